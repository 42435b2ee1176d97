// moe.cuh: the expert routing steps that moe.cu (the 16-bit and float32
// expert MLP) shares with fp8_moe.cu (the FP8 expert MLP): grouping the
// (token, k) pairs by expert on the device, the float32 SiLU-mul between
// the projections and the combine of each token's k outputs. Defined in
// moe.cu; not part of the ABI. Each launches one kernel on ctx's stream
// and returns di_check_launch(ctx, op).
#pragma once

#include "common.cuh"

// di_moe_group groups pairs routing ids by expert on the device (a stable
// counting sort, no host wait): offsets[e] .. offsets[e+1] are expert e's
// rows (num_experts + 1 ints), order[row] the pair at that row (an expert's
// pairs in pair order), row_of[pair] its row, or -1 for an id outside
// [0, num_experts) (which sets DI_CHECK_MOE in ctx->check and leaves the
// pair out). The result is the unique stable grouping, whichever kernels
// compute it: where di_moe_group_one (up to 1024 pairs, di_moe_group_smem
// within 48 KiB) one block (di_moe_group_block, segments of 32 pairs a
// warp); above, three launches over segments of 256 pairs a
// warp (count per segment and expert, prefix sums, placement), at most
// MOE_GROUP_MAX_EXPERTS experts, with num_experts * segments ints of
// scratch. di_moe_group_ok says whether a call can be grouped.
#define MOE_GROUP_MAX_EXPERTS 3072
bool di_moe_group_ok(size_t pairs, int num_experts);
// di_moe_group_smem is the dynamic shared memory di_moe_group_block needs:
// (segments * num_experts + 2 num_experts + 1) ints, segments = ceil(pairs
// / 32). di_moe_group_one says whether one block groups the call (up to
// 1024 pairs, that memory within 48 KiB): then a kernel may group with
// di_moe_group_block in one of its blocks instead of a launch of its own.
static inline size_t di_moe_group_smem(size_t pairs, int num_experts) {
	return (((pairs + 31) / 32) * (size_t)num_experts + 2 * (size_t)num_experts + 1) * sizeof(int);
}
bool di_moe_group_one(size_t pairs, int num_experts);
int di_moe_group(di_ctx *ctx, int *offsets, int *order, int *row_of, const int *ids, int pairs, int num_experts,
                 const char *op);

// di_moe_row_tile finds row tile number want when each expert's rows
// (offsets[e] to offsets[e+1]) are cut into tiles of bn rows, numbered
// expert by expert: the tile's expert (ex; -1 past the last tile) and its
// first row within the expert (r0). The grouped GEMMs (moe.cu,
// fp8_moe.cu) give each block one tile (want = blockIdx.y). The lanes of a
// warp scan 32 experts at a time, so every lane of the warp must call it.
// Cost: num_experts / 32 warp scans.
static __device__ __forceinline__ void di_moe_row_tile(const int *offsets, int num_experts, int bn, int want, int lane,
                                                       int &ex, int &r0) {
	ex = -1, r0 = 0;
	int seen = 0;
	for (int e0 = 0; e0 < num_experts && ex < 0; e0 += 32) {
		const int e = e0 + lane;
		const int nt = e < num_experts ? (offsets[e + 1] - offsets[e] + bn - 1) / bn : 0;
		int incl = nt;
#pragma unroll
		for (int off = 1; off < 32; off <<= 1) {
			const int o = __shfl_up_sync(0xffffffffu, incl, off);
			if (lane >= off) incl += o;
		}
		const unsigned hit = __ballot_sync(0xffffffffu, want < seen + incl);
		if (hit) {
			const int l = __ffs(hit) - 1;
			const int before = __shfl_sync(0xffffffffu, seen + incl - nt, l);
			ex = e0 + l;
			r0 = (want - before) * bn;
		}
		seen += __shfl_sync(0xffffffffu, incl, 31);
	}
}

// di_moe_group_block is di_moe_group's one-block grouping, run by the
// calling block (blockDim.x a multiple of 32) with sh holding
// di_moe_group_smem bytes of shared memory. The pairs are cut into segments
// of 32, a warp a segment: (1) each pair's rank among the pairs of its
// segment with the same expert (__match_any_sync), the segment's count of
// each expert; (2) thread e turns expert e's counts into the rows of the
// segments before (a prefix over segments); (3) warp 0 scans the experts'
// totals into offsets; (4) each pair's row is its expert's offset, plus its
// segment's prefix, plus its rank: an expert's rows in pair order, the
// unique stable grouping. An id outside [0, num_experts) sets DI_CHECK_MOE
// in check and row_of[pair] = -1 (left out). Cost: two reads of the ids,
// segments steps a thread in (2), num_experts / 32 in (3); the earlier
// kernel (thread e scanning all ids) took 14 us at 384 pairs over 64
// experts (V2-Lite, batch 64), 3.3 at 6 pairs. Inlined into the kernels
// that group (moe.cu, fp8_moe.cu).
static __device__ __forceinline__ void di_moe_group_block(int *sh, int *offsets, int *order, int *row_of,
                                                          const int *ids, int pairs, int num_experts,
                                                          unsigned *check) {
	const int segs = (pairs + 31) >> 5, ne = num_experts;
	int *cnt = sh, *tot = sh + segs * ne, *off = tot + ne; // [segs][ne], [ne], [ne + 1]
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const unsigned below = (1u << lane) - 1u;
	for (int i = threadIdx.x; i < segs * ne; i += blockDim.x) cnt[i] = 0;
	__syncthreads();
	for (int s = warp; s < segs; s += nw) {
		const int p = s * 32 + lane, v = p < pairs ? ids[p] : -1;
		const bool ok = v >= 0 && v < ne;
		if (p < pairs && !ok) {
			atomicOr(check, DI_CHECK_MOE);
			row_of[p] = -1;
		}
		const unsigned peers = __match_any_sync(0xffffffffu, ok ? v : -1);
		if (ok && (peers & below) == 0) cnt[s * ne + v] = __popc(peers);
	}
	__syncthreads();
	for (int e = threadIdx.x; e < ne; e += blockDim.x) {
		int run = 0;
		for (int s = 0; s < segs; s++) {
			const int c = cnt[s * ne + e];
			cnt[s * ne + e] = run;
			run += c;
		}
		tot[e] = run;
	}
	__syncthreads();
	if (warp == 0) {
		int run = 0;
		for (int e0 = 0; e0 < ne; e0 += 32) {
			const int e = e0 + lane, v = e < ne ? tot[e] : 0;
			int incl = v;
#pragma unroll
			for (int o = 1; o < 32; o <<= 1) {
				const int t = __shfl_up_sync(0xffffffffu, incl, o);
				if (lane >= o) incl += t;
			}
			if (e < ne) off[e] = run + incl - v;
			run += __shfl_sync(0xffffffffu, incl, 31);
		}
		if (lane == 0) off[ne] = run;
	}
	__syncthreads();
	for (int e = threadIdx.x; e <= ne; e += blockDim.x) offsets[e] = off[e];
	for (int s = warp; s < segs; s += nw) {
		const int p = s * 32 + lane, v = p < pairs ? ids[p] : -1;
		const bool ok = v >= 0 && v < ne;
		const unsigned peers = __match_any_sync(0xffffffffu, ok ? v : -1);
		if (ok) {
			const int r = off[v] + cnt[s * ne + v] + __popc(peers & below);
			order[r] = p;
			row_of[p] = r;
		}
	}
}

// di_moe_act_f32 computes act[r, j] = silu(g[r, j]) * g[r, inter + j] in
// float32 for rows rows (g is [rows, 2*inter], act [rows, inter]): the silu
// in float64, rounded to float32, times up.
int di_moe_act_f32(di_ctx *ctx, float *act, const float *g, size_t rows, int inter, const char *op);

// di_moe_combine computes out[t] = sum_k w[t,k] ye[row_of[t*top_k+k]] for
// num_tokens tokens of hidden floats, a fused multiply-add per k in k
// order; pairs with row_of -1 (an id out of range) are left out.
// Launched with programmatic dependent launch (di_launch): its launch
// overlaps the tail of the kernel before it.
int di_moe_combine(di_ctx *ctx, float *out, const float *ye, const int *row_of, const float *w, int num_tokens,
                   int top_k, int hidden, const char *op);
