package kernels

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// shapeCase is one call of a shared argument check: is nil for arguments
// that must pass (with the sizes in sizes, when given), else the sentinel
// the error must wrap and want a part of its text.
type shapeCase struct {
	name  string
	call  func() ([]int, error)
	is    error
	want  string
	sizes []int
}

func runShapeCases(t *testing.T, cases []shapeCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sizes, err := tc.call()
			if tc.is == nil {
				if err != nil {
					t.Fatalf("good arguments refused: %v", err)
				}
				if tc.sizes != nil && !equalInts(sizes, tc.sizes) {
					t.Errorf("sizes %v, want %v", sizes, tc.sizes)
				}
				return
			}
			if !errors.Is(err, tc.is) {
				t.Fatalf("error %v, want one wrapping %v", err, tc.is)
			}
			if !strings.HasPrefix(err.Error(), "be: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name the backend and %q", err, tc.want)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// String prints a tensor as the backends do, dtype then shape.
func (o *ownTensor) String() string { return fmt.Sprintf("%v%v", o.dtype, o.shape) }

// ten is a tensor of the test's own backend type.
func ten(d DType, shape ...int) *ownTensor {
	return &ownTensor{fakeTensor{shape: shape, dtype: d}}
}

var noTensor *ownTensor // a typed nil, as a backend's Opt returns

func TestElementwiseShapes(t *testing.T) {
	const be = "be"
	addNorm := func(out, res, x, w Tensor, outTypes ...DType) func() ([]int, error) {
		return func() ([]int, error) {
			rows, n, err := AddNormShapes(be, out, res, x, w, outTypes...)
			return []int{rows, n}, err
		}
	}
	silu := func(out, gu Tensor) func() ([]int, error) {
		return func() ([]int, error) {
			rows, n, err := SiLUMulShapes(be, out, gu)
			return []int{rows, n}, err
		}
	}
	add := func(out, a, b Tensor) func() ([]int, error) {
		return func() ([]int, error) {
			n, err := AddShapes(be, out, a, b)
			return []int{n}, err
		}
	}
	concat := func(out, a, b Tensor) func() ([]int, error) {
		return func() ([]int, error) {
			rows, m, n, err := ConcatShapes(be, out, a, b)
			return []int{rows, m, n}, err
		}
	}
	f := func(shape ...int) *ownTensor { return ten(F32, shape...) }
	runShapeCases(t, []shapeCase{
		{name: "add_rms_norm", call: addNorm(f(2, 8), f(2, 8), f(2, 8), f(8)), sizes: []int{2, 8}},
		{name: "add_rms_norm 16-bit out", call: addNorm(ten(BF16, 2, 8), f(2, 8), f(2, 8), f(8), F32, BF16)},
		{name: "add_rms_norm residual rows", call: addNorm(f(2, 8), f(3, 8), f(2, 8), f(8)), is: ErrShape, want: "add_rms_norm: residual"},
		{name: "add_rms_norm residual dtype", call: addNorm(f(2, 8), ten(BF16, 2, 8), f(2, 8), f(8)), is: ErrDType, want: "residual"},
		{name: "add_rms_norm out dtype", call: addNorm(ten(BF16, 2, 8), f(2, 8), f(2, 8), f(8)), is: ErrDType, want: "out"},
		{name: "add_rms_norm weight", call: addNorm(f(2, 8), f(2, 8), f(2, 8), f(7)), is: ErrShape, want: "weight"},
		{name: "add_rms_norm nil residual", call: addNorm(f(2, 8), nil, f(2, 8), f(8)), is: ErrForeignTensor, want: "residual"},

		{name: "silu_mul", call: silu(f(2, 4), f(2, 8)), sizes: []int{2, 4}},
		{name: "silu_mul odd width", call: silu(f(2, 3), f(2, 7)), is: ErrShape, want: "silu_mul: gate_up F32[2 7] has an odd width"},
		{name: "silu_mul out", call: silu(f(2, 5), f(2, 8)), is: ErrShape, want: "out"},
		{name: "silu_mul gate_up dtype", call: silu(f(2, 4), ten(BF16, 2, 8)), is: ErrDType, want: "gate_up"},
		{name: "silu_mul gate_up rank", call: silu(f(2, 4), f(16)), is: ErrShape, want: "gate_up"},

		{name: "add", call: add(f(2, 3), f(2, 3), f(2, 3)), sizes: []int{6}},
		{name: "add any rank", call: add(f(2, 3, 4), f(2, 3, 4), f(2, 3, 4)), sizes: []int{24}},
		{name: "add b shape", call: add(f(2, 3), f(2, 3), f(3, 2)), is: ErrShape, want: "add: b is"},
		{name: "add a rank", call: add(f(2, 3), f(6), f(2, 3)), is: ErrShape, want: "add: a is"},
		{name: "add out dtype", call: add(ten(I32, 2, 3), f(2, 3), f(2, 3)), is: ErrDType, want: "add: out is"},
		{name: "add a dtype", call: add(f(2, 3), ten(BF16, 2, 3), f(2, 3)), is: ErrDType, want: "add: a is"},

		{name: "concat", call: concat(f(2, 5), f(2, 2), f(2, 3)), sizes: []int{2, 2, 3}},
		{name: "concat b rows", call: concat(f(2, 5), f(2, 2), f(3, 3)), is: ErrShape, want: "concat: b"},
		{name: "concat out width", call: concat(f(2, 4), f(2, 2), f(2, 3)), is: ErrShape, want: "concat: out"},
		{name: "concat a dtype", call: concat(f(2, 5), ten(I32, 2, 2), f(2, 3)), is: ErrDType, want: "concat: a"},
	})
}

func TestRoPEAndCacheShapes(t *testing.T) {
	const be = "be"
	f := func(shape ...int) *ownTensor { return ten(F32, shape...) }
	i32 := func(shape ...int) *ownTensor { return ten(I32, shape...) }
	good := RoPEParams{NumHeads: 2, HeadSize: 8, Offset: 2, RotaryDim: 4}
	rope := func(edit func(*RoPEParams), x, pos, cos, sin Tensor) func() ([]int, error) {
		return func() ([]int, error) {
			p := good
			edit(&p)
			t, maxPos, err := RoPEShapes(be, x, pos, cos, sin, p)
			return []int{t, maxPos}, err
		}
	}
	same := func(*RoPEParams) {}
	write := func(cache, src, sm Tensor, col int, cacheTypes ...DType) func() ([]int, error) {
		return func() ([]int, error) {
			c, err := WriteCacheShapes(be, cache, src, sm, col, cacheTypes...)
			return []int{c.T, c.W, c.Col, c.Slots, c.Width}, err
		}
	}
	runShapeCases(t, []shapeCase{
		{name: "rope", call: rope(same, f(3, 16), i32(3), f(10, 2), f(10, 2)), sizes: []int{3, 10}},
		{name: "rope odd rotary dim", call: rope(func(p *RoPEParams) { p.RotaryDim = 3 }, f(3, 16), i32(3), f(10, 1), f(10, 1)), is: ErrShape, want: "rope: params"},
		{name: "rope past the head", call: rope(func(p *RoPEParams) { p.Offset = 5 }, f(3, 16), i32(3), f(10, 2), f(10, 2)), is: ErrShape, want: "rope: params"},
		{name: "rope negative offset", call: rope(func(p *RoPEParams) { p.Offset = -1 }, f(3, 16), i32(3), f(10, 2), f(10, 2)), is: ErrShape, want: "rope: params"},
		{name: "rope no heads", call: rope(func(p *RoPEParams) { p.NumHeads = 0 }, f(3, 0), i32(3), f(10, 2), f(10, 2)), is: ErrShape, want: "rope: params"},
		{name: "rope x width", call: rope(same, f(3, 15), i32(3), f(10, 2), f(10, 2)), is: ErrShape, want: "rope: x"},
		{name: "rope positions dtype", call: rope(same, f(3, 16), f(3), f(10, 2), f(10, 2)), is: ErrDType, want: "positions"},
		{name: "rope positions length", call: rope(same, f(3, 16), i32(2), f(10, 2), f(10, 2)), is: ErrShape, want: "positions"},
		{name: "rope cos width", call: rope(same, f(3, 16), i32(3), f(10, 3), f(10, 3)), is: ErrShape, want: "cos"},
		{name: "rope sin rows", call: rope(same, f(3, 16), i32(3), f(10, 2), f(9, 2)), is: ErrShape, want: "sin"},

		{name: "write_cache", call: write(f(4, 2, 8), f(3, 4), i32(3), 4), sizes: []int{3, 4, 4, 8, 8}},
		{name: "write_cache 8-bit", call: write(ten(F8E4M3, 4, 2, 8), f(3, 4), i32(3), 0, F32, F8E4M3)},
		{name: "write_cache 8-bit not taken", call: write(ten(F8E4M3, 4, 2, 8), f(3, 4), i32(3), 0), is: ErrDType, want: "write_cache: cache"},
		{name: "write_cache columns", call: write(f(4, 2, 8), f(3, 4), i32(3), 5), is: ErrShape, want: "columns [5, 9)"},
		{name: "write_cache negative column", call: write(f(4, 2, 8), f(3, 4), i32(3), -1), is: ErrShape, want: "columns [-1, 3)"},
		{name: "write_cache cache rank", call: write(f(8, 8), f(3, 4), i32(3), 0), is: ErrShape, want: "cache"},
		{name: "write_cache src dtype", call: write(f(4, 2, 8), ten(BF16, 3, 4), i32(3), 0), is: ErrDType, want: "src"},
		{name: "write_cache slot_mapping length", call: write(f(4, 2, 8), f(3, 4), i32(2), 0), is: ErrShape, want: "slot_mapping"},
	})
}

func TestAttentionShapes(t *testing.T) {
	const be = "be"
	f := func(shape ...int) *ownTensor { return ten(F32, shape...) }
	i32 := func(shape ...int) *ownTensor { return ten(I32, shape...) }
	good := AttentionParams{NumHeads: 4, NumKVHeads: 2, HeadDim: 8}
	attn := func(edit func(*AttentionParams), out, q, k, v Tensor, outTypes, cacheTypes []DType) func() ([]int, error) {
		return func() ([]int, error) {
			p := good
			edit(&p)
			t, err := AttentionShapes(be, out, q, k, v, p, outTypes, cacheTypes)
			return []int{t}, err
		}
	}
	same := func(*AttentionParams) {}
	// goodMeta is a step of 2 sequences and 3 tokens over blocks of 4,
	// changed by edit.
	goodMeta := func(edit func(*AttentionMetadata)) *AttentionMetadata {
		m := &AttentionMetadata{NumSeqs: 2, NumTokens: 3, BlockSize: 4, CuSeqlensQ: i32(3), SeqlensK: i32(2), BlockTables: i32(2, 5)}
		edit(m)
		return m
	}
	meta := func(m *AttentionMetadata, numTokens, blockSize int) func() ([]int, error) {
		return func() ([]int, error) {
			_, _, bt, err := MetadataShapes[*ownTensor](be, "attention", m, numTokens, blockSize)
			if err != nil {
				return nil, err
			}
			return bt.Shape(), nil
		}
	}
	sameMeta := func(*AttentionMetadata) {}
	runShapeCases(t, []shapeCase{
		{name: "attention", call: attn(same, f(3, 32), f(3, 32), f(5, 4, 16), f(5, 4, 16), nil, nil), sizes: []int{3}},
		{name: "attention 16-bit out", call: attn(same, ten(BF16, 3, 32), f(3, 32), f(5, 4, 16), f(5, 4, 16), []DType{F32, BF16}, nil)},
		{name: "attention 16-bit out not taken", call: attn(same, ten(BF16, 3, 32), f(3, 32), f(5, 4, 16), f(5, 4, 16), nil, nil), is: ErrDType, want: "attention: out"},
		{name: "attention input dtype", call: attn(func(p *AttentionParams) { p.InputDType = BF16 }, f(3, 32), f(3, 32), f(5, 4, 16), f(5, 4, 16), nil, nil)},
		{name: "attention bad input dtype", call: attn(func(p *AttentionParams) { p.InputDType = I32 }, f(3, 32), f(3, 32), f(5, 4, 16), f(5, 4, 16), nil, nil), is: ErrDType, want: "input dtype"},
		{name: "attention kv heads", call: attn(func(p *AttentionParams) { p.NumKVHeads = 3 }, f(3, 32), f(3, 32), f(5, 4, 24), f(5, 4, 24), nil, nil), is: ErrShape, want: "attention: params"},
		{name: "attention window", call: attn(func(p *AttentionParams) { p.SlidingWindow = -1 }, f(3, 32), f(3, 32), f(5, 4, 16), f(5, 4, 16), nil, nil), is: ErrShape, want: "attention: params"},
		{name: "attention q width", call: attn(same, f(3, 32), f(3, 31), f(5, 4, 16), f(5, 4, 16), nil, nil), is: ErrShape, want: "attention: q"},
		{name: "attention q dtype", call: attn(same, f(3, 32), ten(BF16, 3, 32), f(5, 4, 16), f(5, 4, 16), nil, nil), is: ErrDType, want: "attention: q"},
		{name: "attention out rows", call: attn(same, f(2, 32), f(3, 32), f(5, 4, 16), f(5, 4, 16), nil, nil), is: ErrShape, want: "attention: out"},
		{name: "attention k width", call: attn(same, f(3, 32), f(3, 32), f(5, 4, 8), f(5, 4, 8), nil, nil), is: ErrShape, want: "k_cache"},
		{name: "attention 8-bit cache", call: attn(same, f(3, 32), f(3, 32), ten(F8E4M3, 5, 4, 16), ten(F8E4M3, 5, 4, 16), nil, []DType{F32, F8E4M3})},
		{name: "attention mixed caches", call: attn(same, f(3, 32), f(3, 32), f(5, 4, 16), ten(F8E4M3, 5, 4, 16), nil, []DType{F32, F8E4M3}), is: ErrDType, want: "v_cache"},
		{name: "attention v blocks", call: attn(same, f(3, 32), f(3, 32), f(5, 4, 16), f(5, 2, 16), nil, nil), is: ErrShape, want: "v_cache"},

		{name: "metadata", call: meta(goodMeta(sameMeta), 3, 4), sizes: []int{2, 5}},
		{name: "metadata empty step", call: meta(goodMeta(func(m *AttentionMetadata) {
			m.NumSeqs, m.NumTokens, m.CuSeqlensQ, m.SeqlensK, m.BlockTables = 0, 0, i32(1), i32(0), i32(0, 5)
		}), 0, 4)},
		{name: "metadata nil", call: meta(nil, 3, 4), is: ErrShape, want: "nil metadata"},
		{name: "metadata block size", call: meta(goodMeta(sameMeta), 3, 8), is: ErrShape, want: "metadata block size 4, cache block size 8"},
		{name: "metadata zero block size", call: meta(goodMeta(func(m *AttentionMetadata) { m.BlockSize = 0 }), 3, 0), is: ErrShape, want: "block size"},
		{name: "metadata nil tensor", call: meta(goodMeta(func(m *AttentionMetadata) { m.SeqlensK = nil }), 3, 4), is: ErrForeignTensor, want: "seqlens_k"},
		{name: "metadata foreign tensor", call: meta(goodMeta(func(m *AttentionMetadata) { m.BlockTables = fakeTensor{[]int{2, 5}, I32} }), 3, 4), is: ErrForeignTensor, want: "block_tables"},
		{name: "metadata negative sequences", call: meta(goodMeta(func(m *AttentionMetadata) { m.NumSeqs = -1 }), 3, 4), is: ErrShape, want: "-1 sequences"},
		{name: "metadata no sequences", call: meta(goodMeta(func(m *AttentionMetadata) { m.NumSeqs = 0 }), 3, 4), is: ErrShape, want: "0 sequences for 3 tokens"},
		{name: "metadata tokens", call: meta(goodMeta(func(m *AttentionMetadata) { m.NumTokens = 2 }), 3, 4), is: ErrShape, want: "metadata has 2 tokens, q has 3 rows"},
		{name: "metadata cu_seqlens_q", call: meta(goodMeta(func(m *AttentionMetadata) { m.CuSeqlensQ = i32(2) }), 3, 4), is: ErrShape, want: "cu_seqlens_q"},
		{name: "metadata seqlens_k dtype", call: meta(goodMeta(func(m *AttentionMetadata) { m.SeqlensK = f(2) }), 3, 4), is: ErrDType, want: "seqlens_k"},
		{name: "metadata block_tables rows", call: meta(goodMeta(func(m *AttentionMetadata) { m.BlockTables = i32(3, 5) }), 3, 4), is: ErrShape, want: "block_tables"},
	})
}

func TestLogitsAndResolveShapes(t *testing.T) {
	const be = "be"
	f := func(shape ...int) *ownTensor { return ten(F32, shape...) }
	i32 := func(shape ...int) *ownTensor { return ten(I32, shape...) }
	logits := func(out, hidden, rows, norm, head Tensor) func() ([]int, error) {
		return func() ([]int, error) {
			t, r, dim, vocab, err := LogitsShapes(be, out, hidden, rows, norm, head)
			return []int{t, r, dim, vocab}, err
		}
	}
	resolve := func(ids, from, sampled Tensor) func() ([]int, error) {
		return func() ([]int, error) {
			t, r, err := ResolveShapes(be, ids, from, sampled)
			return []int{t, r}, err
		}
	}
	runShapeCases(t, []shapeCase{
		{name: "logits", call: logits(f(2, 100), f(5, 8), i32(2), f(8), ten(BF16, 100, 8)), sizes: []int{5, 2, 8, 100}},
		{name: "logits all rows", call: logits(f(5, 100), f(5, 8), nil, nil, f(100, 8)), sizes: []int{5, 5, 8, 100}},
		{name: "logits typed nil options", call: logits(f(5, 100), f(5, 8), noTensor, noTensor, f(100, 8)), sizes: []int{5, 5, 8, 100}},
		{name: "logits head width", call: logits(f(2, 100), f(5, 8), i32(2), nil, f(100, 7)), is: ErrShape, want: "logits: head"},
		{name: "logits head dtype", call: logits(f(2, 100), f(5, 8), i32(2), nil, ten(I32, 100, 8)), is: ErrDType, want: "logits: head"},
		{name: "logits hidden dtype", call: logits(f(2, 100), ten(BF16, 5, 8), i32(2), nil, f(100, 8)), is: ErrDType, want: "logits: hidden"},
		{name: "logits rows dtype", call: logits(f(2, 100), f(5, 8), f(2), nil, f(100, 8)), is: ErrDType, want: "logits: rows"},
		{name: "logits out rows", call: logits(f(5, 100), f(5, 8), i32(2), nil, f(100, 8)), is: ErrShape, want: "logits: out"},
		{name: "logits norm", call: logits(f(2, 100), f(5, 8), i32(2), f(7), f(100, 8)), is: ErrShape, want: "logits: norm"},

		{name: "resolve", call: resolve(i32(4), i32(4), i32(2)), sizes: []int{4, 2}},
		{name: "resolve from_row length", call: resolve(i32(4), i32(3), i32(2)), is: ErrShape, want: "resolve_placeholders: from_row"},
		{name: "resolve sampled dtype", call: resolve(i32(4), i32(4), f(2)), is: ErrDType, want: "sampled"},
		{name: "resolve ids rank", call: resolve(i32(4, 1), i32(4), i32(2)), is: ErrShape, want: "ids"},
	})
}

func TestMatmulShapes(t *testing.T) {
	const be = "be"
	f := func(shape ...int) *ownTensor { return ten(F32, shape...) }
	all := []DType{F32, BF16, F16}
	linear := func(out, x, w Tensor, xTypes ...DType) func() ([]int, error) {
		return func() ([]int, error) {
			m, n, k, err := LinearShapes(be, out, x, w, nil, xTypes...)
			return []int{m, n, k}, err
		}
	}
	mlp := func(out, x, gu, down Tensor, xTypes ...DType) func() ([]int, error) {
		return func() ([]int, error) {
			rows, hidden, n, err := GatedMLPShapes(be, out, x, gu, down, xTypes...)
			return []int{rows, hidden, n}, err
		}
	}
	moe := func(gu, down Tensor) func() ([]int, error) {
		return func() ([]int, error) {
			d, err := MoEShapes(be, f(2, 8), f(2, 8), ten(I32, 2, 3), f(2, 3), gu, down)
			return []int{d.NumExperts, d.Inter}, err
		}
	}
	runShapeCases(t, []shapeCase{
		{name: "linear rounded x", call: linear(f(3, 5), ten(BF16, 3, 4), ten(BF16, 5, 4), all...), sizes: []int{3, 5, 4}},
		{name: "linear x of other 16-bit type", call: linear(f(3, 5), ten(BF16, 3, 4), ten(F16, 5, 4), all...), is: ErrShape, want: "linear: x of dtype BF16 with weights of dtype F16"},
		{name: "linear 16-bit x over F32 weights", call: linear(f(3, 5), ten(F16, 3, 4), f(5, 4), all...), is: ErrShape, want: "16-bit dtype"},
		{name: "linear 16-bit x not taken", call: linear(f(3, 5), ten(BF16, 3, 4), ten(BF16, 5, 4)), is: ErrDType, want: "linear: x"},

		{name: "gated_mlp", call: mlp(f(3, 8), f(3, 8), ten(BF16, 10, 8), ten(BF16, 8, 5)), sizes: []int{3, 8, 5}},
		{name: "gated_mlp rounded x", call: mlp(f(3, 8), ten(BF16, 3, 8), ten(BF16, 10, 8), ten(BF16, 8, 5), all...)},
		{name: "gated_mlp rounded x not taken", call: mlp(f(3, 8), ten(BF16, 3, 8), ten(BF16, 10, 8), ten(BF16, 8, 5)), is: ErrDType, want: "gated_mlp: x"},
		{name: "gated_mlp x of other 16-bit type", call: mlp(f(3, 8), ten(F16, 3, 8), ten(BF16, 10, 8), ten(BF16, 8, 5), all...), is: ErrShape, want: "16-bit dtype"},
		{name: "gated_mlp odd gate_up", call: mlp(f(3, 8), f(3, 8), ten(BF16, 9, 8), ten(BF16, 8, 4)), is: ErrShape, want: "gate_up BF16[9 8] has an odd row count"},
		{name: "gated_mlp gate_up dtype", call: mlp(f(3, 8), f(3, 8), ten(I32, 10, 8), ten(I32, 8, 5)), is: ErrDType, want: "gate_up"},
		{name: "gated_mlp gate_up width", call: mlp(f(3, 8), f(3, 8), ten(BF16, 10, 7), ten(BF16, 8, 5)), is: ErrShape, want: "gate_up"},
		{name: "gated_mlp down dtype", call: mlp(f(3, 8), f(3, 8), ten(BF16, 10, 8), ten(F16, 8, 5)), is: ErrDType, want: "down"},
		{name: "gated_mlp down shape", call: mlp(f(3, 8), f(3, 8), ten(BF16, 10, 8), ten(BF16, 8, 4)), is: ErrShape, want: "down"},
		{name: "gated_mlp out", call: mlp(f(3, 7), f(3, 8), ten(BF16, 10, 8), ten(BF16, 8, 5)), is: ErrShape, want: "out"},

		{name: "moe", call: moe(ten(BF16, 4, 10, 8), ten(BF16, 4, 8, 5)), sizes: []int{4, 5}},
		{name: "moe down of another dtype", call: moe(ten(BF16, 4, 10, 8), ten(F16, 4, 8, 5)), is: ErrDType, want: "moe: down"},
	})
}

// TestClampedSwiGLUShapes: the biases and the activation's parameters that
// MoEClampedSwiGLU adds to MoE's arguments.
func TestClampedSwiGLUShapes(t *testing.T) {
	const be = "be"
	d := MoEDims{T: 2, Hidden: 8, NumExperts: 4, Inter: 5, TopK: 3}
	good := ClampedSwiGLU{Limit: 7, Alpha: 1.702}
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	call := func(gub, dnb Tensor, p ClampedSwiGLU) func() ([]int, error) {
		return func() ([]int, error) { return nil, ClampedSwiGLUShapes(be, d, gub, dnb, p) }
	}
	runShapeCases(t, []shapeCase{
		{name: "good", call: call(ten(F32, 4, 10), ten(F32, 4, 8), good)},
		{name: "gate_up_bias shape", call: call(ten(F32, 4, 5), ten(F32, 4, 8), good), is: ErrShape, want: "moe_clamped_swiglu: gate_up_bias"},
		{name: "gate_up_bias dtype", call: call(ten(BF16, 4, 10), ten(F32, 4, 8), good), is: ErrDType, want: "gate_up_bias"},
		{name: "down_bias shape", call: call(ten(F32, 4, 10), ten(F32, 3, 8), good), is: ErrShape, want: "down_bias"},
		{name: "limit zero", call: call(ten(F32, 4, 10), ten(F32, 4, 8), ClampedSwiGLU{Alpha: 1}), is: ErrShape, want: "limit 0"},
		{name: "limit NaN", call: call(ten(F32, 4, 10), ten(F32, 4, 8), ClampedSwiGLU{Limit: nan, Alpha: 1}), is: ErrShape, want: "limit NaN"},
		{name: "limit infinite", call: call(ten(F32, 4, 10), ten(F32, 4, 8), ClampedSwiGLU{Limit: inf, Alpha: 1}), is: ErrShape, want: "limit +Inf"},
		{name: "alpha NaN", call: call(ten(F32, 4, 10), ten(F32, 4, 8), ClampedSwiGLU{Limit: 7, Alpha: nan}), is: ErrShape, want: "alpha NaN"},
	})
}

func TestQKVShapes(t *testing.T) {
	const be = "be"
	f := func(shape ...int) *ownTensor { return ten(F32, shape...) }
	i32 := func(shape ...int) *ownTensor { return ten(I32, shape...) }
	good := func() QKV {
		return QKV{QKV: f(2, 4*8), Q: f(2, 2*8), K: f(2, 8), V: f(2, 8),
			KCache: ten(F16, 2, 4, 8), VCache: ten(F16, 2, 4, 8),
			SlotMapping: i32(2), Positions: i32(2), Cos: f(10, 4), Sin: f(10, 4),
			NumHeads: 2, NumKVHeads: 1, HeadDim: 8, RoPE: RoPEParams{RotaryDim: 8}}
	}
	qkv := func(edit func(*QKV), cacheTypes ...DType) func() ([]int, error) {
		return func() ([]int, error) {
			a := good()
			edit(&a)
			t, maxPos, err := QKVShapes(be, a, cacheTypes...)
			return []int{t, maxPos}, err
		}
	}
	halfCaches := []DType{F32, F16}
	runShapeCases(t, []shapeCase{
		{name: "good", call: qkv(func(*QKV) {}, halfCaches...), sizes: []int{2, 10}},
		{name: "norms", call: qkv(func(a *QKV) { a.QNorm, a.KNorm = f(8), f(8) }, halfCaches...)},
		{name: "no scratch needed", call: qkv(func(a *QKV) { a.K, a.V = nil, nil }, halfCaches...)},
		{name: "typed nil norms", call: qkv(func(a *QKV) { a.QNorm, a.KNorm = noTensor, noTensor }, halfCaches...)},
		{name: "cache dtype not taken", call: qkv(func(*QKV) {}), is: ErrDType, want: "qkv_prepare: k_cache"},
		{name: "odd rotary dim", call: qkv(func(a *QKV) { a.RoPE.RotaryDim = 7 }, halfCaches...), is: ErrShape, want: "qkv_prepare: 2 heads"},
		{name: "rotation past the head", call: qkv(func(a *QKV) { a.RoPE.Offset = 2 }, halfCaches...), is: ErrShape, want: "rope"},
		{name: "no kv heads", call: qkv(func(a *QKV) { a.NumKVHeads = 0 }, halfCaches...), is: ErrShape, want: "0 kv heads"},
		{name: "one norm", call: qkv(func(a *QKV) { a.QNorm = f(8) }, halfCaches...), is: ErrShape, want: "both set or both nil"},
		{name: "qkv width", call: qkv(func(a *QKV) { a.QKV = f(2, 31) }, halfCaches...), is: ErrShape, want: "qkv_prepare: qkv"},
		{name: "q width", call: qkv(func(a *QKV) { a.Q = f(2, 15) }, halfCaches...), is: ErrShape, want: "qkv_prepare: q is"},
		{name: "cache width", call: qkv(func(a *QKV) { a.KCache = ten(F16, 2, 4, 9) }, halfCaches...), is: ErrShape, want: "k_cache"},
		{name: "v cache dtype", call: qkv(func(a *QKV) { a.VCache = f(2, 4, 8) }, halfCaches...), is: ErrDType, want: "v_cache"},
		{name: "nil v cache", call: qkv(func(a *QKV) { a.VCache = nil }, halfCaches...), is: ErrForeignTensor, want: "v_cache"},
		{name: "slot mapping dtype", call: qkv(func(a *QKV) { a.SlotMapping = f(2) }, halfCaches...), is: ErrDType, want: "slot_mapping"},
		{name: "positions length", call: qkv(func(a *QKV) { a.Positions = i32(3) }, halfCaches...), is: ErrShape, want: "positions"},
		{name: "cos width", call: qkv(func(a *QKV) { a.Cos = f(10, 3) }, halfCaches...), is: ErrShape, want: "cos"},
		{name: "sin rows", call: qkv(func(a *QKV) { a.Sin = f(9, 4) }, halfCaches...), is: ErrShape, want: "sin"},
		{name: "norm width", call: qkv(func(a *QKV) { a.QNorm, a.KNorm = f(8), f(7) }, halfCaches...), is: ErrShape, want: "k_norm"},
	})
}

func TestMemoryShapes(t *testing.T) {
	const be = "be"
	f := func(shape ...int) *ownTensor { return ten(F32, shape...) }
	alloc := func(d DType, shape ...int) func() ([]int, error) {
		return func() ([]int, error) {
			n, err := AllocShapes(be, d, shape)
			return []int{n}, err
		}
	}
	upload := func(dst Tensor, bytes int, d DType) func() ([]int, error) {
		return func() ([]int, error) {
			n, widen, err := UploadShapes(be, dst, bytes, d)
			w := 0
			if widen {
				w = 1
			}
			return []int{n, w}, err
		}
	}
	download := func(bytes int, src Tensor) func() ([]int, error) {
		return func() ([]int, error) {
			n, err := DownloadShapes(be, bytes, src)
			return []int{n}, err
		}
	}
	rows := func(src Tensor, lo, hi int) func() ([]int, error) {
		return func() ([]int, error) { return nil, RowsShapes(be, src, lo, hi) }
	}
	reshape := func(src Tensor, shape ...int) func() ([]int, error) {
		return func() ([]int, error) { return nil, ReshapeShapes(be, src, shape) }
	}
	runShapeCases(t, []shapeCase{
		{name: "alloc", call: alloc(BF16, 2, 3), sizes: []int{6}},
		{name: "alloc scalar", call: alloc(F32), sizes: []int{1}},
		{name: "alloc negative", call: alloc(F32, 2, -1), is: ErrShape, want: "alloc F32[2 -1]: negative dimension"},
		{name: "alloc unknown dtype", call: alloc(DType(99), 2), is: ErrDType, want: "alloc"},

		{name: "upload", call: upload(f(2, 3), 24, F32), sizes: []int{6, 0}},
		{name: "upload widened", call: upload(f(2, 3), 12, BF16), sizes: []int{6, 1}},
		{name: "upload 8-bit", call: upload(ten(F8E4M3, 2, 3), 6, F8E4M3), sizes: []int{6, 0}},
		{name: "upload size", call: upload(f(2, 3), 20, F32), is: ErrShape, want: "upload 20 bytes of F32 into F32[2 3]: want 24 bytes"},
		{name: "upload unknown dtype", call: upload(f(2, 3), 0, DType(99)), is: ErrShape, want: "upload"},
		{name: "upload i32 into f32", call: upload(f(2, 3), 24, I32), is: ErrDType, want: "upload I32 into F32[2 3]"},
		{name: "upload narrowed", call: upload(ten(BF16, 2, 3), 24, F32), is: ErrDType, want: "upload"},
		{name: "upload nil", call: upload(nil, 0, F32), is: ErrForeignTensor, want: "upload: dst"},

		{name: "download", call: download(12, ten(F16, 2, 3)), sizes: []int{12}},
		{name: "download size", call: download(24, ten(F16, 2, 3)), is: ErrShape, want: "download F16[2 3] into 24 bytes: want 12"},
		{name: "download nil", call: download(0, noTensor), is: ErrForeignTensor, want: "download: src"},

		{name: "rows", call: rows(f(4, 2), 1, 3)},
		{name: "rows empty", call: rows(f(4, 2), 4, 4)},
		{name: "rows past the end", call: rows(f(4, 2), 1, 5), is: ErrShape, want: "rows [1, 5) of F32[4 2]"},
		{name: "rows reversed", call: rows(f(4, 2), 3, 2), is: ErrShape, want: "rows"},
		{name: "rows negative", call: rows(f(4, 2), -1, 2), is: ErrShape, want: "rows"},
		{name: "rows of a scalar", call: rows(f(), 0, 0), is: ErrShape, want: "rows"},

		{name: "reshape", call: reshape(f(2, 3), 3, 2)},
		{name: "reshape count", call: reshape(f(2, 3), 4, 2), is: ErrShape, want: "reshape F32[2 3] to [4 2]"},
		{name: "reshape negative", call: reshape(f(2, 3), -1, -6), is: ErrShape, want: "reshape"},
	})
}

// CheckShape reports a missing argument as As does, instead of failing on
// it.
func TestCheckShapeMissing(t *testing.T) {
	for _, missing := range []Tensor{nil, noTensor} {
		err := CheckShape("be", "add", "a", missing, []int{2})
		if !errors.Is(err, ErrForeignTensor) || !strings.HasPrefix(err.Error(), "be: add: a is ") {
			t.Errorf("CheckShape(%T) = %v, want ErrForeignTensor naming the argument", missing, err)
		}
	}
}
