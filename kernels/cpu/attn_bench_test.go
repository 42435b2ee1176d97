package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// BenchmarkAttention: paged GQA attention of a decode step and a prefill
// chunk at the benchmark model's shape (12 heads, 4 KV heads, head dim 64).
func BenchmarkAttention(b *testing.B) {
	const nh, nkv, d, bs = 12, 4, 64, 16
	for _, sp := range []seqSpec{{1, 129}, {1, 1024}, {512, 512}} {
		b.Run(fmt.Sprintf("q%d-k%d", sp.qLen, sp.kLen), func(b *testing.B) {
			be := newTestBackend(b, 0)
			r := rand.New(rand.NewPCG(1, 1))
			numBlocks := (sp.kLen + bs - 1) / bs
			m, _ := pagedBatch(b, be, r, []seqSpec{sp}, bs, numBlocks)
			kc := put(b, be, kernels.F32, randVals(r, numBlocks*bs*nkv*d, 1), numBlocks, bs, nkv*d)
			vc := put(b, be, kernels.F32, randVals(r, numBlocks*bs*nkv*d, 1), numBlocks, bs, nkv*d)
			q := put(b, be, kernels.F32, randVals(r, sp.qLen*nh*d, 1), sp.qLen, nh*d)
			out := alloc(b, be, sp.qLen, nh*d)
			p := kernels.AttentionParams{NumHeads: nh, NumKVHeads: nkv, HeadDim: d, Scale: 0.125}
			for b.Loop() {
				if err := be.Attention(out, q, kc, vc, m, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
