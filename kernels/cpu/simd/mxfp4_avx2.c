//go:build cgo

// AVX2 widening of MXFP4 blocks to BF16 (see mxfp4.go). A block's codes
// are split into low and high nibbles and interleaved into 32 byte indices
// in output order; two VPSHUFB look them up in the block scale's low-byte
// and high-byte tables (mxfp4Split), and byte unpacks join the halves into
// the 32 BF16 values, so every code and scale widens to mxfp4Table's bits.

#include <immintrin.h>
#include <stdint.h>

#include "mxfp4_amd64.h"

#define AVX2 __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

#include "hsum2_avx2.h"

AVX2 void di_widen_mxfp4_avx2(uint16_t *dst, const uint8_t *blocks, const uint8_t *scales, int64_t nb,
                              const uint8_t *split) {
	const __m128i m4 = _mm_set1_epi8(0x0f);
	for (int64_t b = 0; b < nb; b++) {
		__m128i c = _mm_loadu_si128((const __m128i *)(blocks + 16 * b));
		__m128i lo = _mm_and_si128(c, m4);
		__m128i hi = _mm_and_si128(_mm_srli_epi16(c, 4), m4);
		// Lane 0: the indices of outputs 0..15, lane 1: 16..31.
		__m256i idx = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
		const uint8_t *t = split + 32 * (int)scales[b];
		__m256i tl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
		__m256i th = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(t + 16)));
		__m256i l = _mm256_shuffle_epi8(tl, idx), h = _mm256_shuffle_epi8(th, idx);
		__m256i w0 = _mm256_unpacklo_epi8(l, h); // outputs 0..7 | 16..23
		__m256i w1 = _mm256_unpackhi_epi8(l, h); // outputs 8..15 | 24..31
		_mm256_storeu_si256((__m256i *)(dst + 32 * b), _mm256_permute2x128_si256(w0, w1, 0x20));
		_mm256_storeu_si256((__m256i *)(dst + 32 * b + 16), _mm256_permute2x128_si256(w0, w1, 0x31));
	}
}

// MX_GEMV_ROWS_AVX2 is the number of weight rows one pass of the fused AVX2
// GEMV multiplies: each 32 columns of x are loaded once for all of them.
#define MX_GEMV_ROWS_AVX2 4

// mx_lookup widens 8 codes (the low 8 bytes of idx, one code a byte) to the
// float32 values of their scale's row of the table (lo: codes 0..7, hi:
// 8..15): two VPERMPS on the codes' low 3 bits, bit 3 picking between them.
AVX2 INLINE __m256 mx_lookup(__m128i idx, __m256 lo, __m256 hi) {
	const __m256i d = _mm256_cvtepu8_epi32(idx);
	const __m256 a = _mm256_permutevar8x32_ps(lo, d), b = _mm256_permutevar8x32_ps(hi, d);
	return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_cmpgt_epi32(d, _mm256_set1_epi32(7))));
}

// Fused GEMV (see mxfp4_amd64.h): a block's 16 bytes are split into low
// and high nibbles and interleaved into its 32 codes in output order; each
// 8 codes widen through mx_lookup to the table's values (the BF16 values of
// mxfp4Table, widened), so the products are those of LinearBF16 over the
// widened rows: lanes 0..7 and 8..15 of the canonical accumulator take
// columns 32b + 0..15, then 32b + 16..31, fused multiply-adds in k order,
// reduced by hsum2.
AVX2 void di_gemv_mxfp4_avx2(float *out, const float *x, const uint8_t *blocks, const uint8_t *scales, int64_t n,
                             int64_t k, const float *table_f32) {
	const int C = MX_GEMV_ROWS_AVX2;
	const int64_t bk = k / 2, sk = k / 32;
	const __m128i m4 = _mm_set1_epi8(0x0f);
	for (int64_t j = 0; j < n; j += C) {
		const int nc = n - j < C ? (int)(n - j) : C;
		const uint8_t *wb[MX_GEMV_ROWS_AVX2], *ws[MX_GEMV_ROWS_AVX2];
		__m256 lo[MX_GEMV_ROWS_AVX2], hi[MX_GEMV_ROWS_AVX2];
#pragma GCC unroll 4
		for (int c = 0; c < C; c++) {
			const int64_t jj = j + (c < nc ? c : nc - 1);
			wb[c] = blocks + jj * bk;
			ws[c] = scales + jj * sk;
			lo[c] = hi[c] = _mm256_setzero_ps();
		}
		for (int64_t b = 0; b < sk; b++) {
			const float *xb = x + 32 * b;
			const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
			const __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
#pragma GCC unroll 4
			for (int c = 0; c < C; c++) {
				const __m128i q = _mm_loadu_si128((const __m128i *)(wb[c] + 16 * b));
				const __m128i l = _mm_and_si128(q, m4), h = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
				const __m128i i0 = _mm_unpacklo_epi8(l, h), i1 = _mm_unpackhi_epi8(l, h); // codes 0..15, 16..31
				const float *t = table_f32 + 16 * (int)ws[c][b];
				const __m256 tl = _mm256_loadu_ps(t), th = _mm256_loadu_ps(t + 8);
				lo[c] = _mm256_fmadd_ps(x0, mx_lookup(i0, tl, th), lo[c]);
				hi[c] = _mm256_fmadd_ps(x1, mx_lookup(_mm_srli_si128(i0, 8), tl, th), hi[c]);
				lo[c] = _mm256_fmadd_ps(x2, mx_lookup(i1, tl, th), lo[c]);
				hi[c] = _mm256_fmadd_ps(x3, mx_lookup(_mm_srli_si128(i1, 8), tl, th), hi[c]);
			}
		}
		for (int c = 0; c < nc; c++)
			out[j + c] = hsum2(lo[c], hi[c]);
	}
}
