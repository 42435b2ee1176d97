package cpu

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// randQuant quantizes random rows of k weights into the parts' formats
// (rows[i] rows of types[i]) and returns the weight with its dequantized
// float32 values.
func randQuant(r *rand.Rand, shape []int, types []kernels.QuantType, rows []int) (kernels.QuantWeight, []float32) {
	k := shape[len(shape)-1]
	w := kernels.QuantWeight{Shape: shape}
	var deq []float32
	for i, typ := range types {
		q := simd.QuantType(typ)
		rb, _ := q.RowBytes(k)
		data := make([]byte, rows[i]*rb)
		q.Quantize(data, randVals(r, rows[i]*k, 1))
		vals := make([]float32, rows[i]*k)
		q.Dequantize(vals, data)
		deq = append(deq, vals...)
		w.Parts = append(w.Parts, kernels.QuantPart{Type: typ, Rows: rows[i], Data: data})
	}
	return w, deq
}

func quantTensor(t testing.TB, b *Backend, w kernels.QuantWeight) kernels.Tensor {
	t.Helper()
	ten, err := b.QuantWeight(w)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}

// TestQuantOps: every op that takes a weight computes with a
// block-quantized weight (one format, or parts of several fused) exactly
// what it computes with the dequantized float32 weight, for one row
// (decode) and many, on the vectorized and the pure-Go loops.
func TestQuantOps(t *testing.T) {
	for _, pure := range []bool{true, false} {
		b := New(Options{Threads: 2, PureGo: pure})
		defer b.Close()
		r := rand.New(rand.NewPCG(7, 8))
		t.Run(b.Name()+"/linear", func(t *testing.T) {
			for _, c := range []struct {
				types []kernels.QuantType
				rows  []int
				k     int
			}{
				{[]kernels.QuantType{kernels.QuantQ8_0}, []int{70}, 96},
				{[]kernels.QuantType{kernels.QuantQ4_0}, []int{33}, 64},
				{[]kernels.QuantType{kernels.QuantQ4_K}, []int{130}, 512},
				{[]kernels.QuantType{kernels.QuantQ5_K}, []int{40}, 256},
				{[]kernels.QuantType{kernels.QuantQ6_K}, []int{40}, 256},
				// Q4_K_M's fused q/k/v of a layer with a Q6_K v.
				{[]kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ4_K, kernels.QuantQ6_K}, []int{64, 32, 150}, 256},
				{[]kernels.QuantType{kernels.QuantQ6_K, kernels.QuantQ4_K, kernels.QuantQ5_K}, []int{5, 70, 3}, 256},
			} {
				n := 0
				for _, rr := range c.rows {
					n += rr
				}
				w, deq := randQuant(r, []int{n, c.k}, c.types, c.rows)
				qt := quantTensor(t, b, w)
				ref := put(t, b, kernels.F32, deq, n, c.k)
				for _, m := range []int{1, 3, 70} {
					x := put(t, b, kernels.F32, randVals(r, m*c.k, 1), m, c.k)
					bias := put(t, b, kernels.F32, randVals(r, n, 1), n)
					got, want := alloc(t, b, m, n), alloc(t, b, m, n)
					if err := b.Linear(got, x, qt, bias); err != nil {
						t.Fatal(err)
					}
					if err := b.Linear(want, x, ref, bias); err != nil {
						t.Fatal(err)
					}
					checkIdentical(t, "linear", vals(got), vals(want))
				}
			}
		})
		t.Run(b.Name()+"/logits-embedding", func(t *testing.T) {
			const vocab, hidden, rows = 50, 256, 3
			w, deq := randQuant(r, []int{vocab, hidden}, []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ6_K}, []int{20, 30})
			head, ref := quantTensor(t, b, w), put(t, b, kernels.F32, deq, vocab, hidden)
			h := put(t, b, kernels.F32, randVals(r, rows*hidden, 1), rows, hidden)
			got, want := alloc(t, b, rows, vocab), alloc(t, b, rows, vocab)
			if err := b.Logits(got, h, nil, nil, head, 1e-6); err != nil {
				t.Fatal(err)
			}
			if err := b.Logits(want, h, nil, nil, ref, 1e-6); err != nil {
				t.Fatal(err)
			}
			checkIdentical(t, "logits", vals(got), vals(want))
			ids := putI32(t, b, []int32{0, 49, 19, 20}, 4)
			ge, we := alloc(t, b, 4, hidden), alloc(t, b, 4, hidden)
			if err := b.Embedding(ge, head, ids); err != nil {
				t.Fatal(err)
			}
			if err := b.Embedding(we, ref, ids); err != nil {
				t.Fatal(err)
			}
			checkIdentical(t, "embedding", vals(ge), vals(we))
		})
		t.Run(b.Name()+"/moe", func(t *testing.T) {
			const tokens, hidden, inter, e, topK = 6, 64, 96, 4, 2
			gu, guDeq := randQuant(r, []int{e, 2 * inter, hidden}, []kernels.QuantType{kernels.QuantQ8_0}, []int{e * 2 * inter})
			dn, dnDeq := randQuant(r, []int{e, hidden, inter}, []kernels.QuantType{kernels.QuantQ4_0}, []int{e * hidden})
			x := put(t, b, kernels.F32, randVals(r, tokens*hidden, 1), tokens, hidden)
			idv := make([]int32, tokens*topK)
			for i := range idv {
				idv[i] = int32((i*3 + i/topK) % e)
			}
			ids, wts := putI32(t, b, idv, tokens, topK), put(t, b, kernels.F32, randVals(r, tokens*topK, 1), tokens, topK)
			got, want := alloc(t, b, tokens, hidden), alloc(t, b, tokens, hidden)
			if err := b.MoE(got, x, ids, wts, quantTensor(t, b, gu), quantTensor(t, b, dn)); err != nil {
				t.Fatal(err)
			}
			if err := b.MoE(want, x, ids, wts, put(t, b, kernels.F32, guDeq, e, 2*inter, hidden),
				put(t, b, kernels.F32, dnDeq, e, hidden, inter)); err != nil {
				t.Fatal(err)
			}
			checkIdentical(t, "moe", vals(got), vals(want))
		})
	}
}

// TestQuantViews: Rows and Reshape of a block-quantized weight of several
// parts keep each row's format.
func TestQuantViews(t *testing.T) {
	b := newTestBackend(t, 1)
	r := rand.New(rand.NewPCG(9, 10))
	w, deq := randQuant(r, []int{3, 40, 256}, []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ6_K, kernels.QuantQ8_0}, []int{50, 45, 25})
	qt := quantTensor(t, b, w)
	flat, err := b.Reshape(qt, 120, 256)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reshape(qt, 120*2, 128); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("reshape changing the rows: err = %v, want ErrShape", err)
	}
	for _, v := range []struct{ lo, hi int }{{0, 120}, {1, 3}, {48, 52}, {96, 120}, {60, 61}} {
		view, err := b.Rows(flat, v.lo, v.hi)
		if err != nil {
			t.Fatal(err)
		}
		n := v.hi - v.lo
		x := put(t, b, kernels.F32, randVals(r, 2*256, 1), 2, 256)
		got := alloc(t, b, 2, n)
		if err := b.Linear(got, x, view, nil); err != nil {
			t.Fatal(err)
		}
		want := alloc(t, b, 2, n)
		if err := b.Linear(want, x, put(t, b, kernels.F32, deq[v.lo*256:v.hi*256], n, 256), nil); err != nil {
			t.Fatal(err)
		}
		checkIdentical(t, "rows view", vals(got), vals(want))
	}
	// Rows of the 3-D weight: whole matrices (experts).
	view, err := b.Rows(qt, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := view.Shape(); len(got) != 3 || got[0] != 2 || got[1] != 40 {
		t.Errorf("Rows(1, 3) of [3 40 256] has shape %v", got)
	}
}

// TestQuantWeightErrors: inconsistent weights are refused.
func TestQuantWeightErrors(t *testing.T) {
	b := newTestBackend(t, 1)
	r := rand.New(rand.NewPCG(1, 2))
	good, _ := randQuant(r, []int{4, 256}, []kernels.QuantType{kernels.QuantQ4_K}, []int{4})
	for _, c := range []struct {
		name string
		w    kernels.QuantWeight
		want error
	}{
		{"1-D", kernels.QuantWeight{Shape: []int{256}, Parts: good.Parts}, kernels.ErrShape},
		{"short data", kernels.QuantWeight{Shape: good.Shape, Parts: []kernels.QuantPart{{Type: kernels.QuantQ4_K, Rows: 4, Data: good.Parts[0].Data[:100]}}}, kernels.ErrShape},
		{"rows do not add up", kernels.QuantWeight{Shape: []int{5, 256}, Parts: good.Parts}, kernels.ErrShape},
		{"partial block", kernels.QuantWeight{Shape: []int{4, 128}, Parts: []kernels.QuantPart{{Type: kernels.QuantQ4_K, Rows: 4, Data: good.Parts[0].Data[:4*72]}}}, kernels.ErrShape},
		{"Q5_0", kernels.QuantWeight{Shape: []int{1, 32}, Parts: []kernels.QuantPart{{Type: 6, Rows: 1, Data: make([]byte, 22)}}}, kernels.ErrDType},
	} {
		if _, err := b.QuantWeight(c.w); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	// Weights only: Alloc refuses the dtype.
	if _, err := b.Alloc(kernels.Quant, 2, 32); !errors.Is(err, kernels.ErrDType) {
		t.Errorf("Alloc(Quant): err = %v, want ErrDType", err)
	}
}
