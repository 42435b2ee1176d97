package cpu

import (
	"errors"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// A bad call of each op fails with the error of the shared argument check
// in package kernels, so that every backend refuses it the same way.
func TestBadCallsFailWithSharedError(t *testing.T) {
	b := newTestBackend(t, 1)
	f := func(shape ...int) kernels.Tensor { return alloc(t, b, shape...) }
	dt := func(d kernels.DType, shape ...int) kernels.Tensor { return allocDT(t, b, d, shape...) }
	i32 := func(shape ...int) kernels.Tensor { return dt(kernels.I32, shape...) }
	rope := kernels.RoPEParams{NumHeads: 2, HeadSize: 4, RotaryDim: 4}
	ap := kernels.AttentionParams{NumHeads: 2, NumKVHeads: 1, HeadDim: 4, Scale: 1}
	meta := &kernels.AttentionMetadata{NumSeqs: 1, NumTokens: 2, BlockSize: 2,
		CuSeqlensQ: i32(2), SeqlensK: i32(1), BlockTables: i32(1, 2)}
	route := kernels.RouteParams{TopK: 2, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy}
	mla := kernels.MLAParams{NumHeads: 2, NopeDim: 4, RopeDim: 2, KVLoraRank: 8, VHeadDim: 3}
	noBias := (*Tensor)(nil)

	// Each case's arguments are bad in one way; shared is the check the
	// call must fail with.
	tests := []struct {
		name   string
		call   func() error
		shared func() error
	}{
		{"alloc", func() error { _, err := b.Alloc(kernels.F32, 2, -3); return err },
			func() error { _, err := kernels.AllocShapes("cpu", kernels.F32, []int{2, -3}); return err }},
		{"upload", func() error { return b.Upload(f(2, 3), make([]byte, 20), kernels.F32) },
			func() error { _, _, err := kernels.UploadShapes("cpu", f(2, 3), 20, kernels.F32); return err }},
		{"download", func() error { return b.Download(make([]byte, 4), f(2)) },
			func() error { _, err := kernels.DownloadShapes("cpu", 4, f(2)); return err }},
		{"rows", func() error { _, err := b.Rows(f(4, 2), 3, 5); return err },
			func() error { return kernels.RowsShapes("cpu", f(4, 2), 3, 5) }},
		{"reshape", func() error { _, err := b.Reshape(f(2, 3), 5); return err },
			func() error { return kernels.ReshapeShapes("cpu", f(2, 3), []int{5}) }},
		{"embedding", func() error { return b.Embedding(f(2, 8), f(10, 8), f(2)) },
			func() error { _, _, _, err := kernels.EmbeddingShapes("cpu", f(2, 8), f(10, 8), f(2)); return err }},
		{"rms_norm", func() error { return b.RMSNorm(f(2, 8), f(2, 8), f(7), 1e-6) },
			func() error { _, _, err := kernels.NormShapes("cpu", "rms_norm", f(2, 8), f(2, 8), f(7)); return err }},
		{"add_rms_norm", func() error { return b.AddRMSNorm(f(2, 8), f(3, 8), f(2, 8), f(8), 1e-6) },
			func() error { _, _, err := kernels.AddNormShapes("cpu", f(2, 8), f(3, 8), f(2, 8), f(8)); return err }},
		{"linear", func() error { return b.Linear(f(3, 5), dt(kernels.BF16, 3, 4), dt(kernels.BF16, 5, 4), nil) },
			func() error {
				_, _, _, err := kernels.LinearShapes("cpu", f(3, 5), dt(kernels.BF16, 3, 4), dt(kernels.BF16, 5, 4), noBias)
				return err
			}},
		{"silu_mul", func() error { return b.SiLUMul(f(2, 3), f(2, 7)) },
			func() error { _, _, err := kernels.SiLUMulShapes("cpu", f(2, 3), f(2, 7)); return err }},
		{"add", func() error { return b.Add(dt(kernels.BF16, 2, 3), f(2, 3), f(2, 3)) },
			func() error { _, err := kernels.AddShapes("cpu", dt(kernels.BF16, 2, 3), f(2, 3), f(2, 3)); return err }},
		{"concat", func() error { return b.Concat(f(2, 4), f(2, 2), f(2, 3)) },
			func() error { _, _, _, err := kernels.ConcatShapes("cpu", f(2, 4), f(2, 2), f(2, 3)); return err }},
		{"split_columns", func() error { return b.SplitColumns(f(2, 5), f(2, 2), f(2, 2)) },
			func() error {
				_, _, err := kernels.SplitShapes("cpu", f(2, 5), []kernels.Tensor{f(2, 2), f(2, 2)})
				return err
			}},
		{"rope", func() error { return b.RoPE(f(2, 8), i32(3), f(8, 2), f(8, 2), rope) },
			func() error {
				_, _, err := kernels.RoPEShapes("cpu", f(2, 8), i32(3), f(8, 2), f(8, 2), rope)
				return err
			}},
		{"write_cache", func() error { return b.WriteCache(dt(kernels.BF16, 2, 2, 4), f(2, 4), i32(2), 0) },
			func() error {
				_, err := kernels.WriteCacheShapes("cpu", dt(kernels.BF16, 2, 2, 4), f(2, 4), i32(2), 0, cacheTypes...)
				return err
			}},
		{"attention", func() error { return b.Attention(dt(kernels.BF16, 2, 8), f(2, 8), f(2, 2, 4), f(2, 2, 4), meta, ap) },
			func() error {
				_, err := kernels.AttentionShapes("cpu", dt(kernels.BF16, 2, 8), f(2, 8), f(2, 2, 4), f(2, 2, 4), ap, nil, cacheTypes)
				return err
			}},
		{"attention metadata", func() error { return b.Attention(f(3, 8), f(3, 8), f(2, 2, 4), f(2, 2, 4), meta, ap) },
			func() error {
				_, _, _, err := kernels.MetadataShapes[*Tensor]("cpu", "attention", meta, 3, 2)
				return err
			}},
		{"mla_attention", func() error {
			return b.MLAAttention(f(2, 6), f(2, 12), f(2, 2, 10), dt(kernels.BF16, 14, 7), meta, mla)
		},
			func() error {
				_, err := kernels.MLAShapes("cpu", f(2, 6), f(2, 12), f(2, 2, 10), dt(kernels.BF16, 14, 7), mla)
				return err
			}},
		{"moe_route", func() error { return b.MoERoute(i32(2, 2), f(2, 2), f(2, 8), f(7), route) },
			func() error {
				_, _, err := kernels.RouteShapes("cpu", i32(2, 2), f(2, 2), f(2, 8), f(7), route)
				return err
			}},
		{"moe", func() error {
			return b.MoE(f(2, 8), f(2, 8), i32(2, 1), f(2, 1), dt(kernels.BF16, 2, 10, 8), dt(kernels.F16, 2, 8, 5))
		}, func() error {
			_, err := kernels.MoEShapes("cpu", f(2, 8), f(2, 8), i32(2, 1), f(2, 1), dt(kernels.BF16, 2, 10, 8), dt(kernels.F16, 2, 8, 5))
			return err
		}},
		{"resolve_placeholders", func() error { return b.ResolvePlaceholders(i32(3), i32(2), i32(2)) },
			func() error { _, _, err := kernels.ResolveShapes("cpu", i32(3), i32(2), i32(2)); return err }},
		{"logits", func() error { return b.Logits(f(2, 10), f(4, 8), i32(2), f(7), f(10, 8), 1e-6) },
			func() error {
				_, _, _, _, err := kernels.LogitsShapes("cpu", f(2, 10), f(4, 8), i32(2), f(7), f(10, 8))
				return err
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.shared()
			if want == nil {
				t.Fatal("the shared check accepts the case's arguments")
			}
			got := tc.call()
			if got == nil || got.Error() != want.Error() {
				t.Fatalf("error %v, want the shared check's %v", got, want)
			}
			for _, sentinel := range []error{kernels.ErrShape, kernels.ErrDType, kernels.ErrForeignTensor} {
				if errors.Is(got, sentinel) != errors.Is(want, sentinel) {
					t.Errorf("errors.Is(%v, %v) differs from the shared check's", got, sentinel)
				}
			}
		})
	}
}
