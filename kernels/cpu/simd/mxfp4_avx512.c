//go:build cgo

// AVX-512 widening of MXFP4 blocks to BF16 (see mxfp4.go). A block's 16
// bytes are zero-extended to 16 dwords d; (d | d << 12) & 0x000f000f puts
// the low nibble in the dword's low word and the high nibble in its high
// word, which is the order of the 32 outputs; one VPERMW looks the 32
// codes up in the block scale's 16 BF16 values (mxfp4Table), so every code
// and scale widens to the table's bits.

#include <immintrin.h>
#include <stdint.h>

#include "mxfp4_amd64.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2")))
#define INLINE static inline __attribute__((always_inline))

#include "reduce16_avx512.h"

AVX512 INLINE __m512i mxfp4_block_avx512(const uint8_t *src, const uint16_t *lut) {
	__m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src));
	// (A | B) & C: imm (0xF0 | 0xCC) & 0xAA = 0xA8.
	__m512i idx = _mm512_ternarylogic_epi32(d, _mm512_slli_epi32(d, 12), _mm512_set1_epi32(0x000f000f), 0xA8);
	__m512i t = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lut));
	return _mm512_permutexvar_epi16(idx, t);
}

AVX512 void di_widen_mxfp4_avx512(uint16_t *dst, const uint8_t *blocks, const uint8_t *scales, int64_t nb,
                                  const uint16_t *table) {
	int64_t b = 0;
	for (; b + 2 <= nb; b += 2) {
		__m512i v0 = mxfp4_block_avx512(blocks + 16 * b, table + 16 * (int)scales[b]);
		__m512i v1 = mxfp4_block_avx512(blocks + 16 * b + 16, table + 16 * (int)scales[b + 1]);
		_mm512_storeu_si512((void *)(dst + 32 * b), v0);
		_mm512_storeu_si512((void *)(dst + 32 * b + 32), v1);
	}
	for (; b < nb; b++)
		_mm512_storeu_si512((void *)(dst + 32 * b), mxfp4_block_avx512(blocks + 16 * b, table + 16 * (int)scales[b]));
}

// MX_GEMV_COLS is the number of weight rows one pass of the fused GEMV
// multiplies: each 32 columns of x are loaded once for all of them.
#define MX_GEMV_COLS 8

// Fused GEMV: a block's 16 bytes are zero-extended to dwords d and d >> 4,
// whose low 4 bits are the low and high nibbles; two VPERMT2D interleave
// them into the indices of outputs 0..15 and 16..31, and two VPERMPS (which
// read the low 4 bits of an index) look them up in the scale's 16 float32
// values, the BF16 values of mxfp4Table widened, so the products are those
// of LinearBF16 over the widened rows, accumulated and reduced in the same
// canonical order.
AVX512 void di_gemv_mxfp4_avx512(float *out, const float *x, const uint8_t *blocks, const uint8_t *scales, int64_t n,
                                 int64_t k, const float *table_f32) {
	const int C = MX_GEMV_COLS;
	const int64_t bk = k / 2, sk = k / 32;
	const __m512i pa = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
	const __m512i pb = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
	for (int64_t j = 0; j < n; j += C) {
		int nc = n - j < C ? (int)(n - j) : C;
		const uint8_t *wb[MX_GEMV_COLS], *ws[MX_GEMV_COLS];
#pragma GCC unroll 8
		for (int c = 0; c < C; c++) {
			int64_t jj = j + (c < nc ? c : nc - 1);
			wb[c] = blocks + jj * bk;
			ws[c] = scales + jj * sk;
		}
		__m512 acc[MX_GEMV_COLS];
#pragma GCC unroll 8
		for (int c = 0; c < C; c++)
			acc[c] = _mm512_setzero_ps();
		for (int64_t b = 0; b < sk; b++) {
			__m512 xa = _mm512_loadu_ps(x + 32 * b), xb = _mm512_loadu_ps(x + 32 * b + 16);
#pragma GCC unroll 8
			for (int c = 0; c < C; c++) {
				__m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wb[c] + 16 * b)));
				__m512i h = _mm512_srli_epi32(d, 4);
				__m512 lut = _mm512_loadu_ps(table_f32 + 16 * (int)ws[c][b]);
				__m512 wa = _mm512_permutexvar_ps(_mm512_permutex2var_epi32(d, pa, h), lut);
				__m512 wv = _mm512_permutexvar_ps(_mm512_permutex2var_epi32(d, pb, h), lut);
				acc[c] = _mm512_fmadd_ps(xa, wa, acc[c]);
				acc[c] = _mm512_fmadd_ps(xb, wv, acc[c]);
			}
		}
		__m512 a[16];
#pragma GCC unroll 16
		for (int f = 0; f < 16; f++)
			a[4 * (f % 4) + f / 4] = acc[f % C];
		float res[16];
		_mm512_storeu_ps(res, reduce16(a));
		for (int c = 0; c < nc; c++)
			out[j + c] = res[c];
	}
}
