package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

func TestReferenceEqualsDefault(t *testing.T) {
	cfg, err := Load(filepath.Join("..", "..", "configs", "reference.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Model = filepath.Join("..", "..", "configs", want.Model)
	if !reflect.DeepEqual(*cfg, want) {
		t.Errorf("configs/reference.yaml and Default() differ:\n%+v\n%+v", *cfg, want)
	}
}

func TestShippedConfigsLoad(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "configs", "*.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("configs: %v %v", files, err)
	}
	for _, f := range files {
		if _, err := Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		want  []string // substrings of the error; none means success
		check func(*testing.T, *Config)
	}{
		{
			name: "overrides keep the other defaults",
			yaml: "model: m\nengine:\n  max_num_seqs: 8\nzos:\n  enabled: true\n",
			check: func(t *testing.T, c *Config) {
				if c.Engine.MaxNumSeqs != 8 || c.Engine.MaxNumBatchedTokens != Default().Engine.MaxNumBatchedTokens || c.InFlight() != 2 {
					t.Errorf("got %+v", c.Engine)
				}
			},
		},
		{
			name: "pipeline choices",
			yaml: "model: m\npipeline:\n  sample: my-sampler\n  edge_capacity: 4\n  insert:\n    - after: forward\n      stage: logit-softcap\n      options: {cap: 30}\n",
			check: func(t *testing.T, c *Config) {
				p := c.Pipeline
				if p.Impl["sample"] != "my-sampler" || p.EdgeCapacity != 4 || len(p.Insert) != 1 ||
					p.Insert[0].Stage != "logit-softcap" || p.Insert[0].Options["cap"] != 30 {
					t.Errorf("got %+v", p)
				}
			},
		},
		{
			name: "unknown key names its line and the nearest key",
			yaml: "model: m\nengine:\n  max_num_seq: 8\n",
			want: []string{"test.yaml:3", `unknown key "max_num_seq" in engine`, `did you mean "max_num_seqs"?`},
		},
		{
			name: "a step budget of verified drafts: a number or auto",
			yaml: "model: m\nspeculative:\n  max_verify_tokens_per_step: 12\n",
			check: func(t *testing.T, c *Config) {
				if b := c.Speculative.MaxVerifyTokensPerStep; b != (VerifyBudget{Tokens: 12}) || b.String() != "12" {
					t.Errorf("got %+v", b)
				}
			},
		},
		{
			name: "the step budget auto",
			yaml: "model: m\nspeculative:\n  max_verify_tokens_per_step: auto\n",
			check: func(t *testing.T, c *Config) {
				if b := c.Speculative.MaxVerifyTokensPerStep; b != (VerifyBudget{Auto: true}) || b.String() != "auto" {
					t.Errorf("got %+v", b)
				}
			},
		},
		{
			name: "a step budget neither a number nor auto names its line",
			yaml: "model: m\nspeculative:\n  max_verify_tokens_per_step: fast\n",
			want: []string{"test.yaml:3", "speculative.max_verify_tokens_per_step", `expected an integer or "auto", got "fast"`},
		},
		{
			name: "a negative step budget",
			yaml: "model: m\nspeculative:\n  max_verify_tokens_per_step: -2\n",
			want: []string{"speculative.max_verify_tokens_per_step: must be >= 0 (0: no cap) or auto, got -2"},
		},
		{
			name: "admission fraction",
			yaml: "model: m\nengine:\n  admission_fraction: 1.5\n",
			want: []string{"engine.admission_fraction: must be in [0, 1] (0: a prompt joins as soon as it fits), got 1.5"},
		},
		{
			name: "unknown top-level key",
			yaml: "model: m\ndevise: cuda\n",
			want: []string{"test.yaml:2", `unknown key "devise" in the top level`, `did you mean "device"?`},
		},
		{
			name: "wrong type names its line",
			yaml: "model: m\nengine:\n  max_num_seqs: lots\n",
			want: []string{"test.yaml:3", "engine.max_num_seqs: expected an integer", `"lots"`},
		},
		{
			name: "wrong type for a section",
			yaml: "model: m\nzos: true\n",
			want: []string{"test.yaml:2", "zos: expected a mapping"},
		},
		{
			name: "wrong type in a list",
			yaml: "model: m\ncuda_graph:\n  batch_sizes: [1, two]\n",
			want: []string{"test.yaml:3", "cuda_graph.batch_sizes[1]: expected an integer"},
		},
		{
			name: "empty file",
			yaml: "",
			want: []string{"test.yaml", "the file is empty"},
		},
		{
			name: "comments only",
			yaml: "# nothing\n",
			want: []string{"the file is empty"},
		},
		{
			name: "bad YAML",
			yaml: "model: [\n",
			want: []string{"test.yaml", "invalid config"},
		},
		{
			name: "out of range values are all reported",
			yaml: "model: m\ndevice: tpu\ncache:\n  block_size: 12\nspeculative:\n  method: medusa\n",
			want: []string{"device: must be cpu or cuda", "cache.block_size: must be a power of two", `speculative.method: must be none (or empty), ngram, mtp, draft_model or dspark, got "medusa"`},
		},
		{
			name: "decode attention chunk",
			yaml: "model: m\ndevice: cuda\ncuda:\n  decode_attention_chunk: 512\n",
			check: func(t *testing.T, c *Config) {
				if c.CUDA.DecodeAttentionChunk != 512 {
					t.Errorf("cuda.decode_attention_chunk = %d, want 512", c.CUDA.DecodeAttentionChunk)
				}
			},
		},
		{
			name: "decode attention chunk not a multiple of 128",
			yaml: "model: m\ndevice: cuda\ncuda:\n  decode_attention_chunk: 300\n",
			want: []string{"cuda.decode_attention_chunk: must be 0 (the backend's) or a positive multiple of 128, got 300"},
		},
		{
			name: "negative decode attention chunk",
			yaml: "model: m\ndevice: cuda\ncuda:\n  decode_attention_chunk: -128\n",
			want: []string{"cuda.decode_attention_chunk", "got -128"},
		},
		{
			name: "decode attention chunk needs cuda",
			yaml: "model: m\ncuda:\n  decode_attention_chunk: 256\n",
			want: []string{"cuda.decode_attention_chunk: needs device: cuda"},
		},
		{
			name: "an unknown simd path",
			yaml: "model: m\ncpu:\n  simd: sse9\n",
			want: []string{"cpu.simd: must be auto, go, avx2 or avx512, got \"sse9\""},
		},
		{
			name: "an unknown activation rounding",
			yaml: "model: m\ncpu:\n  activation_rounding: q8\n",
			want: []string{"cpu.activation_rounding: must be auto, none, llama_cpp or bf16, got \"q8\""},
		},
		{
			name: "llama.cpp activation rounding",
			yaml: "model: m\ncpu:\n  activation_rounding: llama_cpp\n",
			check: func(t *testing.T, c *Config) {
				if c.CPU.ActivationRounding != "llama_cpp" {
					t.Errorf("cpu.activation_rounding = %q, want llama_cpp", c.CPU.ActivationRounding)
				}
			},
		},
		{
			name: "bfloat16 activation rounding",
			yaml: "model: m\ncpu:\n  activation_rounding: bf16\n",
			check: func(t *testing.T, c *Config) {
				if c.CPU.ActivationRounding != "bf16" {
					t.Errorf("cpu.activation_rounding = %q, want bf16", c.CPU.ActivationRounding)
				}
			},
		},
		{
			name: "activation rounding follows the weights by default",
			yaml: "model: m\n",
			check: func(t *testing.T, c *Config) {
				if c.CPU.ActivationRounding != "auto" {
					t.Errorf("default cpu.activation_rounding = %q, want auto", c.CPU.ActivationRounding)
				}
			},
		},
		{
			name: "a simd path",
			yaml: "model: m\ncpu:\n  simd: go\n",
			check: func(t *testing.T, c *Config) {
				if c.CPU.SIMD != "go" {
					t.Errorf("cpu.simd = %q, want go", c.CPU.SIMD)
				}
			},
		},
		{
			name: "cuda tuning keys",
			yaml: "model: m\ndevice: cuda\ncuda:\n  gemm: split\n  skinny_gemm_rows: 64\n",
			check: func(t *testing.T, c *Config) {
				if c.CUDA.GEMM != "split" || c.CUDA.SkinnyGEMMRows != 64 {
					t.Errorf("cuda = %+v, want gemm split and skinny_gemm_rows 64", c.CUDA)
				}
			},
		},
		{
			name: "gemm round is the default",
			yaml: "model: m\n",
			check: func(t *testing.T, c *Config) {
				if c.CUDA.GEMM != "round" || c.CUDA.SkinnyGEMMRows != 0 {
					t.Errorf("cuda = %+v, want gemm round and skinny_gemm_rows 0", c.CUDA)
				}
			},
		},
		{
			name: "empty gemm is accepted (round)",
			yaml: "model: m\ndevice: cuda\ncuda:\n  gemm: \"\"\n",
			check: func(t *testing.T, c *Config) {
				if c.CUDA.GEMM != "" {
					t.Errorf("cuda.gemm = %q, want empty", c.CUDA.GEMM)
				}
			},
		},
		{
			name: "unknown gemm mode",
			yaml: "model: m\ndevice: cuda\ncuda:\n  gemm: tf32\n",
			want: []string{`cuda.gemm: must be round or split, got "tf32"`},
		},
		{
			name: "gemm split needs cuda",
			yaml: "model: m\ncuda:\n  gemm: split\n",
			want: []string{"cuda.gemm: split needs device: cuda"},
		},
		{
			name: "skinny gemm rows out of range",
			yaml: "model: m\ndevice: cuda\ncuda:\n  skinny_gemm_rows: 65\n",
			want: []string{"cuda.skinny_gemm_rows: must be in [0, 64] (0: off), got 65"},
		},
		{
			name: "negative skinny gemm rows",
			yaml: "model: m\ndevice: cuda\ncuda:\n  skinny_gemm_rows: -1\n",
			want: []string{"cuda.skinny_gemm_rows", "got -1"},
		},
		{
			name: "skinny gemm rows need cuda",
			yaml: "model: m\ncuda:\n  skinny_gemm_rows: 8\n",
			want: []string{"cuda.skinny_gemm_rows: needs device: cuda"},
		},
		{
			name: "fill uninitialized memory",
			yaml: "model: m\ndevice: cuda\ncuda:\n  fill_uninitialized_memory: true\n",
			check: func(t *testing.T, c *Config) {
				if !c.CUDA.FillUninitializedMemory {
					t.Errorf("cuda = %+v, want fill_uninitialized_memory", c.CUDA)
				}
			},
		},
		{
			name: "fill uninitialized memory needs cuda",
			yaml: "model: m\ncuda:\n  fill_uninitialized_memory: true\n",
			want: []string{"cuda.fill_uninitialized_memory: needs device: cuda"},
		},
		{
			name: "gemm plans on the CPU",
			yaml: "model: m\ncuda:\n  gemm_plans: true\n",
			want: []string{"cuda.gemm_plans: needs device: cuda"},
		},
		{
			name: "moe batch invariant",
			yaml: "model: m\ndevice: cuda\ncuda:\n  moe_batch_invariant: true\n",
			check: func(t *testing.T, c *Config) {
				if !c.CUDA.MoEBatchInvariant {
					t.Errorf("cuda = %+v, want moe_batch_invariant", c.CUDA)
				}
			},
		},
		{
			name: "moe batch invariant on the CPU",
			yaml: "model: m\ncuda:\n  moe_batch_invariant: true\n",
			want: []string{"cuda.moe_batch_invariant: needs device: cuda"},
		},
		{
			name: "cuda graphs need cuda",
			yaml: "model: m\ncuda_graph:\n  enabled: true\n",
			want: []string{"cuda_graph.enabled: needs device: cuda"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("test.yaml", []byte(tc.yaml))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				tc.check(t, cfg)
				return
			}
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("Load = %v, want a not-exist error naming the file", err)
	}
}

func TestLoadResolvesPathsAgainstTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte("model: models/x\ntokenizer: /abs/tok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Model != filepath.Join(dir, "models/x") || cfg.Tokenizer != "/abs/tok" {
		t.Errorf("model %q tokenizer %q", cfg.Model, cfg.Tokenizer)
	}
}

// A file that names no model leaves Model empty (the caller's choice), not
// Default's path, which is relative to this repository's configs/.
func TestLoadWithoutModel(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte("engine: {max_num_seqs: 4}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Model != "" || cfg.Engine.MaxNumSeqs != 4 {
		t.Errorf("model %q, max_num_seqs %d; want none and 4", cfg.Model, cfg.Engine.MaxNumSeqs)
	}
	for key, want := range map[string]bool{"model": true, "engine": true, "tokenizer": false, "max_num_seqs": false} {
		if got := setsTopLevelKey([]byte("model: m\nengine: {max_num_seqs: 4}\ntokenizer: null\n"), key); got != want {
			t.Errorf("setsTopLevelKey(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestKVCacheDType(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want kernels.DType // when err is empty
		err  []string      // substrings of the error; none means success
	}{
		{name: "default is auto", yaml: "model: m\n", want: 0},
		{name: "auto", yaml: "model: m\ncache:\n  kv_cache_dtype: auto\n", want: 0},
		{name: "empty means auto", yaml: "model: m\ncache:\n  kv_cache_dtype: \"\"\n", want: 0},
		{name: "auto on cpu", yaml: "model: m\ndevice: cpu\ncache:\n  kv_cache_dtype: auto\n", want: 0},
		{name: "fp8 on cuda", yaml: "model: m\ndevice: cuda\ncache:\n  kv_cache_dtype: fp8\n", want: kernels.F8E4M3},
		{name: "fp8_e4m3 on cuda", yaml: "model: m\ndevice: cuda\ncache:\n  kv_cache_dtype: fp8_e4m3\n", want: kernels.F8E4M3},
		{
			name: "unknown value names the key and the accepted values",
			yaml: "model: m\ndevice: cuda\ncache:\n  kv_cache_dtype: int8\n",
			err:  []string{"cache.kv_cache_dtype", "auto", "f32", "f16", "fp8", "fp8_e4m3", `"int8"`},
		},
		{
			name: "case matters",
			yaml: "model: m\ndevice: cuda\ncache:\n  kv_cache_dtype: FP8\n",
			err:  []string{"cache.kv_cache_dtype", `"FP8"`},
		},
		{name: "fp8 on cpu", yaml: "model: m\ndevice: cpu\ncache:\n  kv_cache_dtype: fp8\n", want: kernels.F8E4M3},
		{name: "f16 on cpu", yaml: "model: m\ndevice: cpu\ncache:\n  kv_cache_dtype: f16\n", want: kernels.F16},
		{name: "fp16", yaml: "model: m\ncache:\n  kv_cache_dtype: fp16\n", want: kernels.F16},
		{name: "float16", yaml: "model: m\ncache:\n  kv_cache_dtype: float16\n", want: kernels.F16},
		{name: "f32", yaml: "model: m\ncache:\n  kv_cache_dtype: f32\n", want: kernels.F32},
		{name: "float32 on cpu", yaml: "model: m\ndevice: cpu\ncache:\n  kv_cache_dtype: float32\n", want: kernels.F32},
		{name: "fp8_e4m3 on the default device", yaml: "model: m\ncache:\n  kv_cache_dtype: fp8_e4m3\n", want: kernels.F8E4M3},
		{
			name: "wrong type names its line",
			yaml: "model: m\ncache:\n  kv_cache_dtype: [fp8]\n",
			err:  []string{"test.yaml:3", "cache.kv_cache_dtype: expected a string"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("test.yaml", []byte(tc.yaml))
			if len(tc.err) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if got := cfg.Cache.KVDType(); got != tc.want {
					t.Errorf("KVDType() = %v, want %v", got, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse succeeded with kv_cache_dtype %q", cfg.Cache.KVCacheDType)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			for _, w := range tc.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestCacheKVDType(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want kernels.DType
	}{
		{"", 0},
		{"auto", 0},
		{"fp8", kernels.F8E4M3},
		{"fp8_e4m3", kernels.F8E4M3},
		{"f16", kernels.F16},
		{"fp16", kernels.F16},
		{"float16", kernels.F16},
		{"f32", kernels.F32},
		{"fp32", kernels.F32},
		{"float32", kernels.F32},
		{"bf16", 0},  // rejected by Validate: no backend keeps a bfloat16 K/V cache
		{"bogus", 0}, // rejected by Validate
	} {
		if got := (Cache{KVCacheDType: tc.in}).KVDType(); got != tc.want {
			t.Errorf("Cache{KVCacheDType: %q}.KVDType() = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// engine.max_num_batched_tokens 0 (the default) is the device's step size;
// a value set is kept; a negative one is refused naming the key.
func TestStepTokens(t *testing.T) {
	for _, c := range []struct {
		yaml string
		want int
	}{
		{"model: m\n", 512},
		{"model: m\ndevice: cuda\n", 2048},
		{"model: m\nengine: {max_num_batched_tokens: 100}\n", 100},
		{"model: m\ndevice: cuda\nengine: {max_num_batched_tokens: 8192}\n", 8192},
		{"model: m\nengine: {max_num_batched_tokens: 0, max_num_seqs: 1000}\n", 512},
	} {
		cfg, err := Parse("test.yaml", []byte(c.yaml))
		if err != nil {
			t.Fatalf("%q: %v", c.yaml, err)
		}
		if got := cfg.Engine.StepTokens(cfg.Device); got != c.want {
			t.Errorf("%q: StepTokens = %d, want %d", c.yaml, got, c.want)
		}
	}
	if _, err := Parse("test.yaml", []byte("model: m\nengine: {max_num_batched_tokens: -1}\n")); err == nil || !strings.Contains(err.Error(), "engine.max_num_batched_tokens") {
		t.Errorf("max_num_batched_tokens -1: err = %v, want one naming the key", err)
	}
}
