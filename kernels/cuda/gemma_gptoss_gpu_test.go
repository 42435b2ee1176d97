package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// TestGPUGemmaOps compares Scale, GELUTanhMul and Softcap with the CPU
// backend: the same float64 expressions rounded once, so bit-identical
// wherever the device's float64 tanh gives the host's (checked to 1 ulp of
// float32: 2e-7 relative).
func TestGPUGemmaOps(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, rows := range []int{1, 7, 300} {
		t.Run(fmt.Sprintf("rows=%d", rows), func(t *testing.T) {
			const n = 96
			gu := p.rand(kernels.F32, 6, rows, 2*n)
			act := p.zeros(kernels.F32, rows, n)
			p.poison(act)
			if err := p.c.GELUTanhMul(act.c, gu.c); err != nil {
				t.Fatal(err)
			}
			if err := p.g.GELUTanhMul(act.g, gu.g); err != nil {
				t.Fatal(err)
			}
			p.check("gelu_tanh_mul", act, 2e-7)
			x := p.rand(kernels.F32, 80, rows, n)
			out := p.zeros(kernels.F32, rows, n)
			if err := p.c.Scale(out.c, x.c, 0.37); err != nil {
				t.Fatal(err)
			}
			if err := p.g.Scale(out.g, x.g, 0.37); err != nil {
				t.Fatal(err)
			}
			p.check("scale", out, 0)
			// In place, as the models call it.
			if err := p.c.Softcap(x.c, 30); err != nil {
				t.Fatal(err)
			}
			if err := p.g.Softcap(x.g, 30); err != nil {
				t.Fatal(err)
			}
			p.check("softcap", x, 2e-7)
		})
	}
	if err := p.g.Softcap(p.zeros(kernels.F32, 2, 2).g, 0); err == nil {
		t.Error("softcap with cap 0: no error")
	}
}

// TestGPUMoEClampedSwiGLU compares gpt-oss's expert MLP with the CPU
// backend over float32 and BF16 weights in both GEMM modes, from one token
// to batches past one device chunk (1024 pairs), with gate values beyond
// the clamp; and checks that a graph replays its eager bits and that a
// token alone gets the bits it gets in a batch.
func TestGPUMoEClampedSwiGLU(t *testing.T) {
	const e, topK, hidden, inter = 8, 4, 64, 48
	act := kernels.ClampedSwiGLU{Limit: 7, Alpha: 1.702}
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			for _, tokens := range []int{1, 5, 300} {
				t.Run(fmt.Sprintf("%s/%s/tokens=%d", mode, dt, tokens), func(t *testing.T) {
					x := p.rand(kernels.F32, 3, tokens, hidden)
					gu, down := p.rand(dt, 0.4, e, 2*inter, hidden), p.rand(dt, 0.2, e, hidden, inter)
					gub, dnb := p.rand(kernels.F32, 1, e, 2*inter), p.rand(kernels.F32, 1, e, hidden)
					ids := p.ints(randExpertIDs(p.r, tokens, topK, e), tokens, topK)
					w := p.rand(kernels.F32, 1, tokens, topK)
					out := p.zeros(kernels.F32, tokens, hidden)
					p.poison(out)
					if err := p.c.MoEClampedSwiGLU(out.c, x.c, ids.c, w.c, gu.c, gub.c, down.c, dnb.c, act); err != nil {
						t.Fatal(err)
					}
					if err := p.g.MoEClampedSwiGLU(out.g, x.g, ids.g, w.g, gu.g, gub.g, down.g, dnb.g, act); err != nil {
						t.Fatal(err)
					}
					p.check("moe_clamped_swiglu", out, 2*linearTol(dt, mode))
					if tokens < 5 {
						return
					}
					// Token 3 alone: the bits it got in the batch.
					all := p.f32(p.g, out.g)
					view := func(ten kernels.Tensor) kernels.Tensor {
						v, err := p.g.Rows(ten, 3, 4)
						if err != nil {
							t.Fatal(err)
						}
						return v
					}
					one := p.zeros(kernels.F32, 1, hidden).g
					if err := p.g.MoEClampedSwiGLU(one, view(x.g), view(ids.g), view(w.g), gu.g, gub.g, down.g, dnb.g, act); err != nil {
						t.Fatal(err)
					}
					for j, v := range p.f32(p.g, one) {
						if math.Float32bits(v) != math.Float32bits(all[3*hidden+j]) {
							t.Fatalf("token 3 alone, element %d: %g, in the batch %g", j, v, all[3*hidden+j])
						}
					}
					// A captured graph replays the eager bits.
					replay := p.zeros(kernels.F32, tokens, hidden).g
					g, err := p.g.CaptureGraph(func() error {
						return p.g.MoEClampedSwiGLU(replay, x.g, ids.g, w.g, gu.g, gub.g, down.g, dnb.g, act)
					})
					if err != nil {
						t.Fatal(err)
					}
					defer g.Close()
					if err := g.Replay(); err != nil {
						t.Fatal(err)
					}
					for i, v := range p.f32(p.g, replay) {
						if math.Float32bits(v) != math.Float32bits(all[i]) {
							t.Fatalf("graph replay element %d: %g, eager %g", i, v, all[i])
						}
					}
				})
			}
		}
	}
}
