package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

func newQuantWeight(t testing.TB, ops kernels.Ops, w kernels.QuantWeight) kernels.Tensor {
	t.Helper()
	q, ok := ops.(kernels.QuantWeighter)
	if !ok {
		t.Fatalf("%s has no block-quantized weights", ops.Name())
	}
	ten, err := q.QuantWeight(w)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}

// quantCases are the weights of the linear tests: each format alone (Q8_0
// and Q4_0 with rows of 3 and 5 blocks, which the device pads to 16 bytes),
// and fused weights mixing formats as llama.cpp's Q4_K_M does (q/k in Q4_K,
// v in Q6_K) and more.
var quantCases = []struct {
	name  string
	types []kernels.QuantType
	rows  []int
	k     int
}{
	{"q8_0", []kernels.QuantType{kernels.QuantQ8_0}, []int{70}, 96},
	{"q4_0", []kernels.QuantType{kernels.QuantQ4_0}, []int{33}, 160},
	{"q4_k", []kernels.QuantType{kernels.QuantQ4_K}, []int{130}, 512},
	{"q5_k", []kernels.QuantType{kernels.QuantQ5_K}, []int{40}, 256},
	{"q6_k", []kernels.QuantType{kernels.QuantQ6_K}, []int{41}, 768},
	{"q4_k+q6_k", []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ4_K, kernels.QuantQ6_K}, []int{64, 32, 150}, 256},
	{"q6_k+q4_k+q5_k+q8_0", []kernels.QuantType{kernels.QuantQ6_K, kernels.QuantQ4_K, kernels.QuantQ5_K, kernels.QuantQ8_0}, []int{5, 70, 3, 9}, 256},
}

// linearBounds are, per output (r, j), sum_c |x_c w_c| and sum_c |x_c| max_c
// |w_c| (the second covers the GEMV's one rounding of d sc q - dmin m where
// ggml rounds twice: within an ulp of |d sc q| <= 2 max |w|).
func linearBounds(x, deq []float32, m, n, k int) (abs, xw []float64) {
	abs, xw = make([]float64, m*n), make([]float64, m*n)
	wmax := make([]float64, n)
	for j := range n {
		for _, v := range deq[j*k : (j+1)*k] {
			wmax[j] = math.Max(wmax[j], math.Abs(float64(v)))
		}
	}
	for r := range m {
		row := x[r*k : (r+1)*k]
		var xs float64
		for _, v := range row {
			xs += math.Abs(float64(v))
		}
		for j := range n {
			var a float64
			for c, v := range row {
				a += math.Abs(float64(v) * float64(deq[j*k+c]))
			}
			abs[r*n+j], xw[r*n+j] = a, xs*wmax[j]
		}
	}
	return abs, xw
}

// TestGPUQuantLinear compares Linear over block-quantized weights with the
// CPU backend (x times the dequantized weight, float32) at 1, 3, 8, 64 and
// 300 rows, on every path, in both GEMM modes:
//   - GEMV (float32 activations; auto up to 2 rows) and the GEMM of GEMM
//     mode split (the weight dequantized to float32, cuBLAS SGEMM): float32
//     rounding only, |gpu - cpu| <= 1e-4 sum|x w| + 2^-20 sum|x| max|w|;
//   - the GEMM of GEMM mode round (weights and x rounded to BF16): each
//     product off by at most 2^-7 relative, |gpu - cpu| <= (2^-7 + 1e-4)
//     sum|x w| + 2^-20 sum|x| max|w|.
func TestGPUQuantLinear(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode)
		for _, qc := range quantCases {
			n := 0
			for _, rr := range qc.rows {
				n += rr
			}
			w, deq := randQuantWeight(p.r, []int{n, qc.k}, qc.types, qc.rows, 0.1)
			wc, wg := newQuantWeight(t, p.c, w), newQuantWeight(t, p.g, w)
			for _, m := range []int{1, 3, 8, 64, 300} {
				xs := randVals(p.r, m*qc.k, 1)
				x := p.put(kernels.F32, xs, m, qc.k)
				bias := p.rand(kernels.F32, 0.1, n)
				out := p.zeros(kernels.F32, m, n)
				if err := p.c.Linear(out.c, x.c, wc, bias.c); err != nil {
					t.Fatal(err)
				}
				cpu := p.f32(p.c, out.c)
				abs, xw := linearBounds(xs, deq, m, n, qc.k)
				for _, path := range []quantPath{quantAuto, quantGEMV, quantGEMM} {
					name := fmt.Sprintf("%s/%s/n=%d/k=%d/m=%d/path=%d", mode, qc.name, n, qc.k, m, path)
					p.poison(out)
					var err error
					if path == quantAuto {
						err = p.g.Linear(out.g, x.g, wg, bias.g)
					} else {
						err = p.g.linearQuantPath(out.g, x.g, wg, bias.g, path)
					}
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					got := p.f32(p.g, out.g)
					rounded := mode == GEMMRound && (path == quantGEMM || (path == quantAuto && m > 2))
					rel := 1e-4
					if rounded {
						rel += 1.0 / 128
					}
					var worst float64
					for i := range got {
						g, c := float64(got[i]), float64(cpu[i])
						if math.IsNaN(g) {
							t.Fatalf("%s: out[%d][%d] not written", name, i/n, i%n)
						}
						d := math.Abs(g - c)
						if bound := rel*abs[i] + xw[i]/(1<<20) + 1e-6; d > bound {
							t.Fatalf("%s: out[%d][%d] = %v, cpu %v: |diff| %.3g > %.3g", name, i/n, i%n, g, c, d, bound)
						}
						worst = max(worst, d/(abs[i]+1e-30))
					}
					t.Logf("%s: bf16 rounding %v, max |gpu - cpu| / sum|x w| = %.3g", name, rounded, worst)
				}
			}
		}
	}
}

// TestGPUQuantInvariance: on the GEMV a row's bits are the same alone and
// among 3, 8 (one launch of each row count the GEMV takes) and 64 rows,
// for each format and a fused weight of several.
func TestGPUQuantInvariance(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(3, 9))
	for _, qc := range quantCases {
		n := 0
		for _, rr := range qc.rows {
			n += rr
		}
		qw, _ := randQuantWeight(r, []int{n, qc.k}, qc.types, qc.rows, 0.1)
		w := newQuantWeight(t, g, qw)
		for _, rows := range []int{3, 8, 64} {
			x := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, rows*qc.k, 1)), kernels.F32, rows, qc.k)
			all, _ := g.Alloc(kernels.F32, rows, n)
			if err := g.linearQuantPath(all, x, w, nil, quantGEMV); err != nil {
				t.Fatal(err)
			}
			want, err := kernels.ToF32(g, all)
			if err != nil {
				t.Fatal(err)
			}
			for _, row := range []int{0, 1, rows - 1} {
				xr, _ := g.Rows(x, row, row+1)
				one, _ := g.Alloc(kernels.F32, 1, n)
				if err := g.Linear(one, xr, w, nil); err != nil {
					t.Fatal(err)
				}
				got, err := kernels.ToF32(g, one)
				if err != nil {
					t.Fatal(err)
				}
				for j := range n {
					if math.Float32bits(got[j]) != math.Float32bits(want[row*n+j]) {
						t.Fatalf("%s: row %d of %d: out[%d] = %v alone, %v in the batch", qc.name, row, rows, j, got[j], want[row*n+j])
					}
				}
			}
		}
	}
	t.Log("quant GEMV: rows alone bit-identical to the same rows among 3, 8 and 64")
}

// TestGPUQuantEmbeddingLogits: Embedding from a block-quantized table
// gives ggml's dequantized rows bit for bit (an id outside the table:
// ErrOutOfRange at the next Sync); Logits with a block-quantized head
// (gathered rows, with and without the norm) agrees with the CPU within
// the GEMV's float32 rounding (1e-5 of the largest logit), and a row
// outside hidden is reported by the next Sync.
func TestGPUQuantEmbeddingLogits(t *testing.T) {
	p := newPair(t, GEMMRound)
	const vocab, hidden = 300, 512
	w, deq := randQuantWeight(p.r, []int{vocab, hidden}, []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ6_K, kernels.QuantQ8_0,
		kernels.QuantQ5_K, kernels.QuantQ4_0}, []int{100, 90, 50, 40, 20}, 0.1)
	tc, tg := newQuantWeight(t, p.c, w), newQuantWeight(t, p.g, w)
	ids := []int32{0, 299, 99, 100, 189, 190, 239, 240, 279, 280, 7}
	id := p.ints(ids, len(ids))
	out := p.zeros(kernels.F32, len(ids), hidden)
	p.poison(out)
	if err := p.g.Embedding(out.g, tg, id.g); err != nil {
		t.Fatal(err)
	}
	if err := p.c.Embedding(out.c, tc, id.c); err != nil {
		t.Fatal(err)
	}
	got := p.f32(p.g, out.g)
	for i, v := range ids {
		for c := range hidden {
			if want := deq[int(v)*hidden+c]; math.Float32bits(got[i*hidden+c]) != math.Float32bits(want) {
				t.Fatalf("embedding row %d (id %d) [%d] = %v, dequantized %v", i, v, c, got[i*hidden+c], want)
			}
		}
	}
	p.check("quant embedding against the CPU", out, 0)
	bad := p.ints([]int32{3, vocab}, 2)
	if err := p.g.Embedding(p.zeros(kernels.F32, 2, hidden).g, tg, bad.g); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Sync(); !errors.Is(err, kernels.ErrOutOfRange) {
		t.Fatalf("embedding id %d of %d: Sync = %v, want ErrOutOfRange", vocab, vocab, err)
	}

	const tokens = 9
	h := p.rand(kernels.F32, 1, tokens, hidden)
	norm := p.rand(kernels.F32, 1, hidden)
	for _, c := range []struct {
		name string
		rows []int32
		norm bool
	}{{"all rows, no norm", nil, false}, {"three rows, norm", []int32{8, 0, 4}, true}, {"one row, norm", []int32{5}, true},
		{"nine rows, norm (GEMM)", []int32{0, 1, 2, 3, 4, 5, 6, 7, 8}, true}} {
		r := len(c.rows)
		var rs dual
		if r == 0 {
			r = tokens
		} else {
			rs = p.ints(c.rows, r)
		}
		var nw dual
		if c.norm {
			nw = norm
		}
		lg := p.zeros(kernels.F32, r, vocab)
		p.poison(lg)
		if err := p.c.Logits(lg.c, h.c, rs.c, nw.c, tc, 1e-6); err != nil {
			t.Fatal(err)
		}
		if err := p.g.Logits(lg.g, h.g, rs.g, nw.g, tg, 1e-6); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		tol := 1e-5
		if r > 2 { // the GEMM: weights and activations rounded to BF16
			tol = 2e-2
		}
		e := p.check("quant logits "+c.name, lg, tol)
		t.Logf("quant logits %s: max |gpu - cpu| / max |cpu| = %.3g", c.name, e)
	}
	badRows := p.ints([]int32{1, tokens}, 2)
	if err := p.g.Logits(p.zeros(kernels.F32, 2, vocab).g, h.g, badRows.g, norm.g, tg, 1e-6); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Sync(); !errors.Is(err, kernels.ErrOutOfRange) {
		t.Fatalf("logits row %d of %d: Sync = %v, want ErrOutOfRange", tokens, tokens, err)
	}
}

// TestGPUQuantViews: Linear over Rows (and Reshape) views of stacked
// block-quantized experts of mixed formats, and Embedding from a Rows view,
// take each row's own format and blocks, as the CPU backend does.
func TestGPUQuantViews(t *testing.T) {
	p := newPair(t, GEMMRound)
	const experts, n, k = 3, 40, 256
	w, _ := randQuantWeight(p.r, []int{experts, n, k}, []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ6_K, kernels.QuantQ8_0},
		[]int{50, 45, 25}, 0.1)
	wc, wg := newQuantWeight(t, p.c, w), newQuantWeight(t, p.g, w)
	x := p.rand(kernels.F32, 1, 2, k)
	for e := range experts {
		vc, err := p.c.Rows(wc, e, e+1)
		if err != nil {
			t.Fatal(err)
		}
		vg, err := p.g.Rows(wg, e, e+1)
		if err != nil {
			t.Fatal(err)
		}
		rc, _ := p.c.Reshape(vc, n, k)
		rg, err := p.g.Reshape(vg, n, k)
		if err != nil {
			t.Fatal(err)
		}
		out := p.zeros(kernels.F32, 2, n)
		if err := p.c.Linear(out.c, x.c, rc, nil); err != nil {
			t.Fatal(err)
		}
		if err := p.g.Linear(out.g, x.g, rg, nil); err != nil {
			t.Fatalf("expert %d: %v", e, err)
		}
		p.check(fmt.Sprintf("quant linear of expert %d's rows view", e), out, 1e-5)
	}
	flat := func(ops kernels.Ops, w kernels.Tensor) kernels.Tensor {
		f, err := ops.Reshape(w, experts*n, k)
		if err != nil {
			t.Fatal(err)
		}
		v, err := ops.Rows(f, 43, 97) // across the Q4_K / Q6_K / Q8_0 boundaries
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tab := dual{flat(p.c, wc), flat(p.g, wg)}
	id := p.ints([]int32{0, 6, 7, 51, 52, 53}, 6)
	out := p.zeros(kernels.F32, 6, k)
	if err := p.c.Embedding(out.c, tab.c, id.c); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Embedding(out.g, tab.g, id.g); err != nil {
		t.Fatal(err)
	}
	p.check("quant embedding from a rows view", out, 0)
	lin := p.zeros(kernels.F32, 2, 54)
	if err := p.c.Linear(lin.c, x.c, tab.c, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Linear(lin.g, x.g, tab.g, nil); err != nil {
		t.Fatal(err)
	}
	p.check("quant linear of rows 43..97", lin, 1e-5)
	if _, err := p.g.Reshape(wg, experts*n*2, k/2); !errors.Is(err, kernels.ErrShape) {
		t.Fatalf("reshape changing the rows' length: %v, want ErrShape", err)
	}
}

// TestGPUQuantMoE compares MoE over block-quantized experts (gate and up
// of different formats in one fused weight, as a Q4_K_M file may have
// them) with the CPU backend (max |diff| <= 1e-4 max |cpu|: the GEMV's
// float32 rounding), at 1, 7 and 600 tokens (1200 pairs: two chunks),
// checks that a token's bits do not depend on the batch, that a captured
// graph replays the eager bits, and that an id outside the experts is
// reported by the next Sync.
func TestGPUQuantMoE(t *testing.T) {
	p := newPair(t, GEMMRound)
	const experts, topK, hidden, inter = 4, 2, 256, 256
	var types []kernels.QuantType
	var rows []int
	for range experts {
		types = append(types, kernels.QuantQ4_K, kernels.QuantQ6_K)
		rows = append(rows, inter, inter)
	}
	guW, _ := randQuantWeight(p.r, []int{experts, 2 * inter, hidden}, types, rows, 0.1)
	dnW, _ := randQuantWeight(p.r, []int{experts, hidden, inter}, []kernels.QuantType{kernels.QuantQ8_0, kernels.QuantQ5_K},
		[]int{2 * hidden, 2 * hidden}, 0.1)
	gu := dual{newQuantWeight(t, p.c, guW), newQuantWeight(t, p.g, guW)}
	dn := dual{newQuantWeight(t, p.c, dnW), newQuantWeight(t, p.g, dnW)}
	problem := func(tokens int) (x, ids, w, out dual) {
		idv := make([]int32, tokens*topK)
		for tk := range tokens {
			perm := p.r.Perm(experts)
			for k := range topK {
				idv[tk*topK+k] = int32(perm[k])
			}
		}
		return p.rand(kernels.F32, 1, tokens, hidden), p.ints(idv, tokens, topK), p.rand(kernels.F32, 1, tokens, topK),
			p.zeros(kernels.F32, tokens, hidden)
	}
	for _, tokens := range []int{1, 7, 600} {
		x, ids, w, out := problem(tokens)
		if err := p.c.MoE(out.c, x.c, ids.c, w.c, gu.c, dn.c); err != nil {
			t.Fatal(err)
		}
		p.poison(out)
		if err := p.g.MoE(out.g, x.g, ids.g, w.g, gu.g, dn.g); err != nil {
			t.Fatalf("tokens=%d: %v", tokens, err)
		}
		e := p.check(fmt.Sprintf("quant moe, %d tokens", tokens), out, 1e-4)
		t.Logf("quant moe %d tokens: max |gpu - cpu| / max |cpu| = %.3g", tokens, e)
		if tokens < 7 {
			continue
		}
		got := p.f32(p.g, out.g)
		for _, tk := range []int{3, tokens - 1} {
			xt, _ := p.g.Rows(x.g, tk, tk+1)
			it, _ := p.g.Rows(ids.g, tk, tk+1)
			wt, _ := p.g.Rows(w.g, tk, tk+1)
			ot, _ := p.g.Alloc(kernels.F32, 1, hidden)
			if err := p.g.MoE(ot, xt, it, wt, gu.g, dn.g); err != nil {
				t.Fatal(err)
			}
			alone := p.f32(p.g, ot)
			for j := range hidden {
				if math.Float32bits(alone[j]) != math.Float32bits(got[tk*hidden+j]) {
					t.Fatalf("tokens=%d: token %d alone out[%d] = %v, in the batch %v", tokens, tk, j, alone[j], got[tk*hidden+j])
				}
			}
		}
	}
	x, ids, w, out := problem(4)
	if err := p.g.MoE(out.g, x.g, ids.g, w.g, gu.g, dn.g); err != nil {
		t.Fatal(err)
	}
	eager := p.f32(p.g, out.g)
	p.poison(out)
	graph, err := p.g.CaptureGraph(func() error { return p.g.MoE(out.g, x.g, ids.g, w.g, gu.g, dn.g) })
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	if err := graph.Replay(); err != nil {
		t.Fatal(err)
	}
	replayed := p.f32(p.g, out.g)
	for j := range eager {
		if math.Float32bits(eager[j]) != math.Float32bits(replayed[j]) {
			t.Fatalf("graph replay out[%d] = %v, eager %v", j, replayed[j], eager[j])
		}
	}
	bad := p.ints([]int32{0, experts}, 1, topK)
	x1, _ := p.g.Rows(x.g, 0, 1)
	w1, _ := p.g.Rows(w.g, 0, 1)
	o1, _ := p.g.Alloc(kernels.F32, 1, hidden)
	if err := p.g.MoE(o1, x1, bad.g, w1, gu.g, dn.g); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Sync(); !errors.Is(err, kernels.ErrOutOfRange) {
		t.Fatalf("expert id %d of %d: Sync = %v, want ErrOutOfRange", experts, experts, err)
	}
	// One projection block-quantized, the other dense: refused, as the CPU
	// backend refuses it (the dense one's dtype is named).
	dense := p.rand(kernels.F32, 0.1, experts, hidden, inter)
	errG := p.g.MoE(out.g, x.g, ids.g, w.g, gu.g, dense.g)
	errC := p.c.MoE(out.c, x.c, ids.c, w.c, gu.c, dense.c)
	if !errors.Is(errG, kernels.ErrDType) || !errors.Is(errC, kernels.ErrDType) {
		t.Fatalf("block-quantized gate_up with a dense down: cuda %v, cpu %v; want ErrDType from both", errG, errC)
	}
}

// TestGPUQuantMLA: MLAAttention with a block-quantized wkvb computes with
// its dequantized values: bit for bit the call with a float32 wkvb holding
// ggml's dequantization, and within 2e-5 of the CPU backend.
func TestGPUQuantMLA(t *testing.T) {
	p := newPair(t, GEMMRound)
	mp := kernels.MLAParams{NumHeads: 4, NopeDim: 32, RopeDim: 16, KVLoraRank: 256, VHeadDim: 32}
	mp.Scale = float32(1 / math.Sqrt(float64(mp.NopeDim+mp.RopeDim)))
	const blockSize, numBlocks = 16, 40
	b := p.pagedBatch(blockSize, numBlocks, [][2]int{{5, 5}, {1, 37}, {3, 20}})
	rows := mp.NumHeads * (mp.NopeDim + mp.VHeadDim)
	qw, deq := randQuantWeight(p.r, []int{rows, mp.KVLoraRank}, []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ8_0}, []int{rows / 2, rows / 2}, 0.2)
	w := dual{newQuantWeight(t, p.c, qw), newQuantWeight(t, p.g, qw)}
	wf := p.put(kernels.F32, deq, rows, mp.KVLoraRank)
	cache := p.rand(kernels.F32, 1, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
	q := p.rand(kernels.F32, 1, b.numTokens, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
	out := p.zeros(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
	ref, _ := p.g.Alloc(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
	if err := p.g.MLAAttention(ref, q.g, cache.g, wf.g, &b.gpuMeta, mp); err != nil {
		t.Fatal(err)
	}
	p.poison(out)
	if err := p.g.MLAAttention(out.g, q.g, cache.g, w.g, &b.gpuMeta, mp); err != nil {
		t.Fatal(err)
	}
	if err := p.c.MLAAttention(out.c, q.c, cache.c, w.c, &b.cpuMeta, mp); err != nil {
		t.Fatal(err)
	}
	got, want := p.f32(p.g, out.g), p.f32(p.g, ref)
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("out[%d] = %v with the block-quantized wkvb, %v with its float32 dequantization", i, got[i], want[i])
		}
	}
	p.check("quant mla_attention", out, 2e-5)
}

// TestGPUQuantOps: GatedMLP with block-quantized weights runs its linears
// (agreeing with the CPU in GEMM mode split, whose dequantizing GEMM is
// float32), x of a 16-bit dtype with a block-quantized weight is refused
// as on the CPU (ErrDType), and Alloc refuses the dtype.
func TestGPUQuantOps(t *testing.T) {
	p := newPair(t, GEMMSplit)
	const rows, hidden, inter = 5, 256, 512
	guW, _ := randQuantWeight(p.r, []int{2 * inter, hidden}, []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ6_K}, []int{inter, inter}, 0.1)
	dnW, _ := randQuantWeight(p.r, []int{hidden, inter}, []kernels.QuantType{kernels.QuantQ6_K}, []int{hidden}, 0.1)
	gu := dual{newQuantWeight(t, p.c, guW), newQuantWeight(t, p.g, guW)}
	dn := dual{newQuantWeight(t, p.c, dnW), newQuantWeight(t, p.g, dnW)}
	x := p.rand(kernels.F32, 1, rows, hidden)
	g, a, out := p.zeros(kernels.F32, rows, 2*inter), p.zeros(kernels.F32, rows, inter), p.zeros(kernels.F32, rows, hidden)
	mlp := func(ops kernels.Ops, out, x, gu, dn, g, a kernels.Tensor) error {
		if m, ok := ops.(kernels.GatedMLPer); ok {
			return m.GatedMLP(out, x, gu, dn, g, a)
		}
		if err := ops.Linear(g, x, gu, nil); err != nil {
			return err
		}
		if err := ops.SiLUMul(a, g); err != nil {
			return err
		}
		return ops.Linear(out, a, dn, nil)
	}
	if err := mlp(p.c, out.c, x.c, gu.c, dn.c, g.c, a.c); err != nil {
		t.Fatal(err)
	}
	if err := mlp(p.g, out.g, x.g, gu.g, dn.g, g.g, a.g); err != nil {
		t.Fatal(err)
	}
	p.check("quant gated mlp", out, 1e-4)
	xb := p.rand(kernels.BF16, 1, rows, hidden)
	errC := p.c.Linear(g.c, xb.c, gu.c, nil)
	errG := p.g.Linear(g.g, xb.g, gu.g, nil)
	if !errors.Is(errC, kernels.ErrDType) || !errors.Is(errG, kernels.ErrDType) {
		t.Fatalf("BF16 x with a block-quantized weight: cuda %v, cpu %v; want the same refusal", errG, errC)
	}
	if _, err := p.g.Alloc(kernels.Quant, 2, 32); !errors.Is(err, kernels.ErrDType) {
		t.Fatalf("Alloc(Quant): %v, want ErrDType", err)
	}
}
