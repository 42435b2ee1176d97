package simd

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/pool"
)

// BenchmarkPrefillLayer runs the four products of one decoder layer of the
// 153M Llama (decodeLayer153M) for a 512-token prefill (m = 512 rows of x)
// over the pool, 16 columns a grain, as the CPU backend calls them, for
// every weight format the peer benchmark compares: f32, bf16 (LinearF32,
// LinearBF16) and Q8_0, Q4_K, Q6_K (LinearQuant: the tiled path, which
// dequantizes tiles of weight rows into a float32 scratch and runs the F32
// GEMM on them). The same layer runs every time: its weights come from
// L3 or memory, which matters little as prefill reuses each weight 512
// times. It reports the layer's GFLOP/s (2*m*n*k
// summed over the four products), best window of one layer, and its ratio
// to the register-only FMA peak measured right before the case. bf16pairs
// is LinearBF16Pairs (bfloat16 activations, VDPBF16PS where the CPU has
// it: twice the multiply-adds an instruction of the float32 FMA peak):
//
//	go test -c -o simd.test ./kernels/cpu/simd
//	./simd.test -test.run XXX -test.bench PrefillLayer -test.benchtime 10x [-workers 1]

func BenchmarkPrefillLayer(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	roof := newRoofline(p)
	impl := benchImpl(b)
	r := rand.New(rand.NewPCG(13, 14))
	const m = 512
	x := randVec(r, m*3072)
	out := make([]float32, m*6144)
	type format struct {
		name string
		// mk returns the product of one matrix of n x k weights, for
		// columns [lo, hi).
		mk func(n, k int) func(lo, hi int)
	}
	dense := func(dt benchWeights) format {
		return format{dt.name, func(n, k int) func(lo, hi int) {
			w := dt.make(r, n*k)
			return func(lo, hi int) { dt.run(impl, out, x[:m*k], w, m, n, k, lo, hi) }
		}}
	}
	quant := func(t QuantType) format {
		return format{t.String(), func(n, k int) func(lo, hi int) {
			w, _ := quantRows(t, r, n, k)
			return func(lo, hi int) { impl.LinearQuant(out, x[:m*k], w, t, m, n, k, lo, hi) }
		}}
	}
	xh := make([]uint16, len(x))
	RoundBF16(xh, x)
	pairs := format{"bf16pairs", func(n, k int) func(lo, hi int) {
		w := benchDtypes[1].make(r, n*k).([]uint16)
		return func(lo, hi int) { impl.LinearBF16Pairs(out, xh[:m*k], w, m, n, k, lo, hi) }
	}}
	formats := []format{dense(benchDtypes[0]), dense(benchDtypes[1]), pairs,
		quant(QuantQ8_0), quant(QuantQ4_K), quant(QuantQ6_K)}
	for _, f := range formats {
		b.Run(fmt.Sprintf("%s/%s/m%d", impl, f.name, m), func(b *testing.B) {
			runs := make([]func(lo, hi int), len(decodeLayer153M))
			flops := 0.0
			for i, sh := range decodeLayer153M {
				runs[i] = f.mk(sh.n, sh.k)
				flops += 2 * float64(m*sh.n*sh.k)
			}
			peak := roof.peakGFLOPs()
			win := newBestWindow(1)
			for b.Loop() {
				for i, sh := range decodeLayer153M {
					p.ForGrain(sh.n, 16, runs[i])
				}
				win.done()
			}
			best := flops / win.bestSec / 1e9
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			b.ReportMetric(best, "best_GFLOP/s")
			if peak > 0 {
				b.ReportMetric(peak, "peak_GFLOP/s")
				b.ReportMetric(best/peak, "best_x_peak")
			}
		})
	}
}
