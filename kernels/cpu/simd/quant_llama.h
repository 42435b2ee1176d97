// LinearQuantLlama's C kernels, shared by quant_llama_avx2.c and
// quant_llama_vnni.c; each defines QTARGET (its target attribute) and
// QVNNI (1 where the int8 dot product is AVX512-VNNI's vpdpbusd) first.
//
// Every output is vecDotLlama's block dot product (q8act.go) bit for bit.
// The integer sums of a block are exact in any order, so SIMD computes
// them as it likes; the float32 operations that apply the scales are
// vecDotLlama's, in its order:
//
//	Q8_0:  sumf = fma(float(sumi), dw*da, sumf) per block
//	Q4_0:  sumf = fma(float(sumi)*dw, da, sumf) per block
//	K:     sumf = fma(dw*da, float(isum), sumf) per block, isum the
//	       block's scaled integer sum; Q4_K/Q5_K then
//	       sumf = fma(-(dmin*da), float(sumi_mins), sumf).
//
// (Q8_0 and Q4_0 are llama.cpp's generic functions; for the K-quants those
// apply dw*da to eight lane sums, see dotKQ8K.)
//
// Q8_0/Q4_0 tiles run 8 weight rows at once, one float lane each (the
// per-block integer sums of the 8 rows are reduced into one vector); the
// K-quant decode tiles sum a (row, column)'s products of a block in the 8
// lanes of a vector and add the lanes once per block.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant_amd64.h"

#define QL static inline __attribute__((always_inline)) QTARGET

QL float ql_half(const uint8_t *p) {
	uint16_t h;
	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

QL float ql_f32(const uint8_t *p) {
	float f;
	memcpy(&f, p, 4);
	return f;
}

QL __m256i ql_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

// ql_dot32 returns 8 int32 lanes summing to sum(w[i]*a[i]) over 32 signed
// bytes (|values| <= 127), given |w| and a with w's signs.
QL __m256i ql_dot32(__m256i absw, __m256i sa) {
	return _mm256_madd_epi16(_mm256_maddubs_epi16(absw, sa), _mm256_set1_epi16(1));
}

// ql_reduce8 returns the vector whose lane c is the sum of p[c]'s lanes.
QL __m256i ql_reduce8(const __m256i *p) {
	__m256i h0 = _mm256_hadd_epi32(p[0], p[1]), h1 = _mm256_hadd_epi32(p[2], p[3]);
	__m256i h2 = _mm256_hadd_epi32(p[4], p[5]), h3 = _mm256_hadd_epi32(p[6], p[7]);
	__m256i g0 = _mm256_hadd_epi32(h0, h1), g1 = _mm256_hadd_epi32(h2, h3);
	return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

// ql_prefetch_l2 asks for the n bytes at p in L2 (one request per line).
// The decode tiles prefetch the weights of a tile further on, a share per
// block, so that the short rows of a quantized matrix keep more memory
// requests in flight than the hardware prefetcher starts on its own (see
// QL_PF32_TILES).
QL void ql_prefetch_l2(const uint8_t *p, int64_t n) {
	for (int64_t i = 0; i < n; i += 64)
		_mm_prefetch((const char *)(p + i), _MM_HINT_T1);
}

// ql_prefetch32 is the Q8_0/Q4_0 tiles' prefetch: into L1 when l1 (see
// QL_PF_L1), else into L2.
QL void ql_prefetch32(const uint8_t *p, int64_t n, int l1) {
	if (!l1) {
		ql_prefetch_l2(p, n);
		return;
	}
	for (int64_t i = 0; i < n; i += 64)
		_mm_prefetch((const char *)(p + i), _MM_HINT_T0);
}

// ql_offsets8 returns the byte offsets wc[c] - wc[0] of a tile's 8 weight
// rows (each under 2^31: 8 rows of a matrix).
QL __m256i ql_offsets8(const uint8_t *const *wc) {
	return _mm256_setr_epi32(0, (int)(wc[1] - wc[0]), (int)(wc[2] - wc[0]), (int)(wc[3] - wc[0]),
	                         (int)(wc[4] - wc[0]), (int)(wc[5] - wc[0]), (int)(wc[6] - wc[0]), (int)(wc[7] - wc[0]));
}

// ql_scales8 returns the f16 scales of block b of the 8 rows (wc[0] + b*bb
// + off[c]) as float32, gathered in one instruction: eight scalar loads
// stored to the stack and reloaded as one vector cost a store-forwarding
// stall per block, which kept the decode GEMV at half the read bandwidth.
QL __m256 ql_scales8(const uint8_t *p, __m256i off) {
	const __m256i g = _mm256_i32gather_epi32((const int *)p, off, 1);
	const __m256i lo = _mm256_shuffle_epi8(g, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
	                                                           0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
	return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(lo, 0x08)));
}

// ql_w32 returns the 32 weights of block p of a Q8_0 or Q4_0 row: signed
// with AVX2 (sign trick), unsigned with VNNI (Q8_0: w+128, Q4_0: the
// nibble q, weight q-8; ql_base removes the offset).
QL __m256i ql_w32(const int qt, const uint8_t *p) {
	if (qt == DI_Q8_0) {
		const __m256i w = ql_load(p + 2);
		return QVNNI ? _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)) : w;
	}
	const __m128i v = _mm_loadu_si128((const __m128i *)(p + 2)), m4 = _mm_set1_epi8(0x0F);
	const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
	return QVNNI ? q : _mm256_sub_epi8(q, _mm256_set1_epi8(8));
}

#if QVNNI
// ql_base is the starting accumulator whose lanes sum to -off*sum(a), off
// the weights' offset (128 for Q8_0, 8 for Q4_0): vpdpbusd on top of it
// sums the products of the weights themselves.
QL __m256i ql_base(const int qt, __m256i a) {
	const __m256i o = _mm256_set1_epi8((char)(qt == DI_Q8_0 ? 0x80 : 8));
	return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), o, a));
}

QL __m512i ql_base512(const int qt, __m512i a) {
	const __m512i o = _mm512_set1_epi8((char)(qt == DI_Q8_0 ? 0x80 : 8));
	return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), o, a));
}

// ql_reduce8x2 returns, for p[c] holding block b's 8 partial sums in
// lanes 0..7 and block b+1's in 8..15, the vector of the sums of block b
// for columns 0..7 (lanes 0..7) and of block b+1 (lanes 8..15).
QL __m512i ql_reduce8x2(const __m512i *p) {
	__m512i u[4];
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++)
		u[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]),
		                        _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
	// v0: columns 0..3 per 128-bit lane, v1: columns 4..7.
	const __m512i v0 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[0], u[1]), _mm512_unpackhi_epi64(u[0], u[1]));
	const __m512i v1 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2], u[3]), _mm512_unpackhi_epi64(u[2], u[3]));
	const __m512i ix = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), iy = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
	return _mm512_add_epi32(_mm512_permutex2var_epi64(v0, ix, v1), _mm512_permutex2var_epi64(v0, iy, v1));
}
#endif

// ql_block32 is the generic code's float step of a Q8_0 or Q4_0 block: acc
// + sumi*(dw*da) for Q8_0, acc + (sumi*dw)*da for Q4_0, fused.
QL __m256 ql_block32(const int qt, __m256 acc, __m256 sumi, __m256 dw, __m256 da) {
	if (qt == DI_Q8_0)
		return _mm256_fmadd_ps(sumi, _mm256_mul_ps(dw, da), acc);
	return _mm256_fmadd_ps(_mm256_mul_ps(sumi, dw), da, acc);
}

// ql_store8 writes the first nc lanes of each of the R vectors v to out +
// r*ldo.
QL void ql_store8(float *out, int64_t ldo, const __m256 *v, const int R, int nc) {
	for (int r = 0; r < R; r++) {
		float o[8];
		_mm256_storeu_ps(o, v[r]);
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = o[c];
	}
}

// ql_tile32 computes R activation rows (a + r*ab) against the 8 weight
// rows wc[0..7] of a Q8_0 or Q4_0 matrix, nb blocks, and writes the first
// nc columns: out[r*ldo + c]. The VNNI build takes two blocks per 512-bit
// vector and applies their scales one block after the other.
QL void ql_tile32(const int qt, const int R, const uint8_t *a, int64_t ab, const uint8_t *const *wc, int64_t nb,
                  float *out, int64_t ldo, int nc, const uint8_t *pf, int l1) {
	const int64_t bb = qt == DI_Q8_0 ? 34 : 18;
	__m256 acc[4];
#pragma GCC unroll 8
	for (int r = 0; r < R; r++)
		acc[r] = _mm256_setzero_ps();
	int64_t b = 0;
	const __m256i off = ql_offsets8(wc);
#if QVNNI
	const __m512i off16 = _mm512_inserti64x4(_mm512_castsi256_si512(off), _mm256_add_epi32(off, _mm256_set1_epi32((int)bb)), 1);
	for (; b + 2 <= nb; b += 2) {
		if (pf)
			ql_prefetch32(pf + b * 8 * bb, 16 * bb, l1);
		__m512i w[8];
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++) {
			const uint8_t *p = wc[c] + b * bb;
			w[c] = _mm512_inserti64x4(_mm512_castsi256_si512(ql_w32(qt, p)), ql_w32(qt, p + bb), 1);
		}
		const __m512 dw =
		    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(off16, (const void *)(wc[0] + b * bb), 1)));
#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			const uint8_t *ap = a + r * ab + b * 34;
			const __m512i av = _mm512_inserti64x4(_mm512_castsi256_si512(ql_load(ap + 2)), ql_load(ap + 36), 1);
			const __m512i base = ql_base512(qt, av);
			__m512i p[8];
#pragma GCC unroll 8
			for (int c = 0; c < 8; c++)
				p[c] = _mm512_dpbusd_epi32(base, w[c], av);
			const __m512 s = _mm512_cvtepi32_ps(ql_reduce8x2(p));
			const __m256 da0 = _mm256_set1_ps(ql_half(ap)), da1 = _mm256_set1_ps(ql_half(ap + 34));
			const __m256 dw0 = _mm512_castps512_ps256(dw), dw1 = _mm512_extractf32x8_ps(dw, 1);
			const __m256 s0 = _mm512_castps512_ps256(s), s1 = _mm512_extractf32x8_ps(s, 1);
			acc[r] = ql_block32(qt, acc[r], s0, dw0, da0);
			acc[r] = ql_block32(qt, acc[r], s1, dw1, da1);
		}
	}
#endif
	for (; b < nb; b++) {
		if (pf)
			ql_prefetch32(pf + b * 8 * bb, 8 * bb, l1);
		__m256i w[8];
#if !QVNNI
		__m256i aw[8];
#endif
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++) {
			const uint8_t *p = wc[c] + b * bb;
			w[c] = ql_w32(qt, p);
#if !QVNNI
			aw[c] = _mm256_abs_epi8(w[c]);
#endif
		}
		const __m256 dw = ql_scales8(wc[0] + b * bb, off);
#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			const uint8_t *ap = a + r * ab + b * 34;
			const __m256i av = ql_load(ap + 2);
			__m256i p[8];
#if QVNNI
			const __m256i base = ql_base(qt, av);
#pragma GCC unroll 8
			for (int c = 0; c < 8; c++)
				p[c] = _mm256_dpbusd_epi32(base, w[c], av);
#else
#pragma GCC unroll 8
			for (int c = 0; c < 8; c++)
				p[c] = ql_dot32(aw[c], _mm256_sign_epi8(av, w[c]));
#endif
			const __m256 s = _mm256_cvtepi32_ps(ql_reduce8(p));
			acc[r] = ql_block32(qt, acc[r], s, dw, _mm256_set1_ps(ql_half(ap)));
		}
	}
	ql_store8(out, ldo, acc, R, nc);
}

// ql_kscales unpacks the eight 6-bit scales (sc) and mins (mn) of a
// Q4_K/Q5_K block's 12 bytes (get_scale_min_k4).
QL void ql_kscales(const uint8_t *q, uint8_t *sc, uint8_t *mn) {
	uint32_t u[3], s[4];
	memcpy(u, q, 12);
	s[0] = u[0] & 0x3f3f3f3f;
	s[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
	s[2] = u[1] & 0x3f3f3f3f;
	s[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
	memcpy(sc, s, 8);
	memcpy(mn, s + 2, 8);
}

// ql_tilek computes R activation rows (Q8_K, a + r*ab) against the NC
// weight rows wc[0..NC-1] of a K-quant matrix, nb blocks, and writes the
// first nc columns: out[r*ldo + c].
QL void ql_tilek(const int qt, const int R, const int NC, const uint8_t *a, int64_t ab, const uint8_t *const *wc,
                 int64_t nb, float *out, int64_t ldo, int nc, const uint8_t *pf) {
	const int64_t bb = qt == DI_Q4_K ? 144 : qt == DI_Q5_K ? 176 : 210;
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	__m128 sumf[4]; // lane c: column c
	#pragma GCC unroll 8
	for (int r = 0; r < R; r++)
		sumf[r] = _mm_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		if (pf)
			ql_prefetch_l2(pf + b * NC * bb, NC * bb);
		__m256i lo[4][4], hi[4][4];
		#pragma GCC unroll 8
		for (int r = 0; r < R; r++)
			#pragma GCC unroll 8
			for (int c = 0; c < NC; c++)
				lo[r][c] = hi[r][c] = _mm256_setzero_si256();
		uint8_t sc[4][16], mn[4][8];
		#pragma GCC unroll 8
		for (int c = 0; c < NC; c++) {
			const uint8_t *p = wc[c] + b * bb;
			if (qt == DI_Q6_K)
				memcpy(sc[c], p + 192, 16);
			else
				ql_kscales(p + 4, sc[c], mn[c]);
		}
		#pragma GCC unroll 8
		for (int pi = 0; pi < 4; pi++) {
			// The pair of 32-weight chunks (A, B) of this step, and the
			// scales of their 16-weight halves.
			int ta, tb;
			if (qt == DI_Q6_K) {
				ta = 4 * (pi / 2) + (pi & 1);
				tb = ta + 2;
			} else {
				ta = 2 * pi;
				tb = ta + 1;
			}
			__m256i xa[4], xb[4];
			#pragma GCC unroll 8
			for (int r = 0; r < R; r++) {
				const uint8_t *q8 = a + r * ab + b * 292 + 4;
				xa[r] = ql_load(q8 + 32 * ta);
				xb[r] = ql_load(q8 + 32 * tb);
			}
			#pragma GCC unroll 8
			for (int c = 0; c < NC; c++) {
				const uint8_t *p = wc[c] + b * bb;
				__m256i qa, qb, s;
				if (qt == DI_Q6_K) {
					const int n = pi / 2, h = pi & 1;
					const __m256i ql = ql_load(p + 64 * n + 32 * h), qh = ql_load(p + 128 + 32 * n), m3 = _mm256_set1_epi8(3);
					qa = _mm256_or_si256(_mm256_and_si256(ql, m4),
					                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * h), m3), 4));
					qb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 4), m4),
					                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * h + 4), m3), 4));
					qa = _mm256_sub_epi8(qa, _mm256_set1_epi8(32));
					qb = _mm256_sub_epi8(qb, _mm256_set1_epi8(32));
					const int8_t *s8 = (const int8_t *)sc[c];
					const uint32_t s0 = (uint16_t)s8[2 * ta] | (uint32_t)(uint16_t)s8[2 * tb] << 16;
					const uint32_t s1 = (uint16_t)s8[2 * ta + 1] | (uint32_t)(uint16_t)s8[2 * tb + 1] << 16;
					s = _mm256_set_m128i(_mm_set1_epi32((int)s1), _mm_set1_epi32((int)s0));
				} else {
					const __m256i q = ql_load(p + (qt == DI_Q4_K ? 16 : 48) + 32 * pi);
					qa = _mm256_and_si256(q, m4);
					qb = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
					if (qt == DI_Q5_K) {
						const __m256i qh = ql_load(p + 16), one = _mm256_set1_epi8(1);
						qa = _mm256_or_si256(qa, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * pi), one), 4));
						qb = _mm256_or_si256(qb,
						                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * pi + 1), one), 4));
					}
					s = _mm256_set1_epi32((int)(sc[c][ta] | (uint32_t)sc[c][tb] << 16));
				}
				if (qt == DI_Q6_K) {
					const __m256i ua = _mm256_abs_epi8(qa), ub = _mm256_abs_epi8(qb);
					#pragma GCC unroll 8
					for (int r = 0; r < R; r++) {
						const __m256i pa = _mm256_maddubs_epi16(ua, _mm256_sign_epi8(xa[r], qa));
						const __m256i pb = _mm256_maddubs_epi16(ub, _mm256_sign_epi8(xb[r], qb));
						lo[r][c] = _mm256_add_epi32(lo[r][c], _mm256_madd_epi16(_mm256_unpacklo_epi16(pa, pb), s));
						hi[r][c] = _mm256_add_epi32(hi[r][c], _mm256_madd_epi16(_mm256_unpackhi_epi16(pa, pb), s));
					}
				} else {
					#pragma GCC unroll 8
					for (int r = 0; r < R; r++) {
						const __m256i pa = _mm256_maddubs_epi16(qa, xa[r]);
						const __m256i pb = _mm256_maddubs_epi16(qb, xb[r]);
						lo[r][c] = _mm256_add_epi32(lo[r][c], _mm256_madd_epi16(_mm256_unpacklo_epi16(pa, pb), s));
						hi[r][c] = _mm256_add_epi32(hi[r][c], _mm256_madd_epi16(_mm256_unpackhi_epi16(pa, pb), s));
					}
				}
			}
		}
		// Per row, the block's integer sums of the NC columns (lanes 0..3)
		// and their mins terms (lanes 4..7) in one reduction.
		float dw[4] = {0, 0, 0, 0}, dmin[4] = {0, 0, 0, 0};
		__m256i mins[4];
		#pragma GCC unroll 8
		for (int c = 0; c < NC; c++) {
			const uint8_t *p = wc[c] + b * bb;
			dw[c] = ql_half(qt == DI_Q6_K ? p + 208 : p);
			if (qt != DI_Q6_K) {
				dmin[c] = ql_half(p + 2);
				const __m128i m8 = _mm_loadl_epi64((const __m128i *)mn[c]);
				mins[c] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
			}
		}
		const __m128 dwv = _mm_loadu_ps(dw), dminv = _mm_loadu_ps(dmin);
		#pragma GCC unroll 8
		for (int r = 0; r < R; r++) {
			const uint8_t *ap = a + r * ab + b * 292;
			const __m128 da = _mm_set1_ps(ql_f32(ap));
			__m256i v[8];
			#pragma GCC unroll 4
			for (int c = 0; c < 4; c++) {
				v[c] = v[4 + c] = _mm256_setzero_si256();
				if (c >= NC)
					continue;
				v[c] = _mm256_add_epi32(lo[r][c], hi[r][c]);
				if (qt != DI_Q6_K)
					v[4 + c] = _mm256_madd_epi16(ql_load(ap + 260), mins[c]);
			}
			const __m256i red = ql_reduce8(v);
			sumf[r] = _mm_fmadd_ps(_mm_mul_ps(dwv, da), _mm_cvtepi32_ps(_mm256_castsi256_si128(red)), sumf[r]);
			if (qt != DI_Q6_K)
				sumf[r] = _mm_fnmadd_ps(_mm_mul_ps(dminv, da), _mm_cvtepi32_ps(_mm256_extracti128_si256(red, 1)), sumf[r]);
		}
	}
	#pragma GCC unroll 8
	for (int r = 0; r < R; r++) {
		float f[4];
		_mm_storeu_ps(f, sumf[r]);
		#pragma GCC unroll 8
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = f[c];
	}
}

// QL_PF32_TILES is how many 8-row tiles ahead the Q8_0/Q4_0 decode tiles
// prefetch (into L2), QL_PFK_TILES the same for the K-quant tiles of NC
// rows. Measured on a 2-vCPU AVX-512 VNNI Xeon, 2048 x 768 and 768 x 3072
// Q8_0 from memory, two threads: none 0.50-0.66 of the read bandwidth,
// 1 tile 0.85, 2 tiles 0.91-0.95, 3 tiles 0.84-0.97, 4-6 tiles (T2)
// 0.77-0.84. The K-quant tiles, bound by their own instructions, gain
// 10-15% from 1 to 2 tiles.
#define QL_PF32_TILES 2
#define QL_PFK_TILES 2

// QL_PF_L1 is the prefetch mode (the entry points' prefetch argument) in
// which the Q8_0 decode tile of one activation row prefetches one tile
// ahead into L1 instead of QL_PF32_TILES ahead into L2 (QL_PF_L2). The
// better one differs between machines: on the Xeon above two tiles into
// L2; on a 2-vCPU AMD EPYC (Zen 4) VM, one tile into L1 (a single-core
// test: 0.81-0.88 of a read loop against 0.77-0.78; BenchmarkQuantLlamaGEMV
// in kernels/cpu/simd/BENCH.md, where Q4_0 and 4 rows lost). The caller
// picks it by the CPU's vendor, ql_linear keeps it for tiles of up to
// QL_PF_L1_TILE bytes.
#define QL_PF_L2 1
#define QL_PF_L1 2

// QL_PF_L1_TILE is the largest 8-row tile (8 rows of k/32 blocks) that
// QL_PF_L1 prefetches into L1: a tile ahead must fit beside the tile being
// read in a 32 KiB L1. Wider rows prefetch into L2 (QL_PF_L2): on the Zen 4
// VM above, the Q8_0 768 x 3072 down projections of a 153M Llama (26 KiB
// tiles) took 1100-1230 µs a decode step against 1280-1900 µs in L1 mode,
// four alternating runs from huge pages; the 768-wide rows (6.5 KiB tiles)
// stay in L1 mode.
#define QL_PF_L1_TILE (16 << 10)

// ql_cols runs the tiles of R rows over the ncols weight rows at w (rb
// bytes each): NC at a time, the last tile's missing rows replaced by the
// last row (computed, not written). With pf set (the pass that streams the
// weights from memory; QL_PF_L2 or QL_PF_L1) each tile prefetches the
// weights of a later tile, as long as that tile lies within the avail rows
// from w on (the rows of this call, so across the groups of tiles of
// ql_linear).
QL void ql_cols(const int qt, const int R, const int NC, float *out, int64_t ldo, const uint8_t *a, int64_t ab,
                const uint8_t *w, int64_t rb, int64_t nb, int64_t ncols, int pf, int64_t avail) {
	const int k32 = qt == DI_Q8_0 || qt == DI_Q4_0, l1 = k32 && pf == QL_PF_L1;
	const int64_t ahead = (l1 ? 1 : k32 ? QL_PF32_TILES : QL_PFK_TILES) * NC;
	for (int64_t j = 0; j < ncols; j += NC) {
		const uint8_t *wc[8];
		const int nc = ncols - j < NC ? (int)(ncols - j) : NC;
		for (int c = 0; c < NC; c++)
			wc[c] = w + (j + (c < nc ? c : nc - 1)) * rb;
		const uint8_t *p = pf && j + ahead + NC <= avail ? w + (j + ahead) * rb : 0;
		if (k32)
			ql_tile32(qt, R, a, ab, wc, nb, out + j, ldo, nc, p, l1);
		else
			ql_tilek(qt, R, NC, a, ab, wc, nb, out + j, ldo, nc, p);
	}
}

// Helpers of both builds' packed prefill paths, which run from
// QL_PACK_ROWS activation rows on.
#define QL_PACK_ROWS 16

// ql_pack32 repacks the nc (<= NC) Q8_0 or Q4_0 weight rows at w (rb bytes
// each; the last repeated up to NC) for a packed tile of NC rows of the
// VNNI prefill (the AVX2 one packs 16-bit weights, qa_pack32): per block
// (36*NC bytes) the weights ql_w32 returns as [quad g 0..7][row c][4 bytes],
// then dw[NC] floats.
QL void ql_pack32(const int qt, const int NC, const uint8_t *w, int64_t rb, int64_t nb, int nc, uint8_t *dst) {
	const int64_t bb = qt == DI_Q8_0 ? 34 : 18;
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *d = dst + b * 36 * NC;
		float *dw = (float *)(d + 32 * NC);
		for (int c = 0; c < NC; c++) {
			const uint8_t *p = w + (c < nc ? c : nc - 1) * rb + b * bb;
			uint32_t u[8];
			_mm256_storeu_si256((__m256i *)u, ql_w32(qt, p));
#pragma GCC unroll 8
			for (int g = 0; g < 8; g++)
				memcpy(d + 4 * NC * g + 4 * c, &u[g], 4);
			dw[c] = ql_half(p);
		}
	}
}

// qp_qk writes the 256 weights of K-quant block p as int8 codes (Q6_K:
// q-32) in element order and returns them with the scales sc (16, one per
// 16 weights) and mins mn (8).
QL void qp_qk(const int qt, const uint8_t *p, int8_t *q, int16_t *sc, int16_t *mn) {
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	if (qt == DI_Q6_K) {
		for (int n = 0; n < 2; n++)
			for (int h = 0; h < 2; h++) {
				const __m256i ql = ql_load(p + 64 * n + 32 * h), qh = ql_load(p + 128 + 32 * n), m3 = _mm256_set1_epi8(3);
				__m256i qa = _mm256_or_si256(_mm256_and_si256(ql, m4),
				                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * h), m3), 4));
				__m256i qb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 4), m4),
				                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * h + 4), m3), 4));
				_mm256_storeu_si256((__m256i *)(q + 128 * n + 32 * h), _mm256_sub_epi8(qa, _mm256_set1_epi8(32)));
				_mm256_storeu_si256((__m256i *)(q + 128 * n + 32 * h + 64), _mm256_sub_epi8(qb, _mm256_set1_epi8(32)));
			}
		for (int j = 0; j < 16; j++)
			sc[j] = (int8_t)p[192 + j];
		return;
	}
	uint8_t s8[8], m8[8];
	ql_kscales(p + 4, s8, m8);
	for (int j = 0; j < 8; j++) {
		sc[2 * j] = sc[2 * j + 1] = s8[j];
		mn[j] = m8[j];
	}
	for (int c = 0; c < 4; c++) {
		const __m256i v = ql_load(p + (qt == DI_Q4_K ? 16 : 48) + 32 * c);
		__m256i qa = _mm256_and_si256(v, m4), qb = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
		if (qt == DI_Q5_K) {
			const __m256i qh = ql_load(p + 16), one = _mm256_set1_epi8(1);
			qa = _mm256_or_si256(qa, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
			qb = _mm256_or_si256(qb, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
		}
		_mm256_storeu_si256((__m256i *)(q + 64 * c), qa);
		_mm256_storeu_si256((__m256i *)(q + 64 * c + 32), qb);
	}
}

// ql_pack_quads writes the 256 unsigned codes q of one weight row's block
// as row c of a packed tile of NC rows: quad p (the codes 4p..4p+3) at d +
// 4*NC*p + 4*c.
QL void ql_pack_quads(const uint8_t *q, uint8_t *d, int c, const int NC) {
	for (int p = 0; p < 64; p++)
		memcpy(d + 4 * NC * p + 4 * c, q + 4 * p, 4);
}

// QK_SIDE is the int32 per Q8_K block of ql_bpairs' output.
#define QK_SIDE 4

// ql_bpairs writes, per Q8_K block of the nb at a, the int16 pairs (B_2h,
// B_2h+1) at h = 0..3, B_j = bsums[2j] + bsums[2j+1] the sum of the
// activations of Q4_K/Q5_K sub-block j (|B_j| <= 32*128), for the mins
// terms: QK_SIDE int32 a block.
QL void ql_bpairs(const uint8_t *a, int64_t nb, int32_t *dst) {
	for (int64_t b = 0; b < nb; b++) {
		int16_t bs[16];
		memcpy(bs, a + b * 292 + 260, 32);
		for (int h = 0; h < 4; h++) {
			const int16_t b0 = (int16_t)(bs[4 * h] + bs[4 * h + 1]), b1 = (int16_t)(bs[4 * h + 2] + bs[4 * h + 3]);
			dst[b * QK_SIDE + h] = (int32_t)((uint32_t)(uint16_t)b0 | (uint32_t)(uint16_t)b1 << 16);
		}
	}
}

// ql_pair16 packs two int16 values into one int32 (a low, b high).
QL int32_t ql_pair16(int a, int b) { return (int32_t)((uint32_t)(uint16_t)a | (uint32_t)(uint16_t)b << 16); }

// ql_packk writes row c (of NC) of a packed K-quant tile for block p of a
// weight row: the unsigned codes (Q6_K: q+32, 0..63) as ql_pack_quads
// does at d, then the int32 entries at sc (per sub-block j, [j][c]): s_j
// when pair is 0, (s_j, s_j) as int16 when it is 1; Q4_K/Q5_K the min
// pairs (m_2h, m_2h+1) at mins ([h][c]); Q6_K the scale pairs (s_2h,
// s_2h+1) at spairs ([h][c]), for the codes' offset of 32. It returns
// the block's dw and, through dmin, Q4_K/Q5_K's dmin.
QL float ql_packk(const int qt, const uint8_t *p, uint8_t *d, int32_t *sc, int32_t *mins, int32_t *spairs, int c,
                  const int NC, const int pair, float *dmin) {
	int8_t q[256];
	int16_t s[16], mn[8];
	qp_qk(qt, p, q, s, mn);
	const int q6 = qt == DI_Q6_K, nj = q6 ? 16 : 8;
	if (q6)
		for (int i = 0; i < 256; i++)
			q[i] = (int8_t)(q[i] + 32);
	ql_pack_quads((const uint8_t *)q, d, c, NC);
	for (int j = 0; j < nj; j++) {
		const int v = s[q6 ? j : 2 * j];
		sc[NC * j + c] = pair ? ql_pair16(v, v) : v;
	}
	if (q6) {
		for (int h = 0; h < 8; h++)
			spairs[NC * h + c] = ql_pair16(s[2 * h], s[2 * h + 1]);
		return ql_half(p + 208);
	}
	for (int h = 0; h < 4; h++)
		mins[NC * h + c] = ql_pair16(mn[2 * h], mn[2 * h + 1]);
	*dmin = ql_half(p + 2);
	return ql_half(p);
}

#if QVNNI
#include <stdlib.h>

// Prefill from QL_PACK_ROWS activation rows on: 16 weight rows at a time
// are repacked (once per call) so that one 512-bit vector holds the same
// weights of 16 rows and each lane accumulates one output (a column; for
// Q6_K a column and one of the generic code's lanes l); the activations
// are broadcast. The integer sums per block, and the float operations per
// output, are those of the tiles above.
//
// Q8_0/Q4_0 block of the 16 rows (QP32_BYTES): u8 weights (Q8_0: w+128,
// Q4_0: q) as [quad g 0..7][row c 0..15][4 bytes], then dw[16] floats.
// vpdpbusd sums four products per lane from a base of -off*sum(a).
//
// The K-quant layouts (QPK4_BYTES for Q4_K/Q5_K, QPK6_BYTES for Q6_K) are
// described with their kernels below. The kernels' inner products go
// through qp_dpbusd_b, qp_dpwssd and qp_dpwssd_b (inline assembly): with
// the intrinsics GCC 12 copied every accumulator to a fresh register and
// back around each instruction, which had the K-quant kernels at half
// their speed.
#define QP32_BYTES (512 + 64)

// qp_rows32 computes R rows (activations a + r*ab, block sums asum[r*nb+b])
// against a packed tile and writes nc columns of out[r*ldo + c].
QL void qp_rows32(const int qt, const int R, const uint8_t *pk, int64_t nb, const uint8_t *a, int64_t ab,
                  const int32_t *asum, float *out, int64_t ldo, int nc) {
	const int off = qt == DI_Q8_0 ? 128 : 8;
	__m512 acc[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		acc[r] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = pk + b * QP32_BYTES;
		__m512i s[4];
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			s[r] = _mm512_set1_epi32(-off * asum[r * nb + b]);
#pragma GCC unroll 8
		for (int g = 0; g < 8; g++) {
			const __m512i wv = _mm512_loadu_si512(pb + 64 * g);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				int32_t q;
				memcpy(&q, a + r * ab + b * 34 + 2 + 4 * g, 4);
				s[r] = _mm512_dpbusd_epi32(s[r], wv, _mm512_set1_epi32(q));
			}
		}
		const __m512 dw = _mm512_loadu_ps(pb + 512);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const __m512 da = _mm512_set1_ps(ql_half(a + r * ab + b * 34));
			const __m512 sf = _mm512_cvtepi32_ps(s[r]);
			if (qt == DI_Q8_0)
				acc[r] = _mm512_fmadd_ps(sf, _mm512_mul_ps(dw, da), acc[r]);
			else
				acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(sf, dw), da, acc[r]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		_mm512_mask_storeu_ps(out + r * ldo, (__mmask16)((1u << nc) - 1), acc[r]);
}

// qp_dpbusd_b, qp_dpwssd and qp_dpwssd_b are vpdpbusd/vpdpwssd with the
// accumulator tied to the destination register (the _b forms broadcast a
// 32-bit activation group from memory).
QL __m512i qp_dpbusd_b(__m512i acc, __m512i w, const int32_t *x) {
	__asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
	return acc;
}

QL __m512i qp_dpwssd(__m512i acc, __m512i x, __m512i y) {
	__asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(y));
	return acc;
}

QL __m512i qp_dpwssd_b(__m512i acc, __m512i w, const int32_t *x) {
	__asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
	return acc;
}

// K-quant block of the 16 rows (QPK_BYTES): the unsigned codes (Q6_K: q+32)
// as [quad p 0..63][row c][4 bytes] (ql_packk), then int32 [j][c] = the
// sub-block scale s_j (QPK_SCL; 8 sub-blocks of 32 weights, Q6_K 16 of
// 16), then Q4_K/Q5_K int32 [h 0..3][c] = the min pair (m_2h, m_2h+1)
// against ql_bpairs' pairs of sub-block sums, Q6_K int32 [h 0..7][c] =
// the scale pair (s_2h, s_2h+1) against the bsums pairs (QPK_PAIRS), then
// dw[16] and (Q4_K/Q5_K) dmin[16] (QPK_DW). Per sub-block, vpdpbusd sums
// its codes times the activations (broadcast four at a time from the Q8_K
// block) into t, exactly (|t| <= 32*63*128), and vpmulld by s_j adds s_j*t
// to the block's integer; Q6_K's integer starts at -32*sum(s_j*bsum_j),
// the codes' offset. 64 vpdpbusd and 8 (Q6_K 16) vpmulld a block and row:
// the generic code's eight lanes, each scaled on its own, took 96 VNNI
// instructions (Q6_K 128).
#define QPK_SCL 4096
#define QPK_PAIRS (QPK_SCL + 16 * 64)
#define QPK_DW (QPK_PAIRS + 8 * 64)
#define QPK_BYTES (QPK_DW + 128)

QL void qp_packk(const int qt, const uint8_t *w, int64_t rb, int64_t nb, int nc, uint8_t *dst) {
	const int64_t bb = qt == DI_Q4_K ? 144 : qt == DI_Q5_K ? 176 : 210;
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *d = dst + b * QPK_BYTES;
		int32_t *pairs = (int32_t *)(d + QPK_PAIRS);
		float *dw = (float *)(d + QPK_DW);
		for (int c = 0; c < 16; c++)
			dw[c] = ql_packk(qt, w + (c < nc ? c : nc - 1) * rb + b * bb, d, (int32_t *)(d + QPK_SCL), pairs, pairs, c,
			                 16, 0, dw + 16 + c);
	}
}

// qp_rowsk computes R rows (Q8_K activations a + r*ab; Q4_K/Q5_K their
// ql_bpairs at side + r*nb*QK_SIDE) against a packed K-quant tile; nc
// columns of out[r*ldo + c]. The float operations per output are
// vecDotLlama's: per block fma(dw*da, isum), then the mins.
QL void qp_rowsk(const int qt, const int R, const uint8_t *pk, int64_t nb, const uint8_t *a, int64_t ab,
                 const int32_t *side, float *out, int64_t ldo, int nc) {
	const int q6 = qt == DI_Q6_K, nj = q6 ? 16 : 8, nq = q6 ? 4 : 8; // sub-blocks, quads per sub-block
	__m512 sumf[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		sumf[r] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = pk + b * QPK_BYTES;
		__m512i aux[4];
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			aux[r] = _mm512_setzero_si512();
		if (q6) {
			// -32 * sum_j s_j*bsum_j: the codes' offset.
#pragma GCC unroll 8
			for (int h = 0; h < 8; h++) {
				const __m512i sv = _mm512_loadu_si512(pb + QPK_PAIRS + 64 * h);
#pragma GCC unroll 4
				for (int r = 0; r < R; r++)
					aux[r] = qp_dpwssd_b(aux[r], sv, (const int32_t *)(a + r * ab + b * 292 + 260) + h);
			}
#pragma GCC unroll 4
			for (int r = 0; r < R; r++)
				aux[r] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(aux[r], 5));
		}
#pragma GCC unroll 2
		for (int j = 0; j < nj; j++) {
			__m512i t[4];
#pragma GCC unroll 4
			for (int r = 0; r < R; r++)
				t[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
			for (int g = 0; g < nq; g++) {
				const int qd = nq * j + g;
				const __m512i wv = _mm512_loadu_si512(pb + 64 * qd);
#pragma GCC unroll 4
				for (int r = 0; r < R; r++)
					t[r] = qp_dpbusd_b(t[r], wv, (const int32_t *)(a + r * ab + b * 292 + 4) + qd);
			}
			const __m512i sv = _mm512_loadu_si512(pb + QPK_SCL + 64 * j);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++)
				aux[r] = _mm512_add_epi32(aux[r], _mm512_mullo_epi32(t[r], sv));
		}
		const __m512 dw = _mm512_loadu_ps(pb + QPK_DW);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const __m512 da = _mm512_set1_ps(ql_f32(a + r * ab + b * 292));
			sumf[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(aux[r]), sumf[r]);
		}
		if (q6)
			continue;
		const __m512 dmin = _mm512_loadu_ps(pb + QPK_DW + 64);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			__m512i mi = _mm512_setzero_si512();
#pragma GCC unroll 4
			for (int h = 0; h < 4; h++)
				mi = qp_dpwssd_b(mi, _mm512_loadu_si512(pb + QPK_PAIRS + 64 * h), side + (r * nb + b) * QK_SIDE + h);
			const __m512 dm = _mm512_mul_ps(dmin, _mm512_set1_ps(ql_f32(a + r * ab + b * 292)));
			sumf[r] = _mm512_fnmadd_ps(dm, _mm512_cvtepi32_ps(mi), sumf[r]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		_mm512_mask_storeu_ps(out + r * ldo, (__mmask16)((1u << nc) - 1), sumf[r]);
}

// qp_linear is ql_linear through packed tiles; it returns 0 (and computes
// nothing) when its scratch cannot be allocated.
QL int qp_linear(const int qt, float *out, int64_t ldo, const uint8_t *a, const uint8_t *w, int64_t m, int64_t k,
                 int64_t ncols) {
	const int k32 = qt == DI_Q8_0 || qt == DI_Q4_0;
	const int64_t nb = k / (k32 ? 32 : 256);
	const int64_t bb = qt == DI_Q8_0 ? 34 : qt == DI_Q4_0 ? 18 : qt == DI_Q4_K ? 144 : qt == DI_Q5_K ? 176 : 210;
	const int64_t rb = nb * bb, ab = k32 ? nb * 34 : nb * 292;
	uint8_t *pk = malloc((size_t)nb * (k32 ? QP32_BYTES : QPK_BYTES));
	// Block sums (Q8_0/Q4_0) or pairs of sub-block sums (Q4_K/Q5_K) of a.
	int32_t *side = malloc((size_t)m * nb * (k32 ? 1 : QK_SIDE) * sizeof(int32_t));
	if (!pk || !side) {
		free(pk);
		free(side);
		return 0;
	}
	for (int64_t i = 0; i < m; i++) {
		if (k32) {
			for (int64_t b = 0; b < nb; b++) {
				int32_t s = 0;
				for (int t = 0; t < 32; t++)
					s += (int8_t)a[i * ab + b * 34 + 2 + t];
				side[i * nb + b] = s;
			}
		} else if (qt != DI_Q6_K) {
			ql_bpairs(a + i * ab, nb, side + i * nb * QK_SIDE);
		}
	}
	for (int64_t j = 0; j < ncols; j += 16) {
		const int nc = ncols - j < 16 ? (int)(ncols - j) : 16;
		int64_t i = 0;
		if (k32) {
			ql_pack32(qt, 16, w + j * rb, rb, nb, nc, pk);
			for (; i + 4 <= m; i += 4)
				qp_rows32(qt, 4, pk, nb, a + i * ab, ab, side + i * nb, out + i * ldo + j, ldo, nc);
			for (; i < m; i++)
				qp_rows32(qt, 1, pk, nb, a + i * ab, ab, side + i * nb, out + i * ldo + j, ldo, nc);
		} else {
			qp_packk(qt, w + j * rb, rb, nb, nc, pk);
			for (; i + 4 <= m; i += 4)
				qp_rowsk(qt, 4, pk, nb, a + i * ab, ab, side + i * nb * QK_SIDE, out + i * ldo + j, ldo, nc);
			for (; i < m; i++)
				qp_rowsk(qt, 1, pk, nb, a + i * ab, ab, side + i * nb * QK_SIDE, out + i * ldo + j, ldo, nc);
		}
	}
	free(pk);
	free(side);
	return 1;
}
#endif

#if !QVNNI
#include <stdlib.h>

// The AVX2 build's prefill from QL_PACK_ROWS activation rows on: QA_NC
// weight rows at a time are repacked (once per call) as 16-bit integers so
// that one 256-bit vector holds the same pair of weights of 8 rows, and each
// lane accumulates one output (no horizontal sums: the tiles above reduce 8
// vectors a block and row). The activations are widened to 16 bits once per
// call (qa_widen), and vpmaddwd of a weight vector with a broadcast pair of
// activations adds two exact products per lane: two multiplications per 32
// products of 8 columns. (The int8 form, vpmaddubsw on |w| and the
// activations with w's signs, then vpmaddwd by ones, adds a vpsignb, which
// shares vpmaddubsw's two pipes on Zen 4: 0.76-0.98x the rate of this one,
// BENCH.md.) The block's integer sums are exact (|sum| <= 32*128*128), and
// the float operations per output are the generic code's, as in the tiles
// above.
//
// A Q8_0/Q4_0 block of the 16 rows (QA32_BYTES): the weights (Q4_0: q-8) as
// int16 [pair j 0..15][row c 0..15][2], then dw[16] floats.
#define QA_NC 16
#define QA32_BYTES (QA_NC * 64 + QA_NC * 4)

// qa_pack32 repacks the nc (<= QA_NC) Q8_0 or Q4_0 weight rows at w (rb
// bytes each; the last repeated up to QA_NC) into nb packed blocks at dst.
QL void qa_pack32(const int qt, const uint8_t *w, int64_t rb, int64_t nb, int nc, uint8_t *dst) {
	const int64_t bb = qt == DI_Q8_0 ? 34 : 18;
	for (int64_t b = 0; b < nb; b++) {
		uint32_t *d = (uint32_t *)(dst + b * QA32_BYTES);
		float *dw = (float *)(dst + b * QA32_BYTES + QA_NC * 64);
		for (int c = 0; c < QA_NC; c++) {
			const uint8_t *p = w + (c < nc ? c : nc - 1) * rb + b * bb;
			const __m256i q = ql_w32(qt, p);
			uint32_t u[16]; // the 16 pairs of the row's weights as int16
			_mm256_storeu_si256((__m256i *)u, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)));
			_mm256_storeu_si256((__m256i *)(u + 8), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)));
#pragma GCC unroll 16
			for (int j = 0; j < 16; j++)
				d[QA_NC * j + c] = u[j];
			dw[c] = ql_half(p);
		}
	}
}

// qa_widen writes the m activation rows at a (nb Q8_0 blocks each, ab
// bytes apart) as int16 rows of k = 32*nb values (x) and their blocks'
// scales as float32 (da, nb per row).
QL void qa_widen(const uint8_t *a, int64_t ab, int64_t m, int64_t nb, int16_t *x, float *da) {
	for (int64_t i = 0; i < m; i++)
		for (int64_t b = 0; b < nb; b++) {
			const uint8_t *p = a + i * ab + b * 34;
			int16_t *d = x + (i * nb + b) * 32;
			_mm256_storeu_si256((__m256i *)d, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 2))));
			_mm256_storeu_si256((__m256i *)(d + 16), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 18))));
			da[i * nb + b] = ql_half(p);
		}
}

// QA_STEP is one activation row's step of qa_block4: the pair j at X (+S)
// broadcast, multiplied by the two weight vectors (ymm12, ymm13) and added
// to the row's accumulators a<R> (columns 0..7) and b<R> (8..15).
#define QA_STEP(R, X, S)                                                                                              \
	"vpbroadcastd 4*\\j(" X S "), %%ymm14\n\t"                                                                     \
	"vpmaddwd %%ymm14, %%ymm12, %%ymm15\n\t"                                                                        \
	"vpmaddwd %%ymm14, %%ymm13, %%ymm14\n\t"                                                                        \
	"vpaddd %%ymm15, %[a" R "], %[a" R "]\n\t"                                                                      \
	"vpaddd %%ymm14, %[b" R "], %[b" R "]\n\t"

// qa_block4 returns in s0[r] (columns 0..7) and s1[r] (8..15) the integer
// sums of one packed block at w with four int16 activation rows (at x0,
// x0 + st bytes, x2, x2 + st bytes). In assembly: from intrinsics GCC
// spilled an accumulator around every step (a store and a reload in the
// chain of sums), which ran at 0.88-0.93x this rate on one core.
QL void qa_block4(const uint8_t *w, const int16_t *x0, const int16_t *x2, int64_t st, __m256i *s0, __m256i *s1) {
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
	__asm__(".irp j, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"
	        "vmovdqu 64*\\j(%[w]), %%ymm12\n\t"
	        "vmovdqu 64*\\j+32(%[w]), %%ymm13\n\t"
	        QA_STEP("0", "%[x0]", "") QA_STEP("1", "%[x0]", ",%[st]") QA_STEP("2", "%[x2]", "") QA_STEP("3", "%[x2]", ",%[st]")
	        ".endr\n\t"
	        : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [b0] "+x"(b0), [b1] "+x"(b1), [b2] "+x"(b2),
	          [b3] "+x"(b3)
	        : [w] "r"(w), [x0] "r"(x0), [x2] "r"(x2), [st] "r"(st)
	        : "xmm12", "xmm13", "xmm14", "xmm15", "memory");
	s0[0] = a0, s0[1] = a1, s0[2] = a2, s0[3] = a3, s1[0] = b0, s1[1] = b1, s1[2] = b2, s1[3] = b3;
}

// qa_rows32 computes R (1 to 4) rows (int16 activations x + r*k, block
// scales da + r*nb) against a packed tile and writes nc columns of
// out[r*ldo + c].
QL void qa_rows32(const int qt, const int R, const uint8_t *pk, int64_t nb, const int16_t *x, const float *da, int64_t k,
                  float *out, int64_t ldo, int nc) {
	__m256 acc[4][2];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		acc[r][0] = acc[r][1] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = pk + b * QA32_BYTES;
		__m256i s0[4], s1[4];
		if (R == 4) {
			qa_block4(pb, x + b * 32, x + 2 * k + b * 32, 2 * k, s0, s1);
		} else {
#pragma GCC unroll 4
			for (int r = 0; r < R; r++)
				s0[r] = s1[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
			for (int j = 0; j < 16; j++) {
				const __m256i w0 = _mm256_loadu_si256((const __m256i *)(pb + 64 * j));
				const __m256i w1 = _mm256_loadu_si256((const __m256i *)(pb + 64 * j + 32));
#pragma GCC unroll 4
				for (int r = 0; r < R; r++) {
					int32_t q;
					memcpy(&q, x + r * k + b * 32 + 2 * j, 4);
					const __m256i xv = _mm256_set1_epi32(q);
					s0[r] = _mm256_add_epi32(s0[r], _mm256_madd_epi16(w0, xv));
					s1[r] = _mm256_add_epi32(s1[r], _mm256_madd_epi16(w1, xv));
				}
			}
		}
		const __m256 dw0 = _mm256_loadu_ps((const float *)(pb + QA_NC * 64));
		const __m256 dw1 = _mm256_loadu_ps((const float *)(pb + QA_NC * 64 + 32));
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const __m256 d = _mm256_broadcast_ss(da + r * nb + b);
			acc[r][0] = ql_block32(qt, acc[r][0], _mm256_cvtepi32_ps(s0[r]), dw0, d);
			acc[r][1] = ql_block32(qt, acc[r][1], _mm256_cvtepi32_ps(s1[r]), dw1, d);
		}
	}
	for (int r = 0; r < R; r++) {
		float o[QA_NC];
		_mm256_storeu_ps(o, acc[r][0]);
		_mm256_storeu_ps(o + 8, acc[r][1]);
		for (int c = 0; c < nc; c++)
			out[r * ldo + c] = o[c];
	}
}

// A K-quant block of 8 rows for the AVX2 prefill (QAK_BYTES): the unsigned
// codes (Q6_K: q+32) as [quad p 0..63][row c 0..7][4 bytes] (ql_packk),
// int32 [j][c] = the scale pair (s_j, s_j) of sub-block j (QAK_SCL), then
// Q4_K/Q5_K int32 [h 0..3][c] = the min pair (m_2h, m_2h+1), Q6_K int32
// [h 0..7][c] = the scale pair (s_2h, s_2h+1) (QAK_PAIRS), then dw[8] and
// dmin[8] (QAK_DW). vpmaddubsw gives a quad's two pair sums (|pair| <=
// 2*63*128); vpaddw adds those of QAK_GROUP(qt) quads of one sub-block
// within int16 (Q4_K/Q5_K 4: |.| <= 4*2*31*128 = 31744; Q6_K 2: 32256),
// and vpmaddwd by (s_j, s_j) adds s_j times them to the block's integer;
// Q6_K's starts at -32*sum(s_j*bsum_j), the codes' offset. (Groups of 8
// quads, which Q4_K's codes would allow, ran at 0.87x the rate of 4: a
// longer chain of dependent adds.)
#define QAK_SCL 2048
#define QAK_PAIRS (QAK_SCL + 16 * 32)
#define QAK_DW (QAK_PAIRS + 8 * 32)
#define QAK_BYTES (QAK_DW + 64)
#define QAK_GROUP(qt) ((qt) == DI_Q6_K ? 2 : 4)

QL void qa_packk(const int qt, const uint8_t *w, int64_t rb, int64_t nb, int nc, uint8_t *dst) {
	const int64_t bb = qt == DI_Q4_K ? 144 : qt == DI_Q5_K ? 176 : 210;
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *d = dst + b * QAK_BYTES;
		int32_t *pairs = (int32_t *)(d + QAK_PAIRS);
		float *dw = (float *)(d + QAK_DW);
		for (int c = 0; c < 8; c++)
			dw[c] = ql_packk(qt, w + (c < nc ? c : nc - 1) * rb + b * bb, d, (int32_t *)(d + QAK_SCL), pairs, pairs, c, 8,
			                 1, dw + 8 + c);
	}
}

// qa_rowsk computes R rows (Q8_K activations a + r*ab; Q4_K/Q5_K their
// ql_bpairs at side + r*nb*QK_SIDE) against a packed K-quant tile of 8
// rows and writes nc columns of out[r*ldo + c]. The float operations per
// output are vecDotLlama's: per block fma(dw*da, isum), then the mins.
QL void qa_rowsk(const int qt, const int R, const uint8_t *pk, int64_t nb, const uint8_t *a, int64_t ab,
                 const int32_t *side, float *out, int64_t ldo, int nc) {
	const int q6 = qt == DI_Q6_K, nj = q6 ? 16 : 8, nq = q6 ? 4 : 8, grp = QAK_GROUP(qt);
	__m256 sumf[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		sumf[r] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = pk + b * QAK_BYTES;
		__m256i aux[4];
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			aux[r] = _mm256_setzero_si256();
			if (!q6)
				continue;
			// -32 * sum_j s_j*bsum_j: the codes' offset.
			const int32_t *bs = (const int32_t *)(a + r * ab + b * 292 + 260);
			__m256i c = _mm256_setzero_si256();
#pragma GCC unroll 8
			for (int h = 0; h < 8; h++)
				c = _mm256_add_epi32(
				    c, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(pb + QAK_PAIRS + 32 * h)), _mm256_set1_epi32(bs[h])));
			aux[r] = _mm256_sub_epi32(aux[r], _mm256_slli_epi32(c, 5));
		}
#pragma GCC unroll 1
		for (int j = 0; j < nj; j++) {
			const __m256i sv = _mm256_loadu_si256((const __m256i *)(pb + QAK_SCL + 32 * j));
#pragma GCC unroll 1
			for (int g0 = 0; g0 < nq; g0 += grp) {
				__m256i t[4];
#pragma GCC unroll 8
				for (int g = g0; g < g0 + grp; g++) {
					const int qd = nq * j + g;
					const __m256i wv = _mm256_loadu_si256((const __m256i *)(pb + 32 * qd));
#pragma GCC unroll 4
					for (int r = 0; r < R; r++) {
						int32_t x;
						memcpy(&x, a + r * ab + b * 292 + 4 + 4 * qd, 4);
						const __m256i p = _mm256_maddubs_epi16(wv, _mm256_set1_epi32(x));
						t[r] = g == g0 ? p : _mm256_add_epi16(t[r], p);
					}
				}
#pragma GCC unroll 4
				for (int r = 0; r < R; r++)
					aux[r] = _mm256_add_epi32(aux[r], _mm256_madd_epi16(t[r], sv));
			}
		}
		const __m256 dw = _mm256_loadu_ps((const float *)(pb + QAK_DW));
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const float da = ql_f32(a + r * ab + b * 292);
			sumf[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(aux[r]), sumf[r]);
			if (q6)
				continue;
			__m256i mi = _mm256_setzero_si256();
#pragma GCC unroll 4
			for (int h = 0; h < 4; h++) {
				const __m256i mv = _mm256_loadu_si256((const __m256i *)(pb + QAK_PAIRS + 32 * h));
				mi = _mm256_add_epi32(mi, _mm256_madd_epi16(mv, _mm256_set1_epi32(side[(r * nb + b) * QK_SIDE + h])));
			}
			const __m256 dmin = _mm256_loadu_ps((const float *)(pb + QAK_DW + 32));
			sumf[r] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(mi), sumf[r]);
		}
	}
	ql_store8(out, ldo, sumf, R, nc);
}

// qa_linear is ql_linear through packed tiles of 8 weight rows; it returns
// 0 (and computes nothing) when its scratch cannot be allocated.
QL int qa_linear(const int qt, float *out, int64_t ldo, const uint8_t *a, const uint8_t *w, int64_t m, int64_t k,
                 int64_t ncols) {
	if (qt == DI_Q4_K || qt == DI_Q5_K || qt == DI_Q6_K) {
		const int64_t nb = k / 256, rb = nb * (qt == DI_Q4_K ? 144 : qt == DI_Q5_K ? 176 : 210), ab = nb * 292;
		uint8_t *pk = malloc((size_t)nb * QAK_BYTES);
		int32_t *side = malloc((size_t)m * nb * QK_SIDE * sizeof(int32_t));
		if (!pk || !side) {
			free(pk);
			free(side);
			return 0;
		}
		if (qt != DI_Q6_K)
			for (int64_t i = 0; i < m; i++)
				ql_bpairs(a + i * ab, nb, side + i * nb * QK_SIDE);
		for (int64_t j = 0; j < ncols; j += 8) {
			const int nc = ncols - j < 8 ? (int)(ncols - j) : 8;
			qa_packk(qt, w + j * rb, rb, nb, nc, pk);
			int64_t i = 0;
			for (; i + 4 <= m; i += 4)
				qa_rowsk(qt, 4, pk, nb, a + i * ab, ab, side + i * nb * QK_SIDE, out + i * ldo + j, ldo, nc);
			for (; i < m; i++)
				qa_rowsk(qt, 1, pk, nb, a + i * ab, ab, side + i * nb * QK_SIDE, out + i * ldo + j, ldo, nc);
		}
		free(pk);
		free(side);
		return 1;
	}
	if (qt != DI_Q8_0 && qt != DI_Q4_0)
		return 0;
	const int64_t nb = k / 32, bb = qt == DI_Q8_0 ? 34 : 18, rb = nb * bb, ab = nb * 34;
	uint8_t *pk = malloc((size_t)nb * QA32_BYTES);
	int16_t *x = malloc((size_t)(m * k) * sizeof(int16_t));
	float *da = malloc((size_t)(m * nb) * sizeof(float));
	if (!pk || !x || !da) {
		free(pk);
		free(x);
		free(da);
		return 0;
	}
	qa_widen(a, ab, m, nb, x, da);
	for (int64_t j = 0; j < ncols; j += QA_NC) {
		const int nc = ncols - j < QA_NC ? (int)(ncols - j) : QA_NC;
		qa_pack32(qt, w + j * rb, rb, nb, nc, pk);
		int64_t i = 0;
		for (; i + 4 <= m; i += 4)
			qa_rows32(qt, 4, pk, nb, x + i * k, da + i * nb, k, out + i * ldo + j, ldo, nc);
		switch (m - i) {
		case 3: qa_rows32(qt, 3, pk, nb, x + i * k, da + i * nb, k, out + i * ldo + j, ldo, nc); break;
		case 2: qa_rows32(qt, 2, pk, nb, x + i * k, da + i * nb, k, out + i * ldo + j, ldo, nc); break;
		case 1: qa_rows32(qt, 1, pk, nb, x + i * k, da + i * nb, k, out + i * ldo + j, ldo, nc); break;
		}
	}
	free(pk);
	free(x);
	free(da);
	return 1;
}
#endif

// ql_linear: out[i*ldo + j] = the block dot product of activation row i
// (a + i*ab) with weight row j (w + j*rb), i in [0, m), j in [0, ncols).
// Weight tiles outside, activation rows inside: a tile's weights stay in
// L1 while the rows stream past them. pf is the decode tiles' prefetch
// mode (QL_PF_L2 or QL_PF_L1); QL_PF_L1 applies to one Q8_0 row alone,
// where it was measured (QL_PF_L1), and to tiles of up to QL_PF_L1_TILE
// bytes.
QL void ql_linear(const int qt, float *out, int64_t ldo, const uint8_t *a, const uint8_t *w, int64_t m, int64_t k,
                  int64_t ncols, int pf) {
	pf = pf == QL_PF_L1 && qt == DI_Q8_0 && m == 1 && 8 * (k / 32) * 34 <= QL_PF_L1_TILE ? QL_PF_L1 : QL_PF_L2;
#if QVNNI
	if (m >= QL_PACK_ROWS && qp_linear(qt, out, ldo, a, w, m, k, ncols))
		return;
#else
	if (m >= QL_PACK_ROWS && qa_linear(qt, out, ldo, a, w, m, k, ncols))
		return;
#endif
	const int bs = qt == DI_Q8_0 || qt == DI_Q4_0 ? 32 : 256;
	const int64_t nb = k / bs;
	const int64_t bb = qt == DI_Q8_0 ? 34 : qt == DI_Q4_0 ? 18 : qt == DI_Q4_K ? 144 : qt == DI_Q5_K ? 176 : 210;
	const int64_t rb = nb * bb, ab = bs == 32 ? nb * 34 : nb * 292;
	const int k32 = bs == 32;
	const int NC = k32 ? 8 : (m >= 4 ? QL_KCOLS_PREFILL : 4);
	const int64_t step = k32 ? 8 : 4 * NC; // weight rows per outer step
	for (int64_t j0 = 0; j0 < ncols; j0 += step) {
		const int64_t cols = ncols - j0 < step ? ncols - j0 : step;
		const uint8_t *wj = w + j0 * rb;
		float *oj = out + j0;
		int64_t i = 0;
		const int64_t avail = ncols - j0;
		// The first pass over a tile streams it from memory and prefetches.
		if (k32) {
			for (; i + 4 <= m; i += 4)
				ql_cols(qt, 4, 8, oj + i * ldo, ldo, a + i * ab, ab, wj, rb, nb, cols, i == 0 ? pf : 0, avail);
			switch (m - i) {
			case 3: ql_cols(qt, 3, 8, oj + i * ldo, ldo, a + i * ab, ab, wj, rb, nb, cols, i == 0 ? pf : 0, avail); break;
			case 2: ql_cols(qt, 2, 8, oj + i * ldo, ldo, a + i * ab, ab, wj, rb, nb, cols, i == 0 ? pf : 0, avail); break;
			case 1: ql_cols(qt, 1, 8, oj + i * ldo, ldo, a + i * ab, ab, wj, rb, nb, cols, i == 0 ? pf : 0, avail); break;
			}
		} else if (m >= 4) {
			for (; i + 4 <= m; i += 4)
				ql_cols(qt, 4, QL_KCOLS_PREFILL, oj + i * ldo, ldo, a + i * ab, ab, wj, rb, nb, cols, i == 0 ? pf : 0, avail);
			for (; i < m; i++)
				ql_cols(qt, 1, QL_KCOLS_PREFILL, oj + i * ldo, ldo, a + i * ab, ab, wj, rb, nb, cols, 0, avail);
		} else {
			for (; i < m; i++)
				ql_cols(qt, 1, 4, oj + i * ldo, ldo, a + i * ab, ab, wj, rb, nb, cols, i == 0 ? pf : 0, avail);
		}
	}
}

// ql_quantize_q8k writes the nb blocks of 256 floats at x as Q8_K blocks
// (QuantizeQ8K in q8act.go, bit for bit): the first value of largest
// magnitude mx (NaNs never count, as in the scalar comparison),
// iscale = -127/mx, q = min(127, nearest(iscale*x)) by ggml's nearest_int
// (the float add of 1.5*2^23 and the low mantissa bits, kept here so that
// NaN and out-of-range values give the scalar code's bytes), the low byte
// of q, d = 1/iscale, and bsums of the stored bytes.
QL void ql_quantize_q8k(const float *x, uint8_t *y, int64_t nb) {
	const __m256 sign = _mm256_set1_ps(-0.0f);
	for (int64_t b = 0; b < nb; b++, x += 256, y += 292) {
		__m256 mx8 = _mm256_setzero_ps();
#pragma GCC unroll 4
		for (int i = 0; i < 256; i += 8)
			// max(a, b) returns b when a is a NaN.
			mx8 = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), mx8);
		__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx8), _mm256_extractf128_ps(mx8, 1));
		m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
		m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
		const float amax = _mm_cvtss_f32(m4);
		if (!(amax > 0)) {
			memset(y, 0, 292);
			continue;
		}
		const __m256 am = _mm256_set1_ps(amax);
		int idx = 0;
		for (int i = 0; i < 256; i += 8) {
			const int mask =
			    _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), am, _CMP_EQ_OQ));
			if (mask) {
				idx = i + __builtin_ctz((unsigned)mask);
				break;
			}
		}
		const float iscale = -127.0f / x[idx];
		const __m256 is = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
		const __m256i lowm = _mm256_set1_epi32(0x007fffff), bias = _mm256_set1_epi32(0x00400000);
		const __m256i m127 = _mm256_set1_epi32(127), mff = _mm256_set1_epi32(0xff);
		const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
		int16_t bs[16];
		for (int i = 0; i < 256; i += 32) {
			__m256i q[4];
#pragma GCC unroll 4
			for (int t = 0; t < 4; t++) {
				__m256 f = _mm256_mul_ps(is, _mm256_loadu_ps(x + i + 8 * t));
				// Keep the product rounded: no fused multiply-add.
				__asm__("" : "+x"(f));
				const __m256i v = _mm256_castps_si256(_mm256_add_ps(f, magic));
				const __m256i n = _mm256_sub_epi32(_mm256_and_si256(v, lowm), bias);
				q[t] = _mm256_and_si256(_mm256_min_epi32(n, m127), mff);
			}
			const __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]), _mm256_packus_epi32(q[2], q[3]));
			const __m256i bytes = _mm256_permutevar8x32_epi32(p, order);
			_mm256_storeu_si256((__m256i *)(y + 4 + i), bytes);
			const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes), _mm256_set1_epi16(1));
			int32_t u[8];
			_mm256_storeu_si256((__m256i *)u, s4);
			bs[i / 16] = (int16_t)(u[0] + u[1] + u[2] + u[3]);
			bs[i / 16 + 1] = (int16_t)(u[4] + u[5] + u[6] + u[7]);
		}
		memcpy(y + 260, bs, 32);
		const float d = 1.0f / iscale;
		memcpy(y, &d, 4);
	}
}

// ql_quantize_q8_0 writes the nb blocks of 32 floats at x as Q8_0 blocks
// (quantQ8_0 in quant_ref.go, bit for bit): amax the largest |x|,
// d = amax/127 stored as a half (F16C, ties to even, as F32ToF16 for
// finite d), id = 1/d (0 when d is 0), q = round(x*id) with ties away from
// zero (the product rounded first). It returns nb, or the index of the
// first block holding a NaN or an infinity (or whose d is so small that
// id overflows), where it stops: the scalar code's sequential maximum and
// float-to-int conversions decide those blocks, so the caller quantizes
// them with it. Cost: about two passes of
// 8-wide operations over the block, in registers.
QL int64_t ql_quantize_q8_0(const float *x, uint8_t *y, int64_t nb) {
	const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
	const __m256 inf = _mm256_set1_ps(__builtin_inff());
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	for (int64_t b = 0; b < nb; b++, x += 32, y += 34) {
		__m256 v[4], mx = _mm256_setzero_ps();
		int bad = 0;
		for (int t = 0; t < 4; t++) {
			v[t] = _mm256_loadu_ps(x + 8 * t);
			const __m256 a = _mm256_andnot_ps(sign, v[t]);
			// |x| >= inf, or unordered (NaN).
			bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
			mx = _mm256_max_ps(a, mx);
		}
		if (bad) return b;
		__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
		m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
		m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
		const float d = _mm_cvtss_f32(m4) / 127.0f;
		const float id = d != 0.0f ? 1.0f / d : 0.0f;
		// A tiny subnormal d overflows id: the products are then infinite
		// or NaN, which the scalar code converts.
		if (!(id < __builtin_inff())) return b;
		const uint16_t h = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		memcpy(y, &h, 2);
		const __m256 idv = _mm256_set1_ps(id);
		__m256i q[4];
		for (int t = 0; t < 4; t++) {
			__m256 f = _mm256_mul_ps(v[t], idv);
			// Keep the product rounded: no fused multiply-add.
			__asm__("" : "+x"(f));
			const __m256 tr = _mm256_round_ps(f, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
			const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(f, tr)), half, _CMP_GE_OQ);
			const __m256 step = _mm256_or_ps(_mm256_and_ps(f, sign), one); // copysign(1, f)
			q[t] = _mm256_cvttps_epi32(_mm256_add_ps(tr, _mm256_and_ps(up, step)));
		}
		const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
		_mm256_storeu_si256((__m256i *)(y + 2), _mm256_permutevar8x32_epi32(p, order));
	}
	return nb;
}

#define QL_QUANT_ENTRY(name)                                                                                          \
	QTARGET void name(const float *x, uint8_t *y, int64_t nb) { ql_quantize_q8k(x, y, nb); }

// ql_round_bf16 rounds the n floats at x to bfloat16 into y as RoundBF16
// (q8act.go): nearest, ties to even, on the bits; a NaN keeps its upper
// half with the quiet bit set. 16 values a step on 256-bit vectors.
QL void ql_round_bf16(const float *x, uint16_t *y, int64_t n) {
	const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(64);
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		__m256i r[2];
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			const __m256i b = _mm256_loadu_si256((const __m256i *)(x + i + 8 * h));
			const __m256i hi = _mm256_srli_epi32(b, 16);
			const __m256i up = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, bias), _mm256_and_si256(hi, one)), 16);
			const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs), inf);
			r[h] = _mm256_blendv_epi8(up, _mm256_or_si256(hi, quiet), nan);
		}
		// packus keeps 0..65535; it interleaves the 128-bit halves.
		const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
		_mm256_storeu_si256((__m256i *)(y + i), p);
	}
	for (; i < n; i++) {
		uint32_t b;
		memcpy(&b, x + i, 4);
		y[i] = (b & 0x7fffffff) > 0x7f800000 ? (uint16_t)((b >> 16) | 64) : (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
	}
}

#define QL_ROUND_BF16_ENTRY(name)                                                                                     \
	QTARGET void name(const float *x, uint16_t *y, int64_t n) { ql_round_bf16(x, y, n); }

#define QL_QUANT_Q8_0_ENTRY(name)                                                                                     \
	QTARGET int64_t name(const float *x, uint8_t *y, int64_t nb) { return ql_quantize_q8_0(x, y, nb); }

#define QL_ENTRY(name)                                                                                                \
	QTARGET void name(int qtype, float *out, int64_t ldo, const uint8_t *a, const uint8_t *w, int64_t m, int64_t k,  \
	                  int64_t ncols, int pf) {                                                                      \
		switch (qtype) {                                                                                        \
		case DI_Q8_0: ql_linear(DI_Q8_0, out, ldo, a, w, m, k, ncols, pf); break;                                 \
		case DI_Q4_0: ql_linear(DI_Q4_0, out, ldo, a, w, m, k, ncols, pf); break;                                 \
		case DI_Q4_K: ql_linear(DI_Q4_K, out, ldo, a, w, m, k, ncols, pf); break;                                 \
		case DI_Q5_K: ql_linear(DI_Q5_K, out, ldo, a, w, m, k, ncols, pf); break;                                 \
		case DI_Q6_K: ql_linear(DI_Q6_K, out, ldo, a, w, m, k, ncols, pf); break;                                 \
		}                                                                                                       \
	}
