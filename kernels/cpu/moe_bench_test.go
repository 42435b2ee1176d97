package cpu

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// BenchmarkMoE runs the routed experts of one MoE layer of the shipped
// default model's shape (hidden 256, 8 experts of 192, top 2, BF16) on 64
// tokens with random routing: a batch-64 decode step's MoE call. layers1
// calls one layer's weights again and again (hot in the caches); layers16
// cycles through 16 layers' (38 MB, beyond a 32 MB L3: each call's experts
// come from memory, as in a decode step, whose other weights and latent
// caches pass through the caches between two MoE layers). Reports GFLOP/s
// of the experts' products (2 x 3 x hidden x inter a routed pair).
// DEEPINFER_BENCH_SIMD picks the backend's cpu.simd. On the 2-vCPU Zen 4
// VM, AVX2 path, two threads, three runs: layers1 110-118 GFLOP/s,
// layers16 97-99 (0.41-0.42 of the 236 GFLOP/s FMA probe); AVX-512
// 133-145 and 112-116.
func BenchmarkMoE(b *testing.B) {
	const hidden, inter, experts, topK, tokens = 256, 192, 8, 2, 64
	for _, layers := range []int{1, 16} {
		b.Run(fmt.Sprintf("t%d/layers%d", tokens, layers), func(b *testing.B) {
			be := New(Options{SIMD: os.Getenv("DEEPINFER_BENCH_SIMD")})
			b.Cleanup(func() { be.Close() })
			r := rand.New(rand.NewPCG(7, 7))
			gu := make([]kernels.Tensor, layers)
			dn := make([]kernels.Tensor, layers)
			for l := range layers {
				gu[l] = put(b, be, kernels.BF16, randVals(r, experts*2*inter*hidden, 0.05), experts, 2*inter, hidden)
				dn[l] = put(b, be, kernels.BF16, randVals(r, experts*hidden*inter, 0.05), experts, hidden, inter)
			}
			ids := make([]int32, tokens*topK)
			for i := range tokens {
				p := r.Perm(experts)
				ids[i*topK], ids[i*topK+1] = int32(p[0]), int32(p[1])
			}
			x := put(b, be, kernels.F32, randVals(r, tokens*hidden, 1), tokens, hidden)
			it := putI32(b, be, ids, tokens, topK)
			w := put(b, be, kernels.F32, randVals(r, tokens*topK, 1), tokens, topK)
			out := alloc(b, be, tokens, hidden)
			l := 0
			for b.Loop() {
				if err := be.MoE(out, x, it, w, gu[l], dn[l]); err != nil {
					b.Fatal(err)
				}
				l = (l + 1) % layers
			}
			flops := 2 * 3 * float64(hidden*inter*tokens*topK)
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
