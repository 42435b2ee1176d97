package stages

import (
	"context"
	"fmt"
	"runtime"
	"slices"

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

// sample draws each row's token with the request's sampling params
// (kernels/sampling): masks for min_tokens, logit bias, penalties over the
// prompt and output so far, greedy or temperature with min-p, top-k, top-p,
// and a draw keyed by (seed, output position), so that a request's tokens
// do not depend on its batch neighbours. Rows are split over one worker per
// core (each row is independent, so the split changes no result).
//
// On a backend that samples on the device (kernels.DeviceSampler) a step
// whose rows ask for no logprobs and no prompt logprobs is sampled there:
// each row's params become a kernels.SampleRow whose edits carry the
// min_tokens mask, the logit bias and the penalty history (one edit per
// distinct token), the logits stay on the device, and the tokens are
// published to the next step from device memory. Other steps, and backends
// without the capability, sample on the host as above.
type sample struct {
	d       SampleDeps
	early   func(*SampledStep)  // publishes a step's device tokens early (lagged edge to forward)
	scratch []*sampling.Scratch // one per worker
	logits  []float32           // reused host copy of each step's logits

	dev   kernels.DeviceSampler // nil: the backend has none
	edits []editBuilder         // one per worker
	rows  []kernels.SampleRow   // reused device rows
	timer sampleTimer           // device time of the sampling kernels
}

// minRowsPerWorker keeps small batches on one goroutine, where a fan-out
// would cost more than it saves.
const minRowsPerWorker = 8

// PublishLagged keeps the graph's early publishing (device tokens).
func (s *sample) PublishLagged(p func(*SampledStep)) { s.early = p }

func (s *sample) Process(ctx context.Context, res *ForwardResult) (*SampledStep, error) {
	if s.dev != nil && onDevice(res) {
		return s.processDevice(res)
	}
	rows, err := beginSample(s.d, res, &s.logits)
	if err != nil {
		return nil, err
	}
	out := &SampledStep{ForwardResult: res, Samples: make([]Sample, len(res.Rows))}
	if out.PromptLogprobs, err = promptLogprobs(res, rows[len(res.Rows):]); err != nil {
		return nil, fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
	}
	eos := s.d.EOSTokenIDs
	n := len(res.Rows)
	workers := min(len(s.scratch), max(1, n/minRowsPerWorker))
	var g errgroup.Group
	for w := range workers {
		lo, hi := w*n/workers, (w+1)*n/workers
		g.Go(func() error {
			for r := lo; r < hi; r++ {
				if err := s.sampleRow(res, rows[r], r, eos, s.scratch[w], out); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, endSample(s.d, out, nil)
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

// processDevice samples a step on the device: the rows' settings are built
// on the host (split over the workers as the host path), then one call
// samples every row. Cost: the host path's O(history) per penalized row
// and none of its download or per-token work; one device call, which waits
// for the tokens.
func (s *sample) processDevice(res *ForwardResult) (*SampledStep, error) {
	startSample(res)
	eos := s.d.EOSTokenIDs
	vocab := res.Logits.Shape()[len(res.Logits.Shape())-1]
	n := len(res.Rows)
	s.rows = slices.Grow(s.rows[:0], n)[:n]
	workers := min(len(s.edits), max(1, n/minRowsPerWorker))
	var g errgroup.Group
	for w := range workers {
		lo, hi := w*n/workers, (w+1)*n/workers
		g.Go(func() error {
			b := &s.edits[w]
			b.reset(vocab)
			for r := lo; r < hi; r++ {
				ref := res.Rows[r]
				p, hist, step := rowParams(ref.Meta, ref.Index, eos, PendingTokens(res, ref.Meta))
				row, err := b.row(&p, hist, step)
				if err != nil {
					return fmt.Errorf("sample: step %d: request %q: %w", res.Outputs.StepID, ref.RequestID, err)
				}
				s.rows[r] = row
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return sampleOnDevice(s.d, s.early, s.dev, res, s.rows, &s.timer)
}

// editBuilder turns one row's host sampling inputs (rowParams) into a
// kernels.SampleRow whose edits reproduce sampling.Sample's mask, bias and
// penalties: one edit per distinct token id among the masked ids, the bias
// map and, when a penalty is active, the prompt and output history (the
// output count with it). Its dense index over the vocabulary is cleared
// after each row, so a row costs O(masked + bias + history) and a builder
// holds 4 bytes per vocabulary entry. Not safe for concurrent use.
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
func (b *editBuilder) edit(t int32) (k int, ok bool) {
	if t < 0 || int(t) >= len(b.slot) {
		return 0, false
	}
	if k := b.slot[t]; k > 0 {
		return b.start + int(k) - 1, true
	}
	b.edits = append(b.edits, kernels.LogitEdit{Token: t})
	b.slot[t] = int32(len(b.edits) - b.start)
	return len(b.edits) - 1, true
}

// outside is the error of a token id outside the vocabulary.
func (b *editBuilder) outside(what string, t int32) error {
	return fmt.Errorf("%s token id %d not in [0, %d): %w", what, t, len(b.slot), kernels.ErrOutOfRange)
}

// row builds the SampleRow of params p, history h (read only when a
// penalty is active, as sampling.Sample does) and output position step.
// The row's Edits alias the builder until its next reset.
func (b *editBuilder) row(p *sampling.Params, h sampling.History, step uint64) (kernels.SampleRow, error) {
	r := kernels.SampleRow{
		Greedy: p.Greedy(), Temperature: p.Temperature, TopK: p.TopK, TopP: p.TopP, MinP: p.MinP,
		Seed: p.Seed, Step: step,
		RepetitionPenalty: p.RepetitionPenalty, PresencePenalty: p.PresencePenalty, FrequencyPenalty: p.FrequencyPenalty,
	}
	b.start = len(b.edits)
	err := b.addEdits(p, h, &r)
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

func (b *editBuilder) addEdits(p *sampling.Params, h sampling.History, r *kernels.SampleRow) error {
	for _, t := range p.Masked {
		k, ok := b.edit(t)
		if !ok {
			return b.outside("masked", t)
		}
		b.edits[k].Flags |= kernels.EditMask
	}
	for t, bias := range p.LogitBias {
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
	if h.Penalty != nil {
		return fmt.Errorf("a penalty state instead of the token history: %w", kernels.ErrSampleParams)
	}
	for _, t := range h.PromptTokenIDs {
		k, ok := b.edit(t)
		if !ok {
			return b.outside("prompt", t)
		}
		b.edits[k].Flags |= kernels.EditSeen
	}
	for _, t := range h.OutputTokenIDs {
		k, ok := b.edit(t)
		if !ok {
			return b.outside("output", t)
		}
		b.edits[k].Flags |= kernels.EditSeen
		b.edits[k].Count++
	}
	return nil
}

// sampleRow samples row r into out.Samples[r].
func (s *sample) sampleRow(res *ForwardResult, logits []float32, r int, eos []int, sc *sampling.Scratch, out *SampledStep) error {
	ref := res.Rows[r]
	m := ref.Meta
	p, hist, step := rowParams(m, ref.Index, eos, PendingTokens(res, m))
	got, err := sampling.Sample(logits, &p, hist, step, sc)
	if err != nil {
		return fmt.Errorf("sample: step %d: request %q: %w", res.Outputs.StepID, ref.RequestID, err)
	}
	smp := Sample{Token: int(got.Token)}
	if p.Logprobs {
		lp := &engine.TokenLogprobs{TokenID: int(got.Token), Logprob: got.Logprob}
		for _, t := range got.Top {
			lp.Top = append(lp.Top, engine.TokenLogprob{TokenID: int(t.Token), Logprob: t.Logprob})
		}
		smp.Logprobs = lp
	}
	out.Samples[r] = smp
	return nil
}

// rowParams converts a sequence's request params into one row's sampling
// params, its penalty history and its output position. pending are the
// sequence's tokens sampled by the previous step and not yet in its
// metadata (zero-overhead scheduling). The index-th output of a request
// with a seed draws from seed+index, as vLLM's parallel sampling does.
func rowParams(m *engine.SequenceMetadata, index int, eos []int, pending []int) (sampling.Params, sampling.History, uint64) {
	rp := m.Params
	p := sampling.DefaultParams()
	p.Temperature, p.TopK, p.TopP, p.MinP = rp.Temperature, rp.TopK, rp.TopP, rp.MinP
	p.RepetitionPenalty, p.PresencePenalty, p.FrequencyPenalty = rp.RepetitionPenalty, rp.PresencePenalty, rp.FrequencyPenalty
	if len(rp.LogitBias) > 0 {
		p.LogitBias = make(map[int32]float32, len(rp.LogitBias))
		for id, b := range rp.LogitBias {
			p.LogitBias[int32(id)] = b
		}
	}
	if rp.Seed != nil {
		p.Seed, p.Seeded = uint64(*rp.Seed)+uint64(index), true
	}
	if rp.Logprobs != nil {
		p.Logprobs, p.NumLogprobs = true, *rp.Logprobs
	}
	numOut := len(m.TokenIDs) + len(pending) - m.NumPromptTokens
	if numOut < rp.MinTokens {
		for _, id := range rp.StopTokenIDs {
			p.Masked = append(p.Masked, int32(id))
		}
		if !rp.IgnoreEOS {
			for _, id := range eos {
				p.Masked = append(p.Masked, int32(id))
			}
		}
	}
	var hist sampling.History
	if p.RepetitionPenalty != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		hist.PromptTokenIDs = toI32(m.TokenIDs[:m.NumPromptTokens])
		hist.OutputTokenIDs = append(toI32(m.TokenIDs[m.NumPromptTokens:]), toI32(pending)...)
	}
	return p, hist, uint64(numOut)
}

func toI32(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
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
