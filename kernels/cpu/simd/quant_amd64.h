// C kernels of package simd for llama.cpp's block-quantized weights
// (QuantType): a row of w is dequantized 16 weights at a time in registers
// and reduced in the canonical order of the package doc, so every output is
// bit for bit the float32 GEMV over the dequantized matrix.
#ifndef DEEPINFER_QUANT_AMD64_H
#define DEEPINFER_QUANT_AMD64_H

#include <stdint.h>

// Quantized types, numbered as ggml numbers them (QuantType).
enum { DI_Q4_0 = 2, DI_Q8_0 = 8, DI_Q4_K = 12, DI_Q5_K = 13, DI_Q6_K = 14 };

// out[i*n+j] = sum_kk x[i*k+kk] * W[j][kk], i in [0,m), j in [j0,j1), with
// W's rows of row_bytes bytes at w + j*row_bytes. k is a multiple of the
// type's block size.
void di_linear_quant_avx2(int qtype, float *out, const float *x, const uint8_t *w,
                          int64_t m, int64_t n, int64_t k, int64_t j0, int64_t j1);
void di_linear_quant_avx512(int qtype, float *out, const float *x, const uint8_t *w,
                            int64_t m, int64_t n, int64_t k, int64_t j0, int64_t j1);


// dst[0 .. nb*block size) = the weights of the nb whole blocks at w, bit for
// bit as the kernels above compute them in registers (and as Dequantize).
void di_dequant_avx2(int qtype, float *dst, const uint8_t *w, int64_t nb);
void di_dequant_avx512(int qtype, float *dst, const uint8_t *w, int64_t nb);

// out[i*ldo + j] = llama.cpp's block dot product (ggml_vec_dot_*_q8_0 /
// _q8_K, generic order) of activation row i (a + i*activation row bytes,
// Q8_0 or Q8_K blocks) with weight row j (w + j*row_bytes), i in [0,m), j in
// [0,ncols). k is a multiple of the type's block size. The vnni variant
// needs AVX512-VNNI with VL and BW. prefetch: 2 has the Q8_0/Q4_0 decode
// tiles prefetch one tile ahead into L1, anything else two tiles into L2
// (quant_llama.h, QL_PF_L1); it never changes a result.
void di_linear_qllama_avx2(int qtype, float *out, int64_t ldo, const uint8_t *a, const uint8_t *w, int64_t m,
                           int64_t k, int64_t ncols, int prefetch);
void di_linear_qllama_vnni(int qtype, float *out, int64_t ldo, const uint8_t *a, const uint8_t *w, int64_t m,
                           int64_t k, int64_t ncols, int prefetch);
// di_cpu_is_amd reports whether CPUID's vendor string is AuthenticAMD.
int di_cpu_is_amd(void);

// out[i*ldo + j] = the sum over kk, in order and in float64, of the
// float32 products x[i*k+kk] * w[j*k+kk] (bfloat16 values when bf16, else
// IEEE half), rounded to float32 once: llama.cpp's generic
// ggml_vec_dot_bf16 / _f16. i in [0,m), j in [0,ncols). Needs AVX-512
// F/BW/VL/DQ and F16C; returns 0 (nothing computed) when its scratch
// cannot be allocated.
int di_linear16_llama_avx512(int bf16, float *out, int64_t ldo, const uint16_t *x, const uint16_t *w, int64_t m,
                             int64_t k, int64_t ncols);
// The same for AVX2 + FMA + F16C.
int di_linear16_llama_avx2(int bf16, float *out, int64_t ldo, const uint16_t *x, const uint16_t *w, int64_t m,
                           int64_t k, int64_t ncols);

// QuantizeQ8K of nb blocks of 256 values of x into y (the same bytes as the
// Go loop): AVX2 + FMA, and AVX-512 F/BW/VL.
void di_quantize_q8k_avx2(const float *x, uint8_t *y, int64_t nb);
void di_quantize_q8k_vnni(const float *x, uint8_t *y, int64_t nb);
int64_t di_quantize_q8_0_avx2(const float *x, uint8_t *y, int64_t nb);
int64_t di_quantize_q8_0_vnni(const float *x, uint8_t *y, int64_t nb);
void di_round_bf16_avx2(const float *x, uint16_t *y, int64_t n);

#endif
