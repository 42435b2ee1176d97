package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/pool"
)

// TestDequantNative checks the SIMD dequantizers of the tiled path against
// Dequantize, bit for bit, for every format.
func TestDequantNative(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	for _, typ := range QuantTypes {
		const n = 7
		k := 4 * typ.BlockSize()
		w, want := quantRows(typ, r, n, k)
		for name, dq := range nativeDequant {
			got := make([]float32, n*k+1)
			got[n*k] = 42 // must stay untouched
			dq(got, w, typ)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s %s: weight %d = %g, want %g", name, typ, i, got[i], want[i])
				}
			}
			if got[n*k] != 42 {
				t.Fatalf("%s %s: wrote past the blocks", name, typ)
			}
		}
	}
}

// TestLinearQuantTiled checks the tiled (prefill) path of LinearQuant bit
// for bit against the register path, for every format and implementation,
// m = 1, 3, 17, 64 and 200, several column splits (one call, uneven
// ranges, as pools of 1 to 3 workers cut them), and shapes whose tiles do
// not divide the columns. The register path is itself checked against
// LinearF32 over Dequantize by TestLinearQuant; here one shape is checked
// against it too.
func TestLinearQuantTiled(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	pools := []*pool.Pool{pool.New(1), pool.New(2), pool.New(3)}
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	// Under the race detector (about 20x slower here) the same cases run
	// with fewer activation rows; the tiles and splits stay.
	ms := []int{1, 3, 17, 64, 200}
	if raceEnabled {
		ms = []int{1, 5, 17}
	}
	maxM := ms[len(ms)-1]
	for _, typ := range QuantTypes {
		bs := typ.BlockSize()
		// k = 1280 gives tiles of 64 weight rows, k = 3072 tiles of 32, so
		// n = 200 spans several tiles and ends in a partial one.
		shapes := []struct{ n, k int }{{37, 2 * bs}, {200, 1280}}
		if bs == 32 {
			shapes = append(shapes, struct{ n, k int }{70, 3072})
		}
		for _, sh := range shapes {
			if sh.k%bs != 0 {
				continue
			}
			rb, _ := typ.RowBytes(sh.k)
			w, deq := quantRows(typ, r, sh.n, sh.k)
			x := randVec(r, maxM*sh.k)
			for _, impl := range Impls() {
				// Reference: the register path over all rows at once.
				ref := make([]float32, maxM*sh.n)
				impl.linearQuantRows(ref, x, w, typ, rb, maxM, sh.n, sh.k, 0, sh.n)
				if sh.n == 37 {
					f32 := make([]float32, maxM*sh.n)
					impl.LinearF32(f32, x, deq, maxM, sh.n, sh.k, 0, sh.n)
					requireBits(t, fmt.Sprintf("%s/%s rows vs LinearF32", impl, typ), f32, ref)
				}
				for _, m := range ms {
					name := fmt.Sprintf("%s/%s/n%d_k%d/m%d", impl, typ, sh.n, sh.k, m)
					want := ref[:m*sh.n]
					// One call, and uneven ranges of one call each.
					for _, cuts := range [][]int{{0, sh.n}, {0, 1, sh.n/3 + 5, sh.n - 1, sh.n}} {
						out := sentinelVec(m * sh.n)
						for c := 0; c+1 < len(cuts); c++ {
							impl.linearQuantTiled(out, x, w, typ, rb, m, sh.n, sh.k, cuts[c], cuts[c+1])
						}
						requireBits(t, fmt.Sprintf("%s tiled cuts %v", name, cuts), want, out)
					}
					// LinearQuant (whichever path m picks) over pools, as the
					// backend splits columns.
					for _, p := range pools {
						for _, grain := range []int{1, 16} {
							out := sentinelVec(m * sh.n)
							p.ForGrain(sh.n, grain, func(lo, hi int) {
								impl.LinearQuant(out, x, w, typ, m, sh.n, sh.k, lo, hi)
							})
							requireBits(t, fmt.Sprintf("%s workers=%d grain=%d", name, p.NumWorkers(), grain), want, out)
						}
					}
				}
			}
		}
	}
}

// sentinelVec is an output buffer whose cells hold a value no kernel
// computes here, so a cell left unwritten shows up.
func sentinelVec(num int) []float32 {
	v := make([]float32, num)
	for i := range v {
		v[i] = math.Float32frombits(0x7fc0dead)
	}
	return v
}

func requireBits(t *testing.T, name string, want, got []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: out[%d] = %g (%#x), want %g (%#x)", name, i, got[i], math.Float32bits(got[i]),
				want[i], math.Float32bits(want[i]))
		}
	}
}

// BenchmarkQuantGEMM runs a prefill-shaped product (m = 512 rows of x
// against 3072 x 768 weights, an MLP up projection) over all cores for
// every format, in three ways in the same run: LinearQuant (tiled path),
// the register path it replaces for m >= QuantTileRows, and LinearF32 over
// the dequantized matrix, the speed the tiled path aims at. GFLOP/s counts
// 2*m*n*k; x_f32 is the best window over the F32 GEMM's best window, tok/s
// the rows of x per second of the best window.
//
//	go test -run XXX -bench QuantGEMM -benchtime 20x ./kernels/cpu/simd
func BenchmarkQuantGEMM(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	r := rand.New(rand.NewPCG(8, 8))
	impl := benchImpl(b)
	const m, n, k = 512, 3072, 768
	x := randVec(r, m*k)
	out := make([]float32, m*n)
	flops := 2 * float64(m*n*k)
	run := func(b *testing.B, f func(lo, hi int)) float64 {
		win := newBestWindow(1)
		for b.Loop() {
			p.ForGrain(n, 16, f)
			win.done()
		}
		best := flops / win.bestSec / 1e9
		b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		b.ReportMetric(best, "best_GFLOP/s")
		b.ReportMetric(m/win.bestSec, "best_tok/s")
		return best
	}
	for _, typ := range QuantTypes {
		w, deq := quantRows(typ, r, n, k)
		rb, _ := typ.RowBytes(k)
		var f32Best float64
		b.Run(fmt.Sprintf("%s/%s/f32/m%d_%dx%d", impl, typ, m, n, k), func(b *testing.B) {
			f32Best = run(b, func(lo, hi int) { impl.LinearF32(out, x, deq, m, n, k, lo, hi) })
		})
		b.Run(fmt.Sprintf("%s/%s/tiled/m%d_%dx%d", impl, typ, m, n, k), func(b *testing.B) {
			best := run(b, func(lo, hi int) { impl.LinearQuant(out, x, w, typ, m, n, k, lo, hi) })
			if f32Best > 0 {
				b.ReportMetric(best/f32Best, "x_f32")
			}
		})
		b.Run(fmt.Sprintf("%s/%s/rows/m%d_%dx%d", impl, typ, m, n, k), func(b *testing.B) {
			best := run(b, func(lo, hi int) { impl.linearQuantRows(out, x, w, typ, rb, m, n, k, lo, hi) })
			if f32Best > 0 {
				b.ReportMetric(best/f32Best, "x_f32")
			}
		})
	}
}
