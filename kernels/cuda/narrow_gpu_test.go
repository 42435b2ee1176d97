package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// LinearInputDType (kernels.LinearInputer) reports 16-bit inputs exactly
// where Linear would round a float32 x for cuBLAS: GEMM mode round, 16-bit
// weights, rows past the GEMV kernel's (default 4); never in split mode,
// for float32 weights or with Options.DisableNormNarrow.
func TestGPULinearInputDType(t *testing.T) {
	round, split := newGPU(t, GEMMRound), newGPU(t, GEMMSplit)
	off := newGPUOpts(t, Options{DisableNormNarrow: true})
	for _, c := range []struct {
		g    *Backend
		name string
		w    kernels.DType
		rows int
		want kernels.DType
	}{
		{round, "round", kernels.BF16, 1, kernels.F32},
		{round, "round", kernels.BF16, 4, kernels.F32},
		{round, "round", kernels.BF16, 5, kernels.BF16},
		{round, "round", kernels.F16, 300, kernels.F16},
		{round, "round", kernels.F32, 300, kernels.F32},
		{split, "split", kernels.BF16, 300, kernels.F32},
		{off, "NORM_NARROW=0", kernels.BF16, 300, kernels.F32},
	} {
		if got := c.g.LinearInputDType(c.w, c.rows); got != c.want {
			t.Errorf("%s: LinearInputDType(%s, %d rows) = %s, want %s", c.name, c.w, c.rows, got, c.want)
		}
	}
}

// Norm outputs rounded by the norm where the linears would round them give
// the same bits all the way: RMSNorm and AddRMSNorm with a BF16 or F16 out
// write their float32 outputs rounded to nearest (and the same residual),
// and Linear and GatedMLP over that x give the bits of the float32 x, on
// GatedMLP's Linear path (5 rows) and its 16-bit path (300 rows). A 16-bit
// x of another type than the weights' is refused.
func TestGPUNormNarrowInput(t *testing.T) {
	p := newPair(t, GEMMRound)
	g, r := p.g, p.r
	const hidden, inter, n = 512, 768, 640
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		w := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, hidden, 1)), kernels.F32, hidden)
		proj := upload(t, g, dt, hostBytes(dt, randVals(r, n*hidden, 0.05)), dt, n, hidden)
		gateUp := upload(t, g, dt, hostBytes(dt, randVals(r, 2*inter*hidden, 0.05)), dt, 2*inter, hidden)
		down := upload(t, g, dt, hostBytes(dt, randVals(r, hidden*inter, 0.05)), dt, hidden, inter)
		for _, rows := range []int{5, 300} {
			for _, withResid := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/rows=%d/residual=%v", dt, rows, withResid), func(t *testing.T) {
					if got := g.LinearInputDType(dt, rows); got != dt {
						t.Fatalf("LinearInputDType(%s, %d) = %s: the case does not test the 16-bit input", dt, rows, got)
					}
					xv, rv := randVals(r, rows*hidden, 2), randVals(r, rows*hidden, 2)
					x := upload(t, g, kernels.F32, kernels.F32Bytes(xv), kernels.F32, rows, hidden)
					out32, _ := g.Alloc(kernels.F32, rows, hidden)
					out16, _ := g.Alloc(dt, rows, hidden)
					var res32, res16 kernels.Tensor
					norm := func(out, res kernels.Tensor) {
						var err error
						if withResid {
							err = g.AddRMSNorm(out, res, x, w, 1e-6)
						} else {
							err = g.RMSNorm(out, x, w, 1e-6)
						}
						if err != nil {
							t.Fatal(err)
						}
					}
					if withResid {
						res32 = upload(t, g, kernels.F32, kernels.F32Bytes(rv), kernels.F32, rows, hidden)
						res16 = upload(t, g, kernels.F32, kernels.F32Bytes(rv), kernels.F32, rows, hidden)
					}
					norm(out32, res32)
					norm(out16, res16)
					want32 := p.f32(g, out32)
					if got := p.raw(g, out16); !bytes.Equal(got, hostBytes(dt, want32)) {
						t.Fatalf("the %s norm output is not the float32 one rounded to nearest", dt)
					}
					if withResid && !bytes.Equal(p.raw(g, res16), p.raw(g, res32)) {
						t.Fatal("the residual differs with a 16-bit norm output")
					}
					same := func(what string, run func(x kernels.Tensor, out kernels.Tensor) error, cols int) {
						a, _ := g.Alloc(kernels.F32, rows, cols)
						b, _ := g.Alloc(kernels.F32, rows, cols)
						if err := run(out32, a); err != nil {
							t.Fatal(err)
						}
						if err := run(out16, b); err != nil {
							t.Fatal(err)
						}
						av, bv := p.f32(g, a), p.f32(g, b)
						for i := range av {
							if math.Float32bits(av[i]) != math.Float32bits(bv[i]) {
								t.Fatalf("%s: element %d is %v over the %s x, %v over the float32 x", what, i, bv[i], dt, av[i])
							}
						}
					}
					same("linear", func(x, out kernels.Tensor) error { return g.Linear(out, x, proj, nil) }, n)
					gu, _ := g.Alloc(kernels.F32, rows, 2*inter)
					act, _ := g.Alloc(kernels.F32, rows, inter)
					same("gated_mlp", func(x, out kernels.Tensor) error { return g.GatedMLP(out, x, gateUp, down, gu, act) }, hidden)
				})
			}
		}
	}
	other := upload(t, g, kernels.F16, hostBytes(kernels.F16, randVals(r, n*hidden, 0.05)), kernels.F16, n, hidden)
	xb, _ := g.Alloc(kernels.BF16, 8, hidden)
	out, _ := g.Alloc(kernels.F32, 8, n)
	if err := g.Linear(out, xb, other, nil); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("Linear of a BF16 x over F16 weights: %v, want ErrShape", err)
	}
}

// Through a whole model: with norm outputs rounded by the norms (the
// default) and by the linears (Options.DisableNormNarrow), the 300-token
// prefill of decodeLogits fills the caches with the same bits, so the
// decode step that reads them gives bit-identical logits.
func TestGPUNormNarrowModel(t *testing.T) {
	want, _ := decodeLogits(t, Options{DisableNormNarrow: true})
	got, replays := decodeLogits(t, Options{})
	for name, v := range map[string][]float32{"eager": got, "replay": replays[0]} {
		for i := range want {
			if math.Float32bits(v[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: logit %d = %v with 16-bit norm outputs, %v without", name, i, v[i], want[i])
			}
		}
	}
}

// Attention into a 16-bit out (the input of the o projection, as
// LinearInputDType reports it) writes the float32 output rounded to
// nearest: decode-only and mixed batches, on the kernels that round as
// they store (tensor-core prefill, the decode combine; half, 8-bit and
// float32 caches, head sizes 64 and 128) and on the float32 kernels
// (float32 inputs, head size 40), which go through float32 scratch, as
// every call does with Options.DisableAttnOut16.
func TestGPUAttentionOut16(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("DisableAttnOut16=%v", off), func(t *testing.T) {
			attentionOut16(t, Options{DisableAttnOut16: off})
		})
	}
}

func attentionOut16(t *testing.T, opts Options) {
	p := newPairOpts(t, opts)
	const blockSize, numBlocks = 16, 256
	for _, c := range []struct {
		name  string
		cache kernels.DType
		ap    kernels.AttentionParams
	}{
		{"half-d128", kernels.F16, kernels.AttentionParams{NumHeads: 16, NumKVHeads: 8, HeadDim: 128, InputDType: kernels.BF16}},
		{"half-d64", kernels.F16, kernels.AttentionParams{NumHeads: 32, NumKVHeads: 8, HeadDim: 64, InputDType: kernels.BF16}},
		{"fp8-d128", kernels.F8E4M3, kernels.AttentionParams{NumHeads: 16, NumKVHeads: 8, HeadDim: 128, InputDType: kernels.BF16}},
		{"f32-d64", kernels.F32, kernels.AttentionParams{NumHeads: 8, NumKVHeads: 2, HeadDim: 64, InputDType: kernels.BF16}},
		{"f32-inputs", kernels.F16, kernels.AttentionParams{NumHeads: 8, NumKVHeads: 2, HeadDim: 64, InputDType: kernels.F32}},
		{"d40", kernels.F16, kernels.AttentionParams{NumHeads: 8, NumKVHeads: 2, HeadDim: 40, InputDType: kernels.BF16}},
	} {
		for _, mixed := range []bool{false, true} {
			seqs := [][2]int{{1, 700}, {1, 33}, {1, 1500}, {1, 256}, {1, 90}} // (query rows, keys)
			if mixed {
				seqs = append(seqs, [2]int{100, 300}, [2]int{37, 37})
			}
			t.Run(fmt.Sprintf("%s/mixed=%v", c.name, mixed), func(t *testing.T) {
				ap := c.ap
				ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
				b := p.pagedBatch(blockSize, numBlocks, seqs)
				if !mixed {
					b.gpuMeta.MaxSeqlenQ = 1
				}
				width, w := ap.NumKVHeads*ap.HeadDim, ap.NumHeads*ap.HeadDim
				cache := func() kernels.Tensor {
					vals := randVals(p.r, numBlocks*blockSize*width, 2)
					return upload(t, p.g, c.cache, hostBytes(c.cache, vals), c.cache, numBlocks, blockSize, width)
				}
				kc, vc := cache(), cache()
				q := p.rand(kernels.F32, 1, b.numTokens, w)
				out32, _ := p.g.Alloc(kernels.F32, b.numTokens, w)
				if err := p.g.Attention(out32, q.g, kc, vc, &b.gpuMeta, ap); err != nil {
					t.Fatal(err)
				}
				want := p.f32(p.g, out32)
				for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
					out16, _ := p.g.Alloc(dt, b.numTokens, w)
					if err := p.g.Attention(out16, q.g, kc, vc, &b.gpuMeta, ap); err != nil {
						t.Fatal(err)
					}
					if got := p.raw(p.g, out16); !bytes.Equal(got, hostBytes(dt, want)) {
						t.Fatalf("%s out: not the float32 output rounded to nearest", dt)
					}
				}
			})
		}
	}
}
