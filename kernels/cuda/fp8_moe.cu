// fp8_moe.cu: the expert MLP over FP8 block-scaled expert weights (the MoE
// of kernels.Ops with weights built by kernels.FP8Weighter).
//
// Two paths, as moe.cu's:
//   - device (up to FP8_MOE_DEVICE_PAIRS (token, k) pairs, every decode
//     batch, and always while a graph is captured): the pairs are grouped
//     by expert on the device (one block, a stable counting sort), the
//     gate/up and down projections are grouped FP8 GEMVs over every expert
//     (di_fp8_gemv with the expert offsets: each expert's weights read once
//     per 8 of its rows, x gathered through the grouping), SiLU-mul in
//     float32 between them, and a combine that sums each token's k outputs
//     in k order. No host wait.
//   - host (larger batches, prefill; block_k >= 128): the routing ids are
//     copied to the host and grouped there (one small copy and a wait), the
//     gathered rows are quantized per 128 columns (di_fp8_quant) and both
//     projections run as one grouped tensor-core GEMM launch each
//     (di_fp8_gemm over the experts' offsets).
// Numerics: those of fp8.cu's GEMV and GEMM; every output element is a
// fixed-order sum over its own token's values (batch-invariant on either
// path; the two paths differ by the activations' rounding).
#include <vector>

#include "fp8.cuh"
#include "moe.cuh"

#define FP8_MOE_DEVICE_PAIRS 1024

// fp8_moe_run runs both projections and the combine once the grouping
// (offsets, order, row_of on the device) exists. gemm: the host path's
// tensor-core GEMMs (max_rows: the largest expert's row count), else the
// GEMVs.
static int fp8_moe_run(di_ctx *ctx, float *out, const float *x, const float *weights, const di_fp8w &gu,
                       const di_fp8w &dn, const int *offsets, const int *order, const int *row_of, int num_tokens,
                       int top_k, int hidden, int inter, int num_experts, bool gemm, int max_rows) {
	const size_t pairs = (size_t)num_tokens * top_k;
	void *g = nullptr, *act = nullptr, *ye = nullptr, *q = nullptr;
	int rc = di_scratch(ctx, pairs * 2 * inter * sizeof(float), &g);
	if (rc == DI_OK) rc = di_scratch(ctx, pairs * inter * sizeof(float), &act);
	if (rc == DI_OK) rc = di_scratch(ctx, pairs * hidden * sizeof(float), &ye);
	const int kmax = hidden > inter ? hidden : inter;
	const size_t qbytes = (pairs * kmax + 15) & ~(size_t)15;
	if (rc == DI_OK && gemm)
		rc = di_scratch(ctx, qbytes + pairs * ((kmax + DI_FP8_GROUP - 1) / DI_FP8_GROUP) * sizeof(float), &q);
	float *gh = (float *)g, *ah = (float *)act, *yh = (float *)ye;
	uint8_t *qa = (uint8_t *)q;
	float *qs = (float *)(qa + qbytes);
	if (rc == DI_OK) {
		if (gemm) {
			rc = di_fp8_quant(ctx, qa, qs, x, order, top_k, (int)pairs, hidden);
			if (rc == DI_OK) rc = di_fp8_gemm(ctx, gh, qa, qs, gu, nullptr, offsets, max_rows, 2 * inter, hidden, num_experts);
		} else {
			rc = di_fp8_gemv(ctx, gh, x, order, top_k, gu, nullptr, offsets, 0, 2 * inter, hidden, num_experts, false);
		}
	}
	if (rc == DI_OK) {
		rc = di_moe_act_f32(ctx, ah, gh, pairs, inter, "fp8 moe: silu_mul");
	}
	if (rc == DI_OK) {
		if (gemm) {
			rc = di_fp8_quant(ctx, qa, qs, ah, nullptr, 1, (int)pairs, inter);
			if (rc == DI_OK) rc = di_fp8_gemm(ctx, yh, qa, qs, dn, nullptr, offsets, max_rows, hidden, inter, num_experts);
		} else {
			rc = di_fp8_gemv(ctx, yh, ah, nullptr, 1, dn, nullptr, offsets, 0, hidden, inter, num_experts, false);
		}
	}
	if (rc == DI_OK)
		rc = di_moe_combine(ctx, out, yh, row_of, weights, num_tokens, top_k, hidden, "fp8 moe: combine");
	if (q) di_scratch_free(ctx, q);
	di_scratch_free(ctx, ye);
	di_scratch_free(ctx, act);
	di_scratch_free(ctx, g);
	return rc;
}

static int fp8_weight_of(di_ctx *ctx, const char *name, const di_fp8_weight *src, di_fp8w *w) {
	if (!src || !src->data || !src->scales || !src->scale_row || src->scale_cols <= 0 || src->block_k < 16 ||
	    (src->block_k & (src->block_k - 1)) != 0)
		return di_fail(ctx, DI_ERR_INVALID, "fp8 moe: %s: missing pointers or block_k %d not a power of two >= 16", name,
		               src ? src->block_k : 0);
	w->data = DI_PTR(const uint8_t, src->data);
	w->scales = DI_PTR(const float, src->scales);
	w->scale_row = DI_PTR(const int, src->scale_row);
	w->scale_cols = src->scale_cols;
	w->bk_shift = __builtin_ctz((unsigned)src->block_k);
	return DI_OK;
}

extern "C" int di_op_fp8_moe(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights,
                             const di_fp8_weight *gate_up, const di_fp8_weight *down, int num_tokens, int top_k,
                             int hidden, int inter, int num_experts, int path) {
	di_fp8w gu, dn;
	int rc = fp8_weight_of(ctx, "gate_up", gate_up, &gu);
	if (rc == DI_OK) rc = fp8_weight_of(ctx, "down", down, &dn);
	if (rc != DI_OK || num_tokens == 0) return rc;
	if (hidden % 16 != 0 || inter % 16 != 0 || (x % 16) != 0 || (gate_up->data % 16) != 0 || (down->data % 16) != 0)
		return di_fail(ctx, DI_ERR_UNSUPPORTED,
		               "fp8 moe: hidden %d and intermediate %d must be multiples of 16 with 16-byte aligned x and weights",
		               hidden, inter);
	cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
	cudaStreamIsCapturing(ctx->stream, &cap);
	const bool capturing = cap != cudaStreamCaptureStatusNone;
	const size_t pairs = (size_t)num_tokens * top_k;
	const bool gemm_ok = di_fp8_gemm_ok(gu, hidden) && di_fp8_gemm_ok(dn, inter);
	const bool device_fits = (pairs + num_experts + 1) * sizeof(int) <= 48 * 1024;
	bool host = !capturing && (path == DI_FP8_GEMM || (path == DI_FP8_AUTO && pairs > FP8_MOE_DEVICE_PAIRS && gemm_ok) ||
	                           (path == DI_FP8_AUTO && !device_fits));
	if (path == DI_FP8_GEMM && (capturing || !gemm_ok))
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8 moe: the GEMM path needs block_k >= %d and no graph capture",
		               DI_FP8_GROUP);
	if (host && !gemm_ok)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8 moe: %zu pairs need the GEMM path, which needs block_k >= %d",
		               pairs, DI_FP8_GROUP);
	if (!host && !device_fits)
		return di_fail(ctx, capturing ? DI_ERR_CAPTURING : DI_ERR_UNSUPPORTED,
		               "fp8 moe: %zu pairs over %d experts do not fit the device grouping (at most %d)", pairs,
		               num_experts, (int)(48 * 1024 / sizeof(int)) - num_experts - 1);
	void *d_index = nullptr;
	// [offsets (num_experts + 1) | order (pairs) | row_of (pairs)]
	rc = di_scratch(ctx, (num_experts + 1 + 2 * pairs) * sizeof(int), &d_index);
	if (rc != DI_OK) return rc;
	int *offsets = (int *)d_index, *order = offsets + num_experts + 1, *row_of = order + pairs;
	int max_rows = 0;
	if (!host) {
		rc = di_moe_group(ctx, offsets, order, row_of, DI_PTR(const int, ids), (int)pairs, num_experts,
		                  "fp8 moe: group");
	} else {
		std::vector<int> host_ids(pairs);
		cudaError_t e = cudaMemcpyAsync(host_ids.data(), DI_PTR(const int, ids), pairs * sizeof(int),
		                                cudaMemcpyDeviceToHost, ctx->stream);
		if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
		if (e != cudaSuccess) rc = di_cuda_fail(ctx, e, "fp8 moe: read routing ids");
		std::vector<int> index(num_experts + 1 + 2 * pairs, 0);
		for (size_t p = 0; rc == DI_OK && p < pairs; p++) {
			const int id = host_ids[p];
			if (id < 0 || id >= num_experts)
				rc = di_fail(ctx, DI_ERR_OUT_OF_RANGE, "fp8 moe: ids[%zu][%zu] = %d, %d experts", p / top_k, p % top_k,
				             id, num_experts);
			else
				index[id + 1]++;
		}
		if (rc == DI_OK) {
			for (int i = 0; i < num_experts; i++) {
				max_rows = index[i + 1] > max_rows ? index[i + 1] : max_rows;
				index[i + 1] += index[i];
			}
			std::vector<int> next(index.begin(), index.begin() + num_experts);
			int *ord = index.data() + num_experts + 1, *rof = ord + pairs;
			for (size_t p = 0; p < pairs; p++) {
				const int r = next[host_ids[p]]++;
				ord[r] = (int)p;
				rof[p] = r;
			}
			e = cudaMemcpyAsync(d_index, index.data(), index.size() * sizeof(int), cudaMemcpyHostToDevice, ctx->stream);
			// Wait, so that index may be freed on return whatever the copy path.
			if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
			if (e != cudaSuccess) rc = di_cuda_fail(ctx, e, "fp8 moe: upload grouping");
		}
	}
	if (rc == DI_OK)
		rc = fp8_moe_run(ctx, DI_PTR(float, out), DI_PTR(const float, x), DI_PTR(const float, weights), gu, dn, offsets,
		                 order, row_of, num_tokens, top_k, hidden, inter, num_experts, host, max_rows);
	di_scratch_free(ctx, d_index);
	return rc;
}
