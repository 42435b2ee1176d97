package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/assets"
	"github.com/deepinfer/deepinfer-go/engine/config"
)

// engineFlagSet says which of the optional engine flags a command takes.
type engineFlagSet struct {
	model        bool // --model/-m (commands without a positional model or a --model of their own)
	seed         bool // --seed as the engine's seed (generate's --seed is the per-request one)
	chatTemplate bool // --chat-template
}

// engineFlags binds the engine settings that have command-line flags, named
// as vLLM names them. A flag given on the command line overrides the value
// of the config file; a flag not given leaves the file's value (or the
// built-in default) alone.
type engineFlags struct {
	configPath        string
	model             string
	maxModelLen       int
	maxNumSeqs        int
	gpuMemUtilization float64
	kvCacheDType      string
	tensorParallel    int
	chatTemplate      string
	seed              int64
	device            string

	cmd *cobra.Command
}

// register adds --config/-c and the engine flags of set to cmd.
func (f *engineFlags) register(cmd *cobra.Command, set engineFlagSet) {
	f.cmd = cmd
	fl := cmd.Flags()
	fl.StringVarP(&f.configPath, "config", "c", "", "engine config (YAML); default: the built-in config (configs/default.yaml) with the shipped model")
	if set.model {
		fl.StringVarP(&f.model, "model", "m", "", "model directory (Hugging Face layout) or GGUF file; overrides the config's model; default: the shipped deepseek-tiny")
	}
	fl.IntVar(&f.maxModelLen, "max-model-len", 0, "prompt + output tokens per sequence (engine.max_model_len); default: the config's, else the model's max_position_embeddings")
	fl.IntVar(&f.maxNumSeqs, "max-num-seqs", 0, "sequences in one step (engine.max_num_seqs); default: the config's")
	fl.Float64Var(&f.gpuMemUtilization, "gpu-memory-utilization", 0, "cuda: share of device memory for activations and KV (cache.memory_fraction), in (0, 1]; default: the config's")
	fl.StringVar(&f.kvCacheDType, "kv-cache-dtype", "", "KV cache element type (cache.kv_cache_dtype): auto, f32, f16, fp8 or fp8_e4m3; default: the config's")
	fl.IntVar(&f.tensorParallel, "tensor-parallel-size", 1, "devices to split the model over; only 1 is supported")
	fl.StringVar(&f.device, "device", "", "cpu or cuda (device); default: the config's")
	if set.seed {
		fl.Int64Var(&f.seed, "seed", 0, "seed of requests that set none (seed); default: the config's")
	}
	if set.chatTemplate {
		fl.StringVar(&f.chatTemplate, "chat-template", "", "file with a Jinja chat template that replaces the tokenizer's")
	}
}

// changed reports whether the flag name was given on the command line.
func (f *engineFlags) changed(name string) bool {
	fl := f.cmd.Flags().Lookup(name)
	return fl != nil && fl.Changed
}

// load builds the run's config: the --config file (its relative paths
// resolved against the file's directory) or, without one, the built-in
// default with the shipped model (see shippedModelDir); then positional
// (a model directory given as an argument, "" for none) or --model; then
// every engine flag given. The result is validated. cleanup, never nil,
// removes what --chat-template wrote; call it once the engine is built.
// Cost: reading the config file; without --config and --model, the first
// run on a machine writes the shipped model (about 38 MB) to the user's
// cache directory, and every run hashes it (tens of milliseconds).
func (f *engineFlags) load(positional string) (cfg *config.Config, cleanup func(), err error) {
	cleanup = func() {}
	if f.tensorParallel != 1 {
		return nil, cleanup, fmt.Errorf("--tensor-parallel-size %d: tensor parallelism is not supported; one process runs the model on one device (--tensor-parallel-size 1)", f.tensorParallel)
	}
	model := f.model
	if positional != "" {
		if model != "" && model != positional {
			return nil, cleanup, fmt.Errorf("the model is given twice: %q as an argument and %q with --model", positional, model)
		}
		model = positional
	}
	if f.configPath != "" {
		if cfg, err = config.Load(f.configPath); err != nil {
			return nil, cleanup, err
		}
	} else {
		d := config.Default()
		cfg = &d
		cfg.Model = ""
	}
	// Neither the command line nor the file names a model: the shipped one.
	if model == "" && cfg.Model == "" {
		if model, err = shippedModelDir(); err != nil {
			return nil, cleanup, err
		}
	}
	if model != "" {
		if _, err := os.Stat(model); err != nil {
			return nil, cleanup, fmt.Errorf("model: %w", err)
		}
		cfg.Model = model
	}
	if f.changed("max-model-len") {
		cfg.Engine.MaxModelLen = f.maxModelLen
	}
	if f.changed("max-num-seqs") {
		cfg.Engine.MaxNumSeqs = f.maxNumSeqs
		// Every running sequence must be able to decode in one step.
		cfg.Engine.MaxNumBatchedTokens = max(cfg.Engine.StepTokens(cfg.Device), f.maxNumSeqs)
	}
	if f.changed("gpu-memory-utilization") {
		cfg.Cache.MemoryFraction = f.gpuMemUtilization
	}
	if f.changed("kv-cache-dtype") {
		cfg.Cache.KVCacheDType = f.kvCacheDType
	}
	if f.changed("device") {
		cfg.Device = f.device
	}
	if f.changed("seed") {
		cfg.Seed = f.seed
	}
	if err := cfg.Validate(); err != nil {
		return nil, cleanup, fmt.Errorf("config with the command-line flags: %w", err)
	}
	if f.chatTemplate != "" {
		dir, err := chatTemplateTokenizer(cfg, f.chatTemplate)
		if err != nil {
			return nil, cleanup, err
		}
		cfg.Tokenizer = dir
		cleanup = func() { os.RemoveAll(dir) }
	}
	return cfg, cleanup, nil
}

// shippedModelDir is the shipped model's directory, written to the user's
// cache directory on first use (assets.DefaultModelDir). A variable so
// that tests can count its calls.
var shippedModelDir = assets.DefaultModelDir

// chatTemplateTokenizer writes a tokenizer directory for cfg whose
// tokenizer_config.json is the model's with chat_template replaced by the
// contents of the file templatePath, and returns it: a new temporary
// directory the caller removes once the tokenizer is loaded. tokenizer.json
// is linked, or copied where links fail. Cost: one small file read and
// written, plus a copy of tokenizer.json where links are not available.
func chatTemplateTokenizer(cfg *config.Config, templatePath string) (string, error) {
	tmpl, err := os.ReadFile(templatePath)
	if err != nil {
		return "", fmt.Errorf("--chat-template: %w", err)
	}
	src := cfg.Tokenizer
	if src == "" {
		src = cfg.Model
	}
	if st, err := os.Stat(src); err == nil && !st.IsDir() {
		return "", fmt.Errorf("--chat-template: the tokenizer comes from the file %s; a replaced chat template needs a tokenizer directory (--config with tokenizer: DIR)", src)
	}
	tc := map[string]json.RawMessage{}
	if data, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json")); err == nil {
		if err := json.Unmarshal(data, &tc); err != nil {
			return "", fmt.Errorf("--chat-template: %s: %w", filepath.Join(src, "tokenizer_config.json"), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("--chat-template: %w", err)
	}
	tc["chat_template"], _ = json.Marshal(string(tmpl))
	data, err := json.Marshal(tc)
	if err != nil {
		return "", fmt.Errorf("--chat-template: %w", err)
	}
	dir, err := os.MkdirTemp("", "deepinfer-tokenizer-")
	if err != nil {
		return "", fmt.Errorf("--chat-template: %w", err)
	}
	fail := func(err error) (string, error) {
		os.RemoveAll(dir)
		return "", fmt.Errorf("--chat-template: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), data, 0o644); err != nil {
		return fail(err)
	}
	tj, err := filepath.Abs(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		return fail(err)
	}
	if err := os.Symlink(tj, filepath.Join(dir, "tokenizer.json")); err != nil {
		if err := copyFile(filepath.Join(dir, "tokenizer.json"), tj); err != nil {
			return fail(err)
		}
	}
	return dir, nil
}

// copyFile copies the file src to dst.
func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
