package kernels

import (
	"math"
	"testing"
)

func TestHalfConversions(t *testing.T) {
	for _, tc := range []struct {
		f          float32
		bf16, fp16 uint16
	}{
		{0, 0, 0},
		{1, 0x3f80, 0x3c00},
		{-2, 0xc000, 0xc000},
		{0.1, 0x3dcd, 0x2e66},                   // rounds
		{65504, 0x4780, 0x7bff},                 // largest half
		{1e6, 0x4974, 0x7c00},                   // half overflows to +Inf
		{5.960464477539063e-08, 0x3380, 0x0001}, // smallest half subnormal
		{float32(math.Inf(-1)), 0xff80, 0xfc00},
		{1.00390625, 0x3f80, 0x3c04}, // bf16 tie to even (down)
		{1.01171875, 0x3f82, 0x3c0c}, // bf16 tie to even (up)
	} {
		if got := F32ToBF16(tc.f); got != tc.bf16 {
			t.Errorf("F32ToBF16(%v) = %#04x, want %#04x", tc.f, got, tc.bf16)
		}
		if got := F32ToF16(tc.f); got != tc.fp16 {
			t.Errorf("F32ToF16(%v) = %#04x, want %#04x", tc.f, got, tc.fp16)
		}
	}
	// Every half value widens and narrows back to itself.
	for h := range 1 << 16 {
		u := uint16(h)
		if f := F16ToF32(u); !math.IsNaN(float64(f)) && F32ToF16(f) != u {
			t.Fatalf("f16 %#04x -> %v -> %#04x", u, f, F32ToF16(f))
		}
		if f := BF16ToF32(u); !math.IsNaN(float64(f)) && F32ToBF16(f) != u {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", u, f, F32ToBF16(f))
		}
	}
	if !math.IsNaN(float64(BF16ToF32(F32ToBF16(float32(math.NaN()))))) {
		t.Error("bf16 NaN not preserved")
	}
}

func TestParseDType(t *testing.T) {
	for _, d := range []DType{F32, BF16, F16, I32} {
		if got, err := ParseDType(d.String()); err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.String(), got, err)
		}
	}
	if _, err := ParseDType("F64"); err == nil {
		t.Error("ParseDType(F64): no error")
	}
}

// e4m3Want decodes an OCP FP8 E4M3 code from its bit fields (sign, 4
// exponent bits with bias 7, 3 mantissa bits), independently of
// F8E4M3ToF32; ok is false for the NaN codes.
func e4m3Want(c uint8) (v float64, ok bool) {
	exp, mant := int(c>>3)&0xf, int(c&7)
	if exp == 0xf && mant == 7 {
		return 0, false
	}
	if exp == 0 {
		v = math.Ldexp(float64(mant), -9)
	} else {
		v = math.Ldexp(float64(8+mant), exp-7-3)
	}
	if c&0x80 != 0 {
		v = -v
	}
	return v, true
}

func TestF8E4M3Decode(t *testing.T) {
	for c := range 256 {
		code := uint8(c)
		got := F8E4M3ToF32(code)
		want, ok := e4m3Want(code)
		if !ok {
			if !math.IsNaN(float64(got)) {
				t.Errorf("F8E4M3ToF32(%#02x) = %v, want NaN", code, got)
			}
			continue
		}
		if math.Float32bits(got) != math.Float32bits(float32(want)) {
			t.Errorf("F8E4M3ToF32(%#02x) = %v, want %v", code, got, want)
		}
	}
	for _, tc := range []struct {
		code uint8
		want float32
	}{
		{0x01, 1.0 / 512}, // smallest subnormal
		{0x07, 7.0 / 512}, // largest subnormal
		{0x08, 1.0 / 64},  // smallest normal
		{0x38, 1},
		{0x7e, 448}, // largest finite
		{0xfe, -448},
		{0xc0, -2},
	} {
		if got := F8E4M3ToF32(tc.code); got != tc.want {
			t.Errorf("F8E4M3ToF32(%#02x) = %v, want %v", tc.code, got, tc.want)
		}
	}
}

func TestF8E4M3RoundTrip(t *testing.T) {
	for c := range 256 {
		code := uint8(c)
		if code&0x7f == 0x7f {
			continue // NaN
		}
		if got := F32ToF8E4M3(F8E4M3ToF32(code)); got != code {
			t.Errorf("%#02x -> %v -> %#02x", code, F8E4M3ToF32(code), got)
		}
	}
}

// TestF8E4M3TiesToEven checks every pair of neighbouring finite codes, of
// both signs: their midpoint rounds to the code with an even mantissa, and
// the next float32 above or below it to the nearer neighbour.
func TestF8E4M3TiesToEven(t *testing.T) {
	for lo := uint8(0); lo < 0x7e; lo++ {
		hi := lo + 1
		a, _ := e4m3Want(lo)
		b, _ := e4m3Want(hi)
		mid := float32((a + b) / 2) // exact: a and b have at most 4 significant bits
		if float64(mid) != (a+b)/2 {
			t.Fatalf("midpoint of %#02x and %#02x not exact in float32", lo, hi)
		}
		even := lo
		if lo&1 != 0 {
			even = hi
		}
		for _, sign := range []uint8{0, 0x80} {
			m := mid
			up, down := math.Nextafter32(mid, float32(math.Inf(1))), math.Nextafter32(mid, 0)
			if sign != 0 {
				m, up, down = -m, -up, -down
			}
			for _, tc := range []struct {
				name string
				f    float32
				want uint8
			}{
				{"midpoint", m, sign | even},
				{"above the midpoint", up, sign | hi},
				{"below the midpoint", down, sign | lo},
			} {
				if got := F32ToF8E4M3(tc.f); got != tc.want {
					t.Errorf("F32ToF8E4M3(%v) (%s of %#02x and %#02x) = %#02x, want %#02x",
						tc.f, tc.name, sign|lo, sign|hi, got, tc.want)
				}
			}
		}
	}
}

func TestF8E4M3Encode(t *testing.T) {
	inf := float32(math.Inf(1))
	tiny := float32(math.Ldexp(1, -10)) // half the smallest subnormal
	for _, tc := range []struct {
		name string
		f    float32
		want uint8
	}{
		{"zero", 0, 0x00},
		{"negative zero", float32(math.Copysign(0, -1)), 0x80},
		{"one", 1, 0x38},
		{"rounds down", 0.1, 0x1d},                // 0.1015625
		{"largest finite", 448, 0x7e},             //
		{"just below 448", 447, 0x7e},             // nearer 448 than 416
		{"halfway to the next binade", 464, 0x7e}, // would round to 480, beyond the range
		{"449 saturates", 449, 0x7e},
		{"1e6 saturates", 1e6, 0x7e},
		{"largest float32 saturates", math.MaxFloat32, 0x7e},
		{"+Inf saturates", inf, 0x7e},
		{"-449 saturates", -449, 0xfe},
		{"-1e6 saturates", -1e6, 0xfe},
		{"-Inf saturates", -inf, 0xfe},
		{"smallest subnormal", float32(math.Ldexp(1, -9)), 0x01},
		{"half the smallest subnormal ties to zero", tiny, 0x00},
		{"just above half the smallest subnormal", math.Nextafter32(tiny, 1), 0x01},
		{"below half the smallest subnormal", math.Nextafter32(tiny, 0), 0x00},
		{"negative below half the smallest subnormal", -math.Nextafter32(tiny, 0), 0x80},
		{"1e-30", 1e-30, 0x00},
		{"-1e-30", -1e-30, 0x80},
		{"float32 subnormal", math.SmallestNonzeroFloat32, 0x00},
		{"negative float32 subnormal", -math.SmallestNonzeroFloat32, 0x80},
		{"subnormal rounds up into the normals", float32(math.Ldexp(15, -10)), 0x08}, // 7.5 * 2^-9: tie, to the even 0x08
	} {
		if got := F32ToF8E4M3(tc.f); got != tc.want {
			t.Errorf("%s: F32ToF8E4M3(%v) = %#02x, want %#02x", tc.name, tc.f, got, tc.want)
		}
	}
	for _, tc := range []struct {
		f    float32
		want uint8
	}{
		{float32(math.NaN()), 0x7f},
		{math.Float32frombits(0x7f800001), 0x7f}, // signalling NaN
		{math.Float32frombits(0xffc00000), 0xff}, // negative NaN
	} {
		got := F32ToF8E4M3(tc.f)
		if got != tc.want || !math.IsNaN(float64(F8E4M3ToF32(got))) {
			t.Errorf("F32ToF8E4M3(NaN %#08x) = %#02x, want %#02x (NaN)", math.Float32bits(tc.f), got, tc.want)
		}
	}
}
