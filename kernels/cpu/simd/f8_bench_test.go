package simd

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/pool"
)

// FP8 against BF16 and F32 weights on the linear layers of two models, at
// decode (m = 1, 8) and prefill (m = 512):
//
//	go test -c -o simd.test ./kernels/cpu/simd
//	./simd.test -test.run XXX -test.bench 'F8Linear/cold' -test.benchtime 200x
//	./simd.test -test.run XXX -test.bench 'F8Linear/hot'  -test.benchtime 2000x
//	./simd.test -test.run XXX -test.bench 'F8Prefill'     -test.benchtime 10x
//
// cold rotates over f8ColdBytes of weight copies per case, far above the
// last-level cache (a decode step of a model larger than it); hot repeats
// one copy (a model that stays in the caches, as the shipped one does on a
// server CPU). Each case reports ns/op, the weight bytes read per second
// (GB/s) and the weights read per second (Gweights/s: its ratio between two
// dtypes is their speed ratio on the same shape).

// f8ColdBytes is the working set of a cold case.
const f8ColdBytes = 1 << 30

// f8BenchShapes are the linear layers a decode step runs (n x k, fused as
// the engine fuses them): the shipped DeepSeek-V3-architecture model
// (hidden 256) and a 153M-parameter Llama (hidden 768, MLP 3072, GQA 12/4
// heads of 64, vocabulary 32000).
var f8BenchShapes = []struct {
	model, name string
	n, k        int
}{
	{"tiny", "q_a+kv_a_272x256", 128 + 144, 256},
	{"tiny", "q_b_384x128", 384, 128},
	{"tiny", "o_256x256", 256, 256},
	{"tiny", "gate_up_2048x256", 2048, 256},
	{"tiny", "down_256x1024", 256, 1024},
	{"tiny", "expert_gate_up_384x256", 384, 256},
	{"tiny", "expert_down_256x192", 256, 192},
	{"llama153m", "qkv_1280x768", 768 + 2*256, 768},
	{"llama153m", "o_768x768", 768, 768},
	{"llama153m", "gate_up_6144x768", 2 * 3072, 768},
	{"llama153m", "down_768x3072", 768, 3072},
	{"llama153m", "lm_head_32000x768", 32000, 768},
	{"tinyllama", "down_2048x5632", 2048, 5632},
	{"tinyllama", "gate_up_11264x2048", 11264, 2048},
}

// f8BenchWeights is one dtype of the FP8 comparison: bytes per weight and
// numCopies distinct copies of one random [n][k] matrix.
type f8BenchWeights struct {
	name string
	make func(r *rand.Rand, n, k, numCopies int) []any
	run  func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int)
	size func(n, k int) int // bytes read
}

var f8BenchDtypes = []f8BenchWeights{
	{"f32", func(r *rand.Rand, n, k, numCopies int) []any {
		w := randVec(r, n*k)
		ws := make([]any, numCopies)
		for c := range ws {
			ws[c] = append([]float32(nil), w...)
		}
		return ws
	}, func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
		p.LinearF32(out, x, w.([]float32), m, n, k, j0, j1)
	}, func(n, k int) int { return 4 * n * k }},
	{"bf16", func(r *rand.Rand, n, k, numCopies int) []any {
		w := make([]uint16, n*k)
		for i := range w {
			w[i] = f32ToBF16(float32(r.NormFloat64()))
		}
		ws := make([]any, numCopies)
		for c := range ws {
			ws[c] = append([]uint16(nil), w...)
		}
		return ws
	}, func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
		p.LinearBF16(out, x, w.([]uint16), m, n, k, j0, j1)
	}, func(n, k int) int { return 2 * n * k }},
	{"f8", func(r *rand.Rand, n, k, numCopies int) []any {
		w, _ := randF8Weights(r, n, k, 128)
		for j := range w.ScaleRow { // 128x128 blocks, as checkpoints have them
			w.ScaleRow[j] = int32(j / 128)
		}
		w.Scales = w.Scales[:((n+127)/128)*((k+127)/128)]
		ws := make([]any, numCopies)
		for c := range ws {
			cw := w
			cw.Data = append([]uint8(nil), w.Data...)
			ws[c] = cw
		}
		return ws
	}, func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
		p.LinearF8(out, x, w.(F8Weights), m, n, k, j0, j1)
	}, func(n, k int) int { return n*k + 4*((n+127)/128)*((k+127)/128) }},
}

// BenchmarkF8Linear: decode-shaped products over all cores, split into
// columns as kernels/cpu does (ForGrain(n, 16)).
func BenchmarkF8Linear(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	impl := benchImpl(b)
	r := rand.New(rand.NewPCG(5, 8))
	for _, cold := range []bool{true, false} {
		mode := "hot"
		if cold {
			mode = "cold"
		}
		for _, sh := range f8BenchShapes {
			for _, dt := range f8BenchDtypes {
				numCopies := 1
				if cold {
					numCopies = max(1, f8ColdBytes/dt.size(sh.n, sh.k))
				}
				var ws []any // drawn on the first case that runs
				for _, m := range []int{1, 2, 4, 8} {
					b.Run(fmt.Sprintf("%s/%s/%s/%s/%s/m%d", mode, impl, sh.model, sh.name, dt.name, m), func(b *testing.B) {
						if ws == nil {
							ws = dt.make(r, sh.n, sh.k, numCopies)
						}
						x := randVec(r, m*sh.k)
						out := make([]float32, m*sh.n)
						bytes := dt.size(sh.n, sh.k)
						win := newBestWindow(max(4, (1<<20)/bytes))
						i := 0
						for b.Loop() {
							w := ws[i%len(ws)]
							i++
							p.ForGrain(sh.n, 16, func(lo, hi int) {
								dt.run(impl, out, x, w, m, sh.n, sh.k, lo, hi)
							})
							win.done()
						}
						sec := b.Elapsed().Seconds() / float64(b.N)
						b.ReportMetric(float64(bytes)/sec/1e9, "GB/s")
						b.ReportMetric(float64(sh.n*sh.k)/sec/1e9, "Gweights/s")
						b.ReportMetric(float64(sh.n*sh.k)/win.bestSec/1e9, "best_Gweights/s")
					})
				}
				ws = nil
			}
		}
	}
}

// BenchmarkF8Prefill: prefill-shaped products (m = 512) over all cores,
// in GFLOP/s.
func BenchmarkF8Prefill(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	impl := benchImpl(b)
	r := rand.New(rand.NewPCG(6, 9))
	const m = 512
	for _, sh := range f8BenchShapes {
		if sh.n*sh.k < 1<<19 {
			continue
		}
		for _, dt := range f8BenchDtypes {
			w := dt.make(r, sh.n, sh.k, 1)[0]
			x := randVec(r, m*sh.k)
			out := make([]float32, m*sh.n)
			b.Run(fmt.Sprintf("%s/%s/%s/%s/m%d", impl, sh.model, sh.name, dt.name, m), func(b *testing.B) {
				win := newBestWindow(1)
				for b.Loop() {
					p.ForGrain(sh.n, 16, func(lo, hi int) {
						dt.run(impl, out, x, w, m, sh.n, sh.k, lo, hi)
					})
					win.done()
				}
				flops := 2 * float64(m*sh.n*sh.k)
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				b.ReportMetric(flops/win.bestSec/1e9, "best_GFLOP/s")
			})
		}
	}
}
