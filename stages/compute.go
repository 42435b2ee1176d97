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

func init() {
	pipeline.Register("prepare", "default", func(a pipeline.Args) (*pipeline.Node, error) {
		rt, err := runtimeOf(a)
		if err != nil {
			return nil, err
		}
		return pipeline.NewStage[*ScheduledStep, *PreparedStep](&prepare{rt: rt}), nil
	})
	pipeline.Register("forward", "default", func(a pipeline.Args) (*pipeline.Node, error) {
		rt, err := runtimeOf(a)
		if err != nil {
			return nil, err
		}
		var opts ForwardOptions
		if err := a.DecodeOptions(&opts); err != nil {
			return nil, err
		}
		f, err := newForward(rt, opts)
		if err != nil {
			return nil, err
		}
		return pipeline.NewStage[*PreparedStep, *ForwardResult](f), nil
	})
}

// newForward builds the forward stage: CUDA graphs when asked, and device
// markers when the backend has them (kernels.DeviceTimer) and rt has Stats.
func newForward(rt *Runtime, opts ForwardOptions) (*forward, error) {
	f := &forward{rt: rt}
	_, f.asyncSample = rt.Ops.(kernels.AsyncDeviceSampler)
	if dt, ok := kernels.DeviceTimerOf(rt.Ops); ok && rt.Stats != nil {
		// Measurement never stops the engine: without markers the stats
		// simply have no device timeline.
		var err error
		if f.timeline, err = newDeviceTimeline(dt, rt.Stats); err != nil {
			rt.Stats.deviceTimelineFailed(err)
		}
	}
	if opts.CUDAGraph.Enabled {
		var err error
		if f.graphs, err = newDecodeGraphs(rt, opts.CUDAGraph.BatchSizes); err != nil {
			f.timeline.close()
			return nil, fmt.Errorf("forward: cuda_graph: %w", err)
		}
	}
	return f, nil
}

// prepare lays a scheduled step out as the model's flat batch in backend
// memory and lists the rows that sample.
type prepare struct{ rt *Runtime }

func (p *prepare) Process(_ context.Context, step *ScheduledStep) (*PreparedStep, error) {
	h := &models.HostBatch{BlockSize: p.rt.Cache.BlockSize}
	numRows := step.Outputs.NumSampleRows
	rows := make([]RowRef, numRows)
	sampleRows := make([]int32, numRows)
	var promptRows []PromptRow
	var promptRowIdx []int32
	fromRow := make([]int32, 0, step.Outputs.NumBatchedTokens)
	placeholders := false
	for i := range step.Seqs {
		m := &step.Seqs[i]
		first := int32(len(h.InputIDs))
		for pos := m.PromptLogprobsFrom; pos >= 0 && pos < m.PromptLogprobsTo; pos++ {
			promptRows = append(promptRows, PromptRow{Meta: m, Next: m.TokenIDs[pos+1]})
			promptRowIdx = append(promptRowIdx, first+int32(pos-m.PosStart))
		}
		ids := make([]int32, len(m.InputTokenIDs))
		for j, id := range m.InputTokenIDs {
			from := int32(-1)
			if id == engine.PlaceholderToken {
				if m.InputFromRow < 0 {
					return nil, fmt.Errorf("prepare: step %d: sequence %d: a placeholder without a source row", step.Outputs.StepID, m.SeqID)
				}
				from = int32(m.InputFromRow)
				placeholders = true
				if p.rt.Stats != nil {
					p.rt.Stats.Placeholders.Add(1)
				}
			}
			ids[j] = int32(id)
			fromRow = append(fromRow, from)
		}
		table := make([]int32, len(m.BlockTable))
		for j, b := range m.BlockTable {
			table[j] = int32(b)
		}
		h.AddSequence(ids, m.PosStart, table)
		if !m.Sample {
			continue
		}
		last := int32(len(h.InputIDs) - 1)
		put := func(r int, id engine.SeqID, index int) error {
			if r < 0 || r >= numRows {
				return fmt.Errorf("prepare: step %d: sample row %d outside [0, %d)", step.Outputs.StepID, r, numRows)
			}
			rows[r] = RowRef{Meta: m, SeqID: id, Index: index, RequestID: m.RequestID}
			sampleRows[r] = last
			return nil
		}
		if err := put(m.SampleRow, m.SeqID, m.SampleIndex); err != nil {
			return nil, err
		}
		for j, fork := range m.ForkSeqIDs {
			if err := put(m.SampleRow+1+j, fork, j+1); err != nil {
				return nil, err
			}
		}
	}
	// The placeholders' source rows and the rows that sample go up with the
	// batch, in one copy.
	var extra [][]int32
	if placeholders {
		extra = append(extra, fromRow)
	}
	all := append(sampleRows, promptRowIdx...)
	if len(all) > 0 {
		extra = append(extra, all)
	}
	batch, views, err := h.UploadWith(p.rt.Ops, p.rt.Cache.NumBlocks, extra...)
	if err != nil {
		return nil, fmt.Errorf("prepare: step %d: %w", step.Outputs.StepID, err)
	}
	out := &PreparedStep{ScheduledStep: step, Batch: batch, Rows: rows, PromptRows: promptRows}
	if placeholders {
		// Resolved by the forward stage right before it runs, as a device
		// stream would: step N's tokens may still be being sampled.
		out.FromRow, views = views[0], views[1:]
	}
	if len(all) > 0 {
		out.SampleRows = views[0]
	}
	return out, nil
}

// ForwardOptions are the forward stage's options (pipeline.options.forward
// in YAML).
type ForwardOptions struct {
	// CUDAGraph replays captured CUDA graphs for decode steps: a decode batch
	// of up to the largest of BatchSizes sequences pads up to the next
	// captured size; prefill, mixed and larger batches run eagerly. Needs a
	// backend that can capture (device: cuda) and a model whose forward pass
	// never waits for the host: every built-in model (the Llama family, and
	// DeepSeek, whose MoE layers group their routing on the device for
	// decode-sized batches).
	CUDAGraph struct {
		Enabled    bool  `yaml:"enabled"`
		BatchSizes []int `yaml:"batch_sizes"`
	} `yaml:"cuda_graph"`
}

// forward runs the model over the paged KV cache and computes the logits of
// the rows that sample. It also measures the gap between the end of one
// forward pass and the start of the next: the time the device would idle
// while the host works between steps; on a backend with a device stream
// (kernels.DeviceTimer) it measures the same on the device itself, with
// markers around each pass (deviceTimeline).
type forward struct {
	rt       *Runtime
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
	if err := copyBlocks(f.rt, step.Outputs.BlockCopies); err != nil {
		return nil, fmt.Errorf("forward: step %d: %w", step.Outputs.StepID, err)
	}
	g := f.graphs.pick(step)
	if g != nil {
		if err := g.load(ctx, f.rt, step); err != nil {
			return nil, fmt.Errorf("forward: step %d: graph inputs: %w", step.Outputs.StepID, err)
		}
	} else if step.FromRow != nil {
		if err := f.rt.ZOS.resolvePlaceholders(ctx, f.rt.Ops, step.ScheduledStep, step.Batch.InputIDs, step.FromRow); err != nil {
			return nil, fmt.Errorf("forward: %w", err)
		}
	}
	start := time.Now()
	deferred := f.deferSync()
	if f.rt.Stats != nil && !f.lastEnd.IsZero() && !deferred {
		f.rt.Stats.recordGap(start.Sub(f.lastEnd))
	}
	defer func() { f.lastEnd = time.Now() }()
	f.markStart(step)
	var hidden kernels.Tensor
	var err error
	if g != nil {
		if err = g.graph.Replay(); err == nil {
			hidden = g.hidden
			if f.rt.Stats != nil {
				f.rt.Stats.GraphSteps.Add(1)
			}
		}
	} else {
		hidden, err = f.rt.Model.Forward(ctx, f.rt.Cache, step.Batch)
	}
	if err != nil {
		return nil, fmt.Errorf("forward: step %d: %w", step.Outputs.StepID, err)
	}
	res := &ForwardResult{PreparedStep: step}
	if step.SampleRows != nil {
		if res.Logits, err = f.rt.Model.ComputeLogits(hidden, step.SampleRows); err != nil {
			return nil, fmt.Errorf("forward: step %d: logits: %w", step.Outputs.StepID, err)
		}
	}
	f.markEnd()
	if deferred {
		f.rt.Stats.forwardDeferred.Store(true)
	} else if err := f.rt.Ops.Sync(); err != nil {
		return nil, fmt.Errorf("forward: step %d: %w", step.Outputs.StepID, err)
	}
	if f.rt.Stats != nil {
		var cost engine.StepCost
		if f.rt.Flops != nil {
			cost = f.rt.Flops.Estimate(step.Seqs)
		}
		f.rt.Stats.record(step.Outputs, cost, time.Since(start))
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
	f.rt.Stats.deviceTimelineFailed(err)
	f.timeline.close()
	f.timeline = nil
}

// graphOps is what a backend offers for graph replay (kernels/cuda.Backend).
type graphOps interface {
	// CaptureGraph records the operations fn queues, without running them.
	CaptureGraph(fn func() error) (interface {
		Replay() error
		Close() error
	}, error)
	// CopyRect copies src [r, c] into the top-left corner of dst [R, C].
	CopyRect(dst, src kernels.Tensor) error
}

// decodeGraphs holds one captured forward pass per decode batch size, all
// over static input tensors; the graphs share the backend's graph memory
// pool (they never run at the same time).
type decodeGraphs struct {
	ops       graphOps
	sizes     []int // ascending
	graphs    []*decodeGraph
	maxBlocks int // width of the static block tables
}

// decodeGraph is the forward pass of a decode batch of size sequences: one
// token each. Rows past a step's real sequences are padding: token 0 at
// position 0 with one key, slot -1 (their keys and values are written
// nowhere), their block-table row left as it was (its first block is a
// valid one), so they change no real row and no cache entry.
type decodeGraph struct {
	size   int
	inputs kernels.Tensor // I32 [4, size]: input ids, positions, slot mapping, seqlens_k
	ids    kernels.Tensor // I32 [size], a view of inputs
	tables kernels.Tensor // I32 [size, maxBlocks]
	batch  *models.ForwardBatch
	hidden kernels.Tensor // the captured pass's output [size, hidden_size]
	graph  interface {
		Replay() error
		Close() error
	}
	host []int32 // staging for inputs
}

// newDecodeGraphs captures a decode forward pass for every batch size,
// after one eager run of each (which lets libraries initialize outside the
// capture). It runs before the step loop starts, when nothing else uses the
// backend's stream. Cost per size: one forward pass and one capture.
func newDecodeGraphs(rt *Runtime, sizes []int) (*decodeGraphs, error) {
	gops, ok := rt.Ops.(graphOps)
	if !ok {
		return nil, fmt.Errorf("backend %s cannot capture graphs: use device: cuda or disable cuda_graph", rt.Ops.Name())
	}
	if len(sizes) == 0 {
		return nil, fmt.Errorf("no batch_sizes")
	}
	for i, n := range sizes {
		if n <= 0 || (i > 0 && n <= sizes[i-1]) {
			return nil, fmt.Errorf("batch_sizes %v: want positive sizes in ascending order", sizes)
		}
	}
	maxModelLen := 0
	if rt.Scheduler != nil {
		maxModelLen = rt.Scheduler.Config().MaxModelLen
	}
	maxBlocks := graphTableBlocks(rt.Cache.NumBlocks, rt.Cache.BlockSize, rt.Model.Config().MaxPositionEmbeddings, maxModelLen)
	d := &decodeGraphs{ops: gops, sizes: append([]int(nil), sizes...), maxBlocks: maxBlocks}
	for _, n := range sizes {
		g, err := d.capture(rt, n)
		if err != nil {
			d.close()
			return nil, fmt.Errorf("decode batch size %d: %w", n, err)
		}
		d.graphs = append(d.graphs, g)
	}
	return d, nil
}

// graphTableBlocks is the width, in blocks, of the captured graphs' block
// tables: the longest sequence the engine can hold, by the scheduler's
// max_model_len, the model's max_position_embeddings and the cache's
// blocks, whichever is least (0: no bound of that kind). Keep it tight: the
// width is the keys a decode row may have as far as a captured kernel
// knows, so it sizes the split-KV attention grid. Bounded by
// max_position_embeddings alone, Qwen3-0.6B's 40960 positions gave its
// decode grid 32 key chunks a row where a max_model_len of 2048 needs 8,
// most of them empty, and the chunks-per-block rule then gave each row one
// block. A step whose tables are wider runs eagerly (pick).
func graphTableBlocks(numBlocks, blockSize, maxPositions, maxModelLen int) int {
	w := numBlocks
	for _, keys := range []int{maxPositions, maxModelLen} {
		if keys > 0 {
			w = min(w, (keys+blockSize-1)/blockSize)
		}
	}
	return w
}

func (d *decodeGraphs) capture(rt *Runtime, n int) (*decodeGraph, error) {
	ops := rt.Ops
	g := &decodeGraph{size: n, host: make([]int32, 4*n)}
	var err error
	if g.inputs, err = ops.Alloc(kernels.I32, 4, n); err != nil {
		return nil, err
	}
	if g.tables, err = ops.Alloc(kernels.I32, n, d.maxBlocks); err != nil {
		return nil, err
	}
	cu := make([]int32, n+1)
	for i := range cu {
		cu[i] = int32(i)
	}
	cuT, err := kernels.FromI32(ops, cu, n+1)
	if err != nil {
		return nil, err
	}
	row := func(i int) kernels.Tensor {
		if err != nil {
			return nil
		}
		var t kernels.Tensor
		if t, err = ops.Rows(g.inputs, i, i+1); err == nil {
			t, err = ops.Reshape(t, n)
		}
		return t
	}
	g.ids = row(0)
	g.batch = &models.ForwardBatch{NumTokens: n, InputIDs: g.ids, Positions: row(1), Attn: kernels.AttentionMetadata{
		NumSeqs: n, NumTokens: n, MaxSeqlenQ: 1, MaxSeqlenK: d.maxBlocks * rt.Cache.BlockSize, BlockSize: rt.Cache.BlockSize,
		CuSeqlensQ: cuT, SeqlensK: row(3), BlockTables: g.tables, SlotMapping: row(2)}}
	if err != nil {
		return nil, err
	}
	if err := g.fill(nil, rt.Cache.BlockSize); err != nil {
		return nil, err
	}
	if err := ops.Upload(g.inputs, kernels.I32Bytes(g.host), kernels.I32); err != nil {
		return nil, err
	}
	ctx := context.Background()
	if _, err := rt.Model.Forward(ctx, rt.Cache, g.batch); err != nil {
		return nil, err
	}
	if err := ops.Sync(); err != nil {
		return nil, err
	}
	g.graph, err = d.ops.CaptureGraph(func() error {
		var ferr error
		g.hidden, ferr = rt.Model.Forward(ctx, rt.Cache, g.batch)
		return ferr
	})
	if err != nil {
		return nil, err
	}
	return g, nil
}

// pick returns the graph that serves step, or nil when the step runs
// eagerly: not a pure decode step, more sequences than the largest size, or
// a block table wider than the static ones.
func (d *decodeGraphs) pick(step *PreparedStep) *decodeGraph {
	if d == nil || step.Batch == nil {
		return nil
	}
	n := len(step.Seqs)
	if n == 0 || step.Batch.NumTokens != n || step.Batch.Attn.NumSeqs != n {
		return nil
	}
	if bt := step.Batch.Attn.BlockTables; bt == nil || len(bt.Shape()) != 2 || bt.Shape()[1] > d.maxBlocks {
		return nil
	}
	for i := range step.Seqs {
		if len(step.Seqs[i].InputTokenIDs) != 1 {
			return nil
		}
	}
	for i, size := range d.sizes {
		if n <= size {
			return d.graphs[i]
		}
	}
	return nil
}

// fill writes the host staging for seqs (nil: padding only).
func (g *decodeGraph) fill(seqs []engine.SequenceMetadata, blockSize int) error {
	n := g.size
	ids, pos, slots, seqlensK := g.host[:n], g.host[n:2*n], g.host[2*n:3*n], g.host[3*n:]
	for i := range n {
		ids[i], pos[i], slots[i], seqlensK[i] = 0, 0, -1, 1
	}
	for i := range seqs {
		m := &seqs[i]
		p := m.PosStart
		if b := p / blockSize; b >= len(m.BlockTable) {
			return fmt.Errorf("sequence %d: position %d outside its block table of %d blocks", m.SeqID, p, len(m.BlockTable))
		}
		ids[i] = int32(m.InputTokenIDs[0])
		pos[i] = int32(p)
		slots[i] = int32(m.BlockTable[p/blockSize]*blockSize + p%blockSize)
		seqlensK[i] = int32(p + 1)
	}
	return nil
}

// load writes step's inputs into the graph's static tensors, padding the
// rows past its sequences, and resolves placeholder inputs on the device.
// Cost: one small upload, one block-table copy on the device.
func (g *decodeGraph) load(ctx context.Context, rt *Runtime, step *PreparedStep) error {
	if err := g.fill(step.Seqs, rt.Cache.BlockSize); err != nil {
		return err
	}
	if err := rt.Ops.Upload(g.inputs, kernels.I32Bytes(g.host), kernels.I32); err != nil {
		return err
	}
	if err := rt.Ops.(graphOps).CopyRect(g.tables, step.Batch.Attn.BlockTables); err != nil {
		return err
	}
	if step.FromRow == nil {
		return nil
	}
	ids, err := rt.Ops.Rows(g.ids, 0, len(step.Seqs))
	if err != nil {
		return err
	}
	return rt.ZOS.resolvePlaceholders(ctx, rt.Ops, step.ScheduledStep, ids, step.FromRow)
}

func (d *decodeGraphs) close() error {
	if d == nil {
		return nil
	}
	var first error
	for _, g := range d.graphs {
		if g.graph != nil {
			if err := g.graph.Close(); err != nil && first == nil {
				first = err
			}
			g.graph = nil
		}
	}
	return first
}

// copyBlocks performs the scheduler's copy-on-write block copies in every
// layer's cache, through the host (rare: only when a forked sequence first
// writes a shared partial block).
func copyBlocks(rt *Runtime, copies []engine.BlockCopy) error {
	if len(copies) == 0 {
		return nil
	}
	var buf []byte
	for _, layer := range [][]kernels.Tensor{rt.Cache.K, rt.Cache.V} {
		for _, t := range layer {
			for _, c := range copies {
				src, err := rt.Ops.Rows(t, c.Src, c.Src+1)
				if err != nil {
					return err
				}
				dst, err := rt.Ops.Rows(t, c.Dst, c.Dst+1)
				if err != nil {
					return err
				}
				n := kernels.NumElements(src) * src.DType().Size()
				if cap(buf) < n {
					buf = make([]byte, n)
				}
				if err := rt.Ops.Download(buf[:n], src); err != nil {
					return err
				}
				if err := rt.Ops.Upload(dst, buf[:n], src.DType()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
