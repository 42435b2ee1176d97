package cpu

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// randFP8 draws an FP8 weight of the given shape with 128x128-style blocks
// of blockN rows and blockK columns per matrix (every matrix of a 3-D
// shape has its own scales, as stacked experts do), and returns it with its
// dequantized float32 values.
func randFP8(r *rand.Rand, blockN, blockK int, shape ...int) (kernels.FP8Weight, []float32) {
	n, k := shape[len(shape)-2], shape[len(shape)-1]
	mats := 1
	if len(shape) == 3 {
		mats = shape[0]
	}
	nb, kb := (n+blockN-1)/blockN, (k+blockK-1)/blockK
	w := kernels.FP8Weight{Shape: shape, Data: make([]byte, mats*n*k), Scales: make([]float32, mats*nb*kb),
		ScaleRow: make([]int32, mats*n), BlockK: blockK}
	for i := range w.Data {
		b := byte(r.IntN(256))
		if b&0x7f == 0x7f {
			b--
		}
		w.Data[i] = b
	}
	for i := range w.Scales {
		w.Scales[i] = float32(r.Float64()+0.1) / 448
	}
	deq := make([]float32, len(w.Data))
	for e := range mats {
		for j := range n {
			row := e*n + j
			w.ScaleRow[row] = int32(e*nb + j/blockN)
			for c := range k {
				s := w.Scales[int(w.ScaleRow[row])*kb+c/blockK]
				deq[row*k+c] = kernels.F8E4M3ToF32(w.Data[row*k+c]) * s
			}
		}
	}
	return w, deq
}

func fp8Tensor(t testing.TB, b *Backend, w kernels.FP8Weight) kernels.Tensor {
	t.Helper()
	ten, err := b.FP8Weight(w)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}

// fp8Tol bounds the difference between an op over an FP8 weight and the op
// over its dequantized float32 values (max error over max value): LinearF8
// rounds each activation times its block scale where dequantizing rounds
// each weight times its scale, a rounding of either factor of every
// product.
const fp8Tol = 1e-5

// TestFP8Ops: every op that takes a weight computes with an FP8 weight what
// it computes with the dequantized float32 weight, to rounding (fp8Tol; the
// embedding's rows are the dequantized ones, bit for bit), and the pure-Go
// and SIMD backends give the same bits. With one scale for all of a
// weight's blocks, its product is bit for bit the float32 product of the
// scaled activations and the widened weights (simd.LinearF8).
func TestFP8Ops(t *testing.T) {
	first := map[string][]float32{} // each output of the first backend
	same := func(t *testing.T, b *Backend, what string, got []float32) {
		t.Helper()
		if prev, ok := first[what]; ok {
			checkIdentical(t, what+" against the first backend's", got, prev)
			return
		}
		first[what] = append([]float32(nil), got...)
	}
	for _, pure := range []bool{true, false} {
		b := New(Options{Threads: 2, PureGo: pure})
		defer b.Close()
		r := rand.New(rand.NewPCG(3, 4))
		t.Run(b.Name()+"/linear", func(t *testing.T) {
			for i, sh := range []struct{ m, n, k int }{{1, 200, 300}, {5, 33, 128}, {17, 130, 257}} {
				w, deq := randFP8(r, 128, 128, sh.n, sh.k)
				xv := randVals(r, sh.m*sh.k, 1)
				x := put(t, b, kernels.F32, xv, sh.m, sh.k)
				bias := put(t, b, kernels.F32, randVals(r, sh.n, 1), sh.n)
				got, want := alloc(t, b, sh.m, sh.n), alloc(t, b, sh.m, sh.n)
				if err := b.Linear(got, x, fp8Tensor(t, b, w), bias); err != nil {
					t.Fatal(err)
				}
				if err := b.Linear(want, x, put(t, b, kernels.F32, deq, sh.n, sh.k), bias); err != nil {
					t.Fatal(err)
				}
				checkClose(t, "linear", vals(got), vals(want), fp8Tol)
				same(t, b, fmt.Sprint("linear ", i), vals(got))

				// One scale for every block.
				s := w.Scales[0]
				for j := range w.Scales {
					w.Scales[j] = s
				}
				xs, widened := make([]float32, len(xv)), make([]float32, len(w.Data))
				for j, v := range xv {
					xs[j] = v * (256 * s)
				}
				for j, c := range w.Data {
					widened[j] = kernels.F8E4M3ToF32(c) / 256
				}
				if err := b.Linear(got, x, fp8Tensor(t, b, w), bias); err != nil {
					t.Fatal(err)
				}
				if err := b.Linear(want, put(t, b, kernels.F32, xs, sh.m, sh.k), put(t, b, kernels.F32, widened, sh.n, sh.k), bias); err != nil {
					t.Fatal(err)
				}
				checkIdentical(t, "linear, one scale", vals(got), vals(want))
			}
		})
		t.Run(b.Name()+"/logits-embedding", func(t *testing.T) {
			const vocab, hidden, rows = 50, 48, 3
			w, deq := randFP8(r, 32, 16, vocab, hidden)
			head, ref := fp8Tensor(t, b, w), put(t, b, kernels.F32, deq, vocab, hidden)
			h := put(t, b, kernels.F32, randVals(r, rows*hidden, 1), rows, hidden)
			got, want := alloc(t, b, rows, vocab), alloc(t, b, rows, vocab)
			if err := b.Logits(got, h, nil, nil, head, 1e-6); err != nil {
				t.Fatal(err)
			}
			if err := b.Logits(want, h, nil, nil, ref, 1e-6); err != nil {
				t.Fatal(err)
			}
			checkClose(t, "logits", vals(got), vals(want), fp8Tol)
			same(t, b, "logits", vals(got))
			ids := putI32(t, b, []int32{0, 49, 7}, 3)
			ge, we := alloc(t, b, 3, hidden), alloc(t, b, 3, hidden)
			if err := b.Embedding(ge, head, ids); err != nil {
				t.Fatal(err)
			}
			if err := b.Embedding(we, ref, ids); err != nil {
				t.Fatal(err)
			}
			checkIdentical(t, "embedding", vals(ge), vals(we))
		})
		t.Run(b.Name()+"/moe", func(t *testing.T) {
			const tokens, hidden, inter, e, topK = 6, 64, 48, 4, 2
			gu, guDeq := randFP8(r, 32, 32, e, 2*inter, hidden)
			dn, dnDeq := randFP8(r, 32, 32, e, hidden, inter)
			x := put(t, b, kernels.F32, randVals(r, tokens*hidden, 1), tokens, hidden)
			idv := make([]int32, tokens*topK)
			for i := range idv {
				idv[i] = int32((i*3 + i/topK) % e)
			}
			ids, wts := putI32(t, b, idv, tokens, topK), put(t, b, kernels.F32, randVals(r, tokens*topK, 1), tokens, topK)
			got, want := alloc(t, b, tokens, hidden), alloc(t, b, tokens, hidden)
			if err := b.MoE(got, x, ids, wts, fp8Tensor(t, b, gu), fp8Tensor(t, b, dn)); err != nil {
				t.Fatal(err)
			}
			if err := b.MoE(want, x, ids, wts, put(t, b, kernels.F32, guDeq, e, 2*inter, hidden),
				put(t, b, kernels.F32, dnDeq, e, hidden, inter)); err != nil {
				t.Fatal(err)
			}
			checkClose(t, "moe", vals(got), vals(want), fp8Tol)
			same(t, b, "moe", vals(got))
		})
	}
}

// TestFP8Views: Rows and Reshape of an FP8 weight keep each row's scales
// (every block of 16 rows has its own: a row read with another's scales is
// off by far more than fp8Tol).
func TestFP8Views(t *testing.T) {
	b := newTestBackend(t, 1)
	r := rand.New(rand.NewPCG(5, 6))
	w, deq := randFP8(r, 16, 16, 3, 40, 32)
	ten := fp8Tensor(t, b, w)
	x := put(t, b, kernels.F32, randVals(r, 2*32, 1), 2, 32)
	v, err := b.Rows(ten, 1, 3)
	if err == nil {
		v, err = b.Reshape(v, 80, 32)
	}
	if err == nil {
		v, err = b.Rows(v, 10, 50)
	}
	if err != nil {
		t.Fatal(err)
	}
	got, want := alloc(t, b, 2, 40), alloc(t, b, 2, 40)
	if err := b.Linear(got, x, v, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Linear(want, x, put(t, b, kernels.F32, deq[(40+10)*32:(40+50)*32], 40, 32), nil); err != nil {
		t.Fatal(err)
	}
	checkClose(t, "view", vals(got), vals(want), fp8Tol)
	if _, err := b.Reshape(ten, 3, 20, 64); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("reshape across rows: err = %v, want ErrShape", err)
	}
}

func TestFP8WeightErrors(t *testing.T) {
	b := newTestBackend(t, 1)
	r := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		name string
		edit func(w *kernels.FP8Weight)
		is   error
	}{
		{"NaN byte", func(w *kernels.FP8Weight) { w.Data[5] = 0xff }, kernels.ErrDType},
		{"short data", func(w *kernels.FP8Weight) { w.Data = w.Data[1:] }, kernels.ErrShape},
		{"scale rows", func(w *kernels.FP8Weight) { w.ScaleRow = w.ScaleRow[1:] }, kernels.ErrShape},
		{"scale row out of range", func(w *kernels.FP8Weight) { w.ScaleRow[3] = 9 }, kernels.ErrShape},
		{"block 100", func(w *kernels.FP8Weight) { w.BlockK = 100 }, kernels.ErrShape},
		{"infinite scale", func(w *kernels.FP8Weight) { w.Scales[0] = float32(math.Inf(1)) }, kernels.ErrShape},
		{"1-D", func(w *kernels.FP8Weight) { w.Shape = []int{w.Shape[0] * w.Shape[1]} }, kernels.ErrShape},
	} {
		w, _ := randFP8(r, 16, 16, 20, 32)
		tc.edit(&w)
		if _, err := b.FP8Weight(w); !errors.Is(err, tc.is) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.is)
		}
	}
	// A plain F8E4M3 tensor (a KV cache) is no weight.
	cache := allocDT(t, b, kernels.F8E4M3, 4, 8)
	x := put(t, b, kernels.F32, make([]float32, 8), 1, 8)
	if err := b.Linear(alloc(t, b, 1, 4), x, cache, nil); !errors.Is(err, kernels.ErrDType) {
		t.Errorf("linear over an unscaled F8E4M3 tensor: err = %v, want ErrDType", err)
	}
}
