package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// Tests of the Scheduler's speculative decoding (NumSpeculativeTokens > 0):
// layout of the verify steps, accounting of accepted and rejected drafts,
// the cuts of drafts, the shifted (zero-overhead) layout, preemption, and a
// randomized run against a fake device that keeps KV per slot, verifies
// drafts against a deterministic target, drafts and shifts like the
// pipeline's stages do.

// specConfig is a small config with speculation: k drafts, lookahead
// slots, blocks of 2 tokens so that a rejection frees blocks.
func specConfig(k, lookahead int) SchedulerConfig {
	return SchedulerConfig{
		MaxNumSeqs:           8,
		MaxNumBatchedTokens:  64,
		MaxModelLen:          64,
		EnableChunkedPrefill: true,
		BlockSize:            2,
		NumBlocks:            128,
		EnablePrefixCaching:  true,
		EOSTokenIDs:          []int{0},
		VocabSize:            testVocab,
		NumSpeculativeTokens: k,
		NumLookaheadSlots:    lookahead,
	}
}

func newSpecScheduler(t *testing.T, cfg SchedulerConfig) *Scheduler {
	t.Helper()
	s, err := NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func addSpecSeq(t *testing.T, s *Scheduler, id string, prompt []int, p SamplingParams) *Sequence {
	t.Helper()
	seq := NewSequence(id, prompt, p, zeroTime)
	if _, err := s.Add(seq); err != nil {
		t.Fatal(err)
	}
	return seq
}

// checkSpecInvariants is checkInvariants plus the speculative bookkeeping:
// each sequence's pending tokens and drafts are those of its rows in
// flight, a running sequence with nothing in flight holds no block past
// its computed tokens and lookahead (rejected drafts' blocks went back),
// and no block is committed past the tokens whose KV a processed step
// wrote.
func checkSpecInvariants(s *Scheduler) error {
	if err := s.checkInvariants(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pending := map[*Sequence]int32{}
	drafts := map[*Sequence]int32{}
	for _, rec := range s.inflight {
		for _, e := range rec.entries {
			if e.row >= 0 {
				pending[e.seq]++
				drafts[e.seq] += e.drafts
			}
		}
	}
	bs := s.bm.blockSize
	L := s.cfg.NumLookaheadSlots
	for _, q := range s.seqs {
		if q.numPendingDrafts != drafts[q] {
			return fmt.Errorf("seq %d: %d pending drafts, steps in flight verify %d", q.id, q.numPendingDrafts, drafts[q])
		}
		if q.numPending != pending[q] {
			return fmt.Errorf("seq %d: %d pending tokens, %d rows in flight", q.id, q.numPending, pending[q])
		}
		if q.status == StatusRunning && q.numPending == 0 {
			most := max(s.bm.NumBlocksFor(q.numComputed+L), s.bm.NumBlocksFor(len(q.tokens)), 1)
			if len(q.blockTable) > most {
				return fmt.Errorf("seq %d: %d blocks with nothing in flight, %d computed + %d lookahead need %d",
					q.id, len(q.blockTable), q.numComputed, L, most)
			}
		}
		if q.isLive() && q.numPending == 0 && int(q.numHashedBlocks)*bs > q.numComputed {
			return fmt.Errorf("seq %d: %d blocks committed, only %d tokens computed", q.id, q.numHashedBlocks, q.numComputed)
		}
		if q.isLive() && int(q.numHashedBlocks)*bs > len(q.tokens) {
			return fmt.Errorf("seq %d: %d blocks committed, only %d tokens known", q.id, q.numHashedBlocks, len(q.tokens))
		}
	}
	return nil
}

func mustSpecInvariants(t *testing.T, s *Scheduler, when string) {
	t.Helper()
	if err := checkSpecInvariants(s); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
}

func specSchedule(t *testing.T, s *Scheduler) (*SchedulerOutputs, []SequenceMetadata) {
	t.Helper()
	out, metas := s.Schedule()
	mustSpecInvariants(t, s, fmt.Sprintf("after Schedule of step %d", out.StepID))
	return out, metas
}

func specProcess(t *testing.T, s *Scheduler, step StepID, rows ...SampledTokens) []FinishedSequence {
	t.Helper()
	fin, err := s.ProcessOutputs(step, rows)
	if err != nil {
		t.Fatal(err)
	}
	mustSpecInvariants(t, s, fmt.Sprintf("after ProcessOutputs of step %d", step))
	return fin
}

func row(id SeqID, tokens []int, drafts ...int) SampledTokens {
	return SampledTokens{SeqID: id, TokenIDs: tokens, Drafts: drafts}
}

func metaFor(t *testing.T, metas []SequenceMetadata, id SeqID) SequenceMetadata {
	t.Helper()
	for _, m := range metas {
		if m.SeqID == id {
			return m
		}
	}
	t.Fatalf("seq %d not scheduled (%d metas)", id, len(metas))
	return SequenceMetadata{}
}

// checkExactSlots fails unless every input's slot is the block table's
// slot of its (unshifted) position.
func checkExactSlots(t *testing.T, m SequenceMetadata, bs int) {
	t.Helper()
	if m.SeqlenK != m.PosStart+m.SeqlenQ || len(m.SlotMapping) != m.SeqlenQ || len(m.InputTokenIDs) != m.SeqlenQ {
		t.Fatalf("seq %d: seqlen_k %d, pos %d, q %d, %d slots, %d inputs", m.SeqID, m.SeqlenK, m.PosStart, m.SeqlenQ,
			len(m.SlotMapping), len(m.InputTokenIDs))
	}
	for j := range m.SeqlenQ {
		p := m.PosStart + j
		if p/bs >= len(m.BlockTable) {
			t.Fatalf("seq %d: position %d past its %d blocks", m.SeqID, p, len(m.BlockTable))
		}
		if want := Slot(m.BlockTable, bs, p); m.SlotMapping[j] != want {
			t.Fatalf("seq %d: slot of position %d is %d, block table says %d", m.SeqID, p, m.SlotMapping[j], want)
		}
	}
}

func tokensOf(prompt []int, outs ...[]int) []int {
	return slices.Concat(append([][]int{prompt}, outs...)...)
}

// 1. Strict mode: the decode after a prefill verifies the drafts that the
// prefill's row proposed, laid out exactly.
func TestSpecStrictDecodeLayout(t *testing.T) {
	cases := []struct {
		name       string
		lookahead  int
		drafts     []int
		wantDrafts []int
	}{
		{"k drafts, no lookahead", 0, []int{11, 12, 13}, []int{11, 12, 13}},
		{"k drafts, lookahead 3", 3, []int{11, 12, 13}, []int{11, 12, 13}},
		{"fewer drafts", 0, []int{11, 12}, []int{11, 12}},
		{"more than k drafts: cut", 3, []int{11, 12, 13, 14, 15}, []int{11, 12, 13}},
		{"no drafts: plain decode", 3, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := specConfig(3, c.lookahead)
			cfg.BlockSize = 4
			s := newSpecScheduler(t, cfg)
			prompt := seqOf(1, 2, 3, 4, 5, 6)
			seq := addSpecSeq(t, s, "a", prompt, longParams(20))
			out, metas := specSchedule(t, s)
			if len(metas) != 1 || !metas[0].Prefill || !metas[0].Sample || metas[0].NumDrafts != 0 || metas[0].Shifted || out.NumDraftTokens != 0 {
				t.Fatalf("prefill: %+v, %+v", out, metas)
			}
			specProcess(t, s, out.StepID, row(seq.ID(), []int{10}, c.drafts...))

			out, metas = specSchedule(t, s)
			m := metaFor(t, metas, seq.ID())
			q := len(c.wantDrafts)
			wantIn := append([]int{10}, c.wantDrafts...)
			if m.Prefill || !m.Sample || m.SampleRow != 0 || m.NumDrafts != q || m.Shifted || m.InputFromRow != -1 {
				t.Fatalf("decode meta: %+v", m)
			}
			if !slices.Equal(m.InputTokenIDs, wantIn) || m.SeqlenQ != 1+q || m.PosStart != len(prompt) || m.SeqlenK != len(prompt)+1+q {
				t.Fatalf("decode inputs %v at %d (q %d, k %d), want %v at %d", m.InputTokenIDs, m.PosStart, m.SeqlenQ, m.SeqlenK, wantIn, len(prompt))
			}
			checkExactSlots(t, m, cfg.BlockSize)
			if out.Kind != StepDecode || out.NumDraftTokens != q || out.NumDecodeTokens != 1+q || out.NumBatchedTokens != 1+q || out.NumSampleRows != 1 {
				t.Fatalf("outputs: %+v", out)
			}
			if !slices.Equal(out.InputTokenIDs, wantIn) || !slices.Equal(out.SlotMapping, m.SlotMapping) {
				t.Fatalf("flat inputs %v slots %v, meta %v %v", out.InputTokenIDs, out.SlotMapping, m.InputTokenIDs, m.SlotMapping)
			}
			// Slots for every input and the drafter's lookahead; only the
			// first input counts as computed until the outcome is known.
			if want := s.bm.NumBlocksFor(len(prompt) + 1 + q + c.lookahead); len(m.BlockTable) != want || len(seq.blockTable) != want {
				t.Fatalf("%d blocks (sequence %d), want %d", len(m.BlockTable), len(seq.blockTable), want)
			}
			if seq.NumComputedTokens() != len(prompt)+1 || seq.numPendingDrafts != int32(q) {
				t.Fatalf("computed %d, pending drafts %d", seq.NumComputedTokens(), seq.numPendingDrafts)
			}
		})
	}
}

// plainReplay runs one sequence without speculation through a fresh
// Scheduler, emitting the given output tokens one per step, and returns
// the Scheduler and the sequence once it holds them all.
func plainReplay(t *testing.T, cfg SchedulerConfig, prompt, outputs []int) (*Scheduler, *Sequence) {
	t.Helper()
	cfg.NumSpeculativeTokens, cfg.NumLookaheadSlots = 0, 0
	s := newSpecScheduler(t, cfg)
	seq := addSpecSeq(t, s, "plain", prompt, longParams(1000))
	for _, tok := range outputs {
		out, metas := s.Schedule()
		if len(metas) != 1 || metas[0].SeqlenK != seq.NumTokens() {
			t.Fatalf("plain replay: %+v", metas)
		}
		if _, err := s.ProcessOutputs(out.StepID, []SampledTokens{row(seq.ID(), []int{tok})}); err != nil {
			t.Fatal(err)
		}
		if err := s.checkInvariants(); err != nil {
			t.Fatal(err)
		}
	}
	return s, seq
}

// cachedHashes returns the hashes in the prefix cache.
func cachedHashes(bm *BlockManager) []uint64 {
	var hs []uint64
	bm.hashToBlock.each(func(h uint64, _ int32) { hs = append(hs, h) })
	slices.Sort(hs)
	return hs
}

// 2. One batch, three outcomes (all accepted, all rejected, mixed), over
// several rounds: tokens, computed counts, the blocks each sequence holds
// (exactly its computed tokens plus lookahead: rejected drafts' blocks go
// back), and the prefix cache, which must be what a run without
// speculation emitting the same tokens one per step commits.
func TestSpecAcceptRejectAccounting(t *testing.T) {
	for _, lookahead := range []int{0, 2} {
		t.Run(fmt.Sprint("lookahead ", lookahead), func(t *testing.T) {
			cfg := specConfig(3, lookahead)
			s := newSpecScheduler(t, cfg)
			prompts := [][]int{seqOf(1, 2, 3, 4, 5), seqOf(6, 7, 8, 9, 10), seqOf(11, 12, 13, 14, 15)}
			seqs := make([]*Sequence, 3)
			for i, p := range prompts {
				seqs[i] = addSpecSeq(t, s, fmt.Sprint("r", i), p, longParams(100))
			}
			want := make([][]int, 3) // outputs so far
			out, metas := specSchedule(t, s)
			if len(metas) != 3 {
				t.Fatalf("prefill: %d metas", len(metas))
			}
			var rows []SampledTokens
			for i, sq := range seqs {
				tok := 20 + i
				want[i] = []int{tok}
				rows = append(rows, row(sq.ID(), []int{tok}, 30+10*i, 31+10*i, 32+10*i))
			}
			specProcess(t, s, out.StepID, rows...)

			// accepted[round][seq]: drafts accepted; the bonus token follows.
			accepted := [][]int{{3, 0, 1}, {0, 3, 2}, {1, 1, 0}, {2, 0, 3}}
			next := 40
			for round, acc := range accepted {
				out, metas := specSchedule(t, s)
				if out.NumDraftTokens != 9 || len(metas) != 3 {
					t.Fatalf("round %d: %d drafts in %d metas", round, out.NumDraftTokens, len(metas))
				}
				freeBefore := s.bm.NumFreeBlocks()
				held := 0
				rows = rows[:0]
				for i, sq := range seqs {
					m := metaFor(t, metas, sq.ID())
					if m.NumDrafts != 3 || m.SeqlenQ != 4 || m.Shifted {
						t.Fatalf("round %d seq %d: %+v", round, i, m)
					}
					checkExactSlots(t, m, cfg.BlockSize)
					held += len(sq.blockTable)
					toks := append(slices.Clone(m.InputTokenIDs[1:1+acc[i]]), next)
					next++
					want[i] = append(want[i], toks...)
					rows = append(rows, row(sq.ID(), toks, next, next+1, next+2))
					next += 3
				}
				if fin := specProcess(t, s, out.StepID, rows...); len(fin) != 0 {
					t.Fatalf("round %d: finished %+v", round, fin)
				}
				heldAfter := 0
				for i, sq := range seqs {
					wantTokens := tokensOf(prompts[i], want[i])
					if !slices.Equal(sq.TokenIDs(), wantTokens) {
						t.Fatalf("round %d seq %d: tokens %v, want %v", round, i, sq.TokenIDs(), wantTokens)
					}
					if sq.NumComputedTokens() != len(wantTokens)-1 {
						t.Fatalf("round %d seq %d: %d computed of %d tokens", round, i, sq.NumComputedTokens(), len(wantTokens))
					}
					if w := s.bm.NumBlocksFor(sq.NumComputedTokens() + lookahead); len(sq.blockTable) != w {
						t.Fatalf("round %d seq %d: %d blocks, want %d (%d computed + %d lookahead)", round, i, len(sq.blockTable), w,
							sq.NumComputedTokens(), lookahead)
					}
					heldAfter += len(sq.blockTable)
				}
				if got := s.bm.NumFreeBlocks(); got != freeBefore+held-heldAfter || got != cfg.NumBlocks-heldAfter {
					t.Fatalf("round %d: %d free blocks, %d before, held %d then %d of %d", round, got, freeBefore, held, heldAfter, cfg.NumBlocks)
				}
				// The same tokens, one per step, without speculation.
				var plainHashes []uint64
				for i, sq := range seqs {
					ps, pq := plainReplay(t, cfg, prompts[i], want[i])
					if !slices.Equal(pq.TokenIDs(), sq.TokenIDs()) || pq.NumComputedTokens() != sq.NumComputedTokens() {
						t.Fatalf("round %d seq %d: plain %v (%d computed), speculative %v (%d computed)", round, i,
							pq.TokenIDs(), pq.NumComputedTokens(), sq.TokenIDs(), sq.NumComputedTokens())
					}
					if pq.numHashedBlocks != sq.numHashedBlocks || pq.lastHash != sq.lastHash {
						t.Fatalf("round %d seq %d: plain committed %d blocks (hash %x), speculative %d (hash %x)", round, i,
							pq.numHashedBlocks, pq.lastHash, sq.numHashedBlocks, sq.lastHash)
					}
					plainHashes = append(plainHashes, cachedHashes(ps.bm)...)
				}
				slices.Sort(plainHashes)
				if got := cachedHashes(s.bm); !slices.Equal(got, plainHashes) {
					t.Fatalf("round %d: prefix cache %x, plain runs %x", round, got, plainHashes)
				}
			}
			for _, sq := range seqs {
				if _, err := s.FinishSequence(sq.ID(), FinishStop); err != nil {
					t.Fatal(err)
				}
			}
			mustSpecInvariants(t, s, "after finishing")
			if s.bm.NumUsedBlocks() != 0 || s.sm.NumUsed() != 0 {
				t.Fatalf("%d blocks, %d state slots held at the end", s.bm.NumUsedBlocks(), s.sm.NumUsed())
			}
		})
	}
}

// 3. Drafts are cut by max_tokens, max_model_len and the token budget, and
// the reservation covers only what is verified.
func TestSpecDraftCuts(t *testing.T) {
	cases := []struct {
		name       string
		mod        func(*SchedulerConfig)
		prompt     int // tokens
		maxTokens  int
		wantDrafts int
	}{
		{"max_tokens: 2 outputs left", nil, 5, 3, 1},
		{"max_tokens: 1 output left", nil, 5, 2, 0},
		{"max_tokens: room for all", nil, 5, 5, 3},
		{"max_model_len", func(c *SchedulerConfig) { c.MaxModelLen = 12 }, 9, 100, 2},
		{"max_model_len with lookahead (the lookahead is cut, not the drafts)", func(c *SchedulerConfig) { c.MaxModelLen = 12; c.NumLookaheadSlots = 1 }, 9, 100, 2},
		{"max_model_len: one position left", func(c *SchedulerConfig) { c.MaxModelLen = 12 }, 10, 100, 1},
		{"max_model_len: a long lookahead cuts no draft", func(c *SchedulerConfig) { c.MaxModelLen = 12; c.NumLookaheadSlots = 3 }, 8, 100, 3},
		{"budget", func(c *SchedulerConfig) { c.MaxNumBatchedTokens = 3; c.MaxNumSeqs = 1 }, 2, 100, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := specConfig(3, 0)
			if c.mod != nil {
				c.mod(&cfg)
			}
			s := newSpecScheduler(t, cfg)
			prompt := make([]int, c.prompt)
			for i := range prompt {
				prompt[i] = 1 + i
			}
			seq := addSpecSeq(t, s, "a", prompt, longParams(c.maxTokens))
			var out *SchedulerOutputs
			for seq.NumComputedTokens() < len(prompt) { // chunks when the budget is small
				out, _ = specSchedule(t, s)
				if seq.NumComputedTokens() < len(prompt) {
					specProcess(t, s, out.StepID)
				}
			}
			specProcess(t, s, out.StepID, row(seq.ID(), []int{50}, 51, 52, 53))
			out, metas := specSchedule(t, s)
			m := metaFor(t, metas, seq.ID())
			if m.NumDrafts != c.wantDrafts || out.NumDraftTokens != c.wantDrafts || m.SeqlenQ != 1+c.wantDrafts {
				t.Fatalf("%d drafts (step: %d, q %d), want %d", m.NumDrafts, out.NumDraftTokens, m.SeqlenQ, c.wantDrafts)
			}
			if !slices.Equal(m.InputTokenIDs, []int{50, 51, 52, 53}[:1+c.wantDrafts]) {
				t.Fatalf("inputs %v", m.InputTokenIDs)
			}
			checkExactSlots(t, m, cfg.BlockSize)
			if last := m.PosStart + m.NumDrafts; c.wantDrafts > 0 && last >= cfg.MaxModelLen {
				t.Fatalf("drafts reach position %d, max_model_len %d", last, cfg.MaxModelLen)
			}
			numOut := seq.NumOutputTokens()
			if numOut+1+m.NumDrafts > c.maxTokens && m.NumDrafts > 0 {
				t.Fatalf("%d outputs + %d may exceed max_tokens %d", numOut, 1+m.NumDrafts, c.maxTokens)
			}
			// Nothing reserved for cut drafts.
			if want := s.bm.NumBlocksFor(min(m.PosStart+1+m.NumDrafts+cfg.NumLookaheadSlots, cfg.MaxModelLen)); len(seq.blockTable) != max(want, s.bm.NumBlocksFor(len(prompt))) {
				t.Fatalf("%d blocks, want %d", len(seq.blockTable), want)
			}
			if out.NumBatchedTokens > cfg.MaxNumBatchedTokens {
				t.Fatalf("%d tokens, budget %d", out.NumBatchedTokens, cfg.MaxNumBatchedTokens)
			}
		})
	}
}

// The budget is shared: the oldest sequence's drafts take it first, and a
// sequence left with one token decodes without drafts (nothing reserved
// for them); its row's proposal then replaces them.
func TestSpecDraftCutByBudgetBetweenSequences(t *testing.T) {
	cfg := specConfig(3, 1)
	cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens = 2, 5
	s := newSpecScheduler(t, cfg)
	a := addSpecSeq(t, s, "a", seqOf(1, 2), longParams(50))
	b := addSpecSeq(t, s, "b", seqOf(3, 4), longParams(50))
	out, metas := specSchedule(t, s)
	if len(metas) != 2 {
		t.Fatalf("prefill: %+v", metas)
	}
	specProcess(t, s, out.StepID, row(a.ID(), []int{5}, 6, 7, 8), row(b.ID(), []int{9}, 10, 11, 12))
	out, metas = specSchedule(t, s)
	ma, mb := metaFor(t, metas, a.ID()), metaFor(t, metas, b.ID())
	if ma.NumDrafts != 3 || mb.NumDrafts != 0 || !slices.Equal(mb.InputTokenIDs, []int{9}) || out.NumBatchedTokens != 5 || out.NumDraftTokens != 3 {
		t.Fatalf("a %d drafts, b %d drafts %v, %d tokens", ma.NumDrafts, mb.NumDrafts, mb.InputTokenIDs, out.NumBatchedTokens)
	}
	if want := s.bm.NumBlocksFor(mb.PosStart + 1 + cfg.NumLookaheadSlots); len(b.blockTable) != want {
		t.Fatalf("b holds %d blocks, want %d: cut drafts reserved", len(b.blockTable), want)
	}
	// b's row proposes nothing new: the next step has no drafts for it
	// (the drafts are the proposal after the sequence's last token).
	specProcess(t, s, out.StepID, row(a.ID(), []int{6, 7, 8, 13}, 14), row(b.ID(), []int{15}))
	_, metas = specSchedule(t, s)
	if ma, mb = metaFor(t, metas, a.ID()), metaFor(t, metas, b.ID()); ma.NumDrafts != 1 || mb.NumDrafts != 0 {
		t.Fatalf("a %d drafts, b %d drafts", ma.NumDrafts, mb.NumDrafts)
	}
}

// seqSnapshot is what a rejected ProcessOutputs must leave unchanged.
type seqSnapshot struct {
	tokens                []int
	numComputed           int
	numPending            int32
	numPendingDrafts      int32
	drafts, blocks        []int
	numHashed             int32
	freeBlocks, inflight  int
	status                SequenceStatus
	cached                []uint64
	numFreeSlots, numLive int
}

func snapshot(s *Scheduler, seq *Sequence) seqSnapshot {
	return seqSnapshot{
		tokens: slices.Clone(seq.tokens), numComputed: seq.numComputed, numPending: seq.numPending,
		numPendingDrafts: seq.numPendingDrafts, drafts: slices.Clone(seq.drafts), blocks: slices.Clone(seq.blockTable),
		numHashed: seq.numHashedBlocks, freeBlocks: s.bm.NumFreeBlocks(), inflight: s.NumInflightSteps(),
		status: seq.status, cached: cachedHashes(s.bm), numFreeSlots: s.sm.NumFree(), numLive: s.numLive,
	}
}

func (a seqSnapshot) equal(b seqSnapshot) bool {
	return slices.Equal(a.tokens, b.tokens) && a.numComputed == b.numComputed && a.numPending == b.numPending &&
		a.numPendingDrafts == b.numPendingDrafts && slices.Equal(a.drafts, b.drafts) && slices.Equal(a.blocks, b.blocks) &&
		a.numHashed == b.numHashed && a.freeBlocks == b.freeBlocks && a.inflight == b.inflight && a.status == b.status &&
		slices.Equal(a.cached, b.cached) && a.numFreeSlots == b.numFreeSlots && a.numLive == b.numLive
}

// ProcessOutputs refuses a row with more tokens than its drafts + 1 (a
// prefill row: more than one), changing nothing.
func TestSpecProcessOutputsTooManyTokens(t *testing.T) {
	s := newSpecScheduler(t, specConfig(3, 1))
	a := addSpecSeq(t, s, "a", seqOf(1, 2, 3, 4, 5), longParams(50))
	b := addSpecSeq(t, s, "b", seqOf(6, 7, 8), longParams(50))
	out, _ := specSchedule(t, s)
	before := snapshot(s, a)
	if _, err := s.ProcessOutputs(out.StepID, []SampledTokens{row(a.ID(), []int{9, 10}), row(b.ID(), []int{11})}); !errors.Is(err, ErrStepMismatch) {
		t.Fatalf("prefill row with 2 tokens: %v", err)
	}
	if !snapshot(s, a).equal(before) {
		t.Fatal("rejected prefill outputs changed the sequence")
	}
	specProcess(t, s, out.StepID, row(a.ID(), []int{9}, 20, 21), row(b.ID(), []int{11}, 22, 23, 24))
	out, metas := specSchedule(t, s)
	if metaFor(t, metas, a.ID()).NumDrafts != 2 || metaFor(t, metas, b.ID()).NumDrafts != 3 {
		t.Fatalf("drafts: %+v", metas)
	}
	beforeA, beforeB := snapshot(s, a), snapshot(s, b)
	bad := [][]SampledTokens{
		{row(a.ID(), []int{20, 21, 30, 31}), row(b.ID(), []int{22})},             // a: 4 tokens, 2 drafts
		{row(a.ID(), []int{20}), row(b.ID(), []int{22, 23, 24, 30, 31})},         // b: 5 tokens, 3 drafts
		{row(a.ID(), []int{20, 21, 30}), row(b.ID(), []int{22, 23, 24, 30, 31})}, // a fine, b not: nothing applied
		{row(a.ID(), []int{20, 21, 30})},                                         // missing row
	}
	for i, sampled := range bad {
		if _, err := s.ProcessOutputs(out.StepID, sampled); !errors.Is(err, ErrStepMismatch) {
			t.Fatalf("case %d: %v, want ErrStepMismatch", i, err)
		}
		if !snapshot(s, a).equal(beforeA) || !snapshot(s, b).equal(beforeB) {
			t.Fatalf("case %d: a rejected call changed the state", i)
		}
		mustSpecInvariants(t, s, fmt.Sprint("after rejected call ", i))
	}
	specProcess(t, s, out.StepID, row(a.ID(), []int{20, 21, 30}), row(b.ID(), []int{22, 23, 24, 31}))
	if !slices.Equal(a.OutputTokenIDs(), []int{9, 20, 21, 30}) || !slices.Equal(b.OutputTokenIDs(), []int{11, 22, 23, 24, 31}) {
		t.Fatalf("outputs %v, %v", a.OutputTokenIDs(), b.OutputTokenIDs())
	}
}

// chainHash is the prefix-cache hash of a sequence's first n full blocks.
func chainHash(tokens []int, bs, n int) uint64 {
	h := rootHash
	for i := range n {
		h = hashBlock(h, tokens[i*bs:(i+1)*bs])
	}
	return h
}

// 4. Zero-overhead scheduling: a sequence whose speculative step N is in
// flight decodes in N+1 with k placeholder inputs laid out as if N accepted
// nothing (Shifted), over blocks that cover any shift; ProcessOutputs of N
// then shifts its computed count by the accepted drafts.
func TestSpecZOSShift(t *testing.T) {
	const k = 3
	for _, lookahead := range []int{0, 2} {
		for _, acc := range []int{0, k} {
			t.Run(fmt.Sprintf("lookahead %d, accepted %d", lookahead, acc), func(t *testing.T) {
				cfg := specConfig(k, lookahead)
				s := newSpecScheduler(t, cfg)
				bs := cfg.BlockSize
				// x is older: its rows come first, so y's rows are row 1.
				x := addSpecSeq(t, s, "x", seqOf(1, 2, 3, 4, 5), longParams(100))
				y := addSpecSeq(t, s, "y", seqOf(6, 7, 8, 9, 10, 11, 12), longParams(100))
				seqs := []*Sequence{x, y}
				out1, _ := specSchedule(t, s)
				specProcess(t, s, out1.StepID, row(x.ID(), []int{20}, 21, 22, 23), row(y.ID(), []int{30}, 31, 32, 33))

				out2, metas2 := specSchedule(t, s) // verifies the drafts; left in flight
				out3, metas3 := specSchedule(t, s)
				if len(metas3) != 2 || out3.NumDraftTokens != 2*k {
					t.Fatalf("step 3: %d metas, %d drafts", len(metas3), out3.NumDraftTokens)
				}
				for _, sq := range seqs {
					m2, m3 := metaFor(t, metas2, sq.ID()), metaFor(t, metas3, sq.ID())
					if m2.NumDrafts != k || m2.Shifted {
						t.Fatalf("step 2 seq %d: %+v", sq.ID(), m2)
					}
					if m3.NumDrafts != k || m3.SeqlenQ != 1+k || !m3.Shifted || m3.InputFromRow != m2.SampleRow || m3.Prefill || !m3.Sample {
						t.Fatalf("step 3 seq %d: %+v", sq.ID(), m3)
					}
					for _, tok := range m3.InputTokenIDs {
						if tok != PlaceholderToken {
							t.Fatalf("step 3 seq %d: inputs %v, want placeholders", sq.ID(), m3.InputTokenIDs)
						}
					}
					// Laid out as if step 2 accepted nothing: step 2's first
					// input, then step 2's bonus token.
					if m3.PosStart != m2.PosStart+1 || m3.PosStart != sq.NumTokens() || sq.NumComputedTokens() != m3.PosStart+1 {
						t.Fatalf("step 3 seq %d: pos %d, step 2 at %d, %d tokens, %d computed", sq.ID(), m3.PosStart, m2.PosStart,
							sq.NumTokens(), sq.NumComputedTokens())
					}
					checkExactSlots(t, m3, bs)
					// Any shift 0..k of step 3's inputs, plus the lookahead.
					if need := m3.PosStart + k + 1 + k + lookahead; len(m3.BlockTable) != s.bm.NumBlocksFor(need) {
						t.Fatalf("step 3 seq %d: %d blocks, the largest shift needs %d positions", sq.ID(), len(m3.BlockTable), need)
					}
					if sq.numPendingDrafts != 2*k || sq.numPending != 2 {
						t.Fatalf("seq %d: %d pending drafts, %d pending", sq.ID(), sq.numPendingDrafts, sq.numPending)
					}
				}
				if !slices.Contains(out3.InputTokenIDs, PlaceholderToken) {
					t.Fatal("flat inputs without placeholders")
				}

				// Step 2's outcome: x accepts acc drafts, y the others.
				accepted := map[SeqID]int{x.ID(): acc, y.ID(): k - acc}
				want := map[SeqID][]int{x.ID(): {20}, y.ID(): {30}}
				var rows2 []SampledTokens
				for i, sq := range seqs {
					m2 := metaFor(t, metas2, sq.ID())
					a := accepted[sq.ID()]
					toks := append(slices.Clone(m2.InputTokenIDs[1:1+a]), 40+i)
					want[sq.ID()] = append(want[sq.ID()], toks...)
					rows2 = append(rows2, row(sq.ID(), toks, 50, 51, 52)) // drafts for step 4: step 3 is already planned
				}
				computed := map[SeqID]int{x.ID(): x.NumComputedTokens(), y.ID(): y.NumComputedTokens()}
				specProcess(t, s, out2.StepID, rows2...)
				for _, sq := range seqs {
					a := accepted[sq.ID()]
					if sq.NumComputedTokens() != computed[sq.ID()]+a || sq.numPendingDrafts != k || sq.numPending != 1 {
						t.Fatalf("seq %d after step 2: %d computed (was %d, %d accepted), %d pending drafts", sq.ID(),
							sq.NumComputedTokens(), computed[sq.ID()], a, sq.numPendingDrafts)
					}
					// Step 3's real layout and the drafter's lookahead are kept;
					// the blocks for larger shifts went back.
					if w := s.bm.NumBlocksFor(sq.NumComputedTokens() + k + lookahead); len(sq.blockTable) != w {
						t.Fatalf("seq %d after step 2: %d blocks, want %d", sq.ID(), len(sq.blockTable), w)
					}
					m3 := metaFor(t, metas3, sq.ID())
					if shifted := m3.PosStart + a + k + lookahead; shifted > len(sq.blockTable)*bs {
						t.Fatalf("seq %d: step 3 shifted by %d reaches position %d, %d blocks kept", sq.ID(), a, shifted, len(sq.blockTable))
					}
				}

				// Step 3's outcome: x accepts one draft, y all of them.
				rows3 := []SampledTokens{row(x.ID(), []int{60, 61}, 62, 63), row(y.ID(), []int{70, 71, 72, 73}, 74)}
				want[x.ID()] = append(want[x.ID()], 60, 61)
				want[y.ID()] = append(want[y.ID()], 70, 71, 72, 73)
				specProcess(t, s, out3.StepID, rows3...)
				prompts := map[SeqID][]int{x.ID(): seqOf(1, 2, 3, 4, 5), y.ID(): seqOf(6, 7, 8, 9, 10, 11, 12)}
				for _, sq := range seqs {
					wt := tokensOf(prompts[sq.ID()], want[sq.ID()])
					if !slices.Equal(sq.TokenIDs(), wt) || sq.NumComputedTokens() != len(wt)-1 || sq.numPending != 0 || sq.numPendingDrafts != 0 {
						t.Fatalf("seq %d: tokens %v (%d computed), want %v", sq.ID(), sq.TokenIDs(), sq.NumComputedTokens(), wt)
					}
					if w := s.bm.NumBlocksFor(sq.NumComputedTokens() + lookahead); len(sq.blockTable) != w {
						t.Fatalf("seq %d at the end: %d blocks, want %d", sq.ID(), len(sq.blockTable), w)
					}
					if sq.lastHash != chainHash(sq.tokens, bs, int(sq.numHashedBlocks)) {
						t.Fatalf("seq %d: committed hash chain is not its tokens'", sq.ID())
					}
				}

				// Step 4 is exact again and verifies step 3's drafts.
				_, metas4 := specSchedule(t, s)
				for _, sq := range seqs {
					m4 := metaFor(t, metas4, sq.ID())
					wantIn := map[SeqID][]int{x.ID(): {61, 62, 63}, y.ID(): {73, 74}}[sq.ID()]
					if m4.Shifted || m4.InputFromRow != -1 || m4.PosStart != sq.NumTokens()-1 || !slices.Equal(m4.InputTokenIDs, wantIn) {
						t.Fatalf("step 4 seq %d: %+v", sq.ID(), m4)
					}
					checkExactSlots(t, m4, bs)
				}
			})
		}
	}
}

// With ZOS, once both steps are processed, the prefix cache holds what a
// strict run with the same tokens commits. Fails (minor, cache efficiency
// only): step N+1's stepEntry.computedAfter was recorded assuming step N
// accepted nothing, and ProcessOutputs commits N+1 up to computedAfter +
// accepted, so it lags by N's accepted drafts until the next step's commit
// (forever when the sequence finishes at N+1).
func TestSpecZOSCommitsLikeStrict(t *testing.T) {
	const k = 3
	cfg := specConfig(k, 0)
	s := newSpecScheduler(t, cfg)
	prompt := seqOf(1, 2, 3, 4, 5)
	x := addSpecSeq(t, s, "x", prompt, longParams(100))
	out1, _ := specSchedule(t, s)
	specProcess(t, s, out1.StepID, row(x.ID(), []int{20}, 21, 22, 23))
	out2, _ := specSchedule(t, s)
	out3, _ := specSchedule(t, s)
	specProcess(t, s, out2.StepID, row(x.ID(), []int{21, 22, 23, 24}))
	specProcess(t, s, out3.StepID, row(x.ID(), []int{25, 26, 27, 28}))
	outputs := []int{20, 21, 22, 23, 24, 25, 26, 27, 28}
	_, plain := plainReplay(t, cfg, prompt, outputs)
	if !slices.Equal(x.TokenIDs(), plain.TokenIDs()) || x.NumComputedTokens() != plain.NumComputedTokens() {
		t.Fatalf("tokens %v (%d computed), plain %v (%d)", x.TokenIDs(), x.NumComputedTokens(), plain.TokenIDs(), plain.NumComputedTokens())
	}
	if x.numHashedBlocks != plain.numHashedBlocks {
		t.Errorf("ZOS committed %d blocks after its steps, a strict run with the same tokens %d (%d computed tokens)",
			x.numHashedBlocks, plain.numHashedBlocks, x.NumComputedTokens())
	}
}

// A sequence that finishes in a speculative step keeps, in the prefix
// cache, the blocks its accepted drafts computed, as a run without
// speculation emitting the same tokens does. Fails (minor, cache
// efficiency only): ProcessOutputs finishes (and frees) the sequence inside
// the token loop, so the commit of computedAfter + accepted that follows
// is skipped.
func TestSpecFinishCommitsAcceptedDrafts(t *testing.T) {
	cfg := specConfig(3, 0)
	s := newSpecScheduler(t, cfg)
	prompt := seqOf(1, 2, 3, 4, 5)
	x := addSpecSeq(t, s, "x", prompt, longParams(5))
	out, _ := specSchedule(t, s)
	specProcess(t, s, out.StepID, row(x.ID(), []int{20}, 21, 22, 23))
	out, metas := specSchedule(t, s)
	if m := metaFor(t, metas, x.ID()); m.NumDrafts != 3 {
		t.Fatalf("%d drafts", m.NumDrafts)
	}
	fin := specProcess(t, s, out.StepID, row(x.ID(), []int{21, 22, 23, 24})) // max_tokens 5 reached
	if len(fin) != 1 || fin[0].Reason != FinishLength || !slices.Equal(fin[0].OutputTokenIDs, []int{20, 21, 22, 23, 24}) {
		t.Fatalf("finished %+v", fin)
	}
	// Without speculation: the same five outputs, the last one finishing.
	ps := newSpecScheduler(t, func() SchedulerConfig { c := cfg; c.NumSpeculativeTokens = 0; return c }())
	p := addSpecSeq(t, ps, "x", prompt, longParams(5))
	for _, tok := range []int{20, 21, 22, 23, 24} {
		out, _ := ps.Schedule()
		if _, err := ps.ProcessOutputs(out.StepID, []SampledTokens{row(p.ID(), []int{tok})}); err != nil {
			t.Fatal(err)
		}
	}
	if !p.IsFinished() || !slices.Equal(p.OutputTokenIDs(), fin[0].OutputTokenIDs) {
		t.Fatalf("plain run: %v %v", p.Status(), p.OutputTokenIDs())
	}
	// Positions 0..8 were computed in both runs: 4 full blocks of 2.
	if got, want := cachedHashes(s.bm), cachedHashes(ps.bm); !slices.Equal(got, want) {
		t.Errorf("prefix cache after finishing: %d blocks with speculation, %d without (accepted drafts of the last step not committed)",
			len(got), len(want))
	}
}

// 4b. Every shift a row can receive must be covered by its block table.
// Fails (bug): with ZOS and no lookahead slots (the ngram drafter), step N
// verifies drafts up to position max_model_len-1; step N+1, planned before
// N's outcome, gets slots capped at max_model_len (draftsFor: slots =
// min(shift+1+q+L, MaxModelLen-numComputed)), but when N accepts every
// draft the device shifts N+1's input to position max_model_len, which has
// no block: ShiftAccepted fails the whole step with ErrOutOfRange (CPU) or
// reports it at the next sync (CUDA). The sequence itself finished at N
// (max_model_len), but its N+1 row is already on the device.
func TestSpecZOSShiftPastMaxModelLen(t *testing.T) {
	const k = 3
	cfg := specConfig(k, 0) // the ngram drafter: no lookahead slots
	cfg.MaxModelLen, cfg.BlockSize = 20, 4
	s := newSpecScheduler(t, cfg)
	prompt := make([]int, 16)
	for i := range prompt {
		prompt[i] = 1 + i
	}
	x := addSpecSeq(t, s, "x", prompt, longParams(100))
	out1, _ := specSchedule(t, s)
	specProcess(t, s, out1.StepID, row(x.ID(), []int{30}, 31, 32, 33))
	out2, metas2 := specSchedule(t, s)
	m2 := metaFor(t, metas2, x.ID())
	if m2.NumDrafts != k || m2.PosStart+m2.NumDrafts != cfg.MaxModelLen-1 {
		t.Fatalf("step 2: %d drafts from %d", m2.NumDrafts, m2.PosStart)
	}
	out3, metas3 := specSchedule(t, s) // step 2 in flight
	for _, m3 := range metas3 {
		if !m3.Shifted {
			continue
		}
		// The largest shift is the drafts step 2 verifies.
		for a := 0; a <= m2.NumDrafts; a++ {
			if last := m3.PosStart + a + m3.SeqlenQ - 1; last/cfg.BlockSize >= len(m3.BlockTable) {
				t.Errorf("step 3 seq %d planned at %d (q %d) over %d blocks: shifted by %d accepted drafts, position %d has no block"+
					" (max_model_len %d)", m3.SeqID, m3.PosStart, m3.SeqlenQ, len(m3.BlockTable), a, last, cfg.MaxModelLen)
			}
		}
	}
	// Step 2 accepts all three drafts: the sequence reaches max_model_len
	// and finishes, but the device has already run step 3 with that shift.
	fin := specProcess(t, s, out2.StepID, row(x.ID(), []int{31, 32, 33, 34}))
	if len(fin) != 1 || fin[0].Reason != FinishLength || len(prompt)+len(fin[0].OutputTokenIDs) != cfg.MaxModelLen {
		t.Fatalf("finished %+v", fin)
	}
	if out3.StepID != 0 {
		specProcess(t, s, out3.StepID, row(x.ID(), []int{40}))
	}
	if s.HasUnfinished() || s.bm.NumUsedBlocks() != 0 {
		t.Fatal("resources held at the end")
	}
}

// 5. Preemption while a speculative step is in flight: the oldest
// sequence's reservation (shift + k + 1) takes the youngest's blocks; the
// victim's in-flight tokens are still appended, its drafts dropped, and it
// is recomputed later (verifying the recompute's drafts, not stale ones).
func TestSpecPreemptInFlight(t *testing.T) {
	const k = 2
	for _, prefixCaching := range []bool{false, true} {
		t.Run(fmt.Sprint("prefix caching ", prefixCaching), func(t *testing.T) {
			cfg := specConfig(k, 0)
			cfg.NumBlocks, cfg.EnablePrefixCaching = 7, prefixCaching
			s := newSpecScheduler(t, cfg)
			a := addSpecSeq(t, s, "a", seqOf(1, 2, 3), longParams(6))
			b := addSpecSeq(t, s, "b", seqOf(4, 5, 6), longParams(6))
			out1, _ := specSchedule(t, s)
			specProcess(t, s, out1.StepID, row(a.ID(), []int{10}, 11, 12), row(b.ID(), []int{20}, 21, 22))
			out2, metas2 := specSchedule(t, s) // both verify 2 drafts: 6 of 7 blocks
			if len(metas2) != 2 || s.bm.NumFreeBlocks() != 1 {
				t.Fatalf("step 2: %d metas, %d free blocks", len(metas2), s.bm.NumFreeBlocks())
			}
			out3, metas3 := specSchedule(t, s) // a needs shift 2 + 1 + 2 slots: b goes
			if !slices.Equal(out3.PreemptedSeqIDs, []SeqID{b.ID()}) || len(metas3) != 1 || metas3[0].SeqID != a.ID() || !metas3[0].Shifted {
				t.Fatalf("step 3: preempted %v, metas %+v", out3.PreemptedSeqIDs, metas3)
			}
			if b.Status() != StatusPreempted || len(b.blockTable) != 0 || b.drafts != nil || b.NumComputedTokens() != 0 {
				t.Fatalf("b: %v, %d blocks, drafts %v, %d computed", b.Status(), len(b.blockTable), b.drafts, b.NumComputedTokens())
			}
			// b's row of step 2 ran on intact KV: its tokens count.
			specProcess(t, s, out2.StepID, row(a.ID(), []int{11, 12, 13}, 90), row(b.ID(), []int{21, 23}, 91, 92))
			if !slices.Equal(b.OutputTokenIDs(), []int{20, 21, 23}) || b.numPending != 0 || b.numPendingDrafts != 0 {
				t.Fatalf("b after step 2: %v, %d pending, %d pending drafts", b.OutputTokenIDs(), b.numPending, b.numPendingDrafts)
			}
			specProcess(t, s, out3.StepID, row(a.ID(), []int{14}, 15, 16))

			// Run to the end: each row accepts its first draft.
			outs := map[SeqID][]int{}
			sawRecompute := false
			next := 100
			for steps := 0; s.HasUnfinished(); steps++ {
				if steps > 50 {
					t.Fatalf("not done: %+v", s.Stats())
				}
				out, metas := specSchedule(t, s)
				var rows []SampledTokens
				for _, m := range metas {
					if m.SeqID == b.ID() && m.Prefill {
						sawRecompute = true
						if m.SeqlenK != b.NumTokens() || m.NumDrafts != 0 {
							t.Fatalf("b's recompute: %+v", m)
						}
					}
					if m.SeqID == b.ID() && !m.Prefill && sawRecompute && m.NumDrafts > 0 && m.InputTokenIDs[1] != 200 {
						t.Fatalf("b's first decode after the recompute verifies %v, not the recompute's drafts", m.InputTokenIDs)
					}
					if !m.Sample {
						continue
					}
					toks := []int{next}
					if m.NumDrafts > 0 {
						toks = []int{m.InputTokenIDs[1], next}
					}
					next++
					drafts := []int{next, next + 1}
					if m.SeqID == b.ID() && m.Prefill {
						drafts = []int{200, 201}
					}
					next += 2
					rows = append(rows, row(m.SeqID, toks, drafts...))
				}
				if out.StepID == 0 {
					continue
				}
				fin := specProcess(t, s, out.StepID, rows...)
				for _, f := range fin {
					outs[f.SeqID] = f.OutputTokenIDs
				}
			}
			if !sawRecompute {
				t.Fatal("b was never recomputed")
			}
			if got := outs[b.ID()]; len(got) != 6 || !slices.Equal(got[:3], []int{20, 21, 23}) {
				t.Fatalf("b's outputs %v", got)
			}
			if got := outs[a.ID()]; len(got) != 6 || !slices.Equal(got[:5], []int{10, 11, 12, 13, 14}) {
				t.Fatalf("a's outputs %v", got)
			}
			st := s.Stats()
			if st.NumPreemptions < 1 || s.bm.NumUsedBlocks() != 0 || st.NumFreeBlocks != st.NumBlocks || st.NumFreeStateSlots != st.NumStateSlots ||
				st.NumInflightSteps != 0 {
				t.Fatalf("at the end: %+v", st)
			}
			mustSpecInvariants(t, s, "at the end")
		})
	}
}

// 5b. EOS among the accepted tokens ends the sequence there (unless
// min_tokens is not reached yet), and its blocks go back.
func TestSpecEOSInsideAccepted(t *testing.T) {
	cases := []struct {
		name       string
		minTokens  int
		wantOut    []int
		wantReason FinishReason
	}{
		{"stops at EOS", 0, []int{10, 11, 0}, FinishStop},
		{"EOS before min_tokens", 5, []int{10, 11, 0, 13, 14}, FinishNone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := specConfig(3, 1)
			s := newSpecScheduler(t, cfg)
			p := DefaultSamplingParams()
			p.MaxTokens, p.MinTokens = 50, c.minTokens
			x := addSpecSeq(t, s, "x", seqOf(1, 2, 3, 4, 5), p)
			out, _ := specSchedule(t, s)
			specProcess(t, s, out.StepID, row(x.ID(), []int{10}, 11, 0, 13))
			out, metas := specSchedule(t, s)
			if m := metaFor(t, metas, x.ID()); !slices.Equal(m.InputTokenIDs, []int{10, 11, 0, 13}) {
				t.Fatalf("inputs %v", m.InputTokenIDs)
			}
			fin := specProcess(t, s, out.StepID, row(x.ID(), []int{11, 0, 13, 14}, 15))
			if !slices.Equal(x.OutputTokenIDs(), c.wantOut) || x.FinishReason() != c.wantReason {
				t.Fatalf("outputs %v (%v), want %v (%v)", x.OutputTokenIDs(), x.FinishReason(), c.wantOut, c.wantReason)
			}
			if c.wantReason == FinishNone {
				if len(fin) != 0 || x.NumComputedTokens() != x.NumTokens()-1 ||
					len(x.blockTable) != s.bm.NumBlocksFor(x.NumComputedTokens()+cfg.NumLookaheadSlots) {
					t.Fatalf("finished %+v, %d computed of %d, %d blocks", fin, x.NumComputedTokens(), x.NumTokens(), len(x.blockTable))
				}
				return
			}
			if len(fin) != 1 || fin[0].Reason != FinishStop || !slices.Equal(fin[0].OutputTokenIDs, c.wantOut) {
				t.Fatalf("finished %+v", fin)
			}
			if s.HasUnfinished() || s.bm.NumUsedBlocks() != 0 || s.sm.NumUsed() != 0 {
				t.Fatal("resources held after the finish")
			}
			if out, metas := specSchedule(t, s); out.StepID != 0 || len(metas) != 0 {
				t.Fatalf("scheduled after the finish: %+v", metas)
			}
		})
	}
}

// A sequence alone in a cache that holds it without speculation is never
// preempted for its drafts' slots: drafts that cannot fit are cut. Fails
// (bug): draftsFor cuts drafts by max_tokens, max_model_len and the budget
// but not by the cache, so near the cache's capacity the decode loop finds
// no victim but the sequence itself and preempts it: every further token
// costs an empty step and a full recompute.
func TestSpecDraftsFitTheCache(t *testing.T) {
	cfg := specConfig(3, 0)
	cfg.NumBlocks = 5 // 10 positions
	cfg.EnablePrefixCaching = false
	s := newSpecScheduler(t, cfg)
	x := addSpecSeq(t, s, "x", seqOf(1, 2, 3, 4, 5, 6, 7), longParams(100))
	next := 10
	for steps := 0; s.HasUnfinished(); steps++ {
		if steps > 20 {
			t.Fatalf("not done: %+v", s.Stats())
		}
		numDrafts := len(x.drafts)
		out, metas := specSchedule(t, s)
		if len(out.PreemptedSeqIDs) > 0 {
			t.Errorf("alone in a cache of %d positions with %d tokens (%d computed), preempted for the slots of %d drafts",
				cfg.NumBlocks*cfg.BlockSize, x.NumTokens(), x.NumTokens()-1, numDrafts)
		}
		if out.StepID == 0 {
			continue
		}
		var rows []SampledTokens
		for _, m := range metas {
			if m.Sample {
				rows = append(rows, row(m.SeqID, []int{next}, next+1, next+2, next+3))
				next += 4
			}
		}
		specProcess(t, s, out.StepID, rows...)
	}
	// It ends when the cache cannot hold its next token.
	if x.FinishReason() != FinishLength || x.NumTokens() < cfg.NumBlocks*cfg.BlockSize {
		t.Fatalf("finished %v with %d tokens", x.FinishReason(), x.NumTokens())
	}
}

// specDevice stands in for the pipeline with speculative decoding: the
// forward pass (a KV cache of (token, position) per slot, written through
// the slot mapping and read back through the block table), the verify
// stage (the target's token after each input is nextToken of the context
// read back; the longest prefix of drafts equal to those tokens is
// accepted, then the target's token after it), the draft stage (random
// drafts, each right with probability pGood) with its next-input table and
// accepted counts, and the device half of ZOS (placeholders read from that
// table, positions and slots shifted by the previous row's accepted
// count). A wrong block table, slot, shift, commit or reservation shows up
// as a missing or wrong KV entry, or as a token the reference does not
// produce.
type specDevice struct {
	cfg   SchedulerConfig
	k     int
	kv    []kvEntry
	hist  map[SeqID][]int // every token the device emitted, prompt first
	rng   *rand.Rand
	pGood float64

	prevStep    StepID
	fromSamples int   // decodes whose input was the step before's sampled token, unshifted
	prevNext    []int // (1+k) per sample row of prevStep: bonus, drafts, padding
	prevAcc     []int // accepted drafts per sample row of prevStep
}

func newSpecDevice(cfg SchedulerConfig, rng *rand.Rand, pGood float64) *specDevice {
	return &specDevice{cfg: cfg, k: cfg.NumSpeculativeTokens, kv: make([]kvEntry, cfg.NumBlocks*cfg.BlockSize),
		hist: map[SeqID][]int{}, rng: rng, pGood: pGood}
}

func (d *specDevice) run(out *SchedulerOutputs, metas []SequenceMetadata) ([]SampledTokens, error) {
	bs, k, M := d.cfg.BlockSize, d.k, d.cfg.MaxModelLen
	for _, c := range out.BlockCopies {
		copy(d.kv[c.Dst*bs:(c.Dst+1)*bs], d.kv[c.Src*bs:(c.Src+1)*bs])
	}
	type layout struct {
		start, seqlenK int
		inputs         []int
	}
	lays := make([]layout, len(metas))
	// Write every sequence's KV first, as a layer does.
	for i := range metas {
		m := &metas[i]
		if len(m.InputTokenIDs) != m.SeqlenQ || len(m.SlotMapping) != m.SeqlenQ || m.SeqlenK != m.PosStart+m.SeqlenQ {
			return nil, fmt.Errorf("seq %d: %d inputs, %d slots, q %d, pos %d, k %d", m.SeqID, len(m.InputTokenIDs), len(m.SlotMapping),
				m.SeqlenQ, m.PosStart, m.SeqlenK)
		}
		if len(m.BlockTable) > (M+bs-1)/bs {
			return nil, fmt.Errorf("seq %d: %d blocks, max_model_len %d", m.SeqID, len(m.BlockTable), M)
		}
		if m.Prefill && (m.NumDrafts != 0 || m.Shifted) || !m.Prefill && (m.SeqlenQ != 1+m.NumDrafts || !m.Sample || m.NumDrafts > out.DraftLimit) ||
			m.Shifted && out.PlaceholdersFromSamples {
			return nil, fmt.Errorf("seq %d: prefill %v, q %d, %d drafts, shifted %v", m.SeqID, m.Prefill, m.SeqlenQ, m.NumDrafts, m.Shifted)
		}
		in := make([]int, m.SeqlenQ)
		shift := 0
		if m.Shifted {
			if out.StepID != d.prevStep+1 || m.InputFromRow < 0 || m.InputFromRow >= len(d.prevAcc) {
				return nil, fmt.Errorf("seq %d: shifted by row %d of step %d (%d rows), in step %d", m.SeqID, m.InputFromRow,
					d.prevStep, len(d.prevAcc), out.StepID)
			}
			shift = d.prevAcc[m.InputFromRow]
			for j, tok := range m.InputTokenIDs {
				if tok != PlaceholderToken {
					return nil, fmt.Errorf("seq %d: shifted step with known input %d", m.SeqID, tok)
				}
				in[j] = d.prevNext[m.InputFromRow*(1+k)+j]
			}
		} else if out.PlaceholdersFromSamples && m.InputFromRow >= 0 {
			// The step before verified and drafted nothing: its sampled
			// token, unshifted.
			if out.StepID != d.prevStep+1 || m.InputFromRow >= len(d.prevAcc) || d.prevAcc[m.InputFromRow] != 0 ||
				m.SeqlenQ != 1 || m.InputTokenIDs[0] != PlaceholderToken {
				return nil, fmt.Errorf("seq %d: %d inputs %v from sample row %d of step %d (%d rows), in step %d", m.SeqID, m.SeqlenQ,
					m.InputTokenIDs, m.InputFromRow, d.prevStep, len(d.prevAcc), out.StepID)
			}
			in[0] = d.prevNext[m.InputFromRow*(1+k)]
			d.fromSamples++
		} else {
			if m.InputFromRow != -1 {
				return nil, fmt.Errorf("seq %d: input from row %d, not shifted", m.SeqID, m.InputFromRow)
			}
			for j, tok := range m.InputTokenIDs {
				if tok == PlaceholderToken {
					return nil, fmt.Errorf("seq %d: placeholder in an exact layout", m.SeqID)
				}
				in[j] = tok
			}
		}
		start := m.PosStart + shift
		for j := range in {
			p := start + j
			if p/bs >= len(m.BlockTable) {
				return nil, fmt.Errorf("seq %d: position %d (shift %d) has no block (%d blocks)", m.SeqID, p, shift, len(m.BlockTable))
			}
			slot := Slot(m.BlockTable, bs, p)
			if !m.Shifted && m.SlotMapping[j] != slot {
				return nil, fmt.Errorf("seq %d pos %d: slot %d, block table says %d", m.SeqID, p, m.SlotMapping[j], slot)
			}
			d.kv[slot] = kvEntry{token: in[j], pos: p, ok: true}
		}
		lays[i] = layout{start: start, seqlenK: m.SeqlenK + shift, inputs: in}
	}
	rows := make([]SampledTokens, out.NumSampleRows)
	next := make([]int, out.NumSampleRows*(1+k))
	acc := make([]int, out.NumSampleRows)
	emit := func(id SeqID, r int, toks []int, sampleIndex int) {
		h := append(d.hist[id], toks...)
		d.hist[id] = h
		var drafts []int
		for range d.rng.IntN(min(k, out.DraftLimit) + 1) { // a drafter drafts no more than the step's limit
			t := d.rng.IntN(testVocab)
			if d.rng.Float64() < d.pGood {
				t = nextToken(append(slices.Clone(h), drafts...), sampleIndex, testVocab)
			}
			drafts = append(drafts, t)
		}
		rows[r] = SampledTokens{SeqID: id, TokenIDs: toks, Drafts: drafts}
		last := toks[len(toks)-1]
		for j := range 1 + k {
			next[r*(1+k)+j] = last
			if j > 0 && j <= len(drafts) {
				next[r*(1+k)+j] = drafts[j-1]
			}
		}
		acc[r] = len(toks) - 1
	}
	for i := range metas {
		m, l := &metas[i], lays[i]
		h, seen := d.hist[m.SeqID]
		if !seen {
			h = slices.Clone(m.TokenIDs)
			d.hist[m.SeqID] = h
		}
		if len(m.TokenIDs) > len(h) || !slices.Equal(h[:len(m.TokenIDs)], m.TokenIDs) {
			return nil, fmt.Errorf("seq %d: scheduler's tokens %v, device's %v", m.SeqID, m.TokenIDs, h)
		}
		switch {
		case m.Prefill && (l.seqlenK > len(h) || m.Sample != (l.seqlenK == len(h))):
			return nil, fmt.Errorf("seq %d: prefill to %d of %d known tokens, sample %v", m.SeqID, l.seqlenK, len(h), m.Sample)
		case !m.Prefill && l.start != len(h)-1:
			return nil, fmt.Errorf("seq %d: decode from position %d (shifted %v), the device knows %d tokens", m.SeqID, l.start, m.Shifted, len(h))
		}
		ctx := make([]int, l.seqlenK)
		for pos := range l.seqlenK {
			if pos/bs >= len(m.BlockTable) {
				return nil, fmt.Errorf("seq %d: position %d of %d past its %d blocks", m.SeqID, pos, l.seqlenK, len(m.BlockTable))
			}
			e := d.kv[Slot(m.BlockTable, bs, pos)]
			want := 0
			if pos < l.start {
				want = h[pos]
			} else {
				want = l.inputs[pos-l.start]
			}
			if !e.ok || e.pos != pos || e.token != want || (pos < len(h) && m.Prefill && e.token != h[pos]) {
				return nil, fmt.Errorf("seq %d: KV at position %d holds (%d, pos %d, written %v), want token %d (inputs from %d)",
					m.SeqID, pos, e.token, e.pos, e.ok, want, l.start)
			}
			ctx[pos] = e.token
		}
		if !m.Sample {
			continue
		}
		var toks []int
		if m.Prefill {
			toks = []int{nextToken(ctx, m.SampleIndex, testVocab)}
		} else {
			for j := range 1 + m.NumDrafts {
				target := nextToken(ctx[:l.start+j+1], m.SampleIndex, testVocab)
				toks = append(toks, target)
				if j == m.NumDrafts || l.inputs[1+j] != target {
					break
				}
			}
			// The drafter's lookahead slots, past the last emitted token.
			for p := l.start + len(toks); p < l.start+len(toks)+d.cfg.NumLookaheadSlots && p < M; p++ {
				if p/bs >= len(m.BlockTable) {
					return nil, fmt.Errorf("seq %d: lookahead position %d has no block (%d blocks)", m.SeqID, p, len(m.BlockTable))
				}
			}
		}
		prompt := slices.Clone(h[:m.NumPromptTokens])
		emit(m.SeqID, m.SampleRow, toks, m.SampleIndex)
		for j, id := range m.ForkSeqIDs {
			d.hist[id] = prompt
			emit(id, m.SampleRow+1+j, []int{nextToken(ctx, j+1, testVocab)}, j+1)
		}
	}
	d.prevStep, d.prevNext, d.prevAcc = out.StepID, next, acc
	return rows, nil
}

// checkCommitted fails unless every block in the prefix cache holds, in
// the device's KV, the tokens it is cached under: no block is committed
// over a rejected draft (or any KV not yet written).
func (d *specDevice) checkCommitted(bm *BlockManager) error {
	if !bm.prefixCaching {
		return nil
	}
	bs := bm.blockSize
	for b := range bm.numBlocks {
		if !bm.hashed[b] {
			continue
		}
		for j := range bs {
			e := d.kv[b*bs+j]
			if !e.ok || e.token != int(bm.tokenIDs[b*bs+j]) || e.pos%bs != j {
				return fmt.Errorf("cached block %d slot %d: KV (%d, pos %d, written %v), cached token %d", b, j, e.token, e.pos, e.ok,
					bm.tokenIDs[b*bs+j])
			}
		}
	}
	return nil
}

// specWorkload is a seeded set of requests: prompts sharing prefixes,
// some extending an earlier request's prompt with its outputs (hits on
// committed output blocks), n = 2, min_tokens, ignore_eos, stop tokens.
func specWorkload(rng *rand.Rand, cfg SchedulerConfig, numReqs, maxPrompt int, maxOut func(prompt int) int) []testRequest {
	prefixes := make([][]int, 2)
	for i := range prefixes {
		prefixes[i] = make([]int, 2+rng.IntN(maxPrompt/2))
		for j := range prefixes[i] {
			prefixes[i][j] = 1 + rng.IntN(testVocab-1)
		}
	}
	var reqs []testRequest
	for i := range numReqs {
		var prompt []int
		if i > 0 && rng.IntN(4) == 0 {
			prev := reqs[rng.IntN(len(reqs))]
			out, _ := reference(prev, 0, cfg, testVocab)
			prompt = slices.Concat(prev.prompt, out[:rng.IntN(len(out)+1)])
			prompt = prompt[:min(len(prompt), maxPrompt)]
		} else {
			prompt = slices.Clone(prefixes[rng.IntN(len(prefixes))])
			for n := 1 + rng.IntN(maxPrompt-len(prompt)); n > 0; n-- {
				prompt = append(prompt, 1+rng.IntN(testVocab-1))
			}
		}
		p := DefaultSamplingParams()
		p.MaxTokens = 1 + rng.IntN(maxOut(len(prompt)))
		if rng.IntN(4) == 0 {
			p.MinTokens = rng.IntN(p.MaxTokens + 1)
		}
		p.IgnoreEOS = rng.IntN(3) == 0
		if rng.IntN(6) == 0 {
			p.StopTokenIDs = []int{1 + rng.IntN(testVocab-1)}
		}
		if rng.IntN(5) == 0 {
			p.N = 2
		}
		r := testRequest{id: fmt.Sprintf("r%02d", i), prompt: prompt, params: p, arriveStep: rng.IntN(40), abortStep: -1}
		if rng.IntN(8) == 0 {
			r.abortStep = r.arriveStep + rng.IntN(20)
		}
		reqs = append(reqs, r)
	}
	return reqs
}

// runSpecWorkload drives a Scheduler and a specDevice: inflight 0 is the
// strict mode, 1 keeps one step in flight (ZOS), -1 picks either at random
// each step; limits sets a random draft limit (0..k) before a third of the
// steps. After every call it checks the invariants; at the end, that
// nothing is held and that every sequence's outputs are both the tokens
// the device emitted for it (cut by the stop rules) and the reference's.
func runSpecWorkload(t *testing.T, cfg SchedulerConfig, reqs []testRequest, seed uint64, inflight int, limits bool) (preemptions int64, drafts, steps, forks, fromSamples int) {
	t.Helper()
	s := newSpecScheduler(t, cfg)
	rng := rand.New(rand.NewPCG(seed, 99))
	dev := newSpecDevice(cfg, rng, 0.7)
	byID := map[string]testRequest{}
	for _, r := range reqs {
		byID[r.id] = r
	}
	finished := map[string]map[int]FinishedSequence{}
	record := func(fs []FinishedSequence) {
		for _, f := range fs {
			if finished[f.RequestID] == nil {
				finished[f.RequestID] = map[int]FinishedSequence{}
			}
			if _, dup := finished[f.RequestID][f.Index]; dup {
				t.Fatalf("%s[%d] finished twice", f.RequestID, f.Index)
			}
			finished[f.RequestID][f.Index] = f
		}
	}
	check := func(when string) {
		t.Helper()
		mustSpecInvariants(t, s, when)
		if err := dev.checkCommitted(s.bm); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	type flying struct {
		id          StepID
		rows        []SampledTokens
		metas, copy []SequenceMetadata // the published metadata and a deep copy
	}
	var queue []flying
	process := func() {
		t.Helper()
		f := queue[0]
		queue = queue[1:]
		// Published metadata is never overwritten while its step is in
		// flight (Trim replaces block tables, it does not edit them).
		for i, m := range f.metas {
			c := f.copy[i]
			if !slices.Equal(m.BlockTable, c.BlockTable) || !slices.Equal(m.SlotMapping, c.SlotMapping) ||
				!slices.Equal(m.InputTokenIDs, c.InputTokenIDs) || !slices.Equal(m.TokenIDs, c.TokenIDs) {
				t.Fatalf("step %d seq %d: metadata changed while in flight: %+v, was %+v", f.id, m.SeqID, m, c)
			}
		}
		fin, err := s.ProcessOutputs(f.id, f.rows)
		if err != nil {
			t.Fatal(err)
		}
		record(fin)
		check(fmt.Sprintf("after ProcessOutputs of step %d", f.id))
	}
	added := 0
	for step := 0; ; step++ {
		if step > 2000 {
			t.Fatalf("not done after %d steps: %+v", step, s.Stats())
		}
		for _, r := range reqs {
			if r.arriveStep == step {
				if _, err := s.Add(NewSequence(r.id, r.prompt, r.params, zeroTime)); err != nil {
					t.Fatal(err)
				}
				added++
			}
			if r.abortStep == step {
				record(s.Abort(r.id))
				check(fmt.Sprintf("after aborting %s", r.id))
			}
		}
		if limits && rng.IntN(3) == 0 {
			// The adaptive controller's choice: drafts off (0) as often as
			// any other length, changed with steps in flight.
			s.SetDraftLimit(rng.IntN(cfg.NumSpeculativeTokens + 1))
		}
		out, metas := s.Schedule()
		record(out.Finished)
		check(fmt.Sprintf("after Schedule of step %d", out.StepID))
		preemptions += int64(len(out.PreemptedSeqIDs))
		drafts += out.NumDraftTokens
		if out.NumBatchedTokens > cfg.MaxNumBatchedTokens || out.NumSeqs > cfg.MaxNumSeqs {
			t.Fatalf("step %d: %d tokens, %d seqs", out.StepID, out.NumBatchedTokens, out.NumSeqs)
		}
		n := 0
		for _, m := range metas {
			n += m.NumDrafts
			if r := byID[m.RequestID]; m.NumDrafts > 0 {
				// Every token the row may emit is within max_tokens (the
				// in-flight step counted once), every position it computes
				// within max_model_len (the drafter's lookahead is cut to
				// the context, and the drafter drafts less there).
				pend := 0
				if m.Shifted {
					pend = 1
				}
				if numOut := len(m.TokenIDs) - m.NumPromptTokens + pend; numOut+1+m.NumDrafts > r.params.MaxTokens {
					t.Fatalf("step %d seq %d: %d outputs, verifies %d drafts, max_tokens %d", out.StepID, m.SeqID, numOut, m.NumDrafts, r.params.MaxTokens)
				}
				if last := m.PosStart + m.SeqlenQ - 1; !m.Shifted && last >= cfg.MaxModelLen {
					t.Fatalf("step %d seq %d: drafts reach %d, max_model_len %d", out.StepID, m.SeqID, last, cfg.MaxModelLen)
				}
			}
		}
		if n != out.NumDraftTokens {
			t.Fatalf("step %d: %d drafts in metas, outputs say %d", out.StepID, n, out.NumDraftTokens)
		}
		if out.StepID != 0 {
			sampled, err := dev.run(out, metas)
			if err != nil {
				t.Fatalf("step %d: %v", out.StepID, err)
			}
			steps++
			cp := slices.Clone(metas)
			for i := range cp {
				cp[i].BlockTable, cp[i].SlotMapping = slices.Clone(cp[i].BlockTable), slices.Clone(cp[i].SlotMapping)
				cp[i].InputTokenIDs, cp[i].TokenIDs = slices.Clone(cp[i].InputTokenIDs), slices.Clone(cp[i].TokenIDs)
			}
			queue = append(queue, flying{out.StepID, sampled, metas, cp})
			if err := dev.checkCommitted(s.bm); err != nil {
				t.Fatalf("after running step %d: %v", out.StepID, err)
			}
		}
		keep := inflight
		if keep < 0 {
			keep = rng.IntN(2)
		}
		for len(queue) > keep || (len(queue) > 0 && out.StepID == 0) {
			process()
		}
		if added == len(reqs) && !s.HasUnfinished() && len(queue) == 0 {
			break
		}
	}
	st := s.Stats()
	if s.bm.NumUsedBlocks() != 0 || st.NumFreeStateSlots != st.NumStateSlots || st.NumInflightSteps != 0 || st.NumFreeBlocks != st.NumBlocks {
		t.Fatalf("resources held at the end: %+v", st)
	}
	for _, r := range reqs {
		aborted := false
		for _, f := range finished[r.id] {
			aborted = aborted || f.Reason == FinishAbort
		}
		if len(finished[r.id]) != r.params.N && !aborted {
			t.Fatalf("%s: %d of %d sequences finished", r.id, len(finished[r.id]), r.params.N)
		}
		if len(finished[r.id]) > 1 {
			forks++
		}
		rule := RuleFor(&r.params, cfg.EOSTokenIDs, cfg.MaxModelLen)
		for idx, f := range finished[r.id] {
			if f.Reason == FinishAbort {
				h := dev.hist[f.SeqID]
				want, _ := reference(r, idx, cfg, testVocab)
				if len(f.OutputTokenIDs) > len(want) || !slices.Equal(f.OutputTokenIDs, want[:len(f.OutputTokenIDs)]) ||
					(h != nil && !slices.Equal(f.OutputTokenIDs, h[len(r.prompt):len(r.prompt)+len(f.OutputTokenIDs)])) {
					t.Fatalf("%s[%d] aborted with %v, not a prefix of the reference %v", r.id, idx, f.OutputTokenIDs, want)
				}
				continue
			}
			// The oracle: the tokens the device emitted, in order, up to
			// the first that ends the sequence.
			h := dev.hist[f.SeqID]
			emitted, reason := h[len(r.prompt):], FinishNone
			for i := len(r.prompt); i < len(h); i++ {
				if reason = CheckFinish(rule, i+1-len(r.prompt), i+1, h[i]); reason != FinishNone {
					emitted = h[len(r.prompt) : i+1]
					break
				}
			}
			if f.Reason != reason || !slices.Equal(f.OutputTokenIDs, emitted) {
				t.Fatalf("%s[%d]: finished %v with %v, the device emitted %v (%v)", r.id, idx, f.Reason, f.OutputTokenIDs, emitted, reason)
			}
			if want, wantReason := reference(r, idx, cfg, testVocab); f.Reason != wantReason || !slices.Equal(f.OutputTokenIDs, want) {
				t.Fatalf("%s[%d]: finished %v with %v, reference %v %v", r.id, idx, f.Reason, f.OutputTokenIDs, wantReason, want)
			}
		}
	}
	return preemptions, drafts, steps, forks, dev.fromSamples
}

// 6. Randomized: several sequences, random drafts (0..k, right or wrong),
// strict, ZOS and mixed, prefix caching on, caches small enough to preempt.
func TestSpecRandomWorkloads(t *testing.T) {
	type tc struct {
		name      string
		k, L      int
		inflight  int
		bs        int
		reachLen  bool // requests may run into max_model_len
		limits    bool // random draft limits, 0 included (SetDraftLimit)
		knownBug  string
		noPreempt bool
	}
	cases := []tc{
		{name: "strict-k3", k: 3, L: 0, inflight: 0, bs: 2, reachLen: true},
		{name: "strict-k3-lookahead3", k: 3, L: 3, inflight: 0, bs: 4, reachLen: true},
		{name: "zos-k3-lookahead3", k: 3, L: 3, inflight: 1, bs: 2, reachLen: true},
		{name: "zos-k2-lookahead1", k: 2, L: 1, inflight: 1, bs: 4, reachLen: true},
		{name: "zos-k4", k: 4, L: 0, inflight: 1, bs: 2},
		{name: "mixed-k3-lookahead2", k: 3, L: 2, inflight: -1, bs: 2, reachLen: true},
		{name: "mixed-k1", k: 1, L: 0, inflight: -1, bs: 4},
		{name: "zos-k3-maxlen", k: 3, L: 0, inflight: 1, bs: 2, reachLen: true},
		{name: "zos-k3-limits", k: 3, L: 2, inflight: 1, bs: 2, reachLen: true, limits: true},
		{name: "mixed-k2-limits", k: 2, L: 0, inflight: -1, bs: 4, limits: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.knownBug != "" {
				t.Skip(c.knownBug)
			}
			cfg := SchedulerConfig{
				MaxNumSeqs: 4, MaxNumBatchedTokens: 24, MaxModelLen: 32, EnableChunkedPrefill: true, ChunkSize: 12,
				BlockSize: c.bs, EnablePrefixCaching: true, EOSTokenIDs: []int{0}, VocabSize: testVocab,
				NumSpeculativeTokens: c.k, NumLookaheadSlots: c.L,
			}
			// Room for one sequence at max_model_len with its largest
			// reservation, and a little more: preemption is common.
			cfg.NumBlocks = (cfg.MaxModelLen+cfg.BlockSize-1)/cfg.BlockSize + 6
			maxOut := func(prompt int) int { return cfg.MaxModelLen }
			if !c.reachLen {
				// The last position written, any shift included, stays
				// below max_model_len.
				maxOut = func(prompt int) int { return max(cfg.MaxModelLen-prompt-2*c.k-2, 1) }
			}
			var preemptions int64
			var drafts, steps, forks, fromSamples int
			for seed := range uint64(8) {
				rng := rand.New(rand.NewPCG(seed, 5))
				reqs := specWorkload(rng, cfg, 16, 16, maxOut)
				p, d, n, f, fs := runSpecWorkload(t, cfg, reqs, seed, c.inflight, c.limits)
				preemptions, drafts, steps, forks, fromSamples = preemptions+p, drafts+d, steps+n, forks+f, fromSamples+fs
			}
			if c.limits && fromSamples == 0 {
				t.Errorf("no decode after a step planned with drafts off took its input from that step's samples (%d steps)", steps)
			}
			if preemptions == 0 {
				t.Errorf("no preemption in %d steps", steps)
			}
			if drafts == 0 || forks == 0 {
				t.Errorf("%d drafts verified, %d requests with n = 2 in %d steps", drafts, forks, steps)
			}
			t.Logf("%d steps, %d drafts verified, %d preemptions, %d forked requests, %d decodes from the samples of a step without drafts",
				steps, drafts, preemptions, forks, fromSamples)
		})
	}
}
