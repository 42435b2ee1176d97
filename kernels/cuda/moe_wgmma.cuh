// moe_wgmma.cuh: the grouped expert GEMM on Hopper's warpgroup MMA
// (wgmma), included by moe.cu after di_moe_gemm_k, whose arguments, grid,
// row mapping and epilogue modes it shares.
//
// di_moe_wg_k computes the same products as di_moe_gemm_k (the paired
// gate/up layout, MG_BN = 128 grouped rows of one expert a block, the four
// epilogue modes), MW_BM weight rows a block, with each output element
// summed over k in natural order, 16 columns a wgmma step, into one float32
// accumulator: not di_moe_mma_k's four interleaved passes, so not its
// bits. A token's result still does not depend on the other tokens (every
// element of a wgmma tile is its own dot product, in an order fixed by k),
// but it differs in rounding from what the small batches' kernels give the
// same token (as the dense layers' cuBLAS GEMMs differ from their GEMVs).
// It runs by default where di_moe_wg_ok (Options.DisableMoEWGMMA keeps the
// mma.sync GEMM).
//
// Layout: a block of two warpgroups (256 threads) and MW_BM = 256 weight
// rows (MW_WIDE; 128 with MW_WIDE=0); warpgroup w multiplies the shared
// weight rows 64 w + 128 h .. + 63 of each row group h by all 128 grouped
// rows, wgmma.m64n128k16 with both operands K-major in shared memory in the
// 128-byte swizzle (a row of 64 columns of k is one 128-byte line, its
// 16-byte chunk c stored at chunk c ^ (row & 7)). Paired, the first 128
// shared rows are gate rows and the next 128 the up rows of the same
// columns, so a thread holds the gate (h = 0) and up (h = 1) sums of its
// elements and the SiLU-mul needs no exchange (with MW_WIDE=0 the up sums
// of warpgroup 1 go through shared memory). Every thread queues 12 cp.async
// copies a stage (8 of weights, 4 of inputs, 16 bytes each; inputs gathered
// through the grouping's order), MW_STAGES stages of MW_BK = 64 columns in
// a ring, one barrier a stage, MW_INFLIGHT groups of wgmma left running
// across it; a thread's 64 accumulators a row group are the wgmma D
// fragment (rows 16 (warp % 4) + lane / 4 (+ 8), grouped rows 8 j + 2
// (lane % 4) (+ 1), j = 0..15).
//
// Needs k a multiple of MW_BK (hidden and intermediate), sm_90a. Cost: 2 *
// rows * n * k flops on the tensor cores' native path; 48 KB of shared
// memory a stage (4 stages, one block a multiprocessor), 185-186 registers;
// the tiles read 85 flops a byte from L2 (64 with MW_WIDE=0).
#include "wgmma.cuh"

#define MW_BK 64
#ifndef MW_STAGES
#define MW_STAGES 4
#endif
#ifndef MW_MINB
#define MW_MINB 1
#endif
#ifndef MW_INFLIGHT
#define MW_INFLIGHT 1 // wgmma groups a warpgroup leaves running at the end of a stage: 0 or 1
#endif
#define MW_AHEAD (MW_STAGES - 1 - MW_INFLIGHT) // stages queued ahead of the one multiplied
static_assert(MW_AHEAD >= 1, "MW_STAGES too small for MW_INFLIGHT");
#ifndef MW_WIDE
#define MW_WIDE 1 // 1: 256 weight rows a block, two row groups a warpgroup (0: 128)
#endif
#define MW_GROUPS (1 + MW_WIDE)
#define MW_BM (128 * MW_GROUPS) // weight rows a block
#define MW_THREADS 256
#define MW_A_BYTES (MW_BM * MW_BK * 2)  // a stage of weight rows: 128-byte lines
#define MW_B_BYTES (MG_BN * MW_BK * 2)  // a stage of grouped rows
#define MW_STAGE_BYTES (MW_A_BYTES + MW_B_BYTES)
#define MW_SMEM ((size_t)MW_STAGES * MW_STAGE_BYTES + 1024)
static_assert(MG_BN == 128, "di_moe_wg_k takes di_moe_gemm_k's row tiles");

// di_mw_row is the weight row (within the expert) that shared row r of the
// block's MW_BM rows holds, clamped into the weight (ok false for a row
// past its end, computed but never stored): paired, the first half gate
// rows MW_BM / 2 x .. and the second half the up rows of the same columns;
// otherwise rows MW_BM x ...
template <typename T> __device__ __forceinline__ int di_mw_row(const di_moe_gemm_args<T> &p, int r, bool &ok) {
	if (p.inter > 0) {
		constexpr int half = MW_BM / 2;
		const int j = half * (int)blockIdx.x + (r % half);
		ok = j < p.inter;
		return (r < half ? 0 : p.inter) + min(j, p.inter - 1);
	}
	const int f = MW_BM * (int)blockIdx.x + r;
	ok = f < p.n;
	return min(f, p.n - 1);
}

// di_mw_act writes silu(gate) * up at act[i] (and its remainder at act_lo[i]):
// out of line, so that the epilogue's 64 calls stay unrolled and the
// accumulators in registers.
template <typename T> __device__ __noinline__ void di_mw_act(T *act, T *act_lo, size_t i, float gate, float up) {
	di_to_gemm(act, act_lo, i, di_moe_silu_mul(gate, up));
}

template <typename T, int MODE>
__global__ void __launch_bounds__(MW_THREADS, MW_MINB) di_moe_wg_k(const di_moe_gemm_args<T> p) {
#ifndef MW_HAS_WGMMA
	__trap(); // di_moe_wg_ok keeps other targets' builds from launching it
#endif
	extern __shared__ __align__(16) unsigned char mw_raw[];
	// The swizzle repeats every 1024 bytes: tiles start on such a boundary.
	const unsigned raw = (unsigned)__cvta_generic_to_shared(mw_raw);
	const unsigned base = (raw + 1023u) & ~1023u;
	unsigned char *sh = mw_raw + (base - raw);
	const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	int ex, r0;
	di_moe_row_tile(p.offsets, p.num_experts, MG_BN, blockIdx.y, lane, ex, r0);
	if (ex < 0) return;
	const int lo = p.offsets[ex] + r0, m = min(MG_BN, p.offsets[ex + 1] - lo);
	const int nk = p.k / MW_BK;
	// This thread's copies: 16-byte chunk tid % 8 of shared rows tid / 8 + 32 i.
	constexpr int NA = MW_BM / 32; // weight copies a stage
	const int part = tid & 7;
	const T *asrc[NA], *bsrc[4];
	const unsigned dst = (unsigned)((tid >> 3) * 128 + ((part ^ ((tid >> 3) & 7)) << 4)); // + 4096 i
#pragma unroll
	for (int i = 0; i < NA; i++) {
		bool ok;
		asrc[i] = p.w + ((size_t)ex * p.n + di_mw_row(p, (tid >> 3) + 32 * i, ok)) * p.k + 8 * part;
	}
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const int r = (tid >> 3) + 32 * i, row = lo + (r < m ? r : 0);
		bsrc[i] = p.x + (size_t)(p.order ? p.order[row] / p.div : row) * p.k + 8 * part;
	}
	auto issue = [&](int s) {
		const int kb = s * MW_BK;
		unsigned char *a = sh + (size_t)(s % MW_STAGES) * MW_STAGE_BYTES, *b = a + MW_A_BYTES;
#pragma unroll
		for (int i = 0; i < NA; i++) di_cp_async16(a + dst + 4096 * i, asrc[i] + kb, true);
#pragma unroll
		for (int i = 0; i < 4; i++) di_cp_async16(b + dst + 4096 * i, bsrc[i] + kb, true);
	};
	// d[h]: this warpgroup's shared weight rows 64 wg + 128 h .. + 63 by the 128 grouped rows.
	float d[MW_GROUPS][64];
#pragma unroll
	for (int h = 0; h < MW_GROUPS; h++)
#pragma unroll
		for (int i = 0; i < 64; i++) d[h][i] = 0.f;
#pragma unroll
	for (int s = 0; s < MW_AHEAD; s++) {
		if (s < nk) issue(s);
		di_cp_async_commit();
	}
#pragma unroll 1
	for (int s = 0; s < nk; s++) {
		di_cp_async_wait<MW_AHEAD - 1>();
		di_fence_async_shared();
		// Stage s has landed, and every warpgroup has finished the products
		// of stage s - 1 - MW_INFLIGHT, whose slot the next copy refills.
		__syncthreads();
		if (s + MW_AHEAD < nk) issue(s + MW_AHEAD);
		di_cp_async_commit();
		const unsigned a = base + (unsigned)((s % MW_STAGES) * MW_STAGE_BYTES), b = a + MW_A_BYTES;
		di_wg_fence();
#pragma unroll
		for (int kk = 0; kk < MW_BK / 16; kk++)
#pragma unroll
			for (int h = 0; h < MW_GROUPS; h++)
				di_wg_mma<T>(d[h], di_wg_desc(a + (64 * wg + 128 * h) * 128 + kk * 32), di_wg_desc(b + kk * 32));
		di_wg_commit();
		di_wg_wait<MW_INFLIGHT>();
	}
	di_wg_wait<0>();
	di_cp_async_wait<0>();
	// Element i of d[h]: shared weight row 64 wg + 128 h + 16 (warp % 4) + g + 8 ((i >> 1) & 1),
	// grouped row 8 (i >> 2) + 2 t4 + (i & 1).
	const int rw = 16 * ((tid >> 5) & 3) + g;
	if constexpr (MODE == MG_STORE || MODE == MG_ADD) {
#pragma unroll
		for (int h = 0; h < MW_GROUPS; h++)
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
				bool ok;
				const int f = di_mw_row(p, 64 * wg + 128 * h + rw + 8 * hh, ok);
				if (!ok) continue;
#pragma unroll
				for (int c = 0; c < 16; c++)
#pragma unroll
					for (int e = 0; e < 2; e++) {
						const int r = 8 * c + 2 * t4 + e;
						if (r < m) {
							float *y = p.y + (size_t)(lo + r) * p.n + f;
							if constexpr (MODE == MG_ADD) *y = *y + d[h][4 * c + 2 * hh + e];
							else *y = d[h][4 * c + 2 * hh + e];
						}
					}
			}
	} else {
		// Paired: the gate sums of column j and its up sums. With two row
		// groups a warpgroup (MW_WIDE) a thread holds both, in d[0] and d[1];
		// with one, the up sums of warpgroup 1 go through shared memory to
		// the threads of warpgroup 0 that hold the gate sums.
		const float *up_of = nullptr;
		if constexpr (MW_GROUPS == 1) {
			float *xs = reinterpret_cast<float *>(sh);
			__syncthreads(); // every warpgroup is past its last products
			if (wg == 1) {
#pragma unroll
				for (int i = 0; i < 64; i++) xs[i * 128 + (tid - 128)] = d[0][i];
			}
			__syncthreads();
			if (wg == 1) return;
			up_of = xs + tid;
		}
#pragma unroll
		for (int hh = 0; hh < 2; hh++) {
			const int j = (MW_BM / 2) * (int)blockIdx.x + 64 * (MW_GROUPS - 1) * wg + rw + 8 * hh;
			if (j >= p.inter) continue;
#pragma unroll
			for (int c = 0; c < 16; c++)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					const int r = 8 * c + 2 * t4 + e;
					if (r < m) {
						const int i = 4 * c + 2 * hh + e;
						const size_t row = (size_t)(lo + r);
						float gate = d[0][i], up = MW_GROUPS == 1 ? up_of[i * 128] : d[MW_GROUPS - 1][i];
						if constexpr (MODE == MG_ADD_ACT) {
							gate = p.y[row * 2 * p.inter + j] + gate;
							up = p.y[row * 2 * p.inter + p.inter + j] + up;
						}
						di_mw_act(p.act, p.act_lo, row * p.inter + j, gate, up);
					}
				}
		}
	}
}

// di_moe_wg_grid is di_moe_gemm_grid for MW_BM weight rows a block.
static dim3 di_moe_wg_grid(size_t pairs, int num_experts, int n, int inter) {
	dim3 gr = di_moe_gemm_grid(pairs, num_experts, n, inter);
	gr.x = inter > 0 ? (unsigned)((inter + MW_BM / 2 - 1) / (MW_BM / 2)) : (unsigned)((n + MW_BM - 1) / MW_BM);
	return gr;
}

// di_moe_wg_ok says whether di_moe_wg_k can take a call that di_moe_gemm_k
// could: a library built for sm_90a (the only target with wgmma), hidden
// and intermediate multiples of MW_BK.
static bool di_moe_wg_ok(int hidden, int inter) {
	return di_wg_arch_ok() && hidden % MW_BK == 0 && inter % MW_BK == 0;
}

template <typename T, int MODE>
static int di_moe_wg(di_ctx *ctx, const di_moe_gemm_args<T> &p, size_t pairs) {
	auto kernel = di_moe_wg_k<T, MODE>;
	const cudaError_t e = di_moe_big_smem(kernel, MW_SMEM);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "moe: grouped wgmma gemm: cudaFuncSetAttribute");
	kernel<<<di_moe_wg_grid(pairs, p.num_experts, p.n, p.inter), MW_THREADS, MW_SMEM, ctx->stream>>>(p);
	return di_check_launch(ctx, "moe: grouped wgmma gemm");
}
