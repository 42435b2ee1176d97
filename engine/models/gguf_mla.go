package models

import (
	"fmt"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
	"github.com/deepinfer/deepinfer-go/engine/weights"
)

// splitMLAName reports whether name is a split MLA tensor
// ("blk.N.attn_k_b.weight" or "blk.N.attn_v_b.weight"); kvb is the Hugging
// Face name of the kv_b_proj both come from, vName the attn_v_b tensor's
// name.
func splitMLAName(name string) (kvb, vName string, ok bool) {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return "", "", false
	}
	idx, part, ok := strings.Cut(rest, ".")
	if !ok || (part != gguf.SplitMLAK+".weight" && part != gguf.SplitMLAV+".weight") {
		return "", "", false
	}
	for _, c := range idx {
		if c < '0' || c > '9' {
			return "", "", false
		}
	}
	return "model.layers." + idx + ".self_attn.kv_b_proj.weight", "blk." + idx + "." + gguf.SplitMLAV + ".weight", true
}

// splitKVB assembles kv_b_proj ([heads*(qk_nope+v_head), kv_lora_rank],
// each head's k rows then its v rows) from attn_k_b ([heads, kv_lora_rank,
// qk_nope]: the k rows transposed) and attn_v_b ([heads, v_head,
// kv_lora_rank]), as convert_hf_to_gguf split it. Both must be stored as
// floats; the result has their dtype (F32 when they differ). A
// block-quantized part is an error naming it: its blocks run along the
// transposed axis. Cost: one copy of both tensors.
func (g *GGUFWeights) splitKVB(name string, ref ggufRef) (weights.Tensor, error) {
	read := func(n string) (weights.Tensor, error) {
		info, data, err := g.File.TensorData(n)
		if err != nil {
			return weights.Tensor{}, fmt.Errorf("models: %s: tensor %q (split from %q): %w: %w", g.Path, n, name, err, ErrWeights)
		}
		dt, ok := floatTypes[info.Type]
		if !ok {
			return weights.Tensor{}, fmt.Errorf("models: %s: tensor %q is %v: the split MLA tensors (%s, %s) are read as floats (F32, F16, BF16) only: %w",
				g.Path, n, info.Type, gguf.SplitMLAK, gguf.SplitMLAV, ErrWeights)
		}
		shape := info.Shape()
		if len(shape) != 3 {
			return weights.Tensor{}, fmt.Errorf("models: %s: tensor %q has shape %v, want [heads, rows, cols]: %w", g.Path, n, shape, ErrWeights)
		}
		s := []int{int(shape[0]), int(shape[1]), int(shape[2])}
		return weights.Tensor{Name: n, DType: dt, Shape: s, Data: data, File: g.Path}, nil
	}
	k, err := read(ref.name)
	if err != nil {
		return weights.Tensor{}, err
	}
	v, err := read(ref.vName)
	if err != nil {
		return weights.Tensor{}, err
	}
	heads, rank, nope, vDim := k.Shape[0], k.Shape[1], k.Shape[2], v.Shape[1]
	if v.Shape[0] != heads || v.Shape[2] != rank {
		return weights.Tensor{}, fmt.Errorf("models: %s: tensors %q %v and %q %v: want [heads, kv_lora_rank, qk_nope] and [heads, v_head_dim, kv_lora_rank]: %w",
			g.Path, ref.name, k.Shape, ref.vName, v.Shape, ErrWeights)
	}
	if k.DType != v.DType {
		k = weights.F32Tensor(k.Name, k.Shape, k.Float32s())
		v = weights.F32Tensor(v.Name, v.Shape, v.Float32s())
	}
	es := k.DType.Size()
	rowBytes := rank * es
	out := make([]byte, heads*(nope+vDim)*rowBytes)
	for h := range heads {
		base := h * (nope + vDim) * rowBytes
		kh := k.Data[h*rank*nope*es:]
		for r := range nope {
			row := out[base+r*rowBytes:]
			for c := range rank {
				copy(row[c*es:(c+1)*es], kh[(c*nope+r)*es:(c*nope+r+1)*es])
			}
		}
		copy(out[base+nope*rowBytes:base+(nope+vDim)*rowBytes], v.Data[h*vDim*rowBytes:(h+1)*vDim*rowBytes])
	}
	return weights.Tensor{Name: name, DType: k.DType, Shape: []int{heads * (nope + vDim), rank}, Data: out, File: g.Path}, nil
}
