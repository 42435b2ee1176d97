// moe.cu: MoE routing (softmax or sigmoid scoring; greedy, group-limited
// greedy and noaux_tc top-k) and the grouped expert MLP.
//
// Routing is one warp per token and follows kernels/cpu's router step by
// step (float64 softmax summed in expert order, ties to the lower index,
// masked groups scoring 0), so both backends choose the same experts.
//
// The expert MLP has two paths. Up to MOE_DEVICE_MAX_PAIRS (token, k) pairs
// (every decode batch), and always while a CUDA graph is captured, it never
// waits for the host: one block groups the pairs by expert on the device (a
// stable counting sort into buffers sized from num_tokens * top_k), then a
// grouped projection launched over every expert reads each expert's row
// count on the device (experts without rows return at once), SiLU-mul, a
// second grouped projection, and a combine kernel that sums the k outputs of
// each token in k order. A projection of 16-bit weights with k a multiple
// of 32 runs on tensor cores (di_moe_mma_k), the others as a GEMV on CUDA
// cores (di_moe_gemv_k); 16-bit inputs are rounded once before either.
// Where both projections would run on di_moe_mma_k (16-bit experts without
// gpt-oss's extras, hidden and intermediate multiples of 32: every decode
// batch of DeepSeek's MoE), the decode path (moe_dec) runs the same sums in
// four launches instead of six: the grouping and the rounding of x in one
// kernel, the gate/up projection with the SiLU-mul in its epilogue, the down
// projection (both di_moe_dec_k: blocks for the experts with rows only,
// weights streamed through a copy ring), the combine; all four start with
// programmatic dependent launch.
// Every output element is a fixed-order dot product, so a token's result
// does not depend on the other tokens (batch-invariant).
// Larger batches of 16-bit experts stay on the device too: the grouping
// runs over segments of pairs in three launches, then up to
// ctx->moe_gemm_pairs pairs (2048 by default) the same grouped projections,
// and from there (prefill) each projection is one grouped tensor-core GEMM
// launch over a grid that does not depend on the routing, so the whole MoE
// is capturable at any batch size: by default di_moe_wg_k on sm_90a builds
// (moe_wgmma.cuh: wgmma, tiles of 256 weight rows by 128 rows of one
// expert, the SiLU-mul fused into the gate/up epilogue; each output summed
// in natural k order, so its rounding differs from the smaller batches'),
// else, or with ctx->moe_wg off, di_moe_gemm_k (mma.sync, 128 by 128),
// which sums every output element in di_moe_mma_k's order: the same bits at
// every batch size.
// Other larger batches (float32 experts, sizes that are not multiples of 32)
// copy the routing ids to the host (one small transfer and a wait), group
// there, and run two cuBLAS GEMMs per selected expert.
//
// gpt-oss's experts (di_op_moe_clamped_swiglu) always take the device path,
// in chunks of at most MOE_DEVICE_MAX_PAIRS pairs, over 16-bit or float32
// weights or over MXFP4 weights (di_op_moe_clamped_swiglu_mxfp4, mxfp4.cuh).
// MXFP4 has kernels of its own (di_mx_mma_k, di_mx_gemv_k: the MXFP4
// section below) that read the 4-bit codes and E8M0 scales (4.25 bits a
// weight), widen them to BF16 in registers and multiply them in the order of
// the 16-bit kernels above, so the result is that of the BF16 weights they
// widen to, bit for bit.
#include <math_constants.h>

#include <type_traits>
#include <vector>

#include "common.cuh"
#include "moe.cuh"
#include "mxfp4.cuh"

#define ROUTE_MAX_EXPERTS 512
#define ROUTE_MAX_GROUPS 64
#define MOE_DEVICE_MAX_PAIRS 1024 // larger batches: the grouped GEMM (16-bit experts) or the host path
#define MOE_WARPS 8
#define MOE_ROWS 8 // rows of one expert a warp carries at once

// di_moe_route_k routes token blockIdx.x with one warp (32 threads): the
// per-expert work (exponentials, scores, group scores) is spread over the
// lanes, and what the CPU router sums in order is summed in that order by
// lane 0 (the float64 softmax denominator, the chosen weights). A top-k pick
// is each lane's first maximum over its experts (lane + 32j, ascending), then
// a warp reduction that keeps the larger value and, on equal values, the
// lower index: the CPU's first maximum in index order. Round 13: one thread a
// token took 38 us a call at 64 experts (DeepSeek-V2-Lite, batch 1).
// Launched with programmatic dependent launch (di_launch): its launch
// overlaps the router projection's tail.
__device__ __forceinline__ void di_route_pick(float &v, int &i) {
#pragma unroll
	for (int off = 16; off > 0; off >>= 1) {
		const float ov = __shfl_xor_sync(0xffffffffu, v, off);
		const int oi = __shfl_xor_sync(0xffffffffu, i, off);
		if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
	}
}

// di_route_smem is the shared memory di_route_token takes of the warp that
// routes: ex (e doubles), sc and ch (e floats each), gs (ROUTE_MAX_GROUPS
// floats), in that order; a multiple of 8 bytes.
__host__ __device__ constexpr size_t di_route_smem(int e) {
	return (size_t)e * (sizeof(double) + 2 * sizeof(float)) + ROUTE_MAX_GROUPS * sizeof(float);
}

// di_route_token routes token t of r with the calling warp (lane: its
// lane), ex, sc, ch and gs in shared memory of its own (di_route_smem).
__device__ __forceinline__ void di_route_token(const di_moe_route_args &r, int t, int lane, double *ex, float *sc,
                                               float *ch, float *gs) {
	const int e = r.e, top_k = r.top_k, method = r.method, num_groups = r.num_groups;
	const float *lg = r.logits + (size_t)t * e;
	if (r.scoring == DI_SCORING_SOFTMAX) {
		float m = -CUDART_INF_F;
		for (int i = lane; i < e; i += 32) m = fmaxf(m, lg[i]);
#pragma unroll
		for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
		for (int i = lane; i < e; i += 32) ex[i] = exp((double)(lg[i] - m));
		__syncwarp();
		double sum = 0;
		if (lane == 0)
			for (int i = 0; i < e; i++) sum += ex[i];
		sum = __shfl_sync(0xffffffffu, sum, 0);
		for (int i = lane; i < e; i += 32) sc[i] = (float)((double)(float)ex[i] / sum);
	} else {
		for (int i = lane; i < e; i += 32) sc[i] = (float)(1.0 / (1.0 + exp(-(double)lg[i])));
	}
	for (int i = lane; i < e; i += 32) ch[i] = r.bias ? sc[i] + r.bias[i] : sc[i];
	__syncwarp();
	if (method != DI_TOPK_GREEDY) {
		const int size = e / num_groups;
		for (int gi = lane; gi < num_groups; gi += 32) {
			const float *part = ch + gi * size;
			if (method == DI_TOPK_GROUP_LIMITED) {
				float best = part[0];
				for (int j = 1; j < size; j++) best = fmaxf(best, part[j]);
				gs[gi] = best;
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
				gs[gi] = a + b;
			}
		}
		__syncwarp();
		unsigned long long kept = 0; // groups chosen (num_groups <= 64)
		for (int k = 0; k < r.topk_groups; k++) {
			float v = -CUDART_INF_F;
			int best = -1;
			for (int gi = lane; gi < num_groups; gi += 32)
				if (!(kept >> gi & 1) && (best < 0 || gs[gi] > v)) v = gs[gi], best = gi;
			di_route_pick(v, best);
			kept |= 1ull << best;
		}
		for (int i = lane; i < e; i += 32)
			if (!(kept >> (i / size) & 1)) ch[i] = 0.f;
		__syncwarp();
	}
	unsigned taken = 0; // bit j: expert lane + 32j chosen (e <= 512)
	float sum = 0.f;
	for (int k = 0; k < top_k; k++) {
		float v = -CUDART_INF_F;
		int best = -1;
		for (int j = 0, i = lane; i < e; j++, i += 32)
			if (!(taken >> j & 1) && (best < 0 || ch[i] > v)) v = ch[i], best = i;
		di_route_pick(v, best);
		if ((best & 31) == lane) taken |= 1u << (best >> 5);
		if (lane == 0) {
			r.ids[(size_t)t * top_k + k] = best;
			r.weights[(size_t)t * top_k + k] = sc[best];
			sum += sc[best];
		}
	}
	if (lane == 0) {
		float *w = r.weights + (size_t)t * top_k;
		if (r.norm_topk) {
			const float d = sum + 1e-20f;
			for (int k = 0; k < top_k; k++) w[k] /= d;
		}
		for (int k = 0; k < top_k; k++) w[k] *= r.scaling;
	}
	__syncwarp(); // the warp's shared memory may be reused by its next token
}

__global__ void __launch_bounds__(32) di_moe_route_k(di_moe_route_args r) {
	__shared__ __align__(8) unsigned char sh[di_route_smem(ROUTE_MAX_EXPERTS)];
	double *ex = (double *)sh;
	float *sc = (float *)(ex + r.e), *ch = sc + r.e, *gs = ch + r.e;
	di_pdl_wait();
	di_route_token(r, blockIdx.x, threadIdx.x, ex, sc, ch, gs);
}

// di_route_args_check validates a routing's sizes (moe_route, moe_set_route).
static int di_route_args_check(di_ctx *ctx, const di_moe_route_args &r, const char *op) {
	if (r.e > ROUTE_MAX_EXPERTS || r.num_groups > ROUTE_MAX_GROUPS)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "%s: %d experts in %d groups, at most %d in %d", op, r.e,
		               r.num_groups, ROUTE_MAX_EXPERTS, ROUTE_MAX_GROUPS);
	if (r.top_k > r.e || (r.method != DI_TOPK_GREEDY && r.topk_groups > r.num_groups))
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "%s: top_k %d of %d experts, %d of %d groups", op, r.top_k, r.e,
		               r.topk_groups, r.num_groups);
	return DI_OK;
}

// di_route_launch routes r's tokens, a warp a token.
static int di_route_launch(di_ctx *ctx, const di_moe_route_args &r) {
	if (r.num_tokens == 0) return DI_OK;
	di_launch(ctx, di_moe_route_k, dim3((unsigned)r.num_tokens), dim3(32), 0, r);
	return di_check_launch(ctx, "moe_route");
}

static di_moe_route_args di_route_args(di_dptr ids, di_dptr weights, di_dptr logits, di_dptr bias, int num_tokens,
                                       int num_experts, int top_k, int scoring, int method, int num_groups,
                                       int topk_groups, int norm_topk_prob, float scaling_factor) {
	return di_moe_route_args{DI_PTR(int, ids),   DI_PTR(float, weights), DI_PTR(const float, logits),
	                         DI_PTR(const float, bias), num_tokens, num_experts, top_k, scoring, method,
	                         num_groups,         topk_groups,           norm_topk_prob, scaling_factor};
}

extern "C" int di_op_moe_route(di_ctx *ctx, di_dptr ids, di_dptr weights, di_dptr logits, di_dptr bias,
                               int num_tokens, int num_experts, int top_k, int scoring, int method, int num_groups,
                               int topk_groups, int norm_topk_prob, float scaling_factor) {
	const di_moe_route_args r = di_route_args(ids, weights, logits, bias, num_tokens, num_experts, top_k, scoring,
	                                          method, num_groups, topk_groups, norm_topk_prob, scaling_factor);
	const int rc = di_route_args_check(ctx, r, "moe_route");
	if (rc != DI_OK) return rc;
	return di_route_launch(ctx, r);
}

// moe_set_route: the routing the next moe runs (see deepinfer_cuda.h); ids
// 0 clears it.
extern "C" int di_op_moe_set_route(di_ctx *ctx, di_dptr ids, di_dptr weights, di_dptr logits, di_dptr bias,
                                   int num_tokens, int num_experts, int top_k, int scoring, int method,
                                   int num_groups, int topk_groups, int norm_topk_prob, float scaling_factor) {
	if (ids) {
		const di_moe_route_args r = di_route_args(ids, weights, logits, bias, num_tokens, num_experts, top_k,
		                                          scoring, method, num_groups, topk_groups, norm_topk_prob,
		                                          scaling_factor);
		const int rc = di_route_args_check(ctx, r, "moe_set_route");
		if (rc != DI_OK) return rc;
		ctx->moe_route = r;
		ctx->moe_route_set = true;
		ctx->moe_route_used = false;
		return DI_OK;
	}
	const bool missed = ctx->moe_route_set && !ctx->moe_route_used;
	ctx->moe_route = {};
	ctx->moe_route_set = ctx->moe_route_used = false;
	if (missed) return di_fail(ctx, DI_ERR_INVALID, "a routing was set but no moe ran it");
	return DI_OK;
}

// ---------------------------------------------------------------- expert MLP

// to_gemm writes v in T, and the remainder v - T(v) into lo when lo is set
// (DI_GEMM_SPLIT).
template <typename T> __device__ __forceinline__ void di_to_gemm(T *hi, T *lo, size_t i, float v) {
	const T h = di_from_f32<T>(v);
	hi[i] = h;
	if (lo) lo[i] = di_from_f32<T>(v - di_to_f32(h));
}

// gather: xe[r] = x[pair[r] / top_k] in the GEMM dtype (x float32, or
// X = T: x rounded already, copied).
template <typename T, typename X>
__global__ void di_moe_gather_k(T *xe, T *xe_lo, const X *x, const int *pairs, int top_k, int hidden) {
	const int r = blockIdx.x;
	const X *src = x + (size_t)(pairs[r] / top_k) * hidden;
	for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
		if constexpr (std::is_same_v<X, T>) xe[(size_t)r * hidden + j] = src[j];
		else di_to_gemm(xe, xe_lo, (size_t)r * hidden + j, src[j]);
	}
}

// di_moe_silu_mul is silu(gate) * up: the silu in float64, rounded to
// float32, times up (the value di_moe_act_k and the grouped GEMM's epilogue
// both round to the GEMM dtype). The product is rounded on its own
// (__fmul_rn), so that no caller's split mode fuses it into the remainder's
// subtraction.
#ifndef MOE_SILU_F32
#define MOE_SILU_F32 0 // 1: a measuring build's float32 silu (other bits than the CPU backend's float64 one)
#endif
__device__ __forceinline__ float di_moe_silu_mul(float gate, float up) {
	if (MOE_SILU_F32) return __fmul_rn(gate / (1.f + expf(-gate)), up);
	return __fmul_rn((float)((double)gate / (1.0 + exp(-(double)gate))), up);
}

// act[r, j] = silu(g[r, j]) * g[r, inter + j], in the GEMM dtype.
template <typename T> __global__ void di_moe_act_k(T *act, T *act_lo, const float *g, size_t rows, int inter) {
	const size_t total = rows * (size_t)inter;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
		const size_t r = i / inter, j = i % inter;
		const float gate = g[r * 2 * inter + j], up = g[r * 2 * inter + inter + j];
		di_to_gemm(act, act_lo, i, di_moe_silu_mul(gate, up));
	}
}

// combine: out[t] = sum_k w[t,k] ye[row_of[t*top_k+k]], in k order (a
// fused multiply-add per k, from zero; a pair with row_of -1, an expert id
// out of range reported by the check word, is left out). ye's rows are
// float32, or 16-bit (Y = T: the wgmma GEMM's down projection in GEMM mode
// round, MW_Y16), widened exactly. Block (t, y) does token t's columns
// 4 (128 y + thread) .. + 3 (four of ye's values a pair: VEC, where hidden
// is a multiple of 4 and out and ye are 16-byte aligned) or column 128 y +
// thread, with the token's rows and weights staged in shared memory first,
// so that a thread's top_k loads are independent and in flight together.
// The kernel it replaced (one block a token, each thread walking its
// columns with row_of and w reloaded for every column) took 13.6 us at one
// token of V2-Lite (2048 columns, top 6) and 14.8 at 64, bound by chains of
// dependent loads. Top_k above MOE_COMBINE_MAX_K takes the rows from global
// memory.
#define MOE_COMBINE_THREADS 128
#define MOE_COMBINE_MAX_K 64

// di_load4 widens ye's four values at column 4 j of row (16-byte aligned
// float32 rows, 8-byte aligned 16-bit ones).
__device__ __forceinline__ float4 di_load4(const float *row, int j) {
	return __ldg(reinterpret_cast<const float4 *>(row) + j);
}
template <typename Y> __device__ __forceinline__ float4 di_load4(const Y *row, int j) {
	const uint2 u = __ldg(reinterpret_cast<const uint2 *>(row) + j);
	Y v[4];
	memcpy(v, &u, sizeof u);
	return make_float4(di_to_f32(v[0]), di_to_f32(v[1]), di_to_f32(v[2]), di_to_f32(v[3]));
}

template <typename Y, bool VEC>
static __global__ void __launch_bounds__(MOE_COMBINE_THREADS)
    di_moe_combine_k(float *out, const Y *ye, const int *row_of, const float *w, const float *add, int top_k,
                     int hidden) {
	__shared__ int rs[MOE_COMBINE_MAX_K];
	__shared__ float ws[MOE_COMBINE_MAX_K];
	di_pdl_wait();
	const int t = blockIdx.x;
	const bool staged = top_k <= MOE_COMBINE_MAX_K;
	if (staged) {
		for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
			rs[k] = row_of[(size_t)t * top_k + k];
			ws[k] = w[(size_t)t * top_k + k];
		}
		__syncthreads();
	}
	const int j = blockIdx.y * MOE_COMBINE_THREADS + threadIdx.x; // index of 4 values (VEC) or one
	if (VEC) {
		if (4 * j >= hidden) return;
		float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
		for (int k = 0; k < top_k; k++) {
			const int r = staged ? rs[k] : row_of[(size_t)t * top_k + k];
			if (r < 0) continue;
			const float wk = staged ? ws[k] : w[(size_t)t * top_k + k];
			const float4 v = di_load4(ye + (size_t)r * hidden, j);
			a.x = fmaf(wk, v.x, a.x);
			a.y = fmaf(wk, v.y, a.y);
			a.z = fmaf(wk, v.z, a.z);
			a.w = fmaf(wk, v.w, a.w);
		}
		if (add) { // the routed sum rounded, then the addend: MoE followed by Add
			const float4 b = __ldg(reinterpret_cast<const float4 *>(add + (size_t)t * hidden) + j);
			a.x = __fadd_rn(a.x, b.x);
			a.y = __fadd_rn(a.y, b.y);
			a.z = __fadd_rn(a.z, b.z);
			a.w = __fadd_rn(a.w, b.w);
		}
		reinterpret_cast<float4 *>(out + (size_t)t * hidden)[j] = a;
	} else {
		if (j >= hidden) return;
		float a = 0.f;
#pragma unroll 8
		for (int k = 0; k < top_k; k++) {
			const int r = staged ? rs[k] : row_of[(size_t)t * top_k + k];
			if (r < 0) continue;
			const float wk = staged ? ws[k] : w[(size_t)t * top_k + k];
			a = fmaf(wk, di_to_f32(ye[(size_t)r * hidden + j]), a);
		}
		if (add) a = __fadd_rn(a, __ldg(add + (size_t)t * hidden + j));
		out[(size_t)t * hidden + j] = a;
	}
}

template <typename Y>
static int di_moe_combine_rows(di_ctx *ctx, float *out, const Y *ye, const int *row_of, const float *w,
                               int num_tokens, int top_k, int hidden, const char *op) {
	// moe_set_add's addend: its rows line up with the rows of the out it
	// was set for (a call over a range of rows passes out at that range).
	const float *add = nullptr;
	if (ctx->moe_add) {
		add = ctx->moe_add + (out - ctx->moe_add_out);
		ctx->moe_add_used = true;
	}
	const bool vec = hidden % 4 == 0 && ((uintptr_t)out | (uintptr_t)ye | (uintptr_t)(add ? add : out)) % 16 == 0;
	const int cols = vec ? hidden / 4 : hidden;
	const dim3 grid((unsigned)num_tokens, (unsigned)((cols + MOE_COMBINE_THREADS - 1) / MOE_COMBINE_THREADS));
	if (vec)
		di_launch(ctx, di_moe_combine_k<Y, true>, grid, dim3(MOE_COMBINE_THREADS), 0, out, ye, row_of, w, add, top_k,
		          hidden);
	else
		di_launch(ctx, di_moe_combine_k<Y, false>, grid, dim3(MOE_COMBINE_THREADS), 0, out, ye, row_of, w, add, top_k,
		          hidden);
	return di_check_launch(ctx, op);
}

int di_moe_combine(di_ctx *ctx, float *out, const float *ye, const int *row_of, const float *w, int num_tokens,
                   int top_k, int hidden, const char *op) {
	return di_moe_combine_rows(ctx, out, ye, row_of, w, num_tokens, top_k, hidden, op);
}

extern "C" int di_op_moe_set_add(di_ctx *ctx, di_dptr out, di_dptr add) {
	if (add) {
		ctx->moe_add = DI_PTR(const float, add);
		ctx->moe_add_out = DI_PTR(const float, out);
		ctx->moe_add_used = false;
		return DI_OK;
	}
	const bool missed = ctx->moe_add && !ctx->moe_add_used;
	ctx->moe_add = ctx->moe_add_out = nullptr;
	ctx->moe_add_used = false;
	if (missed) return di_fail(ctx, DI_ERR_INVALID, "the addend was set but no combine pass applied it");
	return DI_OK;
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

static int moe_host(di_ctx *ctx, di_dptr out, di_dptr x, bool x16, di_dptr ids, di_dptr weights, di_dptr gate_up,
                    di_dptr down, int w_dtype, int num_tokens, int top_k, int hidden, int inter, int num_experts) {
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
			if (x16)
				di_moe_gather_k<T, T><<<pairs, 256, 0, ctx->stream>>>(xh, xl, DI_PTR(const T, x), order, top_k, hidden);
			else
				di_moe_gather_k<T, float>
				    <<<pairs, 256, 0, ctx->stream>>>(xh, xl, DI_PTR(const float, x), order, top_k, hidden);
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
		return di_moe_combine(ctx, DI_PTR(float, out), (const float *)ye, row_of, DI_PTR(const float, weights),
		                      num_tokens, top_k, hidden, "moe: combine");
	};
	if (rc == DI_OK) rc = run();
	di_scratch_free(ctx, ye);
	di_scratch_free(ctx, act);
	di_scratch_free(ctx, g);
	di_scratch_free(ctx, xe);
	di_scratch_free(ctx, d_index);
	return rc;
}

// ---------------------------------------------------------------- device path

// group: one block (di_moe_group_block, moe.cuh). offsets[e]..offsets[e+1]
// are expert e's rows; order[row] is the pair at that row (pairs of one
// expert in pair order); row_of[pair] its row, or -1 for an id outside the
// experts (which sets DI_CHECK_MOE).
static __global__ void di_moe_group_k(int *offsets, int *order, int *row_of, const int *ids, int pairs,
                                      int num_experts, unsigned *check) {
	extern __shared__ int sh[]; // di_moe_group_smem
	di_moe_group_block(sh, offsets, order, row_of, ids, pairs, num_experts, check);
}

// The grouping of larger batches: the pairs cut into segments of
// MOE_GROUP_SEG, one warp a segment (MOE_GROUP_WARPS warps a block, each
// with num_experts counters in shared memory).
#define MOE_GROUP_SEG 256
#define MOE_GROUP_WARPS 4

// count: counts[e * segs + s] = the pairs of segment s routed to expert e;
// an id outside the experts sets DI_CHECK_MOE and row_of[pair] = -1.
static __global__ void __launch_bounds__(MOE_GROUP_WARPS * 32)
    di_moe_count_k(int *counts, int *row_of, const int *ids, int pairs, int num_experts, int segs, unsigned *check) {
	extern __shared__ int cnt_sh[]; // [MOE_GROUP_WARPS][num_experts]
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = blockIdx.x * MOE_GROUP_WARPS + warp;
	int *cnt = cnt_sh + warp * num_experts;
	for (int e = lane; e < num_experts; e += 32) cnt[e] = 0;
	__syncwarp();
	if (seg >= segs) return;
	const int p1 = min(pairs, (seg + 1) * MOE_GROUP_SEG);
	for (int p = seg * MOE_GROUP_SEG + lane; p < p1; p += 32) {
		const int v = ids[p];
		if (v < 0 || v >= num_experts) {
			atomicOr(check, DI_CHECK_MOE);
			row_of[p] = -1;
		} else {
			atomicAdd(&cnt[v], 1);
		}
	}
	__syncwarp();
	for (int e = lane; e < num_experts; e += 32) counts[(size_t)e * segs + seg] = cnt[e];
}

// scan (one block): base[e * segs + s] becomes the pairs of expert e in the
// segments before s (a warp an expert), offsets[e] the pairs of the experts
// before e, offsets[num_experts] the pairs with a valid id.
static __global__ void __launch_bounds__(1024) di_moe_scan_k(int *offsets, int *base, int num_experts, int segs) {
	extern __shared__ int tot[]; // [num_experts]
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
	for (int e = warp; e < num_experts; e += nw) {
		int *b = base + (size_t)e * segs, run = 0;
		for (int s0 = 0; s0 < segs; s0 += 32) {
			const int s = s0 + lane, v = s < segs ? b[s] : 0;
			int incl = v;
#pragma unroll
			for (int off = 1; off < 32; off <<= 1) {
				const int o = __shfl_up_sync(0xffffffffu, incl, off);
				if (lane >= off) incl += o;
			}
			if (s < segs) b[s] = run + incl - v;
			run += __shfl_sync(0xffffffffu, incl, 31);
		}
		if (lane == 0) tot[e] = run;
	}
	__syncthreads();
	if (warp == 0) {
		int run = 0;
		for (int e0 = 0; e0 < num_experts; e0 += 32) {
			const int e = e0 + lane, v = e < num_experts ? tot[e] : 0;
			int incl = v;
#pragma unroll
			for (int off = 1; off < 32; off <<= 1) {
				const int o = __shfl_up_sync(0xffffffffu, incl, off);
				if (lane >= off) incl += o;
			}
			if (e < num_experts) offsets[e] = run + incl - v;
			run += __shfl_sync(0xffffffffu, incl, 31);
		}
		if (lane == 0) offsets[num_experts] = run;
	}
}

// place: a warp walks its segment 32 pairs at a time in pair order; a
// pair's row is its expert's offset, the expert's pairs in earlier segments
// and earlier in this one (the lanes before it with the same expert:
// __match_any_sync), so an expert's rows keep pair order.
static __global__ void __launch_bounds__(MOE_GROUP_WARPS * 32)
    di_moe_place_k(int *order, int *row_of, const int *ids, const int *offsets, const int *base, int pairs,
                   int num_experts, int segs) {
	extern __shared__ int next_sh[]; // [MOE_GROUP_WARPS][num_experts]
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = blockIdx.x * MOE_GROUP_WARPS + warp;
	if (seg >= segs) return;
	int *next = next_sh + warp * num_experts;
	for (int e = lane; e < num_experts; e += 32) next[e] = offsets[e] + base[(size_t)e * segs + seg];
	__syncwarp();
	const unsigned below = (1u << lane) - 1u;
	const int p1 = min(pairs, (seg + 1) * MOE_GROUP_SEG);
	for (int p0 = seg * MOE_GROUP_SEG; p0 < p1; p0 += 32) {
		const int p = p0 + lane;
		const int v = p < p1 ? ids[p] : -1;
		const bool ok = v >= 0 && v < num_experts;
		const unsigned peers = __match_any_sync(0xffffffffu, ok ? v : -1);
		if (ok) {
			const int r = next[v] + __popc(peers & below);
			order[r] = p;
			row_of[p] = r;
		}
		__syncwarp();
		if (ok && (peers & below) == 0) next[v] += __popc(peers);
		__syncwarp();
	}
}

bool di_moe_group_one(size_t pairs, int num_experts) {
	return num_experts >= 1 && pairs <= MOE_DEVICE_MAX_PAIRS && di_moe_group_smem(pairs, num_experts) <= 48 * 1024;
}

// MOE_ROUTE_FUSE_TOKENS: calls of at most this many tokens (a warp each of
// di_moe_prep_k's 256 threads) may route in the decode path's prep launch.
#define MOE_ROUTE_FUSE_TOKENS 8

// di_moe_route_fuses says whether the decode path's prep launch takes the
// routing r of a call with pairs pairs: one block groups them, r has at
// most MOE_ROUTE_FUSE_TOKENS tokens, and their warps' shared memory fits
// in 48 KiB.
static bool di_moe_route_fuses(const di_moe_route_args &r, int pairs, int num_experts) {
	return r.num_tokens >= 1 && r.num_tokens <= MOE_ROUTE_FUSE_TOKENS && r.e == num_experts &&
	       di_moe_group_one((size_t)pairs, num_experts) && r.num_tokens * di_route_smem(r.e) <= 48 * 1024;
}

bool di_moe_group_ok(size_t pairs, int num_experts) {
	if (num_experts < 1 || pairs > (size_t)0x7fffffff - MOE_GROUP_SEG) return false;
	if (di_moe_group_one(pairs, num_experts)) return true;
	return num_experts <= MOE_GROUP_MAX_EXPERTS;
}

int di_moe_group(di_ctx *ctx, int *offsets, int *order, int *row_of, const int *ids, int pairs, int num_experts,
                 const char *op) {
	if (!di_moe_group_ok((size_t)pairs, num_experts))
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "%s: %d pairs over %d experts: at most %d experts", op, pairs,
		               num_experts, MOE_GROUP_MAX_EXPERTS);
	if (di_moe_group_one((size_t)pairs, num_experts)) {
		const size_t shared = di_moe_group_smem((size_t)pairs, num_experts);
		di_moe_group_k<<<1, 512, shared, ctx->stream>>>(offsets, order, row_of, ids, pairs, num_experts, ctx->check);
		return di_check_launch(ctx, op);
	}
	const int segs = (pairs + MOE_GROUP_SEG - 1) / MOE_GROUP_SEG;
	const unsigned blocks = (unsigned)((segs + MOE_GROUP_WARPS - 1) / MOE_GROUP_WARPS);
	const size_t counters = (size_t)MOE_GROUP_WARPS * num_experts * sizeof(int);
	void *base = nullptr;
	int rc = di_scratch(ctx, (size_t)num_experts * segs * sizeof(int), &base);
	if (rc != DI_OK) return rc;
	di_moe_count_k<<<blocks, MOE_GROUP_WARPS * 32, counters, ctx->stream>>>((int *)base, row_of, ids, pairs,
	                                                                         num_experts, segs, ctx->check);
	rc = di_check_launch(ctx, op);
	if (rc == DI_OK) {
		di_moe_scan_k<<<1, 1024, num_experts * sizeof(int), ctx->stream>>>(offsets, (int *)base, num_experts, segs);
		rc = di_check_launch(ctx, op);
	}
	if (rc == DI_OK) {
		di_moe_place_k<<<blocks, MOE_GROUP_WARPS * 32, counters, ctx->stream>>>(order, row_of, ids, offsets,
		                                                                         (const int *)base, pairs,
		                                                                         num_experts, segs);
		rc = di_check_launch(ctx, op);
	}
	di_scratch_free(ctx, base);
	return rc;
}

// di_mx_expert is the slot-th expert (in expert order) with rows, or -1
// when fewer have rows; every warp finds it on its own (one round of loads
// per 128 experts). The kernels whose grid has a row of blocks a slot
// (min(num_experts, pairs) slots: the MXFP4 ones, di_moe_dec_k) use it, so
// that a decode step launches blocks for its few experts only.
__device__ int di_mx_expert(const int *offsets, int num_experts, int slot) {
	const int lane = threadIdx.x & 31;
	int seen = 0;
	for (int e0 = 0; e0 < num_experts; e0 += 128) {
		bool has[4];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int e = e0 + 32 * u + lane;
			has[u] = e < num_experts && offsets[e + 1] > offsets[e];
		}
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const unsigned b = __ballot_sync(0xffffffffu, has[u]);
			const int c = __popc(b);
			if (slot < seen + c) {
				const unsigned hit =
				    __ballot_sync(0xffffffffu, has[u] && __popc(b & ((1u << lane) - 1u)) == slot - seen);
				return e0 + 32 * u + __ffs(hit) - 1;
			}
			seen += c;
		}
	}
	return -1;
}

// grouped GEMV: out[row, j] = in(row) . W[e][j] for every row of expert e =
// blockIdx.y, one warp per output column j. in(row) is x[order[row] / div]
// when order is set (the gather), else x[row]; x rows have k elements. The
// numerics are those of the GEMV in ops.cu: 16-bit weights multiply x
// rounded to their dtype (hi and lo parts summed separately in
// DI_GEMM_SPLIT), float32 weights x as is. For 16-bit weights x arrives
// already rounded (X = W, with xlo the remainders in split mode: di_moe_round_k
// or di_moe_act_k rounds each value once, where every warp used to round
// every row it read again); each lane sums its 8-element chunks in ascending
// order, the warp adds the lanes in a fixed tree. The weights of a column are
// read once per MOE_ROWS rows of its expert.
template <typename W, typename X, bool SPLIT>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    di_moe_gemv_k(float *out, const X *x, const X *xlo, const int *order, int div, const W *w, const int *offsets,
                  int n, int k) {
	const int ex = blockIdx.y;
	const int lo = offsets[ex], rows = offsets[ex + 1] - lo;
	const int lane = threadIdx.x & 31;
	const int j = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
	if (rows <= 0 || j >= n) return;
	const W *wr = w + ((size_t)ex * n + j) * k;
	for (int r0 = 0; r0 < rows; r0 += MOE_ROWS) {
		const int m = min(MOE_ROWS, rows - r0);
		size_t xo[MOE_ROWS];
#pragma unroll
		for (int r = 0; r < MOE_ROWS; r++) {
			const int row = lo + r0 + (r < m ? r : 0);
			xo[r] = (size_t)(order ? order[row] / div : row) * k;
		}
		float acc[MOE_ROWS], acc_lo[MOE_ROWS];
#pragma unroll
		for (int r = 0; r < MOE_ROWS; r++) acc[r] = acc_lo[r] = 0.f;
#pragma unroll 2
		for (int i = lane * 8; i < k; i += 256) {
			float wv[8];
			di_load8(wr + i, wv);
#pragma unroll
			for (int r = 0; r < MOE_ROWS; r++) {
				if (r < m) {
					float xv[8];
					di_load8(x + xo[r] + i, xv);
					float a = acc[r], b = acc_lo[r];
#pragma unroll
					for (int e = 0; e < 8; e++) a += wv[e] * xv[e];
					if (SPLIT) {
						di_load8(xlo + xo[r] + i, xv);
#pragma unroll
						for (int e = 0; e < 8; e++) b += wv[e] * xv[e];
					}
					acc[r] = a, acc_lo[r] = b;
				}
			}
		}
#pragma unroll
		for (int r = 0; r < MOE_ROWS; r++) {
			if (r < m) {
				float v = di_warp_sum(acc[r]);
				if (SPLIT) v += di_warp_sum(acc_lo[r]);
				if (lane == 0) out[(size_t)(lo + r0 + r) * n + j] = v;
			}
		}
	}
}

// di_moe_mma_k is di_moe_gemv_k on tensor cores for 16-bit weights and k a
// multiple of 32: block (blockIdx.x, expert blockIdx.y) computes output
// columns j0 .. j0+16*CT-1 (j0 = 16 CT blockIdx.x; each 16 columns are the
// weight rows of an mma.sync m16n8k16's A operand) for the expert's rows in
// tiles of 8 (the B operand; up to RT tiles, 8 RT rows, a pass over the
// weights). Its four warps deal the 32-column blocks of k among them (warp w
// takes blocks w, w + 4, ...), so that at batch 1 a column's weights are
// read by four warps at once; each warp keeps float32 accumulators in
// registers, and warp c adds the four warps' sums of column tile c in warp
// order. Per 32 columns of k a lane reads 16 bytes of weight rows g and g+8
// of each column tile and 16 bytes of each row tile's row g, straight from
// global memory, and feeds the first four of its eight columns to one mma
// and the last four to a second (the same permutation of the reduction
// index for A and B; as gemm_skinny.cu's di_skinny_k). PF loads the next
// block's weights before the current block's mma (registers for loads in
// flight). In split mode the lo parts go to accumulators of their own,
// added at the end.
// Shapes (moe_gemv picks them from the mean rows per expert; all give the
// same bits): the kernel is bound by reading the weights, and what limits it
// is the bytes in flight per SM, so fewer registers (smaller RT: more blocks
// per SM) win while experts hold few rows, and larger RT (fewer passes over
// the weights) once they hold many. Measured on an H200 at
// DeepSeek-V2-Lite's shapes (64 experts, 2048 x 1408, top 6), share of the
// copy bandwidth, gate_up / down: 1 token CT 2 RT 1 PF 77% / 85% (CT 1 RT 4,
// the earlier kernel, 49% / 59%); 8 tokens 99% / 94% (83% / 75%); 64
// tokens CT 2 RT 2 98% / 93% (80% / 73%); 256 tokens CT 2 RT 3 PF 64% / 58%
// (56% / 53%).
// Batch invariance: out[row][j] is a fixed-order sum of the tensor-core
// products of weight row j with that row (each warp's blocks in ascending
// k, then the warps in order); each element of an mma tile is its own dot
// product, and rows past the expert's count are never stored, so a token's
// result does not depend on the other tokens, nor on CT, RT or PF.
// Cost: the expert's weights read once per 8 RT of its rows; 2 KB CT RT of
// shared memory (twice that in split mode) for the warps' sums.
#define MOE_MMA_WARPS 4
template <typename T, bool SPLIT, int CT, int RT, bool PF>
__global__ void __launch_bounds__(MOE_MMA_WARPS * 32)
    di_moe_mma_k(float *out, const T *x, const T *xlo, const int *order, int div, const T *w, const int *offsets,
                 int n, int k) {
	static_assert(CT >= 1 && CT <= MOE_MMA_WARPS && RT >= 1 && RT <= 4, "di_moe_mma_k: CT in 1..4, RT in 1..4");
	__shared__ float part[SPLIT ? 2 : 1][MOE_MMA_WARPS][32][CT * RT * 4];
	const int ex = blockIdx.y;
	const int lo = offsets[ex], rows = offsets[ex + 1] - lo;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
	const int j0 = blockIdx.x * 16 * CT;
	if (rows <= 0 || j0 >= n) return;
	const T *wa[CT], *wb[CT];
#pragma unroll
	for (int c = 0; c < CT; c++) {
		wa[c] = w + ((size_t)ex * n + min(j0 + 16 * c + g, n - 1)) * k + 8 * t4;
		wb[c] = w + ((size_t)ex * n + min(j0 + 16 * c + g + 8, n - 1)) * k + 8 * t4;
	}
	for (int r0 = 0; r0 < rows; r0 += 8 * RT) {
		const int m = min(8 * RT, rows - r0), tiles = (m + 7) / 8;
		size_t xo[RT];
#pragma unroll
		for (int tl = 0; tl < RT; tl++) {
			const int r = tl * 8 + g, row = lo + r0 + (r < m ? r : 0);
			xo[tl] = (size_t)(order ? order[row] / div : row) * k + 8 * t4;
		}
		float acc[CT][RT][4], acc_lo[CT][RT][4];
#pragma unroll
		for (int c = 0; c < CT; c++)
#pragma unroll
			for (int tl = 0; tl < RT; tl++)
#pragma unroll
				for (int e = 0; e < 4; e++) acc[c][tl][e] = acc_lo[c][tl][e] = 0.f;
		uint4 a[CT], b[CT];
		int kb = warp * 32;
		if (PF && kb < k) {
#pragma unroll
			for (int c = 0; c < CT; c++) {
				a[c] = *reinterpret_cast<const uint4 *>(wa[c] + kb);
				b[c] = *reinterpret_cast<const uint4 *>(wb[c] + kb);
			}
		}
#pragma unroll 2
		for (; kb < k; kb += MOE_MMA_WARPS * 32) {
			uint4 an[CT], bn[CT];
#pragma unroll
			for (int c = 0; c < CT; c++) {
				// PF: the next block's (the last block reloads itself);
				// else this block's.
				const int kl = !PF ? kb : (kb + MOE_MMA_WARPS * 32 < k ? kb + MOE_MMA_WARPS * 32 : kb);
				an[c] = *reinterpret_cast<const uint4 *>(wa[c] + kl);
				bn[c] = *reinterpret_cast<const uint4 *>(wb[c] + kl);
				if (!PF) a[c] = an[c], b[c] = bn[c];
			}
#pragma unroll
			for (int tl = 0; tl < RT; tl++) {
				if (tl < tiles) {
					const uint4 xv = *reinterpret_cast<const uint4 *>(x + xo[tl] + kb);
					uint4 xl;
					if (SPLIT) xl = *reinterpret_cast<const uint4 *>(xlo + xo[tl] + kb);
#pragma unroll
					for (int c = 0; c < CT; c++) {
						di_mma16816<T>(acc[c][tl], a[c].x, b[c].x, a[c].y, b[c].y, xv.x, xv.y);
						di_mma16816<T>(acc[c][tl], a[c].z, b[c].z, a[c].w, b[c].w, xv.z, xv.w);
						if (SPLIT) {
							di_mma16816<T>(acc_lo[c][tl], a[c].x, b[c].x, a[c].y, b[c].y, xl.x, xl.y);
							di_mma16816<T>(acc_lo[c][tl], a[c].z, b[c].z, a[c].w, b[c].w, xl.z, xl.w);
						}
					}
				}
			}
			if (PF) {
#pragma unroll
				for (int c = 0; c < CT; c++) a[c] = an[c], b[c] = bn[c];
			}
		}
		if (r0 > 0) __syncthreads(); // the adders have read the previous pass's sums
#pragma unroll
		for (int c = 0; c < CT; c++)
#pragma unroll
			for (int tl = 0; tl < RT; tl++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int f = (c * RT + tl) * 4 + e;
					part[0][warp][lane][f] = acc[c][tl][e];
					if (SPLIT) part[SPLIT ? 1 : 0][warp][lane][f] = acc_lo[c][tl][e];
				}
		__syncthreads();
		for (int c = warp; c < CT; c += MOE_MMA_WARPS) {
#pragma unroll
			for (int tl = 0; tl < RT; tl++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int r = tl * 8 + 2 * t4 + (e & 1), j = j0 + 16 * c + g + 8 * (e >> 1);
					if (tl < tiles && r < m && j < n) {
						const int f = (c * RT + tl) * 4 + e;
						float v = part[0][0][lane][f], vl = 0.f;
						if (SPLIT) vl = part[SPLIT ? 1 : 0][0][lane][f];
#pragma unroll
						for (int wi = 1; wi < MOE_MMA_WARPS; wi++) {
							v += part[0][wi][lane][f];
							if (SPLIT) vl += part[SPLIT ? 1 : 0][wi][lane][f];
						}
						out[(size_t)(lo + r0 + r) * n + j] = SPLIT ? v + vl : v;
					}
				}
			}
		}
	}
}

// moe_mma launches di_moe_mma_k in the shape for rows (token, k) pairs over
// num_experts experts (see di_moe_mma_k: the mean rows per expert decides;
// every shape gives the same bits).
template <typename T, bool SPLIT>
static void moe_mma(di_ctx *ctx, float *out, const T *x, const T *xlo, const int *order, int div, const T *w,
                    const int *offsets, int num_experts, int rows, int n, int k) {
	const auto launch = [&](auto kernel, int ct) {
		const dim3 grid((unsigned)((n + 16 * ct - 1) / (16 * ct)), (unsigned)num_experts);
		kernel<<<grid, MOE_MMA_WARPS * 32, 0, ctx->stream>>>(out, x, xlo, order, div, w, offsets, n, k);
	};
	if (rows < 2 * num_experts)
		launch(di_moe_mma_k<T, SPLIT, 2, 1, true>, 2);
	else if (rows < 12 * num_experts)
		launch(di_moe_mma_k<T, SPLIT, 2, 2, false>, 2);
	else
		launch(di_moe_mma_k<T, SPLIT, 2, 3, true>, 2);
}

// x rounded to T once (and the remainders into lo when set).
template <typename T> __global__ void di_moe_round_k(T *hi, T *lo, const float *x, size_t n) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		di_to_gemm(hi, lo, i, x[i]);
}

// act[r, j] = silu(g[r, j]) * g[r, inter + j] in float32 (the GEMV rounds).
static __global__ void di_moe_act_f32_k(float *act, const float *g, size_t rows, int inter) {
	const size_t total = rows * (size_t)inter;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
		const size_t r = i / inter, j = i % inter;
		const float gate = g[r * 2 * inter + j], up = g[r * 2 * inter + inter + j];
		act[i] = (float)((double)gate / (1.0 + exp(-(double)gate))) * up;
	}
}

int di_moe_act_f32(di_ctx *ctx, float *act, const float *g, size_t rows, int inter, const char *op) {
	di_moe_act_f32_k<<<di_grid(rows * inter, 256), 256, 0, ctx->stream>>>(act, g, rows, inter);
	return di_check_launch(ctx, op);
}

// ---------------------------------------------------------------- decode path (16-bit experts)

// The small batches' path for 16-bit experts (moe_device's dec: di_moe_mma_k
// would serve both projections, no gpt-oss extras) runs four kernels, each
// launched with programmatic dependent launch (di_launch: its launch and
// ramp overlap the previous kernel's tail, under graphs too): di_moe_prep_k
// (the grouping and x rounded to T in one launch; with moe_set_route at up
// to MOE_ROUTE_FUSE_TOKENS tokens, the routing first), di_moe_dec_k over the
// gate/up weight with the SiLU-mul in its epilogue (it writes the rounded
// activations, no float32 gate/up outputs), di_moe_dec_k over the down
// weight, and di_moe_combine. It replaced group, round, grouped mma, act,
// grouped mma and combine (six launches, none overlapped, the projections'
// grids a column of blocks for every expert).

// di_moe_prep_k: block 0 groups the pairs (di_moe_group_block; dynamic
// shared memory of di_moe_group_smem bytes), the other blocks round x
// (nx floats) to T, hi and lo (lo set: split mode), as di_moe_round_k.
// With route.ids set (the routing fused, moe_set_route: at most
// MOE_ROUTE_FUSE_TOKENS tokens), block 0 first routes the tokens, warp w
// token w (di_route_token, in shared memory of di_route_smem bytes a warp:
// the routing kernel's arithmetic, so the same ids and weights), and then
// groups the ids it wrote: one launch fewer than routing apart.
template <typename T>
__global__ void __launch_bounds__(256)
    di_moe_prep_k(int *offsets, int *order, int *row_of, const int *ids, int pairs, int num_experts,
                  unsigned *check, T *xh, T *xl, const float *x, size_t nx, di_moe_route_args route) {
	extern __shared__ int prep_sh[];
	di_pdl_wait();
	if (blockIdx.x == 0) {
		if (route.ids) {
			const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
			if (warp < route.num_tokens) {
				double *ex = (double *)((unsigned char *)prep_sh + warp * di_route_smem(route.e));
				float *sc = (float *)(ex + route.e), *ch = sc + route.e, *gs = ch + route.e;
				di_route_token(route, warp, lane, ex, sc, ch, gs);
			}
			__syncthreads(); // the ids written, the shared memory free for the grouping
		}
		di_moe_group_block(prep_sh, offsets, order, row_of, ids, pairs, num_experts, check);
		return;
	}
	const size_t stride = (size_t)(gridDim.x - 1) * blockDim.x;
	for (size_t i = (size_t)(blockIdx.x - 1) * blockDim.x + threadIdx.x; i < nx; i += stride)
		di_to_gemm(xh, xl, i, x[i]);
}

// di_moe_dec_args is one projection of di_moe_dec_k: weight w [num_experts,
// n, k] of T; grouped row r's input is x[order[r] / div] (order set) or
// x[r], k elements of T (xlo: the remainders in split mode); out float32
// [rows, n] (down), or act and act_lo [rows, n / 2] of T (gate/up, n = 2
// inter: the SiLU-mul of the gate and up outputs, rounded as di_moe_act_k).
template <typename T> struct di_moe_dec_args {
	const T *w, *x, *xlo;
	const int *order;
	int div;
	const int *offsets;
	int num_experts, n, k;
	float *out;
	T *act, *act_lo;
};

#define MOE_DEC_CT 2     // 16-row column tiles a block
#define MOE_DEC_STAGES 4 // 32-column blocks of k a warp has in flight

// di_moe_dec_k is di_moe_mma_k (CT = 2) with three changes that keep its
// bits: (1) block y works for the y-th expert with rows (di_mx_expert; the
// grid has min(num_experts, pairs) rows of blocks, so a decode step launches
// blocks for the experts it uses only, where di_moe_mma_k's grid has a
// column for every expert); (2) each warp streams its weight blocks through
// a copy ring of its own in shared memory (MOE_DEC_STAGES blocks of 32
// columns in flight, 1 KB a block and column tile: a lane copies with
// cp.async the 16 bytes of rows g and g + 8 it alone reads back, so no
// barrier is needed), where di_moe_mma_k keeps one block in registers ahead
// (at one token that left about 32 KB in flight a multiprocessor and 77% /
// 85% of the copy bandwidth on V2-Lite's gate/up / down); (3) PAIRED (the
// gate/up weight, n = 2 inter): column tile 0 is gate rows 16 x .. 16 x +
// 15 and tile 1 the up rows inter + 16 x .., so the epilogue holds both
// inputs of each activation and writes silu(gate) * up rounded to T (hi and
// lo in split mode): di_moe_act_k's value of di_moe_mma_k's float32 outputs.
// The mma.sync calls, their operands and order, and the warp-order sum of
// the four warps' partial sums (hi + lo last in split mode) are
// di_moe_mma_k's, so every output has its bits, whatever the batch.
// Cost: 32 KB of shared memory a block (the rings, which also take the
// warps' sums at the end of a pass); an expert's weights read once per 8 RT
// of its rows.
template <typename T, bool SPLIT, int RT, bool PAIRED>
__global__ void __launch_bounds__(MOE_MMA_WARPS * 32) di_moe_dec_k(di_moe_dec_args<T> p) {
	constexpr int CT = MOE_DEC_CT, ST = MOE_DEC_STAGES;
	constexpr int WS = ST * 2 * CT * 32 * 4; // floats in a warp's ring
	static_assert(RT >= 1 && RT <= 4, "di_moe_dec_k: RT in 1..4");
	static_assert((SPLIT ? 2 : 1) * CT * RT * 4 * 32 <= WS, "di_moe_dec_k: a warp's sums fit its ring");
	// ring[warp][stage][2 c + h][lane]: lane's 16 bytes of weight row g + 8 h
	// of column tile c (16-byte reads and copies conflict-free).
	__shared__ __align__(16) uint4 ring[MOE_MMA_WARPS][ST][2 * CT][32];
	di_pdl_wait();
	const int ex = di_mx_expert(p.offsets, p.num_experts, blockIdx.y);
	if (ex < 0) return;
	const int lo = p.offsets[ex], rows = p.offsets[ex + 1] - lo;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
	const int n = p.n, k = p.k, inter = n >> 1;
	const int j0 = PAIRED ? 16 * (int)blockIdx.x : 16 * CT * (int)blockIdx.x;
	const T *wa[CT], *wb[CT];
#pragma unroll
	for (int c = 0; c < CT; c++) {
		int ra, rb; // weight rows g and g + 8 of column tile c, clamped into the weight
		if (PAIRED) {
			ra = (c ? inter : 0) + min(j0 + g, inter - 1);
			rb = (c ? inter : 0) + min(j0 + g + 8, inter - 1);
		} else {
			ra = min(j0 + 16 * c + g, n - 1);
			rb = min(j0 + 16 * c + g + 8, n - 1);
		}
		wa[c] = p.w + ((size_t)ex * n + ra) * k + 8 * t4;
		wb[c] = p.w + ((size_t)ex * n + rb) * k + 8 * t4;
	}
	const int nb = k >> 5; // 32-column blocks of k; warp w takes w, w + 4, ...
	const int steps = warp < nb ? (nb - 1 - warp) / MOE_MMA_WARPS + 1 : 0;
	uint4(*slots)[2 * CT][32] = ring[warp];
	// issue queues step t's copies into slot t % ST (an empty group past the last step).
	auto issue = [&](int t) {
		if (t < steps) {
			const int kb = (warp + MOE_MMA_WARPS * t) * 32;
#pragma unroll
			for (int c = 0; c < CT; c++) {
				di_cp_async16(&slots[t % ST][2 * c][lane], wa[c] + kb, true);
				di_cp_async16(&slots[t % ST][2 * c + 1][lane], wb[c] + kb, true);
			}
		}
		di_cp_async_commit();
	};
	for (int r0 = 0; r0 < rows; r0 += 8 * RT) {
		const int m = min(8 * RT, rows - r0), tiles = (m + 7) / 8;
		if (r0 > 0) __syncthreads(); // the previous pass's sums in the rings have been read
#pragma unroll
		for (int t = 0; t < ST; t++) issue(t);
		size_t xo[RT];
#pragma unroll
		for (int tl = 0; tl < RT; tl++) {
			const int r = tl * 8 + g, row = lo + r0 + (r < m ? r : 0);
			xo[tl] = (size_t)(p.order ? p.order[row] / p.div : row) * k + 8 * t4;
		}
		float acc[CT][RT][4], acc_lo[CT][RT][4];
#pragma unroll
		for (int c = 0; c < CT; c++)
#pragma unroll
			for (int tl = 0; tl < RT; tl++)
#pragma unroll
				for (int e = 0; e < 4; e++) acc[c][tl][e] = acc_lo[c][tl][e] = 0.f;
		for (int t = 0; t < steps; t++) {
			di_cp_async_wait<ST - 1>(); // step t's copies (this lane's) have landed
			const int kb = (warp + MOE_MMA_WARPS * t) * 32;
			uint4 a[CT], b[CT];
#pragma unroll
			for (int c = 0; c < CT; c++) {
				a[c] = slots[t % ST][2 * c][lane];
				b[c] = slots[t % ST][2 * c + 1][lane];
			}
			issue(t + ST); // into the slot just read (its words are in a and b)
#pragma unroll
			for (int tl = 0; tl < RT; tl++) {
				if (tl < tiles) {
					const uint4 xv = *reinterpret_cast<const uint4 *>(p.x + xo[tl] + kb);
					uint4 xl;
					if (SPLIT) xl = *reinterpret_cast<const uint4 *>(p.xlo + xo[tl] + kb);
#pragma unroll
					for (int c = 0; c < CT; c++) {
						di_mma16816<T>(acc[c][tl], a[c].x, b[c].x, a[c].y, b[c].y, xv.x, xv.y);
						di_mma16816<T>(acc[c][tl], a[c].z, b[c].z, a[c].w, b[c].w, xv.z, xv.w);
						if (SPLIT) {
							di_mma16816<T>(acc_lo[c][tl], a[c].x, b[c].x, a[c].y, b[c].y, xl.x, xl.y);
							di_mma16816<T>(acc_lo[c][tl], a[c].z, b[c].z, a[c].w, b[c].w, xl.z, xl.w);
						}
					}
				}
			}
		}
		di_cp_async_wait<0>();
		__syncwarp(); // every lane's copies have landed: the sums may go over any of them
		float *mine = reinterpret_cast<float *>(ring[warp]);
#pragma unroll
		for (int c = 0; c < CT; c++)
#pragma unroll
			for (int tl = 0; tl < RT; tl++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int f = (c * RT + tl) * 4 + e;
					mine[f * 32 + lane] = acc[c][tl][e];
					if (SPLIT) mine[(CT * RT * 4 + f) * 32 + lane] = acc_lo[c][tl][e];
				}
		__syncthreads();
		// sum is output f of lane ln: the four warps' sums in warp order (and
		// their lo sums the same way, added last), as di_moe_mma_k adds them.
		const float *all = reinterpret_cast<const float *>(ring[0]);
		auto sum = [&](int f, int ln) -> float {
			float v = all[f * 32 + ln], vl = 0.f;
			if (SPLIT) vl = all[(CT * RT * 4 + f) * 32 + ln];
#pragma unroll
			for (int wi = 1; wi < MOE_MMA_WARPS; wi++) {
				v += all[wi * WS + f * 32 + ln];
				if (SPLIT) vl += all[wi * WS + (CT * RT * 4 + f) * 32 + ln];
			}
			return SPLIT ? v + vl : v;
		};
		if (PAIRED) {
			const int e = warp; // warp w finishes accumulator w of each tile: one activation a lane
#pragma unroll
			for (int tl = 0; tl < RT; tl++) {
				const int r = tl * 8 + 2 * t4 + (e & 1), j = j0 + g + 8 * (e >> 1);
				if (tl < tiles && r < m && j < inter) {
					const float gate = sum(tl * 4 + e, lane), up = sum((RT + tl) * 4 + e, lane);
					di_to_gemm(p.act, p.act_lo, (size_t)(lo + r0 + r) * inter + j, di_moe_silu_mul(gate, up));
				}
			}
		} else {
			for (int q = warp; q < CT * 4; q += MOE_MMA_WARPS) {
				const int c = q >> 2, e = q & 3;
#pragma unroll
				for (int tl = 0; tl < RT; tl++) {
					const int r = tl * 8 + 2 * t4 + (e & 1), j = j0 + 16 * c + g + 8 * (e >> 1);
					if (tl < tiles && r < m && j < n) p.out[(size_t)(lo + r0 + r) * n + j] = sum((c * RT + tl) * 4 + e, lane);
				}
			}
		}
	}
}

// moe_dec_project launches di_moe_dec_k over slots expert slots, RT by the
// mean rows per expert as moe_mma (every RT gives the same bits).
template <typename T, bool SPLIT, bool PAIRED>
static int moe_dec_project(di_ctx *ctx, const di_moe_dec_args<T> &p, int slots, int rows) {
	const unsigned gx = PAIRED ? (unsigned)((p.n / 2 + 15) / 16)
	                           : (unsigned)((p.n + 16 * MOE_DEC_CT - 1) / (16 * MOE_DEC_CT));
	const dim3 grid(gx, (unsigned)slots), block(MOE_MMA_WARPS * 32);
	if (rows < 2 * p.num_experts)
		di_launch(ctx, di_moe_dec_k<T, SPLIT, 1, PAIRED>, grid, block, 0, p);
	else if (rows < 12 * p.num_experts)
		di_launch(ctx, di_moe_dec_k<T, SPLIT, 2, PAIRED>, grid, block, 0, p);
	else
		di_launch(ctx, di_moe_dec_k<T, SPLIT, 3, PAIRED>, grid, block, 0, p);
	return di_check_launch(ctx, PAIRED ? "moe: gate_up" : "moe: down");
}

// moe_dec_prep groups the pairs and rounds x (nx floats; 0 where xh is x
// rounded already) to T into xh (and xl in split mode): one di_moe_prep_k
// where one block groups them (di_moe_group_one), else di_moe_group and
// di_moe_round_k. route (ids set: di_moe_route_fuses said yes) is routed in
// the same launch.
template <typename T>
static int moe_dec_prep(di_ctx *ctx, int *offsets, int *order, int *row_of, const int *ids, int pairs,
                        int num_experts, T *xh, T *xl, const float *x, size_t nx, const di_moe_route_args &route) {
	if (di_moe_group_one((size_t)pairs, num_experts)) {
		size_t shared = di_moe_group_smem((size_t)pairs, num_experts);
		if (route.ids && route.num_tokens * di_route_smem(route.e) > shared)
			shared = route.num_tokens * di_route_smem(route.e);
		unsigned blocks = nx ? di_grid(nx, 256) : 0;
		if (blocks > 1024) blocks = 1024;
		di_launch(ctx, di_moe_prep_k<T>, dim3(1 + blocks), dim3(256), shared, offsets, order, row_of, ids, pairs,
		          num_experts, ctx->check, xh, xl, x, nx, route);
		return di_check_launch(ctx, "moe: group");
	}
	if (route.ids) return di_fail(ctx, DI_ERR_INVALID, "moe: a fused routing needs the one-block grouping");
	int r = di_moe_group(ctx, offsets, order, row_of, ids, pairs, num_experts, "moe: group");
	if (r != DI_OK || nx == 0) return r;
	di_moe_round_k<T><<<di_grid(nx, 256), 256, 0, ctx->stream>>>(xh, xl, x, nx);
	return di_check_launch(ctx, "moe: round");
}

// moe_dec runs the decode path after nothing (see above): prep, gate/up
// with the SiLU-mul into act (T hi [pairs, inter], then lo in split mode),
// down into yh [pairs, hidden]; the caller combines. xr holds x rounded
// (hi, then lo: num_tokens * hidden each; rounded set: xr is x, rounded
// to T already, and x is not read).
template <typename T>
static int moe_dec(di_ctx *ctx, void *act, float *yh, void *xr, const float *x, bool rounded, const int *ids,
                   int *offsets, int *order, int *row_of, const void *gate_up, const void *down, int num_tokens,
                   int pairs, int top_k, int hidden, int inter, int num_experts, const di_moe_route_args &route) {
	if constexpr (std::is_same_v<T, float>) {
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "moe: the decode path takes 16-bit experts");
	} else {
		const bool split = ctx->gemm_mode == DI_GEMM_SPLIT;
		const size_t nx = (size_t)num_tokens * hidden, na = (size_t)pairs * inter;
		T *xh = (T *)xr, *xl = split ? xh + nx : nullptr, *ah = (T *)act, *al = split ? ah + na : nullptr;
		int r = moe_dec_prep<T>(ctx, offsets, order, row_of, ids, pairs, num_experts, xh, xl, x, rounded ? 0 : nx,
		                        route);
		if (r != DI_OK) return r;
		const int slots = num_experts < pairs ? num_experts : pairs;
		const di_moe_dec_args<T> gu{(const T *)gate_up, xh, xl, order, top_k, offsets, num_experts, 2 * inter, hidden,
		                            nullptr, ah, al};
		const di_moe_dec_args<T> dn{(const T *)down, ah, al, nullptr, 1, offsets, num_experts, hidden, inter,
		                            yh, nullptr, nullptr};
		r = split ? moe_dec_project<T, true, true>(ctx, gu, slots, pairs)
		          : moe_dec_project<T, false, true>(ctx, gu, slots, pairs);
		if (r != DI_OK) return r;
		return split ? moe_dec_project<T, true, false>(ctx, dn, slots, pairs)
		             : moe_dec_project<T, false, false>(ctx, dn, slots, pairs);
	}
}


// di_moe_gptoss: gpt-oss's expert extras (di_op_moe_clamped_swiglu): the
// projections' biases (gate_up_bias [num_experts, 2 inter], down_bias
// [num_experts, hidden]), the routing ids (the expert of a grouped row r is
// ids[order[r]]) and the clamped SwiGLU's limit and alpha.
struct di_moe_gptoss {
	const float *gate_up_bias, *down_bias;
	const int *ids;
	float limit, alpha;
};

// act[r, j] = clamped_swiglu(g[r, j] + bg, g[r, inter + j] + bu) with the
// row's expert's biases, in T (float32, or the GEMM dtype with lo parts),
// as kernels/cpu's clampedSwiGLURow: g' = min(g, limit), u' = clamp(u,
// -limit, limit), (u' + 1) g' sigmoid(alpha g') with the sigmoid in float64.
template <typename T>
__global__ void di_moe_act_clamped_k(T *act, T *act_lo, const float *g, const int *order, size_t rows, int inter,
                                     di_moe_gptoss gx) {
	const size_t total = rows * (size_t)inter;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
		const size_t r = i / inter, j = i % inter;
		const float *bias = gx.gate_up_bias + (size_t)gx.ids[order[r]] * 2 * inter;
		const float gate = fminf(g[r * 2 * inter + j] + bias[j], gx.limit);
		const float up = fminf(fmaxf(g[r * 2 * inter + inter + j] + bias[inter + j], -gx.limit), gx.limit);
		const float glu = gate * (float)(1.0 / (1.0 + exp(-(double)(gx.alpha * gate))));
		di_to_gemm(act, act_lo, i, (up + 1.f) * glu);
	}
}

// y[r] += down_bias[expert of row r].
__global__ void di_moe_down_bias_k(float *y, const int *order, size_t rows, int hidden, di_moe_gptoss gx) {
	const size_t total = rows * (size_t)hidden;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
		const size_t r = i / hidden, j = i % hidden;
		y[i] += gx.down_bias[(size_t)gx.ids[order[r]] * hidden + j];
	}
}

template <typename W, typename X>
static int moe_gemv(di_ctx *ctx, float *out, const X *x, const X *xlo, const int *order, int div, const void *w,
                    const int *offsets, int num_experts, int rows, int n, int k) {
	if constexpr (std::is_same_v<W, X> && !std::is_same_v<W, float>) {
		if (ctx->moe_mma && k % 32 == 0) {
			if (xlo)
				moe_mma<W, true>(ctx, out, x, xlo, order, div, (const W *)w, offsets, num_experts, rows, n, k);
			else
				moe_mma<W, false>(ctx, out, x, xlo, order, div, (const W *)w, offsets, num_experts, rows, n, k);
			return di_check_launch(ctx, "moe: grouped mma");
		}
	}
	const dim3 grid((unsigned)((n + MOE_WARPS - 1) / MOE_WARPS), (unsigned)num_experts);
	if (xlo)
		di_moe_gemv_k<W, X, true>
		    <<<grid, MOE_WARPS * 32, 0, ctx->stream>>>(out, x, xlo, order, div, (const W *)w, offsets, n, k);
	else
		di_moe_gemv_k<W, X, false>
		    <<<grid, MOE_WARPS * 32, 0, ctx->stream>>>(out, x, xlo, order, div, (const W *)w, offsets, n, k);
	return di_check_launch(ctx, "moe: grouped gemv");
}

// ---------------------------------------------------------------- grouped GEMM (large batches)

// di_moe_gemm_k is the grouped projection of 16-bit experts for large
// batches (from ctx->moe_gemm_pairs pairs, by default above
// MOE_DEVICE_MAX_PAIRS): a tensor-core GEMM over the rows grouped by expert
// that reads an expert's weights once per MG_BN of its rows where
// di_moe_mma_k reads them once per 32, and stages both operands in shared
// memory. Block (blockIdx.x, blockIdx.y) computes MG_BM weight rows (output
// columns) by MG_BN grouped rows of one expert: its tile is the
// blockIdx.y-th of all experts' row tiles (ceil(rows / MG_BN) an expert,
// in expert order), which every warp finds from the grouping's offsets on
// the device, so the grid is an upper bound that does not depend on the
// routing (graph capture; the blocks past the last tile return at once).
// Its eight warps (2 over the weight rows by 4 over the grouped rows) each
// hold 64 x 32 float32 sums; a three-stage cp.async ring stages 32 columns
// of k a stage (8 KB of weight rows, 8 KB of input rows, gathered through
// the grouping's order for gate/up), read back with 16-byte loads.
//
// Numerics: every output element is summed in di_moe_mma_k's order, so the
// two give the same bits and a token's result does not depend on which
// kernel its batch size selects. di_moe_mma_k deals the 32-column blocks of
// k to four warps (warp w: blocks w, w + 4, ...), each summing its blocks
// in ascending order into a float32 accumulator (two mma.sync a block, a
// lane's 8 columns of a block split 4 + 4 between them as in
// gemm_skinny.cu), and adds the four sums in warp order. This kernel walks
// the blocks in that order (the stages take blocks 0, 4, 8, ..., then 1, 5,
// ..., then 2, ..., then 3, ...), feeds each mma the same fragments, and
// keeps the sum of the finished passes (((S0 + S1) + S2), 64 floats a
// thread, 64 KB a block) in shared memory while the next pass accumulates
// in registers from zero; a pass without blocks adds zero, as di_moe_mma_k's
// idle warp does. The weights are mma's A operand (16 rows) and the grouped
// rows its B operand (8 rows), as there. Each element of an mma tile is its
// own dot product and rows past the expert's count are never stored, so the
// result is batch-invariant.
//
// Epilogues (MODE): MG_STORE y = v, MG_ADD y += v (split mode's remainder
// pass: y + v is di_moe_mma_k's hi + lo), MG_ACT act = silu(gate) * up
// rounded to T (di_moe_act_k's value: the gate/up projection with the
// SiLU-mul fused, no float32 intermediates), MG_ADD_ACT the same with gate
// and up the sums in y plus v. In the paired modes (inter > 0: the gate/up
// weight, n = 2 inter) block x takes gate rows 64 x .. 64 x + 63 and the up
// rows inter + 64 x .. of the same columns, so that a thread holds both
// inputs of each activation it writes; otherwise rows 128 x .. 128 x + 127.
//
// Cost: 2 * rows * n * k flops on mma.sync; an expert's weights read once
// per 128 of its rows, the inputs once per 128 output columns (64 for
// gate/up); 112 KB of shared memory and at most 128 registers a thread, two
// blocks a multiprocessor.
#define MG_BM 128 // weight rows (output columns) a block
#define MG_BN 128 // grouped rows a block
#define MG_BK 32  // columns of k a stage: one of di_moe_mma_k's blocks
#ifndef MG_STAGES
#define MG_STAGES 3
#endif
#ifndef MG_MINB
#define MG_MINB 2 // blocks a multiprocessor in the launch bounds (2: at most 128 registers; 1 was 25% slower, NOTES.md)
#endif
#define MG_THREADS 256
#define MG_SMEM ((size_t)MG_STAGES * (MG_BM + MG_BN) * MG_BK * 2 + (size_t)MG_THREADS * 64 * sizeof(float))
enum { MG_STORE = 0, MG_ADD = 1, MG_ACT = 2, MG_ADD_ACT = 3, MG_STORE16 = 4 }; // MG_STORE16: di_moe_wg_k only

// di_moe_gemm_args is one projection: w [num_experts, n, k] of T; grouped
// row r's input is x[order[r] / div] (order set) or x[r], k elements of T;
// inter > 0 for the paired (gate/up) layout; y float32 [rows, n]; act (and
// act_lo in split mode) [rows, inter] of T.
template <typename T> struct di_moe_gemm_args {
	const T *w, *x;
	const int *order;
	int div;
	const int *offsets;
	int num_experts, n, k, inter;
	float *y;
	T *act, *act_lo;
};

// di_mg_row is the weight row (within the expert) that the block's shared
// row r holds, clamped into the weight (ok false for a row past its end,
// which is computed but never stored).
template <typename T> __device__ __forceinline__ int di_mg_row(const di_moe_gemm_args<T> &p, int r, bool &ok) {
	if (p.inter > 0) {
		const int j = 64 * (int)blockIdx.x + (r & 63);
		ok = j < p.inter;
		return (r < 64 ? 0 : p.inter) + min(j, p.inter - 1);
	}
	const int f = MG_BM * (int)blockIdx.x + r;
	ok = f < p.n;
	return min(f, p.n - 1);
}

// di_mg_kblock is the 32-column block of k that stage s takes: pass w's
// blocks w, w + 4, ... (di_moe_mma_k's warp w), the passes in turn.
__device__ __forceinline__ int di_mg_kblock(int s, int nb) {
#pragma unroll
	for (int w = 0; w < 4; w++) {
		const int c = (nb - w + 3) >> 2;
		if (s < c) return w + 4 * s;
		s -= c;
	}
	return 0;
}

template <typename T, int MODE>
__global__ void __launch_bounds__(MG_THREADS, MG_MINB) di_moe_gemm_k(const di_moe_gemm_args<T> p) {
	extern __shared__ __align__(16) unsigned char mg_sh[];
	T *sa = reinterpret_cast<T *>(mg_sh);                               // [MG_STAGES][MG_BM][MG_BK]
	T *sb = sa + MG_STAGES * MG_BM * MG_BK;                             // [MG_STAGES][MG_BN][MG_BK]
	float *st = reinterpret_cast<float *>(sb + MG_STAGES * MG_BN * MG_BK); // [64][MG_THREADS]: finished passes
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	// The block's tile: the blockIdx.y-th row tile over the experts.
	int ex, r0;
	di_moe_row_tile(p.offsets, p.num_experts, MG_BN, blockIdx.y, lane, ex, r0);
	if (ex < 0) return;
	const int lo = p.offsets[ex] + r0, m = min(MG_BN, p.offsets[ex + 1] - lo);
	const int nb = p.k / MG_BK;
	// This thread's copies: 16 bytes of two weight rows and two input rows a stage.
	const T *asrc[2], *bsrc[2];
	int dst[2];
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int c = tid + MG_THREADS * i, r = c >> 2, part = c & 3;
		bool ok;
		asrc[i] = p.w + ((size_t)ex * p.n + di_mg_row(p, r, ok)) * p.k + 8 * part;
		const int row = lo + (r < m ? r : 0);
		bsrc[i] = p.x + (size_t)(p.order ? p.order[row] / p.div : row) * p.k + 8 * part;
		dst[i] = r * MG_BK + 8 * part;
	}
	auto issue = [&](int s) {
		const int kb = di_mg_kblock(s, nb) * MG_BK, slot = s % MG_STAGES;
		T *a = sa + slot * MG_BM * MG_BK, *b = sb + slot * MG_BN * MG_BK;
#pragma unroll
		for (int i = 0; i < 2; i++) {
			di_cp_async16(a + dst[i], asrc[i] + kb, true);
			di_cp_async16(b + dst[i], bsrc[i] + kb, true);
		}
	};
	const int wf = warp & 1, wt = warp >> 1;
	// Shared weight row of m16 tile mi's first row: gate tiles 0, 1 and their up tiles 2, 3 (paired).
	auto arow = [&](int mi) { return (mi < 2 ? 0 : 64) + 32 * wf + 16 * (mi & 1); };
	float acc[4][4][4];
#pragma unroll
	for (int mi = 0; mi < 4; mi++)
#pragma unroll
		for (int ni = 0; ni < 4; ni++)
#pragma unroll
			for (int q = 0; q < 4; q++) acc[mi][ni][q] = 0.f;
#pragma unroll
	for (int s = 0; s < MG_STAGES - 1; s++) {
		if (s < nb) issue(s);
		di_cp_async_commit();
	}
	int s = 0;
#pragma unroll 1
	for (int w = 0; w < 4; w++) {
		const int c = (nb - w + 3) >> 2;
#pragma unroll 1
		for (int i = 0; i < c; i++, s++) {
			di_cp_async_wait<MG_STAGES - 2>();
			__syncthreads(); // stage s has landed for every thread; stage s - 1's slot is free
			if (s + MG_STAGES - 1 < nb) issue(s + MG_STAGES - 1);
			di_cp_async_commit();
			const T *a = sa + (s % MG_STAGES) * MG_BM * MG_BK, *b = sb + (s % MG_STAGES) * MG_BN * MG_BK;
			uint4 xb[4];
#pragma unroll
			for (int ni = 0; ni < 4; ni++)
				xb[ni] = *reinterpret_cast<const uint4 *>(b + (32 * wt + 8 * ni + g) * MG_BK + 8 * t4);
#pragma unroll
			for (int mi = 0; mi < 4; mi++) {
				const uint4 wa = *reinterpret_cast<const uint4 *>(a + (arow(mi) + g) * MG_BK + 8 * t4);
				const uint4 wb = *reinterpret_cast<const uint4 *>(a + (arow(mi) + g + 8) * MG_BK + 8 * t4);
#pragma unroll
				for (int ni = 0; ni < 4; ni++) {
					di_mma16816<T>(acc[mi][ni], wa.x, wb.x, wa.y, wb.y, xb[ni].x, xb[ni].y);
					di_mma16816<T>(acc[mi][ni], wa.z, wb.z, wa.w, wb.w, xb[ni].z, xb[ni].w);
				}
			}
		}
		if (w < 3) { // the finished passes' sum: S0, then (S0 + S1), then ((S0 + S1) + S2)
#pragma unroll
			for (int mi = 0; mi < 4; mi++)
#pragma unroll
				for (int ni = 0; ni < 4; ni++)
#pragma unroll
					for (int q = 0; q < 4; q++) {
						float &t = st[((mi * 4 + ni) * 4 + q) * MG_THREADS + tid];
						t = w == 0 ? acc[mi][ni][q] : t + acc[mi][ni][q];
						acc[mi][ni][q] = 0.f;
					}
		}
	}
	di_cp_async_wait<0>();
#pragma unroll
	for (int mi = 0; mi < 4; mi++)
#pragma unroll
		for (int ni = 0; ni < 4; ni++)
#pragma unroll
			for (int q = 0; q < 4; q++)
				acc[mi][ni][q] = st[((mi * 4 + ni) * 4 + q) * MG_THREADS + tid] + acc[mi][ni][q];
	// Element q of tile (mi, ni): weight row arow(mi) + g + 8 (q >> 1), grouped row 32 wt + 8 ni + 2 t4 + (q & 1).
	if constexpr (MODE == MG_STORE || MODE == MG_ADD) {
#pragma unroll
		for (int mi = 0; mi < 4; mi++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				bool ok;
				const int f = di_mg_row(p, arow(mi) + g + 8 * h, ok);
				if (!ok) continue;
#pragma unroll
				for (int ni = 0; ni < 4; ni++)
#pragma unroll
					for (int e = 0; e < 2; e++) {
						const int r = 32 * wt + 8 * ni + 2 * t4 + e;
						if (r < m) {
							float *y = p.y + (size_t)(lo + r) * p.n + f;
							if constexpr (MODE == MG_ADD) *y = *y + acc[mi][ni][2 * h + e];
							else *y = acc[mi][ni][2 * h + e];
						}
					}
			}
	} else {
#pragma unroll
		for (int mi = 0; mi < 2; mi++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int j = 64 * (int)blockIdx.x + arow(mi) + g + 8 * h;
				if (j >= p.inter) continue;
#pragma unroll
				for (int ni = 0; ni < 4; ni++)
#pragma unroll
					for (int e = 0; e < 2; e++) {
						const int r = 32 * wt + 8 * ni + 2 * t4 + e;
						if (r < m) {
							const size_t row = (size_t)(lo + r);
							float gate = acc[mi][ni][2 * h + e], up = acc[mi + 2][ni][2 * h + e];
							if constexpr (MODE == MG_ADD_ACT) {
								gate = p.y[row * 2 * p.inter + j] + gate;
								up = p.y[row * 2 * p.inter + p.inter + j] + up;
							}
							di_to_gemm(p.act, p.act_lo, row * p.inter + j, di_moe_silu_mul(gate, up));
						}
					}
			}
	}
}

// di_moe_gemm_grid is the grid of a projection over pairs grouped rows:
// paired (gate/up) column tiles of 64 or plain ones of 128, and an upper
// bound of the experts' row tiles (sum of ceil(rows / MG_BN) over at most
// min(experts, pairs) experts with rows).
static dim3 di_moe_gemm_grid(size_t pairs, int num_experts, int n, int inter) {
	const size_t busy = pairs < (size_t)num_experts ? pairs : (size_t)num_experts;
	const size_t tiles = (pairs + (MG_BN - 1) * busy) / MG_BN;
	const unsigned x = inter > 0 ? (unsigned)((inter + 63) / 64) : (unsigned)((n + MG_BM - 1) / MG_BM);
	return dim3(x, (unsigned)(tiles > 0 ? tiles : 1));
}

// di_moe_gemm_ok says whether di_moe_gemm_k serves an MoE call: 16-bit
// weights, hidden and inter multiples of MG_BK, and a grid within CUDA's
// limits (the alignment is the caller's check).
static bool di_moe_gemm_ok(int w_dtype, size_t pairs, int num_experts, int hidden, int inter) {
	if ((w_dtype != DI_BF16 && w_dtype != DI_F16) || hidden % MG_BK != 0 || inter % MG_BK != 0) return false;
	return di_moe_gemm_grid(pairs, num_experts, hidden, 0).y <= 65535u;
}

// di_moe_big_smem lets kernel take smem bytes of dynamic shared memory,
// with the whole carveout as shared memory.
template <typename K> static cudaError_t di_moe_big_smem(K kernel, size_t smem) {
	cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
	if (e == cudaSuccess)
		e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
	return e;
}

template <typename T, int MODE>
static int di_moe_gemm(di_ctx *ctx, const di_moe_gemm_args<T> &p, size_t pairs) {
	auto kernel = di_moe_gemm_k<T, MODE>;
	// Two blocks a multiprocessor need 2 x (112 + 1) KB of its 228: the whole carveout as shared memory.
	const cudaError_t e = di_moe_big_smem(kernel, MG_SMEM);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "moe: grouped gemm: cudaFuncSetAttribute");
	kernel<<<di_moe_gemm_grid(pairs, p.num_experts, p.n, p.inter), MG_THREADS, MG_SMEM, ctx->stream>>>(p);
	return di_check_launch(ctx, "moe: grouped gemm");
}

#include "moe_wgmma.cuh"

// di_moe_gemm_any runs one grouped projection on di_moe_wg_k where wg is
// set, else on di_moe_gemm_k.
template <typename T, int MODE>
static int di_moe_gemm_any(di_ctx *ctx, const di_moe_gemm_args<T> &p, size_t pairs, bool wg) {
	return wg ? di_moe_wg<T, MODE>(ctx, p, pairs) : di_moe_gemm<T, MODE>(ctx, p, pairs);
}

// moe_gemm_mlp is moe_mlp's 16-bit path on di_moe_gemm_k (on di_moe_wg_k
// by default, ctx->moe_wg, where di_moe_wg_ok): xh (and xl) are
// x rounded to T; in GEMM mode round two launches (gate/up with the
// SiLU-mul fused into ah, then down into yh: rows of T on di_moe_wg_k with
// MW_Y16, *y16 then set, else float32); in split mode gate/up's hi and lo
// passes through gh (float32 [pairs, 2 inter]) into ah and al, and down's
// into yh.
template <typename T>
static int moe_gemm_mlp(di_ctx *ctx, float *gh, T *ah, T *al, float *yh, const T *xh, const T *xl, const int *order,
                        const int *offsets, const T *gate_up, const T *down, size_t pairs, int top_k, int hidden,
                        int inter, int num_experts, bool *y16) {
	di_moe_gemm_args<T> gu{gate_up, xh, order, top_k, offsets, num_experts, 2 * inter, hidden, inter, gh, ah, nullptr};
	di_moe_gemm_args<T> dn{down, ah, nullptr, 1, offsets, num_experts, hidden, inter, 0, yh, nullptr, nullptr};
	const bool wg = ctx->moe_wg && di_moe_wg_ok(pairs, hidden, inter);
	int r;
	if (!xl) {
		r = di_moe_gemm_any<T, MG_ACT>(ctx, gu, pairs, wg);
		if (r != DI_OK) return r;
		if (wg && MW_Y16) {
			dn.y = nullptr, dn.act = (T *)yh;
			*y16 = true;
			return di_moe_wg<T, MG_STORE16>(ctx, dn, pairs);
		}
		return di_moe_gemm_any<T, MG_STORE>(ctx, dn, pairs, wg);
	}
	r = di_moe_gemm_any<T, MG_STORE>(ctx, gu, pairs, wg);
	gu.x = xl, gu.act_lo = al;
	if (r == DI_OK) r = di_moe_gemm_any<T, MG_ADD_ACT>(ctx, gu, pairs, wg);
	if (r == DI_OK) r = di_moe_gemm_any<T, MG_STORE>(ctx, dn, pairs, wg);
	dn.x = al;
	if (r == DI_OK) r = di_moe_gemm_any<T, MG_ADD>(ctx, dn, pairs, wg);
	return r;
}

// moe_mlp runs the grouped gate/up GEMV, SiLU-mul and the down GEMV of
// moe_device for weights of type T: x (num_tokens rows) and the activations
// go to the GEMVs rounded to T once (hi and lo in split mode), or as float32
// for float32 weights. gemm (16-bit weights, di_moe_gemm_ok, no gx) runs
// both projections on a grouped GEMM instead (moe_gemm_mlp: wgmma, or the
// mma.sync one with di_moe_mma_k's bits; *y16 set where yh then holds rows
// of T). rounded: xr is x rounded to T already (x not read).
template <typename T>
static int moe_mlp(di_ctx *ctx, float *gh, void *act, float *yh, const float *x, void *xr, bool rounded,
                   const int *order, const int *offsets, const void *gate_up, const void *down, int num_tokens,
                   int pairs, int top_k, int hidden, int inter, int num_experts, const di_moe_gptoss *gx, bool gemm,
                   bool *y16) {
	if constexpr (std::is_same_v<T, float>) {
		int r = moe_gemv<T, float>(ctx, gh, x, nullptr, order, top_k, gate_up, offsets, num_experts, pairs, 2 * inter,
		                           hidden);
		if (r != DI_OK) return r;
		if (gx) {
			di_moe_act_clamped_k<float><<<di_grid((size_t)pairs * inter, 256), 256, 0, ctx->stream>>>(
			    (float *)act, nullptr, gh, order, pairs, inter, *gx);
			r = di_check_launch(ctx, "moe: silu_mul");
		} else {
			r = di_moe_act_f32(ctx, (float *)act, gh, pairs, inter, "moe: silu_mul");
		}
		if (r != DI_OK) return r;
		return moe_gemv<T, float>(ctx, yh, (const float *)act, nullptr, nullptr, 1, down, offsets, num_experts, pairs,
		                          hidden, inter);
	} else {
		const bool split = ctx->gemm_mode == DI_GEMM_SPLIT;
		const size_t nx = (size_t)num_tokens * hidden, na = (size_t)pairs * inter;
		T *xh = (T *)xr, *xl = split ? xh + nx : nullptr, *ah = (T *)act, *al = split ? ah + na : nullptr;
		int r = DI_OK;
		if (!rounded) {
			di_moe_round_k<T><<<di_grid(nx, 256), 256, 0, ctx->stream>>>(xh, xl, x, nx);
			r = di_check_launch(ctx, "moe: round");
		}
		if (r == DI_OK && gemm && !gx)
			return moe_gemm_mlp<T>(ctx, gh, ah, al, yh, xh, xl, order, offsets, (const T *)gate_up, (const T *)down,
			                       (size_t)pairs, top_k, hidden, inter, num_experts, y16);
		if (r == DI_OK)
			r = moe_gemv<T, T>(ctx, gh, xh, xl, order, top_k, gate_up, offsets, num_experts, pairs, 2 * inter,
			                   hidden);
		if (r != DI_OK) return r;
		if (gx)
			di_moe_act_clamped_k<T><<<di_grid(na, 256), 256, 0, ctx->stream>>>(ah, al, gh, order, pairs, inter, *gx);
		else
			di_moe_act_k<T><<<di_grid(na, 256), 256, 0, ctx->stream>>>(ah, al, gh, pairs, inter);
		r = di_check_launch(ctx, "moe: silu_mul");
		if (r != DI_OK) return r;
		return moe_gemv<T, T>(ctx, yh, ah, al, nullptr, 1, down, offsets, num_experts, pairs, hidden, inter);
	}
}

// ---------------------------------------------------------------- MXFP4 experts

// The MXFP4 expert MLP (di_op_moe_clamped_swiglu_mxfp4) shares moe_device's
// grouping (di_moe_group), x rounded to BF16 (di_moe_round_k) and combine,
// and runs each projection as one kernel of its own: gate_up with the biased
// clamped SwiGLU in its epilogue (writing the BF16 activations the down
// projection reads), down with its bias added in its epilogue. Either kernel
// is a tensor-core one (di_mx_mma_k, where the 16-bit call takes
// di_moe_mma_k: ctx->moe_mma) or a GEMV (di_mx_gemv_k, where it takes
// di_moe_gemv_k), and multiplies the widened weights (mxfp4.cuh) in that
// kernel's order, then adds the bias or applies the activation as
// di_moe_down_bias_k and di_moe_act_clamped_k do: the bits of the BF16 call.
//
// Both kernels have MX_WARPS = 8 warps a block in two halves of four, each
// half 16 weight rows of one expert: gate_up's block x takes rows 16 x ..
// 16 x + 15 of the gate (half 0) and the same rows of the up projection
// (half 1, rows inter + 16 x ..), so that its epilogue holds both inputs of
// the activation; down's block x takes rows 32 x .. 32 x + 31. The grid's y
// is a slot per expert that can have rows (min(num_experts, pairs)): block
// y works for the y-th expert with rows, in expert order (di_mx_expert), so
// that a decode step launches blocks for its few experts only (the 16-bit
// kernels launch a column of blocks for every expert, most of which return
// at once). Each warp streams its weight rows' codes through a copy ring of
// its own in shared memory (MX_STAGES segments of 1 KB in flight: a lane
// copies with cp.async what it alone reads back, so no barrier is needed),
// the block's scales staged once (32 rows of k/32 bytes). They are launched
// with programmatic dependent launch (di_launch): their launch overlaps the
// previous kernel's tail, and they touch no input before di_pdl_wait.
#define MX_WARPS 8
#define MX_STAGES 4 // a power of two, at least 4 (di_mx_mma_k keeps its sums in the ring)
#define MX_RING (MX_WARPS * MX_STAGES * 1024)
enum { MX_GATE_UP = 0, MX_DOWN = 1 };

// di_mx_weight is one MXFP4 projection's codes (device layout, mxfp4.cuh)
// and scales, [num_experts * n, k].
struct di_mx_weight {
	const uint8_t *codes, *scales;
};

// di_mx_proj is one MXFP4 projection call: weight w of n rows an expert
// and k columns; offsets the grouping's; x the BF16 inputs (and xlo, the
// remainders in split mode) of k columns, grouped row r's being row
// order[r] / div (order set) or r; bias [num_experts, n]. MX_GATE_UP (n =
// 2 inter) writes act (and act_lo) [rows, inter] in BF16, MX_DOWN y [rows,
// n] in float32.
struct di_mx_proj {
	di_mx_weight w;
	int n, k;
	const int *offsets;
	int num_experts;
	const __nv_bfloat16 *x, *xlo;
	const int *order;
	int div;
	__nv_bfloat16 *act, *act_lo;
	float *y;
	const float *bias;
	float limit, alpha;
};

// di_mx_row0 is the first weight row (within the expert) of half h of this
// block.
template <int MODE> __device__ __forceinline__ int di_mx_row0(int h, int n) {
	return MODE == MX_GATE_UP ? (h ? n / 2 : 0) + 16 * (int)blockIdx.x : 32 * (int)blockIdx.x + 16 * h;
}

// di_mx_stage_scales copies the block's 32 rows' scales (row i of half h at
// sc + (16 h + i) * rs) into shared memory, scale b of a row at pos(b), and
// reports whether any exceeds 128 (block-wide; also the barrier after which
// sc may be read).
template <int MODE, typename Pos>
__device__ bool di_mx_stage_scales(unsigned char *sc, int rs, const di_mx_proj &p, int ex, int nb, Pos pos) {
	const size_t base0 = ((size_t)ex * p.n + di_mx_row0<MODE>(0, p.n)) * nb;
	const size_t base1 = ((size_t)ex * p.n + di_mx_row0<MODE>(1, p.n)) * nb;
	const int total = 32 * nb;
	bool big = false;
	// 16 loads a thread in flight at once: one round trip up to k = 4096.
	for (int i0 = threadIdx.x; i0 < total; i0 += 16 * blockDim.x) {
		unsigned v[16];
#pragma unroll
		for (int u = 0; u < 16; u++) {
			const int i = i0 + u * blockDim.x, br = i / nb, b = i - br * nb;
			v[u] = i < total ? p.w.scales[(br < 16 ? base0 : base1) + (size_t)(br & 15) * nb + b] : 0u;
		}
#pragma unroll
		for (int u = 0; u < 16; u++) {
			const int i = i0 + u * blockDim.x, br = i / nb, b = i - br * nb;
			if (i < total) sc[br * rs + pos(b)] = (unsigned char)v[u];
			big |= v[u] > 128;
		}
	}
	return __syncthreads_or(big);
}

// di_mx_epilogue finishes a pass of m rows from r0 of expert ex (grouped
// rows lo + r0 ..): value(h, i, c) is the projection of weight row i of half
// h with the pass's row c, the bits di_moe_mma_k or di_moe_gemv_k stores.
// MX_GATE_UP: act = di_moe_act_clamped_k's clamped SwiGLU of the gate (half
// 0) and up (half 1) values plus their biases, in BF16 (and lo parts);
// MX_DOWN: y = value + bias, as di_moe_down_bias_k adds it.
template <int MODE, typename V>
__device__ __forceinline__ void di_mx_epilogue(const di_mx_proj &p, int ex, int lo, int r0, int m, V value) {
	const float *bias = p.bias + (size_t)ex * p.n;
	if (MODE == MX_GATE_UP) {
		const int inter = p.n >> 1, j0 = 16 * blockIdx.x;
		for (int i = threadIdx.x; i < 16 * m; i += blockDim.x) {
			const int wr = i & 15, c = i >> 4, j = j0 + wr;
			const float gate = fminf(value(0, wr, c) + bias[j], p.limit);
			const float up = fminf(fmaxf(value(1, wr, c) + bias[inter + j], -p.limit), p.limit);
			const float glu = gate * (float)(1.0 / (1.0 + exp(-(double)(p.alpha * gate))));
			di_to_gemm(p.act, p.act_lo, (size_t)(lo + r0 + c) * inter + j, (up + 1.f) * glu);
		}
	} else {
		const int j0 = 32 * blockIdx.x;
		for (int i = threadIdx.x; i < 32 * m; i += blockDim.x) {
			const int wr = i & 31, c = i >> 5;
			p.y[(size_t)(lo + r0 + c) * p.n + j0 + wr] = value(wr >> 4, wr & 15, c) + bias[j0 + wr];
		}
	}
}

// di_mx_pi is the place of step si's word among the four of a chain's 16
// bytes in a full segment (mxfp4.cuh).
__device__ __forceinline__ int di_mx_pi(int si) { return ((si & 1) << 1) | (si >> 1); }

// di_mx_mma_k is di_moe_mma_k over MXFP4 weights, T tiles of 8 rows a pass
// (T <= 4). Half h's four warps are di_moe_mma_k's four warps of the 16
// weight rows: warp c (chain c) takes the 32-column steps kb = 32 c + 128 s
// in ascending s, and lane (g, t4) widens, for rows g and g + 8 of the tile,
// the words of columns kb + 8 t4 .. + 7 into the BF16 fragments the 16-bit
// kernel loads, and multiplies them with the same mma.sync calls on the same
// x fragments; the four chains' sums are added in chain order. A warp's
// ring slot holds, for each lane, the 16 bytes of its two rows' codes in a
// segment (the words of its four steps there, one 16-byte copy each). At
// the end of a pass each lane leaves its accumulators in its own ring bytes
// for the epilogue. smem: MX_RING + 32 (4 cs + 4) bytes, cs = 4 ceil(k /
// 512) (the scales, a row's ordered by chain).
template <int T, bool SPLIT, int MODE>
__global__ void __launch_bounds__(MX_WARPS * 32, T == 1 ? 3 : 2) di_mx_mma_k(di_mx_proj p) {
	extern __shared__ __align__(16) unsigned char mx_smem[];
	di_pdl_wait();
	const int ex = di_mx_expert(p.offsets, p.num_experts, blockIdx.y);
	if (ex < 0) return;
	const int lo = p.offsets[ex], rows = p.offsets[ex + 1] - lo;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
	const int half = warp >> 2, chain = warp & 3;
	const int k = p.k, nb = k >> 5, nfull = nb >> 4, nt = nb & 15, ns = nfull + (nt > 0);
	const size_t rowb = (size_t)(k >> 1);
	const uint8_t *ra = p.w.codes + ((size_t)ex * p.n + di_mx_row0<MODE>(half, p.n) + g) * rowb, *rb = ra + 8 * rowb;
	unsigned char *ring = mx_smem + warp * (MX_STAGES * 1024), *sc = mx_smem + MX_RING;
	const int cs = 4 * ((nb + 15) >> 4), rs = 4 * cs + 4;
	auto issue = [&](int G) {
		if (G < ns) {
			unsigned char *slot = ring + (G & (MX_STAGES - 1)) * 1024 + lane * 16;
			if (G < nfull) {
				const size_t o = 256 * (size_t)G + 64 * chain + 16 * t4;
				di_cp_async16(slot, ra + o, true);
				di_cp_async16(slot + 512, rb + o, true);
			} else {
#pragma unroll
				for (int si = 0; si < 4; si++) {
					const int lb = 4 * si + chain;
					if (lb < nt) {
						const size_t o = 256 * (size_t)nfull + 16 * lb + 4 * t4;
						di_cp_async4(slot + 4 * di_mx_pi(si), ra + o);
						di_cp_async4(slot + 512 + 4 * di_mx_pi(si), rb + o);
					}
				}
			}
		}
		di_cp_async_commit();
	};
#pragma unroll
	for (int s = 0; s < MX_STAGES; s++) issue(s);
	const bool big = di_mx_stage_scales<MODE>(sc, rs, p, ex, nb, [cs](int b) { return (b & 3) * cs + (b >> 2); });
	const unsigned char *sa = sc + (16 * half + g) * rs + chain * cs, *sb = sa + 8 * rs;
	// A lane's float i in its ring bytes: stage i / 8, row half (i / 4) % 2.
	auto part = [&](int w, int ln, int i) -> float * {
		return reinterpret_cast<float *>(mx_smem + w * (MX_STAGES * 1024) + (i >> 3) * 1024 + ((i >> 2) & 1) * 512 +
		                                 ln * 16 + (i & 3) * 4);
	};
	for (int r0 = 0; r0 < rows; r0 += 8 * T) {
		const int m = min(8 * T, rows - r0), tiles = (m + 7) >> 3;
		if (r0 > 0) {
			__syncthreads(); // the previous epilogue has read the sums in the rings
#pragma unroll
			for (int s = 0; s < MX_STAGES; s++) issue(s);
		}
		int xo[T];
#pragma unroll
		for (int tl = 0; tl < T; tl++) {
			const int r = tl * 8 + g, row = lo + r0 + (r < m ? r : 0);
			xo[tl] = (p.order ? p.order[row] / p.div : row) * k + 8 * t4;
		}
		float acc[T][4], acc_lo[T][4];
#pragma unroll
		for (int tl = 0; tl < T; tl++)
#pragma unroll
			for (int e = 0; e < 4; e++) acc[tl][e] = acc_lo[tl][e] = 0.f;
		auto pass = [&](auto big_tag) {
			constexpr bool BIG = decltype(big_tag)::value;
			for (int G = 0; G < ns; G++) {
				di_cp_async_wait<MX_STAGES - 1>(); // segment G's copies (this lane's) have landed
				const unsigned char *slot = ring + (G & (MX_STAGES - 1)) * 1024 + lane * 16;
				const uint4 ca = *reinterpret_cast<const uint4 *>(slot), cb = *reinterpret_cast<const uint4 *>(slot + 512);
				const uint32_t s4a = *reinterpret_cast<const uint32_t *>(sa + 4 * G);
				const uint32_t s4b = *reinterpret_cast<const uint32_t *>(sb + 4 * G);
				const int steps = G < nfull ? 4 : (nt - chain + 3) >> 2;
#pragma unroll
				for (int si = 0; si < 4; si++) {
					if (si < steps) {
						const int kb = 512 * G + 128 * si + 32 * chain;
						uint4 xv[T], xl[T];
#pragma unroll
						for (int tl = 0; tl < T; tl++) {
							if (tl < tiles) {
								xv[tl] = *reinterpret_cast<const uint4 *>(p.x + xo[tl] + kb);
								if (SPLIT) xl[tl] = *reinterpret_cast<const uint4 *>(p.xlo + xo[tl] + kb);
							}
						}
						const uint4 a = di_mx_widen<BIG>(di_mx_word(ca, di_mx_pi(si)), di_mx_byte(s4a, si));
						const uint4 b = di_mx_widen<BIG>(di_mx_word(cb, di_mx_pi(si)), di_mx_byte(s4b, si));
#pragma unroll
						for (int tl = 0; tl < T; tl++) {
							if (tl < tiles) {
								di_mma16816<__nv_bfloat16>(acc[tl], a.x, b.x, a.y, b.y, xv[tl].x, xv[tl].y);
								di_mma16816<__nv_bfloat16>(acc[tl], a.z, b.z, a.w, b.w, xv[tl].z, xv[tl].w);
								if (SPLIT) {
									di_mma16816<__nv_bfloat16>(acc_lo[tl], a.x, b.x, a.y, b.y, xl[tl].x, xl[tl].y);
									di_mma16816<__nv_bfloat16>(acc_lo[tl], a.z, b.z, a.w, b.w, xl[tl].z, xl[tl].w);
								}
							}
						}
					}
				}
				issue(G + MX_STAGES); // into the slot just read (its words are used above)
			}
		};
		if (big) pass(std::true_type{});
		else pass(std::false_type{});
		di_cp_async_wait<0>();
#pragma unroll
		for (int tl = 0; tl < T; tl++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				*part(warp, lane, tl * 4 + e) = acc[tl][e];
				if (SPLIT) *part(warp, lane, 4 * T + tl * 4 + e) = acc_lo[tl][e];
			}
		__syncthreads();
		// di_moe_mma_k's sum of weight row i (of a half) and the pass's row c.
		di_mx_epilogue<MODE>(p, ex, lo, r0, m, [&](int h, int i, int c) {
			const int ln = (i & 7) * 4 + ((c & 7) >> 1), e = (c >> 3) * 4 + ((i >> 3) << 1) + (c & 1);
			const int w0 = 4 * h;
			float v = *part(w0, ln, e), vl = 0.f;
			if (SPLIT) vl = *part(w0, ln, 4 * T + e);
#pragma unroll
			for (int wi = 1; wi < 4; wi++) {
				v += *part(w0 + wi, ln, e);
				if (SPLIT) vl += *part(w0 + wi, ln, 4 * T + e);
			}
			return SPLIT ? v + vl : v;
		});
	}
}

// di_mx_gemv_k is di_moe_gemv_k over MXFP4 weights, RP rows a pass (RP <=
// 4; di_moe_gemv_k's passes of MOE_ROWS rows give the same bits, each
// (column, row) sum being its own). Warp q of half h computes weight rows
// 4 q .. 4 q + 3 of the half (four columns of di_moe_gemv_k, one warp
// each there): lane L sums each column's 8-element chunks at 8 L + 256 s in
// ascending s, as di_moe_gemv_k's lane L does, with the chunk's widened
// values as float32, and the warp adds the lanes in di_warp_sum's tree. A
// warp's ring slot holds, for each lane, the 8 bytes of each of its four
// rows' codes in a segment (the words of its two 256-column steps there,
// one 8-byte copy each). smem: MX_RING + 32 * 16 ceil(k / 512) (the scales,
// the two a lane reads in a segment side by side) + 128 RP bytes.
template <int RP, bool SPLIT, int MODE>
__global__ void __launch_bounds__(MX_WARPS * 32, 2) di_mx_gemv_k(di_mx_proj p) {
	extern __shared__ __align__(16) unsigned char mx_smem[];
	di_pdl_wait();
	const int ex = di_mx_expert(p.offsets, p.num_experts, blockIdx.y);
	if (ex < 0) return;
	const int lo = p.offsets[ex], rows = p.offsets[ex + 1] - lo;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = warp >> 2, q = warp & 3;
	const int k = p.k, nb = k >> 5, nfull = nb >> 4, nt = nb & 15, ns = nfull + (nt > 0);
	const size_t rowb = (size_t)(k >> 1);
	const uint8_t *r0c = p.w.codes + ((size_t)ex * p.n + di_mx_row0<MODE>(half, p.n) + 4 * q) * rowb;
	unsigned char *ring = mx_smem + warp * (MX_STAGES * 1024), *sc = mx_smem + MX_RING;
	const int rs = 16 * ((nb + 15) >> 4);
	float *res = reinterpret_cast<float *>(sc + 32 * rs); // [2 halves][16 rows][RP]
	// This lane's bytes of a full segment: chain (L / 4) % 4, word L % 4, half L / 16 of the 16.
	const int off = 64 * ((lane >> 2) & 3) + 16 * (lane & 3) + 8 * (lane >> 4);
	auto issue = [&](int G) {
		if (G < ns) {
			unsigned char *slot = ring + (G & (MX_STAGES - 1)) * 1024 + lane * 8;
#pragma unroll
			for (int c = 0; c < 4; c++) {
				const uint8_t *row = r0c + c * rowb;
				if (G < nfull) {
					di_cp_async8(slot + c * 256, row + 256 * (size_t)G + off);
				} else { // the tail: steps 2G (block lane / 4) and 2G + 1 (block 8 + lane / 4)
					if ((lane >> 2) < nt) di_cp_async4(slot + c * 256, row + 256 * (size_t)nfull + 4 * lane);
					if (8 + (lane >> 2) < nt) di_cp_async4(slot + c * 256 + 4, row + 256 * (size_t)nfull + 128 + 4 * lane);
				}
			}
		}
		di_cp_async_commit();
	};
#pragma unroll
	for (int s = 0; s < MX_STAGES; s++) issue(s);
	// Block b = 16 G + 8 h + i of a row at 16 G + 2 i + h: lane L's two in a segment side by side.
	const bool big = di_mx_stage_scales<MODE>(sc, rs, p, ex, nb,
	                                          [](int b) { return (b & ~15) | ((b & 7) << 1) | ((b >> 3) & 1); });
	const unsigned char *srow = sc + (16 * half + 4 * q) * rs + 2 * (lane >> 2);
	for (int r0 = 0; r0 < rows; r0 += RP) {
		const int m = min(RP, rows - r0);
		if (r0 > 0) {
			__syncthreads(); // the previous epilogue has read res
#pragma unroll
			for (int s = 0; s < MX_STAGES; s++) issue(s);
		}
		int xo[RP];
#pragma unroll
		for (int r = 0; r < RP; r++) {
			const int row = lo + r0 + (r < m ? r : 0);
			xo[r] = (p.order ? p.order[row] / p.div : row) * k + 8 * lane;
		}
		float acc[4][RP], acc_lo[4][RP];
#pragma unroll
		for (int c = 0; c < 4; c++)
#pragma unroll
			for (int r = 0; r < RP; r++) acc[c][r] = acc_lo[c][r] = 0.f;
		auto pass = [&](auto big_tag) {
			constexpr bool BIG = decltype(big_tag)::value;
			for (int G = 0; G < ns; G++) {
				di_cp_async_wait<MX_STAGES - 1>(); // segment G's copies (this lane's) have landed
				const unsigned char *slot = ring + (G & (MX_STAGES - 1)) * 1024 + lane * 8;
				uint2 cw[4];
				uint32_t s2[4];
#pragma unroll
				for (int c = 0; c < 4; c++) {
					cw[c] = *reinterpret_cast<const uint2 *>(slot + c * 256);
					s2[c] = *reinterpret_cast<const uint16_t *>(srow + c * rs + 16 * G);
				}
#pragma unroll
				for (int h = 0; h < 2; h++) {
					const int col = 512 * G + 256 * h + 8 * lane;
					if (col < k) {
						float wv[4][8];
#pragma unroll
						for (int c = 0; c < 4; c++)
							di_mx_f32(di_mx_widen<BIG>(h ? cw[c].y : cw[c].x, di_mx_byte(s2[c], h)), wv[c]);
#pragma unroll
						for (int r = 0; r < RP; r++) {
							if (r < m) {
								float xv[8];
								di_load8(p.x + xo[r] + 512 * G + 256 * h, xv);
#pragma unroll
								for (int c = 0; c < 4; c++) {
									float a = acc[c][r];
#pragma unroll
									for (int e = 0; e < 8; e++) a += wv[c][e] * xv[e];
									acc[c][r] = a;
								}
								if (SPLIT) {
									di_load8(p.xlo + xo[r] + 512 * G + 256 * h, xv);
#pragma unroll
									for (int c = 0; c < 4; c++) {
										float b = acc_lo[c][r];
#pragma unroll
										for (int e = 0; e < 8; e++) b += wv[c][e] * xv[e];
										acc_lo[c][r] = b;
									}
								}
							}
						}
					}
				}
				issue(G + MX_STAGES); // into the slot just read (its words are used above)
			}
		};
		if (big) pass(std::true_type{});
		else pass(std::false_type{});
#pragma unroll
		for (int c = 0; c < 4; c++) {
#pragma unroll
			for (int r = 0; r < RP; r++) {
				if (r < m) {
					float v = di_warp_sum(acc[c][r]);
					if (SPLIT) v += di_warp_sum(acc_lo[c][r]);
					if (lane == 0) res[(16 * half + 4 * q + c) * RP + r] = v;
				}
			}
		}
		__syncthreads();
		di_mx_epilogue<MODE>(p, ex, lo, r0, m, [&](int h, int i, int c) { return res[(16 * h + i) * RP + c]; });
	}
	di_cp_async_wait<0>();
}

// di_mx_smem is the shared memory of di_mx_mma_k (mma) or di_mx_gemv_k with
// rp rows a pass, for k columns.
static size_t di_mx_smem(bool mma, int rp, int k) {
	const int nb = k / 32;
	return mma ? MX_RING + 32 * (16 * ((nb + 15) / 16) + 4) : MX_RING + 32 * 16 * ((nb + 15) / 16) + 128 * rp;
}

// di_mx_start launches kernel with smem bytes of dynamic shared memory
// (opting in above 48 KB).
template <typename K> static int di_mx_start(di_ctx *ctx, K kernel, dim3 grid, size_t smem, const di_mx_proj &p) {
	if (smem > 48 * 1024) {
		const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
		if (e != cudaSuccess) return di_cuda_fail(ctx, e, "moe (mxfp4): cudaFuncSetAttribute");
	}
	di_launch(ctx, kernel, grid, dim3(MX_WARPS * 32), smem, p);
	return di_check_launch(ctx, "moe (mxfp4): projection");
}

// di_mx_project runs projection p (mode MODE) for a chunk of num_tokens
// tokens over slots expert slots: on tensor cores where the 16-bit call
// would be (ctx->moe_mma), passes of as many rows as an expert of the chunk
// can have up to 8, 16 or 32 (GEMV: 1, 2 or 4).
template <int MODE, bool SPLIT>
static int di_mx_project(di_ctx *ctx, const di_mx_proj &p, int slots, int num_tokens) {
	const dim3 grid((unsigned)(p.n / 32), (unsigned)slots); // gate_up: inter / 16 blocks; down: n / 32
	const bool mma = ctx->moe_mma != 0;
	const int rp = num_tokens <= 1 ? 1 : num_tokens <= 2 ? 2 : 4;
	const size_t smem = di_mx_smem(mma, rp, p.k);
	if (smem > 227 * 1024)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "moe (mxfp4): k %d needs %zu bytes of shared memory", p.k, smem);
	if (mma) {
		if (num_tokens <= 8) return di_mx_start(ctx, di_mx_mma_k<1, SPLIT, MODE>, grid, smem, p);
		if (num_tokens <= 16) return di_mx_start(ctx, di_mx_mma_k<2, SPLIT, MODE>, grid, smem, p);
		return di_mx_start(ctx, di_mx_mma_k<4, SPLIT, MODE>, grid, smem, p);
	}
	if (rp == 1) return di_mx_start(ctx, di_mx_gemv_k<1, SPLIT, MODE>, grid, smem, p);
	if (rp == 2) return di_mx_start(ctx, di_mx_gemv_k<2, SPLIT, MODE>, grid, smem, p);
	return di_mx_start(ctx, di_mx_gemv_k<4, SPLIT, MODE>, grid, smem, p);
}

// di_moe_mx are MXFP4 expert weights for moe_device.
struct di_moe_mx {
	di_mx_weight gate_up, down;
};

// moe_mx_mlp is moe_mlp with gx's bias and activation over MXFP4 experts,
// the down bias included: x (num_tokens rows) rounded to BF16 once (hi and
// lo in split mode) into xr, the activations (BF16, hi and lo) into act, the
// expert outputs into yh (grouped rows).
static int moe_mx_mlp(di_ctx *ctx, void *act, float *yh, const float *x, void *xr, const int *order,
                      const int *offsets, const di_moe_mx &mx, int num_tokens, int pairs, int top_k, int hidden,
                      int inter, int num_experts, const di_moe_gptoss &gx) {
	using B = __nv_bfloat16;
	const bool split = ctx->gemm_mode == DI_GEMM_SPLIT;
	const size_t nx = (size_t)num_tokens * hidden, na = (size_t)pairs * inter;
	B *xh = (B *)xr, *xl = split ? xh + nx : nullptr, *ah = (B *)act, *al = split ? ah + na : nullptr;
	di_moe_round_k<B><<<di_grid(nx, 256), 256, 0, ctx->stream>>>(xh, xl, x, nx);
	int r = di_check_launch(ctx, "moe (mxfp4): round");
	if (r != DI_OK) return r;
	const int slots = num_experts < pairs ? num_experts : pairs;
	const di_mx_proj gu{mx.gate_up, 2 * inter, hidden, offsets, num_experts, xh, xl, order, top_k, ah, al,
	                    nullptr, gx.gate_up_bias, gx.limit, gx.alpha};
	r = split ? di_mx_project<MX_GATE_UP, true>(ctx, gu, slots, num_tokens)
	          : di_mx_project<MX_GATE_UP, false>(ctx, gu, slots, num_tokens);
	if (r != DI_OK) return r;
	const di_mx_proj dn{mx.down, hidden, inter, offsets, num_experts, ah, al, nullptr, 1, nullptr, nullptr,
	                    yh, gx.down_bias, gx.limit, gx.alpha};
	return split ? di_mx_project<MX_DOWN, true>(ctx, dn, slots, num_tokens)
	             : di_mx_project<MX_DOWN, false>(ctx, dn, slots, num_tokens);
}

// moe_device is the MoE without the host: the grouping on the device, then
// the grouped projections (gemm: di_moe_gemm_k for 16-bit weights, see
// moe_mlp; dec: the decode path of 16-bit weights, moe_dec; else
// di_moe_mma_k or di_moe_gemv_k), the combine. x16: x is of the experts'
// 16-bit type, rounded already (di_op_moe's check), and no rounding runs.
static int moe_device(di_ctx *ctx, di_dptr out, di_dptr x, bool x16, di_dptr ids, di_dptr weights, di_dptr gate_up,
                      di_dptr down, int w_dtype, int num_tokens, int top_k, int hidden, int inter, int num_experts,
                      const di_moe_gptoss *gx = nullptr, const di_moe_mx *mx = nullptr, bool gemm = false,
                      const di_moe_route_args *route = nullptr) {
	const int pairs = num_tokens * top_k;
	gemm = gemm && !gx && !mx;
	// The decode path: where di_moe_mma_k would run both projections (16-bit
	// weights, k of both a multiple of 32) without gpt-oss's extras.
	const bool dec = !gemm && !gx && !mx && w_dtype != DI_F32 && ctx->moe_mma && hidden % 32 == 0 && inter % 32 == 0;
	// The routing (moe_set_route): in the decode path's prep launch where
	// that one block groups the pairs, else a launch of its own first.
	di_moe_route_args fused = {};
	if (route) {
		if (dec && di_moe_route_fuses(*route, pairs, num_experts)) {
			fused = *route;
		} else {
			const int r = di_route_launch(ctx, *route);
			if (r != DI_OK) return r;
		}
	}
	void *d_index = nullptr, *g = nullptr, *act = nullptr, *ye = nullptr, *xr = nullptr;
	// [offsets (num_experts + 1) | order (pairs) | row_of (pairs)]
	int rc = di_scratch(ctx, (num_experts + 1 + 2 * (size_t)pairs) * sizeof(int), &d_index);
	// The gate/up outputs (MXFP4 experts, the decode path, and the grouped
	// GEMM in GEMM mode round, apply the activation in the gate/up kernel).
	const bool need_g = !mx && !dec && !(gemm && ctx->gemm_mode != DI_GEMM_SPLIT);
	if (rc == DI_OK && need_g) rc = di_scratch(ctx, (size_t)pairs * 2 * inter * sizeof(float), &g);
	// Activations: float32, or 16-bit hi (and lo) parts in the same bytes.
	if (rc == DI_OK) rc = di_scratch(ctx, (size_t)pairs * inter * sizeof(float), &act);
	if (rc == DI_OK) rc = di_scratch(ctx, (size_t)pairs * hidden * sizeof(float), &ye);
	// x rounded for 16-bit weights: hi (and lo) parts, at most float32's bytes (x itself where x16).
	if (rc == DI_OK && w_dtype != DI_F32 && !x16)
		rc = di_scratch(ctx, (size_t)num_tokens * hidden * sizeof(float), &xr);
	if (x16) xr = DI_PTR(void, x);
	int *offsets = (int *)d_index, *order = offsets + num_experts + 1, *row_of = order + pairs;
	if (rc == DI_OK && !dec)
		rc = di_moe_group(ctx, offsets, order, row_of, DI_PTR(const int, ids), pairs, num_experts, "moe: group");
	auto run = [&]() -> int {
		float *gh = (float *)g, *yh = (float *)ye;
		if (dec) {
			DI_DISPATCH_WEIGHT(w_dtype, T, {
				const int r = moe_dec<T>(ctx, act, yh, xr, DI_PTR(const float, x), x16, DI_PTR(const int, ids), offsets,
				                         order, row_of, (const void *)gate_up, (const void *)down, num_tokens, pairs,
				                         top_k, hidden, inter, num_experts, fused);
				if (r != DI_OK) return r;
			});
			return di_moe_combine(ctx, DI_PTR(float, out), yh, row_of, DI_PTR(const float, weights), num_tokens,
			                      top_k, hidden, "moe: combine");
		}
		if (mx) { // gx is set: the MXFP4 experts are gpt-oss's (di_op_moe_clamped_swiglu_mxfp4)
			const int r = moe_mx_mlp(ctx, act, yh, DI_PTR(const float, x), xr, order, offsets, *mx, num_tokens, pairs,
			                         top_k, hidden, inter, num_experts, *gx);
			if (r != DI_OK) return r;
			return di_moe_combine(ctx, DI_PTR(float, out), yh, row_of, DI_PTR(const float, weights), num_tokens,
			                      top_k, hidden, "moe: combine");
		}
		DI_DISPATCH_WEIGHT(w_dtype, T, {
			bool y16 = false;
			const int r = moe_mlp<T>(ctx, gh, act, yh, DI_PTR(const float, x), xr, x16, order, offsets,
			                         (const void *)gate_up, (const void *)down, num_tokens, pairs, top_k, hidden,
			                         inter, num_experts, gx, gemm, &y16);
			if (r != DI_OK) return r;
			if (y16)
				return di_moe_combine_rows(ctx, DI_PTR(float, out), (const T *)(const void *)yh, row_of,
				                           DI_PTR(const float, weights), num_tokens, top_k, hidden, "moe: combine");
		});
		if (gx) {
			di_moe_down_bias_k<<<di_grid((size_t)pairs * hidden, 256), 256, 0, ctx->stream>>>(yh, order, pairs, hidden,
			                                                                                 *gx);
			const int r = di_check_launch(ctx, "moe: down bias");
			if (r != DI_OK) return r;
		}
		return di_moe_combine(ctx, DI_PTR(float, out), yh, row_of, DI_PTR(const float, weights), num_tokens, top_k,
		                      hidden, "moe: combine");
	};
	if (rc == DI_OK) rc = run();
	if (xr && !x16) di_scratch_free(ctx, xr);
	di_scratch_free(ctx, ye);
	di_scratch_free(ctx, act);
	if (g) di_scratch_free(ctx, g);
	di_scratch_free(ctx, d_index);
	return rc;
}

extern "C" int di_op_moe(di_ctx *ctx, di_dptr out, di_dptr x, int x_dtype, di_dptr ids, di_dptr weights,
                         di_dptr gate_up, di_dptr down, int w_dtype, int num_tokens, int top_k, int hidden, int inter,
                         int num_experts) {
	// x of the experts' 16-bit type: rounded already, as GEMM mode round
	// rounds a float32 x on every path (the same bits, one pass fewer).
	const bool x16 = x_dtype != DI_F32;
	if (x16 && (x_dtype != w_dtype || (w_dtype != DI_BF16 && w_dtype != DI_F16) || ctx->gemm_mode != DI_GEMM_ROUND))
		return di_fail(ctx, DI_ERR_INVALID,
		               "moe: x of dtype %d takes experts of that 16-bit dtype (they are %d) in GEMM mode round", x_dtype,
		               w_dtype);
	// moe_set_route's routing: this call's ids and weights, run here.
	const di_moe_route_args *route = nullptr;
	if (ctx->moe_route_set && !ctx->moe_route_used) {
		const di_moe_route_args &r = ctx->moe_route;
		if (r.ids != DI_PTR(int, ids) || r.weights != DI_PTR(float, weights) || r.num_tokens != num_tokens ||
		    r.e != num_experts || r.top_k != top_k)
			return di_fail(ctx, DI_ERR_INVALID,
			               "moe: the routing set (%d tokens, %d of %d experts) is not this call's (%d tokens, %d of "
			               "%d experts, or other ids and weights)",
			               r.num_tokens, r.top_k, r.e, num_tokens, top_k, num_experts);
		ctx->moe_route_used = true;
		route = &r;
	}
	if (num_tokens == 0) return DI_OK;
	cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
	cudaStreamIsCapturing(ctx->stream, &cap);
	const bool capturing = cap != cudaStreamCaptureStatusNone;
	const size_t pairs = (size_t)num_tokens * top_k;
	// The GEMV reads 16-byte chunks: rows of a multiple of 8 elements, aligned.
	const bool shape_ok = hidden % 8 == 0 && inter % 8 == 0 && (x % 16) == 0 && (gate_up % 16) == 0 &&
	                      (down % 16) == 0 && di_moe_group_ok(pairs, num_experts);
	// 16-bit experts stay on the device at every size (unless moe_gemm_pairs
	// is negative): from ctx->moe_gemm_pairs pairs a grouped GEMM
	// (moe_gemm_mlp), below it di_moe_mma_k itself.
	const bool device16 =
	    shape_ok && ctx->moe_gemm_pairs > 0 && di_moe_gemm_ok(w_dtype, pairs, num_experts, hidden, inter);
	const bool gemm = device16 && pairs >= (size_t)ctx->moe_gemm_pairs;
	if (shape_ok && (device16 || capturing || pairs <= MOE_DEVICE_MAX_PAIRS))
		return moe_device(ctx, out, x, x16, ids, weights, gate_up, down, w_dtype, num_tokens, top_k, hidden, inter,
		                  num_experts, nullptr, nullptr, gemm, route);
	if (route) {
		const int r = di_route_launch(ctx, *route);
		if (r != DI_OK) return r;
	}
	if (capturing)
		return di_fail(ctx, DI_ERR_CAPTURING,
		               "moe: hidden %d and intermediate %d must be multiples of 8 with 16-byte aligned tensors and "
		               "at most %d experts to run on the device; the host path is not capturable",
		               hidden, inter, MOE_GROUP_MAX_EXPERTS);
	return moe_host(ctx, out, x, x16, ids, weights, gate_up, down, w_dtype, num_tokens, top_k, hidden, inter,
	                num_experts);
}

// moe_clamped_swiglu is di_op_moe for gpt-oss's experts (biased
// projections, clamped SwiGLU; kernels.BiasedMoEer), over dense weights
// (gate_up and down of w_dtype) or MXFP4 ones (mx; gate_up and down are
// then the code blocks, for the alignment check). It always takes the
// device path, in chunks of tokens of at most MOE_DEVICE_MAX_PAIRS (token,
// k) pairs, so it never waits for the host and is capturable; a chunk
// reads each of its experts' weights once (correct, not fast, for long
// prefills).
static int moe_clamped_swiglu(di_ctx *ctx, const char *op, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights,
                              di_dptr gate_up, di_dptr gate_up_bias, di_dptr down, di_dptr down_bias, int w_dtype,
                              int num_tokens, int top_k, int hidden, int inter, int num_experts, float limit,
                              float alpha, const di_moe_mx *mx) {
	if (num_tokens == 0) return DI_OK;
	if (top_k < 1 || top_k > MOE_DEVICE_MAX_PAIRS) return di_fail(ctx, DI_ERR_INVALID, "%s: top_k %d", op, top_k);
	const bool shape_ok = hidden % 8 == 0 && inter % 8 == 0 && (x % 16) == 0 && (gate_up % 16) == 0 &&
	                      (down % 16) == 0 &&
	                      (MOE_DEVICE_MAX_PAIRS + num_experts + 1) * sizeof(int) <= 48 * 1024;
	if (!shape_ok)
		return di_fail(ctx, DI_ERR_UNSUPPORTED,
		               "%s: hidden %d and intermediate %d must be multiples of 8 with 16-byte "
		               "aligned tensors, and %d experts at most %d",
		               op, hidden, inter, num_experts, (int)(48 * 1024 / sizeof(int)) - MOE_DEVICE_MAX_PAIRS - 1);
	const int chunk = MOE_DEVICE_MAX_PAIRS / top_k;
	for (int t0 = 0; t0 < num_tokens; t0 += chunk) {
		const int n = num_tokens - t0 < chunk ? num_tokens - t0 : chunk;
		const size_t pair0 = (size_t)t0 * top_k, row0 = (size_t)t0 * hidden;
		const di_moe_gptoss gx{DI_PTR(const float, gate_up_bias), DI_PTR(const float, down_bias),
		                       DI_PTR(const int, ids) + pair0, limit, alpha};
		const int rc = moe_device(ctx, out + row0 * sizeof(float), x + row0 * sizeof(float), false,
		                          ids + pair0 * sizeof(int), weights + pair0 * sizeof(float), gate_up, down, w_dtype,
		                          n, top_k, hidden, inter, num_experts, &gx, mx);
		if (rc != DI_OK) return rc;
	}
	return DI_OK;
}

extern "C" int di_op_moe_clamped_swiglu(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights,
                                        di_dptr gate_up, di_dptr gate_up_bias, di_dptr down, di_dptr down_bias,
                                        int w_dtype, int num_tokens, int top_k, int hidden, int inter,
                                        int num_experts, float limit, float alpha) {
	return moe_clamped_swiglu(ctx, "moe_clamped_swiglu", out, x, ids, weights, gate_up, gate_up_bias, down, down_bias,
	                          w_dtype, num_tokens, top_k, hidden, inter, num_experts, limit, alpha, nullptr);
}

// di_op_moe_clamped_swiglu_mxfp4 is di_op_moe_clamped_swiglu over MXFP4
// expert weights (codes in mxfp4.cuh's device layout): the MXFP4 kernels
// (moe_mx_mlp) read the 4-bit codes and E8M0 scales, widen them to BF16 in
// registers and multiply them in the 16-bit kernels' order, so the result
// is the BF16 call's for the widened weights, bit for bit (GEMM mode and
// di_options.disable_moe_mma as that call's).
extern "C" int di_op_moe_clamped_swiglu_mxfp4(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights,
                                              di_dptr gate_up_blocks, di_dptr gate_up_scales, di_dptr gate_up_bias,
                                              di_dptr down_blocks, di_dptr down_scales, di_dptr down_bias,
                                              int num_tokens, int top_k, int hidden, int inter, int num_experts,
                                              float limit, float alpha) {
	const char *op = "moe_clamped_swiglu_mxfp4";
	if (hidden % 32 != 0 || inter % 32 != 0)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "%s: hidden %d and intermediate %d must be multiples of 32", op,
		               hidden, inter);
	if (!gate_up_scales || !down_scales) return di_fail(ctx, DI_ERR_INVALID, "%s: missing scales", op);
	const di_moe_mx mx{{DI_PTR(const uint8_t, gate_up_blocks), DI_PTR(const uint8_t, gate_up_scales)},
	                   {DI_PTR(const uint8_t, down_blocks), DI_PTR(const uint8_t, down_scales)}};
	return moe_clamped_swiglu(ctx, op, out, x, ids, weights, gate_up_blocks, gate_up_bias, down_blocks, down_bias,
	                          DI_BF16, num_tokens, top_k, hidden, inter, num_experts, limit, alpha, &mx);
}
