package weights

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// Llama-3.2-1B's published config.json (hub style: rope_scaling + rope_theta).
const llama32Config = `{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}`

// DeepSeek-V2-Lite's published config.json (abridged to the keys read here).
const deepseekV2LiteConfig = `{
  "architectures": ["DeepseekV2ForCausalLM"],
  "bos_token_id": 100000,
  "eos_token_id": 100001,
  "first_k_dense_replace": 1,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 10944,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v2",
  "moe_intermediate_size": 1408,
  "moe_layer_freq": 1,
  "n_group": 1,
  "n_routed_experts": 64,
  "n_shared_experts": 2,
  "norm_topk_prob": false,
  "num_attention_heads": 16,
  "num_experts_per_tok": 6,
  "num_hidden_layers": 27,
  "num_key_value_heads": 16,
  "q_lora_rank": null,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 1.0,
  "scoring_func": "softmax",
  "tie_word_embeddings": false,
  "topk_group": 1,
  "topk_method": "greedy",
  "torch_dtype": "bfloat16",
  "v_head_dim": 128,
  "vocab_size": 102400
}`

func TestParseConfigLlama32(t *testing.T) {
	cfg, err := ParseConfig([]byte(llama32Config))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Architectures: []string{"LlamaForCausalLM"}, ModelType: "llama", DType: "bfloat16",
		VocabSize: 128256, HiddenSize: 2048, IntermediateSize: 8192, NumHiddenLayers: 16,
		NumAttentionHeads: 32, NumKeyValueHeads: 8, HeadDim: 64, HiddenAct: "silu", RMSNormEps: 1e-5,
		MaxPositionEmbeddings: 131072, TieWordEmbeddings: true, MaxWindowLayers: 28,
		BOSTokenID: intp(128000), EOSTokenIDs: []int{128001, 128008, 128009},
		Rope: Rope{Type: "llama3", Theta: 500000, Factor: 32, OriginalMaxPositionEmbeddings: 8192,
			LowFreqFactor: 1, HighFreqFactor: 4, BetaFast: 32, BetaSlow: 1, Truncate: true, PartialRotaryFactor: 1},
		MoELayerFreq: 1, DecoderSparseStep: 1, RoutedScalingFactor: 1,
	}
	cfg.Raw = nil
	if !reflect.DeepEqual(*cfg, want) {
		t.Errorf("ParseConfig =\n%+v\nwant\n%+v", *cfg, want)
	}
}

func TestParseConfigDeepseekV2Lite(t *testing.T) {
	cfg, err := ParseConfig([]byte(deepseekV2LiteConfig))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"QLoraRank (null)", cfg.QLoraRank, 0},
		{"KVLoraRank", cfg.KVLoraRank, 512},
		{"QKNopeHeadDim", cfg.QKNopeHeadDim, 128},
		{"QKRopeHeadDim", cfg.QKRopeHeadDim, 64},
		{"HeadDim (= rope dim)", cfg.HeadDim, 64},
		{"VHeadDim", cfg.VHeadDim, 128},
		{"NRoutedExperts", cfg.NRoutedExperts, 64},
		{"NumExpertsPerTok", cfg.NumExpertsPerTok, 6},
		{"NSharedExperts", cfg.NSharedExperts, 2},
		{"MoEIntermediateSize", cfg.MoEIntermediateSize, 1408},
		{"FirstKDenseReplace", cfg.FirstKDenseReplace, 1},
		{"TopKMethod", cfg.TopKMethod, "greedy"},
		{"ScoringFunc", cfg.ScoringFunc, "softmax"},
		{"NormTopKProb", cfg.NormTopKProb, false},
		{"RopeInterleave", cfg.RopeInterleave, true},
		{"EOSTokenIDs", cfg.EOSTokenIDs, []int{100001}},
		{"NumNextNPredictLayers", cfg.NumNextNPredictLayers, 0},
		{"Rope", cfg.Rope, Rope{Type: "yarn", Theta: 10000, Factor: 40, OriginalMaxPositionEmbeddings: 4096,
			BetaFast: 32, BetaSlow: 1, Mscale: 0.707, MscaleAllDim: 0.707, Truncate: true, PartialRotaryFactor: 1}},
		{"IsMoELayer(0)", cfg.IsMoELayer(0), false},
		{"IsMoELayer(1)", cfg.IsMoELayer(1), true},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if got := cfg.Raw["q_lora_rank"]; got != nil {
		t.Errorf("Raw[q_lora_rank] = %v, want nil", got)
	}
	if got := cfg.Raw["vocab_size"]; got != json.Number("102400") {
		t.Errorf("Raw[vocab_size] = %#v, want json.Number 102400", got)
	}
}

func TestParseConfigDefaults(t *testing.T) {
	tests := []struct {
		name  string
		json  string
		check func(t *testing.T, c *Config)
	}{
		{
			name: "deepseek_v3 defaults from the HF class",
			json: `{"model_type": "deepseek_v3", "num_nextn_predict_layers": 1}`,
			check: func(t *testing.T, c *Config) {
				got := []any{c.VocabSize, c.HiddenSize, c.NumHiddenLayers, c.NumAttentionHeads, c.QLoraRank,
					c.NRoutedExperts, c.NumExpertsPerTok, c.NGroup, c.TopKGroup, c.TopKMethod, c.ScoringFunc,
					c.NormTopKProb, c.RoutedScalingFactor, c.FirstKDenseReplace, c.NumNextNPredictLayers, *c.BOSTokenID, c.EOSTokenIDs}
				want := []any{129280, 7168, 61, 128, 1536, 256, 8, 8, 4, "noaux_tc", "sigmoid", true, 2.5, 3, 1, 0, []int{1}}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("got %v, want %v", got, want)
				}
			},
		},
		{
			name: "transformers 5 rope_parameters and num_mtp_layers",
			json: `{"model_type": "deepseek_v3", "num_mtp_layers": 2, "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0,
			        "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 16, "original_max_position_embeddings": 64}}`,
			check: func(t *testing.T, c *Config) {
				want := Rope{Type: "yarn", Theta: 50000, Factor: 4, OriginalMaxPositionEmbeddings: 64, BetaFast: 16, BetaSlow: 1,
					Mscale: 1, MscaleAllDim: 1, Truncate: true, PartialRotaryFactor: 1}
				if c.Rope != want {
					t.Errorf("Rope = %+v, want %+v", c.Rope, want)
				}
				if c.NumNextNPredictLayers != 2 {
					t.Errorf("NumNextNPredictLayers = %d, want 2", c.NumNextNPredictLayers)
				}
			},
		},
		{
			name: "rope_parameters wins over rope_theta and rope_scaling",
			json: `{"model_type": "llama", "rope_theta": 1.0, "rope_scaling": {"type": "linear", "factor": 3.0},
			        "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0}}`,
			check: func(t *testing.T, c *Config) {
				if c.Rope.Type != "default" || c.Rope.Theta != 20000 || c.Rope.Factor != 3 {
					t.Errorf("Rope = %+v", c.Rope)
				}
			},
		},
		{
			name: "llama defaults",
			json: `{"model_type": "llama"}`,
			check: func(t *testing.T, c *Config) {
				got := []any{c.VocabSize, c.HiddenSize, c.NumKeyValueHeads, c.HeadDim, c.MaxPositionEmbeddings, c.Rope.Theta,
					c.Rope.Type, c.RMSNormEps, *c.BOSTokenID, c.EOSTokenIDs, c.SlidingWindow, c.RopeInterleave}
				want := []any{32000, 4096, 32, 128, 2048, 10000.0, "default", 1e-6, 1, []int{2}, 0, false}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("got %v, want %v", got, want)
				}
			},
		},
		{
			name: "mistral defaults: 8 kv heads, window 4096",
			json: `{"model_type": "mistral", "num_key_value_heads": null, "head_dim": null}`,
			check: func(t *testing.T, c *Config) {
				// null means "use the derived value", as in HF.
				if c.NumKeyValueHeads != 32 || c.HeadDim != 128 || c.SlidingWindow != 4096 {
					t.Errorf("kv %d head_dim %d window %d", c.NumKeyValueHeads, c.HeadDim, c.SlidingWindow)
				}
			},
		},
		{
			name: "mistral window null",
			json: `{"model_type": "mistral", "sliding_window": null}`,
			check: func(t *testing.T, c *Config) {
				if c.NumKeyValueHeads != 8 || c.SlidingWindow != 0 {
					t.Errorf("kv %d window %d", c.NumKeyValueHeads, c.SlidingWindow)
				}
			},
		},
		{
			name: "qwen3: head_dim 128, window off unless use_sliding_window",
			json: `{"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "sliding_window": 4096,
			        "eos_token_id": 151645, "bos_token_id": null}`,
			check: func(t *testing.T, c *Config) {
				if c.HeadDim != 128 || c.SlidingWindow != 0 || c.BOSTokenID != nil || !reflect.DeepEqual(c.EOSTokenIDs, []int{151645}) {
					t.Errorf("head_dim %d window %d bos %v eos %v", c.HeadDim, c.SlidingWindow, c.BOSTokenID, c.EOSTokenIDs)
				}
			},
		},
		{
			name: "qwen3 with use_sliding_window",
			json: `{"model_type": "qwen3", "use_sliding_window": true, "sliding_window": 512, "max_window_layers": 4}`,
			check: func(t *testing.T, c *Config) {
				if c.SlidingWindow != 512 || c.MaxWindowLayers != 4 {
					t.Errorf("window %d max_window_layers %d", c.SlidingWindow, c.MaxWindowLayers)
				}
			},
		},
		{
			name: "qwen2 has q/k/v bias by default",
			json: `{"model_type": "qwen2", "eos_token_id": null}`,
			check: func(t *testing.T, c *Config) {
				if !c.AttentionBias || c.EOSTokenIDs != nil {
					t.Errorf("AttentionBias %v eos %v", c.AttentionBias, c.EOSTokenIDs)
				}
			},
		},
		{
			name: "dtype preferred over torch_dtype, integral floats accepted",
			json: `{"model_type": "llama", "dtype": "float32", "torch_dtype": "bfloat16", "vocab_size": 1e3}`,
			check: func(t *testing.T, c *Config) {
				if c.DType != "float32" || c.VocabSize != 1000 {
					t.Errorf("DType %q vocab %d", c.DType, c.VocabSize)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, cfg)
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name  string
		json  string
		wants []string
	}{
		{"not JSON", `{"vocab_size": `, []string{"not a JSON object"}},
		{"null", `null`, []string{"not a JSON object"}},
		{"a list", `[1]`, []string{"not a JSON object"}},
		{"string for an int", `{"hidden_size": "64"}`, []string{`"hidden_size"`, "an integer"}},
		{"fraction for an int", `{"vocab_size": 10.5}`, []string{`"vocab_size"`, "an integer"}},
		{"bool as string", `{"tie_word_embeddings": "yes"}`, []string{`"tie_word_embeddings"`, "a boolean"}},
		{"bad eos list", `{"eos_token_id": [1, "x"]}`, []string{`"eos_token_id"`}},
		{"architectures not strings", `{"architectures": "LlamaForCausalLM"}`, []string{`"architectures"`}},
		{"unknown rope type", `{"rope_scaling": {"rope_type": "longrope", "factor": 2}}`, []string{`"longrope"`, "rope type"}},
		{"unknown rope type in rope_parameters", `{"rope_parameters": {"rope_type": "su"}}`, []string{`"su"`}},
		{"rope_scaling not an object", `{"rope_scaling": 2}`, []string{`"rope_scaling"`}},
		{"rope factor wrong type", `{"rope_scaling": {"type": "linear", "factor": "2"}}`, []string{"rope_scaling", `"factor"`}},
		{"linear without factor", `{"rope_scaling": {"type": "linear", "factor": 0}}`, []string{"linear", "factor"}},
		{"llama3 without original max", `{"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}}`,
			[]string{"llama3", "original_max_position_embeddings"}},
		{"zero heads", `{"num_attention_heads": 0}`, []string{"num_attention_heads"}},
		{"heads not a multiple of kv heads", `{"num_attention_heads": 6, "num_key_value_heads": 4}`, []string{"num_key_value_heads 4"}},
		{"experts not a multiple of groups", `{"model_type": "deepseek_v3", "n_group": 3}`, []string{"n_group 3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.json))
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v, want ErrConfig", err)
			}
			for _, want := range tc.wants {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %q, want it to mention %q", err, want)
				}
			}
		})
	}
}
