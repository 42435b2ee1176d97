package llm

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/weights"
)

// tinyLlama writes a random-weight Llama (vocab 64, hidden 32, 2 layers,
// GQA) to a temp directory and returns it.
func tinyLlama(t testing.TB) string {
	t.Helper()
	const vocab, hidden, inter, layers, heads, kvHeads, headDim = 64, 32, 64, 2, 4, 2, 8
	dir := t.TempDir()
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
		"num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kvHeads,
		"head_dim": headDim, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
		"tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
	}
	data, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	var ts []weights.Tensor
	mat := func(name string, rows, cols int, std float64) {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * std)
		}
		ts = append(ts, weights.F32Tensor(name, []int{rows, cols}, v))
	}
	ones := func(name string, n int) {
		v := make([]float32, n)
		for i := range v {
			v[i] = 1 + float32(rng.NormFloat64()*0.1)
		}
		ts = append(ts, weights.F32Tensor(name, []int{n}, v))
	}
	mat("model.embed_tokens.weight", vocab, hidden, 1)
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		mat(p+"self_attn.q_proj.weight", heads*headDim, hidden, 0.2)
		mat(p+"self_attn.k_proj.weight", kvHeads*headDim, hidden, 0.2)
		mat(p+"self_attn.v_proj.weight", kvHeads*headDim, hidden, 0.2)
		mat(p+"self_attn.o_proj.weight", hidden, heads*headDim, 0.2)
		mat(p+"mlp.gate_proj.weight", inter, hidden, 0.2)
		mat(p+"mlp.up_proj.weight", inter, hidden, 0.2)
		mat(p+"mlp.down_proj.weight", hidden, inter, 0.2)
		ones(p+"input_layernorm.weight", hidden)
		ones(p+"post_attention_layernorm.weight", hidden)
	}
	ones("model.norm.weight", hidden)
	mat("lm_head.weight", vocab, hidden, 0.5)
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tinyConfig returns a config for the tiny model, changed by edit.
func tinyConfig(t testing.TB, dir string, edit func(*config.Config)) *config.Config {
	t.Helper()
	yaml := fmt.Sprintf("model: %s\ncpu: {threads: 2}\ncache: {num_blocks: 64, block_size: 4}\nengine: {max_num_seqs: 8, max_num_batched_tokens: 64, prefill_chunk_size: 16}\npipeline: {sample: greedy}\n", dir)
	cfg, err := config.Parse("tiny.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}
