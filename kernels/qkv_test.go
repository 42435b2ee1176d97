package kernels_test

import (
	"errors"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// fusing records PrepareQKV calls in place of a fused kernel.
type fusing struct {
	kernels.Ops
	calls int
}

func (f *fusing) PrepareQKV(kernels.QKV) error { f.calls++; return nil }

// qkvArgs are the arguments of a small PrepareQKV call on ops: 2 tokens,
// 2 q heads and 1 KV head of 4, rotary over the whole head.
func qkvArgs(t *testing.T, ops kernels.Ops) kernels.QKV {
	t.Helper()
	f := func(xs []float32, shape ...int) kernels.Tensor {
		x, err := kernels.FromF32(ops, xs, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	i := func(xs []int32, shape ...int) kernels.Tensor {
		x, err := kernels.FromI32(ops, xs, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	qkv := make([]float32, 2*16)
	for j := range qkv {
		qkv[j] = float32(j%7) - 3
	}
	return kernels.QKV{QKV: f(qkv, 2, 16), Q: f(make([]float32, 16), 2, 8),
		K: f(make([]float32, 8), 2, 4), V: f(make([]float32, 8), 2, 4),
		KCache: f(make([]float32, 16), 2, 2, 4), VCache: f(make([]float32, 16), 2, 2, 4),
		SlotMapping: i([]int32{3, -1}, 2), Positions: i([]int32{0, 1}, 2),
		Cos: f([]float32{1, 1, 0, 0}, 2, 2), Sin: f([]float32{0, 0, 1, 1}, 2, 2),
		NumHeads: 2, NumKVHeads: 1, HeadDim: 4, RoPE: kernels.RoPEParams{RotaryDim: 4}}
}

// PrepareQKV takes the fused op when the backend has one, else runs the
// steps: split, RoPE (here angle 0 at position 0, 90 degrees at 1) and the
// cache write of slot 3 only.
func TestPrepareQKV(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 1})
	defer c.Close()
	f := &fusing{Ops: c}
	if err := kernels.PrepareQKV(f, qkvArgs(t, c)); err != nil || f.calls != 1 {
		t.Fatalf("fused: %v, %d calls", err, f.calls)
	}
	a := qkvArgs(t, c)
	if err := kernels.PrepareQKV(c, a); err != nil {
		t.Fatal(err)
	}
	q, err := kernels.ToF32(c, a.Q)
	if err != nil {
		t.Fatal(err)
	}
	// Row 0 (position 0) is q unrotated: qkv[0:8] = j%7 - 3. Row 1 (90
	// degrees): qkv[16:24] = [-1 0 1 2 | 3 -3 -2 -1], pairs (x0, x1) ->
	// (-x1, x0) over (j, j+2) of each head.
	want := []float32{-3, -2, -1, 0, 1, 2, 3, -3, -1, -2, -1, 0, 2, 1, 3, -3}
	for j := range want {
		if q[j] != want[j] {
			t.Fatalf("q = %v, want %v", q, want)
		}
	}
	kc, err := kernels.ToF32(c, a.KCache)
	if err != nil {
		t.Fatal(err)
	}
	// Slot 3 holds row 0's k (qkv[8:12] = j%7 - 3, j = 8..11), unrotated;
	// row 1 (slot -1) is not written.
	wantK := []float32{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -2, -1, 0, 1}
	for j := range wantK {
		if kc[j] != wantK[j] {
			t.Fatalf("K cache = %v, want %v", kc, wantK)
		}
	}
}

func TestPrepareQKVErrors(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 1})
	defer c.Close()
	for name, edit := range map[string]func(*kernels.QKV){
		"one norm":   func(a *kernels.QKV) { a.QNorm = a.Cos },
		"no scratch": func(a *kernels.QKV) { a.K = nil },
	} {
		a := qkvArgs(t, c)
		edit(&a)
		if err := kernels.PrepareQKV(c, a); !errors.Is(err, kernels.ErrShape) {
			t.Errorf("%s: %v, want ErrShape", name, err)
		}
	}
}
