package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// TestLlamaCppActivations: with Options.Activations ActLlamaCpp, Linear with a
// block-quantized weight (formats fused, as Q4_K_M files mix them) gives
// for every output llama.cpp's block dot product of its weight row and its
// quantized activation row, and a BF16 weight gives the product over
// bfloat16-rounded activations; a row computed alone is bit-identical to
// the same row in a batch split over the workers. Without the option the
// results are the float32 ones.
func TestLlamaCppActivations(t *testing.T) {
	const m, k = 18, 512 // from 16 rows the AVX-512 VNNI kernels repack the weights
	r := rand.New(rand.NewPCG(11, 12))
	types := []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ6_K, kernels.QuantQ8_0, kernels.QuantQ4_0}
	rows := []int{70, 30, 20, 40}
	n := 160
	qw, _ := randQuant(r, []int{n, k}, types, rows)
	x := randVals(r, m*k, 1)
	for _, pure := range []bool{true, false} {
		b := New(Options{Threads: 2, PureGo: pure, Activations: ActLlamaCpp})
		defer b.Close()
		w := quantTensor(t, b, qw)
		xt := put(t, b, kernels.F32, x, m, k)
		out := alloc(t, b, m, n)
		if err := b.Linear(out, xt, w, nil); err != nil {
			t.Fatal(err)
		}
		got := vals(out)
		j := 0
		for pi, p := range qw.Parts {
			typ := simd.QuantType(p.Type)
			rb, _ := typ.RowBytes(k)
			ab, _ := simd.ActRowBytes(typ, k)
			acts := make([]byte, m*ab)
			simd.QuantizeActs(acts, x, typ, m, k)
			for jj := range rows[pi] {
				for i := range m {
					want := simd.VecDotLlama(typ, k, p.Data[jj*rb:(jj+1)*rb], acts[i*ab:(i+1)*ab])
					if g := got[i*n+j]; math.Float32bits(g) != math.Float32bits(want) {
						t.Fatalf("%s: %v row %d, out[%d,%d] = %g, llama.cpp's dot %g", b.Name(), typ, jj, i, j, g, want)
					}
				}
				j++
			}
		}
		// One row alone: the same bits.
		one := alloc(t, b, 1, n)
		if err := b.Linear(one, put(t, b, kernels.F32, x[4*k:5*k], 1, k), w, nil); err != nil {
			t.Fatal(err)
		}
		checkIdentical(t, b.Name()+" row alone", vals(one), got[4*n:5*n])

		// BF16 weights: activations rounded to bfloat16.
		wf := randVals(r, n*k, 0.1)
		wb := put(t, b, kernels.BF16, wf, n, k)
		if err := b.Linear(out, xt, wb, nil); err != nil {
			t.Fatal(err)
		}
		xh, wh := make([]uint16, m*k), make([]uint16, n*k)
		simd.RoundBF16(xh, x)
		simd.RoundBF16(wh, roundTo(kernels.BF16, wf))
		want := make([]float32, m*n)
		simd.Linear16Llama(want, xh, wh, true, m, n, k, 0, n)
		checkIdentical(t, b.Name()+" bf16", vals(out), want)
	}

	// The default keeps float32 activations: other bits.
	b := New(Options{Threads: 2})
	defer b.Close()
	w := quantTensor(t, b, qw)
	out := alloc(t, b, m, n)
	if err := b.Linear(out, put(t, b, kernels.F32, x, m, k), w, nil); err != nil {
		t.Fatal(err)
	}
	ref := New(Options{Threads: 1, Activations: ActLlamaCpp})
	defer ref.Close()
	outL := alloc(t, ref, m, n)
	if err := ref.Linear(outL, put(t, ref, kernels.F32, x, m, k), quantTensor(t, ref, qw), nil); err != nil {
		t.Fatal(err)
	}
	same := 0
	for i, v := range vals(out) {
		if v == vals(outL)[i] {
			same++
		}
	}
	if same == len(vals(out)) {
		t.Errorf("default and llama.cpp activations gave the same %d outputs", same)
	}
	checkClose(t, "default vs llama.cpp activations", vals(out), vals(outL), 0.05)
}

// TestActRoundingModes: each Options.Activations mode rounds the
// activations of exactly the weight formats it names: ActLlamaCppQuantized
// gives ActLlamaCpp's bits with a block-quantized weight and ActFloat32's
// with a BF16 one.
func TestActRoundingModes(t *testing.T) {
	const m, k, n = 5, 256, 48
	r := rand.New(rand.NewPCG(13, 14))
	qw, _ := randQuant(r, []int{n, k}, []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ8_0}, []int{32, 16})
	x := randVals(r, m*k, 1)
	wf := randVals(r, n*k, 0.1)
	run := func(mode ActRounding) (quant, bf16 []float32) {
		b := New(Options{Threads: 2, Activations: mode})
		defer b.Close()
		xt := put(t, b, kernels.F32, x, m, k)
		for _, w := range []kernels.Tensor{quantTensor(t, b, qw), put(t, b, kernels.BF16, wf, n, k)} {
			out := alloc(t, b, m, n)
			if err := b.Linear(out, xt, w, nil); err != nil {
				t.Fatal(err)
			}
			if quant == nil {
				quant = vals(out)
			} else {
				bf16 = vals(out)
			}
		}
		return quant, bf16
	}
	fq, fb := run(ActFloat32)
	lq, lb := run(ActLlamaCpp)
	if slices.Equal(fq, lq) || slices.Equal(fb, lb) {
		t.Fatal("float32 and llama.cpp activations gave the same bits: the modes cannot be told apart")
	}
	qq, qb := run(ActLlamaCppQuantized)
	checkIdentical(t, "quantized-only mode, Q4_K/Q8_0 weight", qq, lq)
	checkIdentical(t, "quantized-only mode, BF16 weight", qb, fb)
}

// TestBF16PairsActivations: under ActBF16 a BF16 weight gives
// simd.LinearBF16Pairs over the bfloat16-rounded activations on every
// path (pure Go included), the same bits for a row alone and in a batch
// split over the workers; a
// block-quantized weight gives ActLlamaCppQuantized's bits and an F16
// weight ActFloat32's.
func TestBF16PairsActivations(t *testing.T) {
	const m, k, n = 9, 320, 72 // k not a multiple of 32: the pair steps' zero tail
	r := rand.New(rand.NewPCG(15, 16))
	x := randVals(r, m*k, 1)
	wf := randVals(r, n*k, 0.1)
	xh, wh := make([]uint16, m*k), make([]uint16, n*k)
	simd.RoundBF16(xh, x)
	simd.RoundBF16(wh, roundTo(kernels.BF16, wf))
	want := make([]float32, m*n)
	simd.Impls()[0].LinearBF16Pairs(want, xh, wh, m, n, k, 0, n) // the pure-Go loop
	// A block-quantized weight, k a multiple of the K-quants' block.
	const kq = 256
	qw, _ := randQuant(r, []int{n, kq}, []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ8_0}, []int{48, 24})
	linear := func(b *Backend, w kernels.Tensor, rows int) []float32 {
		t.Helper()
		k := w.Shape()[1]
		out := alloc(t, b, rows, n)
		if err := b.Linear(out, put(t, b, kernels.F32, x[:rows*k], rows, k), w, nil); err != nil {
			t.Fatal(err)
		}
		return vals(out)
	}
	for _, pure := range []bool{true, false} {
		b := New(Options{Threads: 2, PureGo: pure, Activations: ActBF16})
		defer b.Close()
		wb := put(t, b, kernels.BF16, wf, n, k)
		checkIdentical(t, b.Name()+" bf16 pairs", linear(b, wb, m), want)
		checkIdentical(t, b.Name()+" bf16 pairs, one row", linear(b, wb, 1), want[:n])

		auto := New(Options{Threads: 2, PureGo: pure, Activations: ActLlamaCppQuantized})
		defer auto.Close()
		checkIdentical(t, b.Name()+" quantized weight", linear(b, quantTensor(t, b, qw), m),
			linear(auto, quantTensor(t, auto, qw), m))
		checkIdentical(t, b.Name()+" f16 weight", linear(b, put(t, b, kernels.F16, wf, n, k), m),
			linear(auto, put(t, auto, kernels.F16, wf, n, k), m))
		if slices.Equal(linear(auto, put(t, auto, kernels.BF16, wf, n, k), m), want) {
			t.Fatal("float32 and bfloat16-pair activations gave the same bits: the modes cannot be told apart")
		}
	}
	checkClose(t, "bf16 pairs vs float32 activations", want, refLinear(x, roundTo(kernels.BF16, wf), nil, m, n, k), 0.02)
}
