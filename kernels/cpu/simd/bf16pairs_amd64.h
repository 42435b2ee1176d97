// The C kernels of LinearBF16Pairs (bf16pairs.go).
#ifndef DEEPINFER_BF16PAIRS_AMD64_H
#define DEEPINFER_BF16PAIRS_AMD64_H

#include <stdint.h>

// out[i*ldo + j] = LinearBF16Pairs' dot product of bfloat16 activation row
// i (x + i*k) with bfloat16 weight row j (w + j*k), i in [0,m), j in
// [0,ncols). Needs AVX-512 F/BW/VL/DQ and AVX512_BF16.
void di_linear_bf16pairs_avx512(float *out, int64_t ldo, const uint16_t *x, const uint16_t *w, int64_t m,
                                int64_t k, int64_t ncols);

// di_linear_bf16pairs_avx512's products with float32 FMAs under MXCSR's
// DAZ and FTZ (restored before it returns): the same bits on AVX2 + FMA.
// Returns 0, or -1 when its per-thread buffers could not be allocated.
int di_linear_bf16pairs_avx2(float *out, int64_t ldo, const uint16_t *x, const uint16_t *w, int64_t m, int64_t k,
                             int64_t ncols);

#endif
