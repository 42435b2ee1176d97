package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// GPU tests: every operation against the CPU backend on random inputs. They
// skip where no CUDA library and device exist (see newGPU).

// linearTol is the bound on max|gpu-cpu|/max|cpu| for a GEMM whose weights
// have dtype dt: float32 exactly (no TF32), 16-bit weights with rounded
// activations at that dtype's precision, split activations near float32.
func linearTol(dt kernels.DType, mode GEMMMode) float64 {
	switch {
	case dt == kernels.F32:
		return 2e-5
	case mode == GEMMSplit:
		return 2e-4
	case dt == kernels.BF16:
		return 2e-2
	}
	return 4e-3
}

func TestGPUEmbedding(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		t.Run(dt.String(), func(t *testing.T) {
			table := p.rand(dt, 1, 100, 67)
			ids := make([]int32, 13)
			for i := range ids {
				ids[i] = int32(p.r.IntN(100))
			}
			idT := p.ints(ids, 13)
			out := p.zeros(kernels.F32, 13, 67)
			p.poison(out)
			if err := p.c.Embedding(out.c, table.c, idT.c); err != nil {
				t.Fatal(err)
			}
			if err := p.g.Embedding(out.g, table.g, idT.g); err != nil {
				t.Fatal(err)
			}
			p.check("embedding", out, 0)
		})
	}
}

func TestGPUNorms(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, n := range []int{7, 64, 1000, 4096} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			x, w := p.rand(kernels.F32, 3, 5, n), p.rand(kernels.F32, 1, n)
			out := p.zeros(kernels.F32, 5, n)
			p.poison(out)
			if err := p.c.RMSNorm(out.c, x.c, w.c, 1e-5); err != nil {
				t.Fatal(err)
			}
			if err := p.g.RMSNorm(out.g, x.g, w.g, 1e-5); err != nil {
				t.Fatal(err)
			}
			p.check("rms_norm", out, 1e-6)
			// Fused residual add, out aliasing x.
			res, d := p.rand(kernels.F32, 2, 5, n), p.rand(kernels.F32, 2, 5, n)
			if err := p.c.AddRMSNorm(d.c, res.c, d.c, w.c, 1e-6); err != nil {
				t.Fatal(err)
			}
			if err := p.g.AddRMSNorm(d.g, res.g, d.g, w.g, 1e-6); err != nil {
				t.Fatal(err)
			}
			p.check("add_rms_norm residual", res, 0)
			p.check("add_rms_norm out", d, 1e-6)
		})
	}
}

// A norm over a large batch (di_rms_norm_k with threads standing in for
// several of the row's virtual threads: RMS_VIRTUAL, from
// RMS_VIRTUAL_ROWS rows a multiprocessor) gives each row the bits it gets
// alone (one thread a virtual thread), with and without the residual, into
// float32 and BF16 outputs; widths with one, two and four values a
// virtual thread, under 1024 columns, and past the held path (loop, one
// thread a virtual thread at any batch). The CPU bound of TestGPUNorms
// holds for the batch.
func TestGPUNormsBatchBits(t *testing.T) {
	p := newPair(t, GEMMRound)
	g := p.g
	const rows = 1200 // above RMS_VIRTUAL_ROWS times the multiprocessors of any current GPU
	for _, n := range []int{200, 1000, 2048, 4096, 5000} {
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			for _, withResid := range []bool{false, true} {
				t.Run(fmt.Sprintf("n=%d/%s/residual=%v", n, dt, withResid), func(t *testing.T) {
					xv, rv, wv := randVals(p.r, rows*n, 2), randVals(p.r, rows*n, 2), randVals(p.r, n, 1)
					w := p.put(kernels.F32, wv, n)
					norm := func(be kernels.Ops, wt kernels.Tensor, x, res []float32, rows int, odt kernels.DType) (out, resOut []byte) {
						xt := upload(t, be, kernels.F32, kernels.F32Bytes(x), kernels.F32, rows, n)
						ot, err := be.Alloc(odt, rows, n)
						if err != nil {
							t.Fatal(err)
						}
						var rt kernels.Tensor
						if withResid {
							rt = upload(t, be, kernels.F32, kernels.F32Bytes(res), kernels.F32, rows, n)
							err = be.AddRMSNorm(ot, rt, xt, wt, 1e-6)
						} else {
							err = be.RMSNorm(ot, xt, wt, 1e-6)
						}
						if err != nil {
							t.Fatal(err)
						}
						out = p.raw(be, ot)
						if withResid {
							resOut = p.raw(be, rt)
						}
						return out, resOut
					}
					all, allRes := norm(g, w.g, xv, rv, rows, dt)
					size := len(all) / rows
					for _, r := range []int{0, 1, 777, rows - 1} {
						one, oneRes := norm(g, w.g, xv[r*n:(r+1)*n], rv[r*n:(r+1)*n], 1, dt)
						if !bytes.Equal(one, all[r*size:(r+1)*size]) {
							t.Fatalf("row %d: the norm alone differs in bits from the norm among %d rows", r, rows)
						}
						if withResid && !bytes.Equal(oneRes, allRes[r*4*n:(r+1)*4*n]) {
							t.Fatalf("row %d: the residual alone differs from the residual among %d rows", r, rows)
						}
					}
					if dt == kernels.F32 {
						want, _ := norm(p.c, w.c, xv, rv, rows, dt)
						e := maxRelErr(kernels.BytesF32(all), kernels.BytesF32(want))
						if !(e <= 1e-6) { // NaN too
							t.Fatalf("max relative error %.3g against the CPU backend, want <= 1e-6", e)
						}
					}
				})
			}
		}
	}
}

func TestGPULinear(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
			for _, sh := range [][3]int{{1, 33, 48}, {7, 256, 1024}, {64, 96, 200}} {
				for _, bias := range []bool{false, true} {
					name := fmt.Sprintf("%s/%s/m%d_n%d_k%d/bias=%v", mode, dt, sh[0], sh[1], sh[2], bias)
					t.Run(name, func(t *testing.T) {
						m, n, k := sh[0], sh[1], sh[2]
						x, w := p.rand(kernels.F32, 1, m, k), p.rand(dt, 1, n, k)
						var bc, bg kernels.Tensor
						if bias {
							b := p.rand(kernels.F32, 1, n)
							bc, bg = b.c, b.g
						}
						out := p.zeros(kernels.F32, m, n)
						p.poison(out)
						if err := p.c.Linear(out.c, x.c, w.c, bc); err != nil {
							t.Fatal(err)
						}
						if err := p.g.Linear(out.g, x.g, w.g, bg); err != nil {
							t.Fatal(err)
						}
						p.check("linear", out, linearTol(dt, mode))
					})
				}
			}
		}
	}
}

func TestGPUElementwise(t *testing.T) {
	p := newPair(t, GEMMRound)
	gu := p.rand(kernels.F32, 4, 9, 2*77)
	act := p.zeros(kernels.F32, 9, 77)
	p.poison(act)
	if err := p.c.SiLUMul(act.c, gu.c); err != nil {
		t.Fatal(err)
	}
	if err := p.g.SiLUMul(act.g, gu.g); err != nil {
		t.Fatal(err)
	}
	p.check("silu_mul", act, 1e-6)

	a, b := p.rand(kernels.F32, 1, 9, 77), p.rand(kernels.F32, 1, 9, 77)
	sum := p.zeros(kernels.F32, 9, 77)
	p.poison(sum)
	if err := p.c.Add(sum.c, a.c, b.c); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Add(sum.g, a.g, b.g); err != nil {
		t.Fatal(err)
	}
	p.check("add", sum, 0)

	c := p.rand(kernels.F32, 1, 9, 13)
	cat := p.zeros(kernels.F32, 9, 90)
	p.poison(cat)
	if err := p.c.Concat(cat.c, a.c, c.c); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Concat(cat.g, a.g, c.g); err != nil {
		t.Fatal(err)
	}
	p.check("concat", cat, 0)

	// SplitColumns into 2 and into 6 parts (two launches of at most four).
	for _, widths := range [][]int{{60, 30}, {7, 20, 3, 33, 12, 15}} {
		parts := make([]dual, len(widths))
		cs, gs := make([]kernels.Tensor, len(widths)), make([]kernels.Tensor, len(widths))
		for i, w := range widths {
			parts[i] = p.zeros(kernels.F32, 9, w)
			p.poison(parts[i])
			cs[i], gs[i] = parts[i].c, parts[i].g
		}
		if err := p.c.SplitColumns(cat.c, cs...); err != nil {
			t.Fatal(err)
		}
		if err := p.g.SplitColumns(cat.g, gs...); err != nil {
			t.Fatal(err)
		}
		for i := range parts {
			p.check(fmt.Sprintf("split_columns %v part %d", widths, i), parts[i], 0)
		}
	}
	if err := p.g.SplitColumns(cat.g, act.g); err == nil {
		t.Error("split_columns of 90 columns into 77: no error")
	}
}

func TestGPURoPE(t *testing.T) {
	p := newPair(t, GEMMRound)
	tests := []kernels.RoPEParams{
		{NumHeads: 4, HeadSize: 16, RotaryDim: 16},
		{NumHeads: 3, HeadSize: 24, Offset: 16, RotaryDim: 8, Interleaved: true},
		{NumHeads: 8, HeadSize: 128, RotaryDim: 64},
	}
	for _, rp := range tests {
		t.Run(fmt.Sprintf("%+v", rp), func(t *testing.T) {
			const maxPos, tokens = 50, 11
			half := rp.RotaryDim / 2
			cos, sin := p.rand(kernels.F32, 1, maxPos, half), p.rand(kernels.F32, 1, maxPos, half)
			pos := make([]int32, tokens)
			for i := range pos {
				pos[i] = int32(p.r.IntN(maxPos))
			}
			ps := p.ints(pos, tokens)
			x := p.rand(kernels.F32, 1, tokens, rp.NumHeads*rp.HeadSize)
			if err := p.c.RoPE(x.c, ps.c, cos.c, sin.c, rp); err != nil {
				t.Fatal(err)
			}
			if err := p.g.RoPE(x.g, ps.g, cos.g, sin.g, rp); err != nil {
				t.Fatal(err)
			}
			p.check("rope", x, 1e-6)
		})
	}
}

func TestGPUWriteCacheAndResolve(t *testing.T) {
	p := newPair(t, GEMMRound)
	cache := p.rand(kernels.F32, 1, 6, 4, 20)
	src := p.rand(kernels.F32, 1, 5, 8)
	sm := p.ints([]int32{3, -1, 23, 0, 10}, 5)
	if err := p.c.WriteCache(cache.c, src.c, sm.c, 12); err != nil {
		t.Fatal(err)
	}
	if err := p.g.WriteCache(cache.g, src.g, sm.g, 12); err != nil {
		t.Fatal(err)
	}
	p.check("write_cache", cache, 0)

	ids := p.ints([]int32{5, 6, 7, 8}, 4)
	from := p.ints([]int32{-1, 2, 0, -1}, 4)
	sampled := p.ints([]int32{40, 41, 42}, 3)
	if err := p.c.ResolvePlaceholders(ids.c, from.c, sampled.c); err != nil {
		t.Fatal(err)
	}
	if err := p.g.ResolvePlaceholders(ids.g, from.g, sampled.g); err != nil {
		t.Fatal(err)
	}
	want, got := p.i32(p.c, ids.c), p.i32(p.g, ids.g)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("resolve_placeholders: %v, want %v", got, want)
	}
}

// attnCase is one batch layout: per sequence (q_len, k_len).
var attnCases = []struct {
	name string
	seqs [][2]int
}{
	{"prefill", [][2]int{{9, 9}}},
	{"decode", [][2]int{{1, 1}, {1, 17}, {1, 200}}},
	{"mixed", [][2]int{{5, 5}, {3, 10}, {1, 17}, {70, 130}}},
}

func TestGPUAttention(t *testing.T) {
	p := newPair(t, GEMMRound)
	const blockSize, numBlocks = 4, 160
	for _, ap := range []kernels.AttentionParams{
		{NumHeads: 8, NumKVHeads: 2, HeadDim: 64},
		{NumHeads: 4, NumKVHeads: 4, HeadDim: 128, SlidingWindow: 6},
		{NumHeads: 6, NumKVHeads: 3, HeadDim: 40},
	} {
		ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
		for _, tc := range attnCases {
			t.Run(fmt.Sprintf("%s/h%d_kv%d_d%d_w%d", tc.name, ap.NumHeads, ap.NumKVHeads, ap.HeadDim, ap.SlidingWindow), func(t *testing.T) {
				b := p.pagedBatch(blockSize, numBlocks, tc.seqs)
				width := ap.NumKVHeads * ap.HeadDim
				kc, vc := p.rand(kernels.F32, 1, numBlocks, blockSize, width), p.rand(kernels.F32, 1, numBlocks, blockSize, width)
				q := p.rand(kernels.F32, 1, b.numTokens, ap.NumHeads*ap.HeadDim)
				out := p.zeros(kernels.F32, b.numTokens, ap.NumHeads*ap.HeadDim)
				p.poison(out)
				if err := p.c.Attention(out.c, q.c, kc.c, vc.c, &b.cpuMeta, ap); err != nil {
					t.Fatal(err)
				}
				if err := p.g.Attention(out.g, q.g, kc.g, vc.g, &b.gpuMeta, ap); err != nil {
					t.Fatal(err)
				}
				p.check("attention", out, 1e-5)
			})
		}
	}
}

// mlaShapes are the MLA tests' layer sizes: tiny, and DeepSeek-V2's latent
// and head sizes with three heads.
var mlaShapes = []kernels.MLAParams{
	{NumHeads: 4, NopeDim: 16, RopeDim: 8, KVLoraRank: 32, VHeadDim: 12},
	{NumHeads: 3, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128},
}

// eachMLACase runs fn for every MLA shape, weight dtype and batch of
// attnCases, as a subtest, with the shape's scale set.
func eachMLACase(t *testing.T, fn func(t *testing.T, mp kernels.MLAParams, dt kernels.DType, seqs [][2]int)) {
	for _, mp := range mlaShapes {
		mp.Scale = float32(1 / math.Sqrt(float64(mp.NopeDim+mp.RopeDim)))
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			for _, tc := range attnCases {
				t.Run(fmt.Sprintf("%s/%s/kvl%d", tc.name, dt, mp.KVLoraRank), func(t *testing.T) { fn(t, mp, dt, tc.seqs) })
			}
		}
	}
}

// mla runs MLAAttention on both backends over a paged batch of seqs with
// random caches, weights and queries, checks the GPU against the CPU and
// returns the GPU output's bytes.
func (p *pair) mla(t *testing.T, mp kernels.MLAParams, dt kernels.DType, seqs [][2]int) []byte {
	t.Helper()
	const blockSize, numBlocks = 16, 40
	b := p.pagedBatch(blockSize, numBlocks, seqs)
	cache := p.rand(kernels.F32, 1, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
	w := p.rand(dt, 0.2, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	q := p.rand(kernels.F32, 1, b.numTokens, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
	out := p.zeros(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
	p.poison(out)
	if err := p.c.MLAAttention(out.c, q.c, cache.c, w.c, &b.cpuMeta, mp); err != nil {
		t.Fatal(err)
	}
	if err := p.g.MLAAttention(out.g, q.g, cache.g, w.g, &b.gpuMeta, mp); err != nil {
		t.Fatal(err)
	}
	p.check("mla_attention", out, 2e-5)
	return p.raw(p.g, out.g)
}

func TestGPUMLAAttention(t *testing.T) {
	p := newPair(t, GEMMRound)
	eachMLACase(t, func(t *testing.T, mp kernels.MLAParams, dt kernels.DType, seqs [][2]int) { p.mla(t, mp, dt, seqs) })
}

// The two forms of the MLA kernel, keys staged in shared memory (small
// grids) and read from global memory (large ones), give the same bits:
// Options.MLAStagedMax < 0 forces the second, a large value the
// first, over decode, prefill and mixed batches, tiny and DeepSeek-V2 sizes,
// float32 and bf16 weights.
func TestGPUMLAStagedBits(t *testing.T) {
	plain := newPairOpts(t, Options{MLAStagedMax: -1})
	staged := newPairOpts(t, Options{MLAStagedMax: 1000000})
	eachMLACase(t, func(t *testing.T, mp kernels.MLAParams, dt kernels.DType, seqs [][2]int) {
		if !bytes.Equal(plain.mla(t, mp, dt, seqs), staged.mla(t, mp, dt, seqs)) {
			t.Errorf("staged keys: bits differ from the plain kernel's")
		}
	})
}

// routeCases are the routings the MoE routing tests run: e experts,
// softmax and sigmoid scoring, the greedy, group-limited and noaux_tc
// top-k, with and without the correction bias.
var routeCases = []struct {
	e    int
	rp   kernels.RouteParams
	bias bool
}{
	{8, kernels.RouteParams{TopK: 2, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy, NumGroups: 1, ScalingFactor: 1}, false},
	{64, kernels.RouteParams{TopK: 6, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGroupLimited, NumGroups: 8, TopKGroups: 3, ScalingFactor: 2}, false},
	{64, kernels.RouteParams{TopK: 6, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy, NumGroups: 1, NormTopKProb: true, ScalingFactor: 1}, false},
	{256, kernels.RouteParams{TopK: 8, Scoring: kernels.ScoringSigmoid, Method: kernels.TopKNoAuxTC, NumGroups: 8, TopKGroups: 4, NormTopKProb: true, ScalingFactor: 2.5}, true},
}

func TestGPUMoERoute(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, tc := range routeCases {
		t.Run(fmt.Sprintf("e%d/%d/%d", tc.e, tc.rp.Scoring, tc.rp.Method), func(t *testing.T) {
			const tokens = 37
			logits := p.rand(kernels.F32, 3, tokens, tc.e)
			var bc, bg kernels.Tensor
			if tc.bias {
				b := p.rand(kernels.F32, 0.1, tc.e)
				bc, bg = b.c, b.g
			}
			ids, w := p.zeros(kernels.I32, tokens, tc.rp.TopK), p.zeros(kernels.F32, tokens, tc.rp.TopK)
			if err := p.c.MoERoute(ids.c, w.c, logits.c, bc, tc.rp); err != nil {
				t.Fatal(err)
			}
			if err := p.g.MoERoute(ids.g, w.g, logits.g, bg, tc.rp); err != nil {
				t.Fatal(err)
			}
			want, got := p.i32(p.c, ids.c), p.i32(p.g, ids.g)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("moe_route ids:\n got %v\nwant %v", got, want)
			}
			p.check("moe_route weights", w, 1e-6)
		})
	}
}

// MoE against the CPU backend: decode-sized batches and a small prefill run
// the device-side grouping; 400 tokens x 3 (1200 pairs) the host grouping
// with cuBLAS. With 16-bit weights a projection whose k is a multiple of 32
// runs on tensor cores (di_moe_mma_k), the others on the GEMV: the first
// shape has both (gate/up k = 64, down k = 48); the second has only the
// down projection on tensor cores, with 72 output columns (a warp's last 8
// past the end) and, at 64 tokens on 4 experts, more than 32 rows an expert
// (two passes over its weights).
func TestGPUMoE(t *testing.T) {
	shapes := []struct{ e, topK, hidden, inter int }{{8, 3, 64, 48}, {4, 3, 72, 64}}
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			for _, tokens := range []int{1, 4, 19, 64, 400} {
				for _, sh := range shapes {
					t.Run(fmt.Sprintf("%s/%s/tokens=%d/e%d_h%d_i%d", mode, dt, tokens, sh.e, sh.hidden, sh.inter), func(t *testing.T) {
						e, topK, hidden, inter := sh.e, sh.topK, sh.hidden, sh.inter
						x := p.rand(kernels.F32, 1, tokens, hidden)
						gu, down := p.rand(dt, 0.2, e, 2*inter, hidden), p.rand(dt, 0.2, e, hidden, inter)
						ids := p.ints(randExpertIDs(p.r, tokens, topK, e), tokens, topK)
						w := p.rand(kernels.F32, 1, tokens, topK)
						out := p.zeros(kernels.F32, tokens, hidden)
						p.poison(out)
						if err := p.c.MoE(out.c, x.c, ids.c, w.c, gu.c, down.c); err != nil {
							t.Fatal(err)
						}
						if err := p.g.MoE(out.g, x.g, ids.g, w.g, gu.g, down.g); err != nil {
							t.Fatal(err)
						}
						p.check("moe", out, 2*linearTol(dt, mode))
					})
				}
			}
		}
	}
}

// randExpertIDs draws top_k distinct experts for each token.
func randExpertIDs(r *rand.Rand, tokens, topK, e int) []int32 {
	idv := make([]int32, tokens*topK)
	for i := range tokens {
		perm := r.Perm(e)
		for k := range topK {
			idv[i*topK+k] = int32(perm[k])
		}
	}
	return idv
}

// The device-side MoE is batch-invariant (a token alone gives the bits it
// gives among 32) and capturable: a graph replays to the eager bits, also
// after the routing ids changed between replays.
func TestGPUMoEInvarianceAndGraph(t *testing.T) {
	p := newPair(t, GEMMRound)
	g := p.g
	const tokens, e, topK, hidden, inter = 32, 16, 4, 256, 192
	x := p.rand(kernels.F32, 1, tokens, hidden)
	gu, down := p.rand(kernels.BF16, 0.2, e, 2*inter, hidden), p.rand(kernels.BF16, 0.2, e, hidden, inter)
	ids := p.ints(randExpertIDs(p.r, tokens, topK, e), tokens, topK)
	w := p.rand(kernels.F32, 1, tokens, topK)
	out, err := g.Alloc(kernels.F32, tokens, hidden)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.MoE(out, x.g, ids.g, w.g, gu.g, down.g); err != nil {
		t.Fatal(err)
	}
	crowd := p.f32(g, out)
	// Token 5 alone.
	const r0 = 5
	view := func(ten kernels.Tensor) kernels.Tensor {
		v, err := g.Rows(ten, r0, r0+1)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	one, err := g.Alloc(kernels.F32, 1, hidden)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.MoE(one, view(x.g), view(ids.g), view(w.g), gu.g, down.g); err != nil {
		t.Fatal(err)
	}
	for j, v := range p.f32(g, one) {
		if math.Float32bits(v) != math.Float32bits(crowd[r0*hidden+j]) {
			t.Fatalf("token %d alone: out[%d] = %v, among %d: %v", r0, j, v, tokens, crowd[r0*hidden+j])
		}
	}
	// Captured, replayed, then replayed again over new routing ids.
	graph, err := g.CaptureGraph(func() error { return g.MoE(out, x.g, ids.g, w.g, gu.g, down.g) })
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	newIDs := randExpertIDs(p.r, tokens, topK, e)
	for round := range 2 {
		if round == 1 {
			if err := g.Upload(ids.g, kernels.I32Bytes(newIDs), kernels.I32); err != nil {
				t.Fatal(err)
			}
			if err := g.MoE(out, x.g, ids.g, w.g, gu.g, down.g); err != nil {
				t.Fatal(err)
			}
			crowd = p.f32(g, out)
		}
		p.poison(dual{g: out})
		if err := graph.Replay(); err != nil {
			t.Fatal(err)
		}
		for j, v := range p.f32(g, out) {
			if math.Float32bits(v) != math.Float32bits(crowd[j]) {
				t.Fatalf("round %d: replayed out[%d] = %v, eager %v", round, j, v, crowd[j])
			}
		}
	}
	t.Logf("moe on the device: a token alone bit-identical to the same token among %d; graph replay bit-identical to eager (2 routings)", tokens)
}

func TestGPULogits(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			for _, withRows := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/rows=%v", mode, dt, withRows), func(t *testing.T) {
					const tokens, dim, vocab = 10, 96, 300
					hidden := p.rand(kernels.F32, 2, tokens, dim)
					norm, head := p.rand(kernels.F32, 1, dim), p.rand(dt, 0.3, vocab, dim)
					r := tokens
					var rc, rg kernels.Tensor
					if withRows {
						rows := p.ints([]int32{9, 0, 4}, 3)
						rc, rg, r = rows.c, rows.g, 3
					}
					out := p.zeros(kernels.F32, r, vocab)
					p.poison(out)
					if err := p.c.Logits(out.c, hidden.c, rc, norm.c, head.c, 1e-6); err != nil {
						t.Fatal(err)
					}
					if err := p.g.Logits(out.g, hidden.g, rg, norm.g, head.g, 1e-6); err != nil {
						t.Fatal(err)
					}
					p.check("logits", out, linearTol(dt, mode))
				})
			}
		}
	}
}

func TestGPUViewsAndWidening(t *testing.T) {
	p := newPair(t, GEMMRound)
	vals := randVals(p.r, 24, 1)
	// BF16 host values widened into an F32 tensor on the device.
	w := upload(t, p.g, kernels.F32, hostBytes(kernels.BF16, vals), kernels.BF16, 4, 6)
	got := p.f32(p.g, w)
	for i, v := range vals {
		if want := kernels.BF16ToF32(kernels.F32ToBF16(v)); got[i] != want {
			t.Fatalf("widened[%d] = %v, want %v", i, got[i], want)
		}
	}
	// Writing rows [1, 3) through a view, then a reshaped view of the whole.
	rows, err := p.g.Rows(w, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.g.Upload(rows, kernels.F32Bytes(make([]float32, 12)), kernels.F32); err != nil {
		t.Fatal(err)
	}
	flat, err := p.g.Reshape(w, 24)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range p.f32(p.g, flat) {
		want := got[i]
		if i >= 6 && i < 18 {
			want = 0
		}
		if v != want {
			t.Fatalf("after writing rows [1,3): element %d = %v, want %v", i, v, want)
		}
	}
}

// Index errors met by kernels surface at the next Sync, name the operation
// and wrap kernels.ErrOutOfRange; the backend stays usable.
func TestGPUDeviceChecks(t *testing.T) {
	p := newPair(t, GEMMRound)
	g := p.g
	table := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, 40, 1)), kernels.F32, 10, 4)
	cache := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, 32, 1)), kernels.F32, 2, 4, 4)
	tests := []struct {
		name, op string
		run      func() error
	}{
		{"embedding id", "embedding", func() error {
			out, _ := g.Alloc(kernels.F32, 2, 4)
			ids := upload(t, g, kernels.I32, kernels.I32Bytes([]int32{3, 10}), kernels.I32, 2)
			return g.Embedding(out, table, ids)
		}},
		{"cache slot", "write_cache", func() error {
			src, _ := g.Alloc(kernels.F32, 1, 4)
			sm := upload(t, g, kernels.I32, kernels.I32Bytes([]int32{8}), kernels.I32, 1)
			return g.WriteCache(cache, src, sm, 0)
		}},
		{"placeholder row", "resolve_placeholders", func() error {
			ids, _ := g.Alloc(kernels.I32, 2)
			from := upload(t, g, kernels.I32, kernels.I32Bytes([]int32{0, 5}), kernels.I32, 2)
			sampled, _ := g.Alloc(kernels.I32, 3)
			return g.ResolvePlaceholders(ids, from, sampled)
		}},
		{"block table", "attention", func() error {
			q, _ := g.Alloc(kernels.F32, 1, 4)
			out, _ := g.Alloc(kernels.F32, 1, 4)
			m := kernels.AttentionMetadata{NumSeqs: 1, NumTokens: 1, BlockSize: 4,
				CuSeqlensQ:  upload(t, g, kernels.I32, kernels.I32Bytes([]int32{0, 1}), kernels.I32, 2),
				SeqlensK:    upload(t, g, kernels.I32, kernels.I32Bytes([]int32{3}), kernels.I32, 1),
				BlockTables: upload(t, g, kernels.I32, kernels.I32Bytes([]int32{7}), kernels.I32, 1, 1),
			}
			return g.Attention(out, q, cache, cache, &m, kernels.AttentionParams{NumHeads: 1, NumKVHeads: 1, HeadDim: 4, Scale: 1})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); err != nil {
				t.Fatalf("launch: %v", err)
			}
			err := g.Sync()
			if !errors.Is(err, kernels.ErrOutOfRange) {
				t.Fatalf("Sync after a bad %s: %v, want ErrOutOfRange", tc.op, err)
			}
			if !strings.Contains(err.Error(), tc.op) {
				t.Errorf("error %q does not name %s", err, tc.op)
			}
			if err := g.Sync(); err != nil {
				t.Fatalf("second Sync: %v", err)
			}
		})
	}
	// A bad expert id: the device-side grouping (a small batch) reports it at
	// the next Sync; the host grouping (a 1200-pair batch, 8-element rows
	// not required) from MoE itself.
	for _, tokens := range []int{1, 1200} {
		x, _ := g.Alloc(kernels.F32, tokens, 8)
		out, _ := g.Alloc(kernels.F32, tokens, 8)
		gu, _ := g.Alloc(kernels.BF16, 2, 16, 8)
		dn, _ := g.Alloc(kernels.BF16, 2, 8, 8)
		idv := make([]int32, tokens)
		idv[tokens-1] = 2
		ids := upload(t, g, kernels.I32, kernels.I32Bytes(idv), kernels.I32, tokens, 1)
		w, _ := g.Alloc(kernels.F32, tokens, 1)
		err := g.MoE(out, x, ids, w, gu, dn)
		if err == nil {
			err = g.Sync()
		}
		if !errors.Is(err, kernels.ErrOutOfRange) || !strings.Contains(err.Error(), "moe") {
			t.Errorf("MoE over %d tokens with expert 2 of 2: %v, want ErrOutOfRange naming moe", tokens, err)
		}
		if err := g.Sync(); err != nil {
			t.Fatalf("Sync after the bad MoE: %v", err)
		}
	}
}

// The backend's own kernels are batch-invariant: a decode row computed alone
// is bit-identical to the same row inside a crowded batch. cuBLAS GEMMs are
// not guaranteed to be; the test reports whether they were here.
func TestGPUBatchInvariance(t *testing.T) {
	p := newPair(t, GEMMRound)
	const blockSize, numBlocks = 16, 64
	ap := kernels.AttentionParams{NumHeads: 8, NumKVHeads: 2, HeadDim: 64, Scale: 0.125}
	width := ap.NumKVHeads * ap.HeadDim
	kc, vc := p.rand(kernels.F32, 1, numBlocks, blockSize, width), p.rand(kernels.F32, 1, numBlocks, blockSize, width)
	crowd := p.pagedBatch(blockSize, numBlocks, [][2]int{{1, 40}, {1, 100}, {30, 90}, {1, 7}})
	qAll := p.rand(kernels.F32, 1, crowd.numTokens, ap.NumHeads*ap.HeadDim)
	outAll := p.zeros(kernels.F32, crowd.numTokens, ap.NumHeads*ap.HeadDim)
	if err := p.g.Attention(outAll.g, qAll.g, kc.g, vc.g, &crowd.gpuMeta, ap); err != nil {
		t.Fatal(err)
	}
	all := p.f32(p.g, outAll.g)
	// Sequence 1 alone: its one decode row, the same block table.
	tables := p.i32(p.g, crowd.gpuMeta.BlockTables)
	maxBlocks := crowd.gpuMeta.BlockTables.Shape()[1]
	solo := kernels.AttentionMetadata{NumSeqs: 1, NumTokens: 1, BlockSize: blockSize,
		CuSeqlensQ:  upload(t, p.g, kernels.I32, kernels.I32Bytes([]int32{0, 1}), kernels.I32, 2),
		SeqlensK:    upload(t, p.g, kernels.I32, kernels.I32Bytes([]int32{100}), kernels.I32, 1),
		BlockTables: upload(t, p.g, kernels.I32, kernels.I32Bytes(tables[maxBlocks:2*maxBlocks]), kernels.I32, 1, maxBlocks),
	}
	qRow, err := p.g.Rows(qAll.g, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	outRow, _ := p.g.Alloc(kernels.F32, 1, ap.NumHeads*ap.HeadDim)
	if err := p.g.Attention(outRow, qRow, kc.g, vc.g, &solo, ap); err != nil {
		t.Fatal(err)
	}
	row := p.f32(p.g, outRow)
	w := ap.NumHeads * ap.HeadDim
	for i, v := range row {
		if math.Float32bits(v) != math.Float32bits(all[w+i]) {
			t.Fatalf("attention: decode row alone differs from the crowded batch at %d: %v vs %v", i, v, all[w+i])
		}
	}
	// Linear: one row alone vs inside 64 rows (reported, not required).
	x, wt := p.rand(kernels.F32, 1, 64, 512), p.rand(kernels.BF16, 1, 256, 512)
	o64, _ := p.g.Alloc(kernels.F32, 64, 256)
	if err := p.g.Linear(o64, x.g, wt.g, nil); err != nil {
		t.Fatal(err)
	}
	x1, _ := p.g.Rows(x.g, 5, 6)
	o1, _ := p.g.Alloc(kernels.F32, 1, 256)
	if err := p.g.Linear(o1, x1, wt.g, nil); err != nil {
		t.Fatal(err)
	}
	a, b := p.f32(p.g, o64)[5*256:6*256], p.f32(p.g, o1)
	same := true
	for i := range b {
		same = same && math.Float32bits(a[i]) == math.Float32bits(b[i])
	}
	t.Logf("linear (cuBLAS, bf16): row alone bit-identical to the row among 64: %v", same)
}

// A captured graph replays the same work as eager execution, bit for bit.
func TestGPUGraphReplay(t *testing.T) {
	p := newPair(t, GEMMRound)
	g := p.g
	const rows, n, k = 4, 128, 256
	x := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, rows*k, 1)), kernels.F32, rows, k)
	norm := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, k, 1)), kernels.F32, k)
	w := upload(t, g, kernels.BF16, hostBytes(kernels.BF16, randVals(p.r, n*k, 0.1)), kernels.BF16, n, k)
	h, _ := g.Alloc(kernels.F32, rows, k)
	y, _ := g.Alloc(kernels.F32, rows, n)
	z, _ := g.Alloc(kernels.F32, rows, n)
	step := func() error {
		if err := g.RMSNorm(h, x, norm, 1e-5); err != nil {
			return err
		}
		if err := g.Linear(y, h, w, nil); err != nil {
			return err
		}
		return g.Add(z, y, y)
	}
	if err := g.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if err := step(); err != nil {
		t.Fatal(err)
	}
	if err := g.Sync(); !errors.Is(err, ErrCapturing) {
		t.Errorf("Sync while capturing: %v, want ErrCapturing", err)
	}
	graph, err := g.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	for round := range 3 {
		if err := g.Upload(x, kernels.F32Bytes(randVals(p.r, rows*k, 1)), kernels.F32); err != nil {
			t.Fatal(err)
		}
		if err := graph.Replay(); err != nil {
			t.Fatal(err)
		}
		replayed := p.f32(g, z)
		if err := step(); err != nil {
			t.Fatal(err)
		}
		eager := p.f32(g, z)
		for i := range eager {
			if math.Float32bits(eager[i]) != math.Float32bits(replayed[i]) {
				t.Fatalf("round %d: replay differs from eager at %d: %v vs %v", round, i, replayed[i], eager[i])
			}
		}
	}
}
