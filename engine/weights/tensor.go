package weights

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// Tensor is one named tensor of a safetensors file. Data holds the raw
// little-endian bytes, row-major, and aliases the file's memory mapping: it is
// read-only and valid until the File or Checkpoint it came from is closed.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
	// File is the path of the safetensors file that holds the tensor.
	File string
}

// NumElements returns the product of the shape (1 for a scalar).
func (t Tensor) NumElements() int { return numElements(t.Shape) }

func numElements(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// Float32s returns a new slice with the tensor's elements converted to
// float32: floats exactly (BF16 and F16 widen losslessly), integers and
// booleans by value. Cost: one allocation of 4 bytes per element and one pass;
// meant for tests, reference data and small tensors, not for weights on a hot
// path (use AsFloat32 / AsUint16 for zero-copy views).
func (t Tensor) Float32s() []float32 {
	n := len(t.Data) / max(t.DType.Size(), 1)
	out := make([]float32, n)
	b := t.Data
	switch t.DType {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case BF16:
		for i := range out {
			out[i] = BF16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case F16:
		for i := range out {
			out[i] = F16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case I32:
		for i := range out {
			out[i] = float32(int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
	case I64:
		for i := range out {
			out[i] = float32(int64(binary.LittleEndian.Uint64(b[8*i:])))
		}
	case U8, Bool:
		for i := range out {
			out[i] = float32(b[i])
		}
	case F8E4M3:
		for i := range out {
			out[i] = F8E4M3ToFloat32(b[i])
		}
	case F8E5M2:
		for i := range out {
			out[i] = F16ToFloat32(uint16(b[i]) << 8) // E5M2 is the top byte of a half
		}
	}
	return out
}

// Ints returns a new slice with the elements of an integer or boolean tensor
// (I32, I64, U8, BOOL). A float tensor is an error wrapping ErrDType. Cost: one
// allocation and one pass.
func (t Tensor) Ints() ([]int, error) {
	size := t.DType.Size()
	if t.DType.IsFloat() || size == 0 {
		return nil, fmt.Errorf("weights: %s: tensor %q: Ints of %s: %w", t.File, t.Name, t.DType, ErrDType)
	}
	out := make([]int, len(t.Data)/size)
	b := t.Data
	for i := range out {
		switch t.DType {
		case I32:
			out[i] = int(int32(binary.LittleEndian.Uint32(b[4*i:])))
		case I64:
			out[i] = int(int64(binary.LittleEndian.Uint64(b[8*i:])))
		default:
			out[i] = int(b[i])
		}
	}
	return out, nil
}

// AsFloat32 returns the data of an F32 tensor as a []float32 that aliases the
// mapping (no copy). It fails with ErrDType for another dtype, and with
// ErrMisaligned when the data does not start on a 4-byte boundary or the host
// is big-endian. The slice must not be written.
func (t Tensor) AsFloat32() ([]float32, error) {
	if t.DType != F32 {
		return nil, fmt.Errorf("weights: %s: tensor %q: AsFloat32 of %s: %w", t.File, t.Name, t.DType, ErrDType)
	}
	if len(t.Data) == 0 {
		return []float32{}, nil
	}
	if uintptr(unsafe.Pointer(&t.Data[0]))%4 != 0 || !littleEndianHost() {
		return nil, fmt.Errorf("weights: %s: tensor %q: AsFloat32: %w", t.File, t.Name, ErrMisaligned)
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&t.Data[0])), len(t.Data)/4), nil
}

// AsUint16 returns the raw 16-bit elements of a BF16 or F16 tensor as a
// []uint16 aliasing the mapping (no copy); see BF16ToFloat32 and F16ToFloat32.
// It fails with ErrDType for another dtype and ErrMisaligned when the data does
// not start on a 2-byte boundary or the host is big-endian. The slice must not
// be written.
func (t Tensor) AsUint16() ([]uint16, error) {
	if t.DType != BF16 && t.DType != F16 {
		return nil, fmt.Errorf("weights: %s: tensor %q: AsUint16 of %s: %w", t.File, t.Name, t.DType, ErrDType)
	}
	if len(t.Data) == 0 {
		return []uint16{}, nil
	}
	if uintptr(unsafe.Pointer(&t.Data[0]))%2 != 0 || !littleEndianHost() {
		return nil, fmt.Errorf("weights: %s: tensor %q: AsUint16: %w", t.File, t.Name, ErrMisaligned)
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&t.Data[0])), len(t.Data)/2), nil
}

func littleEndianHost() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// BF16ToFloat32 widens a bfloat16 bit pattern to float32 (exact).
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16ToFloat32 widens an IEEE 754 half-precision bit pattern to float32
// (exact, including subnormals, infinities and NaN).
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0: // signed zero
		return math.Float32frombits(sign)
	default: // subnormal: mant * 2^-24
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
}
