package simd

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestBF16PairFMA: single steps of the pure-Go VDPBF16PS arithmetic
// against values worked out by hand.
func TestBF16PairFMA(t *testing.T) {
	bf := func(f float32) uint16 { return uint16(math.Float32bits(f) >> 16) }
	sub := uint16(0x0001) // the smallest positive bfloat16 subnormal
	cases := []struct {
		name string
		a, b uint16
		c    float32
		want float32
	}{
		{"exact", bf(1.5), bf(2), 1, 4},
		{"subnormal input reads as zero", sub, bf(1), 3, 3},
		{"subnormal accumulator reads as zero", bf(1), bf(1), math.Float32frombits(1), 1},
		// 1 + 2^-24 is a tie between 1 and 1 + 2^-23: nearest even is 1.
		{"tie to even", bf(0x1p-12), bf(0x1p-12), 1, 1},
		// (1 + 2^-23) + 2^-24: a tie whose even neighbour is above.
		{"tie up to even", bf(0x1p-12), bf(0x1p-12), 1 + 0x1p-23, 1 + 0x1p-22},
		// 2^-63 * 2^-63 = 2^-126 is normal; 2^-64 * 2^-63 is not: flushed.
		{"smallest normal kept", bf(0x1p-63), bf(0x1p-63), 0, 0x1p-126},
		{"subnormal result flushed", bf(0x1p-64), bf(0x1p-63), 0, 0},
		{"negative subnormal result flushed to -0", bf(-0x1p-64), bf(0x1p-63), 0, float32(math.Copysign(0, -1))},
		// A product below float32's normal range still moves a sum it
		// reaches: 2^-126 + 2^-127 is exact at 24 bits.
		{"tiny product added exactly", bf(0x1p-64), bf(0x1p-63), 0x1p-126, 0x1.8p-126},
		{"overflow to infinity", bf(0x1p100), bf(0x1p100), 0, float32(math.Inf(1))},
	}
	for _, tc := range cases {
		got := bf16PairFMA(tc.a, tc.b, tc.c)
		if math.Float32bits(got) != math.Float32bits(tc.want) {
			t.Errorf("%s: bf16PairFMA(%#04x, %#04x, %g) = %g (%#08x), want %g (%#08x)", tc.name, tc.a, tc.b, tc.c,
				got, math.Float32bits(got), tc.want, math.Float32bits(tc.want))
		}
	}
}

// bf16PairsInputs draws bfloat16 rows: normal values around 1, and, when
// extreme, also subnormals, zeros of both signs and values whose products
// leave float32's normal range.
func bf16PairsInputs(r *rand.Rand, n int, scale float64, extreme bool) []uint16 {
	v := make([]uint16, n)
	for i := range v {
		f := float32(r.NormFloat64() * scale)
		if extreme {
			switch r.IntN(8) {
			case 0:
				f = math.Float32frombits(uint32(r.IntN(0x80)) << 16) // subnormal or zero
			case 1:
				f *= 0x1p-70
			case 2:
				f *= 0x1p-60
			case 3:
				f = float32(math.Copysign(0, -1))
			}
		}
		v[i] = f32ToBF16(f)
	}
	return v
}

// TestLinearBF16Pairs: every Impl gives the pure-Go bits (with
// AVX512_BF16, the instruction's own arithmetic), an output never depends
// on the other rows or the column range, and the result is the dot product
// to float32 accuracy.
func TestLinearBF16Pairs(t *testing.T) {
	if !Default().HasNativeBF16Pairs() {
		t.Logf("this CPU has no AVX512_BF16: only the pure-Go loop is checked")
	}
	shapes := []struct{ m, n, k int }{
		{1, 19, 768}, {1, 8, 31}, {2, 9, 33}, {3, 13, 64}, {4, 17, 100}, {5, 11, 32},
		{6, 4, 1}, {7, 23, 300}, {13, 30, 96}, {1, 3, 2}, {6, 3, 33}, {8, 2, 49185},
	}
	r := rand.New(rand.NewPCG(11, 12))
	// tinyMix: normal values near 1 or near 2^-64, none subnormal: steps
	// the pure-Go loop takes on its fast path with products below
	// float32's normal range added to normal sums.
	tinyMix := func(n int) []uint16 {
		v := bf16PairsInputs(r, n, 1, false)
		for i := range v {
			if r.IntN(3) == 0 {
				v[i] = f32ToBF16(bf16ToF32(v[i]) * 0x1p-64)
			}
		}
		return v
	}
	for _, sh := range shapes {
		for _, inputs := range []string{"normal", "extreme", "tiny"} {
			m, n, k := sh.m, sh.n, sh.k
			extreme := inputs == "extreme"
			x := bf16PairsInputs(r, m*k, 1, extreme)
			w := bf16PairsInputs(r, n*k, 0.1, extreme)
			if inputs == "tiny" {
				x, w = tinyMix(m*k), tinyMix(n*k)
			}
			want := make([]float32, m*n)
			goImpl.LinearBF16Pairs(want, x, w, m, n, k, 0, n)
			for i := range m {
				for j := range n {
					var exact, mag float64
					for kk := range k {
						a, b := float64(bf16ToF32(daz16(x[i*k+kk]))), float64(bf16ToF32(daz16(w[j*k+kk])))
						exact += a * b
						mag += math.Abs(a * b)
					}
					if d := math.Abs(float64(want[i*n+j]) - exact); d > 1e-5*mag+1e-30 {
						t.Fatalf("%dx%dx%d %s: out[%d,%d] = %g, exact %g (sum of |products| %g)", m, n, k, inputs, i, j, want[i*n+j], exact, mag)
					}
				}
			}
			for _, p := range Impls() {
				got := make([]float32, m*n)
				p.LinearBF16Pairs(got, x, w, m, n, k, 0, n)
				for f := range got {
					if math.Float32bits(got[f]) != math.Float32bits(want[f]) {
						t.Fatalf("%s %dx%dx%d %s: out[%d] = %g (%#08x), pure Go %g (%#08x)", p.Name(), m, n, k, inputs,
							f, got[f], math.Float32bits(got[f]), want[f], math.Float32bits(want[f]))
					}
				}
				one := make([]float32, n)
				for i := range m {
					p.LinearBF16Pairs(one, x[i*k:(i+1)*k], w, 1, n, k, 1, n)
					for j := 1; j < n; j++ {
						if math.Float32bits(one[j]) != math.Float32bits(want[i*n+j]) {
							t.Fatalf("%s %dx%dx%d: row %d alone over columns [1,%d): out[%d] = %g, in the batch %g", p.Name(), m, n, k, i, n, j, one[j], want[i*n+j])
						}
					}
				}
			}
		}
	}
}

// TestBF16PairsInstruction: long random runs of single pair steps through
// every native kernel (k = 34, one pair in lane 0 a step) against
// bf16PairFMA, with accumulators built by a first pair, over every kind of
// bfloat16 input: AVX512_BF16's VDPBF16PS itself, and the AVX2 kernel's
// float32 FMAs under DAZ and FTZ.
func TestBF16PairsInstruction(t *testing.T) {
	ran := false
	for _, p := range Impls() {
		if !p.HasNativeBF16Pairs() {
			continue
		}
		ran = true
		t.Run(p.Name(), func(t *testing.T) { checkPairSteps(t, p) })
	}
	if !ran {
		t.Skip("no native LinearBF16Pairs on this CPU")
	}
}

func checkPairSteps(t *testing.T, p *Impl) {
	const n = 4096
	r := rand.New(rand.NewPCG(13, 14))
	anyBF16 := func() uint16 {
		h := uint16(r.Uint32())
		if h&0x7f80 == 0x7f80 { // no infinities or NaNs
			h &^= 0x4000
		}
		return h
	}
	for round := range 64 {
		// k = 34: lane 0 takes pair (1, 0) in step one and pair (33, 32)
		// in step two; every other value is zero.
		const k = 34
		x, w := make([]uint16, k), make([]uint16, n*k)
		x[0], x[1], x[32], x[33] = anyBF16(), anyBF16(), anyBF16(), anyBF16()
		for j := range n {
			row := w[j*k : (j+1)*k]
			row[0], row[1], row[32], row[33] = anyBF16(), anyBF16(), anyBF16(), anyBF16()
		}
		want := make([]float32, n)
		goImpl.LinearBF16Pairs(want, x, w, 1, n, k, 0, n)
		// One row (the decode kernels) and six copies of it (the GEMM
		// tiles).
		for _, m := range []int{1, 6} {
			xm := make([]uint16, 0, m*k)
			for range m {
				xm = append(xm, x...)
			}
			got := make([]float32, m*n)
			p.LinearBF16Pairs(got, xm, w, m, n, k, 0, n)
			for f := range got {
				j := f % n
				if math.Float32bits(got[f]) != math.Float32bits(want[j]) && !(math.IsNaN(float64(got[f])) && math.IsNaN(float64(want[j]))) {
					row := w[j*k : (j+1)*k]
					t.Fatalf("round %d, %d rows: x pairs (%#04x %#04x) (%#04x %#04x), w pairs (%#04x %#04x) (%#04x %#04x): %s %g (%#08x), pure Go %g (%#08x)",
						round, m, x[0], x[1], x[32], x[33], row[0], row[1], row[32], row[33], p.Name(), got[f], math.Float32bits(got[f]), want[j], math.Float32bits(want[j]))
				}
			}
		}
	}
}

// TestBF16PairsRestoresMXCSR: the AVX2 kernel runs under DAZ and FTZ and
// hands the thread back without them: a product below float32's normal
// range, computed by Go right after on the same thread, stays subnormal.
func TestBF16PairsRestoresMXCSR(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, p := range Impls() {
		if !p.HasNativeBF16Pairs() {
			continue
		}
		x, w := make([]uint16, 64), make([]uint16, 3*64)
		for _, m := range []int{1, 6} {
			xm := make([]uint16, 0, m*64)
			for range m {
				xm = append(xm, x...)
			}
			p.LinearBF16Pairs(make([]float32, m*3), xm, w, m, 3, 64, 0, 3)
			tiny, half := float32(0x1p-126), float32(0.5)
			// Bits, not ==: under DAZ a comparison reads 2^-127 as zero.
			if got := subnormalProduct(tiny, half); math.Float32bits(got) != 0x00400000 {
				t.Fatalf("%s, %d rows: 2^-126 * 0.5 = %g (%#08x) after the kernel, want 2^-127 (flush to zero left on)", p.Name(), m, got, math.Float32bits(got))
			}
		}
	}
}

// subnormalProduct keeps the product from being folded at compile time.
//
//go:noinline
func subnormalProduct(a, b float32) float32 { return a * b }
