package models

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// RandomWeights builds, in memory, every tensor the architecture of cfg reads,
// with seeded random values stored in dtype (F32, BF16 or F16): matrices
// uniform with variance 1/fan_in (so activations stay of order one), norm
// weights near 1, biases and the routing bias small. For tests and
// benchmarks that need a model without files. Cost: the model's size in
// memory, generated on one core.
func RandomWeights(cfg *weights.Config, dtype kernels.DType, seed uint64) (MemWeights, error) {
	var wdt weights.DType
	switch dtype {
	case kernels.F32:
		wdt = weights.F32
	case kernels.BF16:
		wdt = weights.BF16
	case kernels.F16:
		wdt = weights.F16
	default:
		return nil, fmt.Errorf("models: random weights in %v: %w", dtype, kernels.ErrDType)
	}
	g := &randGen{r: rand.New(rand.NewPCG(seed, 0x5eed)), dtype: wdt, out: MemWeights{}}
	arch := ""
	if len(cfg.Architectures) > 0 {
		arch = cfg.Architectures[0]
	}
	h := cfg.HiddenSize
	g.matrix("model.embed_tokens.weight", 1, cfg.VocabSize, h)
	if arch == "Gemma3ForCausalLM" {
		g.small("model.norm.weight", h) // Gemma's norms scale by 1 + weight
	} else {
		g.norm("model.norm.weight", h)
	}
	if !cfg.TieWordEmbeddings {
		g.matrix("lm_head.weight", h, cfg.VocabSize, h)
	}
	switch arch {
	case "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
		"Qwen3MoeForCausalLM", "MixtralForCausalLM":
		for i := range cfg.NumHiddenLayers {
			g.llamaLayer(cfg, arch, fmt.Sprintf("model.layers.%d.", i), i)
		}
	case "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM":
		n := cfg.NumHiddenLayers
		if arch == "DeepseekV3ForCausalLM" {
			n += cfg.NumNextNPredictLayers
		}
		for i := range n {
			p := fmt.Sprintf("model.layers.%d.", i)
			g.deepseekLayer(cfg, p, i)
			if i >= cfg.NumHiddenLayers {
				g.norm(p+"enorm.weight", h)
				g.norm(p+"hnorm.weight", h)
				g.matrix(p+"eh_proj.weight", 2*h, h, 2*h)
				g.norm(p+"shared_head.norm.weight", h)
			}
		}
	case "Gemma3ForCausalLM":
		for i := range cfg.NumHiddenLayers {
			g.gemma3Layer(cfg, fmt.Sprintf("model.layers.%d.", i))
		}
	default:
		return nil, fmt.Errorf("models: random weights for architecture %q: %w", arch, ErrUnknownArchitecture)
	}
	return g.out, nil
}

type randGen struct {
	r     *rand.Rand
	dtype weights.DType
	out   MemWeights
}

// put stores vals under name in g.dtype.
func (g *randGen) put(name string, vals []float32, shape ...int) {
	var data []byte
	switch g.dtype {
	case weights.F32:
		data = kernels.F32Bytes(vals)
	default:
		data = make([]byte, 2*len(vals))
		for i, v := range vals {
			h := kernels.F32ToBF16(v)
			if g.dtype == weights.F16 {
				h = kernels.F32ToF16(v)
			}
			binary.LittleEndian.PutUint16(data[2*i:], h)
		}
	}
	g.out[name] = weights.Tensor{Name: name, DType: g.dtype, Shape: shape, Data: data, File: "random"}
}

func (g *randGen) uniform(n int, a float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((2*g.r.Float64() - 1) * a)
	}
	return v
}

// matrix stores a tensor whose values have variance 1/fanIn.
func (g *randGen) matrix(name string, fanIn int, shape ...int) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	g.put(name, g.uniform(n, math.Sqrt(3/float64(fanIn))), shape...)
}

func (g *randGen) norm(name string, n int) {
	v := g.uniform(n, 0.2)
	for i := range v {
		v[i] += 1
	}
	g.put(name, v, n)
}

func (g *randGen) small(name string, n int) { g.put(name, g.uniform(n, 0.1), n) }

func (g *randGen) mlp(p string, h, inter int, bias bool) {
	g.matrix(p+"gate_proj.weight", h, inter, h)
	g.matrix(p+"up_proj.weight", h, inter, h)
	g.matrix(p+"down_proj.weight", inter, h, inter)
	if bias {
		g.small(p+"gate_proj.bias", inter)
		g.small(p+"up_proj.bias", inter)
		g.small(p+"down_proj.bias", h)
	}
}

func (g *randGen) llamaLayer(cfg *weights.Config, arch, p string, i int) {
	h, qd, kvd := cfg.HiddenSize, cfg.NumAttentionHeads*cfg.HeadDim, cfg.NumKeyValueHeads*cfg.HeadDim
	a := p + "self_attn."
	g.norm(p+"input_layernorm.weight", h)
	g.norm(p+"post_attention_layernorm.weight", h)
	g.matrix(a+"q_proj.weight", h, qd, h)
	g.matrix(a+"k_proj.weight", h, kvd, h)
	g.matrix(a+"v_proj.weight", h, kvd, h)
	g.matrix(a+"o_proj.weight", qd, h, qd)
	if cfg.AttentionBias {
		g.small(a+"q_proj.bias", qd)
		g.small(a+"k_proj.bias", kvd)
		g.small(a+"v_proj.bias", kvd)
		if cfg.ModelType != "qwen2" { // Qwen2's o_proj has no bias
			g.small(a+"o_proj.bias", h)
		}
	}
	if cfg.ModelType == "qwen3" || cfg.ModelType == "qwen3_moe" {
		g.norm(a+"q_norm.weight", cfg.HeadDim)
		g.norm(a+"k_norm.weight", cfg.HeadDim)
	}
	switch {
	case arch == "MixtralForCausalLM": // the hub's names
		m := p + "block_sparse_moe."
		g.matrix(m+"gate.weight", h, cfg.NRoutedExperts, h)
		for e := range cfg.NRoutedExperts {
			x, inter := fmt.Sprintf("%sexperts.%d.", m, e), cfg.MoEIntermediateSize
			g.matrix(x+"w1.weight", h, inter, h)
			g.matrix(x+"w3.weight", h, inter, h)
			g.matrix(x+"w2.weight", inter, h, inter)
		}
	case arch == "Qwen3MoeForCausalLM" && cfg.IsMoELayer(i):
		g.matrix(p+"mlp.gate.weight", h, cfg.NRoutedExperts, h)
		for e := range cfg.NRoutedExperts {
			g.mlp(fmt.Sprintf("%smlp.experts.%d.", p, e), h, cfg.MoEIntermediateSize, false)
		}
	default:
		g.mlp(p+"mlp.", h, cfg.IntermediateSize, cfg.MLPBias)
	}
}

func (g *randGen) deepseekLayer(cfg *weights.Config, p string, i int) {
	h, nh := cfg.HiddenSize, cfg.NumAttentionHeads
	nope, rope, kvl, vd := cfg.QKNopeHeadDim, cfg.QKRopeHeadDim, cfg.KVLoraRank, cfg.VHeadDim
	a := p + "self_attn."
	g.norm(p+"input_layernorm.weight", h)
	g.norm(p+"post_attention_layernorm.weight", h)
	if cfg.QLoraRank > 0 {
		g.matrix(a+"q_a_proj.weight", h, cfg.QLoraRank, h)
		g.norm(a+"q_a_layernorm.weight", cfg.QLoraRank)
		g.matrix(a+"q_b_proj.weight", cfg.QLoraRank, nh*(nope+rope), cfg.QLoraRank)
		if cfg.AttentionBias {
			g.small(a+"q_a_proj.bias", cfg.QLoraRank)
		}
	} else {
		g.matrix(a+"q_proj.weight", h, nh*(nope+rope), h)
	}
	g.matrix(a+"kv_a_proj_with_mqa.weight", h, kvl+rope, h)
	g.norm(a+"kv_a_layernorm.weight", kvl)
	g.matrix(a+"kv_b_proj.weight", kvl, nh*(nope+vd), kvl)
	g.matrix(a+"o_proj.weight", nh*vd, h, nh*vd)
	if cfg.AttentionBias {
		g.small(a+"kv_a_proj_with_mqa.bias", kvl+rope)
		g.small(a+"o_proj.bias", h)
	}
	if !cfg.IsMoELayer(i) {
		g.mlp(p+"mlp.", h, cfg.IntermediateSize, false)
		return
	}
	e, inter := cfg.NRoutedExperts, cfg.MoEIntermediateSize
	g.matrix(p+"mlp.gate.weight", h, e, h)
	if cfg.TopKMethod == "noaux_tc" {
		g.small(p+"mlp.gate.e_score_correction_bias", e)
	}
	for x := range e {
		g.mlp(fmt.Sprintf("%smlp.experts.%d.", p, x), h, inter, false)
	}
	if cfg.NSharedExperts > 0 {
		g.mlp(p+"mlp.shared_experts.", h, inter*cfg.NSharedExperts, false)
	}
}

// gemma3Layer stores a Gemma 3 decoder layer; its norm weights are near 0
// (Gemma's RMSNorm scales by 1 + weight).
func (g *randGen) gemma3Layer(cfg *weights.Config, p string) {
	h, qd, kvd := cfg.HiddenSize, cfg.NumAttentionHeads*cfg.HeadDim, cfg.NumKeyValueHeads*cfg.HeadDim
	a := p + "self_attn."
	for _, n := range []string{"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"} {
		g.small(p+n+".weight", h)
	}
	g.matrix(a+"q_proj.weight", h, qd, h)
	g.matrix(a+"k_proj.weight", h, kvd, h)
	g.matrix(a+"v_proj.weight", h, kvd, h)
	g.matrix(a+"o_proj.weight", qd, h, qd)
	g.small(a+"q_norm.weight", cfg.HeadDim)
	g.small(a+"k_norm.weight", cfg.HeadDim)
	g.mlp(p+"mlp.", h, cfg.IntermediateSize, false)
}
