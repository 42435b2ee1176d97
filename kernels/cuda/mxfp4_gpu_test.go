package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// MXFP4 expert weights on the device (mxfp4.go, mxfp4.cuh): the contract is
// the CPU backend's, the bits of the same call with the weights widened to
// BF16 (which holds every MXFP4 value exactly).

// randMXFP4Weight is a random MXFP4 weight of shape: random codes, scales
// 2^-10 to 2^-3 (weights of up to 0.75, a trained model's magnitudes, so
// that the gates fall inside the clamp) with a few blocks at the extremes
// 0 and 1 (subnormal values) and 125 and 126.
func randMXFP4Weight(r *rand.Rand, shape ...int) kernels.MXFP4Weight {
	w := mxfp4Weight(shape...)
	for i := range w.Blocks {
		w.Blocks[i] = byte(r.IntN(256))
	}
	for i := range w.Scales {
		w.Scales[i] = byte(117 + r.IntN(8))
		if r.IntN(16) == 0 {
			w.Scales[i] = []byte{0, 1, 125, 126}[r.IntN(4)]
		}
	}
	return w
}

// widenMXFP4Bytes is w widened to BF16 as the models widen it for backends
// without MXFP4 kernels (kernels.F32ToBF16 of kernels.MXFP4ToF32 per
// element), as BF16 bytes.
func widenMXFP4Bytes(w kernels.MXFP4Weight) []byte {
	k := w.Shape[len(w.Shape)-1]
	out := make([]byte, 4*len(w.Blocks))
	for i := range 2 * len(w.Blocks) {
		code := w.Blocks[i/2] >> (4 * (i % 2))
		v := kernels.MXFP4ToF32(code, w.Scales[(i/k)*(k/kernels.MXFP4BlockSize)+(i%k)/kernels.MXFP4BlockSize])
		binary.LittleEndian.PutUint16(out[2*i:], kernels.F32ToBF16(v))
	}
	return out
}

// mxfp4Dual is w as an MXFP4 weight on both backends of p.
func (p *pair) mxfp4Dual(w kernels.MXFP4Weight) dual {
	p.t.Helper()
	c, err := p.c.MXFP4Weight(w)
	if err != nil {
		p.t.Fatal(err)
	}
	g, err := p.g.MXFP4Weight(w)
	if err != nil {
		p.t.Fatal(err)
	}
	return dual{c, g}
}

// mxfp4SameBits fails unless got and want have identical bits.
func mxfp4SameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d is %g (%#08x), want bit-identical %g (%#08x)", what, i, got[i],
				math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// TestGPUMXFP4MoE runs gpt-oss's experts over MXFP4 weights on every path
// the BF16 call has (GEMM modes round and split; tensor-core projections,
// and the CUDA-core GEMVs with Options.DisableMoEMMA) at 1, 8, 64 and 1200
// (token, k) pairs (the last in two device chunks; passes of 8, 16 and 32
// rows on tensor cores, 1, 2 and 4 on the GEMV, several passes an expert
// from 64 pairs; gate/up rows of two full 512-column segments and a tail of
// 3 blocks, down rows of a tail alone): the bits of the same call over the
// weights widened to BF16, and the CPU backend's MXFP4 result within the
// bound of the BF16 expert test (TestGPUMoEClampedSwiGLU). At 64 pairs and
// more it also checks that token 3 alone gets its bits in the batch and
// that a captured graph replays the eager bits.
func TestGPUMXFP4MoE(t *testing.T) {
	const e, hidden, inter = 8, 1120, 160
	act := kernels.ClampedSwiGLU{Limit: 7, Alpha: 1.702}
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		for _, mma := range []bool{true, false} {
			p := newPairOpts(t, Options{GEMM: mode, DisableMoEMMA: !mma})
			guW, dnW := randMXFP4Weight(p.r, e, 2*inter, hidden), randMXFP4Weight(p.r, e, hidden, inter)
			gu, dn := p.mxfp4Dual(guW), p.mxfp4Dual(dnW)
			guB := upload(t, p.g, kernels.BF16, widenMXFP4Bytes(guW), kernels.BF16, e, 2*inter, hidden)
			dnB := upload(t, p.g, kernels.BF16, widenMXFP4Bytes(dnW), kernels.BF16, e, hidden, inter)
			gub, dnb := p.rand(kernels.F32, 1, e, 2*inter), p.rand(kernels.F32, 1, e, hidden)
			for _, sz := range []struct{ tokens, topK int }{{1, 1}, {2, 4}, {16, 4}, {300, 4}} {
				t.Run(fmt.Sprintf("%s/mma=%v/pairs=%d", mode, mma, sz.tokens*sz.topK), func(t *testing.T) {
					tokens, topK := sz.tokens, sz.topK
					x := p.rand(kernels.F32, 3, tokens, hidden)
					ids := p.ints(randExpertIDs(p.r, tokens, topK, e), tokens, topK)
					w := p.rand(kernels.F32, 1, tokens, topK)
					out := p.zeros(kernels.F32, tokens, hidden)
					p.poison(out)
					call := func(o, gate, down kernels.Tensor) {
						t.Helper()
						if err := p.g.MoEClampedSwiGLU(o, x.g, ids.g, w.g, gate, gub.g, down, dnb.g, act); err != nil {
							t.Fatal(err)
						}
					}
					call(out.g, gu.g, dn.g)
					if err := p.c.MoEClampedSwiGLU(out.c, x.c, ids.c, w.c, gu.c, gub.c, dn.c, dnb.c, act); err != nil {
						t.Fatal(err)
					}
					p.check("mxfp4 moe_clamped_swiglu vs cpu", out, 2*linearTol(kernels.BF16, mode))
					got := p.f32(p.g, out.g)
					wide := p.zeros(kernels.F32, tokens, hidden).g
					call(wide, guB, dnB)
					mxfp4SameBits(t, "MXFP4 vs the BF16 widening", got, p.f32(p.g, wide))
					if tokens*topK < 64 {
						return
					}
					// Token 3 alone: the bits it got in the batch.
					view := func(ten kernels.Tensor) kernels.Tensor {
						v, err := p.g.Rows(ten, 3, 4)
						if err != nil {
							t.Fatal(err)
						}
						return v
					}
					one := p.zeros(kernels.F32, 1, hidden).g
					if err := p.g.MoEClampedSwiGLU(one, view(x.g), view(ids.g), view(w.g), gu.g, gub.g, dn.g, dnb.g, act); err != nil {
						t.Fatal(err)
					}
					mxfp4SameBits(t, "token 3 alone", p.f32(p.g, one), got[3*hidden:4*hidden])
					// A captured graph replays the eager bits.
					replay := p.zeros(kernels.F32, tokens, hidden).g
					g, err := p.g.CaptureGraph(func() error {
						return p.g.MoEClampedSwiGLU(replay, x.g, ids.g, w.g, gu.g, gub.g, dn.g, dnb.g, act)
					})
					if err != nil {
						t.Fatal(err)
					}
					defer g.Close()
					if err := g.Replay(); err != nil {
						t.Fatal(err)
					}
					mxfp4SameBits(t, "graph replay", p.f32(p.g, replay), got)
				})
			}
		}
	}
}

// TestGPUMXFP4Layouts: the MXFP4 kernels against the BF16 widening, bit for
// bit, at row lengths that take every part of the device layout
// (mxfp4.cuh): whole 512-column segments only (512, 1024), gpt-oss's 2880
// (five segments and a tail of 10 blocks, where the GEMV's lanes read
// their second step's word), tails of 15 and 9 blocks (480, 800) and of one
// block after a segment (544); scales of 129 to 132 in one expert's blocks
// put its kernel blocks on the two-multiply widening among blocks that
// are not. Both GEMM modes, tensor cores and GEMV, 1, 3 and 20 tokens.
func TestGPUMXFP4Layouts(t *testing.T) {
	const e, topK = 4, 2
	act := kernels.ClampedSwiGLU{Limit: 7, Alpha: 1.702}
	for _, sh := range []struct{ hidden, inter int }{{512, 544}, {2880, 480}, {800, 1024}} {
		r := rand.New(rand.NewPCG(uint64(sh.hidden), uint64(sh.inter)))
		guW, dnW := randMXFP4Weight(r, e, 2*sh.inter, sh.hidden), randMXFP4Weight(r, e, sh.hidden, sh.inter)
		for _, w := range []kernels.MXFP4Weight{guW, dnW} {
			for i := range len(w.Scales) / e { // expert 1: some big scales (values up to 6 * 2^5)
				if r.IntN(8) == 0 {
					w.Scales[len(w.Scales)/e+i] = byte(129 + r.IntN(4))
				}
			}
		}
		for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
			for _, mma := range []bool{true, false} {
				g := newGPUOpts(t, Options{GEMM: mode, DisableMoEMMA: !mma})
				mx := func(w kernels.MXFP4Weight) kernels.Tensor {
					ten, err := g.MXFP4Weight(w)
					if err != nil {
						t.Fatal(err)
					}
					return ten
				}
				gu, dn := mx(guW), mx(dnW)
				guB := upload(t, g, kernels.BF16, widenMXFP4Bytes(guW), kernels.BF16, e, 2*sh.inter, sh.hidden)
				dnB := upload(t, g, kernels.BF16, widenMXFP4Bytes(dnW), kernels.BF16, e, sh.hidden, sh.inter)
				gub := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, e*2*sh.inter, 0.1)), kernels.F32, e, 2*sh.inter)
				dnb := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, e*sh.hidden, 0.1)), kernels.F32, e, sh.hidden)
				for _, tokens := range []int{1, 3, 20} {
					t.Run(fmt.Sprintf("hidden=%d/inter=%d/%s/mma=%v/tokens=%d", sh.hidden, sh.inter, mode, mma, tokens), func(t *testing.T) {
						x := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, tokens*sh.hidden, 1)), kernels.F32, tokens, sh.hidden)
						ids := upload(t, g, kernels.I32, kernels.I32Bytes(randExpertIDs(r, tokens, topK, e)), kernels.I32, tokens, topK)
						w := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, tokens*topK, 0.5)), kernels.F32, tokens, topK)
						run := func(gate, down kernels.Tensor) []float32 {
							t.Helper()
							out, err := g.Alloc(kernels.F32, tokens, sh.hidden)
							if err != nil {
								t.Fatal(err)
							}
							if err := g.MoEClampedSwiGLU(out, x, ids, w, gate, gub, down, dnb, act); err != nil {
								t.Fatal(err)
							}
							v, err := kernels.ToF32(g, out)
							if err != nil {
								t.Fatal(err)
							}
							return v
						}
						mxfp4SameBits(t, "MXFP4 vs the BF16 widening", run(gu, dn), run(guB, dnB))
					})
				}
			}
		}
	}
}

// TestGPUMXFP4AllScales: the widening in the kernels' registers gives the
// BF16 widening for every scale and code. Expert s (of 255) has every
// gate/up block under scale s and every down block under scale 7s mod 233;
// token s goes to expert s alone with x scaled by 2^(127 - s), so that each
// projection's terms are of one magnitude and the output stays finite
// (subnormal products included: a value widened wrong shows in its row's
// sum). Codes are random; under scales 253 and 254 only the magnitudes up
// to 1.5 are drawn, the larger ones being infinities there (the one case
// left out), and the down scales stop at 232, where the outputs would
// overflow. Both GEMM modes, tensor cores and GEMV.
func TestGPUMXFP4AllScales(t *testing.T) {
	const e, hidden, inter = 255, 64, 32
	act := kernels.ClampedSwiGLU{Limit: 1e4, Alpha: 1}
	r := rand.New(rand.NewPCG(11, 12))
	guW, dnW := mxfp4Weight(e, 2*inter, hidden), mxfp4Weight(e, hidden, inter)
	for _, w := range []kernels.MXFP4Weight{guW, dnW} {
		for i := range w.Blocks {
			w.Blocks[i] = byte(r.IntN(256))
		}
	}
	perGU, perDN := len(guW.Scales)/e, len(dnW.Scales)/e
	for s := range e {
		for i := range perGU {
			guW.Scales[s*perGU+i] = byte(s)
		}
		for i := range perDN {
			dnW.Scales[s*perDN+i] = byte(7 * s % 233)
		}
		if s >= 253 { // codes 0-3 and 8-11 only: finite under these scales
			per := len(guW.Blocks) / e
			for i := range per {
				guW.Blocks[s*per+i] &= 0xbb
			}
		}
	}
	xs := make([]float32, e*hidden)
	for i := range xs {
		xs[i] = float32(math.Ldexp(float64(r.Float32()*2-1)*0.1, 127-i/hidden))
	}
	ids, wts := make([]int32, e), make([]float32, e)
	for s := range e {
		ids[s], wts[s] = int32(s), 1
	}
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		for _, mma := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/mma=%v", mode, mma), func(t *testing.T) {
				g := newGPUOpts(t, Options{GEMM: mode, DisableMoEMMA: !mma})
				put := func(dt kernels.DType, raw []byte, shape ...int) kernels.Tensor {
					return upload(t, g, dt, raw, dt, shape...)
				}
				mx := func(w kernels.MXFP4Weight) kernels.Tensor {
					ten, err := g.MXFP4Weight(w)
					if err != nil {
						t.Fatal(err)
					}
					return ten
				}
				x, id, wt := put(kernels.F32, kernels.F32Bytes(xs), e, hidden), put(kernels.I32, kernels.I32Bytes(ids), e, 1),
					put(kernels.F32, kernels.F32Bytes(wts), e, 1)
				gub, dnb := put(kernels.F32, make([]byte, 4*e*2*inter), e, 2*inter), put(kernels.F32, make([]byte, 4*e*hidden), e, hidden)
				run := func(gu, dn kernels.Tensor) []float32 {
					out, err := g.Alloc(kernels.F32, e, hidden)
					if err != nil {
						t.Fatal(err)
					}
					if err := g.MoEClampedSwiGLU(out, x, id, wt, gu, gub, dn, dnb, act); err != nil {
						t.Fatal(err)
					}
					v, err := kernels.ToF32(g, out)
					if err != nil {
						t.Fatal(err)
					}
					return v
				}
				got := run(mx(guW), mx(dnW))
				want := run(put(kernels.BF16, widenMXFP4Bytes(guW), e, 2*inter, hidden), put(kernels.BF16, widenMXFP4Bytes(dnW), e, hidden, inter))
				for i, v := range want {
					if math.IsInf(float64(v), 0) || math.IsNaN(float64(v)) {
						t.Fatalf("BF16 widening: output %d (token %d) is %g: the test's magnitudes are off", i, i/hidden, v)
					}
				}
				mxfp4SameBits(t, "MXFP4 vs the BF16 widening", got, want)
			})
		}
	}
}

// TestGPUMXFP4Errors: MXFP4Weight's checks on a real device (a scale of
// 255, wrong code and scale counts), and MoEClampedSwiGLU refusing one
// MXFP4 and one BF16 expert weight; nothing is launched, and the backend
// stays usable.
func TestGPUMXFP4Errors(t *testing.T) {
	g := newGPU(t, GEMMRound)
	nan := mxfp4Weight(2, 64, 64)
	nan.Scales[7] = 0xff
	short := mxfp4Weight(2, 64, 64)
	short.Blocks = short.Blocks[:len(short.Blocks)-1]
	scales := mxfp4Weight(2, 64, 64)
	scales.Scales = append(scales.Scales, 127)
	for _, c := range []struct {
		name string
		w    kernels.MXFP4Weight
		want error
	}{{"NaN scale", nan, kernels.ErrDType}, {"short blocks", short, kernels.ErrShape}, {"extra scale", scales, kernels.ErrShape}} {
		if _, err := g.MXFP4Weight(c.w); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	gu, err := g.MXFP4Weight(mxfp4Weight(2, 128, 64))
	if err != nil {
		t.Fatal(err)
	}
	f32 := func(shape ...int) kernels.Tensor {
		ten, err := g.Alloc(kernels.F32, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return ten
	}
	dnB, err := g.Alloc(kernels.BF16, 2, 64, 64)
	if err != nil {
		t.Fatal(err)
	}
	ids := upload(t, g, kernels.I32, kernels.I32Bytes([]int32{1}), kernels.I32, 1, 1)
	act := kernels.ClampedSwiGLU{Limit: 7, Alpha: 1.702}
	if err := g.MoEClampedSwiGLU(f32(1, 64), f32(1, 64), ids, f32(1, 1), gu, f32(2, 128), dnB, f32(2, 64), act); !errors.Is(err, kernels.ErrDType) {
		t.Errorf("MXFP4 gate_up with BF16 down: %v, want ErrDType", err)
	}
	dn, err := g.MXFP4Weight(mxfp4Weight(2, 64, 64))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.MoEClampedSwiGLU(f32(1, 64), f32(1, 64), ids, f32(1, 1), gu, f32(2, 128), dn, f32(2, 64), act); err != nil {
		t.Errorf("valid MXFP4 call after the refusals: %v", err)
	}
	if err := g.Sync(); err != nil {
		t.Error(err)
	}
}

// BenchmarkGPUMXFP4MoE times gpt-oss-20B's experts (hidden 2880,
// intermediate 2880, 32 experts, top 4; random weights) at 1 and 64
// tokens, MXFP4 against BF16 (the weights widened), on the tensor-core
// projections (the default) and the CUDA-core GEMVs
// (Options.DisableMoEMMA). At one token each call takes the next of eight
// disjoint sets of four experts, so that every call reads its experts'
// weights from memory (the 32 experts: 423 MB in MXFP4, 1.59 GB in BF16,
// against a 50 MB L2); at 64 tokens the routing is random and reaches
// nearly every expert. Each line gives the time, the GB/s of weight bytes
// the call reads (the experts it uses: codes and scales for MXFP4, 4.25
// bits a weight; 2 bytes for BF16) and their share of the copy bandwidth
// measured in the same run (CopyRect on 1 GiB, read + written) and of the
// 4.2 TB/s the engine benchmarks take as the floor. One backend a path,
// each with 2 GB of weights (about 8 GB of device memory with the copy
// measurement's); its name keeps it out of the bench phase's default
// pattern (GPU): run it with -test.bench MXFP4MoE.
//
// Measured on the H200 with the first MXFP4 kernels (the 16-bit kernels
// templated over an MXFP4 weight source; copy 1694 GB/s in that run):
// mma 93.9 us (563 GB/s, 33% of copy) at 1 token, 555 us at 64; GEMV 145.8
// and 2526 us; BF16 116.9, 597.6, 112.9 and 2240 us. The MXFP4 kernels of
// moe.cu's MXFP4 section replaced them:
//   - the codes rearranged at upload (mxfp4.cuh): a lane's codes of a
//     512-column segment are one 16-byte (mma) or 8-byte (GEMV) copy, and
//     8 codes widen in 9 integer operations and 4 bf16x2 multiplies (was
//     about 19 and 4 with the prmt tables), the scale's power one integer
//     multiply-add: an mma step (16 rows by 32 columns, two mma.sync) is 45
//     instructions;
//   - a cp.async ring per warp (4 segments, 4 KB in flight a warp, about
//     100 KB a multiprocessor) with no barrier in the loop, where the
//     block used to wait at a barrier every 128 columns;
//   - blocks for the experts with rows only (grid y = min(experts, pairs)):
//     at 1 token 720 + 360 blocks, all with work, where 11520 + 5760 were
//     launched and 1440 + 720 had work;
//   - the gate/up activation and the down bias in the projections'
//     epilogues, and programmatic dependent launch: 5 kernels a call
//     instead of 7.
//
// Predicted: mma (the engine's path: the 16-bit call's choice, which MXFP4
// must follow for its bits) at 1 token 25-40 us, 1.3-2.1 TB/s, 80-125% of
// a 1694 GB/s copy figure (goal 70%), 3-4.5x BF16; at 64 tokens 150-220
// us, 2.7-4x BF16. GEMV at 1 token 30-45 us; at 64 tokens 350-500 us (two
// passes of 4 rows an expert, each widening to float32 again), 4.5-6x
// BF16's GEMV. BF16 unchanged.
func BenchmarkMXFP4MoE(b *testing.B) {
	const experts, topK, hidden, inter = 32, 4, 2880, 2880
	r := rand.New(rand.NewPCG(20, 20))
	// One expert's random weights, repeated for every expert (the values do
	// not change the time; generating 800M of them would).
	gu1, dn1 := randMXFP4Weight(r, 1, 2*inter, hidden), randMXFP4Weight(r, 1, hidden, inter)
	tile := func(w kernels.MXFP4Weight, n, k int) kernels.MXFP4Weight {
		out := kernels.MXFP4Weight{Shape: []int{experts, n, k}}
		for range experts {
			out.Blocks = append(out.Blocks, w.Blocks...)
			out.Scales = append(out.Scales, w.Scales...)
		}
		return out
	}
	guMX, dnMX := tile(gu1, 2*inter, hidden), tile(dn1, hidden, inter)
	guWide, dnWide := widenMXFP4Bytes(gu1), widenMXFP4Bytes(dn1)
	mxExpert := float64(len(gu1.Blocks)+len(gu1.Scales)+len(dn1.Blocks)+len(dn1.Scales)) / 1e9 // GB an expert
	bfExpert := float64(len(guWide)+len(dnWide)) / 1e9
	for _, mma := range []bool{true, false} {
		path := "mma"
		if !mma {
			path = "gemv"
		}
		g := newGPUOpts(b, Options{GEMM: GEMMRound, DisableMoEMMA: !mma})
		copyGBs := benchCopyBandwidth(b, g)
		gu, err := g.MXFP4Weight(guMX)
		if err != nil {
			b.Fatal(err)
		}
		dn, err := g.MXFP4Weight(dnMX)
		if err != nil {
			b.Fatal(err)
		}
		guB, err := g.Alloc(kernels.BF16, experts, 2*inter, hidden)
		if err != nil {
			b.Fatal(err)
		}
		dnB, err := g.Alloc(kernels.BF16, experts, hidden, inter)
		if err != nil {
			b.Fatal(err)
		}
		for x := range experts { // expert by expert: 50 MB of host bytes at a time
			for _, u := range []struct {
				w   kernels.Tensor
				raw []byte
			}{{guB, guWide}, {dnB, dnWide}} {
				v, err := g.Rows(u.w, x, x+1)
				if err != nil {
					b.Fatal(err)
				}
				if err := g.Upload(v, u.raw, kernels.BF16); err != nil {
					b.Fatal(err)
				}
			}
		}
		gub := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, experts*2*inter, 0.1)), kernels.F32, experts, 2*inter)
		dnb := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, experts*hidden, 0.1)), kernels.F32, experts, hidden)
		act := kernels.ClampedSwiGLU{Limit: 7, Alpha: 1.702}
		for _, tokens := range []int{1, 64} {
			b.Run(fmt.Sprintf("path=%s/tokens=%d", path, tokens), func(b *testing.B) {
				// sets of routing ids; the experts each set uses
				const sets = 8
				var idT []kernels.Tensor
				used := 0
				for s := range sets {
					ids := make([]int32, tokens*topK)
					seen := map[int32]bool{}
					for t := range tokens {
						perm := r.Perm(experts)
						for k := range topK {
							id := int32(perm[k])
							if tokens == 1 {
								id = int32((s*topK + k) % experts)
							}
							ids[t*topK+k] = id
							seen[id] = true
						}
					}
					used += len(seen)
					idT = append(idT, upload(b, g, kernels.I32, kernels.I32Bytes(ids), kernels.I32, tokens, topK))
				}
				usedMean := float64(used) / sets
				x := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, tokens*hidden, 1)), kernels.F32, tokens, hidden)
				w := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, tokens*topK, 0.3)), kernels.F32, tokens, topK)
				out, err := g.Alloc(kernels.F32, tokens, hidden)
				if err != nil {
					b.Fatal(err)
				}
				i := 0
				msMX := timeIt(b, g, 64, func() error {
					i++
					return g.MoEClampedSwiGLU(out, x, idT[i%sets], w, gu, gub, dn, dnb, act)
				})
				msBF := timeIt(b, g, 64, func() error {
					i++
					return g.MoEClampedSwiGLU(out, x, idT[i%sets], w, guB, gub, dnB, dnb, act)
				})
				gbMX, gbBF := usedMean*mxExpert/(msMX/1e3), usedMean*bfExpert/(msBF/1e3)
				b.ReportMetric(msMX*1e3, "mxfp4-us/op")
				b.ReportMetric(msBF*1e3, "bf16-us/op")
				b.ReportMetric(gbMX, "mxfp4-GB/s")
				b.Logf("mxfp4 | moe gpt-oss-20b experts, %s, tokens=%-2d (%.1f experts a call) | MXFP4 %7.1f us %5.0f GB/s = %3.0f%% of copy (%3.0f%% of 4.2 TB/s) | BF16 %7.1f us %5.0f GB/s = %3.0f%% of copy | MXFP4 speedup %.2fx | copy bandwidth in this run %.0f GB/s",
					path, tokens, usedMean, msMX*1e3, gbMX, 100*gbMX/copyGBs, 100*gbMX*1e9/deviceCopyBandwidth,
					msBF*1e3, gbBF, 100*gbBF/copyGBs, msBF/msMX, copyGBs)
			})
		}
	}
}
