package cpu

import (
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// minParallelElems is the work (elements touched) below which a row loop runs
// on the caller alone: waking workers costs more than it saves.
const minParallelElems = 1 << 15

// minRowElemsPerWorker is the work (elements touched) per worker from
// which forRows' row loops go parallel: 4 Ki on two workers, 32 Ki (the
// bound of the other loops) on sixteen. Since the pool's workers poll
// between jobs (package pool), handing out a loop costs 0.5-0.8 µs on two
// cores, and the norms, adds and ropes of a batch-64 decode step of a model
// of hidden size 256 (16 Ki elements, 10-30 µs each on one core) ran on the
// caller while the other core waited under the former bound of 32 Ki: with
// 4 Ki, those ops of a step took 0.49-0.61 ms instead of 0.70-1.03 (three
// alternating runs, two cores; 1 Ki measured about the same as 4 Ki).
const minRowElemsPerWorker = 1 << 11

// forRows runs fn over row ranges, in parallel from minRowElemsPerWorker
// elements a worker.
func (b *Backend) forRows(rows, width int, fn func(lo, hi int)) {
	if rows*width < minRowElemsPerWorker*b.threads || rows < 2 {
		if rows > 0 {
			fn(0, rows)
		}
		return
	}
	b.run.For(rows, fn)
}

// Embedding gathers rows of table by ids.
func (b *Backend) Embedding(out, table, ids kernels.Tensor) error {
	const op = "embedding"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	tb, err := asCPU(op, "table", table)
	if err != nil {
		return err
	}
	id, err := asCPU(op, "ids", ids)
	if err != nil {
		return err
	}
	vocab, hidden, t, err := kernels.EmbeddingShapes("cpu", o, tb, id)
	if err != nil {
		return err
	}
	for i, v := range id.i32 {
		if v < 0 || int(v) >= vocab {
			return fmt.Errorf("cpu: %s: ids[%d] = %d, vocabulary %d: %w", op, i, v, vocab, kernels.ErrOutOfRange)
		}
	}
	b.forRows(t, hidden, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst := o.f32[i*hidden : (i+1)*hidden]
			if tb.dtype == kernels.F32 {
				copy(dst, tb.f32[int(id.i32[i])*hidden:])
			} else {
				b.rowF32(tb, int(id.i32[i]), hidden, dst)
			}
		}
	})
	return nil
}

// rmsScale returns 1/sqrt(mean(x^2)+eps), accumulated in float64.
func rmsScale(x []float32, eps float32) float32 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return float32(1 / math.Sqrt(s/float64(len(x))+float64(eps)))
}

// rmsScale4 is rmsScale of four rows of one length at once: the four
// float64 sums run interleaved, each in its own row's order, so every
// result is rmsScale's bits while the adds of one row no longer wait for
// each other (a float64 add chain is bound by the add's latency: four
// chains run in about the time of one).
func rmsScale4(a, b, c, d []float32, eps float32) (float32, float32, float32, float32) {
	n := len(a)
	b, c, d = b[:n], c[:n], d[:n]
	var sa, sb, sc, sd float64
	for i, v := range a {
		sa += float64(v) * float64(v)
		sb += float64(b[i]) * float64(b[i])
		sc += float64(c[i]) * float64(c[i])
		sd += float64(d[i]) * float64(d[i])
	}
	f := func(s float64) float32 { return float32(1 / math.Sqrt(s/float64(n)+float64(eps))) }
	return f(sa), f(sb), f(sc), f(sd)
}

// normRows is RMSNorm over rows [lo, hi) of x (rows of n) into the same
// rows of dst (which may be x): each row's scale rmsScale (four rows at a
// time through rmsScale4, the same bits), then dst = (x * scale) * w, each
// product rounded, through the path's ScaleRows (simd), one call for four
// rows.
func (k *kernelSet) normRows(dst, x, w []float32, n, lo, hi int, eps float32) {
	var s [4]float32
	i := lo
	for ; i+4 <= hi; i += 4 {
		s[0], s[1], s[2], s[3] = rmsScale4(x[i*n:(i+1)*n], x[(i+1)*n:(i+2)*n], x[(i+2)*n:(i+3)*n], x[(i+3)*n:(i+4)*n], eps)
		k.scaleRows(dst[i*n:(i+4)*n], x[i*n:(i+4)*n], w, n, s, 4)
	}
	for ; i < hi; i++ {
		s[0] = rmsScale(x[i*n:(i+1)*n], eps)
		k.scaleRows(dst[i*n:(i+1)*n], x[i*n:(i+1)*n], w, n, s, 1)
	}
}

// normTensors converts the tensors of RMSNorm and AddRMSNorm.
func (b *Backend) normTensors(op string, out, x, weight kernels.Tensor) (o, xs, w *Tensor, err error) {
	if err = b.checkOpen(op); err != nil {
		return
	}
	if o, err = asCPU(op, "out", out); err != nil {
		return
	}
	if xs, err = asCPU(op, "x", x); err != nil {
		return
	}
	w, err = asCPU(op, "weight", weight)
	return
}

// RMSNorm normalizes each row of x into out.
func (b *Backend) RMSNorm(out, x, weight kernels.Tensor, eps float32) error {
	const op = "rms_norm"
	o, xs, w, err := b.normTensors(op, out, x, weight)
	if err != nil {
		return err
	}
	rows, n, err := kernels.NormShapes("cpu", op, o, xs, w)
	if err != nil {
		return err
	}
	b.forRows(rows, n, func(lo, hi int) {
		b.k.normRows(o.f32, xs.f32, w.f32, n, lo, hi, eps)
	})
	return nil
}

// AddRMSNorm adds x into residual and normalizes the sum into out.
func (b *Backend) AddRMSNorm(out, residual, x, weight kernels.Tensor, eps float32) error {
	const op = "add_rms_norm"
	o, xs, w, err := b.normTensors(op, out, x, weight)
	if err != nil {
		return err
	}
	r, err := asCPU(op, "residual", residual)
	if err != nil {
		return err
	}
	rows, n, err := kernels.AddNormShapes("cpu", o, r, xs, w)
	if err != nil {
		return err
	}
	b.forRows(rows, n, func(lo, hi int) {
		// residual += x as one vector op over the chunk's rows: 1 * x is
		// exact, so the fused multiply-add rounds the sum once, as +=.
		b.k.axpy(1, xs.f32[lo*n:hi*n], r.f32[lo*n:hi*n])
		b.k.normRows(o.f32, r.f32, w.f32, n, lo, hi, eps)
	})
	return nil
}

// SiLUMul computes silu(gate) * up from the fused [T, 2n] projection.
func (b *Backend) SiLUMul(out, gateUp kernels.Tensor) error {
	return b.gatedRows("silu_mul", out, gateUp, b.k.siluMulRow)
}

// gatedRows checks out [T, n] and the fused gateUp [T, 2n] and runs
// row(dst, gu) over each row (gu the row's gate then up halves), the rows
// split over the workers; op names errors.
func (b *Backend) gatedRows(op string, out, gateUp kernels.Tensor, row func(dst, gu []float32)) error {
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	g, err := asCPU(op, "gate_up", gateUp)
	if err != nil {
		return err
	}
	rows, n, err := kernels.SiLUMulShapes("cpu", o, g)
	if err != nil {
		return err
	}
	b.forRows(rows, 2*n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row(o.f32[i*n:(i+1)*n], g.f32[2*i*n:(2*i+2)*n])
		}
	})
	return nil
}

// siluMulRow sets dst = silu(gate) * up for one row gateUp of the fused
// projection (its gate half, then its up half): simd.Impl.SiLUMul, within
// a few ulp of the exact value, vectorized.
func (k *kernelSet) siluMulRow(dst, gateUp []float32) {
	n := len(dst)
	k.siluMul(dst, gateUp[:n], gateUp[n:2*n])
}

// Add computes out = a + b elementwise.
func (b *Backend) Add(out, x, y kernels.Tensor) error {
	const op = "add"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	a, err := asCPU(op, "a", x)
	if err != nil {
		return err
	}
	c, err := asCPU(op, "b", y)
	if err != nil {
		return err
	}
	n, err := kernels.AddShapes("cpu", o, a, c)
	if err != nil {
		return err
	}
	const chunk = 4096
	b.forRows((n+chunk-1)/chunk, chunk, func(lo, hi int) {
		s, e := lo*chunk, min(hi*chunk, n)
		dst, held, other := o.f32[s:e], a.f32[s:e], c.f32[s:e]
		// dst = a + b as one vector op (Axpy with a = 1: 1 * other is
		// exact, so the fused multiply-add rounds the sum once, as +), into
		// out holding one of the addends (out may be a or b).
		if &dst[0] == &other[0] {
			held, other = other, held
		} else if &dst[0] != &held[0] {
			copy(dst, held)
		}
		b.k.axpy(1, other, dst)
	})
	return nil
}

// Concat joins the rows of a and b.
func (b *Backend) Concat(out, x, y kernels.Tensor) error {
	const op = "concat"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	a, err := asCPU(op, "a", x)
	if err != nil {
		return err
	}
	c, err := asCPU(op, "b", y)
	if err != nil {
		return err
	}
	rows, m, n, err := kernels.ConcatShapes("cpu", o, a, c)
	if err != nil {
		return err
	}
	b.forRows(rows, m+n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(o.f32[i*(m+n):], a.f32[i*m:(i+1)*m])
			copy(o.f32[i*(m+n)+m:], c.f32[i*n:(i+1)*n])
		}
	})
	return nil
}

// SplitColumns copies the column blocks of x into parts (see kernels.Ops).
func (b *Backend) SplitColumns(x kernels.Tensor, parts ...kernels.Tensor) error {
	const op = "split_columns"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	xs, err := asCPU(op, "x", x)
	if err != nil {
		return err
	}
	ps := make([]*Tensor, len(parts))
	for i, p := range parts {
		if ps[i], err = asCPU(op, fmt.Sprintf("parts[%d]", i), p); err != nil {
			return err
		}
	}
	rows, width, err := kernels.SplitShapes("cpu", xs, parts)
	if err != nil {
		return err
	}
	b.forRows(rows, width, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			src := xs.f32[r*width : (r+1)*width]
			for _, p := range ps {
				w := p.shape[1]
				copy(p.f32[r*w:(r+1)*w], src[:w])
				src = src[w:]
			}
		}
	})
	return nil
}
