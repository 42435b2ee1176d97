package simd

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/pool"
)

// BenchmarkQuantLlamaGEMV measures LinearQuantLlama (activations quantized
// as llama.cpp quantizes them, integer block dot products) on decode
// shapes with weights rotating through 512 MiB, against the bandwidths
// measured right before on the same pool, as BenchmarkQuantGEMV does:
//
//	go test -run XXX -bench QuantLlamaGEMV -benchtime 200x ./kernels/cpu/simd
func BenchmarkQuantLlamaGEMV(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	benchQuantGEMV(b, r, func(impl *Impl, typ QuantType, m, k int) quantRowsRun {
		ab, _ := ActRowBytes(typ, k)
		a := make([]byte, m*ab)
		QuantizeActs(a, randVec(r, m*k), typ, m, k)
		return func(out []float32, w []byte, n, lo, hi int) { impl.LinearQuantLlama(out, a, w, typ, m, n, k, lo, hi) }
	})
}

// BenchmarkQuantLlamaGEMM runs LinearQuantLlama on prefill-shaped products
// of the 153M Llama (m = 512 activation rows against the 3072 x 768 up
// projection and the 768 x 3072 down projection) over all cores; GOP/s
// counts 2*m*n*k integer operations, tok/s the rows per second of the best
// window:
//
//	go test -run XXX -bench QuantLlamaGEMM -benchtime 20x ./kernels/cpu/simd
func BenchmarkQuantLlamaGEMM(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	r := rand.New(rand.NewPCG(8, 9))
	impl := benchImpl(b)
	const m = 512
	for _, typ := range QuantTypes {
		for _, sh := range []struct{ n, k int }{{3072, 768}, {768, 3072}} {
			benchQuantLlamaGEMM(b, p, r, impl, typ, m, sh.n, sh.k)
		}
	}
}

func benchQuantLlamaGEMM(b *testing.B, p *pool.Pool, r *rand.Rand, impl *Impl, typ QuantType, m, n, k int) {
	out := make([]float32, m*n)
	ops := 2 * float64(m*n*k)
	w, _ := quantRows(typ, r, n, k)
	ab, _ := ActRowBytes(typ, k)
	a := make([]byte, m*ab)
	QuantizeActs(a, randVec(r, m*k), typ, m, k)
	b.Run(fmt.Sprintf("%s/%s/m%d_%dx%d", impl, typ, m, n, k), func(b *testing.B) {
		win := newBestWindow(1)
		for b.Loop() {
			p.ForGrain(n, 16, func(lo, hi int) { impl.LinearQuantLlama(out, a, w, typ, m, n, k, lo, hi) })
			win.done()
		}
		b.ReportMetric(ops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GOP/s")
		b.ReportMetric(ops/win.bestSec/1e9, "best_GOP/s")
		b.ReportMetric(float64(m)/win.bestSec, "best_tok/s")
	})
}

// BenchmarkLinear16Llama runs Linear16Llama (bfloat16 activations and
// weights, llama.cpp's generic float64 order) on one core, weights hot in
// the caches (768 x 768), for one activation row and for 64; GMAC/s counts
// m*n*k products per second of the best window:
//
//	go test -run XXX -bench Linear16Llama -benchtime 40x ./kernels/cpu/simd
func BenchmarkLinear16Llama(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	impl := benchImpl(b)
	const n, k = 768, 768
	w := make([]uint16, n*k)
	for i := range w {
		w[i] = f32ToBF16(float32(r.NormFloat64()))
	}
	for _, m := range []int{1, 64} {
		x := make([]uint16, m*k)
		for i := range x {
			x[i] = f32ToBF16(float32(r.NormFloat64()))
		}
		out := make([]float32, m*n)
		b.Run(fmt.Sprintf("%s/m%d_%dx%d", impl, m, n, k), func(b *testing.B) {
			win := newBestWindow(5)
			for b.Loop() {
				impl.Linear16Llama(out, x, w, true, m, n, k, 0, n)
				win.done()
			}
			b.ReportMetric(float64(m*n*k)/win.bestSec/1e9, "best_GMAC/s")
		})
	}
}

// BenchmarkQuantizeQ8K rounds 512 activation rows of 768 values to Q8_K
// blocks (the activations of one prefill product of the 153M Llama) with
// the pure-Go loop and with each SIMD path; ns/value per row set:
//
//	go test -run XXX -bench QuantizeQ8K ./kernels/cpu/simd
func BenchmarkQuantizeQ8K(b *testing.B) {
	r := rand.New(rand.NewPCG(10, 11))
	const m, k = 512, 768
	x := randVec(r, m*k)
	dst := make([]byte, m*k/256*Q8KBlockBytes)
	paths := map[string]func(dst []byte, src []float32){"go": func(dst []byte, src []float32) { quantizeQ8KGo(dst, src) }}
	for name, f := range nativeQuantizeQ8K {
		paths[name] = f
	}
	for name, f := range paths {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				f(dst, x)
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N)/(m*k), "ns/value")
		})
	}
}

// BenchmarkQuantizeQ8_0 rounds 512 activation rows of 768 values to Q8_0
// blocks (what Q8_0 and Q4_0 weights multiply) with the Go reference and
// with each SIMD path; ns/value:
//
//	go test -run XXX -bench QuantizeQ8_0 ./kernels/cpu/simd
func BenchmarkQuantizeQ8_0(b *testing.B) {
	r := rand.New(rand.NewPCG(10, 11))
	const m, k = 512, 768
	x := randVec(r, m*k)
	dst := make([]byte, m*k/32*34)
	paths := map[string]func(dst []byte, src []float32){"go": func(dst []byte, src []float32) { QuantQ8_0.Quantize(dst, src) }}
	for name, f := range nativeQuantizeQ8_0 {
		paths[name] = func(dst []byte, src []float32) { quantizeQ8_0With(f, dst, src) }
	}
	for name, f := range paths {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				f(dst, x)
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N)/(m*k), "ns/value")
		})
	}
}
