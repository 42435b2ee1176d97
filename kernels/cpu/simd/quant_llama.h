// LinearQuantLlama's C kernels, shared by quant_llama_avx2.c and
// quant_llama_vnni.c; each defines QTARGET (its target attribute) and
// QVNNI (1 where the int8 dot product is AVX512-VNNI's vpdpbusd) first.
//
// Every output is llama.cpp's generic block dot product (vecDotLlama in
// q8act.go) bit for bit. The integer sums of a block are exact in any
// order, so SIMD computes them as it likes; the float32 operations that
// apply the scales are the generic functions' own, in their order:
//
//	Q8_0:  sumf = fma(float(sumi), dw*da, sumf) per block
//	Q4_0:  sumf = fma(float(sumi)*dw, da, sumf) per block
//	K:     sums[l] = fma(dw*da, float(aux[l]), sums[l]), l = index mod 8,
//	       Q4_K/Q5_K also sumf = fma(-(dmin*da), float(sumi_mins), sumf);
//	       at the end sumf += sums[0], ..., sums[7] in order.
//
// Q8_0/Q4_0 tiles run 8 weight rows at once, one float lane each (the
// per-block integer sums of the 8 rows are reduced into one vector); K-quant
// tiles keep aux[0..7] of one (row, column) in the 8 lanes of a vector,
// pairing bytes (i, i+8) with a byte shuffle so that vpmaddubsw never adds
// products of two different lanes l.

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

// ql_pair is the byte order within each 16-byte half that puts the bytes
// i and i+8 (the same lane l = i mod 8) next to each other.
QL __m256i ql_pair(void) {
	return _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13,
	                        6, 14, 7, 15);
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

QL int ql_hsum_i32(__m256i v) {
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
	return _mm_cvtsi128_si32(s);
}

// ql_tilek computes R activation rows (Q8_K, a + r*ab) against the NC
// weight rows wc[0..NC-1] of a K-quant matrix, nb blocks, and writes the
// first nc columns: out[r*ldo + c].
QL void ql_tilek(const int qt, const int R, const int NC, const uint8_t *a, int64_t ab, const uint8_t *const *wc,
                 int64_t nb, float *out, int64_t ldo, int nc, const uint8_t *pf) {
	const int64_t bb = qt == DI_Q4_K ? 144 : qt == DI_Q5_K ? 176 : 210;
	const __m256i perm = ql_pair(), m4 = _mm256_set1_epi8(0x0F);
	__m256 sums[4][4];
	float sumf[4][4];
	#pragma GCC unroll 8
	for (int r = 0; r < R; r++)
		#pragma GCC unroll 8
		for (int c = 0; c < NC; c++) {
			sums[r][c] = _mm256_setzero_ps();
			sumf[r][c] = 0;
		}
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
				xa[r] = _mm256_shuffle_epi8(ql_load(q8 + 32 * ta), perm);
				xb[r] = _mm256_shuffle_epi8(ql_load(q8 + 32 * tb), perm);
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
				qa = _mm256_shuffle_epi8(qa, perm);
				qb = _mm256_shuffle_epi8(qb, perm);
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
		#pragma GCC unroll 8
		for (int c = 0; c < NC; c++) {
			const uint8_t *p = wc[c] + b * bb;
			const float dw = ql_half(qt == DI_Q6_K ? p + 208 : p);
			__m256i mins = _mm256_setzero_si256();
			float dmin = 0;
			if (qt != DI_Q6_K) {
				dmin = ql_half(p + 2);
				const __m128i m8 = _mm_loadl_epi64((const __m128i *)mn[c]);
				mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
			}
			#pragma GCC unroll 8
			for (int r = 0; r < R; r++) {
				const uint8_t *ap = a + r * ab + b * 292;
				const float da = ql_f32(ap);
				// lo holds lanes 0..3 in each half, hi lanes 4..7.
				const __m256i aux = _mm256_add_epi32(_mm256_permute2x128_si256(lo[r][c], hi[r][c], 0x20),
				                                     _mm256_permute2x128_si256(lo[r][c], hi[r][c], 0x31));
				const float d = dw * da;
				sums[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(aux), sums[r][c]);
				if (qt != DI_Q6_K) {
					const int sumi = ql_hsum_i32(_mm256_madd_epi16(ql_load(ap + 260), mins));
					const float dm = dmin * da;
					sumf[r][c] = _mm_cvtss_f32(
					    _mm_fnmadd_ss(_mm_set_ss(dm), _mm_set_ss((float)sumi), _mm_set_ss(sumf[r][c])));
				}
			}
		}
	}
	#pragma GCC unroll 8
	for (int r = 0; r < R; r++)
		#pragma GCC unroll 8
		for (int c = 0; c < nc; c++) {
			float s[8];
			_mm256_storeu_ps(s, sums[r][c]);
			float f = sumf[r][c];
			#pragma GCC unroll 8
			for (int l = 0; l < 8; l++)
				f += s[l];
			out[r * ldo + c] = f;
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
// picks it by the CPU's vendor.
#define QL_PF_L2 1
#define QL_PF_L1 2

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
// each; the last repeated up to NC) for a packed tile of NC rows: per block
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

// ql_quads4 returns the 8 dwords (l = 0..7) of the bytes l, l+8, l+16,
// l+24 of the 32 bytes at q.
QL __m256i ql_quads4(const uint8_t *q) {
	const __m128i r0 = _mm_loadl_epi64((const __m128i *)q), r1 = _mm_loadl_epi64((const __m128i *)(q + 8));
	const __m128i r2 = _mm_loadl_epi64((const __m128i *)(q + 16)), r3 = _mm_loadl_epi64((const __m128i *)(q + 24));
	const __m128i p01 = _mm_unpacklo_epi8(r0, r1), p23 = _mm_unpacklo_epi8(r2, r3);
	return _mm256_set_m128i(_mm_unpackhi_epi16(p01, p23), _mm_unpacklo_epi16(p01, p23));
}

// ql_pack_quads writes the 64 quads (ql_quads4) of the 256 codes q of one
// weight row as row c of a packed tile of NC rows: quad p = 8j+l at d +
// 4*NC*p + 4*c.
QL void ql_pack_quads(const int8_t *q, uint8_t *d, int c, const int NC) {
	for (int j = 0; j < 8; j++) {
		uint32_t u[8];
		_mm256_storeu_si256((__m256i *)u, ql_quads4((const uint8_t *)q + 32 * j));
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++)
			memcpy(d + 4 * NC * (8 * j + l) + 4 * c, &u[l], 4);
	}
}

// QP_SIDE4 is the int32 per Q8_K block of qp_quads' output.
#define QP_SIDE4 68

// qp_quads writes, per Q8_K block of the nb at a, the quads of bytes
// (a[i], a[i+8], a[i+16], a[i+24]), i = 32j+l, at index 8j+l, then at 64+h
// the int16 pair (B_2h, B_2h+1), B_j = bsums[2j] + bsums[2j+1] the sum of
// sub-block j (|B_j| <= 32*128), for the mins terms: QP_SIDE4 int32 a
// block.
QL void qp_quads(const uint8_t *a, int64_t nb, int32_t *dst) {
	for (int64_t b = 0; b < nb; b++) {
		for (int j = 0; j < 8; j++)
			_mm256_storeu_si256((__m256i *)(dst + b * QP_SIDE4 + 8 * j), ql_quads4(a + b * 292 + 4 + 32 * j));
		int16_t bs[16];
		memcpy(bs, a + b * 292 + 260, 32);
		for (int h = 0; h < 4; h++) {
			const int16_t b0 = (int16_t)(bs[4 * h] + bs[4 * h + 1]), b1 = (int16_t)(bs[4 * h + 2] + bs[4 * h + 3]);
			dst[b * QP_SIDE4 + 64 + h] = (int32_t)((uint32_t)(uint16_t)b0 | (uint32_t)(uint16_t)b1 << 16);
		}
	}
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

// qp_pairs writes the int16 pairs (a[i], a[i+8]), i = 16j+l, of the nb
// Q8_K blocks at a into dst (128 int32 per block, index 8j+l).
QL void qp_pairs(const uint8_t *a, int64_t nb, int32_t *dst) {
	for (int64_t b = 0; b < nb; b++)
		for (int j = 0; j < 16; j++) {
			const uint8_t *q = a + b * 292 + 4 + 16 * j;
			const __m128i lo = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)q));
			const __m128i hi = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(q + 8)));
			_mm_storeu_si128((__m128i *)(dst + b * 128 + 8 * j), _mm_unpacklo_epi16(lo, hi));
			_mm_storeu_si128((__m128i *)(dst + b * 128 + 8 * j + 4), _mm_unpackhi_epi16(lo, hi));
		}
}

// Q6_K block of the 16 rows (QPK6_BYTES): int32 pairs of the int16 values
// sc*q of weights i = 16j+l and i+8 (both lane l of the generic code,
// both under scale j; vpdpwssd against the activation pairs (a[i],
// a[i+8]) adds them to aux[l]), laid out for 128-bit broadcasts of four
// activation pairs: vector [j 0..15][h 0..1][g 0..3] holds in lane
// 4cc+ll the pair of row 4g+cc, lane l = 4h+ll; then dw of row 4g+cc in
// lane 4cc+ll of vector g (4 vectors). One broadcast of the pairs
// l = 4h..4h+3 of a row serves the four vectors g: a quarter of the loads
// of one 32-bit broadcast per vector.
#define QPK6_BYTES (128 * 64 + 4 * 64)

QL void qp_pack6k(const uint8_t *w, int64_t rb, int64_t nb, int nc, uint8_t *dst) {
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *d = dst + b * QPK6_BYTES;
		float *dw = (float *)(d + 128 * 64);
		for (int c = 0; c < 16; c++) {
			const int g = c / 4, cc = c % 4;
			const uint8_t *p = w + (c < nc ? c : nc - 1) * rb + b * 210;
			int8_t q[256];
			int16_t sc[16], mn[8];
			qp_qk(DI_Q6_K, p, q, sc, mn);
			for (int j = 0; j < 16; j++) {
				const __m256i v = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * j))),
				                                     _mm256_set1_epi16(sc[j]));
				const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
				_mm_storeu_si128((__m128i *)(d + ((2 * j + 0) * 4 + g) * 64 + 16 * cc), _mm_unpacklo_epi16(lo, hi));
				_mm_storeu_si128((__m128i *)(d + ((2 * j + 1) * 4 + g) * 64 + 16 * cc), _mm_unpackhi_epi16(lo, hi));
			}
			const float s = ql_half(p + 208);
			for (int ll = 0; ll < 4; ll++)
				dw[16 * g + 4 * cc + ll] = s;
		}
	}
}

// qp_rows6k computes R rows (Q8_K activations a + r*ab, their pairs at
// pairs + r*nb*128) against a packed Q6_K tile; nc columns of
// out[r*ldo + c]. aux[r][g][h] lane 4cc+ll is the generic aux[4h+ll] of
// row r and column 4g+cc; the float operations per output are the
// generic code's.
QL void qp_rows6k(const int R, const uint8_t *pk, int64_t nb, const uint8_t *a, int64_t ab, const int32_t *pairs,
                  float *out, int64_t ldo, int nc) {
	__m512 sums[3][4][2];
#pragma GCC unroll 3
	for (int r = 0; r < R; r++)
#pragma GCC unroll 4
		for (int g = 0; g < 4; g++)
			sums[r][g][0] = sums[r][g][1] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = pk + b * QPK6_BYTES;
		__m512i aux[3][4][2];
#pragma GCC unroll 3
		for (int r = 0; r < R; r++)
#pragma GCC unroll 4
			for (int g = 0; g < 4; g++)
				aux[r][g][0] = aux[r][g][1] = _mm512_setzero_si512();
		for (int j = 0; j < 16; j++) {
#pragma GCC unroll 2
			for (int h = 0; h < 2; h++) {
				__m512i x[3];
#pragma GCC unroll 3
				for (int r = 0; r < R; r++)
					x[r] = _mm512_broadcast_i32x4(
					    _mm_loadu_si128((const __m128i *)(pairs + (r * nb + b) * 128 + 8 * j + 4 * h)));
#pragma GCC unroll 4
				for (int g = 0; g < 4; g++) {
					const __m512i wv = _mm512_loadu_si512(pb + ((2 * j + h) * 4 + g) * 64);
#pragma GCC unroll 3
					for (int r = 0; r < R; r++)
						aux[r][g][h] = qp_dpwssd(aux[r][g][h], wv, x[r]);
				}
			}
		}
#pragma GCC unroll 3
		for (int r = 0; r < R; r++) {
			const __m512 da = _mm512_set1_ps(ql_f32(a + r * ab + b * 292));
#pragma GCC unroll 4
			for (int g = 0; g < 4; g++) {
				const __m512 d = _mm512_mul_ps(_mm512_loadu_ps(pb + 128 * 64 + 64 * g), da);
				sums[r][g][0] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(aux[r][g][0]), sums[r][g][0]);
				sums[r][g][1] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(aux[r][g][1]), sums[r][g][1]);
			}
		}
	}
	// Lane c = 4g+cc of column vector l gathers lane 4cc+ll of sums[g][h].
	const __m512i ix[4] = {
	    _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0),
	    _mm512_setr_epi32(1, 5, 9, 13, 17, 21, 25, 29, 0, 0, 0, 0, 0, 0, 0, 0),
	    _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 0, 0, 0, 0, 0, 0, 0, 0),
	    _mm512_setr_epi32(3, 7, 11, 15, 19, 23, 27, 31, 0, 0, 0, 0, 0, 0, 0, 0),
	};
#pragma GCC unroll 3
	for (int r = 0; r < R; r++) {
		__m512 f = _mm512_setzero_ps(); // the generic sumf: no mins in Q6_K
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++) {
			const int h = l / 4, ll = l % 4;
			const __m512 lo = _mm512_permutex2var_ps(sums[r][0][h], ix[ll], sums[r][1][h]);
			const __m512 hi = _mm512_permutex2var_ps(sums[r][2][h], ix[ll], sums[r][3][h]);
			f = _mm512_add_ps(f, _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)));
		}
		_mm512_mask_storeu_ps(out + r * ldo, (__mmask16)((1u << nc) - 1), f);
	}
}

// Q4_K/Q5_K block of the 16 rows (QPK4_BYTES): u8 codes as [quad p =
// 8j+l][row c][4 bytes] holding the weights i = 32j+l, +8, +16, +24 (all
// four lane l of the generic code, all four under sub-block j's scale),
// then int32 [h 0..3][c] = the scale pair (s_2h, s_2h+1) (QPK4_SCL), int32
// [c] = -QPK4_OFF * (s_0 + s_2 + s_4 + s_6) (QPK4_CORR), int32 [h 0..3][c]
// = the min pair (m_2h, m_2h+1) (QPK4_MINS; against the pairs of sub-block
// sums of qp_quads, half the instructions of the bsums pairs against (m_j,
// m_j)), then dw[16] and dmin[16] (QPK4_DW).
// vpdpbusd sums the four products of a quad exactly (|t| <= 4*31*128 =
// 15872 < 2^14); the quad of sub-block 2h+1 is shifted into the high half
// of its lane and that of 2h added on top of QPK4_OFF, so one vpdpwssd
// against (s_2h, s_2h+1) adds both scaled quads to aux[l]: three VNNI
// instructions for two quads (two against one scale pair before).
#define QPK4_SCL (64 * 64)
#define QPK4_CORR (QPK4_SCL + 4 * 64)
#define QPK4_MINS (QPK4_CORR + 64)
#define QPK4_DW (QPK4_MINS + 4 * 64)
#define QPK4_BYTES (QPK4_DW + 128)

// QPK4_OFF keeps the low half of a lane that holds two quads in [512,
// 32256]: non-negative, so adding it never borrows from the high half, and
// under 2^15, so vpdpwssd reads it as t + QPK4_OFF. Each block's aux
// starts at -QPK4_OFF times the sum of the low halves' scales, so every
// aux[l] is the generic code's integer.
#define QPK4_OFF 16384

// qp_shift_off returns (t << 16) + QPK4_OFF, off holding QPK4_OFF << 16
// (qp_quadpairs3's shift and or, for the rows left over).
QL __m512i qp_shift_off(__m512i t, __m512i off) {
	return _mm512_or_si512(_mm512_slli_epi32(t, 16), _mm512_srli_epi32(off, 16));
}

QL void qp_pack4k(const int qt, const uint8_t *w, int64_t rb, int64_t nb, int nc, uint8_t *dst) {
	const int64_t bb = qt == DI_Q4_K ? 144 : 176;
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *d = dst + b * QPK4_BYTES;
		int32_t *scl = (int32_t *)(d + QPK4_SCL), *corr = (int32_t *)(d + QPK4_CORR);
		int32_t *mins = (int32_t *)(d + QPK4_MINS);
		float *dw = (float *)(d + QPK4_DW), *dmin = dw + 16;
		for (int c = 0; c < 16; c++) {
			const uint8_t *p = w + (c < nc ? c : nc - 1) * rb + b * bb;
			int8_t q[256];
			int16_t sc[16], mn[8];
			qp_qk(qt, p, q, sc, mn);
			ql_pack_quads(q, d, c, 16);
			int32_t lo = 0;
			for (int h = 0; h < 4; h++) {
				mins[16 * h + c] = (int32_t)((uint32_t)(uint16_t)mn[2 * h] | (uint32_t)(uint16_t)mn[2 * h + 1] << 16);
				scl[16 * h + c] = (int32_t)((uint32_t)(uint16_t)sc[4 * h] | (uint32_t)(uint16_t)sc[4 * h + 2] << 16);
				lo += sc[4 * h];
			}
			corr[c] = -QPK4_OFF * lo;
			dw[c] = ql_half(p);
			dmin[c] = ql_half(p + 2);
		}
	}
}

// qp_quadpairs3 is qp_rows4k's inner step for three rows (quads at q, q
// + st bytes, q + 2*st), in assembly so that both weight vectors (w, w +
// 512) stay in registers for the three rows (GCC reloaded them per row).
// The quad of sub-block 2h+1 goes into the high half by vpslld and vpord
// (QPK4_OFF into the low half), which run beside the VNNI instructions;
// VBMI2's vpshldd would do both in one instruction but, on Zen 4, takes
// the VNNI instructions' pipes (a register-only loop of 9 vpdpbusd and 3
// vpshldd ran the vpdpbusd at 0.75 of their rate alone; with vpslld and
// vpord instead, at 0.95).
QL void qp_quadpairs3(__m512i *a0, __m512i *a1, __m512i *a2, const uint8_t *w, const int32_t *q, int64_t st,
                      __m512i sv, __m512i off) {
	static const int32_t lo = QPK4_OFF;
	__asm__("vmovdqu64 (%[w]), %%zmm30\n\t"
	        "vmovdqu64 512(%[w]), %%zmm31\n\t"
	        "vmovdqa64 %[off], %%zmm27\n\t"
	        "vmovdqa64 %[off], %%zmm28\n\t"
	        "vmovdqa64 %[off], %%zmm29\n\t"
	        "vpdpbusd 32(%[q])%{1to16%}, %%zmm31, %%zmm27\n\t"
	        "vpdpbusd 32(%[q],%[st],1)%{1to16%}, %%zmm31, %%zmm28\n\t"
	        "vpdpbusd 32(%[q],%[st],2)%{1to16%}, %%zmm31, %%zmm29\n\t"
	        "vpslld $16, %%zmm27, %%zmm27\n\t"
	        "vpslld $16, %%zmm28, %%zmm28\n\t"
	        "vpslld $16, %%zmm29, %%zmm29\n\t"
	        "vpord %[lo]%{1to16%}, %%zmm27, %%zmm27\n\t"
	        "vpord %[lo]%{1to16%}, %%zmm28, %%zmm28\n\t"
	        "vpord %[lo]%{1to16%}, %%zmm29, %%zmm29\n\t"
	        "vpdpbusd (%[q])%{1to16%}, %%zmm30, %%zmm27\n\t"
	        "vpdpbusd (%[q],%[st],1)%{1to16%}, %%zmm30, %%zmm28\n\t"
	        "vpdpbusd (%[q],%[st],2)%{1to16%}, %%zmm30, %%zmm29\n\t"
	        "vpdpwssd %[sv], %%zmm27, %[a0]\n\t"
	        "vpdpwssd %[sv], %%zmm28, %[a1]\n\t"
	        "vpdpwssd %[sv], %%zmm29, %[a2]"
	        : [a0] "+v"(*a0), [a1] "+v"(*a1), [a2] "+v"(*a2)
	        : [w] "r"(w), [q] "r"(q), [st] "r"(st), [sv] "v"(sv), [off] "v"(off), [lo] "m"(lo)
	        : "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "memory");
}

// qp_rows4k computes R rows (Q8_K activations a + r*ab, their quads and
// sub-block sums at quads + r*nb*QP_SIDE4) against a packed Q4_K/Q5_K
// tile; nc columns of out[r*ldo + c]. The float operations per output are
// the generic code's.
QL void qp_rows4k(const int R, const uint8_t *pk, int64_t nb, const uint8_t *a, int64_t ab,
                  const int32_t *quads, float *out, int64_t ldo, int nc) {
	__m512 sums[3][8], sumf[3];
#pragma GCC unroll 3
	for (int r = 0; r < R; r++) {
		sumf[r] = _mm512_setzero_ps();
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++)
			sums[r][l] = _mm512_setzero_ps();
	}
	// The mins terms first, in a pass of their own: sumf is their own
	// accumulator, so each output's float operations keep the generic
	// code's order.
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = pk + b * QPK4_BYTES;
		const int32_t *mins = (const int32_t *)(pb + QPK4_MINS);
		__m512i mi[3];
#pragma GCC unroll 3
		for (int r = 0; r < R; r++)
			mi[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
		for (int h = 0; h < 4; h++) {
			const __m512i mv = _mm512_loadu_si512(mins + 16 * h);
#pragma GCC unroll 3
			for (int r = 0; r < R; r++)
				mi[r] = qp_dpwssd_b(mi[r], mv, quads + (r * nb + b) * QP_SIDE4 + 64 + h);
		}
		const __m512 dmin = _mm512_loadu_ps(pb + QPK4_DW + 64);
#pragma GCC unroll 3
		for (int r = 0; r < R; r++) {
			const __m512 dm = _mm512_mul_ps(dmin, _mm512_set1_ps(ql_f32(a + r * ab + b * 292)));
			sumf[r] = _mm512_fnmadd_ps(dm, _mm512_cvtepi32_ps(mi[r]), sumf[r]);
		}
	}
	// The lanes l one after another, each over the block's four scale
	// pairs: R accumulators live at a time (24 live across the pairs
	// spilled five of them), and each output's float operations stay the
	// generic code's (sums[r][l] of one lane l per block, in block order).
	const __m512i off = _mm512_set1_epi32(QPK4_OFF << 16);
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = pk + b * QPK4_BYTES;
		// aux starts at the offset's correction (see QPK4_OFF).
		const __m512i corr = _mm512_loadu_si512(pb + QPK4_CORR);
		const __m512 dw = _mm512_loadu_ps(pb + QPK4_DW);
		__m512 d[3];
#pragma GCC unroll 3
		for (int r = 0; r < R; r++)
			d[r] = _mm512_mul_ps(dw, _mm512_set1_ps(ql_f32(a + r * ab + b * 292)));
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++) {
			__m512i aux[3];
#pragma GCC unroll 3
			for (int r = 0; r < R; r++)
				aux[r] = corr;
#pragma GCC unroll 4
			for (int h = 0; h < 4; h++) {
				const __m512i sv = _mm512_loadu_si512(pb + QPK4_SCL + 64 * h);
				if (R == 3) {
					qp_quadpairs3(&aux[0], &aux[1], &aux[2], pb + (16 * h + l) * 64, quads + b * QP_SIDE4 + 16 * h + l,
					              nb * QP_SIDE4 * 4, sv, off);
					continue;
				}
				const __m512i w0 = _mm512_loadu_si512(pb + (16 * h + l) * 64);
				const __m512i w1 = _mm512_loadu_si512(pb + (16 * h + 8 + l) * 64);
#pragma GCC unroll 3
				for (int r = 0; r < R; r++) {
					const int32_t *qr = quads + (r * nb + b) * QP_SIDE4 + 16 * h + l;
					// The quad of sub-block 2h+1 in the high half, that of
					// 2h plus the offset in the low half. t starts at off,
					// which the shift drops, so no zero register is held.
					__m512i t = qp_dpbusd_b(off, w1, qr + 8);
					t = qp_shift_off(t, off);
					t = qp_dpbusd_b(t, w0, qr);
					aux[r] = qp_dpwssd(aux[r], t, sv);
				}
			}
#pragma GCC unroll 3
			for (int r = 0; r < R; r++)
				sums[r][l] = _mm512_fmadd_ps(d[r], _mm512_cvtepi32_ps(aux[r]), sums[r][l]);
		}
	}
#pragma GCC unroll 3
	for (int r = 0; r < R; r++) {
		__m512 f = sumf[r];
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++)
			f = _mm512_add_ps(f, sums[r][l]);
		_mm512_mask_storeu_ps(out + r * ldo, (__mmask16)((1u << nc) - 1), f);
	}
}

// qp_linear is ql_linear through packed tiles; it returns 0 (and computes
// nothing) when its scratch cannot be allocated.
QL int qp_linear(const int qt, float *out, int64_t ldo, const uint8_t *a, const uint8_t *w, int64_t m, int64_t k,
                 int64_t ncols) {
	const int k32 = qt == DI_Q8_0 || qt == DI_Q4_0;
	const int64_t nb = k / (k32 ? 32 : 256);
	const int64_t bb = qt == DI_Q8_0 ? 34 : qt == DI_Q4_0 ? 18 : qt == DI_Q4_K ? 144 : qt == DI_Q5_K ? 176 : 210;
	const int64_t rb = nb * bb, ab = k32 ? nb * 34 : nb * 292;
	const int k4 = qt == DI_Q4_K || qt == DI_Q5_K;
	uint8_t *pk = malloc((size_t)nb * (k32 ? QP32_BYTES : k4 ? QPK4_BYTES : QPK6_BYTES));
	// Block sums (Q8_0/Q4_0), quads (Q4_K/Q5_K) or pairs (Q6_K) of a.
	int32_t *side = malloc((size_t)m * nb * (k32 ? 1 : k4 ? QP_SIDE4 : 128) * sizeof(int32_t));
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
		} else if (k4) {
			qp_quads(a + i * ab, nb, side + i * nb * QP_SIDE4);
		} else {
			qp_pairs(a + i * ab, nb, side + i * nb * 128);
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
		} else if (k4) {
			qp_pack4k(qt, w + j * rb, rb, nb, nc, pk);
			for (; i + 3 <= m; i += 3)
				qp_rows4k(3, pk, nb, a + i * ab, ab, side + i * nb * QP_SIDE4, out + i * ldo + j, ldo, nc);
			for (; i < m; i++)
				qp_rows4k(1, pk, nb, a + i * ab, ab, side + i * nb * QP_SIDE4, out + i * ldo + j, ldo, nc);
		} else {
			qp_pack6k(w + j * rb, rb, nb, nc, pk);
			for (; i + 3 <= m; i += 3)
				qp_rows6k(3, pk, nb, a + i * ab, ab, side + i * nb * 128, out + i * ldo + j, ldo, nc);
			for (; i < m; i++)
				qp_rows6k(1, pk, nb, a + i * ab, ab, side + i * nb * 128, out + i * ldo + j, ldo, nc);
		}
	}
	free(pk);
	free(side);
	return 1;
}
#endif

#if !QVNNI
#include <stdlib.h>

// The AVX2 build's prefill from QL_PACK_ROWS activation rows on: 8 weight
// rows at a time are repacked (once per call) so that one 256-bit vector
// holds the same four weights of 8 rows and each lane accumulates one
// output (no horizontal sums: the tiles above reduce 8 vectors a block and
// row). The inner loops unroll twice: fully unrolled, GCC reassociated the
// integer sums and spilled them. A Q8_0/Q4_0 block of the 8 rows (QA32_BYTES):
// signed weights (Q4_0: q-8) as [quad g 0..7][row c 0..7][4 bytes], then
// dw[8] floats. vpmaddubsw multiplies |w| by the activations with w's
// signs (|a| <= 127 in Q8_0 blocks, so the sign is exact) and vpmaddwd by
// ones adds the pairs: the block's exact integer sum per lane; the float
// operations per output are the generic code's, as in the tiles above.
#define QA32_BYTES (256 + 32)

// qa_rows32 computes R rows (activations a + r*ab) against a packed tile
// and writes nc columns of out[r*ldo + c].
QL void qa_rows32(const int qt, const int R, const uint8_t *pk, int64_t nb, const uint8_t *a, int64_t ab, float *out,
                  int64_t ldo, int nc) {
	const __m256i ones = _mm256_set1_epi16(1);
	__m256 acc[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
		acc[r] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = pk + b * QA32_BYTES;
		__m256i s[4];
#pragma GCC unroll 4
		for (int r = 0; r < R; r++)
			s[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
		for (int g = 0; g < 8; g++) {
			const __m256i wv = _mm256_loadu_si256((const __m256i *)(pb + 32 * g)), aw = _mm256_abs_epi8(wv);
#pragma GCC unroll 4
			for (int r = 0; r < R; r++) {
				int32_t q;
				memcpy(&q, a + r * ab + b * 34 + 2 + 4 * g, 4);
				const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(q), wv));
				s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(p, ones));
			}
		}
		const __m256 dw = _mm256_loadu_ps((const float *)(pb + 256));
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			acc[r] = ql_block32(qt, acc[r], _mm256_cvtepi32_ps(s[r]), dw, _mm256_set1_ps(ql_half(a + r * ab + b * 34)));
		}
	}
	ql_store8(out, ldo, acc, R, nc);
}

// A Q4_K/Q5_K block of 8 rows for the AVX2 prefill (QA4_BYTES): u8 codes
// as [quad p = 8j+l][row c 0..7][4 bytes] (the weights 32j+l, +8, +16,
// +24: lane l of the generic code, sub-block j), int32 [j 0..7][c] = the
// scale pair (s_j, s_j), int32 [h 0..3][c] = the min pair (m_2h,
// m_2h+1), then dw[8] and dmin[8]. vpmaddubsw gives a quad's two pair sums
// (|pair| <= 2*31*128) and vpmaddwd by (s_j, s_j) adds s_j times the quad
// to aux[l]; the mins go against qp_quads' pairs of sub-block sums.
#define QA4_BYTES (2048 + 256 + 128 + 64)

QL void qa_pack4k(const int qt, const uint8_t *w, int64_t rb, int64_t nb, int nc, uint8_t *dst) {
	const int64_t bb = qt == DI_Q4_K ? 144 : 176;
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *d = dst + b * QA4_BYTES;
		int32_t *scl = (int32_t *)(d + 2048), *mins = scl + 64;
		float *dw = (float *)(d + 2048 + 256 + 128), *dmin = dw + 8;
		for (int c = 0; c < 8; c++) {
			const uint8_t *p = w + (c < nc ? c : nc - 1) * rb + b * bb;
			int8_t q[256];
			int16_t sc[16], mn[8];
			qp_qk(qt, p, q, sc, mn);
			ql_pack_quads(q, d, c, 8);
			for (int j = 0; j < 8; j++)
				scl[8 * j + c] = (int32_t)((uint32_t)(uint16_t)sc[2 * j] | (uint32_t)(uint16_t)sc[2 * j] << 16);
			for (int h = 0; h < 4; h++)
				mins[8 * h + c] = (int32_t)((uint32_t)(uint16_t)mn[2 * h] | (uint32_t)(uint16_t)mn[2 * h + 1] << 16);
			dw[c] = ql_half(p);
			dmin[c] = ql_half(p + 2);
		}
	}
}

// A Q6_K block of 8 rows for the AVX2 prefill (QA6_BYTES): the unsigned
// codes q (0..63, weight q-32) as [quad p = 8j+l][row c 0..7][4 bytes]
// (weights 32j+l, +8 of 16-weight sub-block 2j and +16, +24 of 2j+1),
// int32 [j 0..7][c] = the scale pair (s_2j, s_2j+1), then dw[8].
// vpmaddubsw gives the quad's two pair sums of q*a (|.| <= 2*63*128); less
// 32 times the activations' pair sums (qa_side6k; |.| <= 32*256) they stay
// within int16, and vpmaddwd by the scale pair adds both scaled pairs of
// weights q-32 to aux[l]. (The signed codes with vpsignb would not do: Q8_K
// activations reach -128.)
#define QA6_BYTES (2048 + 256 + 32)
#define QA_SIDE6 128

// qa_side6k writes, per Q8_K block of the nb at a, the quads of qp_quads
// (index 8j+l) and at 64+8j+l the int16 pair (32*(a[i] + a[i+8]), 32*(a[i+16]
// + a[i+24])), i = 32j+l: QA_SIDE6 int32 a block.
QL void qa_side6k(const uint8_t *a, int64_t nb, int32_t *dst) {
	for (int64_t b = 0; b < nb; b++) {
		const int8_t *q = (const int8_t *)(a + b * 292 + 4);
		for (int j = 0; j < 8; j++) {
			_mm256_storeu_si256((__m256i *)(dst + b * QA_SIDE6 + 8 * j), ql_quads4((const uint8_t *)q + 32 * j));
			for (int l = 0; l < 8; l++) {
				const int i = 32 * j + l;
				const int16_t lo = (int16_t)(32 * (q[i] + q[i + 8])), hi = (int16_t)(32 * (q[i + 16] + q[i + 24]));
				dst[b * QA_SIDE6 + 64 + 8 * j + l] = (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
			}
		}
	}
}

QL void qa_pack6k(const uint8_t *w, int64_t rb, int64_t nb, int nc, uint8_t *dst) {
	for (int64_t b = 0; b < nb; b++) {
		uint8_t *d = dst + b * QA6_BYTES;
		int32_t *scl = (int32_t *)(d + 2048);
		float *dw = (float *)(d + 2048 + 256);
		for (int c = 0; c < 8; c++) {
			const uint8_t *p = w + (c < nc ? c : nc - 1) * rb + b * 210;
			int8_t q[256];
			int16_t sc[16], mn[8];
			qp_qk(DI_Q6_K, p, q, sc, mn);
			for (int i = 0; i < 256; i++)
				q[i] = (int8_t)(q[i] + 32);
			ql_pack_quads(q, d, c, 8);
			for (int j = 0; j < 8; j++)
				scl[8 * j + c] = (int32_t)((uint32_t)(uint16_t)sc[2 * j] | (uint32_t)(uint16_t)sc[2 * j + 1] << 16);
			dw[c] = ql_half(p + 208);
		}
	}
}

// qa_rowsk computes R rows (Q8_K activations a + r*ab, their side data at
// side + r*nb*(QP_SIDE4 or QA_SIDE6)) against a packed Q4_K/Q5_K (QA4) or,
// with q6, Q6_K (QA6) tile of 8 rows and writes nc columns of out[r*ldo +
// c]. The float operations per output are the generic code's: sums[l] per
// block in block order, the mins (Q4_K/Q5_K) in their own sumf, then sumf +
// sums[0] + ... + sums[7].
QL void qa_rowsk(const int q6, const int R, const uint8_t *pk, int64_t nb, const uint8_t *a, int64_t ab,
                 const int32_t *side, float *out, int64_t ldo, int nc) {
	const int64_t bytes = q6 ? QA6_BYTES : QA4_BYTES, stride = q6 ? QA_SIDE6 : QP_SIDE4;
	const int dwAt = q6 ? 2048 + 256 : 2048 + 256 + 128;
	__m256 sums[4][8], sumf[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		sumf[r] = _mm256_setzero_ps();
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++)
			sums[r][l] = _mm256_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = pk + b * bytes;
		const __m256 dw = _mm256_loadu_ps((const float *)(pb + dwAt));
		__m256 d[4];
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const float da = ql_f32(a + r * ab + b * 292);
			d[r] = _mm256_mul_ps(dw, _mm256_set1_ps(da));
			if (q6)
				continue;
			__m256i mi = _mm256_setzero_si256();
#pragma GCC unroll 4
			for (int h = 0; h < 4; h++) {
				const __m256i mv = _mm256_loadu_si256((const __m256i *)(pb + 2048 + 256 + 32 * h));
				mi = _mm256_add_epi32(mi, _mm256_madd_epi16(mv, _mm256_set1_epi32(side[(r * nb + b) * stride + 64 + h])));
			}
			const __m256 dmin = _mm256_loadu_ps((const float *)(pb + dwAt + 32));
			sumf[r] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(mi), sumf[r]);
		}
#pragma GCC unroll 1
		for (int l = 0; l < 8; l++) {
			__m256i aux[4];
#pragma GCC unroll 4
			for (int r = 0; r < R; r++)
				aux[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
			for (int j = 0; j < 8; j++) {
				const __m256i wv = _mm256_loadu_si256((const __m256i *)(pb + (8 * j + l) * 32));
				const __m256i sv = _mm256_loadu_si256((const __m256i *)(pb + 2048 + 32 * j));
#pragma GCC unroll 4
				for (int r = 0; r < R; r++) {
					const int32_t *sd = side + (r * nb + b) * stride;
					__m256i p = _mm256_maddubs_epi16(wv, _mm256_set1_epi32(sd[8 * j + l]));
					if (q6) // less 32 times the activations' pair sums
						p = _mm256_sub_epi16(p, _mm256_set1_epi32(sd[64 + 8 * j + l]));
					aux[r] = _mm256_add_epi32(aux[r], _mm256_madd_epi16(p, sv));
				}
			}
#pragma GCC unroll 4
			for (int r = 0; r < R; r++)
				sums[r][l] = _mm256_fmadd_ps(d[r], _mm256_cvtepi32_ps(aux[r]), sums[r][l]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
#pragma GCC unroll 8
		for (int l = 0; l < 8; l++)
			sumf[r] = _mm256_add_ps(sumf[r], sums[r][l]); // Q6_K: the generic sumf starts at zero, no mins
	ql_store8(out, ldo, sumf, R, nc);
}

// qa_linear is ql_linear through packed tiles of 8 weight rows; it returns
// 0 (and computes nothing) when its scratch cannot be allocated.
QL int qa_linear(const int qt, float *out, int64_t ldo, const uint8_t *a, const uint8_t *w, int64_t m, int64_t k,
                 int64_t ncols) {
	if (qt == DI_Q4_K || qt == DI_Q5_K || qt == DI_Q6_K) {
		const int q6 = qt == DI_Q6_K;
		const int64_t nb = k / 256, rb = nb * (qt == DI_Q4_K ? 144 : qt == DI_Q5_K ? 176 : 210), ab = nb * 292;
		const int64_t stride = q6 ? QA_SIDE6 : QP_SIDE4;
		uint8_t *pk = malloc((size_t)nb * (q6 ? QA6_BYTES : QA4_BYTES));
		int32_t *side = malloc((size_t)m * nb * stride * sizeof(int32_t));
		if (!pk || !side) {
			free(pk);
			free(side);
			return 0;
		}
		for (int64_t i = 0; i < m; i++) {
			if (q6)
				qa_side6k(a + i * ab, nb, side + i * nb * stride);
			else
				qp_quads(a + i * ab, nb, side + i * nb * stride);
		}
		for (int64_t j = 0; j < ncols; j += 8) {
			const int nc = ncols - j < 8 ? (int)(ncols - j) : 8;
			if (q6)
				qa_pack6k(w + j * rb, rb, nb, nc, pk);
			else
				qa_pack4k(qt, w + j * rb, rb, nb, nc, pk);
			int64_t i = 0;
			for (; i + 4 <= m; i += 4)
				qa_rowsk(q6, 4, pk, nb, a + i * ab, ab, side + i * nb * stride, out + i * ldo + j, ldo, nc);
			for (; i < m; i++)
				qa_rowsk(q6, 1, pk, nb, a + i * ab, ab, side + i * nb * stride, out + i * ldo + j, ldo, nc);
		}
		free(pk);
		free(side);
		return 1;
	}
	if (qt != DI_Q8_0 && qt != DI_Q4_0)
		return 0;
	const int64_t nb = k / 32, bb = qt == DI_Q8_0 ? 34 : 18, rb = nb * bb, ab = nb * 34;
	uint8_t *pk = malloc((size_t)nb * QA32_BYTES);
	if (!pk)
		return 0;
	for (int64_t j = 0; j < ncols; j += 8) {
		const int nc = ncols - j < 8 ? (int)(ncols - j) : 8;
		ql_pack32(qt, 8, w + j * rb, rb, nb, nc, pk);
		int64_t i = 0;
		for (; i + 4 <= m; i += 4)
			qa_rows32(qt, 4, pk, nb, a + i * ab, ab, out + i * ldo + j, ldo, nc);
		for (; i < m; i++)
			qa_rows32(qt, 1, pk, nb, a + i * ab, ab, out + i * ldo + j, ldo, nc);
	}
	free(pk);
	return 1;
}
#endif

// ql_linear: out[i*ldo + j] = the block dot product of activation row i
// (a + i*ab) with weight row j (w + j*rb), i in [0, m), j in [0, ncols).
// Weight tiles outside, activation rows inside: a tile's weights stay in
// L1 while the rows stream past them. pf is the decode tiles' prefetch
// mode (QL_PF_L2 or QL_PF_L1); QL_PF_L1 applies to one Q8_0 row alone,
// where it was measured (QL_PF_L1).
QL void ql_linear(const int qt, float *out, int64_t ldo, const uint8_t *a, const uint8_t *w, int64_t m, int64_t k,
                  int64_t ncols, int pf) {
	pf = pf == QL_PF_L1 && qt == DI_Q8_0 && m == 1 ? QL_PF_L1 : QL_PF_L2;
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
