package cpu

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

var (
	_ kernels.FP8Weighter  = (*Backend)(nil)
	_ kernels.ScaledWeight = (*Tensor)(nil)
)

// fp8Scales are the block scales of an FP8 weight tensor (see
// kernels.FP8Weight): views share scales and slice scaleRow with their rows.
type fp8Scales struct {
	scales   []float32
	scaleRow []int32 // one per matrix row (elements / last dimension)
	blockK   int
}

// HasWeightScales reports whether t is an FP8 weight built by FP8Weight.
func (t *Tensor) HasWeightScales() bool { return t != nil && t.fp8 != nil }

// FP8Weight copies an FP8 block-scaled weight into Go memory: one byte a
// weight, widened inside the Linear, Logits, MoE, Embedding and
// MLAAttention loops. The products apply each block's scale to the
// activations (simd.Impl.LinearF8), so they match those of the weight
// dequantized to float32 to rounding, not bit for bit; Embedding's rows are
// the dequantized ones. Cost: one copy of the bytes (into memory advised for huge
// pages, weightArena) and scales and one pass over them to check them.
func (b *Backend) FP8Weight(w kernels.FP8Weight) (kernels.Tensor, error) {
	const op = "fp8_weight"
	if len(w.Shape) < 2 || len(w.Shape) > 3 {
		return nil, fmt.Errorf("cpu: %s: shape %v, want [n, k] or [experts, n, k]: %w", op, w.Shape, kernels.ErrShape)
	}
	n, err := kernels.AllocShapes("cpu", kernels.F8E4M3, w.Shape)
	if err != nil {
		return nil, err
	}
	k := w.Shape[len(w.Shape)-1]
	rows := 0
	if k > 0 {
		rows = n / k
	}
	if len(w.Data) != n || len(w.ScaleRow) != rows {
		return nil, fmt.Errorf("cpu: %s: %d bytes and %d scale rows for shape %v: %w", op, len(w.Data), len(w.ScaleRow), w.Shape, kernels.ErrShape)
	}
	sw := simd.F8Weights{Data: w.Data, Scales: w.Scales, ScaleRow: w.ScaleRow, BlockK: w.BlockK}
	if err := sw.Check(rows, k); err != nil {
		return nil, fmt.Errorf("cpu: %s: %v: %w", op, err, kernels.ErrShape)
	}
	for i, v := range w.Data {
		if v&0x7f == 0x7f {
			return nil, fmt.Errorf("cpu: %s: byte %d is an E4M3 NaN (%#02x): %w", op, i, v, kernels.ErrDType)
		}
	}
	data, keep := b.weights.bytes(len(w.Data))
	copy(data, w.Data)
	return &Tensor{shape: append([]int(nil), w.Shape...), dtype: kernels.F8E4M3, u8: data, keep: keep,
		fp8: &fp8Scales{scales: append([]float32(nil), w.Scales...), scaleRow: append([]int32(nil), w.ScaleRow...), blockK: w.BlockK}}, nil
}

// f8Weights is the simd view of an FP8 weight tensor.
func (t *Tensor) f8Weights() simd.F8Weights {
	return simd.F8Weights{Data: t.u8, Scales: t.fp8.scales, ScaleRow: t.fp8.scaleRow, BlockK: t.fp8.blockK}
}

// f8Rows is the view of matrix rows [lo, hi) of an FP8 weight whose last
// dimension is k, shaped shape.
func (t *Tensor) f8Rows(lo, hi, k int, shape []int) *Tensor {
	s := *t.fp8
	s.scaleRow = s.scaleRow[lo:hi:hi]
	return &Tensor{shape: shape, dtype: t.dtype, u8: t.u8[lo*k : hi*k : hi*k], fp8: &s, keep: t.keep}
}
