package simd

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/pool"
)

// The benchmarks measure against the machine's own limits, in the same run:
// GEMV (decode, memory-bound) against the bandwidth of a large parallel
// copy, GEMM (prefill, compute-bound) against the FMA throughput of all cores
// running independent register-only FMAs (fmaPeak).
//
//	go test -run XXX -bench 'Linear|Copy|FMAPeak' -benchtime 2s ./kernels/cpu/simd

// benchWorkers sets the pool size of the benchmarks (0: one per core). On a
// shared machine, -workers=1 gives steadier single-core figures.
var benchWorkers = flag.Int("workers", 0, "benchmark pool size (0: runtime.NumCPU())")

// coldBytes is the working set a GEMV benchmark rotates over, so that
// weights come from memory as in a decode step, not from the last-level cache.
const coldBytes = 512 << 20

// bestWindow tracks the fastest window of consecutive operations. Benchmarks
// report it next to the mean because the machine may be shared: the best
// window is the closest to what the code does on idle cores.
type bestWindow struct {
	size    int // operations per window
	numOps  int
	start   time.Time
	bestSec float64 // seconds per operation in the best window
}

func newBestWindow(size int) *bestWindow {
	return &bestWindow{size: size, start: time.Now(), bestSec: math.Inf(1)}
}

// done records one finished operation.
func (w *bestWindow) done() {
	w.numOps++
	if w.numOps%w.size == 0 {
		now := time.Now()
		w.bestSec = min(w.bestSec, now.Sub(w.start).Seconds()/float64(w.size))
		w.start = now
	}
}

// roofline measures the machine's limits with the same pool the kernels run
// on: a large parallel copy, a large parallel read and the FMA throughput.
// Benchmarks measure them right before each case, so that a ratio compares
// figures taken under the same load of a shared machine.
type roofline struct {
	p        *pool.Pool
	src, dst []byte
	rd       []float32
	sums     []float32
}

const rooflineBytes = 256 << 20

func newRoofline(p *pool.Pool) *roofline {
	r := &roofline{
		p:    p,
		src:  make([]byte, rooflineBytes),
		dst:  make([]byte, rooflineBytes),
		rd:   make([]float32, rooflineBytes/4),
		sums: make([]float32, 8*p.NumWorkers()),
	}
	for i := range r.src {
		r.src[i] = byte(i)
	}
	copy(r.dst, r.src) // fault the pages in
	for i := range r.rd {
		r.rd[i] = 1
	}
	return r
}

// copyGBps is the best of four parallel copies of 256 MiB, counted as bytes
// read plus bytes written per second.
func (r *roofline) copyGBps() float64 {
	w := newBestWindow(1)
	for range 4 {
		r.p.ForGrain(len(r.src), 1<<16, func(lo, hi int) { copy(r.dst[lo:hi], r.src[lo:hi]) })
		w.done()
	}
	return 2 * rooflineBytes / w.bestSec / 1e9
}

// readGBps is the best of four parallel streaming reads of 256 MiB (a dot
// product of the buffer with itself, far less compute per byte than memory
// gives): the roofline of a GEMV.
func (r *roofline) readGBps() float64 {
	w := newBestWindow(1)
	for range 4 {
		r.p.ForGrain(len(r.rd), 1<<16, func(lo, hi int) {
			r.sums[lo*len(r.sums)/len(r.rd)] += Dot(r.rd[lo:hi], r.rd[lo:hi])
		})
		w.done()
	}
	return rooflineBytes / w.bestSec / 1e9
}

// peakGFLOPs is the best of four runs of register-only FMAs on every worker
// (fmaPeak), or 0 without AVX-512.
func (r *roofline) peakGFLOPs() float64 {
	const iters = 2_000_000
	if _, ok := fmaPeak(1); !ok {
		return 0
	}
	w := newBestWindow(1)
	for range 4 {
		r.p.For(r.p.NumWorkers(), func(lo, hi int) {
			for range hi - lo {
				fmaPeak(iters)
			}
		})
		w.done()
	}
	return float64(r.p.NumWorkers()) * iters * 24 * 32 / w.bestSec / 1e9
}

func BenchmarkCopy(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	const size = 256 << 20
	src := make([]byte, size)
	dst := make([]byte, size)
	copy(dst, src) // fault the pages in
	b.SetBytes(2 * size)
	win := newBestWindow(1)
	for b.Loop() {
		p.ForGrain(size, 1<<16, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
		win.done()
	}
	b.ReportMetric(2*size/win.bestSec/1e9, "best_GB/s")
}

func BenchmarkFMAPeak(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	if _, ok := fmaPeak(1); !ok {
		b.Skip("no AVX-512")
	}
	const iters = 1_000_000
	win := newBestWindow(1)
	for b.Loop() {
		p.For(p.NumWorkers(), func(lo, hi int) {
			for range hi - lo {
				fmaPeak(iters)
			}
		})
		win.done()
	}
	flops := float64(p.NumWorkers()) * iters * 24 * 32
	b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	b.ReportMetric(flops/win.bestSec/1e9, "best_GFLOP/s")
}

type benchWeights struct {
	name  string
	esize int
	make  func(r *rand.Rand, num int) any
	run   func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int)
}

var benchDtypes = []benchWeights{
	{"f32", 4, func(r *rand.Rand, num int) any { return randVec(r, num) },
		func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
			p.LinearF32(out, x, w.([]float32), m, n, k, j0, j1)
		}},
	{"bf16", 2, func(r *rand.Rand, num int) any {
		w := make([]uint16, num)
		for i := range w {
			w[i] = f32ToBF16(float32(r.NormFloat64()))
		}
		return w
	}, func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
		p.LinearBF16(out, x, w.([]uint16), m, n, k, j0, j1)
	}},
	{"f16", 2, func(r *rand.Rand, num int) any {
		w := make([]uint16, num)
		for i := range w {
			w[i] = uint16(r.IntN(2))<<15 | uint16(10+r.IntN(8))<<10 | uint16(r.IntN(1024))
		}
		return w
	}, func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
		p.LinearF16(out, x, w.([]uint16), m, n, k, j0, j1)
	}},
}

// Shapes of a ~100M-parameter Llama layer (hidden 768, MLP 2048, vocab 32000).
var gemvShapes = []struct {
	name string
	n, k int
}{
	{"qkv_o_768x768", 768, 768},
	{"up_2048x768", 2048, 768},
	{"down_768x2048", 768, 2048},
	{"lm_head_32000x768", 32000, 768},
}

// BenchmarkLinearGEMV runs decode-shaped products (m = 1 and 4) over all
// cores, rotating over enough weight copies to miss the caches, and reports
// the weight bytes streamed per second and the ratio to copy bandwidth.
func BenchmarkLinearGEMV(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	roof := newRoofline(p)
	r := rand.New(rand.NewPCG(1, 1))
	for _, impl := range []*Impl{benchImpl(b)} {
		for _, dt := range benchDtypes {
			if dt.name == "f16" {
				continue // same loop as bf16 with a different widening
			}
			for _, sh := range gemvShapes {
				wbytes := sh.n * sh.k * dt.esize
				numCopies := max(1, coldBytes/wbytes)
				ws := make([]any, numCopies)
				for i := range ws {
					ws[i] = dt.make(r, sh.n*sh.k)
				}
				for _, m := range []int{1, 4} {
					b.Run(fmt.Sprintf("%s/%s/%s/m%d", impl, dt.name, sh.name, m), func(b *testing.B) {
						x := randVec(r, m*sh.k)
						out := make([]float32, m*sh.n)
						copyBW, readBW := roof.copyGBps(), roof.readGBps()
						i := 0
						win := newBestWindow(max(4, (1<<20)/wbytes))
						for b.Loop() {
							w := ws[i%numCopies]
							i++
							p.ForGrain(sh.n, 16, func(lo, hi int) {
								dt.run(impl, out, x, w, m, sh.n, sh.k, lo, hi)
							})
							win.done()
						}
						gbps := float64(wbytes) * float64(b.N) / b.Elapsed().Seconds() / 1e9
						best := float64(wbytes) / win.bestSec / 1e9
						b.ReportMetric(gbps, "GB/s")
						b.ReportMetric(best, "best_GB/s")
						b.ReportMetric(copyBW, "copy_GB/s")
						b.ReportMetric(readBW, "read_GB/s")
						b.ReportMetric(best/copyBW, "best_x_copy")
						b.ReportMetric(best/readBW, "best_x_read")
					})
				}
			}
		}
	}
}

// BenchmarkLinearGEMM runs prefill-shaped products (m = 512) over all cores
// and reports GFLOP/s and the fraction of the measured FMA peak.
func BenchmarkLinearGEMM(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	roof := newRoofline(p)
	r := rand.New(rand.NewPCG(2, 2))
	const m = 512
	impls := []*Impl{benchImpl(b)}
	for _, impl := range impls {
		for _, dt := range benchDtypes {
			for _, sh := range gemvShapes[:3] {
				w := dt.make(r, sh.n*sh.k)
				x := randVec(r, m*sh.k)
				out := make([]float32, m*sh.n)
				b.Run(fmt.Sprintf("%s/%s/%s/m%d", impl, dt.name, sh.name, m), func(b *testing.B) {
					benchGEMMCase(b, p, roof, 1, m, sh.n, sh.k, func(lo, hi int) {
						dt.run(impl, out, x, w, m, sh.n, sh.k, lo, hi)
					})
				})
			}
		}
	}
}

// benchGEMMCase times run, an m x n x k product split over the pool 16
// columns a grain, in the benchmark's loop and reports GFLOP/s, the best
// window of window calls, and its share of the FMA peak measured first.
func benchGEMMCase(b *testing.B, p *pool.Pool, roof *roofline, window, m, n, k int, run func(lo, hi int)) {
	peak := roof.peakGFLOPs()
	win := newBestWindow(window)
	for b.Loop() {
		p.ForGrain(n, 16, run)
		win.done()
	}
	flops := 2 * float64(m*n*k)
	b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	best := flops / win.bestSec / 1e9
	b.ReportMetric(best, "best_GFLOP/s")
	if peak > 0 {
		b.ReportMetric(peak, "peak_GFLOP/s")
		b.ReportMetric(best/peak, "best_x_peak")
	}
}

// BenchmarkDot measures the small-vector cost, where the cgo call matters.
func BenchmarkDot(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, impl := range Impls() {
		for _, num := range []int{16, 64, 128, 4096} {
			a, c := randVec(r, num), randVec(r, num)
			b.Run(fmt.Sprintf("%s/n%d", impl, num), func(b *testing.B) {
				var s float32
				for b.Loop() {
					s += impl.Dot(a, c)
				}
				_ = s
			})
		}
	}
}

// BenchmarkLinearGEMVHot runs m = 1 on one core against a weight block that
// stays in L2 (256 x 768): the kernel's own streaming rate, which must stay
// well above memory bandwidth for decode to be memory-bound.
func BenchmarkLinearGEMVHot(b *testing.B) {
	const n, k = 256, 768
	r := rand.New(rand.NewPCG(4, 4))
	for _, impl := range Impls()[1:] {
		for _, dt := range benchDtypes {
			w := dt.make(r, n*k)
			x := randVec(r, k)
			out := make([]float32, n)
			b.Run(fmt.Sprintf("%s/%s", impl, dt.name), func(b *testing.B) {
				win := newBestWindow(16)
				for b.Loop() {
					dt.run(impl, out, x, w, 1, n, k, 0, n)
					win.done()
				}
				b.ReportMetric(float64(n*k*dt.esize)/win.bestSec/1e9, "best_GB/s")
			})
		}
	}
}

// benchImpl is the implementation the benchmarks measure: the fastest, or
// the one $DEEPINFER_SIMD names (go, avx2, avx512, or avx512-novbmi: the
// AVX-512 FP8 path without its VBMI widening), to compare paths on one
// machine.
func benchImpl(b *testing.B) *Impl {
	name := os.Getenv("DEEPINFER_SIMD")
	for _, v := range f8Variants() {
		if v.String() == name {
			return v
		}
	}
	impl, err := Pick(name)
	if err != nil {
		b.Fatal(err)
	}
	return impl
}
