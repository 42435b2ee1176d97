package cuda

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// GPU tests of MoE over 16-bit experts at prefill sizes: the grouped
// tensor-core GEMM (di_moe_gemm_k, from Options.MoEGEMMPairs pairs, by
// default above 1024) after the device grouping of any number of pairs.

// moeData is one MoE call's inputs as host bytes, to upload to any backend.
type moeData struct {
	tokens, topK, experts, hidden, inter int
	dt                                   kernels.DType
	x, gu, dn, w                         []byte
	ids                                  []int32
}

// newMoEData draws x in [-1, 1), weights in [-0.2, 0.2) rounded to dt and
// routing weights in [-1, 1); ids are the routing ([tokens, topK]).
func newMoEData(r *rand.Rand, dt kernels.DType, tokens, topK, experts, hidden, inter int, ids []int32) moeData {
	return moeData{tokens: tokens, topK: topK, experts: experts, hidden: hidden, inter: inter, dt: dt,
		x:   kernels.F32Bytes(randVals(r, tokens*hidden, 1)),
		gu:  hostBytes(dt, randVals(r, experts*2*inter*hidden, 0.2)),
		dn:  hostBytes(dt, randVals(r, experts*hidden*inter, 0.2)),
		w:   kernels.F32Bytes(randVals(r, tokens*topK, 1)),
		ids: ids}
}

// moeTensors are moeData's inputs on one backend, with an output.
type moeTensors struct{ out, x, gu, dn, ids, w kernels.Tensor }

func (d moeData) upload(t testing.TB, ops kernels.Ops) moeTensors {
	t.Helper()
	out, err := ops.Alloc(kernels.F32, d.tokens, d.hidden)
	if err != nil {
		t.Fatal(err)
	}
	return moeTensors{out: out,
		x:   upload(t, ops, kernels.F32, d.x, kernels.F32, d.tokens, d.hidden),
		gu:  upload(t, ops, d.dt, d.gu, d.dt, d.experts, 2*d.inter, d.hidden),
		dn:  upload(t, ops, d.dt, d.dn, d.dt, d.experts, d.hidden, d.inter),
		ids: upload(t, ops, kernels.I32, kernels.I32Bytes(d.ids), kernels.I32, d.tokens, d.topK),
		w:   upload(t, ops, kernels.F32, d.w, kernels.F32, d.tokens, d.topK)}
}

func (m moeTensors) run(ops kernels.Ops) error { return ops.MoE(m.out, m.x, m.ids, m.w, m.gu, m.dn) }

// moeDownload returns ten's float32 values.
func moeDownload(t testing.TB, ops kernels.Ops, ten kernels.Tensor) []float32 {
	t.Helper()
	v, err := kernels.ToF32(ops, ten)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// replayed runs m once in a captured graph (which only the device path
// allows) and returns its output.
func (m moeTensors) replayed(t testing.TB, g *Backend) []float32 {
	t.Helper()
	graph, err := g.CaptureGraph(func() error { return m.run(g) })
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	if err := graph.Replay(); err != nil {
		t.Fatal(err)
	}
	return moeDownload(t, g, m.out)
}

// moeRouting draws ids [tokens, topK]: "random" top_k distinct experts a
// token; "two" experts 3 and experts-4 only (top_k 2, in random k order),
// so that every other expert has no rows; "one" expert 5 for every pair.
func moeRouting(r *rand.Rand, kind string, tokens, topK, experts int) []int32 {
	switch kind {
	case "two":
		ids := make([]int32, tokens*topK)
		for i := range tokens {
			a, b := int32(3), int32(experts-4)
			if r.IntN(2) == 1 {
				a, b = b, a
			}
			ids[i*topK], ids[i*topK+1] = a, b
		}
		return ids
	case "one":
		ids := make([]int32, tokens*topK)
		for i := range ids {
			ids[i] = 5
		}
		return ids
	}
	return randExpertIDs(r, tokens, topK, experts)
}

// moeEqual reports the first element where got and want differ in bits.
func moeEqual(got, want []float32) (int, bool) {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i, false
		}
	}
	return -1, true
}

// MoE at prefill sizes against the CPU backend: 1500 pairs (500 tokens x
// 3, 8 experts), 4096 tokens x 6 (64 experts, 24576 pairs), 24576 pairs as
// 12288 tokens x 2 (16 experts, about 1536 rows an expert: 12 row tiles),
// experts without rows (only 2 of 16 used) and one expert with every row
// (top 1). hidden 288 and intermediate 160 leave partial column tiles (288
// = 2 x 128 + 32 output columns of down; 160 = 2 x 64 + 32 of gate/up) and
// uneven passes over k (9 and 5 blocks of 32); hidden 320 and intermediate
// 192, multiples of 64, are the shapes the wgmma kernel (di_moe_wg_k, the
// default) takes, with a partial tile of down's output columns (320 = 256
// + 64); each case also runs on the mma.sync GEMM (DisableMoEWGMMA). The
// bound is TestGPUMoE's,
// twice the linear's. The eager output must also equal, bit for bit, the
// same call replayed from a graph, which shows that the eager call ran on
// the device (the host path, cuBLAS per expert, cannot be captured and sums
// in another order).
func TestGPUMoEPrefill(t *testing.T) {
	cases := []struct {
		name                  string
		tokens, topK, experts int
		route                 string
	}{
		{"pairs=1500", 500, 3, 8, "random"},
		{"pairs=4096x6", 4096, 6, 64, "random"},
		{"pairs=24576_top2", 12288, 2, 16, "random"},
		{"zero_rows", 1200, 2, 16, "two"},
		{"one_expert", 1500, 1, 8, "one"},
	}
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		for _, wg := range []bool{false, true} {
			p := newPairOpts(t, Options{GEMM: mode, DisableMoEWGMMA: !wg})
			for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
				if mode == GEMMSplit && dt == kernels.F16 {
					continue // split mode's path is dtype-generic; BF16 covers it
				}
				for _, tc := range cases {
					for _, shape := range [][2]int{{288, 160}, {320, 192}} {
						hidden, inter := shape[0], shape[1]
						if wg && hidden%64 != 0 {
							continue // the wgmma GEMM takes multiples of 64 only: the mma.sync one ran it
						}
						kernel := map[bool]string{false: "mma", true: "wgmma"}[wg]
						t.Run(fmt.Sprintf("%s/%s/%s/%s/h%d_i%d", mode, kernel, dt, tc.name, hidden, inter), func(t *testing.T) {
							ids := moeRouting(p.r, tc.route, tc.tokens, tc.topK, tc.experts)
							d := newMoEData(p.r, dt, tc.tokens, tc.topK, tc.experts, hidden, inter, ids)
							c, g := d.upload(t, p.c), d.upload(t, p.g)
							p.poison(dual{g: g.out})
							if err := c.run(p.c); err != nil {
								t.Fatal(err)
							}
							if err := g.run(p.g); err != nil {
								t.Fatal(err)
							}
							e := p.check("moe", dual{c: c.out, g: g.out}, 2*linearTol(dt, mode))
							eager := moeDownload(t, p.g, g.out)
							p.poison(dual{g: g.out})
							if i, ok := moeEqual(g.replayed(t, p.g), eager); !ok {
								t.Fatalf("graph replay out[%d] differs from the eager call's bits", i)
							}
							t.Logf("%d pairs: max relative error %.3g against the CPU backend; eager = graph replay", tc.tokens*tc.topK, e)
						})
					}
				}
			}
		}
	}
}

// The mma.sync grouped GEMM (di_moe_gemm_k, DisableMoEWGMMA) gives
// di_moe_mma_k's bits: the same call on a backend that takes the GEMM at
// every size (MoEGEMMPairs 1, eager) and on one that never does
// (MoEGEMMPairs -1) inside a graph, where the device path runs
// the smaller batches' kernels at any size. Shapes: one token, the three
// shapes of di_moe_mma_k (under 2, under 12 and from 12 rows per expert on
// average: 24 pairs on 16 experts and 160 on 16, both crowded onto the
// first experts so that those take several passes, then the larger ones), a
// small batch, two row tiles of an expert (900 pairs on 4 experts), k of
// one and two blocks of 32 (passes without blocks add zero), and 12000
// pairs.
func TestGPUMoEPrefillBits(t *testing.T) {
	shapes := []struct {
		tokens, topK, experts, hidden, inter int
		crowded                              bool // every token picks experts 0..topK-1
	}{
		{1, 6, 64, 288, 160, false}, {12, 2, 16, 288, 160, true}, {40, 4, 16, 288, 160, true},
		{37, 3, 8, 288, 160, false}, {300, 3, 4, 288, 160, false}, {700, 2, 4, 64, 32, false},
		{2000, 6, 64, 288, 160, false},
	}
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		gemm := newGPUOpts(t, Options{GEMM: mode, MoEGEMMPairs: 1, DisableMoEWGMMA: true})
		small := newGPUOpts(t, Options{GEMM: mode, MoEGEMMPairs: -1})
		r := rand.New(rand.NewPCG(28, uint64(mode)))
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
			for _, sh := range shapes {
				t.Run(fmt.Sprintf("%s/%s/tokens=%d_top%d_e%d_h%d_i%d", mode, dt, sh.tokens, sh.topK, sh.experts, sh.hidden, sh.inter), func(t *testing.T) {
					ids := randExpertIDs(r, sh.tokens, sh.topK, sh.experts)
					if sh.crowded {
						for i := range ids {
							ids[i] = int32(i % sh.topK)
						}
					}
					d := newMoEData(r, dt, sh.tokens, sh.topK, sh.experts, sh.hidden, sh.inter, ids)
					a := d.upload(t, gemm)
					if err := a.run(gemm); err != nil {
						t.Fatal(err)
					}
					got := moeDownload(t, gemm, a.out)
					want := d.upload(t, small).replayed(t, small)
					if i, ok := moeEqual(got, want); !ok {
						t.Fatalf("grouped GEMM out[%d] = %v, the small-batch kernels' %v", i, got[i], want[i])
					}
				})
			}
		}
	}
}

// A token alone gives the bits it gives among 4096 tokens (64 experts, top
// 6: 24576 pairs through a grouped GEMM; hidden and intermediate multiples
// of 64, so the wgmma GEMM where the library has it). With
// DisableMoEWGMMA the crowd runs the mma.sync GEMM, and the token alone
// gives the same bits through it (MoEGEMMPairs 1) and through the small
// batches' kernel (the default at 6 pairs), which sums in that GEMM's
// order. With the default options the crowd runs the wgmma GEMM, and the
// token alone gives the same bits through it.
func TestGPUMoEPrefillInvariance(t *testing.T) {
	const tokens, topK, experts, hidden, inter = 4096, 6, 64, 512, 384
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		r := rand.New(rand.NewPCG(4096, uint64(mode)))
		d := newMoEData(r, kernels.BF16, tokens, topK, experts, hidden, inter, randExpertIDs(r, tokens, topK, experts))
		for _, family := range []struct {
			name  string
			crowd Options
			alone []Options
		}{
			{"mma", Options{GEMM: mode, DisableMoEWGMMA: true}, []Options{
				{GEMM: mode, MoEGEMMPairs: 1, DisableMoEWGMMA: true}, // the mma.sync GEMM
				{GEMM: mode, DisableMoEWGMMA: true},                  // the small batches' kernel
			}},
			{"wgmma", Options{GEMM: mode}, []Options{{GEMM: mode, MoEGEMMPairs: 1}}},
		} {
			def := newGPUOpts(t, family.crowd)
			crowdT := d.upload(t, def)
			if err := crowdT.run(def); err != nil {
				t.Fatal(err)
			}
			crowd := moeDownload(t, def, crowdT.out)
			for i, o := range family.alone {
				t.Run(fmt.Sprintf("%s/%s/alone%d", mode, family.name, i), func(t *testing.T) {
					g := newGPUOpts(t, o)
					all := d.upload(t, g)
					for _, row := range []int{0, 1777, tokens - 1} {
						view := func(ten kernels.Tensor) kernels.Tensor {
							v, err := g.Rows(ten, row, row+1)
							if err != nil {
								t.Fatal(err)
							}
							return v
						}
						one, err := g.Alloc(kernels.F32, 1, hidden)
						if err != nil {
							t.Fatal(err)
						}
						if err := g.MoE(one, view(all.x), view(all.ids), view(all.w), all.gu, all.dn); err != nil {
							t.Fatal(err)
						}
						want := crowd[row*hidden : (row+1)*hidden]
						if i, ok := moeEqual(moeDownload(t, g, one), want); !ok {
							t.Fatalf("token %d alone: out[%d] differs from the same token among %d", row, i, tokens)
						}
					}
				})
			}
		}
	}
}

// MoE over more than 1024 pairs is capturable: a graph of 600 tokens x 6
// (3600 pairs) replays to the eager bits, also after the routing ids
// changed between replays (including a routing with most experts empty).
func TestGPUMoEPrefillGraph(t *testing.T) {
	const tokens, topK, experts, hidden, inter = 600, 6, 64, 256, 192
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(600, 6))
	d := newMoEData(r, kernels.BF16, tokens, topK, experts, hidden, inter, randExpertIDs(r, tokens, topK, experts))
	m := d.upload(t, g)
	graph, err := g.CaptureGraph(func() error { return m.run(g) })
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	// The third routing puts slots 0 and 1 of every token on two experts
	// and the other four on expert 0: 61 experts without rows.
	two := moeRouting(r, "two", tokens, 2, experts)
	crowded := make([]int32, tokens*topK)
	for tok := range tokens {
		copy(crowded[tok*topK:], two[tok*2:tok*2+2])
	}
	for i, ids := range [][]int32{d.ids, randExpertIDs(r, tokens, topK, experts), crowded} {
		if err := g.Upload(m.ids, kernels.I32Bytes(ids), kernels.I32); err != nil {
			t.Fatal(err)
		}
		if err := m.run(g); err != nil {
			t.Fatal(err)
		}
		eager := moeDownload(t, g, m.out)
		nan := make([]float32, tokens*hidden)
		for j := range nan {
			nan[j] = float32(math.NaN())
		}
		if err := g.Upload(m.out, kernels.F32Bytes(nan), kernels.F32); err != nil {
			t.Fatal(err)
		}
		if err := graph.Replay(); err != nil {
			t.Fatal(err)
		}
		if j, ok := moeEqual(moeDownload(t, g, m.out), eager); !ok {
			t.Fatalf("routing %d: replayed out[%d] differs from the eager call's bits", i, j)
		}
	}
}

// A routing id outside the experts in a batch over 1024 pairs (the grouped
// GEMM's path) is reported as on the small batches' device path: MoE
// returns nil and the next Sync kernels.ErrOutOfRange naming moe; the
// backend stays usable.
func TestGPUMoEPrefillBadID(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(1200, 1))
	const tokens, topK, experts, hidden, inter = 1200, 1, 2, 32, 32
	for _, bad := range []int32{experts, -1} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			ids := randExpertIDs(r, tokens, topK, experts)
			ids[tokens/2] = bad
			m := newMoEData(r, kernels.BF16, tokens, topK, experts, hidden, inter, ids).upload(t, g)
			if err := m.run(g); err != nil {
				t.Fatalf("MoE: %v, want the error at the next Sync (device path)", err)
			}
			err := g.Sync()
			if !errors.Is(err, kernels.ErrOutOfRange) || !strings.Contains(err.Error(), "moe") {
				t.Fatalf("Sync after expert id %d of %d: %v, want ErrOutOfRange naming moe", bad, experts, err)
			}
			if err := g.Sync(); err != nil {
				t.Fatalf("second Sync: %v", err)
			}
		})
	}
}

// BenchmarkMoEPrefill times DeepSeek-V2-Lite's routed experts (64 of
// hidden 2048, intermediate 1408, top 6; random BF16 weights and routing)
// at 1 to 4096 tokens (6 to 24576 pairs) in GEMM mode round, four ways in
// the same run: "gemm", the grouping on the device and the grouped GEMM at
// every size (Options.MoEGEMMPairs 1) on the mma.sync GEMM
// (DisableMoEWGMMA), eager; "wgmma", the same on the default wgmma GEMM;
// "host", Options.MoEGEMMPairs
// -1 (up to 1024 pairs the small kernels, eager; above, the routing ids
// copied to the host, a wait, two cuBLAS GEMMs per expert); "small", the small batches' device kernels (di_moe_mma_k: each
// expert's weights read once per 32 of its rows), which a backend without
// the GEMM runs for any batch inside a graph (timed as graph replays). The
// gemm and small paths give the same bits (checked here too; the wgmma
// GEMM's difference from them is logged); TFLOP/s
// count 2 * 3 * pairs * hidden * inter; the floor is the weight bytes of
// the experts the routing uses, read once at deviceCopyBandwidth. Three backends with 1.1 GB of weights
// each; its name keeps it out of the bench phase's default pattern (GPU):
// run it with -test.bench MoEPrefill.
func BenchmarkMoEPrefill(b *testing.B) {
	const experts, topK, hidden, inter = 64, 6, 2048, 1408
	guRaw, dnRaw := randomBF16(experts*2*inter*hidden, 1), randomBF16(experts*hidden*inter, 2)
	type backend struct {
		g      *Backend
		gu, dn kernels.Tensor
	}
	openBackend := func(o Options) backend {
		g := newGPUOpts(b, o)
		return backend{g, upload(b, g, kernels.BF16, guRaw, kernels.BF16, experts, 2*inter, hidden),
			upload(b, g, kernels.BF16, dnRaw, kernels.BF16, experts, hidden, inter)}
	}
	def := openBackend(Options{GEMM: GEMMRound, MoEGEMMPairs: 1, DisableMoEWGMMA: true})
	wgmma := openBackend(Options{GEMM: GEMMRound, MoEGEMMPairs: 1})
	noGEMM := openBackend(Options{GEMM: GEMMRound, MoEGEMMPairs: -1})
	r := rand.New(rand.NewPCG(2048, 1408))
	for _, tokens := range []int{1, 8, 64, 256, 1024, 4096} {
		b.Run(fmt.Sprintf("v2lite/tokens=%d", tokens), func(b *testing.B) {
			pairs := tokens * topK
			x := kernels.F32Bytes(randVals(r, tokens*hidden, 1))
			ids := kernels.I32Bytes(randExpertIDs(r, tokens, topK, experts))
			w := kernels.F32Bytes(randVals(r, pairs, 0.3))
			flops := 2 * 3 * float64(pairs) * hidden * inter
			call := func(be backend) (kernels.Tensor, func() error) {
				g := be.g
				xt := upload(b, g, kernels.F32, x, kernels.F32, tokens, hidden)
				it := upload(b, g, kernels.I32, ids, kernels.I32, tokens, topK)
				wt := upload(b, g, kernels.F32, w, kernels.F32, tokens, topK)
				out, err := g.Alloc(kernels.F32, tokens, hidden)
				if err != nil {
					b.Fatal(err)
				}
				return out, func() error { return g.MoE(out, xt, it, wt, be.gu, be.dn) }
			}
			outG, runG := call(def)
			msG := timeIt(b, def.g, 10, runG)
			gemm := moeDownload(b, def.g, outG)
			outW, runW := call(wgmma)
			msW := timeIt(b, wgmma.g, 10, runW)
			wgOut := moeDownload(b, wgmma.g, outW)
			outH, runH := call(noGEMM)
			msH := timeIt(b, noGEMM.g, 10, runH)
			host := moeDownload(b, noGEMM.g, outH)
			graph, err := noGEMM.g.CaptureGraph(runH) // inside a graph: the small batches' kernels
			if err != nil {
				b.Fatal(err)
			}
			msS := timeIt(b, noGEMM.g, 10, graph.Replay)
			small := moeDownload(b, noGEMM.g, outH)
			graph.Close()
			same := "same bits as gemm"
			if i, ok := moeEqual(small, gemm); !ok {
				same = fmt.Sprintf("BITS DIFFER from gemm at %d", i)
			}
			tf := func(ms float64) float64 { return flops / (ms / 1e3) / 1e12 }
			b.ReportMetric(tf(msG), "gemm-TFLOP/s")
			b.ReportMetric(tf(msW), "wgmma-TFLOP/s")
			b.ReportMetric(tf(msH), "host-TFLOP/s")
			b.ReportMetric(tf(msS), "small-TFLOP/s")
			// The floor: every expert with a pair read once at the copy bandwidth.
			used := map[int32]bool{}
			for _, id := range kernels.BytesI32(ids) {
				used[id] = true
			}
			floorMs := float64(len(used)) * 3 * hidden * inter * 2 / deviceCopyBandwidth * 1e3
			b.ReportMetric(msS/floorMs, "small-x-floor")
			b.Logf("moe prefill | v2lite tokens=%d pairs=%d experts used %d (floor %.3f ms) | gemm %.3f ms %.1f TFLOP/s %.2fx floor | wgmma %.3f ms %.1f TFLOP/s (%.2fx gemm's speed; max rel diff %.2g; output fnv64a %016x) | eager default path (host above 1024 pairs) %.3f ms %.1f TFLOP/s (gemm %.2fx faster; max rel diff %.2g) | small kernels (graph) %.3f ms %.1f TFLOP/s %.2fx floor, %s",
				tokens, pairs, len(used), floorMs, msG, tf(msG), msG/floorMs, msW, tf(msW), msG/msW, maxRelErr(wgOut, gemm), fnvF32(wgOut),
				msH, tf(msH), msH/msG, maxRelErr(host, gemm), msS, tf(msS), msS/floorMs, same)
		})
	}
}

// fnvF32 is the FNV-1a hash of v's bits: a fingerprint to compare one
// kernel's output across builds of the library.
func fnvF32(v []float32) uint64 {
	h := fnv.New64a()
	h.Write(kernels.F32Bytes(v))
	return h.Sum64()
}

// MoE takes x rounded already to its 16-bit experts' dtype in GEMM mode
// round (kernels.MoERoundedShapes: a model's norm writes x so where
// LinearInputDType and MoEInputDType (unless Options.DisableMoERoundedInput) say
// that the MoE's input projections round it), with
// the bits of the same call on x in float32, on every path that serves 16-
// bit experts: the decode kernels (24 pairs), the grouped GEMM on wgmma
// and on mma.sync (3000 pairs), the host path (1800 pairs, MoEGEMMPairs
// -1), also with the shared experts' addend (MoEAdd). Split mode, which
// rounds no x, and an x of the other 16-bit dtype are refused.
func TestGPUMoERoundedInput(t *testing.T) {
	const hidden, inter = 256, 192
	cases := []struct {
		name                  string
		opts                  Options
		tokens, topK, experts int
	}{
		{"decode", Options{GEMM: GEMMRound}, 4, 6, 16},
		{"wgmma", Options{GEMM: GEMMRound}, 500, 6, 16},
		{"mma", Options{GEMM: GEMMRound, DisableMoEWGMMA: true}, 500, 6, 16},
		{"host", Options{GEMM: GEMMRound, MoEGEMMPairs: -1}, 300, 6, 16},
	}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/%s", dt, c.name), func(t *testing.T) {
				g := newGPUOpts(t, c.opts)
				r := rand.New(rand.NewPCG(uint64(c.tokens), uint64(dt)))
				d := newMoEData(r, dt, c.tokens, c.topK, c.experts, hidden, inter, randExpertIDs(r, c.tokens, c.topK, c.experts))
				m := d.upload(t, g)
				add := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, c.tokens*hidden, 1)), kernels.F32, c.tokens, hidden)
				xr := upload(t, g, dt, hostBytes(dt, kernels.BytesF32(d.x)), dt, c.tokens, hidden)
				for _, withAdd := range []bool{false, true} {
					run := func(x kernels.Tensor) []float32 {
						out, err := g.Alloc(kernels.F32, c.tokens, hidden)
						if err != nil {
							t.Fatal(err)
						}
						if withAdd {
							err = g.MoEAdd(out, x, m.ids, m.w, m.gu, m.dn, add)
						} else {
							err = g.MoE(out, x, m.ids, m.w, m.gu, m.dn)
						}
						if err != nil {
							t.Fatal(err)
						}
						return moeDownload(t, g, out)
					}
					want, got := run(m.x), run(xr)
					if i, ok := moeEqual(got, want); !ok {
						t.Fatalf("add %v: out[%d] = %v from x rounded, %v from x in float32", withAdd, i, got[i], want[i])
					}
				}
			})
		}
	}
	t.Run("input_dtype", func(t *testing.T) {
		for _, c := range []struct {
			opts Options
			w    kernels.DType
			want kernels.DType
		}{
			{Options{GEMM: GEMMRound}, kernels.BF16, kernels.BF16},
			{Options{GEMM: GEMMRound, DisableMoERoundedInput: true}, kernels.BF16, kernels.F32},
			{Options{GEMM: GEMMRound}, kernels.F16, kernels.F16},
			{Options{GEMM: GEMMRound}, kernels.F8E4M3, kernels.F32},
			{Options{GEMM: GEMMSplit}, kernels.BF16, kernels.F32},
		} {
			g := newGPUOpts(t, c.opts)
			if got := g.MoEInputDType(c.w, 4096); got != c.want {
				t.Errorf("%+v: MoEInputDType(%v) = %v, want %v", c.opts, c.w, got, c.want)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		d := newMoEData(r, kernels.BF16, 4, 2, 8, hidden, inter, randExpertIDs(r, 4, 2, 8))
		for _, c := range []struct {
			name string
			mode GEMMMode
			xdt  kernels.DType
			want string
		}{{"split", GEMMSplit, kernels.BF16, "rounds no x"}, {"f16_x", GEMMRound, kernels.F16, "moe: x is"}} {
			g := newGPUOpts(t, Options{GEMM: c.mode})
			m := d.upload(t, g)
			xr := upload(t, g, c.xdt, hostBytes(c.xdt, kernels.BytesF32(d.x)), c.xdt, d.tokens, hidden)
			err := g.MoE(m.out, xr, m.ids, m.w, m.gu, m.dn)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: MoE with x %v: error %v, want one that says %q", c.name, c.xdt, err, c.want)
			}
		}
	})
}
