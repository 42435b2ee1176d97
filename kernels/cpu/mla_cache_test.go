package cpu

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// TestMLAWUKCache: MLAAttention builds W_UK once per stored weight and
// reuses it. The kept values are those the per-call build computes (and
// those of the dequantized F32 weight, which is transposed per call), a
// second call and a call through a view give bit-identical outputs without
// a new entry, Upload over a BF16/F16 weight makes the next call use the
// new values, and concurrent first calls agree (also with a backend whose
// pooled scratch, from a one-row call, is too small for the batch).
func TestMLAWUKCache(t *testing.T) {
	const nh, nope, rope, kvl, vd, bs, numBlocks = 3, 8, 4, 32, 6, 4, 16
	rows := nh * (nope + vd)
	p := kernels.MLAParams{NumHeads: nh, NopeDim: nope, RopeDim: rope, KVLoraRank: kvl, VHeadDim: vd, Scale: 0.25}
	type weight struct {
		ten kernels.Tensor
		deq []float32
	}
	cases := []struct {
		name string
		make func(r *rand.Rand, b *Backend) weight
	}{
		{"bf16", func(r *rand.Rand, b *Backend) weight {
			v := roundTo(kernels.BF16, randVals(r, rows*kvl, 0.5))
			return weight{put(t, b, kernels.BF16, v, rows, kvl), v}
		}},
		{"f16", func(r *rand.Rand, b *Backend) weight {
			v := roundTo(kernels.F16, randVals(r, rows*kvl, 0.5))
			return weight{put(t, b, kernels.F16, v, rows, kvl), v}
		}},
		{"fp8", func(r *rand.Rand, b *Backend) weight {
			w, deq := randFP8(r, 8, 16, rows, kvl)
			return weight{fp8Tensor(t, b, w), deq}
		}},
		{"q8_0+q4_0", func(r *rand.Rand, b *Backend) weight {
			w, deq := randQuant(r, []int{rows, kvl}, []kernels.QuantType{kernels.QuantQ8_0, kernels.QuantQ4_0}, []int{rows - 10, 10})
			return weight{quantTensor(t, b, w), deq}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, 2)
			r := rand.New(rand.NewPCG(12, 28))
			specs := []seqSpec{{3, 5}, {1, 9}}
			m, slots := pagedBatch(t, b, r, specs, bs, numBlocks)
			cache := latentCache(t, b, r, specs, slots, numBlocks, bs, kvl+rope)
			q := put(t, b, kernels.F32, randVals(r, m.NumTokens*nh*(nope+rope), 1), m.NumTokens, nh*(nope+rope))
			mla := func(w kernels.Tensor) []float32 {
				t.Helper()
				out := alloc(t, b, m.NumTokens, nh*vd)
				if err := b.MLAAttention(out, q, cache, w, m, p); err != nil {
					t.Fatal(err)
				}
				return vals(out)
			}
			entries := func() int {
				b.mla.mu.Lock()
				defer b.mla.mu.Unlock()
				return len(b.mla.m)
			}

			w := tc.make(r, b)
			wt := w.ten.(*Tensor)
			first := mla(w.ten)
			if n := entries(); n != 1 {
				t.Fatalf("%d cache entries after the first call, want 1", n)
			}
			checkIdentical(t, "second call", mla(w.ten), first)
			view, err := b.Rows(w.ten, 0, rows)
			if err != nil {
				t.Fatal(err)
			}
			checkIdentical(t, "call through a view", mla(view), first)
			if n := entries(); n != 1 {
				t.Fatalf("%d cache entries after calls through the weight and a view, want 1", n)
			}
			// The kept W_UK is the per-call build, and that of the
			// dequantized F32 weight (which is not kept).
			f32 := put(t, b, kernels.F32, w.deq, rows, kvl).(*Tensor)
			checkIdentical(t, "kept W_UK vs per-call build", b.mlaWUK(wt, p), b.buildWUK(wt, p))
			checkIdentical(t, "kept W_UK vs F32 weight's", b.mlaWUK(wt, p), b.buildWUK(f32, p))
			switch tc.name {
			case "fp8":
				// FP8 products scale the activations, not the weights:
				// the dequantized weight's to rounding (TestFP8Ops).
				checkClose(t, "output vs F32 weight's", first, mla(f32), fp8Tol)
			case "bf16", "f16":
			default:
				// Block-quantized products are those of the dequantized
				// weight bit for bit (TestQuantOps).
				checkIdentical(t, "output vs F32 weight's", first, mla(f32))
			}
			if n := entries(); n != 1 {
				t.Fatalf("%d cache entries after an F32 call, want 1 (F32 weights are not kept)", n)
			}

			if wt.u16 != nil {
				// Upload over the weight: the next call computes with the
				// new values, as a fresh backend does.
				nv := roundTo(wt.dtype, randVals(r, rows*kvl, 0.5))
				raw := make([]byte, 2*len(nv))
				if err := b.Download(raw, put(t, b, wt.dtype, nv, rows, kvl)); err != nil {
					t.Fatal(err)
				}
				if err := b.Upload(w.ten, raw, wt.dtype); err != nil {
					t.Fatal(err)
				}
				got := mla(w.ten)
				if slices.Equal(got, first) {
					t.Fatal("output unchanged after Upload of new weight values")
				}
				fresh := newTestBackend(t, 2)
				out := alloc(t, fresh, m.NumTokens, nh*vd)
				if err := fresh.MLAAttention(out, q, cache, put(t, fresh, wt.dtype, nv, rows, kvl), m, p); err != nil {
					t.Fatal(err)
				}
				checkIdentical(t, "output after Upload vs fresh backend", got, vals(out))
				if n := entries(); n != 1 {
					t.Fatalf("%d cache entries after Upload and a call, want 1", n)
				}
			}

			// Concurrent first calls on a fresh backend agree with each other
			// and with the single-caller output.
			b2 := newTestBackend(t, 2)
			w2 := tc.make(rand.New(rand.NewPCG(5, 6)), b2)
			single := newTestBackend(t, 2)
			w1 := tc.make(rand.New(rand.NewPCG(5, 6)), single)
			// single first runs a one-row decode, so its batch call below
			// outgrows the pooled scratch (and b2's callers start bare).
			od := alloc(t, single, 1, nh*vd)
			q0 := put(t, single, kernels.F32, vals(q)[:nh*(nope+rope)], 1, nh*(nope+rope))
			if err := single.MLAAttention(od, q0, cache, w1.ten, decodeMeta(t, single, m, 0, 0), p); err != nil {
				t.Fatal(err)
			}
			want := func() []float32 {
				out := alloc(t, single, m.NumTokens, nh*vd)
				if err := single.MLAAttention(out, q, cache, w1.ten, m, p); err != nil {
					t.Fatal(err)
				}
				return vals(out)
			}()
			outs := make([][]float32, 4)
			errs := make([]error, len(outs))
			var wg sync.WaitGroup
			for i := range outs {
				wg.Go(func() {
					out, err := b2.Alloc(kernels.F32, m.NumTokens, nh*vd)
					if err == nil {
						err = b2.MLAAttention(out, q, cache, w2.ten, m, p)
					}
					if err == nil {
						outs[i] = vals(out)
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for i := range outs {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				checkIdentical(t, fmt.Sprintf("concurrent caller %d", i), outs[i], want)
			}
		})
	}
}

// TestMLAAttentionHalfCache: with Options.KVCacheDType F16 the latent cache
// is IEEE half (MLACacheLayout), WriteMLACache stores each value rounded to
// nearest even, and MLAAttention gives the bits of a float32 cache holding
// the rounded values: sequences of several key tiles, decode rows whose
// next item's first tile is fetched ahead, and a prompt's rows, on every
// SIMD path, with the default key segments and with segments of one tile
// (rows of up to 300 keys in three). WriteMLACache refuses rows of the
// wrong width and caches of other types.
func TestMLAAttentionHalfCache(t *testing.T) {
	const nh, nope, rope, kvl, vd, bs = 4, 8, 6, 40, 6, 8
	width := kvl + rope
	p := kernels.MLAParams{NumHeads: nh, NopeDim: nope, RopeDim: rope, KVLoraRank: kvl, VHeadDim: vd, Scale: 0.2}
	if dt, w := newTestBackend(t, 1).MLACacheLayout(kernels.BF16, p); dt != kernels.F32 || w != width {
		t.Errorf("MLACacheLayout without the option = %v, %d; want F32, %d", dt, w, width)
	}
	specs := []seqSpec{{4, 4}, {1, 9}, {1, 300}, {1, 130}, {3, 257}, {1, 129}}
	for _, set := range simd.Impls() {
		for _, seg := range []int{0, keyTile} {
			impl := set.Name()
			t.Run(fmt.Sprintf("%s/segment keys %d", impl, seg), func(t *testing.T) { testMLAHalfCache(t, impl, seg, specs, p) })
		}
	}
	b := New(Options{Threads: 1, KVCacheDType: kernels.F16})
	t.Cleanup(func() { b.Close() })
	sm := putI32(t, b, []int32{0, 1}, 2)
	ckv, kpe := alloc(t, b, 2, kvl), alloc(t, b, 2, rope)
	for _, tc := range []struct {
		name            string
		cache, ckv, kpe kernels.Tensor
		want            error
	}{
		{"c_kv too wide", allocDT(t, b, kernels.F16, 4, bs, width), alloc(t, b, 2, kvl+1), kpe, kernels.ErrShape},
		{"k_pe of other rows", allocDT(t, b, kernels.F16, 4, bs, width), ckv, alloc(t, b, 3, rope), kernels.ErrShape},
		{"cache too narrow", allocDT(t, b, kernels.F16, 4, bs, width-1), ckv, kpe, kernels.ErrShape},
		{"bf16 cache", allocDT(t, b, kernels.BF16, 4, bs, width), ckv, kpe, kernels.ErrDType},
	} {
		if err := b.WriteMLACache(tc.cache, tc.ckv, tc.kpe, sm, p); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// testMLAHalfCache is one SIMD path and key segment size of
// TestMLAAttentionHalfCache.
func testMLAHalfCache(t *testing.T, impl string, segKeys int, specs []seqSpec, p kernels.MLAParams) {
	const bs, numBlocks = 8, 128
	nh, nope, rope, kvl, vd := p.NumHeads, p.NopeDim, p.RopeDim, p.KVLoraRank, p.VHeadDim
	width := kvl + rope
	b := New(Options{Threads: 3, KVCacheDType: kernels.F16, SIMD: impl, PureGo: impl == "go"})
	t.Cleanup(func() { b.Close() })
	b.mla.segmentKeys = segKeys
	if dt, w := b.MLACacheLayout(kernels.BF16, p); dt != kernels.F16 || w != width {
		t.Fatalf("MLACacheLayout = %v, %d; want F16, %d", dt, w, width)
	}
	r := rand.New(rand.NewPCG(5, 31))
	m, slots := pagedBatch(t, b, r, specs, bs, numBlocks)
	half, full := allocDT(t, b, kernels.F16, numBlocks, bs, width), alloc(t, b, numBlocks, bs, width)
	var qAll []float32
	for s, sp := range specs {
		sm := putI32(t, b, slots[s], sp.kLen)
		ckv, kpe := randVals(r, sp.kLen*kvl, 3), randVals(r, sp.kLen*rope, 3)
		if err := b.WriteMLACache(half, put(t, b, kernels.F32, ckv, sp.kLen, kvl), put(t, b, kernels.F32, kpe, sp.kLen, rope), sm, p); err != nil {
			t.Fatal(err)
		}
		rc, rk := roundTo(kernels.F16, ckv), roundTo(kernels.F16, kpe)
		if err := b.WriteMLACache(full, put(t, b, kernels.F32, rc, sp.kLen, kvl), put(t, b, kernels.F32, rk, sp.kLen, rope), sm, p); err != nil {
			t.Fatal(err)
		}
		for i, slot := range slots[s] {
			row := append(slices.Clone(ckv[i*kvl:(i+1)*kvl]), kpe[i*rope:(i+1)*rope]...)
			for e, v := range row {
				if got, want := half.(*Tensor).u16[int(slot)*width+e], kernels.F32ToF16(v); got != want {
					t.Fatalf("sequence %d key %d column %d: stored %#04x, want %#04x", s, i, e, got, want)
				}
			}
		}
		qAll = append(qAll, randVals(r, sp.qLen*nh*(nope+rope), 0.5)...)
	}
	w := put(t, b, kernels.BF16, roundTo(kernels.BF16, randVals(r, nh*(nope+vd)*kvl, 0.5)), nh*(nope+vd), kvl)
	q := put(t, b, kernels.F32, qAll, m.NumTokens, nh*(nope+rope))
	oh, of := alloc(t, b, m.NumTokens, nh*vd), alloc(t, b, m.NumTokens, nh*vd)
	if err := b.MLAAttention(oh, q, half, w, m, p); err != nil {
		t.Fatal(err)
	}
	if err := b.MLAAttention(of, q, full, w, m, p); err != nil {
		t.Fatal(err)
	}
	for i, v := range vals(of) {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("output %d = %v: the comparison below would see no values", i, v)
		}
	}
	checkIdentical(t, "half latent cache vs float32 cache of the rounded values", vals(oh), vals(of))
	// A decode row alone gives its batch row's bits.
	row := 0
	for s, sp := range specs {
		od := alloc(t, b, 1, nh*vd)
		j := sp.qLen - 1
		qj := qAll[(row+j)*nh*(nope+rope) : (row+j+1)*nh*(nope+rope)]
		if err := b.MLAAttention(od, put(t, b, kernels.F32, qj, 1, nh*(nope+rope)), half, w, decodeMeta(t, b, m, s, j), p); err != nil {
			t.Fatal(err)
		}
		checkIdentical(t, fmt.Sprintf("sequence %d last row alone", s), vals(od), vals(oh)[(row+j)*nh*vd:(row+j+1)*nh*vd])
		row += sp.qLen
	}
}
