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

// hsum2x4 is hsum2 of four accumulators (lo[f], hi[f]) at once: the sums
// of accumulators 0..3 in lanes 0..3. Each level adds the same pairs of
// lanes as hsum2 (l + l+8, l + l+4, l + l+2, l + l+1), with the lanes of
// the four moved side by side instead of one accumulator folded at a time:
// 18 instructions for four sums where hsum2 takes 7 for one.
AVX2 INLINE __m128 hsum2x4(const __m256 *lo, const __m256 *hi) {
	const __m256 s0 = _mm256_add_ps(lo[0], hi[0]), s1 = _mm256_add_ps(lo[1], hi[1]);
	const __m256 s2 = _mm256_add_ps(lo[2], hi[2]), s3 = _mm256_add_ps(lo[3], hi[3]);
	// [s0 l + l+4 | s1 l + l+4], the same for s2, s3.
	const __m256 t01 = _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
	const __m256 t23 = _mm256_add_ps(_mm256_permute2f128_ps(s2, s3, 0x20), _mm256_permute2f128_ps(s2, s3, 0x31));
	// l + l+2: [a0+a2, a1+a3, c0+c2, c1+c3 | b.., d..].
	const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
	                               _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
	// l + l+1: [a, c, a, c | b, d, b, d].
	const __m256 v = _mm256_add_ps(_mm256_shuffle_ps(u, u, _MM_SHUFFLE(2, 0, 2, 0)),
	                               _mm256_shuffle_ps(u, u, _MM_SHUFFLE(3, 1, 3, 1)));
	return _mm_unpacklo_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}

#endif
