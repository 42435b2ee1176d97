package models

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// A GGUF file (llama.cpp's single-file format) is a model directory's
// equal: GGUFConfig maps its metadata to a config.json, and GGUFWeights
// serves its tensors under their Hugging Face names, so that every
// architecture loads from it unchanged. Float tensors (F32, F16, BF16) are
// read as a safetensors checkpoint's are; block-quantized ones (Q8_0,
// Q4_0, Q4_K, Q5_K, Q6_K) keep their blocks and need a backend that
// computes with them (kernels.QuantWeighter).

// IsGGUF reports whether path is a regular file that starts with the GGUF
// magic.
func IsGGUF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return false
	}
	var magic [4]byte
	_, err = io.ReadFull(f, magic[:])
	return err == nil && string(magic[:]) == gguf.Magic
}

// GGUFConfig is the config of the model in f: f.Config's config.json keys
// parsed by weights.ParseConfig, with the end-of-turn and end-of-message
// tokens (tokenizer.ggml.eot_token_id, eom_token_id) added to the EOS ids
// as llama.cpp stops on them, and the dtype of the token embeddings when
// they are stored as floats. Errors name the key.
func GGUFConfig(f *gguf.File) (*weights.Config, error) {
	c, err := f.Config()
	if err != nil {
		return nil, err
	}
	var eos []int64
	if v, ok := c["eos_token_id"]; ok {
		if id, ok := v.(int64); ok {
			eos = append(eos, id)
		}
	}
	for _, key := range []string{"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		if v, ok := f.Get(key); ok {
			id, ok := v.Int()
			if !ok || id < 0 {
				return nil, fmt.Errorf("gguf: metadata %q is %v, want a token id", key, v.Any())
			}
			if !slices.Contains(eos, id) {
				eos = append(eos, id)
			}
		}
	}
	if len(eos) > 0 {
		c["eos_token_id"] = eos
	}
	if t, ok := f.Tensor("token_embd.weight"); ok {
		switch t.Type {
		case gguf.TypeF32:
			c["torch_dtype"] = "float32"
		case gguf.TypeF16:
			c["torch_dtype"] = "float16"
		case gguf.TypeBF16:
			c["torch_dtype"] = "bfloat16"
		}
	}
	data, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("gguf: config: %w", err)
	}
	cfg, err := weights.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("gguf: config from metadata: %w", err)
	}
	return cfg, nil
}

// QuantTensor is a block-quantized tensor of a GGUF file: its Hugging Face
// name, format, shape (outermost first, as safetensors orders it) and the
// blocks of its rows, which alias the file.
type QuantTensor struct {
	Name  string
	Type  kernels.QuantType
	Shape []int
	Data  []byte
	File  string
}

// blockSource is a Weights whose tensors may be block-quantized.
type blockSource interface {
	// Blocks returns the named tensor when it is stored block-quantized;
	// ok is false for a tensor stored as floats (read it with Tensor) or
	// absent, err non-nil for a format no kernel computes with.
	Blocks(name string) (t QuantTensor, ok bool, err error)
}

// quantTypes maps the GGUF types computed from their blocks.
var quantTypes = map[gguf.GGMLType]kernels.QuantType{
	gguf.TypeQ8_0: kernels.QuantQ8_0, gguf.TypeQ4_0: kernels.QuantQ4_0,
	gguf.TypeQ4_K: kernels.QuantQ4_K, gguf.TypeQ5_K: kernels.QuantQ5_K, gguf.TypeQ6_K: kernels.QuantQ6_K,
}

// floatTypes maps the GGUF types read as floats.
var floatTypes = map[gguf.GGMLType]weights.DType{
	gguf.TypeF32: weights.F32, gguf.TypeF16: weights.F16, gguf.TypeBF16: weights.BF16,
}

// ggufRef is where a Hugging Face tensor name lives in a GGUF file: a
// tensor, or one expert's slice of a merged expert tensor.
type ggufRef struct {
	name   string
	expert int // -1: the whole tensor
	// vName is set for a kv_b_proj assembled from the split MLA tensors:
	// name is attn_k_b, vName attn_v_b (see splitKVB).
	vName string
}

// GGUFWeights serves the tensors of a GGUF file under their Hugging Face
// names (gguf.HFName): llama's attn_q and attn_k rows are un-permuted
// (gguf.PermuteQK) to the rotate-half layout of the checkpoint the file
// was converted from, merged expert tensors (ffn_*_exps, [experts, n,
// k]) are viewed one expert at a time
// ("model.layers.N.mlp.experts.E.gate_proj.weight"), and deepseek2's split
// MLA tensors (attn_k_b, attn_v_b) are served as the kv_b_proj they were
// split from (a copy; see splitKVB). Float tensors come
// from Tensor, block-quantized ones from Blocks. Data aliases the file
// (except un-permuted tensors, copies) and is valid until Close.
type GGUFWeights struct {
	// Path is the file's path.
	Path string
	// File is the parsed file.
	File *gguf.File
	// Config is GGUFConfig of the file.
	Config *weights.Config

	arch  string
	refs  map[string]ggufRef
	names []string // sorted
	owned bool     // Close closes File
}

// OpenGGUF maps the GGUF file at path and reads its config. Close releases
// the mapping. Errors name the key or tensor at fault (an unsupported
// architecture names it). Cost: one parse of the metadata (vocabulary
// included); no tensor data is read.
func OpenGGUF(path string) (*GGUFWeights, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	g, err := NewGGUFWeights(path, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	g.owned = true
	return g, nil
}

// NewGGUFWeights serves the tensors of a parsed file; path names it in
// errors. The caller keeps f open while the weights are read.
func NewGGUFWeights(path string, f *gguf.File) (*GGUFWeights, error) {
	cfg, err := GGUFConfig(f)
	if err != nil {
		return nil, fmt.Errorf("models: %s: %w", path, err)
	}
	arch, _ := f.Get("general.architecture")
	g := &GGUFWeights{Path: path, File: f, Config: cfg, refs: map[string]ggufRef{}}
	g.arch, _ = arch.String()
	for i := range f.Tensors {
		t := &f.Tensors[i]
		hf, experts, ok := gguf.HFName(t.Name)
		if kvb, vName, isSplit := splitMLAName(t.Name); isSplit {
			if t.Name != vName { // attn_k_b: kv_b_proj, read with its attn_v_b
				g.refs[kvb] = ggufRef{name: t.Name, expert: -1, vName: vName}
				continue
			}
			if _, hasK := f.Tensor(strings.Replace(vName, gguf.SplitMLAV, gguf.SplitMLAK, 1)); hasK {
				continue
			}
			// attn_v_b alone: listed under its own name below.
		}
		switch {
		case !ok:
			// No Hugging Face equivalent: listed under its own name, so
			// that it is reported as unused.
			g.refs[t.Name] = ggufRef{name: t.Name, expert: -1}
		case experts:
			shape := t.Shape()
			if len(shape) != 3 {
				return nil, fmt.Errorf("models: %s: tensor %q has shape %v, want [experts, n, k]: %w", path, t.Name, shape, ErrWeights)
			}
			for e := range int(shape[0]) {
				g.refs[strings.Replace(hf, "{E}", fmt.Sprint(e), 1)] = ggufRef{name: t.Name, expert: e}
			}
		default:
			g.refs[hf] = ggufRef{name: t.Name, expert: -1}
		}
	}
	for name := range g.refs {
		g.names = append(g.names, name)
	}
	slices.Sort(g.names)
	return g, nil
}

// Close releases the file when OpenGGUF opened it.
func (g *GGUFWeights) Close() error {
	if !g.owned {
		return nil
	}
	return g.File.Close()
}

// Has reports whether the named tensor exists.
func (g *GGUFWeights) Has(name string) bool { _, ok := g.refs[name]; return ok }

// Names lists the tensors by their Hugging Face names (GGUF names for
// tensors without one), sorted.
func (g *GGUFWeights) Names() []string { return g.names }

// raw returns the named tensor's GGUF info, shape and bytes (one expert's
// slice of a merged tensor), un-permuted for llama's q and k.
func (g *GGUFWeights) raw(name string) (*gguf.TensorInfo, []int, []byte, error) {
	ref, ok := g.refs[name]
	if !ok {
		return nil, nil, nil, fmt.Errorf("%s: tensor %q (GGUF %s): %w", g.Path, name, ggufNameOf(name), weights.ErrNotFound)
	}
	info, data, err := g.File.TensorData(ref.name)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", g.Path, err)
	}
	shape64 := info.Shape()
	shape := make([]int, len(shape64))
	for i, d := range shape64 {
		shape[i] = int(d)
	}
	if ref.expert >= 0 {
		per := len(data) / shape[0]
		data = data[ref.expert*per : (ref.expert+1)*per : (ref.expert+1)*per]
		shape = shape[1:]
	}
	if g.arch == "llama" {
		base := ref.name
		if b, ok := strings.CutSuffix(base, ".weight"); ok {
			base = b
		} else if b, ok := strings.CutSuffix(base, ".bias"); ok {
			base = b
		}
		heads := 0
		switch {
		case strings.HasSuffix(base, ".attn_q"):
			heads = g.Config.NumAttentionHeads
		case strings.HasSuffix(base, ".attn_k"):
			heads = g.Config.NumKeyValueHeads
		}
		if heads > 0 && len(shape) > 0 && shape[0] > 0 {
			perm, err := gguf.PermuteQK(data, heads, shape[0], len(data)/shape[0], false)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("%s: tensor %q: %w: %w", g.Path, ref.name, err, ErrWeights)
			}
			data = perm
		}
	}
	return info, shape, data, nil
}

// Tensor returns the named float tensor (F32, F16 or BF16). A
// block-quantized tensor is an error naming it and its format (read it
// with Blocks).
func (g *GGUFWeights) Tensor(name string) (weights.Tensor, error) {
	ref := g.refs[name]
	if ref.vName != "" {
		return g.splitKVB(name, ref)
	}
	if info, ok := g.File.Tensor(ref.name); ok {
		if _, ok := floatTypes[info.Type]; !ok {
			return weights.Tensor{}, g.typeError(name, info)
		}
	}
	info, shape, data, err := g.raw(name)
	if err != nil {
		return weights.Tensor{}, err
	}
	return weights.Tensor{Name: name, DType: floatTypes[info.Type], Shape: shape, Data: data, File: g.Path}, nil
}

// Blocks returns the named tensor when it is stored in a block-quantized
// format; ok is false when it is stored as floats or absent.
func (g *GGUFWeights) Blocks(name string) (QuantTensor, bool, error) {
	ref, ok := g.refs[name]
	if !ok || ref.vName != "" {
		return QuantTensor{}, false, nil // a split kv_b_proj is read as floats
	}
	info, ok := g.File.Tensor(ref.name)
	if !ok {
		return QuantTensor{}, false, nil
	}
	if _, ok := floatTypes[info.Type]; ok {
		return QuantTensor{}, false, nil
	}
	qt, ok := quantTypes[info.Type]
	if !ok {
		return QuantTensor{}, false, g.typeError(name, info)
	}
	_, shape, data, err := g.raw(name)
	if err != nil {
		return QuantTensor{}, false, err
	}
	return QuantTensor{Name: name, Type: qt, Shape: shape, Data: data, File: g.Path}, true, nil
}

func (g *GGUFWeights) typeError(name string, info *gguf.TensorInfo) error {
	if _, ok := quantTypes[info.Type]; ok {
		return fmt.Errorf("models: %s: tensor %q (GGUF %q) is %v, block-quantized: only the matrices of linear layers, embeddings and LM heads may be: %w",
			g.Path, name, info.Name, info.Type, ErrWeights)
	}
	return fmt.Errorf("models: %s: tensor %q (GGUF %q) is %v (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): %w",
		g.Path, name, info.Name, info.Type, ErrWeights)
}

// ggufNameOf is the GGUF name of a Hugging Face tensor name, for errors.
func ggufNameOf(hf string) string {
	name, expert, ok := gguf.GGUFName(hf)
	switch {
	case !ok:
		return "name unknown"
	case expert >= 0:
		return fmt.Sprintf("%q expert %d", name, expert)
	}
	return fmt.Sprintf("%q", name)
}
