package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// sinkRef is causal GQA attention with per-head sink logits in float64:
// the sink joins the softmax denominator (after the max over scores and
// sink is subtracted) and contributes no value.
func sinkRef(q, k, v []float32, seqLens []int, nh, nkv, d, window int, scale float64, sinks []float32) []float32 {
	out := make([]float32, len(q))
	kvw, group := nkv*d, nh/nkv
	start := 0
	for _, n := range seqLens {
		for i := range n {
			first := 0
			if window > 0 {
				first = max(0, i+1-window)
			}
			for h := range nh {
				qi := q[(start+i)*nh*d+h*d:][:d]
				kh := (h / group) * d
				logits := []float64{}
				for j := first; j <= i; j++ {
					var s float64
					for e := range d {
						s += float64(qi[e]) * float64(k[(start+j)*kvw+kh+e])
					}
					logits = append(logits, s*scale)
				}
				m := float64(sinks[h])
				for _, l := range logits {
					m = math.Max(m, l)
				}
				den := math.Exp(float64(sinks[h]) - m)
				for _, l := range logits {
					den += math.Exp(l - m)
				}
				for e := range d {
					var acc float64
					for jj, l := range logits {
						acc += math.Exp(l-m) * float64(v[(start+first+jj)*kvw+kh+e])
					}
					out[(start+i)*nh*d+h*d+e] = float32(acc / den)
				}
			}
		}
		start += n
	}
	return out
}

// TestAttentionSinks checks paged Attention and RingAttention with sinks
// against the float64 reference (full and sliding window, sinks far above
// and below the scores), their identity, and batch invariance: a
// sequence's rows are the same bits alone and beside another sequence.
func TestAttentionSinks(t *testing.T) {
	const nh, nkv, d, blockSize, numBlocks = 4, 2, 16, 4, 32
	kvw := nkv * d
	b := newTestBackend(t, 3)
	r := rand.New(rand.NewPCG(3, 4))
	lens := []int{11, 6}
	n := lens[0] + lens[1]
	qv, kv, vv := randVals(r, n*nh*d, 1), randVals(r, n*kvw, 1), randVals(r, n*kvw, 1)
	sinks := []float32{-3, 0.5, 40, 1.5} // head 2's sink dwarfs every score
	run := func(window int, seqs []int) (paged, ring []float32) {
		// seqs: which of the two sequences are in the batch.
		var cu, seqK, sm, bt, slots []int32
		var q, k, v []float32
		cu = append(cu, 0)
		tot := 0
		for _, s := range seqs {
			off := 0
			if s == 1 {
				off = lens[0]
			}
			for pos := range lens[s] {
				sm = append(sm, int32(s*16*blockSize+pos))
			}
			q = append(q, qv[off*nh*d:(off+lens[s])*nh*d]...)
			k = append(k, kv[off*kvw:(off+lens[s])*kvw]...)
			v = append(v, vv[off*kvw:(off+lens[s])*kvw]...)
			tot += lens[s]
			cu = append(cu, int32(tot))
			seqK = append(seqK, int32(lens[s]))
			for j := range 16 {
				bt = append(bt, int32(s*16+j))
			}
			slots = append(slots, int32(s))
		}
		ns := len(seqs)
		m := &kernels.AttentionMetadata{NumSeqs: ns, NumTokens: tot, BlockSize: blockSize,
			CuSeqlensQ: putI32(t, b, cu, ns+1), SeqlensK: putI32(t, b, seqK, ns),
			BlockTables: putI32(t, b, bt, ns, 16), SlotMapping: putI32(t, b, sm, tot)}
		p := kernels.AttentionParams{NumHeads: nh, NumKVHeads: nkv, HeadDim: d, Scale: 0.25, SlidingWindow: window,
			Sinks: put(t, b, kernels.F32, sinks, nh)}
		kc, vc := alloc(t, b, numBlocks, blockSize, kvw), alloc(t, b, numBlocks, blockSize, kvw)
		kt, vt := put(t, b, kernels.F32, k, tot, kvw), put(t, b, kernels.F32, v, tot, kvw)
		if err := b.WriteCache(kc, kt, m.SlotMapping, 0); err != nil {
			t.Fatal(err)
		}
		if err := b.WriteCache(vc, vt, m.SlotMapping, 0); err != nil {
			t.Fatal(err)
		}
		qt := put(t, b, kernels.F32, q, tot, nh*d)
		po := alloc(t, b, tot, nh*d)
		if err := b.Attention(po, qt, kc, vc, m, p); err != nil {
			t.Fatal(err)
		}
		if window == 0 {
			return vals(po), nil
		}
		kr, vr := alloc(t, b, 2, window, kvw), alloc(t, b, 2, window, kvw)
		ro := alloc(t, b, tot, nh*d)
		if err := b.RingAttention(ro, qt, kt, vt, kr, vr, putI32(t, b, slots, ns), m, p); err != nil {
			t.Fatal(err)
		}
		return vals(po), vals(ro)
	}
	for _, window := range []int{0, 3} {
		paged, ring := run(window, []int{0, 1})
		want := sinkRef(qv, kv, vv, lens, nh, nkv, d, window, 0.25, sinks)
		checkClose(t, "paged attention with sinks", paged, want, 1e-5)
		if window > 0 {
			checkIdentical(t, "ring vs paged attention with sinks", ring, paged)
		}
		alone, _ := run(window, []int{0})
		checkIdentical(t, "sequence 0 alone vs batched", alone, paged[:lens[0]*nh*d])
		// Head 2's sink takes nearly all the mass: its output is near 0.
		for i := range n {
			for e := range d {
				if x := paged[i*nh*d+2*d+e]; math.Abs(float64(x)) > 1e-10 {
					t.Fatalf("window %d row %d: head 2 output %g, want ~0 under a sink of 40", window, i, x)
				}
			}
		}
	}
	// A wrongly shaped sink vector is refused.
	m := &kernels.AttentionMetadata{NumSeqs: 1, NumTokens: 1, BlockSize: blockSize,
		CuSeqlensQ: putI32(t, b, []int32{0, 1}, 2), SeqlensK: putI32(t, b, []int32{1}, 1),
		BlockTables: putI32(t, b, make([]int32, 16), 1, 16), SlotMapping: putI32(t, b, []int32{0}, 1)}
	p := kernels.AttentionParams{NumHeads: nh, NumKVHeads: nkv, HeadDim: d, Scale: 0.25, Sinks: put(t, b, kernels.F32, sinks[:3], 3)}
	err := b.Attention(alloc(t, b, 1, nh*d), alloc(t, b, 1, nh*d), alloc(t, b, numBlocks, blockSize, kvw), alloc(t, b, numBlocks, blockSize, kvw), m, p)
	if err == nil {
		t.Error("Attention accepted 3 sinks for 4 heads")
	}
}
