package kernels

import "fmt"

// FloatTypes are the dtypes weights may be stored in.
var FloatTypes = []DType{F32, BF16, F16}

// CheckShape is the argument check every backend runs before a kernel: t
// must have len(want) dimensions, each equal to want[i] where want[i] >= 0
// (-1 accepts any size), and, when dtypes are given, one of them. The error
// names the backend, the operation, the argument and what was expected,
// and wraps ErrShape or ErrDType.
func CheckShape(backend, op, name string, t Tensor, want []int, dtypes ...DType) error {
	shape := t.Shape()
	ok := len(shape) == len(want)
	for i := 0; ok && i < len(want); i++ {
		if want[i] >= 0 && shape[i] != want[i] {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("%s: %s: %s is %v, want shape %v: %w", backend, op, name, t, want, ErrShape)
	}
	if len(dtypes) == 0 {
		return nil
	}
	for _, d := range dtypes {
		if t.DType() == d {
			return nil
		}
	}
	return fmt.Errorf("%s: %s: %s is %v, want dtype in %v: %w", backend, op, name, t, dtypes, ErrDType)
}
