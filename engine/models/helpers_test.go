package models

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// Tiny configs covering every architecture and rope type; independent of the
// fixtures under testdata/.
var tinyConfigs = map[string]string{
	"llama": `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
		"rope_theta": 500000.0, "attention_bias": true,
		"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
			"original_max_position_embeddings": 64}}`,
	"mistral": `{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 8,
		"num_key_value_heads": 2, "head_dim": 4, "max_position_embeddings": 4096, "sliding_window": 5,
		"rope_scaling": {"type": "linear", "factor": 2.0}}`,
	"qwen2": `{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 4, "max_position_embeddings": 4096, "tie_word_embeddings": true,
		"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}`,
	"qwen3": `{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 12, "max_position_embeddings": 4096, "tie_word_embeddings": true}`,
	"qwen3-moe": `{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 40, "moe_intermediate_size": 12, "num_hidden_layers": 3,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12, "max_position_embeddings": 4096,
		"num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1,
		"mlp_only_layers": [1], "tie_word_embeddings": false}`,
	"mixtral": `{"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "max_position_embeddings": 4096, "num_local_experts": 4,
		"num_experts_per_tok": 2, "rope_theta": 1000000.0, "sliding_window": null}`,
	"deepseek-v2": `{"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 12, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": null, "kv_lora_rank": 16,
		"qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 8,
		"num_experts_per_tok": 2, "n_shared_experts": 2, "first_k_dense_replace": 1,
		"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.0,
		"scoring_func": "softmax", "max_position_embeddings": 163840,
		"rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
			"beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}}`,
	// deepseek-v2 with biases on kv_a and o (attention_bias): kv_a is then
	// a weight of its own, not a view of a fused q / kv_a one.
	"deepseek-v2-bias": `{"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 12, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": null, "kv_lora_rank": 16,
		"qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 8,
		"num_experts_per_tok": 2, "n_shared_experts": 2, "first_k_dense_replace": 1,
		"topk_method": "greedy", "scoring_func": "softmax", "max_position_embeddings": 4096,
		"attention_bias": true}`,
	"deepseek-v3": `{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 8, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 12, "kv_lora_rank": 16,
		"qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 8,
		"num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "topk_method": "noaux_tc",
		"n_group": 4, "topk_group": 2, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
		"scoring_func": "sigmoid", "num_nextn_predict_layers": 1, "max_position_embeddings": 163840,
		"rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
			"beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}`,
}

// tinyNames is the order tests walk tinyConfigs in.
var tinyNames = []string{"llama", "mistral", "qwen2", "qwen3", "qwen3-moe", "mixtral", "deepseek-v2", "deepseek-v3"}

// tinyWeights returns the tiny config called name and random weights for
// it in dtype, drawn from seed.
func tinyWeights(t testing.TB, name string, dtype kernels.DType, seed uint64) (*weights.Config, MemWeights) {
	t.Helper()
	cfg := parseConfig(t, tinyConfigs[name])
	w, err := RandomWeights(cfg, dtype, seed)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, w
}

// testMaxLen bounds the RoPE tables of test models.
const testMaxLen = 256

func newBackend(t testing.TB, threads int) *cpu.Backend {
	t.Helper()
	b := cpu.New(cpu.Options{Threads: threads})
	t.Cleanup(func() { b.Close() })
	return b
}

func parseConfig(t testing.TB, js string) *weights.Config {
	t.Helper()
	cfg, err := weights.ParseConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// tinyModel builds a tiny model with random weights in dtype.
func tinyModel(t testing.TB, ops kernels.Ops, name string, dtype kernels.DType) (Model, MemWeights) {
	t.Helper()
	cfg := parseConfig(t, tinyConfigs[name])
	w, err := RandomWeights(cfg, dtype, 7)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Builtin().New(ops, cfg, w, Options{MaxModelLen: testMaxLen})
	if err != nil {
		t.Fatal(err)
	}
	return m, w
}

// blockPool hands out physical blocks in a shuffled order.
type blockPool struct{ free []int32 }

func newBlockPool(r *rand.Rand, n int) *blockPool {
	p := &blockPool{}
	for _, i := range r.Perm(n) {
		p.free = append(p.free, int32(i))
	}
	return p
}

// table returns a block table covering numTokens tokens.
func (p *blockPool) table(blockSize, numTokens int) []int32 {
	n := (numTokens + blockSize - 1) / blockSize
	t := p.free[:n:n]
	p.free = p.free[n:]
	return t
}

// seqStep is one sequence's share of a step: new ids after numCached tokens.
type seqStep struct {
	ids       []int32
	numCached int
	table     []int32
}

// step runs one forward over the given sequences and returns the logits of
// every new token, row-major [num_tokens][vocab], and the hidden states.
func step(t testing.TB, m Model, cache *KVCache, seqs ...seqStep) ([][]float32, kernels.Tensor) {
	t.Helper()
	h := HostBatch{BlockSize: cache.BlockSize}
	for _, s := range seqs {
		h.AddSequence(s.ids, s.numCached, s.table)
	}
	b, err := h.Upload(opsOf(m), cache.NumBlocks)
	if err != nil {
		t.Fatal(err)
	}
	hidden, err := m.Forward(context.Background(), cache, b)
	if err != nil {
		t.Fatal(err)
	}
	lg, err := m.ComputeLogits(hidden, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rowsOf(t, opsOf(m), lg), hidden
}

func opsOf(m Model) kernels.Ops {
	switch x := m.(type) {
	case *llama:
		return x.ops
	case *deepseek:
		return x.ops
	case *gemma3:
		return x.ops
	case *gptOss:
		return x.ops
	}
	panic("unknown model type")
}

func rowsOf(t testing.TB, ops kernels.Ops, ten kernels.Tensor) [][]float32 {
	t.Helper()
	v, err := kernels.ToF32(ops, ten)
	if err != nil {
		t.Fatal(err)
	}
	n := ten.Shape()[1]
	var rows [][]float32
	for i := 0; i < len(v); i += n {
		rows = append(rows, v[i:i+n])
	}
	return rows
}

func randomIDs(r *rand.Rand, n, vocab int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	return ids
}

// relErr is max|got-want| / max|want| over a row.
func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i := range want {
		num = math.Max(num, math.Abs(float64(got[i])-want[i]))
		den = math.Max(den, math.Abs(want[i]))
	}
	if den == 0 {
		return num
	}
	return num / den
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func argmax(xs []float32) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
}
