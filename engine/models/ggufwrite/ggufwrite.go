// Package ggufwrite writes a GGUF file (version 3) from a Hugging Face model
// directory (config.json, *.safetensors, tokenizer.json), with the weight
// types of llama.cpp's presets, so that llama.cpp and this engine can run
// the same weights.
//
// Presets: f32, bf16, q8_0 and q4_k_m (Q4_K, with Q6_K for output.weight
// and for attn_v / ffn_down of the layers llama.cpp's use_more_bits picks).
// Quantized blocks are bit for bit those of llama.cpp's quantize_row_*_ref
// (no importance matrix); a weight whose row length is not a multiple of
// 256 falls back to Q8_0 (llama.cpp would pick Q5_0 or Q8_0), one not a
// multiple of 32 to F32. 1-D tensors (norms, biases) stay F32 as llama.cpp
// keeps them. Architectures: llama, qwen2, qwen3 (deepseek is not written
// yet); llama's q/k rows are permuted to llama.cpp's interleaved RoPE
// layout as its converter does.
package ggufwrite

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// Presets lists the weight presets Write takes.
var Presets = []string{"f32", "bf16", "q8_0", "q4_k_m"}

// Write writes the model in dir as a GGUF file of the given preset to dst,
// with the tokenizer (and chat template) of tokDir's tokenizer.json and
// tokenizer_config.json ("" for dir). Cost: the model's weights read and
// converted in memory once.
func Write(dst io.Writer, dir, tokDir, preset string) error {
	if tokDir == "" {
		tokDir = dir
	}
	cfg, err := weights.ReadConfig(filepath.Join(dir, weights.ConfigFile))
	if err != nil {
		return err
	}
	arch := cfg.ModelType
	if arch != "llama" && arch != "qwen2" && arch != "qwen3" {
		return fmt.Errorf("ggufwrite: model_type %q: only llama, qwen2 and qwen3 are written", arch)
	}
	if cfg.Rope.Type != "default" {
		return fmt.Errorf("ggufwrite: rope type %q is not written yet (llama.cpp stores llama3 scaling as a rope_freqs tensor)", cfg.Rope.Type)
	}
	fileType := map[string]gguf.FileType{"f32": gguf.FileTypeAllF32, "bf16": gguf.FileTypeMostlyBF16,
		"q8_0": gguf.FileTypeMostlyQ8_0, "q4_k_m": gguf.FileTypeMostlyQ4_K_M}
	ft, ok := fileType[preset]
	if !ok {
		return fmt.Errorf("ggufwrite: preset %q: want one of %v", preset, Presets)
	}
	w := gguf.NewWriter()
	SetHyper(w, arch, cfg)
	w.Set("general.name", gguf.String(filepath.Base(filepath.Clean(dir))))
	w.Set("general.file_type", gguf.Uint32(uint32(ft)))
	w.Set("general.quantization_version", gguf.Uint32(2))

	tj, err := os.ReadFile(filepath.Join(tokDir, "tokenizer.json"))
	if err != nil {
		return fmt.Errorf("ggufwrite: %w", err)
	}
	cj, _ := os.ReadFile(filepath.Join(tokDir, "tokenizer_config.json"))
	kv, err := tokenizer.GGUFMetadata(tj, cj)
	if err != nil {
		return fmt.Errorf("ggufwrite: %w", err)
	}
	for _, e := range kv {
		if e.Key == "tokenizer.ggml.tokens" && e.Value.Len() > cfg.VocabSize {
			return fmt.Errorf("ggufwrite: tokenizer has %d tokens, more than vocab_size %d", e.Value.Len(), cfg.VocabSize)
		}
		if e.Key == "tokenizer.ggml.tokens" && e.Value.Len() != cfg.VocabSize {
			// llama.cpp wants one token per embedding row.
			toks, _ := e.Value.Strings()
			e.Value = gguf.Array(padTokens(toks, cfg.VocabSize))
		}
		if e.Key == "tokenizer.ggml.token_type" && e.Value.Len() != cfg.VocabSize {
			tt := e.Value.Any().([]int32)
			for len(tt) < cfg.VocabSize {
				tt = append(tt, 5) // unused
			}
			e.Value = gguf.Array(tt[:cfg.VocabSize])
		}
		w.Set(e.Key, e.Value)
	}

	ck, err := weights.Open(dir)
	if err != nil {
		return err
	}
	defer ck.Close()
	names := append([]string(nil), ck.Names()...)
	sort.Strings(names)
	for _, hf := range names {
		name, expert, ok := gguf.GGUFName(hf)
		if !ok || expert >= 0 {
			return fmt.Errorf("ggufwrite: tensor %q has no GGUF name", hf)
		}
		t, err := ck.Tensor(hf)
		if err != nil {
			return err
		}
		vals := t.Float32s()
		if arch == "llama" && (strings.HasSuffix(name, "attn_q.weight") || strings.HasSuffix(name, "attn_k.weight") ||
			strings.HasSuffix(name, "attn_q.bias") || strings.HasSuffix(name, "attn_k.bias")) {
			heads := cfg.NumAttentionHeads
			if strings.Contains(name, "attn_k") {
				heads = cfg.NumKeyValueHeads
			}
			rowLen := 1
			if len(t.Shape) == 2 {
				rowLen = t.Shape[1]
			}
			perm, err := gguf.PermuteQK(f32Bytes(vals), heads, t.Shape[0], 4*rowLen, true)
			if err != nil {
				return fmt.Errorf("ggufwrite: %s: %w", hf, err)
			}
			vals = bytesF32(perm)
		}
		dims := make([]int64, len(t.Shape))
		for i, d := range t.Shape {
			dims[len(dims)-1-i] = int64(d)
		}
		gt := Pick(preset, name, dims, cfg.NumHiddenLayers)
		data, err := encode(gt, vals)
		if err != nil {
			return fmt.Errorf("ggufwrite: %s: %w", hf, err)
		}
		if err := w.AddTensor(name, gt, dims, data); err != nil {
			return err
		}
	}
	_, err = w.WriteTo(dst)
	return err
}

// Pick returns the GGUF type of the tensor name with dims (ggml order)
// under a preset, as llama.cpp's quantizer picks it.
func Pick(preset, name string, dims []int64, numLayers int) gguf.GGMLType {
	if len(dims) < 2 {
		return gguf.TypeF32
	}
	var t gguf.GGMLType
	switch preset {
	case "f32":
		return gguf.TypeF32
	case "bf16":
		return gguf.TypeBF16
	case "q8_0":
		t = gguf.TypeQ8_0
	case "q4_k_m":
		t = gguf.TypeQ4_K
		if name == "output.weight" {
			t = gguf.TypeQ6_K
		} else if strings.HasSuffix(name, "attn_v.weight") || strings.HasSuffix(name, "ffn_down.weight") {
			var layer int
			fmt.Sscanf(name, "blk.%d.", &layer)
			if UseMoreBits(layer, numLayers) {
				t = gguf.TypeQ6_K
			}
		}
	default:
		return gguf.TypeF32
	}
	if dims[0]%int64(t.BlockSize()) != 0 {
		t = gguf.TypeQ8_0
	}
	if dims[0]%32 != 0 {
		t = gguf.TypeF32
	}
	return t
}

// UseMoreBits is llama.cpp's choice of the layers (of n) whose attn_v and
// ffn_down get Q6_K in Q4_K_M.
func UseMoreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

func encode(t gguf.GGMLType, vals []float32) ([]byte, error) {
	switch t {
	case gguf.TypeF32:
		return f32Bytes(vals), nil
	case gguf.TypeBF16:
		h := make([]uint16, len(vals))
		simd.F32ToBF16(h, vals)
		out := make([]byte, 2*len(h))
		for i, v := range h {
			binary.LittleEndian.PutUint16(out[2*i:], v)
		}
		return out, nil
	}
	q := simd.QuantType(t)
	rb, err := q.RowBytes(len(vals))
	if err != nil {
		return nil, err
	}
	out := make([]byte, rb)
	q.Quantize(out, vals)
	return out, nil
}

func f32Bytes(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func bytesF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func padTokens(toks []string, n int) []string {
	for i := len(toks); i < n; i++ {
		toks = append(toks, fmt.Sprintf("[PAD%d]", i))
	}
	return toks[:n]
}

// SetHyper writes the hyper-parameters of a llama, qwen2 or qwen3 config as
// llama.cpp names them under arch (the keys engine/gguf's Config reads).
func SetHyper(w *gguf.Writer, arch string, cfg *weights.Config) {
	p := func(k string) string { return arch + "." + k }
	w.Set("general.architecture", gguf.String(arch))
	w.Set(p("context_length"), gguf.Uint32(uint32(cfg.MaxPositionEmbeddings)))
	w.Set(p("embedding_length"), gguf.Uint32(uint32(cfg.HiddenSize)))
	w.Set(p("block_count"), gguf.Uint32(uint32(cfg.NumHiddenLayers)))
	w.Set(p("feed_forward_length"), gguf.Uint32(uint32(cfg.IntermediateSize)))
	w.Set(p("attention.head_count"), gguf.Uint32(uint32(cfg.NumAttentionHeads)))
	w.Set(p("attention.head_count_kv"), gguf.Uint32(uint32(cfg.NumKeyValueHeads)))
	w.Set(p("attention.key_length"), gguf.Uint32(uint32(cfg.HeadDim)))
	w.Set(p("attention.value_length"), gguf.Uint32(uint32(cfg.HeadDim)))
	w.Set(p("rope.dimension_count"), gguf.Uint32(uint32(cfg.HeadDim)))
	w.Set(p("rope.freq_base"), gguf.Float32(float32(cfg.Rope.Theta)))
	w.Set(p("attention.layer_norm_rms_epsilon"), gguf.Float32(float32(cfg.RMSNormEps)))
	w.Set(p("vocab_size"), gguf.Uint32(uint32(cfg.VocabSize)))
}
