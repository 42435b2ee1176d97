package cpu

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

func TestUploadDownloadViews(t *testing.T) {
	b := newTestBackend(t, 1)
	x := []float32{1, 2, 3, 4, 5, 6}
	ten := put(t, b, kernels.F32, x, 3, 2)
	got, err := kernels.ToF32(b, ten)
	if err != nil || !slices.Equal(got, x) {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	// A row view shares memory: uploading into it changes the parent.
	v, err := b.Rows(ten, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Upload(v, kernels.F32Bytes([]float32{7, 8, 9, 10}), kernels.F32); err != nil {
		t.Fatal(err)
	}
	if got := vals(ten); !slices.Equal(got, []float32{1, 2, 7, 8, 9, 10}) {
		t.Errorf("after upload into rows [1,3): %v", got)
	}
	r, err := b.Reshape(v, 4)
	if err != nil || !slices.Equal(r.Shape(), []int{4}) || vals(r)[0] != 7 {
		t.Errorf("reshape: %v %v", r, err)
	}
	// BF16 bytes widen into an F32 tensor.
	w, _ := b.Alloc(kernels.F32, 2)
	if err := b.Upload(w, kernels.U16Bytes([]uint16{kernels.F32ToBF16(1.5), kernels.F32ToBF16(-2)}), kernels.BF16); err != nil {
		t.Fatal(err)
	}
	if got := vals(w); !slices.Equal(got, []float32{1.5, -2}) {
		t.Errorf("bf16 into f32: %v", got)
	}
	// Unaligned source bytes take the element-wise path and agree.
	raw := append([]byte{0}, kernels.F32Bytes([]float32{3.5, -1})...)[1:]
	if err := b.Upload(w, raw, kernels.F32); err != nil {
		t.Fatal(err)
	}
	if got := vals(w); !slices.Equal(got, []float32{3.5, -1}) {
		t.Errorf("unaligned f32 upload: %v", got)
	}
	ids, _ := kernels.FromI32(b, []int32{-1, 5}, 2)
	if got, _ := kernels.ToI32(b, ids); !slices.Equal(got, []int32{-1, 5}) {
		t.Errorf("i32 round trip: %v", got)
	}
}

type foreign struct{}

func (foreign) Shape() []int         { return []int{1} }
func (foreign) DType() kernels.DType { return kernels.F32 }

func TestErrors(t *testing.T) {
	b := newTestBackend(t, 1)
	f := func(shape ...int) kernels.Tensor { return alloc(t, b, shape...) }
	i32 := func(xs ...int32) kernels.Tensor { return putI32(t, b, xs, len(xs)) }
	meta := func(blocks ...int32) *kernels.AttentionMetadata {
		return &kernels.AttentionMetadata{NumSeqs: 1, NumTokens: 1, BlockSize: 2,
			CuSeqlensQ: i32(0, 1), SeqlensK: i32(3), BlockTables: putI32(t, b, blocks, 1, len(blocks)), SlotMapping: i32(0)}
	}
	ap := kernels.AttentionParams{NumHeads: 1, NumKVHeads: 1, HeadDim: 2, Scale: 1}
	closed := New(Options{Threads: 1})
	closed.Close()
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"upload size", b.Upload(f(2), make([]byte, 4), kernels.F32), kernels.ErrShape},
		{"upload i32 into f32", b.Upload(f(1), make([]byte, 4), kernels.I32), kernels.ErrDType},
		{"linear inner dim", b.Linear(f(1, 3), f(1, 4), f(3, 5), nil), kernels.ErrShape},
		{"linear out", b.Linear(f(1, 2), f(1, 4), f(3, 4), nil), kernels.ErrShape},
		{"linear i32 weight", b.Linear(f(1, 1), f(1, 1), i32(1), nil), kernels.ErrShape},
		{"linear foreign", b.Linear(f(1, 1), foreign{}, f(1, 1), nil), kernels.ErrForeignTensor},
		{"rms_norm weight", b.RMSNorm(f(2, 3), f(2, 3), f(4), 1e-6), kernels.ErrShape},
		{"rope odd rotary dim", b.RoPE(f(1, 4), i32(0), f(4, 1), f(4, 1), kernels.RoPEParams{NumHeads: 1, HeadSize: 4, RotaryDim: 3}), kernels.ErrShape},
		{"rope position", b.RoPE(f(1, 4), i32(4), f(4, 2), f(4, 2), kernels.RoPEParams{NumHeads: 1, HeadSize: 4, RotaryDim: 4}), kernels.ErrOutOfRange},
		{"write_cache slot", b.WriteCache(f(2, 2, 2), f(1, 2), i32(4), 0), kernels.ErrOutOfRange},
		{"write_cache columns", b.WriteCache(f(2, 2, 2), f(1, 2), i32(0), 1), kernels.ErrShape},
		{"attention block", b.Attention(f(1, 2), f(1, 2), f(2, 2, 2), f(2, 2, 2), meta(0, 2), ap), kernels.ErrOutOfRange},
		{"attention short table", b.Attention(f(1, 2), f(1, 2), f(2, 2, 2), f(2, 2, 2), meta(0), ap), kernels.ErrOutOfRange},
		{"attention gqa", b.Attention(f(1, 6), f(1, 6), f(2, 2, 4), f(2, 2, 4), meta(0, 1), kernels.AttentionParams{NumHeads: 3, NumKVHeads: 2, HeadDim: 2}), kernels.ErrShape},
		{"route top_k", b.MoERoute(putI32(t, b, make([]int32, 5), 1, 5), f(1, 5), f(1, 4), nil, kernels.RouteParams{TopK: 5, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy}), kernels.ErrShape},
		{"moe expert id", b.MoE(f(1, 2), f(1, 2), putI32(t, b, []int32{3}, 1, 1), f(1, 1), f(2, 4, 2), f(2, 2, 2)), kernels.ErrOutOfRange},
		{"logits row", b.Logits(f(1, 3), f(2, 2), i32(2), nil, f(3, 2), 0), kernels.ErrOutOfRange},
		{"closed", closed.Add(f(1), f(1), f(1)), kernels.ErrClosed},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, tc.err, tc.want)
		}
	}
}

// TestPureGoMatchesDefault: the portable path and the vectorized one give the
// same bits for linear, attention (GQA over both cache types, MLA) and
// SiLUMul.
func TestPureGoMatchesDefault(t *testing.T) {
	fast, slow := New(Options{Threads: 2}), New(Options{Threads: 2, PureGo: true})
	defer fast.Close()
	defer slow.Close()
	t.Logf("default %s, pure %s", fast.Name(), slow.Name())
	r := rand.New(rand.NewPCG(11, 11))
	const m, n, k = 5, 70, 99
	x, w := randVals(r, m*k, 1), randVals(r, n*k, 1)
	var outs [2][]float32
	for i, b := range []*Backend{fast, slow} {
		out := alloc(t, b, m, n)
		if err := b.Linear(out, put(t, b, kernels.F32, x, m, k), put(t, b, kernels.BF16, w, n, k), nil); err != nil {
			t.Fatal(err)
		}
		outs[i] = vals(out)
	}
	checkIdentical(t, "linear go vs "+fast.k.name, outs[1], outs[0])

	// Attention (a float32 cache read in place, an 8-bit one copied), MLA
	// attention and SiLUMul, over a prefill chunk and decode rows.
	specs := []seqSpec{{3, 3}, {1, 140}, {37, 300}}
	const nh, nkv, d, bs, numBlocks = 4, 2, 24, 8, 64
	const nope, rope, kvl, vd = 8, 4, 20, 6
	var att [2][][]float32
	for i, b := range []*Backend{fast, slow} {
		r := rand.New(rand.NewPCG(12, 12))
		m, slots := pagedBatch(t, b, r, specs, bs, numBlocks)
		q := put(t, b, kernels.F32, randVals(r, m.NumTokens*nh*d, 1), m.NumTokens, nh*d)
		for _, dt := range []kernels.DType{kernels.F32, kernels.F8E4M3} {
			kc, vc := allocDT(t, b, dt, numBlocks, bs, nkv*d), allocDT(t, b, dt, numBlocks, bs, nkv*d)
			for s, sp := range specs {
				for _, c := range []kernels.Tensor{kc, vc} {
					if err := b.WriteCache(c, put(t, b, kernels.F32, randVals(r, sp.kLen*nkv*d, 2), sp.kLen, nkv*d), putI32(t, b, slots[s], sp.kLen), 0); err != nil {
						t.Fatal(err)
					}
				}
			}
			out := alloc(t, b, m.NumTokens, nh*d)
			if err := b.Attention(out, q, kc, vc, m, kernels.AttentionParams{NumHeads: nh, NumKVHeads: nkv, HeadDim: d, Scale: 0.4}); err != nil {
				t.Fatal(err)
			}
			att[i] = append(att[i], vals(out))
		}
		cache := latentCache(t, b, r, specs, slots, numBlocks, bs, kvl+rope)
		wkvb := put(t, b, kernels.BF16, randVals(r, nh*(nope+vd)*kvl, 0.5), nh*(nope+vd), kvl)
		out := alloc(t, b, m.NumTokens, nh*vd)
		mp := kernels.MLAParams{NumHeads: nh, NopeDim: nope, RopeDim: rope, KVLoraRank: kvl, VHeadDim: vd, Scale: 0.3}
		if err := b.MLAAttention(out, put(t, b, kernels.F32, randVals(r, m.NumTokens*nh*(nope+rope), 1), m.NumTokens, nh*(nope+rope)), cache, wkvb, m, mp); err != nil {
			t.Fatal(err)
		}
		att[i] = append(att[i], vals(out))
		act := alloc(t, b, 3, 70)
		if err := b.SiLUMul(act, put(t, b, kernels.F32, randVals(r, 3*140, 12), 3, 140)); err != nil {
			t.Fatal(err)
		}
		att[i] = append(att[i], vals(act))
	}
	for j, what := range []string{"attention, f32 cache", "attention, 8-bit cache", "mla attention", "silu_mul"} {
		checkIdentical(t, what+": go vs "+fast.k.name, att[1][j], att[0][j])
	}
}
