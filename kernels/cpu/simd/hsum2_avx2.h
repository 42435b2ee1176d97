// hsum2_avx2.h: the canonical tree of one 16-lane accumulator held as two
// AVX2 registers (lo: lanes 0..7, hi: 8..15; package doc), shared by the
// AVX2 kernel files (each is compiled on its own, so the function is static
// inline here). The includer defines AVX2 (its target attribute) and INLINE
// first.
#ifndef DEEPINFER_HSUM2_AVX2_H
#define DEEPINFER_HSUM2_AVX2_H

#include <immintrin.h>

// hsum2 is the canonical tree of one accumulator held as (lo, hi): lane l +
// lane l+8 first (lo + hi), then the AVX-512 path's steps.
AVX2 INLINE float hsum2(__m256 lo, __m256 hi) {
	__m256 s8 = _mm256_add_ps(lo, hi);
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	__m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
	return _mm_cvtss_f32(s1);
}

#endif
