// fp8.cuh: what fp8.cu (FP8 weight GEMV, activation quantization, FP8
// tensor-core GEMM, dequantization, the linear entry point) shares with
// fp8_moe.cu (the FP8 expert MLP). Not part of the ABI.
#pragma once

#include "common.cuh"

// di_fp8w is an FP8 block-scaled weight on the device (di_fp8_weight with
// typed pointers): element (r, c) of the [rows, k] matrix is
// e4m3(data[r*k + c]) * scales[scale_row[r] * scale_cols + (c >> bk_shift)].
// For stacked experts, rows = experts * n and expert e's matrix starts at
// row e * n.
struct di_fp8w {
	const uint8_t *data;
	const float *scales;
	const int *scale_row;
	int scale_cols; // ceil(k / block_k)
	int bk_shift;   // log2(block_k), block_k >= 16
	const float *lt_scales; // di_fp8_weight.lt_scales (null: none)
	int lt_ld;
};

// di_e4m3x2_to_h2 widens the two E4M3 values in the low 16 bits of v (the
// lower byte first) to a half2 in mma.sync's register order (the first value
// in the low half): exact, E4M3 being a subset of half.
__device__ __forceinline__ unsigned di_e4m3x2_to_h2(unsigned v) {
	const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
	return (unsigned)h.x | ((unsigned)h.y << 16);
}

// di_e4m3x4_to_h2x2 widens the four E4M3 values of v (bytes 0..3) to two
// half2 in the same order: lo holds bytes 0 and 1, hi bytes 2 and 3. On
// sm_89+ two cvt instructions, with no repacking.
__device__ __forceinline__ void di_e4m3x4_to_h2x2(unsigned v, unsigned &lo, unsigned &hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
	asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\tcvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
	    : "=r"(lo), "=r"(hi)
	    : "r"(v));
#else
	lo = di_e4m3x2_to_h2(v);
	hi = di_e4m3x2_to_h2(v >> 16);
#endif
}

// DI_FP8_GROUP is the activation group of the tensor-core GEMM: activations
// are quantized per row and DI_FP8_GROUP columns, and the GEMM promotes its
// partial sums to float32 once per DI_FP8_GROUP columns of k.
#define DI_FP8_GROUP 128

// di_fp8_gemv computes out[r, j] = x(r) . W[e][j] (+ bias[j]) for the rows
// of each expert e (offsets set: rows offsets[e] .. offsets[e+1] of out,
// experts grid rows; offsets null: rows 0 .. m of the one matrix) with
// float32 x; x(r) is x[order[r] / div] when order is set, else x[r]. k is a
// multiple of 16 and x, w.data 16-byte aligned. Launched with programmatic
// dependent launch when pdl is set (the Linear path), plainly otherwise.
// Numerics: each lane sums its 16-weight chunks (a chunk's 16 products in
// float32 in column order, times the chunk's block scale, added to the
// lane's sum), lanes and warps are added in a fixed tree that depends on k
// only: a row's bits do not depend on the other rows, on m, nor on which
// expert batch it came in.
int di_fp8_gemv(di_ctx *ctx, float *out, const float *x, const int *order, int div, const di_fp8w &w,
                const float *bias, const int *offsets, int m, int n, int k, int experts, bool pdl);

// di_fp8_quant quantizes rows of float32 x to E4M3 per group of
// DI_FP8_GROUP columns: s = amax / 448 (1 for an all-zero group), q =
// e4m3(x / s) rounded to nearest even (saturating; |x / s| <= 448 anyway),
// q [rows, k] bytes, qs [rows, ceil(k / DI_FP8_GROUP)] the s values (with
// group_major: [ceil(k / DI_FP8_GROUP), rows], cuBLASLt's layout of 1x128
// scales). Row r reads x[order[r] / div] when order is set. k is a
// multiple of 16. rows_pad > rows writes rows_pad rows, the ones past rows
// as zeros (q 0, s 1), and lays qs out with rows_pad rows.
int di_fp8_quant(di_ctx *ctx, uint8_t *q, float *qs, const float *x, const int *order, int div, int rows, int k,
                 bool group_major = false, int rows_pad = 0);

// di_fp8_gemm_ok reports whether the tensor-core GEMM serves the weight
// (block_k >= DI_FP8_GROUP, so that a 128-column k tile has one weight
// scale a row) and k (a multiple of 16).
bool di_fp8_gemm_ok(const di_fp8w &w, int k);

// di_fp8_gemm computes out = dequant(aq, as) . W^T (+ bias) on tensor cores
// (mma.sync m16n8k32 e4m3, float32 accumulation of each 128-column k tile,
// promoted as acc += partial * (a_scale * w_scale)). aq, as: di_fp8_quant's
// output. offsets set: expert e's rows offsets[e] .. offsets[e+1] against
// W[e], with max_rows bounding every expert's count (the grid); offsets
// null: rows 0 .. max_rows against the one matrix. Every output element is
// a fixed-order sum over k tiles: its bits do not depend on the other rows.
int di_fp8_gemm(di_ctx *ctx, float *out, const uint8_t *aq, const float *as, const di_fp8w &w, const float *bias,
                const int *offsets, int max_rows, int n, int k, int experts);
