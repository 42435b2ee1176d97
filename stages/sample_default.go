package stages

import (
	"context"
	"fmt"
	"runtime"

	"golang.org/x/sync/errgroup"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels/sampling"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func init() {
	registerStage("sample", "default", func(rt *Runtime) pipeline.Stage[*ForwardResult, *SampledStep] {
		scratch := make([]*sampling.Scratch, runtime.NumCPU())
		for i := range scratch {
			scratch[i] = new(sampling.Scratch)
		}
		return &sample{rt: rt, scratch: scratch}
	})
}

// sample draws each row's token with the request's sampling params
// (kernels/sampling): masks for min_tokens, logit bias, penalties over the
// prompt and output so far, greedy or temperature with min-p, top-k, top-p,
// and a draw keyed by (seed, output position), so that a request's tokens
// do not depend on its batch neighbours. Rows are split over one worker per
// core (each row is independent, so the split changes no result).
type sample struct {
	rt      *Runtime
	scratch []*sampling.Scratch // one per worker
	logits  []float32           // reused host copy of each step's logits
}

// minRowsPerWorker keeps small batches on one goroutine, where a fan-out
// would cost more than it saves.
const minRowsPerWorker = 8

func (s *sample) Process(ctx context.Context, res *ForwardResult) (*SampledStep, error) {
	rows, err := beginSample(ctx, s.rt, res, &s.logits)
	if err != nil {
		return nil, err
	}
	out := &SampledStep{ForwardResult: res, Samples: make([]Sample, len(res.Rows))}
	if out.PromptLogprobs, err = promptLogprobs(res, rows[len(res.Rows):]); err != nil {
		return nil, fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
	}
	eos := s.rt.Scheduler.Config().EOSTokenIDs
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
	return out, endSample(s.rt, out)
}

// sampleRow samples row r into out.Samples[r].
func (s *sample) sampleRow(res *ForwardResult, logits []float32, r int, eos []int, sc *sampling.Scratch, out *SampledStep) error {
	ref := res.Rows[r]
	m := ref.Meta
	p, hist, step := rowParams(m, ref.Index, eos, s.rt.ZOS.pendingTokens(res.Outputs.StepID, m))
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
