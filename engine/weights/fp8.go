package weights

import (
	"math"
)

// FP8 E4M3 conversions and DeepSeek's block quantization recipe, for
// checkpoints whose config.json has quantization_config.quant_method
// "fp8": every quantized matrix W [n, k] is stored as F8_E4M3 bytes Q with
// a float32 tensor "<name>_scale_inv" (W's name with "weight" replaced by
// "weight_scale_inv") of shape [ceil(n/bn), ceil(k/bk)] for blocks of
// bn x bk (weight_block_size, [128, 128] in the published checkpoints),
// and W[r, c] = Q[r, c] * scale_inv[r/bn, c/bk].

// F8E4M3ToFloat32 widens an OCP FP8 E4M3 byte (exact): exponent bias 7,
// subnormals m * 2^-9, largest finite 448, NaN for 0x7F and 0xFF (E4M3
// has no infinities).
func F8E4M3ToFloat32(b uint8) float32 {
	sign := uint32(b&0x80) << 24
	exp := uint32(b>>3) & 0xf
	mant := uint32(b) & 0x7
	switch {
	case exp == 0xf && mant == 0x7:
		return math.Float32frombits(sign | 0x7fc00000)
	case exp == 0:
		return math.Float32frombits(sign | math.Float32bits(float32(mant)*(1.0/512)))
	}
	return math.Float32frombits(sign | (exp+127-7)<<23 | mant<<20)
}

// Float32ToF8E4M3 rounds to the nearest E4M3 value, ties to even;
// magnitudes beyond 448 saturate to +-448 and NaN becomes 0x7F (0xFF when
// negative).
func Float32ToF8E4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	abs := b & 0x7fffffff
	switch {
	case abs > 0x7f800000:
		return sign | 0x7f
	case abs > 0x43e00000: // beyond 448
		return sign | 0x7e
	}
	exp := int32(abs>>23) - 127
	if exp < -10 {
		return sign
	}
	mant := abs&0x7fffff | 0x800000
	shift := uint32(20)
	r := uint32(exp+7) << 3
	if exp < -6 {
		shift = uint32(14 - exp)
		r = 0
	} else {
		mant &= 0x7fffff
	}
	r |= mant >> shift
	rem := mant & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && r&1 == 1) {
		r++
	}
	return sign | uint8(r)
}

// QuantizeFP8Blocks quantizes the row-major matrix w [n, k] per block of
// bn x bk as DeepSeek-V3 does: scale = amax(|block|)/448 (1 for an all-zero
// block), Q = round-to-nearest-even(W / scale) in E4M3. It returns the n*k
// bytes and the [ceil(n/bn), ceil(k/bk)] scales (the scale_inv tensor).
// Cost: two passes over w.
func QuantizeFP8Blocks(w []float32, n, k, bn, bk int) (data []byte, scales []float32) {
	nb, kb := (n+bn-1)/bn, (k+bk-1)/bk
	data = make([]byte, n*k)
	scales = make([]float32, nb*kb)
	for bi := range nb {
		for bj := range kb {
			r0, r1, c0, c1 := bi*bn, min((bi+1)*bn, n), bj*bk, min((bj+1)*bk, k)
			var amax float32
			for r := r0; r < r1; r++ {
				for _, v := range w[r*k+c0 : r*k+c1] {
					amax = max(amax, float32(math.Abs(float64(v))))
				}
			}
			s := amax / 448
			if s == 0 {
				s = 1
			}
			scales[bi*kb+bj] = s
			for r := r0; r < r1; r++ {
				for c := c0; c < c1; c++ {
					data[r*k+c] = Float32ToF8E4M3(w[r*k+c] / s)
				}
			}
		}
	}
	return data, scales
}

// DequantizeFP8Blocks is the inverse view of QuantizeFP8Blocks: W[r, c] =
// E4M3(data[r*k+c]) * scales[r/bn, c/bk], rounded once to float32.
func DequantizeFP8Blocks(data []byte, scales []float32, n, k, bn, bk int) []float32 {
	kb := (k + bk - 1) / bk
	out := make([]float32, n*k)
	for r := range n {
		for c := range k {
			out[r*k+c] = F8E4M3ToFloat32(data[r*k+c]) * scales[(r/bn)*kb+c/bk]
		}
	}
	return out
}

// ScaleInvName is the name of the scale tensor of the FP8 weight called
// name: "x.weight" -> "x.weight_scale_inv".
func ScaleInvName(name string) string { return name + "_scale_inv" }
