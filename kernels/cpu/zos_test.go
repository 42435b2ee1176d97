package cpu

import (
	"errors"
	"reflect"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

func TestResolvePlaceholders(t *testing.T) {
	b := New(Options{Threads: 2})
	defer b.Close()
	up := func(xs ...int32) kernels.Tensor {
		t.Helper()
		ten, err := kernels.FromI32(b, xs, len(xs))
		if err != nil {
			t.Fatal(err)
		}
		return ten
	}
	ids := up(5, -1, 7, -1)
	if err := b.ResolvePlaceholders(ids, up(-1, 2, -1, 0), up(40, 41, 42)); err != nil {
		t.Fatal(err)
	}
	got, err := kernels.ToI32(b, ids)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []int32{5, 42, 7, 40}) {
		t.Errorf("ids = %v", got)
	}
	err = b.ResolvePlaceholders(up(-1), up(3), up(1, 2))
	if !errors.Is(err, kernels.ErrOutOfRange) {
		t.Errorf("row outside the step: %v", err)
	}
	err = b.ResolvePlaceholders(up(-1, -1), up(0), up(1))
	if !errors.Is(err, kernels.ErrShape) {
		t.Errorf("length mismatch: %v", err)
	}
}
