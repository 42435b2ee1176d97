// moe.cu: MoE routing (softmax or sigmoid scoring; greedy, group-limited
// greedy and noaux_tc top-k) and the grouped expert MLP.
//
// Routing is one thread per token and follows kernels/cpu's router step by
// step (float64 softmax, ties to the lower index, masked groups scoring 0),
// so both backends choose the same experts.
//
// The expert MLP copies the routing ids to the host (one small transfer and
// a wait), groups the (token, k) pairs by expert there, then runs one gather,
// two cuBLAS GEMMs per selected expert, SiLU-mul, and a combine kernel that
// sums the k outputs of each token in k order. The wait makes it unfit for
// CUDA Graph capture; a device-side grouping is later work.
#include <math_constants.h>

#include <vector>

#include "common.cuh"

#define ROUTE_MAX_EXPERTS 512
#define ROUTE_MAX_GROUPS 64

__device__ __forceinline__ int di_argmax_free(const float *v, const bool *taken, int n) {
	int best = -1;
	for (int i = 0; i < n; i++)
		if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
	return best;
}

__global__ void di_moe_route_k(int *ids, float *weights, const float *logits, const float *bias, int num_tokens, int e,
                               int top_k, int scoring, int method, int num_groups, int topk_groups, int norm_topk,
                               float scaling) {
	const int t = blockIdx.x * blockDim.x + threadIdx.x;
	if (t >= num_tokens) return;
	float sc[ROUTE_MAX_EXPERTS], ch[ROUTE_MAX_EXPERTS], g[ROUTE_MAX_GROUPS];
	bool taken[ROUTE_MAX_EXPERTS];
	const float *lg = logits + (size_t)t * e;
	if (scoring == DI_SCORING_SOFTMAX) {
		float m = -CUDART_INF_F;
		for (int i = 0; i < e; i++) m = fmaxf(m, lg[i]);
		double sum = 0;
		for (int i = 0; i < e; i++) {
			double x = exp((double)(lg[i] - m));
			sc[i] = (float)x;
			sum += x;
		}
		for (int i = 0; i < e; i++) sc[i] = (float)((double)sc[i] / sum);
	} else {
		for (int i = 0; i < e; i++) sc[i] = (float)(1.0 / (1.0 + exp(-(double)lg[i])));
	}
	for (int i = 0; i < e; i++) ch[i] = bias ? sc[i] + bias[i] : sc[i];
	if (method != DI_TOPK_GREEDY) {
		const int size = e / num_groups;
		for (int gi = 0; gi < num_groups; gi++) {
			const float *part = ch + gi * size;
			if (method == DI_TOPK_GROUP_LIMITED) {
				float best = part[0];
				for (int j = 1; j < size; j++) best = fmaxf(best, part[j]);
				g[gi] = best;
			} else { // sum of the two best
				float a = -CUDART_INF_F, b = -CUDART_INF_F;
				for (int j = 0; j < size; j++) {
					const float x = part[j];
					if (x > a) {
						b = a;
						a = x;
					} else if (x > b) {
						b = x;
					}
				}
				g[gi] = a + b;
			}
		}
		for (int gi = 0; gi < num_groups; gi++) taken[gi] = false;
		for (int k = 0; k < topk_groups; k++) taken[di_argmax_free(g, taken, num_groups)] = true;
		for (int gi = 0; gi < num_groups; gi++)
			if (!taken[gi])
				for (int j = 0; j < size; j++) ch[gi * size + j] = 0.f;
	}
	for (int i = 0; i < e; i++) taken[i] = false;
	int *id = ids + (size_t)t * top_k;
	float *w = weights + (size_t)t * top_k;
	float sum = 0.f;
	for (int k = 0; k < top_k; k++) {
		const int i = di_argmax_free(ch, taken, e);
		taken[i] = true;
		id[k] = i;
		w[k] = sc[i];
		sum += sc[i];
	}
	if (norm_topk) {
		const float d = sum + 1e-20f;
		for (int k = 0; k < top_k; k++) w[k] /= d;
	}
	for (int k = 0; k < top_k; k++) w[k] *= scaling;
}

extern "C" int di_op_moe_route(di_ctx *ctx, di_dptr ids, di_dptr weights, di_dptr logits, di_dptr bias,
                               int num_tokens, int num_experts, int top_k, int scoring, int method, int num_groups,
                               int topk_groups, int norm_topk_prob, float scaling_factor) {
	if (num_tokens == 0) return DI_OK;
	if (num_experts > ROUTE_MAX_EXPERTS || num_groups > ROUTE_MAX_GROUPS)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "moe_route: %d experts in %d groups, at most %d in %d", num_experts,
		               num_groups, ROUTE_MAX_EXPERTS, ROUTE_MAX_GROUPS);
	const int threads = 64;
	di_moe_route_k<<<(num_tokens + threads - 1) / threads, threads, 0, ctx->stream>>>(
	    DI_PTR(int, ids), DI_PTR(float, weights), DI_PTR(const float, logits), DI_PTR(const float, bias), num_tokens,
	    num_experts, top_k, scoring, method, num_groups, topk_groups, norm_topk_prob, scaling_factor);
	return di_check_launch(ctx, "moe_route");
}

// ---------------------------------------------------------------- expert MLP

// to_gemm writes v in T, and the remainder v - T(v) into lo when lo is set
// (DI_GEMM_SPLIT).
template <typename T> __device__ __forceinline__ void di_to_gemm(T *hi, T *lo, size_t i, float v) {
	const T h = di_from_f32<T>(v);
	hi[i] = h;
	if (lo) lo[i] = di_from_f32<T>(v - di_to_f32(h));
}

// gather: xe[r] = x[pair[r] / top_k] in the GEMM dtype.
template <typename T>
__global__ void di_moe_gather_k(T *xe, T *xe_lo, const float *x, const int *pairs, int top_k, int hidden) {
	const int r = blockIdx.x;
	const float *src = x + (size_t)(pairs[r] / top_k) * hidden;
	for (int j = threadIdx.x; j < hidden; j += blockDim.x) di_to_gemm(xe, xe_lo, (size_t)r * hidden + j, src[j]);
}

// act[r, j] = silu(g[r, j]) * g[r, inter + j], in the GEMM dtype.
template <typename T> __global__ void di_moe_act_k(T *act, T *act_lo, const float *g, size_t rows, int inter) {
	const size_t total = rows * (size_t)inter;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
		const size_t r = i / inter, j = i % inter;
		const float gate = g[r * 2 * inter + j], up = g[r * 2 * inter + inter + j];
		di_to_gemm(act, act_lo, i, (float)((double)gate / (1.0 + exp(-(double)gate))) * up);
	}
}

// combine: out[t] = sum_k w[t,k] ye[row_of[t*top_k+k]], in k order.
__global__ void di_moe_combine_k(float *out, const float *ye, const int *row_of, const float *w, int top_k,
                                 int hidden) {
	const int t = blockIdx.x;
	for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
		float a = 0.f;
		for (int k = 0; k < top_k; k++) {
			const int r = row_of[t * top_k + k];
			a = fmaf(w[t * top_k + k], ye[(size_t)r * hidden + j], a);
		}
		out[(size_t)t * hidden + j] = a;
	}
}

// expert_gemms runs out[rows of e] = in[rows of e] W[e]^T for every expert
// with rows; W[e] is [n, k] at w + e*n*k.
template <typename T>
static int di_expert_gemms(di_ctx *ctx, float *out, const T *in, const T *w, int w_dtype, const std::vector<int> &count,
                           int num_experts, int n, int k) {
	for (int ex = 0; ex < num_experts; ex++) {
		const int lo = count[ex], rows = count[ex + 1] - lo;
		if (rows == 0) continue;
		int r = di_gemm(ctx, out + (size_t)lo * n, in + (size_t)lo * k, w + (size_t)ex * n * k, w_dtype, rows, n, k);
		if (r != DI_OK) return r;
	}
	return DI_OK;
}

extern "C" int di_op_moe(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, di_dptr gate_up,
                         di_dptr down, int w_dtype, int num_tokens, int top_k, int hidden, int inter,
                         int num_experts) {
	if (num_tokens == 0) return DI_OK;
	cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
	cudaStreamIsCapturing(ctx->stream, &cap);
	if (cap != cudaStreamCaptureStatusNone)
		return di_fail(ctx, DI_ERR_CAPTURING, "moe: reads the routing on the host; not capturable");
	const int pairs = num_tokens * top_k;
	std::vector<int> host_ids(pairs);
	cudaError_t e = cudaMemcpyAsync(host_ids.data(), DI_PTR(const int, ids), pairs * sizeof(int),
	                                cudaMemcpyDeviceToHost, ctx->stream);
	if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "moe: read routing ids");
	// Group pairs by expert, in pair order; row_of[pair] is the pair's row.
	std::vector<int> count(num_experts + 1, 0);
	for (int p = 0; p < pairs; p++) {
		const int x_id = host_ids[p];
		if (x_id < 0 || x_id >= num_experts)
			return di_fail(ctx, DI_ERR_OUT_OF_RANGE, "moe: ids[%d][%d] = %d, %d experts", p / top_k, p % top_k, x_id,
			               num_experts);
		count[x_id + 1]++;
	}
	for (int i = 0; i < num_experts; i++) count[i + 1] += count[i];
	std::vector<int> index(2 * pairs); // [order (pairs by expert) | row_of]
	{
		std::vector<int> next(count.begin(), count.end() - 1);
		for (int p = 0; p < pairs; p++) {
			const int r = next[host_ids[p]]++;
			index[r] = p;
			index[pairs + p] = r;
		}
	}
	const bool split = w_dtype != DI_F32 && ctx->gemm_mode == DI_GEMM_SPLIT;
	const size_t es = w_dtype == DI_F32 ? 4 : 2, copies = split ? 2 : 1;
	void *d_index = nullptr, *xe = nullptr, *g = nullptr, *act = nullptr, *ye = nullptr;
	int rc = di_scratch(ctx, 2 * pairs * sizeof(int), &d_index);
	if (rc == DI_OK) rc = di_scratch(ctx, copies * pairs * hidden * es, &xe);
	if (rc == DI_OK) rc = di_scratch(ctx, copies * pairs * 2 * inter * sizeof(float), &g);
	if (rc == DI_OK) rc = di_scratch(ctx, copies * pairs * inter * es, &act);
	if (rc == DI_OK) rc = di_scratch(ctx, copies * pairs * hidden * sizeof(float), &ye);
	if (rc == DI_OK) {
		e = cudaMemcpyAsync(d_index, index.data(), 2 * pairs * sizeof(int), cudaMemcpyHostToDevice, ctx->stream);
		// Wait, so that index may be freed on return whatever the copy path.
		if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
		if (e != cudaSuccess) rc = di_cuda_fail(ctx, e, "moe: upload grouping");
	}
	const int *order = (const int *)d_index, *row_of = order + pairs;
	auto run = [&]() -> int {
		DI_DISPATCH_WEIGHT(w_dtype, T, {
			T *xh = (T *)xe, *xl = split ? xh + (size_t)pairs * hidden : nullptr;
			T *ah = (T *)act, *al = split ? ah + (size_t)pairs * inter : nullptr;
			float *gh = (float *)g, *gl = gh + (size_t)pairs * 2 * inter;
			float *yh = (float *)ye, *yl = yh + (size_t)pairs * hidden;
			const T *wg = DI_PTR(const T, gate_up), *wd = DI_PTR(const T, down);
			di_moe_gather_k<T><<<pairs, 256, 0, ctx->stream>>>(xh, xl, DI_PTR(const float, x), order, top_k, hidden);
			int r = di_check_launch(ctx, "moe: gather");
			if (r == DI_OK) r = di_expert_gemms(ctx, gh, xh, wg, w_dtype, count, num_experts, 2 * inter, hidden);
			if (r == DI_OK && split) r = di_expert_gemms(ctx, gl, xl, wg, w_dtype, count, num_experts, 2 * inter, hidden);
			if (r == DI_OK && split) r = di_add_into(ctx, gh, gl, nullptr, pairs, 2 * inter);
			if (r != DI_OK) return r;
			di_moe_act_k<T><<<di_grid((size_t)pairs * inter, 256), 256, 0, ctx->stream>>>(ah, al, gh, pairs, inter);
			r = di_check_launch(ctx, "moe: silu_mul");
			if (r == DI_OK) r = di_expert_gemms(ctx, yh, ah, wd, w_dtype, count, num_experts, hidden, inter);
			if (r == DI_OK && split) r = di_expert_gemms(ctx, yl, al, wd, w_dtype, count, num_experts, hidden, inter);
			if (r == DI_OK && split) r = di_add_into(ctx, yh, yl, nullptr, pairs, hidden);
			if (r != DI_OK) return r;
		});
		di_moe_combine_k<<<num_tokens, 256, 0, ctx->stream>>>(DI_PTR(float, out), (const float *)ye, row_of,
		                                                     DI_PTR(const float, weights), top_k, hidden);
		return di_check_launch(ctx, "moe: combine");
	};
	if (rc == DI_OK) rc = run();
	di_scratch_free(ctx, ye);
	di_scratch_free(ctx, act);
	di_scratch_free(ctx, g);
	di_scratch_free(ctx, xe);
	di_scratch_free(ctx, d_index);
	return rc;
}
