package simd

import (
	"fmt"
	"math"
	"unsafe"
)

// MXFP4 (OCP microscaling FP4): 32 elements share one E8M0 scale byte s
// (2^(s-127)) and each element is a 4-bit E2M1 code (sign, 2 exponent bits,
// 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6), two codes a byte, low nibble
// first. Every value code * 2^(s-127) is a BF16 value (exact) for s <= 252;
// larger scales overflow the biggest codes to infinities.

// mxfp4E2M1 are the magnitudes of the E2M1 codes 0..7 (bit 3 is the sign).
var mxfp4E2M1 = [8]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// mxfp4Table holds the BF16 bits of every (scale, code) pair at
// scale<<4 | code: code * 2^(scale-127) rounded to float32, then to BF16
// (both exact where finite; the scale 255, E8M0's NaN, widens as 2^128
// like the others). The SIMD paths read a scale's 16 entries as their
// look-up table. 8 KiB, read-only after package init.
var mxfp4Table = func() (t [256 * 16]uint16) {
	for s := range 256 {
		for c := range 16 {
			v := float32(math.Ldexp(mxfp4E2M1[c&7], s-127))
			if c&8 != 0 {
				v = -v
			}
			t[s<<4|c] = f32ToBF16(v)
		}
	}
	return t
}()

// mxfp4Split is mxfp4Table with each scale's 16 entries split into their
// 16 low bytes and then their 16 high bytes: the two byte tables the AVX2
// path looks codes up in with VPSHUFB. 8 KiB, read-only after package init.
var mxfp4Split = func() (t [256 * 32]byte) {
	for s := range 256 {
		for c := range 16 {
			v := mxfp4Table[s<<4|c]
			t[s*32+c] = byte(v)
			t[s*32+16+c] = byte(v >> 8)
		}
	}
	return t
}()

// mxfp4Pairs and mxfp4NonZero widen a byte of two codes in one step for
// the scales 2..252, whose values are all normal BF16 numbers: the BF16
// exponent field of code c under scale s is that under scale 2 plus s-2
// (scale 2 is the lowest whose values are all normal), with no carry out
// of the field, so the pair of BF16 values is mxfp4Pairs[byte] +
// (s-2)*0x00800080 on the halves whose code is not a zero (mxfp4NonZero
// masks them). 2 KiB, read-only after package init.
var mxfp4Pairs, mxfp4NonZero = func() (p, nz [256]uint32) {
	for c := range 256 {
		lo, hi := uint32(mxfp4Table[2<<4|c&0x0f]), uint32(mxfp4Table[2<<4|c>>4])
		p[c] = lo | hi<<16
		if c&0x07 != 0 {
			nz[c] |= 0xffff
		}
		if c&0x70 != 0 {
			nz[c] |= 0xffff0000
		}
	}
	return p, nz
}()

// MXFP4ToBF16 returns the BF16 bits of the E2M1 code (low nibble of code)
// under the E8M0 scale: the value every WidenMXFP4 path writes for it.
func MXFP4ToBF16(code, scale byte) uint16 { return mxfp4Table[int(scale)<<4|int(code&0x0f)] }

// WidenMXFP4 writes the BF16 bits of the MXFP4 elements of blocks (16
// bytes of two codes a block, low nibble first) and scales (one E8M0 byte a
// block of 32 elements) into dst[:32*len(scales)]: MXFP4ToBF16 of each
// element, for every code and every scale (255 included), on every path.
// It panics if blocks is shorter than 16*len(scales) or dst than
// 32*len(scales). Cost: the SIMD paths one table look-up instruction (AVX-512
// VPERMW, AVX2 two VPSHUFB) per 32 elements (avx512) or 16 (avx2), reading
// 17 bytes and writing 64 a block; the Go path about two table reads a byte.
func (p *Impl) WidenMXFP4(dst []uint16, blocks, scales []byte) {
	nb := len(scales)
	if len(blocks) < 16*nb || len(dst) < 32*nb {
		panic(fmt.Sprintf("simd: WidenMXFP4: %d scales need 16*%d block bytes and 32*%d outputs, have %d and %d",
			nb, nb, nb, len(blocks), len(dst)))
	}
	if nb == 0 {
		return
	}
	if !widenMXFP4Native(p.name, dst, blocks, scales) {
		widenMXFP4Go(dst, blocks, scales)
	}
}

// WidenMXFP4 runs Default().WidenMXFP4.
func WidenMXFP4(dst []uint16, blocks, scales []byte) { defaultImpl.WidenMXFP4(dst, blocks, scales) }

// widenMXFP4Go is the Go path of WidenMXFP4 (lengths checked by the
// caller).
func widenMXFP4Go(dst []uint16, blocks, scales []byte) {
	for b, s := range scales {
		src := (*[16]byte)(blocks[b*16:])
		d := (*[32]uint16)(dst[b*32:])
		if s < 2 || s > 252 {
			lut := (*[16]uint16)(mxfp4Table[int(s)<<4:])
			for i := range 16 {
				c := src[i]
				d[2*i] = lut[c&0x0f]
				d[2*i+1] = lut[c>>4]
			}
			continue
		}
		add := uint32(s-2) * 0x00800080
		d32 := (*[16]uint32)(unsafe.Pointer(d))
		for i := range 16 {
			c := src[i]
			d32[i] = mxfp4Pairs[c] + add&mxfp4NonZero[c]
		}
	}
}

// mxfp4TableF32 is mxfp4Table widened to float32 (exact): the values the
// fused AVX-512 GEMV looks codes up in. 16 KiB, read-only after package
// init.
var mxfp4TableF32 = func() (t [256 * 16]float32) {
	for i, v := range mxfp4Table {
		t[i] = bf16ToF32(v)
	}
	return t
}()

// GemvMXFP4 computes out[j] = sum over kk of x[kk] * w[j][kk] for j in
// [0, n), w the [n][k] MXFP4 matrix of blocks (k/2 bytes a row) and scales
// (k/32 a row), k a positive multiple of 32: bit for bit LinearBF16 with
// m = 1 over the rows widened by WidenMXFP4, on every path. The avx512
// and avx2 paths fuse the widening into the product (VPERMPS look-ups of
// the codes in the scale's row of mxfp4TableF32, no scratch; weights read
// once, 17 bytes a block); the Go path widens 16 rows at a time into a
// buffer (allocated once a call) and runs LinearBF16 on them, so callers
// should pass many rows a call. It panics if k is not a positive multiple of 32 or a slice is
// too short.
func (p *Impl) GemvMXFP4(out, x []float32, blocks, scales []byte, n, k int) {
	if k <= 0 || k%32 != 0 || n < 0 {
		panic(fmt.Sprintf("simd: GemvMXFP4: n=%d k=%d, want n >= 0 and k a positive multiple of 32", n, k))
	}
	if len(out) < n || len(x) < k || len(blocks) < n*k/2 || len(scales) < n*k/32 {
		panic(fmt.Sprintf("simd: GemvMXFP4: len(out)=%d len(x)=%d len(blocks)=%d len(scales)=%d for n=%d k=%d",
			len(out), len(x), len(blocks), len(scales), n, k))
	}
	if n == 0 || gemvMXFP4Native(p.name, out, x, blocks, scales, n, k) {
		return
	}
	const tile = 16 // rows widened at a time: 16 rows of k = 2880 are 90 KiB
	buf := make([]uint16, min(n, tile)*k)
	for j0 := 0; j0 < n; j0 += tile {
		j1 := min(j0+tile, n)
		wn := buf[:(j1-j0)*k]
		p.WidenMXFP4(wn, blocks[j0*k/2:j1*k/2], scales[j0*k/32:j1*k/32])
		p.linearBF16(out[j0:j1], x, wn, 1, j1-j0, k, 0, j1-j0)
	}
}
