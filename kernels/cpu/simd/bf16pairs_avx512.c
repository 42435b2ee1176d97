//go:build cgo

// AVX512_BF16 kernel of LinearBF16Pairs (bf16pairs.go): bfloat16 activation
// rows against bfloat16 weight rows with VDPBF16PS, whose arithmetic is the
// function's definition. One zmm accumulator per output; a k-step of 32
// values is one 64-byte load of the weight row, one of the activation row
// and one VDPBF16PS (32 multiply-adds, the instruction count of 16 float32
// FMAs); the tail past the last whole step loads zeros. The lanes are then
// summed by the canonical tree (reduce16), so an output depends only on its
// own two rows and k.
//
// Tiles, by the number of rows m:
//   - m = 1 (decode): one column at a time, the weights read from memory
//     once as one sequential stream;
//   - m = 2..4: m x 4 (up to 16 accumulators), streamed the same way;
//   - m >= 5 (prefill): 6 x 4 register tiles (24 accumulators, 4 weight
//     vectors, one row of x: 29 zmm; 10 loads per 24 VDPBF16PS) over column
//     blocks of at most BP_L2_BLOCK_BYTES of weights, which every group of
//     six rows re-reads from L2. Rows past m in the last group repeat the
//     last row and are not stored.

#include <immintrin.h>
#include <stdint.h>

#include "simd_amd64.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#include "reduce16_avx512.h"

// Weight bytes of one column block of the GEMM tiles (kept in L2).
#define BP_L2_BLOCK_BYTES (384 * 1024)

AVX512 INLINE __m512 bp_dot(__m512 acc, __m512i x, __m512i w) {
	return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
}

// bp_tile computes an R x C tile (R*C <= 24) of out over all of k: rows
// x[0..nr), weight rows w[0..nc) (both stride k). Rows and columns past
// nr, nc repeat the last valid one and are not stored. pf, when not NULL,
// is the next tile's first weight row: each step prefetches its share.
AVX512 INLINE void bp_tile(const int R, const int C, const uint16_t *x, int nr, const uint16_t *w, int nc,
                           int64_t k, float *out, int64_t ldo, const uint16_t *pf) {
	const uint16_t *xr[8];
	const uint16_t *wc[8];
#pragma GCC unroll 8
	for (int r = 0; r < R; r++)
		xr[r] = x + (r < nr ? r : nr - 1) * k;
#pragma GCC unroll 8
	for (int c = 0; c < C; c++)
		wc[c] = w + (c < nc ? c : nc - 1) * k;
	__m512 acc[24];
#pragma GCC unroll 24
	for (int f = 0; f < R * C; f++)
		acc[f] = _mm512_setzero_ps();
	const int64_t k32 = k & ~(int64_t)31;
	int64_t kk = 0;
	for (; kk < k32; kk += 32) {
		if (pf) {
			const char *p = (const char *)(pf + kk * C);
#pragma GCC unroll 8
			for (int q = 0; q < C * 64; q += 64)
				_mm_prefetch(p + q, _MM_HINT_T1);
		}
		__m512i wv[8];
#pragma GCC unroll 8
		for (int c = 0; c < C; c++)
			wv[c] = _mm512_loadu_si512((const void *)(wc[c] + kk));
#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			__m512i xv = _mm512_loadu_si512((const void *)(xr[r] + kk));
#pragma GCC unroll 8
			for (int c = 0; c < C; c++)
				acc[r * C + c] = bp_dot(acc[r * C + c], xv, wv[c]);
		}
	}
	if (kk < k) {
		__mmask32 mk = (__mmask32)((1ull << (k - kk)) - 1);
		__m512i wv[8];
#pragma GCC unroll 8
		for (int c = 0; c < C; c++)
			wv[c] = _mm512_maskz_loadu_epi16(mk, wc[c] + kk);
#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			__m512i xv = _mm512_maskz_loadu_epi16(mk, xr[r] + kk);
#pragma GCC unroll 8
			for (int c = 0; c < C; c++)
				acc[r * C + c] = bp_dot(acc[r * C + c], xv, wv[c]);
		}
	}
	if (R * C == 1) {
		out[0] = hsum(acc[0]);
		return;
	}
	float res[32];
#pragma GCC unroll 2
	for (int g = 0; g < R * C; g += 16) {
		__m512 a[16];
#pragma GCC unroll 16
		for (int f = 0; f < 16; f++) // r[4c+q] = hsum(a[4q+c]): res[g+f] = hsum(acc[g+f])
			a[4 * (f % 4) + f / 4] = acc[g + f < R * C ? g + f : g];
		_mm512_storeu_ps(res + g, reduce16(a));
	}
	for (int r = 0; r < nr; r++)
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = res[r * C + c];
}

// bp_rows runs rows [0, nr) of x against weight rows [jb, je) with R x C
// tiles; stream prefetches the next tile (weights from memory).
AVX512 INLINE void bp_rows(const int R, const int C, float *out, int64_t ldo, const uint16_t *x, int nr,
                           const uint16_t *w, int64_t k, int64_t jb, int64_t je, int stream) {
	for (int64_t j = jb; j < je; j += C) {
		int nc = je - j < C ? (int)(je - j) : C;
		const uint16_t *pf = 0;
		if (stream && j + 2 * C <= je)
			pf = w + (j + C) * k;
		bp_tile(R, C, x, nr, w + j * k, nc, k, out + j, ldo, pf);
	}
}

AVX512 void di_linear_bf16pairs_avx512(float *out, int64_t ldo, const uint16_t *x, const uint16_t *w, int64_t m,
                                       int64_t k, int64_t ncols) {
	switch (m) {
	case 1:
		// A decode row: one column after another over the whole of k.
		// Adjacent rows of w, so the weights arrive as one sequential
		// stream the hardware prefetchers follow; x stays in L1. On the
		// Zen 4 VM of BENCH.md, BenchmarkDecodeLayer read 0.92-0.99 of the
		// read probe this way against 0.79-0.80 with 1 x 8 tiles and their
		// prefetch, 0.49-0.60 with 1 x 2, 1 x 4 or 1 x 8 tiles without it.
		for (int64_t j = 0; j < ncols; j++)
			bp_tile(1, 1, x, 1, w + j * k, 1, k, out + j, ldo, 0);
		return;
	case 2:
		bp_rows(2, 4, out, ldo, x, 2, w, k, 0, ncols, 1);
		return;
	case 3:
		bp_rows(3, 4, out, ldo, x, 3, w, k, 0, ncols, 1);
		return;
	case 4:
		bp_rows(4, 4, out, ldo, x, 4, w, k, 0, ncols, 1);
		return;
	}
	int64_t nb = BP_L2_BLOCK_BYTES / (2 * (k > 0 ? k : 1));
	nb = nb < 4 ? 4 : nb & ~(int64_t)3;
	for (int64_t jb = 0; jb < ncols; jb += nb) {
		int64_t je = jb + nb < ncols ? jb + nb : ncols;
		for (int64_t i = 0; i < m; i += 6) {
			int nr = m - i < 6 ? (int)(m - i) : 6;
			bp_rows(6, 4, out + i * ldo, ldo, x + i * k, nr, w, k, jb, je, 0);
		}
	}
}
