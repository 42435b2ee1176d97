package cpu

import (
	"fmt"
	"slices"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

var (
	_ kernels.QuantWeighter = (*Backend)(nil)
	_ kernels.BlockWeight   = (*Tensor)(nil)
)

// quantSeg is a run of matrix rows [lo, hi) of a block-quantized weight
// stored in one format, rb bytes a row.
type quantSeg struct {
	lo, hi int
	typ    simd.QuantType
	rb     int
	data   []byte // (hi-lo)*rb bytes
}

// quantRows are the rows of a block-quantized weight (see
// kernels.QuantWeight): segments in row order, covering every matrix row.
// Views slice the segments and share their bytes.
type quantRows struct {
	segs []quantSeg
}

// HasBlocks reports whether t is a block-quantized weight built by
// QuantWeight.
func (t *Tensor) HasBlocks() bool { return t != nil && t.q != nil }

// QuantWeight copies a block-quantized weight into Go memory, kept in its
// blocks: Linear, Logits and MoE dequantize them in registers (LinearQuant:
// bit for bit as if the weight had been dequantized to float32 first),
// Embedding and MLAAttention dequantize the rows they read. Formats: Q8_0,
// Q4_0, Q4_K, Q5_K and Q6_K. Cost: one copy of the bytes, into memory
// advised for huge pages (weightArena).
func (b *Backend) QuantWeight(w kernels.QuantWeight) (kernels.Tensor, error) {
	const op = "quant_weight"
	if len(w.Shape) < 2 || len(w.Shape) > 3 {
		return nil, fmt.Errorf("cpu: %s: shape %v, want [n, k] or [experts, n, k]: %w", op, w.Shape, kernels.ErrShape)
	}
	n, err := kernels.AllocShapes("cpu", kernels.F32, w.Shape)
	if err != nil {
		return nil, err
	}
	k := w.Shape[len(w.Shape)-1]
	rows := 0
	if k > 0 {
		rows = n / k
	}
	size, lo := 0, 0
	for i, p := range w.Parts {
		t := simd.QuantType(p.Type)
		if uint32(t) != uint32(p.Type) || !slices.Contains(simd.QuantTypes, t) {
			return nil, fmt.Errorf("cpu: %s: part %d is %v (supported: %v): %w", op, i, p.Type, simd.QuantTypes, kernels.ErrDType)
		}
		rb, err := t.RowBytes(k)
		if err != nil {
			return nil, fmt.Errorf("cpu: %s: part %d: %v: %w", op, i, err, kernels.ErrShape)
		}
		if p.Rows < 0 || len(p.Data) != p.Rows*rb {
			return nil, fmt.Errorf("cpu: %s: part %d: %d bytes for %d %v rows of %d weights, want %d: %w",
				op, i, len(p.Data), p.Rows, t, k, p.Rows*rb, kernels.ErrShape)
		}
		size += len(p.Data)
		lo += p.Rows
	}
	if lo != rows {
		return nil, fmt.Errorf("cpu: %s: parts hold %d rows, shape %v has %d: %w", op, lo, w.Shape, rows, kernels.ErrShape)
	}
	data, keep := b.weights.bytes(size)
	data = data[:0]
	q := &quantRows{}
	starts := []int{} // byte offset of each segment in data
	lo = 0
	for _, p := range w.Parts {
		t := simd.QuantType(p.Type)
		rb, _ := t.RowBytes(k)
		if n := len(q.segs); n > 0 && q.segs[n-1].typ == t {
			// Adjacent rows of one format: one segment.
			q.segs[n-1].hi += p.Rows
		} else if p.Rows > 0 {
			q.segs = append(q.segs, quantSeg{lo: lo, hi: lo + p.Rows, typ: t, rb: rb})
			starts = append(starts, len(data))
		}
		data = append(data, p.Data...)
		lo += p.Rows
	}
	for i := range q.segs {
		s := &q.segs[i]
		end := starts[i] + (s.hi-s.lo)*s.rb
		s.data = data[starts[i]:end:end]
	}
	return &Tensor{shape: append([]int(nil), w.Shape...), dtype: kernels.Quant, q: q, keep: keep}, nil
}

// qRows is the view of matrix rows [lo, hi) of a block-quantized weight,
// shaped shape.
func (t *Tensor) qRows(lo, hi int, shape []int) *Tensor {
	v := &quantRows{}
	for _, s := range t.q.segs {
		a, z := max(lo, s.lo), min(hi, s.hi)
		if a >= z {
			continue
		}
		v.segs = append(v.segs, quantSeg{lo: a - lo, hi: z - lo, typ: s.typ, rb: s.rb,
			data: s.data[(a-s.lo)*s.rb : (z-s.lo)*s.rb : (z-s.lo)*s.rb]})
	}
	return &Tensor{shape: shape, dtype: kernels.Quant, q: v, keep: t.keep}
}

// quantColumns is the width of the column blocks that a prefill over a
// part of a weight's rows computes into scratch.
const quantColumns = 64

// linearQuant computes columns [j0, j1) of out[m, n] = x[m, k] W^T for a
// block-quantized W of n rows, one LinearQuant call per segment. A weight
// of one segment is one call; a segment that is a part of the rows is
// computed as a matrix of its own rows, so its columns of out are written
// directly for one row of x and through a small scratch block for more
// (LinearQuant's results do not depend on the rows or columns it is given,
// so neither does the result here).
func (b *Backend) linearQuant(out, x []float32, w *quantRows, m, n, k, j0, j1 int) {
	if b.acts.roundsFor(kernels.Quant) {
		a := &llamaActs{lq: b.k.linearQuantLlama, l16: b.k.linear16Llama}
		a.quantize(x, w, m, k, b.k.quantizeActs)
		a.linearQuant(out, w, m, n, k, j0, j1)
		return
	}
	w.bySegment(out, m, n, j0, j1, func(out []float32, rows []byte, typ simd.QuantType, m, n, lo, hi int) {
		b.k.linearQuant(out, x, rows, typ, m, n, k, lo, hi)
	})
}

// bySegment computes columns [j0, j1) of out[m, n] segment by segment:
// lin(out, rows, typ, m, n, lo, hi) computes columns [lo, hi) of out[m, n]
// from the weight rows (n rows of type typ). A segment of all n rows is one
// call; a part of the rows is computed as a matrix of its own rows, its
// columns of out written directly for m = 1 and through a scratch block of
// quantColumns columns for more (lin's outputs must depend only on their
// own rows, so the result does not depend on the segmentation).
func (w *quantRows) bySegment(out []float32, m, n, j0, j1 int, lin func(out []float32, rows []byte, typ simd.QuantType, m, n, lo, hi int)) {
	var scratch []float32
	for _, s := range w.segs {
		lo, hi := max(j0, s.lo), min(j1, s.hi)
		if lo >= hi {
			continue
		}
		if s.lo == 0 && s.hi == n {
			lin(out, s.data, s.typ, m, n, lo, hi)
			continue
		}
		if m == 1 {
			c := hi - lo
			lin(out[lo:hi], s.data[(lo-s.lo)*s.rb:(hi-s.lo)*s.rb], s.typ, 1, c, 0, c)
			continue
		}
		if scratch == nil {
			scratch = make([]float32, m*quantColumns)
		}
		for c0 := lo; c0 < hi; c0 += quantColumns {
			c1 := min(c0+quantColumns, hi)
			c := c1 - c0
			buf := scratch[:m*c]
			lin(buf, s.data[(c0-s.lo)*s.rb:(c1-s.lo)*s.rb], s.typ, m, c, 0, c)
			for i := range m {
				copy(out[i*n+c0:i*n+c1], buf[i*c:(i+1)*c])
			}
		}
	}
}

// quantRowF32 dequantizes matrix row i of a block-quantized weight into
// buf (len >= the row length).
func (t *Tensor) quantRowF32(buf []float32, i int) []float32 {
	k := t.shape[len(t.shape)-1]
	for _, s := range t.q.segs {
		if i >= s.lo && i < s.hi {
			s.typ.Dequantize(buf[:k], s.data[(i-s.lo)*s.rb:(i-s.lo+1)*s.rb])
			break
		}
	}
	return buf[:k]
}

// llamaActs are the activation rows of one matrix product rounded as
// llama.cpp's CPU backend rounds them for the weight's formats
// (Options.Activations): Q8_0 blocks for Q8_0/Q4_0 rows, Q8_K
// blocks for K-quant rows, 16-bit values for BF16 and F16 weights.
type llamaActs struct {
	q80, q8k []byte   // rows quantized by simd.Impl.QuantizeActs, nil if unused
	h        []uint16 // rows rounded to the weight's 16-bit type
	// lq and l16 are the backend's simd.LinearQuantLlama and
	// simd.Linear16Llama.
	lq  func(out []float32, a, w []byte, t simd.QuantType, m, n, k, j0, j1 int)
	l16 func(out []float32, x, w []uint16, bf16 bool, m, n, k, j0, j1 int)
	// pairs, when set (ActBF16 with BF16 weights), multiplies h with the
	// weights in place of l16 (simd.LinearBF16Pairs).
	pairs func(out []float32, x, w []uint16, m, n, k, j0, j1 int)
}

// newLlamaActs rounds the m rows of x for the weight w under the mode r,
// or returns nil for weights that multiply float32 activations in
// llama.cpp too (F32) or have no llama.cpp counterpart (F8E4M3); ks
// computes the products. Cost: one pass over x per format.
func newLlamaActs(x []float32, w *Tensor, m, k int, ks kernelSet, r ActRounding) *llamaActs {
	a := &llamaActs{lq: ks.linearQuantLlama, l16: ks.linear16Llama}
	switch w.dtype {
	case kernels.Quant:
		a.quantize(x, w.q, m, k, ks.quantizeActs)
	case kernels.BF16:
		a.h = make([]uint16, m*k)
		ks.roundBF16(a.h, x[:m*k])
		if r == ActBF16 {
			a.pairs = ks.linearBF16Pairs
		}
	case kernels.F16:
		a.h = make([]uint16, m*k)
		simd.RoundF16(a.h, x[:m*k])
	default:
		return nil
	}
	return a
}

// quantize fills q80 and q8k for the formats of w's segments with
// quantizeActs (simd.Impl.QuantizeActs).
func (a *llamaActs) quantize(x []float32, w *quantRows, m, k int, quantizeActs func(dst []byte, x []float32, t simd.QuantType, m, k int) int) {
	for _, s := range w.segs {
		buf := &a.q80
		if s.typ.BlockSize() == 256 {
			buf = &a.q8k
		}
		if *buf == nil {
			rb, _ := simd.ActRowBytes(s.typ, k)
			*buf = make([]byte, m*rb)
			quantizeActs(*buf, x, s.typ, m, k)
		}
	}
}

// linear computes columns [j0, j1) of out[m, n] = x W^T with the rounded
// activations (w the weight newLlamaActs rounded them for).
func (a *llamaActs) linear(out []float32, w *Tensor, m, n, k, j0, j1 int) {
	if w.dtype == kernels.Quant {
		a.linearQuant(out, w.q, m, n, k, j0, j1)
		return
	}
	if a.pairs != nil {
		a.pairs(out, a.h, w.u16, m, n, k, j0, j1)
		return
	}
	a.l16(out, a.h, w.u16, w.dtype == kernels.BF16, m, n, k, j0, j1)
}

// linearQuant is llama.cpp's product of the quantized rows with each
// segment's rows: a segment of all n rows is one call; a part of the rows
// is computed as a matrix of its own rows, written directly for one row
// and through a scratch block for more (each output depends only on its
// own rows, so the result does not depend on the segmentation).
func (a *llamaActs) linearQuant(out []float32, w *quantRows, m, n, k, j0, j1 int) {
	w.bySegment(out, m, n, j0, j1, func(out []float32, rows []byte, typ simd.QuantType, m, n, lo, hi int) {
		acts := a.q80
		if typ.BlockSize() == 256 {
			acts = a.q8k
		}
		a.lq(out, acts, rows, typ, m, n, k, lo, hi)
	})
}
