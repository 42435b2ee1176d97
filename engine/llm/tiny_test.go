package llm

import (
	"fmt"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
)

// tinyLlama writes a random-weight Llama (random.TinyLlama) to a temp
// directory and returns it.
func tinyLlama(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 7); err != nil {
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
