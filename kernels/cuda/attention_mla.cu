// attention_mla.cu: multi-head latent attention (MLA, DeepSeek) with weight
// absorption over a float32 latent cache [num_blocks, block_size,
// kv_lora_rank + rope_dim] read through block tables: one block per (row,
// head), with small grids staging their keys in shared memory a tile at a
// time (the same bits).
#include "attention.cuh"

// ---------------------------------------------------------------- MLA

#define MLA_THREADS 256
#define MLA_MAX_COLS 4 // latent columns per thread: kv_lora_rank <= 4*MLA_THREADS

// One block per (query row, head), in one of two forms with the same
// arithmetic (the same bits, TestGPUMLAStagedBits):
//  - STAGED: each tile of ATT_TILE cached rows is copied into shared memory
//    by all threads at once (16-byte loads when vec4), so a tile costs one
//    round trip to the cache, and the scores and the latent output read
//    shared memory (ATT_TILE x (kv_lora_rank + rope_dim) floats: 147 KB for
//    DeepSeek's 576, one block a multiprocessor);
//  - plain: the score loop reads each key's row from global memory and the
//    output loop reads it again, one load a key (a few KB of shared memory,
//    many blocks a multiprocessor).
// di_op_mla_attention takes STAGED for grids of at most ctx->mla_staged_max
// blocks (the multiprocessors' count; di_options.mla_staged_max):
// DeepSeek-V2-Lite, 384 keys, round 13: batch 1 (16 blocks) 6.3 -> 4.8 ms of
// MLA a decode step; at batch 64 (1024 blocks) the plain form is faster
// (10.9 ms against 12.3-20.8 for staged tiles of 16-32 keys).
// Shared memory: the absorbed query [kv_lora_rank + rope_dim], q_nope
// [nope_dim] (reused for the latent output), the tile's scores and slots,
// and for STAGED the tile's rows. Every sum runs in a fixed order that
// depends only on the row's own keys: a row's result is the same alone and
// in any batch. Cost per (row, head): one read of W_UK[h] and W_UV[h] (from
// L2 after the first block of a head) and of the row's visible cache rows.
template <typename W, bool STAGED>
__global__ void __launch_bounds__(MLA_THREADS)
    di_mla_k(float *out, const float *q, const float *cache, const W *wkvb, const int *cu, const int *seqlens_k,
             const int *block_tables, int num_seqs, int max_blocks, int block_size, int num_blocks, int num_heads,
             int nope, int rope, int kvl, int vd, float scale, int vec4, unsigned *check) {
	extern __shared__ __align__(16) float smem[];
	const int width = kvl + rope;
	float *qx = smem;                       // [width]
	float *olat = qx + width;               // [max(kvl, nope)]
	float *sp = olat + max(kvl, nope);      // [ATT_TILE]
	int *slots = (int *)(sp + ATT_TILE);    // [ATT_TILE]
	float *lat = (float *)(slots + ATT_TILE); // STAGED: [ATT_TILE][width]
	const int i = blockIdx.x, h = blockIdx.y;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
	float *o = out + ((size_t)i * num_heads + h) * vd;
	int s, first, last;
	if (!di_seq_window(cu, seqlens_k, num_seqs, max_blocks * block_size, i, 0, &s, &first, &last)) {
		if (tid == 0) atomicOr(check, DI_CHECK_MLA);
		for (int e = tid; e < vd; e += blockDim.x) o[e] = 0.f;
		return;
	}
	const float *qr = q + ((size_t)i * num_heads + h) * (nope + rope);
	for (int d = tid; d < nope; d += blockDim.x) olat[d] = qr[d];
	for (int r = tid; r < rope; r += blockDim.x) qx[kvl + r] = qr[nope + r];
	__syncthreads();
	// Absorb: q_lat[c] = sum_d W_UK[h][d][c] q_nope[d]; W_UK[h] is rows
	// h*(nope+vd) .. +nope of wkvb [num_heads*(nope+vd), kvl].
	const W *wuk = wkvb + (size_t)h * (nope + vd) * kvl;
	for (int c = tid; c < kvl; c += blockDim.x) {
		float a = 0.f;
#pragma unroll 16
		for (int d = 0; d < nope; d++) a += di_to_f32(wuk[(size_t)d * kvl + c]) * olat[d];
		qx[c] = a;
	}
	float acc[MLA_MAX_COLS];
#pragma unroll
	for (int c = 0; c < MLA_MAX_COLS; c++) acc[c] = 0.f;
	float m = -CUDART_INF_F, l = 0.f;
	const int w4 = width / 4;
	for (int t0 = first; t0 < last; t0 += ATT_TILE) {
		const int n = min(ATT_TILE, last - t0);
		__syncthreads(); // the previous tile (and, first time, qx) is consumed
		di_load_slots(slots, block_tables, s, max_blocks, block_size, num_blocks, t0, n, check, DI_CHECK_MLA);
		__syncthreads();
		if constexpr (STAGED) {
			if (vec4) {
				for (int idx = tid; idx < n * w4; idx += blockDim.x) {
					const int jj = idx / w4, e4 = idx - jj * w4, slot = slots[jj];
					reinterpret_cast<float4 *>(lat + (size_t)jj * width)[e4] =
					    slot >= 0 ? reinterpret_cast<const float4 *>(cache + (size_t)slot * width)[e4]
					              : make_float4(0.f, 0.f, 0.f, 0.f);
				}
			} else {
				for (int idx = tid; idx < n * width; idx += blockDim.x) {
					const int jj = idx / width, e = idx - jj * width, slot = slots[jj];
					lat[idx] = slot >= 0 ? cache[(size_t)slot * width + e] : 0.f;
				}
			}
			__syncthreads();
		}
		for (int jj = warp; jj < n; jj += nwarps) {
			const int slot = slots[jj];
			float dot = 0.f;
			if (slot >= 0) {
				const float *kr = STAGED ? lat + (size_t)jj * width : cache + (size_t)slot * width;
				for (int e = lane; e < width; e += 32) dot += qx[e] * kr[e];
			}
			dot = di_warp_sum(dot);
			if (lane == 0) sp[jj] = slot >= 0 ? dot * scale : -CUDART_INF_F;
		}
		__syncthreads();
		const float alpha = di_online_update(sp, n, &m, &l);
#pragma unroll
		for (int c = 0; c < MLA_MAX_COLS; c++) {
			const int e = tid + c * MLA_THREADS;
			if (e >= kvl) break;
			float a = acc[c] * alpha;
			for (int jj = 0; jj < n; jj++) {
				const int slot = slots[jj];
				if (slot >= 0) a += sp[jj] * (STAGED ? lat[(size_t)jj * width + e] : cache[(size_t)slot * width + e]);
			}
			acc[c] = a;
		}
	}
	const float inv = l > 0.f ? 1.f / l : 0.f;
	__syncthreads(); // olat (q_nope) no longer read
#pragma unroll
	for (int c = 0; c < MLA_MAX_COLS; c++) {
		const int e = tid + c * MLA_THREADS;
		if (e < kvl) olat[e] = acc[c] * inv;
	}
	__syncthreads();
	// out[v] = sum_c W_UV[h][v][c] o_lat[c]; W_UV[h] is rows h*(nope+vd)+nope ..
	// Four rows a warp at once, each summed in its own lane order, so that
	// four rows' loads are in flight.
	const W *wuv = wkvb + ((size_t)h * (nope + vd) + nope) * kvl;
	for (int v0 = warp * 4; v0 < vd; v0 += nwarps * 4) {
		float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
		for (int c = lane; c < kvl; c += 32) {
			const float oc = olat[c];
#pragma unroll
			for (int r = 0; r < 4; r++)
				if (v0 + r < vd) a[r] += di_to_f32(wuv[(size_t)(v0 + r) * kvl + c]) * oc;
		}
#pragma unroll
		for (int r = 0; r < 4; r++) {
			const float v = di_warp_sum(a[r]);
			if (lane == 0 && v0 + r < vd) o[v0 + r] = v;
		}
	}
}

// di_mla_smem is di_mla_k's shared memory (see its layout above).
static size_t di_mla_smem(int kv_lora_rank, int nope_dim, int rope_dim, bool staged) {
	const size_t width = kv_lora_rank + rope_dim, lat0 = kv_lora_rank > nope_dim ? kv_lora_rank : nope_dim;
	return (width + lat0 + ATT_TILE + (staged ? ATT_TILE * width : 0)) * sizeof(float) + ATT_TILE * sizeof(int);
}

template <bool STAGED>
static int di_mla(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, di_dptr wkvb, int w_dtype, const di_attn_meta *m,
                  int num_heads, int nope_dim, int rope_dim, int kv_lora_rank, int v_head_dim, float scale) {
	const int width = kv_lora_rank + rope_dim, lat0 = kv_lora_rank > nope_dim ? kv_lora_rank : nope_dim;
	const size_t shmem = di_mla_smem(kv_lora_rank, nope_dim, rope_dim, STAGED);
	// 16-byte staging: rows of whole float4s, the tile at a 16-byte offset.
	const int vec4 = width % 4 == 0 && (width + lat0) % 4 == 0 && cache % 16 == 0;
	dim3 grid(m->num_tokens, num_heads);
	int rc = DI_OK;
	DI_DISPATCH_WEIGHT(w_dtype, W, {
		if (shmem > 48 * 1024) {
			cudaError_t e =
			    cudaFuncSetAttribute(di_mla_k<W, STAGED>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem);
			if (e != cudaSuccess) {
				rc = di_cuda_fail(ctx, e, "mla_attention: cudaFuncSetAttribute");
				break;
			}
		}
		di_mla_k<W, STAGED><<<grid, MLA_THREADS, shmem, ctx->stream>>>(
		    DI_PTR(float, out), DI_PTR(const float, q), DI_PTR(const float, cache), DI_PTR(const W, wkvb),
		    DI_PTR(const int, m->cu_seqlens_q), DI_PTR(const int, m->seqlens_k), DI_PTR(const int, m->block_tables),
		    m->num_seqs, m->max_blocks_per_seq, m->block_size, m->num_blocks, num_heads, nope_dim, rope_dim,
		    kv_lora_rank, v_head_dim, scale, vec4, ctx->check);
	});
	if (rc != DI_OK) return rc;
	return di_check_launch(ctx, "mla_attention");
}

extern "C" int di_op_mla_attention(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, di_dptr wkvb, int w_dtype,
                                   const di_attn_meta *m, int num_heads, int nope_dim, int rope_dim, int kv_lora_rank,
                                   int v_head_dim, float scale) {
	if (m->num_tokens == 0) return DI_OK;
	if (kv_lora_rank > MLA_MAX_COLS * MLA_THREADS)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "mla_attention: kv_lora_rank %d > %d", kv_lora_rank,
		               MLA_MAX_COLS * MLA_THREADS);
	const long long blocks = (long long)m->num_tokens * num_heads;
	const long long most = ctx->mla_staged_max >= 0 ? ctx->mla_staged_max : (ctx->sm_count > 0 ? ctx->sm_count : 132);
	if (blocks <= most && di_mla_smem(kv_lora_rank, nope_dim, rope_dim, true) <= 200 * 1024)
		return di_mla<true>(ctx, out, q, cache, wkvb, w_dtype, m, num_heads, nope_dim, rope_dim, kv_lora_rank,
		                    v_head_dim, scale);
	return di_mla<false>(ctx, out, q, cache, wkvb, w_dtype, m, num_heads, nope_dim, rope_dim, kv_lora_rank,
	                     v_head_dim, scale);
}
