package cpu

import (
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// The elementwise operations of the Gemma family (kernels.GemmaOpser).

// geluTanh is GELU with the tanh approximation (PyTorch's
// gelu(approximate="tanh"), transformers' gelu_pytorch_tanh), in float64.
func geluTanh(x float32) float32 {
	v := float64(x)
	return float32(0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v))))
}

// Scale computes out = x * s.
func (b *Backend) Scale(out, x kernels.Tensor, s float32) error {
	const op = "scale"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	a, err := asCPU(op, "x", x)
	if err != nil {
		return err
	}
	n, err := kernels.AddShapes("cpu", o, a, a)
	if err != nil {
		return err
	}
	const chunk = 4096
	b.forRows((n+chunk-1)/chunk, chunk, func(lo, hi int) {
		for i := lo * chunk; i < min(hi*chunk, n); i++ {
			o.f32[i] = a.f32[i] * s
		}
	})
	return nil
}

// GELUTanhMul computes gelu_tanh(gate) * up from the fused [T, 2n] projection.
func (b *Backend) GELUTanhMul(out, gateUp kernels.Tensor) error {
	return b.gatedRows("gelu_tanh_mul", out, gateUp, func(dst, gu []float32) {
		n := len(dst)
		gate, up := gu[:n], gu[n:]
		for j := range dst {
			dst[j] = geluTanh(gate[j]) * up[j]
		}
	})
}

// Softcap computes x = c * tanh(x / c) in place.
func (b *Backend) Softcap(x kernels.Tensor, c float32) error {
	const op = "softcap"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	a, err := asCPU(op, "x", x)
	if err != nil {
		return err
	}
	if !(c > 0) {
		return fmt.Errorf("cpu: %s: cap %g, want > 0: %w", op, c, kernels.ErrShape)
	}
	n, err := kernels.AddShapes("cpu", a, a, a)
	if err != nil {
		return err
	}
	const chunk = 4096
	b.forRows((n+chunk-1)/chunk, chunk, func(lo, hi int) {
		for i := lo * chunk; i < min(hi*chunk, n); i++ {
			a.f32[i] = c * float32(math.Tanh(float64(a.f32[i]/c)))
		}
	})
	return nil
}

var _ kernels.GemmaOpser = (*Backend)(nil)
var _ kernels.RingAttentioner = (*Backend)(nil)
