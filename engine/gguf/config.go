package gguf

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Architectures lists the general.architecture values Config maps.
var Architectures = []string{"llama", "qwen2", "qwen3", "qwen3moe", "deepseek2"}

// KeyYarnMscale is this engine's key for the mscale of a DeepSeek YaRN
// config (rope_scaling.mscale) where it differs from mscale_all_dim: llama.cpp
// stores only mscale_all_dim (as rope.scaling.yarn_log_multiplier, times
// 0.1) and computes as if both were equal, which DeepSeek's published
// configs are. llama.cpp ignores the key.
const KeyYarnMscale = "deepinfer.rope.scaling.yarn_mscale"

// Config maps the file's hyper-parameters to the keys of a Hugging Face
// config.json for the same model, so that the engine's config.json parser
// (defaults, validation) applies unchanged: marshal the map and parse it.
// It covers the architectures in Architectures; another one is an error
// naming it. A required key that is missing or of the wrong type is an
// error naming the key. Cost: a few map lookups (the vocabulary size is the
// length of tokenizer.ggml.tokens when {arch}.vocab_size is absent).
//
// What GGUF does not store is filled as llama.cpp assumes it: no biases
// except where the tensors have them (qwen2's q/k/v biases), untied
// embeddings unless output.weight is absent, and for deepseek2 the V3
// routing (sigmoid scores, noaux_tc) when expert_gating_func is 2, else V2's.
// A llama file with {arch}.expert_count is Mixtral (MixtralForCausalLM:
// feed_forward_length is each expert's size). qwen3moe renormalizes the
// top-k weights unless qwen3moe.expert_weights_norm says false (llama.cpp
// always does), and its layers without blk.N.ffn_gate_inp.weight are dense
// (mlp_only_layers; llama.cpp wants every layer sparse). For deepseek2,
// block_count counts the nextn (MTP) layers as llama.cpp does; they are not
// decoder layers.
// A rope_freqs.weight tensor (Llama 3.1-style frequency factors) has no
// config.json form and is an error.
func (f *File) Config() (map[string]any, error) {
	arch, err := f.requireString("general.architecture")
	if err != nil {
		return nil, err
	}
	c := map[string]any{}
	p := func(k string) string { return arch + "." + k }
	switch arch {
	case "llama":
		c["model_type"], c["architectures"] = "llama", []string{"LlamaForCausalLM"}
		if n, _ := f.optInt(p("expert_count")); n > 0 {
			c["model_type"], c["architectures"] = "mixtral", []string{"MixtralForCausalLM"}
		}
	case "qwen3moe":
		c["model_type"], c["architectures"] = "qwen3_moe", []string{"Qwen3MoeForCausalLM"}
	case "qwen2":
		c["model_type"], c["architectures"] = "qwen2", []string{"Qwen2ForCausalLM"}
	case "qwen3":
		c["model_type"], c["architectures"] = "qwen3", []string{"Qwen3ForCausalLM"}
	case "deepseek2":
		// The same GGUF architecture serves V2 and V3; sigmoid gating is V3.
		if g, _ := f.optInt(p("expert_gating_func")); g == 2 {
			c["model_type"], c["architectures"] = "deepseek_v3", []string{"DeepseekV3ForCausalLM"}
		} else {
			c["model_type"], c["architectures"] = "deepseek_v2", []string{"DeepseekV2ForCausalLM"}
		}
	default:
		return nil, fmt.Errorf("gguf: general.architecture %q is not supported (supported: %v)", arch, Architectures)
	}
	if _, ok := f.Tensor("rope_freqs.weight"); ok {
		return nil, fmt.Errorf("gguf: tensor \"rope_freqs.weight\" (rope frequency factors) has no config.json equivalent")
	}
	required := []struct{ gguf, hf string }{
		{"embedding_length", "hidden_size"},
		{"block_count", "num_hidden_layers"},
		{"attention.head_count", "num_attention_heads"},
	}
	for _, r := range required {
		v, err := f.requireInt(p(r.gguf))
		if err != nil {
			return nil, err
		}
		c[r.hf] = v
	}
	optional := []struct{ gguf, hf string }{
		{"feed_forward_length", "intermediate_size"},
		{"context_length", "max_position_embeddings"},
		{"attention.head_count_kv", "num_key_value_heads"},
	}
	for _, o := range optional {
		if v, ok, err := f.intKey(p(o.gguf)); err != nil {
			return nil, err
		} else if ok {
			c[o.hf] = v
		}
	}
	if v, ok, err := f.floatKey(p("attention.layer_norm_rms_epsilon")); err != nil {
		return nil, err
	} else if ok {
		c["rms_norm_eps"] = v
	}
	if v, ok, err := f.floatKey(p("rope.freq_base")); err != nil {
		return nil, err
	} else if ok {
		c["rope_theta"] = v
	}
	if err := f.ropeScaling(arch, c); err != nil {
		return nil, err
	}
	if v, ok, err := f.intKey(p("vocab_size")); err != nil {
		return nil, err
	} else if ok {
		c["vocab_size"] = v
	} else if tv, ok := f.Get("tokenizer.ggml.tokens"); ok && tv.Len() >= 0 {
		c["vocab_size"] = tv.Len()
	}
	// Head size: key_length where set (qwen3 writes it), else the default.
	if arch != "deepseek2" {
		if v, ok, err := f.intKey(p("attention.key_length")); err != nil {
			return nil, err
		} else if ok {
			c["head_dim"] = v
		}
	}
	_, hasOutput := f.Tensor("output.weight")
	c["tie_word_embeddings"] = !hasOutput
	if arch == "qwen2" {
		_, bias := f.Tensor("blk.0.attn_q.bias")
		c["attention_bias"] = bias
	} else if _, bias := f.Tensor("blk.0.attn_q.bias"); bias {
		c["attention_bias"] = true
	}
	for key, hf := range map[string]string{
		"tokenizer.ggml.bos_token_id":     "bos_token_id",
		"tokenizer.ggml.eos_token_id":     "eos_token_id",
		"tokenizer.ggml.padding_token_id": "pad_token_id",
	} {
		if v, ok, err := f.intKey(key); err != nil {
			return nil, err
		} else if ok {
			c[hf] = v
		}
	}
	switch {
	case arch == "deepseek2":
		if err := f.deepseek(c, p); err != nil {
			return nil, err
		}
	case c["model_type"] == "mixtral" || arch == "qwen3moe":
		if err := f.sparseMoE(arch, c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// sparseMoE maps the experts of a Mixtral (llama) or qwen3moe file.
func (f *File) sparseMoE(arch string, c map[string]any) error {
	p := func(k string) string { return arch + "." + k }
	n, err := f.requireInt(p("expert_count"))
	if err != nil {
		return err
	}
	used, err := f.requireInt(p("expert_used_count"))
	if err != nil {
		return err
	}
	if n <= 0 || used <= 0 || used > n {
		return fmt.Errorf("gguf: keys %q = %d and %q = %d: want 0 < used <= count", p("expert_count"), n, p("expert_used_count"), used)
	}
	c["num_experts_per_tok"] = used
	if arch == "llama" {
		c["num_local_experts"] = n
		return nil
	}
	c["num_experts"] = n
	if v, ok, err := f.intKey(p("expert_feed_forward_length")); err != nil {
		return err
	} else if ok {
		c["moe_intermediate_size"] = v
	}
	c["norm_topk_prob"] = true
	if v, ok := f.Get(p("expert_weights_norm")); ok {
		b, isBool := v.Bool()
		if !isBool {
			return fmt.Errorf("gguf: key %q: %s, want a bool", p("expert_weights_norm"), v.Type())
		}
		c["norm_topk_prob"] = b
	}
	layers, _ := c["num_hidden_layers"].(int64)
	if layers > int64(len(f.Tensors)) {
		// Every layer has tensors: a larger count is a lie, and would size
		// the list below.
		return fmt.Errorf("gguf: key %q = %d, more layers than the file's %d tensors", p("block_count"), layers, len(f.Tensors))
	}
	dense := []int64{}
	for i := range layers {
		if _, ok := f.Tensor(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", i)); !ok {
			dense = append(dense, i)
		}
	}
	c["decoder_sparse_step"] = 1
	c["mlp_only_layers"] = dense
	return nil
}

// ConfigJSON is Config marshalled as config.json bytes.
func (f *File) ConfigJSON() ([]byte, error) {
	c, err := f.Config()
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(c, "", "  ")
}

func (f *File) ropeScaling(arch string, c map[string]any) error {
	p := func(k string) string { return arch + "." + k }
	typ, ok := f.Get(p("rope.scaling.type"))
	if !ok {
		return nil
	}
	s, isStr := typ.String()
	if !isStr {
		return fmt.Errorf("gguf: key %q: %s, want a string", p("rope.scaling.type"), typ.Type())
	}
	if s == "none" || s == "" {
		return nil
	}
	if s != "linear" && s != "yarn" {
		return fmt.Errorf("gguf: key %q: rope scaling %q is not supported", p("rope.scaling.type"), s)
	}
	rs := map[string]any{"rope_type": s}
	if v, ok, err := f.floatKey(p("rope.scaling.factor")); err != nil {
		return err
	} else if ok {
		rs["factor"] = v
	}
	if v, ok, err := f.intKey(p("rope.scaling.original_context_length")); err != nil {
		return err
	} else if ok {
		rs["original_max_position_embeddings"] = v
	}
	for _, k := range []struct{ gguf, hf string }{{"rope.scaling.yarn_beta_fast", "beta_fast"}, {"rope.scaling.yarn_beta_slow", "beta_slow"}} {
		if v, ok, err := f.floatKey(p(k.gguf)); err != nil {
			return err
		} else if ok {
			rs[k.hf] = v
		}
	}
	// convert_hf_to_gguf writes 0.1 * mscale_all_dim for DeepSeek's yarn,
	// and llama.cpp takes mscale to be equal unless KeyYarnMscale says.
	if v, ok, err := f.floatKey(p("rope.scaling.yarn_log_multiplier")); err != nil {
		return err
	} else if ok && v != 0 {
		all := shortest32(v / 0.1)
		rs["mscale_all_dim"] = all
		rs["mscale"] = all
		if m, ok, err := f.floatKey(KeyYarnMscale); err != nil {
			return err
		} else if ok {
			rs["mscale"] = m
		}
	}
	c["rope_scaling"] = rs
	return nil
}

func (f *File) deepseek(c map[string]any, p func(string) string) error {
	ints := []struct{ gguf, hf string }{
		{"attention.q_lora_rank", "q_lora_rank"},
		{"attention.kv_lora_rank", "kv_lora_rank"},
		{"rope.dimension_count", "qk_rope_head_dim"},
		{"leading_dense_block_count", "first_k_dense_replace"},
		{"expert_feed_forward_length", "moe_intermediate_size"},
		{"expert_count", "n_routed_experts"},
		{"expert_shared_count", "n_shared_experts"},
		{"expert_used_count", "num_experts_per_tok"},
		{"expert_group_count", "n_group"},
		{"expert_group_used_count", "topk_group"},
		{"nextn_predict_layers", "num_nextn_predict_layers"},
	}
	for _, e := range ints {
		if v, ok, err := f.intKey(p(e.gguf)); err != nil {
			return err
		} else if ok {
			c[e.hf] = v
		}
	}
	if nextn, ok := c["num_nextn_predict_layers"].(int64); ok && nextn > 0 {
		all, _ := c["num_hidden_layers"].(int64)
		if nextn >= all {
			return fmt.Errorf("gguf: key %q = %d, not fewer than %q = %d", p("nextn_predict_layers"), nextn, p("block_count"), all)
		}
		c["num_hidden_layers"] = all - nextn
	}
	// The file describes MLA as multi-query attention (head_count_kv 1);
	// the checkpoint's config has one kv head per attention head.
	c["num_key_value_heads"] = c["num_attention_heads"]
	if _, ok := c["q_lora_rank"]; !ok {
		c["q_lora_rank"] = nil // DeepSeek-V2-Lite: a plain q_proj
	}
	if _, ok := f.Tensor("blk.0.attn_q.weight"); ok {
		c["q_lora_rank"] = nil
	} else if r, _ := c["q_lora_rank"].(int64); r == 0 {
		c["q_lora_rank"] = nil
	}
	rope, _ := c["qk_rope_head_dim"].(int64)
	// Newer conversions store the MLA sizes as key_length_mla /
	// value_length_mla (key_length then is the absorbed kv_lora_rank+rope).
	keyLen, ok, err := f.intKey(p("attention.key_length_mla"))
	if err != nil {
		return err
	}
	if !ok {
		if keyLen, ok, err = f.intKey(p("attention.key_length")); err != nil {
			return err
		}
	}
	if ok {
		c["qk_nope_head_dim"] = keyLen - rope
	}
	valLen, ok, err := f.intKey(p("attention.value_length_mla"))
	if err != nil {
		return err
	}
	if !ok {
		if valLen, ok, err = f.intKey(p("attention.value_length")); err != nil {
			return err
		}
	}
	if ok {
		c["v_head_dim"] = valLen
	}
	if v, ok, err := f.floatKey(p("expert_weights_scale")); err != nil {
		return err
	} else if ok {
		c["routed_scaling_factor"] = v
	}
	if v, ok := f.Get(p("expert_weights_norm")); ok {
		b, isBool := v.Bool()
		if !isBool {
			return fmt.Errorf("gguf: key %q: %s, want a bool", p("expert_weights_norm"), v.Type())
		}
		c["norm_topk_prob"] = b
	}
	g, _ := f.optInt(p("expert_gating_func"))
	switch g {
	case 0, 1:
		c["scoring_func"] = "softmax"
		if ng, _ := c["n_group"].(int64); ng > 1 {
			c["topk_method"] = "group_limited_greedy"
		} else {
			c["topk_method"] = "greedy"
		}
	case 2:
		c["scoring_func"] = "sigmoid"
		c["topk_method"] = "noaux_tc"
	default:
		return fmt.Errorf("gguf: key %q: gating function %d, want 1 (softmax) or 2 (sigmoid)", p("expert_gating_func"), g)
	}
	return nil
}

// shortest32 rounds x to float32 and returns the shortest decimal of that
// (a value stored as float32 and scaled back, 0.0707/0.1, reads as 0.707).
func shortest32(x float64) float64 {
	d, _ := strconv.ParseFloat(strconv.FormatFloat(float64(float32(x)), 'g', -1, 32), 64)
	return d
}

func (f *File) requireString(key string) (string, error) {
	v, ok := f.Get(key)
	if !ok {
		return "", fmt.Errorf("gguf: missing key %q", key)
	}
	s, ok := v.String()
	if !ok {
		return "", fmt.Errorf("gguf: key %q: %s, want a string", key, v.Type())
	}
	return s, nil
}

func (f *File) requireInt(key string) (int64, error) {
	v, ok, err := f.intKey(key)
	if err == nil && !ok {
		err = fmt.Errorf("gguf: missing key %q", key)
	}
	return v, err
}

// intKey returns an integer key; absent is ok = false, another type an error.
func (f *File) intKey(key string) (int64, bool, error) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false, nil
	}
	i, isInt := v.Int()
	if !isInt {
		return 0, false, fmt.Errorf("gguf: key %q: %s, want an integer", key, v.Type())
	}
	return i, true, nil
}

func (f *File) optInt(key string) (int64, bool) {
	v, ok, err := f.intKey(key)
	return v, ok && err == nil
}

// floatKey returns a float (or integer) key; absent is ok = false.
func (f *File) floatKey(key string) (float64, bool, error) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false, nil
	}
	if x, is32 := v.Any().(float32); is32 {
		// The shortest decimal of the float32, as config.json would say it
		// (1e-06, not 9.999999974752427e-07).
		d, _ := strconv.ParseFloat(strconv.FormatFloat(float64(x), 'g', -1, 32), 64)
		return d, true, nil
	}
	x, isNum := v.Float()
	if !isNum {
		return 0, false, fmt.Errorf("gguf: key %q: %s, want a number", key, v.Type())
	}
	return x, true, nil
}
