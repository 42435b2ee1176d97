package cuda

import (
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

// moeCase builds an FP8 MoE problem on both backends: tokens rows of x,
// top-k distinct experts a token, random mixing weights.
type moeCase struct {
	x, ids, w, out, gu, dn dual
	guW, dnW               kernels.FP8Weight
}

func newMoECase(p *pair, tokens, experts, topK, hidden, inter int, gu, dn kernels.FP8Weight, guT, dnT dual) moeCase {
	ids := make([]int32, tokens*topK)
	for t := range tokens {
		perm := p.r.Perm(experts)
		for k := range topK {
			ids[t*topK+k] = int32(perm[k])
		}
	}
	return moeCase{x: p.rand(kernels.F32, 1, tokens, hidden), ids: p.ints(ids, tokens, topK), w: p.rand(kernels.F32, 1, tokens, topK),
		out: p.zeros(kernels.F32, tokens, hidden), gu: guT, dn: dnT, guW: gu, dnW: dn}
}

// TestGPUFP8MoE compares MoE over FP8 experts with the CPU backend on the
// device path (grouped GEMV, float32 activations: max |diff| <= 1e-4 max
// |cpu|) and the host path (grouped GEMM over activations quantized per 128
// columns: <= 0.1 max |cpu|; the activation rounding's bound per element is
// stated in TestGPUFP8Linear), checks that a token's bits do not depend on
// the batch on either path, and that a captured graph replays the eager
// device path's bits.
func TestGPUFP8MoE(t *testing.T) {
	p := newPair(t, GEMMRound)
	const experts, topK, hidden, inter = 8, 2, 256, 384
	guW, dnW := makeFP8(p.r, experts, 2*inter, hidden, 128), makeFP8(p.r, experts, hidden, inter, 128)
	gu := dual{newFP8Weight(t, p.c, guW), newFP8Weight(t, p.g, guW)}
	dn := dual{newFP8Weight(t, p.c, dnW), newFP8Weight(t, p.g, dnW)}
	for _, tokens := range []int{1, 7, 600} {
		c := newMoECase(p, tokens, experts, topK, hidden, inter, guW, dnW, gu, dn)
		if err := p.c.MoE(c.out.c, c.x.c, c.ids.c, c.w.c, gu.c, dn.c); err != nil {
			t.Fatal(err)
		}
		cpu := p.f32(p.c, c.out.c)
		for _, path := range []fp8Path{fp8Auto, fp8GEMV, fp8GEMM} {
			name := fmt.Sprintf("tokens=%d/path=%d", tokens, path)
			p.poison(c.out)
			var err error
			if path == fp8Auto {
				err = p.g.MoE(c.out.g, c.x.g, c.ids.g, c.w.g, gu.g, dn.g)
			} else {
				err = p.g.moeFP8Path(c.out.g, c.x.g, c.ids.g, c.w.g, gu.g, dn.g, path)
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got := p.f32(p.g, c.out.g)
			gemm := path == fp8GEMM || (path == fp8Auto && tokens*topK > 1024)
			tol := 1e-4
			if gemm {
				tol = 0.1
			}
			e := maxRelErr(got, cpu)
			if !(e <= tol) {
				t.Fatalf("%s: max |gpu - cpu| / max |cpu| = %.3g, want <= %g", name, e, tol)
			}
			t.Logf("fp8 moe %s (gemm %v): max |gpu - cpu| / max |cpu| = %.3g", name, gemm, e)
			if tokens < 7 {
				continue
			}
			// Token 3 alone: the same bits.
			x3, _ := p.g.Rows(c.x.g, 3, 4)
			id3, _ := p.g.Rows(c.ids.g, 3, 4)
			w3, _ := p.g.Rows(c.w.g, 3, 4)
			o3, _ := p.g.Alloc(kernels.F32, 1, hidden)
			if err := p.g.moeFP8Path(o3, x3, id3, w3, gu.g, dn.g, map[bool]fp8Path{true: fp8GEMM, false: fp8GEMV}[gemm]); err != nil {
				t.Fatal(err)
			}
			alone := p.f32(p.g, o3)
			for j := range hidden {
				if math.Float32bits(alone[j]) != math.Float32bits(got[3*hidden+j]) {
					t.Fatalf("%s: token 3 alone out[%d] = %v, in the batch %v", name, j, alone[j], got[3*hidden+j])
				}
			}
		}
	}
	// Graph: the device path captured and replayed gives the eager bits.
	c := newMoECase(p, 4, experts, topK, hidden, inter, guW, dnW, gu, dn)
	if err := p.g.MoE(c.out.g, c.x.g, c.ids.g, c.w.g, gu.g, dn.g); err != nil {
		t.Fatal(err)
	}
	eager := p.f32(p.g, c.out.g)
	p.poison(c.out)
	graph, err := p.g.CaptureGraph(func() error { return p.g.MoE(c.out.g, c.x.g, c.ids.g, c.w.g, gu.g, dn.g) })
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	if err := graph.Replay(); err != nil {
		t.Fatal(err)
	}
	replayed := p.f32(p.g, c.out.g)
	for j := range eager {
		if math.Float32bits(eager[j]) != math.Float32bits(replayed[j]) {
			t.Fatalf("graph replay out[%d] = %v, eager %v", j, replayed[j], eager[j])
		}
	}
	t.Log("fp8 moe: graph replay bit-identical to eager")
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
