package models

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
	"github.com/deepinfer/deepinfer-go/engine/models/ggufwrite"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// ggufConfigs are small models whose matrices have rows of whole 256-weight
// blocks, so that every K-quant format applies.
var ggufConfigs = map[string]string{
	"llama": `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 320,
		"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
		"max_position_embeddings": 256, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}`,
	"qwen3": `{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 288,
		"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
		"max_position_embeddings": 256, "tie_word_embeddings": true, "bos_token_id": 3, "eos_token_id": 4}`,
}

// ggufArch is the GGUF architecture of a config.
func ggufArch(cfg *weights.Config) string {
	return cfg.ModelType
}

// writeGGUF writes the tensors of w (a model of config cfg) as a GGUF file
// of preset f32, bf16, q8_0 or q4_k_m (llama.cpp's choice of types:
// Q6_K for output.weight and for attn_v / ffn_down of the layers its
// use_more_bits picks), llama's q/k rows permuted as llama.cpp's converter
// does. It returns the file's path and the weights the file holds in
// Hugging Face layout: w itself for f32 and bf16, the dequantized values
// (F32) of quantized tensors otherwise.
func writeGGUF(t testing.TB, dir string, cfg *weights.Config, w MemWeights, preset string, edit func(*gguf.Writer)) (string, MemWeights) {
	t.Helper()
	arch := ggufArch(cfg)
	gw := gguf.NewWriter()
	ggufwrite.SetHyper(gw, arch, cfg)
	gw.Set("tokenizer.ggml.bos_token_id", gguf.Uint32(uint32(*cfg.BOSTokenID)))
	gw.Set("tokenizer.ggml.eos_token_id", gguf.Uint32(uint32(cfg.EOSTokenIDs[0])))
	held := MemWeights{}
	for _, hf := range w.Names() {
		ten := w[hf]
		name, expert, ok := gguf.GGUFName(hf)
		if !ok || expert >= 0 {
			t.Fatalf("tensor %q has no GGUF name", hf)
		}
		rows, k := ten.Shape[0], 1
		if len(ten.Shape) == 2 {
			k = ten.Shape[1]
		}
		heads := 0
		if arch == "llama" && (strings.Contains(name, ".attn_q.") || strings.Contains(name, ".attn_k.")) {
			heads = cfg.NumAttentionHeads
			if strings.Contains(name, ".attn_k.") {
				heads = cfg.NumKeyValueHeads
			}
		}
		permute := func(data []byte, rowBytes int, toGGUF bool) []byte {
			if heads == 0 {
				return data
			}
			out, err := gguf.PermuteQK(data, heads, rows, rowBytes, toGGUF)
			if err != nil {
				t.Fatal(err)
			}
			return out
		}
		dims := []int64{int64(rows)}
		if len(ten.Shape) == 2 {
			dims = []int64{int64(k), int64(rows)}
		}
		typ := ggufPick(preset, name, len(ten.Shape), k, cfg.NumHiddenLayers)
		var data []byte
		switch {
		case typ == gguf.TypeBF16:
			if ten.DType != weights.BF16 {
				t.Fatalf("%s: bf16 preset over %v weights", hf, ten.DType)
			}
			data = permute(ten.Data, 2*k, true)
			held[hf] = ten
		case typ == gguf.TypeF32:
			data = permute(kernels.F32Bytes(ten.Float32s()), 4*k, true)
			held[hf] = ten
		default:
			q := simd.QuantType(typ)
			vals := bytesF32(permute(kernels.F32Bytes(ten.Float32s()), 4*k, true))
			rb, err := q.RowBytes(k)
			if err != nil {
				t.Fatal(err)
			}
			data = make([]byte, rows*rb)
			q.Quantize(data, vals)
			deq := make([]float32, rows*k)
			q.Dequantize(deq, data)
			dt := weights.F32Tensor(hf, ten.Shape, bytesF32(permute(kernels.F32Bytes(deq), 4*k, false)))
			held[hf] = dt
		}
		if err := gw.AddTensor(name, typ, dims, data); err != nil {
			t.Fatal(err)
		}
	}
	if edit != nil {
		edit(gw)
	}
	var buf bytes.Buffer
	if _, err := gw.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, arch+"-"+preset+".gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, held
}

// ggufPick is llama.cpp's type of a tensor under a preset (no fallbacks:
// the test models' rows are whole blocks).
func ggufPick(preset, name string, ndims, k, numLayers int) gguf.GGMLType {
	if ndims < 2 {
		return gguf.TypeF32
	}
	switch preset {
	case "bf16":
		return gguf.TypeBF16
	case "q8_0":
		return gguf.TypeQ8_0
	case "q4_0":
		return gguf.TypeQ4_0
	case "q5_k":
		return gguf.TypeQ5_K
	case "q4_k_m":
		if name == "output.weight" {
			return gguf.TypeQ6_K
		}
		if strings.HasSuffix(name, "attn_v.weight") || strings.HasSuffix(name, "ffn_down.weight") {
			var layer int
			fmt.Sscanf(name, "blk.%d.", &layer)
			n := numLayers
			if layer < n/8 || layer >= 7*n/8 || (layer-n/8)%3 == 2 {
				return gguf.TypeQ6_K
			}
		}
		return gguf.TypeQ4_K
	}
	return gguf.TypeF32
}

func bytesF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// TestGGUFLoad: a model loaded from a GGUF file computes, bit for bit, the
// logits of the same model built from the weights the file holds: the
// Hugging Face weights themselves for F32 and BF16 files, their
// dequantized values for Q8_0, Q4_0, Q5_K and Q4_K_M (Q4_K with Q6_K) files,
// whose blocks the backend keeps. Prefill (several rows) and decode (one
// row) both, on 1 and 2 threads.
func TestGGUFLoad(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(5, 6))
	for _, name := range []string{"llama", "qwen3"} {
		for _, preset := range []string{"f32", "bf16", "q8_0", "q4_0", "q5_k", "q4_k_m"} {
			t.Run(name+"/"+preset, func(t *testing.T) {
				cfg := parseConfig(t, ggufConfigs[name])
				dt := kernels.F32
				if preset == "bf16" {
					dt = kernels.BF16
				}
				w, err := RandomWeights(cfg, dt, 17)
				if err != nil {
					t.Fatal(err)
				}
				path, held := writeGGUF(t, dir, cfg, w, preset, nil)
				for _, threads := range []int{1, 2} {
					ops := newBackend(t, threads)
					mg, err := Builtin().Load(ops, path, Options{MaxModelLen: testMaxLen})
					if err != nil {
						t.Fatal(err)
					}
					mh, err := Builtin().New(ops, cfg, held, Options{MaxModelLen: testMaxLen})
					if err != nil {
						t.Fatal(err)
					}
					if gc, hc := mg.Config(), mh.Config(); gc.VocabSize != hc.VocabSize || gc.HeadDim != hc.HeadDim ||
						gc.Rope.Theta != hc.Rope.Theta || gc.RMSNormEps != hc.RMSNormEps || gc.TieWordEmbeddings != hc.TieWordEmbeddings ||
						!slices.Equal(gc.EOSTokenIDs, hc.EOSTokenIDs) || *gc.BOSTokenID != *hc.BOSTokenID {
						t.Errorf("config from GGUF %+v differs from config.json's %+v", gc, hc)
					}
					f := WeightFormat(mg)
					if want := map[string]string{"f32": "F32", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0",
						"q5_k": "Q5_K", "q4_k_m": "Q4_K+Q6_K"}[preset]; f != want {
						t.Errorf("WeightFormat = %q, want %q", f, want)
					}
					ids := randomIDs(r, 11, cfg.VocabSize)
					sameGGUFLogits(t, fmt.Sprintf("threads %d, ", threads), mg, mh, ids)
				}
			})
		}
	}
}

// TestGGUFErrors: a file the engine cannot run is an error that names the
// tensor or key at fault.
func TestGGUFErrors(t *testing.T) {
	dir := t.TempDir()
	cfg := parseConfig(t, ggufConfigs["llama"])
	w, err := RandomWeights(cfg, kernels.F32, 3)
	if err != nil {
		t.Fatal(err)
	}
	ops := newBackend(t, 1)
	load := func(w MemWeights, preset string, edit func(*gguf.Writer)) error {
		path, _ := writeGGUF(t, dir, cfg, w, preset, edit)
		_, err := Builtin().Load(ops, path, Options{MaxModelLen: testMaxLen})
		return err
	}

	missing := MemWeights{}
	for k, v := range w {
		if k != "model.layers.1.mlp.up_proj.weight" {
			missing[k] = v
		}
	}
	if err := load(missing, "q8_0", nil); !errors.Is(err, ErrWeights) || !strings.Contains(err.Error(), "model.layers.1.mlp.up_proj.weight") ||
		!strings.Contains(err.Error(), "blk.1.ffn_up.weight") {
		t.Errorf("missing tensor: err = %v, want ErrWeights naming model.layers.1.mlp.up_proj.weight and blk.1.ffn_up.weight", err)
	}

	err = load(w, "f32", func(gw *gguf.Writer) { gw.Set("general.architecture", gguf.String("gpt2")) })
	if err == nil || !strings.Contains(err.Error(), `"gpt2"`) {
		t.Errorf("unsupported architecture: err = %v, want one naming gpt2", err)
	}

	err = load(w, "f32", func(gw *gguf.Writer) {
		gw.Set("llama.embedding_length", gguf.String("wide"))
	})
	if err == nil || !strings.Contains(err.Error(), "llama.embedding_length") {
		t.Errorf("mistyped key: err = %v, want one naming llama.embedding_length", err)
	}

	// A format no kernel computes with (Q5_0), named with its tensor.
	small := MemWeights{}
	for k, v := range w {
		if k != "model.layers.0.mlp.gate_proj.weight" {
			small[k] = v
		}
	}
	err = load(small, "f32", func(gw *gguf.Writer) {
		if err := gw.AddTensor("blk.0.ffn_gate.weight", gguf.TypeQ5_0, []int64{256, 512}, make([]byte, 512*8*22)); err != nil {
			t.Fatal(err)
		}
	})
	if !errors.Is(err, ErrWeights) || !strings.Contains(err.Error(), "blk.0.ffn_gate.weight") || !strings.Contains(err.Error(), "Q5_0") {
		t.Errorf("Q5_0 tensor: err = %v, want ErrWeights naming blk.0.ffn_gate.weight and Q5_0", err)
	}

	// A backend without block-quantized kernels refuses the weights by name.
	path, _ := writeGGUF(t, dir, cfg, w, "q4_k_m", nil)
	_, err = Builtin().Load(plainOps{ops}, path, Options{MaxModelLen: testMaxLen})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "model.embed_tokens.weight") || !strings.Contains(err.Error(), "Q4_K") {
		t.Errorf("backend without QuantWeighter: err = %v, want ErrConfig naming the tensor and Q4_K", err)
	}

	notGGUF := filepath.Join(dir, "model.bin")
	os.WriteFile(notGGUF, []byte("not a model"), 0o644)
	if _, err := Builtin().Load(ops, notGGUF, Options{}); err == nil || !strings.Contains(err.Error(), "not a GGUF file") {
		t.Errorf("a file that is not GGUF: err = %v", err)
	}
}

// TestGGUFEOS: the end-of-turn token joins the EOS ids, as llama.cpp stops
// on it.
func TestGGUFEOS(t *testing.T) {
	dir := t.TempDir()
	cfg := parseConfig(t, ggufConfigs["qwen3"])
	w, err := RandomWeights(cfg, kernels.F32, 3)
	if err != nil {
		t.Fatal(err)
	}
	path, _ := writeGGUF(t, dir, cfg, w, "f32", func(gw *gguf.Writer) {
		gw.Set("tokenizer.ggml.eot_token_id", gguf.Uint32(7))
	})
	g, err := OpenGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if got := g.Config.EOSTokenIDs; !slices.Equal(got, []int{4, 7}) {
		t.Errorf("EOS ids = %v, want [4 7]", got)
	}
	if !g.Has("model.layers.1.self_attn.k_norm.weight") || g.Has("model.layers.2.self_attn.k_norm.weight") {
		t.Error("Has: wrong answer for layer 1 / layer 2 k_norm")
	}
}
