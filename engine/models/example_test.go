package models_test

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// A tiny Qwen3 with random weights: size its paged cache, prefill a prompt
// of 5 tokens through a block table, then decode one token.
func ExampleRegistry_New() {
	cfg, err := weights.ParseConfig([]byte(`{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
		"vocab_size": 50, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
		"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "tie_word_embeddings": true}`))
	if err != nil {
		panic(err)
	}
	w, err := models.RandomWeights(cfg, kernels.BF16, 1)
	if err != nil {
		panic(err)
	}
	ops := cpu.New(cpu.Options{Threads: 2})
	defer ops.Close()
	m, err := models.Builtin().New(ops, cfg, w, models.Options{MaxModelLen: 64})
	if err != nil {
		panic(err)
	}
	spec := m.KVCacheSpec()
	fmt.Printf("%s: %s cache, %d layers, %d bytes per token per layer\n", m.Architecture(), spec.Layout, spec.NumLayers, spec.BytesPerTokenPerLayer())

	const blockSize = 4
	cache, err := m.NewKVCache(8, blockSize)
	if err != nil {
		panic(err)
	}
	table := []int32{5, 2} // physical blocks of this sequence, in order
	run := func(ids []int32, numCached int) []float32 {
		b := models.HostBatch{BlockSize: blockSize}
		b.AddSequence(ids, numCached, table)
		batch, err := b.Upload(ops, cache.NumBlocks)
		if err != nil {
			panic(err)
		}
		hidden, err := m.Forward(context.Background(), cache, batch)
		if err != nil {
			panic(err)
		}
		last, _ := kernels.FromI32(ops, []int32{int32(len(ids) - 1)}, 1)
		logits, err := m.ComputeLogits(hidden, last)
		if err != nil {
			panic(err)
		}
		v, _ := kernels.ToF32(ops, logits)
		return v
	}
	prefill := run([]int32{3, 14, 15, 9, 2}, 0)
	decode := run([]int32{6}, 5)
	fmt.Println(len(prefill), len(decode))
	// Output:
	// Qwen3ForCausalLM: gqa cache, 2 layers, 64 bytes per token per layer
	// 50 50
}
