package stages

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

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
//
// The host lays a step out once (mtpPlan) and sends it up in one upload
// (mtpLayout); the passes, argmaxes, gathers and shifts then queue as one
// program (runChain), eagerly, or, when the engine captures CUDA graphs
// and the step's shapes fit, as two graph replays (mtpGraphs).
// Cost: one MTP layer over the step's tokens, then k-1 passes of one row
// per sequence, each with a logits row per sequence.
type mtpDrafter struct {
	d      DraftDeps
	mtp    *models.MTP
	graphs *mtpGraphs // nil: every step eager
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
// the next depth's input), so a step costs no host round trip. Drafts
// from the graphs are the graphs' static output: they hold until the
// drafter's next step is queued.
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
	d := p.d
	refs, counts, err := sampleEntries(step)
	if err != nil {
		return DeviceDrafts{}, err
	}
	dd := DeviceDrafts{At: make([][]int32, len(refs))}
	k := draftLimit(d, step)
	if k == 0 {
		return dd, nil // see draftLimit
	}
	if err := copyCacheBlocks(d.Ops, d.Speculative.DraftCache, step.Outputs.BlockCopies); err != nil {
		return dd, err
	}
	s := p.plan(step, refs, counts, k, fromDevice)
	if len(s.rows) == 0 {
		return dd, nil
	}
	defer recordDraft(d.Stats, time.Now())
	tokens, stride, ok, err := p.graphs.draft(step, s)
	if err == nil && !ok {
		tokens, stride, err = p.eager(ctx, step, s)
	}
	if err != nil {
		return dd, err
	}
	dd.Tokens = tokens
	for i, r := range s.rows {
		at := make([]int32, s.depth[i])
		for j := range at {
			at[j] = int32(j*stride + i)
		}
		dd.At[r.out] = at
	}
	return dd, nil
}

// mtpPlan is a drafting step as the host lays it out, before any upload.
type mtpPlan struct {
	fromDevice bool
	// ids and fromRow, per row of the step: the first pass's input (each
	// row's next token), or, from the device, the sample row of
	// step.Tokens that gives it (fromRow >= 0; -1 elsewhere).
	ids, fromRow []int32
	placeholders bool // some fromRow >= 0
	// rows are the entries that draft, deepest first, each with how many
	// drafts it gets (depth) and its entry in step.Verified (entry). On the
	// host path rows[i].hiddenRow is the row of the first pass's output
	// that predicts its first draft and rows[i].pos already counts its
	// accepted drafts; from the device both are the device's to shift.
	rows     []chainRow
	depth    []int
	entry    []int32
	maxDepth int
	maxShift int // the largest accepted count a row may be shifted by (from the device)
	entries  int // entries of the step: the columns of step.DeviceVerified
}

// plan lays step out on the host. The drafting rows are sorted deepest
// first, so that the rows of each depth are a prefix of the rows of the
// depth before, and each depth's inputs a prefix of the last one's
// outputs.
func (p *mtpDrafter) plan(step *SampledStep, refs []RowRef, counts []int, k int, fromDevice bool) *mtpPlan {
	d, res := p.d, step.ForwardResult
	t := res.Batch.NumTokens
	first := tokenRows(step)
	s := &mtpPlan{fromDevice: fromDevice, ids: make([]int32, t), fromRow: make([]int32, t), entries: len(refs)}
	// Each row's next token: the sampled one for rows that sample (from
	// the host samples, or from step.Tokens through fromRow), else the next
	// prompt token.
	sampleIndex := make(map[[2]int]int, len(step.Rows))
	for i, r := range step.Rows {
		if r.SeqID == r.Meta.SeqID {
			sampleIndex[[2]int{r.Row, r.Offset}] = i
		}
	}
	for i := range step.Seqs {
		m := &step.Seqs[i]
		q := m.SeqlenQ
		from := q - 1 - m.NumDrafts // first sampling row
		for j := range q {
			s.fromRow[first[i]+j] = -1
			switch {
			case m.Sample && j >= from:
				r := sampleIndex[[2]int{m.SampleRow, j - from}]
				if fromDevice {
					s.fromRow[first[i]+j] = int32(r)
					s.placeholders = true
				} else {
					s.ids[first[i]+j] = int32(step.Samples[r].Token)
				}
			case j+1 < q:
				s.ids[first[i]+j] = int32(m.InputTokenIDs[j+1])
			default:
				s.ids[first[i]+j] = int32(m.TokenIDs[m.PosStart+q])
			}
		}
	}
	seqIndex := make(map[engine.SeqID]int, len(step.Seqs))
	for i := range step.Seqs {
		seqIndex[step.Seqs[i].SeqID] = i
	}
	// The entries that draft, each with how deep its chain can go (its
	// positions must stay inside its block table and the context; from the
	// device, for any accepted count).
	var rows []chainRow
	var depth []int
	var entry []int32
	for r, ref := range refs {
		m := ref.Meta
		if ref.SeqID != m.SeqID {
			continue // a fork
		}
		i := seqIndex[m.SeqID]
		c := chainRow{out: r, meta: m, pos: samplePosition(step, m) + 1, hiddenRow: first[i] + m.SeqlenQ - 1 - m.NumDrafts}
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
		entry = append(entry, int32(r))
		s.maxShift = max(s.maxShift, worst)
	}
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return depth[b] - depth[a] })
	for _, o := range order {
		s.rows = append(s.rows, rows[o])
		s.depth = append(s.depth, depth[o])
		s.entry = append(s.entry, entry[o])
	}
	if len(s.rows) > 0 {
		s.maxDepth = s.depth[0]
	}
	return s
}

// depthRows returns how many rows each depth has (rows[0]: every drafting
// row).
func (s *mtpPlan) depthRows() []int {
	rows := make([]int, s.maxDepth)
	for _, d := range s.depth {
		for j := range d {
			rows[j]++
		}
	}
	return rows
}

// mtpLayout places a drafting step's host arrays in its one upload, as I32
// offsets, each array 16-byte aligned: the first pass's over T rows (the
// step's t, then padding), and from chain on the chain's over N rows (the
// drafting rows, then padding), D depths and block tables W wide. The
// first pass's offsets depend on T only, and the chain's on N, W and chain
// only (depth j's on j, not on D), so that the graphs of each part, keyed
// by T and by (N, D), read a step laid out for both.
type mtpLayout struct {
	T, N, D, W int
	// The first pass, [T] each: input ids, positions, slots and key
	// counts (the static batch of a graph; the device copies the step's
	// own over its t rows), and the placeholders' sample rows.
	ids, positions, slots, seqlensK, fromRow int
	chain                                    int
	verified                                 int // [3, N]: a verification as kernels.DraftAccepter writes it (accepted counts, last tokens, hidden rows), by column
	entries                                  int // [N]: each row's column of the verification
	cu                                       int // [N+1]: 0, 1, ..., N
	tables                                   int // [N, W]: each row's block table, -1 past it
	depths                                   []mtpDepthLayout
	size                                     int
}

// mtpDepthLayout is where depth j's one-token rows lie ([N] each):
// positions, slots and key counts as if nothing were accepted, and the
// column whose accepted count shifts each (-1: none).
type mtpDepthLayout struct{ positions, slots, seqlensK, shiftFrom int }

// newMTPLayout lays out T first-pass rows and N chain rows of D depths
// with tables w wide; the chain starts at chainAt or right after the
// first pass, whichever is later.
func newMTPLayout(T, N, D, W, chainAt int) mtpLayout {
	l := mtpLayout{T: T, N: N, D: D, W: W}
	at := 0
	next := func(n int) int {
		o := at
		at += (n + 3) &^ 3
		return o
	}
	l.ids, l.positions, l.slots, l.seqlensK, l.fromRow = next(T), next(T), next(T), next(T), next(T)
	at = max(at, chainAt)
	l.chain = at
	l.verified, l.entries, l.cu, l.tables = next(3*N), next(N), next(N+1), next(N*W)
	for j := 1; j < D; j++ {
		l.depths = append(l.depths, mtpDepthLayout{next(N), next(N), next(N), next(N)})
	}
	l.size = at
	return l
}

// firstExtent is where a layout of T first-pass rows may start its chain.
func firstExtent(T int) int { return newMTPLayout(T, 0, 1, 0, 0).chain }

// fill writes s laid out by l into host (l.size elements; every array l
// places is written). Rows past the step's are padding, as in the decode
// graphs: token 0 at position 0 with one key, written nowhere (slot -1),
// shifted by nothing, a block table of block 0 (then -1, as past a real
// row's table), column 0 of the verification. On the host path the
// verification holds, in column i, row i's hidden row, and nothing is
// shifted. s nil: padding only. Every row's block table must fit in W.
func (l *mtpLayout) fill(host []int32, s *mtpPlan, blockSize int) {
	var t, n int
	if s != nil {
		t, n = len(s.ids), len(s.rows)
	}
	for i := range l.T {
		id, from := int32(0), int32(-1)
		if i < t {
			id, from = s.ids[i], s.fromRow[i]
		}
		host[l.ids+i], host[l.positions+i], host[l.slots+i], host[l.seqlensK+i], host[l.fromRow+i] = id, 0, -1, 1, from
	}
	verified := host[l.verified : l.verified+3*l.N]
	clear(verified)
	for i := 0; i <= l.N; i++ {
		host[l.cu+i] = int32(i)
	}
	for i := range l.N {
		table := host[l.tables+i*l.W : l.tables+(i+1)*l.W]
		for b := range table {
			table[b] = -1
		}
		host[l.entries+i] = 0
		if i >= n {
			table[0] = 0
			continue
		}
		r := s.rows[i]
		for b, blk := range r.meta.BlockTable {
			table[b] = int32(blk)
		}
		if s.fromDevice {
			host[l.entries+i] = s.entry[i]
		} else {
			host[l.entries+i] = int32(i)
			verified[2*l.N+i] = int32(r.hiddenRow)
		}
	}
	for j := 1; j < l.D; j++ {
		dl := l.depths[j-1]
		for i := range l.N {
			pos, slot, keys, from := int32(0), int32(-1), int32(1), int32(-1)
			if i < n && s.depth[i] > j {
				r := s.rows[i]
				p := r.pos + j - 1
				pos, keys = int32(p), int32(p+1)
				slot = int32(r.meta.BlockTable[p/blockSize]*blockSize + p%blockSize)
				if s.fromDevice {
					from = s.entry[i]
				}
			}
			host[dl.positions+i], host[dl.slots+i], host[dl.seqlensK+i], host[dl.shiftFrom+i] = pos, slot, keys, from
		}
	}
}

// mtpViews are a layout's arrays in backend memory: views of the one
// buffer its step was uploaded into.
type mtpViews struct {
	ids, positions, slots, seqlensK, fromRow kernels.Tensor // I32 [T]
	verified                                 kernels.Tensor // I32 [3, N]
	entries, cu                              kernels.Tensor // I32 [N], [N+1]
	tables                                   kernels.Tensor // I32 [N, W]
	depths                                   []mtpDepthViews
}

// mtpDepthViews are depth j's arrays, I32 [N] each.
type mtpDepthViews struct{ positions, slots, seqlensK, shiftFrom kernels.Tensor }

// views returns l's arrays in buf (I32, one dimension, laid out by l):
// the first pass's when first, the chain's when chain. No copy.
func (l *mtpLayout) views(ops kernels.Ops, buf kernels.Tensor, first, chain bool) (*mtpViews, error) {
	var err error
	view := func(off, n int, shape ...int) kernels.Tensor {
		if err != nil {
			return nil
		}
		var t kernels.Tensor
		if t, err = ops.Rows(buf, off, off+n); err == nil && len(shape) > 0 {
			t, err = ops.Reshape(t, shape...)
		}
		return t
	}
	v := &mtpViews{}
	if first {
		v.ids, v.positions, v.slots, v.seqlensK, v.fromRow = view(l.ids, l.T), view(l.positions, l.T), view(l.slots, l.T), view(l.seqlensK, l.T), view(l.fromRow, l.T)
	}
	if chain {
		v.verified, v.entries, v.cu, v.tables = view(l.verified, 3*l.N, 3, l.N), view(l.entries, l.N), view(l.cu, l.N+1), view(l.tables, l.N*l.W, l.N, l.W)
		for _, dl := range l.depths {
			v.depths = append(v.depths, mtpDepthViews{view(dl.positions, l.N), view(dl.slots, l.N), view(dl.seqlensK, l.N), view(dl.shiftFrom, l.N)})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mtp layout: %w", err)
	}
	return v, nil
}

// mtpChain is what the chained passes read: a layout's chain views and
// what the step holds on the device.
type mtpChain struct {
	v      *mtpViews
	stride int // depth j's drafts start at j*stride of tokens
	// first is the first pass's output, its rows those of the step's batch.
	first kernels.Tensor
	// verified (I32 [3, R]) gives, at a row's column (v.entries), its
	// accepted count (row 0) and its hidden row in first (row 2).
	verified   kernels.Tensor
	tokens     kernels.Tensor // I32 [D*stride]: the drafts
	rows       []int          // rows of each depth (stride each in a graph: padding past a step's)
	maxSeqlenK []int          // bound on the key counts of depth j's batch (j >= 1), shifts included
	blockSize  int
	shift      bool // shift each depth's rows by their accepted counts (from the device, and in a graph)
}

// runChain queues the drafts of every depth: depth 0 is the argmax of the
// MTP head over the first pass's output at each row's hidden row; depth j
// >= 1 runs the MTP layer over one token a row (depth j-1's draft) at the
// positions laid out for it, shifted by the row's accepted count when
// c.shift, fed the first pass's output at the hidden row (j = 1) or depth
// j-1's output, and takes the argmax. It only queues device work, so that
// a graph can capture it.
func (p *mtpDrafter) runChain(ctx context.Context, c *mtpChain) error {
	ops, cache := p.d.Ops, p.d.Speculative.DraftCache
	var err error
	verifiedRow := func(i int) kernels.Tensor {
		var t kernels.Tensor
		if err == nil {
			if t, err = ops.Rows(c.verified, i, i+1); err == nil {
				t, err = ops.Reshape(t, c.verified.Shape()[1])
			}
		}
		return t
	}
	prefix := func(t kernels.Tensor, lo, n int) kernels.Tensor {
		var v kernels.Tensor
		if err == nil {
			v, err = ops.Rows(t, lo, lo+n)
		}
		return v
	}
	accepted, hiddenRows := verifiedRow(0), verifiedRow(2)
	n := c.rows[0]
	entries := prefix(c.v.entries, 0, n)
	if err != nil {
		return err
	}
	// Each row's hidden row, by its column of the verification.
	at, err := ops.Alloc(kernels.I32, n)
	if err != nil {
		return err
	}
	if err := ops.ResolvePlaceholders(at, entries, hiddenRows); err != nil {
		return err
	}
	logits, err := p.mtp.ComputeLogits(0, c.first, at)
	if err != nil {
		return err
	}
	if dst := prefix(c.tokens, 0, n); err == nil {
		err = kernels.ArgmaxInto(ops, dst, logits)
	}
	if err != nil || len(c.rows) == 1 {
		return err
	}
	// Depth 1 is fed the first pass's output at the hidden rows.
	m := c.rows[1]
	out, err := kernels.AllocEmpty(ops, c.first.DType(), m, c.first.Shape()[1]) // every row embedded
	if idx := prefix(at, 0, m); err == nil {
		err = ops.Embedding(out, c.first, idx)
	}
	if err != nil {
		return err
	}
	for j := 1; j < len(c.rows); j++ {
		m := c.rows[j]
		dv := c.v.depths[j-1]
		b := &models.ForwardBatch{NumTokens: m, InputIDs: prefix(c.tokens, (j-1)*c.stride, m), Positions: prefix(dv.positions, 0, m),
			Attn: kernels.AttentionMetadata{NumSeqs: m, NumTokens: m, MaxSeqlenQ: 1, MaxSeqlenK: c.maxSeqlenK[j], BlockSize: c.blockSize,
				CuSeqlensQ: prefix(c.v.cu, 0, m+1), SeqlensK: prefix(dv.seqlensK, 0, m), BlockTables: prefix(c.v.tables, 0, m),
				SlotMapping: prefix(dv.slots, 0, m)}}
		shiftFrom, hidden := prefix(dv.shiftFrom, 0, m), prefix(out, 0, m)
		dst := prefix(c.tokens, j*c.stride, m)
		if err != nil {
			return err
		}
		if c.shift {
			if err := ops.ShiftAccepted(&b.Attn, b.Positions, shiftFrom, accepted); err != nil {
				return err
			}
		}
		if out, err = p.mtp.Forward(ctx, 0, cache, b, hidden); err != nil {
			return err
		}
		if logits, err = p.mtp.ComputeLogits(0, out, nil); err != nil {
			return err
		}
		if err := kernels.ArgmaxInto(ops, dst, logits); err != nil {
			return err
		}
	}
	return nil
}

// eager runs a drafting step without graphs: its layout (no padding) in
// one upload, the first pass over the step's own batch, then the chain. It
// returns the drafts and their stride (the drafting rows).
func (p *mtpDrafter) eager(ctx context.Context, step *SampledStep, s *mtpPlan) (kernels.Tensor, int, error) {
	ops, res := p.d.Ops, step.ForwardResult
	t, n := len(s.ids), len(s.rows)
	w := 1
	for _, r := range s.rows {
		w = max(w, len(r.meta.BlockTable))
	}
	l := newMTPLayout(t, n, s.maxDepth, w, 0)
	host := make([]int32, l.size)
	l.fill(host, s, p.d.BlockSize)
	buf, err := kernels.FromI32(ops, host, l.size)
	if err != nil {
		return nil, 0, err
	}
	v, err := l.views(ops, buf, true, true)
	if err != nil {
		return nil, 0, err
	}
	if s.placeholders {
		if err := ops.ResolvePlaceholders(v.ids, v.fromRow, step.Tokens); err != nil {
			return nil, 0, err
		}
	}
	hidden := res.Hidden
	if hidden.Shape()[0] != t { // a CUDA graph's static output
		if hidden, err = ops.Rows(hidden, 0, t); err != nil {
			return nil, 0, err
		}
	}
	mb := *res.Batch
	mb.InputIDs = v.ids
	out, err := p.mtp.Forward(ctx, 0, p.d.Speculative.DraftCache, &mb, hidden)
	if err != nil {
		return nil, 0, err
	}
	tokens, err := ops.Alloc(kernels.I32, s.maxDepth*n)
	if err != nil {
		return nil, 0, err
	}
	c := &mtpChain{v: v, stride: n, first: out, verified: v.verified, tokens: tokens, rows: s.depthRows(),
		maxSeqlenK: make([]int, s.maxDepth), blockSize: p.d.BlockSize, shift: s.fromDevice}
	if s.fromDevice {
		c.verified = step.DeviceVerified
	}
	for j := 1; j < s.maxDepth; j++ {
		for i := range c.rows[j] {
			c.maxSeqlenK[j] = max(c.maxSeqlenK[j], s.rows[i].pos+j)
		}
		if s.fromDevice {
			c.maxSeqlenK[j] += s.maxShift
		}
	}
	return tokens, n, p.runChain(ctx, c)
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

// Start captures the MTP drafter's graphs when the engine runs decode
// steps on CUDA graphs (before the loop starts; see mtpGraphs).
func (p *mtpDrafter) Start(ctx context.Context) error {
	if p.mtp == nil || !p.d.CUDAGraph.Enabled {
		return nil
	}
	var err error
	if p.graphs, err = newMTPGraphs(ctx, p); err != nil {
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
	defer recordDraft(d.Stats, time.Now())
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
