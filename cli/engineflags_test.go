package cli

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/server/servertest"
)

// writeTinyConfig writes a random-weight Llama (no tokenizer) and a config
// for it with the YAML extra (default: a cache of 64 blocks); it returns
// the model directory and the config's path.
func writeTinyConfig(t *testing.T, extra string) (modelDir, cfgPath string) {
	t.Helper()
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 7); err != nil {
		t.Fatal(err)
	}
	if extra == "" {
		extra = "cache: {num_blocks: 64}\n"
	}
	cfgPath = filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(cfgPath, []byte("model: .\ncpu: {threads: 2}\n"+extra), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, cfgPath
}

// loadWithFlags parses args as a command with the engine flags of set and
// returns the config they build.
func loadWithFlags(t *testing.T, set engineFlagSet, args ...string) (*config.Config, error) {
	t.Helper()
	var (
		ef  engineFlags
		cfg *config.Config
	)
	cmd := &cobra.Command{
		Use: "x", Args: cobra.MaximumNArgs(1), SilenceUsage: true, SilenceErrors: true,
		RunE: func(_ *cobra.Command, args []string) error {
			c, cleanup, err := ef.load(firstArg(args))
			defer cleanup()
			cfg = c
			return err
		},
	}
	ef.register(cmd, set)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return cfg, err
}

// A flag overrides the config file; a flag not given leaves the file's
// value; a model given as an argument or with --model replaces the file's.
func TestEngineFlagsOverrideConfig(t *testing.T) {
	modelDir, cfgPath := writeTinyConfig(t, "engine: {max_num_seqs: 8, max_model_len: 256}\ncache: {num_blocks: 64, memory_fraction: 0.7}\nseed: 3\n")
	other := t.TempDir()
	all := engineFlagSet{model: true, seed: true, chatTemplate: true}
	tests := []struct {
		name    string
		args    []string
		check   func(*config.Config) bool
		wantErr string
	}{
		{"file values", []string{"-c", cfgPath}, func(c *config.Config) bool {
			return c.Engine.MaxNumSeqs == 8 && c.Engine.MaxModelLen == 256 && c.Cache.MemoryFraction == 0.7 && c.Seed == 3 && c.Model == modelDir
		}, ""},
		{"max-num-seqs", []string{"-c", cfgPath, "--max-num-seqs", "4"}, func(c *config.Config) bool { return c.Engine.MaxNumSeqs == 4 }, ""},
		{"max-num-seqs above batched tokens", []string{"-c", cfgPath, "--max-num-seqs", "4096"}, func(c *config.Config) bool {
			return c.Engine.MaxNumSeqs == 4096 && c.Engine.MaxNumBatchedTokens == 4096
		}, ""},
		{"max-model-len", []string{"-c", cfgPath, "--max-model-len", "128"}, func(c *config.Config) bool { return c.Engine.MaxModelLen == 128 }, ""},
		{"gpu-memory-utilization", []string{"-c", cfgPath, "--gpu-memory-utilization", "0.5"}, func(c *config.Config) bool { return c.Cache.MemoryFraction == 0.5 }, ""},
		{"kv-cache-dtype", []string{"-c", cfgPath, "--kv-cache-dtype", "fp8"}, func(c *config.Config) bool { return c.Cache.KVCacheDType == "fp8" }, ""},
		{"device", []string{"-c", cfgPath, "--device", "cuda"}, func(c *config.Config) bool { return c.Device == "cuda" }, ""},
		{"seed", []string{"-c", cfgPath, "--seed", "11"}, func(c *config.Config) bool { return c.Seed == 11 }, ""},
		{"tensor-parallel-size 1", []string{"-c", cfgPath, "--tensor-parallel-size", "1"}, func(c *config.Config) bool { return true }, ""},
		{"positional model", []string{"-c", cfgPath, other}, func(c *config.Config) bool { return c.Model == other && c.Engine.MaxNumSeqs == 8 }, ""},
		{"-m model", []string{"-c", cfgPath, "-m", other}, func(c *config.Config) bool { return c.Model == other }, ""},
		{"model without config", []string{"--model", other}, func(c *config.Config) bool {
			d := config.Default()
			return c.Model == other && c.Engine.MaxNumSeqs == d.Engine.MaxNumSeqs && c.Device == "cpu"
		}, ""},
		{"tensor-parallel-size 2", []string{"-c", cfgPath, "--tensor-parallel-size", "2"}, nil, "--tensor-parallel-size 2: tensor parallelism is not supported"},
		{"bad memory fraction", []string{"-c", cfgPath, "--gpu-memory-utilization", "1.5"}, nil, "cache.memory_fraction"},
		{"bad kv dtype", []string{"-c", cfgPath, "--kv-cache-dtype", "int4"}, nil, "cache.kv_cache_dtype"},
		{"bad device", []string{"-c", cfgPath, "--device", "tpu"}, nil, "device"},
		{"model twice", []string{"-m", modelDir, other}, nil, "the model is given twice"},
		{"missing model", []string{filepath.Join(other, "nonesuch")}, nil, "nonesuch"},
		{"missing chat template", []string{"-c", cfgPath, "--chat-template", filepath.Join(other, "nonesuch.jinja")}, nil, "--chat-template"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadWithFlags(t, all, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(cfg) {
				t.Errorf("config = %+v", cfg)
			}
		})
	}
}

// Without --config and a model, the shipped model is used, from its
// extracted copy and never from the working directory; configs/default.yaml
// says the same as the built-in default.
func TestDefaultConfigIsTheShippedModel(t *testing.T) {
	calls := 0
	old := shippedModelDir
	t.Cleanup(func() { shippedModelDir = old })
	fake := t.TempDir()
	shippedModelDir = func() (string, error) { calls++; return fake, nil }
	t.Chdir(t.TempDir())
	cfg, err := loadWithFlags(t, engineFlagSet{model: true})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || cfg.Model != fake {
		t.Errorf("model = %q after %d calls, want %q", cfg.Model, calls, fake)
	}
	file, err := config.Load(filepath.Join(testDir, "..", "configs", "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	file.Model, cfg.Model = "", ""
	d := config.Default()
	d.Model = ""
	if !reflect.DeepEqual(*file, d) {
		t.Errorf("configs/default.yaml differs from the built-in default:\n%+v\n%+v", *file, d)
	}
}

// A config file that names no model (or names it null) runs the shipped
// model, as no config does, wherever the file lies; --model still wins.
func TestConfigWithoutModelRunsTheShippedModel(t *testing.T) {
	old := shippedModelDir
	t.Cleanup(func() { shippedModelDir = old })
	fake := t.TempDir()
	shippedModelDir = func() (string, error) { return fake, nil }
	dir := t.TempDir()
	for _, body := range []string{"engine: {max_num_seqs: 8}\n", "model: null\nengine: {max_num_seqs: 8}\n", "model:\nengine: {max_num_seqs: 8}\n"} {
		path := filepath.Join(dir, "run.yaml")
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadWithFlags(t, engineFlagSet{model: true}, "-c", path)
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if cfg.Model != fake || cfg.Engine.MaxNumSeqs != 8 {
			t.Errorf("%q: model %q, max_num_seqs %d; want the shipped model %q and the file's 8", body, cfg.Model, cfg.Engine.MaxNumSeqs, fake)
		}
		other := t.TempDir()
		if cfg, err = loadWithFlags(t, engineFlagSet{model: true}, "-c", path, "-m", other); err != nil || cfg.Model != other {
			t.Errorf("%q with -m: model %v, err %v; want %q", body, cfg, err, other)
		}
	}
}

// testDir is the package directory, taken before any test changes the
// working directory.
var testDir = func() string {
	d, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return d
}()

// deepinfer generate with no --config runs the shipped model from a
// directory that has no configs/ nor assets/, extracting it once into the
// user's cache directory and reusing it on the next run.
func TestGenerateFromAnyDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the shipped model")
	}
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("HOME", cache)
	t.Setenv("LocalAppData", cache)
	t.Chdir(t.TempDir())
	for i := range 2 {
		out, err := run(t, "generate", "-p", "func main() {", "-n", "4")
		if err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, out)
		}
		if !strings.HasPrefix(out, "func main() {") || !strings.Contains(out, "stats:") {
			t.Errorf("run %d: output:\n%s", i, out)
		}
	}
	// Linux: $XDG_CACHE_HOME/deepinfer; macOS: $HOME/Library/Caches/deepinfer.
	var models []string
	for _, pat := range []string{"deepinfer", filepath.Join("*", "*", "deepinfer")} {
		m, _ := filepath.Glob(filepath.Join(cache, pat, "*", "deepseek-tiny", "model.safetensors"))
		models = append(models, m...)
	}
	if len(models) != 1 {
		t.Errorf("extracted copies of the model: %v, want one", models)
	}
}

// --logprobs N prints each generated token's logprob and N alternatives;
// -n past max_model_len is reported before generating; --chat does not
// print the rendered template.
func TestGenerateReports(t *testing.T) {
	_, cfg := writeTinyConfig(t, "")
	sdir := t.TempDir()
	if err := servertest.WriteModel(sdir, 3); err != nil {
		t.Fatal(err)
	}
	scfg := filepath.Join(sdir, "serve.yaml")
	if err := os.WriteFile(scfg, []byte(servertest.ConfigYAML(sdir)), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(sdir, "tmpl.jinja")
	if err := os.WriteFile(tmpl, []byte("<<{{ messages[0]['content'] }}>>"), 0o644); err != nil {
		t.Fatal(err)
	}
	logprobLine := regexp.MustCompile(`(?m)^\s+\d+\s+\d+\s+\d+\s+-?\d+\.\d{4}(\s+\d+=-?\d+\.\d{4}){2}$`)
	tests := []struct {
		name  string
		args  []string
		check func(string) bool
	}{
		{"logprobs", []string{"-c", cfg, "--token-ids", "-p", "3 4 5", "-n", "3", "--ignore-eos", "--logprobs", "2"}, func(out string) bool {
			return strings.Contains(out, "logprobs:") && len(logprobLine.FindAllString(out, -1)) == 3
		}},
		{"logprobs of several prompts", []string{"-c", cfg, "--token-ids", "-p", "3 4 5", "-p", "6 7", "-n", "2", "--ignore-eos", "--logprobs", "2"}, func(out string) bool {
			return len(logprobLine.FindAllString(out, -1)) == 4
		}},
		{"prompt logprobs", []string{"-c", cfg, "--token-ids", "-p", "3 4 5", "-n", "1", "--prompt-logprobs", "2"}, func(out string) bool {
			return strings.Contains(out, "prompt logprobs:") && len(logprobLine.FindAllString(out, -1)) == 2 && !strings.Contains(out, "\nlogprobs:")
		}},
		{"no logprobs", []string{"-c", cfg, "--token-ids", "-p", "3 4 5", "-n", "3"}, func(out string) bool { return !strings.Contains(out, "logprobs") }},
		{"within the context", []string{"-c", cfg, "--max-model-len", "16", "--token-ids", "-p", "3 4 5", "-n", "13"}, func(out string) bool { return strings.Contains(out, "stats:") }},
		{"chat does not echo the template", []string{"-c", scfg, "--chat", "-p", "hi there", "-n", "3"}, func(out string) bool {
			return !strings.Contains(out, "user: hi there") && !strings.Contains(out, "assistant:") && strings.Contains(out, "stats:")
		}},
		{"chat template file", []string{"-c", scfg, "--chat", "--chat-template", tmpl, "-p", "hi there", "-n", "3"}, func(out string) bool {
			return !strings.Contains(out, "<<") && strings.Contains(out, "stats:")
		}},
		{"plain prompt is echoed", []string{"-c", scfg, "-p", "hi there", "-n", "3"}, func(out string) bool { return strings.HasPrefix(out, "hi there") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, append([]string{"generate"}, tc.args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !tc.check(out) {
				t.Errorf("output:\n%s", out)
			}
		})
	}
}

// --chat-template FILE replaces the tokenizer's template and keeps the rest
// of tokenizer_config.json.
func TestChatTemplateTokenizer(t *testing.T) {
	dir := t.TempDir()
	if err := servertest.WriteModel(dir, 3); err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(dir, "t.jinja")
	os.WriteFile(tmpl, []byte("{{ bos_token }}[{{ messages[0]['content'] }}]"), 0o644)
	tdir, err := chatTemplateTokenizer(&config.Config{Model: dir}, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tdir)
	tok, err := tokenizer.Load(tdir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "hi"}}, true)
	if err != nil || got != "<s>[hi]" {
		t.Errorf("rendered %q, %v; want %q", got, err, "<s>[hi]")
	}
}

// -n past max_model_len is refused before anything is generated, naming
// the prompt's length, max_model_len and the largest -n that fits.
func TestGeneratePastTheContext(t *testing.T) {
	_, cfg := writeTinyConfig(t, "")
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"--max-model-len", "16", "--token-ids", "-p", "3 4 5 6 7 8 9 10 11 12", "-n", "20"},
			[]string{"prompt 1 has 10 tokens", "--max-tokens 20", "max_model_len 16", "at most 6"}},
		{[]string{"--max-model-len", "16", "--token-ids", "-p", "3 4", "-p", "3 4 5 6 7 8 9 10 11 12 13 14", "-n", "8"},
			[]string{"prompt 2 has 12 tokens", "max_model_len 16", "at most 4"}},
		{[]string{"--token-ids", "-p", "3 4 5", "-n", "5000"}, []string{"prompt 1 has 3 tokens", "--max-tokens 5000", "max_model_len 256"}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := run(t, append([]string{"generate", "-c", cfg}, tc.args...)...)
			if err == nil {
				t.Fatalf("no error:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want %q", err, w)
				}
			}
			if strings.Contains(out, "stats:") {
				t.Errorf("generated before refusing:\n%s", out)
			}
		})
	}
}

// Commands refuse bad engine flags before loading anything.
func TestCommandsRefuseFlags(t *testing.T) {
	_, cfg := writeTinyConfig(t, "")
	for _, args := range [][]string{
		{"generate", "-c", cfg, "--tensor-parallel-size", "2", "-p", "x"},
		{"serve", "-c", cfg, "--tensor-parallel-size", "2"},
		{"eval", "-c", cfg, "--tensor-parallel-size", "2", "-f", cfg},
		{"bench", "-c", cfg, "--tensor-parallel-size", "2"},
		{"graph", "-c", cfg, "--tensor-parallel-size", "2"},
	} {
		t.Run(args[0], func(t *testing.T) {
			if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), "tensor parallelism is not supported") {
				t.Errorf("%v: err = %v", args, err)
			}
		})
	}
	if _, err := run(t, "serve", "a", "b"); err == nil || !strings.Contains(err.Error(), "accepts at most 1 arg") {
		t.Errorf("serve with two models: %v", err)
	}
}

func TestVersion(t *testing.T) {
	out, err := run(t, "--version")
	if err != nil || !strings.HasPrefix(out, "deepinfer ") || !strings.Contains(out, "go1.") {
		t.Errorf("--version: %q, %v", out, err)
	}
	tests := []struct {
		bi   debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3, go1.26.0"},
		{debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"},
		}}, "(devel), revision abc123 (2026-01-02T03:04:05Z) dirty, go1.26.0"},
		{debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "false"}}}, "(devel), revision abc123"},
	}
	for _, tc := range tests {
		if got := formatVersion(&tc.bi); got != tc.want {
			t.Errorf("formatVersion = %q, want %q", got, tc.want)
		}
	}
}
