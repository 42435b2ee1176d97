package models

import (
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/weights"
)

// IsFP8Linear reports whether the tensor called name is a weight that FP8
// checkpoints quantize: the matrix of a linear layer of a decoder layer
// (attention projections, dense and expert MLPs; "*_proj.weight",
// DeepSeek's kv_a_proj_with_mqa, Mixtral's experts' w1/w2/w3), not the embeddings, the LM head, a MoE
// router or DeepSeek's MTP eh_proj.
func IsFP8Linear(name string) bool {
	if strings.HasSuffix(name, ".eh_proj.weight") {
		return false
	}
	return strings.HasSuffix(name, "_proj.weight") || strings.HasSuffix(name, ".kv_a_proj_with_mqa.weight") ||
		strings.HasSuffix(name, ".w1.weight") || strings.HasSuffix(name, ".w2.weight") || strings.HasSuffix(name, ".w3.weight")
}

// QuantizeFP8 returns the tensors of src as an FP8 checkpoint holds them:
// every float matrix IsFP8Linear names becomes F8_E4M3 in blocks of block
// (rows, columns) with its "_scale_inv" F32 tensor (weights.QuantizeFP8Blocks,
// DeepSeek's recipe); every other tensor is shared with src. Pair it with a
// config whose Quantization is {Method: "fp8", WeightBlockSize: block}.
// Cost: one pass over the quantized matrices.
func QuantizeFP8(src MemWeights, block [2]int) MemWeights {
	out := make(MemWeights, len(src))
	for name, t := range src {
		if !IsFP8Linear(name) || len(t.Shape) != 2 || t.DType == weights.F8E4M3 {
			out[name] = t
			continue
		}
		n, k := t.Shape[0], t.Shape[1]
		data, scales := weights.QuantizeFP8Blocks(t.Float32s(), n, k, block[0], block[1])
		out[name] = weights.Tensor{Name: name, DType: weights.F8E4M3, Shape: t.Shape, Data: data, File: t.File}
		sname := weights.ScaleInvName(name)
		st := weights.F32Tensor(sname, []int{(n + block[0] - 1) / block[0], (k + block[1] - 1) / block[1]}, scales)
		st.File = t.File
		out[sname] = st
	}
	return out
}

// DequantizeFP8 is the inverse of QuantizeFP8: every F8_E4M3 matrix with
// its "_scale_inv" becomes the F32 matrix of its dequantized values (each
// rounded once, as the kernels widen them), and the scale tensors go.
func DequantizeFP8(src MemWeights, block [2]int) MemWeights {
	out := make(MemWeights, len(src))
	for name, t := range src {
		if strings.HasSuffix(name, "_scale_inv") {
			continue
		}
		if t.DType != weights.F8E4M3 {
			out[name] = t
			continue
		}
		s := src[weights.ScaleInvName(name)]
		vals := weights.DequantizeFP8Blocks(t.Data, s.Float32s(), t.Shape[0], t.Shape[1], block[0], block[1])
		dt := weights.F32Tensor(name, t.Shape, vals)
		dt.File = t.File
		out[name] = dt
	}
	return out
}
