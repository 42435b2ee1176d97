package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// BenchmarkGptOssExperts is gpt-oss-20B's expert step (32 experts of
// hidden 2880 and intermediate 2880, top-4, the clamped SwiGLU) for one
// token (GEMV, decode) and for 64 tokens (GEMM), with the experts as
// MXFP4 blocks and widened to BF16. Consecutive iterations route to
// different experts (8 groups of 4, 424 MB of MXFP4 and 1.6 GB of BF16 in
// all), so the weights come from memory, not cache. B/s (from SetBytes)
// are the stored bytes of the experts read an iteration; weights/ns is
// the same work for both formats, so its ratio is the speed-up.
func BenchmarkGptOssExperts(b *testing.B) {
	const e, hidden, inter, topK = 32, 2880, 2880, 4
	r := rand.New(rand.NewPCG(1, 2))
	be := New(Options{})
	defer be.Close()
	gu, dn := randMXFP4(r, e, 2*inter, hidden), randMXFP4(r, e, hidden, inter)
	widen := func(w kernels.MXFP4Weight) kernels.Tensor {
		u := make([]uint16, len(w.Blocks)*2)
		widenMXFP4(u, w.Blocks, w.Scales)
		return &Tensor{shape: w.Shape, dtype: kernels.BF16, u16: u}
	}
	mxGU, err := be.MXFP4Weight(gu)
	if err != nil {
		b.Fatal(err)
	}
	mxDN, err := be.MXFP4Weight(dn)
	if err != nil {
		b.Fatal(err)
	}
	weights := map[string][2]kernels.Tensor{"mxfp4": {mxGU, mxDN}, "bf16": {widen(gu), widen(dn)}}
	perWeight := map[string]float64{"mxfp4": 0.5 + 1.0/32, "bf16": 2}
	gub := put(b, be, kernels.F32, randVals(r, e*2*inter, 0.1), e, 2*inter)
	dnb := put(b, be, kernels.F32, randVals(r, e*hidden, 0.1), e, hidden)
	act := kernels.ClampedSwiGLU{Limit: 7, Alpha: 1.702}
	for _, tokens := range []int{1, 64} {
		x := put(b, be, kernels.F32, randVals(r, tokens*hidden, 1), tokens, hidden)
		out := alloc(b, be, tokens, hidden)
		wts := put(b, be, kernels.F32, randVals(r, tokens*topK, 1), tokens, topK)
		// Group g routes every token to experts 4g..4g+3.
		var groups []kernels.Tensor
		for g := range e / topK {
			ids := make([]int32, tokens*topK)
			for i := range ids {
				ids[i] = int32(g*topK + i%topK)
			}
			groups = append(groups, putI32(b, be, ids, tokens, topK))
		}
		for _, format := range []string{"bf16", "mxfp4"} {
			w := weights[format]
			b.Run(fmt.Sprintf("%s/tokens=%d", format, tokens), func(b *testing.B) {
				elems := float64(topK * 3 * hidden * inter)
				b.SetBytes(int64(elems * perWeight[format]))
				i := 0
				for b.Loop() {
					if err := be.MoEClampedSwiGLU(out, x, groups[i%len(groups)], wts, w[0], gub, w[1], dnb, act); err != nil {
						b.Fatal(err)
					}
					i++
				}
				b.ReportMetric(elems*float64(b.N)/float64(b.Elapsed().Nanoseconds()), "weights/ns")
			})
		}
	}
}
