package cuda

import (
	"bytes"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// The fused mla_prepare kernel (on unless Options.DisableFusedMLAPrepare) gives the bits of
// the separate ops on the same backend (kernels.PrepareMLASteps: split,
// RMSNorm of c_kv, RoPE of q and k_pe, the cache write): q and the whole
// latent cache, for the DeepSeek-V2-Lite shape and a small one, interleaved
// pairs and halves, F32, F16, BF16 and packed 8-bit caches, rows not
// written (slot -1), one row and prefill chunks (up to 64 tokens q runs in
// blocks of its own, past it in the latent block); and q against the CPU
// backend's steps to float32 rounding. Each case runs twice: from the
// fused q / kv_a row (MLAPrep.QKVA), and from q in place with kv_a's own
// rows (MLAPrep.KVA, q compressed).
func TestGPUPrepareMLA(t *testing.T) {
	cases := []prepareMLACase{
		{"v2lite-bf16-decode", kernels.MLAParams{NumHeads: 16, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128}, true, kernels.BF16, 1, 0},
		{"v2lite-bf16-chunk", kernels.MLAParams{NumHeads: 16, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128}, true, kernels.BF16, 37, 5},
		// Past 64 tokens the kernel has one block a token (q in the latent block).
		{"v2lite-bf16-chunk100", kernels.MLAParams{NumHeads: 16, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128}, true, kernels.BF16, 100, 7},
		{"small-f8-chunk80", kernels.MLAParams{NumHeads: 4, NopeDim: 32, RopeDim: 16, KVLoraRank: 128, VHeadDim: 32}, false, kernels.F8E4M3, 80, 9},
		{"v2lite-f16-halves", kernels.MLAParams{NumHeads: 16, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128}, false, kernels.F16, 9, 4},
		{"v2lite-f8", kernels.MLAParams{NumHeads: 16, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128}, true, kernels.F8E4M3, 9, 4},
		{"small-f32", kernels.MLAParams{NumHeads: 4, NopeDim: 32, RopeDim: 16, KVLoraRank: 128, VHeadDim: 32}, true, kernels.F32, 7, 3},
		{"small-f8-decode", kernels.MLAParams{NumHeads: 4, NopeDim: 32, RopeDim: 16, KVLoraRank: 128, VHeadDim: 32}, false, kernels.F8E4M3, 1, 0},
	}
	for _, c := range cases {
		for _, sep := range []bool{false, true} {
			name := c.name
			if sep {
				name += "/kva"
			}
			t.Run(name, func(t *testing.T) { testPrepareMLA(t, c, sep) })
		}
	}
}

// prepareMLACase is one shape of TestGPUPrepareMLA.
type prepareMLACase struct {
	name           string
	d              kernels.MLAParams
	interleaved    bool
	cache          kernels.DType
	tokens         int
	skipSlotsEvery int // every n-th row has slot -1 (0: none)
}

// testPrepareMLA runs case c of TestGPUPrepareMLA; sep: q in place and
// kv_a's own rows, else the fused row.
func testPrepareMLA(t *testing.T, c prepareMLACase, sep bool) {
	d := c.d
	p := newPairOpts(t, Options{GEMM: GEMMRound})
	const maxPos, blocks, blockSize = 300, 16, 16
	qd := d.NumHeads * (d.NopeDim + d.RopeDim)
	width := mlaCacheWidth(c.cache, d)
	half := d.RopeDim / 2
	qkva := p.rand(kernels.F32, 2, c.tokens, qd+d.KVLoraRank+d.RopeDim)
	kva := p.rand(kernels.F32, 2, c.tokens, d.KVLoraRank+d.RopeDim)
	q0 := randVals(p.r, c.tokens*qd, 1) // q before rotation (sep)
	cos, sin := p.rand(kernels.F32, 1, maxPos, half), p.rand(kernels.F32, 1, maxPos, half)
	norm := p.rand(kernels.F32, 1.5, d.KVLoraRank)
	ps, sm := p.positionsAndSlots(c.tokens, maxPos, blocks*blockSize, c.skipSlotsEvery)
	// The cache starts as random bytes (8-bit rows: any byte), so
	// that rows not written are checked to keep them.
	cacheInit := make([]byte, blocks*blockSize*width*map[kernels.DType]int{kernels.F32: 4, kernels.F16: 2, kernels.BF16: 2, kernels.F8E4M3: 1}[c.cache])
	for i := range cacheInit {
		cacheInit[i] = byte(p.r.IntN(256))
	}
	if c.cache == kernels.F32 || c.cache == kernels.F16 || c.cache == kernels.BF16 {
		cacheInit = hostBytes(c.cache, randVals(p.r, blocks*blockSize*width, 1))
	}
	args := func(ops kernels.Ops, pick func(dual) kernels.Tensor, q, cache kernels.Tensor) kernels.MLAPrep {
		a := kernels.MLAPrep{QKVA: pick(qkva), Q: q, Cache: cache, SlotMapping: pick(sm), Positions: pick(ps),
			Cos: pick(cos), Sin: pick(sin), KVNorm: pick(norm), Eps: 1e-6, MLA: d, Interleaved: c.interleaved}
		if sep {
			a.QKVA, a.KVA = nil, pick(kva)
		}
		var err error
		if a.CKV, err = ops.Alloc(kernels.F32, c.tokens, d.KVLoraRank); err != nil {
			t.Fatal(err)
		}
		if a.KPE, err = ops.Alloc(kernels.F32, c.tokens, d.RopeDim); err != nil {
			t.Fatal(err)
		}
		return a
	}
	gpu := func(x dual) kernels.Tensor { return x.g }
	run := func(fused bool) (q []float32, cache []byte) {
		qt := upload(t, p.g, kernels.F32, kernels.F32Bytes(q0), kernels.F32, c.tokens, qd)
		ct := upload(t, p.g, c.cache, cacheInit, c.cache, blocks, blockSize, width)
		a := args(p.g, gpu, qt, ct)
		var err error
		if fused {
			err = kernels.PrepareMLA(p.g, a)
		} else {
			err = kernels.PrepareMLASteps(p.g, a)
		}
		if err != nil {
			t.Fatal(err)
		}
		cache = make([]byte, len(cacheInit))
		if err := p.g.Download(cache, ct); err != nil {
			t.Fatal(err)
		}
		return p.f32(p.g, qt), cache
	}
	fq, fc := run(true)
	sq, sc := run(false)
	if !bytes.Equal(kernels.F32Bytes(fq), kernels.F32Bytes(sq)) {
		t.Errorf("q: fused differs from the separate ops (max relative difference %.3g)", maxRelErr(fq, sq))
	}
	if !bytes.Equal(fc, sc) {
		n := 0
		for i := range fc {
			if fc[i] != sc[i] {
				n++
			}
		}
		t.Errorf("cache: fused differs from the separate ops in %d of %d bytes", n, len(fc))
	}
	if bytes.Equal(fc, cacheInit) {
		t.Error("cache unchanged")
	}
	// The CPU backend's steps, to float32 rounding (q only: its
	// cache is in float32).
	cpuQ := upload(t, p.c, kernels.F32, kernels.F32Bytes(q0), kernels.F32, c.tokens, qd)
	cpuC, err := p.c.Alloc(kernels.F32, blocks, blockSize, d.KVLoraRank+d.RopeDim)
	if err != nil {
		t.Fatal(err)
	}
	if err := kernels.PrepareMLA(p.c, args(p.c, func(x dual) kernels.Tensor { return x.c }, cpuQ, cpuC)); err != nil {
		t.Fatal(err)
	}
	if e := maxRelErr(fq, p.f32(p.c, cpuQ)); e > 1e-5 {
		t.Errorf("q vs the CPU backend: max relative difference %.3g", e)
	}
}
