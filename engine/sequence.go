package engine

import (
	"fmt"
	"math"
	"time"
)

// maxTokenReserve caps the output tokens a new sequence reserves room for,
// in its token ids and in its block table (BlockManager.tableHeadroom), so
// that decoding appends without reallocating either.
const maxTokenReserve = 1024

// SeqID identifies one sequence inside a Scheduler (ids start at 1).
type SeqID int64

// StepID identifies one scheduled step (ids start at 1).
type StepID int64

// SequenceStatus is where a sequence stands in its life.
type SequenceStatus uint8

const (
	// StatusWaiting: added, not admitted yet (no blocks, no state slot).
	StatusWaiting SequenceStatus = iota
	// StatusWaitingForGrammar: its grammar is still compiling; the
	// Scheduler holds it until GrammarReady.
	StatusWaitingForGrammar
	// StatusPrompted: admitted, prefill in progress (chunked prefill: some
	// of its known tokens are computed, the last chunk is not scheduled).
	StatusPrompted
	// StatusRunning: every known token is scheduled; it decodes one (or,
	// with speculation, several) tokens per step.
	StatusRunning
	// StatusPreempted: its blocks were taken back; it waits at the front of
	// the queue to recompute prompt + output so far.
	StatusPreempted
	// StatusFinished: done, with a FinishReason; its resources are free.
	StatusFinished
)

var statusNames = [...]string{"waiting", "waiting-for-grammar", "prompted", "running", "preempted", "finished"}

func (s SequenceStatus) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("SequenceStatus(%d)", uint8(s))
}

// FinishReason says why a sequence finished.
type FinishReason uint8

const (
	// FinishNone: not finished.
	FinishNone FinishReason = iota
	// FinishStop: EOS, a stop token id or a stop string.
	FinishStop
	// FinishLength: max_tokens reached, or the context reached the model's
	// (or the whole KV cache's) length.
	FinishLength
	// FinishAbort: aborted by the caller.
	FinishAbort
	// FinishError: the request can never run (for example its prompt needs
	// more KV blocks than the cache holds) or failed.
	FinishError
)

var finishNames = [...]string{"", "stop", "length", "abort", "error"}

func (r FinishReason) String() string {
	if int(r) < len(finishNames) {
		return finishNames[r]
	}
	return fmt.Sprintf("FinishReason(%d)", uint8(r))
}

// Sequence is the long-lived state of one output sequence of a request:
// its tokens, sampling params, KV block table, state slot and status.
//
// A Sequence belongs to the Scheduler once added: the Scheduler mutates it
// under its lock, and other goroutines must not read it while the Scheduler
// runs. Steps publish what downstream stages need as SequenceMetadata,
// whose slices are read-only snapshots that later steps never overwrite.
type Sequence struct {
	// Layout: a decode step touches every running sequence twice (Schedule,
	// then ProcessOutputs), thousands of them per step, so the fields it
	// reads or writes come first, grouped by pass: a decode's
	// ProcessOutputs touches the first 64 bytes only, its Schedule the
	// first 192 (more when its metadata is written in full).
	// TestSequenceLayout pins this.

	// Both passes.

	// tokens holds prompt then output token ids; it only grows, and
	// elements below len are never overwritten (snapshots share it).
	tokens    []int
	lastToken int // tokens[len(tokens)-1]
	// quietLen is the token count below which no token-level check can
	// end the sequence (Scheduler.quietLen; 0 until added).
	quietLen int
	// epoch counts the times the sequence lost its blocks (preemption), so
	// that outputs of a step planned before the loss do not commit blocks.
	epoch uint32
	// numPending counts the tokens sampled by steps still in flight (not
	// reported to ProcessOutputs yet); pendingStep and pendingRow locate
	// the last of them.
	numPending int32
	// numHashedBlocks leading blocks have a known prefix hash; lastHash is
	// the hash of the last of them.
	numHashedBlocks int32
	// numPendingDrafts counts the drafts of steps in flight (speculative
	// decoding), whose accepted count is not known yet (numComputed leaves
	// them out).
	numPendingDrafts int32
	status           SequenceStatus
	// mayShare is set while the block the next write lands in may be
	// shared (after a fork); otherwise the write needs no ref-count check.
	mayShare bool
	// ignoreEOS, maxTokens, minTokens and stopTokenIDs copy the params the
	// per-token checks read.
	ignoreEOS    bool
	finishReason FinishReason
	maxTokens    int32

	// Schedule.

	// numComputed counts the tokens whose KV is written or scheduled to be
	// written: after a step is planned it counts that step's tokens.
	numComputed     int
	numPromptTokens int
	// blockTable lists the KV blocks of positions 0, bs, 2bs, ...; it only
	// grows while the sequence holds blocks, and is replaced (never edited
	// in place) on copy-on-write or when freed.
	blockTable []int
	// lastBlock is blockTable's last element (-1 when empty).
	lastBlock     int32
	pendingRow    int32
	pendingStep   StepID
	scheduledStep StepID // the last step that scheduled the sequence
	id            SeqID
	// metaGen counts the changes of what a plain decode's metadata copies
	// from the sequence besides its tokens (block table, state slot,
	// matcher): see Scheduler.planPlainDecodes.
	metaGen     uint32
	stateSlot   int32 // -1 when none
	requestID   string
	params      *SamplingParams
	sampleIndex int // 0 for the first sequence of a request, i for its i-th fork
	minTokens   int32
	priority    uint64 // arrival order inside the Scheduler: lower is older

	// Schedule's full metadata writes, speculative decoding (drafts) and
	// the blocks' commits (lastHash).

	// matcher is the sequence's position in its grammar (nil without one).
	matcher GrammarMatcher
	// drafts are the drafter's proposals for the next step (speculative
	// decoding).
	drafts   []int
	lastHash uint64
	// numCached counts the tokens found in the prefix cache at the last
	// admission.
	numCached int

	// Cold: admission, forks, finish, the per-token checks that can end
	// the sequence.

	stopTokenIDs []int
	arrival      time.Time
	finishErr    error
	// numForks is how many children the sequence forks when its prefill's
	// last chunk is scheduled (n - 1 for a fresh request with n > 1).
	numForks int
	// promptLogprobsDone counts the prompt positions whose prompt logprobs
	// were already scheduled, so a recompute does not ask again.
	promptLogprobsDone int
	// grammar is the request's compiled structured-output constraint (nil
	// without one).
	grammar Grammar
}

// setBlockTable replaces the block table and caches its last block.
func (s *Sequence) setBlockTable(t []int) {
	s.metaGen++
	s.blockTable = t
	s.lastBlock = -1
	if len(t) > 0 {
		s.lastBlock = int32(t[len(t)-1])
	}
}

// NewSequence returns a waiting sequence for a request. The prompt is
// copied; params is cloned (its maps and slices may change afterwards). The
// Scheduler assigns the id on Add. Validation happens in Scheduler.Add.
func NewSequence(requestID string, promptTokenIDs []int, params SamplingParams, arrival time.Time) *Sequence {
	tokens := make([]int, len(promptTokenIDs), len(promptTokenIDs)+min(max(params.MaxTokens, 0), maxTokenReserve)+1)
	copy(tokens, promptTokenIDs)
	s := &Sequence{
		requestID:       requestID,
		params:          params.clone(),
		arrival:         arrival,
		tokens:          tokens,
		numPromptTokens: len(promptTokenIDs),
		stateSlot:       -1,
		pendingRow:      -1,
		lastBlock:       -1,
	}
	if len(tokens) > 0 {
		s.lastToken = tokens[len(tokens)-1]
	}
	s.maxTokens, s.minTokens = int32(min(s.params.MaxTokens, math.MaxInt32)), int32(min(s.params.MinTokens, math.MaxInt32))
	s.ignoreEOS, s.stopTokenIDs = s.params.IgnoreEOS, s.params.StopTokenIDs
	return s
}

// ID returns the sequence id (0 until added to a Scheduler).
func (s *Sequence) ID() SeqID { return s.id }

// RequestID returns the id of the request the sequence belongs to.
func (s *Sequence) RequestID() string { return s.requestID }

// Params returns the sampling params (shared, read-only).
func (s *Sequence) Params() *SamplingParams { return s.params }

// ArrivalTime returns when the request arrived.
func (s *Sequence) ArrivalTime() time.Time { return s.arrival }

// SampleIndex is 0 for the first sequence of a request and i for its i-th
// fork (n > 1); samplers derive per-sequence seeds from (Seed, SampleIndex).
func (s *Sequence) SampleIndex() int { return s.sampleIndex }

// Status returns the current status.
func (s *Sequence) Status() SequenceStatus { return s.status }

// FinishReason returns why the sequence finished (FinishNone while alive).
func (s *Sequence) FinishReason() FinishReason { return s.finishReason }

// IsFinished reports whether the sequence finished.
func (s *Sequence) IsFinished() bool { return s.status == StatusFinished }

// NumTokens returns the number of known tokens (prompt + output).
func (s *Sequence) NumTokens() int { return len(s.tokens) }

// NumPromptTokens returns the prompt length.
func (s *Sequence) NumPromptTokens() int { return s.numPromptTokens }

// NumOutputTokens returns the number of known output tokens.
func (s *Sequence) NumOutputTokens() int { return len(s.tokens) - s.numPromptTokens }

// PromptTokenIDs returns the prompt (read-only view).
func (s *Sequence) PromptTokenIDs() []int { return s.tokens[:s.numPromptTokens:s.numPromptTokens] }

// OutputTokenIDs returns the known output tokens (read-only view).
func (s *Sequence) OutputTokenIDs() []int {
	return s.tokens[s.numPromptTokens:len(s.tokens):len(s.tokens)]
}

// TokenIDs returns prompt + output tokens (read-only view).
func (s *Sequence) TokenIDs() []int { return s.tokens[:len(s.tokens):len(s.tokens)] }

// NumComputedTokens returns the number of tokens whose KV is computed or
// scheduled in a step already planned.
func (s *Sequence) NumComputedTokens() int { return s.numComputed }

// NumCachedTokens returns the number of tokens served from the prefix cache
// at the last admission.
func (s *Sequence) NumCachedTokens() int { return s.numCached }

// BlockTable returns the KV block ids (read-only view).
func (s *Sequence) BlockTable() []int { return s.blockTable[:len(s.blockTable):len(s.blockTable)] }

// Matcher returns the sequence's structured-output matcher (nil without a
// constraint, or while its grammar compiles).
func (s *Sequence) Matcher() GrammarMatcher { return s.matcher }

// StateSlot returns the state slot, or -1 when the sequence holds none.
func (s *Sequence) StateSlot() int { return int(s.stateSlot) }

// totalLen counts known tokens plus those sampled by steps in flight.
func (s *Sequence) totalLen() int { return len(s.tokens) + int(s.numPending) }

// isLive reports whether the sequence holds (or may hold) resources.
func (s *Sequence) isLive() bool { return s.status == StatusPrompted || s.status == StatusRunning }

// older reports whether a has priority over b (arrived first).
func older(a, b *Sequence) bool {
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	return a.id < b.id
}

// fork returns a child sharing tokens and params; blocks and state are
// forked by the managers.
func (s *Sequence) fork(id SeqID, sampleIndex int) *Sequence {
	c := &Sequence{
		id:                 id,
		requestID:          s.requestID,
		params:             s.params,
		arrival:            s.arrival,
		priority:           s.priority,
		sampleIndex:        sampleIndex,
		tokens:             append(make([]int, 0, cap(s.tokens)), s.tokens...),
		numPromptTokens:    s.numPromptTokens,
		lastToken:          s.lastToken,
		status:             s.status,
		numComputed:        s.numComputed,
		numPending:         s.numPending,
		pendingStep:        s.pendingStep,
		maxTokens:          s.maxTokens,
		minTokens:          s.minTokens,
		ignoreEOS:          s.ignoreEOS,
		stopTokenIDs:       s.stopTokenIDs,
		quietLen:           s.quietLen,
		stateSlot:          -1,
		pendingRow:         -1,
		lastBlock:          -1,
		promptLogprobsDone: s.promptLogprobsDone,
		grammar:            s.grammar,
	}
	if s.grammar != nil {
		// A fork happens before its parent's first output token: the
		// child starts at the grammar's start too.
		c.matcher = s.grammar.NewMatcher()
		c.metaGen++
	}
	return c
}

// FinishedSequence reports the end of one sequence.
type FinishedSequence struct {
	SeqID     SeqID
	RequestID string
	// Index is the sequence's SampleIndex (its place among the request's n
	// outputs).
	Index  int
	Reason FinishReason
	// OutputTokenIDs is a copy of the sequence's output tokens.
	OutputTokenIDs []int
	// Err explains FinishError (nil otherwise).
	Err error
}

func (s *Sequence) finished() FinishedSequence {
	return FinishedSequence{
		SeqID:          s.id,
		RequestID:      s.requestID,
		Index:          s.sampleIndex,
		Reason:         s.finishReason,
		OutputTokenIDs: append([]int(nil), s.OutputTokenIDs()...),
		Err:            s.finishErr,
	}
}
