package stages

import (
	"context"
	"errors"
	"sync"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// dsparkCounter is an opCounter that also gives its caller the KV cache
// dtype of the backend beneath (kernels.KVCacheDTyper), so that a DSpark
// pass over it computes what it computes over that backend.
type dsparkCounter struct {
	*opCounter
	raw kernels.Ops
}

func (c dsparkCounter) KVCacheDType(w kernels.DType) kernels.DType {
	if kd, ok := c.raw.(kernels.KVCacheDTyper); ok {
		return kd.KVCacheDType(w)
	}
	return c.ActivationDType()
}

// asyncDSparkCounter is a dsparkCounter that says it computes
// asynchronously (kernels.AsyncFetcher), as a GPU backend does, so that
// its caller takes a GPU's paths: no read after each DSpark position.
type asyncDSparkCounter struct{ dsparkCounter }

func (c asyncDSparkCounter) FetchI32Async(t kernels.Tensor) (func() ([]int32, error), error) {
	c.count("fetch")
	got, err := kernels.ToI32(c.opCounter.Ops, t)
	return func() ([]int32, error) { return got, err }, nil
}

// DSparkOpStep is one drafting step of the DSpark drafter under an
// opCounter (DraftOpStep) with, for the same step, the drafts of the
// host path (dsparkDrafter.Propose: models.DSpark.Draft, then the gate)
// and the operations that path queued.
type DSparkOpStep struct {
	DraftOpStep
	Reference    [][]int
	ReferenceOps int
}

// DSparkOpRecord collects the steps of a counting DSpark drafter.
type DSparkOpRecord struct {
	mu    sync.Mutex
	Steps []DSparkOpStep
}

// countingDSpark is the DSpark drafter over an opCounter, recording each
// step and the host path's drafts for it.
type countingDSpark struct {
	*dsparkDrafter
	ops *opCounter
	rec *DSparkOpRecord
}

func (c *countingDSpark) ProposeOnDevice(ctx context.Context, step *SampledStep) (DeviceDrafts, error) {
	dd, _, err := c.record(ctx, step, false, func() (DeviceDrafts, bool, error) {
		dd, err := c.dsparkDrafter.ProposeOnDevice(ctx, step)
		return dd, true, err
	})
	return dd, err
}

func (c *countingDSpark) ProposeFromDevice(ctx context.Context, step *SampledStep) (DeviceDrafts, bool, error) {
	return c.record(ctx, step, true, func() (DeviceDrafts, bool, error) { return c.dsparkDrafter.ProposeFromDevice(ctx, step) })
}

// Propose is ProposeOnDevice with the drafts brought to the host.
func (c *countingDSpark) Propose(ctx context.Context, step *SampledStep) ([][]int, error) {
	dd, err := c.ProposeOnDevice(ctx, step)
	if err != nil {
		return nil, err
	}
	return dd.Host(c.ops.Ops)
}

func (c *countingDSpark) record(ctx context.Context, step *SampledStep, fromDevice bool, propose func() (DeviceDrafts, bool, error)) (DeviceDrafts, bool, error) {
	before := c.ops.snapshot()
	dd, ok, err := propose()
	if err != nil || !ok {
		return dd, ok, err
	}
	d := c.ops.snapshot().Sub(before)
	drafts, err := dd.Host(c.ops.Ops) // not counted: the stage's fetch
	if err != nil {
		return dd, ok, err
	}
	// The host path on the same step, once its host half is in (the stage
	// waits for it next anyway).
	if err := step.Await(); err != nil {
		return dd, ok, err
	}
	before = c.ops.snapshot()
	ref, err := c.dsparkDrafter.Propose(ctx, step)
	if err != nil {
		return dd, ok, err
	}
	s := DSparkOpStep{DraftOpStep: DraftOpStep{StepID: int64(step.Outputs.StepID), FromDevice: fromDevice, Prefill: step.Outputs.NumPrefillTokens > 0,
		NumTokens: step.Batch.NumTokens, SampleRows: step.Outputs.NumSampleRows,
		Ops: d.Ops, Total: d.Total(), Views: d.Views, Drafts: drafts, GraphsTaken: d.Ops["graph_replay"] > 0},
		Reference: ref, ReferenceOps: c.ops.snapshot().Sub(before).Total()}
	c.rec.mu.Lock()
	c.rec.Steps = append(c.rec.Steps, s)
	c.rec.mu.Unlock()
	return dd, ok, nil
}

// RegisterCountingDSpark registers in r, as the draft implementation
// name, the DSpark drafter over an opCounter of the engine's backend (the
// DSpark pass's own kernels included), which records each step's
// operations and drafts, and the host path's drafts for the same step, in
// rec. With graphs enabled the drafter captures its graphs on the CPU
// backend as the CUDA backend would (fakeGraphOps); async makes the
// counter say it computes asynchronously, as a GPU backend does.
func RegisterCountingDSpark(r *pipeline.Registry, name string, graphs CUDAGraph, async bool, rec *DSparkOpRecord) {
	RegisterDraft(r, name, NoOptions{}, func(d DraftDeps, _ NoOptions) (Drafter, error) {
		argmax, ok := d.Ops.(kernels.Argmaxer)
		if !ok {
			return nil, errors.New("counting dspark: the backend has no argmax")
		}
		raw, inner := d.Ops, d.Ops
		if graphs.Enabled {
			inner = &fakeGraphOps{Ops: d.Ops}
		}
		c := newOpCounter(inner, argmax)
		var ops kernels.Ops = dsparkCounter{opCounter: c, raw: raw}
		if async {
			ops = asyncDSparkCounter{dsparkCounter{opCounter: c, raw: raw}}
		}
		d.Ops, d.CUDAGraph = ops, graphs
		if d.Speculative.DSpark != nil {
			d.Speculative.DSpark = d.Speculative.DSpark.WithOps(ops)
		}
		p, err := newDSparkDrafter(d)
		if err != nil {
			return nil, err
		}
		return &countingDSpark{dsparkDrafter: p, ops: c, rec: rec}, nil
	})
}
