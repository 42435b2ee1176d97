package models

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// Constructor builds a model of architecture arch from a parsed config and
// its weights, uploading the weights to ops.
type Constructor func(arch string, ops kernels.Ops, cfg *weights.Config, src Weights, opts Options) (Model, error)

// Registry maps config.json architecture names to constructors. It is owned
// by its creator; Builtin returns a fresh one holding this package's
// architectures.
type Registry struct {
	byName map[string]Constructor
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{byName: map[string]Constructor{}} }

// Builtin returns a new registry with every architecture of this package.
func Builtin() *Registry {
	r := NewRegistry()
	for _, name := range []string{"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
		"Qwen3MoeForCausalLM", "MixtralForCausalLM"} {
		r.byName[name] = newLlama
	}
	for _, name := range []string{"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"} {
		r.byName[name] = newDeepseek
	}
	r.byName["Gemma3ForCausalLM"] = newGemma3
	r.byName["GptOssForCausalLM"] = newGptOss
	return r
}

// Register adds an architecture; a name already present is an error.
func (r *Registry) Register(arch string, c Constructor) error {
	if _, dup := r.byName[arch]; dup {
		return fmt.Errorf("models: architecture %q registered twice", arch)
	}
	r.byName[arch] = c
	return nil
}

// Names lists the registered architectures, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.byName))
	for n := range r.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// New builds the model for cfg's first architectures entry. An unknown or
// missing name is an error wrapping ErrUnknownArchitecture that lists the
// supported ones.
func (r *Registry) New(ops kernels.Ops, cfg *weights.Config, src Weights, opts Options) (Model, error) {
	arch := ""
	if len(cfg.Architectures) > 0 {
		arch = cfg.Architectures[0]
	}
	c, ok := r.byName[arch]
	if !ok {
		return nil, fmt.Errorf("models: architecture %q (supported: %s): %w", arch, strings.Join(r.Names(), ", "), ErrUnknownArchitecture)
	}
	switch q := cfg.Quantization.Method; q {
	case "", "fp8":
	case "mxfp4": // gpt-oss's experts: read by its loader
		if arch != "GptOssForCausalLM" {
			return nil, fmt.Errorf("models: %s: quantization_config.quant_method %q (supported: fp8; mxfp4 for gpt-oss): %w", arch, q, ErrConfig)
		}
	default:
		return nil, fmt.Errorf("models: %s: quantization_config.quant_method %q (supported: fp8; mxfp4 for gpt-oss): %w", arch, q, ErrConfig)
	}
	switch opts.Quantization {
	case "", "fp8":
	default:
		return nil, fmt.Errorf("models: quantization %q (supported: fp8): %w", opts.Quantization, ErrConfig)
	}
	rec := &readRecorder{src: src, read: map[string]bool{}}
	m, err := c(arch, ops, cfg, rec, opts)
	if err != nil {
		return nil, err
	}
	rec.reportUnused(opts.logger(), arch)
	return m, nil
}

// WeightFormat names the dtypes model m keeps its weights in, the most
// bytes first ("BF16", "F8_E4M3+BF16"), or "" for a model that does not
// say.
func WeightFormat(m Model) string {
	if f, ok := m.(interface{ WeightFormat() string }); ok {
		return f.WeightFormat()
	}
	return ""
}

// readRecorder is a Weights that remembers which tensors were read, so that
// the ones a checkpoint holds but no layer reads (a rotary inv_freq buffer,
// MTP layers a config does not announce) are reported.
type readRecorder struct {
	src  Weights
	read map[string]bool
}

func (r *readRecorder) Tensor(name string) (weights.Tensor, error) {
	r.read[name] = true
	return r.src.Tensor(name)
}

func (r *readRecorder) Has(name string) bool { return r.src.Has(name) }

// Blocks forwards to a source with block-quantized tensors; ok is false for
// any other.
func (r *readRecorder) Blocks(name string) (QuantTensor, bool, error) {
	src, ok := r.src.(blockSource)
	if !ok {
		return QuantTensor{}, false, nil
	}
	r.read[name] = true
	return src.Blocks(name)
}

// unused lists the source's tensors never read, sorted; nil when the
// source cannot list its tensors.
func (r *readRecorder) unused() []string {
	lister, ok := r.src.(interface{ Names() []string })
	if !ok {
		return nil
	}
	var out []string
	for _, name := range lister.Names() {
		if !r.read[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// reportUnused logs one line when the checkpoint holds tensors the model
// ignored: their count and the first few names.
func (r *readRecorder) reportUnused(logger *slog.Logger, arch string) {
	unused := r.unused()
	if len(unused) == 0 {
		return
	}
	logger.Info("checkpoint tensors the model does not use, ignored",
		"architecture", arch, "count", len(unused), "first", unused[:min(len(unused), 4)])
}

// Load opens the Hugging Face model directory dir, or the GGUF file dir
// names (see GGUFWeights), and builds its model on ops with the registry
// r. The weights are copied to the backend, so the files are closed before
// Load returns.
func (r *Registry) Load(ops kernels.Ops, dir string, opts Options) (Model, error) {
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		if !IsGGUF(dir) {
			return nil, fmt.Errorf("models: %s: a file but not a GGUF file; a model is a Hugging Face directory or a .gguf file", dir)
		}
		var g *GGUFWeights
		var err error
		if opts.GGUF != nil {
			g, err = NewGGUFWeights(dir, opts.GGUF)
		} else {
			g, err = OpenGGUF(dir)
		}
		if err != nil {
			return nil, err
		}
		defer g.Close()
		return r.New(ops, g.Config, g, opts)
	}
	ck, err := weights.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	return r.New(ops, ck.Config, ck, opts)
}
