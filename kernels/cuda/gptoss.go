package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// MoEClampedSwiGLU runs gpt-oss's experts (kernels.BiasedMoEer): MoE's
// device path (pairs grouped by expert on the device, grouped GEMVs or
// tensor-core projections, the k outputs summed in k order) with the
// gate/up bias and clamped SwiGLU fused into the activation pass and the
// down bias added per row. Batches of more than 1024 (token, k) pairs run
// in token chunks of at most 1024 pairs, each reading its experts' weights
// once (correct, not tuned for long prefills). Never waits for the host, so
// it can be captured. Hidden and intermediate sizes must be multiples of 8.
// An id outside the experts is reported by the next Download or Sync.
func (b *Backend) MoEClampedSwiGLU(out, x, ids, weights, gateUp, gateUpBias, down, downBias kernels.Tensor, p kernels.ClampedSwiGLU) error {
	const op = "moe_clamped_swiglu"
	var ts [8]*Tensor
	for i, a := range []struct {
		name string
		t    kernels.Tensor
	}{{"out", out}, {"x", x}, {"ids", ids}, {"weights", weights}, {"gate_up", gateUp},
		{"down", down}, {"gate_up_bias", gateUpBias}, {"down_bias", downBias}} {
		c, err := asCUDA(op, a.name, a.t)
		if err != nil {
			return err
		}
		ts[i] = c
	}
	o, xs, is, ws, gu, dn, gub, dnb := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6], ts[7]
	d, err := kernels.MoEShapes("cuda", o, xs, is, ws, gu, dn)
	if err != nil {
		return err
	}
	t, hidden, numExperts, inter, topK := d.T, d.Hidden, d.NumExperts, d.Inter, d.TopK
	if err := kernels.CheckShape("cuda", op, "gate_up_bias", gub, []int{numExperts, 2 * inter}, kernels.F32); err != nil {
		return err
	}
	if err := kernels.CheckShape("cuda", op, "down_bias", dnb, []int{numExperts, hidden}, kernels.F32); err != nil {
		return err
	}
	if !(p.Limit > 0) || math.IsInf(float64(p.Limit), 0) || math.IsNaN(float64(p.Alpha)) {
		return fmt.Errorf("cuda: %s: limit %g, alpha %g: %w", op, p.Limit, p.Alpha, kernels.ErrShape)
	}
	if dn.dtype != gu.dtype {
		return fmt.Errorf("cuda: %s: gate_up %s, down %s: one weight dtype expected: %w", op, gu.dtype, dn.dtype, kernels.ErrDType)
	}
	return b.launch(op, func() C.int {
		return C.c_moe_clamped_swiglu(b.lib.api, b.ctx, o.ptr(), xs.ptr(), is.ptr(), ws.ptr(), gu.ptr(), gub.ptr(), dn.ptr(), dnb.ptr(),
			C.int(gu.dtype), C.int(t), C.int(topK), C.int(hidden), C.int(inter), C.int(numExperts), C.float(p.Limit), C.float(p.Alpha))
	}, o, xs, is, ws, gu, dn, gub, dnb)
}

var _ kernels.BiasedMoEer = (*Backend)(nil)
