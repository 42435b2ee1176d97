// attention_mla_tc.cu: multi-head latent attention (MLA, DeepSeek) with
// weight absorption over a 16-bit (F16 or BF16) or 8-bit latent cache, on
// tensor cores; attention_mla.cu keeps the float32 path.
//
// A call runs four kernels over its rows (in passes of at most
// di_mla_pass_rows rows, so that the scratch stays bounded):
//  1. di_mla_absorb_tc_k: q_lat[t,h] = q_nope[t,h] W_UK[h] (16-bit
//     weights: tensor cores, q_nope split into two 16-bit parts; float32
//     weights: di_mla_absorb_k, float32 on CUDA cores; fixed order either
//     way), with q_pe appended, both times scale*log2(e), rounded to the
//     cache's 16-bit type;
//  2. di_mla_tc_k: the latent attention, split over keys: one block per
//     (query row, chunk of its keys, group of 16 heads, slice of the latent
//     output). Every head of the group shares each staged tile of keys
//     (copied a key row at a time by the bulk copy engine, several tiles in
//     flight): scores and outputs are mma.sync m16n8k16 products with the
//     heads as the tile rows, an online softmax per head, and the chunk's
//     normalized output stored as half with its (max, sum);
//  3. di_mla_combine_k: merges a row's chunks in ascending order;
//  4. di_mla_unabsorb_tc_k: out[t,h] = o_lat[t,h] W_UV[h]^T (as step 1:
//     tensor cores with o_lat split for 16-bit weights, di_mla_unabsorb_k
//     for float32 ones; fixed order).
// A row's chunks are a function of its own visible key count (di_mla_chunk)
// and each chunk's arithmetic depends on nothing else, so a row's bits are
// the same alone, in any batch, as a decode row or inside a (chunked)
// prefill; how many slices of the output a block takes (which follows the
// grid's size) changes no bit either: every slice's block computes the same
// scores.
//
// The 8-bit cache (cache.kv_cache_dtype fp8) packs a token's row as
// di_mla_f8_row_bytes says: kv_lora_rank E4M3 values, each group of
// MLA_F8_GROUP of them with its own float32 scale (amax / 448), the rope
// part as half, as FlashMLA's FP8 layout does. The tiles are widened to
// half (value * scale, rounded) in shared memory, so an 8-bit row gives the
// bits of a half row holding those values.
#include "attention_tc.cuh"

#define MLA_HG 16       // heads a block: the m16 rows of the tiles
#define MLA_MAX_SPLITS 32
#define MLA_SHORT_KEYS 512 // rows of at most this many keys take chunks of MLA_SHORT_CHUNK
#ifndef MLA_SHORT_CHUNK
#define MLA_SHORT_CHUNK 128
#endif
#define MLA_SCRATCH_BYTES (96u << 20) // scratch of one pass at most (di_mla_pass_rows)

// di_mla_chunk is the chunk length, in keys, of a row with `keys` visible
// keys and num_heads heads: 128 for short rows; else at least 32 keys a
// head (the chunk's partial output, num_heads * kv_lora_rank halves, stays
// about a tenth of the keys' bytes) and at most MLA_MAX_SPLITS chunks.
// A function of the row's key count and the model's head count alone.
__host__ __device__ __forceinline__ int di_mla_chunk(int keys, int num_heads) {
	if (keys <= MLA_SHORT_KEYS) return MLA_SHORT_CHUNK;
	const int mn = (32 * num_heads + 127) / 128 * 128;
	int c = (keys + MLA_MAX_SPLITS - 1) / MLA_MAX_SPLITS;
	c = (c + 127) / 128 * 128;
	return c > mn ? c : (mn > MLA_SHORT_CHUNK ? mn : MLA_SHORT_CHUNK);
}

// di_mla_nsplit bounds the chunks of any row of at most max_keys keys: at
// most 4 short chunks, and a long row's chunks are at least the minimum
// di_mla_chunk gives it.
static int di_mla_nsplit(int max_keys, int num_heads) {
	const int short_keys = max_keys < MLA_SHORT_KEYS ? max_keys : MLA_SHORT_KEYS;
	int n = (short_keys + MLA_SHORT_CHUNK - 1) / MLA_SHORT_CHUNK;
	if (max_keys > MLA_SHORT_KEYS) {
		const int mn = (32 * num_heads + 127) / 128 * 128, lo = mn > MLA_SHORT_CHUNK ? mn : MLA_SHORT_CHUNK;
		const int k = (max_keys + lo - 1) / lo;
		if (k > n) n = k;
	}
	if (n < 1) n = 1;
	return n > MLA_MAX_SPLITS ? MLA_MAX_SPLITS : n;
}

// di_mla_t16 is the 16-bit type of the tensor-core operands for a cache of
// element type CT: BF16 for a BF16 cache, half otherwise.
template <typename CT> struct di_mla_t16 { using type = __half; };
template <> struct di_mla_t16<__nv_bfloat16> { using type = __nv_bfloat16; };

template <typename T> __device__ __forceinline__ uint32_t di_pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t di_pack2<__half>(float lo, float hi) { return di_half2_bits(lo, hi); }
template <> __device__ __forceinline__ uint32_t di_pack2<__nv_bfloat16>(float lo, float hi) {
	__nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
	return *reinterpret_cast<uint32_t *>(&h);
}

// ---------------------------------------------------------------- cache writes

// di_mla_store_row writes one token's [c_kv k_pe] (x: kvl floats, xp: rope
// floats) into its cache row in the cache's layout (F32, F16, BF16: the
// values rounded to nearest; F8E4M3: the packed row, each group's scale
// amax / 448, or 1 for a group of zeros, the values x / scale rounded to
// nearest even and saturated), the block's threads sharing the work. The
// writer of mla_write_cache and mla_prepare, which must give the same
// bytes.
template <typename CT>
__device__ __forceinline__ void di_mla_store_row(unsigned char *row, const float *x, const float *xp, int kvl,
                                                 int rope) {
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
	if constexpr (di_is_fp8<CT>) {
		// A warp a group of MLA_F8_GROUP columns, four a lane.
		for (int g = warp; g < kvl / MLA_F8_GROUP; g += nwarps) {
			const int c0 = g * MLA_F8_GROUP;
			float v[4], amax = 0.f;
#pragma unroll
			for (int u = 0; u < 4; u++) {
				v[u] = x[c0 + lane + 32 * u];
				amax = fmaxf(amax, fabsf(v[u]));
			}
			amax = di_warp_max(amax);
			const float scale = amax > 0.f ? __fdiv_rn(amax, 448.f) : 1.f;
#pragma unroll
			for (int u = 0; u < 4; u++) row[c0 + lane + 32 * u] = di_from_f32<__nv_fp8_e4m3>(__fdiv_rn(v[u], scale)).__x;
			if (lane == 0) reinterpret_cast<float *>(row + kvl + 2 * rope)[g] = scale;
		}
		__half *rp = reinterpret_cast<__half *>(row + kvl);
		for (int r = tid; r < rope; r += blockDim.x) rp[r] = __float2half_rn(xp[r]);
	} else {
		CT *rp = reinterpret_cast<CT *>(row);
		for (int c = tid; c < kvl; c += blockDim.x) rp[c] = di_from_f32<CT>(x[c]);
		for (int r = tid; r < rope; r += blockDim.x) rp[kvl + r] = di_from_f32<CT>(xp[r]);
	}
}

// One block per token: row slot_mapping[t] of the cache gets c_kv[t] and
// k_pe[t] in the cache's layout (di_mla_store_row). A slot outside the
// cache sets DI_CHECK_WRITE_CACHE.
template <typename CT>
__global__ void di_mla_write_k(unsigned char *cache, const float *ckv, const float *kpe, const int *slot_mapping,
                               int num_tokens, int kvl, int rope, int row_bytes, int num_slots, unsigned *check) {
	di_pdl_wait();
	for (int t = blockIdx.x; t < num_tokens; t += gridDim.x) {
		const int slot = slot_mapping[t];
		if (slot < 0) continue;
		if (slot >= num_slots) {
			if (threadIdx.x == 0) atomicOr(check, DI_CHECK_WRITE_CACHE);
			continue;
		}
		di_mla_store_row<CT>(cache + (size_t)slot * row_bytes, ckv + (size_t)t * kvl, kpe + (size_t)t * rope, kvl,
		                     rope);
	}
}

// di_mla_f8_shape checks that op's 8-bit rows can be packed: kv_lora_rank
// in whole groups of MLA_F8_GROUP, the rope dim a multiple of 8.
static int di_mla_f8_shape(di_ctx *ctx, const char *op, int kvl, int rope) {
	if (kvl % MLA_F8_GROUP == 0 && rope % 8 == 0) return DI_OK;
	return di_fail(ctx, DI_ERR_UNSUPPORTED,
	               "%s: 8-bit rows need kv_lora_rank a multiple of %d (got %d) and the rope dim a multiple of 8 (got %d)",
	               op, MLA_F8_GROUP, kvl, rope);
}

extern "C" int di_op_mla_write_cache(di_ctx *ctx, di_dptr cache, int cache_dtype, di_dptr ckv, di_dptr kpe,
                                     di_dptr slot_mapping, int num_tokens, int kvl, int rope, int num_slots) {
	if (num_tokens == 0) return DI_OK;
	if (kvl <= 0 || rope <= 0)
		return di_fail(ctx, DI_ERR_INVALID, "mla_write_cache: kv_lora_rank %d, rope dim %d", kvl, rope);
	const unsigned grid = num_tokens < 65535 ? (unsigned)num_tokens : 65535u;
	unsigned char *c = DI_PTR(unsigned char, cache);
	const float *x = DI_PTR(const float, ckv), *xp = DI_PTR(const float, kpe);
	const int *sm = DI_PTR(const int, slot_mapping);
	switch (cache_dtype) {
	case DI_F32:
		di_launch(ctx, di_mla_write_k<float>, dim3(grid), dim3(128), 0, c, x, xp, sm, num_tokens, kvl, rope,
		          (kvl + rope) * 4, num_slots, ctx->check);
		break;
	case DI_F16:
		di_launch(ctx, di_mla_write_k<__half>, dim3(grid), dim3(128), 0, c, x, xp, sm, num_tokens, kvl, rope,
		          (kvl + rope) * 2, num_slots, ctx->check);
		break;
	case DI_BF16:
		di_launch(ctx, di_mla_write_k<__nv_bfloat16>, dim3(grid), dim3(128), 0, c, x, xp, sm, num_tokens, kvl, rope,
		          (kvl + rope) * 2, num_slots, ctx->check);
		break;
	case DI_F8E4M3:
		if (di_mla_f8_shape(ctx, "mla_write_cache", kvl, rope) != DI_OK) return DI_ERR_UNSUPPORTED;
		di_launch(ctx, di_mla_write_k<__nv_fp8_e4m3>, dim3(grid), dim3(128), 0, c, x, xp, sm, num_tokens, kvl, rope,
		          di_mla_f8_row_bytes(kvl, rope), num_slots, ctx->check);
		break;
	default:
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "mla_write_cache: cache dtype %d", cache_dtype);
	}
	return di_check_launch(ctx, "mla_write_cache");
}

// di_mla_prepare_k: blocks (t, 0 .. gridDim.y - 1) for token t, each of
// norm_threads(kvl) threads (the rms_norm kernel's block, so that the sum
// of squares is added in its order). From token t's q (num_heads x (nope
// + rope), row t of q_in, row stride q_stride) and kv_a row [c_kv (kvl),
// k_pe (rope)] (row t of kva, stride kva_stride): the fused projection's
// row [q c_kv k_pe] read through both, or q_in the output q itself
// (rotated in place: each rope value is read and written by one thread,
// the others neither read nor written), with kv_a from its own product. Block (t, 0)
// normalizes c_kv as di_rms_norm_k's held path does and rotates k_pe, both
// into shared memory, then writes row slot_mapping[t] of the cache as
// di_mla_write_k writes it (di_mla_store_row); q[t] gets the row's q with
// each head's rope dimensions rotated as di_rope_k rotates them, by block
// (t, 0) when gridDim.y is 1, else by blocks (t, 1 ..), each a share of
// the heads (for few tokens: the q copy then runs beside the norm rather
// than after it; a value's arithmetic is the same in any block). A
// position outside the tables sets DI_CHECK_ROPE and leaves the token's
// values unrotated (as di_rope_k does); a slot outside the cache sets
// DI_CHECK_WRITE_CACHE. The bits of split_columns, rms_norm, two ropes and
// mla_write_cache.
template <typename CT>
__global__ void di_mla_prepare_k(float *q, unsigned char *cache, const float *q_in, int q_stride, const float *kva,
                                 int kva_stride, const float *normw,
                                 const int *slot_mapping, const int *positions, const float *cosv, const float *sinv,
                                 int max_pos, int num_heads, int nope, int rope, int kvl, int interleaved, float eps,
                                 int row_bytes, int num_slots, unsigned *check) {
	extern __shared__ float prep_smem[]; // [kvl + rope]: c_kv normalized, k_pe rotated
	__shared__ double red[32];
	const int t = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
	const int hs = nope + rope, qd = num_heads * hs, half = rope / 2;
	const int qblocks = gridDim.y - 1;    // blocks for q beside the latent one (0: the latent block does q)
	const bool latent = blockIdx.y == 0; // c_kv, k_pe and the cache row
	float wv[RMS_HELD];
	if (latent) {
#pragma unroll
		for (int k = 0; k < RMS_HELD; k++) {
			const int j = tid + k * nt;
			wv[k] = j < kvl ? normw[j] : 0.f;
		}
	}
	di_pdl_wait();
	const float *row = q_in + (size_t)t * q_stride, *kvrow = kva + (size_t)t * kva_stride;
	const int pos = positions[t];
	const bool ok = pos >= 0 && pos < max_pos;
	const float *cs = cosv + (size_t)(ok ? pos : 0) * half, *sn = sinv + (size_t)(ok ? pos : 0) * half;
	if (!latent || qblocks == 0) {
		int h0 = 0, h1 = num_heads;
		if (qblocks > 0) h0 = (blockIdx.y - 1) * num_heads / qblocks, h1 = blockIdx.y * num_heads / qblocks;
		float *qo = q + (size_t)t * qd;
		// In place, the values not rotated are where they belong already.
		for (int i = h0 * hs + tid; row != qo && i < h1 * hs; i += nt) {
			const int d = i % hs;
			if (d < nope || !ok) qo[i] = row[i];
		}
		// Each thread its own rope pairs, read from the row and written once.
		for (int idx = tid; ok && idx < (h1 - h0) * half; idx += nt) {
			const int h = h0 + idx / half, j = idx % half;
			const int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
			const float *src = row + h * hs + nope;
			float p[2] = {src[a], src[b]};
			di_rotate(p, 0, 1, cs[j], sn[j]);
			qo[h * hs + nope + a] = p[0];
			qo[h * hs + nope + b] = p[1];
		}
		if (!latent) return;
	}
	float v[RMS_HELD];
#pragma unroll
	for (int k = 0; k < RMS_HELD; k++) {
		const int j = tid + k * nt;
		v[k] = j < kvl ? kvrow[j] : 0.f;
	}
	const float r = di_rms_held_scale(v, kvl, eps, red);
#pragma unroll
	for (int k = 0; k < RMS_HELD; k++) {
		const int j = tid + k * nt;
		if (j < kvl) prep_smem[j] = (v[k] * r) * wv[k];
	}
	if (!ok && tid == 0) atomicOr(check, DI_CHECK_ROPE);
	const float *kp = kvrow + kvl;
	for (int j = tid; ok && j < half; j += nt) {
		const int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
		float p[2] = {kp[a], kp[b]};
		di_rotate(p, 0, 1, cs[j], sn[j]);
		prep_smem[kvl + a] = p[0];
		prep_smem[kvl + b] = p[1];
	}
	if (!ok)
		for (int i = tid; i < rope; i += nt) prep_smem[kvl + i] = kp[i];
	__syncthreads();
	const int slot = slot_mapping[t];
	if (slot < 0) return;
	if (slot >= num_slots) {
		if (tid == 0) atomicOr(check, DI_CHECK_WRITE_CACHE);
		return;
	}
	di_mla_store_row<CT>(cache + (size_t)slot * row_bytes, prep_smem, prep_smem + kvl, kvl, rope);
}

// MLA_PREP_Q_TOKENS: calls of at most this many tokens give q blocks of
// their own (MLA_PREP_Q_BLOCKS a token, each a share of the heads); more
// tokens fill the device with one block a token.
#define MLA_PREP_Q_TOKENS 64
#ifndef MLA_PREP_Q_BLOCKS
#define MLA_PREP_Q_BLOCKS 4 // 0: q in the latent block at every size
#endif

extern "C" int di_op_mla_prepare(di_ctx *ctx, di_dptr q, di_dptr cache, int cache_dtype, di_dptr q_in, int q_stride,
                                 di_dptr kva, int kva_stride, di_dptr normw, di_dptr slot_mapping, di_dptr positions,
                                 di_dptr cosv, di_dptr sinv, int num_tokens, int max_pos, int num_heads, int nope,
                                 int rope, int kvl, int interleaved, float eps, int num_slots) {
	if (num_tokens == 0) return DI_OK;
	if (kvl <= 0 || rope <= 0 || rope % 2 != 0 || num_heads <= 0 || nope < 0 || kvl > RMS_HELD * 1024)
		return di_fail(ctx, DI_ERR_INVALID, "mla_prepare: heads %d, nope %d, rope %d (even), kv_lora_rank %d (at most %d)",
		               num_heads, nope, rope, kvl, RMS_HELD * 1024);
	if (q_stride < num_heads * (nope + rope) || kva_stride < kvl + rope)
		return di_fail(ctx, DI_ERR_INVALID, "mla_prepare: row strides q %d, kv_a %d for q rows of %d and kv_a rows of %d",
		               q_stride, kva_stride, num_heads * (nope + rope), kvl + rope);
	const int threads = norm_threads(kvl);
	const size_t smem = (size_t)(kvl + rope) * sizeof(float);
	const int qblocks =
	    num_tokens <= MLA_PREP_Q_TOKENS ? (num_heads < MLA_PREP_Q_BLOCKS ? num_heads : MLA_PREP_Q_BLOCKS) : 0;
	const dim3 grid((unsigned)num_tokens, (unsigned)(1 + qblocks));
	unsigned char *c = DI_PTR(unsigned char, cache);
	const float *xq = DI_PTR(const float, q_in), *xkv = DI_PTR(const float, kva), *w = DI_PTR(const float, normw);
	const float *cs = DI_PTR(const float, cosv), *sn = DI_PTR(const float, sinv);
	const int *sm = DI_PTR(const int, slot_mapping), *ps = DI_PTR(const int, positions);
	float *qo = DI_PTR(float, q);
#define DI_MLA_PREP(CT, ROW)                                                                                       \
	di_launch(ctx, di_mla_prepare_k<CT>, grid, dim3(threads), smem, qo, c, xq, q_stride, xkv, kva_stride, w, sm, ps, cs, sn, max_pos, \
	          num_heads, nope, rope, kvl, interleaved, eps, (ROW), num_slots, ctx->check)
	switch (cache_dtype) {
	case DI_F32:
		DI_MLA_PREP(float, (kvl + rope) * 4);
		break;
	case DI_F16:
		DI_MLA_PREP(__half, (kvl + rope) * 2);
		break;
	case DI_BF16:
		DI_MLA_PREP(__nv_bfloat16, (kvl + rope) * 2);
		break;
	case DI_F8E4M3:
		if (di_mla_f8_shape(ctx, "mla_prepare", kvl, rope) != DI_OK) return DI_ERR_UNSUPPORTED;
		DI_MLA_PREP(__nv_fp8_e4m3, di_mla_f8_row_bytes(kvl, rope));
		break;
	default:
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "mla_prepare: cache dtype %d", cache_dtype);
	}
#undef DI_MLA_PREP
	return di_check_launch(ctx, "mla_prepare");
}

// ---------------------------------------------------------------- absorption

// di_mla_stage_w copies rows x cols elements of a weight (row stride lds
// elements) into float shared memory dst (row stride ldd) as di_to_f32
// gives them. With 16-byte aligned rows of whole 16-byte chunks it issues
// each thread's 16-byte loads eight at a time before converting any: at
// batch 1 the kernels below are bound by how many weight loads are in
// flight, and one scalar load after another left them at tens of GB/s.
// Otherwise element by element. The values are the same either way.
template <typename W>
__device__ __forceinline__ void di_mla_stage_w(float *dst, int ldd, const W *src, size_t lds, int rows, int cols) {
	constexpr int V = 16 / sizeof(W), B = 8;
	const int tid = threadIdx.x, nt = blockDim.x;
	const bool vec = cols % V == 0 && lds % V == 0 && reinterpret_cast<size_t>(src) % 16 == 0;
	if (!vec) {
		for (int i = tid; i < rows * cols; i += nt) {
			const int r = i / cols, c = i - r * cols;
			dst[r * ldd + c] = di_to_f32(src[(size_t)r * lds + c]);
		}
		return;
	}
	const int per_row = cols / V, total = rows * per_row;
	for (int base = tid; base < total; base += B * nt) {
		uint4 v[B];
#pragma unroll
		for (int u = 0; u < B; u++) {
			const int k = base + u * nt;
			if (k < total) {
				const int r = k / per_row, e = (k - r * per_row) * V;
				v[u] = *reinterpret_cast<const uint4 *>(src + (size_t)r * lds + e);
			}
		}
#pragma unroll
		for (int u = 0; u < B; u++) {
			const int k = base + u * nt;
			if (k < total) {
				const int r = k / per_row, e = (k - r * per_row) * V;
				const W *pv = reinterpret_cast<const W *>(&v[u]);
#pragma unroll
				for (int j = 0; j < V; j++) dst[r * ldd + e + j] = di_to_f32(pv[j]);
			}
		}
	}
}

#define MLA_AB_COLS 64 // latent columns a block
#define MLA_AB_ROWS 16 // query rows a pass of a block
#define MLA_RB 64      // query rows a block for many rows (di_mla_rb)
#define MLA_RB_FEW 16  // ... and for at most MLA_RB_FEW_MAX rows
#define MLA_RB_FEW_MAX 256

// di_mla_rb is the query rows a block of the absorption kernels takes:
// MLA_RB_FEW for decode-sized calls, so that 64 rows are four times the
// blocks (one tile of rows each) rather than four tiles of rows chained in
// one block, and MLA_RB from more rows, where the weight slab a block
// stages is amortized over more rows. A row's sums are the same in any
// block, so the choice changes no bit.
static inline int di_mla_rb(int rows) { return rows <= MLA_RB_FEW_MAX ? MLA_RB_FEW : MLA_RB; }

// di_mla_absorb_k: grid (kvl / MLA_AB_COLS, heads, ceil(rows / rb)),
// 128 threads. ql[t, h, c] = T16(qscale * sum_d q[t, h, d] W_UK[h][d][c])
// for c < kvl, where thread (c, half) sums its half of d in order and the
// two halves are added (a fixed order); ql[t, h, kvl + r] =
// T16(qscale * q_pe[t, h, r]). The block's slab of W_UK[h] is read once
// into shared memory for its rows. Shared: nope x 64 + 16 x nope + 2 x 16 x
// 64 floats.
template <typename W, typename T16>
__global__ void __launch_bounds__(128)
    di_mla_absorb_k(T16 *ql, const float *q, const W *wkvb, int rows, int num_heads, int nope, int rope, int kvl,
                    int vd, float qscale, int rb) {
	extern __shared__ __align__(16) float ab_smem[];
	float *sW = ab_smem;                         // [nope][64]
	float *sQ = sW + nope * MLA_AB_COLS;         // [16][nope]
	float *sA = sQ + MLA_AB_ROWS * nope;         // [2][16][64]
	const int tid = threadIdx.x, c = tid & (MLA_AB_COLS - 1), dh = tid >> 6;
	const int c0 = blockIdx.x * MLA_AB_COLS, h = blockIdx.y;
	const int width = kvl + rope, qw = num_heads * (nope + rope);
	const W *w = wkvb + (size_t)h * (nope + vd) * kvl + c0;
	di_mla_stage_w(sW, MLA_AB_COLS, w, kvl, nope, MLA_AB_COLS);
	di_pdl_wait();
	const int d_lo = dh * (nope / 2), d_hi = dh ? nope : nope / 2;
	const int r_end = min(rows, (int)(blockIdx.z + 1) * rb);
	for (int r0 = blockIdx.z * rb; r0 < r_end; r0 += MLA_AB_ROWS) {
		const int nr = min(MLA_AB_ROWS, r_end - r0);
		__syncthreads(); // sW is loaded; the previous rows' sQ and sA are consumed
		for (int i = tid; i < MLA_AB_ROWS * nope; i += blockDim.x) {
			const int r = i / nope, d = i - r * nope;
			sQ[i] = r < nr ? q[(size_t)(r0 + r) * qw + (size_t)h * (nope + rope) + d] : 0.f;
		}
		__syncthreads();
		float acc[MLA_AB_ROWS];
#pragma unroll
		for (int r = 0; r < MLA_AB_ROWS; r++) acc[r] = 0.f;
		for (int d = d_lo; d < d_hi; d++) {
			const float wv = sW[d * MLA_AB_COLS + c];
#pragma unroll
			for (int r = 0; r < MLA_AB_ROWS; r++) acc[r] = __fmaf_rn(sQ[r * nope + d], wv, acc[r]);
		}
#pragma unroll
		for (int r = 0; r < MLA_AB_ROWS; r++) sA[(dh * MLA_AB_ROWS + r) * MLA_AB_COLS + c] = acc[r];
		__syncthreads();
		for (int i = tid; i < nr * MLA_AB_COLS; i += blockDim.x) {
			const int r = i / MLA_AB_COLS, cc = i - r * MLA_AB_COLS;
			const float v = __fadd_rn(sA[r * MLA_AB_COLS + cc], sA[(MLA_AB_ROWS + r) * MLA_AB_COLS + cc]);
			ql[((size_t)(r0 + r) * num_heads + h) * width + c0 + cc] = di_from_f32<T16>(__fmul_rn(v, qscale));
		}
		if (blockIdx.x == 0) {
			for (int i = tid; i < nr * rope; i += blockDim.x) {
				const int r = i / rope, e = i - r * rope;
				const float v = q[(size_t)(r0 + r) * qw + (size_t)h * (nope + rope) + nope + e];
				ql[((size_t)(r0 + r) * num_heads + h) * width + kvl + e] = di_from_f32<T16>(__fmul_rn(v, qscale));
			}
		}
	}
}

#define MLA_UA_V 16 // output columns a block

// di_mla_unabsorb_k: grid (ceil(vd / 16), heads, ceil(rows / rb)), 128
// threads. out[t, h*vd + v] = sum_c olat[t, h, c] W_UV[h][v][c]: thread
// (v, p) sums columns c = p + 8k in order, then the eight partial sums of
// a v are added in a fixed butterfly. Shared: 16 x (kvl + 8) + 16 x kvl
// floats.
template <typename W>
__global__ void __launch_bounds__(128)
    di_mla_unabsorb_k(float *out, const float *olat, const W *wkvb, int rows, int num_heads, int nope, int kvl,
                      int vd, int rb) {
	extern __shared__ __align__(16) float ua_smem[];
	const int ldw = kvl + 8;
	float *sW = ua_smem;                  // [16][kvl + 8]
	float *sO = sW + MLA_UA_V * ldw;      // [16][kvl]
	const int tid = threadIdx.x, v = tid >> 3, p = tid & 7;
	const int v0 = blockIdx.x * MLA_UA_V, h = blockIdx.y;
	const W *w = wkvb + ((size_t)h * (nope + vd) + nope) * kvl;
	const int nv = min(MLA_UA_V, vd - v0); // weight rows past vd stage as zeros
	di_mla_stage_w(sW, ldw, w + (size_t)v0 * kvl, kvl, nv, kvl);
	for (int i = nv * kvl + tid; i < MLA_UA_V * kvl; i += blockDim.x) {
		const int vv = i / kvl, cc = i - vv * kvl;
		sW[vv * ldw + cc] = 0.f;
	}
	di_pdl_wait();
	const int r_end = min(rows, (int)(blockIdx.z + 1) * rb);
	for (int r0 = blockIdx.z * rb; r0 < r_end; r0 += MLA_AB_ROWS) {
		const int nr = min(MLA_AB_ROWS, r_end - r0);
		__syncthreads();
		for (int i = tid; i < MLA_AB_ROWS * kvl; i += blockDim.x) {
			const int r = i / kvl, cc = i - r * kvl;
			sO[i] = r < nr ? olat[((size_t)(r0 + r) * num_heads + h) * kvl + cc] : 0.f;
		}
		__syncthreads();
		float acc[MLA_AB_ROWS];
#pragma unroll
		for (int r = 0; r < MLA_AB_ROWS; r++) acc[r] = 0.f;
		for (int cc = p; cc < kvl; cc += 8) {
			const float wv = sW[v * ldw + cc];
#pragma unroll
			for (int r = 0; r < MLA_AB_ROWS; r++) acc[r] = __fmaf_rn(sO[r * kvl + cc], wv, acc[r]);
		}
#pragma unroll
		for (int r = 0; r < MLA_AB_ROWS; r++) {
#pragma unroll
			for (int o = 1; o < 8; o <<= 1) acc[r] = __fadd_rn(acc[r], __shfl_xor_sync(0xffffffffu, acc[r], o));
		}
		if (v0 + v < vd) {
#pragma unroll
			for (int r = 0; r < MLA_AB_ROWS; r++)
				if ((r & 7) == p && r < nr) out[(size_t)(r0 + r) * num_heads * vd + (size_t)h * vd + v0 + v] = acc[r];
		}
	}
}

// ---------------------------------------------------------------- absorption on tensor cores

// The absorption products for 16-bit weights (BF16 or F16) on tensor
// cores: mma.sync m16n8k16 in the weight's own type W, 16 query rows as the
// A operand and the weights as B. Each float32 input x is split into two W
// parts, hi = W(x) and lo = W(x - hi) (x - hi is exact), both multiplied
// by the weight in their own float32 accumulators, added at the end: x is
// kept to about 16 significant bits with BF16 parts (F16 parts: 22 bits,
// or an absolute error of at most 2^-25 where the low part is subnormal;
// they take |x| < 65504, as F16 weights' activations are), the products
// are exact and the sums float32. Each output element is
// its own dot product in a fixed order (ascending k-steps; in
// di_mla_unabsorb_tc_k the warps' quarters of k added in warp order), the
// rows of a tile do not mix, and rows past the call are zeros that are
// never stored: a row's bits do not depend on the call's other rows nor
// on its place in its tile.

// di_mla_tc_absorb reports whether the tensor-core absorption kernels take
// weights of dtype w_dtype at wkvb for these sizes (16-bit weights, 16-byte
// aligned; nope and vd multiples of 16, kvl a multiple of 64); otherwise
// the float32 kernels above run.
static bool di_mla_tc_absorb(int w_dtype, di_dptr wkvb, int nope, int kvl, int vd) {
	return (w_dtype == DI_BF16 || w_dtype == DI_F16) && wkvb % 16 == 0 && nope % 16 == 0 && vd % 16 == 0 &&
	       kvl % 64 == 0;
}

// di_mla_split2 splits x0, x1 into W parts: hi holds W(x0), W(x1), lo
// W(x0 - hi0), W(x1 - hi1) (x0's part in the low half).
template <typename W> __device__ __forceinline__ void di_mla_split2(float x0, float x1, uint32_t &hi, uint32_t &lo) {
	const W h0 = di_from_f32<W>(x0), h1 = di_from_f32<W>(x1);
	const W l0 = di_from_f32<W>(__fsub_rn(x0, di_to_f32(h0))), l1 = di_from_f32<W>(__fsub_rn(x1, di_to_f32(h1)));
	hi = di_bits16(h0) | (di_bits16(h1) << 16);
	lo = di_bits16(l0) | (di_bits16(l1) << 16);
}

// di_mla_stage_split stages rows x cols floats (row r at src + r * lds)
// into shared memory as their W parts, hi and lo (row r at + r * ldd; ldd
// a multiple of 4, hi and lo 8-byte aligned), zeros for rows at or past
// valid. float4 loads, eight a thread issued before any is converted,
// where the rows allow (cols and lds multiples of 4, src 16-byte aligned),
// else element by element; the values are the same either way.
template <typename W>
__device__ __forceinline__ void di_mla_stage_split(W *hi, W *lo, int ldd, const float *src, size_t lds, int valid,
                                                   int rows, int cols) {
	const int tid = threadIdx.x, nt = blockDim.x;
	if (cols % 4 == 0 && lds % 4 == 0 && reinterpret_cast<size_t>(src) % 16 == 0) {
		constexpr int B = 8; // loads a thread has in flight
		const int per_row = cols / 4, total = rows * per_row;
		for (int base = tid; base < total; base += B * nt) {
			float4 v[B];
#pragma unroll
			for (int u = 0; u < B; u++) {
				const int k = base + u * nt, r = k / per_row, e = (k - r * per_row) * 4;
				v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
				if (k < total && r < valid) v[u] = *reinterpret_cast<const float4 *>(src + (size_t)r * lds + e);
			}
#pragma unroll
			for (int u = 0; u < B; u++) {
				const int k = base + u * nt, r = k / per_row, e = (k - r * per_row) * 4;
				if (k < total) {
					uint2 h, l;
					di_mla_split2<W>(v[u].x, v[u].y, h.x, l.x);
					di_mla_split2<W>(v[u].z, v[u].w, h.y, l.y);
					*reinterpret_cast<uint2 *>(hi + r * ldd + e) = h;
					*reinterpret_cast<uint2 *>(lo + r * ldd + e) = l;
				}
			}
		}
		return;
	}
	for (int k = tid; k < rows * cols; k += nt) {
		const int r = k / cols, e = k - r * cols;
		const float x = r < valid ? src[(size_t)r * lds + e] : 0.f;
		const W h = di_from_f32<W>(x);
		hi[r * ldd + e] = h;
		lo[r * ldd + e] = di_from_f32<W>(__fsub_rn(x, di_to_f32(h)));
	}
}

#define MLA_TC_AB_COLS 64 // latent columns a block of di_mla_absorb_tc_k: 16 a warp

// di_mla_absorb_tc_k: di_mla_absorb_k for 16-bit weights W on tensor
// cores. Grid (kvl / 64, heads, ceil(rows / rb)), 128 threads. Block
// (x, h, z) stages W_UK[h]'s columns [64 x, +64) (nope x 64 W, cp.async,
// issued before di_pdl_wait) and its query rows [rb z, +rb) split
// into W parts; warp w computes latent columns +16 w .. +16 for the rows in
// tiles of 16: ql[t, h, c] = T16(qscale * (sum_d hi[t, d] W_UK[h][d][c] +
// sum_d lo[t, d] W_UK[h][d][c])), each sum over the nope / 16 k-steps in
// ascending order; block x == 0 also writes T16(qscale * q_pe). Shared:
// nope x 72 + 2 x rb x (nope + 8) W elements (53 KB for nope 128 and rb
// 64, 27 KB for rb 16).
template <typename W, typename T16>
__global__ void __launch_bounds__(128)
    di_mla_absorb_tc_k(T16 *ql, const float *q, const W *wkvb, int rows, int num_heads, int nope, int rope, int kvl,
                       int vd, float qscale, int rb_rows) {
	extern __shared__ __align__(16) unsigned char abt_smem[];
	const int ldw = MLA_TC_AB_COLS + 8, ldq = nope + 8;
	W *sW = reinterpret_cast<W *>(abt_smem); // [nope][ldw]
	W *sQh = sW + nope * ldw;                // [rb_rows][ldq]
	W *sQl = sQh + rb_rows * ldq;            // [rb_rows][ldq]
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
	const int lm_row = lane & 7, lm_mat = lane >> 3;
	const int c0 = blockIdx.x * MLA_TC_AB_COLS, h = blockIdx.y;
	const int width = kvl + rope, qw = num_heads * (nope + rope);
	{
		constexpr int CH = MLA_TC_AB_COLS / 8; // 16-byte chunks a weight row
		const W *w = wkvb + (size_t)h * (nope + vd) * kvl + c0;
		for (int k = tid; k < nope * CH; k += blockDim.x) {
			const int r = k / CH, e = (k - r * CH) * 8;
			di_cp_async16(sW + r * ldw + e, w + (size_t)r * kvl + e, true);
		}
		di_cp_async_commit();
	}
	di_pdl_wait();
	const int rb = blockIdx.z * rb_rows, nr = min(rb_rows, rows - rb), ntl = (nr + 15) / 16;
	const float *qb = q + (size_t)rb * qw + (size_t)h * (nope + rope);
	di_mla_stage_split(sQh, sQl, ldq, qb, (size_t)qw, nr, ntl * 16, nope);
	di_cp_async_wait<0>();
	__syncthreads();
	for (int tl = 0; tl < ntl; tl++) {
		float hi[2][4], lo[2][4];
#pragma unroll
		for (int n = 0; n < 2; n++)
#pragma unroll
			for (int e = 0; e < 4; e++) hi[n][e] = lo[n][e] = 0.f;
		for (int ks = 0; ks < nope / 16; ks++) {
			uint32_t b[4], ah[4], al[4];
			di_ldmatrix_x4_trans(b, sW + (ks * 16 + (lm_mat & 1) * 8 + lm_row) * ldw + warp * 16 + (lm_mat >> 1) * 8);
			const int ao = (tl * 16 + lm_row + (lm_mat & 1) * 8) * ldq + ks * 16 + (lm_mat >> 1) * 8;
			di_ldmatrix_x4(ah, sQh + ao);
			di_ldmatrix_x4(al, sQl + ao);
			di_mma16816<W>(hi[0], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
			di_mma16816<W>(hi[1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
			di_mma16816<W>(lo[0], al[0], al[1], al[2], al[3], b[0], b[1]);
			di_mma16816<W>(lo[1], al[0], al[1], al[2], al[3], b[2], b[3]);
		}
#pragma unroll
		for (int half = 0; half < 2; half++) {
			const int r = tl * 16 + g + 8 * half;
			if (r >= nr) continue;
			T16 *dst = ql + ((size_t)(rb + r) * num_heads + h) * width + c0 + warp * 16 + 2 * t4;
#pragma unroll
			for (int n = 0; n < 2; n++) {
				const float v0 = __fadd_rn(hi[n][2 * half], lo[n][2 * half]);
				const float v1 = __fadd_rn(hi[n][2 * half + 1], lo[n][2 * half + 1]);
				*reinterpret_cast<uint32_t *>(dst + n * 8) = di_pack2<T16>(__fmul_rn(v0, qscale), __fmul_rn(v1, qscale));
			}
		}
	}
	if (blockIdx.x == 0) {
		for (int i = tid; i < nr * rope; i += blockDim.x) {
			const int r = i / rope, e = i - r * rope;
			const float v = qb[(size_t)r * qw + nope + e];
			ql[((size_t)(rb + r) * num_heads + h) * width + kvl + e] = di_from_f32<T16>(__fmul_rn(v, qscale));
		}
	}
}

// di_mla_unabsorb_tc_k: di_mla_unabsorb_k for 16-bit weights W on tensor
// cores. Grid (vd / 16, heads, ceil(rows / rb)), 128 threads. Block
// (x, h, z) stages W_UV[h]'s rows [16 x, +16) (16 x kvl W, cp.async,
// issued before di_pdl_wait), then takes its rows [rb z, +rb) in
// tiles of 16, each staged split into W parts: warp w sums its quarter of
// the latent columns (k-steps [w kvl / 64, +kvl / 64) in ascending order,
// hi and lo products in their own accumulators, then hi + lo), and
// out[t, h*vd + v] = ((s0 + s1) + s2) + s3 over the warps' sums. Shared:
// 3 x 16 x (kvl + 8) W elements and 4 x 16 x 16 floats (53 KB for kvl 512).
template <typename W>
__global__ void __launch_bounds__(128)
    di_mla_unabsorb_tc_k(float *out, const float *olat, const W *wkvb, int rows, int num_heads, int nope, int kvl,
                         int vd, int rb) {
	extern __shared__ __align__(16) unsigned char uat_smem[];
	const int ld = kvl + 8;
	W *sW = reinterpret_cast<W *>(uat_smem);                       // [16][ld]
	W *sOh = sW + MLA_UA_V * ld;                                   // [16][ld]
	W *sOl = sOh + MLA_AB_ROWS * ld;                               // [16][ld]
	float *sP = reinterpret_cast<float *>(sOl + MLA_AB_ROWS * ld); // [4 warps][16 rows][16 v]
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
	const int lm_row = lane & 7, lm_mat = lane >> 3;
	const int v0 = blockIdx.x * MLA_UA_V, h = blockIdx.y;
	{
		const int ch = kvl / 8; // 16-byte chunks a weight row
		const W *w = wkvb + ((size_t)h * (nope + vd) + nope + v0) * kvl;
		for (int k = tid; k < MLA_UA_V * ch; k += blockDim.x) {
			const int r = k / ch, e = (k - r * ch) * 8;
			di_cp_async16(sW + r * ld + e, w + (size_t)r * kvl + e, true);
		}
		di_cp_async_commit();
	}
	di_pdl_wait();
	const int nks = kvl / 64, ks0 = warp * nks; // this warp's k-steps
	const size_t lds = (size_t)num_heads * kvl;
	const int r_end = min(rows, (int)(blockIdx.z + 1) * rb);
	for (int r0 = blockIdx.z * rb; r0 < r_end; r0 += MLA_AB_ROWS) {
		const int nr = min(MLA_AB_ROWS, r_end - r0);
		__syncthreads(); // the previous tile's parts and sums are consumed
		di_mla_stage_split(sOh, sOl, ld, olat + ((size_t)r0 * num_heads + h) * kvl, lds, nr, MLA_AB_ROWS, kvl);
		di_cp_async_wait<0>();
		__syncthreads();
		float hi[2][4], lo[2][4];
#pragma unroll
		for (int n = 0; n < 2; n++)
#pragma unroll
			for (int e = 0; e < 4; e++) hi[n][e] = lo[n][e] = 0.f;
		for (int ks = ks0; ks < ks0 + nks; ks++) {
			uint32_t b[4], ah[4], al[4];
			di_ldmatrix_x4(b, sW + ((lm_mat >> 1) * 8 + lm_row) * ld + ks * 16 + (lm_mat & 1) * 8);
			const int ao = (lm_row + (lm_mat & 1) * 8) * ld + ks * 16 + (lm_mat >> 1) * 8;
			di_ldmatrix_x4(ah, sOh + ao);
			di_ldmatrix_x4(al, sOl + ao);
			di_mma16816<W>(hi[0], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
			di_mma16816<W>(hi[1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
			di_mma16816<W>(lo[0], al[0], al[1], al[2], al[3], b[0], b[1]);
			di_mma16816<W>(lo[1], al[0], al[1], al[2], al[3], b[2], b[3]);
		}
		float *pw = sP + warp * MLA_AB_ROWS * MLA_UA_V;
#pragma unroll
		for (int half = 0; half < 2; half++)
#pragma unroll
			for (int n = 0; n < 2; n++)
				*reinterpret_cast<float2 *>(pw + (g + 8 * half) * MLA_UA_V + n * 8 + 2 * t4) =
				    make_float2(__fadd_rn(hi[n][2 * half], lo[n][2 * half]),
				                __fadd_rn(hi[n][2 * half + 1], lo[n][2 * half + 1]));
		__syncthreads();
		constexpr int P = MLA_AB_ROWS * MLA_UA_V;
		for (int i = tid; i < nr * MLA_UA_V; i += blockDim.x) {
			const int r = i / MLA_UA_V, vv = i - r * MLA_UA_V;
			const float s = __fadd_rn(__fadd_rn(__fadd_rn(sP[i], sP[P + i]), sP[2 * P + i]), sP[3 * P + i]);
			out[(size_t)(r0 + r) * num_heads * vd + (size_t)h * vd + v0 + vv] = s;
		}
	}
}

// ---------------------------------------------------------------- latent attention

// The shape of di_mla_tc_k (compile-time; tools/gpu/mla_sweep times the
// alternatives against each other and a device copy): MLA_TC_BK keys a
// tile, MLA_TC_WARPS warps a block, MLA_TC_STAGES (16-bit caches) or
// MLA_TC_STAGES_F8 (8-bit) copy stages, and the copies on the bulk copy
// engine (MLA_TC_BULK 1: one cp.async.bulk a key row, completing on an
// mbarrier) or as 16-byte cp.async (0, the default: as fast at batch 64 and
// 4096 keys, faster for short batches and rows, where the issuing warp's
// bulk copies sit on the tile's chain; kernels/cuda/NOTES.md). The tile and
// the warps fix the arithmetic's order (the same for both cache types, so
// that an 8-bit row gives the bits of a half row holding its values); the
// stages and the copy engine change no bit.
#ifndef MLA_TC_BK
#define MLA_TC_BK 32
#endif
#ifndef MLA_TC_WARPS
#define MLA_TC_WARPS 8
#endif
#ifndef MLA_TC_STAGES
#define MLA_TC_STAGES 2
#endif
#ifndef MLA_TC_STAGES_F8
#define MLA_TC_STAGES_F8 2
#endif
#ifndef MLA_TC_BULK
#define MLA_TC_BULK 0
#endif

// di_bulk_g2s queues a copy of bytes (a multiple of 16; both addresses
// 16-byte aligned) from global to shared memory on the bulk copy engine,
// completing bytes on bar.
__device__ __forceinline__ void di_bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
	                 di_smem_u32(dst)),
	             "l"(src), "r"(bytes), "r"(di_smem_u32(bar))
	             : "memory");
}
// di_fence_proxy_async orders this thread's earlier shared-memory writes
// before later bulk copies into the same bytes.
__device__ __forceinline__ void di_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// di_mla_cp16 is di_cp_async16 to a shared-memory address already converted.
__device__ __forceinline__ void di_mla_cp16(unsigned dst, const void *src, bool ok) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}

// di_mla_seq_window is di_seq_window without a window (row i's sequence
// and its visible keys [0, last)), trying first the sequence of index i
// (a decode batch's layout), which one check of cu confirms, before the
// binary search: the same sequence either way (the only non-empty one
// holding row i), two independent loads instead of a chain of them.
__device__ __forceinline__ bool di_mla_seq_window(const int *cu, const int *seqlens_k, int num_seqs, int max_keys,
                                                  int i, int *seq, int *last) {
	int s = max(0, min(i, num_seqs - 1));
	if (!(cu[s] <= i && i < cu[s + 1])) s = di_find_seq(cu, num_seqs, i);
	const int q0 = cu[s], ql = cu[s + 1] - q0, kl = seqlens_k[s];
	const int j = i - q0;
	if (j < 0 || j >= ql || kl < ql || kl > max_keys) return false;
	*seq = s;
	*last = kl - ql + j + 1;
	return true;
}

// di_mla_layout is di_mla_tc_k's shared memory (byte offsets): ns copy
// stages of bk key rows (16-bit: rows of ldk halves, as the tensor cores
// read them; 8-bit: the raw rows of rb bytes, then one widened tile of bk x
// ldk halves), the warps' partial scores [4][16][bk + 8] floats, the
// probabilities [16][bk + 4], the rescale factors and inverse sums [16]
// each, a mask of the valid keys and an mbarrier a stage. The query tile
// (16 x ldk halves) is staged, before the keys need it, in the last stage
// (16-bit) or the widened tile (8-bit).
struct di_mla_layout {
	int ldk, rb;
	size_t stage, wide, s, p, alpha, inv, mask, bar, total;
};
__host__ __device__ __forceinline__ di_mla_layout di_mla_tc_layout(int kvl, int rope, bool f8, int bk, int ns) {
	di_mla_layout L;
	L.ldk = kvl + rope + 8;
	L.rb = f8 ? di_mla_f8_row_bytes(kvl, rope) : (kvl + rope) * 2;
	const size_t tile = (size_t)bk * L.ldk * 2;
	L.stage = f8 ? (size_t)bk * L.rb : tile;
	L.wide = (size_t)ns * L.stage;
	L.s = L.wide + (f8 ? tile : 0);
	L.p = L.s + (size_t)4 * MLA_HG * (bk + 8) * 4;
	L.alpha = L.p + (size_t)MLA_HG * (bk + 4) * 4;
	L.inv = L.alpha + MLA_HG * 4;
	L.mask = L.inv + MLA_HG * 4;
	L.bar = L.mask + (size_t)ns * 8;
	L.total = L.bar + (size_t)ns * 8;
	return L;
}

// di_mla_tc_minb is the blocks a multiprocessor of di_mla_tc_k<KVL, ..>
// over the largest rope dim (64): 2 where two blocks' shared memory fits
// an H100/H200 multiprocessor (227 KB), else 1; the launch bounds' second
// figure (with 8 warps: the register budget).
template <int KVL, bool F8, int BK, int NS> constexpr int di_mla_tc_minb() {
	constexpr int ldk = KVL + 72, rb = F8 ? (KVL + 128 + 4 * (KVL / MLA_F8_GROUP) + 15) / 16 * 16 : (KVL + 64) * 2;
	constexpr size_t tile = (size_t)BK * ldk * 2;
	constexpr size_t total = NS * (F8 ? (size_t)BK * rb : tile) + (F8 ? tile : 0) + (size_t)4 * MLA_HG * (BK + 8) * 4 +
	                         (size_t)MLA_HG * (BK + 4) * 4 + MLA_HG * 8 + (size_t)NS * 16;
	return 2 * (total + 1024) <= 228 * 1024 ? 2 : 1;
}

// di_mla_tc_k: grid (rows, nsplit, ceil(heads / 16) * D), 32 W threads,
// shared memory di_mla_tc_layout(KVL, rope, F8, BK, NS). Block (x, c, z)
// takes query row row0 + x (its visible keys [0, last)), chunk c of them
// (di_mla_chunk), heads h0 = (z / D) * 16 .. +16 and latent output columns
// [(z % D) * KVL / D, ...). ql: T16 [rows, heads, KVL + rope] (scores in
// log2 units); the cache rows are di_mla_layout's rb bytes apart (16-bit
// [KVL + rope], or the packed 8-bit row). Keys come in tiles of BK, NS - 1
// tiles in flight ahead of the one in use (8-bit: NS raw tiles, the one in
// use widened to half first): with BULK warp 0 issues one bulk copy a key
// row and the tile's mbarrier completes when its bytes have landed;
// otherwise every warp copies its rows with cp.async. Keys past the chunk
// or in a block outside the cache are zeros and masked. Warp w scores
// keys [(w / 4) * 4 BK / W, +4 BK / W) of a tile over latent k-steps [(w %
// 4) KVL / 64, +KVL / 64) and rope k-step w % 4 (the four quarters added in
// order: ((q0 + q1) + q2) + q3); 32 W / 16 threads run the online softmax
// of a head, each over consecutive keys of the tile (summed in key order,
// then across the threads by xor-butterfly), and warp w accumulates
// output columns [w KVL / (W D), ...) of its slice for all 16 heads. The
// chunk's output, divided by its sum, goes to po (half [rows, heads,
// nsplit, KVL]) and its (max, sum) to pml ([rows, heads, nsplit]); a
// chunk without keys writes (-inf, 0). Barriers a tile: two (16-bit, bulk
// copies), three (16-bit, cp.async), four (8-bit).
template <int KVL, int D, typename CT, int BK, int W, int NS, bool BULK, int MINB>
__global__ void __launch_bounds__(32 * W, MINB)
    di_mla_tc_k(__half *po, float2 *pml, const typename di_mla_t16<CT>::type *ql, const unsigned char *cache,
                const int *cu, const int *seqlens_k, const int *block_tables, int num_seqs, int max_blocks,
                int block_size, int num_blocks, int num_heads, int rope, int row0, int nsplit, unsigned *check) {
	using T16 = typename di_mla_t16<CT>::type;
	constexpr bool F8 = di_is_fp8<CT>;
	constexpr int NTH = 32 * W;
	constexpr int KSL = KVL / 64;             // latent k-steps of a warp's quarter
	constexpr int KPW = BK * 4 / W;           // keys a warp scores
	constexpr int NTS = KPW / 8;              // their n8 tiles
	constexpr int NT = KVL / (8 * W * D);     // output n8 tiles a warp
	constexpr int TPH = NTH / MLA_HG;         // softmax threads a head
	constexpr int KPT = BK / TPH;             // keys a softmax thread
	constexpr int LDS = BK + 8, LDP = BK + 4; // floats a row of the scores, of the probabilities
	constexpr int PRE = F8 ? NS : NS - 1;     // tiles issued before the first is used
	constexpr int CPR = (KVL + 64) / 256 + 1; // cp.async rounds of a row (16-bit rows, rope <= 64, are longest)
	static_assert((W == 4 || W == 8) && BK % 16 == 0 && BK <= 64 && NS >= 2, "di_mla_tc_k shape");
	static_assert(NTS >= 2 && NTS % 2 == 0 && NT >= 2 && NT % 2 == 0, "di_mla_tc_k tiles");
	static_assert(KPT == 2 || KPT == 4 || KPT == 8, "di_mla_tc_k softmax split");
	extern __shared__ __align__(16) unsigned char mla_smem[];
	const di_mla_layout L = di_mla_tc_layout(KVL, rope, F8, BK, NS);
	const int LDK = L.ldk, RB = L.rb, width = KVL + rope;
	const int dst_ld = F8 ? RB : LDK * 2; // bytes between a stage's rows
	float *sS = reinterpret_cast<float *>(mla_smem + L.s);
	float *sP = reinterpret_cast<float *>(mla_smem + L.p);
	float *sAlpha = reinterpret_cast<float *>(mla_smem + L.alpha);
	float *sInvL = reinterpret_cast<float *>(mla_smem + L.inv);
	unsigned long long *sMask = reinterpret_cast<unsigned long long *>(mla_smem + L.mask);
	uint64_t *sBar = reinterpret_cast<uint64_t *>(mla_smem + L.bar);
	T16 *sWide = reinterpret_cast<T16 *>(mla_smem + L.wide);

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
	const int x = blockIdx.x, i = row0 + x, c = blockIdx.y;
	const int hgrp = blockIdx.z / D, ds = blockIdx.z - hgrp * D, h0 = hgrp * MLA_HG;
	const bool writer = ds == 0;
	float2 *ml = pml + ((size_t)x * num_heads + h0) * nsplit + c; // head h0 + r at ml[r * nsplit]
	di_pdl_wait();
	int s, last;
	const bool ok = di_mla_seq_window(cu, seqlens_k, num_seqs, max_blocks * block_size, i, &s, &last);
	const int len = ok ? di_mla_chunk(last, num_heads) : 1;
	const int t_lo = c * len, t_hi = ok ? min(last, (c + 1) * len) : 0;
	if (!ok || t_lo >= t_hi) {
		if (!ok && c == 0 && blockIdx.z == 0 && tid == 0) atomicOr(check, DI_CHECK_MLA);
		if (writer && tid < MLA_HG && h0 + tid < num_heads) ml[(size_t)tid * nsplit] = make_float2(-CUDART_INF_F, 0.f);
		return;
	}
	const int *bt = block_tables + (size_t)s * max_blocks;
	const di_block_div bdiv(block_size);
	const int ntiles = (t_hi - t_lo + BK - 1) / BK;
	const bool producer = BULK ? warp == 0 : true; // the threads that issue copies

	// tile_slots(j, a, b): the cache slots of tile j's keys lane and 32 +
	// lane (-1 past the tile, past the chunk or for a block outside the cache).
	auto slot_of = [&](int t) {
		if (t >= t_hi) return -1;
		const int blk = bt[bdiv.block(t)];
		if (blk < 0 || blk >= num_blocks) {
			atomicOr(check, DI_CHECK_MLA);
			return -1;
		}
		return bdiv.slot(blk, t);
	};
	auto tile_slots = [&](int j, int &a, int &b) {
		const int t0 = t_lo + j * BK;
		a = lane < BK ? slot_of(t0 + lane) : -1;
		b = BK > 32 ? slot_of(t0 + 32 + lane) : -1;
	};
	// issue(j, a, b): tile j's copies into stage j % NS (called by the
	// producer threads, warp-uniformly; cp.async: the caller commits).
	auto issue = [&](int j, int a, int b) {
		const int st = j % NS;
		unsigned char *dst = mla_smem + (size_t)st * L.stage;
		const unsigned ma = __ballot_sync(0xffffffffu, a >= 0), mb = __ballot_sync(0xffffffffu, b >= 0);
		if constexpr (BULK) {
			uint64_t *bar = sBar + st;
			if (lane == 0) {
				sMask[st] = (unsigned long long)ma | ((unsigned long long)mb << 32);
				di_mbar_expect_tx(bar, (unsigned)(__popc(ma) + __popc(mb)) * (unsigned)RB);
			}
			__syncwarp();
#pragma unroll
			for (int h = 0; h < (BK > 32 ? 2 : 1); h++) {
				const int r = lane + 32 * h, sl = h ? b : a;
				if (r < BK) {
					unsigned char *d = dst + (size_t)r * dst_ld;
					if (sl >= 0) {
						di_bulk_g2s(d, cache + (size_t)sl * RB, (unsigned)RB, bar);
					} else {
						for (int e = 0; e < RB; e += 16) *reinterpret_cast<uint4 *>(d + e) = make_uint4(0, 0, 0, 0);
						di_fence_proxy_async();
					}
				}
			}
			di_mbar_arrive(bar);
		} else {
			if (tid == 0) sMask[st] = (unsigned long long)ma | ((unsigned long long)mb << 32);
			// Warp w copies rows w, w + W, ..: lane l the 16 bytes at l * 16
			// + 512 u of each (u < CPR, while inside the row), the row's slot
			// shuffled once and the addresses formed once a row. (The loop
			// over runtime bounds it replaces ran about 60 instructions a
			// row, more than a tile's arithmetic at batch 1 by ncu's counts;
			// kernels/cuda/NOTES.md.)
			const unsigned dst0 = di_smem_u32(dst) + lane * 16 + warp * dst_ld;
			const unsigned char *src0 = cache + lane * 16;
#pragma unroll
			for (int i = 0; i < BK / W; i++) {
				const int r = warp + W * i;
				const int sl = __shfl_sync(0xffffffffu, W * i < 32 ? a : b, r & 31);
				const unsigned char *src = src0 + (size_t)max(sl, 0) * RB;
				const unsigned d = dst0 + (unsigned)(W * i * dst_ld);
#pragma unroll
				for (int u = 0; u < CPR; u++)
					if (lane * 16 + 512 * u < RB) di_mla_cp16(d + 512 * u, src + 512 * u, sl >= 0);
			}
		}
	};

	if constexpr (BULK) {
		if (tid == 0) {
#pragma unroll
			for (int k = 0; k < NS; k++) di_mbar_init(sBar + k, 32);
			di_mbar_init_fence();
		}
		__syncwarp();
	}
	int nsa = -1, nsb = -1; // the slots of the next tile to issue (producers)
	if (producer) {
#pragma unroll
		for (int k = 0; k < PRE; k++) {
			if (k < ntiles) {
				int a, b;
				tile_slots(k, a, b);
				issue(k, a, b);
			}
			if constexpr (!BULK) di_cp_async_commit();
		}
		if (PRE < ntiles) tile_slots(PRE, nsa, nsb);
	}
	// next(j): issue tile j (if any) from the prefetched slots, prefetch tile j + 1's.
	auto issue_next = [&](int j) {
		if (j < ntiles) issue(j, nsa, nsb);
		if constexpr (!BULK) di_cp_async_commit();
		if (j + 1 < ntiles) tile_slots(j + 1, nsa, nsb);
	};

	// The query tile: heads h0.. (zeros past the last head), then each
	// warp's A fragments: latent k-steps [(warp % 4) * KSL, +KSL) and rope
	// k-step warp % 4 (when rope / 16 > warp % 4).
	T16 *sQ = F8 ? sWide : reinterpret_cast<T16 *>(mla_smem + (size_t)(NS - 1) * L.stage);
	{
		const int ch = width / 8;
		for (int r = warp; r < MLA_HG; r += W) {
			const T16 *src = ql + ((size_t)x * num_heads + h0 + r) * width;
			for (int e = lane; e < ch; e += 32) {
				uint4 v = make_uint4(0, 0, 0, 0);
				if (h0 + r < num_heads) v = *reinterpret_cast<const uint4 *>(src + e * 8);
				*reinterpret_cast<uint4 *>(sQ + r * LDK + e * 8) = v;
			}
		}
		if constexpr (BULK && !F8) di_fence_proxy_async(); // a bulk copy refills this stage later
	}
	__syncthreads();
	const int lm_row = lane & 7, lm_mat = lane >> 3, qq = warp & 3, kbase = (warp >> 2) * KPW;
	uint32_t qa[KSL][4], qr[4] = {0, 0, 0, 0};
	const bool has_rope = qq < rope / 16;
#pragma unroll
	for (int k = 0; k < KSL; k++)
		di_ldmatrix_x4(qa[k], sQ + (lm_row + (lm_mat & 1) * 8) * LDK + (qq * KSL + k) * 16 + (lm_mat >> 1) * 8);
	if (has_rope) di_ldmatrix_x4(qr, sQ + (lm_row + (lm_mat & 1) * 8) * LDK + KVL + qq * 16 + (lm_mat >> 1) * 8);
	// (the query's stage is refilled only after the first tile's first
	// barrier, which every warp reaches after these loads)

	float m_run = -CUDART_INF_F, l_run = 0.f; // head sh: the same in its TPH threads
	float o[NT][4];
#pragma unroll
	for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
	const int dbase = ds * (KVL / D) + warp * (KVL / (W * D)); // this warp's output columns
	const int sh = tid / TPH, sk0 = (tid % TPH) * KPT;          // softmax: head sh, keys sk0..+KPT

	for (int j = 0; j < ntiles; j++) {
		const int st = j % NS;
		if constexpr (BULK) {
			di_mbar_wait(sBar + st, (unsigned)(j / NS) & 1u);
			if constexpr (F8) __syncthreads(); // the widened tile's readers (tile j - 1) are done
		} else {
			di_cp_async_wait<PRE - 1>();
			__syncthreads(); // tile j has landed for every thread; tile j - 1 is consumed
			if constexpr (!F8) {
				if (producer) issue_next(j + PRE); // into stage (j - 1) % NS
			}
		}
		const unsigned long long km = sMask[st]; // read before the stage's next copies are issued
		const T16 *Ks;
		if constexpr (F8) {
			// Widen the raw rows: value * its group's scale, rounded to half; the rope halves as they are.
			const unsigned char *raw = mla_smem + (size_t)st * L.stage;
			constexpr int CH = KVL / 16;
			for (int k = tid; k < BK * CH; k += NTH) {
				const int r = k / CH, e = (k - r * CH) * 16;
				const unsigned char *rr = raw + r * RB;
				const float scale = reinterpret_cast<const float *>(rr + KVL + 2 * rope)[e / MLA_F8_GROUP];
				const uint4 v = *reinterpret_cast<const uint4 *>(rr + e);
				const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
				uint32_t hv[8];
#pragma unroll
				for (int u = 0; u < 4; u++) di_fp8x4_scaled_half(wv[u], scale, hv[2 * u], hv[2 * u + 1]);
				uint4 *d = reinterpret_cast<uint4 *>(sWide + r * LDK + e);
				d[0] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
				d[1] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
			}
			const int rch = rope / 8;
			for (int k = tid; k < BK * rch; k += NTH) {
				const int r = k / rch, e = (k - r * rch) * 8;
				*reinterpret_cast<uint4 *>(sWide + r * LDK + KVL + e) =
				    *reinterpret_cast<const uint4 *>(raw + r * RB + KVL + 2 * e);
			}
			__syncthreads(); // the widened tile is complete; raw stage st is consumed
			if (producer) issue_next(j + PRE); // into stage st
			Ks = sWide;
		} else {
			Ks = reinterpret_cast<const T16 *>(mla_smem + (size_t)st * L.stage);
		}

		// Scores: this warp's keys over its quarter of the latent columns and its rope k-step.
		float sc[NTS][4];
#pragma unroll
		for (int n = 0; n < NTS; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
		for (int k = 0; k < KSL; k++) {
#pragma unroll
			for (int np = 0; np < NTS / 2; np++) {
				uint32_t b[4];
				di_ldmatrix_x4(b, Ks + (kbase + np * 16 + (lm_mat >> 1) * 8 + lm_row) * LDK + (qq * KSL + k) * 16 +
				                      (lm_mat & 1) * 8);
				di_mma16816<T16>(sc[2 * np], qa[k][0], qa[k][1], qa[k][2], qa[k][3], b[0], b[1]);
				di_mma16816<T16>(sc[2 * np + 1], qa[k][0], qa[k][1], qa[k][2], qa[k][3], b[2], b[3]);
			}
		}
		if (has_rope) {
#pragma unroll
			for (int np = 0; np < NTS / 2; np++) {
				uint32_t b[4];
				di_ldmatrix_x4(b, Ks + (kbase + np * 16 + (lm_mat >> 1) * 8 + lm_row) * LDK + KVL + qq * 16 +
				                      (lm_mat & 1) * 8);
				di_mma16816<T16>(sc[2 * np], qr[0], qr[1], qr[2], qr[3], b[0], b[1]);
				di_mma16816<T16>(sc[2 * np + 1], qr[0], qr[1], qr[2], qr[3], b[2], b[3]);
			}
		}
		{
			float *ss = sS + qq * MLA_HG * LDS + kbase;
#pragma unroll
			for (int n = 0; n < NTS; n++) {
				*reinterpret_cast<float2 *>(ss + g * LDS + n * 8 + 2 * t4) = make_float2(sc[n][0], sc[n][1]);
				*reinterpret_cast<float2 *>(ss + (g + 8) * LDS + n * 8 + 2 * t4) = make_float2(sc[n][2], sc[n][3]);
			}
		}
		__syncthreads();
		if constexpr (BULK && !F8) {
			if (producer) issue_next(j + PRE); // into stage (j - 1) % NS, whose readers are past this barrier
		}

		// Online softmax: head sh, keys sk0..+KPT; the warps' quarters added in order.
		{
			float sv[KPT], mx = -CUDART_INF_F;
#pragma unroll
			for (int u = 0; u < KPT; u++) {
				const int jj = sk0 + u, at = sh * LDS + jj;
				float v = __fadd_rn(__fadd_rn(__fadd_rn(sS[at], sS[MLA_HG * LDS + at]), sS[2 * MLA_HG * LDS + at]),
				                    sS[3 * MLA_HG * LDS + at]);
				v = (km >> jj) & 1ull ? v : -CUDART_INF_F;
				sv[u] = v;
				mx = fmaxf(mx, v);
			}
#pragma unroll
			for (int o2 = 1; o2 < TPH; o2 <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
			const float m_new = fmaxf(m_run, mx);
			float alpha = 1.f, sum = 0.f, p[KPT];
#pragma unroll
			for (int u = 0; u < KPT; u++) p[u] = 0.f;
			if (m_new != -CUDART_INF_F) {
				alpha = exp2f(__fsub_rn(m_run, m_new));
#pragma unroll
				for (int u = 0; u < KPT; u++) p[u] = exp2f(__fsub_rn(sv[u], m_new));
				sum = p[0];
#pragma unroll
				for (int u = 1; u < KPT; u++) sum = __fadd_rn(sum, p[u]);
			}
#pragma unroll
			for (int o2 = 1; o2 < TPH; o2 <<= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o2));
			l_run = __fadd_rn(__fmul_rn(l_run, alpha), sum);
			m_run = m_new;
			float *pp = sP + sh * LDP + sk0;
			if constexpr (KPT == 2) {
				*reinterpret_cast<float2 *>(pp) = make_float2(p[0], p[1]);
			} else {
#pragma unroll
				for (int u = 0; u < KPT; u += 4)
					*reinterpret_cast<float4 *>(pp + u) = make_float4(p[u], p[u + 1], p[u + 2], p[u + 3]);
			}
			if (tid % TPH == 0) sAlpha[sh] = alpha;
		}
		__syncthreads();

		// Outputs: rescale, then P (16 heads x BK keys) times the keys' latent columns of this warp.
		{
			const float a_lo = sAlpha[g], a_hi = sAlpha[g + 8];
#pragma unroll
			for (int n = 0; n < NT; n++) {
				o[n][0] = __fmul_rn(o[n][0], a_lo), o[n][1] = __fmul_rn(o[n][1], a_lo);
				o[n][2] = __fmul_rn(o[n][2], a_hi), o[n][3] = __fmul_rn(o[n][3], a_hi);
			}
#pragma unroll
			for (int kk = 0; kk < BK / 16; kk++) {
				const float *p0 = sP + g * LDP + kk * 16 + 2 * t4, *p1 = p0 + 8 * LDP;
				const float2 x0 = *reinterpret_cast<const float2 *>(p0), x1 = *reinterpret_cast<const float2 *>(p1);
				const float2 x2 = *reinterpret_cast<const float2 *>(p0 + 8), x3 = *reinterpret_cast<const float2 *>(p1 + 8);
				const uint32_t a0 = di_pack2<T16>(x0.x, x0.y), a1 = di_pack2<T16>(x1.x, x1.y);
				const uint32_t a2 = di_pack2<T16>(x2.x, x2.y), a3 = di_pack2<T16>(x3.x, x3.y);
#pragma unroll
				for (int n = 0; n < NT; n += 2) {
					uint32_t b[4];
					di_ldmatrix_x4_trans(b, Ks + (kk * 16 + (lm_mat & 1) * 8 + lm_row) * LDK + dbase +
					                            (n + (lm_mat >> 1)) * 8);
					di_mma16816<T16>(o[n], a0, a1, a2, a3, b[0], b[1]);
					di_mma16816<T16>(o[n + 1], a0, a1, a2, a3, b[2], b[3]);
				}
			}
		}
		// (no barrier here: the next tile's first barrier comes before anyone
		// overwrites the probabilities, and its copies go to another stage)
	}

	// The chunk's results: (max, sum) per head, the output divided by the sum.
	if (tid % TPH == 0) {
		sInvL[sh] = l_run > 0.f ? __fdiv_rn(1.f, l_run) : 0.f;
		if (writer && h0 + sh < num_heads) ml[(size_t)sh * nsplit] = make_float2(m_run, l_run);
	}
	__syncthreads();
	const float i_lo = sInvL[g], i_hi = sInvL[g + 8];
#pragma unroll
	for (int half = 0; half < 2; half++) {
		const int h = h0 + g + 8 * half;
		if (h >= num_heads) continue;
		const float inv = half ? i_hi : i_lo;
		__half *dst = po + (((size_t)x * num_heads + h) * nsplit + c) * KVL + dbase + 2 * t4;
#pragma unroll
		for (int n = 0; n < NT; n++)
			*reinterpret_cast<__half2 *>(dst + n * 8) =
			    __floats2half2_rn(__fmul_rn(o[n][2 * half], inv), __fmul_rn(o[n][2 * half + 1], inv));
	}
}

// di_mla_combine_k: grid (rows, heads), 128 threads. Merges row x's
// chunks in ascending order into olat (float32 [rows, heads, kvl], kvl a
// multiple of 4): weight w_c = l_c * 2^(m_c - max), the chunks with keys
// only; zeros for a row without keys. Thread t takes columns 4t.. +4
// (8-byte loads of the partial outputs), each summed over the chunks in
// order.
__global__ void di_mla_combine_k(float *olat, const __half *po, const float2 *pml, int num_heads, int kvl,
                                 int nsplit) {
	di_pdl_wait();
	__shared__ float w[MLA_MAX_SPLITS];
	__shared__ float inv_l;
	const int x = blockIdx.x, h = blockIdx.y;
	const float2 *ml = pml + ((size_t)x * num_heads + h) * nsplit;
	if (threadIdx.x < 32) {
		const int c = threadIdx.x;
		const float2 v = c < nsplit ? ml[c] : make_float2(-CUDART_INF_F, 0.f);
		float mx = v.y > 0.f ? v.x : -CUDART_INF_F;
		mx = di_warp_max(mx);
		const float wc = v.y > 0.f ? __fmul_rn(exp2f(__fsub_rn(v.x, mx)), v.y) : 0.f;
		if (c < nsplit) w[c] = wc;
		__syncwarp();
		if (c == 0) {
			float l = 0.f;
			for (int k = 0; k < nsplit; k++) l = __fadd_rn(l, w[k]);
			inv_l = l > 0.f ? __fdiv_rn(1.f, l) : 0.f;
		}
	}
	__syncthreads();
	const __half *p = po + ((size_t)x * num_heads + h) * nsplit * kvl;
	float *o = olat + ((size_t)x * num_heads + h) * kvl;
	for (int e = 4 * threadIdx.x; e < kvl; e += 4 * blockDim.x) {
		float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
		for (int c = 0; c < nsplit; c++) {
			const float wc = w[c];
			if (wc > 0.f) {
				const uint2 u = *reinterpret_cast<const uint2 *>(p + (size_t)c * kvl + e);
				const float2 f0 = __half22float2(*reinterpret_cast<const __half2 *>(&u.x));
				const float2 f1 = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
				a0 = __fmaf_rn(f0.x, wc, a0), a1 = __fmaf_rn(f0.y, wc, a1);
				a2 = __fmaf_rn(f1.x, wc, a2), a3 = __fmaf_rn(f1.y, wc, a3);
			}
		}
		o[e] = __fmul_rn(a0, inv_l), o[e + 1] = __fmul_rn(a1, inv_l);
		o[e + 2] = __fmul_rn(a2, inv_l), o[e + 3] = __fmul_rn(a3, inv_l);
	}
}

// ---------------------------------------------------------------- host side

// di_mla_tc_ok reports whether the tensor-core path takes these sizes.
static bool di_mla_tc_shape(int kvl, int rope) {
	return (kvl == 128 || kvl == 512) && rope > 0 && rope <= 64 && rope % 16 == 0;
}

// di_mla_pick_d is how many slices of the latent output a row's chunk is
// cut into: more for few (row, head group) pairs, so that short batches
// have blocks for every multiprocessor, and at most what leaves a warp two
// n8 tiles of output columns. It changes no bit.
static int di_mla_pick_d(int kvl, size_t pairs) {
	const int d = pairs <= 8 ? 4 : (pairs <= 32 ? 2 : 1), dmax = kvl / (16 * MLA_TC_WARPS);
	return d > dmax ? dmax : d;
}

template <int KVL, int D, typename CT>
static int di_mla_tc_launch(di_ctx *ctx, __half *po, float2 *pml, const void *ql, const unsigned char *cache,
                            const di_attn_meta *m, int rows, int row0, int num_heads, int rope, int nsplit) {
	constexpr bool F8 = di_is_fp8<CT>;
	constexpr int BK = MLA_TC_BK, W = MLA_TC_WARPS, NS = F8 ? MLA_TC_STAGES_F8 : MLA_TC_STAGES;
	const di_mla_layout L = di_mla_tc_layout(KVL, rope, F8, BK, NS);
	auto k = di_mla_tc_k<KVL, D, CT, BK, W, NS, MLA_TC_BULK != 0, di_mla_tc_minb<KVL, F8, BK, NS>()>;
	cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)L.total);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "mla_attention (latent): cudaFuncSetAttribute");
	const int hg = (num_heads + MLA_HG - 1) / MLA_HG;
	di_launch(ctx, k, dim3(rows, nsplit, hg * D), dim3(32 * W), L.total, po, pml,
	          static_cast<const typename di_mla_t16<CT>::type *>(ql), cache, DI_PTR(const int, m->cu_seqlens_q),
	          DI_PTR(const int, m->seqlens_k), DI_PTR(const int, m->block_tables), m->num_seqs, m->max_blocks_per_seq,
	          m->block_size, m->num_blocks, num_heads, rope, row0, nsplit, ctx->check);
	return di_check_launch(ctx, "mla_attention (latent)");
}

template <int KVL, typename CT>
static int di_mla_tc_d(di_ctx *ctx, int d, __half *po, float2 *pml, const void *ql, const unsigned char *cache,
                       const di_attn_meta *m, int rows, int row0, int num_heads, int rope, int nsplit) {
	constexpr int dmax = KVL / (16 * MLA_TC_WARPS);
	if constexpr (dmax >= 4) {
		if (d == 4) return di_mla_tc_launch<KVL, 4, CT>(ctx, po, pml, ql, cache, m, rows, row0, num_heads, rope, nsplit);
	}
	if constexpr (dmax >= 2) {
		if (d >= 2) return di_mla_tc_launch<KVL, 2, CT>(ctx, po, pml, ql, cache, m, rows, row0, num_heads, rope, nsplit);
	}
	return di_mla_tc_launch<KVL, 1, CT>(ctx, po, pml, ql, cache, m, rows, row0, num_heads, rope, nsplit);
}

// di_mla_latent_pass runs the latent attention (di_mla_tc_k and the
// combine) for rows [row0, row0 + rows) of the call: ql and olat point at
// row row0's entries; po and pml are scratch of rows * heads * nsplit
// entries.
static int di_mla_latent_pass(di_ctx *ctx, float *olat, const void *ql, const unsigned char *cache, int cache_dtype,
                              const di_attn_meta *m, int rows, int row0, int num_heads, int kvl, int rope, int nsplit,
                              __half *po, float2 *pml) {
	const int hg = (num_heads + MLA_HG - 1) / MLA_HG;
	const int d = di_mla_pick_d(kvl, (size_t)rows * hg);
	int rc;
#define DI_MLA_TC(KVL)                                                                                              \
	switch (cache_dtype) {                                                                                          \
	case DI_F16: rc = di_mla_tc_d<KVL, __half>(ctx, d, po, pml, ql, cache, m, rows, row0, num_heads, rope, nsplit); break; \
	case DI_BF16:                                                                                                   \
		rc = di_mla_tc_d<KVL, __nv_bfloat16>(ctx, d, po, pml, ql, cache, m, rows, row0, num_heads, rope, nsplit);    \
		break;                                                                                                      \
	default:                                                                                                        \
		rc = di_mla_tc_d<KVL, __nv_fp8_e4m3>(ctx, d, po, pml, ql, cache, m, rows, row0, num_heads, rope, nsplit);    \
		break;                                                                                                      \
	}
	if (kvl == 512) {
		DI_MLA_TC(512)
	} else {
		DI_MLA_TC(128)
	}
#undef DI_MLA_TC
	if (rc != DI_OK) return rc;
	di_launch(ctx, di_mla_combine_k, dim3(rows, num_heads), dim3(128), 0, olat, (const __half *)po, (const float2 *)pml,
	          num_heads, kvl, nsplit);
	return di_check_launch(ctx, "mla_attention (combine)");
}

// di_mla_check_tc validates the arguments the tensor-core path shares.
static int di_mla_check_tc(di_ctx *ctx, const char *op, di_dptr cache, int cache_dtype, int kvl, int rope) {
	if (cache_dtype != DI_F16 && cache_dtype != DI_BF16 && cache_dtype != DI_F8E4M3)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "%s: cache dtype %d: want F16, BF16 or F8E4M3", op, cache_dtype);
	if (!di_mla_tc_shape(kvl, rope))
		return di_fail(ctx, DI_ERR_UNSUPPORTED,
		               "%s: kv_lora_rank %d, rope dim %d: the 16- and 8-bit caches take kv_lora_rank 128 or 512 and a "
		               "rope dim of 16 to 64 in steps of 16",
		               op, kvl, rope);
	if (cache % 16 != 0) return di_fail(ctx, DI_ERR_INVALID, "%s: cache not 16-byte aligned", op);
	return DI_OK;
}

// di_mla_pass_rows is the most rows one pass takes: the pass's scratch
// (per row and head: q_lat, o_lat and nsplit partial outputs) within
// MLA_SCRATCH_BYTES, and at least one row.
static int di_mla_pass_rows(int num_heads, int kvl, int rope, int nsplit) {
	const size_t per_row = (size_t)num_heads * ((size_t)(kvl + rope) * 2 + (size_t)kvl * 4 +
	                                            (size_t)nsplit * ((size_t)kvl * 2 + sizeof(float2)));
	const size_t r = MLA_SCRATCH_BYTES / per_row;
	return r < 1 ? 1 : (r > (1u << 30) ? (1 << 30) : (int)r);
}

extern "C" int di_op_mla_latent_attention(di_ctx *ctx, di_dptr olat, di_dptr ql, di_dptr cache, int cache_dtype,
                                          const di_attn_meta *m, int num_heads, int kvl, int rope) {
	if (m->num_tokens == 0) return DI_OK;
	int rc = di_mla_check_tc(ctx, "mla_latent_attention", cache, cache_dtype, kvl, rope);
	if (rc != DI_OK) return rc;
	if (ql % 16 != 0) return di_fail(ctx, DI_ERR_INVALID, "mla_latent_attention: q_lat not 16-byte aligned");
	const int nsplit = di_mla_nsplit(m->max_blocks_per_seq * m->block_size, num_heads);
	const int pass = di_mla_pass_rows(num_heads, kvl, rope, nsplit);
	const int rows_max = m->num_tokens < pass ? m->num_tokens : pass;
	void *po = nullptr, *pml = nullptr;
	if ((rc = di_scratch(ctx, (size_t)rows_max * num_heads * nsplit * kvl * 2, &po)) != DI_OK) return rc;
	if ((rc = di_scratch(ctx, (size_t)rows_max * num_heads * nsplit * sizeof(float2), &pml)) != DI_OK) {
		di_scratch_free(ctx, po);
		return rc;
	}
	for (int r0 = 0; r0 < m->num_tokens && rc == DI_OK; r0 += pass) {
		const int rows = m->num_tokens - r0 < pass ? m->num_tokens - r0 : pass;
		rc = di_mla_latent_pass(ctx, DI_PTR(float, olat) + (size_t)r0 * num_heads * kvl,
		                        DI_PTR(const unsigned char, ql) + (size_t)r0 * num_heads * (kvl + rope) * 2,
		                        DI_PTR(const unsigned char, cache), cache_dtype, m, rows, r0, num_heads, kvl, rope, nsplit,
		                        (__half *)po, (float2 *)pml);
	}
	di_scratch_free(ctx, po);
	di_scratch_free(ctx, pml);
	return rc;
}

// di_mla_absorb queues the absorption of rows query rows into ql: on
// tensor cores (di_mla_absorb_tc_k) when tc (di_mla_tc_absorb) and W is a
// 16-bit type, else di_mla_absorb_k. Returns the error of raising the
// kernel's shared-memory limit; launch errors surface in di_check_launch.
template <typename W, typename T16>
static cudaError_t di_mla_absorb(di_ctx *ctx, T16 *ql, const float *q, const W *wkvb, int rows, int num_heads,
                                 int nope, int rope, int kvl, int vd, float qscale, bool tc) {
	const int rb = di_mla_rb(rows);
	if constexpr (!std::is_same<W, float>::value) {
		if (tc) {
			const dim3 grid(kvl / MLA_TC_AB_COLS, num_heads, (rows + rb - 1) / rb);
			const size_t smem = ((size_t)nope * (MLA_TC_AB_COLS + 8) + 2 * (size_t)rb * (nope + 8)) * sizeof(W);
			const cudaError_t e = cudaFuncSetAttribute(di_mla_absorb_tc_k<W, T16>,
			                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
			if (e == cudaSuccess)
				di_launch(ctx, di_mla_absorb_tc_k<W, T16>, grid, dim3(128), smem, ql, q, wkvb, rows, num_heads, nope,
				          rope, kvl, vd, qscale, rb);
			return e;
		}
	}
	const dim3 grid(kvl / MLA_AB_COLS, num_heads, (rows + rb - 1) / rb);
	const size_t smem = ((size_t)nope * MLA_AB_COLS + MLA_AB_ROWS * nope + 2 * MLA_AB_ROWS * MLA_AB_COLS) * 4;
	const cudaError_t e =
	    cudaFuncSetAttribute(di_mla_absorb_k<W, T16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
	if (e == cudaSuccess)
		di_launch(ctx, di_mla_absorb_k<W, T16>, grid, dim3(128), smem, ql, q, wkvb, rows, num_heads, nope, rope, kvl,
		          vd, qscale, rb);
	return e;
}

// di_mla_unabsorb queues out = o_lat W_UV^T for rows rows: on tensor cores
// (di_mla_unabsorb_tc_k) when tc and W is a 16-bit type, else
// di_mla_unabsorb_k. Errors as di_mla_absorb's.
template <typename W>
static cudaError_t di_mla_unabsorb(di_ctx *ctx, float *out, const float *olat, const W *wkvb, int rows, int num_heads,
                                   int nope, int kvl, int vd, bool tc) {
	const int rb = di_mla_rb(rows);
	const dim3 grid((vd + MLA_UA_V - 1) / MLA_UA_V, num_heads, (rows + rb - 1) / rb);
	if constexpr (!std::is_same<W, float>::value) {
		if (tc) {
			const size_t smem = (size_t)(MLA_UA_V + 2 * MLA_AB_ROWS) * (kvl + 8) * sizeof(W) +
			                    (size_t)4 * MLA_AB_ROWS * MLA_UA_V * sizeof(float);
			const cudaError_t e =
			    cudaFuncSetAttribute(di_mla_unabsorb_tc_k<W>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
			if (e == cudaSuccess)
				di_launch(ctx, di_mla_unabsorb_tc_k<W>, grid, dim3(128), smem, out, olat, wkvb, rows, num_heads, nope,
				          kvl, vd, rb);
			return e;
		}
	}
	const size_t smem = ((size_t)MLA_UA_V * (kvl + 8) + (size_t)MLA_AB_ROWS * kvl) * 4;
	const cudaError_t e =
	    cudaFuncSetAttribute(di_mla_unabsorb_k<W>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
	if (e == cudaSuccess)
		di_launch(ctx, di_mla_unabsorb_k<W>, grid, dim3(128), smem, out, olat, wkvb, rows, num_heads, nope, kvl, vd, rb);
	return e;
}

extern "C" int di_op_mla_attention_tc(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, int cache_dtype,
                                      di_dptr wkvb, int w_dtype, const di_attn_meta *m, int num_heads, int nope_dim,
                                      int rope_dim, int kv_lora_rank, int v_head_dim, float scale) {
	if (m->num_tokens == 0) return DI_OK;
	const int kvl = kv_lora_rank, rope = rope_dim, nope = nope_dim, vd = v_head_dim;
	int rc = di_mla_check_tc(ctx, "mla_attention", cache, cache_dtype, kvl, rope);
	if (rc != DI_OK) return rc;
	if (w_dtype != DI_F32 && w_dtype != DI_BF16 && w_dtype != DI_F16)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "mla_attention: weight dtype %d", w_dtype);
	if (nope <= 0 || nope % 2 != 0 || vd <= 0 || num_heads <= 0)
		return di_fail(ctx, DI_ERR_INVALID, "mla_attention: nope dim %d (even), v head dim %d, heads %d", nope, vd,
		               num_heads);
	const int nsplit = di_mla_nsplit(m->max_blocks_per_seq * m->block_size, num_heads);
	const int pass = di_mla_pass_rows(num_heads, kvl, rope, nsplit);
	const int rows_max = m->num_tokens < pass ? m->num_tokens : pass;
	const size_t n_ql = (size_t)rows_max * num_heads * (kvl + rope) * 2, n_ol = (size_t)rows_max * num_heads * kvl * 4;
	const size_t n_po = (size_t)rows_max * num_heads * nsplit * kvl * 2,
	             n_ml = (size_t)rows_max * num_heads * nsplit * sizeof(float2);
	void *buf = nullptr;
	if ((rc = di_scratch(ctx, n_ql + n_ol + n_po + n_ml, &buf)) != DI_OK) return rc;
	unsigned char *qlp = (unsigned char *)buf, *olp = qlp + n_ql, *pop = olp + n_ol, *mlp = pop + n_po;
	const bool tc = di_mla_tc_absorb(w_dtype, wkvb, nope, kvl, vd);
	const float qscale = scale * 1.4426950408889634f;
	const bool bf = cache_dtype == DI_BF16;
	for (int r0 = 0; r0 < m->num_tokens && rc == DI_OK; r0 += pass) {
		const int rows = m->num_tokens - r0 < pass ? m->num_tokens - r0 : pass;
		const float *qr = DI_PTR(const float, q) + (size_t)r0 * num_heads * (nope + rope);
		DI_DISPATCH_WEIGHT(w_dtype, W, {
			const cudaError_t e = bf ? di_mla_absorb<W, __nv_bfloat16>(ctx, (__nv_bfloat16 *)qlp, qr, DI_PTR(const W, wkvb),
			                                                           rows, num_heads, nope, rope, kvl, vd, qscale, tc)
			                         : di_mla_absorb<W, __half>(ctx, (__half *)qlp, qr, DI_PTR(const W, wkvb), rows,
			                                                    num_heads, nope, rope, kvl, vd, qscale, tc);
			if (e != cudaSuccess) {
				rc = di_cuda_fail(ctx, e, "mla_attention (absorb): cudaFuncSetAttribute");
				break;
			}
		});
		if (rc != DI_OK) break;
		if ((rc = di_check_launch(ctx, "mla_attention (absorb)")) != DI_OK) break;
		rc = di_mla_latent_pass(ctx, (float *)olp, qlp, DI_PTR(const unsigned char, cache), cache_dtype, m, rows, r0,
		                        num_heads, kvl, rope, nsplit, (__half *)pop, (float2 *)mlp);
		if (rc != DI_OK) break;
		DI_DISPATCH_WEIGHT(w_dtype, W, {
			const cudaError_t e = di_mla_unabsorb<W>(ctx, DI_PTR(float, out) + (size_t)r0 * num_heads * vd,
			                                         (const float *)olp, DI_PTR(const W, wkvb), rows, num_heads, nope,
			                                         kvl, vd, tc);
			if (e != cudaSuccess) {
				rc = di_cuda_fail(ctx, e, "mla_attention (unabsorb): cudaFuncSetAttribute");
				break;
			}
		});
		if (rc != DI_OK) break;
		rc = di_check_launch(ctx, "mla_attention (unabsorb)");
	}
	di_scratch_free(ctx, buf);
	return rc;
}
