package engine

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
)

// Errors of the Scheduler.
var (
	// ErrInvalidConfig wraps every SchedulerConfig validation error.
	ErrInvalidConfig = errors.New("invalid scheduler config")
	// ErrUnknownStep: ProcessOutputs for a step that is not the oldest in
	// flight.
	ErrUnknownStep = errors.New("unknown step")
	// ErrStepMismatch: the sampled tokens do not match the step's sample
	// rows.
	ErrStepMismatch = errors.New("sampled tokens do not match the step")
	// ErrUnknownSequence: no unfinished sequence has that id.
	ErrUnknownSequence = errors.New("unknown sequence")
)

// PlaceholderToken stands, in SequenceMetadata.InputTokenIDs, for a token
// sampled by the previous step and not yet known to the Scheduler (see
// Scheduler, zero-overhead scheduling).
const PlaceholderToken = -1

// SchedulerConfig holds the Scheduler's limits.
type SchedulerConfig struct {
	// MaxNumSeqs caps the live (admitted, unfinished) sequences, hence the
	// sequences of one step.
	MaxNumSeqs int
	// MaxNumBatchedTokens caps the tokens computed in one step
	// (>= MaxNumSeqs, so that every running sequence can decode at once).
	MaxNumBatchedTokens int
	// MaxModelLen caps prompt + output tokens of one sequence.
	MaxModelLen int
	// EnableChunkedPrefill splits prompts longer than ChunkSize (or than
	// the step's remaining token budget) over several steps. Without it a
	// prompt is computed in one step, so MaxNumBatchedTokens must be >=
	// MaxModelLen.
	EnableChunkedPrefill bool
	// ChunkSize caps the prompt tokens of one sequence in one step (0:
	// MaxNumBatchedTokens).
	ChunkSize int
	// ChunkAlign rounds the end of a non-final chunk down to a multiple of
	// it when that leaves a non-empty chunk (0 or 1: no alignment).
	ChunkAlign int
	// BlockSize is the tokens per KV block; NumBlocks the blocks in the
	// cache.
	BlockSize int
	NumBlocks int
	// EnablePrefixCaching shares computed full blocks between sequences
	// with the same prefix.
	EnablePrefixCaching bool
	// NumStateSlots is the number of per-sequence state slots (0:
	// MaxNumSeqs).
	NumStateSlots int
	// NumStateCheckpoints > 0, with EnablePrefixCaching, makes prefix
	// caching serve models whose sequences carry state in their slots
	// (ring buffers of sliding-window layers): that many more state slots,
	// numbered from NumStateSlots, hold checkpoints of a sequence's state
	// at block boundaries, and a hit reaches only as far as the deepest
	// checkpoint its cached blocks cover (see stateCheckpoints); chunk
	// ends are then aligned to blocks (ChunkAlign becomes BlockSize unless
	// it is a multiple of it). 0 with such a model: no hits at all (the
	// caller turns prefix caching off).
	NumStateCheckpoints int
	// EOSTokenIDs end a sequence (unless ignore_eos) once min_tokens are
	// out.
	EOSTokenIDs []int
	// VocabSize bounds prompt and parameter token ids (0: unchecked).
	VocabSize int
	// NumSpeculativeTokens is the longest draft a decode step verifies (k;
	// 0: no speculative decoding). See Scheduler, speculative decoding.
	NumSpeculativeTokens int
	// NumLookaheadSlots are KV slots reserved past a step's last token for
	// a drafter that writes its own KV ahead of the target (an MTP layer or
	// a draft model chaining k-1 tokens): the slots stay the sequence's
	// until the step after has run.
	NumLookaheadSlots int
	// SpecDisableBatchSize > 0 turns drafts off for a step planned while at
	// least that many sequences are running (vLLM's
	// speculative_disable_by_batch_size): where the forward pass is no
	// longer bound by reading the weights, verifying drafts costs more than
	// the tokens it saves.
	SpecDisableBatchSize int
	// AdmissionBatch > 1 admits waiting prompts into a step that decodes
	// only when that many of them fit at once (free sequence slots), or
	// every one waiting does, so that fewer steps carry prompt chunks: on
	// a GPU a decode step replays a captured graph and a step with a
	// prompt chunk runs eagerly, several times longer for a small model
	// (an H100, the shipped model at batch 64: 0.53 ms against 2.0 ms),
	// and under continuous batching a prompt joins nearly every other
	// step. A step that already carries a chunk, or decodes nothing,
	// admits as usual, and so does the step after 4*AdmissionBatch held
	// ones in a row (a batch of long generations may free its slots
	// slowly). The cost: slots left free while the next batch gathers
	// (about (AdmissionBatch-1)/2 on average at saturation), and that
	// wait in a new request's time to first token. 0 or 1: a prompt joins
	// as soon as it fits (vLLM). The YAML key is engine.admission_fraction,
	// a share of MaxNumSeqs.
	AdmissionBatch int
}

// Validate checks the limits; errors wrap ErrInvalidConfig.
func (c *SchedulerConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.MaxNumSeqs < 1:
		return bad("max_num_seqs must be >= 1, got %d", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		return bad("max_num_batched_tokens (%d) must be >= max_num_seqs (%d)", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case c.MaxModelLen < 1:
		return bad("max_model_len must be >= 1, got %d", c.MaxModelLen)
	case !c.EnableChunkedPrefill && c.MaxNumBatchedTokens < c.MaxModelLen:
		return bad("max_num_batched_tokens (%d) must be >= max_model_len (%d) without chunked prefill", c.MaxNumBatchedTokens, c.MaxModelLen)
	case c.ChunkSize < 0:
		return bad("chunk_size must be >= 0, got %d", c.ChunkSize)
	case c.ChunkAlign < 0:
		return bad("chunk_align must be >= 0, got %d", c.ChunkAlign)
	case c.AdmissionBatch < 0:
		return bad("admission_batch must be >= 0, got %d", c.AdmissionBatch)
	case c.BlockSize < 1:
		return bad("block_size must be >= 1, got %d", c.BlockSize)
	case c.NumBlocks < 1:
		return bad("num_blocks must be >= 1, got %d", c.NumBlocks)
	case c.NumStateSlots < 0:
		return bad("num_state_slots must be >= 0, got %d", c.NumStateSlots)
	case c.NumStateCheckpoints < 0:
		return bad("num_state_checkpoints must be >= 0, got %d", c.NumStateCheckpoints)
	case c.VocabSize < 0:
		return bad("vocab_size must be >= 0, got %d", c.VocabSize)
	case c.NumSpeculativeTokens < 0:
		return bad("num_speculative_tokens must be >= 0, got %d", c.NumSpeculativeTokens)
	case c.SpecDisableBatchSize < 0:
		return bad("spec_disable_batch_size must be >= 0, got %d", c.SpecDisableBatchSize)
	case c.NumLookaheadSlots < 0:
		return bad("num_lookahead_slots must be >= 0, got %d", c.NumLookaheadSlots)
	}
	for _, id := range c.EOSTokenIDs {
		if id < 0 || (c.VocabSize > 0 && id >= c.VocabSize) {
			return bad("eos token id %d outside the vocabulary [0, %d)", id, c.VocabSize)
		}
	}
	return nil
}

// StepKind says what a step computes.
type StepKind uint8

const (
	StepEmpty   StepKind = iota // nothing scheduled
	StepPrefill                 // prompt (or recompute) chunks only
	StepDecode                  // decode tokens only
	StepMixed                   // both
)

func (k StepKind) String() string {
	return [...]string{"empty", "prefill", "decode", "mixed"}[k]
}

// SequenceMetadata is the Scheduler's promise for one sequence in one step:
// which tokens it computes, where their KV goes, and whether its last row
// samples. Slices are read-only and never overwritten by later steps.
//
// Layout: the fields a decode step changes from one step to the next come
// first, in 128 bytes (with SeqID, Sample and SampleRow, which a reader of
// every row looks at). A recycled element (ScheduleInto) that already
// holds the same sequence's previous plain decode gets only those bytes
// rewritten, and the fields after them are neither written nor read.
type SequenceMetadata struct {
	SeqID SeqID

	// SeqlenQ is the number of tokens computed this step, SeqlenK the
	// context length after it; positions run PosStart..PosStart+SeqlenQ-1
	// and PosStart = SeqlenK - SeqlenQ.
	SeqlenK  int
	PosStart int
	// InputTokenIDs are this step's tokens (length SeqlenQ). A decode
	// step planned before the previous step's token is known carries
	// PlaceholderToken, to be replaced on the device by the token of
	// sample row InputFromRow of the previous step (-1: no placeholder).
	// With speculative decoding every input of such a step is a
	// placeholder: token j comes from entry InputFromRow*(1+k)+j of the
	// previous step's next-input table (its bonus token, then its drafts).
	InputTokenIDs []int
	InputFromRow  int
	// SampleRow is the index of the sampling row (see Sample) among the
	// step's sample rows (-1 when not sampling).
	SampleRow int
	// SlotMapping holds the KV slot of each input token.
	SlotMapping []int
	// TokenIDs are the sequence's known tokens (prompt then output), for
	// penalties; NumPromptTokens splits them.
	TokenIDs []int

	// src and gen say which sequence, as of which of its changes (its
	// metaGen), wrote the fields past these first 128 bytes for a plain
	// decode (src nil otherwise): see Scheduler.planPlainDecodes.
	src *Sequence
	gen uint32

	// Sample is true when the last row samples a token: a decode step, or
	// the last chunk of a prefill (an earlier chunk does not sample).
	// ForkSeqIDs are sequences forked at this step (n > 1) that sample
	// from the same logits row: ForkSeqIDs[j] takes row SampleRow+1+j and
	// has SampleIndex j+1.
	Sample bool
	// Prefill is true for a prompt (or recompute) chunk, false for a
	// decode step.
	Prefill bool
	// Shifted (speculative decoding with placeholder inputs) says that
	// PosStart, SlotMapping and SeqlenK assume the previous step's sample
	// row InputFromRow accepted no draft: the device adds that row's
	// accepted count to the positions and sequence length and recomputes
	// the slots from BlockTable (kernels.Ops.ShiftAccepted), which covers
	// every shift. False: the layout is exact.
	Shifted bool

	SeqlenQ   int // see SeqlenK
	RequestID string
	// Params are the request's sampling params (shared, read-only).
	Params *SamplingParams
	// SampleIndex is 0 for a request's first sequence, i for its i-th fork.
	SampleIndex int
	// NumDrafts is the number of draft tokens this decode step verifies
	// (speculative decoding): InputTokenIDs are the last known token then
	// the drafts, every row samples, and the row's outcome is 1..NumDrafts+1
	// tokens. 0 for a plain decode and for prefill chunks.
	NumDrafts int
	// BlockTable covers at least SeqlenK positions.
	BlockTable []int
	// StateSlot is the sequence's state slot.
	StateSlot  int
	ForkSeqIDs []SeqID
	// Grammar is the sequence's structured-output matcher (nil: none), and
	// ForkGrammars[j] ForkSeqIDs[j]'s (nil when Grammar is). The sample
	// stage masks each row by its matcher; post-processing commits the
	// row's tokens to it.
	Grammar      GrammarMatcher
	ForkGrammars []GrammarMatcher

	// Rows at positions [PromptLogprobsFrom, PromptLogprobsTo) need prompt
	// logprobs (the row at position p scores prompt token p+1); both -1
	// when none.
	PromptLogprobsFrom int
	PromptLogprobsTo   int

	NumPromptTokens int
	// NumCachedTokens counts the prompt tokens the prefix cache served
	// (as of the sequence's last admission).
	NumCachedTokens int
}

// SchedulerOutputs describes one scheduled step. The flat InputTokenIDs
// and SlotMapping hold the step's tokens in metadata order; each
// SequenceMetadata's slices are views into them.
type SchedulerOutputs struct {
	// StepID is 0 when nothing was scheduled (Kind StepEmpty); such a step
	// is not run and needs no ProcessOutputs.
	StepID StepID
	Kind   StepKind

	NumSeqs          int
	NumPrefillSeqs   int
	NumDecodeSeqs    int
	NumBatchedTokens int
	NumPrefillTokens int
	NumDecodeTokens  int
	NumSampleRows    int
	// NumDraftTokens counts the draft tokens the step verifies (included in
	// NumDecodeTokens).
	NumDraftTokens int
	// DraftLimit is the longest draft the step could verify: k, less when
	// SetDraftLimit lowered it, 0 when drafts are off (SetDraftLimit(0),
	// SpecDisableBatchSize) or speculative decoding is not configured. A
	// drafter may draft no more than it for the step after.
	DraftLimit int
	// PlaceholdersFromSamples: the step's placeholder inputs come from a
	// step that verified no drafts and drafted none (planned with
	// DraftLimit 0): each InputFromRow is that step's sample row, whose
	// sampled token it is, with no shift (speculative decoding; without
	// it placeholders always index the sample rows).
	PlaceholdersFromSamples bool

	InputTokenIDs []int
	SlotMapping   []int

	// BlockCopies and StateCopies run before the step's forward pass.
	BlockCopies []BlockCopy
	StateCopies []StateCopy

	// PreemptedSeqIDs lost their blocks in this step (recompute later).
	PreemptedSeqIDs []SeqID
	// FinishedSeqIDs and AbortedSeqIDs ended since the previous Schedule
	// (by ProcessOutputs, FinishSequence, Abort or this call): downstream
	// per-sequence state may be released.
	FinishedSeqIDs []SeqID
	AbortedSeqIDs  []SeqID
	// Finished are the sequences this call ended itself (a request that
	// can never fit the cache: FinishError; a context that cannot grow:
	// FinishLength). No sampled token reports them, so their requests must
	// be answered from here.
	Finished []FinishedSequence
}

// SampledTokens are the tokens one sample row produced: one for a decode
// or a prompt's last chunk, 1..NumDrafts+1 with speculation (the accepted
// drafts, then the target's token after them). Drafts are the drafter's
// proposals for the sequence's next step, made after these tokens (nil
// without speculation); the next step verifies them unless it was planned
// before they were known.
type SampledTokens struct {
	SeqID    SeqID
	TokenIDs []int
	Drafts   []int
}

// SchedulerStats is a snapshot of the Scheduler's queues and counters.
type SchedulerStats struct {
	NumWaiting           int
	NumWaitingForGrammar int
	NumPrompted          int
	NumRunning           int
	NumInflightSteps     int
	NumPreemptions       int64
	NumBlocks            int
	NumFreeBlocks        int
	BlockUsage           float64
	NumStateSlots        int
	NumFreeStateSlots    int
	PrefixCache          PrefixCacheStats
	// Checkpoints counts prefix caching's state checkpoints (zero unless
	// SchedulerConfig.NumStateCheckpoints is in use).
	Checkpoints CheckpointStats
}

// stepEntry is one sequence of a step in flight.
type stepEntry struct {
	seq           *Sequence
	id            SeqID
	epoch         uint32
	row           int32 // its sample row, -1 when it does not sample
	drafts        int32 // draft tokens verified (speculative decoding)
	computedAfter int
}

// stepRecord remembers a step in flight until its ProcessOutputs.
type stepRecord struct {
	id      StepID
	entries []stepEntry // scheduled sequences, then forks, each once
	numRows int
}

// next appends an entry and returns it for the caller to fill in (its
// previous content, when recycled, is stale).
func (r *stepRecord) next() *stepEntry {
	if n := len(r.entries); n < cap(r.entries) {
		r.entries = r.entries[:n+1]
	} else {
		r.entries = append(r.entries, stepEntry{})
	}
	return &r.entries[len(r.entries)-1]
}

// Scheduler decides, step by step, which sequences compute how many tokens,
// and keeps their KV blocks and state slots.
//
// Queues: waiting (not admitted, sorted by arrival; preempted sequences go
// back in arrival order, hence ahead of newer requests), prompted (admitted,
// prefill in progress) and running (decoding), both sorted by arrival.
//
// Each Schedule call, under the budgets max_num_seqs and
// max_num_batched_tokens:
//  1. every running sequence gets its decode slot reserved, oldest first;
//     when blocks run out the youngest live sequence not yet scheduled in
//     the step is preempted (recompute: its blocks and state are freed and
//     it returns to waiting, keeping its output tokens, so that a later
//     prefill recomputes prompt + output). A sequence alone too long for
//     the whole cache finishes with FinishLength;
//  2. prompted sequences get their next chunk (chunked prefill);
//  3. waiting sequences are admitted in arrival order (stopping at the
//     first that does not fit, so none starves), unless step 1 preempted:
//     all their known tokens get blocks (prefix-cache hits are shared, not
//     recomputed), a state slot, and a first chunk. A prompt longer than
//     the whole cache finishes with FinishError.
//
// A request with n > 1 is one sequence until the last chunk of its prefill
// is scheduled; then n-1 children fork from it (sharing its blocks, copying
// its state) and sample from the same logits row. Their state slots and
// sequence budget are reserved at admission.
//
// ProcessOutputs(step, tokens) appends sampled tokens, applies the checks
// that need no text (EOS unless ignore_eos, stop_token_ids, both only after
// min_tokens; max_tokens; max_model_len) and frees finished sequences.
// Stop strings are checked by post-processing, which calls FinishSequence.
// Blocks enter the prefix cache in ProcessOutputs, after the step that
// computed them has run, so a hit never reads KV not yet written.
//
// Zero-overhead scheduling. The Scheduler lets Schedule for step N+1 run
// before ProcessOutputs of step N (steps are processed in order, one or more
// in flight). What makes it work:
//   - A running sequence whose token from step N is not known yet still
//     decodes in N+1: its input is PlaceholderToken with InputFromRow = its
//     sample row in step N; the prepare stage fills it on the device from
//     step N's sampled tokens (MetadataZOS). Counts stay exact: a sequence
//     counts the tokens in flight (numPending), so positions, seqlen_k and
//     reserved slots are right. Only a placeholder from the step just
//     before is allowed; a sequence whose token is older waits a step.
//   - A sequence known to finish by length (max_tokens, max_model_len,
//     counting tokens in flight) is not scheduled again.
//   - A sequence that finishes at step N (EOS, stop token, stop string) is
//     learned one step late: its step-N+1 row is computed and discarded
//     (ProcessOutputs ignores rows of finished sequences). Its blocks are
//     freed when the finish is learned; the device runs N+1 before any
//     later step that reuses them.
//   - A sequence preempted while in flight keeps its pending count and is
//     not re-admitted until its token arrives (it is appended: the step
//     ran on intact KV); its step's blocks are not committed to the
//     prefix cache (the epoch changed).
//
// The strict mode (ProcessOutputs of N before Schedule of N+1) never sees
// a placeholder. Same requests, same tokens in both modes (tested with a
// model that reads its context back through the block tables).
//
// Speculative decoding (NumSpeculativeTokens = k > 0). Each row reported
// to ProcessOutputs carries the drafter's proposal for the sequence's next
// step (SampledTokens.Drafts). A decode step verifies up to k drafts: its
// inputs are the last token and the drafts (NumDrafts of them), every row
// samples, and the row's outcome is the accepted drafts plus the target's
// token after them (1..NumDrafts+1 tokens). The step reserves KV slots for
// all its inputs plus NumLookaheadSlots for the drafter, but numComputed
// counts only the first input (the one always kept) until the outcome
// arrives; ProcessOutputs then adds the accepted drafts, commits only
// accepted tokens to the prefix cache, and frees the blocks that only
// rejected tokens used (their KV is never read: later steps overwrite
// those slots). With zero-overhead scheduling a sequence whose previous
// step is in flight decodes with placeholders for its bonus token and k
// drafts, laid out as if that step accepted nothing (Shifted); its
// slots cover any outcome, and the device shifts positions, slots and
// sequence lengths by the accepted count before the forward pass, so no
// host round trip sits between the two steps. When the step in flight was
// planned with drafts off (a draft limit of 0: SetDraftLimit(0),
// SpecDisableBatchSize), it verifies none and its drafter proposes none, so
// the next decode has one placeholder, its sampled token, laid out exactly
// (no shift) and read from the sample rows as without speculation
// (SchedulerOutputs.PlaceholdersFromSamples): with drafts off a step costs
// what a plain one does. Drafts a step could not use (max_tokens,
// max_model_len, the token budget) are cut, never reserved.
//
// Methods are safe for concurrent use (one mutex). Schedule and
// ProcessOutputs cost O(live sequences + tokens scheduled) plus hashing of
// newly admitted prompts; each touches a running sequence's memory once.
// At thousands of sequences, recycling the metadata through ScheduleInto
// saves the largest allocation.
type Scheduler struct {
	mu  sync.Mutex
	cfg SchedulerConfig
	eos []int
	bm  *BlockManager
	sm  *StateManager

	waiting  []*Sequence
	prompted []*Sequence
	running  []*Sequence
	grammar  map[SeqID]*Sequence
	seqs     map[SeqID]*Sequence    // unfinished, any status
	requests map[string][]*Sequence // unfinished, by request id

	numLive     int // prompted + running
	held        int // steps in a row that held admissions (holdAdmissions)
	numReserved int // state slots and live places reserved for forks
	// runningLeft is set when a running sequence leaves that status
	// (finish, preemption): only then does running hold sequences to
	// drop, a pass over all of them.
	runningLeft bool

	nextSeqID    SeqID
	nextPriority uint64
	lastStep     StepID
	inflight     []*stepRecord
	spare        []*stepRecord
	builder      stepBuilder
	newRunning   []*Sequence
	// stepInts remembers the token and slot array of the last few steps
	// by their metadata's first element, so that ScheduleInto recycles a
	// step's array with its metadata (see ScheduleInto).
	stepInts [4]stepInts
	nextInts int

	draftLimit int // SetDraftLimit; NumSpeculativeTokens until set
	// draftFree: the step planned last (in flight, with zero-overhead
	// scheduling, while the next is planned) had a draft limit of 0, so it
	// verifies no drafts and its drafter proposes none.
	draftFree          bool
	finishedIDs        []SeqID
	abortedIDs         []SeqID
	pendingStateCopies []pendingStateCopy
	numPreemptions     int64

	// ckpt keeps state checkpoints for prefix caching (nil unless
	// NumStateCheckpoints and prefix caching are on); carried are state
	// copies of an empty step, due before the next step that runs.
	ckpt    *stateCheckpoints
	carried []StateCopy
}

// stepInts is the array behind a step's InputTokenIDs and SlotMapping,
// keyed by the first element of the step's metadata.
type stepInts struct {
	meta *SequenceMetadata
	ints []int
}

// pendingStateCopy is a fork's state copy, due before the step after the
// fork's (the parent's state is final only once the fork's step ran).
type pendingStateCopy struct {
	copy  StateCopy
	child *Sequence
	step  StepID
}

// NewScheduler returns a Scheduler with an empty cache.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = cfg.MaxNumBatchedTokens
	}
	if cfg.NumStateSlots == 0 {
		cfg.NumStateSlots = cfg.MaxNumSeqs
	}
	cfg.EOSTokenIDs = slices.Clone(cfg.EOSTokenIDs)
	bm, err := NewBlockManager(cfg.NumBlocks, cfg.BlockSize, cfg.EnablePrefixCaching)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	sm, err := NewStateManager(cfg.NumStateSlots)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	var ckpt *stateCheckpoints
	if cfg.NumStateCheckpoints > 0 && cfg.EnablePrefixCaching {
		ckpt = newStateCheckpoints(cfg.NumStateCheckpoints, cfg.NumStateSlots, cfg.BlockSize)
		if cfg.ChunkAlign <= 1 || cfg.ChunkAlign%cfg.BlockSize != 0 {
			cfg.ChunkAlign = cfg.BlockSize // every chunk may leave a checkpoint
		}
	}
	return &Scheduler{
		ckpt:       ckpt,
		draftLimit: cfg.NumSpeculativeTokens,
		cfg:        cfg,
		eos:        cfg.EOSTokenIDs,
		bm:         bm,
		sm:         sm,
		grammar:    make(map[SeqID]*Sequence),
		seqs:       make(map[SeqID]*Sequence),
		requests:   make(map[string][]*Sequence),
	}, nil
}

// Config returns the configuration in use (defaults filled in).
func (s *Scheduler) Config() SchedulerConfig { return s.cfg }

// Add validates a new sequence and queues it: it gets an id and waits for
// admission. Errors wrap ErrInvalidRequest: an empty prompt, a prompt
// longer than max_model_len, token ids outside the vocabulary, bad sampling
// params, n above max_num_seqs or the state slots, a request id already
// in use. A prompt that fits max_model_len but not the whole KV cache is
// accepted and finishes with FinishError at the next Schedule.
func (s *Scheduler) Add(seq *Sequence) (SeqID, error) { return s.add(seq, false) }

// AddWaitingForGrammar is Add for a sequence whose grammar is still
// compiling: it waits (StatusWaitingForGrammar) until GrammarReady.
func (s *Scheduler) AddWaitingForGrammar(seq *Sequence) (SeqID, error) { return s.add(seq, true) }

func (s *Scheduler) add(seq *Sequence, waitGrammar bool) (SeqID, error) {
	if seq == nil {
		return 0, fmt.Errorf("scheduler: add: %w: nil sequence", ErrInvalidRequest)
	}
	if err := s.validate(seq); err != nil {
		return 0, fmt.Errorf("scheduler: add request %q: %w", seq.requestID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq.id != 0 {
		return 0, fmt.Errorf("scheduler: add request %q: %w: sequence already added (id %d)", seq.requestID, ErrInvalidRequest, seq.id)
	}
	if _, dup := s.requests[seq.requestID]; dup {
		return 0, fmt.Errorf("scheduler: add request %q: %w: request id in use", seq.requestID, ErrInvalidRequest)
	}
	s.nextSeqID++
	s.nextPriority++
	seq.id = s.nextSeqID
	seq.priority = s.nextPriority
	seq.numForks = seq.params.N - 1
	seq.quietLen = s.quietLen(seq)
	s.seqs[seq.id] = seq
	s.requests[seq.requestID] = []*Sequence{seq}
	if waitGrammar {
		seq.status = StatusWaitingForGrammar
		s.grammar[seq.id] = seq
	} else {
		seq.status = StatusWaiting
		s.waiting = append(s.waiting, seq) // newest priority: the tail
	}
	return seq.id, nil
}

func (s *Scheduler) validate(seq *Sequence) error {
	n := seq.numPromptTokens
	switch {
	case n == 0:
		return fmt.Errorf("%w: empty prompt", ErrInvalidRequest)
	case n > s.cfg.MaxModelLen:
		return fmt.Errorf("%w: prompt of %d tokens exceeds max_model_len %d", ErrInvalidRequest, n, s.cfg.MaxModelLen)
	case seq.params.N > s.cfg.MaxNumSeqs || seq.params.N > s.cfg.NumStateSlots:
		return fmt.Errorf("%w: n = %d exceeds max_num_seqs %d or state slots %d", ErrInvalidRequest, seq.params.N, s.cfg.MaxNumSeqs, s.cfg.NumStateSlots)
	}
	if v := s.cfg.VocabSize; v > 0 {
		for i, t := range seq.PromptTokenIDs() {
			if t < 0 || t >= v {
				return fmt.Errorf("%w: prompt token %d is %d, outside the vocabulary [0, %d)", ErrInvalidRequest, i, t, v)
			}
		}
	}
	return seq.params.Validate(s.cfg.VocabSize)
}

// GrammarReady moves a sequence waiting for its grammar to the waiting
// queue with g, its compiled constraint (the sequence and its forks each
// get a matcher of it), or, when compileErr is not nil, finishes it with
// FinishError. An unknown id (aborted meanwhile) is ErrUnknownSequence.
func (s *Scheduler) GrammarReady(id SeqID, g Grammar, compileErr error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq, ok := s.grammar[id]
	if !ok {
		return fmt.Errorf("scheduler: grammar ready for seq %d: %w", id, ErrUnknownSequence)
	}
	delete(s.grammar, id)
	if compileErr == nil && g == nil {
		compileErr = errors.New("no grammar was given")
	}
	if compileErr != nil {
		s.finish(seq, FinishError, fmt.Errorf("grammar: %w", compileErr))
		return nil
	}
	seq.grammar, seq.matcher = g, g.NewMatcher()
	seq.metaGen++
	seq.status = StatusWaiting
	s.insertWaiting(seq)
	return nil
}

// SetDraftLimit caps the drafts the steps planned from now on verify, at
// most NumSpeculativeTokens (0: none; speculative decoding stays
// configured: the drafter keeps its state, and drafts resume at once when
// the limit is raised).
func (s *Scheduler) SetDraftLimit(k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draftLimit = min(max(k, 0), s.cfg.NumSpeculativeTokens)
}

// NumRunning returns the number of running (decoding) sequences, as of the
// last Schedule. Cost: O(1).
func (s *Scheduler) NumRunning() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running)
}

// HasUnfinished reports whether any added sequence has not finished.
func (s *Scheduler) HasUnfinished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seqs) > 0
}

// NumInflightSteps returns the steps scheduled and not yet processed.
func (s *Scheduler) NumInflightSteps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inflight)
}

// Stats returns queue sizes and counters. Cost: O(queued sequences).
func (s *Scheduler) Stats() SchedulerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := SchedulerStats{
		NumWaitingForGrammar: len(s.grammar),
		NumInflightSteps:     len(s.inflight),
		NumPreemptions:       s.numPreemptions,
		NumBlocks:            s.bm.NumBlocks(),
		NumFreeBlocks:        s.bm.NumFreeBlocks(),
		BlockUsage:           s.bm.Usage(),
		NumStateSlots:        s.sm.NumSlots(),
		NumFreeStateSlots:    s.sm.NumFree(),
		PrefixCache:          s.bm.PrefixCacheStats(),
	}
	if s.ckpt != nil {
		st.Checkpoints = s.ckpt.stats
	}
	for _, q := range s.waiting {
		if q.status == StatusWaiting || q.status == StatusPreempted {
			st.NumWaiting++
		}
	}
	for _, q := range s.prompted {
		if q.status == StatusPrompted {
			st.NumPrompted++
		}
	}
	for _, q := range s.running {
		if q.status == StatusRunning {
			st.NumRunning++
		}
	}
	return st
}

// Sequence returns an unfinished sequence by id (nil if none). The caller
// must not read it while another goroutine drives the Scheduler.
func (s *Scheduler) Sequence(id SeqID) *Sequence {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seqs[id]
}

// Abort finishes every unfinished sequence of a request with FinishAbort,
// whatever its status, and frees its blocks and state; outputs of steps in
// flight for them are discarded. It returns the aborted sequences (none
// when the request is unknown or already finished).
func (s *Scheduler) Abort(requestID string) []FinishedSequence {
	s.mu.Lock()
	defer s.mu.Unlock()
	group := slices.Clone(s.requests[requestID])
	var aborted []FinishedSequence
	for _, seq := range group {
		aborted = append(aborted, s.finish(seq, FinishAbort, nil))
	}
	return aborted
}

// FinishSequence ends a sequence for a reason found outside the Scheduler
// (a stop string in the detokenized text), freeing its resources. Rows of
// steps in flight for it are discarded.
func (s *Scheduler) FinishSequence(id SeqID, reason FinishReason) (FinishedSequence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq, ok := s.seqs[id]
	if !ok {
		return FinishedSequence{}, fmt.Errorf("scheduler: finish seq %d: %w", id, ErrUnknownSequence)
	}
	if reason == FinishNone {
		return FinishedSequence{}, fmt.Errorf("scheduler: finish seq %d: no reason given", id)
	}
	return s.finish(seq, reason, nil), nil
}

// release frees what a live sequence holds: blocks, state slot, fork
// reservations.
func (s *Scheduler) release(seq *Sequence) {
	if !seq.isLive() {
		return
	}
	s.bm.Free(seq)
	s.sm.Free(seq)
	s.numReserved -= seq.numForks
	s.numLive--
}

// finish ends a sequence. Queue slices drop it lazily (by status).
func (s *Scheduler) finish(seq *Sequence, reason FinishReason, err error) FinishedSequence {
	s.release(seq)
	s.runningLeft = s.runningLeft || seq.status == StatusRunning
	seq.status = StatusFinished
	seq.finishReason = reason
	seq.finishErr = err
	delete(s.seqs, seq.id)
	delete(s.grammar, seq.id)
	if group := s.requests[seq.requestID]; len(group) <= 1 {
		delete(s.requests, seq.requestID)
	} else {
		s.requests[seq.requestID] = slices.DeleteFunc(group, func(q *Sequence) bool { return q == seq })
	}
	if reason == FinishAbort {
		s.abortedIDs = append(s.abortedIDs, seq.id)
	} else {
		s.finishedIDs = append(s.finishedIDs, seq.id)
	}
	return seq.finished()
}

// insertWaiting puts a sequence in the waiting queue by arrival order.
func (s *Scheduler) insertWaiting(seq *Sequence) {
	i := sort.Search(len(s.waiting), func(i int) bool { return older(seq, s.waiting[i]) })
	s.waiting = slices.Insert(s.waiting, i, seq)
}

// insertSorted inserts seq into q by arrival order, scanning from the tail
// (new entries are usually the youngest).
func insertSorted(q []*Sequence, seq *Sequence) []*Sequence {
	i := len(q)
	for i > 0 && older(seq, q[i-1]) {
		i--
	}
	return slices.Insert(q, i, seq)
}

// keepStatus drops the sequences whose status is not one of want.
func keepStatus(q []*Sequence, want ...SequenceStatus) []*Sequence {
	n := 0
	for i, seq := range q {
		if seq.status == want[0] || len(want) > 1 && slices.Contains(want[1:], seq.status) {
			if n != i {
				q[n] = seq
			}
			n++
		}
	}
	clear(q[n:])
	return q[:n]
}

// preempt takes a live sequence's blocks and state back and queues it for
// recompute.
func (s *Scheduler) preempt(out *SchedulerOutputs, seq *Sequence) {
	s.release(seq)
	s.runningLeft = s.runningLeft || seq.status == StatusRunning
	seq.status = StatusPreempted
	seq.epoch++
	seq.numComputed = 0
	seq.numCached = 0
	seq.drafts = nil
	s.insertWaiting(seq)
	out.PreemptedSeqIDs = append(out.PreemptedSeqIDs, seq.id)
	s.numPreemptions++
}

// decodeReady reports whether a running sequence can decode in step id.
// It is small enough to inline: the decode loop calls it for every
// running sequence.
func (s *Scheduler) decodeReady(seq *Sequence, id StepID) bool {
	// Its input token is from the previous step at the latest; its
	// known tokens and those in flight are all computed but the last; no
	// token in flight ends it by length; nor may its step in flight reach
	// the end of the context.
	n := seq.totalLen()
	return (seq.numPending < 1 || seq.numPending == 1 && seq.pendingStep == id-1) &&
		seq.numComputed == n-1 &&
		n-seq.numPromptTokens < int(seq.maxTokens) &&
		n < s.cfg.MaxModelLen &&
		seq.numComputed+int(seq.numPendingDrafts) < s.cfg.MaxModelLen
}

// victim returns the youngest live sequence not scheduled in step id among
// the prompted ones and running[from:], or nil.
func (s *Scheduler) victim(id StepID, from int) *Sequence {
	var best *Sequence
	for i := len(s.running) - 1; i >= from; i-- {
		if q := s.running[i]; q.status == StatusRunning && q.scheduledStep != id {
			best = q
			break
		}
	}
	for i := len(s.prompted) - 1; i >= 0; i-- {
		if q := s.prompted[i]; q.status == StatusPrompted && q.scheduledStep != id {
			if best == nil || older(best, q) {
				best = q
			}
			break
		}
	}
	return best
}

// draftsFor returns the drafts a running sequence verifies in the step
// being planned and the KV slots to reserve from its numComputed: its
// known drafts, or k placeholders when its previous step is in flight, cut
// so that every token the step may emit is within max_tokens, every
// position it computes is within max_model_len and the whole cache, and
// its tokens fit the budget. The slots cover the shift of the drafts still
// in flight and the step's inputs, plus as much of the drafter's lookahead
// as the context and the cache hold (a drafter drafts less where they end).
func (s *Scheduler) draftsFor(seq *Sequence, budget int) (q, slots int) {
	k := s.cfg.NumSpeculativeTokens
	if k == 0 {
		return 0, 1
	}
	k = s.stepDraftLimit() // the slots still cover the shift and the drafter's lookahead
	q = len(seq.drafts)
	if seq.numPending > 0 {
		q = k
		if s.draftFree { // the step in flight drafts nothing
			q = 0
		}
	}
	shift := int(seq.numPendingDrafts)
	numOut := len(seq.tokens) + int(seq.numPending) - seq.numPromptTokens
	// Positions [numComputed, end) may be written: end is bounded by the
	// context and by the cache (a longer reservation would preempt the
	// sequence itself).
	end := min(s.cfg.MaxModelLen, s.bm.NumBlocks()*s.bm.BlockSize())
	room := end - seq.numComputed - shift - 1
	q = max(min(q, k, int(seq.maxTokens)-numOut-1, budget-1, room), 0)
	lookahead := max(min(s.cfg.NumLookaheadSlots, room-q), 0)
	return q, max(shift+1+q+lookahead, 1)
}

// stepDraftLimit is the longest draft of the step being planned: the
// limit SetDraftLimit set, 0 while SpecDisableBatchSize sequences run.
func (s *Scheduler) stepDraftLimit() int {
	if s.cfg.SpecDisableBatchSize > 0 && len(s.running) >= s.cfg.SpecDisableBatchSize {
		return 0
	}
	return s.draftLimit
}

// chunkFor returns the tokens of the next prefill chunk (0: none fits).
func (s *Scheduler) chunkFor(numComputed, numTokens, budget int) int {
	remaining := numTokens - numComputed
	if !s.cfg.EnableChunkedPrefill {
		if remaining > budget {
			return 0
		}
		return remaining
	}
	q := min(remaining, s.cfg.ChunkSize, budget)
	if q < remaining && s.cfg.ChunkAlign > 1 {
		end := numComputed + q
		if aligned := end - end%s.cfg.ChunkAlign; aligned > numComputed {
			q = aligned - numComputed
		}
	}
	if s.ckpt != nil {
		// End a chunk at the last block boundary before the final token,
		// where the deepest hit a repeat of these tokens can take needs a
		// checkpoint (stateCheckpoints).
		bs := s.cfg.BlockSize
		if last := (numTokens - 1) / bs * bs; numComputed < last && last < numComputed+q {
			q = last - numComputed
		}
	}
	return q
}

// Schedule plans the next step. It returns the step's outputs and one
// SequenceMetadata per scheduled sequence (decodes first, then prefill
// chunks). Nothing scheduled gives StepID 0 and no metadata. Every planned
// step must be reported, in order, to ProcessOutputs. Cost: O(live
// sequences + tokens scheduled + prompt tokens admitted), one pass over
// the running sequences.
func (s *Scheduler) Schedule() (*SchedulerOutputs, []SequenceMetadata) { return s.ScheduleInto(nil) }

// ScheduleInto is Schedule writing the metadata into buf when it has the
// capacity, and returning it. A caller that knows when a step's metadata is
// no longer read recycles it here: at thousands of sequences the per-step
// allocation is the Scheduler's largest cost. buf must hold metadata as
// Schedule or ScheduleInto returned it (or zeroed elements): the caller
// must not have modified its elements, because an element that already
// holds the same sequence's previous plain decode keeps the fields that did
// not change (see SequenceMetadata, Layout). When buf is the metadata of
// one of the last few steps, that step's token and slot array
// (SchedulerOutputs.InputTokenIDs and SlotMapping, which its metadata's
// InputTokenIDs and SlotMapping view) is recycled with it: recycling buf
// says that nothing reads that step's outputs any more either. The result
// is the same as Schedule's.
func (s *Scheduler) ScheduleInto(buf []SequenceMetadata) (*SchedulerOutputs, []SequenceMetadata) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if s.runningLeft {
		s.running = keepStatus(s.running, StatusRunning)
		s.runningLeft = false
	}
	s.prompted = keepStatus(s.prompted, StatusPrompted)
	s.waiting = keepStatus(s.waiting, StatusWaiting, StatusPreempted)
	b := s.newBuilder(buf)
	id := b.id
	out := b.out
	out.DraftLimit = s.stepDraftLimit()
	out.PlaceholdersFromSamples = s.draftFree
	// State copies run in this order: an empty step's, checkpoints taken,
	// copies out of checkpoints (admissions), forks'.
	out.StateCopies = append(out.StateCopies, s.carried...)
	s.carried = s.carried[:0]
	if s.ckpt != nil {
		out.StateCopies = s.ckpt.takeDue(id, out.StateCopies)
	}

	// 1. Decodes, oldest first; preempt the youngest when blocks run out.
	k, bs := s.cfg.NumSpeculativeTokens, s.bm.BlockSize()
	for i := 0; i < len(s.running); i++ {
		if k == 0 {
			// The common decodes first, in a run (planPlainDecodes);
			// running[i] is one it left to the general path.
			if i = s.planPlainDecodes(b, i); i == len(s.running) {
				break
			}
		}
		seq := s.running[i]
		if seq.status != StatusRunning || !s.decodeReady(seq, id) {
			continue
		}
		if b.numSeqs >= s.cfg.MaxNumSeqs || b.budget < 1 {
			break
		}
		if seq.numComputed >= s.bm.NumBlocks()*bs { // NumBlocksFor(numComputed+1) > NumBlocks
			out.Finished = append(out.Finished, s.finish(seq, FinishLength, nil))
			continue
		}
		q, slots := s.draftsFor(seq, b.budget)
		for !s.bm.CanAppendSlots(seq, slots) {
			v := s.victim(id, i)
			s.preempt(out, v)
			if v == seq {
				break
			}
		}
		if seq.status != StatusRunning {
			continue
		}
		copies, err := s.bm.AppendSlots(seq, slots)
		if err != nil { // cannot happen after CanAppendSlots; keep the request alive
			s.preempt(out, seq)
			continue
		}
		out.BlockCopies = append(out.BlockCopies, copies...)
		s.addDecode(b, seq, q)
	}
	preempted := len(out.PreemptedSeqIDs) > 0

	// 2. Next chunks of prefills in progress.
	s.newRunning = s.newRunning[:0]
	for _, seq := range s.prompted {
		if b.numSeqs >= s.cfg.MaxNumSeqs || b.budget < 1 {
			break
		}
		if seq.status != StatusPrompted || seq.scheduledStep == id {
			continue
		}
		if q := s.chunkFor(seq.numComputed, len(seq.tokens), b.budget); q > 0 {
			s.addChunk(b, seq, q)
		}
	}

	// 3. Admissions, in arrival order, unless this step had to preempt.
	if !preempted {
		s.admit(b)
	}

	for _, seq := range s.newRunning {
		s.running = insertSorted(s.running, seq)
	}
	clear(s.newRunning)

	out.FinishedSeqIDs, s.finishedIDs = s.finishedIDs, nil
	out.AbortedSeqIDs, s.abortedIDs = s.abortedIDs, nil
	return out, s.finishStep(b)
}

// stepBuilder accumulates one step while it is planned: metadata, flat
// token and slot arrays, and the in-flight record, written in a single
// pass so that each sequence's memory is touched once.
type stepBuilder struct {
	id      StepID
	out     *SchedulerOutputs
	metas   []SequenceMetadata
	tokens  []int
	slots   []int
	rec     *stepRecord
	ints    []int // the array tokens and slots start in
	budget  int
	numSeqs int
	row     int
	grew    bool // tokens or slots moved: views must be rebuilt
}

func (s *Scheduler) newBuilder(buf []SequenceMetadata) *stepBuilder {
	b := &s.builder
	*b = stepBuilder{id: s.lastStep + 1, out: &SchedulerOutputs{}, budget: s.cfg.MaxNumBatchedTokens}
	est := len(s.running) + len(s.prompted) + 4
	if cap(buf) >= est {
		b.metas = buf[:0]
	} else {
		b.metas = make([]SequenceMetadata, 0, est)
	}
	// Decode-only steps need one token per running sequence; with prompts
	// to compute, the whole budget may go.
	numTokens := min((len(s.running)+4)*(1+s.cfg.NumSpeculativeTokens), s.cfg.MaxNumBatchedTokens)
	if len(s.prompted) > 0 || len(s.waiting) > 0 {
		numTokens = s.cfg.MaxNumBatchedTokens
	}
	b.ints = s.recycledInts(buf, 2*numTokens)
	b.tokens, b.slots = b.ints[:0:numTokens], b.ints[numTokens:numTokens]
	if n := len(s.spare); n > 0 {
		b.rec = s.spare[n-1]
		s.spare = s.spare[:n-1]
	} else {
		b.rec = &stepRecord{}
	}
	b.rec.id = b.id
	return b
}

// recycledInts returns an array of n ints for a step's tokens and slots:
// the array of the step whose metadata buf is, when the Scheduler still
// remembers it and it is large enough (its old contents stay: the step
// writes every element it uses before anything reads it), else a new one.
// Either way the array is forgotten until finishStep records it again.
func (s *Scheduler) recycledInts(buf []SequenceMetadata, n int) []int {
	if cap(buf) > 0 {
		first := &buf[:1][0]
		for i := range s.stepInts {
			if r := &s.stepInts[i]; r.meta == first {
				ints := r.ints
				*r = stepInts{}
				if cap(ints) >= n {
					return ints[:n]
				}
				break
			}
		}
	}
	return make([]int, n)
}

// rememberInts records the array behind the step whose metadata is metas
// (see recycledInts), forgetting the oldest of the steps remembered.
func (s *Scheduler) rememberInts(metas []SequenceMetadata, ints []int) {
	s.stepInts[s.nextInts] = stepInts{meta: &metas[:1][0], ints: ints}
	s.nextInts = (s.nextInts + 1) % len(s.stepInts)
}

// add1 schedules q tokens of a sequence from its first uncomputed position
// and writes its metadata; a sampling row takes the next sample row, and
// forks the rows after it.
func (s *Scheduler) add1(b *stepBuilder, seq *Sequence, q int, prefill, sample bool, forks []*Sequence, plFrom, plTo int) {
	s.addRows(b, seq, q, 0, prefill, sample, forks, plFrom, plTo)
}

// addDecode schedules a running sequence's decode: its last token and q
// drafts (speculative decoding), placeholders when its previous step is
// still in flight.
func (s *Scheduler) addDecode(b *stepBuilder, seq *Sequence, q int) {
	s.addRows(b, seq, 1+q, q, false, true, nil, -1, -1)
}

// addRows schedules q tokens of a sequence from its first uncomputed
// position, the last drafts of them drafts to verify, and writes its
// metadata; a sampling row takes the next sample row, and forks the rows
// after it.
func (s *Scheduler) addRows(b *stepBuilder, seq *Sequence, q, drafts int, prefill, sample bool, forks []*Sequence, plFrom, plTo int) {
	pos := seq.numComputed
	bs := s.bm.blockSize
	start := len(b.tokens)
	capBefore := cap(b.tokens)
	fromRow, shiftFrom := -1, -1
	if s.cfg.NumSpeculativeTokens > 0 && !prefill && seq.numPending > 0 {
		fromRow, shiftFrom = int(seq.pendingRow), int(seq.pendingRow)
		if s.draftFree { // its step in flight verifies no drafts: no shift
			shiftFrom = -1
		}
	}
	for p := pos; p < pos+q; p++ {
		switch {
		case shiftFrom >= 0:
			b.tokens = append(b.tokens, PlaceholderToken)
		case p == len(seq.tokens)-1:
			b.tokens = append(b.tokens, seq.lastToken) // saves a cache miss per decode
		case p < len(seq.tokens):
			b.tokens = append(b.tokens, seq.tokens[p])
		case p-len(seq.tokens) < len(seq.drafts) && drafts > 0:
			b.tokens = append(b.tokens, seq.drafts[p-len(seq.tokens)])
		default:
			b.tokens = append(b.tokens, PlaceholderToken)
			fromRow = int(seq.pendingRow)
		}
		if off := p - (len(seq.blockTable)-1)*bs; off >= 0 && off < bs { // in the last block
			b.slots = append(b.slots, int(seq.lastBlock)*bs+off)
		} else {
			blk := p / bs
			b.slots = append(b.slots, seq.blockTable[blk]*bs+p%bs)
		}
	}
	if cap(b.tokens) != capBefore {
		b.grew = true
	}
	end := len(b.tokens)

	// Every field is written below, so a recycled element needs no
	// clearing; field by field, no bulk copy runs under the GC.
	if n := len(b.metas); n < cap(b.metas) {
		b.metas = b.metas[:n+1]
	} else {
		b.metas = append(b.metas, SequenceMetadata{})
	}
	m := &b.metas[len(b.metas)-1]
	m.src = nil // not a plain decode's (see planPlainDecodes)
	m.SeqID = seq.id
	m.RequestID = seq.requestID
	m.Params = seq.params
	m.SampleIndex = seq.sampleIndex
	m.SeqlenQ = q
	m.SeqlenK = pos + q
	m.PosStart = pos
	m.InputTokenIDs = b.tokens[start:end:end]
	m.InputFromRow = fromRow
	m.NumDrafts = drafts
	m.Shifted = shiftFrom >= 0
	m.BlockTable = seq.blockTable[:len(seq.blockTable):len(seq.blockTable)]
	m.SlotMapping = b.slots[start:end:end]
	m.StateSlot = int(seq.stateSlot)
	m.Prefill = prefill
	m.Sample = sample
	m.SampleRow = -1
	m.PromptLogprobsFrom = plFrom
	m.PromptLogprobsTo = plTo
	m.TokenIDs = seq.tokens[:len(seq.tokens):len(seq.tokens)]
	m.NumPromptTokens = seq.numPromptTokens
	m.NumCachedTokens = seq.numCached

	seq.scheduledStep = b.id
	// Drafts count as computed only once accepted (ProcessOutputs).
	seq.numComputed += q - drafts
	seq.numPendingDrafts += int32(drafts)
	// The entry too is written in place: a stepEntry built on the stack
	// and appended is copied back in 16-byte loads, which stall on the
	// narrower stores that built it.
	e := b.rec.next()
	e.seq, e.id, e.epoch, e.row, e.drafts, e.computedAfter = seq, seq.id, seq.epoch, -1, int32(drafts), seq.numComputed
	if sample {
		m.SampleRow = b.row
		seq.numPending++
		seq.pendingStep = b.id
		seq.pendingRow = int32(b.row)
		e.row = int32(b.row)
		b.row++
	}
	m.Grammar = seq.matcher
	m.ForkSeqIDs, m.ForkGrammars = nil, nil
	if len(forks) > 0 {
		m.ForkSeqIDs = make([]SeqID, len(forks))
		if seq.matcher != nil {
			m.ForkGrammars = make([]GrammarMatcher, len(forks))
		}
		for j, c := range forks {
			m.ForkSeqIDs[j] = c.id
			if m.ForkGrammars != nil {
				m.ForkGrammars[j] = c.matcher
			}
			c.pendingRow = int32(b.row)
			e := b.rec.next()
			e.seq, e.id, e.epoch, e.row, e.drafts, e.computedAfter = c, c.id, c.epoch, int32(b.row), 0, c.numComputed
			b.row++
		}
	}
	if prefill {
		b.out.NumPrefillSeqs++
		b.out.NumPrefillTokens += q
	} else { // NumDecodeSeqs and NumDecodeTokens: finishStep
		b.out.NumDraftTokens += drafts
	}
	b.numSeqs++
	b.budget -= q
}

// planPlainDecodes plans running[i:] while each sequence is a plain
// decode, skipping those that do not decode in this step, and returns
// the index of the first it leaves to the general path (len(running)
// when none). A plain decode is addDecode(b, seq, 0) for a sequence whose
// slot is in a block it holds privately, or opens a block taken from the
// free list into room its table has, without speculative decoding: the
// step of every running sequence at every step while blocks are free
// (one in block_size of them opens a block). It stops too where the
// step's arrays would have to grow, or the step is full.
//
// Its metadata differs from the sequence's previous plain decode only in
// positions, inputs, slots, sample row and token count, so a recycled
// element that holds that previous decode (same sequence, same metaGen:
// no block, state slot or matcher changed since) gets only those fields
// rewritten, the first 128 bytes (SequenceMetadata, Layout): at thousands
// of sequences per step the metadata is most of the bytes a step writes.
// The loop writes by index into the builder's arrays, sliced to the room
// left, with no append and no call on its usual path. The result is the
// same as addRows' (TestPlainDecodeMatchesAddRows, TestRecycledMetadata).
func (s *Scheduler) planPlainDecodes(b *stepBuilder, i int) int {
	rec := b.rec
	room := min(s.cfg.MaxNumSeqs-b.numSeqs, b.budget,
		cap(b.tokens)-len(b.tokens), cap(b.slots)-len(b.slots), cap(b.metas)-len(b.metas))
	if room <= 0 {
		return i
	}
	rec.entries = slices.Grow(rec.entries, room)
	t0, m0, e0 := len(b.tokens), len(b.metas), len(rec.entries)
	tokens := b.tokens[t0 : t0+room]
	slots := b.slots[t0 : t0+room]
	metas := b.metas[m0 : m0+room]
	entries := rec.entries[e0 : e0+room]
	id, bs, row := b.id, s.bm.blockSize, b.row
	bm, running := s.bm, s.running
	j := 0
	for ; i < len(running) && j < len(tokens); i++ {
		seq := running[i]
		if seq.status != StatusRunning || !s.decodeReady(seq, id) {
			continue
		}
		// Slice headers in locals: the stores below would otherwise
		// make the compiler load them again.
		pos, t, table := seq.numComputed, seq.tokens, seq.blockTable
		if seq.mayShare {
			break
		}
		if pos >= len(table)*bs {
			// Its slot opens a block: AppendSlots' usual case (a free
			// block, room in the table) is taken here, the rest (no free
			// block: preemption; a table to grow) on the general path.
			if pos != len(table)*bs || bm.numFree == 0 || len(table) == cap(table) {
				break
			}
			table = append(table, bm.takeFree())
			seq.setBlockTable(table)
		}
		tok, from := seq.lastToken, -1
		if pos != len(t)-1 { // its last token is in flight (zero-overhead scheduling)
			tok, from = PlaceholderToken, int(seq.pendingRow)
		}
		slot := int(seq.lastBlock)*bs + pos - (len(table)-1)*bs
		if pos < (len(table)-1)*bs { // not in the last block
			slot = table[pos/bs]*bs + pos%bs
		}
		tokens[j], slots[j] = tok, slot
		m := &metas[j]
		if m.src != seq || m.gen != seq.metaGen {
			setPlainMetadata(m, seq)
		}
		m.SeqlenK, m.PosStart = pos+1, pos
		m.InputTokenIDs = tokens[j : j+1 : j+1]
		m.InputFromRow = from
		m.SampleRow = row + j
		m.SlotMapping = slots[j : j+1 : j+1]
		m.TokenIDs = t[:len(t):len(t)]

		seq.scheduledStep = id
		seq.numComputed = pos + 1
		seq.numPending++
		seq.pendingStep = id
		seq.pendingRow = int32(row + j)
		e := &entries[j]
		e.seq, e.id, e.epoch, e.row, e.drafts, e.computedAfter = seq, seq.id, seq.epoch, int32(row+j), 0, pos+1
		j++
	}
	b.tokens, b.slots = b.tokens[:t0+j], b.slots[:t0+j]
	b.metas = b.metas[:m0+j]
	rec.entries = rec.entries[:e0+j]
	b.row += j
	b.numSeqs += j
	b.budget -= j
	return i
}

// setPlainMetadata writes the fields of a plain decode's metadata that
// stay the same from one of the sequence's plain decodes to the next
// (see planPlainDecodes), and marks the element as holding them.
func setPlainMetadata(m *SequenceMetadata, seq *Sequence) {
	m.src, m.gen = seq, seq.metaGen
	m.SeqID = seq.id
	m.Sample, m.Prefill, m.Shifted = true, false, false
	m.SeqlenQ = 1
	m.RequestID = seq.requestID
	m.Params = seq.params
	m.SampleIndex = seq.sampleIndex
	m.NumDrafts = 0
	m.BlockTable = seq.blockTable[:len(seq.blockTable):len(seq.blockTable)]
	m.StateSlot = int(seq.stateSlot)
	m.ForkSeqIDs, m.ForkGrammars = nil, nil
	m.Grammar = seq.matcher
	m.PromptLogprobsFrom, m.PromptLogprobsTo = -1, -1
	m.NumPromptTokens = seq.numPromptTokens
	m.NumCachedTokens = seq.numCached
}

// finishStep completes the outputs, records the step in flight and returns
// its metadata (nil for an empty step).
func (s *Scheduler) finishStep(b *stepBuilder) []SequenceMetadata {
	out := b.out
	if len(b.metas) == 0 {
		out.Kind = StepEmpty
		s.carried = append(s.carried, out.StateCopies...) // nothing runs this step
		out.StateCopies = nil
		s.spare = append(s.spare, b.rec)
		if cap(b.metas) > 0 && !b.grew { // the caller keeps buf for a later step
			s.rememberInts(b.metas, b.ints)
		}
		*b = stepBuilder{}
		return nil
	}
	if b.grew { // rebuild the views into the final arrays
		off := 0
		for k := range b.metas {
			m := &b.metas[k]
			end := off + m.SeqlenQ
			m.InputTokenIDs = b.tokens[off:end:end]
			m.SlotMapping = b.slots[off:end:end]
			off = end
		}
	} else {
		s.rememberInts(b.metas, b.ints)
	}

	s.lastStep = b.id
	s.draftFree = s.cfg.NumSpeculativeTokens > 0 && out.DraftLimit == 0
	out.StepID = b.id
	out.InputTokenIDs = b.tokens
	out.SlotMapping = b.slots
	out.NumSeqs = len(b.metas)
	out.NumBatchedTokens = len(b.tokens)
	// Every scheduled sequence and token is a prefill's or a decode's.
	out.NumDecodeSeqs = out.NumSeqs - out.NumPrefillSeqs
	out.NumDecodeTokens = out.NumBatchedTokens - out.NumPrefillTokens
	out.NumSampleRows = b.row
	switch {
	case out.NumPrefillSeqs > 0 && out.NumDecodeSeqs > 0:
		out.Kind = StepMixed
	case out.NumPrefillSeqs > 0:
		out.Kind = StepPrefill
	default:
		out.Kind = StepDecode
	}
	b.rec.numRows = b.row
	s.inflight = append(s.inflight, b.rec)
	s.flushStateCopies(out, b.id)
	metas := b.metas
	*b = stepBuilder{}
	return metas
}

// admit moves waiting sequences in, oldest first, stopping at the first
// that does not fit.
func (s *Scheduler) admit(b *stepBuilder) {
	if s.holdAdmissions(b) {
		return
	}
	w := s.waiting
	n, i := 0, 0
	for ; i < len(w); i++ {
		seq := w[i]
		if seq.status != StatusWaiting && seq.status != StatusPreempted {
			continue // finished while waiting: drop
		}
		if b.numSeqs >= s.cfg.MaxNumSeqs || b.budget < 1 {
			break
		}
		if seq.numPending > 0 { // its last token is still in flight
			w[n] = seq
			n++
			continue
		}
		if s.bm.NumBlocksFor(len(seq.tokens)) > s.bm.NumBlocks() {
			var f FinishedSequence
			if seq.NumOutputTokens() > 0 {
				f = s.finish(seq, FinishLength, nil)
			} else {
				f = s.finish(seq, FinishError, fmt.Errorf("prompt of %d tokens needs %d KV blocks, the cache has %d",
					len(seq.tokens), s.bm.NumBlocksFor(len(seq.tokens)), s.bm.NumBlocks()))
			}
			b.out.Finished = append(b.out.Finished, f)
			continue
		}
		if s.numLive+s.numReserved+1+seq.numForks > s.cfg.MaxNumSeqs ||
			s.sm.NumFree()-s.numReserved < 1+seq.numForks {
			break
		}
		hits := s.bm.lookup(seq)
		from := -1 // the checkpoint slot the sequence's state starts from
		if s.ckpt != nil {
			var n int
			n, from = s.ckpt.deepest(hits, s.bm.hash)
			hits = hits[:n]
		}
		q := s.chunkFor(len(hits)*s.bm.BlockSize(), len(seq.tokens), b.budget)
		if q == 0 || !s.bm.canAllocateWith(seq, hits) {
			break
		}
		if err := s.bm.allocateWith(seq, hits); err != nil {
			break // unreachable after canAllocateWith
		}
		if err := s.sm.Allocate(seq); err != nil {
			s.bm.Free(seq)
			break // unreachable after the NumFree check
		}
		if from >= 0 {
			b.out.StateCopies = append(b.out.StateCopies, StateCopy{Src: from, Dst: int(seq.stateSlot)})
			s.ckpt.stats.NumHits++
		}
		s.numLive++
		s.numReserved += seq.numForks
		seq.status = StatusPrompted
		s.addChunk(b, seq, q)
		if seq.status == StatusPrompted {
			s.prompted = insertSorted(s.prompted, seq)
		}
	}
	n += copy(w[n:], w[i:])
	clear(w[n:])
	s.waiting = w[:n]
}

// holdAdmissions reports whether step b, which decodes and carries no
// prompt chunk, leaves the waiting prompts waiting until
// SchedulerConfig.AdmissionBatch of them (or every one) fit, for at most
// 4*AdmissionBatch steps in a row. Cost: at most AdmissionBatch waiting
// entries read.
func (s *Scheduler) holdAdmissions(b *stepBuilder) bool {
	n := min(s.cfg.AdmissionBatch, s.cfg.MaxNumSeqs)
	if n <= 1 || b.out.NumPrefillSeqs > 0 || b.numSeqs == 0 || s.held >= 4*n {
		s.held = 0
		return false
	}
	ready := 0
	for _, seq := range s.waiting {
		if (seq.status == StatusWaiting || seq.status == StatusPreempted) && seq.numPending == 0 {
			if ready++; ready == n {
				break
			}
		}
	}
	if free := s.cfg.MaxNumSeqs - s.numLive - s.numReserved; ready == 0 || free == 0 || free >= ready {
		s.held = 0 // nothing to hold: none waits, none fits, or all fit
		return false
	}
	s.held++
	return true
}

// addChunk schedules q prefill tokens of a prompted sequence; the last
// chunk samples, forks the children of an n > 1 request and moves the
// sequence to running.
func (s *Scheduler) addChunk(b *stepBuilder, seq *Sequence, q int) {
	pos := seq.numComputed
	plFrom, plTo := -1, -1
	if seq.params.PromptLogprobs != nil {
		from := max(pos, seq.promptLogprobsDone)
		to := min(pos+q, seq.numPromptTokens-1)
		if from < to {
			plFrom, plTo = from, to
			seq.promptLogprobsDone = to
		}
	}
	last := pos+q == len(seq.tokens)
	var forks []*Sequence
	if last {
		seq.status = StatusRunning
		s.newRunning = append(s.newRunning, seq)
	}
	if last && seq.numForks > 0 {
		// Fork after the parent's slots are reserved (they are: admission
		// allocated every known token), before its metadata is written.
		forks = s.fork(seq, b.id, pos+q)
	}
	s.add1(b, seq, q, true, last, forks, plFrom, plTo)
	if s.ckpt != nil {
		s.ckpt.schedule(seq, seq.numComputed, b.id)
	}
}

// fork creates the children of an n > 1 request at its last prefill chunk:
// each shares the parent's blocks, gets a state slot (its copy runs before
// the next step) and samples from the parent's row in this step.
func (s *Scheduler) fork(parent *Sequence, id StepID, numComputed int) []*Sequence {
	k := parent.numForks
	s.numReserved -= k
	parent.numForks = 0
	children := make([]*Sequence, 0, k)
	for i := 1; i <= k; i++ {
		s.nextSeqID++
		c := parent.fork(s.nextSeqID, i)
		c.numComputed = numComputed
		c.numPending = 1
		c.pendingStep = id
		c.scheduledStep = id
		s.bm.Fork(parent, c)
		cp, err := s.sm.Fork(parent, c)
		if err != nil { // unreachable: slots were reserved at admission
			s.bm.Free(c)
			continue
		}
		s.pendingStateCopies = append(s.pendingStateCopies, pendingStateCopy{copy: cp, child: c, step: id})
		s.numLive++
		s.seqs[c.id] = c
		s.requests[c.requestID] = append(s.requests[c.requestID], c)
		s.newRunning = append(s.newRunning, c)
		children = append(children, c)
	}
	return children
}

// flushStateCopies hands the fork state copies to the step after the
// fork's, dropping those whose child no longer owns the slot.
func (s *Scheduler) flushStateCopies(out *SchedulerOutputs, id StepID) {
	keep := 0
	for _, p := range s.pendingStateCopies {
		switch {
		case p.step == id: // forked in this very step: copy before the next one
			s.pendingStateCopies[keep] = p
			keep++
		case p.child.isLive() && s.sm.owns(p.copy.Dst, p.child.id):
			out.StateCopies = append(out.StateCopies, p.copy)
		}
	}
	clear(s.pendingStateCopies[keep:])
	s.pendingStateCopies = s.pendingStateCopies[:keep]
}

// ProcessOutputs reports the tokens sampled by a step, which must be the
// oldest step in flight: sampled[r] belongs to sample row r (metadata order,
// a row's forks right after it), one entry per row. Rows of sequences that
// finished meanwhile are discarded. It appends the tokens (stopping at the
// first that ends the sequence), frees finished sequences and commits
// computed full blocks to the prefix cache. It returns the sequences it
// finished. A mismatch (wrong step, wrong row count or ids, a row without
// tokens) changes nothing and returns an error. Cost: O(sequences in the
// step + tokens).
func (s *Scheduler) ProcessOutputs(step StepID, sampled []SampledTokens) ([]FinishedSequence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if step == 0 && len(sampled) == 0 {
		return nil, nil // the empty step
	}
	if len(s.inflight) == 0 || s.inflight[0].id != step {
		oldest := StepID(0)
		if len(s.inflight) > 0 {
			oldest = s.inflight[0].id
		}
		return nil, fmt.Errorf("scheduler: process outputs of step %d: %w (oldest in flight: %d)", step, ErrUnknownStep, oldest)
	}
	rec := s.inflight[0]
	if len(sampled) != rec.numRows {
		return nil, fmt.Errorf("scheduler: process outputs of step %d: %w: %d rows, want %d", step, ErrStepMismatch, len(sampled), rec.numRows)
	}
	for i := range rec.entries {
		e := &rec.entries[i]
		if e.row < 0 {
			continue
		}
		if st := &sampled[e.row]; st.SeqID != e.id || len(st.TokenIDs) == 0 || len(st.TokenIDs) > int(e.drafts)+1 {
			return nil, fmt.Errorf("scheduler: process outputs of step %d: %w: row %d has seq %d with %d tokens, want seq %d with 1..%d",
				step, ErrStepMismatch, e.row, st.SeqID, len(st.TokenIDs), e.id, e.drafts+1)
		}
	}
	copy(s.inflight, s.inflight[1:])
	s.inflight[len(s.inflight)-1] = nil
	s.inflight = s.inflight[:len(s.inflight)-1]

	var finished []FinishedSequence
	spec := s.cfg.NumSpeculativeTokens > 0
	for i := range rec.entries {
		e := &rec.entries[i]
		seq := e.seq
		if seq.status == StatusFinished {
			continue // its row is discarded
		}
		if seq.isLive() && seq.epoch == e.epoch {
			s.bm.commitLater(seq, e.computedAfter) // flushed before the blocks change hands
		}
		if e.row < 0 {
			continue
		}
		seq.numPending--
		st := &sampled[e.row]
		var reason FinishReason
		if spec {
			reason = s.appendVerified(seq, e, st)
		} else { // one token, as checked above
			t := st.TokenIDs[0]
			seq.tokens = append(seq.tokens, t)
			seq.lastToken = t
			reason = s.tokenEnds(seq, t)
		}
		if reason != FinishNone {
			finished = s.finishRow(finished, seq, reason)
		}
	}
	s.bm.flushCommits()

	clear(rec.entries)
	rec.entries = rec.entries[:0]
	s.spare = append(s.spare, rec)
	return finished, nil
}

// appendVerified applies a speculative step's row to its sequence: the
// drafter's next proposal, the tokens up to the first that ends the
// sequence, and, with the step's layout still current, the commits of the
// accepted drafts and the release of the blocks only rejected ones used.
// It returns why the sequence ends (FinishNone: it goes on).
func (s *Scheduler) appendVerified(seq *Sequence, e *stepEntry, st *SampledTokens) FinishReason {
	seq.numPendingDrafts -= e.drafts
	seq.drafts = append(seq.drafts[:0], st.Drafts...)
	reason := FinishNone
	for _, t := range st.TokenIDs {
		seq.tokens = append(seq.tokens, t)
		seq.lastToken = t
		if reason = s.tokenEnds(seq, t); reason != FinishNone {
			break
		}
	}
	if e.drafts > 0 && seq.isLive() && seq.epoch == e.epoch {
		// The accepted drafts' KV is valid (each step still in flight
		// counts its first input only); the rejected ones' slots are
		// rewritten by later steps, and blocks only they used go back.
		seq.numComputed += len(st.TokenIDs) - 1
		s.bm.commitLater(seq, seq.numComputed-int(seq.numPending))
		if reason == FinishNone {
			s.bm.flushCommits()
			s.bm.Trim(seq, seq.numComputed+int(seq.numPendingDrafts)+s.cfg.NumLookaheadSlots)
		}
	}
	return reason
}

// finishRow ends a sequence for its row's token and appends the result.
func (s *Scheduler) finishRow(finished []FinishedSequence, seq *Sequence, reason FinishReason) []FinishedSequence {
	s.bm.flushCommits() // before its blocks are released
	return append(finished, s.finish(seq, reason, nil))
}

// tokenEnds is checkStop with its usual outcome inlined: no check can
// end the sequence yet (see quietLen).
func (s *Scheduler) tokenEnds(seq *Sequence, t int) FinishReason {
	if len(seq.tokens) < seq.quietLen {
		return FinishNone
	}
	return s.checkStop(seq, t)
}

// quietLen returns the token count below which checkStop cannot end the
// sequence: max_tokens and the context are not reached, and EOS and stop
// ids do not count yet (min_tokens) or at all (ignore_eos, no stop ids).
func (s *Scheduler) quietLen(seq *Sequence) int {
	n := min(int(seq.numPromptTokens)+int(seq.maxTokens), s.cfg.MaxModelLen)
	if !seq.ignoreEOS || len(seq.stopTokenIDs) > 0 {
		n = min(n, seq.numPromptTokens+max(int(seq.minTokens), 0))
	}
	return n
}

// checkStop applies the token-level finish checks to a just-appended
// token: CheckFinish with the copies of the rule the sequence keeps, spelt
// out so that the per-token call builds no FinishRule (TestTokenEnds pins
// the two together).
func (s *Scheduler) checkStop(seq *Sequence, t int) FinishReason {
	numOut := len(seq.tokens) - seq.numPromptTokens
	if numOut >= int(seq.minTokens) &&
		(!seq.ignoreEOS && slices.Contains(s.eos, t) || len(seq.stopTokenIDs) > 0 && slices.Contains(seq.stopTokenIDs, t)) {
		return FinishStop
	}
	if numOut >= int(seq.maxTokens) || len(seq.tokens) >= s.cfg.MaxModelLen {
		return FinishLength
	}
	return FinishNone
}

// FinishRule holds what the token-level finish checks of one sequence read.
type FinishRule struct {
	MinTokens, MaxTokens int
	IgnoreEOS            bool
	StopTokenIDs         []int
	EOSTokenIDs          []int
	MaxModelLen          int
}

// RuleFor returns the finish rule of a request with params p on a model
// with eos end-of-sequence ids and a context of maxModelLen tokens.
func RuleFor(p *SamplingParams, eos []int, maxModelLen int) FinishRule {
	return FinishRule{MinTokens: p.MinTokens, MaxTokens: p.MaxTokens, IgnoreEOS: p.IgnoreEOS,
		StopTokenIDs: p.StopTokenIDs, EOSTokenIDs: eos, MaxModelLen: maxModelLen}
}

// CheckFinish is the token-level finish rule, shared by the Scheduler
// (which ends the sequence) and post-processing (which answers the request
// in the same step): token has just been appended, making numOut output
// tokens and numTokens in all. EOS and stop token ids count once min_tokens
// are out; max_tokens and the context length always. Cost:
// O(len(EOS ids) + len(stop ids)).
func CheckFinish(r FinishRule, numOut, numTokens, token int) FinishReason {
	if numOut >= r.MinTokens {
		if !r.IgnoreEOS && slices.Contains(r.EOSTokenIDs, token) {
			return FinishStop
		}
		if len(r.StopTokenIDs) > 0 && slices.Contains(r.StopTokenIDs, token) {
			return FinishStop
		}
	}
	if numOut >= r.MaxTokens || numTokens >= r.MaxModelLen {
		return FinishLength
	}
	return FinishNone
}
