// Package random writes Hugging Face model directories with seeded random
// weights, for tests, examples and benchmarks that need a real checkpoint
// on disk without downloading one.
package random

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/deepinfer/deepinfer-go/engine/weights"
)

// Llama describes a Llama-architecture model.
type Llama struct {
	Vocab, Hidden, Intermediate, Layers, Heads, KVHeads, HeadDim int
	MaxPositions                                                 int
	TieEmbeddings                                                bool
	BOS, EOS                                                     int
}

// TinyLlama is a 64-token, 2-layer GQA model small enough for unit tests.
var TinyLlama = Llama{Vocab: 64, Hidden: 32, Intermediate: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, MaxPositions: 256, BOS: 1, EOS: 2}

// WriteLlama writes config.json and model.safetensors (F32) for m into dir,
// with weights drawn from a normal distribution seeded by seed.
func WriteLlama(dir string, m Llama, seed uint64) error {
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"vocab_size": m.Vocab, "hidden_size": m.Hidden, "intermediate_size": m.Intermediate,
		"num_hidden_layers": m.Layers, "num_attention_heads": m.Heads, "num_key_value_heads": m.KVHeads,
		"head_dim": m.HeadDim, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": m.MaxPositions,
		"tie_word_embeddings": m.TieEmbeddings, "bos_token_id": m.BOS, "eos_token_id": m.EOS, "dtype": "float32",
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 0x11a3a))
	var ts []weights.Tensor
	normal := func(name string, std float64, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * std)
		}
		ts = append(ts, weights.F32Tensor(name, shape, v))
	}
	norm := func(name string, n int) {
		v := make([]float32, n)
		for i := range v {
			v[i] = 1 + float32(rng.NormFloat64()*0.1)
		}
		ts = append(ts, weights.F32Tensor(name, []int{n}, v))
	}
	normal("model.embed_tokens.weight", 1, m.Vocab, m.Hidden)
	proj := 1 / float64(m.Hidden) * 6 // keeps activations in range for any width
	for l := range m.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		normal(p+"self_attn.q_proj.weight", proj, m.Heads*m.HeadDim, m.Hidden)
		normal(p+"self_attn.k_proj.weight", proj, m.KVHeads*m.HeadDim, m.Hidden)
		normal(p+"self_attn.v_proj.weight", proj, m.KVHeads*m.HeadDim, m.Hidden)
		normal(p+"self_attn.o_proj.weight", proj, m.Hidden, m.Heads*m.HeadDim)
		normal(p+"mlp.gate_proj.weight", proj, m.Intermediate, m.Hidden)
		normal(p+"mlp.up_proj.weight", proj, m.Intermediate, m.Hidden)
		normal(p+"mlp.down_proj.weight", proj, m.Hidden, m.Intermediate)
		norm(p+"input_layernorm.weight", m.Hidden)
		norm(p+"post_attention_layernorm.weight", m.Hidden)
	}
	norm("model.norm.weight", m.Hidden)
	if !m.TieEmbeddings {
		normal("lm_head.weight", 0.5, m.Vocab, m.Hidden)
	}
	return weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil)
}

// SmallLlama is a 2-layer Llama of hidden size 64 (GQA, 4 heads of 16, 2
// K/V heads) over vocab tokens, a real tokenizer's vocabulary: the model
// of the tests that write a GGUF file from a random model directory.
func SmallLlama(vocab int) Llama {
	return Llama{Vocab: vocab, Hidden: 64, Intermediate: 128, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16,
		MaxPositions: 512, BOS: 0, EOS: 1}
}

// WriteLlamaWithTokenizer is WriteLlama followed by CopyTokenizer from
// the model directory tokDir.
func WriteLlamaWithTokenizer(dir string, m Llama, seed uint64, tokDir string) error {
	if err := WriteLlama(dir, m, seed); err != nil {
		return err
	}
	return CopyTokenizer(dir, tokDir)
}

// CopyTokenizer copies tokenizer.json and tokenizer_config.json from the
// model directory src into dir, giving a random model a real tokenizer
// (one that GGUF metadata can hold, unlike a hand-made one).
func CopyTokenizer(dir, src string) error {
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
