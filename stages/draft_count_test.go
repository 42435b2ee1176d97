package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// opCounter is a kernels.Ops that counts the operations its caller queues
// on the backend beneath it: device operations (allocations, uploads,
// downloads, kernels, device copies, graph replays) by name, and views
// (Rows, Reshape: host bookkeeping, no device work) apart. What a graph
// runs, at its capture or at a replay, is not counted: a replay is one
// operation, as on a device; and, as on a device, uploads, downloads and
// syncs fail inside a graph. It gives its caller the backend's argmax
// (kernels.Argmaxer) and, when built over a graph backend, graph capture,
// so that the caller takes the paths it takes on a GPU.
type opCounter struct {
	kernels.Ops
	argmax kernels.Argmaxer
	graphs graphOps // nil: no graph capture

	mu     sync.Mutex
	counts map[string]int
	views  int
	paused int
}

// newOpCounter counts the operations queued on ops; argmax is the
// backend's argmax (ops may hide it behind a wrapper).
func newOpCounter(ops kernels.Ops, argmax kernels.Argmaxer) *opCounter {
	c := &opCounter{Ops: ops, argmax: argmax, counts: map[string]int{}}
	c.graphs, _ = ops.(graphOps)
	return c
}

// opCount is a snapshot of an opCounter.
type opCount struct {
	Ops   map[string]int
	Views int
}

// Total is the number of device operations.
func (c opCount) Total() int {
	n := 0
	for _, v := range c.Ops {
		n += v
	}
	return n
}

// Sub is c minus an earlier snapshot.
func (c opCount) Sub(earlier opCount) opCount {
	d := opCount{Ops: map[string]int{}, Views: c.Views - earlier.Views}
	for k, v := range c.Ops {
		if v != earlier.Ops[k] {
			d.Ops[k] = v - earlier.Ops[k]
		}
	}
	return d
}

func (c *opCounter) snapshot() opCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := opCount{Ops: make(map[string]int, len(c.counts)), Views: c.views}
	for k, v := range c.counts {
		s.Ops[k] = v
	}
	return s
}

func (c *opCounter) count(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused == 0 {
		c.counts[op]++
	}
}

func (c *opCounter) view() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused == 0 {
		c.views++
	}
}

// host fails an operation that needs the host while a graph is captured
// or replayed.
func (c *opCounter) host(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused > 0 {
		return fmt.Errorf("op counter: %s inside a graph", op)
	}
	c.counts[op]++
	return nil
}

func (c *opCounter) pause(d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.paused += d
}

func (c *opCounter) Alloc(dt kernels.DType, shape ...int) (kernels.Tensor, error) {
	c.count("alloc")
	return c.Ops.Alloc(dt, shape...)
}

func (c *opCounter) Upload(dst kernels.Tensor, src []byte, dt kernels.DType) error {
	if err := c.host("upload"); err != nil {
		return err
	}
	return c.Ops.Upload(dst, src, dt)
}

func (c *opCounter) Download(dst []byte, src kernels.Tensor) error {
	if err := c.host("download"); err != nil {
		return err
	}
	return c.Ops.Download(dst, src)
}

func (c *opCounter) Rows(t kernels.Tensor, lo, hi int) (kernels.Tensor, error) {
	c.view()
	return c.Ops.Rows(t, lo, hi)
}

func (c *opCounter) Reshape(t kernels.Tensor, shape ...int) (kernels.Tensor, error) {
	c.view()
	return c.Ops.Reshape(t, shape...)
}

func (c *opCounter) Sync() error {
	if err := c.host("sync"); err != nil {
		return err
	}
	return c.Ops.Sync()
}

func (c *opCounter) Embedding(out, table, ids kernels.Tensor) error {
	c.count("embedding")
	return c.Ops.Embedding(out, table, ids)
}

func (c *opCounter) RMSNorm(out, x, w kernels.Tensor, eps float32) error {
	c.count("rms_norm")
	return c.Ops.RMSNorm(out, x, w, eps)
}

func (c *opCounter) AddRMSNorm(out, res, x, w kernels.Tensor, eps float32) error {
	c.count("add_rms_norm")
	return c.Ops.AddRMSNorm(out, res, x, w, eps)
}

func (c *opCounter) Linear(out, x, w, bias kernels.Tensor) error {
	c.count("linear")
	return c.Ops.Linear(out, x, w, bias)
}

func (c *opCounter) SiLUMul(out, gateUp kernels.Tensor) error {
	c.count("silu_mul")
	return c.Ops.SiLUMul(out, gateUp)
}

func (c *opCounter) Add(out, a, b kernels.Tensor) error {
	c.count("add")
	return c.Ops.Add(out, a, b)
}

func (c *opCounter) Concat(out, a, b kernels.Tensor) error {
	c.count("concat")
	return c.Ops.Concat(out, a, b)
}

func (c *opCounter) SplitColumns(x kernels.Tensor, parts ...kernels.Tensor) error {
	c.count("split_columns")
	return c.Ops.SplitColumns(x, parts...)
}

func (c *opCounter) RoPE(x, pos, cos, sin kernels.Tensor, p kernels.RoPEParams) error {
	c.count("rope")
	return c.Ops.RoPE(x, pos, cos, sin, p)
}

func (c *opCounter) WriteCache(cache, src, slots kernels.Tensor, col int) error {
	c.count("write_cache")
	return c.Ops.WriteCache(cache, src, slots, col)
}

func (c *opCounter) Attention(out, q, k, v kernels.Tensor, m *kernels.AttentionMetadata, p kernels.AttentionParams) error {
	c.count("attention")
	return c.Ops.Attention(out, q, k, v, m, p)
}

func (c *opCounter) MLAAttention(out, q, cache, wkvb kernels.Tensor, m *kernels.AttentionMetadata, p kernels.MLAParams) error {
	c.count("mla_attention")
	return c.Ops.MLAAttention(out, q, cache, wkvb, m, p)
}

func (c *opCounter) MoERoute(ids, weights, logits, bias kernels.Tensor, p kernels.RouteParams) error {
	c.count("moe_route")
	return c.Ops.MoERoute(ids, weights, logits, bias, p)
}

func (c *opCounter) MoE(out, x, ids, weights, gateUp, down kernels.Tensor) error {
	c.count("moe")
	return c.Ops.MoE(out, x, ids, weights, gateUp, down)
}

func (c *opCounter) ResolvePlaceholders(ids, fromRow, sampled kernels.Tensor) error {
	c.count("resolve_placeholders")
	return c.Ops.ResolvePlaceholders(ids, fromRow, sampled)
}

func (c *opCounter) ShiftAccepted(m *kernels.AttentionMetadata, positions, shiftFrom, accepted kernels.Tensor) error {
	c.count("shift_accepted")
	return c.Ops.ShiftAccepted(m, positions, shiftFrom, accepted)
}

func (c *opCounter) Logits(out, hidden, rows, norm, head kernels.Tensor, eps float32) error {
	c.count("logits")
	return c.Ops.Logits(out, hidden, rows, norm, head, eps)
}

func (c *opCounter) Argmax(out, logits kernels.Tensor) error {
	c.count("argmax")
	return c.argmax.Argmax(out, logits)
}

func (c *opCounter) CopyRect(dst, src kernels.Tensor) error {
	c.count("copy_rect")
	if c.graphs == nil {
		return errors.New("op counter: no graph backend beneath")
	}
	return c.graphs.CopyRect(dst, src)
}

func (c *opCounter) CaptureGraph(fn func() error) (interface {
	Replay() error
	Close() error
}, error) {
	if c.graphs == nil {
		return nil, errors.New("op counter: no graph backend beneath")
	}
	c.pause(1)
	defer c.pause(-1)
	g, err := c.graphs.CaptureGraph(fn)
	if err != nil {
		return nil, err
	}
	return &countedGraph{g: g, c: c}, nil
}

type countedGraph struct {
	g interface {
		Replay() error
		Close() error
	}
	c *opCounter
}

func (g *countedGraph) Replay() error {
	g.c.count("graph_replay")
	g.c.pause(1)
	defer g.c.pause(-1)
	return g.g.Replay()
}

func (g *countedGraph) Close() error { return g.g.Close() }

// DraftOpStep is one step of the MTP drafter under an opCounter: the
// step's shape, the operations its proposal queued and its drafts.
type DraftOpStep struct {
	StepID      int64
	FromDevice  bool // drafted from the verify stage's device half
	Prefill     bool // the step had prefill rows
	NumTokens   int  // rows of the step's batch
	SampleRows  int  // entries (sample rows) of the step
	Ops         map[string]int
	Total       int // device operations
	Views       int
	Drafts      [][]int // per entry
	GraphsTaken bool    // some graph replayed
}

// DraftOpRecord collects the steps of a counting MTP drafter.
type DraftOpRecord struct {
	mu    sync.Mutex
	Steps []DraftOpStep
}

// countingMTP is the MTP drafter over an opCounter, recording each step.
type countingMTP struct {
	*mtpDrafter
	ops *opCounter
	rec *DraftOpRecord
}

func (c *countingMTP) ProposeOnDevice(ctx context.Context, step *SampledStep) (DeviceDrafts, error) {
	dd, _, err := c.record(step, false, func() (DeviceDrafts, bool, error) {
		dd, err := c.mtpDrafter.ProposeOnDevice(ctx, step)
		return dd, true, err
	})
	return dd, err
}

func (c *countingMTP) ProposeFromDevice(ctx context.Context, step *SampledStep) (DeviceDrafts, bool, error) {
	return c.record(step, true, func() (DeviceDrafts, bool, error) { return c.mtpDrafter.ProposeFromDevice(ctx, step) })
}

// Propose is ProposeOnDevice with the drafts brought to the host.
func (c *countingMTP) Propose(ctx context.Context, step *SampledStep) ([][]int, error) {
	dd, err := c.ProposeOnDevice(ctx, step)
	if err != nil {
		return nil, err
	}
	return dd.Host(c.ops.Ops)
}

func (c *countingMTP) record(step *SampledStep, fromDevice bool, propose func() (DeviceDrafts, bool, error)) (DeviceDrafts, bool, error) {
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
	s := DraftOpStep{StepID: int64(step.Outputs.StepID), FromDevice: fromDevice, Prefill: step.Outputs.NumPrefillTokens > 0,
		NumTokens: step.Batch.NumTokens, SampleRows: step.Outputs.NumSampleRows,
		Ops: d.Ops, Total: d.Total(), Views: d.Views, Drafts: drafts, GraphsTaken: d.Ops["graph_replay"] > 0}
	c.rec.mu.Lock()
	c.rec.Steps = append(c.rec.Steps, s)
	c.rec.mu.Unlock()
	return dd, ok, nil
}

// RegisterCountingMTP registers in r, as the draft implementation name,
// the MTP drafter over an opCounter of the engine's backend, which records
// each step's operations and drafts in rec. With graphs enabled the
// drafter captures its graphs on the CPU backend as the CUDA backend
// would (fakeGraphOps: a replay re-runs what was captured, reading the
// static inputs as they are then).
func RegisterCountingMTP(r *pipeline.Registry, name string, graphs CUDAGraph, rec *DraftOpRecord) {
	RegisterDraft(r, name, NoOptions{}, func(d DraftDeps, _ NoOptions) (Drafter, error) {
		argmax, ok := d.Ops.(kernels.Argmaxer)
		if !ok {
			return nil, errors.New("counting mtp: the backend has no argmax")
		}
		inner := d.Ops
		if graphs.Enabled {
			inner = &fakeGraphOps{Ops: d.Ops}
		}
		c := newOpCounter(inner, argmax)
		d.Ops, d.CUDAGraph = c, graphs
		p, err := newMTPDrafter(d)
		if err != nil {
			return nil, err
		}
		return &countingMTP{mtpDrafter: p, ops: c, rec: rec}, nil
	})
}
