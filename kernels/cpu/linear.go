package cpu

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// parallelLinearWork is the work (multiply-adds) from which linearOn splits
// a product over the workers; below it the caller runs the product alone.
const parallelLinearWork = 4 * minParallelElems

// linearTile is the number of output columns (weight rows) in one unit of
// parallel work. The result does not depend on it.
const linearTile = 16

// Linear computes out = x W^T (+ bias) with W in its stored dtype.
func (b *Backend) Linear(out, x, w, bias kernels.Tensor) error {
	const op = "linear"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	xs, err := asCPU(op, "x", x)
	if err != nil {
		return err
	}
	ws, err := asCPU(op, "w", w)
	if err != nil {
		return err
	}
	bs, err := optCPU(op, "bias", bias)
	if err != nil {
		return err
	}
	m, n, k, err := kernels.LinearShapes("cpu", o, xs, ws, bs)
	if err != nil {
		return err
	}
	var bv []float32
	if bs != nil {
		bv = bs.f32
	}
	b.linear(o.f32, xs.f32, ws, m, n, k, bv)
	return nil
}

// linear computes out[m, n] = x[m, k] W^T + bias over column tiles in
// parallel. Each output element is one call of the dtype's dot loop, so the
// tiling and the number of rows never change a result.
func (b *Backend) linear(out, x []float32, w *Tensor, m, n, k int, bias []float32) {
	b.linearOn(out, x, w, m, n, k, bias, true)
}

// linearOn is linear, over the pool's workers when parallel is set and on
// the caller alone otherwise (for callers that already run on a worker of
// the pool). The result is the same either way.
func (b *Backend) linearOn(out, x []float32, w *Tensor, m, n, k int, bias []float32, parallel bool) {
	tiles := (n + linearTile - 1) / linearTile
	var acts *llamaActs // x rounded once for all tiles (Options.Activations)
	if b.acts.roundsFor(w.dtype) {
		acts = newLlamaActs(x, w, m, k, b.k, b.acts)
	}
	if !parallel || m*n*k < parallelLinearWork || tiles < 2 {
		// On the caller: no closure to build (a one-row step runs most of
		// its products here).
		b.linearCols(out, x, w, m, n, k, bias, acts, 0, n)
		return
	}
	b.run.For(tiles, func(lo, hi int) {
		b.linearCols(out, x, w, m, n, k, bias, acts, lo*linearTile, min(hi*linearTile, n))
	})
}

// linearCols computes columns [j0, j1) of out = x w^T + bias (x rounded
// into acts where the activation mode rounds them).
func (b *Backend) linearCols(out, x []float32, w *Tensor, m, n, k int, bias []float32, acts *llamaActs, j0, j1 int) {
	switch {
	case acts != nil:
		acts.linear(out, w, m, n, k, j0, j1)
	case w.dtype == kernels.F32:
		b.k.linearF32(out, x, w.f32, m, n, k, j0, j1)
	case w.dtype == kernels.BF16:
		b.k.linearBF16(out, x, w.u16, m, n, k, j0, j1)
	case w.dtype == kernels.F16:
		b.k.linearF16(out, x, w.u16, m, n, k, j0, j1)
	case w.dtype == kernels.F8E4M3:
		b.k.linearF8(out, x, w.f8Weights(), m, n, k, j0, j1)
	case w.dtype == kernels.Quant:
		b.linearQuant(out, x, w.q, m, n, k, j0, j1)
	}
	if bias != nil {
		for i := range m {
			row := out[i*n : (i+1)*n]
			for j := j0; j < j1; j++ {
				row[j] += bias[j]
			}
		}
	}
}

// Logits gathers rows of hidden, normalizes them and applies the LM head.
func (b *Backend) Logits(out, hidden, rows, norm, head kernels.Tensor, eps float32) error {
	const op = "logits"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	h, err := asCPU(op, "hidden", hidden)
	if err != nil {
		return err
	}
	rs, err := optCPU(op, "rows", rows)
	if err != nil {
		return err
	}
	nw, err := optCPU(op, "norm", norm)
	if err != nil {
		return err
	}
	hw, err := asCPU(op, "head", head)
	if err != nil {
		return err
	}
	t, r, dim, vocab, err := kernels.LogitsShapes("cpu", o, h, rs, nw, hw)
	if err != nil {
		return err
	}
	var idx []int32
	if rs != nil {
		idx = rs.i32
		for i, row := range idx {
			if row < 0 || int(row) >= t {
				return fmt.Errorf("cpu: %s: rows[%d] = %d, hidden has %d rows: %w", op, i, row, t, kernels.ErrOutOfRange)
			}
		}
	} else {
		idx = make([]int32, t)
		for i := range idx {
			idx[i] = int32(i)
		}
	}
	x := make([]float32, r*dim)
	for i, row := range idx {
		copy(x[i*dim:(i+1)*dim], h.f32[int(row)*dim:(int(row)+1)*dim])
	}
	if nw != nil {
		b.k.normRows(x, x, nw.f32, dim, 0, r, eps)
	}
	b.linear(o.f32, x, hw, r, vocab, dim, nil)
	return nil
}
