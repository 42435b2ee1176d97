package stages

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func init() {
	registerStage("sample", "greedy", func(rt *Runtime) pipeline.Stage[*ForwardResult, *SampledStep] {
		dev, _ := rt.Ops.(kernels.DeviceSampler)
		return &greedySample{rt: rt, dev: dev}
	})
	pipeline.Register("logit-softcap", "default", func(a pipeline.Args) (*pipeline.Node, error) {
		rt, err := runtimeOf(a)
		if err != nil {
			return nil, err
		}
		o := struct {
			Cap float64 `yaml:"cap"`
		}{Cap: 30}
		if err := a.DecodeOptions(&o); err != nil {
			return nil, err
		}
		if !(o.Cap > 0) {
			return nil, fmt.Errorf("logit-softcap: cap must be positive, got %g", o.Cap)
		}
		return pipeline.NewStage[*ForwardResult, *ForwardResult](&softcap{rt: rt, cap: float32(o.Cap)}), nil
	})
}

// hostLogits downloads a step's logits as rows of float32 into buf (grown
// as needed and returned for reuse: sampling runs one step at a time).
func hostLogits(ops kernels.Ops, res *ForwardResult, buf *[]float32) ([][]float32, error) {
	if res.Logits == nil {
		return nil, nil
	}
	flat, err := kernels.ToF32Into(ops, res.Logits, *buf)
	if err != nil {
		return nil, err
	}
	*buf = flat
	shape := res.Logits.Shape()
	rows, vocab := shape[0], shape[1]
	out := make([][]float32, rows)
	for r := range out {
		out[r] = flat[r*vocab : (r+1)*vocab : (r+1)*vocab]
	}
	return out, nil
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
	rt     *Runtime
	dev    kernels.DeviceSampler // nil: the backend has none
	logits []float32             // reused host copy of each step's logits
	rows   []kernels.SampleRow   // reused device rows
	timer  sampleTimer           // device time of the sampling kernels
}

func (g *greedySample) Process(ctx context.Context, res *ForwardResult) (*SampledStep, error) {
	if g.dev != nil && res.Logits != nil && len(res.PromptRows) == 0 {
		if err := waitSample(ctx, g.rt, res); err != nil {
			return nil, err
		}
		g.rows = g.rows[:0]
		for range res.Rows {
			g.rows = append(g.rows, kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1})
		}
		return sampleOnDevice(g.rt, g.dev, res, g.rows, &g.timer)
	}
	rows, err := beginSample(ctx, g.rt, res, &g.logits)
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
	return out, endSample(g.rt, out, nil)
}

// sampleOnDevice samples every row of a step on the backend, which keeps
// the tokens, and publishes them for the next step's placeholders without
// an upload. rows has one entry per res.Rows.
//
// On a kernels.AsyncDeviceSampler the device tokens are published before
// their host copy arrives, so the next step's forward pass (which resolves
// its placeholders from them on the device) is queued behind the sampling
// while this stage waits for the copy: the device does not idle between
// the two passes for the host's round trip.
func sampleOnDevice(rt *Runtime, dev kernels.DeviceSampler, res *ForwardResult, rows []kernels.SampleRow, timer *sampleTimer) (*SampledStep, error) {
	var (
		tokens kernels.Tensor
		host   []int32
		err    error
	)
	early := false
	if a, ok := dev.(kernels.AsyncDeviceSampler); ok {
		var fetch func() ([]int32, error)
		timed := timer.begin(rt)
		if tokens, fetch, err = a.SampleTokensAsync(res.Logits, rows); err == nil {
			if timed {
				timer.end()
			}
			if err = publishTokens(rt, res, tokens); err == nil {
				early = true
				if host, err = fetch(); err == nil && timed {
					o := res.Outputs
					timer.read(rt, o.NumPrefillTokens == 0 && o.NumDecodeTokens > 0)
				}
			} else {
				fetch() // the copy is outstanding: collect it
			}
		}
	} else {
		tokens, host, err = dev.SampleTokens(res.Logits, rows)
	}
	if err != nil {
		var rowErr *kernels.SampleRowError
		if errors.As(err, &rowErr) && rowErr.Row >= 0 && rowErr.Row < len(res.Rows) {
			return nil, fmt.Errorf("sample: step %d: request %q: %w", res.Outputs.StepID, res.Rows[rowErr.Row].RequestID, err)
		}
		return nil, fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
	}
	out := &SampledStep{ForwardResult: res, Samples: make([]Sample, len(res.Rows))}
	for r := range out.Samples {
		out.Samples[r] = Sample{Token: int(host[r])}
	}
	if early {
		return out, finishSample(rt, out)
	}
	return out, endSample(rt, out, tokens)
}

// publishTokens publishes a step's device tokens (one accepted token a row)
// before their host copy: see sampleOnDevice.
func publishTokens(rt *Runtime, res *ForwardResult, tokens kernels.Tensor) error {
	accepted, err := acceptedOnes(rt, len(res.Rows))
	if err != nil {
		return fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
	}
	rt.ZOS.publishTokens(res.Outputs.StepID, tokens, accepted)
	return nil
}

// acceptedOnes is the accepted-token count of n rows without speculation:
// I32 [n] of ones in backend memory (nil for no rows).
func acceptedOnes(rt *Runtime, n int) (kernels.Tensor, error) {
	if n == 0 {
		return nil, nil
	}
	ones := make([]int32, n)
	for i := range ones {
		ones[i] = 1
	}
	return kernels.FromI32(rt.Ops, ones, n)
}

// finishSample completes a step whose device tokens were published early:
// their host copy joins them, and the step's sample time is recorded.
func finishSample(rt *Runtime, out *SampledStep) error {
	host := make([]int, len(out.Samples))
	for i, s := range out.Samples {
		host[i] = s.Token
	}
	rt.ZOS.publishHost(out.Outputs.StepID, host)
	if rt.Stats != nil {
		rt.Stats.recordSample(time.Since(out.sampleStart))
	}
	return nil
}

// waitSample waits until the previous step is post-processed (see
// MetadataZOS) and starts the step's sample clock.
func waitSample(ctx context.Context, rt *Runtime, res *ForwardResult) error {
	t := time.Now()
	if err := rt.ZOS.waitPostprocessed(ctx, res.Outputs.StepID-1); err != nil {
		return err
	}
	res.sampleStart = time.Now()
	if rt.Stats != nil {
		rt.Stats.PostWaitNanos.Add(int64(res.sampleStart.Sub(t)))
	}
	return nil
}

// beginSample waits as waitSample and fetches the step's logits rows.
func beginSample(ctx context.Context, rt *Runtime, res *ForwardResult, buf *[]float32) ([][]float32, error) {
	if err := waitSample(ctx, rt, res); err != nil {
		return nil, err
	}
	rows, err := hostLogits(rt.Ops, res, buf)
	if err != nil {
		return nil, fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
	}
	return rows, nil
}

// endSample publishes the step's tokens for the next step's placeholders:
// tokens, when not nil, already holds them in backend memory (sampled on
// the device); otherwise they are uploaded. It records the step's sample
// time (from waitSample to here: the host path's download and sampling, or
// the device path's launch and wait).
func endSample(rt *Runtime, out *SampledStep, tokens kernels.Tensor) error {
	n := len(out.Samples)
	host := make([]int, n)
	toks := make([]int32, n)
	for i, s := range out.Samples {
		host[i], toks[i] = s.Token, int32(s.Token)
	}
	var err error
	if tokens == nil && n > 0 {
		if tokens, err = kernels.FromI32(rt.Ops, toks, n); err != nil {
			return fmt.Errorf("sample: step %d: %w", out.Outputs.StepID, err)
		}
	}
	accepted, err := acceptedOnes(rt, n)
	if err != nil {
		return fmt.Errorf("sample: step %d: %w", out.Outputs.StepID, err)
	}
	took := time.Since(out.sampleStart)
	rt.ZOS.publish(out.Outputs.StepID, tokens, accepted, host)
	if rt.Stats != nil {
		rt.Stats.recordSample(took)
	}
	// Publishing readied the forward stage, waiting on these tokens; handing
	// post-processing the step next would run it first on this core. Yield
	// so the forward pass of the next step starts now (DeepInfer's order:
	// forward N+1, then post-process N).
	runtime.Gosched()
	return nil
}

// softcap bounds logits smoothly: cap * tanh(logit / cap), as Gemma 2 does.
type softcap struct {
	rt  *Runtime
	cap float32
}

func (s *softcap) Process(_ context.Context, res *ForwardResult) (*ForwardResult, error) {
	if res.Logits == nil {
		return res, nil
	}
	flat, err := kernels.ToF32(s.rt.Ops, res.Logits)
	if err != nil {
		return nil, fmt.Errorf("logit-softcap: %w", err)
	}
	for i, x := range flat {
		flat[i] = s.cap * float32(math.Tanh(float64(x/s.cap)))
	}
	capped, err := kernels.FromF32(s.rt.Ops, flat, res.Logits.Shape()...)
	if err != nil {
		return nil, fmt.Errorf("logit-softcap: %w", err)
	}
	out := *res
	out.Logits = capped
	return &out, nil
}
