//go:build cgo

// LinearQuant for AVX-512 F/BW/VL/DQ: one canonical 16-lane accumulator is
// one zmm register, reduced by the canonical tree (lane l + lane l+8, ...).

#define QTARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#include "quant_blocks.h"

QINLINE float qhsum16(__m512 v) {
	__m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	__m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
	return _mm_cvtss_f32(s1);
}

// tile computes R (1..4) rows of x against NC (1..4) consecutive rows of W
// (row c at wr + c*rb), out[r*ldo + c]. Each output has its own accumulator
// and sees the same fused multiply-adds in the same order as with one row
// and one column: the columns only share the loads of x and the loop.
QINLINE void tile(const int qt, const int R, const int NC, const float *x, int64_t k, const uint8_t *wr, int64_t rb,
                  float *out, int64_t ldo, const uint8_t *pf) {
	__m512 acc[4][4];
	#pragma GCC unroll 16
	for (int r = 0; r < R; r++)
		#pragma GCC unroll 16
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	const int bs = block_size(qt);
	const int64_t bb = block_bytes(qt);
	const int64_t nb = k / bs;
	const __m512i m4 = _mm512_set1_epi32(0x0F);
	for (int64_t kb = 0; kb < nb; kb++) {
		const float *xb = x + kb * bs;
		const uint8_t *b0 = wr + kb * bb;
		if (pf)
			qprefetch_l2(pf + kb * NC * bb, NC * bb);
		if (qt == DI_Q4_0) {
			const __m512 tab = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
			__m512 w[4][2];
			#pragma GCC unroll 16
			for (int c = 0; c < NC; c++) {
				const uint8_t *b = b0 + c * rb;
				const __m512 vd = _mm512_set1_ps(qhalf(b));
				const __m512i v = _mm512_cvtepu8_epi32(load16(b + 2));
				// The table gives float(q - 8) for the low four bits.
				w[c][0] = _mm512_fmsub_ps(vd, _mm512_permutexvar_ps(v, tab), _mm512_setzero_ps());
				w[c][1] = _mm512_fmsub_ps(vd, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab), _mm512_setzero_ps());
			}
			#pragma GCC unroll 16
			for (int g = 0; g < 2; g++)
				#pragma GCC unroll 16
				for (int r = 0; r < R; r++) {
					const __m512 xv = _mm512_loadu_ps(xb + r * k + 16 * g);
					#pragma GCC unroll 16
					for (int c = 0; c < NC; c++)
						acc[r][c] = _mm512_fmadd_ps(xv, w[c][g], acc[r][c]);
				}
		} else if (qt == DI_Q4_K || qt == DI_Q5_K) {
			float dm[4][16];
			#pragma GCC unroll 16
			for (int c = 0; c < NC; c++)
				k4_scales(b0 + c * rb, dm[c]);
			#pragma GCC unroll 16
			for (int ch = 0; ch < 4; ch++) {
				__m512 w[4][4];
				#pragma GCC unroll 16
				for (int c = 0; c < NC; c++) {
					const uint8_t *b = b0 + c * rb;
					const uint8_t *qs = b + (qt == DI_Q4_K ? 16 : 48) + 32 * ch;
					const __m512i v0 = _mm512_cvtepu8_epi32(load16(qs)), v1 = _mm512_cvtepu8_epi32(load16(qs + 16));
					// Groups 4ch..4ch+3: low nibbles of 32 bytes, then high.
					__m512i q[4] = {_mm512_and_si512(v0, m4), _mm512_and_si512(v1, m4), _mm512_srli_epi32(v0, 4),
					                _mm512_srli_epi32(v1, 4)};
					if (qt == DI_Q5_K) {
						const __m512i h0 = _mm512_cvtepu8_epi32(load16(b + 16)), h1 = _mm512_cvtepu8_epi32(load16(b + 32));
						const __m512i lo = _mm512_set1_epi32(1 << (2 * ch)), hi = _mm512_set1_epi32(2 << (2 * ch));
						const __m512i sixteen = _mm512_set1_epi32(16);
						q[0] = _mm512_mask_add_epi32(q[0], _mm512_test_epi32_mask(h0, lo), q[0], sixteen);
						q[1] = _mm512_mask_add_epi32(q[1], _mm512_test_epi32_mask(h1, lo), q[1], sixteen);
						q[2] = _mm512_mask_add_epi32(q[2], _mm512_test_epi32_mask(h0, hi), q[2], sixteen);
						q[3] = _mm512_mask_add_epi32(q[3], _mm512_test_epi32_mask(h1, hi), q[3], sixteen);
					}
					#pragma GCC unroll 16
					for (int gi = 0; gi < 4; gi++) {
						const int j = 2 * ch + gi / 2;
						w[c][gi] = _mm512_fmsub_ps(_mm512_set1_ps(dm[c][j]), _mm512_cvtepi32_ps(q[gi]),
						                           _mm512_set1_ps(dm[c][8 + j]));
					}
				}
				#pragma GCC unroll 16
				for (int gi = 0; gi < 4; gi++)
					#pragma GCC unroll 16
					for (int r = 0; r < R; r++) {
						const __m512 xv = _mm512_loadu_ps(xb + r * k + 64 * ch + 16 * gi);
						#pragma GCC unroll 16
						for (int c = 0; c < NC; c++)
							acc[r][c] = _mm512_fmadd_ps(xv, w[c][gi], acc[r][c]);
					}
			}
		} else {
			#pragma GCC unroll 16
			for (int g = 0; g < bs / 16; g++) {
				__m512 w[4];
				#pragma GCC unroll 16
				for (int c = 0; c < NC; c++) {
					float d, mn;
					__m128i q = q16(qt, b0 + c * rb, g, &d, &mn);
					w[c] = _mm512_fmsub_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(mn));
				}
				#pragma GCC unroll 16
				for (int r = 0; r < R; r++) {
					const __m512 xv = _mm512_loadu_ps(xb + r * k + 16 * g);
					#pragma GCC unroll 16
					for (int c = 0; c < NC; c++)
						acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
				}
			}
		}
	}
	#pragma GCC unroll 16
	for (int r = 0; r < R; r++)
		#pragma GCC unroll 16
		for (int c = 0; c < NC; c++)
			out[r * ldo + c] = qhsum16(acc[r][c]);
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
	// Q8_0 and Q6_K keep one column per pass with several rows of x (they
	// gain nothing from more); for one row, Q8_0 takes two columns, two
	// chains of fused multiply-adds: about 10% more GB/s from memory on one
	// core (BenchmarkDecodeLayer, six alternating runs), the same on two.
	const int one = qt == DI_Q8_0 || qt == DI_Q6_K;
	int64_t i = 0;
	for (; i + 4 <= m; i += 4)
		cols(qt, 4, one ? 1 : 2, out + i * n, x + i * k, w, n, k, rb, j0, j1);
	switch (m - i) {
	case 3: cols(qt, 3, one ? 1 : 2, out + i * n, x + i * k, w, n, k, rb, j0, j1); break;
	case 2: cols(qt, 2, one ? 1 : 4, out + i * n, x + i * k, w, n, k, rb, j0, j1); break;
	case 1: cols(qt, 1, qt == DI_Q8_0 ? 2 : one ? 1 : 4, out + i * n, x + i * k, w, n, k, rb, j0, j1); break;
	}
}

QTARGET void di_linear_quant_avx512(int qtype, float *out, const float *x, const uint8_t *w,
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
// block size floats), each group of 16 as d*q - mn with one rounding: the
// same values rows() multiplies with, and those of Dequantize.
QINLINE void dequant(const int qt, float *dst, const uint8_t *w, int64_t nb) {
	const int bs = block_size(qt);
	const int64_t bb = block_bytes(qt);
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *blk = w + b * bb;
		float *y = dst + b * bs;
		for (int g = 0; g < bs / 16; g++) {
			float d, mn;
			__m128i q = q16(qt, blk, g, &d, &mn);
			_mm512_storeu_ps(y + 16 * g, _mm512_fmsub_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
			                                             _mm512_set1_ps(mn)));
		}
	}
}

QTARGET void di_dequant_avx512(int qtype, float *dst, const uint8_t *w, int64_t nb) {
	switch (qtype) {
	case DI_Q8_0: dequant(DI_Q8_0, dst, w, nb); break;
	case DI_Q4_0: dequant(DI_Q4_0, dst, w, nb); break;
	case DI_Q4_K: dequant(DI_Q4_K, dst, w, nb); break;
	case DI_Q5_K: dequant(DI_Q5_K, dst, w, nb); break;
	case DI_Q6_K: dequant(DI_Q6_K, dst, w, nb); break;
	}
}
