package stages

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// mtpGraphs holds the MTP layer's pass (its decoder layer and its head
// over every row) captured as a CUDA graph per row count, the sizes of the
// engine's decode graphs, over static inputs: the drafter's passes over a
// decode step (its one-token rows) and its chained passes replay them
// instead of launching the layer's kernels one by one.
type mtpGraphs struct {
	ops       graphOps
	graphs    []*mtpGraph // ascending by size: pick takes the first that fits
	maxBlocks int
}

// mtpGraph is the MTP pass over size one-token rows. Rows past a pass's
// own are padding, as in decodeGraph: token 0 at position 0, one key, slot
// -1 (nothing written).
type mtpGraph struct {
	staticBatch
	hidden kernels.Tensor // the pass's input hidden states [size, hidden]
	out    kernels.Tensor // output hidden states [size, hidden]
	logits kernels.Tensor // F32 [size, vocab]
	graph  interface {
		Replay() error
		Close() error
	}
}

// newMTPGraphs captures the MTP pass for each of d.CUDAGraph's sizes, after
// one eager run of each. Cost per size: one pass and one capture.
func newMTPGraphs(d DraftDeps, mtp *models.MTP) (*mtpGraphs, error) {
	gops, ok := d.Ops.(graphOps)
	if !ok {
		return nil, fmt.Errorf("backend %s cannot capture graphs", d.Ops.Name())
	}
	mg := &mtpGraphs{ops: gops, maxBlocks: graphTableBlocks(d.NumBlocks, d.BlockSize, d.Model.Config().MaxPositionEmbeddings, d.MaxModelLen)}
	for _, n := range d.CUDAGraph.BatchSizes {
		g, err := mg.capture(d, mtp, n)
		if err != nil {
			mg.close()
			return nil, fmt.Errorf("mtp pass of %d rows: %w", n, err)
		}
		mg.graphs = append(mg.graphs, g)
	}
	return mg, nil
}

func (mg *mtpGraphs) capture(d DraftDeps, mtp *models.MTP, n int) (*mtpGraph, error) {
	ops := d.Ops
	sb, err := newStaticBatch(ops, n, mg.maxBlocks, d.BlockSize)
	if err != nil {
		return nil, err
	}
	g := &mtpGraph{staticBatch: sb}
	h := d.Model.Config().HiddenSize
	if g.hidden, err = ops.Alloc(ops.ActivationDType(), n, h); err != nil {
		return nil, err
	}
	if err := ops.Upload(g.hidden, kernels.F32Bytes(make([]float32, n*h)), kernels.F32); err != nil {
		return nil, err
	}
	cache := d.Speculative.DraftCache
	pass := func() error {
		out, err := mtp.Forward(context.Background(), 0, cache, g.batch, g.hidden)
		if err != nil {
			return err
		}
		logits, err := mtp.ComputeLogits(0, out, nil)
		g.out, g.logits = out, logits
		return err
	}
	if err := pass(); err != nil {
		return nil, err
	}
	if err := ops.Sync(); err != nil {
		return nil, err
	}
	if g.graph, err = mg.ops.CaptureGraph(pass); err != nil {
		return nil, err
	}
	return g, nil
}

// pick returns the graph for a pass over b, or nil when b is not made of
// one-token rows that some size holds under the static block tables.
func (mg *mtpGraphs) pick(b *models.ForwardBatch) *mtpGraph {
	if mg == nil {
		return nil
	}
	for _, g := range mg.graphs {
		if g.fits(b, mg.maxBlocks) {
			return g
		}
	}
	return nil
}

// load writes a pass's inputs into the static tensors: b (copied on the
// device, padded) and the rows hiddenRows of hidden (gathered on the
// device).
func (g *mtpGraph) load(ops kernels.Ops, b *models.ForwardBatch, hidden kernels.Tensor, hiddenRows []int32) error {
	if err := g.staticBatch.load(ops, b); err != nil {
		return err
	}
	n := b.NumTokens
	idx, err := kernels.FromI32(ops, hiddenRows, n)
	if err != nil {
		return err
	}
	dst, err := ops.Rows(g.hidden, 0, n)
	if err != nil {
		return err
	}
	return ops.Embedding(dst, hidden, idx)
}

func (mg *mtpGraphs) close() error {
	if mg == nil {
		return nil
	}
	var first error
	for _, g := range mg.graphs {
		if err := g.graph.Close(); err != nil && first == nil {
			first = err
		}
	}
	mg.graphs = nil
	return first
}
