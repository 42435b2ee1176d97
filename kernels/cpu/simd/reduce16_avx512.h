// reduce16_avx512.h: the canonical reduction tree of one AVX-512
// accumulator (hsum) and of 16 at once (reduce16), shared by the AVX-512
// kernel files (each is compiled on its own, so the functions are static
// inline here). The includer defines AVX512 (its target attribute) and
// INLINE first.
#ifndef DEEPINFER_REDUCE16_AVX512_H
#define DEEPINFER_REDUCE16_AVX512_H

#include <immintrin.h>

// hsum is the canonical tree of one accumulator.
AVX512 INLINE float hsum(__m512 v) {
	__m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	__m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
	return _mm_cvtss_f32(s1);
}

// reduce16 runs the canonical tree on 16 accumulators at once and returns
// r with r[4c+q] = hsum(a[4q+c]): the same additions as hsum, batched into
// full-width shuffles and adds.
AVX512 INLINE __m512 reduce16(const __m512 a[16]) {
	__m512 t[8], u[4], v[2];
#pragma GCC unroll 8
	for (int i = 0; i < 8; i++) // lanes l + l+8: t[i] = [s8(a[2i]) | s8(a[2i+1])]
		t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
		                     _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 4
	for (int j = 0; j < 4; j++) // l + l+4: u[j] chunk c = s4(a[4j+c])
		u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
		                     _mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
	for (int h = 0; h < 2; h++) // l + l+2: v[h] chunk c = [s2(a[8h+c]), s2(a[8h+4+c])]
		v[h] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * h], u[2 * h + 1], _MM_SHUFFLE(1, 0, 1, 0)),
		                     _mm512_shuffle_ps(u[2 * h], u[2 * h + 1], _MM_SHUFFLE(3, 2, 3, 2)));
	// l + l+1: chunk c = [s1(a[c]), s1(a[4+c]), s1(a[8+c]), s1(a[12+c])]
	return _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
	                     _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// reduce8 runs the canonical tree on 8 accumulators at once and returns r
// with r[4c] = hsum(a[c]) and r[4c+1] = hsum(a[4+c]) for c < 4 (lanes 2
// and 3 of each 128-bit chunk repeat 0 and 1): the same additions as hsum,
// in 24 instructions where reduce16 over 8 accumulators padded to 16 takes
// 45.
AVX512 INLINE __m512 reduce8(const __m512 a[8]) {
	__m512 t[4], u[2];
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++) // lanes l + l+8: t[i] = [s8(a[2i]) | s8(a[2i+1])]
		t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
		                     _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 2
	for (int j = 0; j < 2; j++) // l + l+4: u[j] chunk c = s4(a[4j+c])
		u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
		                     _mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
	// l + l+2: v chunk c = [s2(a[c]), s2(a[4+c])]
	__m512 v = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
	                         _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
	// l + l+1: chunk c = [s1(a[c]), s1(a[4+c]), s1(a[c]), s1(a[4+c])]
	return _mm512_add_ps(_mm512_shuffle_ps(v, v, _MM_SHUFFLE(2, 0, 2, 0)),
	                     _mm512_shuffle_ps(v, v, _MM_SHUFFLE(3, 1, 3, 1)));
}

#endif
