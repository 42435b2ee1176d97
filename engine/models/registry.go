package models

import (
	"fmt"
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
	for _, name := range []string{"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"} {
		r.byName[name] = newLlama
	}
	for _, name := range []string{"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"} {
		r.byName[name] = newDeepseek
	}
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
	return c(arch, ops, cfg, src, opts)
}

// Load opens the Hugging Face model directory dir and builds its model on
// ops with the registry r. The weights are copied to the backend, so the
// directory's files are closed before Load returns.
func (r *Registry) Load(ops kernels.Ops, dir string, opts Options) (Model, error) {
	ck, err := weights.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	return r.New(ops, ck.Config, ck, opts)
}
