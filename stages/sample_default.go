package stages

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/sampling"
)

func init() {
	RegisterSample(nil, "default", NoOptions{}, func(d SampleDeps, _ NoOptions) (SampleStage, error) {
		scratch := make([]*sampling.Scratch, runtime.NumCPU())
		for i := range scratch {
			scratch[i] = new(sampling.Scratch)
		}
		dev, _ := d.Ops.(kernels.DeviceSampler)
		return &sample{d: d, scratch: scratch, dev: dev, edits: make([]editBuilder, len(scratch))}, nil
	})
}

// sample draws each row's token with the request's sampling params: masks
// for min_tokens, logit bias, penalties over the prompt and output so far,
// greedy or temperature with min-p, top-k, top-p, and a draw keyed by
// (seed, output position), so that a request's tokens do not depend on
// its batch neighbours. Each row's params are resolved once into a
// kernels.SampleRow whose edits carry the min_tokens mask, the logit bias
// and the penalty history (one edit per distinct token); that row is what
// either sampler takes. Rows are split over one worker per core (each row
// is independent, so the split changes no result).
//
// On a backend that samples on the device (kernels.DeviceSampler) a step
// whose rows ask for no logprobs and no prompt logprobs is sampled there:
// the logits stay on the device, and the tokens are published to the next
// step from device memory. Other steps, and backends without the
// capability, download the logits and sample each row on the host
// (kernels/sampling).
type sample struct {
	d       SampleDeps
	early   func(*SampledStep)  // publishes a step's device tokens early (lagged edge to forward)
	scratch []*sampling.Scratch // one per worker
	logits  []float32           // reused host copy of each step's logits

	dev   kernels.DeviceSampler // nil: the backend has none
	edits []editBuilder         // one per worker
	masks grammarMasks          // the step's allowed-token masks (structured output)
	rows  []kernels.SampleRow   // reused device rows
	timer sampleTimer           // device time of the sampling kernels
}

// minRowsPerWorker keeps small batches on one goroutine, where a fan-out
// would cost more than it saves.
const minRowsPerWorker = 8

// PublishLagged keeps the graph's early publishing (device tokens).
func (s *sample) PublishLagged(p func(*SampledStep)) { s.early = p }

// Process builds each row's kernels.SampleRow (split over the workers),
// then samples the step on the device (one call for every row) or on the
// host (each worker samples its rows as it builds them). Cost per row: the
// row's O(masked + bias + history) to build and check its edits, plus on
// the host the sampler's (sampling.Sample) after the step's download.
func (s *sample) Process(ctx context.Context, res *ForwardResult) (*SampledStep, error) {
	onDev := s.dev != nil && onDevice(res)
	var logits [][]float32
	out := &SampledStep{ForwardResult: res, Samples: make([]Sample, len(res.Rows))}
	if onDev {
		startSample(res)
	} else {
		var err error
		if logits, err = beginSample(s.d, res, &s.logits); err != nil {
			return nil, err
		}
		if out.PromptLogprobs, err = promptLogprobs(res, logits[len(res.Rows):]); err != nil {
			return nil, fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
		}
	}
	vocab := 0
	if res.Logits != nil {
		vocab = res.Logits.Shape()[len(res.Logits.Shape())-1]
	}
	eos := s.d.EOSTokenIDs
	n := len(res.Rows)
	if onDev {
		s.rows = slices.Grow(s.rows[:0], n)[:n]
	}
	workers := min(len(s.scratch), max(1, n/minRowsPerWorker))
	s.masks.compute(res, vocab, workers)
	var g errgroup.Group
	for w := range workers {
		lo, hi := w*n/workers, (w+1)*n/workers
		g.Go(func() error {
			b := &s.edits[w]
			b.reset(vocab)
			for r := lo; r < hi; r++ {
				ref := res.Rows[r]
				row, err := b.row(ref.Meta, ref.Index, eos, rowHistory(res, ref))
				if err == nil {
					row.Allowed = s.masks.row(r)
					keepGrammarPossible(&row)
				}
				if err == nil && !onDev {
					out.Samples[r], err = sampleHost(logits[r], &row, s.scratch[w])
				}
				if err != nil {
					return fmt.Errorf("sample: step %d: request %q: %w", res.Outputs.StepID, ref.RequestID, err)
				}
				if onDev {
					s.rows[r] = row
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if onDev {
		return sampleOnDevice(s.d, s.early, s.dev, res, s.rows, &s.timer)
	}
	var tokens kernels.Tensor
	if s.d.Defer && n > 0 { // the verify stage's device half reads them
		ids := make([]int32, n)
		for r := range ids {
			ids[r] = int32(out.Samples[r].Token)
		}
		var err error
		if tokens, err = kernels.FromI32(s.d.Ops, ids, n); err != nil {
			return nil, fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
		}
	}
	return out, endSample(s.d, out, tokens)
}

// rowHistory returns the tokens a row's sequence has beyond its metadata:
// the previous step's (PendingTokens) and, for the row at Offset j of a
// speculative decode, its first j drafts (as if accepted: the row is the
// target's distribution after them).
func rowHistory(res *ForwardResult, ref RowRef) []int {
	pending := PendingTokens(res, ref.Meta)
	if ref.Offset == 0 {
		return pending
	}
	drafts := StepDrafts(res, ref.Meta)
	return append(slices.Clip(pending), drafts[:min(ref.Offset, len(drafts))]...)
}

// onDevice reports whether a step can be sampled on the device: it has
// logits, and no row asks for logprobs or scores prompt tokens.
func onDevice(res *ForwardResult) bool {
	if res.Logits == nil || len(res.PromptRows) > 0 {
		return false
	}
	for _, ref := range res.Rows {
		if ref.Meta.Params.Logprobs != nil {
			return false
		}
	}
	return true
}

// sampleHost samples one row on the host (logits are edited in place) and
// returns its token, with its logprobs when the row asks for them.
func sampleHost(logits []float32, row *kernels.SampleRow, sc *sampling.Scratch) (Sample, error) {
	got, err := sampling.Sample(logits, row, sc)
	if err != nil {
		return Sample{}, err
	}
	smp := Sample{Token: int(got.Token)}
	if row.Logprobs {
		lp := &engine.TokenLogprobs{TokenID: int(got.Token), Logprob: got.Logprob}
		for _, t := range got.Top {
			lp.Top = append(lp.Top, engine.TokenLogprob{TokenID: int(t.Token), Logprob: t.Logprob})
		}
		smp.Logprobs = lp
	}
	return smp, nil
}

// editBuilder resolves one sequence's request params into the
// kernels.SampleRow that both samplers take: the settings, the seed and
// output position of the draw, the logprobs asked, and edits that carry
// the min_tokens mask, the logit bias and, when a penalty is active, the
// prompt and output history (one edit per distinct token id, the output
// count with it). Its dense index over the vocabulary is cleared after
// each row, so a row costs O(masked + bias + history) and a builder holds
// 4 bytes per vocabulary entry. Not safe for concurrent use.
type editBuilder struct {
	slot  []int32             // token id -> 1 + its edit's index in the current row; 0: none
	edits []kernels.LogitEdit // the edits of the rows built since reset
	start int                 // the current row's first edit
}

// reset starts a step: the rows built before are no longer needed.
func (b *editBuilder) reset(vocab int) {
	if len(b.slot) != vocab {
		b.slot = make([]int32, vocab)
	}
	b.edits = b.edits[:0]
}

// edit returns the index in b.edits of token t's edit in the current row,
// adding an empty one the first time; ok is false for an id outside the
// vocabulary.
func (b *editBuilder) edit(t int) (k int, ok bool) {
	if t < 0 || t >= len(b.slot) {
		return 0, false
	}
	if k := b.slot[t]; k > 0 {
		return b.start + int(k) - 1, true
	}
	b.edits = append(b.edits, kernels.LogitEdit{Token: int32(t)})
	b.slot[t] = int32(len(b.edits) - b.start)
	return len(b.edits) - 1, true
}

// outside is the error of a token id outside the vocabulary.
func (b *editBuilder) outside(what string, t int) error {
	return fmt.Errorf("%s token id %d not in [0, %d): %w", what, t, len(b.slot), kernels.ErrOutOfRange)
}

// row builds the SampleRow of a sequence's request params (m.Params, checked
// by engine.SamplingParams.Validate at admission): a temperature below
// sampling.GreedyEpsilon makes the row greedy; the index-th output of a
// request with a seed draws from seed+index, as vLLM's parallel sampling
// does (no seed: 0); the draw's step is the output position, which counts
// pending, the sequence's tokens sampled by the previous step and not yet
// in its metadata (zero-overhead scheduling). While the output is shorter
// than min_tokens the stop ids, and the eos ids unless ignore_eos, are
// masked. The row's Edits alias the builder until its next reset. Errors:
// a token id outside the vocabulary (kernels.ErrOutOfRange).
func (b *editBuilder) row(m *engine.SequenceMetadata, index int, eos, pending []int) (kernels.SampleRow, error) {
	rp := m.Params
	numOut := len(m.TokenIDs) + len(pending) - m.NumPromptTokens
	r := kernels.SampleRow{
		Greedy: rp.Temperature < sampling.GreedyEpsilon, Temperature: rp.Temperature,
		TopK: rp.TopK, TopP: rp.TopP, MinP: rp.MinP,
		Step:              uint64(numOut),
		RepetitionPenalty: rp.RepetitionPenalty, PresencePenalty: rp.PresencePenalty, FrequencyPenalty: rp.FrequencyPenalty,
	}
	if rp.Seed != nil {
		r.Seed = uint64(*rp.Seed) + uint64(index)
	}
	if rp.Logprobs != nil {
		r.Logprobs, r.NumLogprobs = true, *rp.Logprobs
	}
	b.start = len(b.edits)
	err := b.addEdits(m, numOut < rp.MinTokens, eos, pending, &r)
	for _, e := range b.edits[b.start:] {
		b.slot[e.Token] = 0
	}
	if err != nil {
		b.edits = b.edits[:b.start]
		return kernels.SampleRow{}, err
	}
	r.Edits = b.edits[b.start:len(b.edits):len(b.edits)]
	return r, nil
}

// addEdits adds the current row's edits: the min_tokens mask (when
// masked), the logit bias, and the history when r's penalties are active.
func (b *editBuilder) addEdits(m *engine.SequenceMetadata, masked bool, eos, pending []int, r *kernels.SampleRow) error {
	rp := m.Params
	if masked {
		for _, t := range rp.StopTokenIDs {
			k, ok := b.edit(t)
			if !ok {
				return b.outside("stop", t)
			}
			b.edits[k].Flags |= kernels.EditMask
		}
		if !rp.IgnoreEOS {
			for _, t := range eos {
				k, ok := b.edit(t)
				if !ok {
					return b.outside("eos", t)
				}
				b.edits[k].Flags |= kernels.EditMask
			}
		}
	}
	for t, bias := range rp.LogitBias {
		k, ok := b.edit(t)
		if !ok {
			return b.outside("logit_bias", t)
		}
		b.edits[k].Flags |= kernels.EditBias
		b.edits[k].Bias = bias
	}
	if !r.Penalized() {
		return nil
	}
	for _, t := range m.TokenIDs[:m.NumPromptTokens] {
		k, ok := b.edit(t)
		if !ok {
			return b.outside("prompt", t)
		}
		b.edits[k].Flags |= kernels.EditSeen
	}
	for _, out := range [2][]int{m.TokenIDs[m.NumPromptTokens:], pending} {
		for _, t := range out {
			k, ok := b.edit(t)
			if !ok {
				return b.outside("output", t)
			}
			b.edits[k].Flags |= kernels.EditSeen
			b.edits[k].Count++
		}
	}
	return nil
}

// promptLogprobs scores the prompt rows of a step.
func promptLogprobs(res *ForwardResult, rows [][]float32) ([]engine.TokenLogprobs, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	out := make([]engine.TokenLogprobs, len(rows))
	for i, logits := range rows {
		pr := res.PromptRows[i]
		got, err := sampling.PromptLogprobs(logits, int32(pr.Next), *pr.Meta.Params.PromptLogprobs)
		if err != nil {
			return nil, fmt.Errorf("prompt logprobs of %q: %w", pr.Meta.RequestID, err)
		}
		lp := engine.TokenLogprobs{TokenID: pr.Next, Logprob: got.Logprob}
		for _, t := range got.Top {
			lp.Top = append(lp.Top, engine.TokenLogprob{TokenID: int(t.Token), Logprob: t.Logprob})
		}
		out[i] = lp
	}
	return out, nil
}

// grammarMasks computes the allowed-token masks of a step's rows under a
// structured-output constraint (RowRef.Grammar), one bitmask of the
// vocabulary per such row, reused from step to step. The row at Offset j of
// a speculative decode is masked after its first j drafts: they are
// committed to the matcher for the mask and rolled back after; past a draft
// the grammar refuses, rows get no mask (the row before refuses that draft,
// so verification discards them). A terminated matcher (its sequence ended
// at the step before, still planned under zero-overhead scheduling) gives
// no mask: that row is discarded.
type grammarMasks struct {
	bits []uint32   // backing store, words per row
	rows [][]uint32 // per step row: its mask, nil when none
}

// compute fills the masks of res's rows, the rows of one sequence on one
// goroutine (they share its matcher), spread over workers. Cost: nothing
// for a step without a constrained row; otherwise one ComputeMask per
// constrained row (see engine/grammar) plus a Commit and a Rollback per
// draft.
func (g *grammarMasks) compute(res *ForwardResult, vocab, workers int) {
	n := len(res.Rows)
	g.rows = slices.Grow(g.rows[:0], n)[:n]
	clear(g.rows)
	var groups []int // first row of each constrained sequence's rows
	for r := 0; r < n; r++ {
		if res.Rows[r].Grammar != nil && (r == 0 || res.Rows[r-1].SeqID != res.Rows[r].SeqID) {
			groups = append(groups, r)
		}
	}
	if len(groups) == 0 {
		return
	}
	words := (vocab + 31) / 32
	if need := n * words; len(g.bits) < need {
		g.bits = make([]uint32, need)
	}
	var wg sync.WaitGroup
	workers = min(workers, len(groups))
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(groups); i += workers {
				g.sequence(res, groups[i], words)
			}
		})
	}
	wg.Wait()
}

// sequence masks the rows of one sequence, from row first on.
func (g *grammarMasks) sequence(res *ForwardResult, first, words int) {
	ref := res.Rows[first]
	m := ref.Grammar
	if m.IsTerminated() {
		return
	}
	drafts := StepDrafts(res, ref.Meta)
	committed := 0
	for r := first; r < len(res.Rows) && res.Rows[r].SeqID == ref.SeqID; r++ {
		j := res.Rows[r].Offset
		for committed < j {
			if committed >= len(drafts) || m.Commit(drafts[committed]) != nil {
				j = -1
				break
			}
			committed++
		}
		if j < 0 {
			break
		}
		mask := g.bits[r*words : (r+1)*words : (r+1)*words]
		m.ComputeMask(mask)
		g.rows[r] = mask
	}
	if committed > 0 {
		if err := m.Rollback(committed); err != nil {
			panic(fmt.Sprintf("sample: grammar rollback of %d drafts: %v", committed, err))
		}
	}
}

// row returns step row r's mask (nil: unconstrained).
func (g *grammarMasks) row(r int) []uint32 { return g.rows[r] }

// keepGrammarPossible drops a row's min_tokens mask (the stop and EOS ids)
// when the grammar allows nothing else: the constraint is complete, and
// ending the output is the only way on.
func keepGrammarPossible(r *kernels.SampleRow) {
	if r.Allowed == nil {
		return
	}
	masked := 0
	for _, e := range r.Edits {
		if e.Flags&kernels.EditMask != 0 && r.Allowed[e.Token/32]>>(e.Token%32)&1 == 1 {
			masked++
		}
	}
	if masked == 0 {
		return
	}
	allowed := 0
	for _, w := range r.Allowed {
		allowed += bits.OnesCount32(w)
	}
	if allowed > masked {
		return
	}
	for i := range r.Edits {
		r.Edits[i].Flags &^= kernels.EditMask
	}
}
