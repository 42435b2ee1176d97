package kernels

// FP8 E4M3 weights with block scales, the format DeepSeek-V3/R1 and the
// Qwen3-FP8 checkpoints ship ("quant_method": "fp8", 128x128 blocks): a
// backend that computes with them implements FP8Weighter, and the tensors
// it returns are accepted as weights by Linear, Logits, Embedding, MoE and
// MLAAttention. Other backends refuse F8E4M3 weights (ErrDType); models
// check for FP8Weighter before they build one.

// FP8Weight is an FP8 weight in host memory. Element (r, c) of the matrix
// [rows, k] that Shape flattens to (k its last dimension) stands for
//
//	F8E4M3ToF32(Data[r*k+c]) * Scales[ScaleRow[r]*ceil(k/BlockK) + c/BlockK]
//
// ScaleRow lets the 128 rows of a block share one row of scales, and lets
// matrices with different block grids be stacked (fused q/k/v, gate/up,
// experts). The NaN encodings 0x7F and 0xFF are not valid weights.
type FP8Weight struct {
	Shape    []int     // [n, k] or [experts, n, k]
	Data     []byte    // NumElements(Shape) bytes, row-major
	Scales   []float32 // rows of ceil(k/BlockK) scales, finite, below 2^100 in magnitude
	ScaleRow []int32   // one entry per matrix row: its row of Scales
	BlockK   int       // columns per scale: a power of two >= 16 (128 in the published checkpoints)
}

// FP8Weighter is implemented by backends that compute with FP8 weights:
// they keep the bytes as they are (one byte a weight) and widen them in
// the kernels' inner loops.
type FP8Weighter interface {
	// FP8Weight copies w into backend memory and returns a weight tensor of
	// dtype F8E4M3 and shape w.Shape, or an error wrapping ErrShape or
	// ErrDType when w is inconsistent. Rows and Reshape (keeping the last
	// dimension) of it are weights too. Cost: one copy of Data, Scales and
	// ScaleRow.
	FP8Weight(w FP8Weight) (Tensor, error)
}

// ScaledWeight is implemented by tensor types that can hold an FP8Weight;
// HasWeightScales reports whether this one does. The argument checks accept
// an F8E4M3 weight only when it does.
type ScaledWeight interface {
	HasWeightScales() bool
}

// weightTypes are the dtypes weight w may have: FloatTypes, F8E4M3 for a
// tensor built by FP8Weighter, and Quant for one built by QuantWeighter.
func weightTypes(w Tensor) []DType {
	if q, ok := w.(BlockWeight); ok && present(w) && q.HasBlocks() {
		return []DType{Quant}
	}
	if s, ok := w.(ScaledWeight); ok && present(w) && s.HasWeightScales() {
		return []DType{F32, BF16, F16, F8E4M3}
	}
	return FloatTypes
}
