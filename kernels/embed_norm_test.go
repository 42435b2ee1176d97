package kernels_test

import (
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// embedNormFusing records EmbedNormConcat calls in place of a fused
// operation.
type embedNormFusing struct {
	kernels.Ops
	calls int
}

func (f *embedNormFusing) EmbedNormConcat(out, table, ids, embNorm, x, xNorm kernels.Tensor, eps float32) error {
	f.calls++
	return nil
}

// EmbedNormConcat hands the call to a backend that has the operation;
// elsewhere it writes [RMSNorm(table[ids]), RMSNorm(x)]: the CPU backend's
// rows of its four operations (checked against the norms of the gathered
// rows, computed here by RMSNorm on copies).
func TestEmbedNormConcat(t *testing.T) {
	ops := cpu.New(cpu.Options{Threads: 2})
	defer ops.Close()
	f := func(xs []float32, shape ...int) kernels.Tensor {
		x, err := kernels.FromF32(ops, xs, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	const h, eps = 4, 1e-6
	table := []float32{1, 2, 3, 4, -1, 0.5, 2, 0, 3, 3, -3, 1}
	x, en, xn := []float32{0.5, -1, 2, 4, 1, 1, 1, 1}, []float32{1, 2, 0.5, 1}, []float32{2, 1, 1, 0.25}
	ids, err := kernels.FromI32(ops, []int32{2, 0}, 2)
	if err != nil {
		t.Fatal(err)
	}
	out := f(make([]float32, 2*2*h), 2, 2*h)
	if err := kernels.EmbedNormConcat(ops, out, f(make([]float32, 2*h), 2, h), f(make([]float32, 2*h), 2, h),
		f(table, 3, h), ids, f(en, h), f(x, 2, h), f(xn, h), eps); err != nil {
		t.Fatal(err)
	}
	// The expected rows: RMSNorm of table rows 2 and 0, and of x.
	e := f(append(append([]float32{}, table[2*h:3*h]...), table[:h]...), 2, h)
	if err := ops.RMSNorm(e, e, f(en, h), eps); err != nil {
		t.Fatal(err)
	}
	hx := f(make([]float32, 2*h), 2, h)
	if err := ops.RMSNorm(hx, f(x, 2, h), f(xn, h), eps); err != nil {
		t.Fatal(err)
	}
	got, _ := kernels.ToF32(ops, out)
	ev, _ := kernels.ToF32(ops, e)
	hv, _ := kernels.ToF32(ops, hx)
	for r := range 2 {
		want := append(append([]float32{}, ev[r*h:(r+1)*h]...), hv[r*h:(r+1)*h]...)
		for j, w := range want {
			if got[r*2*h+j] != w {
				t.Fatalf("row %d column %d: %v, want %v", r, j, got[r*2*h+j], w)
			}
		}
	}
	fz := &embedNormFusing{Ops: ops}
	if err := kernels.EmbedNormConcat(fz, nil, nil, nil, nil, nil, nil, nil, nil, eps); err != nil || fz.calls != 1 {
		t.Fatalf("a fusing backend: %d calls, err %v; want its EmbedNormConcat once", fz.calls, err)
	}
}
