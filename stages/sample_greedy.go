package stages

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

func init() {
	RegisterSample(nil, "greedy", NoOptions{}, func(d SampleDeps, _ NoOptions) (SampleStage, error) {
		dev, _ := d.Ops.(kernels.DeviceSampler)
		return &greedySample{d: d, dev: dev}, nil
	})
}

// argmax returns the index of the largest value, the lowest index on ties.
func argmax(xs []float32) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
}

// greedySample takes the argmax of every row, whatever the sampling params
// say: a minimal sampler to swap in from YAML. On a backend that samples on
// the device (kernels.DeviceSampler) the argmax runs there, unless the step
// scores prompt rows (prompt_logprobs need the rows on the host); the
// device reports a row with NaN or +Inf as an error, where the host argmax
// skips NaN and takes the first +Inf.
type greedySample struct {
	d      SampleDeps
	early  func(*SampledStep)    // publishes a step's device tokens early (lagged edge to forward)
	dev    kernels.DeviceSampler // nil: the backend has none
	logits []float32             // reused host copy of each step's logits
	rows   []kernels.SampleRow   // reused device rows
	timer  sampleTimer           // device time of the sampling kernels
}

// PublishLagged keeps the graph's early publishing (device tokens).
func (g *greedySample) PublishLagged(p func(*SampledStep)) { g.early = p }

func (g *greedySample) Process(ctx context.Context, res *ForwardResult) (*SampledStep, error) {
	if g.dev != nil && res.Logits != nil && len(res.PromptRows) == 0 {
		startSample(res)
		g.rows = g.rows[:0]
		for range res.Rows {
			g.rows = append(g.rows, kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1})
		}
		return sampleOnDevice(g.d, g.early, g.dev, res, g.rows, &g.timer)
	}
	rows, err := beginSample(g.d, res, &g.logits)
	if err != nil {
		return nil, err
	}
	out := &SampledStep{ForwardResult: res, Samples: make([]Sample, len(res.Rows))}
	for r, row := range rows[:len(res.Rows)] {
		out.Samples[r] = Sample{Token: argmax(row)}
	}
	if out.PromptLogprobs, err = promptLogprobs(res, rows[len(res.Rows):]); err != nil {
		return nil, fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
	}
	return out, endSample(g.d, out, nil)
}
