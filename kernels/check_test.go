package kernels

import (
	"errors"
	"strings"
	"testing"
)

type fakeTensor struct {
	shape []int
	dtype DType
}

func (f fakeTensor) Shape() []int { return f.shape }
func (f fakeTensor) DType() DType { return f.dtype }

func TestCheckShape(t *testing.T) {
	x := fakeTensor{shape: []int{3, 4}, dtype: BF16}
	tests := []struct {
		want   []int
		dtypes []DType
		is     error
	}{
		{[]int{3, 4}, nil, nil},
		{[]int{-1, 4}, FloatTypes, nil},
		{[]int{3, 5}, nil, ErrShape},
		{[]int{3}, nil, ErrShape},
		{[]int{3, 4}, []DType{F32}, ErrDType},
	}
	for _, tc := range tests {
		err := CheckShape("cpu", "linear", "w", x, tc.want, tc.dtypes...)
		if !errors.Is(err, tc.is) || (err == nil) != (tc.is == nil) {
			t.Errorf("CheckShape(%v, %v) = %v, want %v", tc.want, tc.dtypes, err, tc.is)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "cpu: linear: w is ") {
			t.Errorf("error %q does not name the backend, op and argument", err)
		}
	}
}
