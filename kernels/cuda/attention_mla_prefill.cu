// attention_mla_prefill.cu: MLA (DeepSeek's multi-head latent attention)
// for prefill rows in the non-absorbed form, FlashAttention-style on tensor
// cores, over 16-bit (F16 or BF16) and 8-bit (E4M3, attention_mla_tc.cu's
// packed rows) latent caches. attention_mla_tc.cu keeps the absorbed form,
// which every other row takes.
//
// Which rows take which path (di_op_mla_attention_pf): a sequence with at
// least DI_MLA_PREFILL_MIN_ROWS (16) query rows in the call takes this
// path, every other sequence (decode rows, speculative verification rows,
// short chunks) the absorbed kernels; the rule reads nothing but the
// sequence's own query count, so a row's path does not depend on its batch.
// Only the layer sizes of DeepSeek-V2/V3 (qk_nope 128, qk_rope 64, v head
// 128, kv_lora_rank 128 or 512) take it; other sizes keep the absorbed
// form for every row, and so does a call of several sequences made while
// the stream is captured into a graph (the split needs the host to read
// three counts, see below).
//
// A call with prefill rows runs:
//  1. di_mpf_plan_k (one block): per sequence, its expanded rows (its
//     visible keys rounded up to MPF_BK; prefill sequences only), its
//     query tiles (prefill) and its absorbed rows (the others), as prefix
//     sums, and the three totals. The host sizes the scratch and the grids
//     by the caller's hint (di_mla_pf_hint: the totals from its host copy
//     of cu_seqlens_q, each prefill sequence's keys bounded by the block
//     table's reach), which the plan checks; without one, and with more
//     than one sequence, it reads the totals (one small copy and a wait).
//     A single sequence needs no hint (its block table's reach bounds its
//     keys). Either bound is taken only where it costs no more passes over
//     the heads than the call's query rows would; else the host reads.
//  2. di_mpf_expand_k (mma.sync) or, for 16-bit caches where step 3 runs
//     on wgmma, di_mpf_wgx_k (wgmma), the same bits, per group of heads:
//     K_nope and V of every visible key of every prefill sequence, [c_kv]
//     x [W_UK; W_UV]^T (wkvb's rows of the head), with a fixed order over
//     kv_lora_rank, rounded to the cache's 16-bit type into scratch
//     [head][row][256] (for di_mpf_wg_k: K_nope rows, then V transposed);
//     and each key's k_pe, copied once. A row's values depend on its c_kv and the weight
//     alone, never on how many rows a call expands. An 8-bit cache's rows
//     are widened to half on their way into shared memory (each value times
//     its group's scale, rounded), as the absorbed kernels widen their
//     tiles, and the operands are half from there on: an 8-bit row gives
//     the bits of a half row holding its widened values on both paths.
//  3. di_mpf_wg_k (wgmma, sm_90a builds) or di_mpf_attn_k (mma.sync; with
//     ctx->mla_pf_wg off, and on other builds), the same bits: causal
//     FlashAttention, one block per (query tile of 64 rows, head), qk dim
//     192 (K_nope of the head and the shared k_pe), v dim 128, key tiles of
//     MPF_ABK aligned to absolute positions, online softmax in float32
//     (log2 units), q and the probabilities rounded to the cache's 16-bit
//     type. For di_mpf_wg_k the expansion writes V transposed.
//  4. The absorbed rows, if any: gathered into a compact batch (prefill
//     sequences given zero rows), run through di_op_mla_attention_tc and
//     scattered back: the absorbed path's bits.
// A prefill row's result is a fixed sequence of operations on its own
// sequence's keys: the same bits alone or in any batch, and a prompt
// prefilled in chunks (each of at least 16 rows) gives the bits of the
// whole prompt. A row computed by this path and the same row computed as
// a decode row (absorbed form) agree to rounding only.
//
// An 8-bit cache's latent tile cannot be copied as is (cp.async moves
// bytes, not widened values): each thread loads its chunks (8 bytes and a
// scale) into registers while the tile before it is multiplied, and
// widens and stores them after; the weight's tiles keep cp.async.
//
// Scratch: G heads x expanded rows x 512 bytes (G = as many heads as fit
// MPF_SCRATCH_BYTES, at least one; more heads take more passes), 128
// bytes a row for k_pe, and wkvb converted to the cache's 16-bit type
// when it is stored otherwise. Cost: 2 x rows x kv_lora_rank x heads x 256
// FLOPs for the expansion (rows: the prefill sequences' visible keys) plus
// 2 x (192 + 128) FLOPs per (query, visible key, head) for attention.
#include "attention_tc.cuh"
#include "wgmma.cuh"

#define MPF_MIN_Q DI_MLA_PREFILL_MIN_ROWS
#define MPF_BQ DI_MLA_PREFILL_TILE // query rows a block: 4 warps of 16
#define MPF_BK DI_MLA_PREFILL_TILE // keys a tile; a sequence's expanded rows are padded to a multiple
static_assert(MPF_BQ == 64, "the attention kernel's four warps take 16 query rows each");
#define MPF_THREADS 128
#define MPF_NOPE 128
#define MPF_ROPE 64
#define MPF_VD 128
#define MPF_DQK (MPF_NOPE + MPF_ROPE) // 192
#define MPF_KV (MPF_NOPE + MPF_VD)     // an expanded row of one head: K_nope then V
#define MPF_LK (MPF_DQK + 8)           // a staged K row, elements (ldmatrix without bank conflicts)
#define MPF_LV (MPF_VD + 8)            // a staged V row
#define MPF_SCRATCH_BYTES ((size_t)256 << 20) // expanded K_nope and V of one pass at most (one head always fits)
#define MPF_PLAN_THREADS 1024
// The attention kernel's key tiles (MPF_ABK keys, a divisor of MPF_BK),
// its copy stages and the blocks a multiprocessor its launch bounds ask for;
// overridable (-D) for sweeps. On an H100, BenchmarkGPUMLAPrefill (BF16,
// 4096 tokens, one call): 64 / 2 / 2 679-685 us, 32 / 2 / 3 686-690, 32 / 3
// / 3 692-693, 64 / 3 / 1 1088 (kernels/cuda/NOTES.md). Every setting gives a
// row the same bits alone, in a batch and in chunks; the key tile changes
// them (the softmax's rescaling points).
#ifndef MPF_ABK
#define MPF_ABK 64
#endif
#ifndef MPF_ASTAGES
#define MPF_ASTAGES 2
#endif
#ifndef MPF_AMINB
#define MPF_AMINB 2
#endif
static_assert(MPF_BK % MPF_ABK == 0 && MPF_ABK % 16 == 0, "attention key tiles divide the expanded rows' padding");
static_assert(MPF_ASTAGES >= 2, "the attention kernel needs two copy stages at least");

// Expansion GEMM tiles: MPF_EBM rows x MPF_EBN columns (half a head's 256),
// kv_lora_rank in steps of MPF_EBK through MPF_ESTAGES copy stages.
#define MPF_EBM 64
#define MPF_EBN 128
#define MPF_EBK 64
#define MPF_ESTAGES 3
#define MPF_ELD (MPF_EBK + 8)

// di_mpf_pack rounds two floats to the 16-bit type T (lo in the low half).
template <typename T> __device__ __forceinline__ uint32_t di_mpf_pack(float lo, float hi);
template <> __device__ __forceinline__ uint32_t di_mpf_pack<__half>(float lo, float hi) { return di_half2_bits(lo, hi); }
template <> __device__ __forceinline__ uint32_t di_mpf_pack<__nv_bfloat16>(float lo, float hi) {
	__nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
	return *reinterpret_cast<uint32_t *>(&h);
}

// ---------------------------------------------------------------- the plan

// di_mpf_plan_k: one block of MPF_PLAN_THREADS threads. For sequence s
// (ql query rows, kl keys): a prefill sequence (ql >= MPF_MIN_Q) has
// ceil(ql / MPF_BQ) query tiles and, when its metadata is valid (ql <= kl
// <= max_keys), its kl keys rounded up to MPF_BK expanded rows; any other
// sequence has ql absorbed rows. base_r, base_t and cu_dec ([num_seqs + 1]
// each) get the exclusive prefix sums of the three, counts[0..2] their
// totals (the rows' total clamped to 2^30). Offsets that do not cover
// the call's num_tokens rows set DI_CHECK_MLA. With a hint (hint_rows >= 0:
// the host sized the launches by it), totals above the hint's rows or
// other than its tiles and absorbed rows set DI_CHECK_MLA and are zeroed
// (every total and offset), so that no launch reads past what the hint
// sized: the call's prefill and absorbed rows are then not computed.
__global__ void __launch_bounds__(MPF_PLAN_THREADS)
    di_mpf_plan_k(int *base_r, int *base_t, int *cu_dec, int *counts, const int *cu, const int *seqlens_k,
                  int num_seqs, int num_tokens, int max_keys, int hint_rows, int hint_tiles, int hint_absorbed,
                  unsigned *check) {
	__shared__ long long ws[3][32];
	__shared__ long long carry[3];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
	di_pdl_wait();
	if (tid < 3) carry[tid] = 0;
	__syncthreads();
	for (int s0 = 0; s0 < num_seqs; s0 += blockDim.x) {
		const int s = s0 + tid;
		long long v[3] = {0, 0, 0};
		if (s < num_seqs) {
			const int ql = cu[s + 1] - cu[s], kl = seqlens_k[s];
			if (ql >= MPF_MIN_Q) {
				v[1] = (ql + MPF_BQ - 1) / MPF_BQ;
				if (kl >= ql && kl <= max_keys) v[0] = (long long)(kl + MPF_BK - 1) / MPF_BK * MPF_BK;
			} else {
				v[2] = ql > 0 ? ql : 0;
			}
		}
		long long inc[3];
#pragma unroll
		for (int k = 0; k < 3; k++) {
			inc[k] = v[k];
#pragma unroll
			for (int o = 1; o < 32; o <<= 1) {
				const long long t = __shfl_up_sync(0xffffffffu, inc[k], o);
				if (lane >= o) inc[k] += t;
			}
			if (lane == 31) ws[k][warp] = inc[k];
		}
		__syncthreads();
		if (warp == 0) {
#pragma unroll
			for (int k = 0; k < 3; k++) {
				long long x = lane < nwarps ? ws[k][lane] : 0;
#pragma unroll
				for (int o = 1; o < 32; o <<= 1) {
					const long long t = __shfl_up_sync(0xffffffffu, x, o);
					if (lane >= o) x += t;
				}
				ws[k][lane] = x; // inclusive over the warps
			}
		}
		__syncthreads();
		if (s < num_seqs) {
			long long e[3];
#pragma unroll
			for (int k = 0; k < 3; k++) e[k] = carry[k] + (warp > 0 ? ws[k][warp - 1] : 0) + inc[k] - v[k];
			base_r[s] = (int)min(e[0], (long long)1 << 30);
			base_t[s] = (int)e[1];
			cu_dec[s] = (int)e[2];
		}
		__syncthreads(); // carry and ws are read
		if (tid < 3) carry[tid] += ws[tid][nwarps - 1];
		__syncthreads();
	}
	__shared__ int off_hint;
	if (tid == 0) {
		if (cu[0] != 0 || cu[num_seqs] != num_tokens) atomicOr(check, DI_CHECK_MLA);
		const int r = (int)min(carry[0], (long long)1 << 30);
		off_hint = hint_rows >= 0 && (r > hint_rows || carry[1] != hint_tiles || carry[2] != hint_absorbed);
		if (off_hint) atomicOr(check, DI_CHECK_MLA);
		base_r[num_seqs] = r, base_t[num_seqs] = (int)carry[1], cu_dec[num_seqs] = (int)carry[2];
		counts[0] = r, counts[1] = (int)carry[1], counts[2] = (int)carry[2];
	}
	__syncthreads();
	if (off_hint) {
		for (int s = tid; s <= num_seqs; s += blockDim.x) base_r[s] = base_t[s] = cu_dec[s] = 0;
		if (tid < 3) counts[tid] = 0;
	}
}

// ---------------------------------------------------------------- expansion

// di_mpf_convert_k rounds n weights to the 16-bit type T.
template <typename W, typename T>
__global__ void di_mpf_convert_k(T *dst, const W *src, size_t n) {
	di_pdl_wait();
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dst[i] = di_from_f32<T>(di_to_f32(src[i]));
}

static size_t di_mpf_expand_smem() {
	return (size_t)MPF_ESTAGES * (MPF_EBM + MPF_EBN) * MPF_ELD * 2 + MPF_EBM * sizeof(int);
}

// di_mpf_expand_k: grid (2 x heads of the pass, expanded rows / MPF_EBM),
// MPF_THREADS threads, shared memory di_mpf_expand_smem. Block (x, y)
// computes expanded rows [64 y, 64 y + 64) (all of one sequence: each
// sequence's rows are padded to MPF_BK) times columns [128 (x & 1), +128)
// of head h0 + x / 2 (K_nope, then V): kv[x / 2][r][c] = T(sum over k in
// order of c_kv[r][k] wb[x * 128 + c][k]) in float32, where wb is wkvb's
// rows from head h0 on, in T; rows past the sequence's keys are zero.
// Warp w owns rows 32 (w & 1) .. +32 and columns 64 (w >> 1) .. +64 of the
// tile (2 x 8 m16n8 accumulators). With write_kpe, the blocks of x = 0 also
// copy each row's k_pe into kpe [rows][MPF_ROPE]. With VT (for
// di_mpf_wg_k) a head's scratch is K_nope [r_stride][128] and then V
// transposed, [128][r_stride] (the same values, through shared memory).
// Blocks past the plan's total rows (counts[0]) return at once. A block table entry outside the
// cache sets DI_CHECK_MLA and reads zeros.
template <typename T, bool F8, bool VT>
__global__ void __launch_bounds__(MPF_THREADS, 2)
    di_mpf_expand_k(T *kv, T *kpe, const unsigned char *cache, const T *wb, const int *base_r, const int *counts,
                    const int *seqlens_k, const int *block_tables, int num_seqs, int max_blocks, int block_size,
                    int num_blocks, int kvl, int rowb, size_t r_stride, int write_kpe, unsigned *check) {
	extern __shared__ __align__(16) unsigned char mpf_esmem[];
	T *sA = reinterpret_cast<T *>(mpf_esmem);                      // [STAGES][EBM][ELD]
	T *sB = sA + MPF_ESTAGES * MPF_EBM * MPF_ELD;                  // [STAGES][EBN][ELD]
	int *sl = reinterpret_cast<int *>(sB + MPF_ESTAGES * MPF_EBN * MPF_ELD); // [EBM]
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	const int lm_row = lane & 7, lm_mat = lane >> 3;
	const int m0 = blockIdx.y * MPF_EBM;
	di_pdl_wait();
	if (m0 >= counts[0]) return;
	const int s = di_find_seq(base_r, num_seqs, m0);
	const int kl = seqlens_k[s], p0 = m0 - base_r[s];
	if (tid < MPF_EBM) {
		const int t = p0 + tid;
		sl[tid] = t < kl ? di_key_slot(block_tables + (size_t)s * max_blocks, t, block_size, num_blocks, check, DI_CHECK_MLA)
		                 : -1;
	}
	__syncthreads();
	const T *wblk = wb + (size_t)blockIdx.x * MPF_EBN * kvl;
	constexpr int CH = MPF_EBK / 8;                     // 8-column chunks of a tile's row
	constexpr int ACH = MPF_EBM * CH / MPF_THREADS;     // a thread's chunks of a latent tile
	static_assert(MPF_EBM * CH % MPF_THREADS == 0, "a latent tile's chunks split evenly over the threads");
	// An 8-bit row's chunks of the tile being fetched, in registers from the
	// load to the store (F8 only): 8 E4M3 bytes and their group's scale.
	[[maybe_unused]] uint2 raw[ACH];
	[[maybe_unused]] float rscale[ACH];
	auto fetch_f8 = [&](int kt) {
		const int k0 = kt * MPF_EBK;
#pragma unroll
		for (int i = 0; i < ACH; i++) {
			const int c = tid + i * MPF_THREADS, r = c / CH, e = (c - r * CH) * 8, slot = sl[r];
			raw[i] = make_uint2(0, 0), rscale[i] = 0.f;
			if (slot >= 0) {
				const unsigned char *row = cache + (size_t)slot * rowb;
				raw[i] = *reinterpret_cast<const uint2 *>(row + k0 + e);
				rscale[i] = reinterpret_cast<const float *>(row + kvl + 2 * MPF_ROPE)[(k0 + e) / MLA_F8_GROUP];
			}
		}
	};
	// store_f8 widens the fetched chunks into stage st as the absorbed
	// kernels widen a tile (value * its group's scale, rounded to half), so
	// that an 8-bit row expands to the bits of a half row holding its values.
	auto store_f8 = [&](int st) {
		T *a = sA + st * MPF_EBM * MPF_ELD;
#pragma unroll
		for (int i = 0; i < ACH; i++) {
			const int c = tid + i * MPF_THREADS, r = c / CH, e = (c - r * CH) * 8;
			const uint32_t wv[2] = {raw[i].x, raw[i].y};
			uint32_t hv[4];
#pragma unroll
			for (int u = 0; u < 2; u++) di_fp8x4_scaled_half(wv[u], rscale[i], hv[2 * u], hv[2 * u + 1]);
			*reinterpret_cast<uint4 *>(a + r * MPF_ELD + e) = make_uint4(hv[0], hv[1], hv[2], hv[3]);
		}
	};
	// load queues tile kt's copies into stage st: the weight's always by
	// cp.async, a 16-bit cache's latent rows too (an 8-bit cache's go
	// through fetch_f8 and store_f8).
	auto load = [&](int kt, int st) {
		const int k0 = kt * MPF_EBK;
		T *a = sA + st * MPF_EBM * MPF_ELD, *b = sB + st * MPF_EBN * MPF_ELD;
		if constexpr (!F8) {
			for (int c = tid; c < MPF_EBM * CH; c += MPF_THREADS) {
				const int r = c / CH, e = (c - r * CH) * 8, slot = sl[r];
				di_cp_async16(a + r * MPF_ELD + e, cache + (slot >= 0 ? (size_t)slot * rowb + (size_t)(k0 + e) * sizeof(T) : 0),
				              slot >= 0);
			}
		}
		for (int c = tid; c < MPF_EBN * CH; c += MPF_THREADS) {
			const int r = c / CH, e = (c - r * CH) * 8;
			di_cp_async16(b + r * MPF_ELD + e, wblk + (size_t)r * kvl + k0 + e, true);
		}
		di_cp_async_commit();
	};
	const int nk = kvl / MPF_EBK;
#pragma unroll
	for (int i = 0; i < MPF_ESTAGES - 1; i++) {
		if (i < nk) {
			load(i, i);
			if constexpr (F8) {
				fetch_f8(i);
				store_f8(i);
			}
		} else {
			di_cp_async_commit();
		}
	}
	if (write_kpe && blockIdx.x == 0) {
		// k_pe as stored: the row's rope part in T (an 8-bit row keeps it as
		// half, after its kvl bytes).
		constexpr int RCH = MPF_ROPE / 8;
		const size_t pe_off = (size_t)kvl * (F8 ? 1 : sizeof(T));
		for (int c = tid; c < MPF_EBM * RCH; c += MPF_THREADS) {
			const int r = c / RCH, e = (c - r * RCH) * 8, slot = sl[r];
			uint4 v = make_uint4(0, 0, 0, 0);
			if (slot >= 0) v = *reinterpret_cast<const uint4 *>(cache + (size_t)slot * rowb + pe_off + e * sizeof(T));
			*reinterpret_cast<uint4 *>(kpe + (size_t)(m0 + r) * MPF_ROPE + e) = v;
		}
	}
	const int wm = (warp & 1) * 32, wn = (warp >> 1) * 64;
	float acc[2][8][4];
#pragma unroll
	for (int mi = 0; mi < 2; mi++)
#pragma unroll
		for (int nj = 0; nj < 8; nj++) acc[mi][nj][0] = acc[mi][nj][1] = acc[mi][nj][2] = acc[mi][nj][3] = 0.f;
	for (int kt = 0; kt < nk; kt++) {
		di_cp_async_wait<MPF_ESTAGES - 2>(); // this thread's copies of tile kt have landed
		__syncthreads();                     // everyone's; and the stage refilled below is consumed
		const int nx = kt + MPF_ESTAGES - 1;
		if (nx < nk) {
			load(nx, nx % MPF_ESTAGES);
			if constexpr (F8) fetch_f8(nx); // stored after this tile's products, which hide the loads
		} else {
			di_cp_async_commit();
		}
		const T *a = sA + (kt % MPF_ESTAGES) * MPF_EBM * MPF_ELD, *b = sB + (kt % MPF_ESTAGES) * MPF_EBN * MPF_ELD;
#pragma unroll
		for (int ks = 0; ks < MPF_EBK / 16; ks++) {
			uint32_t af[2][4];
#pragma unroll
			for (int mi = 0; mi < 2; mi++)
				di_ldmatrix_x4(af[mi], a + (wm + mi * 16 + lm_row + (lm_mat & 1) * 8) * MPF_ELD + ks * 16 + (lm_mat >> 1) * 8);
#pragma unroll
			for (int nj = 0; nj < 8; nj += 2) {
				uint32_t bf[4];
				di_ldmatrix_x4(bf, b + (wn + (nj + (lm_mat >> 1)) * 8 + lm_row) * MPF_ELD + ks * 16 + (lm_mat & 1) * 8);
#pragma unroll
				for (int mi = 0; mi < 2; mi++) {
					di_mma16816<T>(acc[mi][nj], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bf[0], bf[1]);
					di_mma16816<T>(acc[mi][nj + 1], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bf[2], bf[3]);
				}
			}
		}
		if constexpr (F8) {
			// Stage nx % MPF_ESTAGES was last read in tile kt - 1, which every
			// thread finished before this tile's barrier; the next tile's
			// barrier publishes the stores before tile nx reads them.
			if (nx < nk) store_f8(nx % MPF_ESTAGES);
		}
	}
	di_cp_async_wait<0>();
	if constexpr (VT) {
		// The wgmma attention kernel's layout: K_nope rows of MPF_NOPE, and V
		// transposed (each value column a row of r_stride keys), so that
		// both products read K-major tiles.
		T *hb = kv + (size_t)(blockIdx.x >> 1) * r_stride * MPF_KV;
		if (blockIdx.x & 1) {
			constexpr int LT = MPF_EBM + 8; // a staged V column: the block's rows
			static_assert(MPF_EBN * LT <= MPF_ESTAGES * MPF_EBM * MPF_ELD, "the transposed tile fits the latent stages");
			T *tr = sA;
			__syncthreads(); // every warp is past its last reads of the stages
#pragma unroll
			for (int mi = 0; mi < 2; mi++)
#pragma unroll
				for (int nj = 0; nj < 8; nj++)
#pragma unroll
					for (int e = 0; e < 4; e++)
						tr[(wn + nj * 8 + 2 * t4 + (e & 1)) * LT + wm + mi * 16 + g + 8 * (e >> 1)] =
						    di_from_f32<T>(acc[mi][nj][e]);
			__syncthreads();
			T *vt = hb + (size_t)r_stride * MPF_NOPE + m0;
			for (int c = tid; c < MPF_EBN * MPF_EBM / 8; c += MPF_THREADS) {
				const int d = c / (MPF_EBM / 8), e = (c - d * (MPF_EBM / 8)) * 8;
				*reinterpret_cast<uint4 *>(vt + (size_t)d * r_stride + e) = *reinterpret_cast<const uint4 *>(tr + d * LT + e);
			}
			return;
		}
	}
	// The tile's rows: K_nope rows of MPF_NOPE (VT), or [K_nope, V] rows of MPF_KV.
	const int ld = VT ? MPF_NOPE : MPF_KV;
	T *o = VT ? kv + (size_t)(blockIdx.x >> 1) * r_stride * MPF_KV + (size_t)m0 * MPF_NOPE
	          : kv + ((size_t)(blockIdx.x >> 1) * r_stride + m0) * MPF_KV + (blockIdx.x & 1) * MPF_EBN;
#pragma unroll
	for (int mi = 0; mi < 2; mi++) {
		const int row = wm + mi * 16 + g;
#pragma unroll
		for (int nj = 0; nj < 8; nj++) {
			const int col = wn + nj * 8 + 2 * t4;
			*reinterpret_cast<uint32_t *>(o + (size_t)row * ld + col) = di_mpf_pack<T>(acc[mi][nj][0], acc[mi][nj][1]);
			*reinterpret_cast<uint32_t *>(o + (size_t)(row + 8) * ld + col) = di_mpf_pack<T>(acc[mi][nj][2], acc[mi][nj][3]);
		}
	}
}

// di_mpf_wgx_k is di_mpf_expand_k with VT for 16-bit caches on Hopper's
// warpgroup MMA (sm_90a builds, with di_mpf_wg_k): grid (heads of the
// pass, expanded rows / MPX_BN rounded up), MPX_THREADS threads, shared
// memory MPX_SMEM. Block (x, y) multiplies all 256 wkvb rows of head h0 +
// x (K_nope's 128, then V's) by the latents of expanded rows [MPX_BN y,
// + MPX_BN), which may span sequences (each row finds its own): warpgroup
// w takes weight rows 64 w + 128 j .. + 63 (j = 0, 1) by the block's rows,
// wgmma.m64n128k16 with both operands K-major in the 128-byte swizzle, a
// ring of MPX_STAGES cp.async stages of 64 columns of kv_lora_rank (one
// barrier a stage). Each output is
// summed over k16 slices in natural order into one float32 accumulator,
// as di_mpf_expand_k's mma.sync chain is: the same bits. The tile goes
// through shared memory, rounded to T, to K_nope rows and V's columns
// (16-byte stores); rows at or past r_stride are not stored. With
// write_kpe, the blocks of x = 0 also copy each row's k_pe. Blocks past
// the plan's total rows (counts[0]) return at once; a block table entry
// outside the cache sets DI_CHECK_MLA and reads zeros.
#define MPX_BN 128 // expanded rows a block
#define MPX_THREADS 256
#ifndef MPX_STAGES
#define MPX_STAGES 4
#endif
#define MPX_A_BYTES (2 * MPF_KV * 64) // a stage of the head's 256 weight rows: 128-byte lines
#define MPX_B_BYTES (MPX_BN * 64 * 2) // a stage of latent rows
#define MPX_STAGE_BYTES (MPX_A_BYTES + MPX_B_BYTES)
#define MPX_LD (MPX_BN + 8) // a staged output line (K_nope row or V column), elements
#define MPX_SMEM ((size_t)MPX_STAGES * MPX_STAGE_BYTES + 1024)
static_assert(MPX_STAGES >= 2, "the expansion needs two copy stages at least");
static_assert(2 * MPF_NOPE * MPX_LD * 2 <= MPX_STAGES * MPX_STAGE_BYTES, "the output tiles fit the stages");

template <typename T>
__global__ void __launch_bounds__(MPX_THREADS, 1)
    di_mpf_wgx_k(T *kv, T *kpe, const unsigned char *cache, const T *wb, const int *base_r, const int *counts,
                 const int *seqlens_k, const int *block_tables, int num_seqs, int max_blocks, int block_size,
                 int num_blocks, int kvl, int rowb, size_t r_stride, int write_kpe, unsigned *check) {
	static_assert(MPF_NOPE == 128 && MPF_VD == 128, "a head's weight rows are two groups of 128");
#ifndef MW_HAS_WGMMA
	__trap(); // di_wg_arch_ok keeps other targets' builds from launching it
#endif
	extern __shared__ __align__(16) unsigned char mpx_raw[];
	const unsigned raw = (unsigned)__cvta_generic_to_shared(mpx_raw);
	const unsigned sbase = (raw + 1023u) & ~1023u;
	unsigned char *sh = mpx_raw + (sbase - raw);
	const int tid = threadIdx.x, wg = tid >> 7, g = (tid & 31) >> 2, t4 = tid & 3;
	const size_t m0 = (size_t)blockIdx.y * MPX_BN;
	di_pdl_wait();
	if (m0 >= (size_t)counts[0]) return;
	// This thread's copies: 16-byte chunk tid % 8 of lines tid / 8 + 32 i
	// (8 weight lines, 4 latent lines a stage).
	const int part = tid & 7, line = tid >> 3;
	const unsigned dst = (unsigned)(line * 128 + ((part ^ (line & 7)) << 4)); // + 4096 i
	const T *wsrc = wb + ((size_t)blockIdx.x * MPF_KV + line) * kvl + 8 * part;
	const unsigned char *lsrc[4];
	bool lok[4];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const int r = (int)m0 + line + 32 * i, s = di_find_seq(base_r, num_seqs, min(r, counts[0] - 1));
		const int t = r - base_r[s];
		const int slot = r < counts[0] && t < seqlens_k[s]
		                     ? di_key_slot(block_tables + (size_t)s * max_blocks, t, block_size, num_blocks, check,
		                                   DI_CHECK_MLA)
		                     : -1;
		lok[i] = slot >= 0;
		lsrc[i] = cache + (lok[i] ? (size_t)slot * rowb : 0) + 16 * part;
	}
	const int nk = kvl / 64;
	auto issue = [&](int kt) {
		unsigned char *a = sh + (size_t)(kt % MPX_STAGES) * MPX_STAGE_BYTES, *b = a + MPX_A_BYTES;
#pragma unroll
		for (int i = 0; i < 8; i++) di_cp_async16(a + dst + 4096 * i, wsrc + (size_t)32 * i * kvl + 64 * kt, true);
#pragma unroll
		for (int i = 0; i < 4; i++) di_cp_async16(b + dst + 4096 * i, lsrc[i] + 128 * kt, lok[i]);
	};
	// Stages queued ahead of the one multiplied. Each stage's products are
	// waited for before the next barrier: with one group left running
	// across it (as di_moe_wg_k does) ptxas serializes every wgmma of this
	// kernel (C7514, the epilogue's reads of the accumulators).
	constexpr int AHEAD = MPX_STAGES - 1;
	float d[2][64];
#pragma unroll
	for (int j = 0; j < 2; j++)
#pragma unroll
		for (int i = 0; i < 64; i++) d[j][i] = 0.f;
#pragma unroll
	for (int kt = 0; kt < AHEAD; kt++) {
		if (kt < nk) issue(kt);
		di_cp_async_commit();
	}
#pragma unroll 1
	for (int kt = 0; kt < nk; kt++) {
		di_cp_async_wait<AHEAD - 1>();
		di_fence_async_shared();
		// Stage kt has landed, and every warpgroup has finished the products
		// of stage kt - 1, whose slot the next copy refills.
		__syncthreads();
		if (kt + AHEAD < nk) issue(kt + AHEAD);
		di_cp_async_commit();
		const unsigned a = sbase + (unsigned)((kt % MPX_STAGES) * MPX_STAGE_BYTES), b = a + MPX_A_BYTES;
		di_wg_fence();
#pragma unroll
		for (int kk = 0; kk < 4; kk++)
#pragma unroll
			for (int j = 0; j < 2; j++)
				di_wg_mma<T>(d[j], di_wg_desc(a + (64 * wg + 128 * j) * 128 + kk * 32), di_wg_desc(b + kk * 32));
		di_wg_commit();
		di_wg_wait<0>();
	}
	di_cp_async_wait<0>();
	__syncthreads(); // every warpgroup is past its last products: the stages are free
	// Element i of d[j]: weight row 64 wg + 128 j + 16 (warp % 4) + g + 8 ((i >> 1) & 1) of the head,
	// expanded row m0 + 8 (i >> 2) + 2 t4 + (i & 1). K_nope goes to kt_s [row][dim], V to vt_s [dim][row].
	T *kt_s = reinterpret_cast<T *>(sh), *vt_s = kt_s + MPF_NOPE * MPX_LD;
	const int wr = 64 * wg + 16 * ((tid >> 5) & 3) + g;
#pragma unroll
	for (int i = 0; i < 64; i++) {
		const int c = wr + 8 * ((i >> 1) & 1), n = 8 * (i >> 2) + 2 * t4 + (i & 1);
		kt_s[n * MPX_LD + c] = di_from_f32<T>(d[0][i]);
		vt_s[c * MPX_LD + n] = di_from_f32<T>(d[1][i]);
	}
	__syncthreads();
	T *hb = kv + (size_t)blockIdx.x * r_stride * MPF_KV, *vt = hb + r_stride * MPF_NOPE;
	constexpr int CH = MPX_BN / 8; // 16-byte chunks of a staged line
	for (int c = tid; c < MPF_NOPE * CH; c += MPX_THREADS) {
		const int ln = c / CH, e = (c - ln * CH) * 8;
		if (m0 + ln < r_stride) // K_nope row m0 + ln: its 128 dims
			*reinterpret_cast<uint4 *>(hb + (m0 + ln) * MPF_NOPE + e) = *reinterpret_cast<const uint4 *>(kt_s + ln * MPX_LD + e);
		if (m0 + e < r_stride) // V column ln: rows m0 + e .. + 7
			*reinterpret_cast<uint4 *>(vt + ln * r_stride + m0 + e) = *reinterpret_cast<const uint4 *>(vt_s + ln * MPX_LD + e);
	}
	if (write_kpe && blockIdx.x == 0) {
		constexpr int RCH = MPF_ROPE / 8;
		const size_t pe_off = (size_t)kvl * sizeof(T);
		for (int c = tid; c < MPX_BN * RCH; c += MPX_THREADS) {
			const int r = c / RCH, e = (c - r * RCH) * 8;
			if (m0 + r >= r_stride) continue;
			const int rr = (int)m0 + r, s = di_find_seq(base_r, num_seqs, min(rr, counts[0] - 1)), t = rr - base_r[s];
			uint4 v = make_uint4(0, 0, 0, 0);
			if (rr < counts[0] && t < seqlens_k[s]) {
				const int slot = di_key_slot(block_tables + (size_t)s * max_blocks, t, block_size, num_blocks, check, DI_CHECK_MLA);
				if (slot >= 0) v = *reinterpret_cast<const uint4 *>(cache + (size_t)slot * rowb + pe_off + e * sizeof(T));
			}
			*reinterpret_cast<uint4 *>(kpe + (m0 + r) * MPF_ROPE + e) = v;
		}
	}
}

// ---------------------------------------------------------------- attention

static size_t di_mpf_attn_smem() { return (size_t)MPF_ASTAGES * MPF_ABK * (MPF_LK + MPF_LV) * 2; }

// di_mpf_softmax folds one key tile's scores sc of a warp (16 query rows,
// 64 keys: mma.sync's m16n8 accumulators, and wgmma's D fragment alike)
// into the online softmax: scaled to log2 units and masked (n: the tile's
// keys below the block's last; full: every key of the tile is visible to
// every row of the warp; last: this thread's rows see keys [0, last)), the
// update of (m, l), the factors alpha by which each row half's output is
// to be scaled (di_mpf_rescale) before this tile's products are added, and
// the probabilities (in sc; di_mpf_pack_probs rounds them to T as the A
// fragments of the products with V).
__device__ __forceinline__ void di_mpf_softmax(float (&sc)[MPF_ABK / 8][4], float (&alpha)[2], float (&m)[2],
                                               float (&l)[2], int t0, int n, bool full, const int (&last)[2],
                                               float scale_log2) {
	constexpr int NT = MPF_ABK / 8;
	const int t4 = threadIdx.x & 3;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float mx = -CUDART_INF_F;
		if (full) {
#pragma unroll
			for (int nt = 0; nt < NT; nt++) {
#pragma unroll
				for (int c = 0; c < 2; c++) {
					const float v = sc[nt][2 * i + c] * scale_log2;
					sc[nt][2 * i + c] = v;
					mx = fmaxf(mx, v);
				}
			}
		} else {
#pragma unroll
			for (int nt = 0; nt < NT; nt++) {
#pragma unroll
				for (int c = 0; c < 2; c++) {
					const int kk = nt * 8 + 2 * t4 + c;
					const bool vis = kk < n && t0 + kk < last[i];
					const float v = vis ? sc[nt][2 * i + c] * scale_log2 : -CUDART_INF_F;
					sc[nt][2 * i + c] = v;
					mx = fmaxf(mx, v);
				}
			}
		}
		alpha[i] = di_softmax_step<true>(sc, m, l, i, mx);
	}
}

// di_mpf_pack_probs rounds a tile's probabilities sc to T as the A
// fragments pa of the products with V (k16 slice kk of the tile).
template <typename T>
__device__ __forceinline__ void di_mpf_pack_probs(const float (&sc)[MPF_ABK / 8][4], uint32_t (&pa)[MPF_ABK / 16][4]) {
#pragma unroll
	for (int kk = 0; kk < MPF_ABK / 16; kk++) {
		pa[kk][0] = di_mpf_pack<T>(sc[2 * kk][0], sc[2 * kk][1]);
		pa[kk][1] = di_mpf_pack<T>(sc[2 * kk][2], sc[2 * kk][3]);
		pa[kk][2] = di_mpf_pack<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
		pa[kk][3] = di_mpf_pack<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
	}
}

// di_mpf_rescale scales the output's row halves by alpha.
__device__ __forceinline__ void di_mpf_rescale(float (&o)[MPF_VD / 8][4], const float (&alpha)[2]) {
#pragma unroll
	for (int nd = 0; nd < MPF_VD / 8; nd++) {
		o[nd][0] *= alpha[0], o[nd][1] *= alpha[0];
		o[nd][2] *= alpha[1], o[nd][3] *= alpha[1];
	}
}

// di_mpf_tile runs one key tile of a warp (16 query rows of one head,
// fragments qf) against the staged K ([MPF_ABK][MPF_LK]) and V
// ([MPF_ABK][MPF_LV]) tiles: the scores, di_mpf_softmax and the products
// with V, in a fixed order (di_tc16_tile's, with qk dim 192 and v dim 128).
template <typename T>
__device__ __forceinline__ void di_mpf_tile(float (&o)[MPF_VD / 8][4], float (&m)[2], float (&l)[2],
                                            const uint32_t (&qf)[MPF_DQK / 16][4], const T *Ks, const T *Vs, int t0,
                                            int n, bool full, const int (&last)[2], float scale_log2) {
	constexpr int NT = MPF_ABK / 8;
	const int lane = threadIdx.x & 31, lm_row = lane & 7, lm_mat = lane >> 3;
	float sc[NT][4];
#pragma unroll
	for (int nt = 0; nt < NT; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
	for (int ks = 0; ks < MPF_DQK / 16; ks++) {
#pragma unroll
		for (int nt = 0; nt < NT; nt += 2) {
			// matrices: (keys nt, d lo), (keys nt, d hi), (keys nt+1, d lo), (keys nt+1, d hi)
			uint32_t b[4];
			di_ldmatrix_x4(b, Ks + ((nt + (lm_mat >> 1)) * 8 + lm_row) * MPF_LK + ks * 16 + (lm_mat & 1) * 8);
			di_mma16816<T>(sc[nt], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[0], b[1]);
			di_mma16816<T>(sc[nt + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[2], b[3]);
		}
	}
	uint32_t pa[MPF_ABK / 16][4];
	float alpha[2];
	di_mpf_softmax(sc, alpha, m, l, t0, n, full, last, scale_log2);
	di_mpf_pack_probs<T>(sc, pa);
	di_mpf_rescale(o, alpha);
#pragma unroll
	for (int kk = 0; kk < MPF_ABK / 16; kk++) {
#pragma unroll
		for (int nd = 0; nd < MPF_VD / 8; nd += 2) {
			// matrices: (keys lo, d nd), (keys hi, d nd), (keys lo, d nd+1), (keys hi, d nd+1)
			uint32_t b[4];
			di_ldmatrix_x4_trans(b, Vs + (kk * 16 + (lm_mat & 1) * 8 + lm_row) * MPF_LV + (nd + (lm_mat >> 1)) * 8);
			di_mma16816<T>(o[nd], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b[0], b[1]);
			di_mma16816<T>(o[nd + 1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b[2], b[3]);
		}
	}
}

// di_mpf_rows is a block's query rows: query tile b of the plan (base_t; a
// sequence's tiles last first, so the longest run first), rows j0 .. j0 +
// nq of sequence s (its first row q0 of the call), whose first row sees
// off + 1 keys; the block's rows see keys below k_hi. di_mpf_block_rows
// finds them; a block past the plan's tiles gets false, and so does one
// whose sequence's metadata does not fit (kl < ql or kl > max_keys), after
// setting DI_CHECK_MLA and zeroing its rows of head h.
struct di_mpf_rows {
	int s, q0, j0, nq, off, k_hi;
};
__device__ __forceinline__ bool di_mpf_block_rows(di_mpf_rows &r, float *out, const int *cu, const int *seqlens_k,
                                                  const int *base_t, int num_seqs, int max_keys, int num_heads, int h,
                                                  bool first_head, unsigned *check) {
	const int b = blockIdx.y;
	if (b >= base_t[num_seqs]) return false;
	r.s = di_find_seq(base_t, num_seqs, b);
	r.q0 = cu[r.s];
	const int ql = cu[r.s + 1] - r.q0, kl = seqlens_k[r.s];
	const int nts = base_t[r.s + 1] - base_t[r.s];
	r.j0 = (nts - 1 - (b - base_t[r.s])) * MPF_BQ, r.nq = min(MPF_BQ, ql - r.j0);
	if (kl < ql || kl > max_keys) {
		if (threadIdx.x == 0 && first_head) atomicOr(check, DI_CHECK_MLA);
		for (int idx = threadIdx.x; idx < r.nq * MPF_VD; idx += blockDim.x) {
			const int row = idx / MPF_VD;
			out[((size_t)(r.q0 + r.j0 + row) * num_heads + h) * MPF_VD + idx - row * MPF_VD] = 0.f;
		}
		return false;
	}
	r.off = kl - ql + r.j0; // keys before the tile's first row
	r.k_hi = r.off + r.nq;   // keys any row of the block sees
	return true;
}

// di_mpf_q loads this thread's q fragments (rows r0 and r0 + 8 of the
// block's, as mma.sync's m16n8k16 A fragments over the 192 dims) straight
// from the float32 rows of head h, rounded to T; rows past nq are zeros.
template <typename T>
__device__ __forceinline__ void di_mpf_q(uint32_t (&qf)[MPF_DQK / 16][4], const float *q, const di_mpf_rows &r, int r0,
                                         int num_heads, int h) {
	const int t4 = threadIdx.x & 3;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int row = r0 + 8 * i;
		const float *qrow = q + ((size_t)(r.q0 + r.j0 + row) * num_heads + h) * MPF_DQK + 2 * t4;
#pragma unroll
		for (int ks = 0; ks < MPF_DQK / 16; ks++) {
			float2 lo = make_float2(0.f, 0.f), hi = lo;
			if (row < r.nq) {
				lo = *reinterpret_cast<const float2 *>(qrow + ks * 16);
				hi = *reinterpret_cast<const float2 *>(qrow + ks * 16 + 8);
			}
			qf[ks][i] = di_mpf_pack<T>(lo.x, lo.y);
			qf[ks][2 + i] = di_mpf_pack<T>(hi.x, hi.y);
		}
	}
}

// di_mpf_store writes o / l of this thread's rows r0 and r0 + 8 (those
// below nq) into out (F32 [rows, heads, 128]) at head h; l is the thread's
// share of its rows' sums (its quad adds them).
__device__ __forceinline__ void di_mpf_store(float *out, const float (&o)[MPF_VD / 8][4], const float (&l)[2],
                                             const di_mpf_rows &r, int r0, int num_heads, int h) {
	const int t4 = threadIdx.x & 3;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float li = l[i];
		li += __shfl_xor_sync(0xffffffffu, li, 1);
		li += __shfl_xor_sync(0xffffffffu, li, 2);
		const int row = r0 + 8 * i;
		if (row >= r.nq) continue;
		const float inv = li > 0.f ? 1.f / li : 0.f;
		float *orow = out + ((size_t)(r.q0 + r.j0 + row) * num_heads + h) * MPF_VD + 2 * t4;
#pragma unroll
		for (int nd = 0; nd < MPF_VD / 8; nd++)
			*reinterpret_cast<float2 *>(orow + nd * 8) = make_float2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
	}
}

// di_mpf_attn_k: grid (heads of the pass, query tiles), MPF_THREADS
// threads, shared memory di_mpf_attn_smem. Block (x, y) takes head h0 + x
// and query tile y of the plan (base_t; a sequence's tiles last first, so
// the longest run first); warp w its rows 16 w .. +16. The keys come from
// the expanded scratch of the head (kv: [heads of the pass][r_stride][256],
// the sequence's rows from base_r[s]) and kpe, in tiles of MPF_ABK aligned to
// positions 0, MPF_ABK, ..., through a ring of MPF_ASTAGES cp.async stages
// (MPF_ASTAGES - 1 tiles in flight while one is multiplied). out (F32 [rows, heads,
// 128]) gets o / l. A sequence whose metadata does not fit (kl < ql or kl >
// max_keys) sets DI_CHECK_MLA and gets zeros.
template <typename T>
__global__ void __launch_bounds__(MPF_THREADS, MPF_AMINB)
    di_mpf_attn_k(float *out, const float *q, const T *kv, const T *kpe, const int *cu, const int *seqlens_k,
                  const int *base_r, const int *base_t, int num_seqs, int max_keys, int num_heads, int h0,
                  size_t r_stride, float scale_log2, unsigned *check) {
	constexpr int KS = MPF_DQK / 16, ND = MPF_VD / 8;
	extern __shared__ __align__(16) unsigned char mpf_asmem[];
	T *Kst = reinterpret_cast<T *>(mpf_asmem); // [MPF_ASTAGES][MPF_ABK][MPF_LK]
	T *Vst = Kst + MPF_ASTAGES * MPF_ABK * MPF_LK; // [MPF_ASTAGES][MPF_ABK][MPF_LV]
	const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2;
	const int hx = blockIdx.x, h = h0 + hx;
	di_pdl_wait();
	di_mpf_rows rw;
	if (!di_mpf_block_rows(rw, out, cu, seqlens_k, base_t, num_seqs, max_keys, num_heads, h, hx == 0, check)) return;
	const int s = rw.s, nq = rw.nq, off = rw.off, k_hi = rw.k_hi;
	const T *kb = kv + ((size_t)hx * r_stride + base_r[s]) * MPF_KV;
	const T *pb = kpe + (size_t)base_r[s] * MPF_ROPE;
	// fetch queues the copies of key tile t0 into stage st: per key 16
	// chunks of K_nope, 8 of k_pe and 16 of V (every row below the
	// sequence's padded end exists in the scratch). Each thread's chunks
	// are the same in every tile: a fixed trip count, unrolled.
	auto fetch = [&](int t0, int st) {
		T *kd = Kst + st * MPF_ABK * MPF_LK, *vd = Vst + st * MPF_ABK * MPF_LV;
		constexpr int CH = (MPF_NOPE + MPF_ROPE + MPF_VD) / 8;
		static_assert(MPF_ABK * CH % MPF_THREADS == 0, "every thread copies as many chunks");
#pragma unroll
		for (int i = 0; i < MPF_ABK * CH / MPF_THREADS; i++) {
			const int c = tid + MPF_THREADS * i, r = c / CH, e = c - r * CH;
			const T *src;
			T *dst;
			if (e < MPF_NOPE / 8) {
				src = kb + (size_t)(t0 + r) * MPF_KV + e * 8;
				dst = kd + r * MPF_LK + e * 8;
			} else if (e < (MPF_NOPE + MPF_ROPE) / 8) {
				src = pb + (size_t)(t0 + r) * MPF_ROPE + (e - MPF_NOPE / 8) * 8;
				dst = kd + r * MPF_LK + e * 8;
			} else {
				const int ev = e - (MPF_NOPE + MPF_ROPE) / 8;
				src = kb + (size_t)(t0 + r) * MPF_KV + MPF_NOPE + ev * 8;
				dst = vd + r * MPF_LV + ev * 8;
			}
			di_cp_async16(dst, src, true);
		}
	};
#pragma unroll
	for (int j = 0; j < MPF_ASTAGES - 1; j++) {
		if (j * MPF_ABK < k_hi) fetch(j * MPF_ABK, j);
		di_cp_async_commit();
	}
	const int rbase = warp * 16, r0 = rbase + g;
	uint32_t qf[KS][4];
	di_mpf_q<T>(qf, q, rw, r0, num_heads, h);
	// This thread's rows see keys [0, last); the warp's rows, keys below
	// w_hi; every row of the warp (all 16 real), keys below w_full.
	int last[2];
#pragma unroll
	for (int i = 0; i < 2; i++) last[i] = r0 + 8 * i < nq ? off + r0 + 8 * i + 1 : 0;
	const int w_hi = rbase < nq ? off + min(rbase + 15, nq - 1) + 1 : 0;
	const int w_full = rbase + 16 <= nq ? off + rbase + 1 : 0;
	float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f}, o[ND][4];
#pragma unroll
	for (int nd = 0; nd < ND; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
	int st = 0;
	for (int t0 = 0; t0 < k_hi; t0 += MPF_ABK, st = st + 1 == MPF_ASTAGES ? 0 : st + 1) {
		const int n = min(MPF_ABK, k_hi - t0);
		di_cp_async_wait<MPF_ASTAGES - 2>();
		// Tile t0 has landed for every thread, and every thread has finished
		// the tile before it, whose stage the next copy refills.
		__syncthreads();
		const int t_next = t0 + (MPF_ASTAGES - 1) * MPF_ABK;
		if (t_next < k_hi) fetch(t_next, st == 0 ? MPF_ASTAGES - 1 : st - 1);
		di_cp_async_commit();
		if (t0 < w_hi) {
			const bool full = n == MPF_ABK && t0 + MPF_ABK <= w_full;
			di_mpf_tile<T>(o, m, l, qf, Kst + st * MPF_ABK * MPF_LK, Vst + st * MPF_ABK * MPF_LV, t0, n, full, last,
			               scale_log2);
		}
	}
	di_cp_async_wait<0>();
	di_mpf_store(out, o, l, rw, r0, num_heads, h);
}

// ---------------------------------------------------------------- attention on wgmma

// di_mpf_wg_k is di_mpf_attn_k on Hopper's warpgroup MMA (sm_90a builds,
// by default; ctx->mla_pf_wg off keeps di_mpf_attn_k): the same grid,
// plan, key tiles of MPF_ABK = 64 keys aligned to absolute positions and
// online softmax, over the expansion's transposed layout (di_mpf_expand_k
// with VT: K_nope rows of 128, V as value columns of r_stride keys). The
// block's four warps are one warpgroup; per key tile it issues the scores
// as 12 wgmma.m64n64k16 (q from registers, mma.sync's A fragments; the K
// tile from shared memory) and, after the softmax, the products with V as
// 4 wgmma.m64n128k16 (the probabilities from registers, V's columns from
// shared memory). Both tiles sit K-major in the 128-byte swizzle (a
// 128-byte line of 64 elements a key or value column, its 16-byte chunk c
// at chunk c ^ (line & 7)), filled by a ring of MPW_STAGES cp.async
// stages. A wgmma sums each element over k16 slices in natural order, as
// di_mpf_tile's mma.sync chain does, and every other step is
// di_mpf_tile's: the two kernels give the same bits (a test checks). Every
// warp runs every key tile below the block's last key (wgmma is
// warpgroup-wide): a tile past a warp's rows is masked whole, which leaves
// its m, l and o as they were (alpha 1, probabilities 0). Shared memory:
// MPW_SMEM (40 KB a stage and 1 KB of alignment).
#ifndef MPW_STAGES
#define MPW_STAGES 2
#endif
#ifndef MPW_MINB
#define MPW_MINB 2
#endif
#define MPW_K_BYTES (MPF_ABK * MPF_DQK * 2) // three 64-column blocks of 64 key lines
#define MPW_V_BYTES (MPF_VD * MPF_ABK * 2)  // 128 value-column lines of 64 keys
#define MPW_STAGE_BYTES (MPW_K_BYTES + MPW_V_BYTES)
#define MPW_SMEM ((size_t)MPW_STAGES * MPW_STAGE_BYTES + 1024)
static_assert(MPW_STAGES >= 2, "the wgmma attention kernel needs two copy stages at least");

template <typename T>
__global__ void __launch_bounds__(MPF_THREADS, MPW_MINB)
    di_mpf_wg_k(float *out, const float *q, const T *kv, const T *kpe, const int *cu, const int *seqlens_k,
                const int *base_r, const int *base_t, int num_seqs, int max_keys, int num_heads, int h0,
                size_t r_stride, float scale_log2, unsigned *check) {
	static_assert(MPF_ABK == 64 && MPF_THREADS == 128, "a key tile is one 128-byte line; the block one warpgroup");
#ifndef MW_HAS_WGMMA
	__trap(); // di_wg_arch_ok keeps other targets' builds from launching it
#endif
	constexpr int KS = MPF_DQK / 16, ND = MPF_VD / 8, NT = MPF_ABK / 8;
	extern __shared__ __align__(16) unsigned char mpw_raw[];
	const unsigned raw = (unsigned)__cvta_generic_to_shared(mpw_raw);
	const unsigned sbase = (raw + 1023u) & ~1023u; // the swizzle repeats every 1024 bytes
	unsigned char *sh = mpw_raw + (sbase - raw);
	const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2;
	const int hx = blockIdx.x, h = h0 + hx;
	di_pdl_wait();
	di_mpf_rows rw;
	if (!di_mpf_block_rows(rw, out, cu, seqlens_k, base_t, num_seqs, max_keys, num_heads, h, hx == 0, check)) return;
	const int s = rw.s, nq = rw.nq, off = rw.off, k_hi = rw.k_hi;
	const T *hb = kv + (size_t)hx * r_stride * MPF_KV;
	const T *kb = hb + (size_t)base_r[s] * MPF_NOPE;            // K_nope rows
	const T *vb = hb + (size_t)r_stride * MPF_NOPE + base_r[s]; // value column d at vb + d r_stride
	const T *pb = kpe + (size_t)base_r[s] * MPF_ROPE;
	// This thread's copies: 16-byte chunk tid % 8 of lines tid / 8 + 16 i
	// (4 key lines of each of the K tile's three column blocks, 8 value
	// columns), every line below the sequence's padded end.
	const int part = tid & 7, line = tid >> 3;
	const unsigned dst = (unsigned)(line * 128 + ((part ^ (line & 7)) << 4)); // + 2048 i
	// fetch queues the copies of key tile t0's K and V tiles into stage st.
	auto fetch = [&](int t0, int st) {
		unsigned char *kd = sh + (size_t)st * MPW_STAGE_BYTES, *vd = kd + MPW_K_BYTES;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const size_t key = (size_t)(t0 + line + 16 * i);
			di_cp_async16(kd + dst + 2048 * i, kb + key * MPF_NOPE + 8 * part, true);
			di_cp_async16(kd + 8192 + dst + 2048 * i, kb + key * MPF_NOPE + 64 + 8 * part, true);
			di_cp_async16(kd + 16384 + dst + 2048 * i, pb + key * MPF_ROPE + 8 * part, true);
		}
#pragma unroll
		for (int i = 0; i < 8; i++) di_cp_async16(vd + dst + 2048 * i, vb + (size_t)(line + 16 * i) * r_stride + t0 + 8 * part, true);
	};
	const int rbase = warp * 16, r0 = rbase + g;
	int last[2];
#pragma unroll
	for (int i = 0; i < 2; i++) last[i] = r0 + 8 * i < nq ? off + r0 + 8 * i + 1 : 0;
	const int w_full = rbase + 16 <= nq ? off + rbase + 1 : 0;
	float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f}, o[ND][4];
#pragma unroll
	for (int nd = 0; nd < ND; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
	uint32_t qf[KS][4];
	// scores issues tile t0's 12 score products from stage st into sc.
	auto scores = [&](float (&sc)[NT][4], int st) {
		const unsigned ka = sbase + (unsigned)(st * MPW_STAGE_BYTES);
		di_wg_fence();
#pragma unroll
		for (int ks = 0; ks < KS; ks++)
			di_wg_mma_rs<T, MPF_ABK>(&sc[0][0], qf[ks], di_wg_desc(ka + (ks >> 2) * 8192 + (ks & 3) * 32), ks > 0);
		di_wg_commit();
	};
	// values issues the products of probabilities pa with the V tile of stage st into o.
	auto values = [&](const uint32_t (&pa)[MPF_ABK / 16][4], int st) {
		const unsigned va = sbase + (unsigned)(st * MPW_STAGE_BYTES + MPW_K_BYTES);
		di_wg_fence();
#pragma unroll
		for (int kk = 0; kk < MPF_ABK / 16; kk++) di_wg_mma_rs<T, MPF_VD>(&o[0][0], pa[kk], di_wg_desc(va + kk * 32));
		di_wg_commit();
	};
#pragma unroll
	for (int j = 0; j < MPW_STAGES - 1; j++) {
		if (j * MPF_ABK < k_hi) fetch(j * MPF_ABK, j);
		di_cp_async_commit();
	}
	di_mpf_q<T>(qf, q, rw, r0, num_heads, h);
	int st = 0;
	for (int t0 = 0; t0 < k_hi; t0 += MPF_ABK, st = st + 1 == MPW_STAGES ? 0 : st + 1) {
		const int n = min(MPF_ABK, k_hi - t0);
		di_cp_async_wait<MPW_STAGES - 2>();
		di_fence_async_shared();
		// Tile t0 has landed for every thread, and every thread's products
		// of the tile before it (whose stage the next copy refills) are done.
		__syncthreads();
		const int t_next = t0 + (MPW_STAGES - 1) * MPF_ABK, sn = st == 0 ? MPW_STAGES - 1 : st - 1;
		if (t_next < k_hi) fetch(t_next, sn);
		di_cp_async_commit();
		float sc[NT][4];
		scores(sc, st);
		di_wg_wait<0>();
		uint32_t pa[MPF_ABK / 16][4];
		float alpha[2];
		di_mpf_softmax(sc, alpha, m, l, t0, n, n == MPF_ABK && t0 + MPF_ABK <= w_full, last, scale_log2);
		di_mpf_pack_probs<T>(sc, pa);
		di_mpf_rescale(o, alpha);
		values(pa, st);
		di_wg_wait<0>();
	}
	di_cp_async_wait<0>();
	di_mpf_store(out, o, l, rw, r0, num_heads, h);
}

// ---------------------------------------------------------------- the absorbed rows

// di_mpf_rows_k: grid (absorbed rows), 128 threads. Row i of the compact
// batch (cu_dec) is row cu[s] + i - cu_dec[s] of the call, s the sequence
// holding it; gather copies that row of src into row i of dst, scatter row
// i of src into that row of dst. width: floats a row, a multiple of 4,
// rows 16-byte aligned.
__global__ void di_mpf_rows_k(float *dst, const float *src, const int *cu, const int *cu_dec, int num_seqs, int width,
                              int gather) {
	di_pdl_wait();
	const int i = blockIdx.x;
	if (i >= cu_dec[num_seqs]) return; // past the plan's rows (a grid sized by a hint)
	const int s = di_find_seq(cu_dec, num_seqs, i);
	const size_t orig = (size_t)cu[s] + (i - cu_dec[s]);
	const size_t from = gather ? orig : (size_t)i, to = gather ? (size_t)i : orig;
	const float4 *sp = reinterpret_cast<const float4 *>(src + from * width);
	float4 *dp = reinterpret_cast<float4 *>(dst + to * width);
	for (int e = threadIdx.x; e < width / 4; e += blockDim.x) dp[e] = sp[e];
}

// ---------------------------------------------------------------- host side

template <typename T> struct di_mpf_dtype;
template <> struct di_mpf_dtype<__half> { static constexpr int value = DI_F16; };
template <> struct di_mpf_dtype<__nv_bfloat16> { static constexpr int value = DI_BF16; };

// di_mpf_passes is the number of passes over the heads for rows expanded
// rows: as many heads a pass as fit MPF_SCRATCH_BYTES, at least one.
static int di_mpf_passes(int num_heads, size_t rows) {
	const size_t per_head = rows * MPF_KV * 2;
	size_t g = per_head > 0 ? MPF_SCRATCH_BYTES / per_head : (size_t)num_heads;
	g = g < 1 ? 1 : (g > (size_t)num_heads ? (size_t)num_heads : g);
	return (int)((num_heads + g - 1) / g);
}

// di_mpf_prefill runs steps 2 and 3 for a plan with nt query tiles and
// rows expanded rows (an upper bound when the plan's counts were not read):
// the heads in di_mpf_passes passes of G heads. T is the operands' 16-bit
// type: the cache's, or half for an 8-bit cache (F8).
template <typename T, bool F8>
static int di_mpf_prefill(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, di_dptr wkvb, int w_dtype,
                          const di_attn_meta *m, const int *base_r, const int *base_t, const int *counts, int num_heads,
                          int kvl, float scale, size_t rows, int nt) {
	const int H = num_heads, rowb = F8 ? di_mla_f8_row_bytes(kvl, MPF_ROPE) : (kvl + MPF_ROPE) * (int)sizeof(T);
	const int passes = di_mpf_passes(H, rows);
	const size_t G = (size_t)((H + passes - 1) / passes);
	const bool convert = w_dtype != di_mpf_dtype<T>::value || wkvb % 16 != 0;
	const size_t n_w = (size_t)H * MPF_KV * kvl;
	const size_t n_kv = G * rows * MPF_KV, n_pe = rows * MPF_ROPE;
	void *buf = nullptr;
	int rc = di_scratch(ctx, (n_kv + n_pe + (convert ? n_w : 0)) * sizeof(T) + 16, &buf);
	if (rc != DI_OK) return rc;
	T *kvp = static_cast<T *>(buf), *pep = kvp + n_kv, *wc = pep + n_pe;
	const T *wb = DI_PTR(const T, wkvb);
	if (convert) {
		DI_DISPATCH_WEIGHT(w_dtype, W, {
			di_launch(ctx, di_mpf_convert_k<W, T>, dim3(di_grid(n_w, 256)), dim3(256), 0, wc, DI_PTR(const W, wkvb), n_w);
		});
		if ((rc = di_check_launch(ctx, "mla_attention (prefill, weight)")) != DI_OK) {
			di_scratch_free(ctx, buf);
			return rc;
		}
		wb = wc;
	}
	// The attention on wgmma where the build has it (the same bits), over
	// the expansion's transposed layout.
	const bool wg = ctx->mla_pf_wg && di_wg_arch_ok();
	// The expansion too, for 16-bit caches (an 8-bit cache's rows are
	// widened on their way into shared memory, which cp.async cannot do).
	const bool wgx = wg && !F8;
	auto expand = wgx ? di_mpf_wgx_k<T> : wg ? di_mpf_expand_k<T, F8, true> : di_mpf_expand_k<T, F8, false>;
	auto attend = wg ? di_mpf_wg_k<T> : di_mpf_attn_k<T>;
	const size_t es = wgx ? MPX_SMEM : di_mpf_expand_smem(), as = wg ? MPW_SMEM : di_mpf_attn_smem();
	cudaError_t e = cudaFuncSetAttribute(expand, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)es);
	if (e == cudaSuccess) e = cudaFuncSetAttribute(attend, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)as);
	if (e != cudaSuccess) {
		di_scratch_free(ctx, buf);
		return di_cuda_fail(ctx, e, "mla_attention (prefill): cudaFuncSetAttribute");
	}
	const int *cu = DI_PTR(const int, m->cu_seqlens_q), *sk = DI_PTR(const int, m->seqlens_k),
	          *bt = DI_PTR(const int, m->block_tables);
	const int max_keys = m->max_blocks_per_seq * m->block_size;
	const float scale_log2 = scale * 1.4426950408889634f;
	for (int p = 0; p < passes && rc == DI_OK; p++) {
		const int h0 = p * (int)G, gn = H - h0 < (int)G ? H - h0 : (int)G;
		if (rows > 0) {
			const dim3 eg = wgx ? dim3(gn, (unsigned)((rows + MPX_BN - 1) / MPX_BN)) : dim3(2 * gn, (unsigned)(rows / MPF_EBM));
			di_launch(ctx, expand, eg, dim3(wgx ? MPX_THREADS : MPF_THREADS), es, kvp,
			          pep, DI_PTR(const unsigned char, cache), wb + (size_t)h0 * MPF_KV * kvl, base_r, counts, sk, bt,
			          m->num_seqs, m->max_blocks_per_seq, m->block_size, m->num_blocks, kvl, rowb, rows, p == 0 ? 1 : 0,
			          ctx->check);
			if ((rc = di_check_launch(ctx, "mla_attention (prefill, expansion)")) != DI_OK) break;
		}
		di_launch(ctx, attend, dim3(gn, nt), dim3(MPF_THREADS), as, DI_PTR(float, out), DI_PTR(const float, q),
		          (const T *)kvp, (const T *)pep, cu, sk, base_r, base_t, m->num_seqs, max_keys, H, h0, rows, scale_log2,
		          ctx->check);
		rc = di_check_launch(ctx, "mla_attention (prefill)");
	}
	di_scratch_free(ctx, buf);
	return rc;
}

extern "C" int di_op_mla_attention_pf(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, int cache_dtype,
                                      di_dptr wkvb, int w_dtype, const di_attn_meta *m, int num_heads, int nope_dim,
                                      int rope_dim, int kv_lora_rank, int v_head_dim, float scale,
                                      const di_mla_pf_hint *hint) {
	auto absorbed = [&](di_dptr o, di_dptr qq, const di_attn_meta *mm) {
		return di_op_mla_attention_tc(ctx, o, qq, cache, cache_dtype, wkvb, w_dtype, mm, num_heads, nope_dim, rope_dim,
		                              kv_lora_rank, v_head_dim, scale);
	};
	if (m->num_tokens == 0) return DI_OK;
	const int T = m->num_tokens, S = m->num_seqs, H = num_heads, kvl = kv_lora_rank;
	const bool sizes = (cache_dtype == DI_F16 || cache_dtype == DI_BF16 || cache_dtype == DI_F8E4M3) && nope_dim == MPF_NOPE &&
	                   rope_dim == MPF_ROPE && v_head_dim == MPF_VD && (kvl == 128 || kvl == 512) && H > 0 &&
	                   H <= 65535 && (w_dtype == DI_F32 || w_dtype == DI_BF16 || w_dtype == DI_F16) &&
	                   (q | out | cache) % 16 == 0;
	const bool rows = T >= MPF_MIN_Q && (m->max_seqlen_q == 0 || m->max_seqlen_q >= MPF_MIN_Q);
	if (!sizes || !rows || S <= 0) return absorbed(out, q, m);
	if (S > 1) { // the split needs the plan's counts on the host: not while capturing
		cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
		if (cudaStreamIsCapturing(ctx->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
			return absorbed(out, q, m);
	}
	const int max_keys = m->max_blocks_per_seq * m->block_size;
	// The sizes of the launches: one sequence of T >= MPF_MIN_Q rows is a
	// prefill sequence with nothing absorbed, and its expanded rows are
	// bounded by its block table's reach; several take the caller's hint.
	// The host reads the plan's counts instead where there is no hint, or
	// where the bound would cost passes over the heads that the call's own
	// query rows (T) might not, and never while capturing.
	size_t rows_x = ((size_t)max_keys + MPF_BK - 1) / MPF_BK * MPF_BK; // expanded rows: a bound, or the plan's total
	int nt = (T + MPF_BQ - 1) / MPF_BQ, nd = 0;
	bool read = S > 1, hinted = false;
	if (S > 1 && hint != nullptr && hint->rows >= 0 && hint->tiles >= 0 && hint->absorbed >= 0 &&
	    hint->rows % MPF_BK == 0 && (size_t)hint->rows / MPF_EBM <= 65535 && hint->tiles <= 65535) {
		rows_x = (size_t)hint->rows, nt = hint->tiles, nd = hint->absorbed;
		hinted = di_mpf_passes(H, rows_x) <= di_mpf_passes(H, ((size_t)T + MPF_BK - 1) / MPF_BK * MPF_BK);
		read = !hinted;
	} else if (!read && di_mpf_passes(H, rows_x) > di_mpf_passes(H, ((size_t)T + MPF_BK - 1) / MPF_BK * MPF_BK)) {
		cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
		read = cudaStreamIsCapturing(ctx->stream, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone;
	}
	void *pbuf = nullptr;
	int rc = di_scratch(ctx, ((size_t)3 * (S + 1) + 4) * sizeof(int), &pbuf);
	if (rc != DI_OK) return rc;
	int *base_r = static_cast<int *>(pbuf), *base_t = base_r + (S + 1), *cu_dec = base_t + (S + 1),
	    *counts = cu_dec + (S + 1);
	const int *cu = DI_PTR(const int, m->cu_seqlens_q), *sk = DI_PTR(const int, m->seqlens_k);
	di_launch(ctx, di_mpf_plan_k, dim3(1), dim3(MPF_PLAN_THREADS), 0, base_r, base_t, cu_dec, counts, cu, sk, S, T,
	          max_keys, hinted ? (int)rows_x : -1, nt, nd, ctx->check);
	if ((rc = di_check_launch(ctx, "mla_attention (prefill plan)")) != DI_OK) {
		di_scratch_free(ctx, pbuf);
		return rc;
	}
	if (hinted && nt == 0) { // no prefill sequence: every row absorbed, as stored (the plan checks the hint)
		di_scratch_free(ctx, pbuf);
		return absorbed(out, q, m);
	}
	if (read) {
		int hc[3] = {0, 0, 0};
		cudaError_t e = cudaMemcpyAsync(hc, counts, sizeof(hc), cudaMemcpyDeviceToHost, ctx->stream);
		if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
		if (e != cudaSuccess) {
			di_scratch_free(ctx, pbuf);
			return di_cuda_fail(ctx, e, "mla_attention (prefill plan): reading the counts");
		}
		rows_x = (size_t)hc[0], nt = hc[1], nd = hc[2];
		if (nt == 0) { // no prefill sequence after all: every row absorbed, as stored
			di_scratch_free(ctx, pbuf);
			return absorbed(out, q, m);
		}
	}
	if (nt > 65535 || rows_x / MPF_EBM > 65535) {
		di_scratch_free(ctx, pbuf);
		return di_fail(ctx, DI_ERR_UNSUPPORTED,
		               "mla_attention (prefill): %d query tiles and %zu expanded rows; at most 65535 tiles and %d rows",
		               nt, rows_x, 65535 * MPF_EBM);
	}
	if (cache_dtype == DI_BF16)
		rc = di_mpf_prefill<__nv_bfloat16, false>(ctx, out, q, cache, wkvb, w_dtype, m, base_r, base_t, counts, H, kvl,
		                                          scale, rows_x, nt);
	else if (cache_dtype == DI_F8E4M3)
		rc = di_mpf_prefill<__half, true>(ctx, out, q, cache, wkvb, w_dtype, m, base_r, base_t, counts, H, kvl, scale,
		                                  rows_x, nt);
	else
		rc = di_mpf_prefill<__half, false>(ctx, out, q, cache, wkvb, w_dtype, m, base_r, base_t, counts, H, kvl, scale,
		                                   rows_x, nt);
	if (rc == DI_OK && nd > 0) {
		// The absorbed rows as a compact batch: the prefill sequences with no rows.
		const int qw = H * MPF_DQK, ow = H * MPF_VD;
		void *dbuf = nullptr;
		rc = di_scratch(ctx, (size_t)nd * (qw + ow) * sizeof(float), &dbuf);
		if (rc == DI_OK) {
			float *qd = static_cast<float *>(dbuf), *od = qd + (size_t)nd * qw;
			di_launch(ctx, di_mpf_rows_k, dim3(nd), dim3(128), 0, qd, DI_PTR(const float, q), cu, (const int *)cu_dec, S,
			          qw, 1);
			rc = di_check_launch(ctx, "mla_attention (absorbed rows: gather)");
			if (rc == DI_OK) {
				di_attn_meta md = *m;
				md.num_tokens = nd;
				md.cu_seqlens_q = (di_dptr)(uintptr_t)cu_dec;
				rc = absorbed((di_dptr)(uintptr_t)od, (di_dptr)(uintptr_t)qd, &md);
			}
			if (rc == DI_OK) {
				di_launch(ctx, di_mpf_rows_k, dim3(nd), dim3(128), 0, DI_PTR(float, out), (const float *)od, cu,
				          (const int *)cu_dec, S, ow, 0);
				rc = di_check_launch(ctx, "mla_attention (absorbed rows: scatter)");
			}
			di_scratch_free(ctx, dbuf);
		}
	}
	di_scratch_free(ctx, pbuf);
	return rc;
}
