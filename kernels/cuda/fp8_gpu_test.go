package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// makeFP8 quantizes random weights [experts, n, k] (scale 0.05) per block
// of 128 rows by blockK columns, as the loader does for a checkpoint's
// tensors, stacking the experts' scale grids.
func makeFP8(r *rand.Rand, experts, n, k, blockK int) kernels.FP8Weight {
	w := kernels.FP8Weight{Shape: []int{experts, n, k}, BlockK: blockK}
	if experts == 1 {
		w.Shape = []int{n, k}
	}
	cols := (k + blockK - 1) / blockK
	for range experts {
		data, scales := weights.QuantizeFP8Blocks(randVals(r, n*k, 0.05), n, k, 128, blockK)
		base := int32(len(w.Scales) / cols)
		w.Data = append(w.Data, data...)
		w.Scales = append(w.Scales, scales...)
		for row := range n {
			w.ScaleRow = append(w.ScaleRow, base+int32(row/128))
		}
	}
	return w
}

// fp8Value is element (row, c) of w (row of the flattened matrix).
func fp8Value(w kernels.FP8Weight, row, c int) float64 {
	k := w.Shape[len(w.Shape)-1]
	cols := (k + w.BlockK - 1) / w.BlockK
	return float64(kernels.F8E4M3ToF32(w.Data[row*k+c])) * float64(w.Scales[int(w.ScaleRow[row])*cols+c/w.BlockK])
}

// quantRow is the GEMM path's activation rounding of one row (fp8.cu's
// di_fp8_quant_k): per 128 columns s = amax / 448 (1 for zeros), q =
// e4m3(x / s) in float32 arithmetic. It returns the widened q and s a
// column.
func quantRow(x []float32) (q, s []float64) {
	q, s = make([]float64, len(x)), make([]float64, len(x))
	for g := 0; g < len(x); g += 128 {
		end := min(g+128, len(x))
		var amax float32
		for _, v := range x[g:end] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		sc := float32(1)
		if amax > 0 {
			sc = amax / 448
		}
		for c := g; c < end; c++ {
			q[c] = float64(kernels.F8E4M3ToF32(kernels.F32ToF8E4M3(x[c] / sc)))
			s[c] = float64(sc)
		}
	}
	return q, s
}

func newFP8Weight(t testing.TB, ops kernels.Ops, w kernels.FP8Weight) kernels.Tensor {
	t.Helper()
	f, ok := ops.(kernels.FP8Weighter)
	if !ok {
		t.Fatalf("%s has no FP8 weights", ops.Name())
	}
	ten, err := f.FP8Weight(w)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}

// TestGPUFP8Linear compares Linear over FP8 weights with the CPU backend
// (x times the dequantized weight in float32) on both paths:
//   - GEMV (float32 activations): |gpu - cpu| <= 1e-4 sum_c |x_c w_c| (summation
//     order only; about 1e-6 seen in float32);
//   - GEMM (activations quantized per 128 columns): against the host's
//     emulation of the same quantization, |gpu - ref| <= 2^-8 sum_c |q_c s_c
//     w_c| (the tensor cores' FP8 accumulation inside a 128-column tile), and
//     against the CPU within the activation rounding's bound sum_c |w_c|
//     (2^-4 |x_c| + 2^-10 s_c) plus that.
//
// Block widths below 128 run the GEMV only (the GEMM refuses them).
func TestGPUFP8Linear(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, sh := range []struct{ n, k, blockK int }{{256, 1024, 128}, {200, 2048, 128}, {136, 4096, 128}, {72, 528, 16}, {96, 1536, 64}} {
		w := makeFP8(p.r, 1, sh.n, sh.k, sh.blockK)
		wc, wg := newFP8Weight(t, p.c, w), newFP8Weight(t, p.g, w)
		deq := make([]float64, sh.n*sh.k)
		for j := range sh.n {
			for c := range sh.k {
				deq[j*sh.k+c] = fp8Value(w, j, c)
			}
		}
		for _, m := range []int{1, 2, 3, 5, 8, 9, 64, 130} {
			xs := randVals(p.r, m*sh.k, 1)
			x := p.put(kernels.F32, xs, m, sh.k)
			bias := p.rand(kernels.F32, 0.1, sh.n)
			out := p.zeros(kernels.F32, m, sh.n)
			if err := p.c.Linear(out.c, x.c, wc, bias.c); err != nil {
				t.Fatal(err)
			}
			cpu := p.f32(p.c, out.c)
			biasV := p.f32(p.c, bias.c)
			// Per output: sum |x w|, the quantized reference, sum |q s w| and
			// the activation rounding's bound (path-independent).
			abs, ref, qabs, wabsS := make([]float64, m*sh.n), make([]float64, m*sh.n), make([]float64, m*sh.n), make([]float64, m*sh.n)
			for r := range m {
				row := xs[r*sh.k : (r+1)*sh.k]
				q, s := quantRow(row)
				for j := range sh.n {
					i := r*sh.n + j
					wrow := deq[j*sh.k : (j+1)*sh.k]
					for c, wv := range wrow {
						abs[i] += math.Abs(float64(row[c]) * wv)
						ref[i] += q[c] * s[c] * wv
						qabs[i] += math.Abs(q[c] * s[c] * wv)
						wabsS[i] += math.Abs(wv) * (math.Abs(float64(row[c]))/16 + s[c]/1024)
					}
					ref[i] += float64(biasV[j])
				}
			}
			for _, path := range []fp8Path{fp8Auto, fp8GEMV, fp8GEMM} {
				name := fmt.Sprintf("n=%d/k=%d/block=%d/m=%d/path=%d", sh.n, sh.k, sh.blockK, m, path)
				p.poison(out)
				var err error
				if path == fp8Auto {
					err = p.g.Linear(out.g, x.g, wg, bias.g)
				} else {
					err = p.g.linearFP8Path(out.g, x.g, wg, bias.g, path)
				}
				if path == fp8GEMM && sh.blockK < 128 {
					if !errors.Is(err, ErrUnsupported) {
						t.Fatalf("%s: got %v, want ErrUnsupported", name, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				got := p.f32(p.g, out.g)
				gemm := path == fp8GEMM || (path == fp8Auto && m > 8 && sh.blockK >= 128)
				var worst float64
				for i := range got {
					g, c := float64(got[i]), float64(cpu[i])
					r, j := i/sh.n, i%sh.n
					if math.IsNaN(g) {
						t.Fatalf("%s: out[%d][%d] not written", name, r, j)
					}
					worst = max(worst, math.Abs(g-c)/(abs[i]+1e-30))
					if !gemm {
						if d := math.Abs(g - c); d > 1e-4*abs[i]+1e-6 {
							t.Fatalf("%s: out[%d][%d] = %v, cpu %v: |diff| %.3g > 1e-4 * %.3g", name, r, j, g, c, d, abs[i])
						}
						continue
					}
					if d := math.Abs(g - ref[i]); d > qabs[i]/256+1e-6 {
						t.Fatalf("%s: out[%d][%d] = %v, quantized reference %v: |diff| %.3g > 2^-8 * %.3g", name, r, j, g, ref[i], d, qabs[i])
					}
					if d := math.Abs(g - c); d > wabsS[i]+qabs[i]/256+1e-4*abs[i]+1e-6 {
						t.Fatalf("%s: out[%d][%d] = %v, cpu %v: |diff| %.3g beyond the rounding bound %.3g", name, r, j, g, c, d, wabsS[i])
					}
				}
				t.Logf("%s: gemm=%v, max |gpu - cpu| / sum|x w| = %.3g", name, gemm, worst)
			}
		}
	}
}

// TestGPUFP8LinearInvariance: on each path a row's bits are the same alone
// and among 64 (and 130 for the GEMM: two row tiles).
func TestGPUFP8LinearInvariance(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(3, 9))
	const n, k = 320, 2048
	w := newFP8Weight(t, g, makeFP8(r, 1, n, k, 128))
	for _, c := range []struct {
		path fp8Path
		rows int
	}{{fp8GEMV, 5}, {fp8GEMV, 64}, {fp8GEMM, 64}, {fp8GEMM, 130}} {
		x := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, c.rows*k, 1)), kernels.F32, c.rows, k)
		all, _ := g.Alloc(kernels.F32, c.rows, n)
		if err := g.linearFP8Path(all, x, w, nil, c.path); err != nil {
			t.Fatal(err)
		}
		want, err := kernels.ToF32(g, all)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range []int{0, 3, c.rows - 1} {
			xr, _ := g.Rows(x, row, row+1)
			one, _ := g.Alloc(kernels.F32, 1, n)
			if err := g.linearFP8Path(one, xr, w, nil, c.path); err != nil {
				t.Fatal(err)
			}
			got, err := kernels.ToF32(g, one)
			if err != nil {
				t.Fatal(err)
			}
			for j := range n {
				if math.Float32bits(got[j]) != math.Float32bits(want[row*n+j]) {
					t.Fatalf("path %d: row %d of %d: out[%d] = %v alone, %v in the batch", c.path, row, c.rows, j, got[j], want[row*n+j])
				}
			}
		}
		t.Logf("fp8 linear path %d: rows alone bit-identical to the same rows among %d", c.path, c.rows)
	}
}

// makeFP8Varied is makeFP8 with each block of 128 rows by blockK columns
// (and each expert) multiplied by its own power of two from 2^-4 to 2^4
// before quantization, so that the block scales differ by up to 2^8 from
// block to block: a kernel that applies a neighbouring block's scale, or
// another expert's, is off by a factor of 2 or more there.
func makeFP8Varied(r *rand.Rand, experts, n, k, blockK int) kernels.FP8Weight {
	w := kernels.FP8Weight{Shape: []int{experts, n, k}, BlockK: blockK}
	cols := (k + blockK - 1) / blockK
	for e := range experts {
		vals := randVals(r, n*k, 0.05)
		for j := range n {
			for c := range k {
				vals[j*k+c] *= float32(math.Ldexp(1, (e*5+(j/128)*3+(c/blockK)*7)%9-4))
			}
		}
		data, scales := weights.QuantizeFP8Blocks(vals, n, k, 128, blockK)
		base := int32(len(w.Scales) / cols)
		w.Data = append(w.Data, data...)
		w.Scales = append(w.Scales, scales...)
		for row := range n {
			w.ScaleRow = append(w.ScaleRow, base+int32(row/128))
		}
	}
	return w
}

// moeCase builds an FP8 MoE problem on both backends: tokens rows of x
// (row t scaled by moeRowScale(t), so that rows span 10 decades and the
// activations of some exceed F16's range), top-k distinct experts a token,
// random mixing weights.
type moeCase struct {
	x, ids, w, out dual
}

func moeRowScale(t int) float32 { return []float32{1, 3e4, 1e-5, 1, 2e5}[t%5] }

func newMoECase(p *pair, tokens, experts, topK, hidden int) moeCase {
	ids := make([]int32, tokens*topK)
	for t := range tokens {
		perm := p.r.Perm(experts)
		for k := range topK {
			ids[t*topK+k] = int32(perm[k])
		}
	}
	xs := randVals(p.r, tokens*hidden, 1)
	for t := range tokens {
		for c := range hidden {
			xs[t*hidden+c] *= moeRowScale(t)
		}
	}
	return moeCase{x: p.put(kernels.F32, xs, tokens, hidden), ids: p.ints(ids, tokens, topK), w: p.rand(kernels.F32, 1, tokens, topK),
		out: p.zeros(kernels.F32, tokens, hidden)}
}

// rowRelErr is the largest over rows of max_j |got - want| / max_j |want|
// (rows of n values; NaN when got has a NaN).
func rowRelErr(got, want []float32, n int) float64 {
	var worst float64
	for r := 0; r*n < len(want); r++ {
		e := maxRelErr(got[r*n:(r+1)*n], want[r*n:(r+1)*n])
		if math.IsNaN(e) {
			return e
		}
		worst = max(worst, e)
	}
	return worst
}

// moeRows runs MoE over rows lo..hi of c on the GPU (path forced unless
// fp8Auto) and returns the output.
func (p *pair) moeRows(c moeCase, lo, hi int, gu, dn kernels.Tensor, path fp8Path) []float32 {
	p.t.Helper()
	xr, _ := p.g.Rows(c.x.g, lo, hi)
	ir, _ := p.g.Rows(c.ids.g, lo, hi)
	wr, _ := p.g.Rows(c.w.g, lo, hi)
	o, err := p.g.Alloc(kernels.F32, hi-lo, kernels.NumElements(c.x.g)/c.x.g.Shape()[0])
	if err != nil {
		p.t.Fatal(err)
	}
	if path == fp8Auto {
		err = p.g.MoE(o, xr, ir, wr, gu, dn)
	} else {
		err = p.g.moeFP8Path(o, xr, ir, wr, gu, dn, path)
	}
	if err != nil {
		p.t.Fatal(err)
	}
	return p.f32(p.g, o)
}

// TestGPUFP8MoE compares MoE over FP8 experts with the CPU backend (x
// times the dequantized weights in float32) on every path, at 1, 8, 64 and
// 1024 (token, k) pairs and more:
//   - the device path on tensor cores (fp8_moe.cu's f8m_mma_k: block_k >=
//     128, sizes multiples of 128) carries activations as F16 hi + lo parts
//     per 128 columns scaled by a power of two (within 2^-22 of the value or
//     2^-39 of its block's largest), and the device GEMV (the other shapes)
//     float32 ones: both differ from the CPU by float32 summation order, so
//     each token row's max |gpu - cpu| must be <= 1e-4 of that row's max
//     |cpu| (rows span 10 decades and some activations exceed F16's range;
//     about 1e-6 seen in float32);
//   - the host path (grouped GEMM over activations quantized to E4M3 per
//     128 columns; forced, or above 1024 pairs on the GEMV's shapes): <= 0.1
//     max |cpu| (the activation rounding's bound per element is stated in
//     TestGPUFP8Linear). The tensor-core shapes stay on the device above
//     1024 pairs (fp8_moe_gpu_test.go tests the larger batches).
//
// Weights take block scales that differ by up to 2^8 from block to block
// (makeFP8Varied), so that a wrong block, row or expert in the scale
// indexing fails the bound; block_k 256 takes one scale per two 128-column
// units. Hidden and intermediate sizes of 5 and 9 units deal uneven shares
// to the kernel's four warps; 1024 pairs on 4 experts make passes of 32
// rows over each expert's weights. On each path a token's bits are the same
// alone, among the first 32 tokens and in the whole batch, and a captured
// graph replays the eager bits.
func TestGPUFP8MoE(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, sh := range []struct {
		name                              string
		experts, topK, hidden, inter, blk int
		tokens                            []int
	}{
		{"tc/top1", 4, 1, 256, 256, 128, []int{1, 8, 64, 1024}},
		{"tc/uneven", 16, 4, 640, 1152, 128, []int{1, 2, 16, 256}},
		{"tc/top2", 8, 2, 256, 384, 128, []int{7, 600}},
		{"tc/block256", 8, 6, 512, 384, 256, []int{1, 40}},
		{"gemv/block64", 8, 2, 256, 384, 64, []int{1, 7, 64}},
		{"gemv/k272", 8, 2, 272, 400, 128, []int{1, 7, 600}},
	} {
		guW, dnW := makeFP8Varied(p.r, sh.experts, 2*sh.inter, sh.hidden, sh.blk), makeFP8Varied(p.r, sh.experts, sh.hidden, sh.inter, sh.blk)
		gu := dual{newFP8Weight(t, p.c, guW), newFP8Weight(t, p.g, guW)}
		dn := dual{newFP8Weight(t, p.c, dnW), newFP8Weight(t, p.g, dnW)}
		gemmOK := sh.blk >= 128
		for _, tokens := range sh.tokens {
			c := newMoECase(p, tokens, sh.experts, sh.topK, sh.hidden)
			if err := p.c.MoE(c.out.c, c.x.c, c.ids.c, c.w.c, gu.c, dn.c); err != nil {
				t.Fatal(err)
			}
			cpu := p.f32(p.c, c.out.c)
			pairs := tokens * sh.topK
			for _, path := range []fp8Path{fp8Auto, fp8GEMV, fp8GEMM} {
				name := fmt.Sprintf("%s/tokens=%d/pairs=%d/path=%d", sh.name, tokens, pairs, path)
				p.poison(c.out)
				var err error
				if path == fp8Auto {
					err = p.g.MoE(c.out.g, c.x.g, c.ids.g, c.w.g, gu.g, dn.g)
				} else {
					err = p.g.moeFP8Path(c.out.g, c.x.g, c.ids.g, c.w.g, gu.g, dn.g, path)
				}
				if path == fp8GEMM && !gemmOK {
					if !errors.Is(err, ErrUnsupported) {
						t.Fatalf("%s: got %v, want ErrUnsupported", name, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				got := p.f32(p.g, c.out.g)
				// The host GEMM: forced, or AUTO above 1024 pairs where the
				// tensor-core device path does not serve the shape.
				tcShape := sh.blk >= 128 && sh.hidden%128 == 0 && sh.inter%128 == 0
				gemm := path == fp8GEMM || (path == fp8Auto && pairs > 1024 && !tcShape)
				if gemm {
					if e := maxRelErr(got, cpu); !(e <= 0.1) {
						t.Fatalf("%s: max |gpu - cpu| / max |cpu| = %.3g, want <= 0.1", name, e)
					} else {
						t.Logf("fp8 moe %s (host GEMM): max |gpu - cpu| / max |cpu| = %.3g", name, e)
					}
				} else {
					e := rowRelErr(got, cpu, sh.hidden)
					if !(e <= 1e-4) {
						t.Fatalf("%s: max over token rows of max |gpu - cpu| / max |cpu| = %.3g, want <= 1e-4", name, e)
					}
					t.Logf("fp8 moe %s (device): max over token rows of max |gpu - cpu| / max |cpu| = %.3g", name, e)
				}
				if tokens < 7 {
					continue
				}
				// The same bits for token 3 alone, for the first 32 tokens as a batch.
				forced := map[bool]fp8Path{true: fp8GEMM, false: fp8GEMV}[gemm]
				same := func(what string, part []float32, lo int) {
					for i, v := range part {
						if math.Float32bits(v) != math.Float32bits(got[lo*sh.hidden+i]) {
							t.Fatalf("%s: %s: token %d out[%d] = %v, in the whole batch %v", name, what, lo+i/sh.hidden, i%sh.hidden, v, got[lo*sh.hidden+i])
						}
					}
				}
				same("token 3 alone", p.moeRows(c, 3, 4, gu.g, dn.g, forced), 3)
				if tokens > 32 {
					same("the first 32 tokens", p.moeRows(c, 0, 32, gu.g, dn.g, forced), 0)
				}
			}
		}
		// Graphs: the device path captured and replayed gives the eager bits.
		for _, tokens := range []int{4, 1024 / sh.topK} {
			c := newMoECase(p, tokens, sh.experts, sh.topK, sh.hidden)
			if err := p.g.MoE(c.out.g, c.x.g, c.ids.g, c.w.g, gu.g, dn.g); err != nil {
				t.Fatal(err)
			}
			eager := p.f32(p.g, c.out.g)
			p.poison(c.out)
			graph, err := p.g.CaptureGraph(func() error { return p.g.MoE(c.out.g, c.x.g, c.ids.g, c.w.g, gu.g, dn.g) })
			if err != nil {
				t.Fatal(err)
			}
			if err := graph.Replay(); err != nil {
				t.Fatal(err)
			}
			replayed := p.f32(p.g, c.out.g)
			graph.Close()
			for j := range eager {
				if math.Float32bits(eager[j]) != math.Float32bits(replayed[j]) {
					t.Fatalf("%s: %d tokens: graph replay out[%d] = %v, eager %v", sh.name, tokens, j, replayed[j], eager[j])
				}
			}
			t.Logf("fp8 moe %s: %d tokens: graph replay bit-identical to eager", sh.name, tokens)
		}
	}
}

// TestGPUFP8Views: Linear over Rows (and Reshape) views of stacked FP8
// experts takes each expert's own scale rows, as the CPU backend does.
func TestGPUFP8Views(t *testing.T) {
	p := newPair(t, GEMMRound)
	const experts, n, k = 3, 160, 256
	wv := makeFP8(p.r, experts, n, k, 128)
	wc, wg := newFP8Weight(t, p.c, wv), newFP8Weight(t, p.g, wv)
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
		p.check(fmt.Sprintf("fp8 linear of expert %d's rows view", e), out, 1e-5)
	}
}

// fp8CachedCopies is the number of float32 copies MLAAttention keeps for
// the FP8 weight w and its views (fp8Dequantized).
func fp8CachedCopies(w kernels.Tensor) int {
	t := w.(*Tensor)
	if t.fp8 == nil || t.fp8.deq == nil {
		return 0
	}
	t.fp8.deq.mu.Lock()
	defer t.fp8.deq.mu.Unlock()
	return len(t.fp8.deq.m)
}

// TestGPUFP8MLA: MLAAttention over an FP8 wkv_b gives the bits of the same
// call over the weight's float32 values (fp8Dequant) and agrees with the CPU
// backend (2e-5, as TestGPUMLAAttention); the float32 copy is made once per
// weight, at the first eager call (a second call and a Reshape view of the
// same rows reuse it), and a first call made while a graph is captured
// caches nothing yet still replays the same bits.
func TestGPUFP8MLA(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, mp := range mlaShapes {
		mp.Scale = float32(1 / math.Sqrt(float64(mp.NopeDim+mp.RopeDim)))
		name := fmt.Sprintf("kvl%d", mp.KVLoraRank)
		const blockSize, numBlocks = 16, 40
		b := p.pagedBatch(blockSize, numBlocks, [][2]int{{1, 17}, {1, 200}, {5, 5}})
		cache := p.rand(kernels.F32, 1, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
		q := p.rand(kernels.F32, 1, b.numTokens, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
		out := p.zeros(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
		rows := mp.NumHeads * (mp.NopeDim + mp.VHeadDim)
		fw := makeFP8Varied(p.r, 1, rows, mp.KVLoraRank, 128)
		fw.Shape = []int{rows, mp.KVLoraRank}
		w := dual{newFP8Weight(t, p.c, fw), newFP8Weight(t, p.g, fw)}
		run := func(wg kernels.Tensor) []byte {
			t.Helper()
			p.poison(out)
			if err := p.g.MLAAttention(out.g, q.g, cache.g, wg, &b.gpuMeta, mp); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return p.raw(p.g, out.g)
		}
		deq, err := p.g.fp8Dequant(w.g.(*Tensor), kernels.F32)
		if err != nil {
			t.Fatal(err)
		}
		want := run(deq)
		if n := fp8CachedCopies(w.g); n != 0 {
			t.Fatalf("%s: %d cached copies before any call over the FP8 weight", name, n)
		}
		for i := range 2 {
			if got := run(w.g); !bytes.Equal(got, want) {
				t.Fatalf("%s: call %d over the FP8 weight: bits differ from the call over its float32 values", name, i)
			}
			if n := fp8CachedCopies(w.g); n != 1 {
				t.Fatalf("%s: after call %d: %d cached copies, want 1", name, i, n)
			}
		}
		view, err := p.g.Reshape(w.g, rows, mp.KVLoraRank)
		if err != nil {
			t.Fatal(err)
		}
		if got := run(view); !bytes.Equal(got, want) || fp8CachedCopies(w.g) != 1 {
			t.Fatalf("%s: a Reshape view: bits equal %v, %d cached copies (want the bits and 1)", name, bytes.Equal(got, want), fp8CachedCopies(w.g))
		}
		if err := p.c.MLAAttention(out.c, q.c, cache.c, w.c, &b.cpuMeta, mp); err != nil {
			t.Fatal(err)
		}
		p.check(name+": fp8 mla_attention", out, 2e-5)

		// A fresh weight whose first call is captured: nothing cached, the replay gives the bits.
		w2 := newFP8Weight(t, p.g, fw)
		p.poison(out)
		graph, err := p.g.CaptureGraph(func() error { return p.g.MLAAttention(out.g, q.g, cache.g, w2, &b.gpuMeta, mp) })
		if err != nil {
			t.Fatalf("%s: capture: %v", name, err)
		}
		if n := fp8CachedCopies(w2); n != 0 {
			t.Fatalf("%s: a call while capturing cached %d copies, want 0", name, n)
		}
		if err := graph.Replay(); err != nil {
			t.Fatal(err)
		}
		got := p.raw(p.g, out.g)
		graph.Close()
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: graph replay of the first call: bits differ", name)
		}
		if got := run(w2); !bytes.Equal(got, want) || fp8CachedCopies(w2) != 1 {
			t.Fatalf("%s: eager call after the capture: bits equal %v, %d cached copies (want the bits and 1)", name, bytes.Equal(got, want), fp8CachedCopies(w2))
		}
		t.Logf("fp8 mla %s: the float32 copy made once (eagerly), calls bit-identical to the float32 weight's", name)
	}
}
