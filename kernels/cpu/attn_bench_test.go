package cpu

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// BenchmarkAttention: paged GQA attention of a decode step and a prefill
// chunk at the benchmark model's shape (12 heads, 4 KV heads, head dim 64),
// over float32 and 8-bit E4M3 caches. On a 2-core machine (go test -bench
// 'BenchmarkAttention/.*/q1-' -benchtime 2s -count 3) the 8-bit caches take
// what the float32 ones do (1024 keys: 0.57-0.73 ms against 0.58-0.65; 129
// keys: 0.23-0.25 against 0.22-0.23): the table lookups of the gather cost
// about what the quarter-size reads save at these cache-resident sizes. A
// first version with a bounds check per key element was 1.3-1.6x slower.
// What 8-bit caches buy on the CPU is four times the tokens in the budget.
//
// The cold cases (go test -bench 'BenchmarkAttention/cold' -benchtime 2000x)
// run one decode row over the caches of 64 layers in turn, 144 MiB of
// float32 keys and values at 576 keys, as a decode step meets them: every
// layer's cache evicted by the weights read since the step before.
// DEEPINFER_BENCH_SIMD picks the backend's cpu.simd (avx2, avx512; empty:
// the best the CPU has), DEEPINFER_BENCH_THREADS its threads (0: all
// cores). Where the cold cases' time goes: BENCH.md of kernels/cpu/simd
// ("Decode attention from memory").
func BenchmarkAttention(b *testing.B) {
	const nh, nkv, d, bs = 12, 4, 64, 16
	for _, cache := range []kernels.DType{kernels.F32, kernels.F8E4M3} {
		for _, sp := range []seqSpec{{1, 129}, {1, 1024}, {512, 512}} {
			b.Run(fmt.Sprintf("cache=%v/q%d-k%d", cache, sp.qLen, sp.kLen), func(b *testing.B) {
				benchAttention(b, cache, sp, nh, nkv, d, bs, 1)
			})
		}
	}
	// One KV head (multi-query attention, as Gemma 3's small models):
	// at batch 1 one item, whose query heads are dealt to the workers
	// (2-core AMD EPYC, AVX-512, old and new test binaries alternating
	// three times: 51-65 -> 36-37 µs).
	b.Run("mqa/q1-k1024", func(b *testing.B) {
		benchAttention(b, kernels.F32, seqSpec{1, 1024}, nh, 1, d, bs, 1)
	})
	for _, cache := range []kernels.DType{kernels.F32, kernels.F16} {
		sp := seqSpec{1, 576}
		b.Run(fmt.Sprintf("cold/cache=%v/q%d-k%d", cache, sp.qLen, sp.kLen), func(b *testing.B) {
			benchAttention(b, cache, sp, nh, nkv, d, bs, 64)
		})
	}
}

// benchAttention times Attention over one sequence sp with caches of
// element type cache written through WriteCache, one pair of caches per
// layer, the layers in turn.
func benchAttention(b *testing.B, cache kernels.DType, sp seqSpec, nh, nkv, d, bs, layers int) {
	th, _ := strconv.Atoi(os.Getenv("DEEPINFER_BENCH_THREADS"))
	be := New(Options{KVCacheDType: cache, SIMD: os.Getenv("DEEPINFER_BENCH_SIMD"), Threads: th})
	b.Cleanup(func() { be.Close() })
	r := rand.New(rand.NewPCG(1, 1))
	numBlocks := (sp.kLen + bs - 1) / bs
	m, slots := pagedBatch(b, be, r, []seqSpec{sp}, bs, numBlocks)
	sm := putI32(b, be, slots[0], sp.kLen)
	kcs, vcs := make([]kernels.Tensor, layers), make([]kernels.Tensor, layers)
	for l := range layers {
		kcs[l], vcs[l] = allocDT(b, be, cache, numBlocks, bs, nkv*d), allocDT(b, be, cache, numBlocks, bs, nkv*d)
		for _, c := range []kernels.Tensor{kcs[l], vcs[l]} {
			if err := be.WriteCache(c, put(b, be, kernels.F32, randVals(r, sp.kLen*nkv*d, 1), sp.kLen, nkv*d), sm, 0); err != nil {
				b.Fatal(err)
			}
		}
	}
	q := put(b, be, kernels.F32, randVals(r, sp.qLen*nh*d, 1), sp.qLen, nh*d)
	out := alloc(b, be, sp.qLen, nh*d)
	p := kernels.AttentionParams{NumHeads: nh, NumKVHeads: nkv, HeadDim: d, Scale: 0.125}
	l := 0
	for b.Loop() {
		if err := be.Attention(out, q, kcs[l], vcs[l], m, p); err != nil {
			b.Fatal(err)
		}
		l = (l + 1) % layers
	}
}

// BenchmarkMLAAttention: absorbed latent attention at the shipped tiny
// DeepSeek-V3's shape (8 heads, kv_lora_rank 128, rope 16, nope 32, v 32,
// BF16 wkv_b, 16-token blocks) over 512 keys per sequence, with 1 query row
// a sequence (decode) and 5 (a speculative step's verification), for 1 and
// 8 sequences. On a 2-core AMD EPYC with AVX-512 (shared with other work, -count
// 3, old and new alternating in one process), reading the cache in place
// with the vectorized softmax and AccumRows took batch1/q1 22-23 µs against
// 139-156 µs for the scalar math.Exp softmax over a copied and transposed
// tile, batch1/q5 95-105 against 389-410, batch8/q1 170-234 against
// 704-711, batch8/q5 443-515 against 1843-2144.
func BenchmarkMLAAttention(b *testing.B) {
	for _, batch := range []int{1, 8} {
		for _, q := range []int{1, 5} {
			b.Run(fmt.Sprintf("batch%d/q%d-k512", batch, q), func(b *testing.B) {
				benchMLA(b, batch, seqSpec{q, 512}, kernels.F32, 1)
			})
		}
	}
	// One decode row over 2048 keys: four key segments (mlaSegmentKeys)
	// dealt to the workers and merged, where the row was one worker's
	// before. 2-core AMD EPYC, AVX-512, old and new test binaries
	// alternating three times: 120-146 -> 76-93 µs (k512, one segment:
	// 40-47 µs either way).
	b.Run("batch1/q1-k2048", func(b *testing.B) {
		benchMLA(b, 1, seqSpec{1, 2048}, kernels.F32, 1)
	})
	// A batched decode step of short sequences, where each head's
	// absorption and projection weigh more than with 512 keys. Absorbing
	// and projecting all 64 rows in one product per head instead of one
	// one-row product per sequence: 473-539 -> 364-455 µs (same AMD
	// machine, old and new alternating, three runs each).
	b.Run("batch64/q1-k128", func(b *testing.B) {
		benchMLA(b, 64, seqSpec{1, 128}, kernels.F32, 1)
	})
	// The same over float32 and IEEE-half latent caches of 8 layers,
	// called in turn (38 MB of float32 cache, beyond a 32 MB L3, as in a
	// decode step of the shipped model, whose weights also pass through
	// the caches between two layers' attention). DEEPINFER_BENCH_SIMD and
	// DEEPINFER_BENCH_THREADS as in BenchmarkAttention. The AVX2 path's
	// P.V spreading its prefetch of the next item's keys over its key
	// steps (as AVX-512's does) instead of one burst before them, six
	// alternating runs of one thread, float32: 1258-1402 -> 1193-1279 µs
	// (medians 1308 -> 1250); two threads 619-657 -> 615-683, no change.
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16} {
		b.Run(fmt.Sprintf("batch64/q1-k128/layers8/%v", dt), func(b *testing.B) {
			benchMLA(b, 64, seqSpec{1, 128}, dt, 8)
		})
	}
}

// benchMLA times MLAAttention over batch sequences of shape sp, in each
// of layers latent caches of type dt in turn (ns/op: one call).
func benchMLA(b *testing.B, batch int, sp seqSpec, dt kernels.DType, layers int) {
	const nh, nope, rope, kvl, vd, bs = 8, 32, 16, 128, 32, 16
	th, _ := strconv.Atoi(os.Getenv("DEEPINFER_BENCH_THREADS"))
	be := New(Options{KVCacheDType: dt, SIMD: os.Getenv("DEEPINFER_BENCH_SIMD"), Threads: th})
	b.Cleanup(func() { be.Close() })
	r := rand.New(rand.NewPCG(3, 3))
	specs := make([]seqSpec, batch)
	for i := range specs {
		specs[i] = sp
	}
	numBlocks := batch * ((sp.kLen + bs - 1) / bs)
	m, slots := pagedBatch(b, be, r, specs, bs, numBlocks)
	p := kernels.MLAParams{NumHeads: nh, NopeDim: nope, RopeDim: rope, KVLoraRank: kvl, VHeadDim: vd, Scale: 0.144}
	caches := make([]kernels.Tensor, layers)
	for l := range caches {
		caches[l] = allocDT(b, be, dt, numBlocks, bs, kvl+rope)
		for s, spec := range specs {
			ckv := put(b, be, kernels.F32, randVals(r, spec.kLen*kvl, 1), spec.kLen, kvl)
			kpe := put(b, be, kernels.F32, randVals(r, spec.kLen*rope, 1), spec.kLen, rope)
			if err := be.WriteMLACache(caches[l], ckv, kpe, putI32(b, be, slots[s], spec.kLen), p); err != nil {
				b.Fatal(err)
			}
		}
	}
	w := put(b, be, kernels.BF16, randVals(r, nh*(nope+vd)*kvl, 0.2), nh*(nope+vd), kvl)
	q := put(b, be, kernels.F32, randVals(r, m.NumTokens*nh*(nope+rope), 1), m.NumTokens, nh*(nope+rope))
	out := alloc(b, be, m.NumTokens, nh*vd)
	l := 0
	for b.Loop() {
		if err := be.MLAAttention(out, q, caches[l], w, m, p); err != nil {
			b.Fatal(err)
		}
		l = (l + 1) % layers
	}
}
