package cpu

import (
	"math"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// MoEClampedSwiGLU is MoE with biased projections and gpt-oss's clamped
// SwiGLU; see kernels.BiasedMoEer. Like MoE, every (token, k) pair's expert
// output is computed alone in its row and the pairs are mixed in k order,
// so a token's result does not depend on its batch neighbours. gateUp and
// down may be MXFP4 weights (MXFP4Weight), widened a tile of rows at a
// time: the bits of the same call with them widened to BF16.
func (b *Backend) MoEClampedSwiGLU(out, x, ids, weights, gateUp, gateUpBias, down, downBias kernels.Tensor, p kernels.ClampedSwiGLU) error {
	const op = "moe_clamped_swiglu"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	var ts [8]*Tensor
	for i, a := range []struct {
		name string
		t    kernels.Tensor
	}{{"out", out}, {"x", x}, {"ids", ids}, {"weights", weights}, {"gate_up", gateUp},
		{"down", down}, {"gate_up_bias", gateUpBias}, {"down_bias", downBias}} {
		c, err := asCPU(op, a.name, a.t)
		if err != nil {
			return err
		}
		ts[i] = c
	}
	o, xs, is, ws, gu, dn, gub, dnb := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6], ts[7]
	d, err := kernels.MXFP4MoEShapes("cpu", o, xs, is, ws, gu, dn)
	if err != nil {
		return err
	}
	t, hidden, numExperts, inter, topK := d.T, d.Hidden, d.NumExperts, d.Inter, d.TopK
	if err := kernels.ClampedSwiGLUShapes("cpu", d, gub, dnb, p); err != nil {
		return err
	}
	byExpert, err := groupByExpert(op, is.i32, numExperts, topK)
	if err != nil {
		return err
	}
	// Expert output per (token, k): every row is written by the expert
	// of its pair before the sum below reads it.
	ys, pooled := poolFloats(&b.moe, t*topK*hidden)
	defer pooled.done()
	for e, pairs := range byExpert {
		n := len(pairs)
		if n == 0 {
			continue
		}
		xe, g, a, rows := b.expertRows(xs.f32, pairs, topK, hidden, inter)
		b.expertLinear(g, xe, gu, e, n, 2*inter, hidden, gub.f32[e*2*inter:(e+1)*2*inter])
		for r := range n {
			clampedSwiGLURow(a[r*inter:(r+1)*inter], g[r*2*inter:(r+1)*2*inter], p)
		}
		ye := xe // reuse: n*hidden
		b.expertLinear(ye, a, dn, e, n, hidden, inter, dnb.f32[e*hidden:(e+1)*hidden])
		for r, pair := range pairs {
			copy(ys[int(pair)*hidden:(int(pair)+1)*hidden], ye[r*hidden:(r+1)*hidden])
		}
		rows.done()
	}
	b.forRows(t, topK*hidden, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst := o.f32[i*hidden : (i+1)*hidden]
			clear(dst)
			for k := range topK {
				b.k.axpy(ws.f32[i*topK+k], ys[(i*topK+k)*hidden:(i*topK+k+1)*hidden], dst)
			}
		}
	})
	return nil
}

// clampedSwiGLURow writes act(gate, up) of one row; gateUp holds the gate
// half then the up half.
func clampedSwiGLURow(dst, gateUp []float32, p kernels.ClampedSwiGLU) {
	n := len(dst)
	for j := range dst {
		g := min(gateUp[j], p.Limit)
		u := min(max(gateUp[n+j], -p.Limit), p.Limit)
		glu := g * float32(1/(1+math.Exp(-float64(p.Alpha*g))))
		dst[j] = (u + 1) * glu
	}
}
