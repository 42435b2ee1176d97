// C kernels of package simd's attention building blocks (attn.go). Each must
// only be called when the CPU has its instruction set; each computes its Go
// reference's operations lane by lane, so all paths give the same bits.
#ifndef DEEPINFER_ATTN_AMD64_H
#define DEEPINFER_ATTN_AMD64_H

#include <stdint.h>
#include <xmmintrin.h>

// The constants of expGo (attn.go), the same literals rounded to float.
#define DI_EXP_MIN (-110.0f)
#define DI_EXP_MAX 89.0f
#define DI_EXP_LOG2E 1.44269504088896341f
#define DI_EXP_LN2_HI 0.693359375f
#define DI_EXP_LN2_LO (-2.12194440e-4f)
#define DI_EXP_P0 1.9875691500e-4f
#define DI_EXP_P1 1.3981999507e-3f
#define DI_EXP_P2 8.3334519073e-3f
#define DI_EXP_P3 4.1665795894e-2f
#define DI_EXP_P4 1.6666665459e-1f
#define DI_EXP_P5 5.0000001201e-1f

// dst[i] = exp(src[i]), i < n.
void di_exp_avx512(float *dst, const float *src, int64_t n);
void di_exp_avx2(float *dst, const float *src, int64_t n);

// dst[i] = silu(gate[i]) * up[i], i < n (Impl.SiLUMul).
void di_silu_mul_avx512(float *dst, const float *gate, const float *up, int64_t n);
void di_silu_mul_avx2(float *dst, const float *gate, const float *up, int64_t n);
// dst[i*n+j] = (x[i*n+j] * s_i) * w[j], i < m (at most 4), j < n (Impl.ScaleRows).
void di_scale_rows_avx512(float *dst, const float *x, const float *w, int64_t n, float s0, float s1, float s2, float s3,
                          int64_t m);
void di_scale_rows_avx2(float *dst, const float *x, const float *w, int64_t n, float s0, float s1, float s2, float s3,
                        int64_t m);

// One key tile of the online softmax of m rows of n scores (Impl.OnlineSoftmax).
void di_online_softmax_avx512(float *s, int64_t m, int64_t n, float scale, const int32_t *lo,
                              const int32_t *hi, float *row_max, float *row_sum, float *alpha);
void di_online_softmax_avx2(float *s, int64_t m, int64_t n, float scale, const int32_t *lo,
                            const int32_t *hi, float *row_max, float *row_sum, float *alpha);

// acc[i*k+c] = fma(acc[i*k+c], alpha[i], sum_j p[i*n+j] * w[rows[j]*ldw+c]) (Impl.AccumRows).
void di_accum_rows_avx512(float *acc, const float *alpha, const float *p, const float *w,
                          const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k);
void di_accum_rows_pf_avx512(float *acc, const float *alpha, const float *p, const float *w,
                             const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k,
                             const int32_t *pf_rows, int64_t pf_n, int64_t pf_k);
void di_accum_rows_avx2(float *acc, const float *alpha, const float *p, const float *w,
                        const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k);
void di_accum_rows_pf_avx2(float *acc, const float *alpha, const float *p, const float *w,
                           const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k,
                           const int32_t *pf_rows, int64_t pf_n, int64_t pf_k);

// row_pf walks rows of a gathered matrix to prefetch into L2 a few lines
// at a time (row_pf_step, once per key step of AccumRows' blocks):
// AccumRowsPrefetch's rows, fetched while the products run instead of in
// one burst. row_pf_init spreads n rows of k floats over steps key steps.
typedef struct {
	const float *w;
	const int32_t *rows;
	int64_t ldw, n, bytes; // n rows of bytes each
	int64_t j, q;          // the next row and byte offset
	int64_t per_key;       // lines a step
} row_pf;

static inline row_pf row_pf_init(const float *w, const int32_t *rows, int64_t ldw, int64_t n, int64_t k,
                                 int64_t steps) {
	const int64_t lines_a_row = (k * 4 + 63) / 64;
	row_pf pf = {w, rows, ldw, n, k * 4, 0, 0, 1};
	if (steps > 0)
		pf.per_key = (n * lines_a_row + steps - 1) / steps;
	return pf;
}

static inline __attribute__((always_inline)) void row_pf_step(row_pf *c) {
	if (!c)
		return;
	for (int64_t i = 0; i < c->per_key && c->j < c->n; i++) {
		_mm_prefetch((const char *)(c->w + (int64_t)c->rows[c->j] * c->ldw) + c->q, _MM_HINT_T1);
		c->q += 64;
		if (c->q >= c->bytes) {
			c->q = 0;
			c->j++;
		}
	}
}

// row_pf_finish prefetches what the steps did not reach (nothing when
// the steps ran).
static inline void row_pf_finish(row_pf *c) {
	c->per_key = (c->bytes + 63) / 64;
	while (c->j < c->n)
		row_pf_step(c);
}

// The same over IEEE-half rows of w, each value widened exactly (Impl.AccumRowsF16).
void di_accum_rows_f16_avx512(float *acc, const float *alpha, const float *p, const uint16_t *w,
                              const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k);
void di_accum_rows_f16_avx2(float *acc, const float *alpha, const float *p, const uint16_t *w,
                            const int32_t *rows, int64_t ldw, int64_t m, int64_t n, int64_t k);

// out[i*n+j] = canonical dot of x[i*k..] and w[rows[j]*ldw..], i < m, j < n
// (Impl.LinearF32Gather); in the kernels_*.c files, next to LinearF32.
void di_linear_gather_avx512(float *out, const float *x, const float *w, const int32_t *rows,
                             int64_t ldw, int64_t m, int64_t n, int64_t k);
void di_linear_gather_avx2(float *out, const float *x, const float *w, const int32_t *rows,
                           int64_t ldw, int64_t m, int64_t n, int64_t k);

// The same over IEEE-half rows of w (ldw in halves), widened exactly in
// registers (Impl.LinearF16Gather).
void di_linear_gather_f16_avx512(float *out, const float *x, const uint16_t *w, const int32_t *rows,
                                 int64_t ldw, int64_t m, int64_t n, int64_t k);
void di_linear_gather_f16_avx2(float *out, const float *x, const uint16_t *w, const int32_t *rows,
                               int64_t ldw, int64_t m, int64_t n, int64_t k);

// out[i*ldo+c] = canonical dot of x[i*ldx..] and column c of the k-major
// w [k][n], i < m, c < n (Impl.LinearF32KMajor); in the kernels_*.c files.
void di_linear_kmajor_avx512(float *out, int64_t ldo, const float *x, int64_t ldx, const float *w,
                             int64_t m, int64_t n, int64_t k);
void di_linear_kmajor_avx2(float *out, int64_t ldo, const float *x, int64_t ldx, const float *w,
                           int64_t m, int64_t n, int64_t k);

// Prefetches the first k floats of rows w[rows[j]*ldw..], j < n, into L2
// (Impl.PrefetchRows); in kernels_avx512.c, for both paths.
void di_prefetch_rows(const float *w, const int32_t *rows, int64_t ldw, int64_t n, int64_t k);

#endif
