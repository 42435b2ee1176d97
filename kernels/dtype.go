package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// DType is the element type of a tensor.
type DType uint8

// Element types. Weights come in F32, BF16 or F16; activations are in the
// backend's ActivationDType; token ids, positions and attention metadata are
// I32. F8E4M3 (OCP FP8 E4M3: 4 exponent bits, 3 mantissa bits, largest
// finite 448, no infinities) holds KV caches a backend keeps in 8 bits
// (see KVCacheDTyper), and FP8 weights of backends with FP8 kernels (see
// FP8Weighter). Quant is a weight in llama.cpp's block-quantized formats
// (see QuantWeighter): it has no per-element size. MXFP4 is an expert
// weight in OCP microscaling FP4 (see MXFP4Weighter), half a byte an
// element plus a scale byte per 32: it has no per-element size either.
const (
	F32 DType = iota + 1
	BF16
	F16
	I32
	F8E4M3
	Quant
	MXFP4
)

// Size is the number of bytes of one element (0 for an invalid DType).
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16, F16:
		return 2
	case F8E4M3:
		return 1
	}
	return 0
}

// String returns the safetensors spelling of d ("F32", "BF16", "F16", "I32").
func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case BF16:
		return "BF16"
	case F16:
		return "F16"
	case I32:
		return "I32"
	case F8E4M3:
		return "F8_E4M3"
	case Quant:
		return "QUANT"
	case MXFP4:
		return "MXFP4"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// IsFloat reports whether d is one of the floating-point types.
func (d DType) IsFloat() bool { return d == F32 || d == BF16 || d == F16 }

// ParseDType maps the safetensors dtype names F32, BF16, F16 and I32 to a DType.
func ParseDType(s string) (DType, error) {
	switch s {
	case "F32":
		return F32, nil
	case "BF16":
		return BF16, nil
	case "F16":
		return F16, nil
	case "I32":
		return I32, nil
	}
	return 0, fmt.Errorf("kernels: dtype %q: %w", s, ErrDType)
}

// BF16ToF32 widens one bfloat16 value (exact).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds a float32 to the nearest bfloat16, ties to even, as torch does.
// NaN stays NaN.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it quiet
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// F16ToF32 widens one IEEE half-precision value (exact, subnormals included).
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: value = mant * 2^-24
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			return -f
		}
		return f
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// F32ToF16 rounds a float32 to the nearest IEEE half, ties to even; values
// beyond the half range become infinities.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := mant >> shift
		rem := mant & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, which is the right rounding
	}
	return sign | uint16(r)
}

// F8E4M3ToF32 widens one OCP FP8 E4M3 value (exact): exponent bias 7,
// subnormals are m * 2^-9, the largest finite value is 448 (0x7E), and the
// only NaN encodings are 0x7F and 0xFF (E4M3 has no infinities).
func F8E4M3ToF32(b uint8) float32 {
	sign := uint32(b&0x80) << 24
	exp := uint32(b>>3) & 0xf
	mant := uint32(b) & 0x7
	switch {
	case exp == 0xf && mant == 0x7:
		return math.Float32frombits(sign | 0x7fc00000)
	case exp == 0: // zero or subnormal: mant * 2^-9
		return math.Float32frombits(sign | math.Float32bits(float32(mant)*(1.0/512)))
	}
	return math.Float32frombits(sign | (exp+127-7)<<23 | mant<<20)
}

// F32ToF8E4M3 rounds a float32 to the nearest OCP FP8 E4M3 value, ties to
// even, as CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE does:
// subnormals are kept (the smallest is 2^-9; magnitudes up to half of it
// become a zero of the same sign), magnitudes beyond 448 (infinities
// included) saturate to +-448 (0x7E, 0xFE), and NaN becomes NaN (0x7F, or
// 0xFF when its sign bit is set).
func F32ToF8E4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	abs := b & 0x7fffffff
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7f
	case abs > 0x43e00000: // beyond 448, infinities included
		return sign | 0x7e
	}
	exp := int32(abs>>23) - 127
	if exp < -10 { // below 2^-10, half the smallest subnormal (float32 subnormals and zero included)
		return sign
	}
	mant := abs&0x7fffff | 0x800000
	// Keep 3 mantissa bits for a normal result, fewer for a subnormal one
	// (exponents -7 to -10 land on multiples of 2^-9).
	shift := uint32(20)
	r := uint32(exp+7) << 3
	if exp < -6 {
		shift = uint32(14 - exp)
		r = 0
	} else {
		mant &= 0x7fffff // the implicit bit lives in the exponent field
	}
	r |= mant >> shift
	rem := mant & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && r&1 == 1) {
		r++ // may carry into the exponent, which is the right rounding; never past 0x7E
	}
	return sign | uint8(r)
}

// hostLittleEndian is true on hosts whose memory layout is the wire layout
// (amd64, arm64): conversions are then plain copies.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// rawBytes views a slice of 4-byte elements as bytes (no copy).
func rawBytes[T float32 | int32](xs []T) []byte {
	if len(xs) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&xs[0])), 4*len(xs))
}

// F32Bytes encodes xs little-endian, the layout Upload expects for F32.
func F32Bytes(xs []float32) []byte {
	b := make([]byte, 4*len(xs))
	if hostLittleEndian {
		copy(b, rawBytes(xs))
		return b
	}
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// uploadI32Bytes is I32Bytes for a call of Ops.Upload, which copies its
// source before it returns: on a little-endian host the bytes of xs
// themselves (no copy), else I32Bytes.
func uploadI32Bytes(xs []int32) []byte {
	if hostLittleEndian {
		return rawBytes(xs)
	}
	return I32Bytes(xs)
}

// I32Bytes encodes xs little-endian, the layout Upload expects for I32.
func I32Bytes(xs []int32) []byte {
	b := make([]byte, 4*len(xs))
	if hostLittleEndian {
		copy(b, rawBytes(xs))
		return b
	}
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

// U16Bytes encodes raw 16-bit elements (BF16 or F16 bit patterns) little-endian.
func U16Bytes(xs []uint16) []byte {
	b := make([]byte, 2*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	return b
}

// BytesF32 decodes little-endian float32 values; len(b) must be a multiple of 4.
func BytesF32(b []byte) []float32 {
	xs := make([]float32, len(b)/4)
	if hostLittleEndian {
		copy(rawBytes(xs), b)
		return xs
	}
	for i := range xs {
		xs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return xs
}

// BytesI32 decodes little-endian int32 values; len(b) must be a multiple of 4.
func BytesI32(b []byte) []int32 {
	xs := make([]int32, len(b)/4)
	if hostLittleEndian {
		copy(rawBytes(xs), b)
		return xs
	}
	for i := range xs {
		xs[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return xs
}
