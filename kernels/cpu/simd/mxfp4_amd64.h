// C kernels of package simd's MXFP4 widening (see mxfp4.go). Each must only
// be called when the CPU has its instruction set.
#ifndef DEEPINFER_MXFP4_AMD64_H
#define DEEPINFER_MXFP4_AMD64_H

#include <stdint.h>

// dst[32*b + 2*i + h] = table[scales[b]*16 + nibble h of blocks[16*b + i]]
// for b in [0, nb), i in [0, 16), h in {0 (low), 1 (high)}: table is
// mxfp4Table (256 scales x 16 BF16 values).
void di_widen_mxfp4_avx512(uint16_t *dst, const uint8_t *blocks, const uint8_t *scales, int64_t nb,
                           const uint16_t *table);
// The same with split the table's low bytes and high bytes, 32 bytes a
// scale (mxfp4Split).
void di_widen_mxfp4_avx2(uint16_t *dst, const uint8_t *blocks, const uint8_t *scales, int64_t nb,
                         const uint8_t *split);

// out[j] = sum_kk x[kk] * w[j][kk] for j in [0, n), w[j] the MXFP4 row of
// k/2 bytes blocks + j*k/2 and k/32 scales scales + j*k/32 (k a multiple of
// 32), its values table_f32[scale*16 + code] (mxfp4TableF32), reduced in
// the canonical order of LinearF32.
void di_gemv_mxfp4_avx512(float *out, const float *x, const uint8_t *blocks, const uint8_t *scales, int64_t n,
                          int64_t k, const float *table_f32);
// The same on AVX2 + FMA, the canonical accumulator as two ymm registers.
void di_gemv_mxfp4_avx2(float *out, const float *x, const uint8_t *blocks, const uint8_t *scales, int64_t n,
                        int64_t k, const float *table_f32);

#endif
