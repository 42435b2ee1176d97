package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// The elementwise operations of the Gemma family (kernels.GemmaOpser), with
// kernels/cpu's arithmetic (float64 tanh rounded once to float32).

// Scale computes out = x * s elementwise; out may alias x. Cost: one pass.
func (b *Backend) Scale(out, x kernels.Tensor, s float32) error {
	const op = "scale"
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	xs, err := asCUDA(op, "x", x)
	if err != nil {
		return err
	}
	n, err := kernels.AddShapes("cuda", o, xs, xs)
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_scale(b.lib.api, b.ctx, o.ptr(), xs.ptr(), C.uint64_t(n), C.float(s))
	}, o, xs)
}

// GELUTanhMul computes gelu_tanh(gate) * up from the fused [T, 2n]
// projection into out [T, n].
func (b *Backend) GELUTanhMul(out, gateUp kernels.Tensor) error {
	return b.gatedActivation("gelu_tanh_mul", out, gateUp, func(o, g *Tensor, rows, n int) C.int {
		return C.c_gelu_tanh_mul(b.lib.api, b.ctx, o.ptr(), g.ptr(), C.int(rows), C.int(n))
	})
}

// Softcap computes x = c * tanh(x / c) in place, c > 0.
func (b *Backend) Softcap(x kernels.Tensor, c float32) error {
	const op = "softcap"
	xs, err := asCUDA(op, "x", x)
	if err != nil {
		return err
	}
	if !(c > 0) {
		return fmt.Errorf("cuda: %s: cap %g, want > 0: %w", op, c, kernels.ErrShape)
	}
	n, err := kernels.AddShapes("cuda", xs, xs, xs)
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_softcap(b.lib.api, b.ctx, xs.ptr(), C.uint64_t(n), C.float(c))
	}, xs)
}

var _ kernels.GemmaOpser = (*Backend)(nil)
