package engine

import (
	"fmt"
	"slices"
)

// fakeModel stands in for the forward pass and the sampler. It keeps a KV
// cache of (token, position) per slot written through the slot mapping and
// "attends" by reading the whole context back through the block table, so
// a wrong block table, slot mapping, block copy, prefix-cache hit or
// placeholder shows up as a wrong or missing entry. The next token is a hash
// of the context and the sample index, so a request's outputs depend only
// on its tokens and can be compared with reference().
type fakeModel struct {
	blockSize int
	vocab     int
	kv        []kvEntry
	// state per slot (sequences' slots, then checkpoints): the tokens
	// folded in, counted and hashed; checked only when checkState (no
	// prefix cache, or one with state checkpoints: a plain hit skips
	// positions).
	state      []foldedState
	checkState bool
	// prevSampled holds the previous step's sample rows, for placeholders.
	prevSampled []int
	prevStep    StepID
}

// foldedState is what a fake state slot has seen: n tokens whose running
// hash is h.
type foldedState struct {
	n int
	h uint64
}

func (f foldedState) fold(t int) foldedState {
	return foldedState{f.n + 1, (f.h ^ uint64(t+1)) * 1099511628211}
}

type kvEntry struct {
	token, pos int
	ok         bool
}

func newFakeModel(cfg SchedulerConfig, vocab int) *fakeModel {
	slots := cfg.NumStateSlots
	if slots == 0 {
		slots = cfg.MaxNumSeqs
	}
	return &fakeModel{
		blockSize:  cfg.BlockSize,
		vocab:      vocab,
		kv:         make([]kvEntry, cfg.NumBlocks*cfg.BlockSize),
		state:      make([]foldedState, slots+cfg.NumStateCheckpoints),
		checkState: !cfg.EnablePrefixCaching || cfg.NumStateCheckpoints > 0,
	}
}

// nextToken is the fake model's deterministic "sample".
func nextToken(ctx []int, sampleIndex, vocab int) int {
	h := uint64(1469598103934665603) ^ uint64(sampleIndex)*0x9e3779b97f4a7c15
	for _, t := range ctx {
		h ^= uint64(t) + 1
		h *= 1099511628211
	}
	h ^= h >> 29
	return int(h % uint64(vocab))
}

// run executes one step and returns its sampled tokens, one entry per row.
func (f *fakeModel) run(out *SchedulerOutputs, metas []SequenceMetadata) ([]SampledTokens, error) {
	bs := f.blockSize
	for _, c := range out.BlockCopies {
		copy(f.kv[c.Dst*bs:(c.Dst+1)*bs], f.kv[c.Src*bs:(c.Src+1)*bs])
	}
	for _, c := range out.StateCopies {
		f.state[c.Dst] = f.state[c.Src]
	}
	if out.StepID != f.prevStep+1 && f.prevStep != 0 {
		f.prevSampled = nil // the previous step is not the one just before
	}
	// Write this step's KV (every sequence first, as a layer does).
	for i := range metas {
		m := &metas[i]
		if len(m.InputTokenIDs) != m.SeqlenQ || len(m.SlotMapping) != m.SeqlenQ {
			return nil, fmt.Errorf("seq %d: %d inputs, %d slots, seqlen_q %d", m.SeqID, len(m.InputTokenIDs), len(m.SlotMapping), m.SeqlenQ)
		}
		for j, tok := range m.InputTokenIDs {
			if tok == PlaceholderToken {
				if m.InputFromRow < 0 || m.InputFromRow >= len(f.prevSampled) {
					return nil, fmt.Errorf("seq %d: placeholder from row %d of %d", m.SeqID, m.InputFromRow, len(f.prevSampled))
				}
				tok = f.prevSampled[m.InputFromRow]
			}
			pos := m.PosStart + j
			if want := Slot(m.BlockTable, bs, pos); m.SlotMapping[j] != want {
				return nil, fmt.Errorf("seq %d pos %d: slot %d, block table says %d", m.SeqID, pos, m.SlotMapping[j], want)
			}
			f.kv[m.SlotMapping[j]] = kvEntry{token: tok, pos: pos, ok: true}
		}
		if f.checkState && m.StateSlot >= 0 {
			if m.PosStart == 0 {
				f.state[m.StateSlot] = foldedState{}
			}
			// The slot must hold exactly the tokens before the step: those
			// the KV cache holds at positions 0..PosStart-1.
			var want foldedState
			for pos := range m.PosStart {
				want = want.fold(f.kv[Slot(m.BlockTable, bs, pos)].token)
			}
			if got := f.state[m.StateSlot]; got != want {
				return nil, fmt.Errorf("seq %d: state slot %d holds %d tokens (hash %x), step starts at %d (hash %x)",
					m.SeqID, m.StateSlot, got.n, got.h, m.PosStart, want.h)
			}
			for j := range m.SeqlenQ {
				f.state[m.StateSlot] = f.state[m.StateSlot].fold(f.kv[m.SlotMapping[j]].token)
			}
		}
	}
	var sampled []SampledTokens
	rows := make([]int, out.NumSampleRows)
	ctx := make([]int, 0, 64)
	for i := range metas {
		m := &metas[i]
		if m.SeqlenK != m.PosStart+m.SeqlenQ || len(m.BlockTable)*bs < m.SeqlenK {
			return nil, fmt.Errorf("seq %d: seqlen_k %d, pos %d + q %d, %d blocks", m.SeqID, m.SeqlenK, m.PosStart, m.SeqlenQ, len(m.BlockTable))
		}
		ctx = ctx[:0]
		for pos := range m.SeqlenK {
			e := f.kv[Slot(m.BlockTable, bs, pos)]
			if !e.ok || e.pos != pos {
				return nil, fmt.Errorf("seq %d: KV at pos %d holds pos %d (written %v)", m.SeqID, pos, e.pos, e.ok)
			}
			if pos < len(m.TokenIDs) && e.token != m.TokenIDs[pos] {
				return nil, fmt.Errorf("seq %d: KV at pos %d holds token %d, sequence has %d", m.SeqID, pos, e.token, m.TokenIDs[pos])
			}
			ctx = append(ctx, e.token)
		}
		if !m.Sample {
			if m.SampleRow != -1 || len(m.ForkSeqIDs) > 0 {
				return nil, fmt.Errorf("seq %d: no sample but row %d, forks %v", m.SeqID, m.SampleRow, m.ForkSeqIDs)
			}
			continue
		}
		t := nextToken(ctx, m.SampleIndex, f.vocab)
		rows[m.SampleRow] = t
		sampled = append(sampled, SampledTokens{SeqID: m.SeqID, TokenIDs: []int{t}})
		for j, id := range m.ForkSeqIDs {
			t := nextToken(ctx, j+1, f.vocab)
			rows[m.SampleRow+1+j] = t
			sampled = append(sampled, SampledTokens{SeqID: id, TokenIDs: []int{t}})
		}
	}
	if len(sampled) != out.NumSampleRows {
		return nil, fmt.Errorf("%d sampled rows, outputs say %d", len(sampled), out.NumSampleRows)
	}
	f.prevSampled = rows
	f.prevStep = out.StepID
	return sampled, nil
}

// testRequest is one request of a workload.
type testRequest struct {
	id         string
	prompt     []int
	params     SamplingParams
	arriveStep int
	abortStep  int // -1: never
}

// reference generates a request's outputs without the Scheduler: the fake
// model applied to prompt + outputs, with the Scheduler's stop rules.
func reference(r testRequest, sampleIndex int, cfg SchedulerConfig, vocab int) ([]int, FinishReason) {
	tokens := slices.Clone(r.prompt)
	p := r.params
	for {
		t := nextToken(tokens, sampleIndex, vocab)
		tokens = append(tokens, t)
		numOut := len(tokens) - len(r.prompt)
		if numOut >= p.MinTokens && ((!p.IgnoreEOS && slices.Contains(cfg.EOSTokenIDs, t)) || slices.Contains(p.StopTokenIDs, t)) {
			return tokens[len(r.prompt):], FinishStop
		}
		if numOut >= p.MaxTokens || len(tokens) >= cfg.MaxModelLen {
			return tokens[len(r.prompt):], FinishLength
		}
	}
}
