// C kernels of package simd for amd64. Each function is compiled for its
// instruction set with a target attribute and must only be called when the
// CPU has it (the Go side checks with golang.org/x/sys/cpu). All of them
// compute the canonical reduction order of the package doc.
#ifndef DEEPINFER_SIMD_AMD64_H
#define DEEPINFER_SIMD_AMD64_H

#include <stdint.h>
#include <xmmintrin.h>

// Weight dtypes of di_linear_*.
enum { DI_F32 = 0, DI_BF16 = 1, DI_F16 = 2 };

// out[i*n+j] = sum_kk x[i*k+kk] * w[j*k+kk], i in [0,m), j in [j0,j1).
void di_linear_avx512(int dtype, float *out, const float *x, const void *w,
                      int64_t m, int64_t n, int64_t k, int64_t j0, int64_t j1);
void di_linear_avx2(int dtype, float *out, const float *x, const void *w,
                    int64_t m, int64_t n, int64_t k, int64_t j0, int64_t j1);

// LinearF8: out[i*n+j] = sum_kk (x[i*k+kk] * (256 * scale)) * (E4M3(w[j*k+kk]) / 256),
// the scale scales[scale_row[j]*ceil(k/2^block_shift) + (kk >> block_shift)],
// each activation's product with 256 * scale rounded once (see LinearF8 in
// f8.go). xs: scratch for min(m, DI_F8_SCALED_ROWS) rows of k floats.
// vbmi (AVX-512 only): nonzero where the CPU has AVX512_VBMI, whose table
// widening the one-row tiles then use (the same bits either way).
#define DI_F8_SCALED_ROWS 64

// The LinearF8 one-pass tiles prefetch the next tile's weights into L1 when
// the tile's weight rows and activation rows (C * k bytes and R * 4k) fit in
// DI_F8_PF_L1_BYTES, half of a 32 KiB L1, and into L2 only when they do not:
// lines brought to L1 a tile early were evicted before their use
// (kernels/cpu/simd/BENCH.md).
#define DI_F8_PF_L1_BYTES (16 * 1024)

static inline int di_f8_prefetch_l2(int R, int C, int64_t k) { return ((int64_t)C + 4 * (int64_t)R) * k > DI_F8_PF_L1_BYTES; }

// DI_F8_PREFETCH prefetches the line at p into L1, or into L2 when l2 (a
// macro: as a static inline function GCC 12 dropped the prefetches).
#define DI_F8_PREFETCH(p, l2)                                                                              \
	do {                                                                                               \
		if (l2)                                                                                    \
			_mm_prefetch((const char *)(p), _MM_HINT_T1);                                      \
		else                                                                                       \
			_mm_prefetch((const char *)(p), _MM_HINT_T0);                                      \
	} while (0)

// DI_MXCSR_DAZ is MXCSR's denormals-are-zero bit: the LinearF8 register
// tiles widen E4M3 subnormals to float32 subnormals only where it is clear.
#define DI_MXCSR_DAZ 0x0040

// di_f8_run_end returns the end of the run of weight rows from j (before
// je) that share j's scale row: the columns the LinearF8 kernels run
// against one scaling of the activations.
static inline int64_t di_f8_run_end(const int32_t *scale_row, int64_t j, int64_t je) {
	int64_t e = j + 1;
	while (e < je && scale_row[e] == scale_row[j])
		e++;
	return e;
}
void di_linear_f8_avx512(float *out, const float *x, const uint8_t *w, const float *scales,
                         const int32_t *scale_row, int block_shift, int64_t m, int64_t n, int64_t k,
                         int64_t j0, int64_t j1, int vbmi, float *xs);
void di_linear_f8_avx2(float *out, const float *x, const uint8_t *w, const float *scales,
                       const int32_t *scale_row, int block_shift, int64_t m, int64_t n, int64_t k,
                       int64_t j0, int64_t j1, float *xs);

float di_dot_avx512(const float *a, const float *b, int64_t n);
void di_axpy_avx512(float a, const float *x, float *y, int64_t n);
void di_scale_avx512(float a, float *x, int64_t n);
void di_bf16_to_f32_avx512(float *dst, const uint16_t *src, int64_t n);
void di_f16_to_f32_avx512(float *dst, const uint16_t *src, int64_t n);
void di_f32_to_bf16_avx512(uint16_t *dst, const float *src, int64_t n);

// Throughput probe for benchmarks: iters rounds of 24 independent FMAs.
float di_fma_peak_avx512(int64_t iters);
float di_fma_peak_avx2(int64_t iters);

float di_dot_avx2(const float *a, const float *b, int64_t n);
void di_axpy_avx2(float a, const float *x, float *y, int64_t n);
void di_scale_avx2(float a, float *x, int64_t n);
void di_bf16_to_f32_avx2(float *dst, const uint16_t *src, int64_t n);
void di_f16_to_f32_avx2(float *dst, const uint16_t *src, int64_t n);
// dst[j*k + e] = the half src[rows[j]*ld + e], j < n, e < k (Impl.F16Rows;
// both paths), prefetching DI_F16_ROWS_AHEAD rows ahead.
#define DI_F16_ROWS_AHEAD 8
void di_f16_rows_to_f32_avx2(float *dst, const uint16_t *src, const int32_t *rows, int64_t ld, int64_t n,
                             int64_t k);
void di_f32_to_bf16_avx2(uint16_t *dst, const float *src, int64_t n);
void di_f32_to_f16_avx2(uint16_t *dst, const float *src, int64_t n);

#endif
