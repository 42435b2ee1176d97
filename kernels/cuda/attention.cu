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
//
// Files: this one dispatches di_op_attention; attention_decode.cu holds the
// decode kernels, attention_prefill.cu the prefill kernels and the plain
// fallback, attention_mla.cu MLA; attention.cuh and attention_tc.cuh what
// they share.
#include "attention.cuh"

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
//     di_prefill_attn_tc_k (tensor cores; see its section in attention_prefill.cu); otherwise
//     di_prefill_attn_k tiles PF_BQ query rows of one head against PF_BK keys held in shared
//     memory, with key tiles aligned to absolute key positions and each row's
//     scores summed in a fixed order; a row's result depends only on its own
//     visible keys, so a chunked prefill gives the bits of a whole one.
//   - di_attention_k (one block per (row, head)) serves prefill rows whose
//     head_dim exceeds PF_MAX_D, and decode rows whose head_dim exceeds
//     DEC_MAX_D.
// A decode row and the same row computed inside a longer prefill chunk go
// through different kernels and agree to rounding, not bit for bit.

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
// of out_dtype (attention_paths_16 must hold for a 16-bit one): the split
// decode rows (di_attention_decode), then every other row
// (di_attention_prefill).
template <typename T>
static int attention(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache, di_dptr v_cache,
                     const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
                     int sliding_window, int input_dtype, const float *sinks) {
	const int *cu = DI_PTR(const int, m->cu_seqlens_q), *sk = DI_PTR(const int, m->seqlens_k),
	          *bt = DI_PTR(const int, m->block_tables);
	const float *qp = DI_PTR(const float, q);
	const T *kp = DI_PTR(const T, k_cache), *vp = DI_PTR(const T, v_cache);
	const di_outp outp{DI_PTR(void, out), out_dtype};
	const bool split = head_dim <= DEC_MAX_D;
	const bool decode_only = m->max_seqlen_q == 1;
	const int vec4 = (head_dim % 4 == 0) && ((k_cache | v_cache) % 16 == 0);
	// Tensor cores for 16-bit models when activations are rounded anyway.
	const bool tc = (input_dtype == DI_BF16 || input_dtype == DI_F16) && ctx->gemm_mode == DI_GEMM_ROUND &&
	                ((q | k_cache | v_cache) % 16 == 0) && (head_dim == 64 || head_dim == 128);
	if (split) {
		const int rc = di_attention_decode<T>(ctx, outp, qp, kp, vp, cu, sk, bt, m, num_heads, num_kv_heads, head_dim,
		                                      scale, sliding_window, tc, decode_only, vec4, sinks);
		if (rc != DI_OK) return rc;
	}
	if (decode_only && split) return DI_OK;
	return di_attention_prefill<T>(ctx, outp, q, qp, kp, vp, cu, sk, bt, m, num_heads, num_kv_heads, head_dim, scale,
	                               sliding_window, tc, split, vec4, sinks);
}

// attention_op is di_op_attention with sink logits (F32 [num_heads] or null).
static int attention_op(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache, di_dptr v_cache,
                        const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
                        int sliding_window, int input_dtype, int cache_dtype, const float *sinks) {
	if (m->num_tokens == 0) return DI_OK;
	if (out_dtype != DI_F32 && out_dtype != DI_BF16 && out_dtype != DI_F16)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "attention: out dtype %d (want F32, BF16 or F16)", out_dtype);
	if (out_dtype != DI_F32 && !attention_paths_16(ctx, m, q, k_cache, v_cache, head_dim, input_dtype)) {
		// A float32 kernel runs: into float32 scratch, then rounded.
		const size_t n = (size_t)m->num_tokens * num_heads * head_dim;
		void *tmp = nullptr;
		int rc = di_scratch(ctx, n * sizeof(float), &tmp);
		if (rc != DI_OK) return rc;
		rc = attention_op(ctx, (di_dptr)tmp, DI_F32, q, k_cache, v_cache, m, num_heads, num_kv_heads, head_dim, scale,
		                  sliding_window, input_dtype, cache_dtype, sinks);
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
		                        sliding_window, input_dtype, sinks);
	case DI_F16:
		return attention<__half>(ctx, out, out_dtype, q, k_cache, v_cache, m, num_heads, num_kv_heads, head_dim, scale,
		                         sliding_window, input_dtype, sinks);
	case DI_F8E4M3:
		return attention<__nv_fp8_e4m3>(ctx, out, out_dtype, q, k_cache, v_cache, m, num_heads, num_kv_heads, head_dim, scale,
		                                sliding_window, input_dtype, sinks);
	}
	return di_fail(ctx, DI_ERR_UNSUPPORTED, "attention: cache dtype %d (want F32, F16 or F8E4M3)", cache_dtype);
}

extern "C" int di_op_attention(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache, di_dptr v_cache,
                               const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
                               int sliding_window, int input_dtype, int cache_dtype) {
	return attention_op(ctx, out, out_dtype, q, k_cache, v_cache, m, num_heads, num_kv_heads, head_dim, scale,
	                    sliding_window, input_dtype, cache_dtype, nullptr);
}

// di_op_attention_sinks is di_op_attention with gpt-oss's learned sink
// logits (sinks: F32 [num_heads]; 0: none): each head's joins the softmax
// denominator of its rows and adds no value.
extern "C" int di_op_attention_sinks(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache,
                                     di_dptr v_cache, const di_attn_meta *m, int num_heads, int num_kv_heads,
                                     int head_dim, float scale, int sliding_window, int input_dtype, int cache_dtype,
                                     di_dptr sinks) {
	return attention_op(ctx, out, out_dtype, q, k_cache, v_cache, m, num_heads, num_kv_heads, head_dim, scale,
	                    sliding_window, input_dtype, cache_dtype, DI_PTR(const float, sinks));
}
