package stages

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
)

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
	graphs    []*decodeGraph // ascending by size: pick takes the first that fits
	maxBlocks int            // width of the static block tables
}

// decodeGraph is the forward pass of a decode batch of size sequences: one
// token each. Rows past a step's real sequences are padding: token 0 at
// position 0 with one key, slot -1 (their keys and values are written
// nowhere), their block-table row left as it was (its first block is a
// valid one), so they change no real row and no cache entry.
type decodeGraph struct {
	staticBatch
	hidden kernels.Tensor // the captured pass's output [size, hidden_size]
	// logits are the captured pass's logits of every row (F32 [size,
	// vocab]): a step whose sample rows are its rows in order reads its
	// first rows (PreparedStep.RowsInOrder), valid until the next replay.
	logits kernels.Tensor
	graph  interface {
		Replay() error
		Close() error
	}
}

// staticBatch is a captured graph's input: a batch of size one-token rows
// in fixed backend tensors, which each replay's inputs are copied into.
// Rows past a pass's own are padding: token 0 at position 0 with one key,
// slot -1 (their keys and values are written nowhere), their block-table
// row left as it was (its first block is a valid one), so they change no
// real row and no cache entry. For a model with ring-buffer layers the
// batch also holds each row's state slot and ring slot (the padding reads
// state slot 0's ring and writes no ring row: ring slot -1).
type staticBatch struct {
	size   int
	ring   bool           // rows 4 and 5 of inputs: state slots, ring slot mapping
	inputs kernels.Tensor // I32 [4 or 6, size]: input ids, positions, slot mapping, seqlens_k (, state slots, ring slots)
	tables kernels.Tensor // I32 [size, maxBlocks]
	batch  *models.ForwardBatch
	host   []int32        // the padding of inputs, on the host
	pad    kernels.Tensor // the same in backend memory (I32, flat)
}

// newStaticBatch allocates a static batch of n rows whose block tables
// are maxBlocks wide, filled with padding; ring adds the rows of a model
// with ring-buffer layers (models.ForwardBatch.StateSlots and
// RingSlotMapping).
func newStaticBatch(ops kernels.Ops, n, maxBlocks, blockSize int, ring bool) (staticBatch, error) {
	rows := 4
	if ring {
		rows = 6
	}
	sb := staticBatch{size: n, ring: ring, host: make([]int32, rows*n)}
	var err error
	if sb.inputs, err = ops.Alloc(kernels.I32, rows, n); err != nil {
		return sb, err
	}
	if sb.tables, err = ops.Alloc(kernels.I32, n, maxBlocks); err != nil {
		return sb, err
	}
	cu := make([]int32, n+1)
	for i := range cu {
		cu[i] = int32(i)
	}
	cuT, err := kernels.FromI32(ops, cu, n+1)
	if err != nil {
		return sb, err
	}
	row := func(i int) kernels.Tensor {
		if err != nil {
			return nil
		}
		var t kernels.Tensor
		if t, err = ops.Rows(sb.inputs, i, i+1); err == nil {
			t, err = ops.Reshape(t, n)
		}
		return t
	}
	sb.batch = &models.ForwardBatch{NumTokens: n, InputIDs: row(0), Positions: row(1), Attn: kernels.AttentionMetadata{
		NumSeqs: n, NumTokens: n, MaxSeqlenQ: 1, MaxSeqlenK: maxBlocks * blockSize, BlockSize: blockSize,
		CuSeqlensQ: cuT, SeqlensK: row(3), BlockTables: sb.tables, SlotMapping: row(2)}}
	if ring {
		sb.batch.StateSlots, sb.batch.RingSlotMapping = row(4), row(5)
	}
	if err != nil {
		return sb, err
	}
	ids, pos, slots, seqlensK := sb.host[:n], sb.host[n:2*n], sb.host[2*n:3*n], sb.host[3*n:4*n]
	for i := range n {
		ids[i], pos[i], slots[i], seqlensK[i] = 0, 0, -1, 1
	}
	if ring {
		ringSlots := sb.host[5*n:]
		for i := range n {
			ringSlots[i] = -1 // state slot (row 4) 0
		}
	}
	if err := ops.Upload(sb.inputs, kernels.I32Bytes(sb.host), kernels.I32); err != nil {
		return sb, err
	}
	sb.pad, err = kernels.FromI32(ops, sb.host, len(sb.host))
	return sb, err
}

// fits reports whether b (one-token rows) fits the static batch.
func (sb *staticBatch) fits(b *models.ForwardBatch, maxBlocks int) bool {
	n := b.NumTokens
	if n == 0 || n > sb.size || b.Attn.NumSeqs != n {
		return false
	}
	if sb.ring && (b.StateSlots == nil || b.RingSlotMapping == nil) {
		return false
	}
	bt := b.Attn.BlockTables
	return bt != nil && len(bt.Shape()) == 2 && bt.Shape()[1] <= maxBlocks
}

// load copies b (one-token rows, in backend memory) into the static
// batch on the device, padding the rows past its own from sb.pad. Cost:
// one launch of up to 9 rectangle copies (13 with rings) where the backend
// copies rectangles together, else one copy each.
func (sb *staticBatch) load(ops kernels.Ops, b *models.ForwardBatch) error {
	n := b.NumTokens
	srcs := []kernels.Tensor{b.InputIDs, b.Positions, b.Attn.SlotMapping, b.Attn.SeqlensK}
	if sb.ring {
		srcs = append(srcs, b.StateSlots, b.RingSlotMapping)
	}
	// Each input row: the step's n values, then padding from sb.pad; then
	// the block tables. Every destination is its own range of the static
	// arrays, so the copies may run in one launch.
	pairs := make([][2]kernels.Tensor, 0, 2*len(srcs)+1)
	var err error
	view := func(t kernels.Tensor, lo, hi int) kernels.Tensor {
		var v kernels.Tensor
		if err == nil {
			if v, err = ops.Rows(t, lo, hi); err == nil {
				v, err = ops.Reshape(v, 1, hi-lo)
			}
		}
		return v
	}
	flat, err := ops.Reshape(sb.inputs, len(sb.host))
	if err != nil {
		return err
	}
	for i, src := range srcs {
		row := sb.size * i
		pairs = append(pairs, [2]kernels.Tensor{view(flat, row, row+n), view(src, 0, n)})
		if n < sb.size {
			pairs = append(pairs, [2]kernels.Tensor{view(flat, row+n, row+sb.size), view(sb.pad, row+n, row+sb.size)})
		}
	}
	if err != nil {
		return err
	}
	pairs = append(pairs, [2]kernels.Tensor{sb.tables, b.Attn.BlockTables})
	return copyRects(ops, pairs)
}

// rectsCopier copies several rectangles in one launch (the CUDA
// backend's CopyRects).
type rectsCopier interface {
	CopyRects(dsts, srcs []kernels.Tensor) error
}

// maxRects is how many pairs one CopyRects call takes (the CUDA
// backend's MaxRects).
const maxRects = 16

// copyRects runs CopyRect for each pair {dst, src}, in as few launches as
// the backend allows: one per maxRects pairs where it copies rectangles
// together (rectsCopier), else one per pair. The destinations must not
// overlap.
func copyRects(ops kernels.Ops, pairs [][2]kernels.Tensor) error {
	rc, ok := ops.(rectsCopier)
	if !ok {
		gops := ops.(graphOps)
		for _, p := range pairs {
			if err := gops.CopyRect(p[0], p[1]); err != nil {
				return err
			}
		}
		return nil
	}
	for len(pairs) > 0 {
		k := min(len(pairs), maxRects)
		dsts, srcs := make([]kernels.Tensor, k), make([]kernels.Tensor, k)
		for i, p := range pairs[:k] {
			dsts[i], srcs[i] = p[0], p[1]
		}
		if err := rc.CopyRects(dsts, srcs); err != nil {
			return err
		}
		pairs = pairs[k:]
	}
	return nil
}

// newDecodeGraphs captures a decode forward pass for every batch size,
// after one eager run of each (which lets libraries initialize outside the
// capture). It runs before the step loop starts, when nothing else uses the
// backend's stream. Cost per size: one forward pass and one capture.
func newDecodeGraphs(d ForwardDeps, sizes []int) (*decodeGraphs, error) {
	gops, ok := d.Ops.(graphOps)
	if !ok {
		return nil, fmt.Errorf("backend %s cannot capture graphs: use device: cuda or disable cuda_graph", d.Ops.Name())
	}
	maxBlocks := graphTableBlocks(d.Cache.NumBlocks, d.Cache.BlockSize, d.Model.Config().MaxPositionEmbeddings, d.MaxModelLen)
	dg := &decodeGraphs{ops: gops, maxBlocks: maxBlocks}
	for _, n := range sizes {
		g, err := dg.capture(d, n)
		if err != nil {
			dg.close()
			return nil, fmt.Errorf("decode batch size %d: %w", n, err)
		}
		dg.graphs = append(dg.graphs, g)
	}
	return dg, nil
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

func (d *decodeGraphs) capture(rt ForwardDeps, n int) (*decodeGraph, error) {
	sb, err := newStaticBatch(rt.Ops, n, d.maxBlocks, rt.Cache.BlockSize, rt.Cache.Spec.RingLayers > 0)
	if err != nil {
		return nil, err
	}
	g := &decodeGraph{staticBatch: sb}
	ops := rt.Ops
	ctx := context.Background()
	hidden, err := rt.Model.Forward(ctx, rt.Cache, g.batch)
	if err == nil {
		_, err = rt.Model.ComputeLogits(hidden, nil)
	}
	if err != nil {
		return nil, err
	}
	if err := ops.Sync(); err != nil {
		return nil, err
	}
	g.graph, err = d.ops.CaptureGraph(func() error {
		var ferr error
		if g.hidden, ferr = rt.Model.Forward(ctx, rt.Cache, g.batch); ferr == nil {
			g.logits, ferr = rt.Model.ComputeLogits(g.hidden, nil)
		}
		return ferr
	})
	if err != nil {
		return nil, err
	}
	// The graph's launches, where the backend counts them (kernels/cuda.Graph).
	if c, ok := g.graph.(interface{ Nodes() int }); ok {
		rt.Stats.RecordGraphNodes(n, c.Nodes())
	}
	return g, nil
}

// pick returns the graph that serves step, or nil when the step runs
// eagerly: not made only of one-token rows (a decode step, speculative
// verify rows included: prepare lays each out as its own decode row), more
// rows than the largest size, or a block table wider than the static ones.
func (d *decodeGraphs) pick(step *PreparedStep) *decodeGraph {
	if d == nil || step.Batch == nil || step.Outputs.NumPrefillSeqs > 0 {
		return nil
	}
	for _, g := range d.graphs {
		if g.fits(step.Batch, d.maxBlocks) {
			return g
		}
	}
	return nil
}

// load writes step's inputs into the graph's static tensors: the step's
// batch, with its placeholders resolved and its shifts applied on the
// device, is copied in on the device.
func (g *decodeGraph) load(rt ForwardDeps, step *PreparedStep) error {
	if err := ResolvePlaceholders(rt.Ops, step, step.Batch.InputIDs); err != nil {
		return err
	}
	if err := ShiftAccepted(rt.Ops, step); err != nil {
		return err
	}
	return g.staticBatch.load(rt.Ops, step.Batch)
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
func copyBlocks(rt ForwardDeps, copies []engine.BlockCopy) error {
	return copyCacheBlocks(rt.Ops, rt.Cache, copies)
}

// copyCacheBlocks performs block copies in every layer of cache.
func copyCacheBlocks(ops kernels.Ops, cache *models.KVCache, copies []engine.BlockCopy) error {
	if len(copies) == 0 {
		return nil
	}
	var buf []byte
	for _, layer := range [][]kernels.Tensor{cache.K, cache.V} {
		for _, t := range layer {
			for _, c := range copies {
				src, err := ops.Rows(t, c.Src, c.Src+1)
				if err != nil {
					return err
				}
				dst, err := ops.Rows(t, c.Dst, c.Dst+1)
				if err != nil {
					return err
				}
				n := kernels.NumElements(src) * src.DType().Size()
				if cap(buf) < n {
					buf = make([]byte, n)
				}
				if err := ops.Download(buf[:n], src); err != nil {
					return err
				}
				if err := ops.Upload(dst, buf[:n], src.DType()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// copyStates performs the scheduler's state copies (a forked sequence
// starts from its parent's state slot) in the cache's ring buffers;
// nothing for a cache without state slots.
func copyStates(ops kernels.Ops, cache *models.KVCache, copies []engine.StateCopy) error {
	if len(copies) == 0 || cache == nil || cache.NumSlots == 0 {
		return nil
	}
	src, dst := make([]int, len(copies)), make([]int, len(copies))
	for i, c := range copies {
		src[i], dst[i] = c.Src, c.Dst
	}
	return cache.CopyStateSlots(ops, src, dst)
}
