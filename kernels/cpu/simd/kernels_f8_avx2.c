//go:build cgo

// AVX2 + FMA + F16C kernel of LinearF8 (see kernels_f8_avx512.c for the
// widening, the scaled activations and the two paths, kernels_avx2.c for
// the canonical order on (lo, hi) pairs of ymm registers). The register
// path widens 8 bytes at a time with no conversion instruction: each
// byte's sign goes to bit 31 of a float32 and its exponent and mantissa to
// bits 26..20 (one VPMOVSXBD, a shift and a mask), which is the float32 of
// 2^-120 its value, an E4M3 subnormal a float32 subnormal (exact where
// MXCSR's DAZ is off, as in Go programs). The scaled rows meet these weights multiplied by 2^112
// (f8_raw_acts), so each product is the same real number as the scaled
// rows' product with the weights times 2^-8 and the sums have the same
// bits; a run whose scaled rows reach 2^16 in magnitude (2^112 times that
// would overflow), or a call under MXCSR's DAZ, widens through VCVTPH2PS
// as the panel path does (the byte made an IEEE half of 2^-8 its value:
// one VPMOVSXBW, shift and mask, two conversions). One row with the
// weights in cache: 1.37x the conversions' rate (AMD Zen 4, two cores).
// From 5 rows on a panel of columns is widened once and di_linear_avx2's
// float32 kernel runs on it. The k tail runs on zero-padded copies blended
// into the lanes it covers.

#include <immintrin.h>
#include <math.h>
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

// f8_load8_raw widens 8 E4M3 bytes into 8 floats of 2^-120 their value.
AVX2 INLINE __m256 f8_load8_raw(const uint8_t *p) {
	__m256i d = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(d, 20), _mm256_set1_epi32((int)0x87F00000)));
}

// f8_widen8 widens 8 E4M3 bytes for the scaled rows tile_f8 is given:
// 2^-120 their value (raw) or 2^-8.
AVX2 INLINE __m256 f8_widen8(const int raw, const uint8_t *p) { return raw ? f8_load8_raw(p) : f8_load8(p); }

AVX2 INLINE float hsum2_f8(__m256 lo, __m256 hi) {
	__m256 s8 = _mm256_add_ps(lo, hi);
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	__m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
	return _mm_cvtss_f32(s1);
}

// tile_f8 computes an R x C tile (R*C <= 4) over all of k: scaled
// activation rows x[0..nr), weight rows w[0..nc) (all of one scale row: x
// is scaled for it, and by 2^112 more when raw); rows and columns past nr,
// nc repeat the last valid one and are not stored. pf, when not NULL, is
// the next tile's first weight row: each step prefetches its share of it
// (the weight stream of decode), into L2 only when pf_l2.
AVX2 INLINE void tile_f8(const int R, const int C, const int raw, const float *x, int nr, const uint8_t *w, int nc,
                         int64_t k, float *out, int64_t ldo, const uint8_t *pf, const int pf_l2) {
	const float *xr[4];
	const uint8_t *wc[4];
	__m256 lo[4], hi[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		xr[r] = x + (r < nr ? r : nr - 1) * k;
#pragma GCC unroll 4
	for (int c = 0; c < C; c++)
		wc[c] = w + (c < nc ? c : nc - 1) * k;
#pragma GCC unroll 4
	for (int f = 0; f < R * C; f++)
		lo[f] = hi[f] = _mm256_setzero_ps();
	const int64_t k16 = k & ~(int64_t)15;
	int64_t kk = 0;
	for (; kk < k16; kk += 16) {
		if (pf) {
			const uint8_t *p = pf + kk * C;
#pragma GCC unroll 4
			for (int q = 0; q < C * 16; q += 64)
				DI_F8_PREFETCH(p + q, pf_l2);
		}
		__m256 xl[4], xh[4];
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			xl[r] = _mm256_loadu_ps(xr[r] + kk);
			xh[r] = _mm256_loadu_ps(xr[r] + kk + 8);
		}
#pragma GCC unroll 4
		for (int c = 0; c < C; c++) {
			__m256 wl, wh;
			if (raw) {
				wl = f8_load8_raw(wc[c] + kk);
				wh = f8_load8_raw(wc[c] + kk + 8);
			} else {
				f8_load16(wc[c] + kk, &wl, &wh);
			}
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				lo[r * C + c] = _mm256_fmadd_ps(xl[r], wl, lo[r * C + c]);
				hi[r * C + c] = _mm256_fmadd_ps(xh[r], wh, hi[r * C + c]);
			}
		}
	}
	if (kk < k) {
		int rem = (int)(k - kk);
		__m256i rv = _mm256_set1_epi32(rem);
		__m256 mlo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(rv, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
		__m256 mhi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(rv, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)));
		__m256 wl[4], wh[4];
#pragma GCC unroll 4
		for (int c = 0; c < C; c++) {
			uint8_t buf[16] = {0};
			memcpy(buf, wc[c] + kk, rem);
			wl[c] = f8_widen8(raw, buf);
			wh[c] = f8_widen8(raw, buf + 8);
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

// rows_f8 runs the R x C tiles of rows [i0, i0+nr) of the scaled
// activations xs (row i0 first) against weight rows [ja, jb), the columns
// short of a full tile one at a time (see kernels_f8_avx512.c); pf_end
// bounds the weight rows the tiles prefetch (the column block's end).
AVX2 INLINE void rows_f8_pf(const int R, const int C, const int raw, const int pf_l2, float *out, const float *xs,
                            const uint8_t *w, int64_t n, int64_t k, int64_t i0, int nr, int64_t ja, int64_t jb,
                            int64_t pf_end) {
	int64_t j = ja;
	for (; j + C <= jb; j += C) {
		const uint8_t *pf = j + 2 * C <= pf_end ? w + (j + C) * k : 0;
		tile_f8(R, C, raw, xs, nr, w + j * k, C, k, out + i0 * n + j, n, pf, pf_l2);
	}
	for (; j < jb; j++)
		tile_f8(R, 1, raw, xs, nr, w + j * k, 1, k, out + i0 * n + j, n, 0, 0);
}

AVX2 INLINE void rows_f8(const int R, const int C, const int raw, float *out, const float *xs, const uint8_t *w,
                         int64_t n, int64_t k, int64_t i0, int nr, int64_t ja, int64_t jb, int64_t pf_end) {
	if (di_f8_prefetch_l2(R, C, k))
		rows_f8_pf(R, C, raw, 1, out, xs, w, n, k, i0, nr, ja, jb, pf_end);
	else
		rows_f8_pf(R, C, raw, 0, out, xs, w, n, k, i0, nr, ja, jb, pf_end);
}

// f8_scale_acts: see kernels_f8_avx512.c.
AVX2 static void f8_scale_acts(float *xs, const float *x, int64_t m, int64_t k, const float *sc, int sh) {
	for (int64_t i = 0; i < m; i++) {
		const float *src = x + i * k;
		float *dst = xs + i * k;
		for (int64_t lo = 0; lo < k; lo += (int64_t)1 << sh) {
			int64_t hi = lo + ((int64_t)1 << sh);
			if (hi > k)
				hi = k;
			const float s1 = sc[lo >> sh] * 256.0f;
			const __m256 s = _mm256_set1_ps(s1);
			int64_t kk = lo;
			for (; kk + 8 <= hi; kk += 8)
				_mm256_storeu_ps(dst + kk, _mm256_mul_ps(_mm256_loadu_ps(src + kk), s));
			for (; kk < hi; kk++)
				dst[kk] = src[kk] * s1;
		}
	}
}

// f8_raw_acts multiplies the m rows of k scaled activations in xs by 2^112
// and returns 1 when all of them are below 2^16 in magnitude (the product
// then exact: no overflow, and 2^112 times a float32 subnormal is exact too),
// for weights widened by f8_load8_raw; otherwise (a larger value, an
// infinity or a NaN) it leaves xs as it is and returns 0.
AVX2 static int f8_raw_acts(float *xs, int64_t m, int64_t k) {
	const int64_t len = m * k;
	const __m256 lim = _mm256_set1_ps(65536.0f), abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
	int64_t i = 0;
	for (; i + 8 <= len; i += 8)
		ok = _mm256_and_ps(ok, _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(xs + i), abs), lim, _CMP_LT_OQ));
	int fits = _mm256_movemask_ps(ok) == 0xff;
	for (; i < len; i++)
		fits &= fabsf(xs[i]) < 65536.0f;
	if (!fits)
		return 0;
	const __m256 p = _mm256_set1_ps(0x1p112f);
	for (i = 0; i + 8 <= len; i += 8)
		_mm256_storeu_ps(xs + i, _mm256_mul_ps(_mm256_loadu_ps(xs + i), p));
	for (; i < len; i++)
		xs[i] *= 0x1p112f;
	return 1;
}

#define F8_L2_BLOCK_BYTES (384 * 1024)

// Rows from which the panel path runs: per 16 weights of a column, 2-row
// register tiles cost 5 uops of widening per tile plus the FMAs, the panel
// 7 once plus the FMAs (16 ymm registers hold no taller tile than
// kernels_f8_avx512.c's 8 x 2).
#define F8_PANEL_MIN_ROWS 5

// f8_widen_rows writes rows [jb, je) of w widened into dst ([je-jb][k]
// float32, each E4M3 value times 2^-8): the values the register path
// multiplies in registers.
AVX2 static void f8_widen_rows(float *dst, const uint8_t *w, int64_t k, int64_t jb, int64_t je) {
	for (int64_t j = jb; j < je; j++) {
		const uint8_t *src = w + j * k;
		float *d = dst + (j - jb) * k;
		int64_t kk = 0;
		for (; kk + 16 <= k; kk += 16) {
			__m256 lo, hi;
			f8_load16(src + kk, &lo, &hi);
			_mm256_storeu_ps(d + kk, lo);
			_mm256_storeu_ps(d + kk + 8, hi);
		}
		if (kk < k) {
			uint8_t buf[16] = {0};
			float tmp[16];
			int rem = (int)(k - kk);
			memcpy(buf, src + kk, rem);
			__m256 lo, hi;
			f8_load16(buf, &lo, &hi);
			_mm256_storeu_ps(tmp, lo);
			_mm256_storeu_ps(tmp + 8, hi);
			memcpy(d + kk, tmp, rem * sizeof(float));
		}
	}
}

// linear_f8_regs: up to 4 rows, in register tiles, each run of columns that
// share a scale row against the rows scaled for it (see
// kernels_f8_avx512.c).
AVX2 static void linear_f8_regs(float *out, const float *x, const uint8_t *w, const float *scales,
                                const int32_t *scale_row, int sh, int64_t m, int64_t n, int64_t k,
                                int64_t j0, int64_t j1, float *xs) {
	const int64_t kb = (k + ((int64_t)1 << sh) - 1) >> sh;
	int64_t nb = F8_L2_BLOCK_BYTES / (k > 0 ? k : 1);
	nb = nb < 16 ? 16 : nb / 16 * 16;
	const int may_raw = !(_mm_getcsr() & DI_MXCSR_DAZ); // subnormal weights must read as themselves
	int32_t scaled = -1;                                // the scale row xs holds
	int raw = 0;                                        // xs is scaled by 2^112 more
	for (int64_t jb = j0; jb < j1; jb += nb) {
		int64_t je = j1 - jb < nb ? j1 : jb + nb;
		for (int64_t ja = jb; ja < je;) {
			const int64_t jr = di_f8_run_end(scale_row, ja, je);
			if (scale_row[ja] != scaled) {
				scaled = scale_row[ja];
				f8_scale_acts(xs, x, m, k, scales + (int64_t)scaled * kb, sh);
				raw = may_raw && f8_raw_acts(xs, m, k);
			}
			for (int64_t i = 0; i < m;) {
				const int two = m - i >= 2;
				if (two && raw)
					rows_f8(2, 2, 1, out, xs + i * k, w, n, k, i, 2, ja, jr, je);
				else if (two)
					rows_f8(2, 2, 0, out, xs + i * k, w, n, k, i, 2, ja, jr, je);
				else if (raw)
					rows_f8(1, 4, 1, out, xs + i * k, w, n, k, i, 1, ja, jr, je);
				else
					rows_f8(1, 4, 0, out, xs + i * k, w, n, k, i, 1, ja, jr, je);
				i += two ? 2 : 1;
			}
			ja = jr;
		}
	}
}

// linear_f8_panel: see kernels_f8_avx512.c.
AVX2 static int linear_f8_panel(float *out, const float *x, const uint8_t *w, const float *scales,
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
				di_linear_avx2(DI_F32, out + i0 * n + jb, xs, panel, mr, n, k, ja - jb, jr - jb);
				ja = jr;
			}
		}
	}
	free(panel);
	return 1;
}

void di_linear_f8_avx2(float *out, const float *x, const uint8_t *w, const float *scales,
                       const int32_t *scale_row, int block_shift, int64_t m, int64_t n, int64_t k,
                       int64_t j0, int64_t j1, float *xs) {
	if (m >= F8_PANEL_MIN_ROWS && k > 0 &&
	    linear_f8_panel(out, x, w, scales, scale_row, block_shift, m, n, k, j0, j1, xs))
		return;
	for (int64_t i0 = 0; i0 < m; i0 += 4) {
		const int64_t mr = m - i0 < 4 ? m - i0 : 4;
		linear_f8_regs(out + i0 * n, x + i0 * k, w, scales, scale_row, block_shift, mr, n, k, j0, j1, xs);
	}
}
