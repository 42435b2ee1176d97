package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// GPU tests of MoE over FP8 experts at prefill sizes: the tensor-core device
// path above 1024 pairs (fp8_moe.cu: the device grouping of any number of
// pairs, then f8m_gemm_k from Options.MoEGEMMPairs pairs, f8m_mma_k below).

// fp8MoEShape is an FP8 MoE layer: experts, top k, hidden and intermediate
// sizes (multiples of 128: the tensor-core path) and the weights' block
// width.
type fp8MoEShape struct {
	experts, topK, hidden, inter, blk int
}

// fp8MoEWeights builds sh's expert weights (makeFP8Varied: block scales
// that differ by up to 2^8 from block to block) on both backends of p.
func fp8MoEWeights(t *testing.T, p *pair, sh fp8MoEShape) (gu, dn dual) {
	guW, dnW := makeFP8Varied(p.r, sh.experts, 2*sh.inter, sh.hidden, sh.blk), makeFP8Varied(p.r, sh.experts, sh.hidden, sh.inter, sh.blk)
	return dual{newFP8Weight(t, p.c, guW), newFP8Weight(t, p.g, guW)}, dual{newFP8Weight(t, p.c, dnW), newFP8Weight(t, p.g, dnW)}
}

// MoE over FP8 experts at prefill sizes against the CPU backend (x times
// the dequantized weights in float32), on the default backend (the grouped
// GEMM from 2048 pairs): 1 to 12000 pairs, around and above 1024 (the
// former host threshold) and 2048. Hidden 640 and intermediate 384 deal 5
// and 3 units of 128 columns to the four passes (one pass without units)
// and leave a partial tile of weight rows (640 = 2 x 256 + 128 output
// columns of down); block_k 256 takes one scale per two units. Rows of x
// span 10 decades (moeRowScale; some activations exceed F16's range). Each
// token row's max |gpu - cpu| must be <= 1e-4 of that row's max |cpu|, the
// bound of the small batches' device path (TestGPUFP8MoE); the eager
// output must equal a captured graph's replay bit for bit (the host path
// cannot be captured and rounds the activations to E4M3, so equality shows
// that the eager call stayed on the device), and token 3 alone and the
// first 32 tokens as a batch must give the bits they have in the whole
// batch.
func TestGPUFP8MoEPrefill(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, c := range []struct {
		sh     fp8MoEShape
		tokens []int
	}{
		{fp8MoEShape{16, 4, 640, 384, 128}, []int{1, 256, 300, 511, 512, 1000, 3000}},
		{fp8MoEShape{8, 2, 512, 256, 256}, []int{1100, 1500}},
	} {
		sh := c.sh
		gu, dn := fp8MoEWeights(t, p, sh)
		for _, tokens := range c.tokens {
			pairs := tokens * sh.topK
			t.Run(fmt.Sprintf("e%d_top%d_h%d_i%d_b%d/tokens=%d/pairs=%d", sh.experts, sh.topK, sh.hidden, sh.inter, sh.blk, tokens, pairs), func(t *testing.T) {
				mc := newMoECase(p, tokens, sh.experts, sh.topK, sh.hidden)
				if err := p.c.MoE(mc.out.c, mc.x.c, mc.ids.c, mc.w.c, gu.c, dn.c); err != nil {
					t.Fatal(err)
				}
				cpu := p.f32(p.c, mc.out.c)
				p.poison(mc.out)
				if err := p.g.MoE(mc.out.g, mc.x.g, mc.ids.g, mc.w.g, gu.g, dn.g); err != nil {
					t.Fatal(err)
				}
				got := p.f32(p.g, mc.out.g)
				e := rowRelErr(got, cpu, sh.hidden)
				if !(e <= 1e-4) {
					t.Fatalf("max over token rows of max |gpu - cpu| / max |cpu| = %.3g, want <= 1e-4", e)
				}
				p.poison(mc.out)
				graph, err := p.g.CaptureGraph(func() error { return p.g.MoE(mc.out.g, mc.x.g, mc.ids.g, mc.w.g, gu.g, dn.g) })
				if err != nil {
					t.Fatal(err)
				}
				err = graph.Replay()
				graph.Close()
				if err != nil {
					t.Fatal(err)
				}
				if i, ok := moeEqual(p.f32(p.g, mc.out.g), got); !ok {
					t.Fatalf("graph replay out[%d] differs from the eager call's bits", i)
				}
				same := func(what string, part []float32, lo int) {
					if i, ok := moeEqual(part, got[lo*sh.hidden:lo*sh.hidden+len(part)]); !ok {
						t.Fatalf("%s: token %d out[%d] = %v, in the whole batch %v", what, lo+i/sh.hidden, i%sh.hidden, part[i], got[lo*sh.hidden+i])
					}
				}
				if tokens > 3 {
					same("token 3 alone", p.moeRows(mc, 3, 4, gu.g, dn.g, fp8Auto), 3)
				}
				if tokens > 32 {
					same("the first 32 tokens", p.moeRows(mc, 0, 32, gu.g, dn.g, fp8Auto), 0)
				}
				t.Logf("%d pairs: max over token rows of max |gpu - cpu| / max |cpu| = %.3g; eager = graph replay; alone = in the batch", pairs, e)
			})
		}
	}
}

// The grouped GEMM (f8m_gemm_k) gives f8m_mma_k's bits: the same call on a
// backend that takes the GEMM at every size (MoEGEMMPairs 1) and on one
// that never reaches it (MoEGEMMPairs 2^30: f8m_mma_k at every size, also
// on the device). Shapes: one token; 40 tokens crowded onto 4 of 16 experts
// (passes of several row tiles in f8m_mma_k); k of one and two units
// (passes without units add zero) and of 5 and 9 units; several row tiles
// of 64 an expert (1400 pairs on 4 experts); block_k 256; a partial tile of
// weight rows (hidden 384: 256 + 128 output columns of down); 12000 pairs.
func TestGPUFP8MoEPrefillBits(t *testing.T) {
	gemm := newPairOpts(t, Options{GEMM: GEMMRound, MoEGEMMPairs: 1})
	small := newGPUOpts(t, Options{GEMM: GEMMRound, MoEGEMMPairs: 1 << 30})
	for _, c := range []struct {
		sh      fp8MoEShape
		tokens  int
		crowded bool // every token picks experts 0..topK-1
	}{
		{fp8MoEShape{64, 6, 256, 384, 128}, 1, false},
		{fp8MoEShape{16, 4, 256, 384, 128}, 40, true},
		{fp8MoEShape{8, 2, 128, 256, 128}, 300, false},
		{fp8MoEShape{16, 4, 640, 1152, 128}, 256, false},
		{fp8MoEShape{4, 2, 384, 256, 128}, 700, false},
		{fp8MoEShape{8, 6, 512, 384, 256}, 300, false},
		{fp8MoEShape{64, 6, 256, 384, 128}, 2000, false},
	} {
		sh := c.sh
		t.Run(fmt.Sprintf("e%d_top%d_h%d_i%d_b%d/tokens=%d_crowded=%v", sh.experts, sh.topK, sh.hidden, sh.inter, sh.blk, c.tokens, c.crowded), func(t *testing.T) {
			guW, dnW := makeFP8Varied(gemm.r, sh.experts, 2*sh.inter, sh.hidden, sh.blk), makeFP8Varied(gemm.r, sh.experts, sh.hidden, sh.inter, sh.blk)
			ids := randExpertIDs(gemm.r, c.tokens, sh.topK, sh.experts)
			if c.crowded {
				for i := range ids {
					ids[i] = int32(i % sh.topK)
				}
			}
			xs := randVals(gemm.r, c.tokens*sh.hidden, 1)
			for tok := range c.tokens {
				for j := range sh.hidden {
					xs[tok*sh.hidden+j] *= moeRowScale(tok)
				}
			}
			ws := randVals(gemm.r, c.tokens*sh.topK, 1)
			run := func(g *Backend) []float32 {
				gu, dn := newFP8Weight(t, g, guW), newFP8Weight(t, g, dnW)
				x := upload(t, g, kernels.F32, kernels.F32Bytes(xs), kernels.F32, c.tokens, sh.hidden)
				id := upload(t, g, kernels.I32, kernels.I32Bytes(ids), kernels.I32, c.tokens, sh.topK)
				w := upload(t, g, kernels.F32, kernels.F32Bytes(ws), kernels.F32, c.tokens, sh.topK)
				out, err := g.Alloc(kernels.F32, c.tokens, sh.hidden)
				if err != nil {
					t.Fatal(err)
				}
				if err := g.MoE(out, x, id, w, gu, dn); err != nil {
					t.Fatal(err)
				}
				return moeDownload(t, g, out)
			}
			got, want := run(gemm.g), run(small)
			if i, ok := moeEqual(got, want); !ok {
				t.Fatalf("grouped GEMM out[%d] = %v, f8m_mma_k's %v", i, got[i], want[i])
			}
		})
	}
}

// A token alone gives the bits it gives among 4096 tokens (64 experts, top
// 6: 24576 pairs through the grouped GEMM on the default backend): alone it
// runs f8m_mma_k (6 pairs), and alone through the GEMM too (MoEGEMMPairs 1).
func TestGPUFP8MoEPrefillInvariance(t *testing.T) {
	const tokens = 4096
	sh := fp8MoEShape{64, 6, 512, 384, 128}
	p := newPair(t, GEMMRound)
	gemm := newGPUOpts(t, Options{GEMM: GEMMRound, MoEGEMMPairs: 1})
	guW, dnW := makeFP8Varied(p.r, sh.experts, 2*sh.inter, sh.hidden, sh.blk), makeFP8Varied(p.r, sh.experts, sh.hidden, sh.inter, sh.blk)
	mc := newMoECase(p, tokens, sh.experts, sh.topK, sh.hidden)
	gu, dn := newFP8Weight(t, p.g, guW), newFP8Weight(t, p.g, dnW)
	if err := p.g.MoE(mc.out.g, mc.x.g, mc.ids.g, mc.w.g, gu, dn); err != nil {
		t.Fatal(err)
	}
	crowd := p.f32(p.g, mc.out.g)
	xs, ids, ws := p.f32(p.g, mc.x.g), p.i32(p.g, mc.ids.g), p.f32(p.g, mc.w.g)
	for _, path := range []struct {
		name string
		g    *Backend
	}{{"small_batch_kernel_alone", p.g}, {"gemm_alone", gemm}} {
		t.Run(path.name, func(t *testing.T) {
			g := path.g
			gu, dn := newFP8Weight(t, g, guW), newFP8Weight(t, g, dnW)
			for _, row := range []int{0, 1777, tokens - 1} {
				x := upload(t, g, kernels.F32, kernels.F32Bytes(xs[row*sh.hidden:(row+1)*sh.hidden]), kernels.F32, 1, sh.hidden)
				id := upload(t, g, kernels.I32, kernels.I32Bytes(ids[row*sh.topK:(row+1)*sh.topK]), kernels.I32, 1, sh.topK)
				w := upload(t, g, kernels.F32, kernels.F32Bytes(ws[row*sh.topK:(row+1)*sh.topK]), kernels.F32, 1, sh.topK)
				one, err := g.Alloc(kernels.F32, 1, sh.hidden)
				if err != nil {
					t.Fatal(err)
				}
				if err := g.MoE(one, x, id, w, gu, dn); err != nil {
					t.Fatal(err)
				}
				if i, ok := moeEqual(moeDownload(t, g, one), crowd[row*sh.hidden:(row+1)*sh.hidden]); !ok {
					t.Fatalf("token %d alone: out[%d] differs from the same token among %d", row, i, tokens)
				}
			}
		})
	}
}

// FP8 MoE over more than 2048 pairs is capturable: a graph of 600 tokens x
// 6 (3600 pairs: the grouped GEMM) replays to the eager bits, also after
// the routing ids changed between replays (including a routing with 61 of
// 64 experts empty).
func TestGPUFP8MoEPrefillGraph(t *testing.T) {
	const tokens = 600
	sh := fp8MoEShape{64, 6, 256, 384, 128}
	p := newPair(t, GEMMRound)
	gu, dn := fp8MoEWeights(t, p, sh)
	mc := newMoECase(p, tokens, sh.experts, sh.topK, sh.hidden)
	graph, err := p.g.CaptureGraph(func() error { return p.g.MoE(mc.out.g, mc.x.g, mc.ids.g, mc.w.g, gu.g, dn.g) })
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	two := moeRouting(p.r, "two", tokens, 2, sh.experts)
	crowded := make([]int32, tokens*sh.topK)
	for tok := range tokens {
		copy(crowded[tok*sh.topK:], two[tok*2:tok*2+2])
	}
	for i, ids := range [][]int32{p.i32(p.g, mc.ids.g), randExpertIDs(p.r, tokens, sh.topK, sh.experts), crowded} {
		if err := p.g.Upload(mc.ids.g, kernels.I32Bytes(ids), kernels.I32); err != nil {
			t.Fatal(err)
		}
		if err := p.g.MoE(mc.out.g, mc.x.g, mc.ids.g, mc.w.g, gu.g, dn.g); err != nil {
			t.Fatal(err)
		}
		eager := p.f32(p.g, mc.out.g)
		p.poison(mc.out)
		if err := graph.Replay(); err != nil {
			t.Fatal(err)
		}
		if j, ok := moeEqual(p.f32(p.g, mc.out.g), eager); !ok {
			t.Fatalf("routing %d: replayed out[%d] differs from the eager call's bits", i, j)
		}
	}
}

// A routing id outside the experts in an FP8 batch over 2048 pairs (the
// grouped GEMM) is reported as on the small batches' device path: MoE
// returns nil and the next Sync kernels.ErrOutOfRange naming moe; the
// backend stays usable.
func TestGPUFP8MoEPrefillBadID(t *testing.T) {
	const tokens = 1200
	sh := fp8MoEShape{4, 2, 128, 128, 128}
	p := newPair(t, GEMMRound)
	gu, dn := fp8MoEWeights(t, p, sh)
	for _, bad := range []int32{int32(sh.experts), -1} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			mc := newMoECase(p, tokens, sh.experts, sh.topK, sh.hidden)
			ids := p.i32(p.g, mc.ids.g)
			ids[tokens/2] = bad
			if err := p.g.Upload(mc.ids.g, kernels.I32Bytes(ids), kernels.I32); err != nil {
				t.Fatal(err)
			}
			if err := p.g.MoE(mc.out.g, mc.x.g, mc.ids.g, mc.w.g, gu.g, dn.g); err != nil {
				t.Fatalf("MoE: %v, want the error at the next Sync (device path)", err)
			}
			err := p.g.Sync()
			if !errors.Is(err, kernels.ErrOutOfRange) || !strings.Contains(err.Error(), "moe") {
				t.Fatalf("Sync after expert id %d of %d: %v, want ErrOutOfRange naming moe", bad, sh.experts, err)
			}
			if err := p.g.Sync(); err != nil {
				t.Fatalf("second Sync: %v", err)
			}
		})
	}
}

// BenchmarkFP8MoEPrefill times DeepSeek-V2-Lite's routed experts as FP8
// (64 of hidden 2048, intermediate 1408, top 6; random E4M3 codes, 128 x
// 128 block scales; random routing) at 64 to 4096 tokens (384 to 24576
// pairs), eager, in one run: "new", the default (the device grouping, then
// from 2048 pairs the grouped GEMM f8m_gemm_k, below f8m_mma_k); "graph",
// the same captured and replayed; "old", the host path that AUTO took above
// 1024 pairs before (routing ids copied to the host, a wait, activations
// quantized to E4M3 per 128 columns, the mma.sync FP8 GEMM per expert:
// fp8GEMM forced); "small", f8m_mma_k at every size (MoEGEMMPairs 2^30);
// and BF16 experts on the device's grouped GEMM (BenchmarkMoEPrefill's
// "gemm"). TFLOP/s count 2 * 3 * pairs * hidden * inter. The new and small
// outputs must have the same bits (logged), the old one differs by its
// activations' E4M3 rounding (max relative difference logged). It logs
// "fp8 moe prefill" lines. Three backends, 1.7 GB of weights; its name keeps
// it out of the bench phase's default pattern (GPU).
func BenchmarkFP8MoEPrefill(b *testing.B) {
	const experts, topK, hidden, inter = 64, 6, 2048, 1408
	guF, dnF := randomFP8(experts, 2*inter, hidden, 81), randomFP8(experts, hidden, inter, 82)
	guRaw, dnRaw := randomBF16(experts*2*inter*hidden, 1), randomBF16(experts*hidden*inter, 2)
	def := newGPUOpts(b, Options{GEMM: GEMMRound})
	small := newGPUOpts(b, Options{GEMM: GEMMRound, MoEGEMMPairs: 1 << 30})
	type ws struct{ gu, dn kernels.Tensor }
	fp8 := map[*Backend]ws{}
	for _, g := range []*Backend{def, small} {
		fp8[g] = ws{newFP8Weight(b, g, guF), newFP8Weight(b, g, dnF)}
	}
	bf := ws{upload(b, def, kernels.BF16, guRaw, kernels.BF16, experts, 2*inter, hidden),
		upload(b, def, kernels.BF16, dnRaw, kernels.BF16, experts, hidden, inter)}
	r := rand.New(rand.NewPCG(2048, 1409))
	for _, tokens := range []int{64, 256, 1024, 4096} {
		b.Run(fmt.Sprintf("v2lite/tokens=%d", tokens), func(b *testing.B) {
			pairs := tokens * topK
			x := kernels.F32Bytes(randVals(r, tokens*hidden, 1))
			ids := kernels.I32Bytes(randExpertIDs(r, tokens, topK, experts))
			w := kernels.F32Bytes(randVals(r, pairs, 0.3))
			flops := 2 * 3 * float64(pairs) * hidden * inter
			call := func(g *Backend, gu, dn kernels.Tensor, path fp8Path) (kernels.Tensor, func() error) {
				xt := upload(b, g, kernels.F32, x, kernels.F32, tokens, hidden)
				it := upload(b, g, kernels.I32, ids, kernels.I32, tokens, topK)
				wt := upload(b, g, kernels.F32, w, kernels.F32, tokens, topK)
				out, err := g.Alloc(kernels.F32, tokens, hidden)
				if err != nil {
					b.Fatal(err)
				}
				if path == fp8Auto {
					return out, func() error { return g.MoE(out, xt, it, wt, gu, dn) }
				}
				return out, func() error { return g.moeFP8Path(out, xt, it, wt, gu, dn, path) }
			}
			outN, runN := call(def, fp8[def].gu, fp8[def].dn, fp8Auto)
			msN := timeIt(b, def, 10, runN)
			newOut := moeDownload(b, def, outN)
			graph, err := def.CaptureGraph(runN)
			if err != nil {
				b.Fatal(err)
			}
			msG := timeIt(b, def, 10, graph.Replay)
			graphOut := moeDownload(b, def, outN)
			graph.Close()
			outO, runO := call(def, fp8[def].gu, fp8[def].dn, fp8GEMM)
			msO := timeIt(b, def, 10, runO)
			oldOut := moeDownload(b, def, outO)
			outS, runS := call(small, fp8[small].gu, fp8[small].dn, fp8Auto)
			msS := timeIt(b, small, 10, runS)
			smallOut := moeDownload(b, small, outS)
			_, runB := call(def, bf.gu, bf.dn, fp8Auto)
			msB := timeIt(b, def, 10, runB)
			same := "new = small = graph bits"
			if i, ok := moeEqual(smallOut, newOut); !ok {
				same = fmt.Sprintf("BITS DIFFER new vs small at %d", i)
			} else if i, ok := moeEqual(graphOut, newOut); !ok {
				same = fmt.Sprintf("BITS DIFFER new vs graph at %d", i)
			}
			tf := func(ms float64) float64 { return flops / (ms / 1e3) / 1e12 }
			b.ReportMetric(tf(msN), "new-TFLOP/s")
			b.ReportMetric(tf(msO), "old-TFLOP/s")
			b.ReportMetric(tf(msS), "small-TFLOP/s")
			b.ReportMetric(tf(msB), "bf16-TFLOP/s")
			b.Logf("fp8 moe prefill | v2lite tokens=%d pairs=%d | new %.3f ms %.1f TFLOP/s | graph %.3f ms | old (host grouping, E4M3 activations) %.3f ms %.1f TFLOP/s, new %.2fx faster, max rel diff %.2g | small kernels %.3f ms %.1f TFLOP/s | bf16 device gemm %.3f ms %.1f TFLOP/s, fp8/bf16 %.2fx | %s",
				tokens, pairs, msN, tf(msN), msG, msO, tf(msO), msO/msN, maxRelErr(oldOut, newOut), msS, tf(msS), msB, tf(msB), msB/msN, same)
			if math.IsNaN(maxRelErr(newOut, oldOut)) {
				b.Fatal("NaN in the new path's output")
			}
		})
	}
}
