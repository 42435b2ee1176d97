package cuda

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// SiLULinear (one fused kernel for one row on the GEMV path, the two ops
// otherwise) gives the bits of SiLUMul followed by Linear on the same
// backend: every weight dtype, both GEMM modes, with and without bias, one
// row and three; shapes that do not fit are errors naming the op.
func TestGPUSiLULinear(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode)
		g := p.g
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
			for _, rows := range []int{1, 3} {
				for _, withBias := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/%s/rows=%d/bias=%v", mode, dt, rows, withBias), func(t *testing.T) {
						const n, k = 300, 1032 // k a multiple of 8, past one group of loads
						gu := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, rows*2*k, 4)), kernels.F32, rows, 2*k)
						w := upload(t, g, dt, hostBytes(dt, randVals(p.r, n*k, 0.05)), dt, n, k)
						var bias kernels.Tensor
						if withBias {
							bias = upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, n, 1)), kernels.F32, n)
						}
						alloc := func(shape ...int) kernels.Tensor {
							x, err := g.Alloc(kernels.F32, shape...)
							if err != nil {
								t.Fatal(err)
							}
							return x
						}
						fused, sep, act := alloc(rows, n), alloc(rows, n), alloc(rows, k)
						if err := g.SiLULinear(fused, gu, w, bias); err != nil {
							t.Fatal(err)
						}
						if err := g.SiLUMul(act, gu); err != nil {
							t.Fatal(err)
						}
						if err := g.Linear(sep, act, w, bias); err != nil {
							t.Fatal(err)
						}
						got, want := p.f32(g, fused), p.f32(g, sep)
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("element %d: fused %v, separate %v", i, got[i], want[i])
							}
						}
					})
				}
			}
		}
	}
	g := newGPU(t, GEMMRound)
	alloc := func(dt kernels.DType, shape ...int) kernels.Tensor {
		x, err := g.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	w := alloc(kernels.BF16, 4, 8)
	for name, args := range map[string][3]kernels.Tensor{
		"gate_up width": {alloc(kernels.F32, 1, 4), alloc(kernels.F32, 1, 15), nil},
		"out shape":     {alloc(kernels.F32, 2, 4), alloc(kernels.F32, 1, 16), nil},
		"bias length":   {alloc(kernels.F32, 1, 4), alloc(kernels.F32, 1, 16), alloc(kernels.F32, 5)},
	} {
		err := g.SiLULinear(args[0], args[1], w, args[2])
		if !errors.Is(err, kernels.ErrShape) || !strings.Contains(err.Error(), "silu_linear") {
			t.Errorf("%s: %v, want a shape error naming silu_linear", name, err)
		}
	}
}
