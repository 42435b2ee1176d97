package stages

import (
	"context"
	"fmt"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// The forward slot: *PreparedStep -> *ForwardResult. A stage of this slot
// runs the model over the paged KV cache and computes the logits of the
// rows that sample (Logits, F32 [len(Rows)+len(PromptRows), vocab]). It
// performs the scheduler's block copies (Outputs.BlockCopies) first and
// resolves placeholder inputs from the step before (ResolvePlaceholders,
// with PreparedStep.Previous, which the loop's lagged edge from sample
// delivers: forward of step N+1 waits for sample of step N). Device work
// done once (warm-up, CUDA graph capture) belongs in a Start method
// (pipeline.Starter), never in the constructor.
type ForwardStage = pipeline.Stage[*PreparedStep, *ForwardResult]

// ForwardDeps is what a forward stage gets.
type ForwardDeps struct {
	Model       models.Model
	Ops         kernels.Ops
	Cache       *models.KVCache
	Stats       *Stats                 // nil: not counted
	Flops       *engine.FlopsEstimator // nil: not estimated
	CUDAGraph   CUDAGraph
	MaxModelLen int
}

// RegisterForward registers a forward implementation in r (nil: the
// default registry). The stage is wrapped so that each step's Previous is
// set from the lagged edge before its Process runs.
func RegisterForward[O any](r *pipeline.Registry, name string, defaults O, build func(ForwardDeps, O) (ForwardStage, error)) {
	register(r, "forward", name, defaults, func(e *Env) ForwardDeps {
		maxModelLen := 0
		if e.Scheduler != nil {
			maxModelLen = e.Scheduler.Config().MaxModelLen
		}
		return ForwardDeps{Model: e.Model, Ops: e.Ops, Cache: e.Cache, Stats: e.Stats, Flops: e.Flops,
			CUDAGraph: e.CUDAGraph, MaxModelLen: maxModelLen}
	}, build, func(s ForwardStage) *pipeline.Node {
		return withLagged(s, func(step *PreparedStep, prev *SampledStep) { step.Previous = prev })
	})
}

func init() {
	RegisterForward(nil, "default", NoOptions{}, func(d ForwardDeps, _ NoOptions) (ForwardStage, error) {
		return newForward(d), nil
	})
}

// ResolvePlaceholders fills the placeholder inputs of step (step.FromRow;
// nothing when it has none) in ids (I32, the step's input ids in backend
// memory, or a prefix of them) from the tokens of step.Previous: its
// device Tokens when the sample stage left them, else its host Samples
// (one upload). Cost: one backend gather of len(FromRow) ids.
func ResolvePlaceholders(ops kernels.Ops, step *PreparedStep, ids kernels.Tensor) error {
	if step.FromRow == nil {
		return nil
	}
	prev := step.Previous
	id := step.Outputs.StepID
	if prev == nil || prev.Outputs.StepID != id-1 {
		got := engine.StepID(0)
		if prev != nil {
			got = prev.Outputs.StepID
		}
		return fmt.Errorf("step %d has placeholders but the previous sampled step is %d, not %d", id, got, id-1)
	}
	tokens := prev.Next
	if tokens == nil {
		tokens = prev.Tokens
	}
	if tokens == nil {
		host := make([]int32, len(prev.Samples))
		for i, s := range prev.Samples {
			host[i] = int32(s.Token)
		}
		var err error
		if tokens, err = kernels.FromI32(ops, host, len(host)); err != nil {
			return fmt.Errorf("step %d: %w", id, err)
		}
	}
	if err := ops.ResolvePlaceholders(ids, step.FromRow, tokens); err != nil {
		return fmt.Errorf("step %d: %w", id, err)
	}
	return nil
}

// ShiftAccepted applies the shifts of step (step.ShiftFrom; nothing when
// it has none) from the accepted draft counts of step.Previous, which the
// draft stage leaves in backend memory (SampledStep.Accepted). Cost: one
// backend pass over the step's metadata.
func ShiftAccepted(ops kernels.Ops, step *PreparedStep) error {
	if step.ShiftFrom == nil {
		return nil
	}
	prev := step.Previous
	if prev == nil || prev.Accepted == nil || prev.Outputs.StepID != step.Outputs.StepID-1 {
		return fmt.Errorf("step %d shifts by the previous step's accepted counts, which it lacks", step.Outputs.StepID)
	}
	if err := ops.ShiftAccepted(&step.Batch.Attn, step.Batch.Positions, step.ShiftFrom, prev.Accepted); err != nil {
		return fmt.Errorf("step %d: %w", step.Outputs.StepID, err)
	}
	return nil
}

// TrimDrafts returns step without the rows that would verify nothing: a
// step planned while the step before was in flight (ZOS) gave each of its
// shifted decodes room for k drafts, and when the step before proposed
// fewer (a drafter's gate or budget, a prompt lookup that found less) the
// rows past them hold padding. TrimDrafts lays the step out again without
// them (PreparedStep.Relayout, from step.Previous.NextDrafts), so that
// the forward pass, its logits and the verification cover only the
// drafts proposed. It returns step itself when no row would be dropped or
// it cannot be laid out again (no Relayout, no NextDrafts). The copy
// shares step.Previous. Cost: nothing when nothing is dropped, else a
// host layout of the step and one upload (no wait for the device).
func TrimDrafts(step *PreparedStep) (*PreparedStep, error) {
	prev := step.Previous
	if step.Relayout == nil || prev == nil || prev.NextDrafts == nil || prev.ForwardResult == nil || prev.Outputs.StepID != step.Outputs.StepID-1 {
		return step, nil
	}
	trim := false
	for i := range step.Seqs {
		m := &step.Seqs[i]
		if m.Shifted && m.NumDrafts > 0 && m.InputFromRow >= 0 && m.InputFromRow < len(prev.NextDrafts) && prev.NextDrafts[m.InputFromRow] < m.NumDrafts {
			trim = true
			break
		}
	}
	if !trim {
		return step, nil
	}
	t, err := step.Relayout(prev.NextDrafts)
	if err != nil {
		return nil, err
	}
	t.Previous = prev
	return t, nil
}

// ForwardResult holds the logits of a step's sample rows (forward -> sample).
type ForwardResult struct {
	*PreparedStep
	Logits kernels.Tensor // F32 [len(Rows)+len(PromptRows), vocab]
	// Hidden is the last hidden state of every token of the step, before
	// the final norm (models.Model.Forward), for drafters that condition on
	// it (MTP). It is valid until the next step's forward pass.
	Hidden kernels.Tensor
	// PreviousOutputs is the step before's *StepOutputs, which the loop's
	// lagged edge from postprocess hands the sample slot before this step
	// is sampled (nil for the first step).
	PreviousOutputs *StepOutputs

	sampleStart time.Time // when sampling began, for Stats.SampleNanos
}

// newForward builds the forward stage; its device work (markers, graph
// capture) waits for Start.
func newForward(d ForwardDeps) *forward {
	f := &forward{d: d}
	_, f.asyncSample = d.Ops.(kernels.AsyncDeviceSampler)
	return f
}

// Start creates the device markers when the backend has them
// (kernels.DeviceTimer) and the stats are kept, and captures the decode
// CUDA graphs when asked. It runs before the step loop starts, when nothing
// else uses the backend's stream.
func (f *forward) Start(context.Context) error {
	if dt, ok := kernels.DeviceTimerOf(f.d.Ops); ok && f.d.Stats != nil {
		// Measurement never stops the engine: without markers the stats
		// simply have no device timeline.
		var err error
		if f.timeline, err = newDeviceTimeline(dt, f.d.Stats); err != nil {
			f.d.Stats.deviceTimelineFailed(err)
		}
	}
	if f.d.CUDAGraph.Enabled {
		var err error
		if f.graphs, err = newDecodeGraphs(f.d, f.d.CUDAGraph.BatchSizes); err != nil {
			return fmt.Errorf("forward: cuda_graph: %w", err)
		}
	}
	return nil
}

// forward runs the model over the paged KV cache and computes the logits of
// the rows that sample. It also measures the gap between the end of one
// forward pass and the start of the next: the time the device would idle
// while the host works between steps; on a backend with a device stream
// (kernels.DeviceTimer) it measures the same on the device itself, with
// markers around each pass (deviceTimeline).
type forward struct {
	d        ForwardDeps
	lastEnd  time.Time
	graphs   *decodeGraphs   // nil: every step eager
	timeline *deviceTimeline // nil: no device markers
	// asyncSample: the backend samples on the device without a host round
	// trip (kernels.AsyncDeviceSampler); see deferSync.
	asyncSample bool
}

// deferSync reports whether the stage leaves a step's work queued without
// waiting for it: when the sample stage can queue its sampling right behind
// it (asynchronous device sampling) and the device timeline measures the
// forward passes' device time (Stats.ForwardTime then reads it). The
// device then never waits for the host's hand-off from this stage to the
// sample stage; device check failures surface at the sample stage's fetch
// or the next download. Otherwise the stage waits for the device after
// each step, which also times the forward pass on the host.
func (f *forward) deferSync() bool { return f.asyncSample && f.timeline != nil }

func (f *forward) Process(ctx context.Context, step *PreparedStep) (*ForwardResult, error) {
	if t, err := TrimDrafts(step); err != nil {
		return nil, fmt.Errorf("forward: %w", err)
	} else if t != step {
		defer func() { t.Previous = nil }() // as the lagged edge clears step's
		step = t
	}
	if err := copyBlocks(f.d, step.Outputs.BlockCopies); err != nil {
		return nil, fmt.Errorf("forward: step %d: %w", step.Outputs.StepID, err)
	}
	if err := copyStates(f.d.Ops, f.d.Cache, step.Outputs.StateCopies); err != nil {
		return nil, fmt.Errorf("forward: step %d: state copies: %w", step.Outputs.StepID, err)
	}
	g := f.graphs.pick(step)
	if g != nil {
		if err := g.load(f.d, step); err != nil {
			return nil, fmt.Errorf("forward: step %d: graph inputs: %w", step.Outputs.StepID, err)
		}
	} else {
		if err := ResolvePlaceholders(f.d.Ops, step, step.Batch.InputIDs); err != nil {
			return nil, fmt.Errorf("forward: %w", err)
		}
		if err := ShiftAccepted(f.d.Ops, step); err != nil {
			return nil, fmt.Errorf("forward: %w", err)
		}
	}
	start := time.Now()
	deferred := f.deferSync()
	if f.d.Stats != nil && !f.lastEnd.IsZero() && !deferred {
		f.d.Stats.recordGap(start.Sub(f.lastEnd))
	}
	defer func() { f.lastEnd = time.Now() }()
	f.markStart(step)
	var hidden kernels.Tensor
	var err error
	if g != nil {
		if err = g.graph.Replay(); err == nil {
			hidden = g.hidden
			if f.d.Stats != nil {
				f.d.Stats.GraphSteps.Add(1)
			}
		}
	} else {
		hidden, err = f.d.Model.Forward(ctx, f.d.Cache, step.Batch)
	}
	if err != nil {
		return nil, fmt.Errorf("forward: step %d: %w", step.Outputs.StepID, err)
	}
	res := &ForwardResult{PreparedStep: step, Hidden: hidden}
	if step.SampleRows != nil && g != nil && step.RowsInOrder {
		// The graph computed every row's logits: the step's are its first.
		if res.Logits, err = f.d.Ops.Rows(g.logits, 0, step.Batch.NumTokens); err != nil {
			return nil, fmt.Errorf("forward: step %d: logits: %w", step.Outputs.StepID, err)
		}
	} else if step.SampleRows != nil {
		if res.Logits, err = f.d.Model.ComputeLogits(hidden, step.SampleRows); err != nil {
			return nil, fmt.Errorf("forward: step %d: logits: %w", step.Outputs.StepID, err)
		}
	}
	f.markEnd()
	if deferred {
		f.d.Stats.forwardDeferred.Store(true)
	} else if err := f.d.Ops.Sync(); err != nil {
		return nil, fmt.Errorf("forward: step %d: %w", step.Outputs.StepID, err)
	}
	if f.d.Stats != nil {
		var cost engine.StepCost
		if f.d.Flops != nil {
			cost = f.d.Flops.Estimate(step.Seqs)
		}
		f.d.Stats.record(step.Outputs, cost, time.Since(start))
	}
	return res, nil
}

// Close destroys the captured graphs and the device markers.
func (f *forward) Close() error {
	f.timeline.close()
	f.timeline = nil
	return f.graphs.close()
}

// markStart records the step's start marker, right before its forward work
// is queued. A marker that fails turns the timeline off (the error is kept
// in the stats); it never fails the step.
func (f *forward) markStart(step *PreparedStep) {
	if f.timeline == nil {
		return
	}
	o := step.Outputs
	if err := f.timeline.begin(o.NumPrefillTokens == 0 && o.NumDecodeTokens > 0); err != nil {
		f.timelineFailed(err)
	}
}

// markEnd records the step's end marker, right after its work is queued,
// and reads the markers of the two steps before (already completed).
func (f *forward) markEnd() {
	if f.timeline == nil {
		return
	}
	if err := f.timeline.finish(); err != nil {
		f.timelineFailed(err)
	}
}

func (f *forward) timelineFailed(err error) {
	f.d.Stats.deviceTimelineFailed(err)
	f.timeline.close()
	f.timeline = nil
}
