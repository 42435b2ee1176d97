package kernels_test

import (
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// gating records SiLULinear calls in place of a fused kernel.
type gating struct {
	kernels.Ops
	calls int
}

func (g *gating) SiLULinear(out, gateUp, w, bias kernels.Tensor) error { g.calls++; return nil }

// SiLUMulLinear takes the fused op when the backend has one, else SiLUMul
// into act and Linear: here silu(gate) * up of one row through a 2x2 weight.
func TestSiLUMulLinear(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 1})
	defer c.Close()
	f := func(xs []float32, shape ...int) kernels.Tensor {
		x, err := kernels.FromF32(c, xs, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	gu := f([]float32{0, 2, 3, 5}, 1, 4) // gate (0, 2), up (3, 5)
	w := f([]float32{1, 0, 1, 1}, 2, 2)
	out, act := f(make([]float32, 2), 1, 2), f(make([]float32, 2), 1, 2)
	g := &gating{Ops: c}
	if err := kernels.SiLUMulLinear(g, out, act, gu, w, nil); err != nil || g.calls != 1 {
		t.Fatalf("fused: %v, %d calls", err, g.calls)
	}
	if err := kernels.SiLUMulLinear(c, out, act, gu, w, nil); err != nil {
		t.Fatal(err)
	}
	got, err := kernels.ToF32(c, out)
	if err != nil {
		t.Fatal(err)
	}
	// silu(0) = 0, silu(2) = 2 / (1 + e^-2) = 1.7615942; act = (0, 8.807971).
	want := []float32{0, 8.807971}
	for i := range want {
		if d := got[i] - want[i]; d > 1e-5 || d < -1e-5 {
			t.Fatalf("out = %v, want %v", got, want)
		}
	}
}
