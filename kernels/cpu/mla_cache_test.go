package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
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
			if tc.name != "bf16" && tc.name != "f16" {
				// FP8 and block-quantized products are those of the
				// dequantized weight bit for bit (TestFP8Ops, TestQuantOps).
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
