package kernels

import (
	"fmt"
	"slices"
)

// FloatTypes are the dtypes weights may be stored in.
var FloatTypes = []DType{F32, BF16, F16}

// CheckShape is the argument check every backend runs before a kernel: t
// must have len(want) dimensions, each equal to want[i] where want[i] >= 0
// (-1 accepts any size), and, when dtypes are given, one of them. The error
// names the backend, the operation, the argument and what was expected,
// and wraps ErrShape or ErrDType; a nil t (or a typed nil pointer) is
// reported as As reports it, wrapping ErrForeignTensor.
func CheckShape(backend, op, name string, t Tensor, want []int, dtypes ...DType) error {
	if !present(t) {
		return fmt.Errorf("%s: %s: %s is %T: %w", backend, op, name, t, ErrForeignTensor)
	}
	shape := t.Shape()
	ok := len(shape) == len(want)
	for i := 0; ok && i < len(want); i++ {
		if want[i] >= 0 && shape[i] != want[i] {
			ok = false
		}
	}
	if !ok {
		// Clones: handing want itself to Errorf would move every
		// caller's literal to the heap, errors or not.
		return fmt.Errorf("%s: %s: %s is %v, want shape %v: %w", backend, op, name, t, slices.Clone(want), ErrShape)
	}
	if len(dtypes) == 0 {
		return nil
	}
	for _, d := range dtypes {
		if t.DType() == d {
			return nil
		}
	}
	return fmt.Errorf("%s: %s: %s is %v, want dtype in %v: %w", backend, op, name, t, slices.Clone(dtypes), ErrDType)
}

// As converts t to a backend's own tensor type T (a pointer type), or
// fails with ErrForeignTensor naming the backend, the operation and the
// argument: a nil tensor or one made by another backend.
func As[T interface {
	comparable
	Tensor
}](backend, op, name string, t Tensor) (T, error) {
	c, ok := t.(T)
	var zero T
	if !ok || c == zero {
		return zero, fmt.Errorf("%s: %s: %s is %T: %w", backend, op, name, t, ErrForeignTensor)
	}
	return c, nil
}

// Opt is As for optional arguments: a nil tensor (or a typed nil of T)
// gives the zero T and no error.
func Opt[T interface {
	comparable
	Tensor
}](backend, op, name string, t Tensor) (T, error) {
	var zero T
	if t == nil {
		return zero, nil
	}
	if c, ok := t.(T); ok && c == zero {
		return zero, nil
	}
	return As[T](backend, op, name, t)
}
