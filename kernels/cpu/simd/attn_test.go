package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// ulps is the distance between two float32 values of the same sign in
// units in the last place (their bit patterns' difference).
func ulps(a, b float32) int64 {
	d := int64(math.Float32bits(a)) - int64(math.Float32bits(b))
	if d < 0 {
		d = -d
	}
	return d
}

// expSweep returns every step-th float32 between lo and hi (bit patterns
// of one sign: -0 to lo for negative lo, +0 to hi for positive hi).
func expSweep(from, to float32, step uint32) []float32 {
	var out []float32
	for b := math.Float32bits(from); b <= math.Float32bits(to); b += step {
		out = append(out, math.Float32frombits(b))
	}
	return out
}

// TestExpAccuracy checks Exp on every path against the correctly rounded
// exponential, float32(math.Exp(float64(x))), over sweeps of softmax inputs
// (x <= 0, subnormal results included) and of positive inputs (SiLU's
// e^-x): at most 1 ulp, and the special values exactly. An exhaustive run
// over every float32 in [-110, 89] measured the same bound (1 ulp).
func TestExpAccuracy(t *testing.T) {
	step := uint32(997)
	if raceEnabled || testing.Short() {
		step = 104729
	}
	xs := append(expSweep(float32(math.Copysign(0, -1)), -110, step), expSweep(0, 89, step)...)
	// Around the subnormal boundary, underflow to zero, and overflow.
	for _, c := range []float32{-87.33655, -87.33654, -103.27893, -103.97208, -103.972084, -104, 88.72283, 88.72284} {
		for d := -64; d <= 64; d++ {
			xs = append(xs, math.Float32frombits(uint32(int32(math.Float32bits(c))+int32(d))))
		}
	}
	for _, p := range Impls() {
		got := make([]float32, len(xs))
		p.Exp(got, xs)
		var worst int64
		var worstX float32
		for i, x := range xs {
			want := float32(math.Exp(float64(x)))
			if d := ulps(got[i], want); d > worst {
				worst, worstX = d, x
			}
		}
		t.Logf("%s: %d inputs, max error %d ulp (x = %g)", p, len(xs), worst, worstX)
		if worst > 1 {
			t.Errorf("%s: Exp(%g) is %d ulp from the correctly rounded value", p, worstX, worst)
		}
		specials := []struct{ x, want float32 }{
			{float32(math.Inf(-1)), 0}, {-1e30, 0}, {-104, 0}, {-200, 0},
			{0, 1}, {float32(math.Copysign(0, -1)), 1},
			{float32(math.Inf(1)), float32(math.Inf(1))}, {89, float32(math.Inf(1))}, {1e30, float32(math.Inf(1))},
		}
		for _, sp := range specials {
			var out [1]float32
			p.Exp(out[:], []float32{sp.x})
			if math.Float32bits(out[0]) != math.Float32bits(sp.want) {
				t.Errorf("%s: Exp(%g) = %g, want %g", p, sp.x, out[0], sp.want)
			}
		}
		nan := []float32{float32(math.NaN()), 1, float32(math.NaN())}
		p.Exp(nan, nan)
		if !isNaN32(nan[0]) || !isNaN32(nan[2]) || nan[1] != float32(math.E) {
			t.Errorf("%s: Exp(NaN, 1, NaN) = %v", p, nan)
		}
	}
}

// TestExpMatchesGo: every path gives expGo's bits, over a dense sweep of
// the whole clamped range and the values outside it, at every vector
// length and offset (tails included).
func TestExpMatchesGo(t *testing.T) {
	step := uint32(97)
	if raceEnabled || testing.Short() {
		step = 9973
	}
	xs := append(expSweep(float32(math.Copysign(0, -1)), -120, step), expSweep(0, 100, step)...)
	xs = append(xs, float32(math.Inf(-1)), float32(math.Inf(1)), -1e38, 1e38)
	want := make([]float32, len(xs))
	for i, x := range xs {
		want[i] = expGo(x)
	}
	for _, p := range Impls() {
		got := make([]float32, len(xs))
		p.Exp(got, xs)
		for i := range xs {
			if !sameBits(got[i], want[i]) {
				t.Fatalf("%s: Exp(%g) = %g (%#08x), go %g (%#08x)", p, xs[i], got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
		for n := range 40 {
			for off := range 3 {
				dst := filled(n + off + 1)
				p.Exp(dst[off:], xs[1000+off:1000+off+n])
				for i := range n {
					if !sameBits(dst[off+i], want[1000+off+i]) {
						t.Fatalf("%s: len %d offset %d: element %d = %g, go %g", p, n, off, i, dst[off+i], want[1000+off+i])
					}
				}
				if math.Float32bits(dst[off+n]) != 0x7fc0dead {
					t.Fatalf("%s: len %d: Exp wrote past len(src)", p, n)
				}
			}
		}
	}
}

// softmaxCase is one OnlineSoftmax call: m rows of n scores, row i seeing
// [lo[i], hi[i]), with a running state.
type softmaxCase struct {
	s              []float32
	m, n           int
	scale          float32
	lo, hi         []int32
	rowMax, rowSum []float32
	alpha          []float32
	firstTile      bool
}

func newSoftmaxCase(r *rand.Rand, m, n int, firstTile bool) *softmaxCase {
	c := &softmaxCase{s: make([]float32, m*n), m: m, n: n, scale: 0.125 + r.Float32(),
		lo: make([]int32, m), hi: make([]int32, m), rowMax: make([]float32, m), rowSum: make([]float32, m),
		alpha: make([]float32, m), firstTile: firstTile}
	for i := range c.s {
		c.s[i] = float32(r.NormFloat64() * 8)
	}
	for i := range m {
		a, b := r.IntN(n+1), r.IntN(n+1)
		switch r.IntN(4) {
		case 0: // everything
			a, b = 0, n
		case 1: // a causal prefix
			a = 0
		}
		c.lo[i], c.hi[i] = int32(a), int32(b)
		c.rowMax[i], c.rowSum[i] = float32(math.Inf(-1)), 0
		if !firstTile {
			c.rowMax[i], c.rowSum[i] = float32(r.NormFloat64()*8), 1+float32(r.Float64()*100)
		}
	}
	return c
}

func (c *softmaxCase) clone() *softmaxCase {
	d := *c
	d.s = append([]float32(nil), c.s...)
	d.rowMax = append([]float32(nil), c.rowMax...)
	d.rowSum = append([]float32(nil), c.rowSum...)
	d.alpha = append([]float32(nil), c.alpha...)
	return &d
}

func (c *softmaxCase) run(p *Impl) {
	p.OnlineSoftmax(c.s, c.m, c.n, c.scale, c.lo, c.hi, c.rowMax, c.rowSum, c.alpha)
}

func sameSlices(a, b []float32) int {
	for i := range a {
		if !sameBits(a[i], b[i]) {
			return i
		}
	}
	return -1
}

// TestOnlineSoftmax checks every path against the pure-Go one (bit for
// bit) and the Go path against a float64 softmax step; that a row's bits
// do not depend on the other rows or on masked keys past its range; and
// that a row seeing nothing is left as an exact no-op.
func TestOnlineSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, m := range []int{1, 2, 5, 8} {
		for _, n := range []int{1, 3, 15, 16, 17, 31, 33, 64, 100, 128} {
			for _, first := range []bool{true, false} {
				c := newSoftmaxCase(r, m, n, first)
				want := c.clone()
				want.run(goImpl)
				checkSoftmaxRef(t, c, want)
				for _, p := range Impls() {
					got := c.clone()
					got.run(p)
					for name, pair := range map[string][2][]float32{
						"s": {got.s, want.s}, "rowMax": {got.rowMax, want.rowMax},
						"rowSum": {got.rowSum, want.rowSum}, "alpha": {got.alpha, want.alpha},
					} {
						if i := sameSlices(pair[0], pair[1]); i >= 0 {
							t.Fatalf("%s m=%d n=%d first=%v: %s[%d] = %g, go %g", p, m, n, first, name, i, pair[0][i], pair[1][i])
						}
					}
					// Row 0 alone, in a tile cut right after its last key
					// (a decode row's tile), gives the same bits.
					if hi := int(c.hi[0]); hi > int(c.lo[0]) {
						one := &softmaxCase{s: append([]float32(nil), c.s[:hi]...), m: 1, n: hi, scale: c.scale,
							lo: c.lo[:1], hi: c.hi[:1], rowMax: []float32{c.rowMax[0]}, rowSum: []float32{c.rowSum[0]},
							alpha: make([]float32, 1)}
						one.run(p)
						if i := sameSlices(one.s, want.s[:hi]); i >= 0 || !sameBits(one.rowMax[0], want.rowMax[0]) ||
							!sameBits(one.rowSum[0], want.rowSum[0]) || !sameBits(one.alpha[0], want.alpha[0]) {
							t.Fatalf("%s m=%d n=%d: row 0 alone in a %d-key tile differs (score %d)", p, m, n, hi, i)
						}
					}
				}
			}
		}
	}
}

// checkSoftmaxRef compares one step (in, then out) with float64 math.
func checkSoftmaxRef(t *testing.T, in, out *softmaxCase) {
	t.Helper()
	for i := range in.m {
		a, b := int(in.lo[i]), int(in.hi[i])
		row := out.s[i*in.n : (i+1)*in.n]
		if a >= b {
			if out.alpha[i] != 1 || !sameBits(out.rowMax[i], in.rowMax[i]) || !sameBits(out.rowSum[i], in.rowSum[i]) {
				t.Fatalf("row %d sees nothing: state changed", i)
			}
			for j, v := range row {
				if math.Float32bits(v) != 0 {
					t.Fatalf("row %d sees nothing: s[%d] = %g", i, j, v)
				}
			}
			continue
		}
		mNew := float64(in.rowMax[i])
		for _, v := range in.s[i*in.n+a : i*in.n+b] {
			mNew = math.Max(mNew, float64(v*in.scale)) // the max of the rounded products
		}
		alphaArg := float64(in.rowMax[i]) - mNew
		alpha := math.Exp(alphaArg)
		sum := float64(in.rowSum[i]) * alpha
		for j, v := range in.s[i*in.n : (i+1)*in.n] {
			want, arg := 0.0, 0.0
			if j >= a && j < b {
				arg = float64(v)*float64(in.scale) - mNew
				want = math.Exp(arg)
			}
			sum += want
			// The argument rounded to float32 (half an ulp of |arg|), then
			// Exp's ulp.
			if math.Abs(float64(row[j])-want) > (0x1p-24*math.Abs(arg)+0x1p-23)*want+1e-44 {
				t.Fatalf("row %d: p[%d] = %g, want %g", i, j, row[j], want)
			}
		}
		if float64(out.rowMax[i]) != mNew || math.Abs(float64(out.alpha[i])-alpha) > (0x1p-24*math.Abs(alphaArg)+0x1p-23)*alpha+1e-44 ||
			math.Abs(float64(out.rowSum[i])-sum) > 1e-6*sum {
			t.Fatalf("row %d: max %g alpha %g sum %g, want %g %g %g", i, out.rowMax[i], out.alpha[i], out.rowSum[i], mNew, alpha, sum)
		}
	}
}

// gatherCase draws a gather table of n rows out of nw rows of w (stride
// ldw >= k, repeats allowed).
func gatherCase(r *rand.Rand, n, nw, ldw int) []int32 {
	rows := make([]int32, n)
	for j := range rows {
		rows[j] = int32(r.IntN(nw))
	}
	return rows
}

// TestLinearF32Gather: the gathered product is bit for bit LinearF32 on
// the rows copied into a dense matrix, on every path; LinearF16Gather over
// rows of halves is the same over the rows widened.
func TestLinearF32Gather(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, half := range []bool{false, true} {
		for _, sh := range []struct{ m, n, k int }{
			{1, 1, 1}, {1, 7, 0}, {1, 9, 17}, {2, 5, 16}, {3, 13, 33}, {3, 128, 64}, {4, 128, 144}, {5, 17, 48},
			{8, 128, 144}, {9, 3, 100}, {40, 128, 144}, {16, 64, 576}, {3, 11, 1100}, {6, 10, 31}, {7, 9, 70},
		} {
			ldw := sh.k + r.IntN(5)
			nw := 2*sh.n + 1
			w, wh := randVec(r, nw*ldw), []uint16(nil)
			if half {
				wh = randHalves(r, nw*ldw)
				w = widenHalves(wh)
			}
			x := randVec(r, sh.m*sh.k)
			rows := gatherCase(r, sh.n, nw, ldw)
			dense := make([]float32, sh.n*sh.k)
			for j, rw := range rows {
				copy(dense[j*sh.k:(j+1)*sh.k], w[int(rw)*ldw:])
			}
			want := make([]float32, sh.m*sh.n)
			goImpl.LinearF32(want, x, dense, sh.m, sh.n, sh.k, 0, sh.n)
			for _, p := range Impls() {
				got := filled(sh.m*sh.n + 1)
				if half {
					p.LinearF16Gather(got, x, wh, rows, ldw, sh.m, sh.k)
				} else {
					p.LinearF32Gather(got, x, w, rows, ldw, sh.m, sh.k)
				}
				if i := sameSlices(got[:sh.m*sh.n], want); i >= 0 {
					t.Fatalf("%s %v half=%v: out[%d] = %g, LinearF32 %g", p, sh, half, i, got[i], want[i])
				}
				if math.Float32bits(got[sh.m*sh.n]) != 0x7fc0dead {
					t.Fatalf("%s %v half=%v: wrote past m*n", p, sh, half)
				}
			}
		}
	}
}

// randHalves returns n IEEE halves of random values, some of them
// subnormal (below 2^-14) and some zero.
func randHalves(r *rand.Rand, n int) []uint16 {
	h := make([]uint16, n)
	for i := range h {
		v := float32(r.NormFloat64())
		switch r.IntN(8) {
		case 0:
			v *= 1e-6 // a subnormal half
		case 1:
			v = 0
		}
		h[i] = F32ToF16(v)
	}
	return h
}

// widenHalves is every half of h widened to float32 (exact).
func widenHalves(h []uint16) []float32 {
	f := make([]float32, len(h))
	f16ToF32Go(f, h)
	return f
}

// TestAccumRows checks every path against the pure-Go one, the Go path
// against float64 sums, and that a row's bits do not depend on the other
// rows of the call or on keys it gives probability 0 (even where those
// rows of w hold infinities); AccumRowsF16 over rows of halves gives the
// bits of AccumRows over the rows widened.
func TestAccumRows(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, half := range []bool{false, true} {
		for _, sh := range []struct{ m, n, k int }{
			{1, 1, 1}, {1, 0, 16}, {1, 5, 7}, {2, 17, 16}, {3, 9, 33}, {3, 128, 64}, {4, 128, 128}, {5, 31, 64},
			{8, 128, 128}, {7, 20, 100}, {40, 128, 128}, {9, 64, 512}, {2, 3, 200}, {6, 11, 50}, {3, 10, 24},
		} {
			ldw := sh.k + 16 + r.IntN(5)
			nw := 2*sh.n + 2
			w, wh := randVec(r, nw*ldw), []uint16(nil)
			if half {
				wh = randHalves(r, nw*ldw)
			}
			for c := range ldw { // row nw-1: infinities, only ever given p = 0
				w[(nw-1)*ldw+c] = float32(math.Inf(1 - 2*(c%2)))
				if half {
					wh[(nw-1)*ldw+c] = 0x7c00 | uint16(c%2)<<15
				}
			}
			if half {
				w = widenHalves(wh)
			}
			rows := gatherCase(r, sh.n, nw-1, ldw)
			probs := make([]float32, sh.m*sh.n)
			for i := range probs {
				if r.IntN(5) > 0 {
					probs[i] = r.Float32()
				}
			}
			alpha := make([]float32, sh.m)
			for i := range alpha {
				alpha[i] = []float32{0, 1, r.Float32()}[r.IntN(3)]
			}
			acc0 := randVec(r, sh.m*sh.k)
			want := append([]float32(nil), acc0...)
			goImpl.AccumRows(want, alpha, probs, w, rows, ldw, sh.m, sh.k)
			for i := range sh.m {
				for c := range sh.k {
					ref := float64(acc0[i*sh.k+c]) * float64(alpha[i])
					var mag float64
					for j, rw := range rows {
						v := float64(probs[i*sh.n+j]) * float64(w[int(rw)*ldw+c])
						ref += v
						mag += math.Abs(v)
					}
					if got := float64(want[i*sh.k+c]); math.Abs(got-ref) > 1e-6*(mag+math.Abs(float64(acc0[i*sh.k+c])))+1e-30 {
						t.Fatalf("go %v: acc[%d][%d] = %g, want %g", sh, i, c, got, ref)
					}
				}
			}
			accum := func(p *Impl, acc, alpha, probs []float32, rows []int32, m int) {
				if half {
					p.AccumRowsF16(acc, alpha, probs, wh, rows, ldw, m, sh.k)
				} else {
					p.AccumRows(acc, alpha, probs, w, rows, ldw, m, sh.k)
				}
			}
			for _, p := range Impls() {
				got := append([]float32(nil), acc0...)
				accum(p, got, alpha, probs, rows, sh.m)
				if i := sameSlices(got, want); i >= 0 {
					t.Fatalf("%s %v half=%v: acc[%d] = %g, go %g", p, sh, half, i, got[i], want[i])
				}
				// The last row alone, with two extra keys of probability 0
				// (one of them the row of infinities), gives the same bits.
				i := sh.m - 1
				rows2 := append(append([]int32(nil), rows...), int32(nw-1), 0)
				probs2 := append(append([]float32(nil), probs[i*sh.n:(i+1)*sh.n]...), 0, 0)
				one := append([]float32(nil), acc0[i*sh.k:(i+1)*sh.k]...)
				accum(p, one, alpha[i:], probs2, rows2, 1)
				if j := sameSlices(one, want[i*sh.k:(i+1)*sh.k]); j >= 0 {
					t.Fatalf("%s %v half=%v: last row alone with masked keys: acc[%d] = %g, batch %g", p, sh, half, j, one[j], want[i*sh.k+j])
				}
			}
		}
	}
}

func TestAttnPanicsOnBadShapes(t *testing.T) {
	p := Default()
	f := func(n int) []float32 { return make([]float32, n) }
	h := func(n int) []uint16 { return make([]uint16, n) }
	i32 := func(v ...int32) []int32 { return v }
	tests := []panicCase{
		{"exp short dst", func() { p.Exp(f(3), f(4)) }},
		{"softmax short s", func() { p.OnlineSoftmax(f(7), 2, 4, 1, i32(0, 0), i32(4, 4), f(2), f(2), f(2)) }},
		{"softmax short state", func() { p.OnlineSoftmax(f(8), 2, 4, 1, i32(0, 0), i32(4, 4), f(2), f(1), f(2)) }},
		{"softmax hi past n", func() { p.OnlineSoftmax(f(8), 2, 4, 1, i32(0, 0), i32(4, 5), f(2), f(2), f(2)) }},
		{"softmax negative lo", func() { p.OnlineSoftmax(f(8), 2, 4, 1, i32(0, -1), i32(4, 4), f(2), f(2), f(2)) }},
		{"gather short out", func() { p.LinearF32Gather(f(3), f(8), f(16), i32(0, 1), 4, 2, 4) }},
		{"gather row past w", func() { p.LinearF32Gather(f(4), f(8), f(16), i32(0, 3), 5, 2, 4) }},
		{"gather negative row", func() { p.LinearF32Gather(f(4), f(8), f(16), i32(-1, 0), 4, 2, 4) }},
		{"accum short acc", func() { p.AccumRows(f(7), f(2), f(4), f(16), i32(0, 1), 4, 2, 4) }},
		{"accum short p", func() { p.AccumRows(f(8), f(2), f(3), f(16), i32(0, 1), 4, 2, 4) }},
		{"accum row past w", func() { p.AccumRows(f(8), f(2), f(4), f(16), i32(0, 4), 4, 2, 4) }},
		{"f16 gather short out", func() { p.LinearF16Gather(f(3), f(8), h(16), i32(0, 1), 4, 2, 4) }},
		{"f16 gather row past w", func() { p.LinearF16Gather(f(4), f(8), h(16), i32(0, 3), 5, 2, 4) }},
		{"f16 accum short p", func() { p.AccumRowsF16(f(8), f(2), f(3), h(16), i32(0, 1), 4, 2, 4) }},
		{"f16 accum row past w", func() { p.AccumRowsF16(f(8), f(2), f(4), h(16), i32(0, 4), 4, 2, 4) }},
	}
	expectPanics(t, tests)
}

// BenchmarkExp: the exponential over a softmax tile's worth of scores
// against math.Exp (the scalar loop it replaced).
func BenchmarkExp(b *testing.B) {
	p := benchImpl(b)
	r := rand.New(rand.NewPCG(1, 2))
	const n = 1024
	src, dst := make([]float32, n), make([]float32, n)
	for i := range src {
		src[i] = -float32(r.Float64() * 30)
	}
	b.Run(fmt.Sprintf("%s/n=%d", p, n), func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			p.Exp(dst, src)
		}
	})
	b.Run(fmt.Sprintf("math.Exp/n=%d", n), func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			for i, x := range src {
				dst[i] = float32(math.Exp(float64(x)))
			}
		}
	})
}

// TestSiLUMul checks every path against the pure-Go one (bit for bit, every
// length and tail) and the Go path against float64 silu over a sweep of
// inputs, large magnitudes and specials included.
func TestSiLUMul(t *testing.T) {
	step := uint32(4099)
	if raceEnabled || testing.Short() {
		step = 104729
	}
	gate := append(expSweep(float32(math.Copysign(0, -1)), -200, step), expSweep(0, 200, step)...)
	gate = append(gate, -1e30, 1e30, float32(math.Inf(1)), float32(math.Inf(-1)), -104, -88, -87, 88, 89)
	r := rand.New(rand.NewPCG(27, 28))
	up := make([]float32, len(gate))
	for i := range up {
		up[i] = float32(r.NormFloat64())
	}
	want := make([]float32, len(gate))
	siluMulGo(want, gate, up)
	var worst float64
	for i, g := range gate {
		x := float64(g)
		ref := x / (1 + math.Exp(-x)) * float64(up[i])
		if math.IsInf(x, -1) {
			ref = 0
		}
		if math.IsNaN(ref) {
			t.Fatalf("reference NaN at %g", g)
		}
		if math.IsInf(ref, 0) {
			if float64(want[i]) != ref {
				t.Errorf("silu(%g)*%g = %g, want %g", g, up[i], want[i], ref)
			}
			continue
		}
		// Near the subnormal range silu(x) (x tiny, or e^-|x| for x <
		// -87) carries fewer bits: an absolute error of a few subnormal
		// ulps, scaled by up.
		diff := math.Abs(float64(want[i]) - ref)
		ua := math.Abs(float64(up[i]))
		if diff > 4*0x1p-24*math.Abs(ref)+(ua+1)*0x1p-149+math.Abs(x)*ua*0x1p-148 {
			t.Errorf("silu(%g)*%g = %g, want %g", g, up[i], want[i], ref)
		}
		if math.Abs(ref) >= 0x1p-100 {
			worst = max(worst, diff/math.Abs(ref))
		}
	}
	t.Logf("go: %d inputs, max relative error %.3g (%.2f ulp) for results above 2^-100", len(gate), worst, worst/0x1p-24)
	if worst > 4*0x1p-24 {
		t.Errorf("SiLUMul: relative error %g", worst)
	}
	for _, p := range Impls() {
		got := filled(len(gate) + 1)
		p.SiLUMul(got, gate, up)
		if i := sameSlices(got[:len(gate)], want); i >= 0 {
			t.Fatalf("%s: silu(%g)*%g = %g, go %g", p, gate[i], up[i], got[i], want[i])
		}
		if math.Float32bits(got[len(gate)]) != 0x7fc0dead {
			t.Fatalf("%s: SiLUMul wrote past len(gate)", p)
		}
		for n := range 40 {
			dst := filled(n + 1)
			p.SiLUMul(dst, gate[500:500+n], up[500:500+n])
			if i := sameSlices(dst[:n], want[500:500+n]); i >= 0 || math.Float32bits(dst[n]) != 0x7fc0dead {
				t.Fatalf("%s: len %d differs at %d", p, n, i)
			}
		}
	}
}

// TestScaleRows: every path gives scaleRowsGo's bits, 1 to 4 rows of
// widths around the vector lengths (0 to 40, 256, 257), into another buffer
// and in place, with tiny, huge, zero and infinite values, and writes
// nothing past its rows.
func TestScaleRows(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	val := func() float32 {
		switch r.IntN(12) {
		case 0:
			return float32(r.NormFloat64()) * 1e-42 // subnormal
		case 1:
			return float32(r.NormFloat64()) * 1e37
		case 2:
			return float32(math.Copysign(0, r.NormFloat64()))
		case 3:
			return float32(math.Inf(1 - 2*r.IntN(2)))
		}
		return float32(r.NormFloat64())
	}
	widths := []int{256, 257}
	for n := range 41 {
		widths = append(widths, n)
	}
	for _, n := range widths {
		for rows := 1; rows <= 4; rows++ {
			x, w := make([]float32, rows*n), make([]float32, n)
			for i := range x {
				x[i] = val()
			}
			for i := range w {
				w[i] = val()
			}
			var s [4]float32
			for i := range rows {
				s[i] = float32(r.Float64()*4 + 1e-3)
			}
			s[r.IntN(rows)] = val()
			want := make([]float32, rows*n)
			scaleRowsGo(want, x, w, n, s, rows)
			for _, p := range Impls() {
				got := filled(rows*n + 1)
				p.ScaleRows(got, x, w, n, s, rows)
				if i := sameSlices(got[:rows*n], want); i >= 0 || math.Float32bits(got[rows*n]) != 0x7fc0dead {
					t.Fatalf("%s: %d rows of %d: element %d differs, or a write past the rows", p, rows, n, i)
				}
				inPlace := append([]float32(nil), x...)
				p.ScaleRows(inPlace, inPlace, w, n, s, rows)
				if i := sameSlices(inPlace, want); i >= 0 {
					t.Fatalf("%s: %d rows of %d in place: element %d differs", p, rows, n, i)
				}
			}
		}
	}
}

// TestLinearF32KMajor checks every path, over strided rows and a k-major
// w, against LinearF32 of the pure-Go path on the same rows and w
// transposed, bit for bit, including signed zeros, and that nothing
// outside the m rows and n columns of out is written.
func TestLinearF32KMajor(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	for _, sh := range []struct {
		name    string
		m, n, k int
	}{
		{"one output", 1, 1, 1},
		{"empty k", 2, 7, 0},
		{"k below a lane step", 3, 9, 7},
		{"k = 8 (no lane l+8)", 2, 16, 8},
		{"k = 9", 2, 16, 9},
		{"MLA absorption", 64, 128, 32},
		{"odd rows, column tail", 5, 37, 32},
		{"long k", 7, 24, 100},
		{"k = 16", 4, 17, 16},
		{"k = 48", 9, 31, 48},
		{"one row, wide", 1, 300, 33},
		{"zero products", 3, 20, 40},
	} {
		t.Run(sh.name, func(t *testing.T) {
			ldx, ldo := sh.k+r.IntN(9), sh.n+r.IntN(9)
			x := randVec(r, max(sh.m*ldx, 1))
			w := randVec(r, sh.k*sh.n)
			if sh.name == "zero products" { // -0 products: the canonical sums start at +0
				for i := range x {
					x[i] = float32(math.Copysign(0, float64(x[i])))
				}
			}
			dense := make([]float32, sh.n*sh.k) // w transposed: [n][k]
			for kk := range sh.k {
				for c := range sh.n {
					dense[c*sh.k+kk] = w[kk*sh.n+c]
				}
			}
			xs := make([]float32, sh.m*sh.k) // x's rows packed
			for i := range sh.m {
				copy(xs[i*sh.k:(i+1)*sh.k], x[i*ldx:])
			}
			want := make([]float32, sh.m*sh.n)
			goImpl.LinearF32(want, xs, dense, sh.m, sh.n, sh.k, 0, sh.n)
			for _, p := range Impls() {
				size := sh.m * ldo
				got := filled(size + 1)
				p.LinearF32KMajor(got, ldo, x, ldx, w, sh.m, sh.n, sh.k)
				for i := range sh.m {
					for c := range ldo {
						g := got[i*ldo+c]
						if c >= sh.n {
							if math.Float32bits(g) != 0x7fc0dead {
								t.Fatalf("%s: wrote out[%d][%d] past n", p, i, c)
							}
							continue
						}
						if wv := want[i*sh.n+c]; math.Float32bits(g) != math.Float32bits(wv) {
							t.Fatalf("%s: out[%d][%d] = %g, LinearF32 %g", p, i, c, g, wv)
						}
					}
				}
				if math.Float32bits(got[size]) != 0x7fc0dead {
					t.Fatalf("%s: wrote past m rows", p)
				}
			}
		})
	}
}

// TestPrefetchRows: PrefetchRows accepts the rows LinearF32Gather
// accepts, on every path, and panics where a row falls outside w.
func TestPrefetchRows(t *testing.T) {
	w := make([]float32, 10*24)
	for _, tc := range []struct {
		name      string
		rows      []int32
		ldw, k    int
		wantPanic bool
	}{
		{"no rows", nil, 24, 20, false},
		{"rows in w", []int32{0, 9, 3, 3}, 24, 24, false},
		{"k = 0", []int32{9}, 24, 0, false},
		{"row past w", []int32{10}, 24, 24, true},
		{"negative row", []int32{-1}, 24, 8, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range Impls() {
				func() {
					defer func() {
						if got := recover() != nil; got != tc.wantPanic {
							t.Fatalf("%s: panicked %v, want %v", p, got, tc.wantPanic)
						}
					}()
					p.PrefetchRows(w, tc.rows, tc.ldw, tc.k)
				}()
			}
		})
	}
}

// TestAccumRowsPrefetch: AccumRowsPrefetch gives AccumRows' bits on every
// path, whatever rows it is asked to prefetch.
func TestAccumRowsPrefetch(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	for _, sh := range []struct {
		name     string
		m, n, k  int
		pfN, pfK int
	}{
		{"MLA decode tile", 8, 128, 128, 128, 144},
		{"one key", 8, 1, 128, 128, 144},
		{"no keys", 4, 0, 64, 9, 144},
		{"odd rows and width", 7, 33, 100, 5, 100},
		{"nothing to prefetch", 5, 17, 48, 0, 0},
		{"more prefetch than steps", 1, 2, 16, 40, 144},
	} {
		t.Run(sh.name, func(t *testing.T) {
			const ldw = 160
			nw := 200
			w := randVec(r, nw*ldw)
			rows, pf := make([]int32, sh.n), make([]int32, sh.pfN)
			for j := range rows {
				rows[j] = int32(r.IntN(nw))
			}
			for j := range pf {
				pf[j] = int32(r.IntN(nw))
			}
			probs := randVec(r, max(sh.m*sh.n, 1))
			alpha := randVec(r, sh.m)
			acc0 := randVec(r, sh.m*sh.k)
			for _, p := range Impls() {
				want := append([]float32(nil), acc0...)
				p.AccumRows(want, alpha, probs, w, rows, ldw, sh.m, sh.k)
				got := append([]float32(nil), acc0...)
				p.AccumRowsPrefetch(got, alpha, probs, w, rows, ldw, sh.m, sh.k, pf, sh.pfK)
				if i := sameSlices(got, want); i >= 0 {
					t.Fatalf("%s: acc[%d] = %g, AccumRows %g", p, i, got[i], want[i])
				}
			}
		})
	}
}

// BenchmarkLinearF32Gather: decode attention's scores, the m query rows of
// one KV head against 576 gathered key rows (every other row of a larger
// cache, in the caches): grouped-query heads of 64 (m = 2, 3, 4) and the
// default model's 8 latent heads of 144:
//
//	DEEPINFER_SIMD=avx2 go test -run X -bench LinearF32Gather -benchtime 20000x ./kernels/cpu/simd
//
// On the 2-core Zen 4 VM of BENCH.md, AVX2 path, three alternating runs of
// the old and new binaries, once three and four rows took one pass (each
// key row read once, not once per pair of rows): m = 3 8.8-9.5 -> 5.8-7.1
// µs, m = 4 12.1-13.2 -> 8.2-9.7, m = 8 at 144 39.0-40.0 -> 31.8-37.2; m =
// 2 (unchanged) 6.3-7.1 and 5.0-6.0 in the same runs.
func BenchmarkLinearF32Gather(b *testing.B) {
	impl := benchImpl(b)
	r, w, rows, ldw := benchGathered()
	n := len(rows)
	for _, sh := range []struct{ m, k int }{{2, 64}, {3, 64}, {4, 64}, {8, 144}} {
		x := randVec(r, sh.m*sh.k)
		out := make([]float32, sh.m*n)
		b.Run(fmt.Sprintf("%s/m%d_k%d", impl, sh.m, sh.k), func(b *testing.B) {
			for b.Loop() {
				impl.LinearF32Gather(out, x, w, rows, ldw, sh.m, sh.k)
			}
		})
	}
}

// BenchmarkAccumRows: decode attention's P·V, the m query rows of one KV
// head over 576 gathered value rows (as BenchmarkLinearF32Gather):
//
//	DEEPINFER_SIMD=avx2 go test -run X -bench AccumRows -benchtime 20000x ./kernels/cpu/simd
//
// On the 2-core Zen 4 VM of BENCH.md, AVX2 path, three alternating runs of
// the old and new binaries, once three rows took one pass (3 x 2 registers
// of sums) rather than a pair and a single row: m = 3 7.8-8.3 -> 5.2-5.6
// µs. Four rows in one pass (4 x 2) were tried too and ran slower than two
// pairs (m = 4 6.2-6.6 -> 7.3-9.9 µs): not kept.
func BenchmarkAccumRows(b *testing.B) {
	impl := benchImpl(b)
	r, w, rows, ldw := benchGathered()
	n := len(rows)
	for _, sh := range []struct{ m, k int }{{2, 64}, {3, 64}, {4, 64}, {8, 128}} {
		p, alpha := randVec(r, sh.m*n), randVec(r, sh.m)
		acc := make([]float32, sh.m*sh.k)
		b.Run(fmt.Sprintf("%s/m%d_k%d", impl, sh.m, sh.k), func(b *testing.B) {
			for b.Loop() {
				impl.AccumRows(acc, alpha, p, w, rows, ldw, sh.m, sh.k)
			}
		})
	}
}

// benchGathered is the cache of the attention benchmarks: 576 rows of
// stride 512 taken from every other row of a larger matrix.
func benchGathered() (r *rand.Rand, w []float32, rows []int32, ldw int) {
	const n = 576
	ldw = 512
	r = rand.New(rand.NewPCG(1, 1))
	w = randVec(r, 2*n*ldw)
	rows = make([]int32, n)
	for i := range rows {
		rows[i] = int32(2 * i)
	}
	return r, w, rows, ldw
}
