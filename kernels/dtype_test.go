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
