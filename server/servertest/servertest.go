// Package servertest writes a tiny random-weight Llama checkpoint with a
// character-level tokenizer and a chat template: a complete model directory
// for tests of the HTTP server and of the benchmark client, small enough to
// serve hundreds of requests per second on one CPU core.
//
// The tokenizer is a BPE over the printable ASCII characters and "\n" plus a
// few merges, with no pre-tokenizer and a Fuse decoder, so any output of the
// random model decodes to printable text. Characters outside the alphabet
// encode to <unk>.
package servertest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
)

// Special token ids of the model.
const (
	UnkID = 0
	BOSID = 1
	EOSID = 2
)

// merges are the BPE merges, in rank order; each adds one token.
var merges = [][2]string{
	{"t", "h"}, {"h", "e"}, {"i", "n"}, {"e", "r"}, {"a", "n"}, {"r", "e"}, {"o", "n"},
	{" ", "t"}, {"a", "t"}, {"e", "n"}, {"n", "d"}, {"t", "i"}, {"e", "s"}, {"o", "r"},
	{"t", "e"}, {"o", "f"}, {"e", "d"}, {"i", "s"}, {"i", "t"}, {"a", "l"}, {" ", "a"},
	{" ", "s"}, {" ", "w"}, {"th", "e"}, {" t", "he"}, {"in", "g"}, {" ", "o"}, {"o", "u"},
	{":", " "},
}

// Model is the architecture written by WriteModel: 128 tokens (3 specials,
// 95 printable ASCII characters, "\n", 29 merges), 2 layers, 1024 positions.
var Model = random.Llama{Vocab: 128, Hidden: 32, Intermediate: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, MaxPositions: 1024, BOS: BOSID, EOS: EOSID}

// ChatTemplate renders "role: content\n" per message and "assistant:" as the
// generation prompt.
const ChatTemplate = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"

// Vocab returns the tokenizer's vocabulary, token text to id.
func Vocab() map[string]int {
	vocab := map[string]int{"<unk>": UnkID, "<s>": BOSID, "</s>": EOSID}
	next := 3
	for c := 32; c < 127; c++ {
		vocab[string(rune(c))] = next
		next++
	}
	vocab["\n"] = next
	next++
	for _, m := range merges {
		vocab[m[0]+m[1]] = next
		next++
	}
	return vocab
}

// WriteModel writes config.json, model.safetensors (weights seeded by seed),
// tokenizer.json and tokenizer_config.json into dir.
func WriteModel(dir string, seed uint64) error {
	vocab := Vocab()
	if len(vocab) != Model.Vocab {
		return fmt.Errorf("servertest: vocabulary of %d tokens for a model of %d", len(vocab), Model.Vocab)
	}
	if err := random.WriteLlama(dir, Model, seed); err != nil {
		return fmt.Errorf("servertest: %w", err)
	}
	added := func(id int, content string) map[string]any {
		return map[string]any{"id": id, "content": content, "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}
	}
	mergeList := make([][]string, len(merges)) // pairs: merges with spaces cannot be "a b" strings
	for i, m := range merges {
		mergeList[i] = []string{m[0], m[1]}
	}
	spec := map[string]any{
		"version":      "1.0",
		"added_tokens": []map[string]any{added(UnkID, "<unk>"), added(BOSID, "<s>"), added(EOSID, "</s>")},
		"normalizer":   nil, "pre_tokenizer": nil, "post_processor": nil,
		"decoder": map[string]any{"type": "Fuse"},
		"model":   map[string]any{"type": "BPE", "unk_token": "<unk>", "vocab": vocab, "merges": mergeList},
	}
	tcfg := map[string]any{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": ChatTemplate}
	for name, v := range map[string]any{"tokenizer.json": spec, "tokenizer_config.json": tcfg} {
		data, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("servertest: %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("servertest: %w", err)
		}
	}
	return nil
}

// ConfigYAML is an engine config for the model in dir: two CPU threads, a
// KV cache of 1024 blocks of 16 tokens, 32 sequences per step, the default
// sampler.
func ConfigYAML(dir string) string {
	return fmt.Sprintf("model: %q\ncpu: {threads: 2}\ncache: {num_blocks: 1024, block_size: 16}\n"+
		"engine: {max_num_seqs: 32, max_num_batched_tokens: 512, prefill_chunk_size: 256, max_waiting: 512}\n", dir)
}

// Config parses ConfigYAML(dir) and applies edit (when non-nil), then
// validates the result.
func Config(dir string, edit func(*config.Config)) (*config.Config, error) {
	cfg, err := config.Parse("servertest.yaml", []byte(ConfigYAML(dir)))
	if err != nil {
		return nil, err
	}
	if edit != nil {
		edit(cfg)
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}
