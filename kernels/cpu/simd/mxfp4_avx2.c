//go:build cgo

// AVX2 widening of MXFP4 blocks to BF16 (see mxfp4.go). A block's codes
// are split into low and high nibbles and interleaved into 32 byte indices
// in output order; two VPSHUFB look them up in the block scale's low-byte
// and high-byte tables (mxfp4Split), and byte unpacks join the halves into
// the 32 BF16 values, so every code and scale widens to mxfp4Table's bits.

#include <immintrin.h>
#include <stdint.h>

#include "mxfp4_amd64.h"

#define AVX2 __attribute__((target("avx2")))

AVX2 void di_widen_mxfp4_avx2(uint16_t *dst, const uint8_t *blocks, const uint8_t *scales, int64_t nb,
                              const uint8_t *split) {
	const __m128i m4 = _mm_set1_epi8(0x0f);
	for (int64_t b = 0; b < nb; b++) {
		__m128i c = _mm_loadu_si128((const __m128i *)(blocks + 16 * b));
		__m128i lo = _mm_and_si128(c, m4);
		__m128i hi = _mm_and_si128(_mm_srli_epi16(c, 4), m4);
		// Lane 0: the indices of outputs 0..15, lane 1: 16..31.
		__m256i idx = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
		const uint8_t *t = split + 32 * (int)scales[b];
		__m256i tl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
		__m256i th = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(t + 16)));
		__m256i l = _mm256_shuffle_epi8(tl, idx), h = _mm256_shuffle_epi8(th, idx);
		__m256i w0 = _mm256_unpacklo_epi8(l, h); // outputs 0..7 | 16..23
		__m256i w1 = _mm256_unpackhi_epi8(l, h); // outputs 8..15 | 24..31
		_mm256_storeu_si256((__m256i *)(dst + 32 * b), _mm256_permute2x128_si256(w0, w1, 0x20));
		_mm256_storeu_si256((__m256i *)(dst + 32 * b + 16), _mm256_permute2x128_si256(w0, w1, 0x31));
	}
}
