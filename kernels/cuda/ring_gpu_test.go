package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// ringCase is one configuration of TestGPURingAttention.
type ringCase struct {
	cache, input kernels.DType // cache element type; AttentionParams.InputDType
	nh, nkv, d   int
	window       int
	sinks        bool
}

// TestGPURingAttention runs sequences through steps of decode rows, short
// chunks and chunks longer than the window (alone and mixed in one batch)
// three ways: the CUDA paged attention with SlidingWindow = window, the
// CUDA RingAttention over ring buffers written through kernels.RingSlots
// (-1 rows skipped), and the CPU backend's RingAttention. Ring and paged
// on the GPU give the same bits at every step (F32, half and 8-bit
// caches; float32 and tensor-core kernels; with and without sinks), the
// GPU agrees with the CPU within the kernels' tolerance, and the GPU's
// rings hold the CPU's bytes after every step (F32 and 8-bit caches, the
// CPU's types).
func TestGPURingAttention(t *testing.T) {
	cases := []ringCase{
		{kernels.F32, kernels.F32, 8, 2, 64, 37, false},
		{kernels.F32, kernels.F32, 4, 1, 256, 19, true}, // Gemma-like head size: plain prefill kernel
		{kernels.F32, kernels.BF16, 8, 2, 64, 37, true}, // tensor cores over a float32 cache
		{kernels.F16, kernels.BF16, 8, 2, 64, 37, false},
		{kernels.F16, kernels.BF16, 8, 1, 64, 128, true}, // gpt-oss-like: GQA prefill kernel, group 8
		{kernels.F16, kernels.BF16, 4, 2, 128, 37, true},
		{kernels.F8E4M3, kernels.BF16, 8, 2, 64, 37, true},
		{kernels.F8E4M3, kernels.F32, 6, 2, 96, 50, false}, // float32 prefill kernel
	}
	for _, rc := range cases {
		name := fmt.Sprintf("%v_in%v_h%d_kv%d_d%d_w%d_sinks%v", rc.cache, rc.input, rc.nh, rc.nkv, rc.d, rc.window, rc.sinks)
		t.Run(name, func(t *testing.T) { runRingCase(t, rc) })
	}
}

func runRingCase(t *testing.T, rc ringCase) {
	const blockSize, numBlocks, numSlots, maxBlocksPerSeq = 16, 256, 5, 40
	p := newPair(t, GEMMRound)
	kvw := rc.nkv * rc.d
	cpuToo := rc.cache != kernels.F16 // the CPU backend keeps F32 and 8-bit caches
	ap := kernels.AttentionParams{NumHeads: rc.nh, NumKVHeads: rc.nkv, HeadDim: rc.d, Scale: float32(1 / math.Sqrt(float64(rc.d))),
		SlidingWindow: rc.window, InputDType: rc.input}
	if rc.sinks {
		s := p.rand(kernels.F32, 3, rc.nh)
		ap.Sinks = s.g
	}
	apc := ap
	if rc.sinks {
		apc.Sinks = p.put(kernels.F32, p.f32(p.g, ap.Sinks), rc.nh).c
	}
	kc, vc := p.zeros(rc.cache, numBlocks, blockSize, kvw), p.zeros(rc.cache, numBlocks, blockSize, kvw)
	kr, vr := p.zeros(rc.cache, numSlots, rc.window, kvw), p.zeros(rc.cache, numSlots, rc.window, kvw)
	slots := []int32{4, 1, 2}
	perm := p.r.Perm(numBlocks)
	var tables [][]int32
	for s := range slots {
		var tb []int32
		for j := range maxBlocksPerSeq {
			tb = append(tb, int32(perm[s*maxBlocksPerSeq+j]))
		}
		tables = append(tables, tb)
	}
	done := []int{0, 0, 0}
	// Per step, the new tokens of each sequence (0: not in the step).
	steps := [][]int{{3, 150, 1}, {1, 1, 9}, {1, 1, 1}, {90, 2, 1}, {1, 0, 1}, {1, 1, 1}, {8, 0, 200}, {1, 1, 1}, {1, 1, 0}}
	tol := 2e-5
	if rc.input != kernels.F32 {
		tol = 2e-2 // q, k, v and the probabilities in half precision on the tensor cores
	}
	for si, st := range steps {
		var cu, seqK, sm, stSlots, newPer, bt []int32
		cu = append(cu, 0)
		n, maxQ, maxK := 0, 0, 0
		for s, q := range st {
			if q == 0 {
				continue
			}
			for pos := done[s]; pos < done[s]+q; pos++ {
				sm = append(sm, tables[s][pos/blockSize]*blockSize+int32(pos%blockSize))
			}
			n += q
			cu = append(cu, int32(n))
			seqK = append(seqK, int32(done[s]+q))
			bt = append(bt, tables[s]...)
			stSlots = append(stSlots, slots[s])
			newPer = append(newPer, int32(q))
			done[s] += q
			maxQ, maxK = max(maxQ, q), max(maxK, done[s])
		}
		ns := len(seqK)
		cuT, skT, btT, smT := p.ints(cu, ns+1), p.ints(seqK, ns), p.ints(bt, ns, maxBlocksPerSeq), p.ints(sm, n)
		meta := func(pick func(dual) kernels.Tensor) kernels.AttentionMetadata {
			return kernels.AttentionMetadata{NumSeqs: ns, NumTokens: n, MaxSeqlenQ: maxQ, MaxSeqlenK: maxK, BlockSize: blockSize,
				CuSeqlensQ: pick(cuT), SeqlensK: pick(skT), BlockTables: pick(btT), SlotMapping: pick(smT)}
		}
		mc, mg := meta(func(d dual) kernels.Tensor { return d.c }), meta(func(d dual) kernels.Tensor { return d.g })
		q := p.rand(kernels.F32, 1, n, rc.nh*rc.d)
		k, v := p.rand(kernels.F32, 1, n, kvw), p.rand(kernels.F32, 1, n, kvw)
		sl := p.ints(stSlots, ns)
		rs := p.ints(kernels.RingSlots(stSlots, seqK, newPer, rc.window), n)

		// Paged on the GPU.
		if err := p.g.WriteCache(kc.g, k.g, smT.g, 0); err != nil {
			t.Fatal(err)
		}
		if err := p.g.WriteCache(vc.g, v.g, smT.g, 0); err != nil {
			t.Fatal(err)
		}
		paged := p.zeros(kernels.F32, n, rc.nh*rc.d)
		p.poison(paged)
		if err := p.g.Attention(paged.g, q.g, kc.g, vc.g, &mg, ap); err != nil {
			t.Fatal(err)
		}
		// Ring on both backends, then the ring writes.
		out := p.zeros(kernels.F32, n, rc.nh*rc.d)
		p.poison(out)
		if err := p.g.RingAttention(out.g, q.g, k.g, v.g, kr.g, vr.g, sl.g, &mg, ap); err != nil {
			t.Fatal(err)
		}
		if cpuToo {
			if err := p.c.RingAttention(out.c, q.c, k.c, v.c, kr.c, vr.c, sl.c, &mc, apc); err != nil {
				t.Fatal(err)
			}
		}
		for _, w := range []struct{ c, x dual }{{kr, k}, {vr, v}} {
			if err := p.g.WriteCache(w.c.g, w.x.g, rs.g, 0); err != nil {
				t.Fatal(err)
			}
			if cpuToo {
				if err := p.c.WriteCache(w.c.c, w.x.c, rs.c, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, want := p.f32(p.g, out.g), p.f32(p.g, paged.g)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("step %d %v: element %d (row %d): ring %g, paged %g", si, st, i, i/(rc.nh*rc.d), got[i], want[i])
			}
		}
		if cpuToo {
			e := p.check(fmt.Sprintf("step %d ring attention vs cpu", si), out, tol)
			if si == len(steps)-1 {
				t.Logf("max relative error vs the CPU backend (last step) %.2e", e)
			}
			for _, r := range []dual{kr, vr} {
				gb, cb := p.raw(p.g, r.g), p.raw(p.c, r.c)
				for i := range cb {
					if gb[i] != cb[i] {
						t.Fatalf("step %d: ring byte %d: gpu %#x, cpu %#x", si, i, gb[i], cb[i])
					}
				}
			}
		}
	}
}

// TestGPURingAttentionGraph captures a decode step's RingAttention in a
// CUDA graph (no host reads) and replays it: the bits of the eager call.
func TestGPURingAttentionGraph(t *testing.T) {
	const nh, nkv, d, window, numSlots = 8, 2, 64, 40, 3
	p := newPair(t, GEMMRound)
	kvw := nkv * d
	kr, vr := p.rand(kernels.F16, 1, numSlots, window, kvw), p.rand(kernels.F16, 1, numSlots, window, kvw)
	seqK := []int32{300, 7, 41}
	m := kernels.AttentionMetadata{NumSeqs: 3, NumTokens: 3, MaxSeqlenQ: 1, MaxSeqlenK: 512, BlockSize: 16,
		CuSeqlensQ: p.ints([]int32{0, 1, 2, 3}, 4).g, SeqlensK: p.ints(seqK, 3).g}
	ap := kernels.AttentionParams{NumHeads: nh, NumKVHeads: nkv, HeadDim: d, Scale: 0.125, SlidingWindow: window,
		InputDType: kernels.BF16, Sinks: p.rand(kernels.F32, 2, nh).g}
	q := p.rand(kernels.F32, 1, 3, nh*d)
	k, v := p.rand(kernels.F32, 1, 3, kvw), p.rand(kernels.F32, 1, 3, kvw)
	sl := p.ints([]int32{2, 0, 1}, 3)
	eager := p.zeros(kernels.F32, 3, nh*d)
	if err := p.g.RingAttention(eager.g, q.g, k.g, v.g, kr.g, vr.g, sl.g, &m, ap); err != nil {
		t.Fatal(err)
	}
	replayed := p.zeros(kernels.F32, 3, nh*d)
	g, err := p.g.CaptureGraph(func() error {
		return p.g.RingAttention(replayed.g, q.g, k.g, v.g, kr.g, vr.g, sl.g, &m, ap)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	a, b := p.f32(p.g, eager.g), p.f32(p.g, replayed.g)
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("element %d: replay %g, eager %g", i, b[i], a[i])
		}
	}
}

// TestGPUAttentionSinks compares paged Attention with sink logits against
// the CPU backend: decode and prefill rows (chunked and whole), sliding
// window or not, the float32, tensor-core and plain kernels, half-precision
// output; the sinks change the result (a large sink logit takes most of
// the probability), and no sinks gives the bits of a call without them.
func TestGPUAttentionSinks(t *testing.T) {
	const blockSize, numBlocks = 16, 300
	seqs := [][2]int{{1, 700}, {100, 600}, {37, 37}, {1, 5}, {130, 130}}
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode)
		for _, ap := range []kernels.AttentionParams{
			{NumHeads: 16, NumKVHeads: 2, HeadDim: 64, InputDType: kernels.BF16, SlidingWindow: 128},
			{NumHeads: 8, NumKVHeads: 2, HeadDim: 128, InputDType: kernels.BF16},
			{NumHeads: 4, NumKVHeads: 1, HeadDim: 256, InputDType: kernels.BF16, SlidingWindow: 50},
			{NumHeads: 6, NumKVHeads: 3, HeadDim: 40},
		} {
			for _, cdt := range []kernels.DType{kernels.F32, kernels.F8E4M3} {
				ap := ap
				ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
				name := fmt.Sprintf("%s/h%d_kv%d_d%d_w%d_%v", mode, ap.NumHeads, ap.NumKVHeads, ap.HeadDim, ap.SlidingWindow, cdt)
				t.Run(name, func(t *testing.T) {
					b := p.pagedBatch(blockSize, numBlocks, seqs)
					width := ap.NumKVHeads * ap.HeadDim
					kc, vc := p.rand(cdt, 1, numBlocks, blockSize, width), p.rand(cdt, 1, numBlocks, blockSize, width)
					w := ap.NumHeads * ap.HeadDim
					q := p.rand(kernels.F32, 2, b.numTokens, w)
					sinkVals := randVals(p.r, ap.NumHeads, 4)
					sinkVals[0] = 30 // takes nearly all of head 0's probability
					s := p.put(kernels.F32, sinkVals, ap.NumHeads)
					plain := p.zeros(kernels.F32, b.numTokens, w)
					if err := p.g.Attention(plain.g, q.g, kc.g, vc.g, &b.gpuMeta, ap); err != nil {
						t.Fatal(err)
					}
					apc, apg := ap, ap
					apc.Sinks, apg.Sinks = s.c, s.g
					out := p.zeros(kernels.F32, b.numTokens, w)
					p.poison(out)
					if err := p.c.Attention(out.c, q.c, kc.c, vc.c, &b.cpuMeta, apc); err != nil {
						t.Fatal(err)
					}
					if err := p.g.Attention(out.g, q.g, kc.g, vc.g, &b.gpuMeta, apg); err != nil {
						t.Fatal(err)
					}
					tol := 1e-5
					if mode == GEMMRound && (ap.HeadDim == 64 || ap.HeadDim == 128) {
						tol = 1e-2
					}
					e := p.check("attention with sinks", out, tol)
					t.Logf("max relative error vs the CPU backend %.2e", e)
					a, c := p.f32(p.g, out.g), p.f32(p.g, plain.g)
					differ := false
					for i := range a {
						differ = differ || a[i] != c[i]
					}
					if !differ {
						t.Error("the sinks changed nothing")
					}
					// A 16-bit output holds the float32 results rounded.
					o16 := p.zeros(kernels.BF16, b.numTokens, w)
					if err := p.g.Attention(o16.g, q.g, kc.g, vc.g, &b.gpuMeta, apg); err != nil {
						t.Fatal(err)
					}
					h := p.raw(p.g, o16.g)
					for i, x := range a {
						if got, want := uint16(h[2*i])|uint16(h[2*i+1])<<8, kernels.F32ToBF16(x); got != want {
							t.Fatalf("bf16 output element %d: %#x, want %#x (%g rounded)", i, got, want, x)
						}
					}
				})
			}
		}
	}
}
