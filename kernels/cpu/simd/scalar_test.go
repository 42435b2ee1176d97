package simd

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// fmaExact is a*b+c computed exactly with math/big and rounded once to
// float32 (nearest, ties to even, subnormals included).
func fmaExact(a, b, c float32) float32 {
	if isNaN32(a) || isNaN32(b) || isNaN32(c) || math.IsInf(float64(a), 0) || math.IsInf(float64(b), 0) || math.IsInf(float64(c), 0) {
		return float32(float64(a)*float64(b) + float64(c))
	}
	x := new(big.Float).SetPrec(400).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetFloat64(float64(c)))
	if x.Sign() == 0 {
		// Exact zero: +0 unless both a*b and c are -0 (IEEE round-to-nearest).
		if math.Signbit(float64(a)) != math.Signbit(float64(b)) && (a == 0 || b == 0) && math.Signbit(float64(c)) {
			return float32(math.Copysign(0, -1))
		}
		return 0
	}
	f, _ := x.Float32()
	return f
}

func isNaN32(f float32) bool { return f != f }

// checkDotFMA checks that every implementation's Dot computes fma(a, b, c) in
// lane 0 of [c, 0, ..., a, 0, ...] . [1, 0, ..., b, 0, ...] with a at index
// 16, for lengths 17 (a in the k tail) and 32 (a in the main loop). This runs
// the fused multiply-add of each path (dotGo's inlined one and its tail's,
// the hardware's in the SIMD paths) on the given triple.
func checkDotFMA(t *testing.T, a, b, c, want float32) {
	t.Helper()
	if want == 0 || isNaN32(want) {
		return // the tree adds +0 lanes: -0 becomes +0; NaN payloads vary
	}
	for _, k := range []int{17, 32} {
		x := make([]float32, k)
		y := make([]float32, k)
		x[0], y[0], x[16], y[16] = c, 1, a, b
		for _, p := range Impls() {
			if got := p.Dot(x, y); !sameBits(got, want) {
				t.Fatalf("%s: k=%d: Dot lane fma(%g, %g, %g) = %g (%#08x), want %g (%#08x)",
					p, k, a, b, c, got, math.Float32bits(got), want, math.Float32bits(want))
			}
		}
	}
}

func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (isNaN32(a) && isNaN32(b))
}

// randFloat32 draws finite float32 values over a wide exponent range, with
// some zeros and subnormals.
func randFloat32(r *rand.Rand, minExp, maxExp int) float32 {
	switch r.IntN(20) {
	case 0:
		return 0
	case 1:
		return math.Float32frombits(r.Uint32() & 0x807fffff) // subnormal or zero
	}
	mant := 1 + r.Float64()
	e := minExp + r.IntN(maxExp-minExp+1)
	f := float32(math.Ldexp(mant, e))
	if r.IntN(2) == 0 {
		f = -f
	}
	return f
}

func TestFMA32(t *testing.T) {
	midpoint := float32(1 + 0x1p-23) // 1+2^-23: squares land near float32 midpoints
	tests := []struct {
		name    string
		a, b, c float32
	}{
		{"zero", 0, 0, 0},
		{"neg zero product", float32(math.Copysign(0, -1)), 1, float32(math.Copysign(0, -1))},
		{"neg zero plus zero", float32(math.Copysign(0, -1)), 1, 0},
		{"tiny negative underflows to -0", -0x1p-100, 0x1p-100, 0},
		{"inf", float32(math.Inf(1)), 2, 1},
		{"inf minus inf", float32(math.Inf(1)), 1, float32(math.Inf(-1))},
		{"nan", float32(math.NaN()), 1, 1},
		{"overflow product, back in range", 0x1p100, 0x1p100, -0x1p127},
		{"overflow", 0x1p100, 0x1p100, 0},
		{"overflow midpoint above", float32(math.MaxFloat32), 1, 0x1p103},
		{"overflow midpoint exact", 0x1.fffffep127, 1, 0x1p103},
		{"square near midpoint plus tiny", midpoint, midpoint, 0x1p-60},
		{"square near midpoint minus tiny", midpoint, midpoint, -0x1p-60},
		// (1+2^-12)^2 = 1 + 2^-11 + 2^-24: exactly a midpoint after 1+2^-11.
		{"exact midpoint, tiny above", 1 + 0x1p-12, 1 + 0x1p-12, 0x1p-80},
		{"exact midpoint, tiny below", 1 + 0x1p-12, 1 + 0x1p-12, -0x1p-80},
		{"exact midpoint, no addend", 1 + 0x1p-12, 1 + 0x1p-12, 0},
		{"odd midpoint, tiny below", 1 + 0x1p-12, 1 + 0x1p-12 + 0x1p-23, -0x1p-90},
		{"subnormal result", 0x1p-75, 0x1p-75, 0},
		{"subnormal midpoint, tiny above", 0x1.8p-75, 0x1p-75, 0x1p-170},
		{"subnormal midpoint, tiny below", 0x1.8p-75, 0x1p-75, -0x1p-170},
		{"subnormal midpoint exact", 0x1.8p-75, 0x1p-75, 0},
		{"subnormal addend", 0x1p-70, 0x1p-70, 0x1p-149},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, want := fma32(tc.a, tc.b, tc.c), fmaExact(tc.a, tc.b, tc.c)
			if !sameBits(got, want) {
				t.Fatalf("fma32(%g, %g, %g) = %g (%#08x), want %g (%#08x)",
					tc.a, tc.b, tc.c, got, math.Float32bits(got), want, math.Float32bits(want))
			}
			checkDotFMA(t, tc.a, tc.b, tc.c, want)
		})
	}
}

func TestFMA32Random(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ranges := [][2]int{{-10, 10}, {-80, -60}, {-140, 0}, {50, 70}, {-30, 30}}
	for i := range 200000 {
		rg := ranges[i%len(ranges)]
		a, b := randFloat32(r, rg[0], rg[1]), randFloat32(r, rg[0], rg[1])
		c := randFloat32(r, 2*rg[0]-20, 2*rg[1]+20)
		if i%3 == 0 {
			// c near -a*b: heavy cancellation.
			c = -float32(float64(a)*float64(b)) * (1 + float32(r.IntN(5)-2)*0x1p-23)
		}
		if i%7 == 0 {
			// a*b on a midpoint: a product of two 12-bit mantissas.
			a = float32(math.Ldexp(float64(r.IntN(1<<12)|1<<11), r.IntN(20)-10))
			b = float32(math.Ldexp(float64(r.IntN(1<<12)|1<<11), r.IntN(20)-10))
			c = float32(math.Ldexp(float64(r.IntN(1<<10)+1), r.IntN(40)-60)) * float32(1-2*r.IntN(2))
		}
		got, want := fma32(a, b, c), fmaExact(a, b, c)
		if !sameBits(got, want) {
			t.Fatalf("fma32(%g, %g, %g) = %g, want %g", a, b, c, got, want)
		}
		if i%10 == 0 || i%7 == 0 {
			checkDotFMA(t, a, b, c, want)
		}
	}
}

// bf16Nearest rounds f to bfloat16 by picking the nearer of its two bf16
// neighbours in float64 arithmetic (an algorithm independent of f32ToBF16).
func bf16Nearest(f float32) uint16 {
	if isNaN32(f) {
		return 0x7fc0
	}
	bits := math.Float32bits(f)
	lo := uint16(bits >> 16) // toward zero
	if bits&0xffff == 0 {
		return lo
	}
	hi := lo + 1 // away from zero; 0x7f7f+1 = 0x7f80 = Inf
	dlo := math.Abs(float64(f) - float64(bf16ToF32(lo)))
	var dhi float64
	if hi&0x7fff == 0x7f80 {
		dhi = math.Abs(math.Ldexp(1, 128) - math.Abs(float64(f)))
	} else {
		dhi = math.Abs(float64(bf16ToF32(hi)) - float64(f))
	}
	switch {
	case dlo < dhi:
		return lo
	case dhi < dlo:
		return hi
	case lo&1 == 0:
		return lo
	default:
		return hi
	}
}

func TestF32ToBF16(t *testing.T) {
	tests := []struct {
		name string
		in   uint32 // float32 bits
		want uint16
	}{
		{"one", 0x3f800000, 0x3f80},
		{"tie to even down", 0x3f808000, 0x3f80},
		{"tie to even up", 0x3f818000, 0x3f82},
		{"above tie", 0x3f808001, 0x3f81},
		{"below tie", 0x3f807fff, 0x3f80},
		{"negative tie", 0xbf818000, 0xbf82},
		{"max rounds to inf", 0x7f7fffff, 0x7f80},
		{"largest finite bf16", 0x7f7f7fff, 0x7f7f},
		{"inf", 0x7f800000, 0x7f80},
		{"-inf", 0xff800000, 0xff80},
		{"quiet nan", 0x7fc00000, 0x7fc0},
		{"signalling nan", 0x7f800001, 0x7fc0},
		{"negative nan", 0xffc12345, 0x7fc0},
		{"nan whose rounding would carry", 0x7fffffff, 0x7fc0},
		{"-0", 0x80000000, 0x8000},
		{"subnormal tie down", 0x00008000, 0x0000},
		{"subnormal tie up", 0x00018000, 0x0002},
		{"largest subnormal rounds to min normal", 0x007fffff, 0x0080},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := math.Float32frombits(tc.in)
			if got := f32ToBF16(f); got != tc.want {
				t.Fatalf("f32ToBF16(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
			}
			if got := bf16Nearest(f); got != tc.want {
				t.Fatalf("test reference bf16Nearest(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
			}
		})
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 1 << 18 {
		f := math.Float32frombits(r.Uint32())
		if got, want := f32ToBF16(f), bf16Nearest(f); got != want {
			t.Fatalf("f32ToBF16(%#08x) = %#04x, want %#04x", math.Float32bits(f), got, want)
		}
	}
}

func TestBF16RoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := bf16ToF32(uint16(h))
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("bf16ToF32(%#04x) bits %#08x", h, math.Float32bits(f))
		}
		if got := f32ToBF16(f); !isNaN32(f) && got != uint16(h) {
			t.Fatalf("f32ToBF16(bf16ToF32(%#04x)) = %#04x", h, got)
		}
	}
}

func TestF16ToF32(t *testing.T) {
	for h := range 1 << 16 {
		got := f16ToF32(uint16(h))
		sign, exp, mant := h>>15, (h>>10)&0x1f, h&0x3ff
		var want float64
		switch {
		case exp == 0x1f && mant != 0:
			if !isNaN32(got) || math.Signbit(float64(got)) != (sign == 1) ||
				math.Float32bits(got)&0x7fffff != uint32(mant)<<13|0x400000 {
				t.Fatalf("f16ToF32(%#04x) = %#08x, want a quiet NaN with its sign and payload", h, math.Float32bits(got))
			}
			continue
		case exp == 0x1f:
			want = math.Inf(1)
		case exp == 0:
			want = math.Ldexp(float64(mant), -24)
		default:
			want = math.Ldexp(float64(mant|0x400), int(exp)-25)
		}
		if sign == 1 {
			want = -want
		}
		if math.Float32bits(got) != math.Float32bits(float32(want)) {
			t.Fatalf("f16ToF32(%#04x) = %g, want %g", h, got, want)
		}
	}
	// Spot values: 1.0, -2.0, 65504 (max), 2^-24 (min subnormal).
	for _, tc := range []struct {
		h    uint16
		want float32
	}{{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, 0x1p-24}, {0x0400, 0x1p-14}} {
		if got := f16ToF32(tc.h); got != tc.want {
			t.Fatalf("f16ToF32(%#04x) = %g, want %g", tc.h, got, tc.want)
		}
	}
}

func TestDotGoCanonicalOrder(t *testing.T) {
	// k = 18: lanes 0 and 1 get two products, lanes 2..15 one; the expected
	// value is written out from the package doc's definition.
	a := make([]float32, 18)
	b := make([]float32, 18)
	for i := range a {
		a[i] = float32(i%5) + 0.1*float32(i)
		b[i] = 1 / float32(i+3)
	}
	var acc [16]float32
	for kk := range 18 {
		acc[kk%16] = fma32(a[kk], b[kk], acc[kk%16])
	}
	var s8 [8]float32
	for l := range 8 {
		s8[l] = acc[l] + acc[l+8]
	}
	want := ((s8[0] + s8[4]) + (s8[2] + s8[6])) + ((s8[1] + s8[5]) + (s8[3] + s8[7]))
	if got := dotGo(a, b); got != want {
		t.Fatalf("dotGo = %.9g, want canonical %.9g", got, want)
	}
	var exact float64
	for i := range a {
		exact += float64(a[i]) * float64(b[i])
	}
	if math.Abs(float64(want)-exact) > 1e-5*math.Abs(exact) {
		t.Fatalf("canonical dot %.9g far from exact %.9g", want, exact)
	}
}
