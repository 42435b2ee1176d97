package stages

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// mtpGraphs holds the MTP drafter's step captured as CUDA graphs, over
// static inputs that all of them share: the first pass (the MTP layer over
// a decode step's one-token rows, its output kept for the chain) per row
// count T, and the chain (runChain: the head's argmax at each drafting
// row's hidden row, then each further depth's gather, shift, pass and
// argmax) per row count N and depth D, for the sizes of the engine's
// decode graphs and every depth up to k. A step laid out for both (T the
// first size that holds its rows, N the first that holds its drafting
// rows and the columns of its verification) costs the host one upload
// (its layout, straight into the static inputs), the device copies of
// what it holds in backend memory (its placeholders' sampled tokens, its
// batch's positions, slots, key counts and block tables, its hidden
// states, the device's verification) and two replays; rows past the
// step's are padding that writes nothing (mtpLayout.fill).
type mtpGraphs struct {
	ops       kernels.Ops
	gops      graphOps
	maxBlocks int // width of the static block tables
	blockSize int
	chainAt   int              // where the chain's arrays start in arena
	arena     kernels.Tensor   // I32: the host-laid-out inputs of every graph (mtpLayout)
	tables    kernels.Tensor   // I32 [maxT, maxBlocks]: the first pass's block tables
	hidden    kernels.Tensor   // [maxT, hidden]: the first pass's input
	first     kernels.Tensor   // [maxT, hidden]: its output, the chain's input
	iota      kernels.Tensor   // I32 [maxT+1]: 0, 1, 2, ...
	passes    []*mtpPassGraph  // ascending by size: pickPass takes the first that fits
	chains    []*mtpChainGraph // ascending by size, then depth
}

// mtpPassGraph is the first pass over size one-token rows.
type mtpPassGraph struct {
	size  int
	views *mtpViews // the first pass's arrays in the arena
	batch *models.ForwardBatch
	graph interface {
		Replay() error
		Close() error
	}
}

// mtpChainGraph is the chain over size rows and depth depths.
type mtpChainGraph struct {
	size, depth int
	views       *mtpViews      // the chain's arrays in the arena
	tokens      kernels.Tensor // I32 [depth*size]: the drafts, depth j's from j*size
	graph       interface {
		Replay() error
		Close() error
	}
}

// newMTPGraphs allocates the static inputs and captures the first pass
// for each of the engine's graph sizes and the chain for each size and
// depth 1..k, each after one eager run over padding (which lets libraries
// initialize outside the capture). It runs before the step loop starts,
// when nothing else uses the backend's stream. Cost per graph: one run
// and one capture.
func newMTPGraphs(ctx context.Context, p *mtpDrafter) (*mtpGraphs, error) {
	d := p.d
	gops, ok := d.Ops.(graphOps)
	if !ok {
		return nil, fmt.Errorf("backend %s cannot capture graphs", d.Ops.Name())
	}
	sizes := d.CUDAGraph.BatchSizes
	if len(sizes) == 0 {
		return nil, fmt.Errorf("no graph sizes")
	}
	ops, maxT, k := d.Ops, sizes[len(sizes)-1], d.Speculative.NumSpeculativeTokens
	mg := &mtpGraphs{ops: ops, gops: gops, blockSize: d.BlockSize, chainAt: firstExtent(maxT),
		maxBlocks: graphTableBlocks(d.NumBlocks, d.BlockSize, d.Model.Config().MaxPositionEmbeddings, d.MaxModelLen)}
	h := d.Model.Config().HiddenSize
	full := newMTPLayout(maxT, maxT, k, mg.maxBlocks, mg.chainAt)
	var err error
	alloc := func(dt kernels.DType, shape ...int) kernels.Tensor {
		var t kernels.Tensor
		if err == nil {
			t, err = ops.Alloc(dt, shape...)
		}
		return t
	}
	mg.arena, mg.tables = alloc(kernels.I32, full.size), alloc(kernels.I32, maxT, mg.maxBlocks)
	mg.hidden, mg.first = alloc(ops.ActivationDType(), maxT, h), alloc(ops.ActivationDType(), maxT, h)
	if err != nil {
		return nil, err
	}
	iota := make([]int32, maxT+1)
	for i := range iota {
		iota[i] = int32(i)
	}
	if mg.iota, err = kernels.FromI32(ops, iota, maxT+1); err != nil {
		return nil, err
	}
	for _, n := range sizes {
		g, err := mg.capturePass(ctx, p, n)
		if err != nil {
			mg.close()
			return nil, fmt.Errorf("mtp first pass of %d rows: %w", n, err)
		}
		mg.passes = append(mg.passes, g)
	}
	for _, n := range sizes {
		for depth := 1; depth <= k; depth++ {
			g, err := mg.captureChain(ctx, p, n, depth)
			if err != nil {
				mg.close()
				return nil, fmt.Errorf("mtp chain of %d rows, %d deep: %w", n, depth, err)
			}
			mg.chains = append(mg.chains, g)
		}
	}
	return mg, nil
}

// upload writes elements [lo, hi) of l laid out for s (nil: padding) into
// the arena: one upload.
func (mg *mtpGraphs) upload(l *mtpLayout, s *mtpPlan, lo, hi int) error {
	host := make([]int32, l.size)
	l.fill(host, s, mg.blockSize)
	dst, err := mg.ops.Rows(mg.arena, lo, hi)
	if err != nil {
		return err
	}
	return mg.ops.Upload(dst, kernels.I32Bytes(host[lo:hi]), kernels.I32)
}

// capture runs fn once over the padding just uploaded, then records it.
func (mg *mtpGraphs) capture(fn func() error) (interface {
	Replay() error
	Close() error
}, error) {
	if err := fn(); err != nil {
		return nil, err
	}
	if err := mg.ops.Sync(); err != nil {
		return nil, err
	}
	return mg.gops.CaptureGraph(fn)
}

func (mg *mtpGraphs) capturePass(ctx context.Context, p *mtpDrafter, n int) (*mtpPassGraph, error) {
	ops := mg.ops
	l := newMTPLayout(n, 0, 1, 0, mg.chainAt)
	if err := mg.upload(&l, nil, 0, l.chain); err != nil {
		return nil, err
	}
	v, err := l.views(ops, mg.arena, true, false)
	if err != nil {
		return nil, err
	}
	g := &mtpPassGraph{size: n, views: v}
	var cu, tables, hidden, first, idx kernels.Tensor
	if cu, err = ops.Rows(mg.iota, 0, n+1); err == nil {
		if tables, err = ops.Rows(mg.tables, 0, n); err == nil {
			if hidden, err = ops.Rows(mg.hidden, 0, n); err == nil {
				if first, err = ops.Rows(mg.first, 0, n); err == nil {
					idx, err = ops.Rows(mg.iota, 0, n)
				}
			}
		}
	}
	if err != nil {
		return nil, err
	}
	g.batch = &models.ForwardBatch{NumTokens: n, InputIDs: v.ids, Positions: v.positions, Attn: kernels.AttentionMetadata{
		NumSeqs: n, NumTokens: n, MaxSeqlenQ: 1, MaxSeqlenK: mg.maxBlocks * mg.blockSize, BlockSize: mg.blockSize,
		CuSeqlensQ: cu, SeqlensK: v.seqlensK, BlockTables: tables, SlotMapping: v.slots}}
	cache := p.d.Speculative.DraftCache
	g.graph, err = mg.capture(func() error {
		out, err := p.mtp.Forward(ctx, 0, cache, g.batch, hidden)
		if err != nil {
			return err
		}
		return ops.Embedding(first, out, idx)
	})
	return g, err
}

func (mg *mtpGraphs) captureChain(ctx context.Context, p *mtpDrafter, n, depth int) (*mtpChainGraph, error) {
	ops := mg.ops
	l := newMTPLayout(0, n, depth, mg.maxBlocks, mg.chainAt)
	if err := mg.upload(&l, nil, l.chain, l.size); err != nil {
		return nil, err
	}
	v, err := l.views(ops, mg.arena, false, true)
	if err != nil {
		return nil, err
	}
	g := &mtpChainGraph{size: n, depth: depth, views: v}
	if g.tokens, err = ops.Alloc(kernels.I32, depth*n); err != nil {
		return nil, err
	}
	c := &mtpChain{v: v, stride: n, first: mg.first, verified: v.verified, tokens: g.tokens,
		rows: make([]int, depth), maxSeqlenK: make([]int, depth), blockSize: mg.blockSize, shift: true}
	for j := range depth {
		c.rows[j], c.maxSeqlenK[j] = n, mg.maxBlocks*mg.blockSize
	}
	g.graph, err = mg.capture(func() error { return p.runChain(ctx, c) })
	return g, err
}

// pickPass returns the first pass's graph for a step's batch b, or nil
// when b is not made of one-token rows that some size holds under the
// static block tables.
func (mg *mtpGraphs) pickPass(b *models.ForwardBatch) *mtpPassGraph {
	t, bt := b.NumTokens, b.Attn.BlockTables
	if t == 0 || b.Attn.NumSeqs != t || bt == nil || len(bt.Shape()) != 2 || bt.Shape()[1] > mg.maxBlocks {
		return nil
	}
	for _, g := range mg.passes {
		if g.size >= t {
			return g
		}
	}
	return nil
}

// pickChain returns the chain's graph for n rows (or columns of the
// verification) and depth depths, or nil.
func (mg *mtpGraphs) pickChain(n, depth int) *mtpChainGraph {
	for _, g := range mg.chains {
		if g.size >= n && g.depth == depth {
			return g
		}
	}
	return nil
}

// draft queues a drafting step on the graphs and returns its drafts and
// their stride; ok false (nothing queued) when its shapes fit no graph.
// The drafts are the chain graph's static output: valid until the next
// step is queued.
func (mg *mtpGraphs) draft(step *SampledStep, s *mtpPlan) (tokens kernels.Tensor, stride int, ok bool, err error) {
	if mg == nil {
		return nil, 0, false, nil
	}
	b := step.Batch
	pass := mg.pickPass(b)
	if pass == nil {
		return nil, 0, false, nil
	}
	cols := len(s.rows)
	if s.fromDevice {
		cols = max(cols, s.entries)
	}
	chain := mg.pickChain(cols, s.maxDepth)
	if chain == nil {
		return nil, 0, false, nil
	}
	for _, r := range s.rows {
		if len(r.meta.BlockTable) > mg.maxBlocks {
			return nil, 0, false, nil
		}
	}
	ops, t := mg.ops, b.NumTokens
	l := newMTPLayout(pass.size, chain.size, chain.depth, mg.maxBlocks, mg.chainAt)
	if err := mg.upload(&l, s, 0, l.size); err != nil {
		return nil, 0, false, err
	}
	prefix := func(x kernels.Tensor, shape ...int) kernels.Tensor {
		var v kernels.Tensor
		if err == nil {
			if v, err = ops.Rows(x, 0, t); err == nil && len(shape) > 0 {
				v, err = ops.Reshape(v, shape...)
			}
		}
		return v
	}
	if s.placeholders {
		ids, from := prefix(pass.views.ids), prefix(pass.views.fromRow)
		if err == nil {
			err = ops.ResolvePlaceholders(ids, from, step.Tokens)
		}
	}
	// The step's batch, shifts applied, over the static one's first rows,
	// its block tables, the device verification and the target's hidden
	// rows: copies into disjoint static arrays, one launch where the
	// backend allows.
	var pairs [][2]kernels.Tensor
	for _, c := range [][2]kernels.Tensor{{pass.views.positions, b.Positions}, {pass.views.slots, b.Attn.SlotMapping}, {pass.views.seqlensK, b.Attn.SeqlensK}} {
		pairs = append(pairs, [2]kernels.Tensor{prefix(c[0], 1, t), prefix(c[1], 1, t)})
	}
	pairs = append(pairs, [2]kernels.Tensor{pass.batch.Attn.BlockTables, b.Attn.BlockTables})
	if s.fromDevice {
		pairs = append(pairs, [2]kernels.Tensor{chain.views.verified, step.DeviceVerified})
	}
	pairs = append(pairs, [2]kernels.Tensor{prefix(mg.hidden), prefix(step.Hidden)})
	if err == nil {
		err = copyRects(ops, pairs)
	}
	if err == nil {
		err = pass.graph.Replay()
	}
	if err == nil {
		err = chain.graph.Replay()
	}
	if err != nil {
		return nil, 0, false, fmt.Errorf("mtp graphs: %w", err)
	}
	return chain.tokens, chain.size, true, nil
}

func (mg *mtpGraphs) close() error {
	if mg == nil {
		return nil
	}
	var first error
	for _, g := range mg.passes {
		if err := g.graph.Close(); err != nil && first == nil {
			first = err
		}
	}
	for _, g := range mg.chains {
		if err := g.graph.Close(); err != nil && first == nil {
			first = err
		}
	}
	mg.passes, mg.chains = nil, nil
	return first
}
