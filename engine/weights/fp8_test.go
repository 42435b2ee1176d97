package weights

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

func TestF8E4M3Conversions(t *testing.T) {
	for b := range 256 {
		got, want := F8E4M3ToFloat32(uint8(b)), kernels.F8E4M3ToF32(uint8(b))
		if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
			t.Fatalf("F8E4M3ToFloat32(%#02x) = %g, kernels gives %g", b, got, want)
		}
		if got == got && Float32ToF8E4M3(got) != uint8(b) && got != 0 {
			t.Fatalf("Float32ToF8E4M3(%g) = %#02x, want %#02x", got, Float32ToF8E4M3(got), b)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		f := float32(r.NormFloat64() * math.Exp(r.NormFloat64()*4))
		if got, want := Float32ToF8E4M3(f), kernels.F32ToF8E4M3(f); got != want {
			t.Fatalf("Float32ToF8E4M3(%g) = %#02x, kernels gives %#02x", f, got, want)
		}
	}
}

// TestQuantizeFP8Blocks: each block's largest magnitude maps to 448, and
// every dequantized weight is within half an E4M3 step (2^-4 relative, or
// 2^-10 of the scale below the normal range) of the original.
func TestQuantizeFP8Blocks(t *testing.T) {
	for _, sh := range []struct{ n, k, bn, bk int }{{200, 300, 128, 128}, {7, 9, 4, 4}, {1, 130, 128, 128}} {
		r := rand.New(rand.NewPCG(uint64(sh.n), uint64(sh.k)))
		w := make([]float32, sh.n*sh.k)
		for i := range w {
			w[i] = float32(r.NormFloat64() * 0.02)
		}
		data, scales := QuantizeFP8Blocks(w, sh.n, sh.k, sh.bn, sh.bk)
		if want := ((sh.n + sh.bn - 1) / sh.bn) * ((sh.k + sh.bk - 1) / sh.bk); len(scales) != want {
			t.Fatalf("%d scales, want %d", len(scales), want)
		}
		deq := DequantizeFP8Blocks(data, scales, sh.n, sh.k, sh.bn, sh.bk)
		kb := (sh.k + sh.bk - 1) / sh.bk
		for i, v := range w {
			s := scales[(i/sh.k/sh.bn)*kb+(i%sh.k)/sh.bk]
			if tol := math.Max(math.Abs(float64(v))/16, float64(s)/1024); math.Abs(float64(deq[i]-v)) > tol {
				t.Fatalf("%v: w[%d] = %g dequantized to %g (scale %g)", sh, i, v, deq[i], s)
			}
		}
	}
	data, scales := QuantizeFP8Blocks(make([]float32, 16), 4, 4, 4, 4)
	if scales[0] != 1 || strings.Trim(string(data), "\x00") != "" {
		t.Errorf("all-zero block: scale %g, data %v", scales[0], data)
	}
}

func TestQuantizationConfig(t *testing.T) {
	base := map[string]any{"architectures": []string{"DeepseekV3ForCausalLM"}, "model_type": "deepseek_v3",
		"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1}
	for _, tc := range []struct {
		name  string
		qc    any
		want  Quantization
		error string
	}{
		{"absent", nil, Quantization{}, ""},
		{"deepseek-v3", map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": []int{128, 128}},
			Quantization{Method: "fp8", Fmt: "e4m3", ActivationScheme: "dynamic", WeightBlockSize: [2]int{128, 128}}, ""},
		{"qwen3-fp8", map[string]any{"quant_method": "fp8", "activation_scheme": "dynamic", "modules_to_not_convert": []string{"lm_head"}, "weight_block_size": []int{128, 128}},
			Quantization{Method: "fp8", Fmt: "e4m3", ActivationScheme: "dynamic", WeightBlockSize: [2]int{128, 128}, ModulesToNotConvert: []string{"lm_head"}}, ""},
		{"other method recorded", map[string]any{"quant_method": "awq", "bits": 4}, Quantization{Method: "awq"}, ""},
		{"e5m2", map[string]any{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": []int{128, 128}}, Quantization{}, `fmt "e5m2"`},
		{"static activations", map[string]any{"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": []int{128, 128}}, Quantization{}, "static"},
		{"per-tensor", map[string]any{"quant_method": "fp8"}, Quantization{}, "weight_block_size"},
		{"bad block", map[string]any{"quant_method": "fp8", "weight_block_size": []int{128}}, Quantization{}, "weight_block_size"},
		{"zero block", map[string]any{"quant_method": "fp8", "weight_block_size": []int{0, 128}}, Quantization{}, "weight_block_size"},
		{"not an object", "fp8", Quantization{}, "quantization_config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]any{}
			for k, v := range base {
				m[k] = v
			}
			if tc.qc != nil {
				m["quantization_config"] = tc.qc
			}
			data, _ := json.Marshal(m)
			cfg, err := ParseConfig(data)
			if tc.error != "" {
				if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.error) {
					t.Fatalf("err = %v, want ErrConfig mentioning %q", err, tc.error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := cfg.Quantization
			if got.Method != tc.want.Method || got.Fmt != tc.want.Fmt || got.ActivationScheme != tc.want.ActivationScheme ||
				got.WeightBlockSize != tc.want.WeightBlockSize || strings.Join(got.ModulesToNotConvert, ",") != strings.Join(tc.want.ModulesToNotConvert, ",") {
				t.Errorf("Quantization = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestOpenRealLayouts opens checkpoints laid out as published ones are:
// sharded with an index, FP8 weights whose scales sit in another shard,
// BF16/F16/F32/FP8 mixed, DeepSeek's extra MTP layer, and tensors a
// shard holds that its index does not list.
func TestOpenRealLayouts(t *testing.T) {
	f8 := func(name string, shape []int) testTensor {
		return testTensor{name, "F8_E4M3", shape, make([]byte, numElements(shape))}
	}
	shards := map[string][]testTensor{
		"model-00001-of-00003.safetensors": {
			{"model.embed_tokens.weight", "BF16", []int{8, 4}, make([]byte, 64)},
			f8("model.layers.0.self_attn.q_proj.weight", []int{4, 4}),
			{"model.layers.0.input_layernorm.weight", "F32", []int{4}, f32Bytes(1, 1, 1, 1)},
		},
		"model-00002-of-00003.safetensors": {
			{"model.layers.0.self_attn.q_proj.weight_scale_inv", "F32", []int{1, 1}, f32Bytes(0.5)},
			{"model.layers.0.mlp.down_proj.weight", "F16", []int{4, 8}, make([]byte, 64)},
			{"model.layers.1.eh_proj.weight", "BF16", []int{4, 8}, make([]byte, 64)}, // MTP layer
		},
		"model-00003-of-00003.safetensors": {
			{"lm_head.weight", "BF16", []int{8, 4}, make([]byte, 64)},
			{"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", []int{2}, f32Bytes(1, 0.5)}, // not in the index
		},
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, ConfigFile), []byte(tinyConfig))
	weightMap := map[string]string{}
	for shard, ts := range shards {
		writeFile(t, filepath.Join(dir, shard), encodeSafetensors(t, ts, map[string]string{"format": "pt"}))
		for _, tt := range ts {
			if !strings.Contains(tt.name, "rotary_emb") {
				weightMap[tt.name] = shard
			}
		}
	}
	index, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": weightMap})
	writeFile(t, filepath.Join(dir, IndexFile), index)
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, tc := range []struct {
		name  string
		dtype DType
		shard string
	}{
		{"model.layers.0.self_attn.q_proj.weight", F8E4M3, "model-00001-of-00003.safetensors"},
		{"model.layers.0.self_attn.q_proj.weight_scale_inv", F32, "model-00002-of-00003.safetensors"},
		{"model.layers.0.mlp.down_proj.weight", F16, "model-00002-of-00003.safetensors"},
		{"model.layers.1.eh_proj.weight", BF16, "model-00002-of-00003.safetensors"},
		{"model.layers.0.self_attn.rotary_emb.inv_freq", F32, "model-00003-of-00003.safetensors"},
	} {
		ten, err := ck.Tensor(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if ten.DType != tc.dtype || filepath.Base(ten.File) != tc.shard {
			t.Errorf("%s: %s in %s, want %s in %s", tc.name, ten.DType, filepath.Base(ten.File), tc.dtype, tc.shard)
		}
	}
	_, err = ck.Tensor("model.layers.0.self_attn.k_proj.weight")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), IndexFile) || !strings.Contains(err.Error(), `"model.layers.0.self_attn.k_proj.weight"`) {
		t.Errorf("missing tensor: err = %v, want ErrNotFound naming the index and the tensor", err)
	}
	q, _ := ck.Tensor("model.layers.0.self_attn.q_proj.weight")
	if got := q.Float32s(); len(got) != 16 || got[0] != 0 {
		t.Errorf("Float32s of F8_E4M3 zeros = %v", got)
	}
}
