package simd

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Matrix products as llama.cpp's CPU backend computes them (the scalar
// "generic" paths of ggml-cpu): the activations are rounded to the type
// the weight format multiplies with (its vec_dot_type) before the dot
// products, instead of staying float32 as in LinearQuant and LinearBF16.
//
//	weights     activations rounded to          dot product
//	Q8_0, Q4_0  Q8_0 blocks (quantize_row_q8_0_ref)   ggml_vec_dot_q{8,4}_0_q8_0
//	K-quants    Q8_K blocks (quantize_row_q8_K_ref)   ggml_vec_dot_q{4,5,6}_K_q8_K
//	BF16        bfloat16, nearest even               ggml_vec_dot_bf16
//	F16         IEEE half, nearest even              ggml_vec_dot_f16
//
// The block dot products sum integer products exactly and apply the
// scales with float32 operations: Q8_0 and Q4_0 in the C code's order,
// with the fused multiply-adds that the C compiler contracts them into in
// llama.cpp's shipped x86 CPU libraries (their *_generic functions give
// these bits); the K-quants once per block, to the block's integer sum,
// where the generic code applies them to eight lane sums (dotKQ8K). BF16
// and F16 products are exact in float32 and are summed in float64,
// rounded to float32 once. Every output depends only on its own
// activation row and weight row, so these are batch invariant. The SIMD
// paths of LinearQuantLlama and Linear16Llama keep these bits: they form
// the exact integer sums of a block with vector instructions and apply the
// scales (or add the 16-bit products) per output in this order, their
// vector lanes holding different outputs. llama.cpp's own SIMD dot
// products sum the same integers but apply the scales in another order (a
// few float32 ulps apart, more where a sum cancels).
//
// A Q8_K block (Q8KBlockBytes bytes) is laid out as ggml's block_q8_K:
// d float32 | qs int8[256] | bsums int16[16] (sums of 16 qs each).

// Q8KBlockBytes is the size of one Q8_K block of 256 activations.
const Q8KBlockBytes = 4 + 256 + 2*16

// ActRowBytes is the size of a row of k activations quantized for weights
// of type t (Q8_0 blocks for Q8_0 and Q4_0, Q8_K blocks for K-quants), or
// an error when t is unknown or k not a whole number of t's blocks.
func ActRowBytes(t QuantType, k int) (int, error) {
	if _, err := t.RowBytes(k); err != nil {
		return 0, err
	}
	if t.BlockSize() == 256 {
		return k / 256 * Q8KBlockBytes, nil
	}
	return k / 32 * QuantQ8_0.BlockBytes(), nil
}

// QuantizeActs writes m rows of k activations x, each quantized as
// llama.cpp quantizes the activations it multiplies with weights of type t
// (quantize_row_q8_0_ref or quantize_row_q8_K_ref, bit for bit), into dst
// at ActRowBytes(t, k) bytes a row, returning the bytes written, on the
// default Impl's path (see Impl.QuantizeActs). It panics on an unknown
// type, a k that is not a whole number of blocks, or short slices. Cost: a
// few flops per activation.
func QuantizeActs(dst []byte, x []float32, t QuantType, m, k int) int {
	return defaultImpl.QuantizeActs(dst, x, t, m, k)
}

// QuantizeActs is the package-level QuantizeActs on p's SIMD path where it
// has one (the same bytes on every path), so that a backend pinned to one
// instruction set (cpu.simd: avx2) runs none of another's.
func (p *Impl) QuantizeActs(dst []byte, x []float32, t QuantType, m, k int) int {
	rb, err := ActRowBytes(t, k)
	if err != nil {
		panic(err.Error())
	}
	if m < 0 || len(x) < m*k || len(dst) < m*rb {
		panic(fmt.Sprintf("simd: QuantizeActs %s: %d rows of %d: len(x)=%d, len(dst)=%d, want %d and %d",
			t, m, k, len(x), len(dst), m*k, m*rb))
	}
	for i := range m {
		row := x[i*k : (i+1)*k]
		if t.BlockSize() == 256 {
			quantizeQ8KOn(p.name, dst[i*rb:(i+1)*rb], row)
		} else {
			quantizeQ8_0Acts(p.name, dst[i*rb:(i+1)*rb], row)
		}
	}
	return m * rb
}

// QuantizeQ8K writes src (a whole number of 256-value blocks) into dst as
// Q8_K blocks, bit for bit as llama.cpp's quantize_row_q8_K_ref: per block
// the value of largest magnitude max (the first one on ties) gives
// iscale = -127/max, q = min(127, nearest(iscale*x)), d = 1/iscale; an
// all-zero block is d = 0 and zeros. It returns the bytes written and
// panics on a partial block or a short dst. Cost: two passes over src; on
// amd64 with cgo the default Impl's SIMD path (the same bytes, NaNs and
// infinities included) takes about 0.25 ns a value on a Zen 5 core, the
// Go loop 2.4 (BenchmarkQuantizeQ8K).
func QuantizeQ8K(dst []byte, src []float32) int { return quantizeQ8KOn(defaultImpl.name, dst, src) }

// quantizeQ8KOn is QuantizeQ8K on the SIMD path of the Impl named impl,
// where it has one.
func quantizeQ8KOn(impl string, dst []byte, src []float32) int {
	if len(src)%256 != 0 {
		panic(fmt.Sprintf("simd: QuantizeQ8K: %d values is not a whole number of 256-value blocks", len(src)))
	}
	nb := len(src) / 256
	if len(dst) < nb*Q8KBlockBytes {
		panic(fmt.Sprintf("simd: QuantizeQ8K: len(dst)=%d < %d", len(dst), nb*Q8KBlockBytes))
	}
	if f := nativeQuantizeQ8K[impl]; f != nil && nb > 0 {
		f(dst, src)
		return nb * Q8KBlockBytes
	}
	return quantizeQ8KGo(dst, src)
}

// quantizeQ8_0Acts writes src (whole 32-value blocks) into dst as Q8_0
// blocks, bit for bit as QuantQ8_0.Quantize (quantize_row_q8_0_ref), on
// the SIMD path of the Impl named impl where it has one: that path stops at a
// block holding a NaN or an infinity, or whose scale is so small that its
// inverse overflows, which the Go code quantizes, and resumes after it. Cost on an Intel Xeon core (BenchmarkQuantizeQ8_0):
// about 0.6-0.9 ns a value on the SIMD paths, 6 for the Go loop.
func quantizeQ8_0Acts(impl string, dst []byte, src []float32) {
	if f := nativeQuantizeQ8_0[impl]; f != nil {
		quantizeQ8_0With(f, dst, src)
		return
	}
	QuantQ8_0.Quantize(dst, src)
}

// quantizeQ8_0With is quantizeQ8_0Acts on the SIMD path f (an entry of
// nativeQuantizeQ8_0).
func quantizeQ8_0With(f func(dst []byte, src []float32) int, dst []byte, src []float32) {
	const bs, bb = 32, 34
	for b, nb := 0, len(src)/bs; b < nb; b++ {
		b += f(dst[b*bb:], src[b*bs:])
		if b < nb {
			quantQ8_0(dst[b*bb:(b+1)*bb], src[b*bs:(b+1)*bs])
		}
	}
}

// nativeQuantizeQ8_0 holds the SIMD paths of quantizeQ8_0Acts by Impl
// name: each quantizes the whole blocks of src into dst up to the first
// block with a NaN, an infinity or an overflowing inverse scale and
// returns how many it wrote; set by
// the amd64 cgo build.
var nativeQuantizeQ8_0 = map[string]func(dst []byte, src []float32) int{}

// nativeQuantizeQ8K holds the SIMD paths of QuantizeQ8K by Impl name:
// whole blocks, lengths checked by the caller; set by the amd64 cgo build.
var nativeQuantizeQ8K = map[string]func(dst []byte, src []float32){}

// quantizeQ8KGo is QuantizeQ8K in Go, the reference of the SIMD paths.
func quantizeQ8KGo(dst []byte, src []float32) int {
	nb := len(src) / 256
	for b := range nb {
		x, y := src[b*256:(b+1)*256], dst[b*Q8KBlockBytes:(b+1)*Q8KBlockBytes]
		var mx, amax float32
		for _, v := range x {
			if ax := abs32(v); ax > amax {
				amax, mx = ax, v
			}
		}
		if amax == 0 {
			clear(y)
			continue
		}
		iscale := -127 / mx
		qs := y[4:260]
		for j, v := range x {
			// The conversion keeps the product rounded (never fused
			// into the add of nearestInt).
			q := nearestInt(float32(iscale * v))
			qs[j] = byte(int8(min(127, q)))
		}
		for j := range 16 {
			s := 0
			for _, q := range qs[16*j : 16*j+16] {
				s += int(int8(q))
			}
			binary.LittleEndian.PutUint16(y[260+2*j:], uint16(int16(s)))
		}
		binary.LittleEndian.PutUint32(y, math.Float32bits(1/iscale))
	}
	return nb * Q8KBlockBytes
}

// VecDotLlama is the block dot product of a weight row w (k weights of
// type t, RowBytes(k) bytes) with an activation row a quantized for t by
// QuantizeActs (ActRowBytes(t, k) bytes): llama.cpp's generic
// ggml_vec_dot_q8_0_q8_0 and _q4_0_q8_0 bit for bit; for Q4_K, Q5_K and
// Q6_K the generic functions' integers with the scales applied once per
// block (dotKQ8K). It panics on an unknown type, a partial block or short
// slices.
func VecDotLlama(t QuantType, k int, w, a []byte) float32 {
	rb, err := t.RowBytes(k)
	if err != nil {
		panic(err.Error())
	}
	ab, _ := ActRowBytes(t, k)
	if len(w) < rb || len(a) < ab {
		panic(fmt.Sprintf("simd: VecDotLlama %s: len(w)=%d, len(a)=%d, want %d and %d", t, len(w), len(a), rb, ab))
	}
	return vecDotLlama(t, k/t.BlockSize(), w, a)
}

func vecDotLlama(t QuantType, nb int, w, a []byte) float32 {
	switch t {
	case QuantQ8_0:
		return dotQ8_0Q8_0(nb, w, a)
	case QuantQ4_0:
		return dotQ4_0Q8_0(nb, w, a)
	case QuantQ4_K, QuantQ5_K, QuantQ6_K:
		return dotKQ8K(t, nb, w, a)
	}
	panic(fmt.Sprintf("simd: unknown quantized type %d", uint8(t)))
}

// dotQ8_0Q8_0: sumf += sumi*(dw*da) per block.
func dotQ8_0Q8_0(nb int, w, a []byte) float32 {
	var sumf float32
	for b := range nb {
		wb, ab := w[34*b:34*b+34], a[34*b:34*b+34]
		sumi := int32(0)
		for j := 2; j < 34; j++ {
			sumi += int32(int8(wb[j])) * int32(int8(ab[j]))
		}
		d := float32(half(wb) * half(ab))
		sumf = fma32(float32(sumi), d, sumf)
	}
	return sumf
}

// dotQ4_0Q8_0: sumf += sumi*dw*da per block (left to right).
func dotQ4_0Q8_0(nb int, w, a []byte) float32 {
	var sumf float32
	for b := range nb {
		wb, ab := w[18*b:18*b+18], a[34*b:34*b+34]
		var s0, s1 int32
		for j := range 16 {
			q := wb[2+j]
			s0 += (int32(q&0xf) - 8) * int32(int8(ab[2+j]))
			s1 += (int32(q>>4) - 8) * int32(int8(ab[18+j]))
		}
		sumf = fma32(float32(float32(s0+s1)*half(wb)), half(ab), sumf)
	}
	return sumf
}

// dotKQ8K is the K-quant dot product, one float step per 256-weight
// block: the block's exact integer sum isum = sum_j s_j * sum_{i in j}
// q_i*a_i over its sub-blocks j (the generic code's integers, summed over
// its eight lanes l), then sumf = fma(dw*da, float(isum), sumf) and, for
// Q4_K/Q5_K, sumf = fma(-(dmin*da), float(sum(bsums*mins)), sumf).
// llama.cpp's generic code applies dw*da to eight lane sums aux[l] (l =
// the index mod 8) and adds the lanes at the end, and its SIMD code to
// eight lanes of its own: one conversion and multiply-add per block
// instead of eight is what lets the engine's vector kernels hold one
// output per lane (see quant_llama.h); the results are a few float32
// ulps from either.
func dotKQ8K(t QuantType, nb int, w, a []byte) float32 {
	bb := t.BlockBytes()
	var sumf float32
	var q [256]int8
	var sc [16]int32 // scale of each 16-weight group
	for b := range nb {
		wb, ab := w[bb*b:bb*(b+1)], a[Q8KBlockBytes*b:Q8KBlockBytes*(b+1)]
		da := math.Float32frombits(binary.LittleEndian.Uint32(ab))
		qa := ab[4:260]
		var dw, dmin float32
		sumi := int32(0)
		switch t {
		case QuantQ4_K, QuantQ5_K:
			dw, dmin = half(wb), half(wb[2:])
			scales := wb[4:16]
			for j := range 8 {
				s, m := scaleMinK4(j, scales)
				sc[2*j], sc[2*j+1] = int32(s), int32(s)
				bs0 := int32(int16(binary.LittleEndian.Uint16(ab[260+4*j:])))
				bs1 := int32(int16(binary.LittleEndian.Uint16(ab[262+4*j:])))
				sumi += bs0*int32(m) + bs1*int32(m)
			}
			if t == QuantQ4_K {
				unpackQ4K(&q, wb[16:144])
			} else {
				unpackQ5K(&q, wb[16:48], wb[48:176])
			}
		case QuantQ6_K:
			dw = half(wb[208:])
			for j := range 16 {
				sc[j] = int32(int8(wb[192+j]))
			}
			unpackQ6K(&q, wb)
		}
		isum := int32(0)
		for g := range 16 {
			t := int32(0)
			for i := 16 * g; i < 16*g+16; i++ {
				t += int32(q[i]) * int32(int8(qa[i]))
			}
			isum += sc[g] * t
		}
		sumf = fma32(float32(dw*da), float32(isum), sumf)
		if t != QuantQ6_K {
			sumf = fma32(-float32(dmin*da), float32(sumi), sumf)
		}
	}
	return sumf
}

// unpackQ4K writes the 256 4-bit weights of a Q4_K block in order.
func unpackQ4K(q *[256]int8, qs []byte) {
	for c := range 4 {
		for l := range 32 {
			v := qs[32*c+l]
			q[64*c+l] = int8(v & 0xf)
			q[64*c+32+l] = int8(v >> 4)
		}
	}
}

// unpackQ5K writes the 256 5-bit weights of a Q5_K block in order.
func unpackQ5K(q *[256]int8, qh, qs []byte) {
	for c := range 4 {
		u1, u2 := byte(1)<<(2*c), byte(2)<<(2*c)
		for l := range 32 {
			v := qs[32*c+l]
			lo, hi := int8(v&0xf), int8(v>>4)
			if qh[l]&u1 != 0 {
				lo += 16
			}
			if qh[l]&u2 != 0 {
				hi += 16
			}
			q[64*c+l], q[64*c+32+l] = lo, hi
		}
	}
}

// unpackQ6K writes the 256 6-bit weights of a Q6_K block, minus 32, in
// order.
func unpackQ6K(q *[256]int8, b []byte) {
	for n := range 2 {
		ql, qh := b[64*n:64*n+64], b[128+32*n:128+32*n+32]
		for l := range 32 {
			q[128*n+l] = int8(ql[l]&0xf|(qh[l]&3)<<4) - 32
			q[128*n+l+32] = int8(ql[l+32]&0xf|(qh[l]>>2&3)<<4) - 32
			q[128*n+l+64] = int8(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
			q[128*n+l+96] = int8(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
		}
	}
}

// LinearQuantLlama runs Default().LinearQuantLlama.
func LinearQuantLlama(out []float32, a, w []byte, t QuantType, m, n, k, j0, j1 int) {
	defaultImpl.LinearQuantLlama(out, a, w, t, m, n, k, j0, j1)
}

// LinearQuantLlama computes out[i*n+j] = VecDotLlama(t, k, W[j], a[i]) for
// rows i in [0, m) and columns j in [j0, j1): w is n rows of t's blocks
// (RowBytes(k) bytes each), a is m activation rows quantized for t by
// QuantizeActs. vecDotLlama's bits on every Impl (llama.cpp's generic
// ones for Q8_0 and Q4_0): the SIMD paths sum a block's integer products
// with vector instructions (vpmaddubsw/vpmaddwd; vpdpbusd where the CPU
// has AVX512-VNNI) and apply the scales with vecDotLlama's float32
// operations in its order. Each output depends only on its own rows, so
// the result is batch invariant. It panics on an unknown type, a k that is
// not a whole number of blocks, or slices too short for the shape.
//
// Cost: 2*m*(j1-j0)*k integer operations plus the weights' unpacking.
// Below 16 rows (decode) the SIMD paths unpack weights in registers, once
// per four rows of a (Q8_0/Q4_0: eight weight rows share each activation
// load, with AVX512-VNNI two blocks per 512-bit vector; K-quants: four).
// From 16 rows on (prefill), the paths repack 16 weight rows (AVX2: 8) at
// a time, once per call, so that each vector lane accumulates one output:
// vpdpbusd for Q8_0/Q4_0; for the K-quants vpdpbusd over a sub-block's
// codes, then vpmulld by its scale (AVX2: vpmaddubsw over a few quads of
// a sub-block added in int16, then vpmaddwd by the scale).
func (p *Impl) LinearQuantLlama(out []float32, a, w []byte, t QuantType, m, n, k, j0, j1 int) {
	rb, err := t.RowBytes(k)
	if err != nil {
		panic(err.Error())
	}
	ab, _ := ActRowBytes(t, k)
	if m < 0 || j0 < 0 || j0 > j1 || j1 > n || len(out) < m*n || len(a) < m*ab || len(w) < n*rb {
		panic(fmt.Sprintf("simd: LinearQuantLlama %s: m=%d n=%d k=%d j=[%d,%d): len(out)=%d len(a)=%d len(w)=%d",
			t, m, n, k, j0, j1, len(out), len(a), len(w)))
	}
	if m == 0 || j0 == j1 || k == 0 {
		for i := range m {
			clear(out[i*n+j0 : i*n+j1])
		}
		return
	}
	if f := nativeQuantLlama[p.name]; f != nil {
		// out[j0:] holds every element written: the last is
		// (m-1)*n + j1-1 - j0 < m*n - j0.
		f(out[j0:], n, a, w[j0*rb:j1*rb], t, m, k, j1-j0)
		return
	}
	nb := k / t.BlockSize()
	for j := j0; j < j1; j++ {
		wr := w[j*rb : (j+1)*rb]
		for i := range m {
			out[i*n+j] = vecDotLlama(t, nb, wr, a[i*ab:(i+1)*ab])
		}
	}
}

// nativeQuantLlama holds the SIMD paths of LinearQuantLlama by Impl name:
// out[i*ldo+j] for rows i in [0, m) of a and the ncols rows of w (whole
// rows, lengths checked by the caller); set by the amd64 cgo build.
var nativeQuantLlama = map[string]func(out []float32, ldo int, a, w []byte, t QuantType, m, k, ncols int){}

// nativeLinear16Llama holds the SIMD paths of Linear16Llama by Impl name:
// out[i*ldo+j] for the m rows of x and the ncols rows of w (lengths
// checked by the caller); false when it computed nothing (no scratch).
var nativeLinear16Llama = map[string]func(out []float32, ldo int, x, w []uint16, bf16 bool, m, k, ncols int) bool{}

// nativeRoundBF16 holds the SIMD paths of RoundBF16 by Impl name (lengths
// checked by the caller); set by the amd64 cgo build.
var nativeRoundBF16 = map[string]func(dst []uint16, src []float32){}

// RoundBF16 rounds src to bfloat16 into dst (len >= len(src)) as ggml's
// GGML_FP32_TO_BF16: nearest, ties to even; a NaN stays a quiet NaN. It
// runs on the default Impl's path (see Impl.RoundBF16). Cost: one pass
// over src, 16 values a step on the AVX2 path (a batch-64 step's rounding
// fell from 6.9% to 0.8% of its profile against the Go loop).
func RoundBF16(dst []uint16, src []float32) { defaultImpl.RoundBF16(dst, src) }

// RoundBF16 is the package-level RoundBF16 on p's SIMD path where it has
// one (the same bits on every path).
func (p *Impl) RoundBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	if f := nativeRoundBF16[p.name]; f != nil && len(src) > 0 {
		f(dst, src)
		return
	}
	roundBF16Go(dst, src)
}

// roundBF16Go is RoundBF16's Go loop.
func roundBF16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		b := math.Float32bits(f)
		if b&0x7fffffff > 0x7f800000 {
			dst[i] = uint16(b>>16) | 64
			continue
		}
		dst[i] = uint16((b + 0x7fff + (b>>16)&1) >> 16)
	}
}

// RoundF16 rounds src to IEEE half into dst (len >= len(src)) as ggml's
// GGML_FP32_TO_FP16 (see F32ToF16).
func RoundF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = F32ToF16(f)
	}
}

// Linear16Llama runs Default().Linear16Llama.
func Linear16Llama(out []float32, x, w []uint16, bf16 bool, m, n, k, j0, j1 int) {
	defaultImpl.Linear16Llama(out, x, w, bf16, m, n, k, j0, j1)
}

// Linear16Llama computes out[i*n+j] = sum_kk x[i][kk] * W[j][kk] with x
// and W both 16-bit (bfloat16 when bf16, else IEEE half), as llama.cpp's
// generic ggml_vec_dot_bf16 / ggml_vec_dot_f16: each product is exact in
// float32, the products are summed in order in float64 and the sum is
// rounded to float32 once. x is m rows of k values already rounded by
// RoundBF16 or RoundF16. Rows i in [0, m), columns j in [j0, j1); it panics
// on slices too short for the shape. Cost: 2*m*(j1-j0)*k flops.
//
// The AVX-512 path keeps the order: its vector lanes are 16 output
// columns, each summing its own products one after the other. From 4 rows
// of x on, a tile of 16 weight rows is widened and transposed once per
// call into a scratch tile and reused by every row; below (decode), each
// step transposes 8 values of the 16 rows in registers, so the weights are
// read once, from memory, with no scratch. The AVX2 path transposes 8
// weight rows in registers for every row count (8 output columns a
// vector, up to 4 rows of x per pass over a tile).
func (p *Impl) Linear16Llama(out []float32, x, w []uint16, bf16 bool, m, n, k, j0, j1 int) {
	if m < 0 || k < 0 || j0 < 0 || j0 > j1 || j1 > n || len(out) < m*n || len(x) < m*k || len(w) < n*k {
		panic(fmt.Sprintf("simd: Linear16Llama: m=%d n=%d k=%d j=[%d,%d): len(out)=%d len(x)=%d len(w)=%d",
			m, n, k, j0, j1, len(out), len(x), len(w)))
	}
	if m == 0 || j0 == j1 {
		return
	}
	// out[j0:] holds every element written: the last is (m-1)*n + j1-1 - j0.
	if f := nativeLinear16Llama[p.name]; f != nil && f(out[j0:], n, x, w[j0*k:j1*k], bf16, m, k, j1-j0) {
		return
	}
	widen := f16ToF32
	if bf16 {
		widen = bf16ToF32
	}
	buf := make([]float32, m*k)
	for i := range buf {
		buf[i] = widen(x[i])
	}
	wrow := make([]float32, k)
	for j := j0; j < j1; j++ {
		for kk, h := range w[j*k : (j+1)*k] {
			wrow[kk] = widen(h)
		}
		for i := range m {
			var s float64
			for kk, v := range buf[i*k : (i+1)*k] {
				s += float64(float32(v * wrow[kk]))
			}
			out[i*n+j] = float32(s)
		}
	}
}
