//go:build cgo

// AVX-512 (F, BW, VL, DQ) kernels. Every function carries its own target
// attribute, so this file builds with plain compiler flags and the code only
// runs after the Go side has checked the CPU.
//
// Canonical order (package doc): one dot product of length k is 16 lane
// accumulators, lane l summing x[kk]*w[kk] for kk = l (mod 16) in increasing
// kk with one FMA each (a masked FMA for the tail, which leaves the lanes past
// k untouched), then the tree l+8, l+4, l+2, l+1. A zmm register is exactly
// one such accumulator.

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd_amd64.h"
#include "attn_amd64.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#include "reduce16_avx512.h"

// L2 bytes given to one column block of W in di_linear_avx512: the block is
// re-read from L2 by every block of rows.
#define L2_BLOCK_BYTES (384 * 1024)

// L1 bytes for the k-range of one tile's rows and columns (see linear_rows).
#define L1_TILE_BYTES (32 * 1024)

AVX512 INLINE __m512 load_w(const int dt, const void *w, int64_t i) {
	switch (dt) {
	case DI_BF16:
		return _mm512_castsi512_ps(_mm512_slli_epi32(
		    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i))), 16));
	case DI_F16:
		return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
	default:
		return _mm512_loadu_ps((const float *)w + i);
	}
}

AVX512 INLINE __m512 load_w_mask(const int dt, const void *w, int64_t i, __mmask16 mk) {
	switch (dt) {
	case DI_BF16:
		return _mm512_castsi512_ps(_mm512_slli_epi32(
		    _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)w + i)), 16));
	case DI_F16:
		return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)w + i));
	default:
		return _mm512_maskz_loadu_ps(mk, (const float *)w + i);
	}
}

static inline int64_t esize(int dt) { return dt == DI_F32 ? 4 : 2; }

// tile_ptrs sets the row pointers of an R x C tile over rows x[0..nr) and
// columns w[0..nc) (both stride k). Rows and columns past nr, nc repeat the
// last valid one, so a partial tile runs the full-tile code: every
// accumulator is independent of the others, hence every value stored is
// the canonical one.
AVX512 INLINE void tile_ptrs(const int dt, const int R, const int C, const float *x, int nr,
                             const void *w, int nc, int64_t k, const float *xr[4],
                             const char *wc[16]) {
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		xr[r] = x + (r < nr ? r : nr - 1) * k;
#pragma GCC unroll 16
	for (int c = 0; c < C; c++)
		wc[c] = (const char *)w + (c < nc ? c : nc - 1) * k * esize(dt);
}

// tile_steps runs the canonical FMAs of the k-steps [kb, ke) of an R x C
// tile (R <= 4, R*C is 8 or 16, or 1 x 1) into acc[r*C + c]: whole steps of 16, and
// the masked tail when ke == k. Rows stay in registers and one column's
// weights are loaded at a time: R*C + R + 1 zmm.
//
// pf, when not NULL, is where the next tile's weights start: each step
// prefetches its share (C*16 weights) of them, so that a weight stream keeps
// more memory requests in flight than the out-of-order window alone holds
// (a bf16 step has twice the instructions per byte of an f32 step, a 4-row
// step four times the FMAs of a 1-row step). linear_rows asks for it where
// it paid in an interleaved single-core test on the Zen 5 VM of BENCH.md
// (k=768, n=2048, 512 MiB of rotating weights), best GB/s without -> with:
// bf16 m=1 18-21 -> 21-22, m=3 12 -> 17, m=4 12-13 -> 17; f32 m=3 18 -> 20,
// m=4 15 -> 18; but f32 m=1 and m=2 lose (27 -> 21, 21 -> 18): there the
// plain loop already streams at read bandwidth. 16-bit weights prefetch
// into L2 (T1) rather than L1: on the 2-vCPU AVX-512 Xeon of BENCH.md, the
// bf16 layer of BenchmarkDecodeLayer went from 0.73-0.85 to 0.83-0.89 of
// the read bandwidth (three alternating runs; two tiles ahead 0.75-0.88).
// One row no longer takes it: linear_rows streams its tile's columns one
// after another instead, which read faster still (BENCH.md).
AVX512 INLINE void tile_steps(const int dt, const int R, const int C, const float *xr[4],
                              const char *wc[16], int64_t kb, int64_t ke, int64_t k,
                              __m512 acc[16], const char *pf) {
	int64_t kk = kb;
	for (; kk + 16 <= ke; kk += 16) {
		if (pf) {
			const char *p = pf + kk * C * esize(dt);
#pragma GCC unroll 8
			for (int q = 0; q < C * 16 * esize(dt); q += 64) {
				if (dt == DI_F32)
					_mm_prefetch(p + q, _MM_HINT_T0);
				else
					_mm_prefetch(p + q, _MM_HINT_T1);
			}
		}
		__m512 xv[4];
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			xv[r] = _mm512_loadu_ps(xr[r] + kk);
#pragma GCC unroll 16
		for (int c = 0; c < C; c++) {
			__m512 wv = load_w(dt, wc[c], kk);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++)
				acc[r * C + c] = _mm512_fmadd_ps(xv[r], wv, acc[r * C + c]);
		}
	}
	if (ke == k && kk < k) {
		__mmask16 mk = (__mmask16)((1u << (k - kk)) - 1);
		__m512 xv[4];
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			xv[r] = _mm512_maskz_loadu_ps(mk, xr[r] + kk);
#pragma GCC unroll 16
		for (int c = 0; c < C; c++) {
			__m512 wv = load_w_mask(dt, wc[c], kk, mk);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++)
				acc[r * C + c] = _mm512_mask3_fmadd_ps(xv[r], wv, acc[r * C + c], mk);
		}
	}
}

// tile_store reduces the tile's accumulators and writes out[r*ldo + c] for
// r < nr, c < nc.
AVX512 INLINE void tile_store(const int R, const int C, const __m512 acc[16], int nr, int nc,
                              float *out, int64_t ldo) {
	// Order the accumulators so that reduce16's lane f holds acc[f]; a tile
	// of 8 fills lanes 8..15 with copies that are not stored.
	__m512 a[16];
#pragma GCC unroll 16
	for (int f = 0; f < 16; f++)
		a[4 * (f % 4) + f / 4] = acc[f % (R * C)];
	const __m512 v = reduce16(a);
	if (R == 4 && C == 4) {
		// Row r's four sums are chunk r: stored straight from the register.
		const __mmask8 mk = (__mmask8)((1u << nc) - 1);
		const __m128 row[4] = {_mm512_castps512_ps128(v), _mm512_extractf32x4_ps(v, 1),
		                       _mm512_extractf32x4_ps(v, 2), _mm512_extractf32x4_ps(v, 3)};
		for (int r = 0; r < nr; r++)
			_mm_mask_storeu_ps(out + r * ldo, mk, row[r]);
		return;
	}
	float res[16];
	_mm512_storeu_ps(res, v);
	for (int r = 0; r < nr; r++)
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = res[r * C + c];
}

// linear_rows runs the rows [i0, i0+nr) against columns [jb, je) with R x C
// tiles; stream says w comes from memory (GEMV), not from L2 (see pf of
// tile_steps; one row streams a tile's columns one after another). Out of
// stream mode, when a tile's rows and columns over the whole of k would not
// fit in L1 next to each other, k is cut into chunks of kc and each group of up to
// 16 tiles runs chunk by chunk, its accumulators kept in a spill area
// between chunks: the FMAs per lane are the same, in the same order.
AVX512 INLINE void linear_rows(const int dt, const int R, const int C, float *out, const float *x,
                               const void *w, int64_t n, int64_t k, int64_t i0, int nr,
                               int64_t jb, int64_t je, int stream) {
	const int64_t bytes_per_step = R * 4 + C * esize(dt); // per element of k
	const int64_t kc = L1_TILE_BYTES / bytes_per_step / 16 * 16;
	const float *xr[4];
	const char *wc[16];
	if (k <= kc || stream) {
		for (int64_t j = jb; j < je; j += C) {
			int nc = je - j < C ? (int)(je - j) : C;
			__m512 acc[16];
#pragma GCC unroll 16
			for (int f = 0; f < 16; f++)
				acc[f] = _mm512_setzero_ps();
			tile_ptrs(dt, R, C, x + i0 * k, nr, (const char *)w + j * k * esize(dt), nc, k, xr, wc);
			if (stream && R == 1) {
				// A decode row: the tile's columns one after another over
				// the whole of k. They are adjacent rows of w, so the
				// weights arrive as one sequential stream, which the
				// hardware prefetchers follow without the prefetches
				// below, instead of C streams a row apart; x (one row)
				// stays in L1. Each accumulator gets the same FMAs in the
				// same order, so the bits are those of the interleaved
				// loop. Measured in BENCH.md ("One weight stream a decode
				// row"). Not for 2-4 rows: their x rows, read again for
				// every column, spill out of L1 (bf16 768x2048, 4 rows:
				// 23 -> 6-8 GB/s).
#pragma GCC unroll 1
				for (int c = 0; c < C; c++) {
					__m512 a1[16];
					const char *w1[16] = {wc[c]};
					a1[0] = _mm512_setzero_ps();
					tile_steps(dt, 1, 1, xr, w1, 0, k, k, a1, 0);
					acc[c] = a1[0];
				}
			} else {
				const char *pf = 0;
				if (stream && (dt != DI_F32 || R == 4) && j + 2 * C <= je)
					pf = (const char *)w + (j + C) * k * esize(dt);
				tile_steps(dt, R, C, xr, wc, 0, k, k, acc, pf);
			}
			tile_store(R, C, acc, nr, nc, out + i0 * n + j, n);
		}
		return;
	}
	__m512 spill[16][16];
	for (int64_t jg = jb; jg < je; jg += 16 * C) {
		int64_t jge = je - jg < 16 * C ? je : jg + 16 * C;
		for (int64_t kb = 0; kb < k; kb += kc) {
			int64_t ke = k - kb < kc ? k : kb + kc;
			for (int64_t j = jg, t = 0; j < jge; j += C, t++) {
				int nc = jge - j < C ? (int)(jge - j) : C;
				__m512 acc[16];
#pragma GCC unroll 16
				for (int f = 0; f < 16; f++)
					acc[f] = kb == 0 ? _mm512_setzero_ps() : spill[t][f];
				tile_ptrs(dt, R, C, x + i0 * k, nr, (const char *)w + j * k * esize(dt), nc, k, xr, wc);
				tile_steps(dt, R, C, xr, wc, kb, ke, k, acc, 0);
				if (ke == k) {
					tile_store(R, C, acc, nr, nc, out + i0 * n + j, n);
				} else {
#pragma GCC unroll 16
					for (int f = 0; f < 16; f++)
						spill[t][f] = acc[f];
				}
			}
		}
	}
}

// GEMM tiles (m >= 5, weights from L2): BIG_R rows of x by BIG_C columns
// of w, 24 accumulators plus BIG_C weight vectors and one row of x in
// registers (29 zmm). Per k-step of 16 that is 6 loads of x (L1) and 4 of
// w (streamed from L2) for 24 fused multiply-adds, against 4 + 4 for 16
// with the 4 x 4 tile: the L2 stream of w per FMA falls by a third.
// Measured on the Zen 5 VM of BENCH.md (one worker, best window over the
// FMA peak probe, alternating builds): f32 768x768 0.84 -> 0.90-0.91,
// 2048x768 0.81-0.83 -> 0.88-0.90, 768x2048 0.73-0.75 -> 0.76-0.79; bf16
// 0.82-0.91 -> 0.89-0.95. 8 x 3, 4 x 6 and 5 x 5 tiles gave less (BENCH.md).
#define BIG_R 6
#define BIG_C 4

// L1 bytes for the k-range of one big tile's rows and columns (see
// big_rows). 32 KiB and 48-64 KiB measured no better, or worse, for k = 2048
// and 3072.
#define L1_BIG_BYTES (40 * 1024)

// Tiles a k-chunked group of big_rows runs before moving to the next k
// chunk (their accumulators wait in a spill area between chunks).
#define BIG_GROUP 8

// big_steps runs the canonical FMAs of the k-steps [kb, ke) of an R x C
// tile (R*C <= 32, C <= 8) into acc[r*C + c]: whole steps of 16, and the
// masked tail when ke == k. The C weight vectors of a step are loaded once
// and each row of x is loaded into a register once per step.
AVX512 INLINE void big_steps(const int dt, const int R, const int C, const float *xr[8],
                             const char *wc[8], int64_t kb, int64_t ke, int64_t k, __m512 acc[32]) {
	int64_t kk = kb;
	for (; kk + 16 <= ke; kk += 16) {
		__m512 wv[8];
#pragma GCC unroll 8
		for (int c = 0; c < C; c++)
			wv[c] = load_w(dt, wc[c], kk);
#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			__m512 xv = _mm512_loadu_ps(xr[r] + kk);
			// Keep the row in a register: without this GCC folds it into
			// every FMA as a memory operand (C loads a row instead of
			// one), which ran 6-15% slower than the 4 x 4 tile (8 x 3).
			__asm__("" : "+v"(xv));
#pragma GCC unroll 8
			for (int c = 0; c < C; c++)
				acc[r * C + c] = _mm512_fmadd_ps(xv, wv[c], acc[r * C + c]);
		}
	}
	if (ke == k && kk < k) {
		__mmask16 mk = (__mmask16)((1u << (k - kk)) - 1);
		__m512 wv[8];
#pragma GCC unroll 8
		for (int c = 0; c < C; c++)
			wv[c] = load_w_mask(dt, wc[c], kk, mk);
#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			__m512 xv = _mm512_maskz_loadu_ps(mk, xr[r] + kk);
#pragma GCC unroll 8
			for (int c = 0; c < C; c++)
				acc[r * C + c] = _mm512_mask3_fmadd_ps(xv, wv[c], acc[r * C + c], mk);
		}
	}
}

// big_store reduces an R x C tile's accumulators, 16 at a time with
// reduce16 (the last group padded with copies that are not stored), and
// writes out[r*ldo + c] for r < nr, c < nc.
AVX512 INLINE void big_store(const int R, const int C, const __m512 acc[32], int nr, int nc,
                             float *out, int64_t ldo) {
	if (C == 4 && R == 6) {
		// Each row's four sums are one 128-bit chunk of a reduced vector:
		// stored straight from the registers.
		const __mmask8 mk = (__mmask8)((1u << nc) - 1);
		__m512 a[16];
#pragma GCC unroll 16
		for (int f = 0; f < 16; f++)
			a[4 * (f % 4) + f / 4] = acc[f];
		const __m512 v = reduce16(a); // chunk q: row q
		__m128 row[6];
		row[0] = _mm512_castps512_ps128(v);
		row[1] = _mm512_extractf32x4_ps(v, 1);
		row[2] = _mm512_extractf32x4_ps(v, 2);
		row[3] = _mm512_extractf32x4_ps(v, 3);
		// reduce8: lane 4c holds acc[16+c] (row 4), 4c+1 acc[20+c] (row 5).
		const __m512 v8 = reduce8(acc + 16);
		row[4] = _mm512_castps512_ps128(_mm512_permutexvar_ps(
		    _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v8));
		row[5] = _mm512_castps512_ps128(_mm512_permutexvar_ps(
		    _mm512_setr_epi32(1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v8));
		for (int r = 0; r < nr; r++)
			_mm_mask_storeu_ps(out + r * ldo, mk, row[r]);
		return;
	}
	float res[32];
#pragma GCC unroll 2
	for (int g = 0; g < (R * C + 15) / 16; g++) {
		if (R * C - 16 * g == 8) {
			// A last group of 8 (the 6 x 4 tile): reduce8, lanes 4c and
			// 4c+1 hold acc[16g+c] and acc[16g+4+c].
			float r8[16];
			_mm512_storeu_ps(r8, reduce8(acc + 16 * g));
#pragma GCC unroll 8
			for (int f = 0; f < 8; f++)
				res[16 * g + f] = r8[4 * (f % 4) + f / 4];
			continue;
		}
		__m512 a[16];
#pragma GCC unroll 16
		for (int f = 0; f < 16; f++)
			a[4 * (f % 4) + f / 4] = acc[16 * g + f < R * C ? 16 * g + f : R * C - 1];
		_mm512_storeu_ps(res + 16 * g, reduce16(a));
	}
	for (int r = 0; r < nr; r++)
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = res[r * C + c];
}

// big_rows runs the rows [i0, i0+nr) (nr <= R; rows past nr repeat the
// last one, as in tile_ptrs) against columns [jb, je) with R x C tiles.
// When a tile's rows and columns over the whole of k would not fit in
// L1_BIG_BYTES, k is cut into chunks of kc and each group of BIG_GROUP
// tiles runs chunk by chunk, its accumulators kept in a spill area between
// chunks: the FMAs per lane are the same, in the same order.
AVX512 INLINE void big_rows(const int dt, const int R, const int C, float *out, const float *x,
                            const void *w, int64_t n, int64_t k, int64_t i0, int nr,
                            int64_t jb, int64_t je) {
	const int64_t bytes_per_step = R * 4 + C * esize(dt); // per element of k
	int64_t kc = L1_BIG_BYTES / bytes_per_step / 16 * 16;
	if (k <= kc)
		kc = k;
	const float *xr[8];
	const char *wc[8];
#pragma GCC unroll 8
	for (int r = 0; r < R; r++)
		xr[r] = x + (i0 + (r < nr ? r : nr - 1)) * k;
	__m512 spill[BIG_GROUP][32];
	for (int64_t jg = jb; jg < je; jg += BIG_GROUP * C) {
		int64_t jge = je - jg < BIG_GROUP * C ? je : jg + BIG_GROUP * C;
		for (int64_t kb = 0; kb < k; kb += kc) {
			int64_t ke = k - kb < kc ? k : kb + kc;
			for (int64_t j = jg, t = 0; j < jge; j += C, t++) {
				int nc = jge - j < C ? (int)(jge - j) : C;
#pragma GCC unroll 8
				for (int c = 0; c < C; c++)
					wc[c] = (const char *)w + (j + (c < nc ? c : nc - 1)) * k * esize(dt);
				__m512 acc[32];
#pragma GCC unroll 32
				for (int f = 0; f < R * C; f++)
					acc[f] = kb == 0 ? _mm512_setzero_ps() : spill[t][f];
				big_steps(dt, R, C, xr, wc, kb, ke, k, acc);
				if (ke == k) {
					big_store(R, C, acc, nr, nc, out + i0 * n + j, n);
				} else {
#pragma GCC unroll 32
					for (int f = 0; f < R * C; f++)
						spill[t][f] = acc[f];
				}
			}
		}
	}
}

// linear_block runs rows [0, m) of out against the columns [jb, je) of w
// (BIG_R-row big tiles from 5 rows on, the small tiles for the rows left);
// stream as in linear_rows.
AVX512 INLINE void linear_block(const int dt, float *out, const float *x, const void *w, int64_t m,
                                int64_t n, int64_t k, int64_t jb, int64_t je, int stream) {
	for (int64_t i = 0; i < m;) {
		int64_t left = m - i;
		if (!stream && left >= BIG_R) {
			big_rows(dt, BIG_R, BIG_C, out, x, w, n, k, i, BIG_R, jb, je);
			i += BIG_R;
		} else if (left >= 3) {
			int nr = left < 4 ? (int)left : 4;
			linear_rows(dt, 4, 4, out, x, w, n, k, i, nr, jb, je, stream);
			i += nr;
		} else if (left == 2) {
			linear_rows(dt, 2, 8, out, x, w, n, k, i, 2, jb, je, stream);
			i += 2;
		} else {
			linear_rows(dt, 1, 8, out, x, w, n, k, i, 1, jb, je, stream);
			i += 1;
		}
	}
}

// WIDEN_PF_BYTES is how far ahead of its loads widen_block prefetches the
// 16-bit weights (and how many it asks for before its first load). In a
// decode step every weight comes from memory (the step's weights and
// latent cache exceed L3), a pool chunk of a small product widens only a
// few KiB (q_a at batch 64: 16 columns, 8 KiB), and the hardware
// prefetcher had not ramped up by the end of it: the widening loop held
// 24% of linear_bf16's samples in a profile of a batch-64 step of the
// default model. With 2 KiB, the routed experts of that step took
// 1.75-1.87 ms instead of 1.99-2.05 (five alternating runs); 1 and 4 KiB
// measured no better. The AVX2 path, bound by its FMAs, measured no gain
// from it (four alternating runs) and does not prefetch.
#define WIDEN_PF_BYTES 2048

// widen_block writes columns [jb, je) of the 16-bit w (rows of k) to dst
// as float32, row by row with the same stride k: exact, so the float32
// tiles over dst run the very FMAs of the 16-bit tiles over w. The source
// is prefetched WIDEN_PF_BYTES ahead.
AVX512 INLINE void widen_block(const int dt, float *dst, const void *w, int64_t k, int64_t jb,
                               int64_t je) {
	const int64_t total = (je - jb) * k, base = jb * k;
	const char *src = (const char *)w + base * 2, *end = src + total * 2;
	for (const char *p = src; p < src + WIDEN_PF_BYTES && p < end; p += 64)
		_mm_prefetch(p, _MM_HINT_T0);
	int64_t i = 0;
	for (; i + 32 <= total; i += 32) {
		if (src + i * 2 + WIDEN_PF_BYTES < end)
			_mm_prefetch(src + i * 2 + WIDEN_PF_BYTES, _MM_HINT_T0);
		_mm512_storeu_ps(dst + i, load_w(dt, w, base + i));
		_mm512_storeu_ps(dst + i + 16, load_w(dt, w, base + i + 16));
	}
	for (; i + 16 <= total; i += 16)
		_mm512_storeu_ps(dst + i, load_w(dt, w, base + i));
	if (i < total) {
		__mmask16 mk = (__mmask16)((1u << (total - i)) - 1);
		_mm512_mask_storeu_ps(dst + i, mk, load_w_mask(dt, w, base + i, mk));
	}
}

// The per-thread float32 panel of widen_block: WIDEN_BYTES, allocated on
// a thread's first GEMM over 16-bit weights and kept for the thread's life
// (the pool's threads live as long as the process).
#define WIDEN_BYTES (L2_BLOCK_BYTES)
static __thread float *widen_panel;

// linear runs columns [j0, j1) of out = x w^T in column blocks of
// L2_BLOCK_BYTES of w. From 6 rows on (the GEMM), each block runs BIG_R
// rows at a time with big tiles and the rows left with the 4 x 4, 2 x 8
// and 1 x 8 tiles; up to 5 rows (decode, verify rows) w streams from
// memory, once below 5 rows. Every output's FMAs are the same whichever
// tile computes it.
//
// A GEMM over 16-bit weights widens each column block to float32 once
// (widen_block) and runs the float32 tiles over it: the tiles would
// otherwise widen every weight vector again for each group of BIG_R rows,
// two shuffle-port instructions a vector against the 6 FMAs it feeds.
// Measured (BenchmarkLinearBatchDecode, the default model's batch-64
// shapes, one worker, best window over the FMA probe) on a 2-vCPU AVX-512
// Xeon: see BENCH.md.
AVX512 INLINE void linear(const int dt, float *out, const float *x, const void *w, int64_t m,
                          int64_t n, int64_t k, int64_t j0, int64_t j1) {
	// Up to 5 rows w streams from memory (a 4-row pass and a 1-row pass at
	// 5: a speculative decode's verify rows at k = 4). The widened panel
	// pays from 6 rows: at 5 it was written once and then read by both of
	// those passes, and five rows took 1.4-1.5x the time per row of four
	// (BENCH.md); streamed, about 1.05-1.3x.
	const int stream = m <= 5;
	if (dt != DI_F32 && !stream && k > 0) {
		if (!widen_panel && posix_memalign((void **)&widen_panel, 64, WIDEN_BYTES) != 0)
			widen_panel = 0;
		if (widen_panel) {
			int64_t nb = WIDEN_BYTES / (k * 4);
			if (nb >= 16) {
				nb = nb / 16 * 16;
				for (int64_t jb = j0; jb < j1; jb += nb) {
					int64_t je = j1 - jb < nb ? j1 : jb + nb;
					widen_block(dt, widen_panel, w, k, jb, je);
					linear_block(DI_F32, out + jb, x, widen_panel, m, n, k, 0, je - jb, 0);
				}
				return;
			}
		}
	}
	int64_t nb = L2_BLOCK_BYTES / ((k > 0 ? k : 1) * esize(dt));
	nb = nb < 16 ? 16 : nb / 16 * 16;
	for (int64_t jb = j0; jb < j1; jb += nb) {
		int64_t je = j1 - jb < nb ? j1 : jb + nb;
		linear_block(dt, out, x, w, m, n, k, jb, je, stream);
	}
}

AVX512 static void linear_f32(float *out, const float *x, const void *w, int64_t m, int64_t n,
                              int64_t k, int64_t j0, int64_t j1) {
	linear(DI_F32, out, x, w, m, n, k, j0, j1);
}
AVX512 static void linear_bf16(float *out, const float *x, const void *w, int64_t m, int64_t n,
                               int64_t k, int64_t j0, int64_t j1) {
	linear(DI_BF16, out, x, w, m, n, k, j0, j1);
}
AVX512 static void linear_f16(float *out, const float *x, const void *w, int64_t m, int64_t n,
                              int64_t k, int64_t j0, int64_t j1) {
	linear(DI_F16, out, x, w, m, n, k, j0, j1);
}

void di_linear_avx512(int dtype, float *out, const float *x, const void *w, int64_t m, int64_t n,
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

// gather_rows runs rows [i0, i0+nr) of LinearF32Gather (dt F32) or
// LinearF16Gather (dt F16, widened in registers: the same FMAs) with R x C
// tiles: column c of a tile is row rows[j+c] of w (stride ldw elements),
// the last valid one repeated past nc as in tile_ptrs. k is not cut into
// chunks: the tiles of attention are small enough to stay in L1 over the
// whole of k.
AVX512 INLINE void gather_rows(const int dt, const int R, const int C, float *out, const float *x, const void *w,
                               const int32_t *rows, int64_t ldw, int64_t n, int64_t k, int64_t i0,
                               int nr, int prefetch) {
	const float *xr[4];
	const char *wc[16];
	const int64_t es = esize(dt);
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		xr[r] = x + (i0 + (r < nr ? r : nr - 1)) * k;
	for (int64_t j = 0; j < n; j += C) {
		int nc = n - j < C ? (int)(n - j) : C;
#pragma GCC unroll 16
		for (int c = 0; c < C; c++)
			wc[c] = (const char *)w + (int64_t)rows[j + (c < nc ? c : nc - 1)] * ldw * es;
		if (prefetch && j + 2 * C <= n) {
			// The next tile's rows: gathered rows (paged KV) defeat
			// the hardware prefetcher's stride detection.
			for (int c = 0; c < C; c++) {
				const char *pr = (const char *)w + (int64_t)rows[j + C + c] * ldw * es;
				for (int64_t q = 0; q < k * es; q += 64)
					_mm_prefetch(pr + q, _MM_HINT_T0);
			}
		}
		__m512 acc[16];
#pragma GCC unroll 16
		for (int f = 0; f < 16; f++)
			acc[f] = _mm512_setzero_ps();
		tile_steps(dt, R, C, xr, wc, 0, k, k, acc, 0);
		tile_store(R, C, acc, nr, nc, out + i0 * n + j, n);
	}
}

AVX512 INLINE void gather_all(const int dt, float *out, const float *x, const void *w, const int32_t *rows,
                              int64_t ldw, int64_t m, int64_t n, int64_t k) {
	for (int64_t i = 0; i < m;) {
		int64_t left = m - i;
		if (left >= 3) {
			int nr = left < 4 ? (int)left : 4;
			gather_rows(dt, 4, 4, out, x, w, rows, ldw, n, k, i, nr, i == 0);
			i += nr;
		} else if (left == 2) {
			gather_rows(dt, 2, 8, out, x, w, rows, ldw, n, k, i, 2, i == 0);
			i += 2;
		} else {
			gather_rows(dt, 1, 8, out, x, w, rows, ldw, n, k, i, 1, i == 0);
			i += 1;
		}
	}
}

AVX512 void di_linear_gather_avx512(float *out, const float *x, const float *w, const int32_t *rows,
                                    int64_t ldw, int64_t m, int64_t n, int64_t k) {
	gather_all(DI_F32, out, x, w, rows, ldw, m, n, k);
}

AVX512 void di_linear_gather_f16_avx512(float *out, const float *x, const uint16_t *w, const int32_t *rows,
                                        int64_t ldw, int64_t m, int64_t n, int64_t k) {
	gather_all(DI_F16, out, x, w, rows, ldw, m, n, k);
}

// kmajor_s8 is the first level of the canonical tree for R rows and 16
// columns of a k-major w (row kk of w holds weight kk of every column,
// stride n): lane l's FMAs (kk = l, l+16, ... in increasing kk, from +0)
// and lane l+8's, added: s8[l] of each of the 16 dot products of a row,
// the columns in the vector's lanes. mk masks columns past the matrix.
AVX512 INLINE void kmajor_s8(const int R, const float *const xr[4], const float *w, int64_t n,
                             int64_t k, int l, __mmask16 mk, __m512 s8[4]) {
	__m512 a[4], b[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		a[r] = b[r] = _mm512_setzero_ps();
	for (int64_t kk = l; kk < k; kk += 16) {
		__m512 wa = _mm512_maskz_loadu_ps(mk, w + kk * n);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			a[r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[r][kk]), wa, a[r]);
		if (kk + 8 < k) {
			__m512 wb = _mm512_maskz_loadu_ps(mk, w + (kk + 8) * n);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++)
				b[r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[r][kk + 8]), wb, b[r]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		s8[r] = _mm512_add_ps(a[r], b[r]);
}

// kmajor_s4 is s8[l] + s8[l+4] (kmajor_s8) for l < 4.
AVX512 INLINE void kmajor_s4(const int R, const float *const xr[4], const float *w, int64_t n,
                             int64_t k, int l, __mmask16 mk, __m512 s4[4]) {
	__m512 lo[4], hi[4];
	kmajor_s8(R, xr, w, n, k, l, mk, lo);
	kmajor_s8(R, xr, w, n, k, l + 4, mk, hi);
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		s4[r] = _mm512_add_ps(lo[r], hi[r]);
}

// kmajor_s2 is s4[l] + s4[l+2] (kmajor_s4) for l < 2.
AVX512 INLINE void kmajor_s2(const int R, const float *const xr[4], const float *w, int64_t n,
                             int64_t k, int l, __mmask16 mk, __m512 s2[4]) {
	__m512 lo[4], hi[4];
	kmajor_s4(R, xr, w, n, k, l, mk, lo);
	kmajor_s4(R, xr, w, n, k, l + 2, mk, hi);
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		s2[r] = _mm512_add_ps(lo[r], hi[r]);
}

// kmajor_cols runs di_linear_kmajor_avx512's R rows (R <= 4, a constant
// where it is inlined) over every 16-column block.
AVX512 INLINE void kmajor_cols(const int R, float *out, int64_t ldo, const float *const xr[4], const float *w,
                               int64_t n, int64_t k) {
	for (int64_t c = 0; c < n; c += 16) {
		const __mmask16 mk = n - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - c)) - 1);
		__m512 lo[4], hi[4];
		kmajor_s2(R, xr, w + c, n, k, 0, mk, lo);
		kmajor_s2(R, xr, w + c, n, k, 1, mk, hi);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			_mm512_mask_storeu_ps(out + r * ldo + c, mk, _mm512_add_ps(lo[r], hi[r]));
	}
}

// di_linear_kmajor_avx512 is Impl.LinearF32KMajor: for up to 4 rows and 16
// columns at a time, each of the 16 lane sums of the canonical dot product
// runs as a chain of FMAs with the 16 columns in a vector's lanes, and the
// tree l+8, l+4, l+2, l+1 becomes adds of whole vectors, depth first (a few
// live sums a row): the canonical FMAs and adds of every output, with no
// shuffles. Per FMA: one broadcast of x and at least a quarter of a load of
// w. The last rows (m mod 4) take a tile of their own size: a decode row
// at batch 1 (MLA's absorption) once, not four times.
AVX512 void di_linear_kmajor_avx512(float *out, int64_t ldo, const float *x, int64_t ldx,
                                    const float *w, int64_t m, int64_t n, int64_t k) {
	for (int64_t i = 0; i < m; i += 4) {
		const int nr = m - i < 4 ? (int)(m - i) : 4;
		const float *xr[4];
#pragma GCC unroll 4
		for (int r = 0; r < 4; r++)
			xr[r] = x + (i + (r < nr ? r : nr - 1)) * ldx;
		float *o = out + i * ldo;
		switch (nr) {
		case 4:
			kmajor_cols(4, o, ldo, xr, w, n, k);
			break;
		case 3:
			kmajor_cols(3, o, ldo, xr, w, n, k);
			break;
		case 2:
			kmajor_cols(2, o, ldo, xr, w, n, k);
			break;
		default:
			kmajor_cols(1, o, ldo, xr, w, n, k);
		}
	}
}

// di_prefetch_rows is Impl.PrefetchRows: the first k floats of each
// gathered row of w, into L2.
void di_prefetch_rows(const float *w, const int32_t *rows, int64_t ldw, int64_t n, int64_t k) {
	for (int64_t j = 0; j < n; j++) {
		const char *p = (const char *)(w + (int64_t)rows[j] * ldw);
		for (int64_t q = 0; q < k * 4; q += 64)
			_mm_prefetch(p + q, _MM_HINT_T1);
	}
}

AVX512 float di_dot_avx512(const float *a, const float *b, int64_t n) {
	__m512 acc = _mm512_setzero_ps();
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
	if (i < n) {
		__mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
		acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + i), _mm512_maskz_loadu_ps(mk, b + i), acc, mk);
	}
	return hsum(acc);
}

AVX512 void di_axpy_avx512(float a, const float *x, float *y, int64_t n) {
	__m512 av = _mm512_set1_ps(a);
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
	if (i < n) {
		__mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
		__m512 r = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, x + i), _mm512_maskz_loadu_ps(mk, y + i));
		_mm512_mask_storeu_ps(y + i, mk, r);
	}
}

AVX512 void di_scale_avx512(float a, float *x, int64_t n) {
	__m512 av = _mm512_set1_ps(a);
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(x + i, _mm512_mul_ps(av, _mm512_loadu_ps(x + i)));
	if (i < n) {
		__mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
		_mm512_mask_storeu_ps(x + i, mk, _mm512_mul_ps(av, _mm512_maskz_loadu_ps(mk, x + i)));
	}
}

AVX512 void di_bf16_to_f32_avx512(float *dst, const uint16_t *src, int64_t n) {
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i, load_w(DI_BF16, src, i));
	if (i < n) {
		__mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
		_mm512_mask_storeu_ps(dst + i, mk, load_w_mask(DI_BF16, src, i, mk));
	}
}

AVX512 void di_f16_to_f32_avx512(float *dst, const uint16_t *src, int64_t n) {
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i, load_w(DI_F16, src, i));
	if (i < n) {
		__mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
		_mm512_mask_storeu_ps(dst + i, mk, load_w_mask(DI_F16, src, i, mk));
	}
}

// to_bf16 rounds 16 floats to nearest bfloat16, ties to even; NaN -> 0x7fc0.
AVX512 INLINE __m256i to_bf16(__m512 f) {
	__m512i b = _mm512_castps_si512(f);
	__m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
	__mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
	                                        _mm512_set1_epi32(0x7f800000));
	r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
	return _mm512_cvtepi32_epi16(r);
}

AVX512 void di_f32_to_bf16_avx512(uint16_t *dst, const float *src, int64_t n) {
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(dst + i), to_bf16(_mm512_loadu_ps(src + i)));
	if (i < n) {
		__mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
		_mm256_mask_storeu_epi16(dst + i, mk, to_bf16(_mm512_maskz_loadu_ps(mk, src + i)));
	}
}

// di_fma_peak_avx512 runs iters rounds of 24 independent 16-lane FMAs from
// registers: the throughput ceiling the Linear benchmarks are compared with.
// Returns a value derived from the accumulators so the loop is not removed.
AVX512 float di_fma_peak_avx512(int64_t iters) {
	__m512 acc[24];
	__m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
#pragma GCC unroll 24
	for (int i = 0; i < 24; i++)
		acc[i] = _mm512_set1_ps((float)i);
	for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 24
		for (int i = 0; i < 24; i++)
			acc[i] = _mm512_fmadd_ps(acc[i], a, b);
	}
	__m512 s = acc[0];
#pragma GCC unroll 24
	for (int i = 1; i < 24; i++)
		s = _mm512_add_ps(s, acc[i]);
	return hsum(s);
}
