package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// BenchmarkMLAVerifyRows runs MLAAttention over a speculative decode's
// verify rows at the default model's MLA shape (8 heads, kv_lora_rank 128,
// rope 16, BF16 kv_b) with 300 keys: k = 4 (5 rows a sequence) for 1 and
// 8 sequences, 2 threads. The plan attends a sequence's verify rows as
// chunks of rows (attnPlan.items); measured against one item a row, in
// alternating runs of the two builds on a 2-vCPU VM (µs a call, medians
// of 9): 1 sequence 125 -> 115, 8 sequences 726 -> 707.
//
//	go test -run '^$' -bench MLAVerifyRows -benchtime 400x ./kernels/cpu
func BenchmarkMLAVerifyRows(b *testing.B) {
	const nh, nope, rope, kvl, vd, bs, numBlocks = 8, 32, 16, 128, 32, 16, 256
	be := New(Options{Threads: 2})
	defer be.Close()
	r := rand.New(rand.NewPCG(1, 2))
	for _, seqs := range [][]int{{0}, {0, 1, 2, 3, 4, 5, 6, 7}} {
		specs := make([]seqSpec, 8)
		for i := range specs {
			specs[i] = seqSpec{5, 300}
		}
		m, slots := pagedBatch(b, be, r, specs, bs, numBlocks)
		cache := latentCache(b, be, r, specs, slots, numBlocks, bs, kvl+rope)
		wt := put(b, be, kernels.BF16, roundTo(kernels.BF16, randVals(r, nh*(nope+vd)*kvl, 0.5)), nh*(nope+vd), kvl)
		mv, rows := verifyMeta(b, be, m, seqs...)
		q := put(b, be, kernels.F32, randVals(r, len(rows)*nh*(nope+rope), 1), len(rows), nh*(nope+rope))
		o := alloc(b, be, len(rows), nh*vd)
		p := kernels.MLAParams{NumHeads: nh, NopeDim: nope, RopeDim: rope, KVLoraRank: kvl, VHeadDim: vd, Scale: 0.25}
		b.Run("seqs="+string(rune('0'+len(seqs))), func(b *testing.B) {
			for range b.N {
				if err := be.MLAAttention(o, q, cache, wt, mv, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
