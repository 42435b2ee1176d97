package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the YAML config loader. Parse must never
// panic; every error wraps ErrInvalid, and every config it accepts validates.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "configs", "*.yaml"))
	for _, name := range files {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data)
		}
	}
	for _, s := range []string{
		"",
		"# nothing\n",
		"~\n",
		"model: m\n",
		"model: m\nengine:\n  max_num_seqs: 8\nzos:\n  enabled: true\n",
		"model: m\npipeline:\n  sample: my-sampler\n  edge_capacity: 4\n  insert:\n    - after: forward\n      stage: logit-softcap\n      options: {cap: 30}\n",
		"model: m\nengine:\n  max_num_seq: 8\n",
		"model: m\nengine:\n  max_num_seqs: lots\n",
		"model: m\nzos: true\n",
		"model: m\ncuda_graph:\n  batch_sizes: [1, two]\n",
		"model: [\n",
		"model: m\ndevice: tpu\ncache:\n  block_size: 12\nspeculative:\n  method: medusa\n",
		"model: m\ndevice: cuda\ncuda:\n  decode_attention_chunk: 512\n",
		"model: m\nengine:\n  max_num_seqs: -1\n  max_num_batched_tokens: 0\n",
		"model: m\nengine:\n  max_num_seqs: 99999999999999999999999\n",
		"model: m\nengine:\n  max_num_seqs: 1e3\n",
		"model: m\nengine:\n  max_num_seqs: 0x10\n",
		"model: m\ncache:\n  kv_cache_dtype: fp8\n",
		"model: &a m\ntokenizer: *a\n",
		"model: m\nengine: &e {max_num_seqs: 4}\nspeculative: *e\n",
		"model: m\nengine: *missing\n",
		"a: &a [*a]\n",
		"a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: &d [*c, *c]\n",
		"model: m\n<<: {device: cuda}\n",
		"model: m\nengine: !!str x\n",
		"model: !!binary aGk=\n",
		"model: m\n---\nmodel: n\n",
		"[1, 2, 3]\n",
		"\"just a string\"\n",
		"model: m\npipeline:\n  insert:\n    - {}\n    - null\n",
		"model: m\npipeline:\n  insert: [{after: forward, stage: x, options: {a: [1, {b: c}]}}]\n",
		"{model: m, device: cpu}\n",
		"model: m\n\t\n",
		"model: \"\\uD800\"\n",
		"\xef\xbb\xbfmodel: m\n",
		"model: m\x00\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		if err != nil {
			if cfg != nil {
				t.Fatalf("Parse returned a config and an error: %v", err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if cfg == nil {
			t.Fatal("Parse returned neither a config nor an error")
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that does not validate: %v", err)
		}
		_ = cfg.InFlight()
		_ = cfg.Cache.KVDType()
		_ = cfg.Pipeline.Choices()
	})
}
