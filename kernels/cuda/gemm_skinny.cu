// gemm_skinny.cu: the skinny GEMM of the CUDA backend, y[M,N] = x[M,K] W[N,K]^T
// (+ bias) for decode batches of 1..64 rows with BF16 or F16 weights, on
// tensor cores, reading the weights from global memory once. ops.cu's Linear
// dispatch sends such linears here (see di_skinny_ok); F32 weights, K not a
// multiple of 8, unaligned operands and more rows keep the GEMV and cuBLAS
// paths.
//
// Kernel section (di_skinny_k), then the plan and the launcher.
#include "common.cuh"

#include <algorithm>

#define SK_KC 64              // K per pipeline stage
#define SK_ROW (SK_KC * 2)    // bytes of one 16-bit row of a stage
#define SK_MAX_ROWS DI_SKINNY_MAX_ROWS // the kernel's limit on M (64)
#define SK_TARGET_BLOCKS 128  // the plan aims at about this many blocks of 64 weight rows
#define SK_MIN_KSLICE 256     // a K split is at least this long...
#define SK_MAX_SPLITS 32      // ...and there are at most this many

// sk_stages is the depth of the copy pipeline for MT tiles of 8 rows of x:
// deeper for few rows, where shared memory is mostly weights.
__host__ __device__ constexpr int sk_stages(int mt) { return mt == 1 ? 8 : mt == 2 ? 6 : 4; }

// sk_swz is the position of 16-byte chunk ch (0..7) in a 128-byte row r of a
// stage: odd rows swap their halves, so that the eight lanes of a quarter
// warp, which read chunks t (or 4+t) of rows g and g+1, hit distinct banks.
__host__ __device__ constexpr int sk_swz(int r, int ch) { return ch ^ ((r & 1) << 2); }

// ---------------------------------------------------------------- kernel

// di_skinny_k computes out = x . w^T (+ bias) for m <= 8*MT rows of x
// (float32, [m, k]) and the 16-bit weight w ([n, k], row-major).
//
// Work. Block (blockIdx.x, blockIdx.y) takes weight rows n0 .. n0+rb-1 (rb =
// blockDim.x / 2: 16 rows a warp) and the K range of split blockIdx.y
// (kslice long; the last may be shorter). It streams that weight tile
// through shared memory in stages of 64 columns with cp.async, sk_stages(MT)
// stages in flight, together with the same 64 columns of every row of x in
// float32; each stage's x is converted once per block to T, rounded (round
// mode) or as hi = T(x) and lo = T(x - hi) (SPLIT), into a swizzled buffer.
// Warp w multiplies its 16 weight rows (the A operand of mma.sync
// m16n8k16, so that a decode row costs an 8-wide tile, not a 16-wide one)
// by the rows of x in MT tiles of 8 (the B operand, rows past m read as
// zeros, never from memory), float32 accumulators in registers. Each lane
// reads 16 bytes of a weight row and 16 bytes of a row of x per 32 columns:
// within those 32 columns lane t of a quad owns columns 8t..8t+7, the first
// four feeding one mma and the last four a second (a fixed permutation of
// the reduction index, the same for A and B).
//
// Batch invariance (the contract). An output y[r][j] is the float32 sum, in
// a fixed order, of the tensor-core products of row j of w with row r of x:
// within a split, stage by stage in ascending K, per 32 columns the mma of
// the first four columns of each lane then that of the last four (in SPLIT
// each as the hi product, then the lo product, into the same accumulator);
// then the splits' partial sums added in split order 0, 1, ..., ks-1 (one
// split: none), then the bias. The number of splits and their boundaries
// (the plan, sk_plan_for) depend on (n, k) only, never on m; each element
// of an mma tile is an independent dot product; rows of x past m are zeros
// that enter no other row's sum. So row r's bits are the same whether it is
// computed alone or among up to 63 other rows, at any position, eagerly or
// in a captured graph. m only picks MT, the pipeline depth and the block
// width, none of which changes that order.
//
// Split K (ks > 1, for weights with few rows). Each block writes its partial
// sums to its tile's slot of partial ([tile][split][m][rb] float32), then
// counts itself in sem[tile]; the last block of the tile to arrive adds the
// ks slots in split order (so which block arrives last changes nothing),
// adds the bias, writes out and resets sem[tile] to zero for the next
// launch. sem (ctx->skinny_sem) is zero between launches.
//
// Cost. The weights once (n*k*2 bytes, 16-byte cp.async, 64-byte and larger
// contiguous runs per row), x once per block (m*kslice*4 bytes each, from
// L2), ks*m*n*4 bytes of partials written and read when ks > 1; 2*m*n*k
// multiply-adds (twice that in SPLIT) on tensor cores, padded to 8 rows of x.
//
// Prediction (H200, 4.2 TB/s copy bandwidth, weights not in L2), written
// before the first measurement: at 1..8 rows the large weights stream at
// ~3.5-3.9 TB/s (gate_up 16384x2048 ~18 us, down 2048x8192 ~9.5 us, LM head
// 128256x2048 ~135 us) and the small ones are bound by latency (q/o
// 2048x2048 ~3.5 us, k/v 512x2048 ~2.5 us: one DRAM round trip, the pipeline
// ramp and the split-K tail); at 64 rows, round mode ~1.3-1.6x the 1-row
// time, split mode ~2x (x traffic from L2 and the doubled tensor-core work
// start to bind).
template <typename T, bool SPLIT, int MT>
__global__ void __launch_bounds__(256)
    di_skinny_k(float *__restrict__ out, float *__restrict__ partial, unsigned *__restrict__ sem,
                const float *__restrict__ x, const T *__restrict__ w, const float *__restrict__ bias, int m, int n,
                int k, int kslice, int ks) {
	constexpr int S = sk_stages(MT);
	constexpr int MP = 8 * MT; // rows of x as the tensor cores see them
	extern __shared__ uint4 sk_shared[];
	__shared__ unsigned sk_last;
	const int tid = threadIdx.x, nthreads = blockDim.x;
	const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int rb = nthreads >> 1;
	// Shared memory: S weight stages [rb][128 B], S x stages [m][64] float32,
	// x as T [MP][128 B] (hi), and lo in SPLIT.
	unsigned char *ws = reinterpret_cast<unsigned char *>(sk_shared);
	float *xf = reinterpret_cast<float *>(ws + (size_t)S * rb * SK_ROW);
	unsigned char *xh = reinterpret_cast<unsigned char *>(xf + (size_t)S * m * SK_KC);
	unsigned char *xl = xh + MP * SK_ROW;

	const int n0 = blockIdx.x * rb;
	const int split = blockIdx.y;
	const int kbeg = split * kslice;
	const int kend = min(k, kbeg + kslice);
	const int nchunks = (kend - kbeg + SK_KC - 1) / SK_KC;

	// load queues the copies of chunk c into stage c % S; 16-byte pieces
	// past kend or past the last weight row are zero-filled.
	auto load = [&](int c) {
		const int st = c % S;
		const int k0 = kbeg + c * SK_KC;
		unsigned char *wd = ws + (size_t)st * rb * SK_ROW;
		for (int i = tid; i < rb * 8; i += nthreads) {
			const int r = i >> 3, ch = i & 7;
			const int gn = n0 + r, gk = k0 + ch * 8;
			const bool ok = gn < n && gk < kend;
			di_cp_async16(wd + r * SK_ROW + (sk_swz(r, ch) << 4),
			              ok ? static_cast<const void *>(w + (size_t)gn * k + gk) : static_cast<const void *>(w), ok);
		}
		float *xd = xf + (size_t)st * m * SK_KC;
		for (int i = tid; i < m * 16; i += nthreads) {
			const int r = i >> 4, ch = i & 15;
			const int gk = k0 + ch * 4;
			const bool ok = gk < kend;
			di_cp_async16(xd + r * SK_KC + ch * 4,
			              ok ? static_cast<const void *>(x + (size_t)r * k + gk) : static_cast<const void *>(x), ok);
		}
	};

	// Rows m..MP-1 of x are zeros for the whole kernel.
	for (int i = tid; i < (MP - m) * 8; i += nthreads) {
		const int off = (m + (i >> 3)) * SK_ROW + ((i & 7) << 4);
		*reinterpret_cast<uint4 *>(xh + off) = make_uint4(0, 0, 0, 0);
		if (SPLIT) *reinterpret_cast<uint4 *>(xl + off) = make_uint4(0, 0, 0, 0);
	}

#pragma unroll
	for (int c = 0; c < S - 1; c++) {
		if (c < nchunks) load(c);
		di_cp_async_commit();
	}
	float acc[MT][4];
#pragma unroll
	for (int mt = 0; mt < MT; mt++) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;

	for (int c = 0; c < nchunks; c++) {
		di_cp_async_wait<S - 2>(); // chunk c has landed (this thread's copies)
		__syncthreads();           // everyone's copies; everyone is done with chunk c-1
		if (c + S - 1 < nchunks) load(c + S - 1); // into the stage chunk c-1 used
		di_cp_async_commit();
		// x of chunk c as T: four columns per step, swizzled like the weights.
		const float *xs = xf + (size_t)(c % S) * m * SK_KC;
		for (int i = tid; i < m * 16; i += nthreads) {
			const int r = i >> 4, q = i & 15;
			const float4 v = *reinterpret_cast<const float4 *>(xs + r * SK_KC + q * 4);
			const T h0 = di_from_f32<T>(v.x), h1 = di_from_f32<T>(v.y), h2 = di_from_f32<T>(v.z),
			        h3 = di_from_f32<T>(v.w);
			const int off = r * SK_ROW + (sk_swz(r, q >> 1) << 4) + ((q & 1) << 3);
			*reinterpret_cast<uint2 *>(xh + off) =
			    make_uint2(di_bits16(h0) | di_bits16(h1) << 16, di_bits16(h2) | di_bits16(h3) << 16);
			if (SPLIT) {
				const T l0 = di_from_f32<T>(v.x - di_to_f32(h0)), l1 = di_from_f32<T>(v.y - di_to_f32(h1)),
				        l2 = di_from_f32<T>(v.z - di_to_f32(h2)), l3 = di_from_f32<T>(v.w - di_to_f32(h3));
				*reinterpret_cast<uint2 *>(xl + off) =
				    make_uint2(di_bits16(l0) | di_bits16(l1) << 16, di_bits16(l2) | di_bits16(l3) << 16);
			}
		}
		__syncthreads();
		const unsigned char *wst = ws + (size_t)(c % S) * rb * SK_ROW;
		const int row = warp * 16 + g; // and row + 8; rows g, g+8 and mt*8+g share g's parity
#pragma unroll
		for (int kk = 0; kk < 2; kk++) {
			const int sw = sk_swz(g, kk * 4 + t) << 4;
			const uint4 a0 = *reinterpret_cast<const uint4 *>(wst + row * SK_ROW + sw);
			const uint4 a1 = *reinterpret_cast<const uint4 *>(wst + (row + 8) * SK_ROW + sw);
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				const int xr = mt * 8 + g;
				const uint4 bh = *reinterpret_cast<const uint4 *>(xh + xr * SK_ROW + sw);
				if (SPLIT) {
					const uint4 bl = *reinterpret_cast<const uint4 *>(xl + xr * SK_ROW + sw);
					di_mma16816<T>(acc[mt], a0.x, a1.x, a0.y, a1.y, bh.x, bh.y);
					di_mma16816<T>(acc[mt], a0.x, a1.x, a0.y, a1.y, bl.x, bl.y);
					di_mma16816<T>(acc[mt], a0.z, a1.z, a0.w, a1.w, bh.z, bh.w);
					di_mma16816<T>(acc[mt], a0.z, a1.z, a0.w, a1.w, bl.z, bl.w);
				} else {
					di_mma16816<T>(acc[mt], a0.x, a1.x, a0.y, a1.y, bh.x, bh.y);
					di_mma16816<T>(acc[mt], a0.z, a1.z, a0.w, a1.w, bh.z, bh.w);
				}
			}
		}
	}
	di_cp_async_wait<0>(); // only empty groups remain; leave none behind

	// acc[mt][i] is y[mt*8 + 2t + (i&1)][n0 + warp*16 + g + 8*(i>>1)].
	const int nl = warp * 16 + g;
	if (ks == 1) {
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const int r = mt * 8 + 2 * t + (i & 1), j = n0 + nl + 8 * (i >> 1);
				if (r < m && j < n) out[(size_t)r * n + j] = bias ? acc[mt][i] + bias[j] : acc[mt][i];
			}
		return;
	}
	float *pt = partial + (size_t)blockIdx.x * ks * m * rb; // this tile's ks slots
	float *mine = pt + (size_t)split * m * rb;
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int r = mt * 8 + 2 * t + (i & 1);
			if (r < m) mine[r * rb + nl + 8 * (i >> 1)] = acc[mt][i];
		}
	__threadfence(); // the partial sums reach L2 before the count does
	__syncthreads();
	if (tid == 0) {
		const unsigned prev = atomicAdd(sem + blockIdx.x, 1u);
		sk_last = prev == (unsigned)ks - 1;
		if (sk_last) atomicExch(sem + blockIdx.x, 0u);
	}
	__syncthreads();
	if (!sk_last) return;
	__threadfence();
	// The last block adds the slots in split order; __ldcg reads them from L2.
	const int quads = m * rb / 4;
	const size_t slot = (size_t)m * rb / 4;
	const float4 *p4 = reinterpret_cast<const float4 *>(pt);
	for (int i = tid; i < quads; i += nthreads) {
		float4 s = __ldcg(p4 + i);
		int sp = 1;
		for (; sp + 4 <= ks; sp += 4) {
			const float4 v0 = __ldcg(p4 + sp * slot + i), v1 = __ldcg(p4 + (sp + 1) * slot + i),
			             v2 = __ldcg(p4 + (sp + 2) * slot + i), v3 = __ldcg(p4 + (sp + 3) * slot + i);
			s.x += v0.x, s.y += v0.y, s.z += v0.z, s.w += v0.w;
			s.x += v1.x, s.y += v1.y, s.z += v1.z, s.w += v1.w;
			s.x += v2.x, s.y += v2.y, s.z += v2.z, s.w += v2.w;
			s.x += v3.x, s.y += v3.y, s.z += v3.z, s.w += v3.w;
		}
		for (; sp < ks; sp++) {
			const float4 v = __ldcg(p4 + sp * slot + i);
			s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
		}
		const int r = 4 * i / rb, j = n0 + 4 * i % rb;
		const float sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
		for (int e = 0; e < 4; e++)
			if (j + e < n) out[(size_t)r * n + j + e] = bias ? sv[e] + bias[j + e] : sv[e];
	}
}

// ---------------------------------------------------------------- plan and launcher

// sk_plan is how a weight [n, k] is cut: a function of (n, k) only (see the
// batch-invariance contract above).
struct sk_plan {
	int rb;     // weight rows per block (32, 64 or 128): 16 a warp
	int kslice; // K per split, a multiple of SK_KC
	int ks;     // number of splits, ceil(k / kslice), at most SK_MAX_SPLITS
};

// sk_plan_for: weights with at least SK_TARGET_BLOCKS tiles of 64 rows
// (n > 8128: gate_up, the LM head) run one split over blocks of 128 rows;
// smaller ones split K so that the blocks of 64 rows (32 where that still
// makes fewer than 96 blocks) number about SK_TARGET_BLOCKS, each split at
// least SK_MIN_KSLICE long. On the Llama-3.2-1B shapes: q/o 2048x2048 ->
// 4 splits of 512, k/v 512x2048 -> 8 of 256 on 32-row blocks, down
// 2048x8192 -> 4 of 2048, gate_up 16384x2048 and the LM head -> 1.
static sk_plan sk_plan_for(int n, int k) {
	sk_plan p;
	const long kr = ((long)k + SK_KC - 1) / SK_KC * SK_KC;
	const long tiles = ((long)n + 63) / 64;
	if (tiles >= SK_TARGET_BLOCKS) {
		p.rb = 128, p.kslice = (int)kr, p.ks = 1;
		return p;
	}
	long s = ((long)k * tiles + SK_TARGET_BLOCKS - 1) / SK_TARGET_BLOCKS;
	s = std::max(s, ((long)k + SK_MAX_SPLITS - 1) / SK_MAX_SPLITS);
	s = std::max(s, (long)SK_MIN_KSLICE);
	s = std::min((s + SK_KC - 1) / SK_KC * SK_KC, kr);
	p.kslice = (int)s;
	p.ks = (int)(((long)k + s - 1) / s);
	p.rb = tiles * p.ks < 96 ? 32 : 64;
	return p;
}

static int sk_mt(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

// sk_smem is the dynamic shared memory of a launch, in bytes.
static size_t sk_smem(int rb, int mt, int m, bool split) {
	const int s = sk_stages(mt);
	return (size_t)s * rb * SK_ROW + (size_t)s * m * SK_KC * sizeof(float) + (size_t)8 * mt * SK_ROW * (split ? 2 : 1);
}

bool di_skinny_ok(di_ctx *ctx, const float *x, const void *w, int w_dtype, int m, int n, int k) {
	if (m < 1 || m > SK_MAX_ROWS || m > ctx->skinny) return false;
	if (w_dtype != DI_BF16 && w_dtype != DI_F16) return false;
	if (n < 1 || k < 8 || k % 8 != 0) return false;
	if ((uintptr_t)x % 16 != 0 || (uintptr_t)w % 16 != 0) return false;
	int optin = 0;
	if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device) != cudaSuccess) {
		cudaGetLastError();
		return false;
	}
	const sk_plan p = sk_plan_for(n, k);
	// Static shared memory: one word, aligned.
	return sk_smem(p.rb, sk_mt(m), m, ctx->gemm_mode == DI_GEMM_SPLIT) + 16 <= (size_t)optin;
}

template <typename T, bool SPLIT, int MT>
static int sk_launch(di_ctx *ctx, const sk_plan &p, float *out, float *partial, const float *x, const void *w,
                     const float *bias, int m, int n, int k) {
	const size_t smem = sk_smem(p.rb, MT, m, SPLIT);
	auto kern = di_skinny_k<T, SPLIT, MT>;
	if (smem > (48u << 10)) {
		// Idempotent, and allowed while capturing (no stream work).
		cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
		if (e != cudaSuccess) return di_cuda_fail(ctx, e, "linear (skinny): cudaFuncSetAttribute");
	}
	const dim3 grid((unsigned)((n + p.rb - 1) / p.rb), (unsigned)p.ks);
	kern<<<grid, 2 * p.rb, smem, ctx->stream>>>(out, partial, ctx->skinny_sem, x, static_cast<const T *>(w), bias, m,
	                                            n, k, p.kslice, p.ks);
	return di_check_launch(ctx, "linear (skinny)");
}

template <typename T, bool SPLIT>
static int sk_dispatch(di_ctx *ctx, const sk_plan &p, float *out, float *partial, const float *x, const void *w,
                       const float *bias, int m, int n, int k) {
	switch (sk_mt(m)) {
	case 1: return sk_launch<T, SPLIT, 1>(ctx, p, out, partial, x, w, bias, m, n, k);
	case 2: return sk_launch<T, SPLIT, 2>(ctx, p, out, partial, x, w, bias, m, n, k);
	case 4: return sk_launch<T, SPLIT, 4>(ctx, p, out, partial, x, w, bias, m, n, k);
	default: return sk_launch<T, SPLIT, 8>(ctx, p, out, partial, x, w, bias, m, n, k);
	}
}

// di_skinny_linear runs out[m, n] = x[m, k] w[n, k]^T (+ bias) on
// di_skinny_k; the caller has checked di_skinny_ok. One launch; with split
// K it borrows ks*m*n*4 bytes (rounded up to whole tiles) of scratch for the
// partial sums. Cost: see di_skinny_k.
int di_skinny_linear(di_ctx *ctx, float *out, const float *x, const void *w, int w_dtype, const float *bias, int m,
                     int n, int k) {
	const sk_plan p = sk_plan_for(n, k);
	const bool split = ctx->gemm_mode == DI_GEMM_SPLIT;
	const long tiles = ((long)n + p.rb - 1) / p.rb;
	void *partial = nullptr;
	if (p.ks > 1) {
		if (tiles > DI_SKINNY_SEMS)
			return di_fail(ctx, DI_ERR_UNSUPPORTED, "linear (skinny): %ld tiles of %d rows with %d K splits: at most %d",
			               tiles, p.rb, p.ks, DI_SKINNY_SEMS);
		int rc = di_scratch(ctx, (size_t)tiles * p.ks * m * p.rb * sizeof(float), &partial);
		if (rc != DI_OK) return rc;
	}
	int rc;
	float *pp = static_cast<float *>(partial);
	if (w_dtype == DI_BF16)
		rc = split ? sk_dispatch<__nv_bfloat16, true>(ctx, p, out, pp, x, w, bias, m, n, k)
		           : sk_dispatch<__nv_bfloat16, false>(ctx, p, out, pp, x, w, bias, m, n, k);
	else
		rc = split ? sk_dispatch<__half, true>(ctx, p, out, pp, x, w, bias, m, n, k)
		           : sk_dispatch<__half, false>(ctx, p, out, pp, x, w, bias, m, n, k);
	di_scratch_free(ctx, partial);
	return rc;
}
