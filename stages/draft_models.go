package stages

import (
	"context"
	"errors"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// mtpDrafter drafts with the target's multi-token-prediction layer
// (DeepSeek-V3's num_nextn_predict_layers), chained for k > 1 as vLLM and
// SGLang do: the MTP layer at position i combines the target's hidden
// state there with the embedding of the token at i+1 and predicts the
// token at i+2.
//
// Each step it first runs the MTP layer over every row of the step, with
// the step's own layout (positions, slots, block tables, shift included)
// and each row's next token: the next prompt token in a prefill chunk, the
// token the target sampled at the row in a decode. That writes the MTP
// layer's KV for every position the target computed (rows past a
// rejection write slots the next step rewrites), and its output at the row
// of the last emitted token is the first draft. Drafts 2..k chain one row
// per sequence through the same layer (depth 0, as vLLM reuses the one
// layer DeepSeek ships), fed the previous draft and the layer's own
// output, into the lookahead slots the scheduler reserved. Greedy (argmax)
// drafts make q one-hot, which the verify stage relies on. A fork's first
// step gets no draft (its parent's MTP row saw the parent's token).
// Cost: one MTP layer over the step's tokens, then k-1 passes of one row
// per sequence, each with a logits row per sequence.
type mtpDrafter struct {
	d      DraftDeps
	mtp    *models.MTP
	graphs *mtpGraphs // nil: every pass eager
}

func newMTPDrafter(d DraftDeps) (*mtpDrafter, error) {
	if d.Model == nil {
		return &mtpDrafter{d: d}, nil // a dry build (deepinfer graph)
	}
	mtp := d.Model.MTP()
	if mtp == nil || mtp.NumLayers() == 0 {
		return nil, fmt.Errorf("draft=mtp: model %s has no MTP layers (num_nextn_predict_layers is 0, or the checkpoint holds none)", d.Model.Architecture())
	}
	if d.Speculative.DraftCache == nil {
		return nil, errors.New("draft=mtp: no KV cache for the MTP layer")
	}
	return &mtpDrafter{d: d, mtp: mtp}, nil
}

func (p *mtpDrafter) Propose(ctx context.Context, step *SampledStep) ([][]int, error) {
	d, ops, res := p.d, p.d.Ops, step.ForwardResult
	k := draftLimit(d, step)
	if k == 0 {
		return make([][]int, len(step.Verified)), nil // see draftLimit
	}
	cache := d.Speculative.DraftCache
	if err := copyCacheBlocks(ops, cache, step.Outputs.BlockCopies); err != nil {
		return nil, err
	}
	b := res.Batch
	t := b.NumTokens
	first := tokenRows(step)
	// Each row's next token: the sampled one for rows that sample, else the
	// next prompt token.
	sampled := make(map[[2]int]int, len(step.Rows))
	for i, r := range step.Rows {
		if r.SeqID == r.Meta.SeqID {
			sampled[[2]int{r.Row, r.Offset}] = step.Samples[i].Token
		}
	}
	ids := make([]int32, t)
	for i := range step.Seqs {
		m := &step.Seqs[i]
		q := m.SeqlenQ
		from := q - 1 - m.NumDrafts // first sampling row
		for j := range q {
			switch {
			case m.Sample && j >= from:
				ids[first[i]+j] = int32(sampled[[2]int{m.SampleRow, j - from}])
			case j+1 < q:
				ids[first[i]+j] = int32(m.InputTokenIDs[j+1])
			default:
				ids[first[i]+j] = int32(m.TokenIDs[m.PosStart+q])
			}
		}
	}
	idsT, err := kernels.FromI32(ops, ids, t)
	if err != nil {
		return nil, err
	}
	hidden := res.Hidden
	if hidden.Shape()[0] != t { // a CUDA graph's static output
		if hidden, err = ops.Rows(hidden, 0, t); err != nil {
			return nil, err
		}
	}
	mb := *b
	mb.InputIDs = idsT
	// The first draft: the output at each sequence's last emitted token.
	drafts := make([][]int, len(step.Verified))
	seqIndex := make(map[engine.SeqID]int, len(step.Seqs))
	for i := range step.Seqs {
		seqIndex[step.Seqs[i].SeqID] = i
	}
	var rows []chainRow
	var at []int32
	for r, v := range step.Verified {
		m := v.Ref.Meta
		if v.Ref.SeqID != m.SeqID {
			continue // a fork
		}
		i := seqIndex[m.SeqID]
		row := first[i] + m.SeqlenQ - 1 - m.NumDrafts + len(v.TokenIDs) - 1
		rows = append(rows, chainRow{out: r, meta: m, pos: rowPosition(step, v) + 1, hiddenRow: row})
		at = append(at, int32(row))
	}
	out, tokens, err := p.run(ctx, &mb, hidden, nil, at)
	if err != nil {
		return nil, err
	}
	for j := 0; len(rows) > 0; j++ {
		for n := range rows {
			drafts[rows[n].out] = append(drafts[rows[n].out], tokens[n])
			rows[n].token = tokens[n]
		}
		if j == k-1 {
			break
		}
		// The next depth: one row per sequence, fed its draft and the
		// layer's output at the row that predicted it.
		batch, kept, err := chainBatch(d, rows)
		if err != nil || batch == nil {
			return drafts, err
		}
		rows = kept
		gather := make([]int32, len(rows))
		at = make([]int32, len(rows))
		for n := range rows {
			gather[n], at[n] = int32(rows[n].hiddenRow), int32(n)
		}
		if out, tokens, err = p.run(ctx, batch, out, gather, at); err != nil {
			return nil, err
		}
		for n := range rows {
			rows[n].hiddenRow = n
			rows[n].pos++
		}
	}
	return drafts, nil
}

// run runs the MTP layer over batch b, fed the rows hiddenRows of hidden
// (nil: hidden's first b.NumTokens rows), and returns its output and the
// greedy token of each of its rows at: through a captured graph when the
// batch is one-token rows that a graph's size holds, eagerly otherwise.
func (p *mtpDrafter) run(ctx context.Context, b *models.ForwardBatch, hidden kernels.Tensor, hiddenRows []int32, at []int32) (kernels.Tensor, []int, error) {
	ops, cache := p.d.Ops, p.d.Speculative.DraftCache
	n := b.NumTokens
	if hiddenRows == nil {
		hiddenRows = make([]int32, n)
		for i := range hiddenRows {
			hiddenRows[i] = int32(i)
		}
	}
	if g := p.graphs.pick(b); g != nil {
		if err := g.load(ops, b, hidden, hiddenRows); err != nil {
			return nil, nil, fmt.Errorf("mtp graph inputs: %w", err)
		}
		if err := g.graph.Replay(); err != nil {
			return nil, nil, err
		}
		all, err := greedyTokens(ops, g.logits, n)
		if err != nil {
			return nil, nil, err
		}
		tokens := make([]int, len(at))
		for i, r := range at {
			tokens[i] = all[r]
		}
		return g.out, tokens, nil
	}
	h := hidden
	if hidden.Shape()[0] != n || !isIdentity(hiddenRows) {
		idx, err := kernels.FromI32(ops, hiddenRows, len(hiddenRows))
		if err != nil {
			return nil, nil, err
		}
		if h, err = ops.Alloc(hidden.DType(), n, hidden.Shape()[1]); err != nil {
			return nil, nil, err
		}
		if err := ops.Embedding(h, hidden, idx); err != nil {
			return nil, nil, err
		}
	}
	out, err := p.mtp.Forward(ctx, 0, cache, b, h)
	if err != nil {
		return nil, nil, err
	}
	idx, err := kernels.FromI32(ops, at, len(at))
	if err != nil {
		return nil, nil, err
	}
	logits, err := p.mtp.ComputeLogits(0, out, idx)
	if err != nil {
		return nil, nil, err
	}
	tokens, err := greedyTokens(ops, logits, len(at))
	return out, tokens, err
}

// isIdentity reports whether rows is 0, 1, 2, ...
func isIdentity(rows []int32) bool {
	for i, r := range rows {
		if int(r) != i {
			return false
		}
	}
	return true
}

// Start captures the MTP layer's graphs when the engine runs decode steps
// on CUDA graphs (before the loop starts; see mtpGraphs).
func (p *mtpDrafter) Start(context.Context) error {
	if p.mtp == nil || !p.d.CUDAGraph.Enabled {
		return nil
	}
	var err error
	if p.graphs, err = newMTPGraphs(p.d, p.mtp); err != nil {
		return fmt.Errorf("draft=mtp: cuda_graph: %w", err)
	}
	return nil
}

// Close releases the captured graphs.
func (p *mtpDrafter) Close() error { return p.graphs.close() }

// modelDrafter drafts with a smaller model of the same vocabulary, with
// its own paged KV cache in the target's block layout. Each step it runs
// the draft model over the step's rows with the target's inputs (its KV
// for every position the target computed; rows past a rejection write
// slots the next step rewrites), then k passes of one row per sequence:
// the last emitted token, then each draft, at the positions after it
// (the scheduler's lookahead slots), taking the argmax of each.
// Cost: one draft-model pass over the step's tokens plus k one-row passes
// per sequence, each with a logits row.
type modelDrafter struct {
	d     DraftDeps
	model models.Model
}

func newModelDrafter(d DraftDeps) (*modelDrafter, error) {
	if d.Model == nil {
		return &modelDrafter{d: d}, nil // a dry build (deepinfer graph)
	}
	if d.Speculative.DraftModel == nil || d.Speculative.DraftCache == nil {
		return nil, errors.New("draft=draft_model: no draft model loaded (speculative.model)")
	}
	return &modelDrafter{d: d, model: d.Speculative.DraftModel}, nil
}

func (p *modelDrafter) Propose(ctx context.Context, step *SampledStep) ([][]int, error) {
	d, ops := p.d, p.d.Ops
	k := draftLimit(d, step)
	if k == 0 {
		return make([][]int, len(step.Verified)), nil // see draftLimit
	}
	cache := d.Speculative.DraftCache
	if err := copyCacheBlocks(ops, cache, step.Outputs.BlockCopies); err != nil {
		return nil, err
	}
	if _, err := p.model.Forward(ctx, cache, step.Batch); err != nil {
		return nil, err
	}
	drafts := make([][]int, len(step.Verified))
	var rows []chainRow
	for r, v := range step.Verified {
		if v.Ref.SeqID != v.Ref.Meta.SeqID {
			continue // a fork: its parent's rows
		}
		rows = append(rows, chainRow{out: r, meta: v.Ref.Meta, pos: rowPosition(step, v) + 1, token: v.TokenIDs[len(v.TokenIDs)-1]})
	}
	for range k {
		batch, kept, err := chainBatch(d, rows)
		if err != nil || batch == nil {
			return drafts, err
		}
		rows = kept
		hidden, err := p.model.Forward(ctx, cache, batch)
		if err != nil {
			return nil, err
		}
		logits, err := p.model.ComputeLogits(hidden, nil)
		if err != nil {
			return nil, err
		}
		tokens, err := greedyTokens(ops, logits, len(rows))
		if err != nil {
			return nil, err
		}
		for n := range rows {
			drafts[rows[n].out] = append(drafts[rows[n].out], tokens[n])
			rows[n].token = tokens[n]
			rows[n].pos++
		}
	}
	return drafts, nil
}
