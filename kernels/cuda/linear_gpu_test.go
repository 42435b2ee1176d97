package cuda

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// everyWeight is an Options.GEMVMaxElems above every weight of the tests:
// every linear of up to Options.GEMVRows rows takes the GEMV kernel.
const everyWeight = 1024 << 20

// newGPUPath opens a backend whose Linear takes (see gemm_f32_input in
// ops.cu) the skinny GEMM for rows up to skinny with 16-bit weights, else
// the GEMV kernel for rows up to gemv (0 for either: off), else cuBLAS,
// with gemvMax as Options.GEMVMaxElems (0: the default).
func newGPUPath(t testing.TB, mode GEMMMode, skinny, gemv int, gemvMax int64) *Backend {
	t.Helper()
	o := Options{GEMM: mode, SkinnyRows: skinny, GEMVRows: gemv, GEMVMaxElems: gemvMax}
	if gemv == 0 {
		o.GEMVRows = -1
	}
	return newGPUOpts(t, o)
}

// linearOn runs out = x w^T (+ bias) on g from host values (x float32
// [rows, k], w in dt [n, k], bias nil or [n]) and returns out.
func linearOn(t testing.TB, g *Backend, xs []float32, rows, k int, w []byte, dt kernels.DType, n int, bias []float32) []float32 {
	t.Helper()
	x := upload(t, g, kernels.F32, kernels.F32Bytes(xs), kernels.F32, rows, k)
	wt := upload(t, g, dt, w, dt, n, k)
	var bt kernels.Tensor
	if bias != nil {
		bt = upload(t, g, kernels.F32, kernels.F32Bytes(bias), kernels.F32, n)
	}
	out, err := g.Alloc(kernels.F32, rows, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Linear(out, x, wt, bt); err != nil {
		t.Fatal(err)
	}
	v, err := kernels.ToF32(g, out)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The GEMV kernel (here for up to 8 rows, the skinny GEMM off): a row's bits
// do not depend on the other rows, and it agrees with the cuBLAS path
// (Options.GEMVRows < 0), which has the same rounding of the inputs, to
// float32 summation order.
func TestGPUGEMV(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode)                        // for its CPU backend and random source only
		gv := newGPUPath(t, mode, 0, 8, everyWeight) // every weight on the GEMV, at every row count
		ref := newGPUPath(t, mode, 0, 0, 0)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
			// The second shape has k past one unrolled group of loads
			// (8 x 256 elements a lane) with a ragged tail.
			for _, sh := range [][2]int{{1001, 2048}, {600, 8200}} {
				t.Run(fmt.Sprintf("%s/%s/%dx%d", mode, dt, sh[0], sh[1]), func(t *testing.T) {
					const m = 8
					n, k := sh[0], sh[1]
					xs, ws, bs := randVals(p.r, m*k, 1), hostBytes(dt, randVals(p.r, n*k, 0.05)), randVals(p.r, n, 1)
					run := func(g *Backend, rows int) []float32 {
						return linearOn(t, g, xs[3*k:(3+rows)*k], rows, k, ws, dt, n, bs)
					}
					five, one := run(gv, 5), run(gv, 1)
					for i := range one {
						if math.Float32bits(one[i]) != math.Float32bits(five[i]) {
							t.Fatalf("row alone differs from the row among 5 at %d: %v vs %v", i, one[i], five[i])
						}
					}
					if e := maxRelErr(five, run(ref, 5)); e > 1e-5 || math.IsNaN(e) {
						t.Errorf("GEMV vs cuBLAS: max relative difference %.3g", e)
					}
				})
			}
		}
	}
}

// skinnyShapes cover the skinny GEMM's plans (see sk_plan_for in
// gemm_skinny.cu): one K split on 32-, 64- and 128-row blocks, 2, 4, 8 and 17
// splits (the last one 8 columns long), odd n, k a multiple of 8 but not of
// 16 or 64, and row counts across the MT = 1, 2, 4, 8 variants.
var skinnyShapes = [][3]int{
	{1, 33, 48},      // one split, 32-row blocks, k not a multiple of 64
	{2, 5, 8},        // the smallest k
	{3, 257, 200},    // k a multiple of 8, not of 16
	{8, 1000, 1000},  // 4 splits (the last 232 long), 64-row blocks
	{9, 2048, 2048},  // q/o_proj: 4 splits of 512
	{17, 300, 2048},  // k/v-like: 8 splits on 32-row blocks
	{31, 40, 4104},   // 17 splits, the last 8 columns long
	{33, 8200, 136},  // one split on 128-row blocks, last block partial
	{64, 96, 200},    // 64 rows
	{64, 512, 2056},  // 64 rows, 8 splits, ragged last split
	{16, 9000, 2048}, // gate_up-like: one split, 128-row blocks
}

// The skinny GEMM against the CPU backend (at the tolerance of TestGPULinear)
// and against the cuBLAS path (same input rounding; they differ in summation
// order only), with and without bias, for both weight dtypes and modes.
// Outputs start as NaN, so an element the kernel does not write fails.
func TestGPUSkinnyGEMM(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPairOpts(t, Options{GEMM: mode, SkinnyRows: 64})
		ref := newGPUPath(t, mode, 0, 0, 0)
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
			for _, sh := range skinnyShapes {
				for _, bias := range []bool{false, true} {
					m, n, k := sh[0], sh[1], sh[2]
					t.Run(fmt.Sprintf("%s/%s/m%d_n%d_k%d/bias=%v", mode, dt, m, n, k, bias), func(t *testing.T) {
						xs, wv := randVals(p.r, m*k, 1), randVals(p.r, n*k, 0.05)
						var bs []float32
						if bias {
							bs = randVals(p.r, n, 1)
						}
						x, w := p.put(kernels.F32, xs, m, k), p.put(dt, wv, n, k)
						var bc, bg kernels.Tensor
						if bias {
							b := p.put(kernels.F32, bs, n)
							bc, bg = b.c, b.g
						}
						out := p.zeros(kernels.F32, m, n)
						p.poison(out)
						if err := p.c.Linear(out.c, x.c, w.c, bc); err != nil {
							t.Fatal(err)
						}
						if err := p.g.Linear(out.g, x.g, w.g, bg); err != nil {
							t.Fatal(err)
						}
						e := p.check("skinny linear vs cpu", out, linearTol(dt, mode))
						got := p.f32(p.g, out.g)
						cub := linearOn(t, ref, xs, m, k, hostBytes(dt, wv), dt, n, bs)
						d := maxRelErr(got, cub)
						if d > 1e-5 || math.IsNaN(d) {
							t.Errorf("skinny vs cuBLAS: max relative difference %.3g > 1e-5", d)
						}
						t.Logf("skinny %s %s m=%d n=%d k=%d bias=%v: vs cpu %.3g, vs cublas %.3g", mode, dt, m, n, k, bias, e, d)
					})
				}
			}
		}
	}
}

// invarianceRows are the batch sizes of the invariance tests.
var invarianceRows = []int{1, 2, 3, 8, 17, 32, 64}

// Batch invariance of the skinny GEMM: row r of an M-row product is
// bit-identical to row r computed alone, for every M in invarianceRows, in
// both modes, on plans with one split (32- and 128-row blocks) and with 4, 8
// and 17 splits.
func TestGPUSkinnyBatchInvariance(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode) // for its random source
		g := newGPUPath(t, mode, 64, 4, 0)
		for _, c := range []struct {
			dt   kernels.DType
			n, k int
		}{
			{kernels.BF16, 300, 2048}, {kernels.BF16, 2048, 2048}, {kernels.BF16, 8200, 264},
			{kernels.BF16, 77, 1000}, {kernels.F16, 40, 4104}, {kernels.F16, 1000, 1000},
		} {
			t.Run(fmt.Sprintf("%s/%s/n%d_k%d", mode, c.dt, c.n, c.k), func(t *testing.T) {
				const maxRows = 64
				n, k := c.n, c.k
				x := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, maxRows*k, 1)), kernels.F32, maxRows, k)
				w := upload(t, g, c.dt, hostBytes(c.dt, randVals(p.r, n*k, 0.05)), c.dt, n, k)
				b := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, n, 1)), kernels.F32, n)
				rows := func(lo, hi int) []float32 {
					xv, err := g.Rows(x, lo, hi)
					if err != nil {
						t.Fatal(err)
					}
					out, err := g.Alloc(kernels.F32, hi-lo, n)
					if err != nil {
						t.Fatal(err)
					}
					if err := g.Linear(out, xv, w, b); err != nil {
						t.Fatal(err)
					}
					return p.f32(g, out)
				}
				alone := make([][]float32, maxRows)
				for r := range maxRows {
					alone[r] = rows(r, r+1)
				}
				for _, m := range invarianceRows {
					all := rows(0, m)
					for r := range m {
						for j := range n {
							if math.Float32bits(all[r*n+j]) != math.Float32bits(alone[r][j]) {
								t.Fatalf("M=%d: row %d column %d is %v among %d rows, %v alone", m, r, j, all[r*n+j], m, alone[r][j])
							}
						}
					}
				}
				t.Logf("skinny %s %s n=%d k=%d: every row bit-identical alone and among %v rows", mode, c.dt, n, k, invarianceRows)
			})
		}
	}
}

// The skinny GEMM under CUDA Graph capture: two split-K linears and one
// single-split linear captured back to back (so the split-K counters are
// reused within one graph and across replays) replay to the eager bits,
// round after round, with new inputs uploaded between replays.
func TestGPUSkinnyGraph(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode) // for its random source
		g := newGPUPath(t, mode, 64, 4, 0)
		for _, m := range []int{1, 17, 64} {
			t.Run(fmt.Sprintf("%s/m=%d", mode, m), func(t *testing.T) {
				const k = 2048
				ns := []int{300, 2048, 8200} // 8 splits, 4 splits, one split
				x := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, m*k, 1)), kernels.F32, m, k)
				ws, bs, ys := make([]kernels.Tensor, len(ns)), make([]kernels.Tensor, len(ns)), make([]kernels.Tensor, len(ns))
				for i, n := range ns {
					ws[i] = upload(t, g, kernels.BF16, hostBytes(kernels.BF16, randVals(p.r, n*k, 0.05)), kernels.BF16, n, k)
					bs[i] = upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, n, 1)), kernels.F32, n)
					var err error
					if ys[i], err = g.Alloc(kernels.F32, m, n); err != nil {
						t.Fatal(err)
					}
				}
				step := func() error {
					for i := range ns {
						if err := g.Linear(ys[i], x, ws[i], bs[i]); err != nil {
							return err
						}
					}
					return nil
				}
				read := func() [][]float32 {
					out := make([][]float32, len(ns))
					for i := range ns {
						out[i] = p.f32(g, ys[i])
					}
					return out
				}
				graph, err := g.CaptureGraph(step)
				if err != nil {
					t.Fatal(err)
				}
				defer graph.Close()
				for round := range 3 {
					if err := g.Upload(x, kernels.F32Bytes(randVals(p.r, m*k, 1)), kernels.F32); err != nil {
						t.Fatal(err)
					}
					if err := graph.Replay(); err != nil {
						t.Fatal(err)
					}
					replayed := read()
					if err := step(); err != nil {
						t.Fatal(err)
					}
					eager := read()
					for i := range ns {
						for j := range eager[i] {
							if math.Float32bits(eager[i][j]) != math.Float32bits(replayed[i][j]) {
								t.Fatalf("round %d, n=%d: element %d replayed %v, eager %v", round, ns[i], j, replayed[i][j], eager[i][j])
							}
						}
					}
				}
				t.Logf("skinny %s m=%d: graph replay bit-identical to eager for n=%v, k=%d (3 rounds)", mode, m, ns, k)
			})
		}
	}
}

// The one-row GEMV with k within one pass of the block (8 columns a block,
// one chunk each; Options.DisableGEMVWide turns it off) gives the bits of
// the 4-column layout.
func TestGPUGEMVWide(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode) // for its random source
		narrow := newGPUOpts(t, Options{GEMM: mode, GEMVRows: 4, DisableGEMVWide: true})
		wide := newGPUPath(t, mode, 0, 4, 0)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
			for _, sh := range [][2]int{{1001, 2048}, {77, 96}, {3, 1024}} {
				n, k := sh[0], sh[1]
				xs, ws, bs := randVals(p.r, k, 1), hostBytes(dt, randVals(p.r, n*k, 0.05)), randVals(p.r, n, 1)
				want, got := linearOn(t, narrow, xs, 1, k, ws, dt, n, bs), linearOn(t, wide, xs, 1, k, ws, dt, n, bs)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s %s %dx%d: column %d = %v wide, %v narrow", mode, dt, n, k, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// GatedMLP in GEMM mode round with 16-bit weights, from Options.MLPNarrowRows rows
// (default 64), stores g, u and silu(g)*u in the weights' type: the result
// matches a host reference with those rounding points (x, g, u and the
// product to the type, float64 sums) and stays near the float32-intermediate
// path. Below the threshold, and in mode split, it is Linear, SiLUMul,
// Linear to the bit. Shapes it refuses name what is wrong.
func TestGPUGatedMLP(t *testing.T) {
	const hidden, n = 256, 384
	round := func(dt kernels.DType, v float32) float32 {
		if dt == kernels.BF16 {
			return kernels.BF16ToF32(kernels.F32ToBF16(v))
		}
		return kernels.F16ToF32(kernels.F32ToF16(v))
	}
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
			p := newPair(t, mode)
			g := p.g
			alloc := func(shape ...int) kernels.Tensor {
				ten, err := g.Alloc(kernels.F32, shape...)
				if err != nil {
					t.Fatal(err)
				}
				return ten
			}
			for _, rows := range []int{3, 63, 64, 300} {
				xs := randVals(p.r, rows*hidden, 1)
				wgu, wd := randVals(p.r, 2*n*hidden, 0.08), randVals(p.r, hidden*n, 0.08)
				x := upload(t, g, kernels.F32, kernels.F32Bytes(xs), kernels.F32, rows, hidden)
				gw := upload(t, g, dt, hostBytes(dt, wgu), dt, 2*n, hidden)
				dw := upload(t, g, dt, hostBytes(dt, wd), dt, hidden, n)
				out, gu, act := alloc(rows, hidden), alloc(rows, 2*n), alloc(rows, n)
				if err := g.GatedMLP(out, x, gw, dw, gu, act); err != nil {
					t.Fatal(err)
				}
				got := p.f32(g, out)
				out3, gu3, act3 := alloc(rows, hidden), alloc(rows, 2*n), alloc(rows, n)
				if err := g.Linear(gu3, x, gw, nil); err != nil {
					t.Fatal(err)
				}
				if err := g.SiLUMul(act3, gu3); err != nil {
					t.Fatal(err)
				}
				if err := g.Linear(out3, act3, dw, nil); err != nil {
					t.Fatal(err)
				}
				three := p.f32(g, out3)
				name := fmt.Sprintf("%s %s %d rows", mode, dt, rows)
				if mode == GEMMSplit || rows < defaultMLPNarrowRows {
					for i := range three {
						if math.Float32bits(got[i]) != math.Float32bits(three[i]) {
							t.Fatalf("%s: element %d = %v, Linear+SiLUMul+Linear gave %v", name, i, got[i], three[i])
						}
					}
					continue
				}
				ref := make([]float32, rows*hidden)
				act64 := make([]float32, n)
				for r := range rows {
					xr := make([]float32, hidden)
					for k := range hidden {
						xr[k] = round(dt, xs[r*hidden+k])
					}
					dot := func(w []float32, row, width int, v []float32) float32 {
						s := 0.0
						for k := range width {
							s += float64(round(dt, w[row*width+k])) * float64(v[k])
						}
						return float32(s)
					}
					for j := range n {
						gv, uv := round(dt, dot(wgu, j, hidden, xr)), round(dt, dot(wgu, n+j, hidden, xr))
						act64[j] = round(dt, float32(float64(gv)/(1+math.Exp(-float64(gv)))*float64(uv)))
					}
					for j := range hidden {
						ref[r*hidden+j] = dot(wd, j, n, act64)
					}
				}
				if e := maxRelErr(got, ref); !(e <= 2e-3) {
					t.Errorf("%s: max relative error %.2e against the host reference with 16-bit intermediates (want <= 2e-3)", name, e)
				}
				if e := maxRelErr(got, three); !(e <= 1e-2) {
					t.Errorf("%s: max relative error %.2e against float32 intermediates (want <= 1e-2)", name, e)
				}
			}
			x := alloc(4, hidden)
			gw := upload(t, g, dt, hostBytes(dt, make([]float32, (2*n+1)*hidden)), dt, 2*n+1, hidden)
			if err := g.GatedMLP(alloc(4, hidden), x, gw, gw, alloc(4, 2*n), alloc(4, n)); !errors.Is(err, kernels.ErrShape) || !strings.Contains(err.Error(), "gate_up") {
				t.Errorf("gate_up of %d rows: err = %v, want a shape error naming gate_up", 2*n+1, err)
			}
		}
	}
}
