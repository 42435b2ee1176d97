package simd

import "math"

// bf16ToF32 widens a bfloat16 (the upper half of a float32): exact.
func bf16ToF32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// f32ToBF16 rounds to the nearest bfloat16, ties to even. Every NaN becomes
// the quiet NaN 0x7fc0, as in PyTorch; overflow rounds to ±Inf and
// subnormals round like any other value (no flush to zero).
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return 0x7fc0
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// f16ToF32 widens an IEEE half: exact, subnormals included. A NaN keeps its
// sign and payload and is quieted, as VCVTPH2PS does.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // Inf or NaN
		if mant != 0 {
			return math.Float32frombits(sign | 0x7fc00000 | mant<<13)
		}
		return math.Float32frombits(sign | 0x7f800000)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0: // ±0
		return math.Float32frombits(sign)
	default: // subnormal: mant * 2^-24, exact in float32
		f := float32(mant) * 0x1p-24
		return math.Float32frombits(sign | math.Float32bits(f))
	}
}
