// Block decoding shared by quant_avx2.c and quant_avx512.c; each includes it
// after defining QTARGET, the target attribute of its instruction set.
// q16 returns the 16 quantized levels of group g (weights 16g..16g+15) of
// one block as signed bytes, with the scale d and min mn such that weight
// = d*q - mn exactly as dequantize_row_* computes it.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant_amd64.h"

#define QINLINE static inline __attribute__((always_inline)) QTARGET

QINLINE float qhalf(const uint8_t *p) {
	uint16_t h;
	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

// scale_min_k4 unpacks the 6-bit scale and min of sub-block j of a Q4_K or
// Q5_K block (get_scale_min_k4).
QINLINE void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
		*m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

// k4_scales unpacks all eight scales and mins of a Q4_K or Q5_K block at b
// and writes dm[j] = d*sc_j and dm[8+j] = dmin*m_j (j = 0..7), each one
// float product as q16 computes it for sub-block j.
QINLINE void k4_scales(const uint8_t *b, float *dm) {
	uint32_t u[3], s[4];
	memcpy(u, b + 4, 12);
	s[0] = u[0] & 0x3f3f3f3f;
	s[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
	s[2] = u[1] & 0x3f3f3f3f;
	s[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
	__m128i v = _mm_loadu_si128((const __m128i *)s);
	const __m256 d = _mm256_set1_ps(qhalf(b)), dmin = _mm256_set1_ps(qhalf(b + 2));
	_mm256_storeu_ps(dm, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))));
	_mm256_storeu_ps(dm + 8, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)))));
}

// qprefetch_l2 asks for the n bytes at p in L2, one request per line.
QINLINE void qprefetch_l2(const uint8_t *p, int64_t n) {
	for (int64_t i = 0; i < n; i += 64)
		_mm_prefetch((const char *)(p + i), _MM_HINT_T1);
}

// QPF_BYTES is about how far ahead the decode tiles of LinearQuant prefetch
// the weights (into L2). On a 2-vCPU AVX-512 Xeon, one core, 768 x 768 and
// 768 x 3072 Q8_0 from memory: none 7.4-8.2 GB/s, 6, 12 or 24 KiB ahead
// 10.3-10.6 GB/s (the read probe: 15).
#define QPF_BYTES 12288

// qpf_rows is how far ahead (in weight rows, a multiple of nc) the decode
// tiles of nc rows of rb bytes prefetch: about QPF_BYTES.
static inline int64_t qpf_rows(int nc, int64_t rb) {
	int64_t t = QPF_BYTES / (nc * rb);
	return (t < 1 ? 1 : t) * nc;
}

static inline int block_size(int qt) { return qt == DI_Q4_0 || qt == DI_Q8_0 ? 32 : 256; }

static inline int64_t block_bytes(int qt) {
	switch (qt) {
	case DI_Q4_0: return 18;
	case DI_Q8_0: return 34;
	case DI_Q4_K: return 144;
	case DI_Q5_K: return 176;
	default: return 210;
	}
}

QINLINE __m128i lo_nibbles(__m128i v) { return _mm_and_si128(v, _mm_set1_epi8(0x0F)); }
QINLINE __m128i hi_nibbles(__m128i v) { return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)); }
QINLINE __m128i load16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

QINLINE __m128i q16(const int qt, const uint8_t *b, int g, float *d, float *mn) {
	switch (qt) {
	case DI_Q8_0:
		*d = qhalf(b);
		*mn = 0;
		return load16(b + 2 + 16 * g);
	case DI_Q4_0: {
		*d = qhalf(b);
		*mn = 0;
		__m128i v = load16(b + 2);
		return _mm_sub_epi8(g ? hi_nibbles(v) : lo_nibbles(v), _mm_set1_epi8(8));
	}
	case DI_Q4_K:
	case DI_Q5_K: {
		// Chunk c of 64 weights: low nibbles of 32 bytes, then high nibbles.
		const int c = g / 4, r = g % 4, high = r >= 2, half = r & 1;
		int sc, m;
		scale_min_k4(2 * c + high, b + 4, &sc, &m);
		*d = qhalf(b) * (float)sc;
		*mn = qhalf(b + 2) * (float)m;
		const uint8_t *qs = b + (qt == DI_Q4_K ? 16 : 48) + 32 * c + 16 * half;
		__m128i v = load16(qs);
		__m128i q = high ? hi_nibbles(v) : lo_nibbles(v);
		if (qt == DI_Q5_K) {
			const __m128i bit = _mm_set1_epi8((char)((high ? 2 : 1) << (2 * c)));
			__m128i hb = _mm_and_si128(load16(b + 16 + 16 * half), bit);
			__m128i set = _mm_andnot_si128(_mm_cmpeq_epi8(hb, _mm_setzero_si128()), _mm_set1_epi8(16));
			q = _mm_add_epi8(q, set);
		}
		return q;
	}
	default: { // DI_Q6_K
		const int n = g / 8, r = g % 8, quarter = r / 2, s = r & 1;
		const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
		const int8_t *sc = (const int8_t *)(b + 192 + 8 * n);
		*d = qhalf(b + 208) * (float)sc[s + 2 * quarter];
		*mn = 0;
		__m128i v = load16(ql + 16 * s + 32 * (quarter & 1));
		__m128i lo = quarter >= 2 ? hi_nibbles(v) : lo_nibbles(v);
		__m128i h = _mm_and_si128(_mm_srli_epi16(load16(qh + 16 * s), 2 * quarter), _mm_set1_epi8(3));
		__m128i q = _mm_or_si128(lo, _mm_slli_epi16(h, 4));
		return _mm_sub_epi8(q, _mm_set1_epi8(32));
	}
	}
}
