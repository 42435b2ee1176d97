// attention.cu: paged causal attention (GQA, sliding window) and multi-head
// latent attention with weight absorption, over float32 caches laid out
// [num_blocks, block_size, width] and read through block tables.
//
// First version, chosen for being plainly right: one block of threads per
// (query row, head), keys in tiles of ATT_TILE with an online softmax, one
// warp per key for the q.k dot products and one thread per output column for
// p.v. Prefill, chunked prefill and decode are the same kernel. A row's result
// depends only on its own sequence's cache (batch-invariant); the key tiles
// start at the row's first visible key.
//
// Missing for speed (later work): tensor-core tiles for prefill (several
// query rows per block), a split-K decode kernel for long contexts, GQA
// sharing of K/V loads across the query heads of a KV head, bf16 caches.
#include <math_constants.h>

#include "common.cuh"

#define ATT_TILE 64
#define ATT_THREADS 128
#define ATT_MAX_COLS 4 // output columns per thread: head_dim <= 4*ATT_THREADS

// seq_window finds row i's sequence and visible keys [first, last); it
// returns false (and sets the check bit) when the metadata is inconsistent.
__device__ __forceinline__ bool di_seq_window(const int *cu, const int *seqlens_k, int num_seqs, int max_keys, int i,
                                              int window, int *seq, int *first, int *last) {
	const int s = di_find_seq(cu, num_seqs, i);
	const int q0 = cu[s], ql = cu[s + 1] - q0, kl = seqlens_k[s];
	const int j = i - q0;
	if (j < 0 || j >= ql || kl < ql || kl > max_keys) return false;
	*seq = s;
	*last = kl - ql + j + 1;
	*first = window > 0 ? max(0, *last - window) : 0;
	return true;
}

// load_slots fills slots[0..n) with the cache slots of keys t0.. of sequence
// s (-1 and a check bit for a block outside the cache).
__device__ __forceinline__ void di_load_slots(int *slots, const int *block_tables, int s, int max_blocks,
                                              int block_size, int num_blocks, int t0, int n, unsigned *check,
                                              unsigned bit) {
	for (int jj = threadIdx.x; jj < n; jj += blockDim.x) {
		const int t = t0 + jj;
		const int blk = block_tables[(size_t)s * max_blocks + t / block_size];
		if (blk < 0 || blk >= num_blocks) {
			atomicOr(check, bit);
			slots[jj] = -1;
		} else {
			slots[jj] = blk * block_size + t % block_size;
		}
	}
}

// online_update turns the tile's scores sp[0..n) into probabilities relative
// to the new running max (in place) and returns the factor that rescales the
// previous accumulator; m and l are the running max and sum.
__device__ __forceinline__ float di_online_update(float *sp, int n, float *m, float *l) {
	float tmax = -CUDART_INF_F;
	for (int jj = 0; jj < n; jj++) tmax = fmaxf(tmax, sp[jj]);
	const float mnew = fmaxf(*m, tmax);
	__syncthreads(); // every thread has read the raw scores
	if (mnew == -CUDART_INF_F) { // nothing valid yet: keep the state
		for (int jj = threadIdx.x; jj < n; jj += blockDim.x) sp[jj] = 0.f;
		__syncthreads();
		return 1.f;
	}
	const float alpha = expf(*m - mnew);
	for (int jj = threadIdx.x; jj < n; jj += blockDim.x) sp[jj] = expf(sp[jj] - mnew);
	__syncthreads();
	float sum = 0.f;
	for (int jj = 0; jj < n; jj++) sum += sp[jj];
	*l = *l * alpha + sum;
	*m = mnew;
	return alpha;
}

// ---------------------------------------------------------------- GQA attention

__global__ void __launch_bounds__(ATT_THREADS)
    di_attention_k(float *out, const float *q, const float *kc, const float *vc, const int *cu, const int *seqlens_k,
                   const int *block_tables, int num_seqs, int max_blocks, int block_size, int num_blocks,
                   int num_heads, int num_kv_heads, int head_dim, float scale, int window, unsigned *check) {
	extern __shared__ float smem[];
	float *sq = smem;                // [head_dim]
	float *sp = sq + head_dim;       // [ATT_TILE]
	int *slots = (int *)(sp + ATT_TILE); // [ATT_TILE]
	const int i = blockIdx.x, h = blockIdx.y;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
	const int kv_width = num_kv_heads * head_dim;
	const int kvh = h / (num_heads / num_kv_heads);
	float *o = out + ((size_t)i * num_heads + h) * head_dim;
	int s, first, last;
	if (!di_seq_window(cu, seqlens_k, num_seqs, max_blocks * block_size, i, window, &s, &first, &last)) {
		if (tid == 0) atomicOr(check, DI_CHECK_ATTENTION);
		for (int e = tid; e < head_dim; e += blockDim.x) o[e] = 0.f;
		return;
	}
	const float *qr = q + ((size_t)i * num_heads + h) * head_dim;
	for (int e = tid; e < head_dim; e += blockDim.x) sq[e] = qr[e];
	float acc[ATT_MAX_COLS];
#pragma unroll
	for (int c = 0; c < ATT_MAX_COLS; c++) acc[c] = 0.f;
	float m = -CUDART_INF_F, l = 0.f;
	for (int t0 = first; t0 < last; t0 += ATT_TILE) {
		const int n = min(ATT_TILE, last - t0);
		__syncthreads(); // previous tile fully consumed; sq written
		di_load_slots(slots, block_tables, s, max_blocks, block_size, num_blocks, t0, n, check, DI_CHECK_ATTENTION);
		__syncthreads();
		for (int jj = warp; jj < n; jj += nwarps) {
			const int slot = slots[jj];
			float dot = 0.f;
			if (slot >= 0) {
				const float *kr = kc + (size_t)slot * kv_width + kvh * head_dim;
				for (int e = lane; e < head_dim; e += 32) dot += sq[e] * kr[e];
			}
			dot = di_warp_sum(dot);
			if (lane == 0) sp[jj] = slot >= 0 ? dot * scale : -CUDART_INF_F;
		}
		__syncthreads();
		const float alpha = di_online_update(sp, n, &m, &l);
#pragma unroll
		for (int c = 0; c < ATT_MAX_COLS; c++) {
			const int e = tid + c * ATT_THREADS;
			if (e >= head_dim) break;
			float a = acc[c] * alpha;
			for (int jj = 0; jj < n; jj++) {
				const int slot = slots[jj];
				if (slot >= 0) a += sp[jj] * vc[(size_t)slot * kv_width + kvh * head_dim + e];
			}
			acc[c] = a;
		}
	}
	const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
	for (int c = 0; c < ATT_MAX_COLS; c++) {
		const int e = tid + c * ATT_THREADS;
		if (e < head_dim) o[e] = acc[c] * inv;
	}
}

extern "C" int di_op_attention(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr k_cache, di_dptr v_cache,
                               const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
                               int sliding_window) {
	if (m->num_tokens == 0) return DI_OK;
	if (head_dim > ATT_MAX_COLS * ATT_THREADS)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "attention: head_dim %d > %d", head_dim, ATT_MAX_COLS * ATT_THREADS);
	if (m->num_tokens > 0x7fffffff || num_heads > 65535)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "attention: grid %d x %d", m->num_tokens, num_heads);
	const size_t shmem = (head_dim + ATT_TILE) * sizeof(float) + ATT_TILE * sizeof(int);
	dim3 grid(m->num_tokens, num_heads);
	di_attention_k<<<grid, ATT_THREADS, shmem, ctx->stream>>>(
	    DI_PTR(float, out), DI_PTR(const float, q), DI_PTR(const float, k_cache), DI_PTR(const float, v_cache),
	    DI_PTR(const int, m->cu_seqlens_q), DI_PTR(const int, m->seqlens_k), DI_PTR(const int, m->block_tables),
	    m->num_seqs, m->max_blocks_per_seq, m->block_size, m->num_blocks, num_heads, num_kv_heads, head_dim, scale,
	    sliding_window, ctx->check);
	return di_check_launch(ctx, "attention");
}

// ---------------------------------------------------------------- MLA

#define MLA_THREADS 256
#define MLA_MAX_COLS 4 // latent columns per thread: kv_lora_rank <= 4*MLA_THREADS

// One block per (query row, head). Shared memory: the absorbed query
// [kv_lora_rank + rope_dim], q_nope [nope_dim] (reused for the latent output),
// the tile's scores and slots.
template <typename W>
__global__ void __launch_bounds__(MLA_THREADS)
    di_mla_k(float *out, const float *q, const float *cache, const W *wkvb, const int *cu, const int *seqlens_k,
             const int *block_tables, int num_seqs, int max_blocks, int block_size, int num_blocks, int num_heads,
             int nope, int rope, int kvl, int vd, float scale, unsigned *check) {
	extern __shared__ float smem[];
	const int width = kvl + rope;
	float *qx = smem;                   // [width]
	float *olat = qx + width;           // [max(kvl, nope)]
	float *sp = olat + max(kvl, nope);  // [ATT_TILE]
	int *slots = (int *)(sp + ATT_TILE); // [ATT_TILE]
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
		for (int d = 0; d < nope; d++) a += di_to_f32(wuk[(size_t)d * kvl + c]) * olat[d];
		qx[c] = a;
	}
	float acc[MLA_MAX_COLS];
#pragma unroll
	for (int c = 0; c < MLA_MAX_COLS; c++) acc[c] = 0.f;
	float m = -CUDART_INF_F, l = 0.f;
	for (int t0 = first; t0 < last; t0 += ATT_TILE) {
		const int n = min(ATT_TILE, last - t0);
		__syncthreads();
		di_load_slots(slots, block_tables, s, max_blocks, block_size, num_blocks, t0, n, check, DI_CHECK_MLA);
		__syncthreads();
		for (int jj = warp; jj < n; jj += nwarps) {
			const int slot = slots[jj];
			float dot = 0.f;
			if (slot >= 0) {
				const float *kr = cache + (size_t)slot * width;
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
				if (slot >= 0) a += sp[jj] * cache[(size_t)slot * width + e];
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
	const W *wuv = wkvb + ((size_t)h * (nope + vd) + nope) * kvl;
	for (int v = warp; v < vd; v += nwarps) {
		const W *row = wuv + (size_t)v * kvl;
		float a = 0.f;
		for (int c = lane; c < kvl; c += 32) a += di_to_f32(row[c]) * olat[c];
		a = di_warp_sum(a);
		if (lane == 0) o[v] = a;
	}
}

extern "C" int di_op_mla_attention(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, di_dptr wkvb, int w_dtype,
                                   const di_attn_meta *m, int num_heads, int nope_dim, int rope_dim, int kv_lora_rank,
                                   int v_head_dim, float scale) {
	if (m->num_tokens == 0) return DI_OK;
	if (kv_lora_rank > MLA_MAX_COLS * MLA_THREADS)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "mla_attention: kv_lora_rank %d > %d", kv_lora_rank,
		               MLA_MAX_COLS * MLA_THREADS);
	const int width = kv_lora_rank + rope_dim;
	const size_t shmem =
	    (width + (kv_lora_rank > nope_dim ? kv_lora_rank : nope_dim) + ATT_TILE) * sizeof(float) + ATT_TILE * sizeof(int);
	if (shmem > 48 * 1024) return di_fail(ctx, DI_ERR_UNSUPPORTED, "mla_attention: %zu bytes of shared memory", shmem);
	dim3 grid(m->num_tokens, num_heads);
	DI_DISPATCH_WEIGHT(w_dtype, W,
	                   di_mla_k<W><<<grid, MLA_THREADS, shmem, ctx->stream>>>(
	                       DI_PTR(float, out), DI_PTR(const float, q), DI_PTR(const float, cache),
	                       DI_PTR(const W, wkvb), DI_PTR(const int, m->cu_seqlens_q), DI_PTR(const int, m->seqlens_k),
	                       DI_PTR(const int, m->block_tables), m->num_seqs, m->max_blocks_per_seq, m->block_size,
	                       m->num_blocks, num_heads, nope_dim, rope_dim, kv_lora_rank, v_head_dim, scale,
	                       ctx->check));
	return di_check_launch(ctx, "mla_attention");
}
