//go:build cgo

// AVX2 + FMA attention kernels (attn.go), the AVX-512 ones on 8-lane
// registers: a canonical 16-lane accumulator is the pair (lo: lanes 0..7,
// hi: 8..15), as in kernels_avx2.c. Each computes its Go reference's
// operations lane by lane, never letting a product feed an addition the
// compiler could contract.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "attn_amd64.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

#include "hsum2_avx2.h"

// pow2 is 2^n for integer lanes n in [-126, 127].
AVX2 INLINE __m256 pow2(__m256i n) {
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}

// exp8 is expGo on 8 lanes (see exp16 of attn_avx512.c). y * 2^n, n in
// [-159, 129], is (y * 2^(n>>1)) * 2^(n - (n>>1)): the first product is
// exact (a normal float), the second rounds once, as scalef does.
AVX2 INLINE __m256 exp8(__m256 x) {
	x = _mm256_max_ps(_mm256_set1_ps(DI_EXP_MIN), x);
	x = _mm256_min_ps(_mm256_set1_ps(DI_EXP_MAX), x);
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(DI_EXP_LOG2E)),
	                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(DI_EXP_LN2_HI), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(DI_EXP_LN2_LO), r);
	__m256 q = _mm256_fmadd_ps(_mm256_set1_ps(DI_EXP_P0), r, _mm256_set1_ps(DI_EXP_P1));
	q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(DI_EXP_P2));
	q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(DI_EXP_P3));
	q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(DI_EXP_P4));
	q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(DI_EXP_P5));
	__m256 y = _mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
	__m256i ni = _mm256_cvtps_epi32(n);
	__m256i n1 = _mm256_srai_epi32(ni, 1);
	// A NaN lane has y NaN (and a garbage n): the products stay NaN.
	__m256 e = _mm256_mul_ps(_mm256_mul_ps(y, pow2(n1)), pow2(_mm256_sub_epi32(ni, n1)));
	// The result is a register the compiler knows nothing of: an addition
	// of it can never be contracted with the product into one FMA.
	__asm__("" : "+x"(e));
	return e;
}

// lane_mask is the lanes j0+l (l < 8) with a <= j0+l < b, as a blend mask.
AVX2 INLINE __m256 lane_mask(int64_t j0, int64_t a, int64_t b) {
	__m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int32_t)j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	__m256i ge = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32((int32_t)a - 1));
	__m256i lt = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)b), idx);
	return _mm256_castsi256_ps(_mm256_and_si256(ge, lt));
}

// load8 reads x[j, j+8) clipped to j < n, zeros past n.
AVX2 INLINE __m256 load8(const float *x, int64_t j, int64_t n) {
	if (j + 8 <= n)
		return _mm256_loadu_ps(x + j);
	float buf[8] = {0};
	if (j < n)
		memcpy(buf, x + j, (n - j) * sizeof(float));
	return _mm256_loadu_ps(buf);
}

// store8 writes v to x[j, j+8) clipped to j < n.
AVX2 INLINE void store8(float *x, int64_t j, int64_t n, __m256 v) {
	if (j + 8 <= n) {
		_mm256_storeu_ps(x + j, v);
		return;
	}
	if (j < n) {
		float buf[8];
		_mm256_storeu_ps(buf, v);
		memcpy(x + j, buf, (n - j) * sizeof(float));
	}
}

AVX2 void di_exp_avx2(float *dst, const float *src, int64_t n) {
	for (int64_t i = 0; i < n; i += 8)
		store8(dst, i, n, exp8(load8(src, i, n)));
}

// silu8 is siluGo on 8 lanes.
AVX2 INLINE __m256 silu8(__m256 x) {
	__m256 ax = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
	__m256 e = exp8(_mm256_xor_ps(ax, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000))));
	__m256 num = _mm256_blendv_ps(x, _mm256_mul_ps(x, e), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
	return _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

AVX2 void di_scale_rows_avx2(float *dst, const float *x, const float *w, int64_t n, float s0, float s1, float s2, float s3,
                             int64_t m) {
	const float scales[4] = {s0, s1, s2, s3};
	for (int64_t i = 0; i < m; i++) {
		const __m256 r = _mm256_set1_ps(scales[i]);
		const float *xi = x + i * n;
		float *di = dst + i * n;
		for (int64_t j = 0; j < n; j += 8)
			store8(di, j, n, _mm256_mul_ps(_mm256_mul_ps(load8(xi, j, n), r), load8(w, j, n)));
	}
}

AVX2 void di_silu_mul_avx2(float *dst, const float *gate, const float *up, int64_t n) {
	for (int64_t i = 0; i < n; i += 8)
		store8(dst, i, n, _mm256_mul_ps(silu8(load8(gate, i, n)), load8(up, i, n)));
}

// max_ordered is maxOrdered: b unless a > b (MAXSS with b second).
AVX2 INLINE float max_ordered(float a, float b) {
	return _mm_cvtss_f32(_mm_max_ss(_mm_set_ss(a), _mm_set_ss(b)));
}

AVX2 void di_online_softmax_avx2(float *s, int64_t m, int64_t n, float scale, const int32_t *lo,
                                 const int32_t *hi, float *row_max, float *row_sum, float *alpha) {
	const __m256 sc = _mm256_set1_ps(scale);
	for (int64_t i = 0; i < m; i++) {
		float *row = s + i * n;
		const int64_t a = lo[i], b = hi[i];
		if (a >= b) {
			memset(row, 0, n * sizeof(float));
			alpha[i] = 1.0f;
			continue;
		}
		float tmax = row[a] * scale;
		{
			__m256 mv = _mm256_set1_ps(tmax);
			for (int64_t j = a; j < b; j += 8) {
				__m256 v = _mm256_mul_ps(load8(row, j, b), sc);
				// Lanes past b repeat the current max: they change nothing.
				v = _mm256_blendv_ps(mv, v, lane_mask(j, a, b));
				mv = _mm256_max_ps(mv, v);
			}
			float lanes[8];
			_mm256_storeu_ps(lanes, mv);
			for (int l = 0; l < 8; l++)
				tmax = max_ordered(tmax, lanes[l]);
		}
		const float m_old = row_max[i];
		const float m_new = max_ordered(m_old, tmax);
		const __m256 neg_m = _mm256_set1_ps(-m_new);
		__m256 acc_lo = _mm256_setzero_ps(), acc_hi = _mm256_setzero_ps();
		for (int64_t j = 0; j < n; j += 16) {
			__m256 e0 = _mm256_and_ps(lane_mask(j, a, b), exp8(_mm256_fmadd_ps(load8(row, j, n), sc, neg_m)));
			__m256 e1 = _mm256_and_ps(lane_mask(j + 8, a, b), exp8(_mm256_fmadd_ps(load8(row, j + 8, n), sc, neg_m)));
			store8(row, j, n, e0);
			store8(row, j + 8, n, e1);
			acc_lo = _mm256_add_ps(acc_lo, e0);
			acc_hi = _mm256_add_ps(acc_hi, e1);
		}
		float al = _mm256_cvtss_f32(exp8(_mm256_set1_ps(m_old - m_new)));
		alpha[i] = al;
		row_sum[i] = __builtin_fmaf(row_sum[i], al, hsum2(acc_lo, acc_hi));
		row_max[i] = m_new;
	}
}

// accum_w8 loads 8 values of a gathered row at wr (float32, or IEEE half
// widened exactly when h).
AVX2 INLINE __m256 accum_w8(const int h, const void *wr) {
	if (h)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wr));
	return _mm256_loadu_ps((const float *)wr);
}

// accum_w1 is one value of row r at column c.
AVX2 INLINE float accum_w1(const int h, const void *w, int64_t r, int64_t ldw, int64_t c) {
	if (h)
		return _cvtsh_ss(((const uint16_t *)w)[r * ldw + c]);
	return ((const float *)w)[r * ldw + c];
}

// accum_block is the AVX-512 path's accum_block on 8-column registers:
// rows [0, R) over columns [c0, c0+8*V), V full registers (R*V <= 12,
// V <= 6); w holds float32
// rows, or IEEE half ones when h (AccumRowsF16: each value widened exactly,
// the same FMAs).
AVX2 INLINE void accum_block(const int h, const int R, const int V, float *const acc[4], const float *const pr[4],
                             const float *alpha, const void *w, const int32_t *rows, int64_t ldw,
                             int64_t n, int64_t c0, row_pf *pf) {
	const int64_t es = h ? 2 : 4;
	__m256 pv[4][6];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++)
#pragma GCC unroll 6
		for (int v = 0; v < V; v++)
			pv[r][v] = _mm256_setzero_ps();
	for (int64_t j = 0; j < n; j++) {
		row_pf_step(pf);
		const char *wr = (const char *)w + ((int64_t)rows[j] * ldw + c0) * es;
		__m256 wv[6];
#pragma GCC unroll 6
		for (int v = 0; v < V; v++)
			wv[v] = accum_w8(h, wr + 8 * v * es);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const float p = pr[r][j];
			if (p != 0.0f) {
				const __m256 pb = _mm256_set1_ps(p);
#pragma GCC unroll 6
				for (int v = 0; v < V; v++)
					pv[r][v] = _mm256_fmadd_ps(pb, wv[v], pv[r][v]);
			}
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		const __m256 al = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 6
		for (int v = 0; v < V; v++) {
			float *d = acc[r] + c0 + 8 * v;
			_mm256_storeu_ps(d, _mm256_fmadd_ps(_mm256_loadu_ps(d), al, pv[r][v]));
		}
	}
}

// accum_rows runs R rows from i0: for a pair of float32 rows blocks of 48
// columns first (2 x 6 registers of sums: twelve FMA chains a key step,
// where eight are exactly what the FMA latency needs in flight, likely
// why a late load stalled them; MLA's P.V of 8 heads over 128 latent
// columns, one thread, 3-5% faster in nine of ten alternating runs, a
// 2 x 4 block taking the last 32), then blocks of 32 columns (16 for three rows, 3 x 2
// registers of sums, so that each key row is read once for the three),
// then of 8, then the last k%8 columns one at a time with scalar fused
// multiply-adds. Every output is the same chain of FMAs over the keys
// whatever the block, so the blocks change no bit. (Half rows keep 32:
// with their conversions the 2 x 6 block ran slower.)
AVX2 INLINE void accum_rows(const int h, const int R, float *acc, const float *alpha, const float *p, const void *w,
                            const int32_t *rows, int64_t ldw, int64_t n, int64_t k, int64_t i0, row_pf *pf) {
	const int VB = R > 2 ? 2 : 4; // registers of 8 columns in a big block
	float *ar[4];
	const float *pr[4];
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		ar[r] = acc + (i0 + r) * k;
		pr[r] = p + (i0 + r) * n;
	}
	int64_t c = 0;
	if (R == 2 && !h)
		for (; c + 48 <= k; c += 48)
			accum_block(h, R, 6, ar, pr, alpha + i0, w, rows, ldw, n, c, pf);
	for (; c + 8 * VB <= k; c += 8 * VB)
		accum_block(h, R, VB, ar, pr, alpha + i0, w, rows, ldw, n, c, pf);
	for (; c + 8 <= k; c += 8)
		accum_block(h, R, 1, ar, pr, alpha + i0, w, rows, ldw, n, c, pf);
	for (; c < k; c++) {
		for (int r = 0; r < R; r++) {
			float pv = 0.0f;
			for (int64_t j = 0; j < n; j++)
				if (pr[r][j] != 0.0f)
					pv = __builtin_fmaf(pr[r][j], accum_w1(h, w, rows[j], ldw, c), pv);
			ar[r][c] = __builtin_fmaf(ar[r][c], alpha[i0 + r], pv);
		}
	}
}

// accum_all runs AccumRows (h 0) or AccumRowsF16 (h 1): pairs of rows (2 x 4
// registers of sums), three rows left in one pass (3 x 2). Four rows in one
// pass (4 x 2) ran slower than two pairs: a key step's four probability
// tests and broadcasts for eight FMAs.
AVX2 INLINE void accum_all(const int h, float *acc, const float *alpha, const float *p, const void *w,
                           const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k, row_pf *pf) {
	int64_t i = 0;
	for (; m - i >= 4 || m - i == 2; i += 2)
		accum_rows(h, 2, acc, alpha, p, w, rows, ldw, n, k, i, pf);
	if (m - i == 3)
		accum_rows(h, 3, acc, alpha, p, w, rows, ldw, n, k, i, pf);
	else if (m - i == 1)
		accum_rows(h, 1, acc, alpha, p, w, rows, ldw, n, k, i, pf);
}

AVX2 void di_accum_rows_avx2(float *acc, const float *alpha, const float *p, const float *w,
                             const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k) {
	accum_all(0, acc, alpha, p, w, rows, ldw, m, n, k, 0);
}

AVX2 void di_accum_rows_f16_avx2(float *acc, const float *alpha, const float *p, const uint16_t *w,
                                 const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k) {
	accum_all(1, acc, alpha, p, w, rows, ldw, m, n, k, 0);
}

// di_accum_rows_pf_avx2 is Impl.AccumRowsPrefetch: AccumRows, spreading
// the prefetch of the first pf_k floats of rows pf_rows[0, pf_n) of w over
// its key steps (as di_accum_rows_pf_avx512).
AVX2 void di_accum_rows_pf_avx2(float *acc, const float *alpha, const float *p, const float *w,
                                const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k,
                                const int32_t *pf_rows, int64_t pf_n, int64_t pf_k) {
	// Key steps: n for each group of rows (accum_all's) and block of
	// columns (accum_rows': of 48 for a pair, then of 32 or, for three
	// rows, 16; then of 8).
	int64_t blocks = 0;
	for (int64_t i = 0; i < m;) {
		const int64_t r = (m - i >= 4 || m - i == 2) ? 2 : m - i, big = r > 2 ? 16 : 32;
		const int64_t k48 = r == 2 ? k / 48 : 0, rest = k - 48 * k48;
		blocks += k48 + rest / big + (rest % big) / 8;
		i += r;
	}
	row_pf pf = row_pf_init(w, pf_rows, ldw, pf_n, pf_k, blocks * n);
	accum_all(0, acc, alpha, p, w, rows, ldw, m, n, k, &pf);
	row_pf_finish(&pf);
}
