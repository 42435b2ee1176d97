// quant_moe.cu: the expert MLP over block-quantized expert weights (the
// MoE of kernels.Ops with weights built by kernels.QuantWeighter).
//
// One path, the device one of moe.cu and fp8_moe.cu, for every batch: the
// (token, k) pairs of a chunk of tokens (at most QUANT_MOE_PAIRS pairs) are
// grouped by expert on the device (di_moe_group), the gate/up and down
// projections are grouped GEMVs over every expert (di_quant_gemv with the
// expert offsets: each expert's blocks widened in registers, read once per
// 8 of its rows, x gathered through the grouping), SiLU-mul in float32
// between them, and a combine sums each token's k outputs in k order. No
// host wait, so it can be captured. Long prefills run chunk after chunk,
// each reading its experts' weights again: correct, not tuned (a grouped
// GEMM would read them once per chunk).
// Numerics: those of di_quant_gemv; every output element is a fixed-order
// sum over its own token's values, so a token's bits do not depend on the
// batch.
#include <algorithm>

#include "moe.cuh"
#include "quant.cuh"

#define QUANT_MOE_PAIRS 1024

extern "C" int di_op_quant_moe(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights,
                               const di_quant_weight *gate_up, const di_quant_weight *down, int num_tokens, int top_k,
                               int hidden, int inter, int num_experts) {
	di_quantw gu, dn;
	int rc = di_quant_weight_of(ctx, "quant moe: gate_up", gate_up, &gu);
	if (rc == DI_OK) rc = di_quant_weight_of(ctx, "quant moe: down", down, &dn);
	if (rc != DI_OK || num_tokens == 0) return rc;
	if (top_k <= 0 || num_experts <= 0 || hidden % 32 != 0 || inter % 32 != 0 || (x % 16) != 0)
		return di_fail(ctx, DI_ERR_UNSUPPORTED,
		               "quant moe: top_k %d, %d experts, hidden %d and intermediate %d (multiples of 32) with 16-byte "
		               "aligned x",
		               top_k, num_experts, hidden, inter);
	const int chunk = std::max(1, QUANT_MOE_PAIRS / top_k);
	const size_t cpairs = (size_t)std::min(chunk, num_tokens) * top_k;
	if ((cpairs + num_experts + 1) * sizeof(int) > 48 * 1024)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "quant moe: %zu pairs over %d experts do not fit the device grouping",
		               cpairs, num_experts);
	void *d_index = nullptr, *g = nullptr, *act = nullptr, *ye = nullptr;
	// [offsets (num_experts + 1) | order (pairs) | row_of (pairs)]
	rc = di_scratch(ctx, (num_experts + 1 + 2 * cpairs) * sizeof(int), &d_index);
	if (rc == DI_OK) rc = di_scratch(ctx, cpairs * 2 * inter * sizeof(float), &g);
	if (rc == DI_OK) rc = di_scratch(ctx, cpairs * inter * sizeof(float), &act);
	if (rc == DI_OK) rc = di_scratch(ctx, cpairs * hidden * sizeof(float), &ye);
	int *offsets = (int *)d_index, *order = offsets + num_experts + 1, *row_of = order + cpairs;
	float *gh = (float *)g, *ah = (float *)act, *yh = (float *)ye;
	const float *xs = DI_PTR(const float, x), *ws = DI_PTR(const float, weights);
	const int *is = DI_PTR(const int, ids);
	float *os = DI_PTR(float, out);
	for (int t0 = 0; rc == DI_OK && t0 < num_tokens; t0 += chunk) {
		const int nt = std::min(chunk, num_tokens - t0);
		const int pairs = nt * top_k;
		rc = di_moe_group(ctx, offsets, order, row_of, is + (size_t)t0 * top_k, pairs, num_experts, "quant moe: group");
		if (rc == DI_OK)
			rc = di_quant_gemv(ctx, gh, xs + (size_t)t0 * hidden, order, top_k, gu, nullptr, offsets, 0, 2 * inter,
			                   hidden, num_experts, false);
		if (rc == DI_OK) rc = di_moe_act_f32(ctx, ah, gh, (size_t)pairs, inter, "quant moe: silu_mul");
		if (rc == DI_OK)
			rc = di_quant_gemv(ctx, yh, ah, nullptr, 1, dn, nullptr, offsets, 0, hidden, inter, num_experts, false);
		if (rc == DI_OK)
			rc = di_moe_combine(ctx, os + (size_t)t0 * hidden, yh, row_of, ws + (size_t)t0 * top_k, nt, top_k, hidden,
			                    "quant moe: combine");
	}
	di_scratch_free(ctx, ye);
	di_scratch_free(ctx, act);
	di_scratch_free(ctx, g);
	di_scratch_free(ctx, d_index);
	return rc;
}
