//go:build cgo

// AVX-512 kernel of LinearF8: FP8 E4M3 weights with block scales (see
// F8Weights and LinearF8 in f8.go). A byte becomes an IEEE half of 2^-8 its
// value by sign extension and one shift (sign to bit 15, exponent and
// mantissa to bits 13..7, bit 14 cleared), and VCVTPH2PS widens it exactly.
// The scales are applied to the activations: each run of weight rows that
// share a scale row gets the activation rows multiplied by 256 times its
// block scales once (f8_scale_acts, into the caller's scratch), so the
// inner loops widen and multiply-add, nothing more. The canonical order
// then runs as in kernels_avx512.c: one zmm accumulator per output, the
// tree of reduce16 at the end.
//
// Two ways through, by the number of rows m:
//   - m <= 8 (decode, batched decode): R x C register tiles (1 x 8, 2 x 8,
//     4 x 4, and 8 x 2 from 5 rows) widen each weight in registers and use
//     it for the R rows. Up to 4 rows, 16 bytes at a time become floats of
//     2^-120 their value with no conversion instruction (f8_raw: one
//     VPMOVSXBD, a shift and a mask) against rows scaled by 2^112 more
//     (f8_raw_acts; see kernels_f8_avx2.c for why the bits are the same);
//     a run whose scaled rows reach 2^16, and the 8 x 2 tile, widen 32
//     bytes at a time to 2^-8 the value (one VPMOVSXBW, shift and mask,
//     then two VCVTPH2PS). The weights are read once, a byte each, with
//     the next tile prefetched, so the widening overlaps the memory
//     stream. Where the CPU has AVX512_VBMI the one-row tile widens 64
//     bytes at a time by table instead (tile_f8_vbmi: as fast as f8_raw
//     here, and the same values times 2^-8 as VCVTPH2PS gives), in the
//     same order; two rows ran 0.95x that way (their 16 accumulators and 8
//     x vectors left too few registers), so they keep tile_f8.
//   - m >= 9 (prefill): a panel of columns (about 384 KiB of float32, kept
//     in L2) is widened once into a buffer, then the float32 kernel of
//     kernels_avx512.c (di_linear_avx512) runs the scaled rows against each
//     run of its columns. Its canonical order is exactly the register
//     path's, so the bits do not depend on the path, and prefill runs at
//     the float32 GEMM's speed.

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd_amd64.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#include "reduce16_avx512.h"

// f8_widen turns 16 E4M3 bytes (sign-extended to 16 bits) into 16 floats of
// 2^-8 their value.
AVX512 INLINE __m512 f8_widen(__m256i h) {
	h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBFFF));
	return _mm512_cvtph_ps(h);
}

AVX512 INLINE __m512 f8_load(const uint8_t *p) {
	return f8_widen(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)));
}

// f8_load32 widens 32 E4M3 bytes into two vectors of 16 floats of 2^-8
// their value (lo: bytes 0..15, hi: bytes 16..31).
AVX512 INLINE void f8_load32(const uint8_t *p, __m512 *lo, __m512 *hi) {
	__m512i h = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
	h = _mm512_and_si512(_mm512_slli_epi16(h, 7), _mm512_set1_epi16((short)0xBFFF));
	*lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
	*hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

AVX512 INLINE __m512 f8_load_mask(const uint8_t *p, __mmask16 mk) {
	return f8_widen(_mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(mk, p)));
}

// f8_raw turns 16 E4M3 bytes (sign-extended to 32 bits) into 16 floats of
// 2^-120 their value with no conversion instruction: the sign to bit 31,
// the exponent and mantissa to bits 26..20 (see kernels_f8_avx2.c; the
// scaled rows that meet them are multiplied by 2^112, f8_raw_acts).
AVX512 INLINE __m512 f8_raw(__m512i d) {
	return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(d, 20), _mm512_set1_epi32((int)0x87F00000)));
}

// f8_widen16 widens the 16 E4M3 bytes at p to 2^-120 their value (raw) or
// 2^-8; f8_widen16_mask those of them that mk selects, the others zero.
AVX512 INLINE __m512 f8_widen16(const int raw, const uint8_t *p) {
	return raw ? f8_raw(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))) : f8_load(p);
}

AVX512 INLINE __m512 f8_widen16_mask(const int raw, const uint8_t *p, __mmask16 mk) {
	return raw ? f8_raw(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, p))) : f8_load_mask(p, mk);
}

// f8_tile_rows points a tile's R rows of scaled activations and C weight
// rows at rows [0, nr) and [0, nc), the ones past them repeating the last
// valid one.
AVX512 INLINE void f8_tile_rows(const int R, const int C, const float *x, int nr, const uint8_t *w, int nc,
                                int64_t k, const float **xr, const uint8_t **wc) {
#pragma GCC unroll 8
	for (int r = 0; r < R; r++)
		xr[r] = x + (r < nr ? r : nr - 1) * k;
#pragma GCC unroll 16
	for (int c = 0; c < C; c++)
		wc[c] = w + (c < nc ? c : nc - 1) * k;
}

// f8_step16 adds the products of the R rows of scaled activations with the
// 16 widened weights at kk of each of the C columns into acc: one canonical
// step.
AVX512 INLINE void f8_step16(const int R, const int C, const int raw, const float *const *xr,
                             const uint8_t *const *wc, int64_t kk, __m512 *acc) {
	__m512 xv[8];
#pragma GCC unroll 8
	for (int r = 0; r < R; r++)
		xv[r] = _mm512_loadu_ps(xr[r] + kk);
#pragma GCC unroll 16
	for (int c = 0; c < C; c++) {
		__m512 wv = f8_widen16(raw, wc[c] + kk);
#pragma GCC unroll 8
		for (int r = 0; r < R; r++)
			acc[r * C + c] = _mm512_fmadd_ps(xv[r], wv, acc[r * C + c]);
	}
}

// f8_tail adds the last k - kk (< 16) products of each row and column into
// acc, and f8_store reduces acc (one accumulator an output) and stores the
// nr x nc valid outputs: the end of every tile.
AVX512 INLINE void f8_tail(const int R, const int C, const int raw, const float *const *xr,
                           const uint8_t *const *wc, int64_t k, int64_t kk, __m512 *acc) {
	__mmask16 mk = (__mmask16)((1u << (k - kk)) - 1);
	__m512 xv[8];
#pragma GCC unroll 8
	for (int r = 0; r < R; r++)
		xv[r] = _mm512_maskz_loadu_ps(mk, xr[r] + kk);
#pragma GCC unroll 16
	for (int c = 0; c < C; c++) {
		__m512 wv = f8_widen16_mask(raw, wc[c] + kk, mk);
#pragma GCC unroll 8
		for (int r = 0; r < R; r++)
			acc[r * C + c] = _mm512_mask3_fmadd_ps(xv[r], wv, acc[r * C + c], mk);
	}
}

AVX512 INLINE void f8_store(const int R, const int C, const __m512 *acc, int nr, int nc, float *out, int64_t ldo) {
	__m512 a[16];
#pragma GCC unroll 16
	for (int f = 0; f < 16; f++)
		a[4 * (f % 4) + f / 4] = acc[f % (R * C)];
	float res[16];
	_mm512_storeu_ps(res, reduce16(a));
	for (int r = 0; r < nr; r++)
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = res[r * C + c];
}

// tile_f8 computes an R x C tile (R <= 8, R*C at most 16) of out over all of
// k: scaled activation rows x[0..nr), weight rows w[0..nc) (all of one
// scale row: x is scaled for it, and by 2^112 more when raw). Rows and
// columns past nr, nc repeat the last valid one and are not stored. pf,
// when not NULL, is the next tile's first weight row: each step prefetches
// its share of it (the weight stream of decode), into L2 only when pf_l2.
AVX512 INLINE void tile_f8(const int R, const int C, const int raw, const float *x, int nr, const uint8_t *w,
                           int nc, int64_t k, float *out, int64_t ldo, const uint8_t *pf, const int pf_l2) {
	const float *xr[8];
	const uint8_t *wc[16];
	f8_tile_rows(R, C, x, nr, w, nc, k, xr, wc);
	__m512 acc[16];
#pragma GCC unroll 16
	for (int f = 0; f < 16; f++)
		acc[f] = _mm512_setzero_ps();
	const int64_t k16 = k & ~(int64_t)15;
	int64_t kk = 0;
	// Steps of 32 (two canonical steps of 16 on the same accumulators).
	for (; kk + 32 <= k16; kk += 32) {
		if (pf) {
			const uint8_t *p = pf + kk * C;
#pragma GCC unroll 8
			for (int q = 0; q < C * 32; q += 64)
				DI_F8_PREFETCH(p + q, pf_l2);
		}
		__m512 xl[8], xh[8];
#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			xl[r] = _mm512_loadu_ps(xr[r] + kk);
			xh[r] = _mm512_loadu_ps(xr[r] + kk + 16);
		}
#pragma GCC unroll 16
		for (int c = 0; c < C; c++) {
			__m512 wl, wh;
			if (raw) {
				wl = f8_widen16(1, wc[c] + kk);
				wh = f8_widen16(1, wc[c] + kk + 16);
			} else {
				f8_load32(wc[c] + kk, &wl, &wh);
			}
#pragma GCC unroll 8
			for (int r = 0; r < R; r++)
				acc[r * C + c] = _mm512_fmadd_ps(xl[r], wl, acc[r * C + c]);
#pragma GCC unroll 8
			for (int r = 0; r < R; r++)
				acc[r * C + c] = _mm512_fmadd_ps(xh[r], wh, acc[r * C + c]);
		}
	}
	for (; kk < k16; kk += 16) {
		if (pf) {
			const uint8_t *p = pf + kk * C;
#pragma GCC unroll 2
			for (int q = 0; q < C * 16; q += 64)
				DI_F8_PREFETCH(p + q, pf_l2);
		}
		f8_step16(R, C, raw, xr, wc, kk, acc);
	}
	if (kk < k)
		f8_tail(R, C, raw, xr, wc, k, kk, acc);
	f8_store(R, C, acc, nr, nc, out, ldo);
}

#define VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma,f16c")))

// The two bytes above the low 16 bits of the float32 value of E4M3 bytes
// 0..127 times 2^-8 (every such value is a normal bfloat16: three mantissa
// bits, 2^-17 the smallest): f8_bf16_lo holds bits 16..23, f8_bf16_hi bits
// 24..31, so that (hi << 24 | lo << 16) is F8Value(b) / 256 exactly, what
// f8_load gives, 0x7F reading as 480 / 256 as in the other paths. The sign
// bit of a byte is its value's sign bit.
static const uint8_t f8_bf16_lo[128] __attribute__((aligned(64))) = {
	0x00, 0x00, 0x80, 0xc0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
	0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
	0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
	0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
	0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
	0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
	0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
	0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
};
static const uint8_t f8_bf16_hi[128] __attribute__((aligned(64))) = {
	0x00, 0x37, 0x37, 0x37, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38,
	0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39,
	0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a,
	0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b,
	0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c,
	0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d,
	0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e,
	0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f,
};

// f8_place[q] gathers bytes 16q..16q+15 of the low (index i) and high
// (index 64 + i) table results into the top two bytes of 16 float32 lanes;
// the other bytes are zeroed by the mask F8_PLACE_MASK.
static const uint8_t f8_place[4][64] __attribute__((aligned(64))) = {
#define F8P(q, i) 0, 0, 16 * (q) + (i), 64 + 16 * (q) + (i)
#define F8PQ(q)                                                                                           \
	{F8P(q, 0),  F8P(q, 1),  F8P(q, 2),  F8P(q, 3),  F8P(q, 4),  F8P(q, 5),  F8P(q, 6),  F8P(q, 7),  \
	 F8P(q, 8),  F8P(q, 9),  F8P(q, 10), F8P(q, 11), F8P(q, 12), F8P(q, 13), F8P(q, 14), F8P(q, 15)}
	F8PQ(0), F8PQ(1), F8PQ(2), F8PQ(3),
#undef F8PQ
#undef F8P
};
#define F8_PLACE_MASK 0xCCCCCCCCCCCCCCCCull

// tile_f8_vbmi is tile_f8 (R <= 2; one row is what runs it) where the CPU
// has AVX512_VBMI: steps of 64 weights look each byte's two top float32
// bytes up in f8_bf16_lo/hi (two VPERMI2B on the byte's low 7 bits, its
// sign OR-ed in) and place them into four vectors of 16 floats (four
// zero-masked VPERMT2B): the exact values f8_load32 gives. A step costs 7
// shuffle uops for 64 weights, against 8 VCVTPH2PS uops (and 6 more) in
// tile_f8. The same canonical order (16 columns at a time into one
// accumulator an output), so the bits are tile_f8's; the rest of k runs
// tile_f8's steps.
VBMI INLINE void tile_f8_vbmi(const int R, const int C, const float *x, int nr, const uint8_t *w, int nc,
                              int64_t k, float *out, int64_t ldo, const uint8_t *pf, const int pf_l2) {
	const float *xr[8];
	const uint8_t *wc[16];
	f8_tile_rows(R, C, x, nr, w, nc, k, xr, wc);
	const __m512i tl0 = _mm512_load_si512(f8_bf16_lo), tl1 = _mm512_load_si512(f8_bf16_lo + 64);
	const __m512i th0 = _mm512_load_si512(f8_bf16_hi), th1 = _mm512_load_si512(f8_bf16_hi + 64);
	const __m512i sgn = _mm512_set1_epi8((char)0x80);
	__m512 acc[16];
#pragma GCC unroll 16
	for (int f = 0; f < 16; f++)
		acc[f] = _mm512_setzero_ps();
	const int64_t k16 = k & ~(int64_t)15;
	int64_t kk = 0;
	for (; kk + 64 <= k16; kk += 64) {
		if (pf) {
			const uint8_t *p = pf + kk * C;
#pragma GCC unroll 8
			for (int q = 0; q < C * 64; q += 64)
				DI_F8_PREFETCH(p + q, pf_l2);
		}
#pragma GCC unroll 8
		for (int c = 0; c < C; c++) {
			const __m512i b = _mm512_loadu_si512(wc[c] + kk);
			const __m512i lo = _mm512_permutex2var_epi8(tl0, b, tl1);
			const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(th0, b, th1), b, sgn, 0xF8);
#pragma GCC unroll 4
			for (int q = 0; q < 4; q++) {
				const __m512i idx = _mm512_load_si512(f8_place[q]);
				const __m512 wv =
				    _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(F8_PLACE_MASK, lo, idx, hi));
#pragma GCC unroll 2
				for (int r = 0; r < R; r++)
					acc[r * C + c] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[r] + kk + 16 * q), wv, acc[r * C + c]);
			}
		}
	}
	for (; kk < k16; kk += 16)
		f8_step16(R, C, 0, xr, wc, kk, acc);
	if (kk < k)
		f8_tail(R, C, 0, xr, wc, k, kk, acc);
	f8_store(R, C, acc, nr, nc, out, ldo);
}

// f8_scale_acts writes rows [0, m) of x scaled for the weight rows of one
// scale row sc (ceil(k / 2^sh) block scales) into xs: xs[i][kk] = x[i][kk] *
// (256 * sc[kk >> sh]), one rounding each (256 * scale is exact).
AVX512 static void f8_scale_acts(float *xs, const float *x, int64_t m, int64_t k, const float *sc, int sh) {
	for (int64_t i = 0; i < m; i++) {
		const float *src = x + i * k;
		float *dst = xs + i * k;
		for (int64_t lo = 0; lo < k; lo += (int64_t)1 << sh) {
			int64_t hi = lo + ((int64_t)1 << sh);
			if (hi > k)
				hi = k;
			const __m512 s = _mm512_set1_ps(sc[lo >> sh] * 256.0f);
			int64_t kk = lo;
			for (; kk + 16 <= hi; kk += 16)
				_mm512_storeu_ps(dst + kk, _mm512_mul_ps(_mm512_loadu_ps(src + kk), s));
			if (kk < hi) {
				__mmask16 mk = (__mmask16)((1u << (hi - kk)) - 1);
				_mm512_mask_storeu_ps(dst + kk, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, src + kk), s));
			}
		}
	}
}

// f8_raw_acts multiplies the m rows of k scaled activations in xs by 2^112
// and returns 1 when all of them are below 2^16 in magnitude (see
// kernels_f8_avx2.c); otherwise it leaves xs as it is and returns 0.
AVX512 static int f8_raw_acts(float *xs, int64_t m, int64_t k) {
	const int64_t len = m * k;
	const __m512 lim = _mm512_set1_ps(65536.0f);
	__mmask16 ok = 0xFFFF;
	int64_t i = 0;
	for (; i + 16 <= len; i += 16)
		ok &= _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xs + i)), lim, _CMP_LT_OQ);
	if (i < len) {
		__mmask16 mk = (__mmask16)((1u << (len - i)) - 1);
		ok &= _mm512_mask_cmp_ps_mask(mk, _mm512_abs_ps(_mm512_maskz_loadu_ps(mk, xs + i)), lim, _CMP_LT_OQ) |
		      (__mmask16)~mk;
	}
	if (ok != 0xFFFF)
		return 0;
	const __m512 p = _mm512_set1_ps(0x1p112f);
	for (i = 0; i + 16 <= len; i += 16)
		_mm512_storeu_ps(xs + i, _mm512_mul_ps(_mm512_loadu_ps(xs + i), p));
	if (i < len) {
		__mmask16 mk = (__mmask16)((1u << (len - i)) - 1);
		_mm512_mask_storeu_ps(xs + i, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, xs + i), p));
	}
	return 1;
}

// rows_f8 runs the R x C tiles of rows [i0, i0+nr) of the scaled
// activations xs (row i0 first) against weight rows [ja, jb); pf_end bounds
// the weight rows the tiles prefetch (the column block's end). Columns
// short of a full tile (a run of fewer than C rows of one scale row) run
// one at a time (R x 1 tiles), not as a tile of C that repeats its last
// column.
AVX512 INLINE void rows_f8_pf(const int R, const int C, const int raw, const int pf_l2, float *out,
                              const float *xs, const uint8_t *w, int64_t n, int64_t k, int64_t i0, int nr,
                              int64_t ja, int64_t jb, int64_t pf_end, int stream) {
	int64_t j = ja;
	for (; j + C <= jb; j += C) {
		const uint8_t *pf = 0;
		if (stream && j + 2 * C <= pf_end)
			pf = w + (j + C) * k;
		tile_f8(R, C, raw, xs, nr, w + j * k, C, k, out + i0 * n + j, n, pf, pf_l2);
	}
	for (; j < jb; j++)
		tile_f8(R, 1, raw, xs, nr, w + j * k, 1, k, out + i0 * n + j, n, 0, 0);
}

AVX512 INLINE void rows_f8(const int R, const int C, const int raw, float *out, const float *xs,
                           const uint8_t *w, int64_t n, int64_t k, int64_t i0, int nr, int64_t ja, int64_t jb,
                           int64_t pf_end, int stream) {
	if (di_f8_prefetch_l2(R, C, k))
		rows_f8_pf(R, C, raw, 1, out, xs, w, n, k, i0, nr, ja, jb, pf_end, stream);
	else
		rows_f8_pf(R, C, raw, 0, out, xs, w, n, k, i0, nr, ja, jb, pf_end, stream);
}

// rows_f8_vbmi is rows_f8 for one row over tile_f8_vbmi (1 x 8 tiles).
VBMI INLINE void rows_f8_vbmi_pf(const int pf_l2, float *out, const float *xs, const uint8_t *w, int64_t n,
                                 int64_t k, int64_t i0, int64_t ja, int64_t jb, int64_t pf_end, int stream) {
	const int C = 8;
	int64_t j = ja;
	for (; j + C <= jb; j += C) {
		const uint8_t *pf = 0;
		if (stream && j + 2 * C <= pf_end)
			pf = w + (j + C) * k;
		tile_f8_vbmi(1, C, xs, 1, w + j * k, C, k, out + i0 * n + j, n, pf, pf_l2);
	}
	for (; j < jb; j++)
		tile_f8(1, 1, 0, xs, 1, w + j * k, 1, k, out + i0 * n + j, n, 0, 0);
}

VBMI static void rows_f8_vbmi(float *out, const float *xs, const uint8_t *w, int64_t n, int64_t k, int64_t i0,
                              int64_t ja, int64_t jb, int64_t pf_end, int stream) {
	if (di_f8_prefetch_l2(1, 8, k))
		rows_f8_vbmi_pf(1, out, xs, w, n, k, i0, ja, jb, pf_end, stream);
	else
		rows_f8_vbmi_pf(0, out, xs, w, n, k, i0, ja, jb, pf_end, stream);
}

// L2 bytes of weights one column block keeps hot while every block of rows
// runs against it (register path: bytes; panel path: float32).
#define F8_L2_BLOCK_BYTES (384 * 1024)

// Rows from which the panel path runs. Per 16 weights of a column, m rows
// cost the register path 4 uops of widening per tile of up to 8 rows plus
// m FMAs, 4 * ceil(m/8) + m, overlapped with the weight stream; the panel
// path widens and stores once (5 uops), then runs the float32 kernel's m
// FMAs, 5 + m, widening and computing one after the other. On one core
// with weights from memory, m = 8 (measured with the weights scaled in
// the widening, a uop more either way): 5.5-5.9 G weights/s in registers
// against 4.0-4.3 through the panel.
#define F8_PANEL_MIN_ROWS 9

// f8_widen_rows writes rows [jb, je) of w widened into dst ([je-jb][k]
// float32, each E4M3 value times 2^-8): the values the register path
// multiplies in registers.
AVX512 static void f8_widen_rows(float *dst, const uint8_t *w, int64_t k, int64_t jb, int64_t je) {
	for (int64_t j = jb; j < je; j++) {
		const uint8_t *src = w + j * k;
		float *d = dst + (j - jb) * k;
		int64_t kk = 0;
		for (; kk + 32 <= k; kk += 32) {
			__m512 lo, hi;
			f8_load32(src + kk, &lo, &hi);
			_mm512_storeu_ps(d + kk, lo);
			_mm512_storeu_ps(d + kk + 16, hi);
		}
		for (; kk + 16 <= k; kk += 16)
			_mm512_storeu_ps(d + kk, f8_load(src + kk));
		if (kk < k) {
			__mmask16 mk = (__mmask16)((1u << (k - kk)) - 1);
			_mm512_mask_storeu_ps(d + kk, mk, f8_load_mask(src + kk, mk));
		}
	}
}

// linear_f8_regs: up to 8 rows, in register tiles. Each run of columns
// that share a scale row gets the rows scaled for it once (into xs, unless
// the run before had the same scale row).
AVX512 static void linear_f8_regs(float *out, const float *x, const uint8_t *w, const float *scales,
                                  const int32_t *scale_row, int sh, int64_t m, int64_t n, int64_t k,
                                  int64_t j0, int64_t j1, int vbmi, float *xs) {
	const int64_t kb = (k + ((int64_t)1 << sh) - 1) >> sh;
	int64_t nb = F8_L2_BLOCK_BYTES / (k > 0 ? k : 1);
	nb = nb < 16 ? 16 : nb / 16 * 16;
	const int stream = m <= 8;
	// The raw widening (f8_raw) for the tiles of up to 4 rows, not under
	// MXCSR's DAZ (subnormal weights must read as themselves): the VBMI
	// tile widens to 2^-8 the value, and the 8 x 2 tile ran 0.84-0.88x with
	// it (its 16 accumulators and 16 vectors of x leave no register for the
	// wider sign extensions).
	const int may_raw = (m > 1 || !vbmi) && m <= 4 && !(_mm_getcsr() & DI_MXCSR_DAZ);
	int32_t scaled = -1; // the scale row xs holds
	int raw = 0;         // xs is scaled by 2^112 more
	for (int64_t jb = j0; jb < j1; jb += nb) {
		int64_t je = j1 - jb < nb ? j1 : jb + nb;
		for (int64_t ja = jb; ja < je;) {
			const int64_t jr = di_f8_run_end(scale_row, ja, je);
			if (scale_row[ja] != scaled) {
				scaled = scale_row[ja];
				f8_scale_acts(xs, x, m, k, scales + (int64_t)scaled * kb, sh);
				raw = may_raw && f8_raw_acts(xs, m, k);
			}
// The R x C tiles of nr rows from row i, their widening a constant.
#define F8_ROWS(R, C, nr)                                                                                     \
	(raw ? rows_f8(R, C, 1, out, xi, w, n, k, i, nr, ja, jr, je, stream)                                  \
	     : rows_f8(R, C, 0, out, xi, w, n, k, i, nr, ja, jr, je, stream))
			for (int64_t i = 0; i < m;) {
				int64_t left = m - i;
				const float *xi = xs + i * k;
				if (left >= 5) {
					int nr = left < 8 ? (int)left : 8;
					F8_ROWS(8, 2, nr);
					i += nr;
				} else if (left >= 3) {
					int nr = left < 4 ? (int)left : 4;
					F8_ROWS(4, 4, nr);
					i += nr;
				} else if (left == 2) {
					F8_ROWS(2, 8, 2);
					i += 2;
				} else {
					if (vbmi)
						rows_f8_vbmi(out, xi, w, n, k, i, ja, jr, je, stream);
					else
						F8_ROWS(1, 8, 1);
					i += 1;
				}
			}
#undef F8_ROWS
			ja = jr;
		}
	}
}

// linear_f8_panel widens panels of columns once and runs the float32
// kernel on them, DI_F8_SCALED_ROWS rows of x at a time, scaled for each
// run of the panel's columns that share a scale row; it returns 0 (having
// done nothing) when the panel buffer cannot be allocated.
AVX512 static int linear_f8_panel(float *out, const float *x, const uint8_t *w, const float *scales,
                                  const int32_t *scale_row, int sh, int64_t m, int64_t n, int64_t k,
                                  int64_t j0, int64_t j1, float *xs) {
	const int64_t kb = (k + ((int64_t)1 << sh) - 1) >> sh;
	int64_t nb = F8_L2_BLOCK_BYTES / (4 * k);
	nb = nb >= 16 ? nb / 16 * 16 : (nb >= 4 ? nb / 4 * 4 : 4);
	if (nb > j1 - j0)
		nb = j1 - j0;
	size_t bytes = ((size_t)nb * (size_t)k * sizeof(float) + 63) / 64 * 64;
	float *panel = aligned_alloc(64, bytes);
	if (!panel)
		return 0;
	int64_t scaled_i0 = -1; // the rows and scale row xs holds
	int32_t scaled = -1;
	for (int64_t jb = j0; jb < j1; jb += nb) {
		int64_t je = j1 - jb < nb ? j1 : jb + nb;
		f8_widen_rows(panel, w, k, jb, je);
		for (int64_t i0 = 0; i0 < m; i0 += DI_F8_SCALED_ROWS) {
			const int64_t mr = m - i0 < DI_F8_SCALED_ROWS ? m - i0 : DI_F8_SCALED_ROWS;
			for (int64_t ja = jb; ja < je;) {
				const int64_t jr = di_f8_run_end(scale_row, ja, je);
				if (scale_row[ja] != scaled || i0 != scaled_i0) {
					scaled = scale_row[ja];
					scaled_i0 = i0;
					f8_scale_acts(xs, x + i0 * k, mr, k, scales + (int64_t)scaled * kb, sh);
				}
				di_linear_avx512(DI_F32, out + i0 * n + jb, xs, panel, mr, n, k, ja - jb, jr - jb);
				ja = jr;
			}
		}
	}
	free(panel);
	return 1;
}

void di_linear_f8_avx512(float *out, const float *x, const uint8_t *w, const float *scales,
                         const int32_t *scale_row, int block_shift, int64_t m, int64_t n, int64_t k,
                         int64_t j0, int64_t j1, int vbmi, float *xs) {
	if (m >= F8_PANEL_MIN_ROWS && k > 0 &&
	    linear_f8_panel(out, x, w, scales, scale_row, block_shift, m, n, k, j0, j1, xs))
		return;
	for (int64_t i0 = 0; i0 < m; i0 += 8) {
		const int64_t mr = m - i0 < 8 ? m - i0 : 8;
		linear_f8_regs(out + i0 * n, x + i0 * k, w, scales, scale_row, block_shift, mr, n, k, j0, j1, vbmi, xs);
	}
}
