package llm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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

// tinyConfig returns a config for the tiny model, changed by edit. The
// adaptive draft length is off (it depends on timing); tests that want it
// turn it on.
func tinyConfig(t testing.TB, dir string, edit func(*config.Config)) *config.Config {
	t.Helper()
	yaml := fmt.Sprintf("model: %s\ncpu: {threads: 2}\ncache: {num_blocks: 64, block_size: 4}\nengine: {max_num_seqs: 8, max_num_batched_tokens: 64, prefill_chunk_size: 16}\npipeline: {sample: greedy}\nspeculative: {adaptive: false}\n", dir)
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

// charAlphabet is the text alphabet of the tiny test tokenizer: token 3+i
// is charAlphabet[i]; 0, 1 and 2 are <unk>, <s> and </s>.
const charAlphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUV0123456789.,"

// writeCharTokenizer adds a one-character-per-token tokenizer.json (BPE with
// no merges, Fuse decoder) for random.TinyLlama's 64-token vocabulary to dir.
func writeCharTokenizer(t testing.TB, dir string) {
	t.Helper()
	if len(charAlphabet)+3 != random.TinyLlama.Vocab {
		t.Fatalf("alphabet of %d characters for a vocabulary of %d", len(charAlphabet), random.TinyLlama.Vocab)
	}
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for i, r := range charAlphabet {
		vocab[string(r)] = 3 + i
	}
	spec := map[string]any{
		"version": "1.0",
		"added_tokens": []map[string]any{
			{"id": 0, "content": "<unk>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false},
			{"id": 1, "content": "<s>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false},
			{"id": 2, "content": "</s>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false},
		},
		"normalizer": nil, "pre_tokenizer": nil, "post_processor": nil,
		"decoder": map[string]any{"type": "Fuse"},
		"model":   map[string]any{"type": "BPE", "unk_token": "<unk>", "vocab": vocab, "merges": []string{}},
	}
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}
