package models

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/spec"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

const (
	dsparkTarget  = "../../assets/deepseek-tiny"
	dsparkDrafter = "../../assets/dspark-tiny"
)

// dsparkPrompts are the committed held-out prompts of the default model
// with their greedy continuations (transformers'; the engine's are the
// same, see cli's parity test): prompt ids then 64 greedy tokens.
func dsparkPrompts(t testing.TB) (seqs [][]int32, promptLen int) {
	t.Helper()
	data, err := os.ReadFile("../../testdata/deepseek-tiny/reference.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Greedy struct {
			Prompts []struct{ IDs, Greedy []int32 }
		}
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	for _, p := range ref.Greedy.Prompts {
		seqs = append(seqs, append(append([]int32{}, p.IDs...), p.Greedy...))
		promptLen = len(p.IDs)
	}
	return seqs, promptLen
}

// dsparkSetup loads the shipped target and drafter on the CPU and runs the
// target over seqs (one prefill each, in one batch): it returns the
// drafter and the target's hidden states, sequence i's at rows
// offsets[i]...
func dsparkSetup(t testing.TB, seqs [][]int32) (*DSpark, kernels.Tensor, []int) {
	t.Helper()
	ops := newBackend(t, 0)
	target, err := Builtin().Load(ops, dsparkTarget, Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := LoadDSpark(ops, dsparkDrafter, target)
	if err != nil {
		t.Fatal(err)
	}
	const blockSize = 16
	h := &HostBatch{BlockSize: blockSize}
	offsets, blocks := make([]int, len(seqs)), 0
	for i, s := range seqs {
		n := (len(s) + blockSize - 1) / blockSize
		table := make([]int32, n)
		for j := range table {
			table[j] = int32(blocks + j)
		}
		blocks += n
		if i > 0 {
			offsets[i] = offsets[i-1] + len(seqs[i-1])
		}
		h.AddSequence(s, 0, table)
	}
	cache, err := target.NewKVCache(blocks, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.Upload(ops, blocks)
	if err != nil {
		t.Fatal(err)
	}
	hidden, err := target.Forward(context.Background(), cache, b)
	if err != nil {
		t.Fatal(err)
	}
	return d, hidden, offsets
}

// anchor is one drafting point: sequence seq's token at position pos is
// the last one; the target's hidden state at pos-1 conditions the drafts.
type anchor struct{ seq, pos int }

func draftAnchors(t testing.TB, d *DSpark, hidden kernels.Tensor, seqs [][]int32, offsets []int, as []anchor, n int) *DSparkDrafts {
	t.Helper()
	rows, last := make([]int32, len(as)), make([]int32, len(as))
	for i, a := range as {
		rows[i], last[i] = int32(offsets[a.seq]+a.pos-1), seqs[a.seq][a.pos]
	}
	out, err := d.Draft(context.Background(), hidden, rows, last, n, 0)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The Go drafter reproduces the trained one: on the committed prompts, the
// drafts and confidences that the training script computed in float32
// with torch (testdata/dspark-tiny/reference.json) come out the same:
// tokens equal wherever torch's top-2 logit margin is clear, confidences
// within 5e-3 (the target's hidden states come from two implementations).
func TestDSparkReference(t *testing.T) {
	data, err := os.ReadFile("../../testdata/dspark-tiny/reference.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		BlockSize       int     `json:"block_size"`
		ConfidenceScale float64 `json:"confidence_scale"`
		ConfidenceBias  float64 `json:"confidence_bias"`
		Anchors         []struct {
			Prompt, Anchor int
			Drafts         []int
			Z, Margins     []float64
		}
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	seqs, _ := dsparkPrompts(t)
	d, hidden, offsets := dsparkSetup(t, seqs[:4])
	if d.BlockSize() != ref.BlockSize {
		t.Fatalf("block size %d, reference %d", d.BlockSize(), ref.BlockSize)
	}
	var as []anchor
	for _, a := range ref.Anchors {
		as = append(as, anchor{a.Prompt, a.Anchor})
	}
	got := draftAnchors(t, d, hidden, seqs, offsets, as, d.BlockSize())
	compared, worst := 0, 0.0
	for i, a := range ref.Anchors {
		for j := range a.Drafts {
			if got.Tokens[i][j] != a.Drafts[j] {
				if a.Margins[j] > 1e-2 {
					t.Errorf("prompt %d anchor %d position %d: draft %d, torch %d (margin %.3g)", a.Prompt, a.Anchor, j, got.Tokens[i][j], a.Drafts[j], a.Margins[j])
				}
				break // later positions follow another draft
			}
			want := 1 / (1 + math.Exp(-(ref.ConfidenceScale*a.Z[j] + ref.ConfidenceBias)))
			diff := math.Abs(got.Confidence[i][j] - want)
			worst = max(worst, diff)
			if diff > 5e-3 {
				t.Errorf("prompt %d anchor %d position %d: confidence %.5f, torch %.5f", a.Prompt, a.Anchor, j, got.Confidence[i][j], want)
			}
			compared++
		}
	}
	t.Logf("%d anchors, %d positions compared, largest confidence difference %.2g", len(ref.Anchors), compared, worst)
	if compared < len(ref.Anchors) {
		t.Errorf("only %d positions compared", compared)
	}
}

// The confidence head is calibrated on held-out prompts: over the 20
// committed prompts and their greedy continuations, at every position
// whose earlier drafts were all accepted (the positions gating looks
// at), the predicted acceptance matches the measured one within an
// expected calibration error (10 bins) below 0.05.
func TestDSparkCalibration(t *testing.T) {
	seqs, plen := dsparkPrompts(t)
	d, hidden, offsets := dsparkSetup(t, seqs)
	k := d.BlockSize()
	var as []anchor
	for s := range seqs {
		for p := plen; p+k < len(seqs[s]); p++ {
			as = append(as, anchor{s, p})
		}
	}
	got := draftAnchors(t, d, hidden, seqs, offsets, as, k)
	var pred []float64
	var hit []bool
	accepted := make([]int, k)
	for i, a := range as {
		for j := range k {
			ok := got.Tokens[i][j] == int(seqs[a.seq][a.pos+1+j])
			pred, hit = append(pred, got.Confidence[i][j]), append(hit, ok)
			if !ok {
				break
			}
			accepted[j]++
		}
	}
	table, ece := spec.Reliability(pred, hit, 10)
	for _, b := range table {
		if b.Count > 0 {
			t.Logf("[%.1f, %.1f): %5d predictions, predicted %.3f, measured %.3f", b.Lo, b.Hi, b.Count, b.Predicted, b.Measured)
		}
	}
	t.Logf("%d anchors, %d predictions, accepted per position %v, ECE %.4f", len(as), len(pred), accepted, ece)
	if ece >= 0.05 {
		t.Errorf("expected calibration error %.4f, want < 0.05", ece)
	}
	if float64(accepted[0]) < 0.5*float64(len(as)) {
		t.Errorf("first drafts accepted %d of %d times: the drafter hardly drafts", accepted[0], len(as))
	}
}

// A sequence's drafts and confidences are the same alone and in a batch
// (the CPU kernels are batch-invariant, and no row of the block reads
// another sequence's), and fewer positions are a prefix of more.
func TestDSparkBatchInvariant(t *testing.T) {
	seqs, plen := dsparkPrompts(t)
	seqs = seqs[:3]
	d, hidden, offsets := dsparkSetup(t, seqs)
	as := []anchor{{0, plen}, {1, plen + 5}, {2, plen + 20}, {0, plen + 40}}
	all := draftAnchors(t, d, hidden, seqs, offsets, as, d.BlockSize())
	for i, a := range as {
		one := draftAnchors(t, d, hidden, seqs, offsets, []anchor{a}, d.BlockSize())
		if !reflect.DeepEqual(one.Tokens[0], all.Tokens[i]) || !reflect.DeepEqual(one.Confidence[0], all.Confidence[i]) {
			t.Errorf("anchor %v: alone %v %v, in a batch %v %v", a, one.Tokens[0], one.Confidence[0], all.Tokens[i], all.Confidence[i])
		}
		short := draftAnchors(t, d, hidden, seqs, offsets, []anchor{a}, 2)
		if !reflect.DeepEqual(short.Tokens[0], all.Tokens[i][:2]) || !reflect.DeepEqual(short.Confidence[0], all.Confidence[i][:2]) {
			t.Errorf("anchor %v: 2 drafts %v, a prefix of %v expected", a, short.Tokens[0], all.Tokens[i])
		}
	}
	// Stopping below a cumulative confidence drafts a prefix of the full
	// drafts, no shorter than what gating at that threshold keeps.
	for _, c := range []float64{0.3, 0.9} {
		rows, last := make([]int32, len(as)), make([]int32, len(as))
		for i, a := range as {
			rows[i], last[i] = int32(offsets[a.seq]+a.pos-1), seqs[a.seq][a.pos]
		}
		got, err := d.Draft(context.Background(), hidden, rows, last, d.BlockSize(), c)
		if err != nil {
			t.Fatal(err)
		}
		for i := range as {
			n := len(got.Tokens[i])
			if !reflect.DeepEqual(got.Tokens[i], all.Tokens[i][:n]) || !reflect.DeepEqual(got.Confidence[i], all.Confidence[i][:n]) {
				t.Errorf("stop below %g: %v, not a prefix of %v", c, got.Tokens[i], all.Tokens[i])
			}
			if keep := spec.GatePrefix(all.Confidence[i], c); n < keep {
				t.Errorf("stop below %g: %d drafts, gating keeps %d", c, n, keep)
			}
		}
	}
	if out, err := d.Draft(context.Background(), hidden, []int32{0}, []int32{1}, d.BlockSize()+1, 0); err == nil || !errors.Is(err, ErrBatch) {
		t.Errorf("more drafts than the block: %v, %v", out, err)
	}
}

// A drafter whose config does not fit the target is refused by name.
func TestDSparkConfigErrors(t *testing.T) {
	ops := newBackend(t, 1)
	target, err := Builtin().Load(ops, dsparkTarget, Options{})
	if err != nil {
		t.Fatal(err)
	}
	base, err := ReadDSparkConfig(dsparkDrafter)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(*DSparkConfig)
		want error
	}{
		{"architecture", func(c *DSparkConfig) { c.Architectures = []string{"Other"} }, ErrUnknownArchitecture},
		{"hidden size", func(c *DSparkConfig) { c.TargetHiddenSize = 128 }, ErrConfig},
		{"vocabulary", func(c *DSparkConfig) { c.VocabSize = 100 }, ErrConfig},
		{"target layers", func(c *DSparkConfig) { c.TargetLayerIDs = []int{2, 5} }, ErrConfig},
		{"block size", func(c *DSparkConfig) { c.BlockSize = 0 }, ErrConfig},
	} {
		cfg := *base
		c.edit(&cfg)
		if _, err := NewDSpark(ops, &cfg, MemWeights{}, target); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	cfg := *base
	cfg.IntermediateSize++
	if _, err := NewDSpark(ops, &cfg, mustOpen(t, filepath.Join(dsparkDrafter, "model.safetensors")), target); !errors.Is(err, ErrWeights) {
		t.Errorf("wrong intermediate size: %v, want ErrWeights", err)
	}
}

func mustOpen(t testing.TB, path string) *weights.File {
	t.Helper()
	f, err := weights.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// chainedOps is a backend that says it computes asynchronously
// (kernels.AsyncFetcher), so that DSpark chains its positions on the
// "device" and reads them once at the end.
type chainedOps struct{ kernels.Ops }

func (c chainedOps) FetchI32Async(t kernels.Tensor) (func() ([]int32, error), error) {
	got, err := kernels.ToI32(c.Ops, t)
	return func() ([]int32, error) { return got, err }, nil
}

// Chaining the Markov positions on the device with one read at the end
// drafts what reading each position at once drafts, early stop included.
func TestDSparkChainedPositions(t *testing.T) {
	seqs, plen := dsparkPrompts(t)
	seqs = seqs[:2]
	d, hidden, offsets := dsparkSetup(t, seqs)
	rows := []int32{int32(offsets[0] + plen - 1), int32(offsets[1] + plen + 9)}
	last := []int32{seqs[0][plen], seqs[1][plen+10]}
	for _, c := range []float64{0, 0.5, 0.95} {
		want, err := d.Draft(context.Background(), hidden, rows, last, d.BlockSize(), c)
		if err != nil {
			t.Fatal(err)
		}
		chained := *d
		chained.ops = chainedOps{d.ops}
		got, err := chained.Draft(context.Background(), hidden, rows, last, d.BlockSize(), c)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("stop below %g: chained %v %v, read each position %v %v", c, got.Tokens, got.Confidence, want.Tokens, want.Confidence)
		}
	}
}

// queuePass runs Queue over the hidden rows rows and tokens last, as a
// caller with its own buffers does (graphs), and reads the drafts and
// confidence logits back.
func queuePass(t *testing.T, d *DSpark, hidden kernels.Tensor, rows, last []int32, n int) ([]int32, []float32) {
	return queuePassZ(t, d, hidden, rows, last, n, true)
}

// queuePassZ is queuePass, with the confidence head only when withZ (nil
// confidences otherwise).
func queuePassZ(t *testing.T, d *DSpark, hidden kernels.Tensor, rows, last []int32, n int, withZ bool) ([]int32, []float32) {
	t.Helper()
	ops, b := d.ops, len(rows)
	layout := make([]int32, d.LayoutSize(b))
	d.FillLayout(layout, b)
	ts, err := uploadI32(ops, [][]int32{rows, last, layout})
	if err != nil {
		t.Fatal(err)
	}
	p := &DSparkPass{Last: ts[1], Layout: ts[2]}
	var errs []error
	alloc := func(dt kernels.DType, shape ...int) kernels.Tensor {
		x, err := ops.Alloc(dt, shape...)
		errs = append(errs, err)
		return x
	}
	p.Feat, p.Tokens = alloc(ops.ActivationDType(), b, d.cfg.TargetHiddenSize), alloc(kernels.I32, n*b)
	if withZ {
		p.Z = alloc(kernels.F32, n*b, 1)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := ops.Embedding(p.Feat, hidden, ts[0]); err != nil {
		t.Fatal(err)
	}
	if err := d.Queue(context.Background(), p, n, nil); err != nil {
		t.Fatal(err)
	}
	tokens, err := kernels.ToI32(ops, p.Tokens)
	if err != nil {
		t.Fatal(err)
	}
	if !withZ {
		return tokens, nil
	}
	z, err := kernels.ToF32(ops, p.Z)
	if err != nil {
		t.Fatal(err)
	}
	return tokens, z
}

// A pass queued over a caller's buffers (as a CUDA graph replays it)
// drafts what Draft drafts, with or without its confidence head, and rows
// of padding after the real ones
// (hidden row 0, token 0, as the graphs pad) change none of the real
// rows' drafts or confidence logits.
func TestDSparkQueuePadding(t *testing.T) {
	seqs, plen := dsparkPrompts(t)
	seqs = seqs[:2]
	d, hidden, offsets := dsparkSetup(t, seqs)
	rows := []int32{int32(offsets[0] + plen - 1), int32(offsets[1] + plen + 9), int32(offsets[0] + plen + 30)}
	last := []int32{seqs[0][plen], seqs[1][plen+10], seqs[0][plen+31]}
	k, b := d.BlockSize(), len(rows)
	want, err := d.Draft(context.Background(), hidden, rows, last, k, 0)
	if err != nil {
		t.Fatal(err)
	}
	tokens, z := queuePass(t, d, hidden, rows, last, k)
	for s := range b {
		for j := range k {
			if int(tokens[j*b+s]) != want.Tokens[s][j] || d.Confidence(z[j*b+s]) != want.Confidence[s][j] {
				t.Errorf("row %d position %d: queued %d (%g), Draft %d (%g)", s, j, tokens[j*b+s], d.Confidence(z[j*b+s]), want.Tokens[s][j], want.Confidence[s][j])
			}
		}
	}
	// Without the confidence head (a caller that does not gate): the same
	// drafts.
	if noZ, _ := queuePassZ(t, d, hidden, rows, last, k, false); !slices.Equal(noZ, tokens) {
		t.Errorf("without confidences: drafts %v, with them %v", noZ, tokens)
	}
	const pad = 5
	pr, pl := append(slices.Clone(rows), make([]int32, pad)...), append(slices.Clone(last), make([]int32, pad)...)
	ptok, pz := queuePass(t, d, hidden, pr, pl, k)
	for s := range b {
		for j := range k {
			if ptok[j*(b+pad)+s] != tokens[j*b+s] || pz[j*(b+pad)+s] != z[j*b+s] {
				t.Errorf("row %d position %d: padded %d %g, alone %d %g", s, j, ptok[j*(b+pad)+s], pz[j*(b+pad)+s], tokens[j*b+s], z[j*b+s])
			}
		}
	}
}

// Queue refuses buffers that do not fit its rows and positions, and stops
// where after says.
func TestDSparkQueueArgs(t *testing.T) {
	seqs, plen := dsparkPrompts(t)
	d, hidden, _ := dsparkSetup(t, seqs[:1])
	ops, k := d.ops, d.BlockSize()
	const b = 2
	layout := make([]int32, d.LayoutSize(b))
	d.FillLayout(layout, b)
	ts, err := uploadI32(ops, [][]int32{{int32(plen - 1), int32(plen)}, {seqs[0][plen], seqs[0][plen+1]}, layout})
	if err != nil {
		t.Fatal(err)
	}
	feat, _ := ops.Alloc(ops.ActivationDType(), b, d.cfg.TargetHiddenSize)
	if err := ops.Embedding(feat, hidden, ts[0]); err != nil {
		t.Fatal(err)
	}
	tokens, _ := ops.Alloc(kernels.I32, k*b)
	z, _ := ops.Alloc(kernels.F32, k*b, 1)
	short, _ := ops.Alloc(kernels.F32, k*b-1, 1)
	good := DSparkPass{Feat: feat, Last: ts[1], Layout: ts[2], Tokens: tokens, Z: z}
	for _, c := range []struct {
		name string
		edit func(*DSparkPass)
		n    int
	}{
		{"positions past the block", func(*DSparkPass) {}, k + 1},
		{"no features", func(p *DSparkPass) { p.Feat = nil }, k},
		{"features of other rows", func(p *DSparkPass) { p.Feat = hidden }, k},
		{"layout of other rows", func(p *DSparkPass) { p.Layout = ts[0] }, k},
		{"short confidences", func(p *DSparkPass) { p.Z = short }, k},
	} {
		p := good
		c.edit(&p)
		if err := d.Queue(context.Background(), &p, c.n, nil); !errors.Is(err, ErrBatch) {
			t.Errorf("%s: %v, want ErrBatch", c.name, err)
		}
	}
	var seen []int
	p := good
	if err := d.Queue(context.Background(), &p, k, func(j int) (bool, error) {
		seen = append(seen, j)
		return j == 1, nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, []int{0, 1}) {
		t.Errorf("after saw positions %v, want [0 1]", seen)
	}
}

// The precomputed Markov table drafts what computing each position's
// correction drafts, bit for bit (the CPU kernels are batch-invariant),
// with the confidence head per position (Draft) and once per pass (Queue).
func TestDSparkMarkovTable(t *testing.T) {
	seqs, plen := dsparkPrompts(t)
	seqs = seqs[:3]
	d, hidden, offsets := dsparkSetup(t, seqs)
	if d.markovTable == nil {
		t.Fatalf("the shipped drafter (vocabulary %d, hidden %d) has no Markov table", d.cfg.VocabSize, d.cfg.HiddenSize)
	}
	computed := *d
	computed.markovTable = nil
	as := []anchor{{0, plen}, {1, plen + 5}, {2, plen + 20}, {0, plen + 40}}
	rows, last := make([]int32, len(as)), make([]int32, len(as))
	for i, a := range as {
		rows[i], last[i] = int32(offsets[a.seq]+a.pos-1), seqs[a.seq][a.pos]
	}
	for _, c := range []float64{0, 0.5} {
		want, err := computed.Draft(context.Background(), hidden, rows, last, d.BlockSize(), c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.Draft(context.Background(), hidden, rows, last, d.BlockSize(), c)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("stop below %g: with the table %v %v, computed %v %v", c, got.Tokens, got.Confidence, want.Tokens, want.Confidence)
		}
	}
	wantTok, wantZ := queuePass(t, &computed, hidden, rows, last, d.BlockSize())
	gotTok, gotZ := queuePass(t, d, hidden, rows, last, d.BlockSize())
	if !slices.Equal(gotTok, wantTok) || !slices.Equal(gotZ, wantZ) {
		t.Errorf("queued: with the table %v %v, computed %v %v", gotTok, gotZ, wantTok, wantZ)
	}
}
