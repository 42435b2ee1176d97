//go:build cgo

// Linear16Llama for AVX-512 F/BW/VL/DQ (+F16C): llama.cpp's generic
// ggml_vec_dot_bf16 / ggml_vec_dot_f16 order, bit for bit. Each output is
// one sequential float64 sum over kk of the float32 product x[kk]*w[kk];
// the vector lanes hold 16 different weight rows (output columns), never
// two terms of one sum. From 4 activation rows on, a tile of 16 weight
// rows is widened to float32 once per call and stored transposed
// ([kk][16]) in a scratch buffer, so that every activation row then costs
// one float32 multiply, two widenings and two float64 adds per 16
// products; below 4 rows (decode) the tile is transposed in registers as
// it streams from memory (l16_direct).

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_amd64.h"

#define L16 static inline __attribute__((always_inline)) __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define L16TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

// l16_widen8 returns the 8 16-bit values at p as float32.
L16 __m256 l16_widen8(const int bf16, const uint16_t *p) {
	const __m128i v = _mm_loadu_si128((const __m128i *)p);
	if (bf16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
	return _mm256_cvtph_ps(v);
}

L16 float l16_one(const int bf16, uint16_t h) {
	if (bf16) {
		uint32_t u = (uint32_t)h << 16;
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	return _cvtsh_ss(h);
}

// l16_pack writes the 16 weight rows w + c*k (rows past nc repeat the last)
// as float32 into t[kk*16 + c], kk in [0, k).
L16 void l16_pack(const int bf16, const uint16_t *w, int64_t k, int nc, float *t) {
	int64_t kk = 0;
	for (; kk + 8 <= k; kk += 8) {
		__m256 r[16];
#pragma GCC unroll 16
		for (int c = 0; c < 16; c++)
			r[c] = l16_widen8(bf16, w + (c < nc ? c : nc - 1) * k + kk);
		// Transpose two 8x8 blocks (columns 0..7 and 8..15).
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m256 *q = r + 8 * h;
			__m256 a0 = _mm256_unpacklo_ps(q[0], q[1]), a1 = _mm256_unpackhi_ps(q[0], q[1]);
			__m256 a2 = _mm256_unpacklo_ps(q[2], q[3]), a3 = _mm256_unpackhi_ps(q[2], q[3]);
			__m256 a4 = _mm256_unpacklo_ps(q[4], q[5]), a5 = _mm256_unpackhi_ps(q[4], q[5]);
			__m256 a6 = _mm256_unpacklo_ps(q[6], q[7]), a7 = _mm256_unpackhi_ps(q[6], q[7]);
			__m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
			__m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
			__m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
			__m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
			// b0: kk+0 (cols 0-3 | kk+4 cols 0-3), b4: kk+0 cols 4-7 | kk+4 ...
			__m256 o[8];
			o[0] = _mm256_permute2f128_ps(b0, b4, 0x20);
			o[1] = _mm256_permute2f128_ps(b1, b5, 0x20);
			o[2] = _mm256_permute2f128_ps(b2, b6, 0x20);
			o[3] = _mm256_permute2f128_ps(b3, b7, 0x20);
			o[4] = _mm256_permute2f128_ps(b0, b4, 0x31);
			o[5] = _mm256_permute2f128_ps(b1, b5, 0x31);
			o[6] = _mm256_permute2f128_ps(b2, b6, 0x31);
			o[7] = _mm256_permute2f128_ps(b3, b7, 0x31);
#pragma GCC unroll 8
			for (int i = 0; i < 8; i++)
				_mm256_storeu_ps(t + (kk + i) * 16 + 8 * h, o[i]);
		}
	}
	for (; kk < k; kk++)
		for (int c = 0; c < 16; c++)
			t[kk * 16 + c] = l16_one(bf16, w[(c < nc ? c : nc - 1) * k + kk]);
}

// l16_rows computes R rows of xf (float32, stride k) against a packed
// tile: out[r*ldo + c], c < nc.
L16 void l16_rows(const int R, const float *t, const float *xf, int64_t k, float *out, int64_t ldo, int nc) {
	__m512d lo[4], hi[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		lo[r] = hi[r] = _mm512_setzero_pd();
	for (int64_t kk = 0; kk < k; kk++) {
		const __m512 wv = _mm512_loadu_ps(t + kk * 16);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const __m512 p = _mm512_mul_ps(wv, _mm512_set1_ps(xf[r * k + kk]));
			lo[r] = _mm512_add_pd(lo[r], _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
			hi[r] = _mm512_add_pd(hi[r], _mm512_cvtps_pd(_mm512_extractf32x8_ps(p, 1)));
		}
	}
	const __mmask16 mk = (__mmask16)((1u << nc) - 1);
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		const __m512 f = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo[r])), _mm512_cvtpd_ps(hi[r]), 1);
		_mm512_mask_storeu_ps(out + r * ldo, mk, f);
	}
}

// l16_direct computes R (<= 3) rows of xf (float32, stride k) against the
// 16 weight rows w + c*k (rows past nc repeat the last) without a packed
// tile: each step loads 8 values of each of the 16 rows, transposes them
// in registers (16-bit unpacks, lanes = columns) and widens them, then adds
// the products of the 8 k-positions in order; out[r*ldo + c], c < nc. For
// decode, where a packed tile would be written and read back once per
// row: the weights stream from memory, and pf (the weights of a later
// tile, or NULL) is prefetched into L2 a share per step.
L16 void l16_direct(const int bf16, const int R, const uint16_t *w, int64_t k, int nc, const float *xf, float *out,
                    int64_t ldo, const uint16_t *pf) {
	const uint16_t *rw[16];
#pragma GCC unroll 16
	for (int c = 0; c < 16; c++)
		rw[c] = w + (c < nc ? c : nc - 1) * k;
	__m512d lo[3], hi[3];
#pragma GCC unroll 3
	for (int r = 0; r < R; r++)
		lo[r] = hi[r] = _mm512_setzero_pd();
	int64_t kk = 0;
	for (; kk + 8 <= k; kk += 8) {
		if (pf) {
			// 16 rows x 16 bytes a step: the next tiles' rows, in order.
			const char *p = (const char *)(pf + kk * 16);
#pragma GCC unroll 4
			for (int q = 0; q < 256; q += 64)
				_mm_prefetch(p + q, _MM_HINT_T1);
		}
		__m256i v[8], a[8], b[8], t[8];
#pragma GCC unroll 8
		for (int i = 0; i < 8; i++)
			v[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rw[i] + kk))),
			                               _mm_loadu_si128((const __m128i *)(rw[i + 8] + kk)), 1);
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			a[2 * i] = _mm256_unpacklo_epi16(v[2 * i], v[2 * i + 1]);
			a[2 * i + 1] = _mm256_unpackhi_epi16(v[2 * i], v[2 * i + 1]);
		}
		// b: rows 0-3 (low half: 0-3, high half: 8-11) at k-pairs (0,1),
		// (2,3), (4,5), (6,7), then rows 4-7 (12-15).
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			b[4 * h + 0] = _mm256_unpacklo_epi32(a[4 * h + 0], a[4 * h + 2]);
			b[4 * h + 1] = _mm256_unpackhi_epi32(a[4 * h + 0], a[4 * h + 2]);
			b[4 * h + 2] = _mm256_unpacklo_epi32(a[4 * h + 1], a[4 * h + 3]);
			b[4 * h + 3] = _mm256_unpackhi_epi32(a[4 * h + 1], a[4 * h + 3]);
		}
		// t[i]: the 16 columns at kk + i (low half columns 0-7).
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			t[2 * i] = _mm256_unpacklo_epi64(b[i], b[i + 4]);
			t[2 * i + 1] = _mm256_unpackhi_epi64(b[i], b[i + 4]);
		}
#pragma GCC unroll 8
		for (int i = 0; i < 8; i++) {
			const __m512 wv = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(t[i]), 16))
			                       : _mm512_cvtph_ps(t[i]);
#pragma GCC unroll 3
			for (int r = 0; r < R; r++) {
				const __m512 p = _mm512_mul_ps(wv, _mm512_set1_ps(xf[r * k + kk + i]));
				lo[r] = _mm512_add_pd(lo[r], _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
				hi[r] = _mm512_add_pd(hi[r], _mm512_cvtps_pd(_mm512_extractf32x8_ps(p, 1)));
			}
		}
	}
	for (; kk < k; kk++) {
		float wt[16];
#pragma GCC unroll 16
		for (int c = 0; c < 16; c++)
			wt[c] = l16_one(bf16, rw[c][kk]);
		const __m512 wv = _mm512_loadu_ps(wt);
#pragma GCC unroll 3
		for (int r = 0; r < R; r++) {
			const __m512 p = _mm512_mul_ps(wv, _mm512_set1_ps(xf[r * k + kk]));
			lo[r] = _mm512_add_pd(lo[r], _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
			hi[r] = _mm512_add_pd(hi[r], _mm512_cvtps_pd(_mm512_extractf32x8_ps(p, 1)));
		}
	}
	const __mmask16 mk = (__mmask16)((1u << nc) - 1);
#pragma GCC unroll 3
	for (int r = 0; r < R; r++) {
		const __m512 f = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo[r])), _mm512_cvtpd_ps(hi[r]), 1);
		_mm512_mask_storeu_ps(out + r * ldo, mk, f);
	}
}

// L16_PF_TILES is how many 16-row tiles ahead l16_direct prefetches.
#define L16_PF_TILES 2

// l16_decode runs l16_direct over the ncols weight rows for the m < 4
// rows of xf.
L16 void l16_decode(const int bf16, const int R, const float *xf, const uint16_t *w, int64_t k, int64_t ncols,
                    float *out, int64_t ldo) {
	for (int64_t j = 0; j < ncols; j += 16) {
		const int nc = ncols - j < 16 ? (int)(ncols - j) : 16;
		const uint16_t *pf = j + 16 * (L16_PF_TILES + 1) <= ncols ? w + (j + 16 * L16_PF_TILES) * k : 0;
		l16_direct(bf16, R, w + j * k, k, nc, xf, out + j, ldo, pf);
	}
}

L16TARGET int di_linear16_llama_avx512(int bf16, float *out, int64_t ldo, const uint16_t *x, const uint16_t *w,
                                       int64_t m, int64_t k, int64_t ncols) {
	if (m < 4) {
		// Decode: no packed tile; x widened on the stack when it fits.
		float small[4096];
		float *xf = m * k <= 4096 ? small : malloc((size_t)(m * k) * sizeof(float));
		if (!xf)
			return 0;
		for (int64_t i = 0; i < m * k; i++)
			xf[i] = l16_one(bf16, x[i]);
		if (m == 1 && bf16)
			l16_decode(1, 1, xf, w, k, ncols, out, ldo);
		else if (m == 1)
			l16_decode(0, 1, xf, w, k, ncols, out, ldo);
		else if (m == 2 && bf16)
			l16_decode(1, 2, xf, w, k, ncols, out, ldo);
		else if (m == 2)
			l16_decode(0, 2, xf, w, k, ncols, out, ldo);
		else if (bf16)
			l16_decode(1, 3, xf, w, k, ncols, out, ldo);
		else
			l16_decode(0, 3, xf, w, k, ncols, out, ldo);
		if (xf != small)
			free(xf);
		return 1;
	}
	float *t = malloc((size_t)k * 16 * sizeof(float));
	float *xf = malloc((size_t)(m * k > 0 ? m * k : 1) * sizeof(float));
	if (!t || !xf) {
		free(t);
		free(xf);
		return 0;
	}
	for (int64_t i = 0; i < m * k; i++)
		xf[i] = l16_one(bf16, x[i]);
	for (int64_t j = 0; j < ncols; j += 16) {
		const int nc = ncols - j < 16 ? (int)(ncols - j) : 16;
		if (bf16)
			l16_pack(1, w + j * k, k, nc, t);
		else
			l16_pack(0, w + j * k, k, nc, t);
		int64_t i = 0;
		for (; i + 4 <= m; i += 4)
			l16_rows(4, t, xf + i * k, k, out + i * ldo + j, ldo, nc);
		for (; i < m; i++)
			l16_rows(1, t, xf + i * k, k, out + i * ldo + j, ldo, nc);
	}
	free(t);
	free(xf);
	return 1;
}
