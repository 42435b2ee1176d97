package weights

import "fmt"

// DType is the element type of a tensor, as safetensors names it.
type DType uint8

// The dtypes this package reads. Models compute on F32, BF16 and F16; the
// integer and boolean dtypes are accepted in headers (reference ids, masks)
// but a model may refuse them.
const (
	DTypeInvalid DType = iota
	F32
	BF16
	F16
	I32
	I64
	U8
	Bool
	// F8E4M3 is OCP FP8 E4M3 ("F8_E4M3", torch.float8_e4m3fn): the
	// weights of FP8 checkpoints, read with their block scales (see
	// QuantizationConfig).
	F8E4M3
	// F8E5M2 is OCP FP8 E5M2 ("F8_E5M2"): accepted in headers; no model
	// computes with it.
	F8E5M2
)

var dtypeInfo = [...]struct {
	name string
	size int
}{
	DTypeInvalid: {"INVALID", 0},
	F32:          {"F32", 4},
	BF16:         {"BF16", 2},
	F16:          {"F16", 2},
	I32:          {"I32", 4},
	I64:          {"I64", 8},
	U8:           {"U8", 1},
	Bool:         {"BOOL", 1},
	F8E4M3:       {"F8_E4M3", 1},
	F8E5M2:       {"F8_E5M2", 1},
}

// ParseDType returns the DType named s as in a safetensors header ("F32",
// "BF16", ...). An unknown name is an error wrapping ErrDType.
func ParseDType(s string) (DType, error) {
	for d := F32; int(d) < len(dtypeInfo); d++ {
		if dtypeInfo[d].name == s {
			return d, nil
		}
	}
	return DTypeInvalid, fmt.Errorf("dtype %q: %w", s, ErrDType)
}

// String returns the safetensors name of d.
func (d DType) String() string {
	if int(d) < len(dtypeInfo) {
		return dtypeInfo[d].name
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Size returns the number of bytes of one element (0 for an invalid DType).
func (d DType) Size() int {
	if int(d) < len(dtypeInfo) {
		return dtypeInfo[d].size
	}
	return 0
}

// IsFloat reports whether d is a floating-point dtype.
func (d DType) IsFloat() bool { return d == F32 || d == BF16 || d == F16 || d == F8E4M3 || d == F8E5M2 }
