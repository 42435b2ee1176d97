// attention.cu: paged causal attention (GQA, sliding window) and multi-head
// latent attention with weight absorption, over caches laid out
// [num_blocks, block_size, width] and read through block tables: float32,
// IEEE half or (GQA, opt-in) 8-bit E4M3 elements.
//
// GQA attention has split-over-keys decode kernels (tensor cores with half
// inputs for 16-bit models in GEMM mode round: the keys as the tile rows for
// groups of up to 8 query heads, the heads as the rows otherwise; float32
// CUDA cores for the rest), query-tiled prefill kernels (tensor cores, or
// float32 CUDA cores) and the first, plain one (one block per (row, head))
// as the fallback for large head sizes; see the section below for which
// rows go where and why each row's result is independent of its batch. All
// accumulate in float32. MLA is one block per (row, head); small grids
// stage its keys in shared memory a tile at a time (the same bits).
//
// Missing for speed (later work): a wgmma prefill kernel; an MLA kernel
// that reads each latent row once for all heads (split over keys).
#include <math_constants.h>

#include <type_traits>

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

// di_key_slot is the cache slot of key t of the sequence whose block-table
// row is bt: -1, with bit set in *check, for a block outside the cache.
__device__ __forceinline__ int di_key_slot(const int *bt, int t, int block_size, int num_blocks, unsigned *check,
                                           unsigned bit) {
	const int blk = bt[t / block_size];
	if (blk < 0 || blk >= num_blocks) {
		atomicOr(check, bit);
		return -1;
	}
	return blk * block_size + t % block_size;
}

// load_slots fills slots[0..n) with the cache slots of keys t0.. of sequence
// s (di_key_slot).
__device__ __forceinline__ void di_load_slots(int *slots, const int *block_tables, int s, int max_blocks,
                                              int block_size, int num_blocks, int t0, int n, unsigned *check,
                                              unsigned bit) {
	for (int jj = threadIdx.x; jj < n; jj += blockDim.x)
		slots[jj] = di_key_slot(block_tables + (size_t)s * max_blocks, t0 + jj, block_size, num_blocks, check, bit);
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
//
// Three kernels, picked per sequence so that a row's result never depends on
// its batch neighbours:
//   - Decode rows (a sequence with one query row this step): di_decode_attn_k
//     splits the row's keys into at most DEC_MAX_SPLITS chunks whose length is
//     a function of the row's own key count (di_dec_chunk), one block per
//     (chunk, KV head, sequence) computing every query head of that KV head
//     from one read of its keys and values; di_decode_combine_k merges the
//     chunks in ascending order. The grid may hold more chunks than a row
//     uses (an eager batch sizes it from its block tables, a captured graph
//     from its static ones): unused chunks are empty and skipped, so the bits
//     do not change.
//   - Prefill rows (a sequence with two or more query rows): with 16-bit
//     inputs allowed, head size 64 or 128 and GEMM mode round,
//     di_prefill_attn_tc_k (tensor cores; see its section); otherwise
//     di_prefill_attn_k tiles PF_BQ query rows of one head against PF_BK keys held in shared
//     memory, with key tiles aligned to absolute key positions and each row's
//     scores summed in a fixed order; a row's result depends only on its own
//     visible keys, so a chunked prefill gives the bits of a whole one.
//   - di_attention_k (one block per (row, head)) serves prefill rows whose
//     head_dim exceeds PF_MAX_D, and decode rows whose head_dim exceeds
//     DEC_MAX_D.
// A decode row and the same row computed inside a longer prefill chunk go
// through different kernels and agree to rounding, not bit for bit.

// di_outp is an attention output: float32 (dtype DI_F32), or the float32
// results rounded to nearest into BF16 or F16 (the 16-bit input of the o
// projection that reads it; kernels.LinearInputer): the bits of a float32
// output narrowed afterwards. Indices are elements.
struct di_outp {
	void *p;
	int dtype;
	__device__ __forceinline__ void put(size_t i, float v) const {
		if (dtype == DI_BF16) static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
		else if (dtype == DI_F16) static_cast<__half *>(p)[i] = __float2half_rn(v);
		else static_cast<float *>(p)[i] = v;
	}
	// put2 writes elements i and i + 1 (i even).
	__device__ __forceinline__ void put2(size_t i, float a, float b) const {
		if (dtype == DI_BF16)
			*reinterpret_cast<__nv_bfloat162 *>(static_cast<__nv_bfloat16 *>(p) + i) = __floats2bfloat162_rn(a, b);
		else if (dtype == DI_F16)
			*reinterpret_cast<__half2 *>(static_cast<__half *>(p) + i) = __floats2half2_rn(a, b);
		else
			*reinterpret_cast<float2 *>(static_cast<float *>(p) + i) = make_float2(a, b);
	}
};

__device__ __forceinline__ float di_warp_max(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// di_load4 reads four consecutive cache elements as float32: 16 bytes of a
// float32 cache or 8 bytes of a half cache (aligned).
__device__ __forceinline__ float4 di_load4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ float4 di_load4(const __nv_fp8_e4m3 *p) { // 4 bytes, 4-byte aligned
	const uint32_t u = *reinterpret_cast<const uint32_t *>(p);
	const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
	const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> 16), __NV_E4M3);
	return make_float4(__half2float(__half(__half_raw{a.x})), __half2float(__half(__half_raw{a.y})),
	                   __half2float(__half(__half_raw{b.x})), __half2float(__half(__half_raw{b.y})));
}
__device__ __forceinline__ float4 di_load4(const __half *p) {
	const uint2 u = *reinterpret_cast<const uint2 *>(p);
	const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x));
	const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
	return make_float4(a.x, a.y, b.x, b.y);
}

template <typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    di_attention_k(float *out, const float *q, const T *kc, const T *vc, const int *cu, const int *seqlens_k,
                   const int *block_tables, int num_seqs, int max_blocks, int block_size, int num_blocks,
                   int num_heads, int num_kv_heads, int head_dim, float scale, int window, int skip_decode,
                   unsigned *check) {
	extern __shared__ float smem[];
	float *sq = smem;                    // [head_dim]
	float *sp = sq + head_dim;           // [ATT_TILE]
	int *slots = (int *)(sp + ATT_TILE); // [ATT_TILE]
	const int i = blockIdx.x, h = blockIdx.y;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
	const int kv_width = num_kv_heads * head_dim;
	const int kvh = h / (num_heads / num_kv_heads);
	float *o = out + ((size_t)i * num_heads + h) * head_dim;
	if (skip_decode) { // decode rows belong to di_decode_attn_k
		const int s0 = di_find_seq(cu, num_seqs, i);
		if (cu[s0 + 1] - cu[s0] == 1) return;
	}
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
				const T *kr = kc + (size_t)slot * kv_width + kvh * head_dim;
				for (int e = lane; e < head_dim; e += 32) dot += sq[e] * di_to_f32(kr[e]);
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
				if (slot >= 0) a += sp[jj] * di_to_f32(vc[(size_t)slot * kv_width + kvh * head_dim + e]);
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

// ---------------------------------------------------------------- decode: split over keys

#define DEC_THREADS 128
#define DEC_MAX_SPLITS 32   // chunks per row at most
#define DEC_MIN_CHUNK 128   // keys per chunk at least (ctx->dec_chunk may ask more)
#define DEC_CHUNK_ALIGN DI_DEC_CHUNK_ALIGN // chunk lengths are multiples of this
#define DEC_GROUP 8         // query heads (of one KV head) per block at most
#define DEC_MAX_D 256
#define DEC_TILE 4096 // floats of one staged key (or value) sub-tile: keys * head_dim
#define DEC_MAX_SUB 128
#define DEC_MAX_OUT (DEC_GROUP * DEC_MAX_D / DEC_THREADS) // outputs per thread

#define DEC_SHORT_KEYS 512 // rows of at most this many keys take chunks of DEC_MIN_CHUNK

// di_dec_chunk is the chunk length, in key positions, of a decode row with kl
// keys: chunk c holds keys [c*len, (c+1)*len). A function of kl alone. A
// short row (at most DEC_SHORT_KEYS keys, so at most 4 chunks) takes the
// shortest chunks whatever min_chunk says: its time is the latency of a
// chunk's pipeline, not bandwidth (Llama-3.2-1B batch 1 at 257 keys: 0.935
// -> 0.912 ms a step with 128 instead of 256); longer rows keep min_chunk's
// longer pipelines, which read faster (a bound of 1024 keys cost the
// Qwen3-0.6B offline workload 4%; 512 costs nothing measurable).
__host__ __device__ __forceinline__ int di_dec_chunk(int kl, int min_chunk) {
	if (kl <= DEC_SHORT_KEYS) return DEC_MIN_CHUNK;
	int c = (kl + DEC_MAX_SPLITS - 1) / DEC_MAX_SPLITS;
	c = (c + DEC_CHUNK_ALIGN - 1) / DEC_CHUNK_ALIGN * DEC_CHUNK_ALIGN;
	return c > min_chunk ? c : min_chunk;
}

// di_dec_sub is the number of keys staged in shared memory at a time: the
// largest power of two with sub*head_dim <= DEC_TILE, at most DEC_MAX_SUB
// (it divides DEC_CHUNK_ALIGN). A function of head_dim alone.
__host__ __device__ __forceinline__ int di_dec_sub(int head_dim) {
	int s = DEC_MAX_SUB;
	while (s > 1 && s * head_dim > DEC_TILE) s >>= 1;
	return s;
}

// One block per (chunk, KV head and head group, sequence). Each sub-tile of
// keys and values is staged in shared memory with every load in flight at
// once; the block then scores it for all its query heads, updates the
// running max and sum per head and accumulates p.v. It writes, per query
// head, the chunk's max and sum (part_ml) and its unnormalized output
// (part_acc), laid out [seq][head][chunk](...): an empty chunk writes max
// -inf and sum 0.
template <typename T>
__global__ void __launch_bounds__(DEC_THREADS, 4)
    di_decode_attn_k(float *part_acc, float2 *part_ml, const float *q, const T *kc, const T *vc,
                     const int *cu, const int *seqlens_k, const int *block_tables, int max_blocks, int block_size,
                     int num_blocks, int num_heads, int num_kv_heads, int head_dim, float scale, int window,
                     int decode_only, int vec4, int min_chunk, unsigned *check) {
	__shared__ __align__(16) float vs[DEC_TILE];               // [sub][head_dim]
	__shared__ float ks[DEC_TILE + DEC_MAX_SUB];                // [sub][head_dim+1]
	__shared__ float sq[DEC_GROUP * DEC_MAX_D];                 // [head][head_dim]
	__shared__ float sp[DEC_GROUP * DEC_MAX_SUB];               // [head][sub]
	__shared__ int slots[DEC_MAX_SUB];
	__shared__ float sm_m[DEC_GROUP], sm_l[DEC_GROUP], sm_alpha[DEC_GROUP];
	const int c = blockIdx.x, s = blockIdx.z, nsplit = gridDim.x;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int group = num_heads / num_kv_heads, subs = (group + DEC_GROUP - 1) / DEC_GROUP;
	const int kvh = blockIdx.y / subs;
	const int h0 = kvh * group + (blockIdx.y % subs) * DEC_GROUP;
	const int gb = min(DEC_GROUP, (kvh + 1) * group - h0);
	const int q0 = cu[s], ql = cu[s + 1] - q0;
	if (ql != 1) {
		if (decode_only && ql != 0 && c == 0 && blockIdx.y == 0 && tid == 0) atomicOr(check, DI_CHECK_ATTENTION);
		return;
	}
	const int kl = seqlens_k[s];
	const bool bad = kl < 1 || kl > max_blocks * block_size;
	const int len = di_dec_chunk(kl, min_chunk);
	const int first = window > 0 ? max(0, kl - window) : 0;
	const int t_lo = max(first, c * len), t_hi = min(kl, (c + 1) * len);
	float2 *ml = part_ml + ((size_t)s * num_heads + h0) * nsplit + c; // head hh at ml[hh*nsplit]
	if (bad || t_lo >= t_hi) {
		if (bad && c == 0 && blockIdx.y == 0 && tid == 0) atomicOr(check, DI_CHECK_ATTENTION);
		if (tid < gb) ml[(size_t)tid * nsplit] = make_float2(-CUDART_INF_F, 0.f);
		return;
	}
	const int kv_width = num_kv_heads * head_dim, nout = gb * head_dim;
	const int sub = di_dec_sub(head_dim), ld = head_dim + 1;
	const float *qr = q + ((size_t)q0 * num_heads + h0) * head_dim;
	for (int i = tid; i < nout; i += DEC_THREADS) sq[i] = qr[i];
	if (tid < DEC_GROUP) {
		sm_m[tid] = -CUDART_INF_F;
		sm_l[tid] = 0.f;
	}
	// Outputs of this thread: o = tid + k*DEC_THREADS, head o/head_dim, column o%head_dim.
	float acc[DEC_MAX_OUT];
#pragma unroll
	for (int k = 0; k < DEC_MAX_OUT; k++) acc[k] = 0.f;
	const T *kbase = kc + kvh * head_dim, *vbase = vc + kvh * head_dim;
	// The first sub-tile starts at the chunk's first key rounded down to a
	// multiple of sub (absolute positions), so that the sub-tiles of a row do
	// not depend on the window.
	for (int t0 = t_lo / sub * sub; t0 < t_hi; t0 += sub) {
		__syncthreads(); // the previous sub-tile is consumed; sq and the state are written
		if (tid < sub) {
			const int t = t0 + tid;
			slots[tid] = t >= t_lo && t < t_hi ? di_key_slot(block_tables + (size_t)s * max_blocks, t, block_size,
			                                                 num_blocks, check, DI_CHECK_ATTENTION)
			                                   : -1;
		}
		__syncthreads();
		// Stage keys and values: four loads of each in flight per thread.
		if (vec4) {
			const int per_row = head_dim / 4, total = sub * per_row;
			for (int f0 = tid; f0 < total; f0 += DEC_THREADS * 4) {
				float4 kv[4], vv[4];
#pragma unroll
				for (int u = 0; u < 4; u++) {
					const int f = f0 + u * DEC_THREADS;
					kv[u] = vv[u] = make_float4(0.f, 0.f, 0.f, 0.f);
					if (f < total) {
						const int r = f / per_row, e = (f - r * per_row) * 4, sl = slots[r];
						if (sl >= 0) {
							kv[u] = di_load4(kbase + (size_t)sl * kv_width + e);
							vv[u] = di_load4(vbase + (size_t)sl * kv_width + e);
						}
					}
				}
#pragma unroll
				for (int u = 0; u < 4; u++) {
					const int f = f0 + u * DEC_THREADS;
					if (f < total) {
						const int r = f / per_row, e = (f - r * per_row) * 4;
						float *kd = ks + r * ld + e;
						kd[0] = kv[u].x, kd[1] = kv[u].y, kd[2] = kv[u].z, kd[3] = kv[u].w;
						*reinterpret_cast<float4 *>(vs + r * head_dim + e) = vv[u];
					}
				}
			}
		} else {
			const int total = sub * head_dim;
			for (int f0 = tid; f0 < total; f0 += DEC_THREADS * 4) {
				float kv[4], vv[4];
#pragma unroll
				for (int u = 0; u < 4; u++) {
					const int f = f0 + u * DEC_THREADS;
					kv[u] = vv[u] = 0.f;
					if (f < total) {
						const int r = f / head_dim, e = f - r * head_dim, sl = slots[r];
						if (sl >= 0) {
							kv[u] = di_to_f32(kbase[(size_t)sl * kv_width + e]);
							vv[u] = di_to_f32(vbase[(size_t)sl * kv_width + e]);
						}
					}
				}
#pragma unroll
				for (int u = 0; u < 4; u++) {
					const int f = f0 + u * DEC_THREADS;
					if (f < total) {
						const int r = f / head_dim, e = f - r * head_dim;
						ks[r * ld + e] = kv[u];
						vs[r * head_dim + e] = vv[u];
					}
				}
			}
		}
		__syncthreads();
		// Scores: pair p = (head p/sub, key p%sub), summed over e in order.
		for (int p = tid; p < gb * sub; p += DEC_THREADS) {
			const int hh = p / sub, j = p - hh * sub;
			float dot = 0.f;
			if (slots[j] >= 0) {
				const float *kr = ks + j * ld, *qh = sq + hh * head_dim;
				for (int e = 0; e < head_dim; e++) dot += qh[e] * kr[e];
			}
			sp[hh * sub + j] = slots[j] >= 0 ? dot * scale : -CUDART_INF_F;
		}
		__syncthreads();
		// Online softmax per head: one warp per head.
		for (int hh = warp; hh < gb; hh += DEC_THREADS / 32) {
			float *row = sp + hh * sub;
			float mx = -CUDART_INF_F;
			for (int j = lane; j < sub; j += 32) mx = fmaxf(mx, row[j]);
			mx = di_warp_max(mx);
			const float m_old = sm_m[hh], m_new = fmaxf(m_old, mx);
			float alpha = 1.f, sum = 0.f;
			if (m_new != -CUDART_INF_F) {
				alpha = expf(m_old - m_new); // 0 while nothing was seen
				for (int j = lane; j < sub; j += 32) {
					const float pj = expf(row[j] - m_new);
					row[j] = pj;
					sum += pj;
				}
			} else {
				for (int j = lane; j < sub; j += 32) row[j] = 0.f;
			}
			sum = di_warp_sum(sum);
			if (lane == 0) {
				sm_l[hh] = sm_l[hh] * alpha + sum;
				sm_m[hh] = m_new;
				sm_alpha[hh] = alpha;
			}
		}
		__syncthreads();
#pragma unroll
		for (int k = 0; k < DEC_MAX_OUT; k++) {
			const int o = tid + k * DEC_THREADS, hh = o / head_dim;
			if (o < nout) {
				const float *pr = sp + hh * sub;
				const float *vcol = vs + (o - hh * head_dim);
				float a = acc[k] * sm_alpha[hh];
				for (int j = 0; j < sub; j++) a += pr[j] * vcol[j * head_dim];
				acc[k] = a;
			}
		}
	}
	float *pa = part_acc + (((size_t)s * num_heads + h0) * nsplit + c) * head_dim;
#pragma unroll
	for (int k = 0; k < DEC_MAX_OUT; k++) {
		const int o = tid + k * DEC_THREADS, hh = o / head_dim;
		if (o < nout) pa[(size_t)hh * nsplit * head_dim + (o - hh * head_dim)] = acc[k];
	}
	if (tid < gb) ml[(size_t)tid * nsplit] = make_float2(sm_m[tid], sm_l[tid]);
}

// One block per (sequence, head): merges the non-empty chunks of a decode row
// in ascending order and writes the normalized output.
__global__ void di_decode_combine_k(di_outp out, const float *part_acc, const float2 *part_ml, const int *cu,
                                    int num_heads, int head_dim, int nsplit) {
	di_pdl_trigger(); // the next kernel (usually a GEMV) streams its weights meanwhile
	di_pdl_wait();
	__shared__ float w[DEC_MAX_SPLITS];
	__shared__ float inv_l;
	const int s = blockIdx.x, h = blockIdx.y;
	const int q0 = cu[s];
	if (cu[s + 1] - q0 != 1) return;
	__shared__ float sum[DEC_MAX_SPLITS];
	const float2 *ml = part_ml + ((size_t)s * num_heads + h) * nsplit;
	// The first warp loads the chunks' (max, sum) pairs at once, one a lane
	// (nsplit <= DEC_MAX_SPLITS = 32), and weighs them; lane 0 adds the
	// weighted sums in chunk order.
	if (threadIdx.x < 32) {
		const int c = threadIdx.x;
		const float2 v = c < nsplit ? ml[c] : make_float2(-CUDART_INF_F, 0.f);
		float mx = v.y > 0.f ? v.x : -CUDART_INF_F;
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
		const float wc = v.y > 0.f ? expf(v.x - mx) : 0.f;
		if (c < nsplit) w[c] = wc, sum[c] = v.y;
		__syncwarp();
		if (c == 0) {
			float l = 0.f;
			for (int k = 0; k < nsplit; k++) l += sum[k] * w[k];
			inv_l = l > 0.f ? 1.f / l : 0.f;
		}
	}
	__syncthreads();
	const float *pa = part_acc + ((size_t)s * num_heads + h) * nsplit * head_dim;
	const size_t o = ((size_t)q0 * num_heads + h) * head_dim;
	for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
		float a = 0.f;
		for (int c = 0; c < nsplit; c++)
			if (w[c] > 0.f) a += pa[(size_t)c * head_dim + e] * w[c];
		out.put(o + e, a * inv_l);
	}
}

// di_stage_rows copies rows of head_dim floats into shared memory: row r
// from base + rowsel[r]*stride (zeros where rowsel[r] < 0) to dst + r*ld.
// Each thread keeps four loads in flight; vec4 (head_dim a multiple of 4,
// 16-byte aligned rows) loads float4s.
template <typename T>
__device__ __forceinline__ void di_stage_rows(float *dst, int ld, const T *base, size_t stride, const int *rowsel,
                                              int rows, int head_dim, int vec4) {
	const int nt = blockDim.x, tid = threadIdx.x;
	if (vec4) {
		const int per = head_dim / 4, total = rows * per;
		for (int f0 = tid; f0 < total; f0 += nt * 4) {
			float4 v[4];
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int f = f0 + u * nt;
				v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
				if (f < total) {
					const int r = f / per, e = (f - r * per) * 4, sl = rowsel[r];
					if (sl >= 0) v[u] = di_load4(base + (size_t)sl * stride + e);
				}
			}
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int f = f0 + u * nt;
				if (f < total) {
					const int r = f / per, e = (f - r * per) * 4;
					float *d = dst + r * ld + e;
					d[0] = v[u].x, d[1] = v[u].y, d[2] = v[u].z, d[3] = v[u].w;
				}
			}
		}
	} else {
		const int total = rows * head_dim;
		for (int f0 = tid; f0 < total; f0 += nt * 4) {
			float v[4];
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int f = f0 + u * nt;
				v[u] = 0.f;
				if (f < total) {
					const int r = f / head_dim, sl = rowsel[r];
					if (sl >= 0) v[u] = di_to_f32(base[(size_t)sl * stride + (f - r * head_dim)]);
				}
			}
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int f = f0 + u * nt;
				if (f < total) {
					const int r = f / head_dim;
					dst[r * ld + (f - r * head_dim)] = v[u];
				}
			}
		}
	}
}

// di_prefill_rows is a prefill block's query rows: find takes query tile
// number b over the prefill sequences (two or more query rows), tiles of
// bq rows, the last (longest) tile of each sequence first. It returns false
// for b past the last tile, and for a sequence whose key count is below its
// query count or above max_keys (its block table's reach): that is
// reported to check and the tile's rows of heads [h0, h0+nh) of out (rows
// of num_heads x head_dim floats) are zeroed. Every thread calls it;
// the first warp walks the sequences.
struct di_prefill_rows {
	int s, q0, ql, kl; // the sequence, its first query row, query and key counts
	int j0, nq;        // the tile's first row within the sequence and its row count
	__device__ __forceinline__ bool find(const int *cu, const int *seqlens_k, int num_seqs, int bq, int b,
	                                     int max_keys, di_outp out, int num_heads, int h0, int nh, int head_dim,
	                                     unsigned *check) {
		__shared__ int s_seq, s_tile;
		// The first warp walks the sequences 32 at a time: each lane takes
		// one sequence's tile count, an inclusive scan over the lanes and a
		// ballot find the sequence holding tile b. (One thread walking them
		// in turn paid a load's latency per sequence: in a mixed step, every
		// prefill block first walked past all the decode rows.)
		if (threadIdx.x < 32) {
			const int lane = threadIdx.x;
			int sq = -1, t = 0;
			for (int base = 0; base < num_seqs; base += 32) {
				const int si = base + lane;
				int nt = 0;
				if (si < num_seqs) {
					const int n = cu[si + 1] - cu[si];
					nt = n < 2 ? 0 : (n + bq - 1) / bq;
				}
				int incl = nt;
#pragma unroll
				for (int o = 1; o < 32; o <<= 1) {
					const int v = __shfl_up_sync(0xffffffffu, incl, o);
					if (lane >= o) incl += v;
				}
				const unsigned hit = __ballot_sync(0xffffffffu, b < incl);
				if (hit) {
					const int l = __ffs(hit) - 1;
					const int before = __shfl_sync(0xffffffffu, incl - nt, l), ntl = __shfl_sync(0xffffffffu, nt, l);
					sq = base + l;
					t = ntl - 1 - (b - before);
					break;
				}
				b -= __shfl_sync(0xffffffffu, incl, 31);
			}
			if (lane == 0) s_seq = sq, s_tile = t;
		}
		__syncthreads();
		s = s_seq;
		if (s < 0) return false;
		q0 = cu[s], ql = cu[s + 1] - q0, kl = seqlens_k[s];
		j0 = s_tile * bq, nq = min(bq, ql - j0);
		if (kl >= ql && kl <= max_keys) return true;
		if (threadIdx.x == 0) atomicOr(check, DI_CHECK_ATTENTION);
		const int w = nh * head_dim; // the heads are adjacent in a row
		for (int idx = threadIdx.x; idx < nq * w; idx += blockDim.x) {
			const int r = idx / w;
			out.put(((size_t)(q0 + j0 + r) * num_heads + h0) * head_dim + idx - r * w, 0.f);
		}
		return false;
	}
};

// ---------------------------------------------------------------- prefill: query tiles

#define PF_BQ 64
#define PF_BK 64
#define PF_THREADS 128 // 16 x 8: thread (ty, tx) owns rows ty*4.. +4, key columns tx + 8*j
#define PF_MAX_D 128
#define PF_OUT (PF_MAX_D / 8) // output columns per thread: tx + 8*k

static size_t di_prefill_smem(int head_dim) {
	const int ld = head_dim + 1;
	return (size_t)(PF_BQ * ld + PF_BK * ld + PF_BQ * (PF_BK + 1)) * sizeof(float) + PF_BK * sizeof(int);
}

// One block per (query tile of a prefill sequence, head). Shared memory: the
// query tile [PF_BQ][head_dim+1], one key or value tile [PF_BK][head_dim+1],
// the probabilities [PF_BQ][PF_BK+1] and the tile's cache slots.
template <typename T>
__global__ void __launch_bounds__(PF_THREADS)
    di_prefill_attn_k(float *out, const float *q, const T *kc, const T *vc, const int *cu,
                      const int *seqlens_k, const int *block_tables, int num_seqs, int max_blocks, int block_size,
                      int num_blocks, int num_heads, int num_kv_heads, int head_dim, float scale, int window,
                      int vec4, unsigned *check) {
	extern __shared__ float smem[];
	const int ld = head_dim + 1;
	float *Qs = smem, *KVs = Qs + PF_BQ * ld, *Ps = KVs + PF_BK * ld;
	int *slots = (int *)(Ps + PF_BQ * (PF_BK + 1));
	const int tid = threadIdx.x, ty = tid >> 3, tx = tid & 7;
	const int h = blockIdx.y, kvh = h / (num_heads / num_kv_heads);
	di_prefill_rows pr;
	if (!pr.find(cu, seqlens_k, num_seqs, PF_BQ, blockIdx.x, max_blocks * block_size, di_outp{out, DI_F32}, num_heads, h, 1, head_dim,
	             check))
		return;
	const int s = pr.s, q0 = pr.q0, ql = pr.ql, kl = pr.kl, j0 = pr.j0, nq = pr.nq;
	const int kv_width = num_kv_heads * head_dim;
	if (tid < PF_BQ) slots[tid] = tid < nq ? q0 + j0 + tid : -1; // query rows, for staging
	__syncthreads();
	di_stage_rows(Qs, ld, q + (size_t)h * head_dim, (size_t)num_heads * head_dim, slots, PF_BQ, head_dim, vec4);
	// Visible keys [first, last) of this thread's rows; rows past nq see none.
	int first[4], last[4];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const int r = ty * 4 + i;
		last[i] = r < nq ? kl - ql + j0 + r + 1 : 0;
		first[i] = window > 0 ? max(0, last[i] - window) : 0;
	}
	const int k_hi = kl - ql + j0 + nq;
	const int k_lo = window > 0 ? max(0, kl - ql + j0 + 1 - window) : 0;
	float m[4], l[4], o[4][PF_OUT];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		m[i] = -CUDART_INF_F;
		l[i] = 0.f;
#pragma unroll
		for (int k = 0; k < PF_OUT; k++) o[i][k] = 0.f;
	}
	for (int t0 = k_lo / PF_BK * PF_BK; t0 < k_hi; t0 += PF_BK) {
		const int n = min(PF_BK, k_hi - t0);
		__syncthreads(); // the previous tile's values and probabilities are consumed; Qs written
		if (tid < PF_BK)
			slots[tid] = tid < n ? di_key_slot(block_tables + (size_t)s * max_blocks, t0 + tid, block_size, num_blocks,
			                                   check, DI_CHECK_ATTENTION)
			                     : -1;
		__syncthreads();
		di_stage_rows(KVs, ld, kc + kvh * head_dim, kv_width, slots, PF_BK, head_dim, vec4);
		__syncthreads();
		float sc[4][8];
#pragma unroll
		for (int i = 0; i < 4; i++)
#pragma unroll
			for (int j = 0; j < 8; j++) sc[i][j] = 0.f;
		for (int e = 0; e < head_dim; e++) {
			float a[4], b[8];
#pragma unroll
			for (int i = 0; i < 4; i++) a[i] = Qs[(ty * 4 + i) * ld + e];
#pragma unroll
			for (int j = 0; j < 8; j++) b[j] = KVs[(tx + 8 * j) * ld + e];
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < 8; j++) sc[i][j] += a[i] * b[j];
		}
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float mx = -CUDART_INF_F;
#pragma unroll
			for (int j = 0; j < 8; j++) {
				const int kk = tx + 8 * j, t = t0 + kk;
				const bool vis = kk < n && slots[kk] >= 0 && t >= first[i] && t < last[i];
				sc[i][j] = vis ? sc[i][j] * scale : -CUDART_INF_F;
				mx = fmaxf(mx, sc[i][j]);
			}
#pragma unroll
			for (int x = 1; x < 8; x <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
			const float m_new = fmaxf(m[i], mx);
			float alpha = 1.f, sum = 0.f;
			if (m_new != -CUDART_INF_F) {
				alpha = expf(m[i] - m_new);
#pragma unroll
				for (int j = 0; j < 8; j++) {
					sc[i][j] = expf(sc[i][j] - m_new);
					sum += sc[i][j];
				}
			} else {
#pragma unroll
				for (int j = 0; j < 8; j++) sc[i][j] = 0.f;
			}
#pragma unroll
			for (int x = 1; x < 8; x <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
			l[i] = l[i] * alpha + sum;
			m[i] = m_new;
#pragma unroll
			for (int k = 0; k < PF_OUT; k++) o[i][k] *= alpha;
#pragma unroll
			for (int j = 0; j < 8; j++) Ps[(ty * 4 + i) * (PF_BK + 1) + tx + 8 * j] = sc[i][j];
		}
		__syncthreads(); // keys consumed, probabilities written
		di_stage_rows(KVs, ld, vc + kvh * head_dim, kv_width, slots, PF_BK, head_dim, vec4);
		__syncthreads();
		for (int kk = 0; kk < n; kk++) {
			float p[4];
#pragma unroll
			for (int i = 0; i < 4; i++) p[i] = Ps[(ty * 4 + i) * (PF_BK + 1) + kk];
#pragma unroll
			for (int k = 0; k < PF_OUT; k++) {
				const int e = tx + 8 * k;
				if (e < head_dim) {
					const float v = KVs[kk * ld + e];
#pragma unroll
					for (int i = 0; i < 4; i++) o[i][k] += p[i] * v;
				}
			}
		}
	}
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const int r = ty * 4 + i;
		if (r >= nq) continue;
		const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
		float *orow = out + ((size_t)(q0 + j0 + r) * num_heads + h) * head_dim;
#pragma unroll
		for (int k = 0; k < PF_OUT; k++) {
			const int e = tx + 8 * k;
			if (e < head_dim) orow[e] = o[i][k] * inv;
		}
	}
}

// ---------------------------------------------------------------- prefill: tensor cores
//
// di_prefill_attn_tc_k is the prefill kernel for models whose weights are
// 16-bit (AttentionParams.InputDType BF16 or F16) when the backend rounds
// activations (GEMM mode round): q, k, v and the probabilities enter
// mma.sync m16n8k16 as IEEE half (10 mantissa bits, more than bf16's 7;
// values beyond +-65504 overflow to infinity, which the output shows as
// inf or NaN), with float32 accumulation and a float32 online softmax.
// One block of TC_WARPS warps takes TC_BQ query rows of one head (16 rows a
// warp) against TC_BK-key tiles staged in shared memory, converted from the
// float32 cache once per block, and each warp runs di_tc16_tile over
// them, as the half-cache kernels do over their copies. Key tiles are
// aligned to absolute positions and every output element is a fixed
// sequence of tensor-core products, so, as with di_prefill_attn_k, a row's
// bits do not depend on its batch or on how its prompt is chunked.
// Cost per (query tile, head): one read of the visible keys and values
// (float32, mostly from L2) and 4 x 16 x 64 x head_dim FLOPs per key tile.

// di_block_div maps a key position to its cache block and the offset in
// it, by shifts when the block size is a power of two (all in practice)
// instead of an integer division (tens of instructions).
struct di_block_div {
	int size, shift; // shift < 0: divide
	__device__ __forceinline__ explicit di_block_div(int block_size) {
		size = block_size;
		shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
	}
	__device__ __forceinline__ int block(int t) const { return shift >= 0 ? t >> shift : t / size; }
	__device__ __forceinline__ int slot(int blk, int t) const { return blk * size + (t - block(t) * size); }
};

// di_exp2_ftz is 2^x by the MUFU instruction alone (ex2.approx.ftz: about
// 2 ulp, results below 2^-126 flushed to zero; -inf gives 0), without
// exp2f's rescaling for subnormal results. The prefill softmax weights
// feed sums of at least 1 and half-precision products, where a subnormal
// float32 weight counts for nothing either way.
__device__ __forceinline__ float di_exp2_ftz(float x) {
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

#define TC_BQ 64
#define TC_BK 64
#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)

__device__ __forceinline__ uint32_t di_half2_bits(float lo, float hi) {
	__half2 h = __floats2half2_rn(lo, hi);
	return *reinterpret_cast<uint32_t *>(&h);
}

// di_stage_half converts rows of D floats to half in shared memory: row r
// from base + rowsel[r]*stride (zeros where rowsel[r] < 0) to dst + r*ld.
// Rows are 16-byte aligned; each thread keeps four float4 loads in flight.
template <int D, typename T>
__device__ __forceinline__ void di_stage_half(__half *dst, int ld, const T *base, size_t stride,
                                              const int *rowsel, int rows) {
	constexpr int per = D / 4;
	const int nt = blockDim.x, total = rows * per;
	for (int f0 = threadIdx.x; f0 < total; f0 += nt * 4) {
		float4 v[4];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int f = f0 + u * nt;
			v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
			if (f < total) {
				const int r = f / per, sl = rowsel[r];
				if (sl >= 0) v[u] = di_load4(base + (size_t)sl * stride + (f - r * per) * 4);
			}
		}
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int f = f0 + u * nt;
			if (f >= total) continue;
			const int r = f / per, e = (f - r * per) * 4;
			uint2 w;
			w.x = di_half2_bits(v[u].x, v[u].y);
			w.y = di_half2_bits(v[u].z, v[u].w);
			*reinterpret_cast<uint2 *>(dst + r * ld + e) = w;
		}
	}
}

// di_fp8_rows_to_half widens rows [r0, r0+n) of an 8-bit tile ([rows][D]
// bytes) into the half tile dst ([rows][D+8]); threads [t, t+nt) of the
// caller share the work (a warp its own rows, or the whole block).
template <int D>
__device__ __forceinline__ void di_fp8_rows_to_half(__half *dst, const unsigned char *src, int r0, int n, int t,
                                                    int nt) {
	constexpr int LQ = D + 8, CH = D / 16;
	for (int c = t; c < n * CH; c += nt) {
		const int r = r0 + c / CH, e = (c % CH) * 16;
		di_fp8x16_to_half(dst + r * LQ + e, *reinterpret_cast<const uint4 *>(src + r * D + e));
	}
}

__device__ __forceinline__ void di_ldmatrix_x4(uint32_t *r, const void *smem) {
	const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(s));
}
__device__ __forceinline__ void di_ldmatrix_x4_trans(uint32_t *r, const void *smem) {
	const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(s));
}

// di_softmax_update folds row half i (0: the thread's row g, 1: row g+8)
// of a warp's m16 score tile sc (NT n8 tiles, scaled to log2 units and
// masked with -inf; mx: the thread's max of them) into the running max m,
// sum l (the thread's share; the quad adds at the end) and output o, and
// turns the scores into probabilities. FTZ: 2^x by di_exp2_ftz (the
// prefill kernels), else exp2f (decode).
template <bool FTZ, int NT, int ND>
__device__ __forceinline__ void di_softmax_update(float (&sc)[NT][4], float (&m)[2], float (&l)[2],
                                                  float (&o)[ND][4], int i, float mx) {
	auto ex2 = [](float x) { return FTZ ? di_exp2_ftz(x) : exp2f(x); };
	mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
	mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
	const float m_new = fmaxf(m[i], mx);
	float alpha = 1.f, sum = 0.f;
	if (m_new != -CUDART_INF_F) {
		alpha = ex2(m[i] - m_new);
#pragma unroll
		for (int nt = 0; nt < NT; nt++) {
#pragma unroll
			for (int c = 0; c < 2; c++) {
				const float p = ex2(sc[nt][2 * i + c] - m_new);
				sc[nt][2 * i + c] = p;
				sum += p;
			}
		}
	} else {
#pragma unroll
		for (int nt = 0; nt < NT; nt++) sc[nt][2 * i] = sc[nt][2 * i + 1] = 0.f;
	}
	l[i] = l[i] * alpha + sum;
	m[i] = m_new;
#pragma unroll
	for (int nd = 0; nd < ND; nd++) {
		o[nd][2 * i] *= alpha;
		o[nd][2 * i + 1] *= alpha;
	}
}

// di_tc16_tile runs one key tile of a prefill warp (16 query rows of one
// head, fragments qf) against half K and V tiles in shared memory (rows of
// D+8 halves, slots sl): the scores, the online-softmax update of (m, l)
// and o, and the products with V, in a fixed order. full: every key of the
// tile is visible to every row (no masking). first/last: the rows' visible
// key ranges.
template <int D>
__device__ __forceinline__ void di_tc16_tile(float (&o)[D / 8][4], float (&m)[2], float (&l)[2],
                                             const uint32_t (&qf)[D / 16][4], const __half *Ks, const __half *Vs,
                                             const int *sl, int t0, int n, bool full, const int (&first)[2],
                                             const int (&last)[2], float scale_log2) {
	constexpr int LQ = D + 8, KS = D / 16, ND = D / 8;
	const int lane = threadIdx.x & 31, t4 = lane & 3;
	// ldmatrix row addresses: lane i feeds row i%8 of matrix i/8.
	const int lm_row = lane & 7, lm_mat = lane >> 3;
	float sc[8][4];
#pragma unroll
	for (int nt = 0; nt < 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
	for (int ks = 0; ks < KS; ks++) {
#pragma unroll
		for (int nt = 0; nt < 8; nt += 2) {
			// matrices: (keys nt, d lo), (keys nt, d hi), (keys nt+1, d lo), (keys nt+1, d hi)
			uint32_t b[4];
			di_ldmatrix_x4(b, Ks + ((nt + (lm_mat >> 1)) * 8 + lm_row) * LQ + ks * 16 + (lm_mat & 1) * 8);
			di_mma16816<__half>(sc[nt], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[0], b[1]);
			di_mma16816<__half>(sc[nt + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[2], b[3]);
		}
	}
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float mx = -CUDART_INF_F;
		if (full) {
#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
#pragma unroll
				for (int c = 0; c < 2; c++) {
					const float v = sc[nt][2 * i + c] * scale_log2;
					sc[nt][2 * i + c] = v;
					mx = fmaxf(mx, v);
				}
			}
		} else {
#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
#pragma unroll
				for (int c = 0; c < 2; c++) {
					const int kk = nt * 8 + 2 * t4 + c, t = t0 + kk;
					const bool vis = kk < n && sl[kk] >= 0 && t >= first[i] && t < last[i];
					const float v = vis ? sc[nt][2 * i + c] * scale_log2 : -CUDART_INF_F;
					sc[nt][2 * i + c] = v;
					mx = fmaxf(mx, v);
				}
			}
		}
		di_softmax_update<true>(sc, m, l, o, i, mx);
	}
#pragma unroll
	for (int kk = 0; kk < TC_BK / 16; kk++) {
		uint32_t a[4];
		a[0] = di_half2_bits(sc[2 * kk][0], sc[2 * kk][1]);
		a[1] = di_half2_bits(sc[2 * kk][2], sc[2 * kk][3]);
		a[2] = di_half2_bits(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
		a[3] = di_half2_bits(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
		for (int nd = 0; nd < ND; nd += 2) {
			// matrices: (keys lo, d nd), (keys hi, d nd), (keys lo, d nd+1), (keys hi, d nd+1)
			uint32_t b[4];
			di_ldmatrix_x4_trans(b, Vs + (kk * 16 + (lm_mat & 1) * 8 + lm_row) * LQ + (nd + (lm_mat >> 1)) * 8);
			di_mma16816<__half>(o[nd], a[0], a[1], a[2], a[3], b[0], b[1]);
			di_mma16816<__half>(o[nd + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
		}
	}
}

// di_tc16_rows is what a prefill warp of 16 query rows (from rbase; this
// thread's rows rbase+g and rbase+g+8, of nq real rows) sees of the keys:
// row r's last visible key is off + r (off: the keys before the block's
// first row), window > 0 limits it to the last window keys.
struct di_tc16_rows {
	int first[2], last[2]; // this thread's rows: visible keys [first, last)
	int lo, hi;            // keys any row of the warp sees
	int full_lo, full_hi;  // keys every row of the warp sees (empty unless all 16 rows are real)
	__device__ __forceinline__ di_tc16_rows(int rbase, int g, int nq, int off, int window) {
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = rbase + g + 8 * i;
			last[i] = r < nq ? off + r + 1 : 0;
			first[i] = window > 0 ? max(0, last[i] - window) : 0;
		}
		hi = rbase < nq ? off + min(rbase + 15, nq - 1) + 1 : 0;
		lo = window > 0 ? max(0, off + rbase + 1 - window) : 0;
		full_hi = rbase + 16 <= nq ? off + rbase + 1 : 0;
		full_lo = window > 0 ? max(0, hi - window) : 0;
	}
	// sees: some key of tile [t0, t0+n) is visible to the warp.
	__device__ __forceinline__ bool sees(int t0, int n) const { return !(t0 >= hi || t0 + n <= lo); }
	// unmasked: every key of the full tile [t0, t0+n) is visible to every row.
	__device__ __forceinline__ bool unmasked(int t0, int n) const {
		return n == TC_BK && t0 >= full_lo && t0 + TC_BK <= full_hi;
	}
};

// di_tc16_store writes a prefill warp's rows r0 and r0+8 (of nq) as o / l
// (l summed over the quad first): row r at element row0 + r*stride of out.
template <int D>
__device__ __forceinline__ void di_tc16_store(di_outp out, size_t row0, size_t stride, const float (&o)[D / 8][4],
                                              const float (&l)[2], int r0, int nq) {
	const int t4 = threadIdx.x & 3;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float li = l[i];
		li += __shfl_xor_sync(0xffffffffu, li, 1);
		li += __shfl_xor_sync(0xffffffffu, li, 2);
		const int r = r0 + 8 * i;
		if (r >= nq) continue;
		const float inv = li > 0.f ? 1.f / li : 0.f;
		const size_t orow = row0 + (size_t)r * stride + 2 * t4;
#pragma unroll
		for (int nd = 0; nd < D / 8; nd++) out.put2(orow + nd * 8, o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
	}
}

template <int D> static size_t di_prefill_tc_smem() {
	return (size_t)(TC_BQ * (D + 8) + 2 * TC_BK * (D + 8)) * sizeof(__half) + TC_BK * sizeof(int);
}

template <int D, typename T>
__global__ void __launch_bounds__(TC_THREADS)
    di_prefill_attn_tc_k(di_outp out, const float *q, const T *kc, const T *vc, const int *cu,
                         const int *seqlens_k, const int *block_tables, int num_seqs, int max_blocks, int block_size,
                         int num_blocks, int num_heads, int num_kv_heads, float scale_log2, int window,
                         unsigned *check) {
	constexpr int LQ = D + 8, KS = D / 16, ND = D / 8;
	extern __shared__ __align__(16) unsigned char tc_smem[];
	__half *Qs = reinterpret_cast<__half *>(tc_smem), *Ks = Qs + TC_BQ * LQ, *Vs = Ks + TC_BK * LQ;
	int *slots = reinterpret_cast<int *>(Vs + TC_BK * LQ);
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	const int h = blockIdx.y, kvh = h / (num_heads / num_kv_heads);
	di_prefill_rows pr;
	if (!pr.find(cu, seqlens_k, num_seqs, TC_BQ, blockIdx.x, max_blocks * block_size, out, num_heads, h, 1, D, check))
		return;
	const int s = pr.s, q0 = pr.q0, ql = pr.ql, kl = pr.kl, j0 = pr.j0, nq = pr.nq;
	const int kv_width = num_kv_heads * D;
	if (tid < TC_BQ) slots[tid] = tid < nq ? q0 + j0 + tid : -1; // query rows, for staging
	__syncthreads();
	di_stage_half<D, float>(Qs, LQ, q + (size_t)h * D, (size_t)num_heads * D, slots, TC_BQ);
	__syncthreads();
	const int r0 = warp * 16 + g; // this thread's rows: r0 and r0 + 8
	uint32_t qf[KS][4];
#pragma unroll
	for (int ks = 0; ks < KS; ks++) {
		const __half *a = Qs + r0 * LQ + ks * 16 + 2 * t4;
		qf[ks][0] = *reinterpret_cast<const uint32_t *>(a);
		qf[ks][1] = *reinterpret_cast<const uint32_t *>(a + 8 * LQ);
		qf[ks][2] = *reinterpret_cast<const uint32_t *>(a + 8);
		qf[ks][3] = *reinterpret_cast<const uint32_t *>(a + 8 * LQ + 8);
	}
	const di_tc16_rows rw(warp * 16, g, nq, kl - ql + j0, window);
	const int k_hi = kl - ql + j0 + nq;
	const int k_lo = window > 0 ? max(0, kl - ql + j0 + 1 - window) : 0;
	float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f}, o[ND][4];
#pragma unroll
	for (int nd = 0; nd < ND; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
	for (int t0 = k_lo / TC_BK * TC_BK; t0 < k_hi; t0 += TC_BK) {
		const int n = min(TC_BK, k_hi - t0);
		__syncthreads(); // the previous tile is consumed
		if (tid < TC_BK)
			slots[tid] = tid < n ? di_key_slot(block_tables + (size_t)s * max_blocks, t0 + tid, block_size, num_blocks,
			                                   check, DI_CHECK_ATTENTION)
			                     : -1;
		__syncthreads();
		di_stage_half<D, T>(Ks, LQ, kc + kvh * D, kv_width, slots, TC_BK);
		di_stage_half<D, T>(Vs, LQ, vc + kvh * D, kv_width, slots, TC_BK);
		__syncthreads();
		if (rw.sees(t0, n)) di_tc16_tile<D>(o, m, l, qf, Ks, Vs, slots, t0, n, false, rw.first, rw.last, scale_log2);
	}
	di_tc16_store<D>(out, ((size_t)(q0 + j0) * num_heads + h) * D, (size_t)num_heads * D, o, l, r0, nq);
}

// di_prefill_attn_tc16_k is di_prefill_attn_tc_k for half caches: the key
// and value tiles are copied into shared memory as they are stored, with
// cp.async in two stages (tile i+1 in flight while tile i is computed), and
// the B fragments are read with ldmatrix (transposed for V). A tile whose
// every key is visible to every row of the warp skips the per-score
// masking. Same tiling, same products in the same order, so the bits equal
// di_prefill_attn_tc_k's over the same half values. (Two m16 tiles a warp,
// 128-row blocks, measured slower: 146 vs 151 TFLOP/s at head size 64.)
// Shared memory: Q [TC_BQ][D+8] and two stages of K and V [TC_BK][D+8]
// halves, plus the tiles' slots.

// An 8-bit cache (T __nv_fp8_e4m3) is copied as stored into two stages of
// [TC_BK][D] bytes and widened (exactly) into one stage of the half tiles
// once a tile has landed: the same half values, so the bits of a half
// cache holding them.
template <int D, typename T> static size_t di_prefill_tc16_smem() {
	constexpr size_t stages = di_is_fp8<T> ? 1 : 2, raw = di_is_fp8<T> ? 2 * 2 * TC_BK * D : 0;
	return (size_t)(TC_BQ * (D + 8) + 2 * stages * TC_BK * (D + 8)) * sizeof(__half) + raw + 2 * TC_BK * sizeof(int);
}

template <int D, typename T>
__global__ void __launch_bounds__(TC_THREADS)
    di_prefill_attn_tc16_k(di_outp out, const float *q, const T *kc, const T *vc, const int *cu,
                           const int *seqlens_k, const int *block_tables, int num_seqs, int max_blocks,
                           int block_size, int num_blocks, int num_heads, int num_kv_heads, float scale_log2,
                           int window, unsigned *check) {
	constexpr int LQ = D + 8, KS = D / 16, ND = D / 8;
	constexpr bool F8 = di_is_fp8<T>;
	constexpr int STAGES = F8 ? 1 : 2, EPC = 16 / sizeof(T), CH = D / EPC; // CH: 16-byte chunks per row
	constexpr int LD = F8 ? D : LQ;                                        // a copied row's stride, elements
	extern __shared__ __align__(16) unsigned char tc_smem[];
	__half *Qs = reinterpret_cast<__half *>(tc_smem);
	__half *Kst = Qs + TC_BQ * LQ;              // [STAGES][TC_BK][LQ]
	__half *Vst = Kst + STAGES * TC_BK * LQ;    // [STAGES][TC_BK][LQ]
	unsigned char *raw = reinterpret_cast<unsigned char *>(Vst + STAGES * TC_BK * LQ); // F8: [2][K, V][TC_BK][D]
	int *slots = reinterpret_cast<int *>(raw + (F8 ? 2 * 2 * TC_BK * D : 0)); // [2][TC_BK]
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	const int h = blockIdx.y, kvh = h / (num_heads / num_kv_heads);
	di_prefill_rows pr;
	if (!pr.find(cu, seqlens_k, num_seqs, TC_BQ, blockIdx.x, max_blocks * block_size, out, num_heads, h, 1, D, check))
		return;
	const int s = pr.s, q0 = pr.q0, ql = pr.ql, kl = pr.kl, j0 = pr.j0, nq = pr.nq;
	const int kv_width = num_kv_heads * D;
	const int k_hi = kl - ql + j0 + nq;
	const int k_lo = window > 0 ? max(0, kl - ql + j0 + 1 - window) : 0;
	const int t_first = k_lo / TC_BK * TC_BK;
	const T *kbase = kc + kvh * D, *vbase = vc + kvh * D;
	// fetch looks up tile t0's slots into stage st and queues its copies; it
	// returns nonzero when a key of the tile below k_hi has no valid slot.
	auto fetch = [&](int t0, int st) {
		int *sl = slots + st * TC_BK;
		int bad = 0;
		if (tid < TC_BK) {
			const int t = t0 + tid;
			const int slot = t < k_hi ? di_key_slot(block_tables + (size_t)s * max_blocks, t, block_size, num_blocks,
			                                        check, DI_CHECK_ATTENTION)
			                          : -1;
			bad = t < k_hi && slot < 0;
			sl[tid] = slot;
		}
		bad = __syncthreads_or(bad);
		T *kd, *vd;
		if constexpr (F8) {
			kd = reinterpret_cast<T *>(raw + st * 2 * TC_BK * D), vd = kd + TC_BK * D;
		} else {
			kd = Kst + st * TC_BK * LQ, vd = Vst + st * TC_BK * LQ;
		}
		for (int c = tid; c < TC_BK * CH; c += TC_THREADS) {
			const int r = c / CH, e = (c - r * CH) * EPC, slot = sl[r];
			const size_t off = slot >= 0 ? (size_t)slot * kv_width + e : 0;
			di_cp_async16(kd + r * LD + e, kbase + off, slot >= 0);
			di_cp_async16(vd + r * LD + e, vbase + off, slot >= 0);
		}
		di_cp_async_commit();
		return bad;
	};
	int bad_cur = t_first < k_hi ? fetch(t_first, 0) : 0;
	// Q: float32 rows of this head, rounded to half once.
	for (int c = tid; c < TC_BQ * (D / 4); c += TC_THREADS) {
		const int r = c / (D / 4), e = (c - r * (D / 4)) * 4;
		float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
		if (r < nq) v = *reinterpret_cast<const float4 *>(q + ((size_t)(q0 + j0 + r) * num_heads + h) * D + e);
		uint2 w;
		w.x = di_half2_bits(v.x, v.y);
		w.y = di_half2_bits(v.z, v.w);
		*reinterpret_cast<uint2 *>(Qs + r * LQ + e) = w;
	}
	__syncthreads();
	const int r0 = warp * 16 + g;
	uint32_t qf[KS][4];
#pragma unroll
	for (int ks = 0; ks < KS; ks++) {
		const __half *a = Qs + r0 * LQ + ks * 16 + 2 * t4;
		qf[ks][0] = *reinterpret_cast<const uint32_t *>(a);
		qf[ks][1] = *reinterpret_cast<const uint32_t *>(a + 8 * LQ);
		qf[ks][2] = *reinterpret_cast<const uint32_t *>(a + 8);
		qf[ks][3] = *reinterpret_cast<const uint32_t *>(a + 8 * LQ + 8);
	}
	const di_tc16_rows rw(warp * 16, g, nq, kl - ql + j0, window);
	float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f}, o[ND][4];
#pragma unroll
	for (int nd = 0; nd < ND; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
	int st = 0;
	for (int t0 = t_first; t0 < k_hi; t0 += TC_BK, st ^= 1) {
		const int n = min(TC_BK, k_hi - t0);
		int bad_next = 0;
		if (t0 + TC_BK < k_hi) {
			bad_next = fetch(t0 + TC_BK, st ^ 1);
			di_cp_async_wait<1>();
		} else {
			di_cp_async_wait<0>();
		}
		__syncthreads(); // tile t0 has landed for every thread
		const int *sl = slots + st * TC_BK;
		const __half *Ks = Kst + st * TC_BK * LQ, *Vs = Vst + st * TC_BK * LQ;
		if constexpr (F8) {
			di_fp8_rows_to_half<D>(Kst, raw + st * 2 * TC_BK * D, 0, TC_BK, tid, TC_THREADS);
			di_fp8_rows_to_half<D>(Vst, raw + (st * 2 + 1) * TC_BK * D, 0, TC_BK, tid, TC_THREADS);
			__syncthreads();
			Ks = Kst, Vs = Vst;
		}
		const bool full = !bad_cur && rw.unmasked(t0, n);
		bad_cur = bad_next;
		if (rw.sees(t0, n)) di_tc16_tile<D>(o, m, l, qf, Ks, Vs, sl, t0, n, full, rw.first, rw.last, scale_log2);
		__syncthreads(); // stage st is consumed before the next fetch refills it
	}
	di_tc16_store<D>(out, ((size_t)(q0 + j0) * num_heads + h) * D, (size_t)num_heads * D, o, l, r0, nq);
}

// di_prefill_attn_gqa_k is di_prefill_attn_tc16_k with the query heads of
// one KV head in one block, so that each key and value tile copied into
// shared memory serves every head of the group: GQA_WARPS warps, warp w
// takes head (w mod group) of the group and rows [16s, 16s+16) of the
// block's 16 x GQA_WARPS/group query rows (s = w / group; group must divide
// GQA_WARPS). Twice the query rows per copied tile of the 64-row kernel at
// group 4, half the copies per FLOP. Blocks run longest first over the
// whole launch (grid x: the KV head, y: the tile), and each thread looks up
// the cache blocks of its rows of the tile after next while this tile is
// computed, so no block-table read waits on the critical path. Each warp
// runs di_tc16_tile over the same aligned key tiles in the same order as
// di_prefill_attn_tc16_k: the same bits.
// Shared memory: two stages of K and V [TC_BK][D+8] halves and their slots.
// Cost per block: one copy of its KV head's visible keys and values (half,
// mostly from L2) and 4 x 16 x 64 x D tensor-core FLOPs a warp and key tile.

#define GQA_WARPS 8
#define GQA_THREADS (GQA_WARPS * 32)

template <int D> static size_t di_prefill_gqa_smem() {
	return (size_t)(4 * TC_BK * (D + 8)) * sizeof(__half) + 2 * TC_BK * sizeof(int);
}

template <int D>
__global__ void __launch_bounds__(GQA_THREADS, 2)
    di_prefill_attn_gqa_k(di_outp out, const float *q, const __half *kc, const __half *vc, const int *cu,
                          const int *seqlens_k, const int *block_tables, int num_seqs, int max_blocks,
                          int block_size, int num_blocks, int num_heads, int num_kv_heads, float scale_log2,
                          int window, unsigned *check) {
	constexpr int LQ = D + 8, KS = D / 16, ND = D / 8, CH = D / 8; // CH: 16-byte chunks per row
	constexpr int RSTEP = GQA_THREADS / CH, PER = TC_BK / RSTEP;  // a thread copies rows crow + j*RSTEP, j < PER
	extern __shared__ __align__(16) unsigned char tc_smem[];
	__half *Kst = reinterpret_cast<__half *>(tc_smem);          // [2][TC_BK][LQ]
	__half *Vst = Kst + 2 * TC_BK * LQ;                          // [2][TC_BK][LQ]
	int *slots = reinterpret_cast<int *>(Vst + 2 * TC_BK * LQ); // [2][TC_BK]
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	const int group = num_heads / num_kv_heads, bq = 16 * (GQA_WARPS / group);
	const int kvh = blockIdx.x, h = kvh * group + warp % group, rbase = warp / group * 16;
	di_prefill_rows pr;
	if (!pr.find(cu, seqlens_k, num_seqs, bq, blockIdx.y, max_blocks * block_size, out, num_heads, kvh * group, group,
	             D, check))
		return;
	const int s = pr.s, q0 = pr.q0, ql = pr.ql, kl = pr.kl, j0 = pr.j0, nq = pr.nq;
	const int kv_width = num_kv_heads * D;
	const int k_hi = kl - ql + j0 + nq;
	const int k_lo = window > 0 ? max(0, kl - ql + j0 + 1 - window) : 0;
	const int t_first = k_lo / TC_BK * TC_BK;
	const int *bt = block_tables + (size_t)s * max_blocks;
	const __half *kbase = kc + kvh * D, *vbase = vc + kvh * D;
	const int crow = tid / CH, ce = (tid % CH) * 8;
	const di_block_div bd(block_size);
	int blk[PER]; // cache blocks of this thread's rows of the next tile to fetch
	bool bad = false; // an invalid block was met: reported once, at the end
	auto lookup = [&](int t0) {
#pragma unroll
		for (int j = 0; j < PER; j++) {
			const int t = t0 + crow + j * RSTEP;
			blk[j] = t < k_hi ? __ldg(bt + bd.block(t)) : -1;
		}
	};
	// fetch queues the copies of tile t0 into stage st from blk and
	// records its slots (-1: past k_hi or an invalid block, zero-filled).
	auto fetch = [&](int t0, int st) {
		int *sl = slots + st * TC_BK;
		__half *kd = Kst + st * TC_BK * LQ, *vd = Vst + st * TC_BK * LQ;
#pragma unroll
		for (int j = 0; j < PER; j++) {
			const int r = crow + j * RSTEP, t = t0 + r;
			int slot = -1;
			if (t < k_hi) {
				if (blk[j] < 0 || blk[j] >= num_blocks) bad = true;
				else slot = bd.slot(blk[j], t);
			}
			if (ce == 0) sl[r] = slot;
			const size_t off = slot >= 0 ? (size_t)slot * kv_width + ce : 0;
			di_cp_async16(kd + r * LQ + ce, kbase + off, slot >= 0);
			di_cp_async16(vd + r * LQ + ce, vbase + off, slot >= 0);
		}
		di_cp_async_commit();
	};
	if (t_first < k_hi) {
		lookup(t_first);
		fetch(t_first, 0);
		if (t_first + TC_BK < k_hi) lookup(t_first + TC_BK);
	}
	// Q fragments straight from the float32 rows, rounded to half.
	const int r0 = rbase + g;
	uint32_t qf[KS][4];
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int r = r0 + 8 * i;
		const float *qrow = q + ((size_t)(q0 + j0 + r) * num_heads + h) * D + 2 * t4;
#pragma unroll
		for (int ks = 0; ks < KS; ks++) {
			float2 lo = make_float2(0.f, 0.f), hi = lo;
			if (r < nq) {
				lo = *reinterpret_cast<const float2 *>(qrow + ks * 16);
				hi = *reinterpret_cast<const float2 *>(qrow + ks * 16 + 8);
			}
			qf[ks][i] = di_half2_bits(lo.x, lo.y);
			qf[ks][2 + i] = di_half2_bits(hi.x, hi.y);
		}
	}
	const di_tc16_rows rw(rbase, g, nq, kl - ql + j0, window);
	float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f}, o[ND][4];
#pragma unroll
	for (int nd = 0; nd < ND; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
	int st = 0;
	for (int t0 = t_first; t0 < k_hi; t0 += TC_BK, st ^= 1) {
		const int n = min(TC_BK, k_hi - t0);
		if (t0 + TC_BK < k_hi) {
			fetch(t0 + TC_BK, st ^ 1);
			if (t0 + 2 * TC_BK < k_hi) lookup(t0 + 2 * TC_BK);
			di_cp_async_wait<1>();
		} else {
			di_cp_async_wait<0>();
		}
		__syncthreads(); // tile t0 and its slots have landed for every thread
		const int *sl = slots + st * TC_BK;
		const __half *Ks = Kst + st * TC_BK * LQ, *Vs = Vst + st * TC_BK * LQ;
		if (rw.sees(t0, n)) {
			bool full = rw.unmasked(t0, n);
			if (full) full = __all_sync(0xffffffffu, sl[lane] >= 0 && sl[lane + 32] >= 0);
			di_tc16_tile<D>(o, m, l, qf, Ks, Vs, sl, t0, n, full, rw.first, rw.last, scale_log2);
		}
		__syncthreads(); // stage st is consumed before the next fetch refills it
	}
	if (bad) atomicOr(check, DI_CHECK_ATTENTION);
	di_tc16_store<D>(out, ((size_t)(q0 + j0) * num_heads + h) * D, (size_t)num_heads * D, o, l, r0, nq);
}

// ---------------------------------------------------------------- decode: tensor cores
//
// di_decode_attn_tc_k is the split-over-keys decode kernel for 16-bit models
// in GEMM mode round (AttentionParams.InputDType BF16 or F16) with head size
// 64 or 128 and at most 16 query heads per KV head: the query heads of one
// KV head are the rows of an m16n8k16 tile (zero rows past the group), so
// that each key and value is read once for the whole group and the dot
// products run on tensor cores, with q, k, v and the probabilities as half
// and float32 accumulation. Chunks are those of di_decode_attn_k (a function
// of the row's own key count) and are merged by di_decode_combine_k. One
// block of TC_WARPS warps per (chunk, KV head, sequence) walks the chunk in
// tiles of TC_BK keys aligned to absolute positions; warp w takes keys
// [16w, 16w+16) of every tile with its own running max, sum and output, and
// the warps merge in ascending order at the end. A half cache is copied
// with cp.async, two tiles in flight; a float32 cache is converted while
// staged (the same products, so the same bits over the same values).
// Cost: one read of the chunk's keys and values; 4 x 16 x head_dim FLOPs
// per key on tensor cores.

template <int D, typename T>
__device__ __forceinline__ void di_dec_stage(void *kd, void *vd, const T *kbase, const T *vbase, size_t stride,
                                             const int *sl) {
	constexpr int LQ = D + 8;
	if constexpr (std::is_same<T, __half>::value || di_is_fp8<T>) {
		// Rows as stored: half rows into [TC_BK][LQ], 8-bit rows into [TC_BK][D] bytes.
		constexpr int EPC = 16 / sizeof(T), CH = D / EPC, LD = di_is_fp8<T> ? D : LQ; // elements a chunk, chunks a row
		for (int c = threadIdx.x; c < TC_BK * CH; c += TC_THREADS) {
			const int r = c / CH, e = (c - r * CH) * EPC, slot = sl[r];
			const size_t off = slot >= 0 ? (size_t)slot * stride + e : 0;
			di_cp_async16(static_cast<T *>(kd) + r * LD + e, kbase + off, slot >= 0);
			di_cp_async16(static_cast<T *>(vd) + r * LD + e, vbase + off, slot >= 0);
		}
		di_cp_async_commit();
	} else {
		di_stage_half<D, T>(static_cast<__half *>(kd), LQ, kbase, stride, sl, TC_BK);
		di_stage_half<D, T>(static_cast<__half *>(vd), LQ, vbase, stride, sl, TC_BK);
	}
}

// di_dec_chunk_keys finds the keys [t_lo, t_hi) of the chunks that block
// blockIdx.x of gridDim.x takes of decode row blockIdx.z (query row q0), for
// a tensor-core decode block of KV head blockIdx.y, and the row's chunk
// length len. The row's chunks that hold keys, [first / len, ceil(kl /
// len)), are dealt out evenly in runs of consecutive chunks (block x takes
// [cf + x*count/gridDim.x, cf + (x+1)*count/gridDim.x)), so no block is
// idle while another takes two more than it, whatever the width of the
// block tables (nsplit, the chunks of the longest possible row). Block 0 writes the partial results of the chunks without
// keys empty, for the group's heads, at ml[hh * nsplit + c] (ml: the row's
// partials of head h0, chunk 0). A chunk's keys, and so its arithmetic,
// depend on the row's own key count alone: the deal changes no bit. False
// when the block has nothing to do: a sequence that is not one decode row
// (an error in a decode-only batch), bad metadata (reported once), or no
// chunk left for it.
__device__ __forceinline__ bool di_dec_chunk_keys(const int *cu, const int *seqlens_k, int max_keys, int min_chunk,
                                                  int window, int decode_only, int group, int nsplit, float2 *ml,
                                                  unsigned *check, int *q0, int *t_lo, int *t_hi, int *len) {
	const int x = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z, tid = threadIdx.x;
	*q0 = cu[s];
	const int ql = cu[s + 1] - *q0;
	if (ql != 1) {
		if (decode_only && ql != 0 && x == 0 && kvh == 0 && tid == 0) atomicOr(check, DI_CHECK_ATTENTION);
		return false;
	}
	const int kl = seqlens_k[s];
	if (kl < 1 || kl > max_keys) {
		if (x == 0) {
			if (kvh == 0 && tid == 0) atomicOr(check, DI_CHECK_ATTENTION);
			// Every chunk of every head of the group: ml[hh * nsplit + c].
			for (int i = tid; i < nsplit * group; i += blockDim.x) ml[i] = make_float2(-CUDART_INF_F, 0.f);
		}
		return false;
	}
	const int n = di_dec_chunk(kl, min_chunk);
	const int first = window > 0 ? max(0, kl - window) : 0;
	const int cf = first / n, cl = (kl + n - 1) / n; // the chunks with keys: [cf, cl), cl <= nsplit
	if (x == 0) {
		const int empty = cf + nsplit - cl;
		for (int i = tid; i < empty * group; i += blockDim.x) {
			const int e = i / group, hh = i - e * group, c = e < cf ? e : cl + e - cf;
			ml[(size_t)hh * nsplit + c] = make_float2(-CUDART_INF_F, 0.f);
		}
	}
	const int nc = cl - cf, c0 = cf + x * nc / (int)gridDim.x, c1 = cf + (x + 1) * nc / (int)gridDim.x;
	*len = n;
	*t_lo = max(first, c0 * n), *t_hi = min(kl, c1 * n);
	return c0 < c1;
}

// di_dec_fetcher copies the key and value tiles of a tensor-core decode
// block's chunk [t_lo, t_hi) into shared memory: fetch(t0, st) writes the
// slots of tile t0 (-1 outside the chunk or for a block out of range,
// reported) into stage st's slots, looks up the cache blocks of the next
// tile (thread tid < TC_BK, key tid: one fetch ahead, so only the first
// tile's copies wait on a block-table read), and queues the copies into
// stage st (half tiles Kst/Vst, or F8's raw rows). lookup(t0) primes the
// first fetch. Every thread of the block calls both.
template <int D, typename T> struct di_dec_fetcher {
	const int *bt;
	di_block_div bd;
	int t_lo, t_hi, num_blocks;
	size_t kv_width;
	const T *kbase, *vbase;
	int *slots;
	__half *Kst, *Vst;
	unsigned char *raw;
	unsigned *check;
	int blk_next = -1;

	__device__ __forceinline__ void lookup(int t0) {
		const int t = t0 + threadIdx.x;
		if (threadIdx.x < TC_BK && t >= t_lo && t < t_hi) blk_next = __ldg(bt + bd.block(t));
	}
	__device__ __forceinline__ void fetch(int t0, int st) {
		constexpr int LQ = D + 8;
		const int tid = threadIdx.x;
		int *sl = slots + st * TC_BK;
		if (tid < TC_BK) {
			const int t = t0 + tid;
			int slot = -1;
			if (t >= t_lo && t < t_hi) {
				if (blk_next < 0 || blk_next >= num_blocks) atomicOr(check, DI_CHECK_ATTENTION);
				else slot = bd.slot(blk_next, t);
			}
			sl[tid] = slot;
		}
		if (t0 + TC_BK < t_hi) lookup(t0 + TC_BK);
		__syncthreads();
		if constexpr (di_is_fp8<T>)
			di_dec_stage<D, T>(raw + st * 2 * TC_BK * D, raw + (st * 2 + 1) * TC_BK * D, kbase, vbase, kv_width, sl);
		else
			di_dec_stage<D, T>(Kst + st * TC_BK * LQ, Vst + st * TC_BK * LQ, kbase, vbase, kv_width, sl);
	}
};

// di_dec_merge_warps merges the TC_WARPS warps' partial results of a
// decode block in ascending warp order: wbuf holds per warp R rows of D+2
// floats (a head's unnormalized output, then its max in log2 units and its
// sum; rows past group unused). It writes the chunk's output of each head
// of the group (head r at pa + r * nsplit * D) and its (max in natural-log
// units, sum) at ml[r * nsplit], as di_decode_combine_k reads them.
template <int D, int R = 16>
__device__ __forceinline__ void di_dec_merge_warps(const float *wbuf, float *pa, float2 *ml, int group, int nsplit) {
	for (int idx = threadIdx.x; idx < group * D; idx += TC_THREADS) {
		const int r = idx / D, e = idx - r * D;
		float mx = -CUDART_INF_F;
#pragma unroll
		for (int w = 0; w < TC_WARPS; w++) mx = fmaxf(mx, wbuf[((size_t)w * R + r) * (D + 2) + D]);
		float acc = 0.f, sum = 0.f;
		if (mx != -CUDART_INF_F) {
#pragma unroll
			for (int w = 0; w < TC_WARPS; w++) {
				const float *row = wbuf + ((size_t)w * R + r) * (D + 2);
				const float f = exp2f(row[D] - mx);
				acc += row[e] * f;
				sum += row[D + 1] * f;
			}
		}
		pa[(size_t)r * nsplit * D + e] = acc;
		if (e == 0) ml[(size_t)r * nsplit] = make_float2(mx * 0.6931471805599453f, sum);
	}
}

// Shared memory of di_decode_attn_tc_k with S stages: Q [16][D+8] halves;
// then for a half or float32 cache S stages of K and V tiles [TC_BK][D+8]
// halves; for an 8-bit cache one half tile [TC_BK][D+8] (each warp widens
// its 16 keys of K, then of V, into its rows) and S stages of the K and V
// rows as stored [TC_BK][D] bytes. Then the stages' slots. The warps' merge
// reuses it all. The 8-bit kernel reads Q's fragments from shared memory
// at every tile instead of holding them (126 registers instead of 152 at
// head size 128: four blocks a multiprocessor instead of three, which
// makes up for the widening: Qwen3-0.6B heads, 256 rows of 300-1500 keys,
// 9.04 ms a step against 11.4 with two blocks; the half kernel 8.92).
template <int D, typename T, int S> static size_t di_decode_tc_smem() {
	constexpr size_t LQ = D + 8;
	constexpr size_t tiles = di_is_fp8<T> ? (16 + TC_BK) * LQ * sizeof(__half) + (size_t)S * 2 * TC_BK * D
	                                      : (16 * LQ + (size_t)S * 2 * TC_BK * LQ) * sizeof(__half);
	const size_t all = tiles + (size_t)S * TC_BK * sizeof(int);
	const size_t merge = (size_t)TC_WARPS * 16 * (D + 2) * sizeof(float);
	return all > merge ? all : merge;
}

template <int D, typename T, int S>
__global__ void __launch_bounds__(TC_THREADS, di_is_fp8<T> ? 4 : 1)
    di_decode_attn_tc_k(float *part_acc, float2 *part_ml, const float *q, const T *kc, const T *vc, const int *cu,
                        const int *seqlens_k, const int *block_tables, int max_blocks, int block_size, int num_blocks,
                        int num_heads, int num_kv_heads, float scale_log2, int window, int decode_only,
                        int min_chunk, unsigned *check) {
	static_assert(S >= 2, "two stages at least");
	di_pdl_wait();
	constexpr int LQ = D + 8, KS = D / 16, ND = D / 8;
	constexpr bool F8 = di_is_fp8<T>;
	extern __shared__ __align__(16) unsigned char tc_smem[];
	__half *Qs, *Kst, *Vst, *Cs; // Cs: F8's half tile
	unsigned char *raw;          // F8: [S][K, V][TC_BK][D]
	int *slots;                  // [S][TC_BK]
	if constexpr (F8) {
		Qs = reinterpret_cast<__half *>(tc_smem); // [16][LQ]
		Cs = Qs + 16 * LQ;                        // [TC_BK][LQ]
		Kst = Vst = nullptr;
		raw = reinterpret_cast<unsigned char *>(Cs + TC_BK * LQ);
		slots = reinterpret_cast<int *>(raw + S * 2 * TC_BK * D);
	} else {
		Qs = reinterpret_cast<__half *>(tc_smem); // [16][LQ]
		Kst = Qs + 16 * LQ;                        // [S][TC_BK][LQ]
		Vst = Kst + S * TC_BK * LQ;                // [S][TC_BK][LQ]
		Cs = nullptr;
		raw = nullptr;
		slots = reinterpret_cast<int *>(Vst + S * TC_BK * LQ);
	}
	const int kvh = blockIdx.y, s = blockIdx.z, nsplit = gridDim.x; // one chunk a block
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	const int group = num_heads / num_kv_heads, h0 = kvh * group;
	float2 *ml = part_ml + ((size_t)s * num_heads + h0) * nsplit; // chunk c of head hh at ml[hh*nsplit + c]
	int q0, t_lo, t_hi, len;
	if (!di_dec_chunk_keys(cu, seqlens_k, max_blocks * block_size, min_chunk, window, decode_only, group, nsplit, ml,
	                       check, &q0, &t_lo, &t_hi, &len))
		return;
	const int c = t_lo / len;
	ml += c; // head hh at ml[hh*nsplit]
	di_dec_fetcher<D, T> tiles{block_tables + (size_t)s * max_blocks, di_block_div(block_size), t_lo, t_hi,
	                           num_blocks, (size_t)num_kv_heads * D, kc + kvh * D, vc + kvh * D, slots, Kst, Vst, raw,
	                           check};
	auto lookup = [&](int t0) { tiles.lookup(t0); };
	auto fetch = [&](int t0, int st) { tiles.fetch(t0, st); };
	// fetch_or_skip fetches tile t0 into stage st if it holds keys of the
	// chunk, else commits an empty copy group: every loop iteration then
	// waits for the group of S - 1 iterations before.
	auto fetch_or_skip = [&](int t0, int st) {
		if (t0 < t_hi) fetch(t0, st);
		else di_cp_async_commit();
	};
	const int t_first = t_lo / TC_BK * TC_BK;
	lookup(t_first);
	for (int j = 0; j < S - 1; j++) fetch_or_skip(t_first + j * TC_BK, j);
	const float *qr = q + ((size_t)q0 * num_heads + h0) * D;
	for (int i = tid; i < 16 * (D / 4); i += TC_THREADS) {
		const int r = i / (D / 4), e = (i - r * (D / 4)) * 4;
		float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
		if (r < group) v = *reinterpret_cast<const float4 *>(qr + (size_t)r * D + e);
		uint2 w;
		w.x = di_half2_bits(v.x, v.y);
		w.y = di_half2_bits(v.z, v.w);
		*reinterpret_cast<uint2 *>(Qs + r * LQ + e) = w;
	}
	__syncthreads();
	// Q's A fragments: held in registers, or (F8) read again at every tile.
	auto q_frag = [&](uint32_t(&f)[4], int ks) {
		const __half *a = Qs + g * LQ + ks * 16 + 2 * t4;
		f[0] = *reinterpret_cast<const uint32_t *>(a);
		f[1] = *reinterpret_cast<const uint32_t *>(a + 8 * LQ);
		f[2] = *reinterpret_cast<const uint32_t *>(a + 8);
		f[3] = *reinterpret_cast<const uint32_t *>(a + 8 * LQ + 8);
	};
	uint32_t qf[F8 ? 1 : KS][4];
	if constexpr (!F8) {
#pragma unroll
		for (int ks = 0; ks < KS; ks++) q_frag(qf[ks], ks);
	}
	float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f}, o[ND][4];
#pragma unroll
	for (int nd = 0; nd < ND; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
	const int lm_row = lane & 7, lm_mat = lane >> 3, kw = warp * 16; // this warp's keys in a tile
	int st = 0;
	for (int t0 = t_first; t0 < t_hi; t0 += TC_BK, st = st + 1 == S ? 0 : st + 1) {
		fetch_or_skip(t0 + (S - 1) * TC_BK, st == 0 ? S - 1 : st - 1);
		di_cp_async_wait<S - 1>();
		__syncthreads(); // tile t0 has landed for every thread
		const int *sl = slots + st * TC_BK;
		const __half *Ks, *Vs;
		if constexpr (F8) { // the warp widens its own 16 keys: only it reads them
			di_fp8_rows_to_half<D>(Cs, raw + st * 2 * TC_BK * D, kw, 16, lane, 32);
			__syncwarp();
			Ks = Vs = Cs;
		} else {
			Ks = Kst + st * TC_BK * LQ, Vs = Vst + st * TC_BK * LQ;
		}
		float sc[2][4];
#pragma unroll
		for (int nt = 0; nt < 2; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
		for (int ks = 0; ks < KS; ks++) {
			uint32_t b[4], a[4];
			if constexpr (F8) q_frag(a, ks);
			else a[0] = qf[ks][0], a[1] = qf[ks][1], a[2] = qf[ks][2], a[3] = qf[ks][3];
			di_ldmatrix_x4(b, Ks + (kw + (lm_mat >> 1) * 8 + lm_row) * LQ + ks * 16 + (lm_mat & 1) * 8);
			di_mma16816<__half>(sc[0], a[0], a[1], a[2], a[3], b[0], b[1]);
			di_mma16816<__half>(sc[1], a[0], a[1], a[2], a[3], b[2], b[3]);
		}
#pragma unroll
		for (int i = 0; i < 2; i++) {
			float mx = -CUDART_INF_F;
#pragma unroll
			for (int nt = 0; nt < 2; nt++) {
#pragma unroll
				for (int cc = 0; cc < 2; cc++) {
					const float v = sl[kw + nt * 8 + 2 * t4 + cc] >= 0 ? sc[nt][2 * i + cc] * scale_log2 : -CUDART_INF_F;
					sc[nt][2 * i + cc] = v;
					mx = fmaxf(mx, v);
				}
			}
			di_softmax_update<false>(sc, m, l, o, i, mx);
		}
		uint32_t a[4];
		a[0] = di_half2_bits(sc[0][0], sc[0][1]);
		a[1] = di_half2_bits(sc[0][2], sc[0][3]);
		a[2] = di_half2_bits(sc[1][0], sc[1][1]);
		a[3] = di_half2_bits(sc[1][2], sc[1][3]);
		if constexpr (F8) { // the warp's V keys replace its K keys in Cs
			__syncwarp();
			di_fp8_rows_to_half<D>(Cs, raw + (st * 2 + 1) * TC_BK * D, kw, 16, lane, 32);
			__syncwarp();
		}
#pragma unroll
		for (int nd = 0; nd < ND; nd += 2) {
			uint32_t b[4];
			di_ldmatrix_x4_trans(b, Vs + (kw + (lm_mat & 1) * 8 + lm_row) * LQ + (nd + (lm_mat >> 1)) * 8);
			di_mma16816<__half>(o[nd], a[0], a[1], a[2], a[3], b[0], b[1]);
			di_mma16816<__half>(o[nd + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
		}
		__syncthreads(); // stage st is consumed before a fetch refills it
	}
	di_cp_async_wait<0>(); // the empty groups: nothing is in flight when the merge reuses the memory
	// Merge the warps in ascending order: each writes its rows' max, sum and
	// output (the tiles' shared memory is free now), then thread pairs (row,
	// column) combine them.
	float *wbuf = reinterpret_cast<float *>(tc_smem); // [warp][row][D + 2]: output, then max and sum
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float li = l[i];
		li += __shfl_xor_sync(0xffffffffu, li, 1);
		li += __shfl_xor_sync(0xffffffffu, li, 2);
		float *row = wbuf + ((size_t)warp * 16 + g + 8 * i) * (D + 2);
#pragma unroll
		for (int nd = 0; nd < ND; nd++) {
			row[nd * 8 + 2 * t4] = o[nd][2 * i];
			row[nd * 8 + 2 * t4 + 1] = o[nd][2 * i + 1];
		}
		if (t4 == 0) {
			row[D] = m[i];
			row[D + 1] = li;
		}
	}
	__syncthreads();
	di_dec_merge_warps<D>(wbuf, part_acc + (((size_t)s * num_heads + h0) * nsplit + c) * D, ml, group, nsplit);
}

// di_km_softmax is the online softmax of a keys-as-rows decode warp over
// one 16-key score tile sc (S^T: keys g and g + 8, heads 2t4 and 2t4 + 1;
// v0 and v1 say whether the two keys count): it scales the scores to log2
// units, updates the running max m and this lane's share of the sum l per
// head, rescales the output tiles o, and returns in pb the probabilities as
// P^T's B fragments (k: keys, n: heads), each 8 x 8 half of the tile
// transposed in registers.
template <int MT>
__device__ __forceinline__ void di_km_softmax(float (&sc)[4], bool v0, bool v1, float scale_log2, float (&m)[2],
                                              float (&l)[2], float (&o)[MT][4], uint32_t (&pb)[2]) {
#pragma unroll
	for (int cc = 0; cc < 2; cc++) {
		const float x0 = v0 ? sc[cc] * scale_log2 : -CUDART_INF_F;
		const float x1 = v1 ? sc[2 + cc] * scale_log2 : -CUDART_INF_F;
		float mx = fmaxf(x0, x1);
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
		const float m_new = fmaxf(m[cc], mx);
		float alpha = 1.f, p0 = 0.f, p1 = 0.f;
		if (m_new != -CUDART_INF_F) {
			alpha = exp2f(m[cc] - m_new);
			p0 = exp2f(x0 - m_new);
			p1 = exp2f(x1 - m_new);
		}
		sc[cc] = p0, sc[2 + cc] = p1;
		l[cc] = l[cc] * alpha + (p0 + p1);
		m[cc] = m_new;
#pragma unroll
		for (int mt = 0; mt < MT; mt++) o[mt][cc] *= alpha, o[mt][2 + cc] *= alpha;
	}
	const uint32_t lo = di_half2_bits(sc[0], sc[1]), hi = di_half2_bits(sc[2], sc[3]);
	asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb[0]) : "r"(lo));
	asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb[1]) : "r"(hi));
}

// di_km_flush ends a chunk of a keys-as-rows decode block: every thread
// calls it after a barrier that frees wbuf ([TC_WARPS][8 heads][D + 2]
// floats). Each warp writes its heads' outputs (O^T tile mt's row g + 8hi
// is dimension dim(mt, g, hi)), maxima and sums; the warps are merged into
// the chunk's partial results (pa, ml as di_dec_merge_warps takes them);
// m, l and o start over.
template <int D, int MT, typename Dim>
__device__ __forceinline__ void di_km_flush(float *wbuf, float (&m)[2], float (&l)[2], float (&o)[MT][4], Dim dim,
                                            float *pa, float2 *ml, int group, int nsplit) {
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
	for (int cc = 0; cc < 2; cc++) {
		float li = l[cc];
		li += __shfl_xor_sync(0xffffffffu, li, 4);
		li += __shfl_xor_sync(0xffffffffu, li, 8);
		li += __shfl_xor_sync(0xffffffffu, li, 16);
		float *row = wbuf + ((size_t)warp * 8 + 2 * t4 + cc) * (D + 2);
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			row[dim(mt, g, 0)] = o[mt][cc];
			row[dim(mt, g, 1)] = o[mt][2 + cc];
		}
		if (g == 0) {
			row[D] = m[cc];
			row[D + 1] = li;
		}
		m[cc] = -CUDART_INF_F, l[cc] = 0.f;
	}
#pragma unroll
	for (int mt = 0; mt < MT; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
	__syncthreads();
	di_dec_merge_warps<D, 8>(wbuf, pa, ml, group, nsplit);
}

// ---------------------------------------------------------------- decode: keys as MMA rows
//
// di_decode_attn_km_k is di_decode_attn_tc_k with the roles turned for
// groups of at most 8 query heads: the keys are the m16 rows of the
// tensor-core tiles and the group's heads the n8 columns (S^T = K Q^T, then
// O^T = V^T P^T, P^T moved from the score tile's layout to the operand's
// with movmatrix), so no tile row is padding: at 2 heads a group (Qwen3)
// di_decode_attn_tc_k spends 14 of its 16 rows, and their softmax and
// rescaling, on zeros. Half the tensor-core instructions a key, a quarter
// of the exponentials, half the accumulator registers. Same chunks, tiles,
// copy stages and warp merge as di_decode_attn_tc_k (a row's result still
// depends only on its own keys), not the same bits: the products are summed
// in another order. Float32 caches are widened to half while staged, as
// di_decode_attn_tc_k does, so all three cache types give the same bits
// over the same values. Like di_decode_attn_f8_k, a block may take several
// consecutive chunks of its row (di_dec_chunk_keys), merging its warps as
// each ends.
template <int D, typename T>
__global__ void __launch_bounds__(TC_THREADS, 3)
    di_decode_attn_km_k(float *part_acc, float2 *part_ml, const float *q, const T *kc, const T *vc, const int *cu,
                        const int *seqlens_k, const int *block_tables, int max_blocks, int block_size, int num_blocks,
                        int num_heads, int num_kv_heads, float scale_log2, int window, int decode_only,
                        int min_chunk, int nsplit, unsigned *check) {
	di_pdl_wait();
	constexpr int S = 2, LQ = D + 8, KS = D / 16, MT = D / 16;
	constexpr bool F8 = di_is_fp8<T>;
	extern __shared__ __align__(16) unsigned char tc_smem[];
	__half *Kst, *Vst, *Cs;
	unsigned char *raw;
	int *slots;
	if constexpr (F8) {
		Cs = reinterpret_cast<__half *>(tc_smem); // [TC_BK][LQ]
		Kst = Vst = nullptr;
		raw = reinterpret_cast<unsigned char *>(Cs + TC_BK * LQ);
		slots = reinterpret_cast<int *>(raw + S * 2 * TC_BK * D);
	} else {
		Kst = reinterpret_cast<__half *>(tc_smem); // [S][TC_BK][LQ]
		Vst = Kst + S * TC_BK * LQ;
		Cs = nullptr;
		raw = nullptr;
		slots = reinterpret_cast<int *>(Vst + S * TC_BK * LQ);
	}
	const int kvh = blockIdx.y, s = blockIdx.z;
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	const int group = num_heads / num_kv_heads, h0 = kvh * group;
	float2 *ml = part_ml + ((size_t)s * num_heads + h0) * nsplit; // chunk c of head hh at ml[hh*nsplit + c]
	int q0, t_lo, t_hi, len;
	if (!di_dec_chunk_keys(cu, seqlens_k, max_blocks * block_size, min_chunk, window, decode_only, group, nsplit, ml,
	                       check, &q0, &t_lo, &t_hi, &len))
		return;
	di_dec_fetcher<D, T> tiles{block_tables + (size_t)s * max_blocks, di_block_div(block_size), t_lo, t_hi,
	                           num_blocks, (size_t)num_kv_heads * D, kc + kvh * D, vc + kvh * D, slots, Kst, Vst, raw,
	                           check};
	auto lookup = [&](int t0) { tiles.lookup(t0); };
	auto fetch = [&](int t0, int st) { tiles.fetch(t0, st); };
	const int t_first = t_lo / TC_BK * TC_BK;
	lookup(t_first);
	fetch(t_first, 0);
	// Q^T's B fragments (k: dims, n: the group's heads): lane (g, t4) holds
	// head g's dims 2t4, 2t4+1 and 2t4+8, 2t4+9 of each 16, rounded to half.
	uint32_t qb[KS][2];
	{
		const float *qr = q + ((size_t)q0 * num_heads + h0 + g) * D + 2 * t4;
#pragma unroll
		for (int ks = 0; ks < KS; ks++) {
			float2 lo = make_float2(0.f, 0.f), hi = lo;
			if (g < group) {
				lo = *reinterpret_cast<const float2 *>(qr + ks * 16);
				hi = *reinterpret_cast<const float2 *>(qr + ks * 16 + 8);
			}
			qb[ks][0] = di_half2_bits(lo.x, lo.y);
			qb[ks][1] = di_half2_bits(hi.x, hi.y);
		}
	}
	// Per lane: heads 2t4 and 2t4+1 (columns cc), running max m (the same on
	// every lane of a column), this lane's share of the sum l, and O^T's
	// tiles o[mt] (dims mt*16 + g and + 8, heads 2t4 and 2t4+1).
	float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f}, o[MT][4];
#pragma unroll
	for (int mt = 0; mt < MT; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
	const int lm_row = lane & 7, lm_mat = lane >> 3, kw = warp * 16; // this warp's keys in a tile
	int st = 0;
	int chunk = t_lo / len, chunk_end = min(t_hi, (chunk + 1) * len); // the chunk of tile t0 (tiles never straddle two)
	for (int t0 = t_first; t0 < t_hi; t0 += TC_BK, st ^= 1) {
		if (t0 + TC_BK < t_hi) {
			fetch(t0 + TC_BK, st ^ 1);
			di_cp_async_wait<1>();
		} else {
			di_cp_async_wait<0>();
		}
		__syncthreads(); // tile t0 has landed for every thread
		const int *sl = slots + st * TC_BK;
		const __half *Ks, *Vs;
		if constexpr (F8) { // the warp widens its own 16 keys: only it reads them
			di_fp8_rows_to_half<D>(Cs, raw + st * 2 * TC_BK * D, kw, 16, lane, 32);
			__syncwarp();
			Ks = Vs = Cs;
		} else {
			Ks = Kst + st * TC_BK * LQ, Vs = Vst + st * TC_BK * LQ;
		}
		// S^T (keys kw + g and kw + g + 8, heads 2t4 and 2t4 + 1) = K Q^T.
		// Two accumulators (even and odd k-steps) halve the chain of dependent MMAs.
		float sc[4] = {0.f, 0.f, 0.f, 0.f}, sd[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
		for (int ks = 0; ks < KS; ks++) {
			// matrices: (keys lo, d lo), (keys hi, d lo), (keys lo, d hi), (keys hi, d hi)
			uint32_t a[4];
			di_ldmatrix_x4(a, Ks + (kw + (lm_mat & 1) * 8 + lm_row) * LQ + ks * 16 + (lm_mat >> 1) * 8);
			di_mma16816<__half>(ks & 1 ? sd : sc, a[0], a[1], a[2], a[3], qb[ks][0], qb[ks][1]);
		}
#pragma unroll
		for (int i = 0; i < 4; i++) sc[i] += sd[i];
		uint32_t pb[2]; // P^T's B fragments (k: keys, n: heads)
		di_km_softmax(sc, sl[kw + g] >= 0, sl[kw + g + 8] >= 0, scale_log2, m, l, o, pb);
		if constexpr (F8) { // the warp's V keys replace its K keys in Cs
			__syncwarp();
			di_fp8_rows_to_half<D>(Cs, raw + (st * 2 + 1) * TC_BK * D, kw, 16, lane, 32);
			__syncwarp();
		}
		// O^T += V^T P^T: V^T's A fragments by transposed loads of V's rows.
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			// matrices: (d lo, keys lo), (d hi, keys lo), (d lo, keys hi), (d hi, keys hi)
			uint32_t a[4];
			di_ldmatrix_x4_trans(a, Vs + (kw + (lm_mat >> 1) * 8 + lm_row) * LQ + mt * 16 + (lm_mat & 1) * 8);
			di_mma16816<__half>(o[mt], a[0], a[1], a[2], a[3], pb[0], pb[1]);
		}
		__syncthreads(); // stage st is consumed before the next fetch refills it
		if (t0 + TC_BK < chunk_end) continue;
		// The chunk ends with this tile: merge the warps as di_decode_attn_tc_k
		// does, head rows [warp][head][D+2] in the free half tile (the copy in
		// flight fills the other stage; the next fetch's barrier comes first).
		di_km_flush<D>(reinterpret_cast<float *>(F8 ? Cs : Kst + st * TC_BK * LQ), m, l, o,
		               [](int mt, int g, int hi) { return mt * 16 + g + 8 * hi; },
		               part_acc + (((size_t)s * num_heads + h0) * nsplit + chunk) * D, ml + chunk, group, nsplit);
		chunk++;
		chunk_end = min(t_hi, (chunk + 1) * len);
	}
}

template <int D, typename T> static size_t di_decode_km_smem() {
	constexpr size_t LQ = D + 8;
	// A chunk's warp merge ([warp][8 heads][D + 2] floats) reuses a half tile.
	static_assert(TC_WARPS * 8 * (D + 2) * sizeof(float) <= TC_BK * LQ * sizeof(__half), "the merge fits a tile");
	constexpr size_t tiles = di_is_fp8<T> ? TC_BK * LQ * sizeof(__half) + 2 * 2 * TC_BK * D
	                                      : 2 * 2 * TC_BK * LQ * sizeof(__half);
	return tiles + 2 * TC_BK * sizeof(int);
}

// ---------------------------------------------------------------- decode: 8-bit keys in registers
//
// di_decode_attn_f8_k is di_decode_attn_km_k over 8-bit E4M3 caches without
// the trip through a half tile in shared memory: each lane loads the cache
// bytes of its own MMA fragments as 32-bit words and widens them in
// registers (cvt e4m3x2 -> f16x2, exact). That needs layouts in which a
// lane's fragment bytes are adjacent, which the two products allow because
// a dot product does not care in which order it visits its terms:
//  - S^T = K Q^T sums over the head dimension. Logical dimension k of
//    k-step ks (k16) maps to the stored dimension 16ks + 4(k/2 % 4) +
//    2(k/8) + k%2, the same for K and Q: lane (g, t4)'s four values of row
//    g are the word at byte 16ks + 4t4.
//  - O^T = V^T P^T has the head dimension as its rows, which can be any
//    permutation as long as the output is written back in place: rows g
//    and g+8 of m-tiles 2P and 2P+1 are stored dimensions 32P + 4g + 0..3,
//    so a lane reads one word of each of its four keys (2t4, 2t4+1, 2t4+8,
//    2t4+9) and pairs the keys' bytes with byte permutes.
// Rows sit 16 bytes apart beyond their length in shared memory, so that
// both patterns are free of bank conflicts. The cache slots of a tile are
// computed S tiles ahead, into shared memory, so a tile costs one barrier;
// S stages, S - 1 tiles in flight. The products
// are those of di_decode_attn_km_k over the same values, and the bits too:
// the permutations only reorder terms inside one MMA's 16-term sum, which
// the tensor cores add without an order (TestGPUDecodeKeysAsRows). A row's
// result depends only on its own keys. A block takes a run of consecutive
// chunks of its row (di_dec_chunk_keys, di_dec_blocks_per_row) and writes each chunk's
// partial results when the chunk's last tile is done. Qwen3-0.6B heads,
// 256 rows of 300-1500 keys, one decode step: 6.26 ms against
// di_decode_attn_km_k's 7.79 (2 stages 6.27, 4 stages 7.01: three blocks a
// multiprocessor); 5.87 with the slots a tile ahead and two chunks a block
// (kernels/cuda/NOTES.md, round 10).
// Cost: one read of the chunk's keys and values, 2 x 8 x head_dim MMA FLOPs
// a key; four 128-thread blocks a multiprocessor at head size 128 (3 stages:
// 54 KB of shared memory).
template <int D> constexpr int di_f8_row = D + 16; // bytes between staged rows

template <int D, int S> static size_t di_decode_f8_smem() {
	// A chunk's warp merge ([warp][8 heads][D + 2] floats) reuses one stage.
	static_assert(TC_WARPS * 8 * (D + 2) * sizeof(float) <= 2 * TC_BK * di_f8_row<D>, "the merge fits a stage");
	return (size_t)S * 2 * TC_BK * di_f8_row<D> + (size_t)S * TC_BK * sizeof(int);
}

// di_e4m3x2_half2<H> widens the two E4M3 values in 16-bit half H of w (the
// lower byte into the lower half) to a half2's bits: one instruction, where
// the cuda_fp8.h conversion splits and repacks the halves.
template <int H> __device__ __forceinline__ uint32_t di_e4m3x2_half2(uint32_t w) {
	uint32_t r;
	if constexpr (H == 0)
		asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, lo;\n\t}" : "=r"(r) : "r"(w));
	else
		asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, hi;\n\t}" : "=r"(r) : "r"(w));
	return r;
}

__device__ __forceinline__ uint32_t di_prmt(uint32_t a, uint32_t b, uint32_t sel) {
	uint32_t r;
	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
	return r;
}

template <int D, int S>
__global__ void __launch_bounds__(TC_THREADS, S == 2 ? 5 : 4) // two stages: 96 registers, five blocks a multiprocessor
    di_decode_attn_f8_k(float *part_acc, float2 *part_ml, const float *q, const __nv_fp8_e4m3 *kc,
                        const __nv_fp8_e4m3 *vc, const int *cu, const int *seqlens_k, const int *block_tables,
                        int max_blocks, int block_size, int num_blocks, int num_heads, int num_kv_heads,
                        float scale_log2, int window, int decode_only, int min_chunk, int nsplit, unsigned *check) {
	static_assert(S >= 2, "two stages at least");
	di_pdl_wait();
	constexpr int LB = di_f8_row<D>, KS = D / 16, NP = D / 32;
	constexpr int CH = D / 16, RSTEP = TC_THREADS / CH, RPT = TC_BK / RSTEP; // 16-byte chunks a row; rows a thread copies
	extern __shared__ __align__(16) unsigned char tc_smem[]; // [S][K, V][TC_BK][LB]
	const int kvh = blockIdx.y, s = blockIdx.z;
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	const int group = num_heads / num_kv_heads, h0 = kvh * group;
	float2 *ml = part_ml + ((size_t)s * num_heads + h0) * nsplit; // chunk c of head hh at ml[hh*nsplit + c]
	int q0, t_lo, t_hi, len;
	if (!di_dec_chunk_keys(cu, seqlens_k, max_blocks * block_size, min_chunk, window, decode_only, group, nsplit, ml,
	                       check, &q0, &t_lo, &t_hi, &len))
		return;
	// Key kk of stage st's tile copies from cache slot slots[st][kk] (-1:
	// nothing, zeros): thread kk < TC_BK computes the slots of tile j + S
	// while tile j is consumed, from the block-table entry it read an
	// iteration before, so that neither the lookup's latency nor the slot
	// arithmetic (once a key, not once a copy) holds up a copy.
	int *slots = reinterpret_cast<int *>(tc_smem + (size_t)S * 2 * TC_BK * LB); // [S][TC_BK]
	const int *bt = block_tables + (size_t)s * max_blocks;
	const di_block_div bd(block_size);
	auto lookup = [&](int t) { return tid < TC_BK && t >= t_lo && t < t_hi ? __ldg(bt + bd.block(t)) : -1; };
	auto slot_of = [&](int t, int blk) {
		if (t < t_lo || t >= t_hi) return -1;
		if (blk < 0 || blk >= num_blocks) {
			atomicOr(check, DI_CHECK_ATTENTION);
			return -1;
		}
		return bd.slot(blk, t);
	};
	// This thread copies 16-byte chunk cb of rows r0 + i * RSTEP of a tile.
	const int cb = (tid % CH) * 16, r0 = tid / CH;
	const size_t width = (size_t)num_kv_heads * D;
	const unsigned char *kb = reinterpret_cast<const unsigned char *>(kc) + kvh * D + cb;
	const unsigned char *vb = reinterpret_cast<const unsigned char *>(vc) + kvh * D + cb;
	// fetch queues tile t0's copies into stage st; past the chunk it commits
	// an empty group, so that every iteration waits for the group of S - 1
	// iterations before.
	auto fetch = [&](int t0, int st) {
		if (t0 < t_hi) {
			unsigned char *ks = tc_smem + (size_t)st * 2 * TC_BK * LB, *vs = ks + TC_BK * LB;
#pragma unroll
			for (int i = 0; i < RPT; i++) {
				const int r = r0 + i * RSTEP, slot = slots[st * TC_BK + r];
				const size_t off = slot >= 0 ? (size_t)slot * width : 0;
				di_cp_async16(ks + r * LB + cb, kb + off, slot >= 0);
				di_cp_async16(vs + r * LB + cb, vb + off, slot >= 0);
			}
		}
		di_cp_async_commit();
	};
	const int t_first = t_lo / TC_BK * TC_BK;
	if (tid < TC_BK) {
#pragma unroll
		for (int j = 0; j < S; j++) {
			const int t = t_first + j * TC_BK + tid;
			slots[j * TC_BK + tid] = slot_of(t, lookup(t));
		}
	}
	int blk_next = lookup(t_first + S * TC_BK + tid); // for the slots of tile S, computed in iteration 0
	__syncthreads();
#pragma unroll
	for (int j = 0; j < S - 1; j++) fetch(t_first + j * TC_BK, j);
	// Q^T's B fragments in the permuted order: lane (g, t4) holds head g's
	// stored dimensions 16ks + 4t4 .. + 3, rounded to half.
	uint32_t qb[KS][2];
	{
		const float *qr = q + ((size_t)q0 * num_heads + h0 + g) * D + 4 * t4;
#pragma unroll
		for (int ks = 0; ks < KS; ks++) {
			float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
			if (g < group) v = *reinterpret_cast<const float4 *>(qr + ks * 16);
			qb[ks][0] = di_half2_bits(v.x, v.y);
			qb[ks][1] = di_half2_bits(v.z, v.w);
		}
	}
	// Per lane: heads 2t4 and 2t4+1 (columns cc), running max m, this lane's
	// share of the sum l, and O^T's tiles o[mt] in the permuted row order.
	float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f}, o[2 * NP][4];
#pragma unroll
	for (int mt = 0; mt < 2 * NP; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
	const int kw = warp * 16; // this warp's keys in a tile
	int st = 0;
	int chunk = t_lo / len, chunk_end = min(t_hi, (chunk + 1) * len); // the chunk of tile t0 (tiles never straddle two)
	for (int t0 = t_first; t0 < t_hi; t0 += TC_BK, st = st + 1 == S ? 0 : st + 1) {
		di_cp_async_wait<S - 2>();
		__syncthreads(); // tile t0 has landed for every thread, and the stage before it is consumed (or merged in)
		fetch(t0 + (S - 1) * TC_BK, st == 0 ? S - 1 : st - 1);
		if (tid < TC_BK) { // stage st's slots were tile t0's: now tile t0 + S tiles'
			const int t = t0 + S * TC_BK + tid;
			slots[st * TC_BK + tid] = slot_of(t, blk_next);
			blk_next = lookup(t + TC_BK);
		}
		const unsigned char *Ks = tc_smem + (size_t)st * 2 * TC_BK * LB + kw * LB, *Vs = Ks + TC_BK * LB;
		// S^T (keys kw + g and kw + g + 8, heads 2t4 and 2t4 + 1) = K Q^T.
		// Two accumulators (even and odd k-steps), as di_decode_attn_km_k.
		float sc[4] = {0.f, 0.f, 0.f, 0.f}, sd[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
		for (int ks = 0; ks < KS; ks++) {
			const uint32_t w0 = *reinterpret_cast<const uint32_t *>(Ks + g * LB + ks * 16 + 4 * t4);
			const uint32_t w1 = *reinterpret_cast<const uint32_t *>(Ks + (g + 8) * LB + ks * 16 + 4 * t4);
			di_mma16816<__half>(ks & 1 ? sd : sc, di_e4m3x2_half2<0>(w0), di_e4m3x2_half2<0>(w1),
			                    di_e4m3x2_half2<1>(w0), di_e4m3x2_half2<1>(w1), qb[ks][0], qb[ks][1]);
		}
#pragma unroll
		for (int i = 0; i < 4; i++) sc[i] += sd[i];
		const int tk = t0 + kw + g;
		uint32_t pb[2];
		di_km_softmax(sc, tk >= t_lo && tk < t_hi, tk + 8 >= t_lo && tk + 8 < t_hi, scale_log2, m, l, o, pb);
		// O^T += V^T P^T: lane (g, t4) reads stored dimensions 32P + 4g .. + 3
		// of keys 2t4, 2t4 + 1, 2t4 + 8, 2t4 + 9 and pairs them by key.
		const unsigned char *vr = Vs + 2 * t4 * LB + 4 * g;
#pragma unroll
		for (int P = 0; P < NP; P++) {
			const uint32_t w0 = *reinterpret_cast<const uint32_t *>(vr + 32 * P);
			const uint32_t w1 = *reinterpret_cast<const uint32_t *>(vr + LB + 32 * P);
			const uint32_t w2 = *reinterpret_cast<const uint32_t *>(vr + 8 * LB + 32 * P);
			const uint32_t w3 = *reinterpret_cast<const uint32_t *>(vr + 9 * LB + 32 * P);
			const uint32_t x = di_prmt(w0, w1, 0x5140), y = di_prmt(w2, w3, 0x5140); // bytes 0 and 1: m-tile 2P
			const uint32_t xx = di_prmt(w0, w1, 0x7362), yy = di_prmt(w2, w3, 0x7362); // bytes 2 and 3: 2P + 1
			di_mma16816<__half>(o[2 * P], di_e4m3x2_half2<0>(x), di_e4m3x2_half2<1>(x), di_e4m3x2_half2<0>(y),
			                    di_e4m3x2_half2<1>(y), pb[0], pb[1]);
			di_mma16816<__half>(o[2 * P + 1], di_e4m3x2_half2<0>(xx), di_e4m3x2_half2<1>(xx),
			                    di_e4m3x2_half2<0>(yy), di_e4m3x2_half2<1>(yy), pb[0], pb[1]);
		}
		if (t0 + TC_BK < chunk_end) continue;
		// The chunk ends with this tile: its partial results, from the warps'
		// merge in stage st (free: the copies in flight fill the others).
		__syncthreads(); // every warp is done with stage st
		di_km_flush<D>(reinterpret_cast<float *>(tc_smem + (size_t)st * 2 * TC_BK * LB), m, l, o,
		               [](int mt, int g, int hi) { return 32 * (mt >> 1) + 4 * g + 2 * (mt & 1) + hi; },
		               part_acc + (((size_t)s * num_heads + h0) * nsplit + chunk) * D, ml + chunk, group, nsplit);
		chunk++;
		chunk_end = min(t_hi, (chunk + 1) * len);
	}
}

// di_dec_blocks_per_row is how many blocks a (decode row, KV head) of
// di_decode_attn_f8_k (and of di_decode_attn_km_k, unless ctx->dec_km_cpb
// is 0) gets, each taking an even run of the row's chunks
// (di_dec_chunk_keys): enough that rows times that fill ctx->dec_blocks_per_sm
// (32; $DEEPINFER_CUDA_DEC_BPS) blocks a multiprocessor, at most nsplit;
// $DEEPINFER_CUDA_DEC_CPB=n asks ceil(nsplit / n) instead. A chunk's
// arithmetic is the same in any block, so the choice changes no bit; it
// trades the blocks' start-up (the first copies' latency) against
// parallelism for a few long rows. The count follows the rows, not the
// tables' width: the engine's captured graphs have tables as wide as
// max_model_len (Qwen3-0.6B offline: 8 chunks a row where the rows hold
// 1-6), and a count from the width left blocks with no chunk. Offline
// Qwen3-0.6B: 22.5k -> 26.3k output tok/s over 8-bit caches, 18.5k -> 20.3k
// over half ones for chunk runs against one chunk a block; with 8 blocks a
// multiprocessor (whole rows at 256 rows) the tail of unequal rows cost
// more than it saved.
static int di_dec_blocks_per_row(const di_ctx *ctx, size_t rows, int nsplit) {
	if (ctx->dec_cpb > 0) return (nsplit + ctx->dec_cpb - 1) / ctx->dec_cpb;
	const size_t want = (size_t)ctx->dec_blocks_per_sm * (ctx->sm_count > 0 ? ctx->sm_count : 132);
	const size_t g = rows > 0 ? (want + rows - 1) / rows : 1;
	return g < (size_t)nsplit ? (int)g : nsplit;
}

template <int D, int S>
static int di_decode_f8_s(di_ctx *ctx, float *acc, float2 *ml, const float *qp, const __nv_fp8_e4m3 *kp,
                          const __nv_fp8_e4m3 *vp, const int *cu, const int *sk, const int *bt, const di_attn_meta *m,
                          int nsplit, int num_heads, int num_kv_heads, float scale, int window, int decode_only) {
	const size_t shmem = di_decode_f8_smem<D, S>();
	cudaError_t e =
	    cudaFuncSetAttribute(di_decode_attn_f8_k<D, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "attention (decode, 8-bit in registers): cudaFuncSetAttribute");
	const int per_row = di_dec_blocks_per_row(ctx, (size_t)m->num_seqs * num_kv_heads, nsplit);
	di_launch(ctx, di_decode_attn_f8_k<D, S>, dim3(per_row, num_kv_heads, m->num_seqs), TC_THREADS,
	          shmem, acc, ml, qp, kp, vp, cu, sk, bt, m->max_blocks_per_seq, m->block_size, m->num_blocks, num_heads,
	          num_kv_heads, scale * 1.4426950408889634f, window, decode_only, ctx->dec_chunk, nsplit, ctx->check);
	return di_check_launch(ctx, "attention (decode, 8-bit in registers)");
}

// di_prefill_tc launches di_prefill_attn_tc_k for head size D.
template <int D, typename T>
static int di_prefill_tc(di_ctx *ctx, di_outp op, const float *qp, const T *kp, const T *vp, const int *cu,
                         const int *sk, const int *bt, const di_attn_meta *m, int num_heads, int num_kv_heads,
                         float scale, int window) {
	const int tiles = (m->num_tokens + TC_BQ - 1) / TC_BQ + m->num_seqs; // bound on the prefill tiles
	if constexpr (std::is_same<T, __half>::value) {
		// Head size 128 stays on the one-head kernel: at one block of 8 warps a
		// multiprocessor (the registers), 154 against 174 TFLOP/s.
		if constexpr (D == 64) {
			const int group = num_heads / num_kv_heads;
			const int gtiles = (m->num_tokens + 15) / 16 + m->num_seqs; // bound on the tiles of >= 16 rows
			if (ctx->prefill_gqa && GQA_WARPS % group == 0 && gtiles <= 65535) {
				const size_t shmem = di_prefill_gqa_smem<D>();
				cudaError_t e = cudaFuncSetAttribute(di_prefill_attn_gqa_k<D>,
				                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem);
				if (e != cudaSuccess) return di_cuda_fail(ctx, e, "attention (prefill, GQA): cudaFuncSetAttribute");
				const int bq = 16 * (GQA_WARPS / group);
				const int gt = (m->num_tokens + bq - 1) / bq + m->num_seqs;
				di_prefill_attn_gqa_k<D><<<dim3(num_kv_heads, gt), GQA_THREADS, shmem, ctx->stream>>>(
				    op, qp, kp, vp, cu, sk, bt, m->num_seqs, m->max_blocks_per_seq, m->block_size, m->num_blocks,
				    num_heads, num_kv_heads, scale * 1.4426950408889634f, window, ctx->check);
				return di_check_launch(ctx, "attention (prefill, GQA)");
			}
		}
	}
	if constexpr (std::is_same<T, __half>::value || di_is_fp8<T>) {
		const size_t shmem = di_prefill_tc16_smem<D, T>();
		cudaError_t e = cudaFuncSetAttribute(di_prefill_attn_tc16_k<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
		                                     (int)shmem);
		if (e != cudaSuccess) return di_cuda_fail(ctx, e, "attention (prefill, tensor cores): cudaFuncSetAttribute");
		di_prefill_attn_tc16_k<D, T><<<dim3(tiles, num_heads), TC_THREADS, shmem, ctx->stream>>>(
		    op, qp, kp, vp, cu, sk, bt, m->num_seqs, m->max_blocks_per_seq, m->block_size, m->num_blocks, num_heads,
		    num_kv_heads, scale * 1.4426950408889634f, window, ctx->check);
		return di_check_launch(ctx, "attention (prefill, tensor cores)");
	} else {
		const size_t shmem = di_prefill_tc_smem<D>();
		if (shmem > 48 * 1024) {
			cudaError_t e = cudaFuncSetAttribute(di_prefill_attn_tc_k<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
			                                     (int)shmem);
			if (e != cudaSuccess) return di_cuda_fail(ctx, e, "attention (prefill, tensor cores): cudaFuncSetAttribute");
		}
		di_prefill_attn_tc_k<D, T><<<dim3(tiles, num_heads), TC_THREADS, shmem, ctx->stream>>>(
		    op, qp, kp, vp, cu, sk, bt, m->num_seqs, m->max_blocks_per_seq, m->block_size, m->num_blocks, num_heads,
		    num_kv_heads, scale * 1.4426950408889634f, window, ctx->check);
		return di_check_launch(ctx, "attention (prefill, tensor cores)");
	}
}

// di_decode_tc launches di_decode_attn_tc_k for head size D over nsplit
// chunks per row into the partial buffers of di_decode_combine_k, with
// ctx->dec_stages copy stages (ctx->dec_stages_f8 for an 8-bit cache).
template <int D, typename T, int S>
static int di_decode_tc_s(di_ctx *ctx, float *acc, float2 *ml, const float *qp, const T *kp, const T *vp,
                          const int *cu, const int *sk, const int *bt, const di_attn_meta *m, int nsplit,
                          int num_heads, int num_kv_heads, float scale, int window, int decode_only) {
	const size_t shmem = di_decode_tc_smem<D, T, S>();
	cudaError_t e =
	    cudaFuncSetAttribute(di_decode_attn_tc_k<D, T, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "attention (decode, tensor cores): cudaFuncSetAttribute");
	di_launch(ctx, di_decode_attn_tc_k<D, T, S>, dim3(nsplit, num_kv_heads, m->num_seqs), TC_THREADS, shmem, acc, ml,
	          qp, kp, vp, cu, sk, bt, m->max_blocks_per_seq, m->block_size, m->num_blocks, num_heads, num_kv_heads,
	          scale * 1.4426950408889634f, window, decode_only, ctx->dec_chunk, ctx->check);
	return di_check_launch(ctx, "attention (decode, tensor cores)");
}

template <int D, typename T>
static int di_decode_tc(di_ctx *ctx, float *acc, float2 *ml, const float *qp, const T *kp, const T *vp, const int *cu,
                        const int *sk, const int *bt, const di_attn_meta *m, int nsplit, int num_heads,
                        int num_kv_heads, float scale, int window, int decode_only) {
	if constexpr (di_is_fp8<T>) {
		if (ctx->dec_f8_direct && num_heads / num_kv_heads <= 8) {
			switch (ctx->dec_f8_direct) {
			case 2:
				return di_decode_f8_s<D, 2>(ctx, acc, ml, qp, kp, vp, cu, sk, bt, m, nsplit, num_heads, num_kv_heads,
				                            scale, window, decode_only);
			case 4:
				return di_decode_f8_s<D, 4>(ctx, acc, ml, qp, kp, vp, cu, sk, bt, m, nsplit, num_heads, num_kv_heads,
				                            scale, window, decode_only);
			default:
				return di_decode_f8_s<D, 3>(ctx, acc, ml, qp, kp, vp, cu, sk, bt, m, nsplit, num_heads, num_kv_heads,
				                            scale, window, decode_only);
			}
		}
	}
	{
		if (ctx->dec_km && num_heads / num_kv_heads <= 8) {
			const size_t shmem = di_decode_km_smem<D, T>();
			cudaError_t e =
			    cudaFuncSetAttribute(di_decode_attn_km_k<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem);
			if (e != cudaSuccess) return di_cuda_fail(ctx, e, "attention (decode, keys as rows): cudaFuncSetAttribute");
			const int per_row =
			    ctx->dec_km_cpb ? di_dec_blocks_per_row(ctx, (size_t)m->num_seqs * num_kv_heads, nsplit) : nsplit;
			di_launch(ctx, di_decode_attn_km_k<D, T>, dim3(per_row, num_kv_heads, m->num_seqs),
			          TC_THREADS, shmem, acc, ml, qp, kp, vp, cu, sk, bt, m->max_blocks_per_seq, m->block_size,
			          m->num_blocks, num_heads, num_kv_heads, scale * 1.4426950408889634f, window, decode_only,
			          ctx->dec_chunk, nsplit, ctx->check);
			return di_check_launch(ctx, "attention (decode, keys as rows)");
		}
	}
#define DI_DEC_TC(S)                                                                                                 \
	di_decode_tc_s<D, T, S>(ctx, acc, ml, qp, kp, vp, cu, sk, bt, m, nsplit, num_heads, num_kv_heads, scale, window, \
	                        decode_only)
	if constexpr (di_is_fp8<T>) {
		switch (ctx->dec_stages_f8) {
		case 3: return DI_DEC_TC(3);
		case 4: return DI_DEC_TC(4);
		default: return DI_DEC_TC(2);
		}
	} else if constexpr (std::is_same<T, __half>::value) {
		if (ctx->dec_stages == 3) return DI_DEC_TC(3);
		return DI_DEC_TC(2);
	} else {
		return DI_DEC_TC(2);
	}
#undef DI_DEC_TC
}

// attention_paths_16 reports whether every kernel attention<T> runs for
// these arguments writes a 16-bit output itself (di_outp): the decode
// combine and the tensor-core prefill kernels; the float32 kernels do not.
static bool attention_paths_16(const di_ctx *ctx, const di_attn_meta *m, di_dptr q, di_dptr k_cache, di_dptr v_cache,
                               int head_dim, int input_dtype) {
	const bool split = head_dim <= DEC_MAX_D, decode_only = m->max_seqlen_q == 1;
	const bool tc = (input_dtype == DI_BF16 || input_dtype == DI_F16) && ctx->gemm_mode == DI_GEMM_ROUND &&
	                ((q | k_cache | v_cache) % 16 == 0) && (head_dim == 64 || head_dim == 128);
	return ctx->attn_out16 && split && (decode_only || tc);
}

// attention runs di_op_attention over a cache of element type T, into out
// of out_dtype (attention_paths_16 must hold for a 16-bit one).
template <typename T>
static int attention(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache, di_dptr v_cache,
                     const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
                     int sliding_window, int input_dtype) {
	const int *cu = DI_PTR(const int, m->cu_seqlens_q), *sk = DI_PTR(const int, m->seqlens_k),
	          *bt = DI_PTR(const int, m->block_tables);
	const float *qp = DI_PTR(const float, q);
	const T *kp = DI_PTR(const T, k_cache), *vp = DI_PTR(const T, v_cache);
	float *op = DI_PTR(float, out); // the float32 kernels' output (out_dtype DI_F32)
	const di_outp outp{DI_PTR(void, out), out_dtype};
	const bool split = head_dim <= DEC_MAX_D;
	const bool decode_only = m->max_seqlen_q == 1;
	const int vec4 = (head_dim % 4 == 0) && ((k_cache | v_cache) % 16 == 0);
	// Tensor cores for 16-bit models when activations are rounded anyway.
	const bool tc = (input_dtype == DI_BF16 || input_dtype == DI_F16) && ctx->gemm_mode == DI_GEMM_ROUND &&
	                ((q | k_cache | v_cache) % 16 == 0) && (head_dim == 64 || head_dim == 128);
	if (split) {
		const int max_keys = m->max_blocks_per_seq * m->block_size;
		const int min_chunk = ctx->dec_chunk;
		// Enough chunks for the longest row, short (di_dec_chunk) or not.
		const int short_keys = max_keys < DEC_SHORT_KEYS ? max_keys : DEC_SHORT_KEYS;
		int nsplit = (max_keys + min_chunk - 1) / min_chunk;
		nsplit = max(nsplit, (short_keys + DEC_MIN_CHUNK - 1) / DEC_MIN_CHUNK);
		nsplit = nsplit < 1 ? 1 : (nsplit > DEC_MAX_SPLITS ? DEC_MAX_SPLITS : nsplit);
		const int group = num_heads / num_kv_heads, subs = (group + DEC_GROUP - 1) / DEC_GROUP;
		const size_t parts = (size_t)m->num_seqs * num_heads * nsplit;
		void *acc = nullptr, *ml = nullptr;
		int rc = di_scratch(ctx, parts * head_dim * sizeof(float), &acc);
		if (rc != DI_OK) return rc;
		rc = di_scratch(ctx, parts * sizeof(float2), &ml);
		if (rc != DI_OK) {
			di_scratch_free(ctx, acc);
			return rc;
		}
		if (tc && group <= 16 && head_dim == 64) {
			rc = di_decode_tc<64, T>(ctx, (float *)acc, (float2 *)ml, qp, kp, vp, cu, sk, bt, m, nsplit, num_heads,
			                         num_kv_heads, scale, sliding_window, decode_only);
		} else if (tc && group <= 16 && head_dim == 128) {
			rc = di_decode_tc<128, T>(ctx, (float *)acc, (float2 *)ml, qp, kp, vp, cu, sk, bt, m, nsplit, num_heads,
			                          num_kv_heads, scale, sliding_window, decode_only);
		} else {
			di_decode_attn_k<<<dim3(nsplit, num_kv_heads * subs, m->num_seqs), DEC_THREADS, 0, ctx->stream>>>(
			    (float *)acc, (float2 *)ml, qp, kp, vp, cu, sk, bt, m->max_blocks_per_seq, m->block_size,
			    m->num_blocks, num_heads, num_kv_heads, head_dim, scale, sliding_window, decode_only, vec4,
			    min_chunk, ctx->check);
			rc = di_check_launch(ctx, "attention (decode)");
		}
		if (rc == DI_OK) {
			di_launch(ctx, di_decode_combine_k, dim3(m->num_seqs, num_heads), head_dim < 128 ? 64 : 128, 0, outp,
			          (const float *)acc, (const float2 *)ml, cu, num_heads, head_dim, nsplit);
			rc = di_check_launch(ctx, "attention (decode combine)");
		}
		di_scratch_free(ctx, acc);
		di_scratch_free(ctx, ml);
		if (rc != DI_OK) return rc;
	}
	if (decode_only && split) return DI_OK;
	if (tc && head_dim == 64)
		return di_prefill_tc<64>(ctx, outp, qp, kp, vp, cu, sk, bt, m, num_heads, num_kv_heads, scale, sliding_window);
	if (tc && head_dim == 128)
		return di_prefill_tc<128>(ctx, outp, qp, kp, vp, cu, sk, bt, m, num_heads, num_kv_heads, scale, sliding_window);
	if (head_dim <= PF_MAX_D) {
		const size_t shmem = di_prefill_smem(head_dim);
		if (shmem > 48 * 1024) {
			cudaError_t e =
			    cudaFuncSetAttribute(di_prefill_attn_k<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem);
			if (e != cudaSuccess) return di_cuda_fail(ctx, e, "attention (prefill): cudaFuncSetAttribute");
		}
		const int tiles = (m->num_tokens + PF_BQ - 1) / PF_BQ + m->num_seqs; // bound on the prefill tiles
		di_prefill_attn_k<<<dim3(tiles, num_heads), PF_THREADS, shmem, ctx->stream>>>(
		    op, qp, kp, vp, cu, sk, bt, m->num_seqs, m->max_blocks_per_seq, m->block_size, m->num_blocks, num_heads,
		    num_kv_heads, head_dim, scale, sliding_window, vec4 && q % 16 == 0, ctx->check);
		return di_check_launch(ctx, "attention (prefill)");
	}
	const size_t shmem = (head_dim + ATT_TILE) * sizeof(float) + ATT_TILE * sizeof(int);
	dim3 grid(m->num_tokens, num_heads);
	di_attention_k<<<grid, ATT_THREADS, shmem, ctx->stream>>>(
	    op, qp, kp, vp, cu, sk, bt, m->num_seqs, m->max_blocks_per_seq, m->block_size, m->num_blocks, num_heads,
	    num_kv_heads, head_dim, scale, sliding_window, split ? 1 : 0, ctx->check);
	return di_check_launch(ctx, "attention");
}

extern "C" int di_op_attention(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache, di_dptr v_cache,
                               const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
                               int sliding_window, int input_dtype, int cache_dtype) {
	if (m->num_tokens == 0) return DI_OK;
	if (out_dtype != DI_F32 && out_dtype != DI_BF16 && out_dtype != DI_F16)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "attention: out dtype %d (want F32, BF16 or F16)", out_dtype);
	if (out_dtype != DI_F32 && !attention_paths_16(ctx, m, q, k_cache, v_cache, head_dim, input_dtype)) {
		// A float32 kernel runs: into float32 scratch, then rounded.
		const size_t n = (size_t)m->num_tokens * num_heads * head_dim;
		void *tmp = nullptr;
		int rc = di_scratch(ctx, n * sizeof(float), &tmp);
		if (rc != DI_OK) return rc;
		rc = di_op_attention(ctx, (di_dptr)tmp, DI_F32, q, k_cache, v_cache, m, num_heads, num_kv_heads, head_dim,
		                     scale, sliding_window, input_dtype, cache_dtype);
		if (rc == DI_OK) rc = di_narrow(ctx, DI_PTR(void, out), out_dtype, (const float *)tmp, n);
		di_scratch_free(ctx, tmp);
		return rc;
	}
	if (head_dim > ATT_MAX_COLS * ATT_THREADS)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "attention: head_dim %d > %d", head_dim, ATT_MAX_COLS * ATT_THREADS);
	if (m->num_tokens > 0x7fffffff || num_heads > 65535 || m->num_seqs > 65535)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "attention: grid %d tokens x %d heads x %d sequences", m->num_tokens,
		               num_heads, m->num_seqs);
	switch (cache_dtype) {
	case DI_F32:
		return attention<float>(ctx, out, out_dtype, q, k_cache, v_cache, m, num_heads, num_kv_heads, head_dim, scale,
		                        sliding_window, input_dtype);
	case DI_F16:
		return attention<__half>(ctx, out, out_dtype, q, k_cache, v_cache, m, num_heads, num_kv_heads, head_dim, scale,
		                         sliding_window, input_dtype);
	case DI_F8E4M3:
		return attention<__nv_fp8_e4m3>(ctx, out, out_dtype, q, k_cache, v_cache, m, num_heads, num_kv_heads, head_dim, scale,
		                                sliding_window, input_dtype);
	}
	return di_fail(ctx, DI_ERR_UNSUPPORTED, "attention: cache dtype %d (want F32, F16 or F8E4M3)", cache_dtype);
}

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
// blocks (the multiprocessors' count; $DEEPINFER_CUDA_MLA_STAGED_MAX):
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
