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

// rows computes R (1..4) rows of x against one row of W.
QINLINE void rows(const int qt, const int R, const float *x, int64_t k, const uint8_t *wr, float *out, int64_t ldo) {
	__m512 acc[4];
	for (int r = 0; r < R; r++)
		acc[r] = _mm512_setzero_ps();
	const int bs = block_size(qt);
	const int64_t bb = block_bytes(qt);
	for (int64_t kb = 0; kb < k / bs; kb++) {
		const uint8_t *blk = wr + kb * bb;
		for (int g = 0; g < bs / 16; g++) {
			float d, mn;
			__m128i q = q16(qt, blk, g, &d, &mn);
			__m512 wv = _mm512_fmsub_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(mn));
			const int64_t kk = kb * bs + 16 * g;
			for (int r = 0; r < R; r++)
				acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * k + kk), wv, acc[r]);
		}
	}
	for (int r = 0; r < R; r++)
		out[r * ldo] = qhsum16(acc[r]);
}

QINLINE void linear_q(const int qt, float *out, const float *x, const uint8_t *w,
                      int64_t m, int64_t n, int64_t k, int64_t j0, int64_t j1) {
	const int64_t rb = k / block_size(qt) * block_bytes(qt);
	for (int64_t j = j0; j < j1; j++) {
		const uint8_t *wr = w + j * rb;
		int64_t i = 0;
		for (; i + 4 <= m; i += 4)
			rows(qt, 4, x + i * k, k, wr, out + i * n + j, n);
		switch (m - i) {
		case 3: rows(qt, 3, x + i * k, k, wr, out + i * n + j, n); break;
		case 2: rows(qt, 2, x + i * k, k, wr, out + i * n + j, n); break;
		case 1: rows(qt, 1, x + i * k, k, wr, out + i * n + j, n); break;
		}
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
