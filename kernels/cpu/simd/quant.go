package simd

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// QuantType is a block-quantized weight format of llama.cpp (ggml), numbered
// as ggml numbers it (enum ggml_type), so a GGUF tensor type converts
// directly. A row of k weights is k/BlockSize() blocks of BlockBytes()
// bytes, laid out as ggml-common.h defines them (little-endian halves):
//
//	Q8_0 (34 bytes / 32):  d f16 | qs int8[32]                  w = d*q
//	Q4_0 (18 bytes / 32):  d f16 | qs[16] (lo nibbles: 0..15,   w = d*(q-8)
//	                                       hi nibbles: 16..31)
//	Q4_K (144 bytes / 256): d, dmin f16 | scales[12] | qs[128]  w = d*sc*q - dmin*m
//	Q5_K (176 bytes / 256): d, dmin f16 | scales[12] | qh[32] | qs[128]
//	Q6_K (210 bytes / 256): ql[128] | qh[64] | scales int8[16] | d f16
//	                                                            w = d*sc*(q-32)
//
// with 6-bit scales sc and mins m of the eight 32-weight sub-blocks of
// Q4_K/Q5_K packed in 12 bytes, and sixteen 16-weight sub-blocks in Q6_K.
type QuantType uint8

const (
	QuantQ4_0 QuantType = 2
	QuantQ8_0 QuantType = 8
	QuantQ4_K QuantType = 12
	QuantQ5_K QuantType = 13
	QuantQ6_K QuantType = 14
)

// QuantTypes lists the formats this package computes with.
var QuantTypes = []QuantType{QuantQ8_0, QuantQ4_0, QuantQ4_K, QuantQ5_K, QuantQ6_K}

func (t QuantType) String() string {
	switch t {
	case QuantQ4_0:
		return "Q4_0"
	case QuantQ8_0:
		return "Q8_0"
	case QuantQ4_K:
		return "Q4_K"
	case QuantQ5_K:
		return "Q5_K"
	case QuantQ6_K:
		return "Q6_K"
	}
	return fmt.Sprintf("QuantType(%d)", uint8(t))
}

// BlockSize is the number of weights in one block; 0 for an unknown type.
func (t QuantType) BlockSize() int {
	switch t {
	case QuantQ4_0, QuantQ8_0:
		return 32
	case QuantQ4_K, QuantQ5_K, QuantQ6_K:
		return 256
	}
	return 0
}

// BlockBytes is the size of one block in bytes; 0 for an unknown type.
func (t QuantType) BlockBytes() int {
	switch t {
	case QuantQ4_0:
		return 18
	case QuantQ8_0:
		return 34
	case QuantQ4_K:
		return 144
	case QuantQ5_K:
		return 176
	case QuantQ6_K:
		return 210
	}
	return 0
}

// RowBytes is the size of a row of k weights, or an error when the type is
// unknown or k is not a whole number of blocks.
func (t QuantType) RowBytes(k int) (int, error) {
	bs := t.BlockSize()
	if bs == 0 {
		return 0, fmt.Errorf("simd: unknown quantized type %d", uint8(t))
	}
	if k < 0 || k%bs != 0 {
		return 0, fmt.Errorf("simd: %s row of %d weights is not a whole number of %d-weight blocks", t, k, bs)
	}
	return k / bs * t.BlockBytes(), nil
}

// Dequantize writes the weights of the whole blocks in src into
// dst[:len(src)/BlockBytes()*BlockSize()], bit for bit as llama.cpp's
// dequantize_row_* (each weight is exact in float32 except Q4_K/Q5_K's
// d*sc*q - dmin*m, rounded once). It panics on an unknown type, a partial
// block or a short dst. Cost: one pass over src.
func (t QuantType) Dequantize(dst []float32, src []byte) {
	bb := t.BlockBytes()
	if bb == 0 || len(src)%bb != 0 {
		panic(fmt.Sprintf("simd: Dequantize %s: %d bytes is not a whole number of blocks", t, len(src)))
	}
	bs := t.BlockSize()
	nb := len(src) / bb
	if len(dst) < nb*bs {
		panic(fmt.Sprintf("simd: Dequantize %s: len(dst)=%d < %d", t, len(dst), nb*bs))
	}
	for b := range nb {
		blk, y := src[b*bb:(b+1)*bb], dst[b*bs:(b+1)*bs]
		switch t {
		case QuantQ8_0:
			dequantQ8_0(y, blk)
		case QuantQ4_0:
			dequantQ4_0(y, blk)
		case QuantQ4_K:
			dequantQ4K(y, blk)
		case QuantQ5_K:
			dequantQ5K(y, blk)
		case QuantQ6_K:
			dequantQ6K(y, blk)
		}
	}
}

func half(b []byte) float32 { return f16ToF32(binary.LittleEndian.Uint16(b)) }

func dequantQ8_0(y []float32, b []byte) {
	d := half(b)
	for j, q := range b[2:34] {
		y[j] = float32(int8(q)) * d
	}
}

func dequantQ4_0(y []float32, b []byte) {
	d := half(b)
	for j, q := range b[2:18] {
		y[j] = float32(int(q&0xf)-8) * d
		y[j+16] = float32(int(q>>4)-8) * d
	}
}

// scaleMinK4 unpacks the 6-bit scale and min of sub-block j (0..7) of a
// Q4_K/Q5_K block from its 12 packed bytes (get_scale_min_k4).
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

func dequantQ4K(y []float32, b []byte) {
	d, dmin := half(b), half(b[2:])
	scales, qs := b[4:16], b[16:144]
	for c := range 4 {
		sc1, m1 := scaleMinK4(2*c, scales)
		sc2, m2 := scaleMinK4(2*c+1, scales)
		d1, mm1 := d*float32(sc1), dmin*float32(m1)
		d2, mm2 := d*float32(sc2), dmin*float32(m2)
		q := qs[32*c : 32*c+32]
		for l := range 32 {
			y[64*c+l] = d1*float32(q[l]&0xf) - mm1
			y[64*c+32+l] = d2*float32(q[l]>>4) - mm2
		}
	}
}

func dequantQ5K(y []float32, b []byte) {
	d, dmin := half(b), half(b[2:])
	scales, qh, qs := b[4:16], b[16:48], b[48:176]
	for c := range 4 {
		sc1, m1 := scaleMinK4(2*c, scales)
		sc2, m2 := scaleMinK4(2*c+1, scales)
		d1, mm1 := d*float32(sc1), dmin*float32(m1)
		d2, mm2 := d*float32(sc2), dmin*float32(m2)
		u1, u2 := byte(1)<<(2*c), byte(2)<<(2*c)
		q := qs[32*c : 32*c+32]
		for l := range 32 {
			lo, hi := q[l]&0xf, q[l]>>4
			if qh[l]&u1 != 0 {
				lo += 16
			}
			if qh[l]&u2 != 0 {
				hi += 16
			}
			y[64*c+l] = d1*float32(lo) - mm1
			y[64*c+32+l] = d2*float32(hi) - mm2
		}
	}
}

func dequantQ6K(y []float32, b []byte) {
	d := half(b[208:])
	for n := range 2 {
		ql, qh, sc := b[64*n:64*n+64], b[128+32*n:128+32*n+32], b[192+8*n:192+8*n+8]
		yy := y[128*n : 128*n+128]
		for l := range 32 {
			is := l / 16
			q1 := int(ql[l]&0xf|(qh[l]>>0&3)<<4) - 32
			q2 := int(ql[l+32]&0xf|(qh[l]>>2&3)<<4) - 32
			q3 := int(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
			q4 := int(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
			yy[l] = d * float32(int8(sc[is])) * float32(q1)
			yy[l+32] = d * float32(int8(sc[is+2])) * float32(q2)
			yy[l+64] = d * float32(int8(sc[is+4])) * float32(q3)
			yy[l+96] = d * float32(int8(sc[is+6])) * float32(q4)
		}
	}
}

// LinearQuant is LinearF32 with w a [n][k] matrix of quantized rows (each
// row RowBytes(k) bytes, row j at j*RowBytes(k)). Each weight is
// dequantized exactly as Dequantize gives it and the products are reduced
// in the canonical order, so the result is bit for bit LinearF32 over the
// dequantized float32 matrix: batch invariant, the same on every Impl, and
// independent of the column range. The activations stay float32: llama.cpp
// instead rounds x to 8-bit blocks (Q8_0 or Q8_K) and sums integer
// products, so its results differ from these by about that rounding
// (relative 2^-8 per activation), while these stay within float32 rounding
// of the exact product with the stored weights.
// It panics on an unknown type, a k that is not a whole number of blocks,
// or slices too short for the shape.
//
// Cost: 2*m*(j1-j0)*k flops plus the dequantization. Below QuantTileRows
// rows of x (decode), the weights are dequantized in registers: w streams
// from memory once per four rows of x, RowBytes(k)*(j1-j0) bytes for one
// row. From QuantTileRows rows on (prefill), the SIMD paths dequantize a
// tile of weight rows at a time into a float32 scratch sized like one
// column block of LinearF32 (about 384 KiB, kept in L2) and run LinearF32's
// blocked GEMM on it: each weight is dequantized once per call and the
// product runs at the F32 GEMM's speed. Both give the same bits (LinearF32's
// elements do not depend on its column range or on m).
func (p *Impl) LinearQuant(out, x []float32, w []byte, t QuantType, m, n, k, j0, j1 int) {
	rb, err := t.RowBytes(k)
	if err != nil {
		panic(err.Error())
	}
	checkLinear("LinearQuant "+t.String(), len(out), len(x), n*k, m, n, k, j0, j1)
	if len(w) < n*rb {
		panic(fmt.Sprintf("simd: LinearQuant %s: len(w)=%d < %d rows of %d bytes", t, len(w), n, rb))
	}
	if m == 0 || j0 == j1 {
		return
	}
	if m >= QuantTileRows && k > 0 && nativeDequant[p.name] != nil {
		p.linearQuantTiled(out, x, w, t, rb, m, n, k, j0, j1)
		return
	}
	p.linearQuantRows(out, x, w, t, rb, m, n, k, j0, j1)
}

// QuantTileRows is the number of rows of x from which LinearQuant
// dequantizes tiles of w and runs the float32 GEMM on them instead of
// dequantizing in registers (the register path dequantizes once per four
// rows, so from five rows on it would dequantize every weight twice or
// more). The result does not depend on it.
const QuantTileRows = 5

// quantTileBytes is the size of a dequantized tile: LinearF32's column
// block (L2_BLOCK_BYTES of the C kernels), so that one tile is one block.
const quantTileBytes = 384 << 10

// quantTileCols is the number of weight rows of one tile for rows of k
// weights: a multiple of 16 (the kernels' column tiles), at least 16.
func quantTileCols(k int) int {
	return max(16, quantTileBytes/(4*max(k, 1))/16*16)
}

// linearQuantRows is the register path of LinearQuant (arguments checked).
func (p *Impl) linearQuantRows(out, x []float32, w []byte, t QuantType, rb, m, n, k, j0, j1 int) {
	if f := nativeQuant[p.name]; f != nil && k > 0 {
		f(out, x, w, t, m, n, k, j0, j1)
		return
	}
	linearGo(out, x, m, n, k, j0, j1, func(buf []float32, j int) {
		t.Dequantize(buf, w[j*rb:(j+1)*rb])
	})
}

// quantScratch holds the tiles of linearQuantTiled, one per concurrent
// call (a worker of the caller's pool), reused across calls.
var quantScratch sync.Pool

// linearQuantTiled is the tiled path of LinearQuant (arguments checked):
// for each tile of weight rows [c0, c1), dequantize them once and run
// LinearF32 for columns [c0, c1) of out. LinearF32 is given out from column
// c0 on (row stride n) and the tile as a matrix of c1-c0 rows, so it writes
// exactly out[i*n+j], j in [c0, c1), each the canonical dot product of x's
// row i with the dequantized row j.
func (p *Impl) linearQuantTiled(out, x []float32, w []byte, t QuantType, rb, m, n, k, j0, j1 int) {
	dequant := nativeDequant[p.name]
	if dequant == nil {
		dequant = func(dst []float32, w []byte, t QuantType) { t.Dequantize(dst, w) }
	}
	cols := min(quantTileCols(k), j1-j0)
	var buf []float32
	if v, ok := quantScratch.Get().(*[]float32); ok && cap(*v) >= cols*k {
		buf = (*v)[:cols*k]
	} else {
		buf = make([]float32, max(cols*k, quantTileBytes/4))[:cols*k]
	}
	for c0 := j0; c0 < j1; c0 += cols {
		c1 := min(c0+cols, j1)
		tile := buf[:(c1-c0)*k]
		dequant(tile, w[c0*rb:c1*rb], t)
		// out[c0:] is long enough: its last element written is
		// (m-1)*n + c1-1-c0 < m*n - c0.
		p.linearF32(out[c0:], x, tile, m, n, k, 0, c1-c0)
	}
	quantScratch.Put(&buf)
}

// LinearQuant runs Default().LinearQuant.
func LinearQuant(out, x []float32, w []byte, t QuantType, m, n, k, j0, j1 int) {
	defaultImpl.LinearQuant(out, x, w, t, m, n, k, j0, j1)
}

// nativeQuant holds the SIMD paths of LinearQuant by Impl name, and
// nativeDequant their Dequantize (whole blocks, same bits); set by the
// amd64 cgo build.
var (
	nativeQuant   = map[string]func(out, x []float32, w []byte, t QuantType, m, n, k, j0, j1 int){}
	nativeDequant = map[string]func(dst []float32, w []byte, t QuantType){}
)
