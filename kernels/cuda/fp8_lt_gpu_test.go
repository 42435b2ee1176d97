package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// fp8QuantRef is the quantized reference of rows [lo, hi) of w for the
// activations xs [m, k]: sum_c q_c s_c w_c (quantRow's rounding, float64)
// and sum_c |q_c s_c w_c|, [m, hi - lo] each.
func fp8QuantRef(xs []float32, w kernels.FP8Weight, m, k, lo, hi int) (ref, qabs []float64) {
	n := hi - lo
	ref, qabs = make([]float64, m*n), make([]float64, m*n)
	for r := range m {
		q, s := quantRow(xs[r*k : (r+1)*k])
		for j := range n {
			for c := range k {
				v := q[c] * s[c] * fp8Value(w, lo+j, c)
				ref[r*n+j] += v
				qabs[r*n+j] += math.Abs(v)
			}
		}
	}
	return ref, qabs
}

// TestGPUFP8LinearLT covers cuBLASLt's block-scaled FP8 GEMM (fp8LT):
//   - against the host's quantized reference within 2^-8 sum |q s w| (the
//     bound the library's GEMM meets), with block scales that differ by up
//     to 2^8 from block to block (a wrong block index fails), rows and k
//     not multiples of 128;
//   - AUTO above 8 rows takes it: AUTO's bits equal fp8LT's and differ
//     from the library GEMM's somewhere;
//   - weight views: one starting at row 128 keeps the cuBLASLt scales, one
//     starting at row 64 has none (fp8LT refuses it, AUTO takes the
//     library's GEMM).
func TestGPUFP8LinearLT(t *testing.T) {
	p := newPair(t, GEMMRound)
	run := func(w kernels.Tensor, x kernels.Tensor, m, n int, path fp8Path) ([]float32, error) {
		out, err := p.g.Alloc(kernels.F32, m, n)
		if err != nil {
			t.Fatal(err)
		}
		if path == fp8Auto {
			err = p.g.Linear(out, x, w, nil)
		} else {
			err = p.g.linearFP8Path(out, x, w, nil, path)
		}
		if err != nil {
			return nil, err
		}
		return p.f32(p.g, out), nil
	}
	check := func(name string, got []float32, ref, qabs []float64) {
		t.Helper()
		var worst float64
		for i, g := range got {
			d := math.Abs(float64(g) - ref[i])
			if !(d <= qabs[i]/256+1e-6) {
				t.Fatalf("%s: out[%d] = %v, quantized reference %v: |diff| %.3g > 2^-8 * %.3g", name, i, g, ref[i], d, qabs[i])
			}
			worst = max(worst, d/(qabs[i]+1e-30))
		}
		t.Logf("%s: max |lt - ref| / sum|q s w| = %.3g", name, worst)
	}
	sameBits := func(a, b []float32) (differ int) {
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				differ++
			}
		}
		return differ
	}
	for _, sh := range []struct{ n, k int }{{384, 1024}, {200, 1344}} {
		w := makeFP8Varied(p.r, 1, sh.n, sh.k, 128)
		w.Shape = []int{sh.n, sh.k}
		wg := newFP8Weight(t, p.g, w)
		for _, m := range []int{9, 64, 300} {
			name := fmt.Sprintf("n=%d/k=%d/m=%d", sh.n, sh.k, m)
			xs := randVals(p.r, m*sh.k, 1)
			x := upload(t, p.g, kernels.F32, kernels.F32Bytes(xs), kernels.F32, m, sh.k)
			lt, err := run(wg, x, m, sh.n, fp8LT)
			if err != nil {
				t.Fatalf("%s: cuBLASLt: %v", name, err)
			}
			ref, qabs := fp8QuantRef(xs, w, m, sh.k, 0, sh.n)
			check(name, lt, ref, qabs)
			auto, err := run(wg, x, m, sh.n, fp8Auto)
			if err != nil {
				t.Fatal(err)
			}
			if d := sameBits(auto, lt); d != 0 {
				t.Fatalf("%s: AUTO differs from cuBLASLt in %d of %d outputs", name, d, len(lt))
			}
			gemm, err := run(wg, x, m, sh.n, fp8GEMM)
			if err != nil {
				t.Fatal(err)
			}
			if sameBits(gemm, lt) == 0 {
				t.Fatalf("%s: the library GEMM gives cuBLASLt's bits everywhere: cannot tell which path AUTO took", name)
			}
		}
		const m = 64
		xs := randVals(p.r, m*sh.k, 1)
		x := upload(t, p.g, kernels.F32, kernels.F32Bytes(xs), kernels.F32, m, sh.k)
		for _, v := range []struct {
			lo int
			lt bool
		}{{128, true}, {64, false}} {
			name := fmt.Sprintf("n=%d/k=%d/view from row %d", sh.n, sh.k, v.lo)
			view, err := p.g.Rows(wg, v.lo, sh.n)
			if err != nil {
				t.Fatal(err)
			}
			got, err := run(view, x, m, sh.n-v.lo, fp8LT)
			if !v.lt {
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("%s: cuBLASLt path gave %v, want ErrUnsupported (no 128x128 block scales)", name, err)
				}
				auto, err := run(view, x, m, sh.n-v.lo, fp8Auto)
				if err != nil {
					t.Fatal(err)
				}
				gemm, err := run(view, x, m, sh.n-v.lo, fp8GEMM)
				if err != nil {
					t.Fatal(err)
				}
				if d := sameBits(auto, gemm); d != 0 {
					t.Fatalf("%s: AUTO differs from the library GEMM in %d outputs", name, d)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: cuBLASLt: %v", name, err)
			}
			ref, qabs := fp8QuantRef(xs, w, m, sh.k, v.lo, sh.n)
			check(name, got, ref, qabs)
		}
	}
}

// TestGPUFP8MLATensorCores: over 16- and 8-bit latent caches an FP8 wkv_b
// is dequantized once to BF16 (each value rounded to nearest even) and
// takes the tensor-core path: the output's bits equal those of the same
// call over a BF16 weight holding the host's rounding of the dequantized
// values, a second call reads the cached copy (one per dtype: a float32
// cache adds the float32 copy), and the output stays within twice the
// path's bound of the CPU backend over the unrounded weight.
func TestGPUFP8MLATensorCores(t *testing.T) {
	p := newPair(t, GEMMRound)
	mp := mlaScaled(mlaTCShapes[1])
	const blockSize, numBlocks = 16, 40
	slots := blockSize * numBlocks
	b := p.pagedBatch(blockSize, numBlocks, [][2]int{{1, 17}, {1, 200}, {5, 5}, {20, 40}})
	rows := mp.NumHeads * (mp.NopeDim + mp.VHeadDim)
	fw := makeFP8Varied(p.r, 1, rows, mp.KVLoraRank, 128)
	fw.Shape = []int{rows, mp.KVLoraRank}
	rounded := make([]float32, rows*mp.KVLoraRank)
	for r := range rows {
		for c := range mp.KVLoraRank {
			rounded[r*mp.KVLoraRank+c] = kernels.BF16ToF32(kernels.F32ToBF16(float32(fp8Value(fw, r, c))))
		}
	}
	wBF16 := upload(t, p.g, kernels.BF16, hostBytes(kernels.BF16, rounded), kernels.BF16, rows, mp.KVLoraRank)
	q := p.rand(kernels.F32, 1, b.numTokens, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
	out := p.zeros(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
	for _, cdt := range []kernels.DType{kernels.BF16, kernels.F8E4M3} {
		width := mlaCacheWidth(cdt, mp)
		gc, err := p.g.Alloc(cdt, numBlocks, blockSize, width)
		if err != nil {
			t.Fatal(err)
		}
		vals := mlaHostValues(cdt, p.mlaWriteAll(t, gc, mp, slots), mp, slots)
		cc := upload(t, p.c, kernels.F32, kernels.F32Bytes(vals), kernels.F32, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
		w := dual{newFP8Weight(t, p.c, fw), newFP8Weight(t, p.g, fw)}
		run := func(wg kernels.Tensor) []byte {
			t.Helper()
			p.poison(out)
			if err := p.g.MLAAttention(out.g, q.g, gc, wg, &b.gpuMeta, mp); err != nil {
				t.Fatalf("%v cache: %v", cdt, err)
			}
			return p.raw(p.g, out.g)
		}
		want := run(wBF16)
		for i := range 2 {
			if got := run(w.g); !bytes.Equal(got, want) {
				t.Fatalf("%v cache, call %d over the FP8 weight: bits differ from the call over its BF16 rounding", cdt, i)
			}
			if n := fp8CachedCopies(w.g); n != 1 {
				t.Fatalf("%v cache, after call %d: %d cached copies, want 1", cdt, i, n)
			}
		}
		if err := p.c.MLAAttention(out.c, q.c, cc, w.c, &b.cpuMeta, mp); err != nil {
			t.Fatal(err)
		}
		e := p.check(fmt.Sprintf("fp8 mla_attention, %v cache", cdt), out, 2*mlaTCTol(cdt))
		t.Logf("fp8 wkv_b over a %v cache: max relative error against the CPU backend %.3g (bound %.3g)", cdt, e, 2*mlaTCTol(cdt))
		// A float32 cache reads the float32 copy, kept beside the BF16 one.
		fc := p.rand(kernels.F32, 1, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
		if err := p.g.MLAAttention(out.g, q.g, fc.g, w.g, &b.gpuMeta, mp); err != nil {
			t.Fatal(err)
		}
		if n := fp8CachedCopies(w.g); n != 2 {
			t.Fatalf("%v cache then a float32 cache: %d cached copies, want 2", cdt, n)
		}
	}
}
