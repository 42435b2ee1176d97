package models

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
	"github.com/deepinfer/deepinfer-go/engine/models/ggufwrite"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// writeGGUFFile writes the model directory dir as a GGUF file of preset
// (package ggufwrite) under out and returns its path.
func writeGGUFFile(t testing.TB, out, dir, preset string) string {
	t.Helper()
	var buf bytes.Buffer
	if err := ggufwrite.Write(&buf, dir, "", preset); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(out, filepath.Base(filepath.Dir(dir))+"-"+filepath.Base(dir)+"-"+preset+".gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// dequantizedWeights are the tensors of a GGUF file under their Hugging
// Face names, block-quantized ones dequantized to F32: the weights a model
// loaded from the file computes with.
func dequantizedWeights(t testing.TB, path string) (MemWeights, *weights.Config) {
	t.Helper()
	g, err := OpenGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	w := MemWeights{}
	for _, name := range g.Names() {
		q, ok, err := g.Blocks(name)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			ten, err := g.Tensor(name)
			if err != nil {
				t.Fatal(err)
			}
			ten.Data = bytes.Clone(ten.Data)
			w[name] = ten
			continue
		}
		vals := make([]float32, numel(q.Shape))
		simd.QuantType(q.Type).Dequantize(vals, q.Data)
		w[name] = weights.F32Tensor(name, q.Shape, vals)
	}
	return w, g.Config
}

// checkGGUFModel compares, bit for bit, the logits of the model loaded
// from the GGUF file at path with those of want, over a prefill and three
// decode steps.
func checkGGUFModel(t *testing.T, ops kernels.Ops, path string, want Model, ids []int32) Model {
	t.Helper()
	got, err := Builtin().Load(ops, path, Options{MaxModelLen: testMaxLen})
	if err != nil {
		t.Fatal(err)
	}
	sameGGUFLogits(t, "", got, want, ids)
	return got
}

// sameGGUFLogits checks that got (loaded from GGUF) gives want's logits
// bit for bit: on the prefill of ids (at least 8), then on three decode
// steps after a cached prefix of 5; what prefixes the failure message.
func sameGGUFLogits(t *testing.T, what string, got, want Model, ids []int32) {
	t.Helper()
	g, h := promptLogits(t, got, ids), promptLogits(t, want, ids)
	for p := range ids {
		if !sameBits(g[p], h[p]) {
			t.Fatalf("%sprefill position %d: logits from GGUF differ from the model of its weights (first: %v vs %v)", what, p, g[p][:4], h[p][:4])
		}
	}
	cg, _ := got.NewKVCache(16, 4)
	ch, _ := want.NewKVCache(16, 4)
	table := []int32{2, 0, 3, 1}
	step(t, got, cg, seqStep{ids[:5], 0, table[:2]})
	step(t, want, ch, seqStep{ids[:5], 0, table[:2]})
	for i := 5; i < 8; i++ {
		a, _ := step(t, got, cg, seqStep{ids[i : i+1], i, table[:i/4+1]})
		b, _ := step(t, want, ch, seqStep{ids[i : i+1], i, table[:i/4+1]})
		if !sameBits(a[0], b[0]) {
			t.Fatalf("%sdecode position %d: logits from GGUF differ", what, i)
		}
	}
}

// maxRelDiff is max|a-b| / max|b| over every position.
func maxRelDiff(a, b [][]float32) float64 {
	var d, m float64
	for p := range a {
		for i := range a[p] {
			d = math.Max(d, math.Abs(float64(a[p][i]-b[p][i])))
			m = math.Max(m, math.Abs(float64(b[p][i])))
		}
	}
	return d / m
}

// ggufQuantBound bounds max|logit - HF| / max|HF| of a quantized file of
// a fixture (8-bit blocks: Q8_0, with Q6_K/Q5_K/Q4_K where rows allow).
const ggufQuantBound = 0.05

// TestGGUFFixtures: the MoE and DeepSeek fixtures written as GGUF files
// (package ggufwrite: merged experts, Mixtral as llama with experts,
// deepseek2 with the split attn_k_b / attn_v_b and V3's MTP layer as
// nextn) load as their Hugging Face directories do. F32: the same logits
// bit for bit as the directory. Q8_0 and Q4_K_M: the same logits bit for
// bit as the model of the file's dequantized weights, and within
// ggufQuantBound of the directory's.
func TestGGUFFixtures(t *testing.T) {
	out := t.TempDir()
	r := rand.New(rand.NewPCG(3, 4))
	ops := newBackend(t, 2)
	for _, name := range []string{"qwen3-moe", "mixtral", "deepseek-v2", "deepseek-v3"} {
		dir := filepath.Join(fixtureDir, name, "f32")
		hf, err := Builtin().Load(ops, dir, Options{MaxModelLen: testMaxLen})
		if err != nil {
			t.Fatal(err)
		}
		ids := randomIDs(r, 9, hf.Config().VocabSize)
		for _, preset := range []string{"f32", "q8_0", "q4_k_m"} {
			t.Run(name+"/"+preset, func(t *testing.T) {
				path := writeGGUFFile(t, out, dir, preset)
				if preset == "f32" {
					m := checkGGUFModel(t, ops, path, hf, ids)
					if (m.MTP() == nil) != (hf.MTP() == nil) {
						t.Errorf("MTP from GGUF: %v, from the directory: %v", m.MTP() != nil, hf.MTP() != nil)
					}
					return
				}
				w, cfg := dequantizedWeights(t, path)
				deq, err := Builtin().New(ops, cfg, w, Options{MaxModelLen: testMaxLen})
				if err != nil {
					t.Fatal(err)
				}
				m := checkGGUFModel(t, ops, path, deq, ids)
				if f := WeightFormat(m); !strings.Contains(f, "Q8_0") {
					t.Errorf("WeightFormat = %q, want Q8_0 blocks", f)
				}
				d := maxRelDiff(promptLogits(t, m, ids), promptLogits(t, hf, ids))
				t.Logf("max logit difference from the directory: %.3g of the largest logit", d)
				if d > ggufQuantBound {
					t.Errorf("logits differ from the directory's by %.3g of their range, want <= %g", d, ggufQuantBound)
				}
			})
		}
	}
}

// ggufMoEConfigs are random MoE and DeepSeek models whose matrices have
// rows of whole 256-weight blocks, so that the K-quants apply to experts
// and MLA projections too.
var ggufMoEConfigs = map[string]string{
	"qwen3moe": `{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 320,
		"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256, "num_experts": 8,
		"num_experts_per_tok": 2, "norm_topk_prob": true, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
		"max_position_embeddings": 256, "tie_word_embeddings": false, "bos_token_id": 3, "eos_token_id": 4}`,
	"mixtral": `{"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 320,
		"hidden_size": 256, "intermediate_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2,
		"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
		"rope_theta": 1000000.0, "max_position_embeddings": 256, "tie_word_embeddings": false,
		"bos_token_id": 1, "eos_token_id": 2}`,
	"deepseek3": `{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 320,
		"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 256, "kv_lora_rank": 256,
		"qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "n_routed_experts": 8,
		"num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
		"topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true, "routed_scaling_factor": 2.5,
		"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": false,
		"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
			"beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}, "bos_token_id": 0, "eos_token_id": 1}`,
}

// writeHFDir writes a config and its random F32 weights as a Hugging Face
// directory.
func writeHFDir(t testing.TB, dir, config string, seed uint64) *weights.Config {
	t.Helper()
	cfg := parseConfig(t, config)
	w, err := RandomWeights(cfg, kernels.F32, seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var ts []weights.Tensor
	for _, name := range w.Names() {
		ts = append(ts, w[name])
	}
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, weights.ConfigFile), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestGGUFWriteMoE: random MoE and DeepSeek models with 256-wide rows
// written in every preset: Q4_K_M's K-quants (Q4_K experts, Q6_K ffn_down
// and output, Q5_K attn_output and Q8_0 attn_k/attn_v of 8-expert models)
// compute as their dequantized weights do, bit for bit, on 1 and 2
// threads; F32 files as the directory.
func TestGGUFWriteMoE(t *testing.T) {
	root := t.TempDir()
	r := rand.New(rand.NewPCG(8, 9))
	presets := []string{"f32", "bf16", "q8_0", "q4_k_m"}
	if raceEnabled {
		presets = []string{"f32", "q4_k_m"}
	}
	for _, name := range []string{"qwen3moe", "mixtral", "deepseek3"} {
		dir := filepath.Join(root, name, "hf")
		cfg := writeHFDir(t, dir, ggufMoEConfigs[name], 31)
		ids := randomIDs(r, 9, cfg.VocabSize)
		for _, preset := range presets {
			t.Run(name+"/"+preset, func(t *testing.T) {
				path := writeGGUFFile(t, root, dir, preset)
				for _, threads := range []int{1, 2} {
					ops := newBackend(t, threads)
					var want Model
					var err error
					if preset == "f32" {
						want, err = Builtin().Load(ops, dir, Options{MaxModelLen: testMaxLen})
					} else {
						w, c := dequantizedWeights(t, path)
						want, err = Builtin().New(ops, c, w, Options{MaxModelLen: testMaxLen})
					}
					if err != nil {
						t.Fatal(err)
					}
					m := checkGGUFModel(t, ops, path, want, ids)
					if preset == "q4_k_m" && !strings.Contains(WeightFormat(m), "Q4_K") {
						t.Errorf("WeightFormat = %q, want Q4_K blocks", WeightFormat(m))
					}
				}
			})
		}
	}
}

// TestGGUFMoEMetadata: the keys and tensors ggufwrite writes for the MoE
// and DeepSeek fixtures are llama.cpp's: merged experts of [experts, n, k],
// deepseek2's MLA as multi-query attention over the latent with split
// attn_k_b / attn_v_b, V3's MTP layer as nextn tensors past the decoder
// layers, and the keys llama.cpp cannot read written only where the
// checkpoint needs them.
func TestGGUFMoEMetadata(t *testing.T) {
	out := t.TempDir()
	open := func(name string) *gguf.File {
		path := writeGGUFFile(t, out, filepath.Join(fixtureDir, name, "f32"), "q8_0")
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	type tensor struct {
		name  string
		shape []int64
		typ   gguf.GGMLType
	}
	tests := []struct {
		fixture string
		keys    map[string]any // nil: absent
		tensors []tensor
		absent  []string
	}{
		{"mixtral", map[string]any{"general.architecture": "llama", "llama.expert_count": uint32(8),
			"llama.expert_used_count": uint32(2), "llama.feed_forward_length": uint32(24)},
			[]tensor{{"blk.1.ffn_gate_exps.weight", []int64{8, 24, 64}, gguf.TypeF32},
				{"blk.1.ffn_down_exps.weight", []int64{8, 64, 24}, gguf.TypeF32},
				{"blk.1.ffn_gate_inp.weight", []int64{8, 64}, gguf.TypeF32}},
			[]string{"blk.1.ffn_gate.weight"}},
		{"qwen3-moe", map[string]any{"general.architecture": "qwen3moe", "qwen3moe.expert_count": uint32(8),
			"qwen3moe.expert_feed_forward_length": uint32(24), "qwen3moe.expert_weights_norm": false},
			[]tensor{{"blk.1.ffn_up_exps.weight", []int64{8, 24, 64}, gguf.TypeF32}, {"blk.0.ffn_up.weight", []int64{128, 64}, gguf.TypeQ8_0}},
			[]string{"blk.0.ffn_gate_inp.weight"}},
		{"deepseek-v2", map[string]any{"general.architecture": "deepseek2", "deepseek2.attention.head_count_kv": uint32(1),
			"deepseek2.attention.key_length": uint32(32 + 8), "deepseek2.attention.value_length": uint32(32),
			"deepseek2.attention.key_length_mla": uint32(24), "deepseek2.attention.value_length_mla": uint32(12),
			"deepseek2.attention.q_lora_rank": uint32(0), "deepseek2.expert_gating_func": uint32(1),
			"deepseek2.expert_group_count": uint32(4), "deepseek2.rope.scaling.type": "yarn",
			gguf.KeyYarnMscale: float32(1), "deepseek2.expert_weights_norm": nil},
			[]tensor{{"blk.0.attn_k_b.weight", []int64{4, 32, 16}, gguf.TypeF32}, {"blk.0.attn_v_b.weight", []int64{4, 12, 32}, gguf.TypeF32},
				{"blk.0.attn_q.weight", []int64{96, 64}, gguf.TypeQ8_0}, {"blk.1.ffn_down_shexp.weight", []int64{64, 48}, gguf.TypeF32}},
			[]string{"blk.0.attn_kv_b.weight"}},
		{"deepseek-v3", map[string]any{"deepseek2.block_count": uint32(3), "deepseek2.nextn_predict_layers": uint32(1),
			"deepseek2.expert_gating_func": uint32(2), "deepseek2.expert_weights_norm": true, gguf.KeyYarnMscale: nil},
			[]tensor{{"blk.1.exp_probs_b.bias", []int64{8}, gguf.TypeF32}, {"blk.2.nextn.eh_proj.weight", []int64{64, 128}, gguf.TypeQ8_0},
				{"blk.2.nextn.shared_head_head.weight", []int64{256, 64}, gguf.TypeQ8_0}, {"blk.2.ffn_gate_exps.weight", []int64{8, 16, 64}, gguf.TypeF32}, {"blk.1.attn_kv_a_mqa.weight", []int64{40, 64}, gguf.TypeQ8_0}},
			nil},
	}
	for _, tc := range tests {
		f := open(tc.fixture)
		for k, want := range tc.keys {
			v, ok := f.Get(k)
			if want == nil {
				if ok {
					t.Errorf("%s: key %q = %v, want none", tc.fixture, k, v.Any())
				}
				continue
			}
			if !ok || fmt.Sprint(v.Any()) != fmt.Sprint(want) {
				got := any(nil)
				if ok {
					got = v.Any()
				}
				t.Errorf("%s: key %q = %v, want %v", tc.fixture, k, got, want)
			}
		}
		for _, w := range tc.tensors {
			info, ok := f.Tensor(w.name)
			if !ok {
				t.Errorf("%s: no tensor %q", tc.fixture, w.name)
				continue
			}
			if s := info.Shape(); fmt.Sprint(s) != fmt.Sprint(w.shape) || info.Type != w.typ {
				t.Errorf("%s: %s: %v %v, want %v %v", tc.fixture, w.name, s, info.Type, w.shape, w.typ)
			}
		}
		for _, name := range tc.absent {
			if _, ok := f.Tensor(name); ok {
				t.Errorf("%s: tensor %q present", tc.fixture, name)
			}
		}
	}
	// The config a deepseek2 file maps back to is the checkpoint's.
	path := writeGGUFFile(t, out, filepath.Join(fixtureDir, "deepseek-v2", "f32"), "f32")
	g, err := OpenGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	want, err := weights.ReadConfig(filepath.Join(fixtureDir, "deepseek-v2", "f32", weights.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	got := g.Config
	if got.NumHiddenLayers != want.NumHiddenLayers || got.NumKeyValueHeads != want.NumKeyValueHeads || got.QLoraRank != 0 ||
		got.QKNopeHeadDim != want.QKNopeHeadDim || got.VHeadDim != want.VHeadDim || got.TopKMethod != want.TopKMethod ||
		got.Rope.Mscale != want.Rope.Mscale || got.Rope.MscaleAllDim != want.Rope.MscaleAllDim || got.Rope.BetaFast != want.Rope.BetaFast {
		js, _ := json.Marshal(got)
		t.Errorf("config from GGUF %s\ndiffers from config.json's", js)
	}
}
