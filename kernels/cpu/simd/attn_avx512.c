//go:build cgo

// AVX-512 attention kernels (attn.go): the exponential, the online-softmax
// step of one key tile and the gathered P.V accumulation. Each computes the
// operations of its Go reference (expGo, onlineSoftmaxGo, accumRowsGo) lane
// by lane: explicit fused multiply-adds where the reference has fma32, and
// never a product feeding an addition (which the compiler could contract).

#include <immintrin.h>
#include <stdint.h>

#include "attn_amd64.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#include "reduce16_avx512.h"

// exp16 is expGo on 16 lanes. The max and min take x second, so a NaN lane
// stays NaN; scalef rounds y * 2^n once, as expGo's float64 product and
// conversion do.
AVX512 INLINE __m512 exp16(__m512 x) {
	x = _mm512_max_ps(_mm512_set1_ps(DI_EXP_MIN), x);
	x = _mm512_min_ps(_mm512_set1_ps(DI_EXP_MAX), x);
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(DI_EXP_LOG2E)),
	                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DI_EXP_LN2_HI), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DI_EXP_LN2_LO), r);
	__m512 q = _mm512_fmadd_ps(_mm512_set1_ps(DI_EXP_P0), r, _mm512_set1_ps(DI_EXP_P1));
	q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(DI_EXP_P2));
	q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(DI_EXP_P3));
	q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(DI_EXP_P4));
	q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(DI_EXP_P5));
	__m512 y = _mm512_add_ps(_mm512_fmadd_ps(q, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
	return _mm512_scalef_ps(y, n);
}

static inline __mmask16 head_mask(int64_t rem) {
	return rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1);
}

AVX512 void di_exp_avx512(float *dst, const float *src, int64_t n) {
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i, exp16(_mm512_loadu_ps(src + i)));
	if (i < n) {
		__mmask16 mk = head_mask(n - i);
		_mm512_mask_storeu_ps(dst + i, mk, exp16(_mm512_maskz_loadu_ps(mk, src + i)));
	}
}

// silu16 is siluGo on 16 lanes.
AVX512 INLINE __m512 silu16(__m512 x) {
	__m512 ax = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
	__m512 e = exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(ax), _mm512_set1_epi32((int)0x80000000))));
	__mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
	__m512 num = _mm512_mask_mul_ps(x, neg, x, e);
	return _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

AVX512 void di_scale_rows_avx512(float *dst, const float *x, const float *w, int64_t n, float s0, float s1, float s2,
                                 float s3, int64_t m) {
	const float scales[4] = {s0, s1, s2, s3};
	for (int64_t i = 0; i < m; i++) {
		const __m512 r = _mm512_set1_ps(scales[i]);
		const float *xi = x + i * n;
		float *di = dst + i * n;
		int64_t j = 0;
		for (; j + 16 <= n; j += 16)
			_mm512_storeu_ps(di + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xi + j), r), _mm512_loadu_ps(w + j)));
		if (j < n) {
			__mmask16 mk = head_mask(n - j);
			_mm512_mask_storeu_ps(di + j, mk,
			                      _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, xi + j), r), _mm512_maskz_loadu_ps(mk, w + j)));
		}
	}
}

AVX512 void di_silu_mul_avx512(float *dst, const float *gate, const float *up, int64_t n) {
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i, _mm512_mul_ps(silu16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
	if (i < n) {
		__mmask16 mk = head_mask(n - i);
		_mm512_mask_storeu_ps(dst + i, mk,
		                      _mm512_mul_ps(silu16(_mm512_maskz_loadu_ps(mk, gate + i)), _mm512_maskz_loadu_ps(mk, up + i)));
	}
}

// max_ordered is maxOrdered: b unless a > b (MAXSS with b second).
AVX512 INLINE float max_ordered(float a, float b) {
	return _mm_cvtss_f32(_mm_max_ss(_mm_set_ss(a), _mm_set_ss(b)));
}

// seen_mask is the lanes of [j, j+16) inside [a, b).
static inline __mmask16 seen_mask(int64_t j, int64_t a, int64_t b) {
	uint32_t m = 0xffff;
	if (a > j)
		m = a - j >= 16 ? 0 : m & (0xffffu << (a - j));
	if (b < j + 16)
		m = b <= j ? 0 : m & ((1u << (b - j)) - 1);
	return (__mmask16)m;
}

AVX512 void di_online_softmax_avx512(float *s, int64_t m, int64_t n, float scale, const int32_t *lo,
                                     const int32_t *hi, float *row_max, float *row_sum, float *alpha) {
	const __m512 sc = _mm512_set1_ps(scale);
	for (int64_t i = 0; i < m; i++) {
		float *row = s + i * n;
		const int64_t a = lo[i], b = hi[i];
		if (a >= b) {
			for (int64_t j = 0; j < n; j += 16)
				_mm512_mask_storeu_ps(row + j, head_mask(n - j), _mm512_setzero_ps());
			alpha[i] = 1.0f;
			continue;
		}
		// The tile max of the scaled scores: max is exact and order-free
		// for non-NaN values, so lanes may be combined in any order.
		float tmax = row[a] * scale;
		{
			__m512 mv = _mm512_set1_ps(tmax);
			int64_t j = a;
			for (; j + 16 <= b; j += 16)
				mv = _mm512_max_ps(mv, _mm512_mul_ps(_mm512_loadu_ps(row + j), sc));
			if (j < b) {
				__mmask16 mk = head_mask(b - j);
				mv = _mm512_mask_max_ps(mv, mk, mv, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, row + j), sc));
			}
			float lanes[16];
			_mm512_storeu_ps(lanes, mv);
			for (int l = 0; l < 16; l++)
				tmax = max_ordered(tmax, lanes[l]);
		}
		const float m_old = row_max[i];
		const float m_new = max_ordered(m_old, tmax);
		const __m512 neg_m = _mm512_set1_ps(-m_new);
		__m512 acc = _mm512_setzero_ps();
		for (int64_t j = 0; j < n; j += 16) {
			__mmask16 in = head_mask(n - j), mk = seen_mask(j, a, b) & in;
			__m512 e = _mm512_maskz_mov_ps(mk, exp16(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(in, row + j), sc, neg_m)));
			_mm512_mask_storeu_ps(row + j, in, e);
			acc = _mm512_add_ps(acc, e);
		}
		float al = _mm512_cvtss_f32(exp16(_mm512_set1_ps(m_old - m_new)));
		alpha[i] = al;
		row_sum[i] = __builtin_fmaf(row_sum[i], al, hsum(acc));
		row_max[i] = m_new;
	}
}

// accum_w16 loads 16 values of a gathered row at wr, the lanes outside mk
// zero (float32, or IEEE half widened exactly when h).
AVX512 INLINE __m512 accum_w16(const int h, const void *wr, __mmask16 mk) {
	if (h)
		return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, wr));
	return mk == (__mmask16)0xffff ? _mm512_loadu_ps(wr) : _mm512_maskz_loadu_ps(mk, wr);
}

// accum_block runs AccumRows' rows [0, R) (pointers pr to their
// probabilities, acc to their outputs) over the columns [c0, c0+16*V) of
// the gathered rows, V accumulators of 16 columns a row, the last one
// masked by tail; w holds float32 rows, or IEEE half ones when h
// (AccumRowsF16: each value widened exactly, the same FMAs).
AVX512 INLINE void accum_block(const int h, const int R, const int V, float *const acc[4], const float *const pr[4],
                               const float *alpha, const void *w, const int32_t *rows, int64_t ldw,
                               int64_t n, int64_t c0, __mmask16 tail, row_pf *pf) {
	const int64_t es = h ? 2 : 4;
	__m512 pv[4][4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
#pragma GCC unroll 4
		for (int v = 0; v < V; v++)
			pv[r][v] = _mm512_setzero_ps();
	for (int64_t j = 0; j < n; j++) {
		row_pf_step(pf);
		const char *wr = (const char *)w + ((int64_t)rows[j] * ldw + c0) * es;
		__m512 wv[4];
#pragma GCC unroll 4
		for (int v = 0; v < V; v++)
			wv[v] = accum_w16(h, wr + 16 * v * es, v == V - 1 ? tail : (__mmask16)0xffff);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const float p = pr[r][j];
			if (p != 0.0f) {
				const __m512 pb = _mm512_set1_ps(p);
#pragma GCC unroll 4
				for (int v = 0; v < V; v++)
					pv[r][v] = _mm512_fmadd_ps(pb, wv[v], pv[r][v]);
			}
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		const __m512 al = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
		for (int v = 0; v < V; v++) {
			__mmask16 mk = v == V - 1 ? tail : (__mmask16)0xffff;
			float *d = acc[r] + c0 + 16 * v;
			_mm512_mask_storeu_ps(d, mk, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, d), al, pv[r][v]));
		}
	}
}

// accum_rows runs R rows from i0 over all k columns: blocks of 64 columns,
// then of 16, then the masked tail.
AVX512 INLINE void accum_rows(const int h, const int R, float *acc, const float *alpha, const float *p, const void *w,
                              const int32_t *rows, int64_t ldw, int64_t n, int64_t k, int64_t i0,
                              row_pf *pf) {
	float *ar[4];
	const float *pr[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		ar[r] = acc + (i0 + r) * k;
		pr[r] = p + (i0 + r) * n;
	}
	int64_t c = 0;
	for (; c + 64 <= k; c += 64)
		accum_block(h, R, 4, ar, pr, alpha + i0, w, rows, ldw, n, c, 0xffff, pf);
	for (; c + 16 <= k; c += 16)
		accum_block(h, R, 1, ar, pr, alpha + i0, w, rows, ldw, n, c, 0xffff, pf);
	if (c < k)
		accum_block(h, R, 1, ar, pr, alpha + i0, w, rows, ldw, n, c, head_mask(k - c), pf);
}

// accum_all runs AccumRows (h 0) or AccumRowsF16 (h 1) over all m rows,
// prefetching as pf says.
AVX512 INLINE void accum_all(const int h, float *acc, const float *alpha, const float *p, const void *w,
                             const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k, row_pf *pf) {
	int64_t i = 0;
	for (; i + 4 <= m; i += 4)
		accum_rows(h, 4, acc, alpha, p, w, rows, ldw, n, k, i, pf);
	if (m - i >= 2) {
		accum_rows(h, 2, acc, alpha, p, w, rows, ldw, n, k, i, pf);
		i += 2;
	}
	if (i < m)
		accum_rows(h, 1, acc, alpha, p, w, rows, ldw, n, k, i, pf);
}

AVX512 void di_accum_rows_avx512(float *acc, const float *alpha, const float *p, const float *w,
                                 const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k) {
	accum_all(0, acc, alpha, p, w, rows, ldw, m, n, k, 0);
}

AVX512 void di_accum_rows_f16_avx512(float *acc, const float *alpha, const float *p, const uint16_t *w,
                                     const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k) {
	accum_all(1, acc, alpha, p, w, rows, ldw, m, n, k, 0);
}

// di_accum_rows_pf_avx512 is Impl.AccumRowsPrefetch: AccumRows, spreading
// the prefetch of the first pf_k floats of rows pf_rows[0, pf_n) of w over
// its key steps.
AVX512 void di_accum_rows_pf_avx512(float *acc, const float *alpha, const float *p, const float *w,
                                    const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k,
                                    const int32_t *pf_rows, int64_t pf_n, int64_t pf_k) {
	// Key steps: n for each group of rows and block of columns.
	const int64_t groups = m / 4 + (m % 4 >= 2) + (m % 2);
	const int64_t blocks = k / 64 + (k % 64) / 16 + (k % 16 != 0);
	row_pf pf = row_pf_init(w, pf_rows, ldw, pf_n, pf_k, groups * blocks * n);
	accum_all(0, acc, alpha, p, w, rows, ldw, m, n, k, &pf);
	row_pf_finish(&pf);
}
