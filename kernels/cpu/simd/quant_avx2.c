//go:build cgo

// LinearQuant for AVX2 + FMA + F16C. One canonical 16-lane accumulator is a
// pair of ymm registers (lo: lanes 0..7, hi: 8..15), as in kernels_avx2.c.

#define QTARGET __attribute__((target("avx2,fma,f16c")))
#include "quant_blocks.h"

#define AVX2 QTARGET
#define INLINE static inline __attribute__((always_inline))
#include "hsum2_avx2.h"

// tile computes R (1..4) rows of x against NC (1..2) consecutive rows of W
// (row c at wr + c*rb), out[r*ldo + c]. Each output has its own accumulator
// and sees the same fused multiply-adds in the same order as with one row
// and one column: the columns only share the loads of x and the loop.
QINLINE void tile(const int qt, const int R, const int NC, const float *x, int64_t k, const uint8_t *wr, int64_t rb,
                  float *out, int64_t ldo, const uint8_t *pf) {
	__m256 lo[4][2], hi[4][2];
	#pragma GCC unroll 16
	for (int r = 0; r < R; r++)
		#pragma GCC unroll 16
		for (int c = 0; c < NC; c++)
			lo[r][c] = hi[r][c] = _mm256_setzero_ps();
	const int bs = block_size(qt);
	const int64_t bb = block_bytes(qt);
	const int64_t nb = k / bs;
	const __m256i m4 = _mm256_set1_epi32(0x0F);
	for (int64_t kb = 0; kb < nb; kb++) {
		const float *xb = x + kb * bs;
		const uint8_t *b0 = wr + kb * bb;
		if (pf)
			qprefetch_l2(pf + kb * NC * bb, NC * bb);
		float dm[2][16];
		if (qt == DI_Q4_K || qt == DI_Q5_K) {
			#pragma GCC unroll 16
			for (int c = 0; c < NC; c++)
				k4_scales(b0 + c * rb, dm[c]);
		}
		#pragma GCC unroll 16
		for (int g = 0; g < bs / 16; g++) {
			__m256 wl[2], wh[2];
			#pragma GCC unroll 16
			for (int c = 0; c < NC; c++) {
				const uint8_t *b = b0 + c * rb;
				if (qt == DI_Q4_0) {
					const __m256 vd = _mm256_set1_ps(qhalf(b)), z = _mm256_setzero_ps(), e = _mm256_set1_ps(8);
					__m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2)));
					__m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 10)));
					a = g ? _mm256_srli_epi32(a, 4) : _mm256_and_si256(a, m4);
					h = g ? _mm256_srli_epi32(h, 4) : _mm256_and_si256(h, m4);
					// float(q) - 8 is exact: float(q - 8).
					wl[c] = _mm256_fmsub_ps(vd, _mm256_sub_ps(_mm256_cvtepi32_ps(a), e), z);
					wh[c] = _mm256_fmsub_ps(vd, _mm256_sub_ps(_mm256_cvtepi32_ps(h), e), z);
				} else if (qt == DI_Q4_K || qt == DI_Q5_K) {
					const int ch = g / 4, r = g % 4, high = r >= 2, half = r & 1, j = 2 * ch + high;
					const uint8_t *qs = b + (qt == DI_Q4_K ? 16 : 48) + 32 * ch + 16 * half;
					__m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
					__m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
					a = high ? _mm256_srli_epi32(a, 4) : _mm256_and_si256(a, m4);
					h = high ? _mm256_srli_epi32(h, 4) : _mm256_and_si256(h, m4);
					if (qt == DI_Q5_K) {
						// Bit 2ch+high of qh, moved to bit 4 (+16).
						const int sh = 2 * ch + high;
						const uint8_t *qh = b + 16 + 16 * half;
						const __m256i s16 = _mm256_set1_epi32(16);
						__m256i ha = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qh));
						__m256i hh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + 8)));
						ha = _mm256_and_si256(sh <= 4 ? _mm256_slli_epi32(ha, 4 - sh) : _mm256_srli_epi32(ha, sh - 4), s16);
						hh = _mm256_and_si256(sh <= 4 ? _mm256_slli_epi32(hh, 4 - sh) : _mm256_srli_epi32(hh, sh - 4), s16);
						a = _mm256_or_si256(a, ha);
						h = _mm256_or_si256(h, hh);
					}
					const __m256 vd = _mm256_set1_ps(dm[c][j]), vm = _mm256_set1_ps(dm[c][8 + j]);
					wl[c] = _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(a), vm);
					wh[c] = _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(h), vm);
				} else {
					float d, mn;
					__m128i q = q16(qt, b, g, &d, &mn);
					const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(mn);
					wl[c] = _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), vm);
					wh[c] = _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), vm);
				}
			}
			#pragma GCC unroll 16
			for (int r = 0; r < R; r++) {
				const __m256 xl = _mm256_loadu_ps(xb + r * k + 16 * g), xh = _mm256_loadu_ps(xb + r * k + 16 * g + 8);
				#pragma GCC unroll 16
				for (int c = 0; c < NC; c++) {
					lo[r][c] = _mm256_fmadd_ps(xl, wl[c], lo[r][c]);
					hi[r][c] = _mm256_fmadd_ps(xh, wh[c], hi[r][c]);
				}
			}
		}
	}
	#pragma GCC unroll 16
	for (int r = 0; r < R; r++)
		#pragma GCC unroll 16
		for (int c = 0; c < NC; c++)
			out[r * ldo + c] = hsum2(lo[r][c], hi[r][c]);
}

// cols runs tile for R rows over columns [j0, j1): NC at a time, then the
// rest one by one.
QINLINE void cols(const int qt, const int R, const int NC, float *out, const float *x, const uint8_t *w,
                  int64_t n, int64_t k, int64_t rb, int64_t j0, int64_t j1) {
	int64_t j = j0;
	for (; j + NC <= j1; j += NC) {
		const int64_t ahead = qpf_rows(NC, rb);
		tile(qt, R, NC, x, k, w + j * rb, rb, out + j, n, j + NC + ahead <= j1 ? w + (j + ahead) * rb : 0);
	}
	for (; j < j1; j++)
		tile(qt, R, 1, x, k, w + j * rb, rb, out + j, n, 0);
}

QINLINE void linear_q(const int qt, float *out, const float *x, const uint8_t *w,
                      int64_t m, int64_t n, int64_t k, int64_t j0, int64_t j1) {
	const int64_t rb = k / block_size(qt) * block_bytes(qt);
	// Q8_0 and Q6_K keep one column per pass (they gain nothing from more).
	const int nc = qt == DI_Q8_0 || qt == DI_Q6_K ? 1 : 2;
	int64_t i = 0;
	for (; i + 4 <= m; i += 4)
		cols(qt, 4, 1, out + i * n, x + i * k, w, n, k, rb, j0, j1);
	switch (m - i) {
	case 3: cols(qt, 3, 1, out + i * n, x + i * k, w, n, k, rb, j0, j1); break;
	case 2: cols(qt, 2, nc, out + i * n, x + i * k, w, n, k, rb, j0, j1); break;
	case 1: cols(qt, 1, nc, out + i * n, x + i * k, w, n, k, rb, j0, j1); break;
	}
}

QTARGET void di_linear_quant_avx2(int qtype, float *out, const float *x, const uint8_t *w,
                                  int64_t m, int64_t n, int64_t k, int64_t j0, int64_t j1) {
	switch (qtype) {
	case DI_Q8_0: linear_q(DI_Q8_0, out, x, w, m, n, k, j0, j1); break;
	case DI_Q4_0: linear_q(DI_Q4_0, out, x, w, m, n, k, j0, j1); break;
	case DI_Q4_K: linear_q(DI_Q4_K, out, x, w, m, n, k, j0, j1); break;
	case DI_Q5_K: linear_q(DI_Q5_K, out, x, w, m, n, k, j0, j1); break;
	case DI_Q6_K: linear_q(DI_Q6_K, out, x, w, m, n, k, j0, j1); break;
	}
}

// dequant writes the weights of nb whole blocks at w into dst (nb times the
// block size floats), each as d*q - mn with one rounding: the same values
// rows() multiplies with, and those of Dequantize.
QINLINE void dequant(const int qt, float *dst, const uint8_t *w, int64_t nb) {
	const int bs = block_size(qt);
	const int64_t bb = block_bytes(qt);
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *blk = w + b * bb;
		float *y = dst + b * bs;
		for (int g = 0; g < bs / 16; g++) {
			float d, mn;
			__m128i q = q16(qt, blk, g, &d, &mn);
			const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(mn);
			_mm256_storeu_ps(y + 16 * g, _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), vm));
			_mm256_storeu_ps(y + 16 * g + 8,
			                 _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), vm));
		}
	}
}

QTARGET void di_dequant_avx2(int qtype, float *dst, const uint8_t *w, int64_t nb) {
	switch (qtype) {
	case DI_Q8_0: dequant(DI_Q8_0, dst, w, nb); break;
	case DI_Q4_0: dequant(DI_Q4_0, dst, w, nb); break;
	case DI_Q4_K: dequant(DI_Q4_K, dst, w, nb); break;
	case DI_Q5_K: dequant(DI_Q5_K, dst, w, nb); break;
	case DI_Q6_K: dequant(DI_Q6_K, dst, w, nb); break;
	}
}
