package gguf

import (
	"fmt"
	"strconv"
	"strings"
)

// Tensor names: llama.cpp names tensors "token_embd.weight",
// "blk.N.attn_q.weight", ...; Hugging Face checkpoints
// "model.embed_tokens.weight", "model.layers.N.self_attn.q_proj.weight".
// The tables below map one to the other for the llama (Mixtral's experts
// included), qwen2, qwen3, qwen3moe and deepseek2 architectures (llama.cpp's
// convert_hf_to_gguf names). DeepSeek's multi-token-prediction layers
// (blk.N.nextn.*, N past the decoder layers) map to the checkpoint's
// model.layers.N.{eh_proj,enorm,hnorm,embed_tokens,shared_head.*}.

var globalNames = map[string]string{
	"token_embd":  "model.embed_tokens",
	"output_norm": "model.norm",
	"output":      "lm_head",
}

// layerNames maps the part after "blk.N." to the part after
// "model.layers.N.".
var layerNames = map[string]string{
	"attn_norm":      "input_layernorm",
	"attn_q":         "self_attn.q_proj",
	"attn_k":         "self_attn.k_proj",
	"attn_v":         "self_attn.v_proj",
	"attn_output":    "self_attn.o_proj",
	"attn_q_norm":    "self_attn.q_norm",
	"attn_k_norm":    "self_attn.k_norm",
	"ffn_norm":       "post_attention_layernorm",
	"ffn_gate":       "mlp.gate_proj",
	"ffn_up":         "mlp.up_proj",
	"ffn_down":       "mlp.down_proj",
	"attn_q_a":       "self_attn.q_a_proj",
	"attn_q_a_norm":  "self_attn.q_a_layernorm",
	"attn_q_b":       "self_attn.q_b_proj",
	"attn_kv_a_mqa":  "self_attn.kv_a_proj_with_mqa",
	"attn_kv_a_norm": "self_attn.kv_a_layernorm",
	"attn_kv_b":      "self_attn.kv_b_proj",
	"ffn_gate_inp":   "mlp.gate",
	"ffn_gate_shexp": "mlp.shared_experts.gate_proj",
	"ffn_up_shexp":   "mlp.shared_experts.up_proj",
	"ffn_down_shexp": "mlp.shared_experts.down_proj",

	"nextn.eh_proj":          "eh_proj",
	"nextn.enorm":            "enorm",
	"nextn.hnorm":            "hnorm",
	"nextn.embed_tokens":     "embed_tokens",
	"nextn.shared_head_head": "shared_head.head",
	"nextn.shared_head_norm": "shared_head.norm",
}

// hubLayerNames are the Hugging Face names of Mixtral's hub checkpoints
// (block_sparse_moe) for GGUFName; HFName answers with the transformers
// names, which the engine also reads.
var hubLayerNames = map[string]string{
	"ffn_gate_inp": "block_sparse_moe.gate",
}

// expertNames are the merged expert tensors: one GGUF tensor of shape
// [num_experts, n, k] stacks the HF tensors
// model.layers.N.mlp.experts.E.<proj>.weight for every E.
var expertNames = map[string]string{
	"ffn_gate_exps": "gate_proj",
	"ffn_up_exps":   "up_proj",
	"ffn_down_exps": "down_proj",
}

// hubExpertNames are Mixtral's hub names of the experts' matrices
// (block_sparse_moe.experts.E.w1 / w3 / w2), for GGUFName.
var hubExpertNames = map[string]string{
	"ffn_gate_exps": "w1",
	"ffn_up_exps":   "w3",
	"ffn_down_exps": "w2",
}

// Split MLA tensors: newer conversions of deepseek2 store kv_b_proj as
// attn_k_b ([heads, kv_lora_rank, qk_nope] in GGUF's outermost-first
// order: each head's k rows transposed) and attn_v_b ([heads, v_head_dim,
// kv_lora_rank]); HFName does not map them (see SplitMLA).
const (
	SplitMLAK = "attn_k_b"
	SplitMLAV = "attn_v_b"
)

// HFName maps a GGUF tensor name to its Hugging Face name. For a merged
// expert tensor it returns the name of expert 0 with "{E}" in place of the
// expert index ("model.layers.1.mlp.experts.{E}.gate_proj.weight") and
// experts = true. "blk.N.exp_probs_b.bias" maps to DeepSeek V3's
// "model.layers.N.mlp.gate.e_score_correction_bias". ok is false for a
// name without an equivalent (rope_freqs.weight, the split attn_k_b /
// attn_v_b of newer DeepSeek conversions).
func HFName(name string) (hf string, experts, ok bool) {
	base, suffix, found := cutLast(name)
	if !found {
		return "", false, false
	}
	if g, ok := globalNames[base]; ok {
		return g + "." + suffix, false, true
	}
	rest, ok := strings.CutPrefix(base, "blk.")
	if !ok {
		return "", false, false
	}
	idx, part, ok := strings.Cut(rest, ".")
	if !ok {
		return "", false, false
	}
	if _, err := strconv.Atoi(idx); err != nil {
		return "", false, false
	}
	prefix := "model.layers." + idx + "."
	if part == "exp_probs_b" && suffix == "bias" {
		return prefix + "mlp.gate.e_score_correction_bias", false, true
	}
	if p, ok := layerNames[part]; ok {
		return prefix + p + "." + suffix, false, true
	}
	if p, ok := expertNames[part]; ok {
		return prefix + "mlp.experts.{E}." + p + "." + suffix, true, true
	}
	return "", false, false
}

// GGUFName maps a Hugging Face tensor name to its GGUF name; for one
// expert's tensor it returns the merged tensor's name and the expert index
// (else expert = -1). Mixtral's hub names (block_sparse_moe.gate,
// block_sparse_moe.experts.E.w1/w3/w2) map as transformers' do. ok is false
// for names without an equivalent (kv_b_proj maps to attn_kv_b; a writer
// that splits it names attn_k_b / attn_v_b itself).
func GGUFName(hf string) (name string, expert int, ok bool) {
	base, suffix, found := cutLast(hf)
	if !found {
		return "", -1, false
	}
	for g, h := range globalNames {
		if base == h {
			return g + "." + suffix, -1, true
		}
	}
	rest, ok := strings.CutPrefix(base, "model.layers.")
	if !ok {
		return "", -1, false
	}
	idx, part, ok := strings.Cut(rest, ".")
	if !ok {
		return "", -1, false
	}
	if _, err := strconv.Atoi(idx); err != nil {
		return "", -1, false
	}
	prefix := "blk." + idx + "."
	if hf == "model.layers."+idx+".mlp.gate.e_score_correction_bias" {
		return prefix + "exp_probs_b.bias", -1, true
	}
	for g, h := range layerNames {
		if part == h {
			return prefix + g + "." + suffix, -1, true
		}
	}
	for g, h := range hubLayerNames {
		if part == h {
			return prefix + g + "." + suffix, -1, true
		}
	}
	for _, ex := range []struct {
		prefix string
		names  map[string]string
	}{{"mlp.experts.", expertNames}, {"block_sparse_moe.experts.", hubExpertNames}} {
		rest, ok := strings.CutPrefix(part, ex.prefix)
		if !ok {
			continue
		}
		e, proj, ok := strings.Cut(rest, ".")
		if !ok {
			return "", -1, false
		}
		n, err := strconv.Atoi(e)
		if err != nil || n < 0 {
			return "", -1, false
		}
		for g, h := range ex.names {
			if proj == h {
				return prefix + g + "." + suffix, n, true
			}
		}
	}
	return "", -1, false
}

// cutLast splits "a.b.weight" into "a.b" and "weight".
func cutLast(s string) (string, string, bool) {
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// PermuteQK reorders the rows of a q_proj or k_proj weight (or bias)
// between Hugging Face's rotate-half RoPE layout and the interleaved layout
// llama.cpp's llama architecture expects. convert_hf_to_gguf applies the
// forward permutation (toGGUF = true) to llama's attn_q and attn_k; loading
// such a tensor into an HF-layout model needs the inverse. rows is the
// number of rows of the tensor (heads*headDim), rowBytes each row's size in
// bytes (a row of quantized blocks moves as a whole). Cost: one copy of src.
func PermuteQK(src []byte, heads, rows, rowBytes int, toGGUF bool) ([]byte, error) {
	if heads <= 0 || rows%heads != 0 || (rows/heads)%2 != 0 || len(src) != rows*rowBytes {
		return nil, fmt.Errorf("gguf: permute: %d bytes, %d rows of %d bytes, %d heads", len(src), rows, rowBytes, heads)
	}
	headDim := rows / heads
	half := headDim / 2
	dst := make([]byte, len(src))
	// HF row h*headDim + s*half + i (s in {0,1}) is GGUF row h*headDim + 2*i + s.
	for h := range heads {
		for s := range 2 {
			for i := range half {
				hfRow := h*headDim + s*half + i
				gRow := h*headDim + 2*i + s
				from, to := hfRow, gRow
				if !toGGUF {
					from, to = gRow, hfRow
				}
				copy(dst[to*rowBytes:(to+1)*rowBytes], src[from*rowBytes:(from+1)*rowBytes])
			}
		}
	}
	return dst, nil
}
