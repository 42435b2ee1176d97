package cpu

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// TestRingAttentionMatchesPaged runs the same sequences through paged
// sliding-window Attention and through RingAttention over ring buffers
// (history from earlier steps, the step's keys from k and v, then the ring
// write by kernels.RingSlots): every step's output is the same bits, for
// chunks shorter and longer than the window, decode rows, F32, F16 and E4M3
// caches, several sequences in arbitrary slots.
func TestRingAttentionMatchesPaged(t *testing.T) {
	const nh, nkv, d, window, blockSize, numBlocks, numSlots = 4, 2, 16, 7, 4, 64, 5
	kvw := nkv * d
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.F8E4M3} {
		b := newTestBackend(t, 3)
		r := rand.New(rand.NewPCG(1, 2))
		kc, vc := allocDT(t, b, dt, numBlocks, blockSize, kvw), allocDT(t, b, dt, numBlocks, blockSize, kvw)
		kr, vr := allocDT(t, b, dt, numSlots, window, kvw), allocDT(t, b, dt, numSlots, window, kvw)
		slots := []int32{4, 1, 2}
		perm := r.Perm(numBlocks)
		tables := [][]int32{}
		for s := range slots {
			var tb []int32
			for j := range 16 {
				tb = append(tb, int32(perm[s*16+j]))
			}
			tables = append(tables, tb)
		}
		done := []int{0, 0, 0}
		// Per step, the new tokens of each sequence (0: not in the step).
		steps := [][]int{{3, 20, 1}, {1, 1, 9}, {15, 2, 1}, {1, 1, 1}, {8, 0, 30}, {1, 1, 1}}
		p := kernels.AttentionParams{NumHeads: nh, NumKVHeads: nkv, HeadDim: d, Scale: 0.25, SlidingWindow: window}
		for si, st := range steps {
			var cu, seqK, sm, stSlots, newPer []int32
			var bt []int32
			cu = append(cu, 0)
			n := 0
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
			}
			ns := len(seqK)
			m := &kernels.AttentionMetadata{NumSeqs: ns, NumTokens: n, BlockSize: blockSize,
				CuSeqlensQ: putI32(t, b, cu, ns+1), SeqlensK: putI32(t, b, seqK, ns),
				BlockTables: putI32(t, b, bt, ns, 16), SlotMapping: putI32(t, b, sm, n)}
			q := put(t, b, kernels.F32, randVals(r, n*nh*d, 1), n, nh*d)
			k := put(t, b, kernels.F32, randVals(r, n*kvw, 1), n, kvw)
			v := put(t, b, kernels.F32, randVals(r, n*kvw, 1), n, kvw)
			if err := b.WriteCache(kc, k, m.SlotMapping, 0); err != nil {
				t.Fatal(err)
			}
			if err := b.WriteCache(vc, v, m.SlotMapping, 0); err != nil {
				t.Fatal(err)
			}
			want, got := alloc(t, b, n, nh*d), alloc(t, b, n, nh*d)
			if err := b.Attention(want, q, kc, vc, m, p); err != nil {
				t.Fatal(err)
			}
			if err := b.RingAttention(got, q, k, v, kr, vr, putI32(t, b, stSlots, ns), m, p); err != nil {
				t.Fatal(err)
			}
			rs := putI32(t, b, kernels.RingSlots(stSlots, seqK, newPer, window), n)
			if err := b.WriteCache(kr, k, rs, 0); err != nil {
				t.Fatal(err)
			}
			if err := b.WriteCache(vr, v, rs, 0); err != nil {
				t.Fatal(err)
			}
			for i, x := range vals(want) {
				if math.Float32bits(x) != math.Float32bits(vals(got)[i]) {
					t.Fatalf("%v step %d: element %d: ring %g, paged %g", dt, si, i, vals(got)[i], x)
				}
			}
		}
		// A slot outside the ring is refused.
		m := &kernels.AttentionMetadata{NumSeqs: 1, NumTokens: 1, BlockSize: blockSize,
			CuSeqlensQ: putI32(t, b, []int32{0, 1}, 2), SeqlensK: putI32(t, b, []int32{1}, 1),
			BlockTables: putI32(t, b, []int32{0}, 1, 1), SlotMapping: putI32(t, b, []int32{0}, 1)}
		one := func() kernels.Tensor { return alloc(t, b, 1, kvw) }
		err := b.RingAttention(alloc(t, b, 1, nh*d), alloc(t, b, 1, nh*d), one(), one(), kr, vr, putI32(t, b, []int32{numSlots}, 1), m, p)
		if !errors.Is(err, kernels.ErrOutOfRange) {
			t.Errorf("slot %d of %d: %v, want ErrOutOfRange", numSlots, numSlots, err)
		}
		p0 := p
		p0.SlidingWindow = window + 1
		if err := b.RingAttention(alloc(t, b, 1, nh*d), alloc(t, b, 1, nh*d), one(), one(), kr, vr, putI32(t, b, []int32{0}, 1), m, p0); !errors.Is(err, kernels.ErrShape) {
			t.Errorf("window %d over rings of %d: %v, want ErrShape", window+1, window, err)
		}
	}
}

func TestRingSlots(t *testing.T) {
	// Slot 2, window 4: 6 new tokens at positions 3..8 keep the last 4;
	// slot 0: one token at position 9.
	got := kernels.RingSlots([]int32{2, 0}, []int32{9, 10}, []int32{6, 1}, 4)
	want := []int32{-1, -1, 8 + 1, 8 + 2, 8 + 3, 8 + 0, 1}
	if len(got) != len(want) {
		t.Fatalf("%v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%v, want %v", got, want)
		}
	}
}

func TestGemmaOps(t *testing.T) {
	b := newTestBackend(t, 2)
	x := put(t, b, kernels.F32, []float32{-3, -0.5, 0, 0.5, 2, 40}, 1, 6)
	out := alloc(t, b, 1, 3)
	if err := b.GELUTanhMul(out, x); err != nil {
		t.Fatal(err)
	}
	for j, g := range []float64{-3, -0.5, 0} {
		up := []float64{0.5, 2, 40}[j]
		want := 0.5 * g * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(g+0.044715*g*g*g))) * up
		if d := math.Abs(float64(vals(out)[j]) - want); d > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("gelu_tanh(%g)*%g = %g, want %g", g, up, vals(out)[j], want)
		}
	}
	if err := b.Scale(x, x, 2); err != nil {
		t.Fatal(err)
	}
	if vals(x)[0] != -6 || vals(x)[5] != 80 {
		t.Errorf("scale: %v", vals(x))
	}
	if err := b.Softcap(x, 10); err != nil {
		t.Fatal(err)
	}
	if got, want := vals(x)[5], float32(10*math.Tanh(8)); math.Abs(float64(got-want)) > 1e-5 {
		t.Errorf("softcap(80, 10) = %g, want %g", got, want)
	}
	if err := b.Softcap(x, 0); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("cap 0: %v, want ErrShape", err)
	}
}
