package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

var (
	_ kernels.QuantWeighter = (*Backend)(nil)
	_ kernels.BlockWeight   = (*Tensor)(nil)
)

// quantPath picks the kernels of a linear over block-quantized weights
// (enum di_quant_path): the library's choice, or one path forced (tests
// and benchmarks).
type quantPath int

const (
	quantAuto quantPath = C.DI_QUANT_AUTO
	quantGEMV quantPath = C.DI_QUANT_GEMV
	quantGEMM quantPath = C.DI_QUANT_GEMM
)

// quantFormat is the geometry of a block format: weights and bytes a
// block as stored, and whether the device layout moves the block's f16
// scale behind the row's blocks (deepinfer_cuda.h, di_quant_weight).
type quantFormat struct {
	block, bytes int
	dTail        bool
}

// quantFormats are the formats the kernels compute with (quant.cu).
var quantFormats = map[kernels.QuantType]quantFormat{
	kernels.QuantQ8_0: {32, 34, true},
	kernels.QuantQ4_0: {32, 18, true},
	kernels.QuantQ4_K: {256, 144, false},
	kernels.QuantQ5_K: {256, 176, false},
	kernels.QuantQ6_K: {256, 210, true},
}

// quantTypeList names the supported formats in errors.
var quantTypeList = []kernels.QuantType{kernels.QuantQ8_0, kernels.QuantQ4_0, kernels.QuantQ4_K, kernels.QuantQ5_K, kernels.QuantQ6_K}

// quantSeg is a run of matrix rows [lo, hi) of one format.
type quantSeg struct {
	lo, hi int
	typ    kernels.QuantType
}

// quantRows is the device form of a block-quantized weight: the tensor's
// buf holds every row's bytes (device layout), rows the table of U64 row
// descriptors (byte offset | format << 56, deepinfer_cuda.h). A view
// shares both buffers and starts rowOff entries into the table; segs are
// its rows' formats (view-relative), for the host's accounting.
type quantRows struct {
	rows   *buffer
	rowOff int
	segs   []quantSeg
}

// HasBlocks reports whether t is a block-quantized weight built by
// QuantWeight.
func (t *Tensor) HasBlocks() bool { return t != nil && t.q != nil }

// quantArg is the ABI's description of a block-quantized weight tensor: a
// weight (or view) of one format names it, so that the GEMV runs that
// format's kernel.
func (t *Tensor) quantArg() C.di_quant_weight {
	format := 0 // rows of several formats: the kernels read each row's
	if len(t.q.segs) == 1 {
		format = int(t.q.segs[0].typ)
	}
	return C.di_quant_weight{data: t.ptr(), rows: C.di_dptr(t.q.rows.ptr + 8*uint64(t.q.rowOff)), format: C.int(format)}
}

// QuantWeight implements kernels.QuantWeighter: every row's blocks are
// copied to the device as stored (Q8_0, Q4_0 and Q6_K with each block's f16
// scale moved behind the row's blocks, rows padded to 16 bytes, one table
// entry of 8 bytes a row; deepinfer_cuda.h's di_quant_weight), and the
// kernels widen them in registers (quant.cu): Linear, Logits and MoE
// compute from the blocks, Embedding and MLAAttention dequantize the rows
// they read, bit for bit as ggml does. Formats: Q8_0, Q4_0, Q4_K, Q5_K and
// Q6_K; parts of several formats may be fused. Errors as the CPU
// backend's: ErrShape for a shape, row count or byte count that does not
// match, ErrDType for another format. Cost: one pass over the bytes on the
// host (the rearrangement) and two uploads.
func (b *Backend) QuantWeight(w kernels.QuantWeight) (kernels.Tensor, error) {
	const op = "quant_weight"
	data, table, segs, err := packQuant(w)
	if err != nil {
		return nil, err
	}
	buf, err := b.uploadBuffer(op, data)
	if err != nil {
		return nil, err
	}
	rows, err := b.uploadBuffer(op, table)
	if err != nil {
		return nil, err
	}
	return &Tensor{shape: append([]int(nil), w.Shape...), dtype: kernels.Quant, buf: buf, q: &quantRows{rows: rows, segs: segs}}, nil
}

// packQuant checks w as the CPU backend's QuantWeight does and lays it out
// for the device: data the rows' bytes (device layout, each row padded to
// 16 bytes), table the rows' U64 descriptors, segs the runs of rows of one
// format.
func packQuant(w kernels.QuantWeight) (data, table []byte, segs []quantSeg, err error) {
	const op = "quant_weight"
	if len(w.Shape) < 2 || len(w.Shape) > 3 {
		return nil, nil, nil, fmt.Errorf("cuda: %s: shape %v, want [n, k] or [experts, n, k]: %w", op, w.Shape, kernels.ErrShape)
	}
	n, err := kernels.AllocShapes("cuda", kernels.F32, w.Shape)
	if err != nil {
		return nil, nil, nil, err
	}
	k := w.Shape[len(w.Shape)-1]
	rows := 0
	if k > 0 {
		rows = n / k
	}
	size, total := 0, 0
	for i, p := range w.Parts {
		f, ok := quantFormats[p.Type]
		if !ok {
			return nil, nil, nil, fmt.Errorf("cuda: %s: part %d is %v (supported: %v): %w", op, i, p.Type, quantTypeList, kernels.ErrDType)
		}
		if k%f.block != 0 {
			return nil, nil, nil, fmt.Errorf("cuda: %s: part %d: %v row of %d weights is not a whole number of %d-weight blocks: %w",
				op, i, p.Type, k, f.block, kernels.ErrShape)
		}
		rb := k / f.block * f.bytes
		if p.Rows < 0 || len(p.Data) != p.Rows*rb {
			return nil, nil, nil, fmt.Errorf("cuda: %s: part %d: %d bytes for %d %v rows of %d weights, want %d: %w",
				op, i, len(p.Data), p.Rows, p.Type, k, p.Rows*rb, kernels.ErrShape)
		}
		size += p.Rows * ((rb + 15) &^ 15)
		total += p.Rows
	}
	if total != rows {
		return nil, nil, nil, fmt.Errorf("cuda: %s: parts hold %d rows, shape %v has %d: %w", op, total, w.Shape, rows, kernels.ErrShape)
	}
	data, table = make([]byte, size), make([]byte, 8*rows)
	off, lo := 0, 0
	for _, p := range w.Parts {
		f := quantFormats[p.Type]
		nb := k / f.block
		rb := nb * f.bytes
		for r := range p.Rows {
			quantRepack(data[off:off+rb], p.Data[r*rb:(r+1)*rb], f, nb)
			putU64(table[8*(lo+r):], uint64(off)|uint64(p.Type)<<56)
			off += (rb + 15) &^ 15
		}
		if s := len(segs); s > 0 && segs[s-1].typ == p.Type {
			segs[s-1].hi += p.Rows
		} else if p.Rows > 0 {
			segs = append(segs, quantSeg{lo: lo, hi: lo + p.Rows, typ: p.Type})
		}
		lo += p.Rows
	}
	return data, table, segs, nil
}

// quantRepack writes one row of nb blocks of format f (src, as stored)
// into dst in the device layout: the blocks as stored, or, for the formats
// with a tail of scales, each block without its f16 d followed by the
// row's d values in block order.
func quantRepack(dst, src []byte, f quantFormat, nb int) {
	if !f.dTail {
		copy(dst, src)
		return
	}
	body := f.bytes - 2
	dAt := 0 // the offset of d in a stored block: first (Q8_0, Q4_0) or last (Q6_K)
	if f.block == 256 {
		dAt = body
	}
	for i := range nb {
		blk := src[i*f.bytes : (i+1)*f.bytes]
		if dAt == 0 {
			copy(dst[i*body:], blk[2:])
		} else {
			copy(dst[i*body:], blk[:body])
		}
		copy(dst[nb*body+2*i:], blk[dAt:dAt+2])
	}
}

// putU64 writes v little-endian.
func putU64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

// qRows is the view of matrix rows [lo, hi) of a block-quantized weight,
// shaped shape.
func (t *Tensor) qRows(lo, hi int, shape []int) *Tensor {
	v := &quantRows{rows: t.q.rows, rowOff: t.q.rowOff + lo}
	for _, s := range t.q.segs {
		if a, z := max(lo, s.lo), min(hi, s.hi); a < z {
			v.segs = append(v.segs, quantSeg{lo: a - lo, hi: z - lo, typ: s.typ})
		}
	}
	return &Tensor{shape: shape, dtype: kernels.Quant, buf: t.buf, off: t.off, q: v}
}

// quantBytes is the number of bytes the kernels read for the weight's
// blocks (as stored; the benchmarks' bandwidth figures count these).
func (t *Tensor) quantBytes() int {
	k := t.shape[len(t.shape)-1]
	total := 0
	for _, s := range t.q.segs {
		f := quantFormats[s.typ]
		total += (s.hi - s.lo) * (k / f.block * f.bytes)
	}
	return total
}

// quantLinear is Linear over a block-quantized weight (float32 x): the
// GEMV up to 2 rows, the dequantizing GEMM above (quant.cu), unless path
// forces one.
func (b *Backend) quantLinear(name string, o, xs, ws, bs *Tensor, m, n, k int, path quantPath) error {
	if xs.dtype != kernels.F32 {
		return fmt.Errorf("cuda: linear: x of dtype %s with block-quantized weights: want F32: %w", xs.dtype, kernels.ErrDType)
	}
	wa := ws.quantArg()
	return b.launch(name, func() C.int {
		return C.c_quant_linear(b.lib.api, b.ctx, o.ptr(), xs.ptr(), &wa, optPtr(bs), C.int(m), C.int(n), C.int(k), C.int(path))
	}, o, xs, ws, bs)
}

// linearQuantPath is Linear over a block-quantized weight with the path
// forced (tests and benchmarks compare the GEMV and the GEMM on the same
// rows).
func (b *Backend) linearQuantPath(out, x, w, bias kernels.Tensor, path quantPath) error {
	o, xs, ws, bs, m, n, k, err := linearArgs(out, x, w, bias, kernels.F32)
	if err != nil {
		return err
	}
	if ws.q == nil {
		return fmt.Errorf("cuda: linear: weight of dtype %s is not block-quantized: %w", ws.dtype, kernels.ErrDType)
	}
	return b.quantLinear("linear", o, xs, ws, bs, m, n, k, path)
}

// quantLogits is Logits with a block-quantized head: di_api.quant_logits.
func (b *Backend) quantLogits(o, h, rs, nw, hw *Tensor, t, r, dim, vocab int, eps float32) error {
	ha := hw.quantArg()
	return b.launch("logits", func() C.int {
		return C.c_quant_logits(b.lib.api, b.ctx, o.ptr(), h.ptr(), optPtr(rs), C.int(r), C.int(t), optPtr(nw), &ha, C.int(dim),
			C.int(vocab), C.float(eps))
	}, o, h, rs, nw, hw)
}

// quantEmbedding is Embedding from a block-quantized table: the rows
// dequantized bit for bit as ggml does.
func (b *Backend) quantEmbedding(o, tb, id *Tensor, t, hidden, vocab int) error {
	ta := tb.quantArg()
	return b.launch("embedding", func() C.int {
		return C.c_quant_embedding(b.lib.api, b.ctx, o.ptr(), &ta, id.ptr(), C.int(t), C.int(hidden), C.int(vocab))
	}, o, tb, id)
}

// quantMoE is MoE over block-quantized experts (both projections): see
// di_api.quant_moe.
func (b *Backend) quantMoE(o, xs, is, ws, gu, dn, add *Tensor, d kernels.MoEDims) error {
	if gu.q == nil || dn.q == nil {
		return fmt.Errorf("cuda: moe: gate_up %s and down %s: both or neither block-quantized: %w", gu.dtype, dn.dtype, ErrUnsupported)
	}
	ga, da := gu.quantArg(), dn.quantArg()
	return b.launch("moe", b.moeAdding(o, add, func() C.int {
		return C.c_quant_moe(b.lib.api, b.ctx, o.ptr(), xs.ptr(), is.ptr(), ws.ptr(), &ga, &da, C.int(d.T), C.int(d.TopK),
			C.int(d.Hidden), C.int(d.Inter), C.int(d.NumExperts))
	}), o, xs, is, ws, gu, dn, add)
}

// quantDequant returns w's values as a new F32 tensor of w's shape, bit for
// bit as ggml dequantizes them (MLA's wkvb, which its kernels read as
// float32). Cost: 4 bytes a weight written and the allocation.
func (b *Backend) quantDequant(w *Tensor) (*Tensor, error) {
	d, err := b.Alloc(kernels.F32, w.shape...)
	if err != nil {
		return nil, err
	}
	out := d.(*Tensor)
	k := w.shape[len(w.shape)-1]
	rows := 0
	if k > 0 {
		rows = w.numel() / k
	}
	wa := w.quantArg()
	return out, b.launch("quant_dequant", func() C.int {
		return C.c_quant_dequant(b.lib.api, b.ctx, out.ptr(), C.int(kernels.F32), &wa, C.int(rows), C.int(k))
	}, out, w)
}
