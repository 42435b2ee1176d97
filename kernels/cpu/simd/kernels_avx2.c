//go:build cgo

// AVX2 + FMA + F16C kernels, each function with its own target attribute.
// One canonical 16-lane accumulator (package doc) is a pair of ymm
// registers: lo holds lanes 0..7, hi lanes 8..15. The tree's first step
// (lane l + lane l+8) is then lo + hi, and the rest is the AVX-512 path's.
// The k tail is run on zero-padded copies and blended into the lanes it
// covers, so lanes past k stay untouched as in the canonical order.

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd_amd64.h"
#include "attn_amd64.h"
#include "bf16pairs_amd64.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#define L2_BLOCK_BYTES (384 * 1024)

static inline int64_t esize(int dt) { return dt == DI_F32 ? 4 : 2; }

// load_w reads 16 weights at w[i..i+16) as lanes lo (0..7) and hi (8..15).
AVX2 INLINE void load_w(const int dt, const void *w, int64_t i, __m256 *lo, __m256 *hi) {
	switch (dt) {
	case DI_BF16: {
		const uint16_t *p = (const uint16_t *)w + i;
		*lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
		*hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 8))), 16));
		break;
	}
	case DI_F16: {
		const uint16_t *p = (const uint16_t *)w + i;
		*lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
		*hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
		break;
	}
	default: {
		const float *p = (const float *)w + i;
		*lo = _mm256_loadu_ps(p);
		*hi = _mm256_loadu_ps(p + 8);
	}
	}
}

#include "hsum2_avx2.h"

// tail_masks returns the blend masks of lanes [0, rem) for lo and hi.
AVX2 INLINE void tail_masks(int rem, __m256 *mlo, __m256 *mhi) {
	__m256i r = _mm256_set1_epi32(rem);
	*mlo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(r, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
	*mhi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(r, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)));
}

// tail_step runs the masked last k-step [kk, k) (k - kk < 16) of an R x C
// tile (C <= 4, R*C <= 6)
// into lo[r*C + c] and hi[r*C + c]: lanes past k keep their sums.
AVX2 INLINE void tail_step(const int dt, const int R, const int C, const float *const xr[4],
                           const char *const wc[4], int64_t kk, int64_t k, __m256 *lo, __m256 *hi) {
	int rem = (int)(k - kk);
	__m256 mlo, mhi, wl[4], wh[4];
	tail_masks(rem, &mlo, &mhi);
#pragma GCC unroll 4
	for (int c = 0; c < C; c++) {
		char buf[64] = {0};
		memcpy(buf, wc[c] + kk * esize(dt), rem * esize(dt));
		load_w(dt, buf, 0, &wl[c], &wh[c]);
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

// tile_store writes the sums of an R x C tile's accumulators (lo[f],
// hi[f]), f = r*C + c, to out[r*ldo + c] for r < nr, c < nc: hsum2's bits,
// four accumulators at a time (hsum2x4) where the tile has four or more.
AVX2 INLINE void tile_store(const int R, const int C, const __m256 *lo, const __m256 *hi, int nr, int nc,
                            float *out, int64_t ldo) {
	float s[8];
	int f = 0;
	for (; f + 4 <= R * C; f += 4)
		_mm_storeu_ps(s + f, hsum2x4(lo + f, hi + f));
	for (; f < R * C; f++)
		s[f] = hsum2(lo[f], hi[f]);
	for (int r = 0; r < nr; r++)
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = s[r * C + c];
}

// tile_rows computes an R x C block (R*C <= 4) of out as in the AVX-512
// path from the rows xr[r] of x (r < R) and the columns wc[c] of w (c < C),
// each valid for k elements; only rows r < nr and columns c < nc are
// stored (tile repeats the last valid one past them).
AVX2 INLINE void tile_rows(const int dt, const int R, const int C, const float *const xr[4], int nr,
                           const char *const wc[4], int nc, int64_t k, float *out, int64_t ldo) {
	__m256 lo[4], hi[4];
#pragma GCC unroll 4
	for (int f = 0; f < R * C; f++)
		lo[f] = hi[f] = _mm256_setzero_ps();
	int64_t kk = 0;
	// Rows in registers, one column's weights at a time.
	for (; kk + 16 <= k; kk += 16) {
		__m256 xl[4], xh[4];
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			xl[r] = _mm256_loadu_ps(xr[r] + kk);
			xh[r] = _mm256_loadu_ps(xr[r] + kk + 8);
		}
#pragma GCC unroll 4
		for (int c = 0; c < C; c++) {
			__m256 wl, wh;
			load_w(dt, wc[c], kk, &wl, &wh);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				lo[r * C + c] = _mm256_fmadd_ps(xl[r], wl, lo[r * C + c]);
				hi[r * C + c] = _mm256_fmadd_ps(xh[r], wh, hi[r * C + c]);
			}
		}
	}
	if (kk < k)
		tail_step(dt, R, C, xr, wc, kk, k, lo, hi);
	tile_store(R, C, lo, hi, nr, nc, out, ldo);
}

// load_w_half reads the 8 weights w[i+8h .. i+8h+8): lo (h = 0) or hi (h = 1)
// of load_w.
AVX2 INLINE __m256 load_w_half(const int dt, const void *w, int64_t i, int h) {
	switch (dt) {
	case DI_BF16:
		return _mm256_castsi256_ps(_mm256_slli_epi32(
		    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i + 8 * h))), 16));
	case DI_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i + 8 * h)));
	default:
		return _mm256_loadu_ps((const float *)w + i + 8 * h);
	}
}

// tile_rows_big is tile_rows for the GEMM tile of 3 rows by 2 columns
// (R*C <= 6): 12 accumulators, and each k-step runs its lo lanes, then its
// hi lanes, with the C weight vectors of the half and one row of x at a
// time in registers (15 ymm). Per 16 lanes that is 10 loads for 12
// fused multiply-adds, against 8 for 8 with the 2 x 2 tile. The FMAs of
// every lane are those of tile_rows, in the same order. One core of the
// Zen 5 VM of BENCH.md, m = 512: 72-78 -> 103-116 GFLOP/s (alternating
// builds; predicted +20% from the loads alone).
AVX2 INLINE void tile_rows_big(const int dt, const int R, const int C, const float *const xr[4], int nr,
                               const char *const wc[4], int nc, int64_t k, float *out, int64_t ldo) {
	__m256 acc[2][6];
#pragma GCC unroll 6
	for (int f = 0; f < R * C; f++)
		acc[0][f] = acc[1][f] = _mm256_setzero_ps();
	int64_t kk = 0;
	for (; kk + 16 <= k; kk += 16) {
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m256 wv[3];
#pragma GCC unroll 3
			for (int c = 0; c < C; c++)
				wv[c] = load_w_half(dt, wc[c], kk, h);
#pragma GCC unroll 3
			for (int r = 0; r < R; r++) {
				__m256 xv = _mm256_loadu_ps(xr[r] + kk + 8 * h);
				// Keep the row in a register (GCC would fold it into
				// each FMA as a memory operand, one load per column).
				__asm__("" : "+x"(xv));
#pragma GCC unroll 3
				for (int c = 0; c < C; c++)
					acc[h][r * C + c] = _mm256_fmadd_ps(xv, wv[c], acc[h][r * C + c]);
			}
		}
	}
	if (kk < k)
		tail_step(dt, R, C, xr, wc, kk, k, acc[0], acc[1]);
	tile_store(R, C, acc[0], acc[1], nr, nc, out, ldo);
}

// tile computes an R x C block (R*C <= 4) of out as in the AVX-512 path:
// rows and columns past nr, nc repeat the last valid one and are not stored.
AVX2 INLINE void tile(const int dt, const int R, const int C, const float *x, int nr,
                      const void *w, int nc, int64_t k, float *out, int64_t ldo) {
	const float *xr[4];
	const char *wc[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		xr[r] = x + (r < nr ? r : nr - 1) * k;
#pragma GCC unroll 4
	for (int c = 0; c < C; c++)
		wc[c] = (const char *)w + (c < nc ? c : nc - 1) * k * esize(dt);
	if (R * C > 4)
		tile_rows_big(dt, R, C, xr, nr, wc, nc, k, out, ldo);
	else
		tile_rows(dt, R, C, xr, nr, wc, nc, k, out, ldo);
}

AVX2 INLINE void linear_rows(const int dt, const int R, const int C, float *out, const float *x,
                             const void *w, int64_t n, int64_t k, int64_t i0, int nr, int64_t jb,
                             int64_t je) {
	for (int64_t j = jb; j < je; j += C) {
		int nc = je - j < C ? (int)(je - j) : C;
		tile(dt, R, C, x + i0 * k, nr, (const char *)w + j * k * esize(dt), nc, k, out + i0 * n + j, n);
	}
}

// linear_block runs rows [0, m) of out against the columns [jb, je) of w.
AVX2 INLINE void linear_block(const int dt, float *out, const float *x, const void *w, int64_t m,
                              int64_t n, int64_t k, int64_t jb, int64_t je) {
	for (int64_t i = 0; i < m;) {
		if (m >= 5 && m - i >= 3) {
			linear_rows(dt, 3, 2, out, x, w, n, k, i, 3, jb, je);
			i += 3;
		} else if (m - i >= 2) {
			linear_rows(dt, 2, 2, out, x, w, n, k, i, 2, jb, je);
			i += 2;
		} else if (m == 1) {
			// A decode row: one column at a time over the whole of k, so
			// that the weights (adjacent rows of w) arrive as one
			// sequential stream rather than four a row apart; each
			// column's FMAs are those of the 1 x 4 tile, in the same order.
			linear_rows(dt, 1, 1, out, x, w, n, k, i, 1, jb, je);
			i += 1;
		} else {
			linear_rows(dt, 1, 4, out, x, w, n, k, i, 1, jb, je);
			i += 1;
		}
	}
}

// widen_block writes columns [jb, je) of the 16-bit w (rows of k) to dst
// as float32 with the same stride k: exact, so the float32 tiles over dst
// run the very FMAs of the 16-bit tiles over w.
AVX2 INLINE void widen_block(const int dt, float *dst, const void *w, int64_t k, int64_t jb, int64_t je) {
	const int64_t total = (je - jb) * k, base = jb * k;
	const uint16_t *src = (const uint16_t *)w + base;
	int64_t i = 0;
	for (; i + 8 <= total; i += 8) {
		__m128i h = _mm_loadu_si128((const __m128i *)(src + i));
		__m256 v = dt == DI_BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
		                         : _mm256_cvtph_ps(h);
		_mm256_storeu_ps(dst + i, v);
	}
	for (; i < total; i++) {
		if (dt == DI_BF16) {
			uint32_t b = (uint32_t)src[i] << 16;
			memcpy(dst + i, &b, 4);
		} else {
			dst[i] = _cvtsh_ss(src[i]);
		}
	}
}

// The per-thread float32 panel of widen_block, allocated on a thread's
// first GEMM over 16-bit weights and kept for the thread's life.
#define WIDEN_BYTES (L2_BLOCK_BYTES)
static __thread float *widen_panel;

// linear runs columns [j0, j1) of out = x w^T in column blocks of
// L2_BLOCK_BYTES of w. A GEMM (6 rows or more) over 16-bit weights widens
// each column block to float32 once and runs the float32 tiles over it,
// instead of widening every weight vector again for each group of 3 rows.
// 5 rows (a speculative decode's verify rows at k = 4) read the 16-bit
// weights in their 3- and 2-row passes: the panel, written once and read
// twice at twice the bytes, made them cost 1.6-1.8 times 4 rows per row
// (BenchmarkLinearRows), 1.05-1.17 without it.
AVX2 INLINE void linear(const int dt, float *out, const float *x, const void *w, int64_t m,
                        int64_t n, int64_t k, int64_t j0, int64_t j1) {
	if (dt != DI_F32 && m >= 6 && k > 0) {
		if (!widen_panel && posix_memalign((void **)&widen_panel, 64, WIDEN_BYTES) != 0)
			widen_panel = 0;
		int64_t nb = WIDEN_BYTES / (k * 4);
		if (widen_panel && nb >= 16) {
			nb = nb / 16 * 16;
			for (int64_t jb = j0; jb < j1; jb += nb) {
				int64_t je = j1 - jb < nb ? j1 : jb + nb;
				widen_block(dt, widen_panel, w, k, jb, je);
				linear_block(DI_F32, out + jb, x, widen_panel, m, n, k, 0, je - jb);
			}
			return;
		}
	}
	int64_t nb = L2_BLOCK_BYTES / ((k > 0 ? k : 1) * esize(dt));
	nb = nb < 16 ? 16 : nb / 16 * 16;
	for (int64_t jb = j0; jb < j1; jb += nb) {
		int64_t je = j1 - jb < nb ? j1 : jb + nb;
		linear_block(dt, out, x, w, m, n, k, jb, je);
	}
}

AVX2 static void linear_f32(float *out, const float *x, const void *w, int64_t m, int64_t n,
                            int64_t k, int64_t j0, int64_t j1) {
	linear(DI_F32, out, x, w, m, n, k, j0, j1);
}
AVX2 static void linear_bf16(float *out, const float *x, const void *w, int64_t m, int64_t n,
                             int64_t k, int64_t j0, int64_t j1) {
	linear(DI_BF16, out, x, w, m, n, k, j0, j1);
}
AVX2 static void linear_f16(float *out, const float *x, const void *w, int64_t m, int64_t n,
                            int64_t k, int64_t j0, int64_t j1) {
	linear(DI_F16, out, x, w, m, n, k, j0, j1);
}

void di_linear_avx2(int dtype, float *out, const float *x, const void *w, int64_t m, int64_t n,
                    int64_t k, int64_t j0, int64_t j1) {
	switch (dtype) {
	case DI_BF16:
		linear_bf16(out, x, w, m, n, k, j0, j1);
		break;
	case DI_F16:
		linear_f16(out, x, w, m, n, k, j0, j1);
		break;
	default:
		linear_f32(out, x, w, m, n, k, j0, j1);
	}
}

// gather_pass runs rows [i, i+R) of x against every gathered column, R x C
// tiles (R*C <= 6, C <= 4; tile_rows_big from three rows), the rows of w
// of type dt (F32, or F16 widened in registers: the same FMAs).
AVX2 INLINE void gather_pass(const int dt, const int R, const int C, float *out, const float *x, const void *w,
                             const int32_t *rows, int64_t ldw, int64_t i, int64_t n, int64_t k) {
	const float *xr[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		xr[r] = x + (i + r) * k;
	for (int64_t j = 0; j < n; j += C) {
		int nc = n - j < C ? (int)(n - j) : C;
		const char *wc[4];
#pragma GCC unroll 4
		for (int c = 0; c < C; c++)
			wc[c] = (const char *)w + (int64_t)rows[j + (c < nc ? c : nc - 1)] * ldw * esize(dt);
		if (R > 2) // one row of x in registers at a time (tile_rows holds them all)
			tile_rows_big(dt, R, C, xr, R, wc, nc, k, out + i * n + j, n);
		else
			tile_rows(dt, R, C, xr, R, wc, nc, k, out + i * n + j, n);
	}
}

// gather_all is LinearF32Gather (dt F32) or LinearF16Gather (dt F16):
// linear's tiles with column c of a tile at row rows[j+c] of w. Three or
// four rows (the query heads of a KV head in grouped-query attention) take
// one pass, 3 x 2 or 4 x 1, so each gathered row is read once rather than
// once per pair of rows.
AVX2 INLINE void gather_all(const int dt, float *out, const float *x, const void *w, const int32_t *rows,
                            int64_t ldw, int64_t m, int64_t n, int64_t k) {
	for (int64_t i = 0; i < m;) {
		switch (m - i) {
		case 1:
			gather_pass(dt, 1, 4, out, x, w, rows, ldw, i, n, k);
			i += 1;
			break;
		case 2:
			gather_pass(dt, 2, 2, out, x, w, rows, ldw, i, n, k);
			i += 2;
			break;
		case 3:
			gather_pass(dt, 3, 2, out, x, w, rows, ldw, i, n, k);
			i += 3;
			break;
		default:
			gather_pass(dt, 4, 1, out, x, w, rows, ldw, i, n, k);
			i += 4;
		}
	}
}

AVX2 void di_linear_gather_avx2(float *out, const float *x, const float *w, const int32_t *rows, int64_t ldw,
                                int64_t m, int64_t n, int64_t k) {
	gather_all(DI_F32, out, x, w, rows, ldw, m, n, k);
}

AVX2 void di_linear_gather_f16_avx2(float *out, const float *x, const uint16_t *w, const int32_t *rows,
                                    int64_t ldw, int64_t m, int64_t n, int64_t k) {
	gather_all(DI_F16, out, x, w, rows, ldw, m, n, k);
}

// kmajor_s8_avx2 is kmajor_s8 of kernels_avx512.c on 8 columns and R <= 2
// rows (16 ymm registers); mk holds -1 in the lanes of columns inside the
// matrix.
AVX2 INLINE void kmajor_s8_avx2(const int R, const float *const xr[2], const float *w, int64_t n,
                                int64_t k, int l, __m256i mk, __m256 s8[2]) {
	__m256 a[2], b[2];
#pragma GCC unroll 2
	for (int r = 0; r < R; r++)
		a[r] = b[r] = _mm256_setzero_ps();
	for (int64_t kk = l; kk < k; kk += 16) {
		__m256 wa = _mm256_maskload_ps(w + kk * n, mk);
#pragma GCC unroll 2
		for (int r = 0; r < R; r++)
			a[r] = _mm256_fmadd_ps(_mm256_set1_ps(xr[r][kk]), wa, a[r]);
		if (kk + 8 < k) {
			__m256 wb = _mm256_maskload_ps(w + (kk + 8) * n, mk);
#pragma GCC unroll 2
			for (int r = 0; r < R; r++)
				b[r] = _mm256_fmadd_ps(_mm256_set1_ps(xr[r][kk + 8]), wb, b[r]);
		}
	}
#pragma GCC unroll 2
	for (int r = 0; r < R; r++)
		s8[r] = _mm256_add_ps(a[r], b[r]);
}

// kmajor_s4_avx2 is s8[l] + s8[l+4] (kmajor_s8_avx2) for l < 4.
AVX2 INLINE void kmajor_s4_avx2(const int R, const float *const xr[2], const float *w, int64_t n,
                                int64_t k, int l, __m256i mk, __m256 s4[2]) {
	__m256 lo[2], hi[2];
	kmajor_s8_avx2(R, xr, w, n, k, l, mk, lo);
	kmajor_s8_avx2(R, xr, w, n, k, l + 4, mk, hi);
#pragma GCC unroll 2
	for (int r = 0; r < R; r++)
		s4[r] = _mm256_add_ps(lo[r], hi[r]);
}

// kmajor_s2_avx2 is s4[l] + s4[l+2] (kmajor_s4_avx2) for l < 2.
AVX2 INLINE void kmajor_s2_avx2(const int R, const float *const xr[2], const float *w, int64_t n,
                                int64_t k, int l, __m256i mk, __m256 s2[2]) {
	__m256 lo[2], hi[2];
	kmajor_s4_avx2(R, xr, w, n, k, l, mk, lo);
	kmajor_s4_avx2(R, xr, w, n, k, l + 2, mk, hi);
#pragma GCC unroll 2
	for (int r = 0; r < R; r++)
		s2[r] = _mm256_add_ps(lo[r], hi[r]);
}

// kmajor_cols_avx2 runs di_linear_kmajor_avx2's R rows (R <= 2, a constant
// where it is inlined) over every 8-column block.
AVX2 INLINE void kmajor_cols_avx2(const int R, float *out, int64_t ldo, const float *const xr[2], const float *w,
                                  int64_t n, int64_t k) {
	for (int64_t c = 0; c < n; c += 8) {
		const int nc = n - c < 8 ? (int)(n - c) : 8;
		const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(nc), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
		__m256 lo[2], hi[2];
		kmajor_s2_avx2(R, xr, w + c, n, k, 0, mk, lo);
		kmajor_s2_avx2(R, xr, w + c, n, k, 1, mk, hi);
#pragma GCC unroll 2
		for (int r = 0; r < R; r++)
			_mm256_maskstore_ps(out + r * ldo + c, mk, _mm256_add_ps(lo[r], hi[r]));
	}
}

// di_linear_kmajor_avx2 is Impl.LinearF32KMajor, as di_linear_kmajor_avx512
// on up to 2 rows and 8 columns at a time (a last odd row alone).
AVX2 void di_linear_kmajor_avx2(float *out, int64_t ldo, const float *x, int64_t ldx, const float *w,
                                int64_t m, int64_t n, int64_t k) {
	for (int64_t i = 0; i < m; i += 2) {
		const float *xr[2] = {x + i * ldx, x + (m - i < 2 ? i : i + 1) * ldx};
		if (m - i < 2)
			kmajor_cols_avx2(1, out + i * ldo, ldo, xr, w, n, k);
		else
			kmajor_cols_avx2(2, out + i * ldo, ldo, xr, w, n, k);
	}
}

AVX2 float di_dot_avx2(const float *a, const float *b, int64_t n) {
	float out;
	tile(DI_F32, 1, 1, a, 1, b, 1, n, &out, 1);
	return out;
}

AVX2 void di_axpy_avx2(float a, const float *x, float *y, int64_t n) {
	__m256 av = _mm256_set1_ps(a);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
	for (; i < n; i++)
		y[i] = __builtin_fmaf(a, x[i], y[i]);
}

AVX2 void di_scale_avx2(float a, float *x, int64_t n) {
	__m256 av = _mm256_set1_ps(a);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(x + i, _mm256_mul_ps(av, _mm256_loadu_ps(x + i)));
	for (; i < n; i++)
		x[i] = a * x[i];
}

AVX2 void di_bf16_to_f32_avx2(float *dst, const uint16_t *src, int64_t n) {
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_si256((__m256i *)(dst + i),
		                    _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i))), 16));
	for (; i < n; i++) {
		uint32_t b = (uint32_t)src[i] << 16;
		memcpy(dst + i, &b, 4);
	}
}

AVX2 void di_f16_to_f32_avx2(float *dst, const uint16_t *src, int64_t n) {
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
	if (i < n) {
		uint16_t buf[8] = {0};
		float f[8];
		memcpy(buf, src + i, (n - i) * 2);
		_mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)buf)));
		memcpy(dst + i, f, (n - i) * 4);
	}
}

// di_f16_rows_to_f32_avx2 (both paths) widens the gathered rows one after another; the
// rows DI_F16_ROWS_AHEAD further on are requested first (a paged cache's
// rows are scattered, so the hardware prefetcher does not see them coming).
AVX2 void di_f16_rows_to_f32_avx2(float *dst, const uint16_t *src, const int32_t *rows, int64_t ld, int64_t n,
                                  int64_t k) {
	for (int64_t j = 0; j < n && j < DI_F16_ROWS_AHEAD; j++)
		for (int64_t b = 0; b < 2 * k; b += 64)
			_mm_prefetch((const char *)(src + (int64_t)rows[j] * ld) + b, _MM_HINT_T0);
	for (int64_t j = 0; j < n; j++) {
		if (j + DI_F16_ROWS_AHEAD < n)
			for (int64_t b = 0; b < 2 * k; b += 64)
				_mm_prefetch((const char *)(src + (int64_t)rows[j + DI_F16_ROWS_AHEAD] * ld) + b, _MM_HINT_T0);
		di_f16_to_f32_avx2(dst + j * k, src + (int64_t)rows[j] * ld, k);
	}
}

// to_bf16 rounds 8 floats to nearest bfloat16, ties to even; NaN -> 0x7fc0.
AVX2 INLINE __m128i to_bf16(__m256 f) {
	__m256i b = _mm256_castps_si256(f);
	__m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
	__m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
	__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
	r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
	r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), _MM_SHUFFLE(3, 1, 2, 0));
	return _mm256_castsi256_si128(r);
}

AVX2 void di_f32_to_bf16_avx2(uint16_t *dst, const float *src, int64_t n) {
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i), to_bf16(_mm256_loadu_ps(src + i)));
	if (i < n) {
		float buf[8] = {0};
		uint16_t o[8];
		memcpy(buf, src + i, (n - i) * 4);
		_mm_storeu_si128((__m128i *)o, to_bf16(_mm256_loadu_ps(buf)));
		memcpy(dst + i, o, (n - i) * 2);
	}
}

// to_f16 rounds 8 floats to IEEE half as F32ToF16 does: F16C's conversion
// (nearest even, overflow to infinity, subnormals rounded), with every NaN
// made 0x7e00 and its sign (F16C keeps the payload).
AVX2 INLINE __m128i to_f16(__m256 f) {
	__m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256i b = _mm256_castps_si256(f);
	__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
	__m256i canon = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x8000)),
	                                _mm256_set1_epi32(0x7e00));
	__m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
	__m128i canon16 = _mm_packus_epi32(_mm256_castsi256_si128(canon), _mm256_extracti128_si256(canon, 1));
	return _mm_blendv_epi8(h, canon16, nan16);
}

// di_f32_to_f16_avx2 is Impl.F32ToF16 (both paths: every AVX-512 CPU has F16C).
AVX2 void di_f32_to_f16_avx2(uint16_t *dst, const float *src, int64_t n) {
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i), to_f16(_mm256_loadu_ps(src + i)));
	if (i < n) {
		float buf[8] = {0};
		uint16_t o[8];
		memcpy(buf, src + i, (n - i) * 4);
		_mm_storeu_si128((__m128i *)o, to_f16(_mm256_loadu_ps(buf)));
		memcpy(dst + i, o, (n - i) * 2);
	}
}

// di_fma_peak_avx2 runs iters rounds of 12 independent 8-lane FMAs from
// registers (192 flops a round; 12 chains cover two FMA ports of four
// cycles' latency): the AVX2 machines' compute ceiling for MFU figures.
// Returns a value derived from the accumulators so the loop is not removed.
AVX2 float di_fma_peak_avx2(int64_t iters) {
	__m256 acc[12];
	const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
#pragma GCC unroll 12
	for (int i = 0; i < 12; i++)
		acc[i] = _mm256_set1_ps((float)i);
	for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
		for (int i = 0; i < 12; i++)
			acc[i] = _mm256_fmadd_ps(acc[i], a, b);
	}
	__m256 s = acc[0];
#pragma GCC unroll 12
	for (int i = 1; i < 12; i++)
		s = _mm256_add_ps(s, acc[i]);
	return hsum2(s, _mm256_setzero_ps());
}

// ---- LinearBF16Pairs without AVX512_BF16 (bf16pairs.go) ----
//
// VDPBF16PS adds to lane l of a 32-value step the product of pair member
// 2l+1, then that of 2l, each with one rounding to nearest even, subnormal
// inputs read as zero and subnormal results flushed to zero. The product of
// two bfloat16 values is exact in float32, so a float32 FMA of the widened
// values rounds the same sum once; with MXCSR's DAZ (subnormal inputs read
// as zero) and FTZ (subnormal results, detected after rounding, flushed)
// set for the call, its bits are the instruction's. Each step of 32 values
// is split into 32 floats, the odd members of the 16 lane pairs first and
// then the even ones (bp_split): two float32 16-lane steps of the canonical
// order run the step's two instructions' worth of FMAs in the instruction's
// order, so the float32 tiles above compute the pairs product over the
// split rows, k rounded up to 32 with zeros (as the instruction's masked
// tail loads zeros).

#define BP_MXCSR_FTZ_DAZ 0x8040

// bp_load32 loads the 32 bfloat16 values of src at [s, s+32) as lanes
// 0..7 (a) and 8..15 (b) of the pairs, zeros past k.
AVX2 INLINE void bp_load32(const uint16_t *src, int64_t s, int64_t k, __m256i *a, __m256i *b) {
	if (s + 32 <= k) {
		*a = _mm256_loadu_si256((const __m256i *)(src + s));
		*b = _mm256_loadu_si256((const __m256i *)(src + s + 16));
		return;
	}
	uint16_t buf[32] = {0};
	memcpy(buf, src + s, (size_t)(k - s) * 2);
	*a = _mm256_loadu_si256((const __m256i *)buf);
	*b = _mm256_loadu_si256((const __m256i *)(buf + 16));
}

// bp_split writes the bfloat16 row src (k values) as float32 in the pairs
// order, k rounded up to 32 with zeros.
AVX2 INLINE void bp_split(float *dst, const uint16_t *src, int64_t k) {
	const __m256i odd = _mm256_set1_epi32((int)0xffff0000u);
	for (int64_t s = 0; s < k; s += 32) {
		__m256i a, b;
		bp_load32(src, s, k, &a, &b);
		_mm256_storeu_si256((__m256i *)(dst + s), _mm256_and_si256(a, odd));
		_mm256_storeu_si256((__m256i *)(dst + s + 8), _mm256_and_si256(b, odd));
		_mm256_storeu_si256((__m256i *)(dst + s + 16), _mm256_slli_epi32(a, 16));
		_mm256_storeu_si256((__m256i *)(dst + s + 24), _mm256_slli_epi32(b, 16));
	}
}

// bp_col computes column w (k bfloat16 weights, split in registers) against
// R <= 5 rows of xs (split rows of k32 floats): out[r*ldo].
AVX2 INLINE void bp_col(const int R, const float *xs, int64_t k32, const uint16_t *w, int64_t k, float *out,
                        int64_t ldo) {
	const __m256i odd = _mm256_set1_epi32((int)0xffff0000u);
	__m256 lo[5], hi[5];
#pragma GCC unroll 5
	for (int r = 0; r < R; r++)
		lo[r] = hi[r] = _mm256_setzero_ps();
	for (int64_t s = 0; s < k32; s += 32) {
		__m256i a, b;
		bp_load32(w, s, k, &a, &b);
		__m256 ol = _mm256_castsi256_ps(_mm256_and_si256(a, odd));
		__m256 oh = _mm256_castsi256_ps(_mm256_and_si256(b, odd));
		__m256 el = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
		__m256 eh = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
#pragma GCC unroll 5
		for (int r = 0; r < R; r++) {
			const float *xr = xs + r * k32 + s;
			lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr), ol, lo[r]);
			hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), oh, hi[r]);
			lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 16), el, lo[r]);
			hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 24), eh, hi[r]);
		}
	}
#pragma GCC unroll 5
	for (int r = 0; r < R; r++)
		out[r * ldo] = hsum2(lo[r], hi[r]);
}

// bp_cols runs R rows of xs against columns [0, ncols) of w, one column
// after another (the weights one sequential stream).
AVX2 INLINE void bp_cols(const int R, float *out, int64_t ldo, const float *xs, int64_t k32, const uint16_t *w,
                         int64_t k, int64_t ncols) {
	for (int64_t j = 0; j < ncols; j++)
		bp_col(R, xs, k32, w + j * k, k, out + j, ldo);
}

// The per-thread split rows of x: up to 5 rows of k rounded up to 32.
static __thread float *bp_xs;
static __thread int64_t bp_xs_len;

AVX2 __attribute__((noinline)) static int bp_linear(float *out, int64_t ldo, const uint16_t *x, const uint16_t *w,
                                                      int64_t m, int64_t k, int64_t ncols) {
	const int64_t k32 = (k + 31) & ~(int64_t)31;
	if (k32 == 0) {
		for (int64_t i = 0; i < m; i++)
			for (int64_t j = 0; j < ncols; j++)
				out[i * ldo + j] = 0;
		return 0;
	}
	if (bp_xs_len < 5 * k32) {
		free(bp_xs);
		bp_xs_len = 0;
		if (posix_memalign((void **)&bp_xs, 64, (size_t)(5 * k32) * sizeof(float)) != 0) {
			bp_xs = 0;
			return -1;
		}
		bp_xs_len = 5 * k32;
	}
	if (m <= 5) {
		// Decode and verify rows: each column's weights widened once in
		// registers for every row.
		for (int64_t i = 0; i < m; i++)
			bp_split(bp_xs + i * k32, x + i * k, k);
		switch (m) {
		case 1:
			bp_cols(1, out, ldo, bp_xs, k32, w, k, ncols);
			break;
		case 2:
			bp_cols(2, out, ldo, bp_xs, k32, w, k, ncols);
			break;
		case 3:
			bp_cols(3, out, ldo, bp_xs, k32, w, k, ncols);
			break;
		case 4:
			bp_cols(4, out, ldo, bp_xs, k32, w, k, ncols);
			break;
		default:
			bp_cols(5, out, ldo, bp_xs, k32, w, k, ncols);
		}
		return 0;
	}
	// A GEMM: each column block split once into the float32 panel, then
	// the 3 x 2 float32 tiles over it, three split rows of x at a time.
	if (!widen_panel && posix_memalign((void **)&widen_panel, 64, WIDEN_BYTES) != 0) {
		widen_panel = 0;
		return -1;
	}
	int64_t nb = WIDEN_BYTES / (k32 * 4);
	if (nb < 2) {
		for (int64_t i = 0; i < m; i += 5) {
			int nr = m - i < 5 ? (int)(m - i) : 5;
			int rc = bp_linear(out + i * ldo, ldo, x + i * k, w, nr, k, ncols);
			if (rc != 0)
				return rc;
		}
		return 0;
	}
	nb &= ~(int64_t)1;
	for (int64_t jb = 0; jb < ncols; jb += nb) {
		int64_t je = ncols - jb < nb ? ncols : jb + nb;
		for (int64_t j = jb; j < je; j++)
			bp_split(widen_panel + (j - jb) * k32, w + j * k, k);
		for (int64_t i = 0; i < m; i += 3) {
			int nr = m - i < 3 ? (int)(m - i) : 3;
			for (int r = 0; r < nr; r++)
				bp_split(bp_xs + r * k32, x + (i + r) * k, k);
			linear_rows(DI_F32, 3, 2, out + i * ldo + jb, bp_xs, widen_panel, ldo, k32, 0, nr, 0, je - jb);
		}
	}
	return 0;
}

// di_linear_bf16pairs_avx2 is di_linear_bf16pairs_avx512 (bf16pairs_amd64.h)
// with float32 FMAs under DAZ and FTZ, the caller's MXCSR restored before it
// returns. It returns 0, or -1 when its buffers could not be allocated.
int di_linear_bf16pairs_avx2(float *out, int64_t ldo, const uint16_t *x, const uint16_t *w, int64_t m, int64_t k,
                             int64_t ncols) {
	unsigned int csr = _mm_getcsr();
	_mm_setcsr(csr | BP_MXCSR_FTZ_DAZ);
	int rc = bp_linear(out, ldo, x, w, m, k, ncols);
	_mm_setcsr(csr);
	return rc;
}
