// Package ggufwrite writes a GGUF file (version 3) from a Hugging Face model
// directory (config.json, *.safetensors, tokenizer.json), with the weight
// types of llama.cpp's presets, so that llama.cpp and this engine can run
// the same weights.
//
// Presets: f32, f16, bf16, q8_0, q4_0 (Q6_K output.weight), q4_k_m (Q4_K,
// with Q6_K for output.weight and for attn_v / ffn_down of the layers
// llama.cpp's use_more_bits picks, and llama.cpp's choices for 8-expert
// models: Q8_0 attn_k and attn_v, Q5_K attn_output) and q5_k_m (the same
// with Q5_K, attn_output kept Q5_K). Quantized blocks are bit for bit those of llama.cpp's
// quantize_row_*_ref (no importance matrix); a weight whose row length is
// not a multiple of 256 falls back to Q8_0 (llama.cpp would pick Q5_0 or
// Q8_0), one not a multiple of 32 to F32 (and with it the other experts'
// matrices of its layer: the MoE kernels take them all in blocks or all in
// floats). 1-D tensors (norms, biases) and MoE routers (ffn_gate_inp) stay
// F32 as llama.cpp keeps them.
//
// Architectures, as convert_hf_to_gguf names and lays them out: llama,
// qwen2, qwen3; qwen3moe; Mixtral as llama with merged experts
// (blk.N.ffn_{gate,up,down}_exps, [experts, n, k]); DeepSeek V2 and V3 as
// deepseek2 with kv_b_proj split into attn_k_b / attn_v_b (kept as floats:
// F32, or BF16 in the bf16 preset, since this engine reads them so) and
// DeepSeek V3's multi-token-prediction layers as blk.N.nextn.*. llama's
// (and Mixtral's) q/k rows are permuted to llama.cpp's interleaved RoPE
// layout as its converter does.
//
// Where llama.cpp cannot say what the checkpoint computes, the file says it
// for this engine and llama.cpp computes otherwise: qwen3moe's
// norm_topk_prob false (written as qwen3moe.expert_weights_norm; llama.cpp
// always renormalizes), qwen3moe's dense layers (mlp_only_layers: llama.cpp
// wants every layer sparse and refuses the file), and a DeepSeek YaRN mscale
// unequal to mscale_all_dim (gguf.KeyYarnMscale).
package ggufwrite

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
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

// Presets lists the weight presets Write takes: together they hold every
// GGUF weight type the engine computes from (F32, F16, BF16, Q8_0, Q4_0,
// Q4_K, Q5_K, Q6_K).
var Presets = []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m"}

// Arch returns the GGUF architecture a config is written as: llama, qwen2,
// qwen3, qwen3moe, or deepseek2 (Mixtral is llama with experts), or an
// error naming a model_type that is not written.
func Arch(cfg *weights.Config) (string, error) {
	switch cfg.ModelType {
	case "llama", "qwen2", "qwen3":
		return cfg.ModelType, nil
	case "mixtral":
		return "llama", nil
	case "qwen3_moe":
		return "qwen3moe", nil
	case "deepseek_v2", "deepseek_v3":
		return "deepseek2", nil
	}
	return "", fmt.Errorf("ggufwrite: model_type %q is not written (written: llama, qwen2, qwen3, qwen3_moe, mixtral, deepseek_v2, deepseek_v3)", cfg.ModelType)
}

// Write writes the model in dir as a GGUF file of the given preset to dst,
// with the tokenizer (and chat template) of tokDir's tokenizer.json and
// tokenizer_config.json. tokDir "" means dir; when dir has no
// tokenizer.json the file gets no vocabulary, only the BOS and EOS ids of
// config.json (enough for this engine to run token ids; llama.cpp needs a
// vocabulary). Cost: the model's weights read and converted in memory once.
func Write(dst io.Writer, dir, tokDir, preset string) error {
	explicitTok := tokDir != ""
	if tokDir == "" {
		tokDir = dir
	}
	cfg, err := weights.ReadConfig(filepath.Join(dir, weights.ConfigFile))
	if err != nil {
		return err
	}
	arch, err := Arch(cfg)
	if err != nil {
		return err
	}
	if err := checkWritable(arch, cfg); err != nil {
		return err
	}
	fileType := map[string]gguf.FileType{"f32": gguf.FileTypeAllF32, "f16": gguf.FileTypeMostlyF16,
		"bf16": gguf.FileTypeMostlyBF16, "q8_0": gguf.FileTypeMostlyQ8_0, "q4_0": gguf.FileTypeMostlyQ4_0,
		"q4_k_m": gguf.FileTypeMostlyQ4_K_M, "q5_k_m": gguf.FileTypeMostlyQ5_K_M}
	ft, ok := fileType[preset]
	if !ok {
		return fmt.Errorf("ggufwrite: preset %q: want one of %v", preset, Presets)
	}
	ck, err := weights.Open(dir)
	if err != nil {
		return err
	}
	defer ck.Close()
	mtp := 0
	if arch == "deepseek2" && cfg.NumNextNPredictLayers > 0 && ck.Has(fmt.Sprintf("model.layers.%d.enorm.weight", cfg.NumHiddenLayers)) {
		mtp = cfg.NumNextNPredictLayers
	}

	w := gguf.NewWriter()
	SetHyper(w, arch, cfg)
	if mtp > 0 {
		w.Set(arch+".block_count", gguf.Uint32(uint32(cfg.NumHiddenLayers+mtp)))
		w.Set(arch+".nextn_predict_layers", gguf.Uint32(uint32(mtp)))
	}
	w.Set("general.name", gguf.String(filepath.Base(filepath.Clean(dir))))
	w.Set("general.file_type", gguf.Uint32(uint32(ft)))
	w.Set("general.quantization_version", gguf.Uint32(2))
	if err := setVocab(w, cfg, tokDir, explicitTok); err != nil {
		return err
	}

	ts, err := tensors(ck, arch, cfg, mtp)
	if err != nil {
		return err
	}
	types := make([]gguf.GGMLType, len(ts))
	for i, t := range ts {
		types[i] = Pick(preset, t.name, t.dims, cfg.NumHiddenLayers+mtp, cfg.NRoutedExperts)
		if t.keep && preset != "bf16" {
			types[i] = gguf.TypeF32
		}
	}
	floatExperts(ts, types)
	for i, t := range ts {
		gt := types[i]
		data, err := encode(gt, t.vals)
		if err != nil {
			return fmt.Errorf("ggufwrite: %s: %w", t.name, err)
		}
		if err := w.AddTensor(t.name, gt, t.dims, data); err != nil {
			return err
		}
	}
	_, err = w.WriteTo(dst)
	return err
}

// floatExperts keeps a layer's merged experts (ffn_{gate,up,down}_exps) in
// F32 when some of them are block-quantized and others are not (a size
// whose rows are no whole 32-weight blocks): the MoE kernels take the
// experts' matrices all in blocks or all in floats.
func floatExperts(ts []outTensor, types []gguf.GGMLType) {
	mixed := map[string]bool{} // layer prefix
	quant := map[string]int{}
	count := map[string]int{}
	for i, t := range ts {
		if blk, ok := strings.CutSuffix(t.name, "_exps.weight"); ok {
			blk = blk[:strings.LastIndexByte(blk, '.')]
			count[blk]++
			if types[i] != gguf.TypeF32 && types[i] != gguf.TypeF16 && types[i] != gguf.TypeBF16 {
				quant[blk]++
			}
		}
	}
	for blk, n := range quant {
		mixed[blk] = n < count[blk]
	}
	for i, t := range ts {
		if blk, ok := strings.CutSuffix(t.name, "_exps.weight"); ok && mixed[blk[:strings.LastIndexByte(blk, '.')]] {
			types[i] = gguf.TypeF32
		}
	}
}

// checkWritable refuses configs the file cannot describe.
func checkWritable(arch string, cfg *weights.Config) error {
	if arch != "deepseek2" {
		if cfg.Rope.Type != "default" {
			return fmt.Errorf("ggufwrite: rope type %q is not written yet (llama.cpp stores llama3 scaling as a rope_freqs tensor)", cfg.Rope.Type)
		}
		if cfg.AttentionBias && arch != "qwen2" {
			return fmt.Errorf("ggufwrite: %s with attention biases is not written", cfg.ModelType)
		}
		return nil
	}
	switch {
	case cfg.Rope.Type != "default" && cfg.Rope.Type != "yarn":
		return fmt.Errorf("ggufwrite: %s: rope type %q: want default or yarn", cfg.ModelType, cfg.Rope.Type)
	case cfg.Rope.Type == "yarn" && cfg.Rope.MscaleAllDim == 0:
		return fmt.Errorf("ggufwrite: %s: yarn without mscale_all_dim is not written", cfg.ModelType)
	case !cfg.RopeInterleave:
		return fmt.Errorf("ggufwrite: %s: rope_interleave false: llama.cpp's deepseek2 rotates interleaved pairs", cfg.ModelType)
	case cfg.MoELayerFreq > 1:
		return fmt.Errorf("ggufwrite: %s: moe_layer_freq %d: llama.cpp's deepseek2 has every layer past the leading dense ones sparse", cfg.ModelType, cfg.MoELayerFreq)
	case cfg.NRoutedExperts > 0 && gatingFunc(cfg) == 0:
		return fmt.Errorf("ggufwrite: %s: scoring_func %q with topk_method %q has no GGUF form (softmax with greedy or group_limited_greedy, sigmoid with noaux_tc)",
			cfg.ModelType, cfg.ScoringFunc, cfg.TopKMethod)
	}
	return nil
}

// gatingFunc is llama.cpp's expert_gating_func of a DeepSeek config: 1
// softmax, 2 sigmoid, 0 for a routing without a GGUF form.
func gatingFunc(cfg *weights.Config) uint32 {
	switch {
	case cfg.ScoringFunc == "softmax" && (cfg.TopKMethod == "greedy" || cfg.TopKMethod == "group_limited_greedy"):
		return 1
	case cfg.ScoringFunc == "sigmoid" && cfg.TopKMethod == "noaux_tc":
		return 2
	}
	return 0
}

// setVocab writes the tokenizer of tokDir, or only the BOS and EOS ids of
// cfg when tokDir has no tokenizer.json and was not asked for.
func setVocab(w *gguf.Writer, cfg *weights.Config, tokDir string, explicit bool) error {
	tj, err := os.ReadFile(filepath.Join(tokDir, "tokenizer.json"))
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		if cfg.BOSTokenID != nil {
			w.Set("tokenizer.ggml.bos_token_id", gguf.Uint32(uint32(*cfg.BOSTokenID)))
		}
		if len(cfg.EOSTokenIDs) > 0 {
			w.Set("tokenizer.ggml.eos_token_id", gguf.Uint32(uint32(cfg.EOSTokenIDs[0])))
		}
		return nil
	}
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
	return nil
}

// outTensor is one tensor of the file: its GGUF name, dims (ggml order,
// innermost first) and values in that layout; keep marks a matrix kept as
// floats in every preset.
type outTensor struct {
	name string
	dims []int64
	vals []float32
	keep bool
}

// tensors converts the checkpoint's tensors to the file's, sorted by name:
// per-expert matrices merged, llama's q/k permuted, DeepSeek's kv_b_proj
// split, the layers past num_hidden_layers kept only as mtp nextn layers.
func tensors(ck *weights.Checkpoint, arch string, cfg *weights.Config, mtp int) ([]outTensor, error) {
	names := append([]string(nil), ck.Names()...)
	sort.Strings(names)
	var out []outTensor
	type expertSet struct {
		rows, cols int
		vals       [][]float32
	}
	experts := map[string]*expertSet{}
	for _, hf := range names {
		if layer, ok := layerOf(hf); ok && layer >= cfg.NumHiddenLayers+mtp {
			continue // MTP layers a file without nextn does not hold (as convert_hf_to_gguf skips them)
		}
		t, err := ck.Tensor(hf)
		if err != nil {
			return nil, err
		}
		vals := t.Float32s()
		if strings.HasSuffix(hf, ".mlp.experts.gate_up_proj") || strings.HasSuffix(hf, ".mlp.experts.down_proj") {
			// transformers 5's stacked experts: [E, 2I, H] (gate rows, then
			// up rows, per expert) and [E, H, I].
			prefix := strings.TrimSuffix(strings.TrimSuffix(hf, "gate_up_proj"), "down_proj")
			blk, _, _ := gguf.GGUFName(prefix + "0.down_proj.weight")
			blk = strings.TrimSuffix(blk, "ffn_down_exps.weight")
			if len(t.Shape) != 3 {
				return nil, fmt.Errorf("ggufwrite: %s: shape %v, want [experts, n, k]", hf, t.Shape)
			}
			e, n, k := t.Shape[0], t.Shape[1], t.Shape[2]
			if strings.HasSuffix(hf, "down_proj") {
				out = append(out, outTensor{name: blk + "ffn_down_exps.weight", dims: []int64{int64(k), int64(n), int64(e)}, vals: vals})
				continue
			}
			half := n / 2
			gate, up := make([]float32, 0, e*half*k), make([]float32, 0, e*half*k)
			for x := range e {
				m := vals[x*n*k : (x+1)*n*k]
				gate, up = append(gate, m[:half*k]...), append(up, m[half*k:]...)
			}
			dims := []int64{int64(k), int64(half), int64(e)}
			out = append(out, outTensor{name: blk + "ffn_gate_exps.weight", dims: dims, vals: gate},
				outTensor{name: blk + "ffn_up_exps.weight", dims: dims, vals: up})
			continue
		}
		name, expert, ok := gguf.GGUFName(hf)
		if !ok {
			return nil, fmt.Errorf("ggufwrite: tensor %q has no GGUF name", hf)
		}
		if expert >= 0 {
			if len(t.Shape) != 2 || expert >= cfg.NRoutedExperts {
				return nil, fmt.Errorf("ggufwrite: %s: shape %v, expert %d of %d", hf, t.Shape, expert, cfg.NRoutedExperts)
			}
			set := experts[name]
			if set == nil {
				set = &expertSet{rows: t.Shape[0], cols: t.Shape[1], vals: make([][]float32, cfg.NRoutedExperts)}
				experts[name] = set
			}
			if t.Shape[0] != set.rows || t.Shape[1] != set.cols {
				return nil, fmt.Errorf("ggufwrite: %s: shape %v, other experts %v", hf, t.Shape, []int{set.rows, set.cols})
			}
			set.vals[expert] = vals
			continue
		}
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
				return nil, fmt.Errorf("ggufwrite: %s: %w", hf, err)
			}
			vals = bytesF32(perm)
		}
		if arch == "deepseek2" && strings.HasSuffix(name, ".attn_kv_b.weight") {
			k, v, err := splitKVB(name, vals, t.Shape, cfg)
			if err != nil {
				return nil, fmt.Errorf("ggufwrite: %s: %w", hf, err)
			}
			out = append(out, k, v)
			continue
		}
		dims := make([]int64, len(t.Shape))
		for i, d := range t.Shape {
			dims[len(dims)-1-i] = int64(d)
		}
		out = append(out, outTensor{name: name, dims: dims, vals: vals})
	}
	for name, set := range experts {
		all := make([]float32, 0, len(set.vals)*set.rows*set.cols)
		for e, v := range set.vals {
			if v == nil {
				return nil, fmt.Errorf("ggufwrite: %s: expert %d of %d is missing", name, e, len(set.vals))
			}
			all = append(all, v...)
		}
		out = append(out, outTensor{name: name, dims: []int64{int64(set.cols), int64(set.rows), int64(len(set.vals))}, vals: all})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// layerOf is N of "model.layers.N.*".
func layerOf(hf string) (int, bool) {
	rest, ok := strings.CutPrefix(hf, "model.layers.")
	if !ok {
		return 0, false
	}
	var n int
	if _, err := fmt.Sscanf(rest, "%d.", &n); err != nil {
		return 0, false
	}
	return n, true
}

// splitKVB splits kv_b_proj ([heads*(nope+v), rank], each head's k rows
// then its v rows) into attn_k_b ([heads, rank, nope]: k rows transposed)
// and attn_v_b ([heads, v, rank]), as convert_hf_to_gguf does.
func splitKVB(name string, vals []float32, shape []int, cfg *weights.Config) (outTensor, outTensor, error) {
	heads, nope, vd, rank := cfg.NumAttentionHeads, cfg.QKNopeHeadDim, cfg.VHeadDim, cfg.KVLoraRank
	if len(shape) != 2 || shape[0] != heads*(nope+vd) || shape[1] != rank {
		return outTensor{}, outTensor{}, fmt.Errorf("shape %v, want [%d, %d]", shape, heads*(nope+vd), rank)
	}
	k := make([]float32, heads*rank*nope)
	v := make([]float32, 0, heads*vd*rank)
	for h := range heads {
		base := h * (nope + vd) * rank
		for r := range nope {
			for c := range rank {
				k[(h*rank+c)*nope+r] = vals[base+r*rank+c]
			}
		}
		v = append(v, vals[base+nope*rank:base+(nope+vd)*rank]...)
	}
	blk := strings.TrimSuffix(name, "attn_kv_b.weight")
	return outTensor{name: blk + gguf.SplitMLAK + ".weight", dims: []int64{int64(nope), int64(rank), int64(heads)}, vals: k, keep: true},
		outTensor{name: blk + gguf.SplitMLAV + ".weight", dims: []int64{int64(rank), int64(vd), int64(heads)}, vals: v, keep: true}, nil
}

// Pick returns the GGUF type of the tensor name with dims (ggml order)
// under a preset, as llama.cpp's quantizer picks it for a model of
// numLayers blocks and numExperts routed experts.
func Pick(preset, name string, dims []int64, numLayers, numExperts int) gguf.GGMLType {
	if len(dims) < 2 || strings.Contains(name, "ffn_gate_inp.") {
		return gguf.TypeF32
	}
	var t gguf.GGMLType
	switch preset {
	case "f32":
		return gguf.TypeF32
	case "f16":
		return gguf.TypeF16
	case "bf16":
		return gguf.TypeBF16
	case "q8_0":
		t = gguf.TypeQ8_0
	case "q4_0":
		t = gguf.TypeQ4_0
		switch {
		case name == "output.weight":
			t = gguf.TypeQ6_K
		case (strings.HasSuffix(name, "attn_v.weight") || strings.HasSuffix(name, "attn_kv_b.weight") ||
			strings.HasSuffix(name, "attn_k.weight")) && numExperts == 8:
			t = gguf.TypeQ8_0
		}
	case "q4_k_m", "q5_k_m":
		t = gguf.TypeQ4_K
		if preset == "q5_k_m" {
			t = gguf.TypeQ5_K
		}
		var layer int
		fmt.Sscanf(name, "blk.%d.", &layer)
		switch {
		case name == "output.weight":
			t = gguf.TypeQ6_K
		case strings.HasSuffix(name, "attn_v.weight") || strings.HasSuffix(name, "attn_kv_b.weight"):
			if UseMoreBits(layer, numLayers) {
				t = gguf.TypeQ6_K
			}
			if numExperts == 8 {
				t = gguf.TypeQ8_0
			}
		case strings.HasSuffix(name, "attn_k.weight") && numExperts == 8:
			t = gguf.TypeQ8_0
		case strings.HasSuffix(name, "attn_output.weight") && numExperts == 8:
			t = gguf.TypeQ5_K
		case strings.Contains(name, "ffn_down"):
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
	case gguf.TypeF16:
		out := make([]byte, 2*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint16(out[2*i:], simd.F32ToF16(v))
		}
		return out, nil
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

// SetHyper writes the hyper-parameters of a config as llama.cpp names them
// under arch (the keys engine/gguf's Config reads): the llama, qwen2 and
// qwen3 ones, and for Mixtral (llama), qwen3moe and deepseek2 their experts,
// and deepseek2's MLA sizes (attention as multi-query over the latent, as
// convert_hf_to_gguf describes it), routing and YaRN.
func SetHyper(w *gguf.Writer, arch string, cfg *weights.Config) {
	p := func(k string) string { return arch + "." + k }
	u32 := func(k string, v int) { w.Set(p(k), gguf.Uint32(uint32(v))) }
	w.Set("general.architecture", gguf.String(arch))
	u32("context_length", cfg.MaxPositionEmbeddings)
	u32("embedding_length", cfg.HiddenSize)
	u32("block_count", cfg.NumHiddenLayers)
	u32("feed_forward_length", cfg.IntermediateSize)
	u32("attention.head_count", cfg.NumAttentionHeads)
	u32("attention.head_count_kv", cfg.NumKeyValueHeads)
	u32("attention.key_length", cfg.HeadDim)
	u32("attention.value_length", cfg.HeadDim)
	u32("rope.dimension_count", cfg.HeadDim)
	w.Set(p("rope.freq_base"), gguf.Float32(float32(cfg.Rope.Theta)))
	w.Set(p("attention.layer_norm_rms_epsilon"), gguf.Float32(float32(cfg.RMSNormEps)))
	u32("vocab_size", cfg.VocabSize)
	if cfg.NRoutedExperts > 0 && (cfg.ModelType == "mixtral" || cfg.ModelType == "qwen3_moe" || arch == "deepseek2") {
		u32("expert_count", cfg.NRoutedExperts)
		u32("expert_used_count", cfg.NumExpertsPerTok)
	}
	switch {
	case cfg.ModelType == "qwen3_moe":
		u32("expert_feed_forward_length", cfg.MoEIntermediateSize)
		w.Set(p("expert_weights_norm"), gguf.Bool(cfg.NormTopKProb))
	case arch == "deepseek2":
		deepseekHyper(w, cfg)
	}
}

func deepseekHyper(w *gguf.Writer, cfg *weights.Config) {
	p := func(k string) string { return "deepseek2." + k }
	u32 := func(k string, v int) { w.Set(p(k), gguf.Uint32(uint32(v))) }
	u32("attention.head_count_kv", 1)
	u32("attention.q_lora_rank", cfg.QLoraRank)
	u32("attention.kv_lora_rank", cfg.KVLoraRank)
	u32("attention.key_length", cfg.KVLoraRank+cfg.QKRopeHeadDim)
	u32("attention.value_length", cfg.KVLoraRank)
	u32("attention.key_length_mla", cfg.QKNopeHeadDim+cfg.QKRopeHeadDim)
	u32("attention.value_length_mla", cfg.VHeadDim)
	u32("rope.dimension_count", cfg.QKRopeHeadDim)
	first := cfg.FirstKDenseReplace
	if cfg.NRoutedExperts <= 0 {
		first = cfg.NumHiddenLayers
	}
	u32("leading_dense_block_count", first)
	moe := cfg.MoEIntermediateSize
	if cfg.NRoutedExperts <= 0 {
		moe = cfg.IntermediateSize
	}
	u32("expert_feed_forward_length", moe)
	u32("expert_shared_count", cfg.NSharedExperts)
	if cfg.NRoutedExperts > 0 {
		w.Set(p("expert_weights_scale"), gguf.Float32(float32(cfg.RoutedScalingFactor)))
		if cfg.NormTopKProb {
			w.Set(p("expert_weights_norm"), gguf.Bool(true))
		}
		u32("expert_gating_func", int(gatingFunc(cfg)))
		if cfg.TopKMethod != "greedy" && cfg.NGroup > 1 {
			u32("expert_group_count", cfg.NGroup)
			u32("expert_group_used_count", cfg.TopKGroup)
		}
	}
	if r := cfg.Rope; r.Type == "yarn" {
		w.Set(p("rope.scaling.type"), gguf.String("yarn"))
		w.Set(p("rope.scaling.factor"), gguf.Float32(float32(r.Factor)))
		u32("rope.scaling.original_context_length", r.OriginalMaxPositionEmbeddings)
		w.Set(p("rope.scaling.yarn_beta_fast"), gguf.Float32(float32(r.BetaFast)))
		w.Set(p("rope.scaling.yarn_beta_slow"), gguf.Float32(float32(r.BetaSlow)))
		w.Set(p("rope.scaling.yarn_log_multiplier"), gguf.Float32(float32(0.1*r.MscaleAllDim)))
		if r.Mscale != r.MscaleAllDim {
			w.Set(gguf.KeyYarnMscale, gguf.Float32(float32(r.Mscale)))
		}
	}
}
