// attention.cuh: what the attention files share. attention.cu dispatches
// di_op_attention between the decode kernels (attention_decode.cu) and the
// prefill and fallback kernels (attention_prefill.cu); attention_mla.cu is
// multi-head latent attention. Here: the paged-cache helpers, the 16-bit
// capable output, the decode split's limits and chunking, and the two
// halves of di_op_attention. attention_tc.cuh adds the tensor-core building
// blocks.
#pragma once

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

// di_sink_inv is the factor that turns a row's accumulated output into its
// normalized one: 1/l without a sink (sink -inf; 0 for an empty row), else
// with the sink's logit joining the denominator and adding no value (gpt-oss,
// kernels.AttentionParams.Sinks), the max taken over the scores and the
// sink: a / (l a + exp(sink - max)), a = exp(m - max). m, l and sink are in
// the units of the kernel's exponentials: natural (exp) or log2 (exp2).
template <bool LOG2>
__device__ __forceinline__ float di_sink_inv(float m, float l, float sink) {
	if (sink == -CUDART_INF_F) return l > 0.f ? 1.f / l : 0.f;
	const float mx = fmaxf(m, sink);
	const float a = LOG2 ? exp2f(m - mx) : expf(m - mx), e = LOG2 ? exp2f(sink - mx) : expf(sink - mx);
	return a / (l * a + e);
}

// di_sink is head h's sink logit times mul (log2e for kernels in log2
// units), or -inf when sinks is null.
__device__ __forceinline__ float di_sink(const float *sinks, int h, float mul) {
	return sinks ? sinks[h] * mul : -CUDART_INF_F;
}

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

// ---------------------------------------------------------------- decode: split over keys (limits)

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

// di_attention_decode and di_attention_prefill are the halves of
// di_op_attention (attention.cu) over a cache of element type T (float,
// __half or __nv_fp8_e4m3, instantiated in their files), with the arguments
// di_op_attention checked and typed: out (outp; float32, or 16-bit where
// attention_paths_16 allows it), q (qp, at the device address q), the
// caches (kp, vp) and the metadata (cu, sk, bt: m's arrays). tc: the
// tensor-core kernels may run (16-bit inputs, GEMM mode round, 16-byte
// aligned q and caches, head size 64 or 128); vec4: the caches allow 16-byte
// loads. di_attention_decode runs the split-over-keys decode of the decode
// rows, for head_dim <= DEC_MAX_D (attention_decode.cu): one kernel over the
// chunks into scratch, then di_decode_combine_k. di_attention_prefill runs
// every other row: the prefill rows, and the decode rows too when split is
// false (head_dim > DEC_MAX_D; attention_prefill.cu). Both queue their
// kernels on ctx's stream and return a di_status. sinks: F32 [num_heads]
// sink logits (kernels.AttentionParams.Sinks) or null.
template <typename T>
int di_attention_decode(di_ctx *ctx, di_outp outp, const float *qp, const T *kp, const T *vp, const int *cu,
                        const int *sk, const int *bt, const di_attn_meta *m, int num_heads, int num_kv_heads,
                        int head_dim, float scale, int sliding_window, bool tc, bool decode_only, int vec4,
                        const float *sinks);
template <typename T>
int di_attention_prefill(di_ctx *ctx, di_outp outp, di_dptr q, const float *qp, const T *kp, const T *vp,
                         const int *cu, const int *sk, const int *bt, const di_attn_meta *m, int num_heads,
                         int num_kv_heads, int head_dim, float scale, int sliding_window, bool tc, bool split,
                         int vec4, const float *sinks);
