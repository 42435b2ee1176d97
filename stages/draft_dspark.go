package stages

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/spec"
	"github.com/deepinfer/deepinfer-go/kernels"
)

func init() {
	RegisterDraft(nil, "dspark", NoOptions{}, func(d DraftDeps, _ NoOptions) (Drafter, error) {
		return newDSparkDrafter(d)
	})
}

// dsparkDrafter drafts with a DSpark block drafter (models.DSpark) and
// gates what the next step verifies by the drafter's confidence.
//
// After each step, for every sequence that sampled (a fork's first step
// excepted: its parent's row saw the parent's token), one DSpark pass
// conditioned on the target's hidden state at the row of the sequence's
// last emitted token proposes min(k, block size) greedy drafts with a
// confidence each (the predicted probability that the target accepts the
// draft given that it accepted the ones before). Gating then keeps:
//
//   - per sequence, the longest prefix whose predicted cumulative
//     acceptance clears speculative.confidence_threshold (0 drafts
//     allowed: spec.GatePrefix);
//   - across the step, when speculative.max_verify_tokens_per_step > 0, at
//     most that many draft tokens, dealt to the drafts with the highest
//     expected accepted tokens per verified token (spec.GateBudget); when
//     it is "auto", as many of those as maximize the step's expected
//     tokens per second, on a line of step time over rows fitted to the
//     steps of the running batch's class (spec.RowCost, spec.GateCost).
//
// The drafter is a DeviceVerifiedDrafter: under ZOS it drafts from the
// verify stage's device half (each sequence's last emitted token and the
// row of its hidden state, SampledStep.DeviceVerified), so no host wait
// sits between the verification and the drafts, and the draft stage
// builds the next step's inputs from the drafts on the device. The host
// lays a step out (dsparkPlan) and sends it in one upload; the device
// gathers each sequence's token and hidden row, runs the pass (eagerly,
// or, when the engine captures CUDA graphs and the step's rows fit, as one
// graph replay: dsparkGraphs) and the host reads the confidences back.
//
// The gate runs on the host, and so sits one host round trip, a read of
// the pass's confidence logits (positions x sequences floats), between
// the drafter's pass and the next step's forward pass. Both GatePrefix
// and GateBudget stay there: the backends have no kernel for GatePrefix's sigmoid,
// running product and threshold (no composition of kernels.Ops gives the
// float64 decisions of the host exactly), nor for GateBudget's sort across
// the batch; and the host needs the gated lengths anyway, since the next
// step's verification takes each row's draft count from them (its device
// half's layout and its host half: StepDrafts), and the scheduler, stats
// and adaptive controller count them. Gating before the next step's
// inputs are built keeps them the host-gated run's exactly. Without ZOS a
// sequence's next step holds exactly its drafts, so fewer drafts are
// fewer rows in the verify forward pass. With ZOS the next step was laid
// out before the drafts existed, with k placeholder rows per sequence;
// the draft stage publishes the gated lengths with the next step's
// inputs (SampledStep.NextDrafts) and the forward stage lays the step out
// again without the rows past them (TrimDrafts), so fewer drafts are
// fewer rows there too. Because the gate runs on the host, the host knows
// the lengths before the next step's forward pass is queued: the remap is
// a host layout and one upload, and the device still corrects positions,
// slots and lengths by the accepted counts (ShiftAccepted). An
// asynchronous read of F32 values would take the confidences' round trip
// off the device's path (kernels.AsyncFetcher reads I32 only, and the
// draft stage holds its two outstanding reads), but the next step's rows
// would then be fixed before the gate, and the remap would have to move
// onto the device.
//
// That round trip is the price of gating: on a device that verifies a
// row nearly free (an H100 at batch 1-64), verifying every draft without
// the read ran 1.17-1.41x faster than gating with it. With the step budget
// "auto" the drafter therefore measures, per batch size class, whether
// gating pays for its read (gating, a spec.Controller over two lengths:
// 1 gates, 0 verifies every draft unread, the threshold included) and
// keeps the faster, as the adaptive controller keeps the faster draft
// length.
//
// The drafter writes no KV cache, so a rejection rolls nothing back.
// Drafts are deterministic (q one-hot), as the verify stage requires.
// Cost per step: the DSpark pass (block layers over block-size rows per
// sequence, then one LM-head row per sequence and drafted position; on a
// synchronous backend such as the CPU's, eagerly, the positions stop once
// no sequence's cumulative confidence clears the threshold), the read of
// the confidences and the host work of gating, O(D log D) for D drafts.
// On graphs a step costs the host one upload, the gathers of its tokens
// and hidden rows (two from the device), one replay and the read.
type dsparkDrafter struct {
	d      DraftDeps
	ds     *models.DSpark
	graphs *dsparkGraphs // nil: every step eager
	// cost is the measured cost of a row when the step budget is "auto"
	// (Speculative.VerifyBudgetAuto; nil otherwise): see observe and gate.
	cost *spec.RowCost
	// gating (budget "auto"; nil otherwise) decides per step whether the
	// drafts are gated (1: the confidences read, the threshold and the
	// budget applied) or all verified unread (0), by measuring the steps
	// that follow each choice; gatedFor is the step the last choice
	// drafted for, gatedK the choice and gatedRows its drafting rows (the
	// class it was made and is measured in).
	gating            *spec.Controller
	gatedFor          engine.StepID
	gatedK, gatedRows int
	// gateTurn is the last step's measurement of the gating choice, fed to
	// gating at the next step's observe: a step drafted from the device's
	// verification has no host outcome yet when it is observed, and has
	// one by the next (the draft stage awaits it before taking the next).
	gateTurn gateTurn
	lastStep engine.StepID
	lastSeen time.Time
	now      func() time.Time // the clock of observe (nil: time.Now)
}

// gateTurn is one loop turn as the gating choice's controller sees it:
// the end of the turn (zero before the first), and, when the turn ended
// with the step the choice drafted for, that step (its emitted tokens are
// counted once its host outcome exists; nil otherwise), the choice and
// its rows.
type gateTurn struct {
	at      time.Time
	step    *SampledStep
	k, rows int
}

func newDSparkDrafter(d DraftDeps) (*dsparkDrafter, error) {
	if d.Model == nil {
		return &dsparkDrafter{d: d}, nil // a dry build (deepinfer graph)
	}
	if d.Speculative.DSpark == nil {
		return nil, errors.New("draft=dspark: no DSpark drafter loaded (speculative.draft_model)")
	}
	p := &dsparkDrafter{d: d, ds: d.Speculative.DSpark}
	if d.Speculative.VerifyBudgetAuto {
		p.cost = spec.NewRowCost()
		p.gating = spec.NewController(1, 16, 8)
	}
	return p, nil
}

// observe records in the row cost (budget "auto") the step that was just
// verified: the time since the drafter saw the step before, which in a
// busy step loop is one turn of it (the drafter's pass, the step's forward
// pass and its sampling), against the step's rows. Only a decode step
// that follows the one the drafter saw last counts: a prompt chunk's rows
// cost otherwise, and a gap (a step drafted nothing, the loop idled)
// spans more than a turn. Cost: O(1).
func (p *dsparkDrafter) observe(step *SampledStep) {
	if p.cost == nil {
		return
	}
	clock := p.now
	if clock == nil {
		clock = time.Now
	}
	now, o := clock(), step.Outputs
	turn := o.StepID == p.lastStep+1
	if turn && o.NumPrefillTokens == 0 && o.NumDecodeSeqs > 0 {
		p.cost.Observe(o.NumDecodeSeqs, o.NumDecodeTokens, now.Sub(p.lastSeen))
	}
	// The gating choice is measured on the step it drafted for, prompt
	// chunks included (the read costs there too): its tokens over the
	// turn that ends here, fed one step late (see gateTurn).
	if g := p.gateTurn; g.step != nil {
		p.gating.Observe(g.rows, g.k, emittedTokens(g.step), g.step.Outputs.NumPrefillTokens, g.at)
	} else if !g.at.IsZero() {
		p.gating.Skip(g.at)
	}
	p.gateTurn = gateTurn{at: now}
	if turn && o.StepID == p.gatedFor {
		p.gateTurn.step, p.gateTurn.k, p.gateTurn.rows = step, p.gatedK, p.gatedRows
	}
	p.lastStep, p.lastSeen = o.StepID, now
}

// emittedTokens is the number of tokens step emitted (each sample row's
// accepted drafts and its bonus token).
func emittedTokens(step *SampledStep) int {
	n := 0
	for _, v := range step.Outcomes() {
		n += len(v.TokenIDs)
	}
	return n
}

// readsConfidence decides whether the drafting step of rows sequences
// about to be queued after step reads its confidences and gates (see
// gating): the drafter gates at all, and with the budget "auto" the
// measurement has not found gating slower at this batch size.
func (p *dsparkDrafter) readsConfidence(step *SampledStep, rows int) bool {
	if p.gating == nil {
		return p.gates()
	}
	k := p.gating.Decide(rows)
	p.gatedFor, p.gatedK, p.gatedRows = step.Outputs.StepID+1, k, rows
	return k == 1
}

// Propose drafts on the host's verification through models.DSpark.Draft,
// which reads the drafts back itself (at once on a synchronous backend,
// stopping early), then gates them: the reference that the device paths
// (ProposeOnDevice, ProposeFromDevice) reproduce. The draft stage takes
// the device paths.
func (p *dsparkDrafter) Propose(ctx context.Context, step *SampledStep) ([][]int, error) {
	p.observe(step)
	d := p.d
	drafts := make([][]int, len(step.Verified))
	k := min(draftLimit(d, step), p.ds.BlockSize())
	if k == 0 || len(step.Verified) == 0 {
		return drafts, nil
	}
	res := step.ForwardResult
	if res.Hidden == nil {
		return nil, fmt.Errorf("draft=dspark: step %d: the forward stage kept no hidden states", step.Outputs.StepID)
	}
	s := p.plan(step, sampleRefs(step.Verified), false)
	if len(s.cols) == 0 {
		return drafts, nil
	}
	defer recordDraft(d.Stats, time.Now())
	got, err := p.ds.Draft(ctx, res.Hidden, s.rows, s.last, k, d.Speculative.ConfidenceThreshold)
	if err != nil {
		return nil, err
	}
	lengths := p.gate(got.Confidence, len(s.cols), k)
	for i, r := range s.cols {
		drafts[r] = got.Tokens[i][:lengths[i]]
	}
	return drafts, nil
}

// ProposeOnDevice drafts on the host's verification (Verified) and returns
// the gated drafts in backend memory.
func (p *dsparkDrafter) ProposeOnDevice(ctx context.Context, step *SampledStep) (DeviceDrafts, error) {
	return p.propose(ctx, step, false)
}

// ProposeFromDevice drafts on the verify stage's device half: each
// sequence's last emitted token and hidden row come from
// step.DeviceVerified on the device. It waits for its own pass only (the
// read of the confidences, for the gate).
func (p *dsparkDrafter) ProposeFromDevice(ctx context.Context, step *SampledStep) (DeviceDrafts, bool, error) {
	if p.ds == nil || step.Tokens == nil || step.DeviceVerified == nil {
		return DeviceDrafts{}, false, nil
	}
	dd, err := p.propose(ctx, step, true)
	return dd, err == nil, err
}

// sampleRefs are the entries of verified.
func sampleRefs(verified []VerifiedRow) []RowRef {
	refs := make([]RowRef, len(verified))
	for i, v := range verified {
		refs[i] = v.Ref
	}
	return refs
}

// gates says whether the confidences can cut a draft: a threshold above
// 0 or a step budget. Without either every row verifies all its n
// drafts, and the drafter does not read the confidences back (a wait for
// the device on an asynchronous backend, which would stall the step).
func (p *dsparkDrafter) gates() bool {
	sp := p.d.Speculative
	return sp.ConfidenceThreshold > 0 || sp.MaxVerifyTokensPerStep > 0 || sp.VerifyBudgetAuto
}

// gate returns how many of its n drafts each of b sequences verifies,
// given the confidences of its drafts: spec.GatePrefix at the threshold,
// then the step's budget (spec.GateBudget), or with the budget "auto" the
// drafts that maximize the step's expected rate on the measured line of
// its class (spec.GateCost; the threshold alone while the line is not
// trusted yet); n each when conf is nil (the drafter does not gate).
func (p *dsparkDrafter) gate(conf [][]float64, b, n int) []int {
	if conf == nil {
		lengths := make([]int, b)
		for i := range lengths {
			lengths[i] = n
		}
		return lengths
	}
	sp := p.d.Speculative
	limits := make([]int, len(conf))
	for i, c := range conf {
		limits[i] = spec.GatePrefix(c, sp.ConfidenceThreshold)
	}
	if p.cost != nil {
		if base, perRow, ok := p.cost.Line(len(conf)); ok {
			return spec.GateCost(conf, limits, base, perRow)
		}
	}
	budget := -1
	if sp.MaxVerifyTokensPerStep > 0 {
		budget = sp.MaxVerifyTokensPerStep
	}
	return spec.GateBudget(conf, limits, budget)
}

// dsparkPlan is a drafting step as the host lays it out: the entries that
// draft (cols: their column of the step's verification, in order) and,
// on the host path, each one's hidden row and last token.
type dsparkPlan struct {
	fromDevice bool
	cols       []int32
	rows, last []int32 // host path only
}

// plan lays out the entries refs of step (forks excepted). On the host
// path it reads step.Verified; from the device the rows and tokens are
// the device's (columns of step.DeviceVerified).
func (p *dsparkDrafter) plan(step *SampledStep, refs []RowRef, fromDevice bool) *dsparkPlan {
	s := &dsparkPlan{fromDevice: fromDevice}
	first := tokenRows(step)
	seqIndex := make(map[engine.SeqID]int, len(step.Seqs))
	for i := range step.Seqs {
		seqIndex[step.Seqs[i].SeqID] = i
	}
	for r, ref := range refs {
		m := ref.Meta
		if ref.SeqID != m.SeqID {
			continue // a fork
		}
		s.cols = append(s.cols, int32(r))
		if !fromDevice {
			v := step.Verified[r]
			i := seqIndex[m.SeqID]
			s.rows = append(s.rows, int32(first[i]+m.SeqlenQ-1-m.NumDrafts+len(v.TokenIDs)-1))
			s.last = append(s.last, int32(v.TokenIDs[len(v.TokenIDs)-1]))
		}
	}
	return s
}

// dsparkInputs places a step's per-row inputs in an I32 buffer of a pass
// over size rows: each row's hidden row, last token and verification
// column (the device's gathers read it), each 16-byte aligned, then the
// pass's layout (models.DSpark.FillLayout).
type dsparkInputs struct{ size, rows, last, cols, layout, total int }

func newDSparkInputs(ds *models.DSpark, size int) dsparkInputs {
	a := (size + 3) &^ 3
	return dsparkInputs{size: size, rows: 0, last: a, cols: 2 * a, layout: 3 * a, total: 3*a + ds.LayoutSize(size)}
}

// fill writes s's rows into host[:l.layout]: from the host, each row's
// hidden row and token (column -1: nothing to gather); from the device,
// row 0 and token 0 to be replaced by the gathers from its column. Rows
// past s's are padding: hidden row 0, token 0, column -1. s nil: padding
// only.
func (l dsparkInputs) fill(host []int32, s *dsparkPlan) {
	n := 0
	if s != nil {
		n = len(s.cols)
	}
	clear(host[:l.layout])
	for i := range l.size {
		host[l.cols+i] = -1
		if i >= n {
			continue
		}
		if s.fromDevice {
			host[l.cols+i] = s.cols[i]
		} else {
			host[l.rows+i], host[l.last+i] = s.rows[i], s.last[i]
		}
	}
}

// dsparkViews are an input buffer's arrays in backend memory.
type dsparkViews struct{ rows, last, cols, layout kernels.Tensor }

func (l dsparkInputs) views(ops kernels.Ops, buf kernels.Tensor) (dsparkViews, error) {
	var err error
	view := func(off, n int) kernels.Tensor {
		var t kernels.Tensor
		if err == nil {
			t, err = ops.Rows(buf, off, off+n)
		}
		return t
	}
	v := dsparkViews{rows: view(l.rows, l.size), last: view(l.last, l.size), cols: view(l.cols, l.size), layout: view(l.layout, l.total-l.layout)}
	if err != nil {
		return v, fmt.Errorf("dspark inputs: %w", err)
	}
	return v, nil
}

// gather queues what a pass needs from the step: from the device, each
// drafting row's hidden row and last token from its column of the
// device's verification; then the features (the hidden states at those
// rows) into feat.
func gatherDSpark(ops kernels.Ops, step *SampledStep, v dsparkViews, feat kernels.Tensor, fromDevice bool) error {
	if fromDevice {
		dv := step.DeviceVerified
		r := dv.Shape()[1]
		for _, c := range []struct {
			dst kernels.Tensor
			row int
		}{{v.rows, 2}, {v.last, 1}} {
			src, err := ops.Rows(dv, c.row, c.row+1)
			if err == nil {
				src, err = ops.Reshape(src, r)
			}
			if err == nil {
				err = ops.ResolvePlaceholders(c.dst, v.cols, src)
			}
			if err != nil {
				return err
			}
		}
	}
	return ops.Embedding(feat, step.Hidden, v.rows)
}

// propose runs a drafting step (from the device, or from the host's
// Verified) and gates its drafts.
func (p *dsparkDrafter) propose(ctx context.Context, step *SampledStep, fromDevice bool) (DeviceDrafts, error) {
	p.observe(step)
	d := p.d
	refs, _, err := sampleEntries(step)
	if err != nil {
		return DeviceDrafts{}, err
	}
	dd := DeviceDrafts{At: make([][]int32, len(refs))}
	n := min(draftLimit(d, step), p.ds.BlockSize())
	if n == 0 {
		return dd, nil
	}
	if step.Hidden == nil {
		return dd, fmt.Errorf("draft=dspark: step %d: the forward stage kept no hidden states", step.Outputs.StepID)
	}
	s := p.plan(step, refs, fromDevice)
	if len(s.cols) == 0 {
		return dd, nil
	}
	defer recordDraft(d.Stats, time.Now())
	read := p.readsConfidence(step, len(s.cols))
	tokens, conf, stride, ok, err := p.graphs.draft(step, s, n, p.ds, read)
	if err == nil && !ok {
		tokens, conf, stride, err = p.eager(ctx, step, s, n, read)
	}
	if err != nil {
		return dd, fmt.Errorf("draft=dspark: %w", err)
	}
	dd.Tokens = tokens
	lengths := p.gate(conf, len(s.cols), n)
	for i, r := range s.cols {
		at := make([]int32, lengths[i])
		for j := range at {
			at[j] = int32(j*stride + i)
		}
		dd.At[r] = at
	}
	return dd, nil
}

// eager runs a drafting step without graphs: its inputs and layout in one
// upload, the gathers, the pass, and the confidences read back: once at
// the end on an asynchronous backend, after each position on the others
// (which stops the pass once no row's cumulative confidence clears the
// threshold, as models.DSpark.Draft does); unless read, not at all, and
// the pass leaves the confidence head out. It returns the drafts, the
// confidences of the positions it ran (per row; nil unread) and the
// drafts' stride (the rows).
func (p *dsparkDrafter) eager(ctx context.Context, step *SampledStep, s *dsparkPlan, n int, read bool) (kernels.Tensor, [][]float64, int, error) {
	ops, ds := p.d.Ops, p.ds
	b := len(s.cols)
	l := newDSparkInputs(ds, b)
	host := make([]int32, l.total)
	l.fill(host, s)
	ds.FillLayout(host[l.layout:], b)
	buf, err := kernels.FromI32(ops, host, l.total)
	if err != nil {
		return nil, nil, 0, err
	}
	v, err := l.views(ops, buf)
	if err != nil {
		return nil, nil, 0, err
	}
	pass := &models.DSparkPass{Last: v.last, Layout: v.layout}
	if pass.Feat, err = ops.Alloc(ops.ActivationDType(), b, ds.Config().TargetHiddenSize); err != nil {
		return nil, nil, 0, err
	}
	if err := gatherDSpark(ops, step, v, pass.Feat, s.fromDevice); err != nil {
		return nil, nil, 0, err
	}
	if pass.Tokens, err = ops.Alloc(kernels.I32, n*b); err != nil {
		return nil, nil, 0, err
	}
	gates := p.gates() && read
	if gates { // else the pass leaves the confidence head out
		if pass.Z, err = ops.Alloc(kernels.F32, n*b, 1); err != nil {
			return nil, nil, 0, err
		}
	}
	thr := p.d.Speculative.ConfidenceThreshold
	_, async := ops.(kernels.AsyncFetcher)
	if async || thr <= 0 || !gates {
		if err := ds.Queue(ctx, pass, n, nil); err != nil {
			return nil, nil, 0, err
		}
		if !gates {
			return pass.Tokens, nil, b, nil
		}
		conf, err := readConfidence(ops, ds, pass.Z, b, n)
		return pass.Tokens, conf, b, err
	}
	conf := make([][]float64, b)
	cum := make([]float64, b)
	for i := range cum {
		cum[i] = 1
	}
	err = ds.Queue(ctx, pass, n, func(j int) (bool, error) {
		zj, err := ops.Rows(pass.Z, j*b, (j+1)*b)
		if err != nil {
			return false, err
		}
		zs, err := kernels.ToF32(ops, zj)
		if err != nil {
			return false, err
		}
		live := false
		for i := range b {
			c := ds.Confidence(zs[i])
			conf[i] = append(conf[i], c)
			cum[i] *= c
			live = live || cum[i] >= thr
		}
		return !live, nil
	})
	return pass.Tokens, conf, b, err
}

// readConfidence reads the confidence logits z of n positions over stride
// rows (F32 [>= n*stride], position-major) and returns the confidences of
// the first b rows. Cost: one download.
func readConfidence(ops kernels.Ops, ds *models.DSpark, z kernels.Tensor, b, n int) ([][]float64, error) {
	stride := kernels.NumElements(z) / n
	zs, err := kernels.ToF32(ops, z)
	if err != nil {
		return nil, err
	}
	conf := make([][]float64, b)
	for i := range conf {
		conf[i] = make([]float64, n)
		for j := range n {
			conf[i][j] = ds.Confidence(zs[j*stride+i])
		}
	}
	return conf, nil
}

// Start captures the DSpark drafter's graphs when the engine runs decode
// steps on CUDA graphs (before the loop starts; see dsparkGraphs).
func (p *dsparkDrafter) Start(ctx context.Context) error {
	if p.ds == nil || !p.d.CUDAGraph.Enabled {
		return nil
	}
	var err error
	if p.graphs, err = newDSparkGraphs(ctx, p); err != nil {
		return fmt.Errorf("draft=dspark: cuda_graph: %w", err)
	}
	return nil
}

// Close releases the captured graphs.
func (p *dsparkDrafter) Close() error { return p.graphs.close() }

// dsparkGraphs holds the DSpark pass captured as CUDA graphs, one per
// size (the engine's decode graph sizes) and depth (1 to min(k, block
// size) positions), over static inputs: per size its input buffer (the
// step's rows, tokens and columns, then the pass's layout, uploaded once)
// and one buffer of features that all sizes share. A step whose drafting
// rows fit a size costs the host one upload (its rows, straight into the
// static inputs), from the device the two gathers of its rows and
// tokens, the gather of its features, one replay and, when the drafter
// gates, the read of the confidences (without gating the graphs leave the
// confidence head out); rows past the step's are padding (hidden row 0,
// token 0), which changes no real row.
type dsparkGraphs struct {
	ops   kernels.Ops
	gops  graphOps
	gates bool                // the drafter gates (dsparkDrafter.gates): the passes compute confidences
	feat  kernels.Tensor      // [largest size, target hidden]: the passes' features
	sizes []*dsparkSizeGraphs // ascending by size
}

// dsparkSizeGraphs are the graphs of one size.
type dsparkSizeGraphs struct {
	l      dsparkInputs
	inputs kernels.Tensor // I32 [l.total]
	views  dsparkViews
	feat   kernels.Tensor // the first size rows of the shared features
	depths []*dsparkGraph // depth j+1 at j
}

// dsparkGraph is the pass over its size's rows and depth positions.
type dsparkGraph struct {
	tokens, z kernels.Tensor // I32 [depth*size], F32 [depth*size, 1] (nil without gating): its static outputs
	graph     interface {
		Replay() error
		Close() error
	}
}

// newDSparkGraphs allocates the static inputs and captures the pass for
// each of the engine's graph sizes and each depth, each after one eager
// run over padding (which lets libraries initialize outside the capture).
// It runs before the step loop starts, when nothing else uses the
// backend's stream. Cost per graph: one run and one capture.
func newDSparkGraphs(ctx context.Context, p *dsparkDrafter) (*dsparkGraphs, error) {
	d, ds := p.d, p.ds
	gops, ok := d.Ops.(graphOps)
	if !ok {
		return nil, fmt.Errorf("backend %s cannot capture graphs", d.Ops.Name())
	}
	sizes := d.CUDAGraph.BatchSizes
	if len(sizes) == 0 {
		return nil, errors.New("no graph sizes")
	}
	ops := d.Ops
	g := &dsparkGraphs{ops: ops, gops: gops, gates: p.gates()}
	var err error
	if g.feat, err = ops.Alloc(ops.ActivationDType(), sizes[len(sizes)-1], ds.Config().TargetHiddenSize); err != nil {
		return nil, err
	}
	depth := min(d.Speculative.NumSpeculativeTokens, ds.BlockSize())
	for _, size := range sizes {
		sg, err := g.captureSize(ctx, ds, size, depth)
		if sg != nil {
			g.sizes = append(g.sizes, sg) // closed with the others, even when partial
		}
		if err != nil {
			g.close()
			return nil, fmt.Errorf("dspark pass of %d rows: %w", size, err)
		}
	}
	return g, nil
}

// captureSize uploads size's padding and layout and captures its graphs
// of depths 1..depth. On an error it returns the graphs captured so far
// (nil when none), for the caller to close.
func (g *dsparkGraphs) captureSize(ctx context.Context, ds *models.DSpark, size, depth int) (*dsparkSizeGraphs, error) {
	ops := g.ops
	sg := &dsparkSizeGraphs{l: newDSparkInputs(ds, size)}
	host := make([]int32, sg.l.total)
	sg.l.fill(host, nil)
	ds.FillLayout(host[sg.l.layout:], size)
	var err error
	if sg.inputs, err = kernels.FromI32(ops, host, sg.l.total); err != nil {
		return nil, err
	}
	if sg.views, err = sg.l.views(ops, sg.inputs); err != nil {
		return nil, err
	}
	if sg.feat, err = ops.Rows(g.feat, 0, size); err != nil {
		return nil, err
	}
	for n := 1; n <= depth; n++ {
		dg := &dsparkGraph{}
		if dg.tokens, err = ops.Alloc(kernels.I32, n*size); err != nil {
			return sg, err
		}
		if g.gates {
			if dg.z, err = ops.Alloc(kernels.F32, n*size, 1); err != nil {
				return sg, err
			}
		}
		pass := &models.DSparkPass{Feat: sg.feat, Last: sg.views.last, Layout: sg.views.layout, Tokens: dg.tokens, Z: dg.z}
		fn := func() error { return ds.Queue(ctx, pass, n, nil) }
		if err := fn(); err != nil {
			return sg, err
		}
		if err := ops.Sync(); err != nil {
			return sg, err
		}
		if dg.graph, err = g.gops.CaptureGraph(fn); err != nil {
			return sg, fmt.Errorf("depth %d: %w", n, err)
		}
		sg.depths = append(sg.depths, dg)
	}
	return sg, nil
}

// draft queues a drafting step of n positions on the graphs and returns
// its drafts (the graph's static output: valid until the drafter's next
// step is queued), the confidences of its rows (read when the graphs
// compute them and read is set, else nil) and the drafts' stride; ok
// false (nothing queued) when its rows fit no size.
func (g *dsparkGraphs) draft(step *SampledStep, s *dsparkPlan, n int, ds *models.DSpark, read bool) (kernels.Tensor, [][]float64, int, bool, error) {
	if g == nil {
		return nil, nil, 0, false, nil
	}
	var sg *dsparkSizeGraphs
	for _, c := range g.sizes {
		if c.l.size >= len(s.cols) {
			sg = c
			break
		}
	}
	if sg == nil || n > len(sg.depths) {
		return nil, nil, 0, false, nil
	}
	ops, l := g.ops, sg.l
	host := make([]int32, l.layout)
	l.fill(host, s)
	dst, err := ops.Rows(sg.inputs, 0, l.layout)
	if err == nil {
		err = ops.Upload(dst, kernels.I32Bytes(host), kernels.I32)
	}
	if err == nil {
		err = gatherDSpark(ops, step, sg.views, sg.feat, s.fromDevice)
	}
	dg := sg.depths[n-1]
	if err == nil {
		err = dg.graph.Replay()
	}
	var conf [][]float64
	if err == nil && g.gates && read {
		conf, err = readConfidence(ops, ds, dg.z, len(s.cols), n)
	}
	if err != nil {
		return nil, nil, 0, false, fmt.Errorf("dspark graphs: %w", err)
	}
	return dg.tokens, conf, l.size, true, nil
}

func (g *dsparkGraphs) close() error {
	if g == nil {
		return nil
	}
	var first error
	for _, sg := range g.sizes {
		for _, dg := range sg.depths {
			if err := dg.graph.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	g.sizes = nil
	return first
}
