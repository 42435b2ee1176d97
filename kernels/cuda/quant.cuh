// quant.cuh: what quant.cu (block-quantized weights: GEMV, dequantization,
// the linear, logits and embedding entry points) shares with quant_moe.cu
// (the expert MLP over block-quantized experts). Not part of the ABI.
//
// A weight is a [rows, k] matrix (stacked experts [experts, n, k] are rows
// = experts * n) whose rows may differ in format (a fused Q4_K_M weight
// mixes Q4_K and Q6_K rows): di_quant_weight's table gives each row's byte
// offset and format (ggml's numbering, di_quant_type), and the row's bytes
// are in the device layout that deepinfer_cuda.h describes (16-byte
// aligned; Q8_0, Q4_0 and Q6_K with their f16 scales moved behind the
// row's blocks).
#pragma once

#include "common.cuh"

// di_quantw is di_quant_weight with typed pointers.
struct di_quantw {
	const uint8_t *data;
	const unsigned long long *rows; // row r: byte offset from data | format << 56
	int format;                     // every row's format, or 0 when they differ
};

#define DI_QROW_OFF ((1ull << 56) - 1)

// di_qrow returns matrix row r's bytes and its format.
__device__ __forceinline__ const uint8_t *di_qrow(const di_quantw &w, size_t r, int &fmt) {
	const unsigned long long d = __ldg(w.rows + r);
	fmt = (int)(d >> 56);
	return w.data + (d & DI_QROW_OFF);
}

// DI_QUANT_GEMV_ROWS: Linear's automatic path takes the GEMV up to this
// many rows and the dequantize-and-cuBLAS GEMM above. The GEMV reads the
// weights once per row (its time grows linearly with the rows); on an H200
// (BenchmarkQuantKernels, 8192x2048 and 2048x8192) one row takes 12-24 us,
// four 37-74 us, and the GEMM 34-45 us at any row count up to 64: Q8_0 and
// Q4_0 break even near 2 rows, the K-quants near 4.
#define DI_QUANT_GEMV_ROWS 2

// di_quant_gemv computes out[r, j] = x(r) . W[e][j] (+ bias[j]) for the rows
// of each expert e (offsets set: rows offsets[e] .. offsets[e+1] of out,
// experts grid rows; offsets null: rows 0 .. m of the one matrix) with
// float32 x; x(r) is x[order[r] / div] when order is set, else x[r]. x is
// 16-byte aligned, k a multiple of every row's block size. Launched with
// programmatic dependent launch when pdl is set (the Linear path), plainly
// otherwise. Numerics: one warp a column; lane l takes the column's
// 32- or 64-weight units l, l + 32, ... in ascending order, widening each
// unit's weights in registers: Q8_0, Q4_0 and Q6_K sum q * x over a group
// of 32 (16 for Q6_K) weights in column order and add the group's sum
// times its scale (Q6_K's d * sc rounded as dequantize_row_q6_K rounds
// it); Q4_K and Q5_K form each weight as fma(d * sc, q, -(dmin * m)) (one
// rounding where dequantize_row_* rounds twice: within one float32 ulp of
// |d sc q| of the CPU's weight) and accumulate its product in column
// order. Lanes are added in a fixed xor tree. A row's bits depend on its
// own x, the column and k alone: not on the other rows, on m, nor on the
// expert batch it came in.
int di_quant_gemv(di_ctx *ctx, float *out, const float *x, const int *order, int div, const di_quantw &w,
                  const float *bias, const int *offsets, int m, int n, int k, int experts, bool pdl);

// di_quant_weight_of checks the ABI's description of a weight (op names the
// operation in the error) and fills w.
int di_quant_weight_of(di_ctx *ctx, const char *op, const di_quant_weight *src, di_quantw *w);
