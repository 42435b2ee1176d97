package llm

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/weights"
)

// ids returns n prompt ids inside the tiny vocabulary.
func ids(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 3 + i%60
	}
	return out
}

// AddRequest refuses at the door what can never be served: prompt plus
// max_tokens over max_model_len (whatever max_tokens is, without
// overflowing), a prompt longer than the whole KV cache, and a text longer
// in bytes than max_model_len tokens of the longest token (not tokenized).
func TestAddRequestRefusesWhatCannotFit(t *testing.T) {
	dir := tinyLlama(t)
	writeCharTokenizer(t, dir)
	full, err := NewLLM(tinyConfig(t, dir, nil), Options{}) // max_model_len 256, 64 blocks of 4
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	small, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) { c.Cache.NumBlocks = 16 }), Options{}) // 64 tokens of KV
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	maxBytes := 256 * full.Tokenizer().MaxTokenBytes()

	tests := []struct {
		name      string
		eng       *LLM
		prompt    string
		ids       []int
		maxTokens int
		want      string // "" accepts
	}{
		{"max_tokens MaxInt", full, "", ids(5), math.MaxInt, "5 prompt tokens plus max_tokens 9223372036854775807 exceed it"},
		{"prompt plus output over max_model_len", full, "", ids(200), 100, "maximum context length is 256 tokens, but 200 prompt tokens plus max_tokens 100"},
		{"prompt plus output exactly max_model_len", full, "", ids(200), 56, ""},
		{"prompt over the KV cache", small, "", ids(100), 1, "prompt of 100 tokens needs 25 KV blocks of 4 tokens, but the whole cache has 16 blocks"},
		{"prompt filling the KV cache", small, "", ids(64), 1, ""},
		{"text over the byte bound", full, strings.Repeat("a", maxBytes+1), nil, 1, "bytes cannot fit max_model_len 256"},
		{"text at the byte bound", full, strings.Repeat("a", maxBytes), nil, 1, ""}, // refused later, once tokenized
		{"text with max_tokens max_model_len", full, "hi", nil, 256, "max_tokens 256 leaves no room for a prompt"},
		{"text with max_tokens MaxInt", full, "hi", nil, math.MaxInt, "leaves no room"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := greedy(tc.maxTokens)
			err := tc.eng.AddRequest(&engine.Request{ID: tc.name, Prompt: tc.prompt, PromptTokenIDs: tc.ids, Params: p, OnOutput: func(engine.RequestOutput) {}})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("AddRequest = %v, want accepted", err)
				}
				tc.eng.Abort(tc.name)
				return
			}
			if !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("AddRequest = %v, want ErrInvalidRequest with %q", err, tc.want)
			}
		})
	}
	// The boundary case runs to its end: nothing is cut short.
	res, err := full.Generate(context.Background(), []Prompt{{IDs: ids(200)}}, func() engine.SamplingParams {
		p := greedy(56)
		p.IgnoreEOS = true
		return p
	}(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if o := res[0].Outputs[0]; o.Err != nil || len(o.TokenIDs) != 56 {
		t.Fatalf("200 + 56 tokens: err %v, %d tokens", o.Err, len(o.TokenIDs))
	}
}

// New refuses, at load and naming the key, model files and settings that
// cannot be served.
func TestNewRefusesImpossibleValues(t *testing.T) {
	memGiB := float64(hostMemoryBytes()) / (1 << 30)
	memSkip, budgetSkip := "", ""
	switch {
	case memGiB <= 0:
		memSkip, budgetSkip = "machine memory unknown", "machine memory unknown"
	case 2*memGiB > config.MaxCPUMemoryGiB:
		budgetSkip = "machine memory above the config's bound"
	}
	editJSON := func(name string, set map[string]any) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			path := filepath.Join(dir, name)
			m := map[string]any{}
			if data, err := os.ReadFile(path); err == nil {
				if err := json.Unmarshal(data, &m); err != nil {
					t.Fatal(err)
				}
			}
			for k, v := range set {
				m[k] = v
			}
			data, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name    string
		files   func(t *testing.T, dir string)
		edit    func(*config.Config)
		skip    string
		want    string // "" loads
		wantErr error
	}{
		{name: "max_model_len over max_position_embeddings", edit: func(c *config.Config) { c.Engine.MaxModelLen = 512 },
			want: "engine.max_model_len 512 exceeds the model's max_position_embeddings 256", wantErr: config.ErrInvalid},
		{name: "max_model_len over max_position_embeddings allowed", edit: func(c *config.Config) {
			c.Engine.MaxModelLen, c.Engine.AllowLongMaxModelLen = 512, true
		}},
		{name: "max_model_len under max_position_embeddings", edit: func(c *config.Config) { c.Engine.MaxModelLen = 128 }},
		{name: "max_model_len within linear rope scaling", files: editJSON("config.json", map[string]any{"rope_scaling": map[string]any{"type": "linear", "factor": 2.0}}),
			edit: func(c *config.Config) { c.Engine.MaxModelLen = 512 }},
		{name: "max_model_len past linear rope scaling", files: editJSON("config.json", map[string]any{"rope_scaling": map[string]any{"type": "linear", "factor": 2.0}}),
			edit: func(c *config.Config) { c.Engine.MaxModelLen = 1024 }, want: "max_position_embeddings 512", wantErr: config.ErrInvalid},
		{name: "negative eos_token_id in config.json", files: editJSON("config.json", map[string]any{"eos_token_id": -5}),
			want: "eos_token_id[0] = -5, want >= 0", wantErr: weights.ErrConfig},
		{name: "negative bos_token_id in config.json", files: editJSON("config.json", map[string]any{"bos_token_id": -1}),
			want: "bos_token_id = -1, want >= 0", wantErr: weights.ErrConfig},
		{name: "negative eos_token_id in tokenizer_config.json", files: editJSON("tokenizer_config.json", map[string]any{"eos_token_id": -5}),
			want: "eos_token_id is -5; token ids cannot be negative", wantErr: config.ErrInvalid},
		{name: "negative id in a list in tokenizer_config.json", files: editJSON("tokenizer_config.json", map[string]any{"eos_token_id": []int{2, -5}}),
			want: "eos_token_id is -5", wantErr: config.ErrInvalid},
		{name: "numeric eos_token in tokenizer_config.json", files: editJSON("tokenizer_config.json", map[string]any{"eos_token": -5}),
			want: "eos_token"},
		{name: "cpu_memory_gib over the machine's memory", edit: func(c *config.Config) {
			c.Cache.NumBlocks, c.Cache.CPUMemoryGiB = 0, math.Ceil(2*memGiB)
		}, skip: budgetSkip,
			want: "cache.cpu_memory_gib", wantErr: config.ErrInvalid},
		{name: "num_blocks over the machine's memory", edit: func(c *config.Config) { c.Cache.NumBlocks = 1 << 50 },
			skip: memSkip,
			want: "cache.num_blocks 1125899906842624", wantErr: config.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.skip != "" {
				t.Skip(tc.skip)
			}
			dir := tinyLlama(t)
			writeCharTokenizer(t, dir)
			if tc.files != nil {
				tc.files(t, dir)
			}
			l, err := NewLLM(tinyConfig(t, dir, tc.edit), Options{})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("New = %v, want loaded", err)
				}
				l.Close()
				return
			}
			if err == nil {
				l.Close()
				t.Fatalf("New loaded, want an error with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("New = %v, want %v with %q", err, tc.wantErr, tc.want)
			}
		})
	}
}

func TestCheckHostMemory(t *testing.T) {
	cfg := func(numBlocks int, gib float64, device string) *config.Config {
		c := config.Default()
		c.Device, c.Cache.NumBlocks, c.Cache.CPUMemoryGiB = device, numBlocks, gib
		return &c
	}
	const mem = 8 << 30
	tests := []struct {
		name string
		cfg  *config.Config
		mem  int64
		want string
	}{
		{"budget within memory", cfg(0, 4, "cpu"), mem, ""},
		{"budget over memory", cfg(0, 100000, "cpu"), mem, "cache.cpu_memory_gib 100000 is more than this machine's 8.0 GiB"},
		{"blocks within memory", cfg(1000, 100000, "cpu"), mem, ""}, // cpu_memory_gib unused with num_blocks
		{"blocks over memory", cfg(1<<30, 1, "cpu"), mem, "cache.num_blocks 1073741824 of 1024 bytes need 1024.0 GiB"},
		{"unknown memory", cfg(0, 100000, "cpu"), 0, ""},
		{"cuda sizes its own cache", cfg(0, 100000, "cuda"), mem, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkHostMemory(tc.cfg, 1024, tc.mem)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkHostMemory = %v, want ErrInvalid with %q", err, tc.want)
			}
		})
	}
}

func TestMaxPromptBytes(t *testing.T) {
	tests := []struct{ maxModelLen, tokenBytes, want int }{
		{1024, 5, 5120},
		{1024, 0, 1024},
		{math.MaxInt / 2, 4, math.MaxInt},
	}
	for _, tc := range tests {
		if got := maxPromptBytes(tc.maxModelLen, tc.tokenBytes); got != tc.want {
			t.Errorf("maxPromptBytes(%d, %d) = %d, want %d", tc.maxModelLen, tc.tokenBytes, got, tc.want)
		}
	}
}

// A text prompt is tokenized with max_model_len as its budget, and the
// tokenize stage answers, with an invalid-request error, a prompt whose
// tokens plus max_tokens pass max_model_len: nothing is cut short.
func TestTextPromptsPastTheContextAreRefused(t *testing.T) {
	dir := tinyLlama(t)
	writeCharTokenizer(t, dir)
	l, err := NewLLM(tinyConfig(t, dir, nil), Options{}) // max_model_len 256, one token a character
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct {
		name      string
		prompt    string
		maxTokens int
		want      string // "" serves it
	}{
		{"fits", strings.Repeat("a", 200), 55, ""},
		{"prompt plus max_tokens past it", strings.Repeat("a", 200), 100, "max_tokens is 100: together past max_model_len 256"},
		{"prompt alone past it", strings.Repeat("a", 300), 1, "more than 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := greedy(tc.maxTokens)
			p.IgnoreEOS = true
			res, err := l.Generate(context.Background(), []Prompt{{Text: tc.prompt}}, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			o := res[0].Outputs[0]
			if tc.want == "" {
				if o.Err != nil || len(o.TokenIDs) != tc.maxTokens {
					t.Fatalf("err %v, %d tokens; want %d tokens", o.Err, len(o.TokenIDs), tc.maxTokens)
				}
				return
			}
			if !errors.Is(o.Err, engine.ErrInvalidRequest) || !strings.Contains(o.Err.Error(), tc.want) || len(o.TokenIDs) != 0 {
				t.Fatalf("err %v with %d tokens, want an invalid request naming %q", o.Err, len(o.TokenIDs), tc.want)
			}
		})
	}
}
