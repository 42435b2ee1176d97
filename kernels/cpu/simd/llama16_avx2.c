//go:build cgo

// Linear16Llama for AVX2 + FMA + F16C: llama.cpp's generic
// ggml_vec_dot_bf16 / ggml_vec_dot_f16 order, bit for bit, as in
// llama16_avx512.c. The vector lanes hold 8 weight rows (output columns):
// each step loads 8 values of each of the 8 rows, transposes them in
// registers (16-bit unpacks) and widens them to float32; every product
// x[kk]*w[kk] is one float32 multiply, widened to float64 and added to its
// column's sum in order (two ymm of 4 float64 per activation row).

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_amd64.h"

#define L16A static inline __attribute__((always_inline)) __attribute__((target("avx2,fma,f16c")))
#define L16ATARGET __attribute__((target("avx2,fma,f16c")))

L16A float l16a_one(const int bf16, uint16_t h) {
	if (bf16) {
		uint32_t u = (uint32_t)h << 16;
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	return _cvtsh_ss(h);
}

// l16a_widen returns the 8 16-bit values of t as float32.
L16A __m256 l16a_widen(const int bf16, __m128i t) {
	if (bf16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(t), 16));
	return _mm256_cvtph_ps(t);
}

// l16a_add adds the products of the 8 columns wv with R rows' activation
// kk (xf + r*k + kk) to their sums (lo: columns 0-3, hi: 4-7).
L16A void l16a_add(const int R, __m256 wv, const float *xf, int64_t k, int64_t kk, __m256d *lo, __m256d *hi) {
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		const __m256 p = _mm256_mul_ps(wv, _mm256_set1_ps(xf[r * k + kk]));
		lo[r] = _mm256_add_pd(lo[r], _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
		hi[r] = _mm256_add_pd(hi[r], _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
	}
}

// l16a_tile computes R (<= 4) rows of xf (float32, stride k) against the 8
// weight rows w + c*k (rows past nc repeat the last): out[r*ldo + c],
// c < nc.
L16A void l16a_tile(const int bf16, const int R, const uint16_t *w, int64_t k, int nc, const float *xf, float *out,
                    int64_t ldo) {
	const uint16_t *rw[8];
#pragma GCC unroll 8
	for (int c = 0; c < 8; c++)
		rw[c] = w + (c < nc ? c : nc - 1) * k;
	__m256d lo[4], hi[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		lo[r] = hi[r] = _mm256_setzero_pd();
	int64_t kk = 0;
	for (; kk + 8 <= k; kk += 8) {
		__m128i v[8], a[8], b[8];
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++)
			v[c] = _mm_loadu_si128((const __m128i *)(rw[c] + kk));
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			a[2 * i] = _mm_unpacklo_epi16(v[2 * i], v[2 * i + 1]);
			a[2 * i + 1] = _mm_unpackhi_epi16(v[2 * i], v[2 * i + 1]);
		}
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			b[4 * h + 0] = _mm_unpacklo_epi32(a[4 * h + 0], a[4 * h + 2]);
			b[4 * h + 1] = _mm_unpackhi_epi32(a[4 * h + 0], a[4 * h + 2]);
			b[4 * h + 2] = _mm_unpacklo_epi32(a[4 * h + 1], a[4 * h + 3]);
			b[4 * h + 3] = _mm_unpackhi_epi32(a[4 * h + 1], a[4 * h + 3]);
		}
		// t(i): the 8 columns at kk + i.
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			l16a_add(R, l16a_widen(bf16, _mm_unpacklo_epi64(b[i], b[i + 4])), xf, k, kk + 2 * i, lo, hi);
			l16a_add(R, l16a_widen(bf16, _mm_unpackhi_epi64(b[i], b[i + 4])), xf, k, kk + 2 * i + 1, lo, hi);
		}
	}
	for (; kk < k; kk++) {
		float wt[8];
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++)
			wt[c] = l16a_one(bf16, rw[c][kk]);
		l16a_add(R, _mm256_loadu_ps(wt), xf, k, kk, lo, hi);
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		float f[8];
		_mm_storeu_ps(f, _mm256_cvtpd_ps(lo[r]));
		_mm_storeu_ps(f + 4, _mm256_cvtpd_ps(hi[r]));
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = f[c];
	}
}

// l16a_linear runs the tiles over the ncols weight rows, 8 at a time, each
// against the m rows of xf in groups of up to 4 (a tile's 8 rows stay in
// L1 while the groups pass).
L16A void l16a_linear(const int bf16, const float *xf, const uint16_t *w, int64_t m, int64_t k, int64_t ncols,
                      float *out, int64_t ldo) {
	for (int64_t j = 0; j < ncols; j += 8) {
		const int nc = ncols - j < 8 ? (int)(ncols - j) : 8;
		int64_t i = 0;
		for (; i + 4 <= m; i += 4)
			l16a_tile(bf16, 4, w + j * k, k, nc, xf + i * k, out + i * ldo + j, ldo);
		switch (m - i) {
		case 3: l16a_tile(bf16, 3, w + j * k, k, nc, xf + i * k, out + i * ldo + j, ldo); break;
		case 2: l16a_tile(bf16, 2, w + j * k, k, nc, xf + i * k, out + i * ldo + j, ldo); break;
		case 1: l16a_tile(bf16, 1, w + j * k, k, nc, xf + i * k, out + i * ldo + j, ldo); break;
		}
	}
}

L16ATARGET int di_linear16_llama_avx2(int bf16, float *out, int64_t ldo, const uint16_t *x, const uint16_t *w,
                                      int64_t m, int64_t k, int64_t ncols) {
	float small[4096];
	float *xf = m * k <= 4096 ? small : malloc((size_t)(m * k) * sizeof(float));
	if (!xf)
		return 0;
	for (int64_t i = 0; i < m * k; i++)
		xf[i] = l16a_one(bf16, x[i]);
	if (bf16)
		l16a_linear(1, xf, w, m, k, ncols, out, ldo);
	else
		l16a_linear(0, xf, w, m, k, ncols, out, ldo);
	if (xf != small)
		free(xf);
	return 1;
}
