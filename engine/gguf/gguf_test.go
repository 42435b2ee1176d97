package gguf

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
)

// allValues has one metadata value of every type, arrays included.
var allValues = []KeyValue{
	{"general.architecture", String("llama")},
	{"t.u8", Uint8(200)}, {"t.i8", Int8(-100)}, {"t.u16", Uint16(60000)}, {"t.i16", Int16(-30000)},
	{"t.u32", Uint32(4e9)}, {"t.i32", Int32(-2e9)}, {"t.f32", Float32(1.5)}, {"t.bool", Bool(true)},
	{"t.str", String("héllo")}, {"t.u64", Uint64(1 << 63)}, {"t.i64", Int64(-1 << 62)}, {"t.f64", Float64(math.Pi)},
	{"a.u8", Array([]uint8{1, 2})}, {"a.i8", Array([]int8{-1})}, {"a.u16", Array([]uint16{7})},
	{"a.i16", Array([]int16{-7, 8})}, {"a.u32", Array([]uint32{})}, {"a.i32", Array([]int32{1, -2, 3})},
	{"a.f32", Array([]float32{0.5, -2})}, {"a.bool", Array([]bool{true, false})},
	{"a.str", Array([]string{"a", "", "ccc"})}, {"a.u64", Array([]uint64{9})}, {"a.i64", Array([]int64{-9})},
	{"a.f64", Array([]float64{1e300})},
}

// sampleFile writes a small file with every value type and three tensors.
func sampleFile(t testing.TB, align int) []byte {
	t.Helper()
	w := NewWriter()
	w.Alignment = align
	for _, kv := range allValues {
		w.Set(kv.Key, kv.Value)
	}
	f32 := make([]byte, 4*3*2)
	for i := range 6 {
		binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(float32(i)))
	}
	must(t, w.AddTensor("a", TypeF32, []int64{3, 2}, f32))
	must(t, w.AddTensor("b", TypeQ8_0, []int64{64}, bytes.Repeat([]byte{1}, 68)))
	must(t, w.AddTensor("c", TypeQ4_K, []int64{256, 1, 1, 2}, bytes.Repeat([]byte{2}, 288)))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, align := range []int{0, 64, 1} {
		data := sampleFile(t, align)
		f, err := Parse(data)
		if err != nil {
			t.Fatalf("align %d: %v", align, err)
		}
		wantAlign := align
		if align == 0 {
			wantAlign = DefaultAlignment
		}
		if f.Version != 3 || f.Alignment != wantAlign || f.DataOffset%int64(wantAlign) != 0 {
			t.Errorf("align %d: version %d alignment %d data offset %d", align, f.Version, f.Alignment, f.DataOffset)
		}
		for _, kv := range allValues {
			got, ok := f.Get(kv.Key)
			if !ok || !reflect.DeepEqual(got.Any(), kv.Value.Any()) {
				t.Errorf("key %q: got %#v, want %#v", kv.Key, got.Any(), kv.Value.Any())
			}
		}
		tests := []struct {
			name  string
			typ   GGMLType
			shape []int64
			size  int64
			first byte
		}{
			{"a", TypeF32, []int64{2, 3}, 24, 0},
			{"b", TypeQ8_0, []int64{64}, 68, 1},
			{"c", TypeQ4_K, []int64{2, 1, 1, 256}, 288, 2},
		}
		for _, tc := range tests {
			info, b, err := f.TensorData(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if info.Type != tc.typ || !reflect.DeepEqual(info.Shape(), tc.shape) || info.Size != tc.size || int64(len(b)) != tc.size || b[0] != tc.first {
				t.Errorf("tensor %s: %+v shape %v, %d bytes", tc.name, info, info.Shape(), len(b))
			}
		}
		if _, b, _ := f.TensorData("a"); math.Float32frombits(binary.LittleEndian.Uint32(b[20:])) != 5 {
			t.Errorf("tensor a: wrong data")
		}
	}
}

func TestValueAccessors(t *testing.T) {
	if v, ok := Uint32(7).Int(); !ok || v != 7 {
		t.Error("Uint32.Int")
	}
	if _, ok := Uint64(math.MaxUint64).Int(); ok {
		t.Error("Uint64 max fits int64")
	}
	if v, ok := Float32(0.25).Float(); !ok || v != 0.25 {
		t.Error("Float32.Float")
	}
	if v, ok := Array([]int32{1, -2}).Ints(); !ok || !reflect.DeepEqual(v, []int64{1, -2}) {
		t.Error("Ints")
	}
	if _, ok := Array([]string{"x"}).Ints(); ok {
		t.Error("string array as Ints")
	}
	if Array([]bool{true}).Type() != ValueArray || String("x").Len() != -1 {
		t.Error("Type/Len")
	}
}

func TestOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	must(t, os.WriteFile(path, sampleFile(t, 0), 0o644))
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, b, err := f.TensorData("b"); err != nil || len(b) != 68 {
		t.Fatalf("TensorData: %v", err)
	}
	must(t, f.Close())
	if _, _, err := f.TensorData("b"); err == nil {
		t.Error("TensorData after Close")
	}
}

// TestTruncated cuts the file at every length: each prefix is an error
// (a prefix never holds all the tensor data), never a panic.
func TestTruncated(t *testing.T) {
	data := sampleFile(t, 0)
	for n := range len(data) - 1 {
		if _, err := Parse(data[:n]); err == nil || !errors.Is(err, ErrFormat) {
			t.Fatalf("prefix of %d bytes: err %v", n, err)
		}
	}
}

// header builds a file by hand: magic, version, counts, then body.
func header(version uint32, numTensors, numKV uint64, body ...[]byte) []byte {
	b := []byte(Magic)
	b = binary.LittleEndian.AppendUint32(b, version)
	b = binary.LittleEndian.AppendUint64(b, numTensors)
	b = binary.LittleEndian.AppendUint64(b, numKV)
	for _, x := range body {
		b = append(b, x...)
	}
	return b
}

func gstr(s string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(s))), s...)
}

func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func tensorInfo(name string, dims []uint64, typ uint32, off uint64) []byte {
	b := gstr(name)
	b = append(b, u32(uint32(len(dims)))...)
	for _, d := range dims {
		b = append(b, u64(d)...)
	}
	return append(append(b, u32(typ)...), u64(off)...)
}

// TestLyingFiles checks that each kind of lie is a clear error naming what
// it concerns.
func TestLyingFiles(t *testing.T) {
	pad := make([]byte, 64)
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"magic", []byte("GGUX\x03\x00\x00\x00"), "magic"},
		{"version", header(7, 0, 0), "version 7"},
		{"big endian", []byte("GGUF\x00\x00\x00\x03"), "big-endian"},
		{"kv count", header(3, 0, 1<<60), "metadata entries cannot fit"},
		{"tensor count", header(3, 1<<60, 0), "tensors cannot fit"},
		{"key length", header(3, 0, 1, u64(1<<40), pad), "key of metadata entry 0"},
		{"value type", header(3, 0, 1, gstr("k"), u32(99), pad), `key "k": unknown value type 99`},
		{"string length", header(3, 0, 1, gstr("k"), u32(8), u64(1<<50), pad), `key "k"`},
		{"array length", header(3, 0, 1, gstr("k"), u32(9), u32(6), u64(1<<61), pad), `key "k": array of 2305843009213693952 float32 cannot fit`},
		{"string array length", header(3, 0, 1, gstr("k"), u32(9), u32(8), u64(1<<40), pad), `key "k": array of`},
		{"nested array", header(3, 0, 1, gstr("k"), u32(9), u32(9), u64(1), pad), "arrays of arrays"},
		{"bool", header(3, 0, 1, gstr("k"), u32(7), []byte{2}, pad), `key "k": element 0: bool byte 2`},
		{"duplicate key", header(3, 0, 2, gstr("k"), u32(0), []byte{1}, gstr("k"), u32(0), []byte{1}, pad), `duplicate metadata key "k"`},
		{"alignment", header(3, 0, 1, gstr("general.alignment"), u32(4), u32(48), pad), `"general.alignment"`},
		{"alignment type", header(3, 0, 1, gstr("general.alignment"), u32(10), u64(32), pad), `"general.alignment"`},
		{"dims", header(3, 1, 0, tensorInfo("w", []uint64{1, 1, 1, 1, 1}, 0, 0), pad), `tensor "w": 5 dimensions`},
		{"zero dim", header(3, 1, 0, tensorInfo("w", []uint64{0}, 0, 0), pad), `tensor "w": dimension 0 is 0`},
		{"type", header(3, 1, 0, tensorInfo("w", []uint64{4}, 4, 0), pad), `tensor "w": unknown ggml type 4`},
		{"block", header(3, 1, 0, tensorInfo("w", []uint64{16}, uint32(TypeQ8_0), 0), pad), `tensor "w": innermost dimension 16`},
		{"overflow", header(3, 1, 0, tensorInfo("w", []uint64{1 << 40, 1 << 40}, 0, 0), pad), `tensor "w": dimensions`},
		{"overflow elements", header(3, 1, 0, tensorInfo("w", []uint64{1 << 62, 4}, uint32(TypeQ2_K), 0), pad), `tensor "w": dimensions`},
		{"past end", header(3, 1, 0, tensorInfo("w", []uint64{1024}, 0, 0), pad), `tensor "w": data`},
		{"offset", header(3, 1, 0, tensorInfo("w", []uint64{1}, 0, 1<<63), pad), `tensor "w": data offset`},
		{"unaligned", header(3, 1, 0, tensorInfo("w", []uint64{1}, 0, 4), pad), `tensor "w": data offset 4 is not a multiple`},
		{"overlap", header(3, 2, 0, tensorInfo("w", []uint64{2}, 0, 0), tensorInfo("v", []uint64{1}, 0, 0), pad), `overlaps`},
		{"duplicate tensor", header(3, 2, 0, tensorInfo("w", []uint64{1}, 0, 0), tensorInfo("w", []uint64{1}, 0, 32), pad, pad), `duplicate tensor "w"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.data)
			if err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrFormat mentioning %q", err, tc.want)
			}
		})
	}
}

func TestVersion2(t *testing.T) {
	data := sampleFile(t, 0)
	binary.LittleEndian.PutUint32(data[4:], 2)
	f, err := Parse(data)
	if err != nil || f.Version != 2 {
		t.Fatalf("v2: %v", err)
	}
}

func TestNames(t *testing.T) {
	tests := []struct {
		gguf, hf string
		expert   int
	}{
		{"token_embd.weight", "model.embed_tokens.weight", -1},
		{"output.weight", "lm_head.weight", -1},
		{"output_norm.weight", "model.norm.weight", -1},
		{"blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias", -1},
		{"blk.0.attn_k_norm.weight", "model.layers.0.self_attn.k_norm.weight", -1},
		{"blk.11.ffn_down.weight", "model.layers.11.mlp.down_proj.weight", -1},
		{"blk.1.attn_kv_a_mqa.weight", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight", -1},
		{"blk.1.ffn_gate_inp.weight", "model.layers.1.mlp.gate.weight", -1},
		{"blk.1.exp_probs_b.bias", "model.layers.1.mlp.gate.e_score_correction_bias", -1},
		{"blk.1.ffn_up_shexp.weight", "model.layers.1.mlp.shared_experts.up_proj.weight", -1},
		{"blk.2.ffn_gate_exps.weight", "model.layers.2.mlp.experts.7.gate_proj.weight", 7},
		{"blk.3.nextn.eh_proj.weight", "model.layers.3.eh_proj.weight", -1},
		{"blk.3.nextn.shared_head_head.weight", "model.layers.3.shared_head.head.weight", -1},
		{"blk.3.nextn.embed_tokens.weight", "model.layers.3.embed_tokens.weight", -1},
	}
	for _, tc := range tests {
		g, e, ok := GGUFName(tc.hf)
		if !ok || g != tc.gguf || e != tc.expert {
			t.Errorf("GGUFName(%q) = %q, %d, %v", tc.hf, g, e, ok)
		}
		h, experts, ok := HFName(tc.gguf)
		want := tc.hf
		if tc.expert >= 0 {
			want = strings.Replace(tc.hf, ".7.", ".{E}.", 1)
		}
		if !ok || h != want || experts != (tc.expert >= 0) {
			t.Errorf("HFName(%q) = %q, %v, %v", tc.gguf, h, experts, ok)
		}
	}
	// Mixtral's hub names map one way: HFName answers transformers' names.
	for hf, want := range map[string]string{
		"model.layers.1.block_sparse_moe.gate.weight":         "blk.1.ffn_gate_inp.weight",
		"model.layers.1.block_sparse_moe.experts.5.w1.weight": "blk.1.ffn_gate_exps.weight",
		"model.layers.1.block_sparse_moe.experts.5.w3.weight": "blk.1.ffn_up_exps.weight",
		"model.layers.1.block_sparse_moe.experts.5.w2.weight": "blk.1.ffn_down_exps.weight",
	} {
		g, e, ok := GGUFName(hf)
		if !ok || g != want || (e != 5 && strings.Contains(hf, "experts")) {
			t.Errorf("GGUFName(%q) = %q, %d, %v, want %q", hf, g, e, ok, want)
		}
	}
	for _, bad := range []string{"rope_freqs.weight", "blk.x.attn_q.weight", "model.layers.1.foo.weight", "nodot",
		"blk.0.attn_k_b.weight", "model.layers.1.block_sparse_moe.experts.x.w1.weight", "model.layers.1.mlp.experts.2.w9.weight"} {
		if _, _, ok := HFName(bad); ok {
			t.Errorf("HFName(%q) ok", bad)
		}
		if _, _, ok := GGUFName(bad); ok {
			t.Errorf("GGUFName(%q) ok", bad)
		}
	}
}

func TestPermuteQK(t *testing.T) {
	// 2 heads of dim 4, one byte per row: HF rows (h, s, i) -> GGUF (h, i, s).
	src := []byte{0, 1, 2, 3, 4, 5, 6, 7}
	got, err := PermuteQK(src, 2, 8, 1, true)
	must(t, err)
	if want := []byte{0, 2, 1, 3, 4, 6, 5, 7}; !bytes.Equal(got, want) {
		t.Fatalf("to GGUF: %v, want %v", got, want)
	}
	back, err := PermuteQK(got, 2, 8, 1, false)
	must(t, err)
	if !bytes.Equal(back, src) {
		t.Fatalf("round trip: %v", back)
	}
	if _, err := PermuteQK(src, 3, 8, 1, true); err == nil {
		t.Error("3 heads of 8 rows accepted")
	}
}

// configFile writes a file with the given metadata and tensor names (each
// a 32-element F32 tensor).
func configFile(t *testing.T, kv []KeyValue, tensors ...string) *File {
	t.Helper()
	w := NewWriter()
	for _, e := range kv {
		w.Set(e.Key, e.Value)
	}
	for _, name := range tensors {
		must(t, w.AddTensor(name, TypeF32, []int64{32}, make([]byte, 128)))
	}
	var buf bytes.Buffer
	_, err := w.WriteTo(&buf)
	must(t, err)
	f, err := Parse(buf.Bytes())
	must(t, err)
	return f
}

// TestConfig maps metadata to config.json and checks it through the
// engine's own config.json parser.
func TestConfig(t *testing.T) {
	common := func(arch string) []KeyValue {
		return []KeyValue{
			{"general.architecture", String(arch)},
			{arch + ".embedding_length", Uint32(64)}, {arch + ".block_count", Uint32(2)},
			{arch + ".feed_forward_length", Uint32(128)}, {arch + ".context_length", Uint32(4096)},
			{arch + ".attention.head_count", Uint32(4)}, {arch + ".attention.head_count_kv", Uint32(2)},
			{arch + ".attention.layer_norm_rms_epsilon", Float32(1e-6)}, {arch + ".rope.freq_base", Float32(500000)},
			{"tokenizer.ggml.tokens", Array([]string{"a", "b", "c"})},
			{"tokenizer.ggml.bos_token_id", Uint32(1)}, {"tokenizer.ggml.eos_token_id", Uint32(2)},
		}
	}
	t.Run("llama", func(t *testing.T) {
		f := configFile(t, common("llama"), "token_embd.weight")
		cfg := parseHF(t, f)
		if cfg.ModelType != "llama" || cfg.HiddenSize != 64 || cfg.NumHiddenLayers != 2 || cfg.IntermediateSize != 128 ||
			cfg.NumAttentionHeads != 4 || cfg.NumKeyValueHeads != 2 || cfg.HeadDim != 16 || cfg.VocabSize != 3 ||
			cfg.RMSNormEps != 1e-6 || cfg.Rope.Theta != 500000 || !cfg.TieWordEmbeddings || cfg.MaxPositionEmbeddings != 4096 ||
			*cfg.BOSTokenID != 1 || !reflect.DeepEqual(cfg.EOSTokenIDs, []int{2}) {
			t.Errorf("%+v", cfg)
		}
	})
	t.Run("qwen2", func(t *testing.T) {
		f := configFile(t, common("qwen2"), "output.weight", "blk.0.attn_q.bias")
		cfg := parseHF(t, f)
		if cfg.ModelType != "qwen2" || !cfg.AttentionBias || cfg.TieWordEmbeddings {
			t.Errorf("%+v", cfg)
		}
	})
	t.Run("qwen3", func(t *testing.T) {
		kv := append(common("qwen3"), KeyValue{"qwen3.attention.key_length", Uint32(32)}, KeyValue{"qwen3.vocab_size", Uint32(10)})
		cfg := parseHF(t, configFile(t, kv, "output.weight"))
		if cfg.ModelType != "qwen3" || cfg.HeadDim != 32 || cfg.VocabSize != 10 || cfg.AttentionBias {
			t.Errorf("%+v", cfg)
		}
	})
	t.Run("deepseek2", func(t *testing.T) {
		kv := append(common("deepseek2"),
			KeyValue{"deepseek2.attention.kv_lora_rank", Uint32(32)}, KeyValue{"deepseek2.attention.q_lora_rank", Uint32(48)},
			KeyValue{"deepseek2.attention.key_length", Uint32(24)}, KeyValue{"deepseek2.attention.value_length", Uint32(16)},
			KeyValue{"deepseek2.rope.dimension_count", Uint32(8)}, KeyValue{"deepseek2.leading_dense_block_count", Uint32(1)},
			KeyValue{"deepseek2.expert_feed_forward_length", Uint32(32)}, KeyValue{"deepseek2.expert_count", Uint32(8)},
			KeyValue{"deepseek2.expert_shared_count", Uint32(1)}, KeyValue{"deepseek2.expert_used_count", Uint32(2)},
			KeyValue{"deepseek2.expert_weights_scale", Float32(2.5)}, KeyValue{"deepseek2.expert_weights_norm", Bool(true)},
			KeyValue{"deepseek2.expert_gating_func", Uint32(2)}, KeyValue{"deepseek2.expert_group_count", Uint32(4)},
			KeyValue{"deepseek2.expert_group_used_count", Uint32(2)},
			KeyValue{"deepseek2.rope.scaling.type", String("yarn")}, KeyValue{"deepseek2.rope.scaling.factor", Float32(40)},
			KeyValue{"deepseek2.rope.scaling.original_context_length", Uint32(4096)},
			KeyValue{"deepseek2.rope.scaling.yarn_log_multiplier", Float32(0.1)})
		cfg := parseHF(t, configFile(t, kv, "output.weight"))
		if cfg.ModelType != "deepseek_v3" || cfg.QLoraRank != 48 || cfg.KVLoraRank != 32 || cfg.QKNopeHeadDim != 16 ||
			cfg.QKRopeHeadDim != 8 || cfg.VHeadDim != 16 || cfg.NRoutedExperts != 8 || cfg.NumExpertsPerTok != 2 ||
			cfg.FirstKDenseReplace != 1 || cfg.RoutedScalingFactor != 2.5 || !cfg.NormTopKProb || cfg.ScoringFunc != "sigmoid" ||
			cfg.TopKMethod != "noaux_tc" || cfg.NGroup != 4 || cfg.TopKGroup != 2 || cfg.Rope.Type != "yarn" ||
			cfg.Rope.Factor != 40 || cfg.Rope.OriginalMaxPositionEmbeddings != 4096 || cfg.Rope.MscaleAllDim != 1 {
			t.Errorf("%+v", cfg)
		}
	})
	t.Run("mixtral", func(t *testing.T) {
		kv := append(common("llama"), KeyValue{"llama.expert_count", Uint32(8)}, KeyValue{"llama.expert_used_count", Uint32(2)})
		cfg := parseHF(t, configFile(t, kv, "output.weight"))
		if cfg.ModelType != "mixtral" || cfg.Architectures[0] != "MixtralForCausalLM" || cfg.NRoutedExperts != 8 ||
			cfg.NumExpertsPerTok != 2 || cfg.MoEIntermediateSize != 128 || !cfg.NormTopKProb {
			t.Errorf("%+v", cfg)
		}
	})
	t.Run("qwen3moe", func(t *testing.T) {
		kv := append(common("qwen3moe"), KeyValue{"qwen3moe.expert_count", Uint32(8)}, KeyValue{"qwen3moe.expert_used_count", Uint32(2)},
			KeyValue{"qwen3moe.expert_feed_forward_length", Uint32(24)}, KeyValue{"qwen3moe.attention.key_length", Uint32(32)})
		// Layer 1 has a router, layer 0 none: layer 0 is dense.
		cfg := parseHF(t, configFile(t, kv, "output.weight", "blk.1.ffn_gate_inp.weight"))
		if cfg.ModelType != "qwen3_moe" || cfg.NRoutedExperts != 8 || cfg.MoEIntermediateSize != 24 || !cfg.NormTopKProb ||
			cfg.HeadDim != 32 || cfg.IsMoELayer(0) || !cfg.IsMoELayer(1) {
			t.Errorf("%+v", cfg)
		}
		kv = append(kv, KeyValue{"qwen3moe.expert_weights_norm", Bool(false)})
		if cfg := parseHF(t, configFile(t, kv, "blk.0.ffn_gate_inp.weight", "blk.1.ffn_gate_inp.weight")); cfg.NormTopKProb || !cfg.IsMoELayer(0) {
			t.Errorf("expert_weights_norm false: %+v", cfg)
		}
		if _, err := configFile(t, common("qwen3moe")).Config(); err == nil || !strings.Contains(err.Error(), "qwen3moe.expert_count") {
			t.Errorf("no expert_count: %v", err)
		}
	})
	t.Run("deepseek2 nextn and mscale", func(t *testing.T) {
		kv := append(common("deepseek2"),
			KeyValue{"deepseek2.block_count", Uint32(3)}, KeyValue{"deepseek2.nextn_predict_layers", Uint32(1)},
			KeyValue{"deepseek2.attention.kv_lora_rank", Uint32(32)}, KeyValue{"deepseek2.attention.q_lora_rank", Uint32(0)},
			KeyValue{"deepseek2.attention.key_length", Uint32(40)}, KeyValue{"deepseek2.attention.value_length", Uint32(32)},
			KeyValue{"deepseek2.attention.key_length_mla", Uint32(24)}, KeyValue{"deepseek2.attention.value_length_mla", Uint32(12)},
			KeyValue{"deepseek2.attention.head_count_kv", Uint32(1)},
			KeyValue{"deepseek2.rope.dimension_count", Uint32(8)}, KeyValue{"deepseek2.expert_gating_func", Uint32(1)},
			KeyValue{"deepseek2.rope.scaling.type", String("yarn")}, KeyValue{"deepseek2.rope.scaling.factor", Float32(40)},
			KeyValue{"deepseek2.rope.scaling.yarn_log_multiplier", Float32(0.1 * 0.707)},
			KeyValue{"deepseek2.rope.scaling.yarn_beta_fast", Float32(16)}, KeyValue{KeyYarnMscale, Float32(1)})
		cfg := parseHF(t, configFile(t, kv, "output.weight"))
		if cfg.ModelType != "deepseek_v2" || cfg.NumHiddenLayers != 2 || cfg.NumNextNPredictLayers != 1 || cfg.QLoraRank != 0 ||
			cfg.NumKeyValueHeads != 4 || cfg.QKNopeHeadDim != 16 || cfg.VHeadDim != 12 || cfg.Rope.MscaleAllDim != 0.707 ||
			cfg.Rope.Mscale != 1 || cfg.Rope.BetaFast != 16 {
			t.Errorf("%+v", cfg)
		}
	})
	errTests := []struct {
		name string
		kv   []KeyValue
		want string
	}{
		{"arch", []KeyValue{{"general.architecture", String("mamba")}}, `"mamba" is not supported`},
		{"no arch", nil, `missing key "general.architecture"`},
		{"missing", []KeyValue{{"general.architecture", String("llama")}}, `missing key "llama.embedding_length"`},
		{"type", append(common("llama")[:1], KeyValue{"llama.embedding_length", String("64")}), `"llama.embedding_length": string, want an integer`},
	}
	for _, tc := range errTests {
		if _, err := configFile(t, tc.kv).Config(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := configFile(t, common("llama"), "rope_freqs.weight").Config(); err == nil || !strings.Contains(err.Error(), "rope_freqs") {
		t.Errorf("rope_freqs: %v", err)
	}
}

func parseHF(t *testing.T, f *File) *weights.Config {
	t.Helper()
	js, err := f.ConfigJSON()
	must(t, err)
	cfg, err := weights.ParseConfig(js)
	if err != nil {
		t.Fatalf("%v\n%s", err, js)
	}
	var m map[string]any
	must(t, json.Unmarshal(js, &m))
	return cfg
}
