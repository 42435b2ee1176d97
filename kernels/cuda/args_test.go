package cuda

import (
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// These tests need no GPU: arguments are checked before anything reaches
// the device, so a Backend that was never opened refuses bad calls as an
// open one does.

// newTensor is a tensor of this backend with no device memory, for
// argument checks only.
func newTensor(d kernels.DType, shape ...int) kernels.Tensor {
	return &Tensor{shape: shape, dtype: d, buf: &buffer{}}
}

// Bad arguments that both backends refuse fail with the same error on
// each, but for the backend's name: the checks are the shared ones of
// package kernels.
func TestBadCallsFailAsOnCPU(t *testing.T) {
	host := cpu.New(cpu.Options{Threads: 1})
	defer host.Close()
	hostTensor := func(d kernels.DType, shape ...int) kernels.Tensor {
		x, err := host.Alloc(d, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	type mk = func(kernels.DType, ...int) kernels.Tensor
	rope := kernels.RoPEParams{NumHeads: 2, HeadSize: 4, RotaryDim: 4}
	ap := kernels.AttentionParams{NumHeads: 2, NumKVHeads: 1, HeadDim: 4, Scale: 1}
	meta := func(n mk, numTokens int) *kernels.AttentionMetadata {
		return &kernels.AttentionMetadata{NumSeqs: 1, NumTokens: numTokens, BlockSize: 2,
			CuSeqlensQ: n(kernels.I32, 2), SeqlensK: n(kernels.I32, 1), BlockTables: n(kernels.I32, 1, 2)}
	}
	route := kernels.RouteParams{TopK: 2, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy}
	mla := kernels.MLAParams{NumHeads: 2, NopeDim: 4, RopeDim: 2, KVLoraRank: 8, VHeadDim: 3}
	const f32, bf16, i32 = kernels.F32, kernels.BF16, kernels.I32
	tests := []struct {
		name string
		call func(ops kernels.Ops, n mk) error
	}{
		{"alloc", func(ops kernels.Ops, n mk) error { _, err := ops.Alloc(f32, 2, -3); return err }},
		{"upload", func(ops kernels.Ops, n mk) error { return ops.Upload(n(f32, 2, 3), make([]byte, 20), f32) }},
		{"upload dtype", func(ops kernels.Ops, n mk) error { return ops.Upload(n(bf16, 2), make([]byte, 8), f32) }},
		{"download", func(ops kernels.Ops, n mk) error { return ops.Download(make([]byte, 4), n(f32, 2)) }},
		{"rows", func(ops kernels.Ops, n mk) error { _, err := ops.Rows(n(f32, 4, 2), 3, 5); return err }},
		{"reshape", func(ops kernels.Ops, n mk) error { _, err := ops.Reshape(n(f32, 2, 3), 5); return err }},
		{"embedding", func(ops kernels.Ops, n mk) error { return ops.Embedding(n(f32, 2, 8), n(f32, 10, 8), n(f32, 2)) }},
		{"rms_norm", func(ops kernels.Ops, n mk) error { return ops.RMSNorm(n(f32, 2, 8), n(f32, 2, 8), n(f32, 7), 1e-6) }},
		{"add_rms_norm", func(ops kernels.Ops, n mk) error {
			return ops.AddRMSNorm(n(f32, 2, 8), n(f32, 3, 8), n(f32, 2, 8), n(f32, 8), 1e-6)
		}},
		{"linear", func(ops kernels.Ops, n mk) error { return ops.Linear(n(f32, 3, 6), n(f32, 3, 4), n(bf16, 5, 4), nil) }},
		{"linear bias", func(ops kernels.Ops, n mk) error {
			return ops.Linear(n(f32, 3, 5), n(f32, 3, 4), n(bf16, 5, 4), n(f32, 4))
		}},
		{"silu_mul", func(ops kernels.Ops, n mk) error { return ops.SiLUMul(n(f32, 2, 3), n(f32, 2, 7)) }},
		{"add", func(ops kernels.Ops, n mk) error { return ops.Add(n(bf16, 2, 3), n(f32, 2, 3), n(f32, 2, 3)) }},
		{"concat", func(ops kernels.Ops, n mk) error { return ops.Concat(n(f32, 2, 4), n(f32, 2, 2), n(f32, 2, 3)) }},
		{"split_columns", func(ops kernels.Ops, n mk) error {
			return ops.SplitColumns(n(f32, 2, 5), n(f32, 2, 2), n(f32, 2, 2))
		}},
		{"rope", func(ops kernels.Ops, n mk) error {
			return ops.RoPE(n(f32, 2, 8), n(i32, 3), n(f32, 8, 2), n(f32, 8, 2), rope)
		}},
		{"write_cache", func(ops kernels.Ops, n mk) error {
			return ops.WriteCache(n(f32, 2, 2, 4), n(bf16, 2, 4), n(i32, 2), 0)
		}},
		{"write_cache columns", func(ops kernels.Ops, n mk) error {
			return ops.WriteCache(n(f32, 2, 2, 4), n(f32, 2, 4), n(i32, 2), 1)
		}},
		{"attention", func(ops kernels.Ops, n mk) error {
			return ops.Attention(n(f32, 2, 8), n(f32, 2, 8), n(f32, 2, 2, 4), n(f32, 2, 1, 4), meta(n, 2), ap)
		}},
		{"attention metadata", func(ops kernels.Ops, n mk) error {
			return ops.Attention(n(f32, 3, 8), n(f32, 3, 8), n(f32, 2, 2, 4), n(f32, 2, 2, 4), meta(n, 2), ap)
		}},
		{"mla_attention", func(ops kernels.Ops, n mk) error {
			return ops.MLAAttention(n(f32, 2, 6), n(f32, 2, 12), n(f32, 2, 2, 10), n(bf16, 14, 7), meta(n, 2), mla)
		}},
		{"moe_route", func(ops kernels.Ops, n mk) error {
			return ops.MoERoute(n(i32, 2, 2), n(f32, 2, 2), n(f32, 2, 8), n(f32, 7), route)
		}},
		{"moe", func(ops kernels.Ops, n mk) error {
			return ops.MoE(n(f32, 2, 8), n(f32, 2, 8), n(i32, 2, 1), n(f32, 2, 1), n(bf16, 2, 10, 8), n(kernels.F16, 2, 8, 5))
		}},
		{"resolve_placeholders", func(ops kernels.Ops, n mk) error {
			return ops.ResolvePlaceholders(n(i32, 3), n(i32, 2), n(i32, 2))
		}},
		{"shift_accepted", func(ops kernels.Ops, n mk) error {
			m := meta(n, 3)
			m.SlotMapping = n(i32, 3)
			return ops.ShiftAccepted(m, n(i32, 2), n(i32, 1), n(i32, 4))
		}},
		{"shift_accepted metadata", func(ops kernels.Ops, n mk) error {
			return ops.ShiftAccepted(meta(n, 3), n(i32, 3), n(i32, 1), n(i32, 4))
		}},
		{"logits", func(ops kernels.Ops, n mk) error {
			return ops.Logits(n(f32, 2, 10), n(f32, 4, 8), n(i32, 2), n(f32, 7), n(f32, 10, 8), 1e-6)
		}},
	}
	dev := &Backend{} // never opened: no call below reaches the device
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.call(host, hostTensor)
			got := tc.call(dev, newTensor)
			if want == nil || got == nil {
				t.Fatalf("cpu: %v, cuda: %v; want both to refuse the arguments", want, got)
			}
			w, g := strings.TrimPrefix(want.Error(), "cpu: "), strings.TrimPrefix(got.Error(), "cuda: ")
			if w != g || !strings.HasPrefix(got.Error(), "cuda: ") {
				t.Errorf("cuda refuses with %q, cpu with %q", got, want)
			}
		})
	}
}

// GatedMLP and PrepareQKV, which only this backend fuses, fail with the
// shared checks' errors.
func TestFusedOpsUseSharedChecks(t *testing.T) {
	n := newTensor
	const f32, bf16 = kernels.F32, kernels.BF16
	xTypes := []kernels.DType{f32, bf16, kernels.F16}
	qkv := kernels.QKV{QKV: n(f32, 2, 32), Q: n(f32, 2, 16), KCache: n(kernels.F16, 2, 4, 8), VCache: n(f32, 2, 4, 8),
		SlotMapping: n(kernels.I32, 2), Positions: n(kernels.I32, 2), Cos: n(f32, 10, 4), Sin: n(f32, 10, 4),
		NumHeads: 2, NumKVHeads: 1, HeadDim: 8, RoPE: kernels.RoPEParams{RotaryDim: 8}}
	tests := []struct {
		name         string
		call, shared func() error
	}{
		{"gated_mlp", func() error {
			return (&Backend{}).GatedMLP(n(f32, 3, 8), n(kernels.F16, 3, 8), n(bf16, 10, 8), n(bf16, 8, 5), nil, nil)
		}, func() error {
			_, _, _, err := kernels.GatedMLPShapes("cuda", n(f32, 3, 8), n(kernels.F16, 3, 8), n(bf16, 10, 8), n(bf16, 8, 5), xTypes...)
			return err
		}},
		{"qkv_prepare", func() error { return (&Backend{}).PrepareQKV(qkv) },
			func() error { _, _, err := kernels.QKVShapes("cuda", qkv, cacheDTypes...); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.shared()
			if want == nil {
				t.Fatal("the shared check accepts the case's arguments")
			}
			if got := tc.call(); got == nil || got.Error() != want.Error() {
				t.Errorf("error %v, want the shared check's %v", got, want)
			}
		})
	}
}
