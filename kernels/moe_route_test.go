package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// routeFusing records RoutedMoE calls in place of a fused operation.
type routeFusing struct {
	kernels.Ops
	calls int
}

func (f *routeFusing) RoutedMoE(out, x, logits, bias kernels.Tensor, p kernels.RouteParams, ids, weights, gateUp, down, add kernels.Tensor) error {
	f.calls++
	return nil
}

// RoutedMoE hands the whole call to a backend that fuses it; elsewhere it
// runs MoERoute and then MoE (or MoEAdd with an addend), with their bits:
// ids, weights and output equal to the operations run by hand, with and
// without an addend.
func TestRoutedMoE(t *testing.T) {
	ops := cpu.New(cpu.Options{Threads: 2})
	defer ops.Close()
	const tokens, experts, topK, hidden, inter = 3, 8, 2, 16, 8
	r := rand.New(rand.NewPCG(3, 3))
	f := func(scale float32, shape ...int) kernels.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = scale * (2*r.Float32() - 1)
		}
		x, err := kernels.FromF32(ops, xs, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	alloc := func(dt kernels.DType, shape ...int) kernels.Tensor {
		x, err := ops.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	p := kernels.RouteParams{TopK: topK, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy, NumGroups: 1, NormTopKProb: true, ScalingFactor: 1}
	x, logits := f(1, tokens, hidden), f(3, tokens, experts)
	gu, dn := f(0.3, experts, 2*inter, hidden), f(0.3, experts, hidden, inter)
	for _, withAdd := range []bool{false, true} {
		var add kernels.Tensor
		if withAdd {
			add = f(2, tokens, hidden)
		}
		ids, w, out := alloc(kernels.I32, tokens, topK), alloc(kernels.F32, tokens, topK), alloc(kernels.F32, tokens, hidden)
		routed := alloc(kernels.F32, tokens, hidden)
		if err := kernels.RoutedMoE(ops, out, routed, x, logits, nil, p, ids, w, gu, dn, add); err != nil {
			t.Fatal(err)
		}
		wantIDs, wantW, want := alloc(kernels.I32, tokens, topK), alloc(kernels.F32, tokens, topK), alloc(kernels.F32, tokens, hidden)
		if err := ops.MoERoute(wantIDs, wantW, logits, nil, p); err != nil {
			t.Fatal(err)
		}
		if err := ops.MoE(want, x, wantIDs, wantW, gu, dn); err != nil {
			t.Fatal(err)
		}
		if add != nil {
			if err := ops.Add(want, want, add); err != nil {
				t.Fatal(err)
			}
		}
		gi, _ := kernels.ToI32(ops, ids)
		wi, _ := kernels.ToI32(ops, wantIDs)
		for i := range wi {
			if gi[i] != wi[i] {
				t.Fatalf("add %v: ids %v, want %v", withAdd, gi, wi)
			}
		}
		for _, pair := range [][2]kernels.Tensor{{w, wantW}, {out, want}} {
			got, _ := kernels.ToF32(ops, pair[0])
			exp, _ := kernels.ToF32(ops, pair[1])
			for i := range exp {
				if math.Float32bits(got[i]) != math.Float32bits(exp[i]) {
					t.Fatalf("add %v: element %d is %v, want %v", withAdd, i, got[i], exp[i])
				}
			}
		}
	}
	fz := &routeFusing{Ops: ops}
	if err := kernels.RoutedMoE(fz, nil, nil, nil, nil, nil, p, nil, nil, nil, nil, nil); err != nil || fz.calls != 1 {
		t.Fatalf("a fusing backend: %d calls, err %v; want its RoutedMoE once", fz.calls, err)
	}
}
