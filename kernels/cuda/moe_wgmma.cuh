// moe_wgmma.cuh: the grouped expert GEMM on Hopper's warpgroup MMA
// (wgmma), included by moe.cu after di_moe_gemm_k, whose arguments, row
// tiles (MG_BN = 128 grouped rows of one expert) and epilogue modes it
// shares.
//
// di_moe_wg_k computes the same products as di_moe_gemm_k (the paired
// gate/up layout, the four epilogue modes, and MG_STORE16: the sums rounded
// to T into act [rows, n], half the bytes of float32 rows for the
// combine to read), 256 weight rows by 128 grouped
// rows a tile, with each output element summed over k in natural order, 16
// columns a wgmma step, into one float32 accumulator: not di_moe_mma_k's
// four interleaved passes, so not its bits. A token's result still does
// not depend on the other tokens (every element of a wgmma tile is its own
// dot product, in an order fixed by k), but it differs in rounding from
// what the small batches' kernels give the same token (as the dense
// layers' cuBLAS GEMMs differ from their GEMVs). It runs by default where
// di_moe_wg_ok (Options.DisableMoEWGMMA keeps the mma.sync GEMM).
//
// Roles: a producer warpgroup queues each stage's copies, MW_STAGES
// stages of MW_BK = 64 columns of k in a ring, each signalled on the
// stage's "full" mbarrier: the weight tile by 16-byte cp.async copies,
// or with MW_TMA by the tensor memory accelerator (two boxes of 128 rows,
// from a tensor map over every expert's rows; cp.async where the driver
// has no encoder for it), the gathered input rows by cp.async (through
// the grouping's order), each producer thread arriving once its copies
// land. Two
// consumer warpgroups wait, fence, issue the stage's eight
// wgmma.m64n128k16 and release the stage on its "empty" mbarrier once
// those are done (one arrival a warp); no block-wide barrier in the loop.
// Blocks are persistent (one a multiprocessor, tiles in di_moe_wg_grid's
// order), so the producer fills the next tile's stages while the
// consumers store the last. setmaxnreg gives the consumers MW_CREGS
// registers and the producer MW_PREGS.
//
// Shared layout: both operands K-major in the 128-byte swizzle (a row of
// 64 columns of k is one 128-byte line, its 16-byte chunk c stored at
// chunk c ^ (row & 7)), the tensor map's swizzle and the descriptors'.
// Consumer warpgroup w multiplies the weight rows 64 w + 128 h .. + 63 of
// each row group h by all 128 grouped rows. Paired, the first 128 weight
// rows are gate rows and the next 128 the up rows of the same columns, so
// a thread holds the gate (h = 0) and up (h = 1) sums of its elements and
// the SiLU-mul needs no exchange. A consumer thread's 64 accumulators a
// row group are the wgmma D fragment (rows 16 (warp % 4) + lane / 4 (+
// 8), grouped rows 8 j + 2 (lane % 4) (+ 1), j = 0..15).
//
// Needs k a multiple of MW_BK (hidden and intermediate), sm_90a, element
// offsets under 2^31 (di_moe_wg_ok). Cost: 2 * rows * n * k flops on the
// tensor cores' native path; 48 KB of shared memory a stage, 384 threads,
// one block a multiprocessor; the tiles read 85 flops a byte from L2.
#include "wgmma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#define MW_BK 64
#ifndef MW_STAGES
#define MW_STAGES 4
#endif
#ifndef MW_TMA
#define MW_TMA 1 // the weight tiles by the tensor memory accelerator (NOTES.md: 1.06x, the same bits); 0: cp.async
#endif
#ifndef MW_CLUSTER
#define MW_CLUSTER 0 // 1: two-CTA clusters sharing each weight tile by TMA multicast (needs MW_TMA; H100: 2.0 ms against 1.2 for the 4096-token GEMM pair, and a test failing: NOTES.md)
#endif
#ifndef MW_Y16
#define MW_Y16 1 // the down projection's rows (GEMM mode round) stored as T for the combine (MG_STORE16; NOTES.md); 0: float32 rows
#endif
#define MW_BM 256 // weight rows a tile
#define MW_THREADS 384
#define MW_PREGS 56
#define MW_CREGS 224
static_assert(MW_THREADS / 3 * (MW_PREGS + 2 * MW_CREGS) <= 65536, "MW registers over the file");
#define MW_A_BYTES (MW_BM * MW_BK * 2) // a stage of weight rows: 128-byte lines
#define MW_STAGE_BYTES (MW_A_BYTES + MG_BN * MW_BK * 2)
#define MW_SMEM ((size_t)MW_STAGES * MW_STAGE_BYTES + 1024 + 2 * MW_STAGES * 8)
static_assert(MG_BN == 128, "di_moe_wg_k takes di_moe_gemm_k's row tiles");

// di_mw_act writes silu(gate) * up at act[i] (and its remainder at act_lo[i]):
// out of line, so that the epilogue's 64 calls stay unrolled and the
// accumulators in registers.
template <typename T> __device__ __noinline__ void di_mw_act(T *act, T *act_lo, size_t i, float gate, float up) {
	di_to_gemm(act, act_lo, i, di_moe_silu_mul(gate, up));
}

// di_mw_row is the weight row (within the expert) that shared row r of
// weight tile bx holds, clamped into the weight (ok false for a row past
// its end, computed but never stored): paired, rows 0..127 the gate rows
// 128 bx .. and rows 128..255 the up rows of the same columns; otherwise
// rows 256 bx ...
template <typename T> __device__ __forceinline__ int di_mw_row(const di_moe_gemm_args<T> &p, int bx, int r, bool &ok) {
	if (p.inter > 0) {
		const int j = 128 * bx + (r & 127);
		ok = j < p.inter;
		return (r < 128 ? 0 : p.inter) + min(j, p.inter - 1);
	}
	const int f = 256 * bx + r;
	ok = f < p.n;
	return min(f, p.n - 1);
}

// di_mw_tile finds tile t of the grid (tiles_x weight tiles a row tile of
// CL * MG_BN rows, CL the cluster's CTAs): its weight tile bx, expert ex,
// and this CTA's (rank's) share of the rows, MG_BN from lo, m of them (0
// for a second CTA past the expert's rows) and lox, the first row the
// copies read (lo, or where the CTA has no rows its partner's first: rows
// computed and never stored); false past the last row tile
// (di_moe_row_tile: every lane of the warp calls it).
template <int CL, typename T>
__device__ __forceinline__ bool di_mw_tile(const di_moe_gemm_args<T> &p, int t, int tiles_x, int lane, int rank,
                                           int &bx, int &ex, int &lo, int &m, int &lox) {
	int r0;
	bx = t % tiles_x;
	di_moe_row_tile(p.offsets, p.num_experts, CL * MG_BN, t / tiles_x, lane, ex, r0);
	if (ex < 0) return false;
	const int first = p.offsets[ex] + r0;
	lo = first + MG_BN * rank, m = max(0, min(MG_BN, p.offsets[ex + 1] - lo)), lox = m > 0 ? lo : first;
	return true;
}

// di_tma_load2d queues the tensor memory accelerator's copy of the box of
// map at (c0 columns, c1 rows) to shared memory at dst, completing its
// bytes on bar.
__device__ __forceinline__ void di_tma_load2d(unsigned dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar) {
#ifdef MW_HAS_WGMMA
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
	             "l"(map), "r"(c0), "r"(c1), "r"(di_smem_u32(bar))
	             : "memory");
#endif
}
// di_tma_load2d_mc is di_tma_load2d multicast: the box lands at dst in
// every CTA of the cluster in mask, each completing its bytes on its own
// mbarrier at bar's offset.
__device__ __forceinline__ void di_tma_load2d_mc(unsigned dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar,
                                                 unsigned short mask) {
#ifdef MW_HAS_WGMMA
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
	             " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
	             "l"(map), "r"(c0), "r"(c1), "r"(di_smem_u32(bar)), "h"(mask)
	             : "memory");
#endif
}
// di_cluster_rank is the CTA's rank in its cluster; di_cluster_sync waits
// for every thread of every CTA of the cluster (release, then acquire).
__device__ __forceinline__ unsigned di_cluster_rank() {
	unsigned r;
	asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
	return r;
}
__device__ __forceinline__ void di_cluster_sync() {
	asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// di_mbar_arrive_at counts one arrival on the mbarrier at bar's offset in
// CTA rank of the cluster (release at cluster scope).
__device__ __forceinline__ void di_mbar_arrive_at(uint64_t *bar, unsigned rank) {
	unsigned remote;
	asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(di_smem_u32(bar)), "r"(rank));
	asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void di_mbar_arrive_tx(uint64_t *bar, unsigned bytes) {
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(di_smem_u32(bar)), "r"(bytes) : "memory");
}

template <typename T, int MODE, bool TMA, int CL>
__global__ void __launch_bounds__(MW_THREADS, 1)
    di_moe_wg_k(const di_moe_gemm_args<T> p, const __grid_constant__ CUtensorMap tw, int tiles_x, int tiles) {
	static_assert(CL == 1 || (CL == 2 && TMA), "two-CTA clusters share the weight tiles by TMA multicast");
#ifndef MW_HAS_WGMMA
	__trap(); // di_moe_wg_ok keeps other targets' builds from launching it
#else
	constexpr int A_BYTES = MW_A_BYTES, STAGE = MW_STAGE_BYTES;
	extern __shared__ __align__(16) unsigned char mw_raw[];
	const unsigned raw = (unsigned)__cvta_generic_to_shared(mw_raw);
	const unsigned base = (raw + 1023u) & ~1023u;
	unsigned char *sh = mw_raw + (base - raw);
	uint64_t *full = reinterpret_cast<uint64_t *>(sh + (size_t)MW_STAGES * STAGE), *empty = full + MW_STAGES;
	const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
	// Clusters (CL = 2): both CTAs take the same tiles (t0, t0 + step, ...),
	// each its half of the tile's rows; CTA rank c loads weight box c of
	// every stage into both CTAs' shared memory, so a stage's slot is free
	// again once the consumers of both CTAs are done with it.
	const int rank = CL > 1 ? (int)di_cluster_rank() : 0;
	const int t0 = blockIdx.x / CL, step = gridDim.x / CL;
	if (tid == 0) {
		for (int s = 0; s < MW_STAGES; s++) {
			di_mbar_init(&full[s], 128 + TMA); // the producer's threads, each once its copies land (+ the weights' bytes)
			di_mbar_init(&empty[s], 8 * CL);   // the consumers' warps (of every CTA), each once its products are done
		}
		di_mbar_init_fence();
	}
	if constexpr (CL > 1) di_cluster_sync(); // the partner's barriers exist before anything reaches them
	else __syncthreads();
	const int nk = p.k / MW_BK;
	if (wg == 0) {
		asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(MW_PREGS));
		// This thread's copies: 16-byte chunk tid % 8 of shared rows tid / 8 + 16 i.
		const int part = tid & 7, rb = tid >> 3;
		const unsigned dst = (unsigned)(rb * 128 + ((part ^ (rb & 7)) << 4)); // + 2048 i
		int it = 0;
		for (int t = t0; t < tiles; t += step) {
			int bx, ex, lo, m, lox;
			if (!di_mw_tile<CL>(p, t, tiles_x, lane, rank, bx, ex, lo, m, lox)) break;
			// Element offsets (under 2^31: di_moe_wg_ok) of this thread's rows.
			const T *w = p.w + (size_t)ex * p.n * p.k + 8 * part, *x = p.x + 8 * part;
			int aoff[16], xoff[8];
#pragma unroll
			for (int i = 0; i < 16 * !TMA; i++) {
				bool ok;
				aoff[i] = di_mw_row(p, bx, rb + 16 * i, ok) * p.k;
			}
#pragma unroll
			for (int i = 0; i < 8; i++) {
				const int r = rb + 16 * i, row = lox + (r < m ? r : 0);
				xoff[i] = (p.order ? p.order[row] / p.div : row) * p.k;
			}
#pragma unroll 1
			for (int s = 0; s < nk; s++, it++) {
				const int slot = it % MW_STAGES;
				di_mbar_wait(&empty[slot], ((it / MW_STAGES) & 1) ^ 1);
				unsigned char *a = sh + (size_t)slot * STAGE, *b = a + A_BYTES;
				const int kb = s * MW_BK;
				if constexpr (TMA) {
					if (tid == 0) {
						di_mbar_arrive_tx(&full[slot], A_BYTES); // both boxes, whichever CTA loads them
						const int r0w = ex * p.n + (p.inter > 0 ? 128 * bx : 256 * bx), r1w = p.inter > 0 ? p.inter : 128;
						if constexpr (CL > 1) {
							di_tma_load2d_mc(base + slot * STAGE + rank * (A_BYTES / 2), &tw, kb, r0w + rank * r1w,
							                 &full[slot], (unsigned short)3);
						} else {
							di_tma_load2d(base + slot * STAGE, &tw, kb, r0w, &full[slot]);
							di_tma_load2d(base + slot * STAGE + A_BYTES / 2, &tw, kb, r0w + r1w, &full[slot]);
						}
					}
				} else {
#pragma unroll
					for (int i = 0; i < 16; i++) di_cp_async16(a + dst + 2048 * i, w + (aoff[i] + kb), true);
				}
#pragma unroll
				for (int i = 0; i < 8; i++) di_cp_async16(b + dst + 2048 * i, x + (xoff[i] + kb), true);
				di_cp_async_mbar_arrive(&full[slot]);
			}
		}
		di_cp_async_wait<0>(); // every copy landed before the thread leaves
		if constexpr (CL > 1) di_cluster_sync(); // the consumers' (below)
		return;
	}
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(MW_CREGS));
	const int cw = wg - 1, g = lane >> 2, t4 = lane & 3;
	const int rw = 16 * ((tid >> 5) & 3) + g;
	// A stage's slot is released to this CTA's producer and, in a cluster,
	// to the partner's, whose multicast writes it too.
	auto release = [&](int slot) {
		if (lane != 0) return;
		di_mbar_arrive(&empty[slot]);
		if constexpr (CL > 1) di_mbar_arrive_at(&empty[slot], (unsigned)(rank ^ 1));
	};
	int it = 0;
	for (int t = t0; t < tiles; t += step) {
		int bx, ex, lo, m, lox;
		if (!di_mw_tile<CL>(p, t, tiles_x, lane, rank, bx, ex, lo, m, lox)) break;
		// d[h]: shared weight rows 64 cw + 128 h .. + 63 by the 128 grouped rows.
		float d[2][64];
#pragma unroll
		for (int h = 0; h < 2; h++)
#pragma unroll
			for (int i = 0; i < 64; i++) d[h][i] = 0.f;
#pragma unroll 1
		for (int s = 0; s < nk; s++, it++) {
			const int slot = it % MW_STAGES;
			di_mbar_wait(&full[slot], (it / MW_STAGES) & 1);
			di_fence_async_shared(); // the copies (seen through the barrier) before wgmma's reads
			const unsigned a = base + (unsigned)(slot * STAGE), b = a + A_BYTES;
			di_wg_fence();
#pragma unroll
			for (int kk = 0; kk < MW_BK / 16; kk++)
#pragma unroll
				for (int h = 0; h < 2; h++)
					di_wg_mma<T>(d[h], di_wg_desc(a + (64 * cw + 128 * h) * 128 + kk * 32), di_wg_desc(b + kk * 32));
			di_wg_commit();
			di_wg_wait<1>();
			// The products of the stage before are done: release its slot.
			if (s > 0) release((it - 1) % MW_STAGES);
		}
		di_wg_wait<0>();
		release((it - 1) % MW_STAGES);
		// Element i of d[h]: shared weight row 64 cw + 128 h + rw + 8 ((i >> 1) & 1),
		// grouped row 8 (i >> 2) + 2 t4 + (i & 1).
		if constexpr (MODE == MG_STORE || MODE == MG_ADD || MODE == MG_STORE16) {
#pragma unroll
			for (int h = 0; h < 2; h++)
#pragma unroll
				for (int hh = 0; hh < 2; hh++) {
					bool ok;
					const int f = di_mw_row(p, bx, 64 * cw + 128 * h + rw + 8 * hh, ok);
					if constexpr (MODE == MG_STORE16) {
						// Rows of T at act [rows, n]: lanes g and g ^ 1 (lane ^ 4)
						// hold neighbouring weight rows (output columns) f, f + 1
						// of the same grouped rows; each gives the other one value
						// (every lane shuffles, stored or not), so that even g
						// stores grouped row 8 c + 2 t4 and odd g the next, both
						// columns in 4 bytes. n is even (a multiple of MW_BK), so
						// f and f + 1 are stored together or not at all.
						const int odd = g & 1, f0 = f & ~1;
#pragma unroll
						for (int c = 0; c < 16; c++) {
							const float v0 = d[h][4 * c + 2 * hh], v1 = d[h][4 * c + 2 * hh + 1];
							const float o = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
							const int r = 8 * c + 2 * t4 + odd;
							if (ok && r < m) {
								T two[2] = {di_from_f32<T>(odd ? o : v0), di_from_f32<T>(odd ? v1 : o)};
								unsigned u;
								memcpy(&u, two, sizeof u);
								*reinterpret_cast<unsigned *>(p.act + (size_t)(lo + r) * p.n + f0) = u;
							}
						}
						continue;
					}
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
			// Paired: d[0] holds the gate sums of column j, d[1] its up sums.
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
				const int j = 128 * bx + 64 * cw + rw + 8 * hh;
				if (j >= p.inter) continue;
#pragma unroll
				for (int c = 0; c < 16; c++)
#pragma unroll
					for (int e = 0; e < 2; e++) {
						const int r = 8 * c + 2 * t4 + e;
						if (r < m) {
							const int i = 4 * c + 2 * hh + e;
							const size_t row = (size_t)(lo + r);
							float gate = d[0][i], up = d[1][i];
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
	if constexpr (CL > 1) di_cluster_sync(); // no partner's arrival or copy reaches this CTA after it leaves
#endif
}

// di_moe_wg_grid is di_moe_gemm_grid for MW_BM weight rows a tile and row
// tiles of cl x MG_BN rows (cl: the cluster's CTAs, MG_BN rows each).
static dim3 di_moe_wg_grid(size_t pairs, int num_experts, int n, int inter, int cl = 1) {
	dim3 gr = di_moe_gemm_grid(pairs, num_experts, n, inter);
	gr.x = inter > 0 ? (unsigned)((inter + MW_BM / 2 - 1) / (MW_BM / 2)) : (unsigned)((n + MW_BM - 1) / MW_BM);
	if (cl > 1) {
		const size_t busy = pairs < (size_t)num_experts ? pairs : (size_t)num_experts, bn = (size_t)cl * MG_BN;
		const size_t tiles = (pairs + (bn - 1) * busy) / bn;
		gr.y = (unsigned)(tiles > 0 ? tiles : 1);
	}
	return gr;
}

// di_moe_wg_ok says whether di_moe_wg_k can take a call that di_moe_gemm_k
// could: a library built for sm_90a (the only target with wgmma), hidden
// and intermediate multiples of MW_BK, and the kernel's 32-bit element
// offsets reaching every row (an expert's weight, 2 inter x hidden or
// hidden x inter, and the rows of x, at most pairs).
static bool di_moe_wg_ok(size_t pairs, int hidden, int inter) {
	const size_t most = (size_t)1 << 31, wide = (size_t)(hidden > inter ? hidden : inter);
	return di_wg_arch_ok() && hidden % MW_BK == 0 && inter % MW_BK == 0 && (size_t)2 * inter * hidden < most &&
	       pairs * wide < most;
}

// di_moe_weight_map encodes the tensor map of p's experts' weights for
// di_moe_wg_k's weight loads: the rows of every expert one after another
// (num_experts * n rows of k 16-bit values), boxes of 128 rows by MW_BK
// columns in the 128-byte swizzle, zeros past the last row. The encoder
// is the driver's, found through the runtime once; false where there is
// none or it refuses (the kernel then copies the weights with cp.async:
// the same bytes in shared memory, a little slower).
template <typename T> static bool di_moe_weight_map(CUtensorMap *map, const di_moe_gemm_args<T> &p) {
	static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
		void *fn = nullptr;
		cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
		if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess)
			fn = nullptr;
#else
		if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q) != cudaSuccess) fn = nullptr;
#endif
		if (!fn || q != cudaDriverEntryPointSuccess) {
			cudaGetLastError(); // nothing sticky: the cp.async path serves
			return (PFN_cuTensorMapEncodeTiled_v12000) nullptr;
		}
		return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
	}();
	if (!encode) return false;
	const cuuint64_t dims[2] = {(cuuint64_t)p.k, (cuuint64_t)p.num_experts * (cuuint64_t)p.n};
	const cuuint64_t strides[1] = {(cuuint64_t)p.k * 2};
	const cuuint32_t box[2] = {MW_BK, 128}, elem[2] = {1, 1};
	const CUtensorMapDataType ty =
	    std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
	return encode(map, ty, 2, const_cast<T *>(p.w), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
	              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
	              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// di_moe_wg_cluster launches di_moe_wg_k in two-CTA clusters (MW_CLUSTER):
// as many clusters as the device holds at once (the blocks are
// persistent), as cudaOccupancyMaxActiveClusters finds them.
template <typename T, int MODE>
static int di_moe_wg_cluster(di_ctx *ctx, const di_moe_gemm_args<T> &p, size_t pairs, const CUtensorMap &tw) {
	auto kernel = di_moe_wg_k<T, MODE, true, 2>;
	cudaError_t e = di_moe_big_smem(kernel, MW_SMEM);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "moe: grouped wgmma gemm (clusters): cudaFuncSetAttribute");
	const dim3 gr = di_moe_wg_grid(pairs, p.num_experts, p.n, p.inter, 2);
	const int tiles = (int)(gr.x * gr.y);
	cudaLaunchAttribute attr[1];
	attr[0].id = cudaLaunchAttributeClusterDimension;
	attr[0].val.clusterDim.x = 2, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = dim3(2 * (unsigned)tiles), cfg.blockDim = dim3(MW_THREADS), cfg.dynamicSmemBytes = MW_SMEM;
	cfg.stream = ctx->stream, cfg.attrs = attr, cfg.numAttrs = 1;
	int resident = 0; // clusters the device holds at once (a host query, no device work)
	e = cudaOccupancyMaxActiveClusters(&resident, kernel, &cfg);
	if (e != cudaSuccess || resident < 1)
		return di_cuda_fail(ctx, e != cudaSuccess ? e : cudaErrorInvalidConfiguration,
		                    "moe: grouped wgmma gemm (clusters): cudaOccupancyMaxActiveClusters");
	cfg.gridDim = dim3(2 * (unsigned)(tiles < resident ? tiles : resident));
	e = cudaLaunchKernelEx(&cfg, kernel, p, tw, (int)gr.x, tiles);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "moe: grouped wgmma gemm (clusters): cudaLaunchKernelEx");
	return di_check_launch(ctx, "moe: grouped wgmma gemm (clusters)");
}

template <typename T, int MODE>
static int di_moe_wg(di_ctx *ctx, const di_moe_gemm_args<T> &p, size_t pairs) {
	CUtensorMap tw;
	memset(&tw, 0, sizeof tw);
	const bool tma = MW_TMA && di_moe_weight_map(&tw, p);
	if constexpr (MW_CLUSTER) {
		if (tma) return di_moe_wg_cluster<T, MODE>(ctx, p, pairs, tw);
	}
	auto kernel = tma ? di_moe_wg_k<T, MODE, true, 1> : di_moe_wg_k<T, MODE, false, 1>;
	const cudaError_t e = di_moe_big_smem(kernel, MW_SMEM);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "moe: grouped wgmma gemm: cudaFuncSetAttribute");
	const dim3 gr = di_moe_wg_grid(pairs, p.num_experts, p.n, p.inter);
	const int tiles = (int)(gr.x * gr.y), sms = ctx->sm_count > 0 ? ctx->sm_count : 132;
	kernel<<<min(tiles, sms), MW_THREADS, MW_SMEM, ctx->stream>>>(p, tw, (int)gr.x, tiles);
	return di_check_launch(ctx, "moe: grouped wgmma gemm");
}
