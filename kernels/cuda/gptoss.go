package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"

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
// gateUp and down may be MXFP4 weights (MXFP4Weight; both or neither,
// hidden and intermediate sizes multiples of 32): MXFP4 expert kernels read
// their 4-bit codes and scales (4.25 bits a weight), widen them to BF16 in
// registers and multiply in the BF16 kernels' order, so the result is that
// of the call with the weights widened to BF16, bit for bit.
func (b *Backend) MoEClampedSwiGLU(out, x, ids, weights, gateUp, gateUpBias, down, downBias kernels.Tensor, p kernels.ClampedSwiGLU) error {
	const op = "moe_clamped_swiglu"
	var ts [8]*Tensor
	if err := asCUDAs(op, ts[:], tensorArg{"out", out}, tensorArg{"x", x}, tensorArg{"ids", ids}, tensorArg{"weights", weights},
		tensorArg{"gate_up", gateUp}, tensorArg{"down", down}, tensorArg{"gate_up_bias", gateUpBias}, tensorArg{"down_bias", downBias}); err != nil {
		return err
	}
	o, xs, is, ws, gu, dn, gub, dnb := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6], ts[7]
	d, err := kernels.MXFP4MoEShapes("cuda", o, xs, is, ws, gu, dn)
	if err != nil {
		return err
	}
	t, hidden, numExperts, inter, topK := d.T, d.Hidden, d.NumExperts, d.Inter, d.TopK
	if err := kernels.ClampedSwiGLUShapes("cuda", d, gub, dnb, p); err != nil {
		return err
	}
	if gu.mx != nil { // and dn.mx: MXFP4MoEShapes takes both or neither
		return b.moeClampedSwiGLUMXFP4(o, xs, is, ws, gu, gub, dn, dnb, d, p)
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
