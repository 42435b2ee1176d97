// internal.h: what the host runtime (csrc/runtime.cu) shares with the kernel
// files (kernels/cuda/*.cu) inside libdeepinfer_cuda.so. Not part of the ABI.
#pragma once

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cublasLt.h>

#include <cstdarg>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "deepinfer_cuda.h"

// Pinned staging chunk for uploads. Small uploads pack into the current
// chunk; a chunk is refilled only once its event (recorded after its last
// copy) has completed, one trip around the ring later.
struct di_stage {
	void *host = nullptr;
	cudaEvent_t done = nullptr;
};

#define DI_SKINNY_SEMS 1024 // tiles of one split-K launch of the skinny GEMM (gemm_skinny.cu)

// Defaults of the tuning switches: di_options' zero values (set_options)
// and a new context's.
#define DI_DEFAULT_GEMV_ROWS 4
#define DI_DEFAULT_GEMV_MAX_ELEMS ((size_t)4 << 20)
#define DI_DEFAULT_DEC_CHUNK 256
#define DI_DEFAULT_DEC_STAGES 2
#define DI_DEFAULT_DEC_F8_STAGES 2
#define DI_DEFAULT_DEC_F8_DIRECT 3
#define DI_DEFAULT_DEC_BLOCKS_PER_SM 32
#define DI_DEFAULT_SAMPLE_SPLIT (1 << 30)
#define DI_DEFAULT_SAMPLE_MIN_CHUNKS 4
#define DI_DEFAULT_MOE_GEMM_PAIRS 2048

// di_moe_route_args is one call's MoE routing (moe_route, moe_set_route):
// router logits [num_tokens, e] (and the optional correction bias [e]) in,
// top_k expert ids and weights a token out.
struct di_moe_route_args {
	int *ids;
	float *weights;
	const float *logits, *bias;
	int num_tokens, e, top_k, scoring, method, num_groups, topk_groups, norm_topk;
	float scaling;
};

struct di_ctx {
	int device = 0;
	cudaStream_t stream = nullptr;
	cublasHandle_t cublas = nullptr;
	void *cublas_workspace = nullptr; // also cuBLASLt's (the same stream)
	size_t cublas_workspace_bytes = 0;
	cublasLtHandle_t lt = nullptr;
	struct di_fp8_lt_cache *fp8_lt = nullptr; // fp8.cu's plans of cuBLASLt FP8 GEMMs
	struct di_gemm_plans *gemm_plans = nullptr; // runtime.cu's plans of cuBLASLt 16-bit and float32 GEMMs
	int gemm_plans_on = 0;                      // di_options.gemm_plans
	di_gemm_stats gemm_counts = {};             // runtime.cu's plans made and GEMMs run through them
	unsigned *check = nullptr;      // device check word (DI_CHECK_* bits)
	unsigned *check_host = nullptr; // pinned mirror for reading it back
	std::vector<di_stage> stages;
	size_t stage_bytes = 0;
	size_t cur_stage = 0; // chunk being filled
	size_t stage_off = 0; // bytes used in it
	int num_graphs = 0;
	// moe_set_add: the addend of the MoE combine passes writing into
	// moe_add_out (row r of out at row r of moe_add), and whether one ran.
	const float *moe_add = nullptr;
	const float *moe_add_out = nullptr;
	bool moe_add_used = false;
	// moe_set_route: the routing the next moe runs itself (moe.cu's
	// di_moe_route_args), whether one is set, and whether a moe took it.
	di_moe_route_args moe_route = {};
	bool moe_route_set = false;
	bool moe_route_used = false;
	// The tuning switches (di_options, set_options; the comments name the
	// di_options field). How float32 activations enter 16-bit GEMMs: gemm_mode.
	int gemm_mode = DI_GEMM_ROUND;
	int pdl = 1; // programmatic dependent launch of the kernels di_launch starts; !disable_pdl
	// Linears of up to this many rows (at most DI_GEMV_MAX_ROWS) on the GEMV
	// kernel, 0: none; gemv_rows.
	int gemv = DI_DEFAULT_GEMV_ROWS;
	// Above one row, GEMV weights of at most this many elements; gemv_max_elems.
	size_t gemv_max_elems = DI_DEFAULT_GEMV_MAX_ELEMS;
	// 16-bit linears of up to this many rows (at most DI_SKINNY_MAX_ROWS) on
	// the skinny GEMM; skinny_rows. Off by default: batch-invariant, but
	// slower than cuBLAS on an H200 at every Llama-3.2-1B shape measured
	// (kernels/cuda/NOTES.md).
	int skinny = 0;
	// The shortest key chunk of a split decode row (a multiple of
	// DI_DEC_CHUNK_ALIGN): longer chunks mean fewer partial results and
	// longer copy pipelines, shorter ones more blocks for a few long rows;
	// decode_chunk (the Go backend's Options.DecodeChunk, YAML
	// cuda.decode_attention_chunk).
	int dec_chunk = DI_DEFAULT_DEC_CHUNK;
	// Sampling calls of at most this many rows cut each row into chunks for
	// the whole-row passes (sample.cu's DsSplit; 0: never; default every
	// call), at least sample_min_chunks of them; sample_split_rows,
	// sample_min_chunks.
	int sample_split = DI_DEFAULT_SAMPLE_SPLIT;
	int sample_min_chunks = DI_DEFAULT_SAMPLE_MIN_CHUNKS;
	int sm_count = 0; // multiprocessors of the device
	// One-row GEMVs with k <= 2048 take 8 columns a block, one chunk each,
	// instead of 4 columns with two chunks; !disable_gemv_wide.
	int gemv_wide = 1;
	// Prefill attention over half caches runs the query heads of a KV head
	// in one block (di_prefill_attn_gqa_k); !disable_prefill_gqa.
	int prefill_gqa = 1;
	// Copy stages of the heads-as-rows tensor-core decode kernel
	// (di_decode_attn_tc_k: groups over 8, or dec_km 0; a tile a stage, all
	// but one in flight): over half caches (decode_stages, 2 or 3) and over
	// 8-bit caches (decode_f8_stages, 2 to 4). The keys-as-rows kernel
	// always runs two.
	int dec_stages = DI_DEFAULT_DEC_STAGES;
	// Decode over half and 8-bit caches with at most 8 query heads a KV head
	// runs di_decode_attn_km_k (keys as the tensor-core rows);
	// !disable_decode_km (0: di_decode_attn_tc_k).
	int dec_km = 1;
	int dec_stages_f8 = DI_DEFAULT_DEC_F8_STAGES;
	// Decode over 8-bit caches with at most 8 query heads a KV head runs
	// di_decode_attn_f8_k (the cache bytes widened in registers) with this
	// many copy stages (2 to 4; 0: di_decode_attn_km_k); decode_f8_direct.
	int dec_f8_direct = DI_DEFAULT_DEC_F8_DIRECT;
	// n: a row gets ceil(nsplit / n) blocks of di_decode_attn_f8_k (0: as
	// many as fill the device; di_dec_blocks_per_row); decode_chunks_per_block.
	int dec_cpb = 0;
	// dec_blocks_per_sm is the blocks a multiprocessor that
	// di_dec_blocks_per_row fills with decode rows; decode_blocks_per_sm.
	int dec_blocks_per_sm = DI_DEFAULT_DEC_BLOCKS_PER_SM;
	// mla_staged_max is the largest MLA grid (rows x heads) that stages its
	// keys in shared memory; -1: the multiprocessors' count; mla_staged_max.
	int mla_staged_max = -1;
	// moe_mma: the expert GEMVs of 16-bit weights on tensor cores
	// (di_moe_mma_k) where k is a multiple of 32; !disable_moe_mma (0 keeps
	// the CUDA-core GEMV).
	int moe_mma = 1;
	// MoE over 16-bit experts from this many (token, k) pairs runs the
	// grouped GEMM (di_moe_gemm_k); 0: never; moe_gemm_pairs.
	int moe_gemm_pairs = DI_DEFAULT_MOE_GEMM_PAIRS;
	// FP8 linears above the GEMV's rows on cuBLASLt where the weight allows
	// it; !disable_fp8_lt.
	int fp8_lt_on = 1;
	// MoE's grouped GEMM on wgmma (di_moe_wg_k) where the build and the
	// shapes allow it; !disable_moe_wgmma.
	int moe_wg = 1;
	// MLA prefill attention on wgmma (di_mpf_wg_k) where the build allows
	// it; !disable_mla_prefill_wgmma.
	int mla_pf_wg = 1;
	int fill_uninit = 0; // every allocation filled with 0xFF bytes; fill_uninitialized
	// Attention kernels round a 16-bit output as they store it (1), or
	// every 16-bit output goes through float32 scratch and a narrowing pass
	// (0, the same bits); !disable_attn_out16.
	int attn_out16 = 1;
	// di_decode_attn_km_k gets as many blocks a row as di_decode_attn_f8_k
	// does (1) or one a chunk (0); !decode_km_block_per_chunk.
	int dec_km_cpb = 1;
	unsigned *skinny_sem = nullptr; // DI_SKINNY_SEMS split-K tile counters of the skinny GEMM, zero between launches
	char err[1024] = {0};

	// Caching allocator: free blocks by rounded size; sizes of live blocks.
	std::mutex mem_mu;
	std::multimap<size_t, void *> free_blocks;
	std::map<void *, size_t> live;
	// Blocks first handed out while capturing a graph: the graph may write
	// them at every replay, so while any graph exists they are reused only by
	// allocations made during capture (the graphs' shared pool).
	std::map<void *, size_t> graph_owned;
	std::multimap<size_t, void *> graph_free;
	di_mem_stats stats = {};
};

// di_fail records a message in ctx->err and returns code.
int di_fail(di_ctx *ctx, int code, const char *fmt, ...);

// di_cuda_fail reports a failed CUDA call (name, code and message).
int di_cuda_fail(di_ctx *ctx, cudaError_t e, const char *what);

// di_check_launch checks the last launch of op.
int di_check_launch(di_ctx *ctx, const char *op);

// di_scratch allocates a device buffer for the duration of one operation;
// di_scratch_free returns it (stream-ordered, so the kernels that use it still
// may be queued).
int di_scratch(di_ctx *ctx, size_t bytes, void **out);
void di_scratch_free(di_ctx *ctx, void *p);

// di_gemm computes the row-major out[m, n] (float32) = x[m, k] w[n, k]^T with
// x and w of dtype (F32, BF16 or F16, both the same) on cuBLAS with float32
// accumulation; all three are dense.
int di_gemm(di_ctx *ctx, float *out, const void *x, const void *w, int dtype, int m, int n, int k);
// di_gemm_to is di_gemm with the output in out_dtype (DI_F32, DI_BF16 or
// DI_F16: the float32 accumulation rounded to nearest).
int di_gemm_to(di_ctx *ctx, void *out, int out_dtype, const void *x, const void *w, int dtype, int m, int n, int k);

// Operation entry points, implemented in kernels/cuda/*.cu.
extern "C" {
int di_op_embedding(di_ctx *ctx, di_dptr out, di_dptr table, int table_dtype, di_dptr ids,
                    int num_tokens, int hidden, int vocab);
int di_op_rms_norm(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr residual, di_dptr x, di_dptr weight, int rows,
                   int n, float eps);
int di_op_linear(di_ctx *ctx, di_dptr out, di_dptr x, int x_dtype, di_dptr w, int w_dtype, di_dptr bias, int m,
                 int n, int k);
int di_op_linear_input_dtype(di_ctx *ctx, int w_dtype, int m);
int di_op_silu_mul(di_ctx *ctx, di_dptr out, di_dptr gate_up, int rows, int n);
int di_op_gated_linear(di_ctx *ctx, di_dptr act, di_dptr gu, di_dptr x, di_dptr w, int w_dtype, int m, int n, int k);
int di_op_gated_mlp(di_ctx *ctx, di_dptr out, di_dptr x, int x_dtype, di_dptr gate_up, di_dptr down, int w_dtype,
                    int m, int n, int hidden);
int di_op_add(di_ctx *ctx, di_dptr out, di_dptr a, di_dptr b, uint64_t n);
int di_op_concat(di_ctx *ctx, di_dptr out, di_dptr a, di_dptr b, int rows, int m, int n);
int di_op_rope(di_ctx *ctx, di_dptr x, di_dptr positions, di_dptr cos, di_dptr sin, int num_tokens,
               int max_pos, int num_heads, int head_size, int offset, int rotary_dim, int interleaved);
int di_op_write_cache(di_ctx *ctx, di_dptr cache, di_dptr src, di_dptr slot_mapping, int num_tokens,
                      int w, int width, int col, int num_slots, int cache_dtype);
int di_op_qkv_prepare(di_ctx *ctx, const di_qkv *a);
int di_op_split_columns(di_ctx *ctx, di_dptr x, int rows, int x_pitch, int nparts, const di_dptr *parts,
                        const int *widths);
int di_op_attention(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache, di_dptr v_cache,
                    const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
                    int sliding_window, int input_dtype, int cache_dtype);
// di_narrow rounds n float32 values of src to dtype (DI_BF16 or DI_F16) into dst.
int di_narrow(di_ctx *ctx, void *dst, int dtype, const float *src, size_t n);
int di_op_mla_attention(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, di_dptr wkvb, int w_dtype,
                        const di_attn_meta *m, int num_heads, int nope_dim, int rope_dim,
                        int kv_lora_rank, int v_head_dim, float scale);
int di_op_moe_route(di_ctx *ctx, di_dptr ids, di_dptr weights, di_dptr logits, di_dptr bias,
                    int num_tokens, int num_experts, int top_k, int scoring, int method,
                    int num_groups, int topk_groups, int norm_topk_prob, float scaling_factor);
int di_op_moe(di_ctx *ctx, di_dptr out, di_dptr x, int x_dtype, di_dptr ids, di_dptr weights, di_dptr gate_up,
              di_dptr down, int w_dtype, int num_tokens, int top_k, int hidden, int inter,
              int num_experts);
int di_op_resolve_placeholders(di_ctx *ctx, di_dptr ids, di_dptr from_row, di_dptr sampled,
                               int num_tokens, int num_sampled);
int di_op_shift_accepted(di_ctx *ctx, di_dptr positions, di_dptr slot_mapping, di_dptr seqlens_k,
                         di_dptr cu_seqlens_q, di_dptr block_tables, di_dptr shift_from, di_dptr accepted,
                         int num_seqs, int num_tokens, int width, int block_size, int num_accepted);
int di_op_token_mask(di_ctx *ctx, di_dptr logits, int num_rows, int vocab, di_dptr mask_rows, di_dptr masks,
                     int num_masks);
int di_op_logits(di_ctx *ctx, di_dptr out, di_dptr hidden, di_dptr rows, int num_rows,
                 int num_hidden, di_dptr norm, di_dptr head, int head_dtype, int dim, int vocab,
                 float eps);
int di_op_argmax(di_ctx *ctx, di_dptr out, di_dptr logits, int num_rows, int vocab);
int di_op_accept_drafts(di_ctx *ctx, di_dptr out, di_dptr tokens, int num_tokens, di_dptr drafts, int num_drafts,
                        di_dptr layout, int num_entries);
int di_op_sample(di_ctx *ctx, di_dptr out, di_dptr logits, int num_rows, int vocab, di_dptr rows,
                 di_dptr edits, int max_candidates, int all_greedy);
int di_op_widen(di_ctx *ctx, float *dst, const void *src, int src_dtype, size_t n);
// FP8 block-scaled weights (kernels/cuda/fp8.cu, fp8_moe.cu).
int di_op_fp8_linear(di_ctx *ctx, di_dptr out, di_dptr x, const di_fp8_weight *w, di_dptr bias, int m, int n, int k,
                     int path);
int di_op_fp8_moe(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, const di_fp8_weight *gate_up,
                  const di_fp8_weight *down, int num_tokens, int top_k, int hidden, int inter, int num_experts,
                  int path);
// MLA over 16- and 8-bit latent caches (kernels/cuda/attention_mla_tc.cu).
int di_op_mla_write_cache(di_ctx *ctx, di_dptr cache, int cache_dtype, di_dptr ckv, di_dptr kpe,
                          di_dptr slot_mapping, int num_tokens, int kvl, int rope, int num_slots);
int di_op_mla_prepare(di_ctx *ctx, di_dptr q, di_dptr cache, int cache_dtype, di_dptr q_in, int q_stride, di_dptr kva,
                      int kva_stride, di_dptr normw, di_dptr slot_mapping, di_dptr positions, di_dptr cos, di_dptr sin,
                      int num_tokens, int max_pos, int num_heads, int nope, int rope, int kvl, int interleaved, float eps,
                      int num_slots);
int di_op_moe_set_add(di_ctx *ctx, di_dptr out, di_dptr add);
int di_op_embed_norm_concat(di_ctx *ctx, di_dptr out, di_dptr table, int table_dtype, di_dptr ids, di_dptr enorm,
                            di_dptr x, di_dptr xnorm, int rows, int h, int vocab, float eps);
int di_op_moe_set_route(di_ctx *ctx, di_dptr ids, di_dptr weights, di_dptr logits, di_dptr bias, int num_tokens,
                        int num_experts, int top_k, int scoring, int method, int num_groups, int topk_groups,
                        int norm_topk_prob, float scaling_factor);
int di_op_mla_attention_tc(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, int cache_dtype, di_dptr wkvb,
                           int w_dtype, const di_attn_meta *m, int num_heads, int nope_dim, int rope_dim,
                           int kv_lora_rank, int v_head_dim, float scale);
int di_op_mla_latent_attention(di_ctx *ctx, di_dptr olat, di_dptr q_lat, di_dptr cache, int cache_dtype,
                               const di_attn_meta *m, int num_heads, int kvl, int rope);
// MLA prefill rows in the non-absorbed form (kernels/cuda/attention_mla_prefill.cu).
int di_op_mla_attention_pf(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, int cache_dtype, di_dptr wkvb,
                           int w_dtype, const di_attn_meta *m, int num_heads, int nope_dim, int rope_dim,
                           int kv_lora_rank, int v_head_dim, float scale, const di_mla_pf_hint *hint);
int di_op_fp8_dequant(di_ctx *ctx, di_dptr out, int out_dtype, const di_fp8_weight *w, int rows, int k);
// di_lt_desc is cuBLASLt's descriptors and chosen algorithm for one GEMM
// shape: the part runtime.cu's 16-bit and float32 plans (di_gemm_plan)
// and fp8.cu's block-scaled FP8 plans share; each keeps its own key beside
// it.
struct di_lt_desc {
	bool ok = false; // false: cuBLASLt has no algorithm for it
	cublasLtMatmulDesc_t op = nullptr;
	cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
	cublasLtMatmulAlgo_t algo = {};
};
// di_lt_desc_destroy destroys p's descriptors (the caller resets p).
void di_lt_desc_destroy(di_lt_desc &p);
// di_lt_pick_algo asks cuBLASLt's heuristic for one algorithm over p's
// descriptors, within ctx's cuBLAS workspace and for operands aligned to
// align bytes, and keeps it in p.algo; false if the queries fail or it
// offers none. Cost: some microseconds of host time, once a shape.
bool di_lt_pick_algo(di_ctx *ctx, di_lt_desc &p, int align);
int di_op_fp8_lt_peak(di_ctx *ctx, int m, int n, int k, int iters, float *ms);
// di_fp8_lt_free releases fp8.cu's cached cuBLASLt plans (context teardown).
void di_fp8_lt_free(di_ctx *ctx);
// Sliding-window rings, attention sinks, Gemma and gpt-oss operations.
int di_op_attention_sinks(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache, di_dptr v_cache,
                          const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
                          int sliding_window, int input_dtype, int cache_dtype, di_dptr sinks);
int di_op_ring_attention(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k, di_dptr v, di_dptr k_ring,
                         di_dptr v_ring, di_dptr slots, int num_slots, const di_attn_meta *m, int max_seqlen_k,
                         int num_heads, int num_kv_heads, int head_dim, float scale, int window, int input_dtype,
                         int cache_dtype, di_dptr sinks);
int di_op_scale(di_ctx *ctx, di_dptr out, di_dptr x, uint64_t n, float s);
int di_op_gelu_tanh_mul(di_ctx *ctx, di_dptr out, di_dptr gate_up, int rows, int n);
int di_op_softcap(di_ctx *ctx, di_dptr x, uint64_t n, float c);
int di_op_moe_clamped_swiglu(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, di_dptr gate_up,
                             di_dptr gate_up_bias, di_dptr down, di_dptr down_bias, int w_dtype, int num_tokens,
                             int top_k, int hidden, int inter, int num_experts, float limit, float alpha);
// MXFP4 expert weights (kernels/cuda/moe.cu, mxfp4.cuh).
int di_op_moe_clamped_swiglu_mxfp4(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights,
                                   di_dptr gate_up_blocks, di_dptr gate_up_scales, di_dptr gate_up_bias,
                                   di_dptr down_blocks, di_dptr down_scales, di_dptr down_bias, int num_tokens,
                                   int top_k, int hidden, int inter, int num_experts, float limit, float alpha);
// Block-quantized weights (kernels/cuda/quant.cu, quant_moe.cu).
int di_op_quant_linear(di_ctx *ctx, di_dptr out, di_dptr x, const di_quant_weight *w, di_dptr bias, int m, int n,
                       int k, int path);
int di_op_quant_logits(di_ctx *ctx, di_dptr out, di_dptr hidden, di_dptr rows, int num_rows, int num_hidden,
                       di_dptr norm, const di_quant_weight *head, int dim, int vocab, float eps);
int di_op_quant_embedding(di_ctx *ctx, di_dptr out, const di_quant_weight *table, di_dptr ids, int num_tokens,
                          int hidden, int vocab);
int di_op_quant_moe(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, const di_quant_weight *gate_up,
                    const di_quant_weight *down, int num_tokens, int top_k, int hidden, int inter, int num_experts);
int di_op_quant_dequant(di_ctx *ctx, di_dptr out, int out_dtype, const di_quant_weight *w, int rows, int k);
// di_gather_norm writes rows of hidden (rows[i], or row i when rows is
// null; a row outside [0, num_hidden) gives zeros and sets DI_CHECK_LOGITS)
// into dst [num_rows, dim] as float32, normalized as logits normalizes them
// when norm is set: logits' first step (kernels/cuda/ops.cu).
int di_gather_norm(di_ctx *ctx, float *dst, const float *hidden, const int *rows, int num_rows, int num_hidden,
                   const float *norm, int dim, float eps);
// di_add_into computes out[i] += a[i] (+ bias[i % n] when bias is set) over
// rows*n elements.
int di_add_into(di_ctx *ctx, float *out, const float *a, const float *bias, size_t rows, int n);
// di_probe_kernel is a kernel-carrying function that create calls to check
// that the library holds an image for the device.
cudaError_t di_probe_kernel(void);
}
