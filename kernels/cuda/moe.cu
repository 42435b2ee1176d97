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
// Every output element is a fixed-order dot product, so a token's result
// does not depend on the other tokens (batch-invariant).
// Larger batches (prefill) copy the routing ids to the host (one small
// transfer and a wait), group there, and run two cuBLAS GEMMs per selected
// expert.
#include <math_constants.h>

#include <type_traits>
#include <vector>

#include "common.cuh"
#include "moe.cuh"

#define ROUTE_MAX_EXPERTS 512
#define ROUTE_MAX_GROUPS 64
#define MOE_DEVICE_MAX_PAIRS 1024 // larger batches group on the host and run cuBLAS
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
__device__ __forceinline__ void di_route_pick(float &v, int &i) {
#pragma unroll
	for (int off = 16; off > 0; off >>= 1) {
		const float ov = __shfl_xor_sync(0xffffffffu, v, off);
		const int oi = __shfl_xor_sync(0xffffffffu, i, off);
		if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
	}
}

__global__ void __launch_bounds__(32)
    di_moe_route_k(int *ids, float *weights, const float *logits, const float *bias, int e, int top_k, int scoring,
                   int method, int num_groups, int topk_groups, int norm_topk, float scaling) {
	__shared__ float sc[ROUTE_MAX_EXPERTS], ch[ROUTE_MAX_EXPERTS], gs[ROUTE_MAX_GROUPS];
	__shared__ double ex[ROUTE_MAX_EXPERTS];
	const int t = blockIdx.x, lane = threadIdx.x;
	const float *lg = logits + (size_t)t * e;
	if (scoring == DI_SCORING_SOFTMAX) {
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
	for (int i = lane; i < e; i += 32) ch[i] = bias ? sc[i] + bias[i] : sc[i];
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
		for (int k = 0; k < topk_groups; k++) {
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
			ids[(size_t)t * top_k + k] = best;
			weights[(size_t)t * top_k + k] = sc[best];
			sum += sc[best];
		}
	}
	if (lane == 0) {
		float *w = weights + (size_t)t * top_k;
		if (norm_topk) {
			const float d = sum + 1e-20f;
			for (int k = 0; k < top_k; k++) w[k] /= d;
		}
		for (int k = 0; k < top_k; k++) w[k] *= scaling;
	}
}

extern "C" int di_op_moe_route(di_ctx *ctx, di_dptr ids, di_dptr weights, di_dptr logits, di_dptr bias,
                               int num_tokens, int num_experts, int top_k, int scoring, int method, int num_groups,
                               int topk_groups, int norm_topk_prob, float scaling_factor) {
	if (num_tokens == 0) return DI_OK;
	if (num_experts > ROUTE_MAX_EXPERTS || num_groups > ROUTE_MAX_GROUPS)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "moe_route: %d experts in %d groups, at most %d in %d", num_experts,
		               num_groups, ROUTE_MAX_EXPERTS, ROUTE_MAX_GROUPS);
	if (top_k > num_experts || (method != DI_TOPK_GREEDY && topk_groups > num_groups))
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "moe_route: top_k %d of %d experts, %d of %d groups", top_k,
		               num_experts, topk_groups, num_groups);
	di_moe_route_k<<<num_tokens, 32, 0, ctx->stream>>>(DI_PTR(int, ids), DI_PTR(float, weights),
	                                                   DI_PTR(const float, logits), DI_PTR(const float, bias),
	                                                   num_experts, top_k, scoring, method, num_groups, topk_groups,
	                                                   norm_topk_prob, scaling_factor);
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
static __global__ void di_moe_combine_k(float *out, const float *ye, const int *row_of, const float *w, int top_k,
                                        int hidden) {
	const int t = blockIdx.x;
	for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
		float a = 0.f;
		for (int k = 0; k < top_k; k++) {
			const int r = row_of[t * top_k + k];
			if (r < 0) continue; // an expert id out of range (reported by the check word)
			a = fmaf(w[t * top_k + k], ye[(size_t)r * hidden + j], a);
		}
		out[(size_t)t * hidden + j] = a;
	}
}

int di_moe_combine(di_ctx *ctx, float *out, const float *ye, const int *row_of, const float *w, int num_tokens,
                   int top_k, int hidden, const char *op) {
	di_moe_combine_k<<<num_tokens, 256, 0, ctx->stream>>>(out, ye, row_of, w, top_k, hidden);
	return di_check_launch(ctx, op);
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

static int moe_host(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, di_dptr gate_up, di_dptr down,
                    int w_dtype, int num_tokens, int top_k, int hidden, int inter, int num_experts) {
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

// group: one block. offsets[e]..offsets[e+1] are expert e's rows; order[row]
// is the pair at that row (pairs of one expert in pair order); row_of[pair]
// its row, or -1 for an id outside the experts (which sets DI_CHECK_MOE).
// Thread e scans all ids for expert e: P reads of shared memory each.
static __global__ void di_moe_group_k(int *offsets, int *order, int *row_of, const int *ids, int pairs,
                                      int num_experts, unsigned *check) {
	extern __shared__ int sh[]; // [pairs ids | num_experts + 1 offsets]
	int *sid = sh, *off = sh + pairs;
	for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
		int v = ids[p];
		if (v < 0 || v >= num_experts) {
			atomicOr(check, DI_CHECK_MOE);
			v = -1;
			row_of[p] = -1;
		}
		sid[p] = v;
	}
	__syncthreads();
	for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
		int c = 0;
		for (int p = 0; p < pairs; p++) c += sid[p] == e;
		off[e + 1] = c;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		off[0] = 0;
		for (int e = 0; e < num_experts; e++) off[e + 1] += off[e];
	}
	__syncthreads();
	for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) offsets[e] = off[e];
	for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
		int r = off[e];
		for (int p = 0; p < pairs; p++)
			if (sid[p] == e) {
				order[r] = p;
				row_of[p] = r;
				r++;
			}
	}
}

int di_moe_group(di_ctx *ctx, int *offsets, int *order, int *row_of, const int *ids, int pairs, int num_experts,
                 const char *op) {
	const size_t shared = (pairs + num_experts + 1) * sizeof(int);
	di_moe_group_k<<<1, 512, shared, ctx->stream>>>(offsets, order, row_of, ids, pairs, num_experts, ctx->check);
	return di_check_launch(ctx, op);
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
// columns j0 .. j0+15 (j0 = 16 blockIdx.x; the weight rows are mma.sync
// m16n8k16's A operand) for the expert's rows in tiles of 8 (the B operand;
// up to four tiles, 32 rows, a pass over the weights). Its four warps deal
// the 32-column blocks of k among them (warp w takes blocks w, w + 4, ...),
// so that at batch 1 a column's weights are read by four warps at once;
// each warp keeps float32 accumulators in registers, and warp 0 adds the
// four warps' sums in warp order. Per 32 columns of k a lane reads 16 bytes
// of weight rows g and g+8 and 16 bytes of each tile's row g, straight from
// global memory, and feeds the first four of its eight columns to one mma
// and the last four to a second (the same permutation of the reduction
// index for A and B; as gemm_skinny.cu's di_skinny_k). In split mode the lo
// parts go to accumulators of their own, added at the end.
// Batch invariance: out[row][j] is a fixed-order sum of the tensor-core
// products of weight row j with that row (each warp's blocks in ascending
// k, then the warps in order); each element of an mma tile is its own dot
// product, and rows past the expert's count are never stored, so a token's
// result does not depend on the other tokens.
// Cost: the expert's weights read once per 32 of its rows; 8 KB of shared
// memory (16 KB in split mode) for the warps' sums.
#define MOE_MMA_WARPS 4
template <typename T, bool SPLIT>
__global__ void __launch_bounds__(MOE_MMA_WARPS * 32)
    di_moe_mma_k(float *out, const T *x, const T *xlo, const int *order, int div, const T *w, const int *offsets,
                 int n, int k) {
	__shared__ float part[SPLIT ? 2 : 1][MOE_MMA_WARPS][32][16];
	const int ex = blockIdx.y;
	const int lo = offsets[ex], rows = offsets[ex + 1] - lo;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
	const int j0 = blockIdx.x * 16;
	if (rows <= 0 || j0 >= n) return;
	const T *wa = w + ((size_t)ex * n + min(j0 + g, n - 1)) * k + 8 * t4;
	const T *wb = w + ((size_t)ex * n + min(j0 + g + 8, n - 1)) * k + 8 * t4;
	for (int r0 = 0; r0 < rows; r0 += 32) {
		const int m = min(32, rows - r0), tiles = (m + 7) / 8;
		size_t xo[4];
#pragma unroll
		for (int tl = 0; tl < 4; tl++) {
			const int r = tl * 8 + g, row = lo + r0 + (r < m ? r : 0);
			xo[tl] = (size_t)(order ? order[row] / div : row) * k + 8 * t4;
		}
		float acc[4][4], acc_lo[4][4];
#pragma unroll
		for (int tl = 0; tl < 4; tl++)
#pragma unroll
			for (int e = 0; e < 4; e++) acc[tl][e] = acc_lo[tl][e] = 0.f;
#pragma unroll 2
		for (int kb = warp * 32; kb < k; kb += MOE_MMA_WARPS * 32) {
			const uint4 a = *reinterpret_cast<const uint4 *>(wa + kb), b = *reinterpret_cast<const uint4 *>(wb + kb);
#pragma unroll
			for (int tl = 0; tl < 4; tl++) {
				if (tl < tiles) {
					const uint4 xv = *reinterpret_cast<const uint4 *>(x + xo[tl] + kb);
					di_mma16816<T>(acc[tl], a.x, b.x, a.y, b.y, xv.x, xv.y);
					di_mma16816<T>(acc[tl], a.z, b.z, a.w, b.w, xv.z, xv.w);
					if (SPLIT) {
						const uint4 xl = *reinterpret_cast<const uint4 *>(xlo + xo[tl] + kb);
						di_mma16816<T>(acc_lo[tl], a.x, b.x, a.y, b.y, xl.x, xl.y);
						di_mma16816<T>(acc_lo[tl], a.z, b.z, a.w, b.w, xl.z, xl.w);
					}
				}
			}
		}
		if (r0 > 0) __syncthreads(); // warp 0 has read the previous pass's sums
#pragma unroll
		for (int tl = 0; tl < 4; tl++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				part[0][warp][lane][tl * 4 + e] = acc[tl][e];
				if (SPLIT) part[SPLIT ? 1 : 0][warp][lane][tl * 4 + e] = acc_lo[tl][e];
			}
		__syncthreads();
		if (warp == 0) {
#pragma unroll
			for (int tl = 0; tl < 4; tl++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int r = tl * 8 + 2 * t4 + (e & 1), j = j0 + g + 8 * (e >> 1);
					if (tl < tiles && r < m && j < n) {
						float v = part[0][0][lane][tl * 4 + e], vl = 0.f;
						if (SPLIT) vl = part[SPLIT ? 1 : 0][0][lane][tl * 4 + e];
#pragma unroll
						for (int wi = 1; wi < MOE_MMA_WARPS; wi++) {
							v += part[0][wi][lane][tl * 4 + e];
							if (SPLIT) vl += part[SPLIT ? 1 : 0][wi][lane][tl * 4 + e];
						}
						out[(size_t)(lo + r0 + r) * n + j] = SPLIT ? v + vl : v;
					}
				}
			}
		}
	}
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
                    const int *offsets, int num_experts, int n, int k) {
	if constexpr (std::is_same_v<W, X> && !std::is_same_v<W, float>) {
		if (ctx->moe_mma && k % 32 == 0) {
			const dim3 grid((unsigned)((n + 15) / 16), (unsigned)num_experts);
			if (xlo)
				di_moe_mma_k<W, true><<<grid, MOE_MMA_WARPS * 32, 0, ctx->stream>>>(out, x, xlo, order, div,
				                                                                    (const W *)w, offsets, n, k);
			else
				di_moe_mma_k<W, false><<<grid, MOE_MMA_WARPS * 32, 0, ctx->stream>>>(out, x, xlo, order, div,
				                                                                     (const W *)w, offsets, n, k);
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

// moe_mlp runs the grouped gate/up GEMV, SiLU-mul and the down GEMV of
// moe_device for weights of type T: x (num_tokens rows) and the activations
// go to the GEMVs rounded to T once (hi and lo in split mode), or as float32
// for float32 weights.
template <typename T>
static int moe_mlp(di_ctx *ctx, float *gh, void *act, float *yh, const float *x, void *xr, const int *order,
                   const int *offsets, const void *gate_up, const void *down, int num_tokens, int pairs, int top_k,
                   int hidden, int inter, int num_experts, const di_moe_gptoss *gx) {
	if constexpr (std::is_same_v<T, float>) {
		int r = moe_gemv<T, float>(ctx, gh, x, nullptr, order, top_k, gate_up, offsets, num_experts, 2 * inter, hidden);
		if (r != DI_OK) return r;
		if (gx) {
			di_moe_act_clamped_k<float><<<di_grid((size_t)pairs * inter, 256), 256, 0, ctx->stream>>>(
			    (float *)act, nullptr, gh, order, pairs, inter, *gx);
			r = di_check_launch(ctx, "moe: silu_mul");
		} else {
			r = di_moe_act_f32(ctx, (float *)act, gh, pairs, inter, "moe: silu_mul");
		}
		if (r != DI_OK) return r;
		return moe_gemv<T, float>(ctx, yh, (const float *)act, nullptr, nullptr, 1, down, offsets, num_experts, hidden,
		                          inter);
	} else {
		const bool split = ctx->gemm_mode == DI_GEMM_SPLIT;
		const size_t nx = (size_t)num_tokens * hidden, na = (size_t)pairs * inter;
		T *xh = (T *)xr, *xl = split ? xh + nx : nullptr, *ah = (T *)act, *al = split ? ah + na : nullptr;
		di_moe_round_k<T><<<di_grid(nx, 256), 256, 0, ctx->stream>>>(xh, xl, x, nx);
		int r = di_check_launch(ctx, "moe: round");
		if (r == DI_OK)
			r = moe_gemv<T, T>(ctx, gh, xh, xl, order, top_k, gate_up, offsets, num_experts, 2 * inter, hidden);
		if (r != DI_OK) return r;
		if (gx)
			di_moe_act_clamped_k<T><<<di_grid(na, 256), 256, 0, ctx->stream>>>(ah, al, gh, order, pairs, inter, *gx);
		else
			di_moe_act_k<T><<<di_grid(na, 256), 256, 0, ctx->stream>>>(ah, al, gh, pairs, inter);
		r = di_check_launch(ctx, "moe: silu_mul");
		if (r != DI_OK) return r;
		return moe_gemv<T, T>(ctx, yh, ah, al, nullptr, 1, down, offsets, num_experts, hidden, inter);
	}
}

static int moe_device(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, di_dptr gate_up,
                      di_dptr down, int w_dtype, int num_tokens, int top_k, int hidden, int inter, int num_experts,
                      const di_moe_gptoss *gx = nullptr) {
	const int pairs = num_tokens * top_k;
	void *d_index = nullptr, *g = nullptr, *act = nullptr, *ye = nullptr, *xr = nullptr;
	// [offsets (num_experts + 1) | order (pairs) | row_of (pairs)]
	int rc = di_scratch(ctx, (num_experts + 1 + 2 * (size_t)pairs) * sizeof(int), &d_index);
	if (rc == DI_OK) rc = di_scratch(ctx, (size_t)pairs * 2 * inter * sizeof(float), &g);
	// Activations: float32, or 16-bit hi (and lo) parts in the same bytes.
	if (rc == DI_OK) rc = di_scratch(ctx, (size_t)pairs * inter * sizeof(float), &act);
	if (rc == DI_OK) rc = di_scratch(ctx, (size_t)pairs * hidden * sizeof(float), &ye);
	// x rounded for 16-bit weights: hi (and lo) parts, at most float32's bytes.
	if (rc == DI_OK && w_dtype != DI_F32) rc = di_scratch(ctx, (size_t)num_tokens * hidden * sizeof(float), &xr);
	int *offsets = (int *)d_index, *order = offsets + num_experts + 1, *row_of = order + pairs;
	if (rc == DI_OK)
		rc = di_moe_group(ctx, offsets, order, row_of, DI_PTR(const int, ids), pairs, num_experts, "moe: group");
	auto run = [&]() -> int {
		float *gh = (float *)g, *yh = (float *)ye;
		DI_DISPATCH_WEIGHT(w_dtype, T, {
			const int r = moe_mlp<T>(ctx, gh, act, yh, DI_PTR(const float, x), xr, order, offsets,
			                         (const void *)gate_up, (const void *)down, num_tokens, pairs, top_k, hidden,
			                         inter, num_experts, gx);
			if (r != DI_OK) return r;
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
	if (xr) di_scratch_free(ctx, xr);
	di_scratch_free(ctx, ye);
	di_scratch_free(ctx, act);
	di_scratch_free(ctx, g);
	di_scratch_free(ctx, d_index);
	return rc;
}

extern "C" int di_op_moe(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, di_dptr gate_up,
                         di_dptr down, int w_dtype, int num_tokens, int top_k, int hidden, int inter,
                         int num_experts) {
	if (num_tokens == 0) return DI_OK;
	cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
	cudaStreamIsCapturing(ctx->stream, &cap);
	const bool capturing = cap != cudaStreamCaptureStatusNone;
	const size_t pairs = (size_t)num_tokens * top_k;
	// The GEMV reads 16-byte chunks: rows of a multiple of 8 elements, aligned.
	const bool shape_ok = hidden % 8 == 0 && inter % 8 == 0 && (x % 16) == 0 && (gate_up % 16) == 0 &&
	                      (down % 16) == 0 && (pairs + num_experts + 1) * sizeof(int) <= 48 * 1024;
	if (shape_ok && (capturing || pairs <= MOE_DEVICE_MAX_PAIRS))
		return moe_device(ctx, out, x, ids, weights, gate_up, down, w_dtype, num_tokens, top_k, hidden, inter,
		                  num_experts);
	if (capturing)
		return di_fail(ctx, DI_ERR_CAPTURING,
		               "moe: hidden %d and intermediate %d must be multiples of 8 with 16-byte aligned tensors and "
		               "at most %d pairs to run on the device; the host path is not capturable",
		               hidden, inter, (int)(48 * 1024 / sizeof(int)) - num_experts - 1);
	return moe_host(ctx, out, x, ids, weights, gate_up, down, w_dtype, num_tokens, top_k, hidden, inter, num_experts);
}

// di_op_moe_clamped_swiglu is di_op_moe for gpt-oss's experts (biased
// projections, clamped SwiGLU; kernels.BiasedMoEer). It always takes the
// device path, in chunks of tokens of at most MOE_DEVICE_MAX_PAIRS (token,
// k) pairs, so it never waits for the host and is capturable; a chunk
// reads each of its experts' weights once (correct, not fast, for long
// prefills).
extern "C" int di_op_moe_clamped_swiglu(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights,
                                        di_dptr gate_up, di_dptr gate_up_bias, di_dptr down, di_dptr down_bias,
                                        int w_dtype, int num_tokens, int top_k, int hidden, int inter,
                                        int num_experts, float limit, float alpha) {
	if (num_tokens == 0) return DI_OK;
	if (top_k < 1 || top_k > MOE_DEVICE_MAX_PAIRS)
		return di_fail(ctx, DI_ERR_INVALID, "moe_clamped_swiglu: top_k %d", top_k);
	const bool shape_ok = hidden % 8 == 0 && inter % 8 == 0 && (x % 16) == 0 && (gate_up % 16) == 0 &&
	                      (down % 16) == 0 &&
	                      (MOE_DEVICE_MAX_PAIRS + num_experts + 1) * sizeof(int) <= 48 * 1024;
	if (!shape_ok)
		return di_fail(ctx, DI_ERR_UNSUPPORTED,
		               "moe_clamped_swiglu: hidden %d and intermediate %d must be multiples of 8 with 16-byte "
		               "aligned tensors, and %d experts at most %d",
		               hidden, inter, num_experts, (int)(48 * 1024 / sizeof(int)) - MOE_DEVICE_MAX_PAIRS - 1);
	const int chunk = MOE_DEVICE_MAX_PAIRS / top_k;
	for (int t0 = 0; t0 < num_tokens; t0 += chunk) {
		const int n = num_tokens - t0 < chunk ? num_tokens - t0 : chunk;
		const size_t pair0 = (size_t)t0 * top_k, row0 = (size_t)t0 * hidden;
		const di_moe_gptoss gx{DI_PTR(const float, gate_up_bias), DI_PTR(const float, down_bias),
		                       DI_PTR(const int, ids) + pair0, limit, alpha};
		const int rc = moe_device(ctx, out + row0 * sizeof(float), x + row0 * sizeof(float),
		                          ids + pair0 * sizeof(int), weights + pair0 * sizeof(float), gate_up, down, w_dtype,
		                          n, top_k, hidden, inter, num_experts, &gx);
		if (rc != DI_OK) return rc;
	}
	return DI_OK;
}
