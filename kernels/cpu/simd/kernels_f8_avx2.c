//go:build cgo

// AVX2 + FMA + F16C kernel of LinearF8 (see kernels_f8_avx512.c for the
// widening and the two paths, kernels_avx2.c for the canonical order on
// (lo, hi) pairs of ymm registers). The register path widens 16 bytes at a
// time (one VPMOVSXBW, shift and mask, two conversions); from 5 rows on a
// panel of columns is widened once and di_linear_avx2's float32 kernel
// runs on it. The k tail runs on zero-padded copies blended into the lanes
// it covers.

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd_amd64.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

// f8_load8 widens 8 E4M3 bytes into 8 floats of 2^-8 their value.
AVX2 INLINE __m256 f8_load8(const uint8_t *p) {
	__m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
	h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)0xBFFF));
	return _mm256_cvtph_ps(h);
}

// f8_load16 widens 16 E4M3 bytes into two vectors of 8 floats of 2^-8
// their value (lo: bytes 0..7, hi: bytes 8..15).
AVX2 INLINE void f8_load16(const uint8_t *p, __m256 *lo, __m256 *hi) {
	__m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
	h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBFFF));
	*lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
	*hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

AVX2 INLINE float hsum2_f8(__m256 lo, __m256 hi) {
	__m256 s8 = _mm256_add_ps(lo, hi);
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	__m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
	return _mm_cvtss_f32(s1);
}

// tile_f8 computes an R x C tile (R*C <= 4) over all of k; rows and
// columns past nr, nc repeat the last valid one and are not stored.
AVX2 INLINE void tile_f8(const int R, const int C, const float *x, int nr, const uint8_t *w,
                         const float *const sc_in[4], int nc, int64_t k, int sh, float *out,
                         int64_t ldo) {
	const float *xr[4];
	const uint8_t *wc[4];
	const float *sc[4];
	__m256 lo[4], hi[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		xr[r] = x + (r < nr ? r : nr - 1) * k;
#pragma GCC unroll 4
	for (int c = 0; c < C; c++) {
		int cc = c < nc ? c : nc - 1;
		wc[c] = w + cc * k;
		sc[c] = sc_in[cc];
	}
#pragma GCC unroll 4
	for (int f = 0; f < R * C; f++)
		lo[f] = hi[f] = _mm256_setzero_ps();
	const int64_t k16 = k & ~(int64_t)15;
	int64_t kk = 0;
	while (kk < k16) {
		const int64_t bi = kk >> sh;
		int64_t be = (bi + 1) << sh;
		if (be > k16)
			be = k16;
		__m256 sv[4];
#pragma GCC unroll 4
		for (int c = 0; c < C; c++)
			sv[c] = _mm256_set1_ps(sc[c][bi] * 256.0f);
		for (; kk < be; kk += 16) {
			__m256 xl[4], xh[4];
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				xl[r] = _mm256_loadu_ps(xr[r] + kk);
				xh[r] = _mm256_loadu_ps(xr[r] + kk + 8);
			}
#pragma GCC unroll 4
			for (int c = 0; c < C; c++) {
				__m256 wl, wh;
				f8_load16(wc[c] + kk, &wl, &wh);
				wl = _mm256_mul_ps(wl, sv[c]);
				wh = _mm256_mul_ps(wh, sv[c]);
#pragma GCC unroll 4
				for (int r = 0; r < R; r++) {
					lo[r * C + c] = _mm256_fmadd_ps(xl[r], wl, lo[r * C + c]);
					hi[r * C + c] = _mm256_fmadd_ps(xh[r], wh, hi[r * C + c]);
				}
			}
		}
	}
	if (kk < k) {
		const int64_t bi = kk >> sh;
		int rem = (int)(k - kk);
		__m256i rv = _mm256_set1_epi32(rem);
		__m256 mlo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(rv, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
		__m256 mhi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(rv, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)));
		__m256 wl[4], wh[4];
#pragma GCC unroll 4
		for (int c = 0; c < C; c++) {
			uint8_t buf[16] = {0};
			memcpy(buf, wc[c] + kk, rem);
			__m256 s = _mm256_set1_ps(sc[c][bi] * 256.0f);
			wl[c] = _mm256_mul_ps(f8_load8(buf), s);
			wh[c] = _mm256_mul_ps(f8_load8(buf + 8), s);
		}
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			float xb[16] = {0};
			memcpy(xb, xr[r] + kk, rem * sizeof(float));
			__m256 xl = _mm256_loadu_ps(xb), xh = _mm256_loadu_ps(xb + 8);
#pragma GCC unroll 4
			for (int c = 0; c < C; c++) {
				int f = r * C + c;
				lo[f] = _mm256_blendv_ps(lo[f], _mm256_fmadd_ps(xl, wl[c], lo[f]), mlo);
				hi[f] = _mm256_blendv_ps(hi[f], _mm256_fmadd_ps(xh, wh[c], hi[f]), mhi);
			}
		}
	}
	for (int r = 0; r < nr; r++)
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = hsum2_f8(lo[r * C + c], hi[r * C + c]);
}

AVX2 INLINE void rows_f8(const int R, const int C, float *out, const float *x, const uint8_t *w,
                         const float *scales, const int32_t *scale_row, int64_t n, int64_t k,
                         int sh, int64_t i0, int nr, int64_t jb, int64_t je) {
	const int64_t kb = (k + ((int64_t)1 << sh) - 1) >> sh;
	for (int64_t j = jb; j < je; j += C) {
		int nc = je - j < C ? (int)(je - j) : C;
		const float *sc[4];
		for (int c = 0; c < nc; c++)
			sc[c] = scales + (int64_t)scale_row[j + c] * kb;
		tile_f8(R, C, x + i0 * k, nr, w + j * k, sc, nc, k, sh, out + i0 * n + j, n);
	}
}

#define F8_L2_BLOCK_BYTES (384 * 1024)

// Rows from which the panel path runs: per 16 weights of a column, 2-row
// register tiles cost 7 uops of widening and scaling per tile plus the
// FMAs, the panel 8 once plus the FMAs (16 ymm registers hold no taller
// tile than kernels_f8_avx512.c's 8 x 2).
#define F8_PANEL_MIN_ROWS 5

// f8_widen_rows writes rows [jb, je) of w dequantized into dst ([je-jb][k]
// float32): the values the register path multiplies in registers.
AVX2 static void f8_widen_rows(float *dst, const uint8_t *w, const float *scales,
                               const int32_t *scale_row, int sh, int64_t k, int64_t jb, int64_t je) {
	const int64_t kb = (k + ((int64_t)1 << sh) - 1) >> sh;
	for (int64_t j = jb; j < je; j++) {
		const uint8_t *src = w + j * k;
		const float *sc = scales + (int64_t)scale_row[j] * kb;
		float *d = dst + (j - jb) * k;
		int64_t kk = 0;
		while (kk < k) {
			const int64_t bi = kk >> sh;
			int64_t be = (bi + 1) << sh;
			if (be > k)
				be = k;
			const __m256 s = _mm256_set1_ps(sc[bi] * 256.0f);
			for (; kk + 16 <= be; kk += 16) {
				__m256 lo, hi;
				f8_load16(src + kk, &lo, &hi);
				_mm256_storeu_ps(d + kk, _mm256_mul_ps(lo, s));
				_mm256_storeu_ps(d + kk + 8, _mm256_mul_ps(hi, s));
			}
			if (kk < be) {
				uint8_t buf[16] = {0};
				float tmp[16];
				int rem = (int)(be - kk);
				memcpy(buf, src + kk, rem);
				__m256 lo, hi;
				f8_load16(buf, &lo, &hi);
				_mm256_storeu_ps(tmp, _mm256_mul_ps(lo, s));
				_mm256_storeu_ps(tmp + 8, _mm256_mul_ps(hi, s));
				memcpy(d + kk, tmp, rem * sizeof(float));
				kk = be;
			}
		}
	}
}

AVX2 static void linear_f8_regs(float *out, const float *x, const uint8_t *w, const float *scales,
                                const int32_t *scale_row, int sh, int64_t m, int64_t n, int64_t k,
                                int64_t j0, int64_t j1) {
	int64_t nb = F8_L2_BLOCK_BYTES / (k > 0 ? k : 1);
	nb = nb < 16 ? 16 : nb / 16 * 16;
	for (int64_t jb = j0; jb < j1; jb += nb) {
		int64_t je = j1 - jb < nb ? j1 : jb + nb;
		for (int64_t i = 0; i < m;) {
			if (m - i >= 2) {
				rows_f8(2, 2, out, x, w, scales, scale_row, n, k, sh, i, 2, jb, je);
				i += 2;
			} else {
				rows_f8(1, 4, out, x, w, scales, scale_row, n, k, sh, i, 1, jb, je);
				i += 1;
			}
		}
	}
}

// linear_f8_panel: see kernels_f8_avx512.c.
AVX2 static int linear_f8_panel(float *out, const float *x, const uint8_t *w, const float *scales,
                                const int32_t *scale_row, int sh, int64_t m, int64_t n, int64_t k,
                                int64_t j0, int64_t j1) {
	int64_t nb = F8_L2_BLOCK_BYTES / (4 * k);
	nb = nb >= 16 ? nb / 16 * 16 : (nb >= 4 ? nb / 4 * 4 : 4);
	if (nb > j1 - j0)
		nb = j1 - j0;
	size_t bytes = ((size_t)nb * (size_t)k * sizeof(float) + 63) / 64 * 64;
	float *panel = aligned_alloc(64, bytes);
	if (!panel)
		return 0;
	for (int64_t jb = j0; jb < j1; jb += nb) {
		int64_t je = j1 - jb < nb ? j1 : jb + nb;
		f8_widen_rows(panel, w, scales, scale_row, sh, k, jb, je);
		di_linear_avx2(DI_F32, out + jb, x, panel, m, n, k, 0, je - jb);
	}
	free(panel);
	return 1;
}

void di_linear_f8_avx2(float *out, const float *x, const uint8_t *w, const float *scales,
                       const int32_t *scale_row, int block_shift, int64_t m, int64_t n, int64_t k,
                       int64_t j0, int64_t j1) {
	if (m >= F8_PANEL_MIN_ROWS && k > 0 &&
	    linear_f8_panel(out, x, w, scales, scale_row, block_shift, m, n, k, j0, j1))
		return;
	linear_f8_regs(out, x, w, scales, scale_row, block_shift, m, n, k, j0, j1);
}
