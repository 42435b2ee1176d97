package cuda

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// stepsOnly hides the backend's QKVPreparer, so kernels.PrepareQKV runs the
// separate ops on it.
type stepsOnly struct{ kernels.Ops }

// The fused qkv_prepare kernel gives the bits of the separate ops (split,
// per-head RMSNorm, RoPE, both cache writes) on the same backend: q and the
// whole of both caches, for Llama-like (no norm) and Qwen3-like (norms)
// layouts, F32, F16 and 8-bit E4M3 caches, a partial interleaved rotation, rows not
// written (slot -1), one row and a prefill chunk; and against the CPU
// backend's steps to float32 rounding.
func TestGPUPrepareQKV(t *testing.T) {
	cases := []struct {
		name           string
		h, hkv, d      int
		rope           kernels.RoPEParams
		norms          bool
		cache          kernels.DType
		tokens         int
		skipSlotsEvery int // every n-th row has slot -1 (0: none)
	}{
		{"llama-d64-f16-decode", 32, 8, 64, kernels.RoPEParams{RotaryDim: 64}, false, kernels.F16, 1, 0},
		{"llama-d64-f16-chunk", 32, 8, 64, kernels.RoPEParams{RotaryDim: 64}, false, kernels.F16, 37, 5},
		{"qwen3-d128-f16", 16, 8, 128, kernels.RoPEParams{RotaryDim: 128}, true, kernels.F16, 9, 4},
		{"qwen3-d128-f32", 16, 8, 128, kernels.RoPEParams{RotaryDim: 128}, true, kernels.F32, 9, 0},
		{"qwen3-d128-f8", 16, 8, 128, kernels.RoPEParams{RotaryDim: 128}, true, kernels.F8E4M3, 9, 4},
		{"llama-d64-f8-decode", 32, 8, 64, kernels.RoPEParams{RotaryDim: 64}, false, kernels.F8E4M3, 1, 0},
		{"partial-interleaved-f32", 6, 2, 48, kernels.RoPEParams{Offset: 16, RotaryDim: 32, Interleaved: true}, false, kernels.F32, 7, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, GEMMRound)
			const maxPos, blocks, blockSize = 300, 16, 16
			qd, kvd := c.h*c.d, c.hkv*c.d
			half := c.rope.RotaryDim / 2
			qkv := p.rand(kernels.F32, 2, c.tokens, qd+2*kvd)
			cos, sin := p.rand(kernels.F32, 1, maxPos, half), p.rand(kernels.F32, 1, maxPos, half)
			ps, sm := p.positionsAndSlots(c.tokens, maxPos, blocks*blockSize, c.skipSlotsEvery)
			var qn, kn dual
			if c.norms {
				qn, kn = p.rand(kernels.F32, 1.5, c.d), p.rand(kernels.F32, 1.5, c.d)
			}
			cacheInit := randVals(p.r, blocks*blockSize*kvd, 1)
			args := func(ops kernels.Ops, pick func(dual) kernels.Tensor, q, kc, vc kernels.Tensor) kernels.QKV {
				a := kernels.QKV{QKV: pick(qkv), Q: q, KCache: kc, VCache: vc, SlotMapping: pick(sm), Positions: pick(ps),
					Cos: pick(cos), Sin: pick(sin), Eps: 1e-6, NumHeads: c.h, NumKVHeads: c.hkv, HeadDim: c.d, RoPE: c.rope}
				if c.norms {
					a.QNorm, a.KNorm = pick(qn), pick(kn)
				}
				var err error
				if a.K, err = ops.Alloc(kernels.F32, c.tokens, kvd); err != nil {
					t.Fatal(err)
				}
				if a.V, err = ops.Alloc(kernels.F32, c.tokens, kvd); err != nil {
					t.Fatal(err)
				}
				return a
			}
			gpu := func(d dual) kernels.Tensor { return d.g }
			run := func(ops kernels.Ops, fused bool) (q []float32, kc, vc []byte) {
				qt := upload(t, p.g, kernels.F32, kernels.F32Bytes(randVals(p.r, c.tokens*qd, 1)), kernels.F32, c.tokens, qd)
				raw := hostBytes(c.cache, cacheInit)
				kct := upload(t, p.g, c.cache, raw, c.cache, blocks, blockSize, kvd)
				vct := upload(t, p.g, c.cache, raw, c.cache, blocks, blockSize, kvd)
				a := args(p.g, gpu, qt, kct, vct)
				var err error
				if fused {
					err = kernels.PrepareQKV(ops, a)
				} else {
					err = kernels.PrepareQKV(stepsOnly{ops}, a)
				}
				if err != nil {
					t.Fatal(err)
				}
				kc, vc = make([]byte, len(raw)), make([]byte, len(raw))
				if err := p.g.Download(kc, kct); err != nil {
					t.Fatal(err)
				}
				if err := p.g.Download(vc, vct); err != nil {
					t.Fatal(err)
				}
				return p.f32(p.g, qt), kc, vc
			}
			fq, fk, fv := run(p.g, true)
			sq, sk, sv := run(p.g, false)
			if !bytes.Equal(kernels.F32Bytes(fq), kernels.F32Bytes(sq)) {
				t.Errorf("q: fused differs from the separate ops (max relative difference %.3g)", maxRelErr(fq, sq))
			}
			if !bytes.Equal(fk, sk) {
				t.Error("K cache: fused differs from the separate ops")
			}
			if !bytes.Equal(fv, sv) {
				t.Error("V cache: fused differs from the separate ops")
			}
			if bytes.Equal(fk, hostBytes(c.cache, cacheInit)) {
				t.Error("K cache unchanged")
			}
			// The CPU backend's steps, to float32 rounding (the caches in F32).
			cpuQ, err := p.c.Alloc(kernels.F32, c.tokens, qd)
			if err != nil {
				t.Fatal(err)
			}
			cpuK := upload(t, p.c, kernels.F32, kernels.F32Bytes(cacheInit), kernels.F32, blocks, blockSize, kvd)
			cpuV := upload(t, p.c, kernels.F32, kernels.F32Bytes(cacheInit), kernels.F32, blocks, blockSize, kvd)
			if err := kernels.PrepareQKV(p.c, args(p.c, func(d dual) kernels.Tensor { return d.c }, cpuQ, cpuK, cpuV)); err != nil {
				t.Fatal(err)
			}
			if e := maxRelErr(fq, p.f32(p.c, cpuQ)); e > 1e-5 {
				t.Errorf("q vs the CPU backend: max relative difference %.3g", e)
			}
		})
	}
}

// Bad arguments are errors naming what was wrong, before any launch.
func TestGPUPrepareQKVErrors(t *testing.T) {
	g := newGPU(t, GEMMRound)
	alloc := func(dt kernels.DType, shape ...int) kernels.Tensor {
		x, err := g.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	good := func() kernels.QKV {
		return kernels.QKV{QKV: alloc(kernels.F32, 2, 4*8), Q: alloc(kernels.F32, 2, 2*8),
			KCache: alloc(kernels.F16, 2, 4, 8), VCache: alloc(kernels.F16, 2, 4, 8),
			SlotMapping: alloc(kernels.I32, 2), Positions: alloc(kernels.I32, 2),
			Cos: alloc(kernels.F32, 10, 4), Sin: alloc(kernels.F32, 10, 4),
			NumHeads: 2, NumKVHeads: 1, HeadDim: 8, RoPE: kernels.RoPEParams{RotaryDim: 8}}
	}
	if err := g.PrepareQKV(good()); err != nil {
		t.Fatalf("good arguments: %v", err)
	}
	for name, edit := range map[string]func(*kernels.QKV){
		"odd rotary dim":   func(a *kernels.QKV) { a.RoPE.RotaryDim = 7 },
		"q width":          func(a *kernels.QKV) { a.Q = alloc(kernels.F32, 2, 15) },
		"one norm":         func(a *kernels.QKV) { a.QNorm = alloc(kernels.F32, 8) },
		"cache width":      func(a *kernels.QKV) { a.KCache = alloc(kernels.F16, 2, 4, 9) },
		"v cache dtype":    func(a *kernels.QKV) { a.VCache = alloc(kernels.F32, 2, 4, 8) },
		"positions length": func(a *kernels.QKV) { a.Positions = alloc(kernels.I32, 3) },
		"cos width":        func(a *kernels.QKV) { a.Cos = alloc(kernels.F32, 10, 3) },
	} {
		a := good()
		edit(&a)
		err := g.PrepareQKV(a)
		if !errors.Is(err, kernels.ErrShape) && !errors.Is(err, kernels.ErrDType) {
			t.Errorf("%s: %v, want a shape or dtype error", name, err)
		}
		if err != nil && !strings.Contains(err.Error(), "qkv_prepare") {
			t.Errorf("%s: %q does not name the op", name, err)
		}
	}
}
