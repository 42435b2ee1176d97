package weights

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
)

// Config is a parsed Hugging Face config.json for the Llama family
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)
// and DeepSeek V2/V3. Field names are the Go-cased HF keys. Where a key is
// absent, the default of the HF config class for ModelType applies; the
// defaults are listed per field as "llama / mistral / qwen2 / qwen3 /
// deepseek_v2 / deepseek_v3" where they differ. An unknown model_type gets the
// llama defaults (refusing unknown architectures is the model package's job).
type Config struct {
	// Architectures, e.g. ["LlamaForCausalLM"]. Default: none.
	Architectures []string
	// ModelType is "model_type", e.g. "llama", "deepseek_v3". Default: "".
	ModelType string
	// DType is "dtype" (transformers 5) or "torch_dtype" (older), e.g.
	// "bfloat16". Default: "".
	DType string

	// VocabSize. Default: 32000 / 32000 / 151936 / 151936 / 32000 / 129280.
	VocabSize int
	// HiddenSize. Default: 4096 / 4096 / 4096 / 4096 / 4096 / 7168.
	HiddenSize int
	// IntermediateSize is the dense MLP width. Default: 11008 / 14336 / 22016 /
	// 22016 / 11008 / 18432.
	IntermediateSize int
	// NumHiddenLayers. Default: 32 / 32 / 32 / 32 / 32 / 61.
	NumHiddenLayers int
	// NumAttentionHeads. Default: 32 / 32 / 32 / 32 / 32 / 128.
	NumAttentionHeads int
	// NumKeyValueHeads. Default: NumAttentionHeads (null too), except mistral 8.
	NumKeyValueHeads int
	// HeadDim. Default: HiddenSize/NumAttentionHeads (null too), except qwen3
	// 128. For deepseek_v2/v3 it is QKRopeHeadDim whatever the file says, as in
	// HF (the rotary dimension); the q/k head size there is
	// QKNopeHeadDim+QKRopeHeadDim.
	HeadDim int
	// HiddenAct. Default: "silu".
	HiddenAct string
	// RMSNormEps. Default: 1e-6.
	RMSNormEps float64
	// MaxPositionEmbeddings. Default: 2048 / 131072 / 32768 / 32768 / 2048 / 4096.
	MaxPositionEmbeddings int
	// TieWordEmbeddings: the LM head reuses embed_tokens. Default: false.
	TieWordEmbeddings bool
	// AttentionBias: q/k/v/o projections carry biases (for deepseek: q_a,
	// kv_a and o). Default: false, except qwen2 true, where HF gives q/k/v a
	// bias and o_proj none.
	AttentionBias bool
	// MLPBias: gate/up/down projections carry biases. Default: false.
	MLPBias bool
	// SlidingWindow is the attention window in tokens, 0 for none (null).
	// Default: 0 / 4096 / 0 / 0 / 0 / 0. For qwen2/qwen3 it is 0 unless
	// UseSlidingWindow, as in HF.
	SlidingWindow int
	// UseSlidingWindow (qwen2/qwen3). Default: false.
	UseSlidingWindow bool
	// MaxWindowLayers (qwen2/qwen3): layers at or above this index use the
	// sliding window when UseSlidingWindow. Default: 28.
	MaxWindowLayers int
	// LayerTypes is "layer_types" ("full_attention" / "sliding_attention"
	// per layer) when the file has it. Default: nil.
	LayerTypes []string
	// BOSTokenID. Default: 1 / 1 / none / none / 1 / 0; nil when none or null.
	BOSTokenID *int
	// EOSTokenIDs is "eos_token_id", an int or a list. Default: [2] / [2] /
	// none / none / [2] / [1]; empty when none or null.
	EOSTokenIDs []int
	// PadTokenID. Default: none (nil); -1, which early Llama conversions
	// wrote for "none", also reads as nil.
	PadTokenID *int

	// Rope holds rope_theta and the rope_scaling / rope_parameters settings.
	Rope Rope

	// DeepSeek V2/V3 (zero for other model types unless the file sets them).

	// QLoraRank is the rank of the q compression; 0 when null (no
	// compression: a plain q_proj). Default: 1536 (v2 and v3).
	QLoraRank int
	// KVLoraRank. Default: 512.
	KVLoraRank int
	// QKNopeHeadDim. Default: 128.
	QKNopeHeadDim int
	// QKRopeHeadDim. Default: 64.
	QKRopeHeadDim int
	// VHeadDim. Default: 128.
	VHeadDim int
	// NRoutedExperts is "n_routed_experts" (DeepSeek), "num_experts"
	// (qwen3_moe) or "num_local_experts" (mixtral). Default: 64 (v2) / 256
	// (v3) / 128 (qwen3_moe) / 8 (mixtral); 0 when null (dense).
	NRoutedExperts int
	// NumExpertsPerTok. Default: none (0, v2) / 8 (v3).
	NumExpertsPerTok int
	// NSharedExperts. Default: 2 (v2) / 1 (v3); 0 when null.
	NSharedExperts int
	// MoEIntermediateSize is each expert's MLP width. Default: 1407 (v2) /
	// 2048 (v3) / 768 (qwen3_moe); mixtral: IntermediateSize.
	MoEIntermediateSize int
	// DecoderSparseStep (qwen3_moe): layer i is MoE when (i+1) is a
	// multiple of it and i is not in MLPOnlyLayers. Default: 1.
	DecoderSparseStep int
	// MLPOnlyLayers (qwen3_moe): layers kept dense. Default: none.
	MLPOnlyLayers []int
	// FirstKDenseReplace: layers below this index are dense. Default: 0 / 3.
	FirstKDenseReplace int
	// MoELayerFreq: a layer at or above FirstKDenseReplace is MoE when its
	// index is a multiple of MoELayerFreq. Default: 1.
	MoELayerFreq int
	// TopKMethod: "greedy", "group_limited_greedy" (v2), "noaux_tc" (v3).
	// Default: "greedy" (v2) / "noaux_tc" (v3, which HF always uses).
	TopKMethod string
	// NGroup: expert groups for grouped routing. Default: none (0, v2) / 8 (v3).
	NGroup int
	// TopKGroup: groups kept per token. Default: none (0, v2) / 4 (v3).
	TopKGroup int
	// NormTopKProb: renormalize the top-k routing weights to sum to one.
	// Default: false (v2, qwen3_moe) / true (v3, and mixtral, which always
	// renormalizes). HF's DeepSeek V2 ignores it.
	NormTopKProb bool
	// RoutedScalingFactor multiplies the routing weights. Default: 1.0 / 2.5.
	RoutedScalingFactor float64
	// ScoringFunc: "softmax" (v2) or "sigmoid" (v3). Default: "softmax" (v2)
	// / "sigmoid" (v3, which HF always uses).
	ScoringFunc string
	// NumNextNPredictLayers is the number of MTP layers stored after the
	// main layers ("num_nextn_predict_layers", or transformers'
	// "num_mtp_layers"). Default: 0 (HF's modeling ignores MTP layers).
	NumNextNPredictLayers int
	// RopeInterleave (v3): RoPE rotates interleaved pairs (x[2i], x[2i+1])
	// instead of halves. Default: true for deepseek_v2/v3 (v2 always
	// interleaves in HF), false otherwise.
	RopeInterleave bool

	// Quantization is "quantization_config"; its zero value (Method "")
	// when absent or null.
	Quantization Quantization

	// Raw is the whole config.json as decoded by encoding/json with
	// UseNumber: numbers are json.Number.
	Raw map[string]any
}

// Rope is the rotary embedding setting, read from the hub's "rope_theta" plus
// "rope_scaling" (with "type" or "rope_type"), or from transformers 5's
// "rope_parameters" (which also carries rope_theta); rope_parameters wins
// where both set a key.
type Rope struct {
	// Type is "default", "linear", "dynamic", "yarn" or "llama3". Default:
	// "default"; any other name is an error.
	Type string
	// Theta is the RoPE base ("rope_theta"). Default: 10000 (all six HF
	// classes; real checkpoints set it).
	Theta float64
	// Factor is the context scaling factor (linear, dynamic, yarn, llama3).
	// Default: 1; required > 0 by those types.
	Factor float64
	// OriginalMaxPositionEmbeddings (yarn, llama3). Default: 0 (absent; HF's
	// yarn then uses MaxPositionEmbeddings; llama3 requires it).
	OriginalMaxPositionEmbeddings int
	// LowFreqFactor and HighFreqFactor (llama3). Default: 0 (absent; llama3
	// requires them).
	LowFreqFactor  float64
	HighFreqFactor float64
	// BetaFast and BetaSlow (yarn). Default: 32 and 1.
	BetaFast float64
	BetaSlow float64
	// Mscale and MscaleAllDim (yarn, DeepSeek). Default: 0 (absent). HF's
	// yarn sets the cos/sin scale to
	// get_mscale(Factor, Mscale)/get_mscale(Factor, MscaleAllDim) when both are
	// non-zero, else get_mscale(Factor) = 0.1*ln(Factor)+1; DeepSeek V3 also
	// scales the softmax by get_mscale(Factor, MscaleAllDim)^2.
	Mscale       float64
	MscaleAllDim float64
	// AttentionFactor (yarn) overrides the cos/sin scale. Default: 0 (absent).
	AttentionFactor float64
	// Truncate (yarn) floors/ceils the correction range. Default: true.
	Truncate bool
	// PartialRotaryFactor is the fraction of the head dim that rotates.
	// Default: 1.
	PartialRotaryFactor float64
}

// Quantization is a checkpoint's "quantization_config". Only Method "fp8"
// (DeepSeek-V3/R1, Qwen3-FP8: E4M3 weights with float32 block scales,
// activations quantized dynamically) is checked here; another method is
// recorded for the model package to refuse by name.
type Quantization struct {
	// Method is "quant_method", e.g. "fp8". Default: "" (not quantized).
	Method string
	// Fmt is "fmt" ("e4m3"). Default: "e4m3" for fp8.
	Fmt string
	// ActivationScheme is "activation_scheme" ("dynamic"). Default:
	// "dynamic" for fp8.
	ActivationScheme string
	// WeightBlockSize is "weight_block_size", [rows, columns] of one scale
	// block ([128, 128]); fp8 requires it (per-tensor scales are refused).
	WeightBlockSize [2]int
	// ModulesToNotConvert is "modules_to_not_convert" (e.g. ["lm_head"]):
	// modules kept in the checkpoint's float dtype. Default: none.
	ModulesToNotConvert []string
}

// quantization reads quantization_config.
func (p *configParser) quantization() Quantization {
	var q Quantization
	msg := p.lookup("quantization_config")
	if msg == nil {
		return q
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(msg, &obj); err != nil {
		p.fail("quantization_config", msg, "an object")
		return q
	}
	sub := configParser{raw: obj}
	q.Method = sub.str("quant_method", "")
	q.ModulesToNotConvert = sub.strs("modules_to_not_convert")
	if q.Method == "fp8" {
		q.Fmt = sub.str("fmt", "e4m3")
		q.ActivationScheme = sub.str("activation_scheme", "dynamic")
		if bs := sub.lookup("weight_block_size"); bs != nil {
			var v []json.RawMessage
			if err := json.Unmarshal(bs, &v); err != nil || len(v) != 2 {
				sub.fail("weight_block_size", bs, "a list of two integers")
			} else {
				for i, m := range v {
					n, ok := parseInt(m)
					if !ok || n <= 0 {
						sub.fail("weight_block_size", bs, "a list of two positive integers")
					}
					q.WeightBlockSize[i] = n
				}
			}
		}
	}
	if sub.err != nil {
		if p.err == nil {
			p.err = fmt.Errorf("quantization_config: %w", sub.err)
		}
		return q
	}
	if q.Method != "fp8" || p.err != nil {
		return q
	}
	switch {
	case q.Fmt != "e4m3":
		p.err = fmt.Errorf("quantization_config: fp8 fmt %q, want e4m3: %w", q.Fmt, ErrConfig)
	case q.ActivationScheme != "dynamic":
		p.err = fmt.Errorf("quantization_config: fp8 activation_scheme %q, want dynamic (static input scales are not supported): %w", q.ActivationScheme, ErrConfig)
	case q.WeightBlockSize == [2]int{}:
		p.err = fmt.Errorf("quantization_config: fp8 without weight_block_size (per-tensor scales) is not supported: %w", ErrConfig)
	}
	return q
}

// ropeTypes lists the accepted Rope.Type values.
var ropeTypes = []string{"default", "linear", "dynamic", "yarn", "llama3"}

// modelDefaults holds the HF config-class defaults of one model type.
type modelDefaults struct {
	vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_pos int
	sliding_window                                                          int
	attention_bias                                                          bool
	bos                                                                     *int
	eos                                                                     []int
	// deepseek
	q_lora, kv_lora, qk_nope, qk_rope, v_head                            int
	n_routed, experts_per_tok, n_shared, moe_intermediate, first_k_dense int
	topk_method, scoring_func                                            string
	n_group, topk_group                                                  int
	norm_topk_prob                                                       bool
	routed_scaling_factor                                                float64
	rope_interleave                                                      bool
}

func intp(v int) *int { return &v }

func defaultsFor(model_type string) modelDefaults {
	llama := modelDefaults{
		vocab: 32000, hidden: 4096, intermediate: 11008, layers: 32, heads: 32,
		max_pos: 2048, bos: intp(1), eos: []int{2}, routed_scaling_factor: 1,
	}
	switch model_type {
	case "mistral":
		d := llama
		d.intermediate, d.kv_heads, d.max_pos, d.sliding_window = 14336, 8, 131072, 4096
		return d
	case "qwen2", "qwen3":
		d := llama
		d.vocab, d.intermediate, d.max_pos, d.bos, d.eos = 151936, 22016, 32768, nil, nil
		d.kv_heads = 32
		if model_type == "qwen3" {
			d.head_dim = 128
		} else {
			d.attention_bias = true
		}
		return d
	case "qwen3_moe":
		d := llama
		d.vocab, d.hidden, d.intermediate, d.layers, d.heads, d.kv_heads = 151936, 2048, 6144, 24, 32, 4
		d.max_pos, d.bos, d.eos, d.head_dim = 32768, nil, nil, 128
		d.n_routed, d.experts_per_tok, d.moe_intermediate = 128, 8, 768
		d.topk_method, d.scoring_func = "greedy", "softmax"
		return d
	case "mixtral":
		d := llama
		d.intermediate, d.kv_heads, d.max_pos = 14336, 8, 131072
		d.n_routed, d.experts_per_tok = 8, 2
		d.topk_method, d.scoring_func, d.norm_topk_prob = "greedy", "softmax", true
		return d
	case "deepseek_v2":
		d := llama
		d.q_lora, d.kv_lora, d.qk_nope, d.qk_rope, d.v_head = 1536, 512, 128, 64, 128
		d.n_routed, d.n_shared, d.moe_intermediate = 64, 2, 1407
		d.topk_method, d.scoring_func = "greedy", "softmax"
		d.rope_interleave = true
		return d
	case "deepseek_v3":
		return modelDefaults{
			vocab: 129280, hidden: 7168, intermediate: 18432, layers: 61, heads: 128, kv_heads: 128,
			max_pos: 4096, bos: intp(0), eos: []int{1},
			q_lora: 1536, kv_lora: 512, qk_nope: 128, qk_rope: 64, v_head: 128,
			n_routed: 256, experts_per_tok: 8, n_shared: 1, moe_intermediate: 2048, first_k_dense: 3,
			topk_method: "noaux_tc", scoring_func: "sigmoid", n_group: 8, topk_group: 4,
			norm_topk_prob: true, routed_scaling_factor: 2.5, rope_interleave: true,
		}
	}
	return llama
}

// ReadConfig reads and parses the config.json at path. A missing file is an
// error wrapping both ErrConfig and fs.ErrNotExist.
func ReadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("weights: %w: %w", ErrConfig, err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("weights: %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig parses the bytes of a config.json. Errors wrap ErrConfig and
// name the offending key.
func ParseConfig(data []byte) (*Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v: %w", err, ErrConfig)
	}
	if raw == nil {
		return nil, fmt.Errorf("not a JSON object: null: %w", ErrConfig)
	}
	p := configParser{raw: raw}
	cfg := &Config{}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&cfg.Raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v: %w", err, ErrConfig)
	}

	cfg.ModelType = p.str("model_type", "")
	d := defaultsFor(cfg.ModelType)
	cfg.Architectures = p.strs("architectures")
	cfg.DType = p.str("dtype", p.str("torch_dtype", ""))

	cfg.VocabSize = p.int("vocab_size", d.vocab)
	cfg.HiddenSize = p.int("hidden_size", d.hidden)
	cfg.IntermediateSize = p.int("intermediate_size", d.intermediate)
	cfg.NumHiddenLayers = p.int("num_hidden_layers", d.layers)
	cfg.NumAttentionHeads = p.int("num_attention_heads", d.heads)
	cfg.NumKeyValueHeads = p.int("num_key_value_heads", d.kv_heads)
	if cfg.NumKeyValueHeads == 0 || p.isNull("num_key_value_heads") {
		cfg.NumKeyValueHeads = cfg.NumAttentionHeads
	}
	cfg.HeadDim = p.int("head_dim", d.head_dim)
	if (cfg.HeadDim == 0 || p.isNull("head_dim")) && cfg.NumAttentionHeads > 0 {
		cfg.HeadDim = cfg.HiddenSize / cfg.NumAttentionHeads
	}
	cfg.HiddenAct = p.str("hidden_act", "silu")
	cfg.RMSNormEps = p.float("rms_norm_eps", 1e-6)
	cfg.MaxPositionEmbeddings = p.int("max_position_embeddings", d.max_pos)
	cfg.TieWordEmbeddings = p.bool("tie_word_embeddings", false)
	cfg.AttentionBias = p.bool("attention_bias", d.attention_bias)
	cfg.MLPBias = p.bool("mlp_bias", false)
	cfg.SlidingWindow = p.int("sliding_window", d.sliding_window)
	cfg.UseSlidingWindow = p.bool("use_sliding_window", false)
	cfg.MaxWindowLayers = p.int("max_window_layers", 28)
	if (cfg.ModelType == "qwen2" || cfg.ModelType == "qwen3" || cfg.ModelType == "qwen3_moe") && !cfg.UseSlidingWindow {
		cfg.SlidingWindow = 0
	}
	cfg.LayerTypes = p.strs("layer_types")
	cfg.BOSTokenID = p.optInt("bos_token_id", d.bos)
	cfg.PadTokenID = p.optInt("pad_token_id", nil)
	if cfg.PadTokenID != nil && *cfg.PadTokenID == -1 {
		cfg.PadTokenID = nil
	}
	cfg.EOSTokenIDs = p.intOrList("eos_token_id", d.eos)

	// DeepSeek.
	cfg.QLoraRank = p.int("q_lora_rank", d.q_lora)
	cfg.KVLoraRank = p.int("kv_lora_rank", d.kv_lora)
	cfg.QKNopeHeadDim = p.int("qk_nope_head_dim", d.qk_nope)
	cfg.QKRopeHeadDim = p.int("qk_rope_head_dim", d.qk_rope)
	cfg.VHeadDim = p.int("v_head_dim", d.v_head)
	cfg.NRoutedExperts = p.int("n_routed_experts", p.int("num_experts", p.int("num_local_experts", d.n_routed)))
	cfg.NumExpertsPerTok = p.int("num_experts_per_tok", d.experts_per_tok)
	cfg.NSharedExperts = p.int("n_shared_experts", d.n_shared)
	cfg.MoEIntermediateSize = p.int("moe_intermediate_size", d.moe_intermediate)
	if cfg.ModelType == "mixtral" {
		cfg.MoEIntermediateSize = cfg.IntermediateSize
	}
	cfg.DecoderSparseStep = p.int("decoder_sparse_step", 1)
	cfg.MLPOnlyLayers = p.ints("mlp_only_layers")
	cfg.FirstKDenseReplace = p.int("first_k_dense_replace", d.first_k_dense)
	cfg.MoELayerFreq = p.int("moe_layer_freq", 1)
	cfg.TopKMethod = p.str("topk_method", d.topk_method)
	cfg.NGroup = p.int("n_group", d.n_group)
	cfg.TopKGroup = p.int("topk_group", d.topk_group)
	cfg.NormTopKProb = p.bool("norm_topk_prob", d.norm_topk_prob)
	if cfg.ModelType == "mixtral" {
		cfg.NormTopKProb = true // HF's Mixtral always renormalizes the top-k weights
	}
	cfg.RoutedScalingFactor = p.float("routed_scaling_factor", d.routed_scaling_factor)
	cfg.ScoringFunc = p.str("scoring_func", d.scoring_func)
	cfg.NumNextNPredictLayers = p.int("num_nextn_predict_layers", p.int("num_mtp_layers", 0))
	cfg.RopeInterleave = p.bool("rope_interleave", d.rope_interleave)
	if cfg.ModelType == "deepseek_v2" || cfg.ModelType == "deepseek_v3" {
		cfg.HeadDim = cfg.QKRopeHeadDim
	}

	cfg.Rope = p.rope()
	cfg.Quantization = p.quantization()
	if p.err != nil {
		return nil, p.err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// validate checks the values every model needs.
func (c *Config) validate() error {
	positive := []struct {
		key string
		v   int
	}{
		{"vocab_size", c.VocabSize},
		{"hidden_size", c.HiddenSize},
		{"num_hidden_layers", c.NumHiddenLayers},
		{"num_attention_heads", c.NumAttentionHeads},
		{"num_key_value_heads", c.NumKeyValueHeads},
		{"head_dim", c.HeadDim},
	}
	for _, f := range positive {
		if f.v <= 0 {
			return fmt.Errorf("%s = %d, want > 0: %w", f.key, f.v, ErrConfig)
		}
	}
	// Special-token ids index the vocabulary: a negative one is a broken
	// file, and would never match a sampled token.
	for _, f := range []struct {
		key string
		id  *int
	}{{"bos_token_id", c.BOSTokenID}, {"pad_token_id", c.PadTokenID}} {
		if f.id != nil && *f.id < 0 {
			return fmt.Errorf("%s = %d, want >= 0 (a token id): %w", f.key, *f.id, ErrConfig)
		}
	}
	for i, id := range c.EOSTokenIDs {
		if id < 0 {
			return fmt.Errorf("eos_token_id[%d] = %d, want >= 0 (a token id): %w", i, id, ErrConfig)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d: %w",
			c.NumAttentionHeads, c.NumKeyValueHeads, ErrConfig)
	}
	if c.RMSNormEps <= 0 {
		return fmt.Errorf("rms_norm_eps = %g, want > 0: %w", c.RMSNormEps, ErrConfig)
	}
	if c.NRoutedExperts > 0 && c.NGroup > 0 && c.NRoutedExperts%c.NGroup != 0 {
		return fmt.Errorf("n_routed_experts %d is not a multiple of n_group %d: %w",
			c.NRoutedExperts, c.NGroup, ErrConfig)
	}
	return nil
}

// IsMoELayer reports whether decoder layer i uses routed experts: for
// qwen3_moe, (i+1) % DecoderSparseStep == 0 and i not in MLPOnlyLayers;
// for mixtral every layer; else the DeepSeek rule, i >= FirstKDenseReplace
// and i % MoELayerFreq == 0.
func (c *Config) IsMoELayer(i int) bool {
	if c.NRoutedExperts <= 0 {
		return false
	}
	switch c.ModelType {
	case "qwen3_moe":
		for _, l := range c.MLPOnlyLayers {
			if l == i {
				return false
			}
		}
		return (i+1)%max(c.DecoderSparseStep, 1) == 0
	case "mixtral":
		return true
	}
	return i >= c.FirstKDenseReplace && i%max(c.MoELayerFreq, 1) == 0
}

// configParser reads typed values out of a config.json object, remembering
// the first error.
type configParser struct {
	raw map[string]json.RawMessage
	err error
}

func (p *configParser) fail(key string, msg json.RawMessage, want string) {
	if p.err == nil {
		p.err = fmt.Errorf("key %q: %s is not %s: %w", key, truncate(string(msg)), want, ErrConfig)
	}
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// lookup returns the raw value of key, or nil when absent or null.
func (p *configParser) lookup(key string) json.RawMessage {
	msg, ok := p.raw[key]
	if !ok || p.isNullMsg(msg) {
		return nil
	}
	return msg
}

func (p *configParser) isNullMsg(msg json.RawMessage) bool {
	return string(bytes.TrimSpace(msg)) == "null"
}

func (p *configParser) isNull(key string) bool {
	msg, ok := p.raw[key]
	return ok && p.isNullMsg(msg)
}

func (p *configParser) str(key, def string) string {
	msg := p.lookup(key)
	if msg == nil {
		return def
	}
	var s string
	if err := json.Unmarshal(msg, &s); err != nil {
		p.fail(key, msg, "a string")
		return def
	}
	return s
}

func (p *configParser) ints(key string) []int {
	msg := p.lookup(key)
	if msg == nil {
		return nil
	}
	var v []int
	if err := json.Unmarshal(msg, &v); err != nil {
		p.fail(key, msg, "a list of integers")
		return nil
	}
	return v
}

func (p *configParser) strs(key string) []string {
	msg := p.lookup(key)
	if msg == nil {
		return nil
	}
	var s []string
	if err := json.Unmarshal(msg, &s); err != nil {
		p.fail(key, msg, "a list of strings")
		return nil
	}
	return s
}

func (p *configParser) bool(key string, def bool) bool {
	msg := p.lookup(key)
	if msg == nil {
		return def
	}
	var b bool
	if err := json.Unmarshal(msg, &b); err != nil {
		p.fail(key, msg, "a boolean")
		return def
	}
	return b
}

func (p *configParser) float(key string, def float64) float64 {
	msg := p.lookup(key)
	if msg == nil {
		return def
	}
	var f float64
	if err := json.Unmarshal(msg, &f); err != nil {
		p.fail(key, msg, "a number")
		return def
	}
	return f
}

// parseInt accepts a JSON integer, or a float with an integral value (1e3).
func parseInt(msg json.RawMessage) (int, bool) {
	var f float64
	if err := json.Unmarshal(msg, &f); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int(f), true
}

// int returns the integer at key; def when absent; 0 when null.
func (p *configParser) int(key string, def int) int {
	msg, ok := p.raw[key]
	if !ok {
		return def
	}
	if p.isNullMsg(msg) {
		return 0
	}
	v, ok := parseInt(msg)
	if !ok {
		p.fail(key, msg, "an integer")
		return def
	}
	return v
}

// optInt returns the integer at key; def when absent; nil when null.
func (p *configParser) optInt(key string, def *int) *int {
	msg, ok := p.raw[key]
	if !ok {
		return def
	}
	if p.isNullMsg(msg) {
		return nil
	}
	v, ok := parseInt(msg)
	if !ok {
		p.fail(key, msg, "an integer")
		return def
	}
	return &v
}

// intOrList returns an integer or a list of integers as a list; def when
// absent; nil when null.
func (p *configParser) intOrList(key string, def []int) []int {
	msg, ok := p.raw[key]
	if !ok {
		return def
	}
	if p.isNullMsg(msg) {
		return nil
	}
	if v, ok := parseInt(msg); ok {
		return []int{v}
	}
	var list []json.RawMessage
	if err := json.Unmarshal(msg, &list); err != nil {
		p.fail(key, msg, "an integer or a list of integers")
		return def
	}
	out := make([]int, 0, len(list))
	for _, m := range list {
		v, ok := parseInt(m)
		if !ok {
			p.fail(key, msg, "an integer or a list of integers")
			return def
		}
		out = append(out, v)
	}
	return out
}

// rope merges rope_theta, rope_scaling and rope_parameters.
func (p *configParser) rope() Rope {
	r := Rope{
		Type:                "default",
		Theta:               p.float("rope_theta", 10000),
		Factor:              1,
		BetaFast:            32,
		BetaSlow:            1,
		Truncate:            true,
		PartialRotaryFactor: p.float("partial_rotary_factor", 1),
	}
	for _, key := range []string{"rope_scaling", "rope_parameters"} {
		msg := p.lookup(key)
		if msg == nil {
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(msg, &obj); err != nil {
			p.fail(key, msg, "an object")
			return r
		}
		sub := configParser{raw: obj}
		typ := sub.str("rope_type", sub.str("type", ""))
		if typ != "" {
			r.Type = typ
		}
		r.Theta = sub.float("rope_theta", r.Theta)
		r.Factor = sub.float("factor", r.Factor)
		r.OriginalMaxPositionEmbeddings = sub.int("original_max_position_embeddings", r.OriginalMaxPositionEmbeddings)
		r.LowFreqFactor = sub.float("low_freq_factor", r.LowFreqFactor)
		r.HighFreqFactor = sub.float("high_freq_factor", r.HighFreqFactor)
		r.BetaFast = sub.float("beta_fast", r.BetaFast)
		r.BetaSlow = sub.float("beta_slow", r.BetaSlow)
		r.Mscale = sub.float("mscale", r.Mscale)
		r.MscaleAllDim = sub.float("mscale_all_dim", r.MscaleAllDim)
		r.AttentionFactor = sub.float("attention_factor", r.AttentionFactor)
		r.Truncate = sub.bool("truncate", r.Truncate)
		r.PartialRotaryFactor = sub.float("partial_rotary_factor", r.PartialRotaryFactor)
		if sub.err != nil && p.err == nil {
			p.err = fmt.Errorf("%s: %w", key, sub.err)
		}
	}
	if p.err != nil {
		return r
	}
	known := false
	for _, t := range ropeTypes {
		known = known || t == r.Type
	}
	switch {
	case !known:
		p.err = fmt.Errorf("rope type %q is not one of %s: %w", r.Type, strings.Join(ropeTypes, ", "), ErrConfig)
	case r.Theta <= 0:
		p.err = fmt.Errorf("rope_theta = %g, want > 0: %w", r.Theta, ErrConfig)
	case r.Type != "default" && r.Factor <= 0:
		p.err = fmt.Errorf("rope type %q: factor = %g, want > 0: %w", r.Type, r.Factor, ErrConfig)
	case r.Type == "llama3" && (r.OriginalMaxPositionEmbeddings <= 0 || r.LowFreqFactor <= 0 || r.HighFreqFactor <= r.LowFreqFactor):
		p.err = fmt.Errorf("rope type llama3 needs original_max_position_embeddings > 0 and "+
			"high_freq_factor > low_freq_factor > 0, have %d, %g, %g: %w",
			r.OriginalMaxPositionEmbeddings, r.HighFreqFactor, r.LowFreqFactor, ErrConfig)
	}
	return r
}
