package stages

import (
	"context"
	"errors"
	"fmt"
	"slices"

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

// Propose is ProposeOnDevice with the drafts brought to the host.
func (p *mtpDrafter) Propose(ctx context.Context, step *SampledStep) ([][]int, error) {
	dd, err := p.ProposeOnDevice(ctx, step)
	if err != nil {
		return nil, err
	}
	return dd.Host(p.d.Ops)
}

// ProposeOnDevice queues the drafter's passes and returns the drafts in
// backend memory: the passes chain on the device (each depth's argmax is
// the next depth's input), so a step costs no host round trip.
func (p *mtpDrafter) ProposeOnDevice(ctx context.Context, step *SampledStep) (DeviceDrafts, error) {
	return p.propose(ctx, step, false)
}

// ProposeFromDevice is ProposeOnDevice from the verify stage's device half:
// the first pass reads the sampled tokens from step.Tokens, the rows of
// the last emitted tokens' hidden states from step.DeviceVerified, and the
// chained passes are laid out as if no draft were accepted and shifted on
// the device by the accepted counts (kernels.Ops.ShiftAccepted).
func (p *mtpDrafter) ProposeFromDevice(ctx context.Context, step *SampledStep) (DeviceDrafts, bool, error) {
	if step.Tokens == nil || step.DeviceVerified == nil {
		return DeviceDrafts{}, false, nil
	}
	dd, err := p.propose(ctx, step, true)
	return dd, err == nil, err
}

// propose is ProposeOnDevice (fromDevice false: the step's host samples
// and Verified) or ProposeFromDevice.
func (p *mtpDrafter) propose(ctx context.Context, step *SampledStep, fromDevice bool) (DeviceDrafts, error) {
	d, ops, res := p.d, p.d.Ops, step.ForwardResult
	refs, counts, err := sampleEntries(step)
	if err != nil {
		return DeviceDrafts{}, err
	}
	dd := DeviceDrafts{At: make([][]int32, len(refs))}
	k := draftLimit(d, step)
	if k == 0 {
		return dd, nil // see draftLimit
	}
	cache := d.Speculative.DraftCache
	if err := copyCacheBlocks(ops, cache, step.Outputs.BlockCopies); err != nil {
		return dd, err
	}
	b := res.Batch
	t := b.NumTokens
	first := tokenRows(step)
	// Each row's next token: the sampled one for rows that sample (from
	// the host samples, or from step.Tokens through fromRow), else the next
	// prompt token.
	sampleIndex := make(map[[2]int]int, len(step.Rows))
	for i, r := range step.Rows {
		if r.SeqID == r.Meta.SeqID {
			sampleIndex[[2]int{r.Row, r.Offset}] = i
		}
	}
	ids := make([]int32, t)
	fromRow := make([]int32, t)
	for i := range step.Seqs {
		m := &step.Seqs[i]
		q := m.SeqlenQ
		from := q - 1 - m.NumDrafts // first sampling row
		for j := range q {
			fromRow[first[i]+j] = -1
			switch {
			case m.Sample && j >= from:
				r := sampleIndex[[2]int{m.SampleRow, j - from}]
				if fromDevice {
					fromRow[first[i]+j] = int32(r)
				} else {
					ids[first[i]+j] = int32(step.Samples[r].Token)
				}
			case j+1 < q:
				ids[first[i]+j] = int32(m.InputTokenIDs[j+1])
			default:
				ids[first[i]+j] = int32(m.TokenIDs[m.PosStart+q])
			}
		}
	}
	seqIndex := make(map[engine.SeqID]int, len(step.Seqs))
	for i := range step.Seqs {
		seqIndex[step.Seqs[i].SeqID] = i
	}
	// The entries that draft, each with how deep its chain can go (its
	// positions must stay inside its block table and the context; from the
	// device, for any accepted count), deepest first: the rows of each
	// depth are then a prefix of the rows of the depth before, and each
	// depth's inputs a prefix of the last one's outputs.
	var rows []chainRow
	var depth, entry []int
	maxShift := 0
	for r, ref := range refs {
		m := ref.Meta
		if ref.SeqID != m.SeqID {
			continue // a fork
		}
		i := seqIndex[m.SeqID]
		base := first[i] + m.SeqlenQ - 1 - m.NumDrafts
		c := chainRow{out: r, meta: m, pos: samplePosition(step, m) + 1, hiddenRow: base}
		worst := 0
		if fromDevice {
			if counts[r] > 1 {
				worst = len(StepDrafts(res, m))
			}
		} else {
			a := len(step.Verified[r].TokenIDs) - 1
			c.pos += a
			c.hiddenRow += a
		}
		n := 1
		for n < k && chainFits(d, c.meta, c.pos+worst+n-1) {
			n++
		}
		rows = append(rows, c)
		depth = append(depth, n)
		entry = append(entry, r)
		maxShift = max(maxShift, worst)
	}
	if len(rows) == 0 {
		return dd, nil
	}
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return depth[b] - depth[a] })
	sorted := make([]chainRow, len(rows))
	at := make([]int32, len(rows)) // host: hidden rows; device: entries
	for i, o := range order {
		sorted[i] = rows[o]
		at[i] = int32(rows[o].hiddenRow)
		if fromDevice {
			at[i] = int32(entry[o])
		}
		d := depth[o]
		dd.At[rows[o].out] = make([]int32, d)
		for j := range d {
			dd.At[rows[o].out][j] = int32(j*len(rows) + i)
		}
	}
	rows = sorted
	n := len(rows)
	maxDepth := depth[order[0]]
	upload := append(append(ids, at...), fromRow...)
	all, err := kernels.FromI32(ops, upload, len(upload))
	if err != nil {
		return dd, err
	}
	var idsT, atT, fromT kernels.Tensor
	if idsT, err = ops.Rows(all, 0, t); err == nil {
		if atT, err = ops.Rows(all, t, t+n); err == nil {
			fromT, err = ops.Rows(all, t+n, 2*t+n)
		}
	}
	var accepted kernels.Tensor // the device's accepted counts, by entry
	if err == nil && fromDevice {
		// The sampled ids from the device tokens, and the hidden rows of
		// the last emitted tokens (base + accepted) by entry.
		err = ops.ResolvePlaceholders(idsT, fromT, step.Tokens)
		var shifted, rowsT kernels.Tensor
		if err == nil {
			if shifted, err = ops.Rows(step.DeviceVerified, 2, 3); err == nil {
				shifted, err = ops.Reshape(shifted, len(refs))
			}
		}
		if err == nil {
			if rowsT, err = ops.Alloc(kernels.I32, n); err == nil {
				err = ops.ResolvePlaceholders(rowsT, atT, shifted)
			}
		}
		atT = rowsT
		if err == nil {
			if accepted, err = ops.Rows(step.DeviceVerified, 0, 1); err == nil {
				accepted, err = ops.Reshape(accepted, len(refs))
			}
		}
	}
	if err != nil {
		return dd, err
	}
	hidden := res.Hidden
	if hidden.Shape()[0] != t { // a CUDA graph's static output
		if hidden, err = ops.Rows(hidden, 0, t); err != nil {
			return dd, err
		}
	}
	if dd.Tokens, err = ops.Alloc(kernels.I32, maxDepth*n); err != nil {
		return dd, err
	}
	tokens := func(j, rows int) (kernels.Tensor, error) { return ops.Rows(dd.Tokens, j*n, j*n+rows) }
	mb := *b
	mb.InputIDs = idsT
	// The first draft: the layer over the step's rows, read at each
	// sequence's last emitted token.
	dst, err := tokens(0, n)
	if err != nil {
		return dd, err
	}
	out, err := p.run(ctx, &mb, hidden, nil, atT, dst)
	if err != nil {
		return dd, err
	}
	// Depth j+1: one row per sequence still drafting, fed its draft of
	// depth j and the layer's output at the row that predicted it (from
	// the device: laid out as if nothing were accepted, then shifted).
	self := make([]int32, n)
	for i := range self {
		self[i] = int32(i)
	}
	gather := at
	if fromDevice {
		gather = nil // the first pass's output is read at atT, a device tensor: see below
	}
	shiftFrom := make([]int32, n)
	for i, o := range order {
		shiftFrom[i] = int32(entry[o])
	}
	for j := 1; j < maxDepth; j++ {
		m := 0
		for m < n && depth[order[m]] > j {
			m++
		}
		batch, err := chainBatchAt(d, rows[:m], j-1)
		if err != nil {
			return dd, err
		}
		if batch.InputIDs, err = tokens(j-1, m); err != nil {
			return dd, err
		}
		if fromDevice {
			sf, err := kernels.FromI32(ops, shiftFrom[:m], m)
			if err != nil {
				return dd, err
			}
			batch.Attn.MaxSeqlenK += maxShift
			if err := ops.ShiftAccepted(&batch.Attn, batch.Positions, sf, accepted); err != nil {
				return dd, err
			}
		}
		if dst, err = tokens(j, m); err != nil {
			return dd, err
		}
		selfT, err := kernels.FromI32(ops, self[:m], m)
		if err != nil {
			return dd, err
		}
		var hiddenRows []int32
		src := out
		switch {
		case j > 1:
			hiddenRows = self[:m]
		case !fromDevice:
			hiddenRows = gather[:m]
		default:
			// The first pass's output at the device rows atT.
			if src, err = ops.Alloc(out.DType(), m, out.Shape()[1]); err == nil {
				var idx kernels.Tensor
				if idx, err = ops.Rows(atT, 0, m); err == nil {
					err = ops.Embedding(src, out, idx)
				}
			}
			if err != nil {
				return dd, err
			}
			hiddenRows = self[:m]
		}
		if out, err = p.run(ctx, batch, src, hiddenRows, selfT, dst); err != nil {
			return dd, err
		}
	}
	return dd, nil
}

// chainFits reports whether a chained pass of m's sequence may run at
// position pos: inside the context and its block table.
func chainFits(d DraftDeps, m *engine.SequenceMetadata, pos int) bool {
	return pos < d.MaxModelLen && pos/d.BlockSize < len(m.BlockTable)
}

// chainBatchAt lays rows out as a decode batch of one row each, token
// r.token at position r.pos+offset, and uploads it (the MTP drafter then
// sets the input ids from backend memory). Every row must fit there
// (chainFits).
func chainBatchAt(d DraftDeps, rows []chainRow, offset int) (*models.ForwardBatch, error) {
	h := &models.HostBatch{BlockSize: d.BlockSize}
	for _, r := range rows {
		table := make([]int32, len(r.meta.BlockTable))
		for j, b := range r.meta.BlockTable {
			table[j] = int32(b)
		}
		h.AddSequence([]int32{int32(r.token)}, r.pos+offset, table)
	}
	return h.Upload(d.Ops, 0)
}

// run runs the MTP layer over batch b, fed the rows hiddenRows of hidden
// (nil: hidden's first b.NumTokens rows), and writes the greedy token of
// each of its rows atT (I32, in backend memory) into dst (I32, as many): through a captured graph when the batch is one-token
// rows that a graph's size holds, eagerly otherwise. It returns the
// layer's output; nothing waits for the device.
func (p *mtpDrafter) run(ctx context.Context, b *models.ForwardBatch, hidden kernels.Tensor, hiddenRows []int32, atT, dst kernels.Tensor) (kernels.Tensor, error) {
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
			return nil, fmt.Errorf("mtp graph inputs: %w", err)
		}
		if err := g.graph.Replay(); err != nil {
			return nil, err
		}
		all, err := ops.Alloc(kernels.I32, g.size)
		if err != nil {
			return nil, err
		}
		if err := kernels.ArgmaxInto(ops, all, g.logits); err != nil {
			return nil, err
		}
		if err := ops.ResolvePlaceholders(dst, atT, all); err != nil {
			return nil, err
		}
		return g.out, nil
	}
	h := hidden
	if hidden.Shape()[0] != n || !isIdentity(hiddenRows) {
		idx, err := kernels.FromI32(ops, hiddenRows, len(hiddenRows))
		if err != nil {
			return nil, err
		}
		if h, err = ops.Alloc(hidden.DType(), n, hidden.Shape()[1]); err != nil {
			return nil, err
		}
		if err := ops.Embedding(h, hidden, idx); err != nil {
			return nil, err
		}
	}
	out, err := p.mtp.Forward(ctx, 0, cache, b, h)
	if err != nil {
		return nil, err
	}
	logits, err := p.mtp.ComputeLogits(0, out, atT)
	if err != nil {
		return nil, err
	}
	return out, kernels.ArgmaxInto(ops, dst, logits)
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
