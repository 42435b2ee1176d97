/*
 * deepinfer_cuda.h: the C ABI of libdeepinfer_cuda.so, the CUDA backend's
 * native half (host runtime in csrc/, device kernels in kernels/cuda/*.cu).
 *
 * Plain C with no CUDA include, so that the Go side (kernels/cuda, through
 * cgo) builds on machines without CUDA and opens the library at run time with
 * dlopen. The library exports one symbol, di_get_api, which fills a table of
 * function pointers; every other entry point is reached through that table.
 * DI_ABI_VERSION changes whenever the table, any signature or any struct
 * changes, and di_get_api refuses a caller built against another version.
 * The library reads no environment variable: every tuning switch is a
 * field of di_options, given to set_options.
 *
 * Conventions:
 *   - Every function returning int returns DI_OK (0) or a di_status; the
 *     message of the last failure of a context is di_api.last_error(ctx).
 *     Functions that run before a context exists take an error buffer.
 *   - Device memory is addressed by di_dptr (a device pointer as an integer).
 *   - A context owns one device, one non-blocking stream, a cuBLAS handle, a
 *     caching device allocator and pinned staging buffers. All work is queued
 *     in order on its stream; a context is not safe for concurrent calls
 *     (the Go side serializes them), except free, which may be called from
 *     any thread.
 *   - Kernels that meet an index outside its table (token id, position, slot,
 *     block, row, expert) cannot return an error while running: they set a
 *     bit of the context's device check word (DI_CHECK_*) and write zeros.
 *     sync and download report and clear that word (DI_ERR_DEVICE_CHECK).
 *   - Activations, norm weights and biases are float32 (KV caches F32, F16
 *     or F8E4M3, see write_cache and attention); weight
 *     matrices and embedding tables are F32, BF16 or F16 (di_dtype). GEMMs run
 *     on cuBLAS with float32 accumulation; BF16 and F16 weights multiply
 *     activations rounded to the weight's dtype (or split in two, see
 *     di_gemm_mode).
 */
#ifndef DEEPINFER_CUDA_H
#define DEEPINFER_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DI_ABI_VERSION 31u

/* The most parts one split_columns call writes. */
#define DI_MAX_SPLIT 4

/* mla_attention_pf: a sequence with at least this many query rows in a
 * call takes the non-absorbed prefill kernels. */
#define DI_MLA_PREFILL_MIN_ROWS 16
/* mla_attention_pf's query tiles, and the multiple its expanded key rows are
 * rounded up to, in rows. */
#define DI_MLA_PREFILL_TILE 64

/* Element types; the values equal kernels.DType's. */
enum di_dtype { DI_F32 = 1, DI_BF16 = 2, DI_F16 = 3, DI_I32 = 4, DI_F8E4M3 = 5 };

enum di_status {
	DI_OK = 0,
	DI_ERR_CUDA = 1,         /* a CUDA runtime call failed */
	DI_ERR_OOM = 2,          /* device memory exhausted (after emptying the cache) */
	DI_ERR_NO_DEVICE = 3,    /* no usable CUDA device or driver */
	DI_ERR_INVALID = 4,      /* bad argument */
	DI_ERR_UNSUPPORTED = 5,  /* a dtype or size this build does not handle */
	DI_ERR_CUBLAS = 6,       /* a cuBLAS call failed */
	DI_ERR_DEVICE_CHECK = 7, /* a kernel met an index out of range; see DI_CHECK_* */
	DI_ERR_OUT_OF_RANGE = 8, /* a host-side index check failed */
	DI_ERR_ARCH = 9,         /* the library has no kernel image for this device */
	DI_ERR_CAPTURING = 10    /* the call is not allowed during graph capture */
};

/* Bits of the device check word: which kernel met a bad index. */
enum di_check {
	DI_CHECK_EMBEDDING = 1u << 0,
	DI_CHECK_ROPE = 1u << 1,
	DI_CHECK_WRITE_CACHE = 1u << 2,
	DI_CHECK_ATTENTION = 1u << 3,
	DI_CHECK_MLA = 1u << 4,
	DI_CHECK_RESOLVE = 1u << 5,
	DI_CHECK_LOGITS = 1u << 6,
	DI_CHECK_MOE = 1u << 7,
	DI_CHECK_SAMPLE = 1u << 8, /* a logits row with NaN, +Inf or all -Inf (see di_sample_status) */
	DI_CHECK_SHIFT = 1u << 9,  /* shift_accepted: a row, count, sequence layout or block table */
	DI_CHECK_ACCEPT = 1u << 10 /* accept_drafts: an entry's token or draft index */
};

/* How float32 activations enter a GEMM with BF16 or F16 weights. ROUND:
 * rounded to the weight dtype (one GEMM). SPLIT: x = hi + lo with hi and lo
 * both in the weight dtype, two GEMM row blocks over one read of the weights
 * (about float32 accuracy; twice the tensor-core work). */
enum di_gemm_mode { DI_GEMM_ROUND = 0, DI_GEMM_SPLIT = 1 };

/* Bounds of di_options' fields. */
#define DI_DEC_CHUNK_ALIGN 128 /* decode_chunk is a multiple of this */
#define DI_GEMV_MAX_ROWS 8     /* gemv_rows at most */
#define DI_SKINNY_MAX_ROWS 64  /* skinny_rows at most */

/* di_options: a context's tuning switches (the Go side's cuda.Options),
 * given to set_options. Every field's zero is the library's default, so a
 * zeroed struct with size set gives the defaults; where "off" differs from
 * the default, a negative value or a disable_ flag asks for it. Fields
 * other than gemm_mode, skinny_rows and the decode chunk pick between
 * kernels of one contract: they change speed, not a call's result (the
 * exceptions name the results they change). Only the first three are meant
 * for production runs; the others are for measuring kernels against each
 * other. */
typedef struct di_options {
	uint32_t size;     /* sizeof(di_options) as the caller sees it */
	int32_t gemm_mode; /* di_gemm_mode (0: DI_GEMM_ROUND) */
	/* Keys per chunk of a split decode row's attention: 0: 256, else a
	 * positive multiple of DI_DEC_CHUNK_ALIGN. A function of nothing but
	 * this setting and the row's key count, so a row's bits do not depend on
	 * its batch; they do depend on this setting. */
	int32_t decode_chunk;
	/* 16-bit linears of up to this many rows (at most DI_SKINNY_MAX_ROWS) on
	 * the skinny GEMM: tensor cores, a row's bits independent of its batch,
	 * slower than cuBLAS at the shapes measured. 0: off. Changes results
	 * (summation order). */
	int32_t skinny_rows;
	/* Linears of up to this many rows (at most DI_GEMV_MAX_ROWS) on the GEMV
	 * kernel: 0: 4; negative: none. Changes results (summation order). */
	int32_t gemv_rows;
	/* Above one row, the GEMV kernel takes weights of at most this many
	 * elements: 0: 4 Mi; negative: none (one-row linears only). */
	int64_t gemv_max_elems;
	int32_t disable_pdl;         /* 1: no programmatic dependent launch */
	int32_t disable_gemv_wide;   /* 1: one-row GEMVs with k <= 2048 take 4 columns a block, not 8 */
	int32_t disable_prefill_gqa; /* 1: prefill over half caches runs one query head a block */
	/* Decode over half and 8-bit caches with at most 8 query heads a KV
	 * head: 1: the heads-as-rows tensor-core kernel instead of the
	 * keys-as-rows one (changes results: rounding). */
	int32_t disable_decode_km;
	/* Copy stages of the heads-as-rows decode kernel over half caches (2 or
	 * 3; 0: 2) and over 8-bit caches (2 to 4; 0: 2). */
	int32_t decode_stages;
	int32_t decode_f8_stages;
	/* Decode over 8-bit caches with at most 8 query heads a KV head widens
	 * the cache bytes in registers with this many copy stages (2 to 4; 0:
	 * 3); negative: the keys-as-rows kernel instead. */
	int32_t decode_f8_direct;
	/* n > 0: a decode row gets ceil(chunks / n) blocks of the 8-bit (and
	 * keys-as-rows) kernel; 0: as many as fill decode_blocks_per_sm blocks a
	 * multiprocessor. */
	int32_t decode_chunks_per_block;
	int32_t decode_blocks_per_sm; /* 0: 32 */
	/* 1: the keys-as-rows decode kernel runs one block a chunk instead of
	 * the 8-bit kernel's runs of chunks. */
	int32_t decode_km_block_per_chunk;
	/* The largest MLA grid (rows x heads) that stages its keys in shared
	 * memory: 0: the multiprocessors' count; negative: none. */
	int32_t mla_staged_max;
	int32_t disable_moe_mma; /* 1: MoE expert GEMVs of 16-bit weights on CUDA cores, not tensor cores */
	/* 1: every 16-bit attention output goes through float32 scratch and a
	 * narrowing pass instead of being rounded as it is stored (same bits). */
	int32_t disable_attn_out16;
	/* Sampling calls of at most this many rows cut each row into chunks for
	 * the whole-row passes: 0: every call; negative: none. At least
	 * sample_min_chunks chunks a row (0: 4). The tokens do not depend on it. */
	int32_t sample_split_rows;
	int32_t sample_min_chunks;
	/* MoE over 16-bit experts (hidden and inter multiples of 32) from this
	 * many (token, k) pairs runs a grouped tensor-core GEMM on the device
	 * (wgmma, or with disable_moe_wgmma the mma.sync one, which gives the
	 * smaller batches' bits), below it the smaller batches' grouped kernels
	 * (both on the device): 0: 2048; negative: never (above 1024 pairs the batch
	 * groups on the host and runs cuBLAS per expert). */
	int32_t moe_gemm_pairs;
	/* 1: FP8 linears above 8 rows run the library's tensor-core GEMM (a
	 * row's bits independent of the batch) instead of cuBLASLt's. */
	int32_t disable_fp8_lt;
	/* 1: every allocation the context hands out (the caching allocator's,
	 * the library's scratch included) is filled with 0xFF bytes first, on
	 * the stream: a kernel that reads memory nobody wrote then sees NaN
	 * (float32, 16-bit) or -1 (integers) instead of what the block's last
	 * owner left. A debugging switch (PyTorch's fill_uninitialized_memory):
	 * one memset an allocation; results change only where such a read
	 * exists. */
	int32_t fill_uninitialized;
	/* 1: float32 and 16-bit GEMMs of more than 16 rows run through
	 * cuBLASLt with an algorithm chosen once per (n, k, types, alignment)
	 * and bucket of the row count (four buckets an octave), instead of
	 * cublasGemmEx, whose choice is made again for every new row count
	 * (an eager step's rows vary with the prompts in it). A plan that
	 * cuBLASLt refuses falls back to cublasGemmEx. Results change by
	 * rounding (another algorithm). */
	int32_t gemm_plans;
	/* 1: MoE over 16-bit experts from moe_gemm_pairs pairs runs the
	 * mma.sync grouped GEMM, which gives the smaller batches' bits, instead
	 * of the wgmma one (sm_90a builds, hidden and intermediate multiples of
	 * 64), whose sums differ from them in rounding. */
	int32_t disable_moe_wgmma;
	/* 1: MLA prefill (the non-absorbed form: expansion and attention)
	 * runs its mma.sync kernels instead of the wgmma ones (sm_90a builds);
	 * the same bits. */
	int32_t disable_mla_prefill_wgmma;
} di_options;

enum di_scoring { DI_SCORING_SOFTMAX = 1, DI_SCORING_SIGMOID = 2 };
enum di_topk { DI_TOPK_GREEDY = 1, DI_TOPK_GROUP_LIMITED = 2, DI_TOPK_NOAUX_TC = 3 };

typedef uint64_t di_dptr;
typedef struct di_ctx di_ctx;

/* Sampling on the device (kernels.DeviceSampler; the algorithm is the host
 * reference sampler's, kernels/sampling). One di_sample_row per logits row
 * and a flat array of di_sample_edit; both are device arrays that the
 * caller uploads. Host-side float64 values are computed by the caller with
 * the host sampler's own expressions, so that the device repeats them bit
 * for bit. */
typedef struct di_sample_row {
	uint64_t seed, step;   /* the draw: Philox4x32-10 key and counter (kernels/sampling.Uniform) */
	double inv_temp;       /* 1 / float64(temperature); unused by a greedy row */
	double t_log_min_p;    /* float64(temperature) * ln(float64(min_p)); read when use_min_p */
	double top_p;          /* float64(top_p); >= 1 disables top-p */
	double top_p_hi;       /* the host's top-p margins: float64(1 + 1e-9) and */
	double top_p_lo;       /* float64(1 - 1e-9) */
	float repetition_penalty, presence_penalty, frequency_penalty;
	int32_t top_k;         /* 0: disabled (also for top_k >= vocab) */
	int32_t greedy;        /* 1: argmax, lowest id on ties */
	int32_t use_min_p;     /* 1: min_p > 0 */
	int32_t penalized;     /* 1: the penalties change the logits of DI_EDIT_SEEN tokens */
	int32_t edit_begin;    /* the row's edits: edits[edit_begin, edit_begin + num_edits) */
	int32_t num_edits;
	int32_t pad;
} di_sample_row;

/* Flags of di_sample_edit; the values equal kernels.EditFlags. */
enum di_edit_flags { DI_EDIT_MASK = 1, DI_EDIT_BIAS = 2, DI_EDIT_SEEN = 4 };

/* One token's logit edit, applied in the host sampler's order and float32
 * arithmetic: mask (-Inf), bias (+= bias), then, for a seen token of a
 * penalized row, repetition, frequency (count times) and presence. */
typedef struct di_sample_edit {
	int32_t token;
	int32_t count; /* occurrences in the output so far */
	float bias;
	uint32_t flags;
} di_sample_edit;

/* Per-row status that di_api.sample writes next to the tokens. */
enum di_sample_status {
	DI_SAMPLE_OK = 0,
	DI_SAMPLE_NAN = 1,     /* a logit is NaN after the edits */
	DI_SAMPLE_POSINF = 2,  /* a logit is +Inf after the edits */
	DI_SAMPLE_ALL_NEGINF = 3 /* every logit is -Inf after the edits */
};

/* The largest vocabulary di_api.sample accepts (its sums of weights are
 * 64-bit integers in units of 2^-43). */
#define DI_SAMPLE_MAX_VOCAB (1 << 20)
/* The longest vocabulary whose rows a call of greedy rows alone samples
 * one block a row, in one launch (di_api.sample's all_greedy). */
#define DI_SAMPLE_GREEDY_WHOLE 16384

typedef struct di_device_info {
	char name[256];
	int device;
	int cc_major, cc_minor;
	int num_sms;
	int runtime_version, driver_version, cublas_version;
	uint64_t total_mem, free_mem, l2_bytes;
	char arch[32]; /* the target the library was built for, e.g. "sm_90a" */
} di_device_info;

typedef struct di_mem_stats {
	uint64_t reserved;  /* bytes held from the driver (in use + cached) */
	uint64_t in_use;    /* bytes handed out and not yet freed */
	uint64_t peak;      /* high-water mark of in_use */
	uint64_t num_allocs, num_cache_hits, num_driver_allocs;
} di_mem_stats;

/* Counters of the cuBLASLt GEMM plans (di_options.gemm_plans) since the
 * context was made. */
typedef struct di_gemm_stats {
	uint64_t plans;      /* plans made (one heuristic query each), cuBLASLt's refusals included */
	uint64_t plan_calls; /* GEMMs that ran through a plan */
} di_gemm_stats;

/* One step's paged-attention metadata: device arrays plus host-side bounds. */
typedef struct di_attn_meta {
	int num_seqs, num_tokens;
	int block_size, max_blocks_per_seq, num_blocks;
	/* max_seqlen_q: the most query rows of one sequence when known (0:
	 * unknown). 1 means a decode-only batch: the prefill kernels are not
	 * launched, and a sequence with more rows is reported as a device check. */
	int max_seqlen_q;
	di_dptr cu_seqlens_q; /* I32 [num_seqs+1] */
	di_dptr seqlens_k;    /* I32 [num_seqs] */
	di_dptr block_tables; /* I32 [num_seqs, max_blocks_per_seq] */
} di_attn_meta;

/* di_mla_pf_hint: the totals of mla_attention_pf's plan as the caller's host
 * copy of cu_seqlens_q gives them, so that a call of several sequences
 * need not read them back: rows bounds the prefill sequences' expanded
 * key rows (each sequence's visible keys rounded up to 64; the block
 * table's reach, rounded, bounds every sequence's), tiles is their query
 * tiles of 64 rows and absorbed the other sequences' rows, both exact.
 * The device's plan checks them: a total above its hint's (tiles or
 * absorbed different) sets DI_CHECK_MLA and the prefill rows get zeros. */
typedef struct di_mla_pf_hint {
	int rows, tiles, absorbed;
} di_mla_pf_hint;

/* di_qkv: the arguments of qkv_prepare (kernels.QKV): split the fused
 * projection qkv (F32 [num_tokens, (num_heads + 2 num_kv_heads) head_dim])
 * into q (F32 [num_tokens, num_heads head_dim]) and the k and v heads;
 * RMS-normalize each q and k head by q_norm and k_norm (F32 [head_dim];
 * both 0 for none); rotate q and k (rot_offset, rotary_dim, interleaved as
 * rope's; cos and sin F32 [max_pos, rotary_dim / 2]); write k and v into
 * column 0 of the caches (cache_dtype DI_F32, DI_F16 or DI_F8E4M3, [num_slots,
 * num_kv_heads head_dim]) at slot_mapping (-1: skip). */
typedef struct di_qkv {
	di_dptr qkv, q, k_cache, v_cache, slot_mapping, positions, cos, sin, q_norm, k_norm;
	int num_tokens, num_heads, num_kv_heads, head_dim;
	int rot_offset, rotary_dim, interleaved, max_pos;
	int num_slots, cache_dtype;
	float eps;
} di_qkv;

/* FP8 E4M3 weights with float32 block scales (kernels.FP8Weighter): element
 * (r, c) of a [rows, k] matrix is e4m3(data[r * k + c]) * scales[scale_row[r]
 * * scale_cols + c / block_k]. Stacked experts [experts, n, k] are rows =
 * experts * n, expert e's matrix starting at row e * n. data: E4M3 bytes,
 * 16-byte aligned, k a multiple of 16; scales F32; scale_row I32 [rows]. */
typedef struct di_fp8_weight {
	di_dptr data, scales, scale_row;
	int scale_cols; /* ceil(k / block_k) */
	int block_k;    /* a power of two >= 16 (128 in the published checkpoints) */
	/* The same scales in cuBLASLt's 128x128 block layout, or 0 where the
	 * weight has no such layout (block_k not 128, or rows of one 128-row
	 * block on different scale rows): F32 [ceil(rows / 128), lt_ld], block
	 * (rb, kb) at rb * lt_ld + kb; lt_ld = ceil(k / 128) rounded up to a
	 * multiple of 4. */
	di_dptr lt_scales;
	int lt_ld;
} di_fp8_weight;

/* Which kernels an FP8 linear or MoE takes: AUTO (the library's choice),
 * GEMV (float32 activations, CUDA cores; for MoE the device path, whose
 * tensor-core kernels carry float32-accurate activations) or GEMM
 * (activations quantized per row and 128 columns, tensor cores; needs
 * block_k >= 128) or LT (the same quantized activations, cuBLASLt's FP8
 * GEMM with 128x128 weight and 1x128 activation block scales, DeepSeek-V3's
 * recipe; needs lt_scales; linears only). The paths differ in the
 * activations' rounding (GEMV against the others) and in the tensor cores'
 * accumulation order (GEMM against LT). */
enum di_fp8_path { DI_FP8_AUTO = 0, DI_FP8_GEMV = 1, DI_FP8_GEMM = 2, DI_FP8_LT = 3 };

/* Block-quantized weights in llama.cpp's formats (kernels.QuantWeighter),
 * numbered as ggml numbers them. A [rows, k] matrix (stacked experts
 * [experts, n, k] are rows = experts * n) whose row r starts at data +
 * (rows[r] & (2^56 - 1)), 16-byte aligned, in format rows[r] >> 56: the
 * rows of one weight may differ in format (a fused Q4_K_M weight mixes
 * Q4_K and Q6_K rows). A row is k / 32 (Q8_0, Q4_0) or k / 256 (K-quants)
 * blocks in ggml's layout (ggml-common.h), except that the f16 scale d of
 * Q8_0, Q4_0 and Q6_K blocks is moved behind the row's blocks:
 *   Q8_0: qs[32] a block, then the blocks' d;
 *   Q4_0: qs[16] a block, then the blocks' d;
 *   Q4_K: the 144-byte blocks as stored (d, dmin, scales[12], qs[128]);
 *   Q5_K: the 176-byte blocks as stored (d, dmin, scales[12], qh[32], qs[128]);
 *   Q6_K: ql[128], qh[64], scales[16] a block, then the blocks' d.
 * rows: U64 [rows] (a view's table starts at its own first row); format:
 * the format of every row, or 0 when they differ (the kernels then read
 * each row's). */
enum di_quant_type { DI_Q4_0 = 2, DI_Q8_0 = 8, DI_Q4_K = 12, DI_Q5_K = 13, DI_Q6_K = 14 };
typedef struct di_quant_weight {
	di_dptr data, rows;
	int format;
} di_quant_weight;

/* Which kernels a linear over block-quantized weights takes: AUTO (GEMV up
 * to 8 rows, else GEMM), GEMV (the blocks widened in registers, float32
 * activations) or GEMM (the weight dequantized per call into scratch, then
 * cuBLAS: BF16 weights and activations in DI_GEMM_ROUND, float32 in
 * DI_GEMM_SPLIT). */
enum di_quant_path { DI_QUANT_AUTO = 0, DI_QUANT_GEMV = 1, DI_QUANT_GEMM = 2 };

/* di_rect is one strided copy of copy_rects: rows rows of width_bytes from
 * src (row pitch src_pitch bytes) to dst (row pitch dst_pitch bytes). */
typedef struct di_rect {
	di_dptr dst, src;
	uint64_t dst_pitch, src_pitch, width_bytes, rows;
} di_rect;

#define DI_MAX_RECTS 16

typedef struct di_api {
	uint32_t abi_version;
	uint32_t size; /* sizeof(di_api) as the library sees it */

	/* --- runtime --- */
	int (*device_count)(int *n, char *err, int errlen);
	/* create: select device, make the stream, cuBLAS handle, staging
	 * buffers, and check that the library has a kernel image for the device. */
	int (*create)(int device, di_ctx **out, char *err, int errlen);
	void (*destroy)(di_ctx *ctx);
	const char *(*last_error)(di_ctx *ctx);
	int (*device_info)(di_ctx *ctx, di_device_info *out);
	int (*mem_stats)(di_ctx *ctx, di_mem_stats *out);
	/* set_options: replace every tuning switch of ctx with opts (see
	 * di_options; a context starts with the defaults). Later calls see the
	 * new values. DI_ERR_INVALID, naming the field, for a value out of
	 * range or an opts->size other than sizeof(di_options), and while any
	 * graph exists (its kernels keep the switches they were captured
	 * with); DI_ERR_CAPTURING during capture. Cost: no device work. */
	int (*set_options)(di_ctx *ctx, const di_options *opts);

	/* --- memory --- */
	/* alloc: from the caching allocator; not zeroed. */
	int (*alloc)(di_ctx *ctx, uint64_t bytes, di_dptr *out);
	/* free: back to the cache, stream-ordered; any thread. */
	int (*free)(di_ctx *ctx, di_dptr p);
	/* empty_cache: return cached blocks to the driver (no-op while graphs exist). */
	int (*empty_cache)(di_ctx *ctx);
	int (*memset_zero)(di_ctx *ctx, di_dptr p, uint64_t bytes);
	/* upload: host -> device through pinned staging; the host buffer may be
	 * reused when the call returns. */
	int (*upload)(di_ctx *ctx, di_dptr dst, const void *src, uint64_t bytes);
	/* upload_widen: n BF16 or F16 host values into an F32 device array. */
	int (*upload_widen)(di_ctx *ctx, di_dptr dst, const void *src, int src_dtype, uint64_t n);
	/* download: device -> host; waits for all queued work, then reports checks. */
	int (*download)(di_ctx *ctx, void *dst, di_dptr src, uint64_t bytes);
	/* download_async: device -> pinned host memory (host_alloc), queued on
	 * the stream, followed by the device check word (4 more bytes at
	 * dst + bytes); returns at once (wait with an event recorded after it;
	 * a nonzero word means a sync will report a check failure). */
	int (*download_async)(di_ctx *ctx, void *dst, di_dptr src, uint64_t bytes);
	int (*copy)(di_ctx *ctx, di_dptr dst, di_dptr src, uint64_t bytes);
	/* copy_2d: rows rows of width_bytes from src (row pitch src_pitch bytes) to
	 * dst (row pitch dst_pitch bytes), on the stream; capturable. */
	int (*copy_2d)(di_ctx *ctx, di_dptr dst, uint64_t dst_pitch, di_dptr src, uint64_t src_pitch,
	               uint64_t width_bytes, uint64_t rows);
	/* copy_rects: n rectangles as copy_2d's (at most DI_MAX_RECTS), in one
	 * kernel launch on the stream; capturable. The rectangles' destinations
	 * must not overlap (their copies run concurrently). */
	int (*copy_rects)(di_ctx *ctx, const di_rect *rects, int n);
	/* sync: waits for all queued work, then reports the device check word. */
	int (*sync)(di_ctx *ctx);
	int (*host_alloc)(di_ctx *ctx, uint64_t bytes, void **out);
	int (*host_free)(di_ctx *ctx, void *p);

	/* --- events (timing enabled) --- */
	int (*event_create)(di_ctx *ctx, void **ev);
	int (*event_record)(di_ctx *ctx, void *ev);
	int (*event_synchronize)(di_ctx *ctx, void *ev);
	int (*event_elapsed_ms)(di_ctx *ctx, void *start, void *end, float *ms);
	int (*event_destroy)(di_ctx *ctx, void *ev);

	/* --- CUDA graphs: capture the context's stream, instantiate, replay --- */
	int (*graph_begin)(di_ctx *ctx);
	/* graph_end: *nodes (when nodes is set) the captured graph's nodes:
	 * its kernels, copies and memsets. */
	int (*graph_end)(di_ctx *ctx, void **exec, size_t *nodes);
	int (*graph_replay)(di_ctx *ctx, void *exec);
	int (*graph_destroy)(di_ctx *ctx, void *exec);

	/* --- operations (see kernels.Ops for the contracts) --- */
	int (*embedding)(di_ctx *ctx, di_dptr out, di_dptr table, int table_dtype, di_dptr ids,
	                 int num_tokens, int hidden, int vocab);
	/* rms_norm: residual == 0: out = norm(x); else residual += x, out = norm(residual).
	 * out is of out_dtype: DI_F32, or DI_BF16 / DI_F16 (each value rounded to
	 * nearest, as linear rounds x). */
	int (*rms_norm)(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr residual, di_dptr x, di_dptr weight,
	                int rows, int n, float eps);
	/* linear: x is of x_dtype: DI_F32, or w_dtype for 16-bit weights (x
	 * already rounded: cuBLAS, the bits of the float32 x that
	 * linear_input_dtype says is rounded to it). */
	int (*linear)(di_ctx *ctx, di_dptr out, di_dptr x, int x_dtype, di_dptr w, int w_dtype, di_dptr bias,
	              int m, int n, int k);
	/* linear_input_dtype: the type linear rounds a float32 x of m rows to
	 * before multiplying w_dtype weights, or DI_F32 when x enters some path
	 * as float32 (GEMV, skinny GEMM, float32 weights, GEMM mode split). */
	int (*linear_input_dtype)(di_ctx *ctx, int w_dtype, int m);
	int (*silu_mul)(di_ctx *ctx, di_dptr out, di_dptr gate_up, int rows, int n);
	/* gated_mlp: out[m, hidden] = (silu(g) * u) down^T with [g u] = x gate_up^T,
	 * for 16-bit weights (w_dtype DI_BF16 or DI_F16): x rounded to w_dtype,
	 * g, u and the product stored in w_dtype (float32 accumulation). */
	int (*gated_mlp)(di_ctx *ctx, di_dptr out, di_dptr x, int x_dtype, di_dptr gate_up, di_dptr down, int w_dtype,
	                 int m, int n, int hidden);
	int (*add)(di_ctx *ctx, di_dptr out, di_dptr a, di_dptr b, uint64_t n);
	int (*concat)(di_ctx *ctx, di_dptr out, di_dptr a, di_dptr b, int rows, int m, int n);
	/* split_columns copies columns of x (rows of x_pitch floats) into nparts
	 * (<= DI_MAX_SPLIT) tensors of widths[i] columns each, in order. */
	int (*split_columns)(di_ctx *ctx, di_dptr x, int rows, int x_pitch, int nparts, const di_dptr *parts,
	                     const int *widths);
	int (*rope)(di_ctx *ctx, di_dptr x, di_dptr positions, di_dptr cos, di_dptr sin, int num_tokens,
	            int max_pos, int num_heads, int head_size, int offset, int rotary_dim, int interleaved);
	/* cache_dtype: DI_F32, DI_F16 or DI_F8E4M3 (src is float32, rounded to
	 * nearest even; E4M3 saturates at +-448). */
	int (*write_cache)(di_ctx *ctx, di_dptr cache, di_dptr src, di_dptr slot_mapping, int num_tokens,
	                   int w, int width, int col, int num_slots, int cache_dtype);
	/* input_dtype: DI_F32 (or 0) keeps q, k, v and the probabilities in
	 * float32; DI_F16 or DI_BF16 lets prefill rows run on tensor cores with
	 * them rounded to half precision (float32 accumulation). cache_dtype:
	 * DI_F32, DI_F16 or DI_F8E4M3, the element type of both caches;
	 * DI_F8E4M3 values are widened exactly (to half for the tensor-core
	 * kernels, to float32 for the others). out_dtype: DI_F32, or DI_BF16 /
	 * DI_F16 for the float32 output rounded to nearest (the input of the
	 * 16-bit linear after it, see linear_input_dtype). */
	int (*attention)(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache, di_dptr v_cache,
	                 const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
	                 int sliding_window, int input_dtype, int cache_dtype);
	int (*mla_attention)(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, di_dptr wkvb, int w_dtype,
	                     const di_attn_meta *m, int num_heads, int nope_dim, int rope_dim,
	                     int kv_lora_rank, int v_head_dim, float scale);
	int (*moe_route)(di_ctx *ctx, di_dptr ids, di_dptr weights, di_dptr logits, di_dptr bias,
	                 int num_tokens, int num_experts, int top_k, int scoring, int method, int num_groups,
	                 int topk_groups, int norm_topk_prob, float scaling_factor);
	/* moe: groups on the device and never waits for the host up to 1024
	 * pairs, while capturing, and for 16-bit experts (hidden and inter
	 * multiples of 32) unless di_options.moe_gemm_pairs is negative;
	 * otherwise waits for the routing ids (one small device-to-host copy).
	 * x is F32, or (GEMM mode round) of the experts' 16-bit dtype: x
	 * rounded already, with the bits of its float32 values (every path
	 * rounds x so in that mode). */
	int (*moe)(di_ctx *ctx, di_dptr out, di_dptr x, int x_dtype, di_dptr ids, di_dptr weights, di_dptr gate_up,
	           di_dptr down, int w_dtype, int num_tokens, int top_k, int hidden, int inter,
	           int num_experts);
	int (*resolve_placeholders)(di_ctx *ctx, di_dptr ids, di_dptr from_row, di_dptr sampled,
	                            int num_tokens, int num_sampled);
	/* logits: rows == 0 means every row of hidden (num_rows == num_hidden);
	 * norm == 0 means no norm. */
	int (*logits)(di_ctx *ctx, di_dptr out, di_dptr hidden, di_dptr rows, int num_rows,
	              int num_hidden, di_dptr norm, di_dptr head, int head_dtype, int dim, int vocab,
	              float eps);
	/* sample: one token per row of logits (F32 [num_rows, vocab], edited in
	 * place at each row's edit ids). rows: di_sample_row[num_rows]; edits:
	 * di_sample_edit[] (0 when no row has edits). out: I32 [3, num_rows]:
	 * the tokens, a di_sample_status per row and the lowest token id with
	 * the status's value (-1 when none); a row with a status other than
	 * DI_SAMPLE_OK gets token 0 and sets DI_CHECK_SAMPLE. max_candidates
	 * bounds the survivors of a random row's filters that are held in shared
	 * memory (0: none; rows with more survivors are walked in global
	 * memory): the tokens do not depend on it. all_greedy != 0 says that
	 * every row is greedy (the caller knows; the rows are in device
	 * memory): the call then skips the random rows' mass pass and, for a
	 * vocabulary of at most DI_SAMPLE_GREEDY_WHOLE tokens, the split of
	 * the rows into chunks, one launch in all. The tokens do not depend
	 * on it. */
	int (*sample)(di_ctx *ctx, di_dptr out, di_dptr logits, int num_rows, int vocab, di_dptr rows,
	              di_dptr edits, int max_candidates, int all_greedy);
	/* qkv_prepare: see di_qkv; the bits of split_columns, rms_norm per
	 * head, rope and write_cache run one after the other. */
	int (*qkv_prepare)(di_ctx *ctx, const di_qkv *a);
	/* shift_accepted (kernels.Ops.ShiftAccepted): for each sequence s of
	 * num_seqs with shift_from[s] >= 0, a = accepted[shift_from[s]]:
	 * seqlens_k[s] += a, and for each token i in [cu_seqlens_q[s],
	 * cu_seqlens_q[s+1]): positions[i] += a, slot_mapping[i] =
	 * block_tables[s * width + p / block_size] * block_size + p % block_size
	 * at the new position p. All I32 device arrays: cu_seqlens_q
	 * [num_seqs+1], seqlens_k, shift_from [num_seqs], block_tables
	 * [num_seqs, width], positions and slot_mapping [num_tokens], accepted
	 * [num_accepted]. A sequence whose row is outside [0, num_accepted),
	 * whose count is negative, whose tokens lie outside [0, num_tokens) or
	 * whose new positions have no block (negative, past width, or a
	 * negative table entry) is left unchanged and sets DI_CHECK_SHIFT. */
	int (*shift_accepted)(di_ctx *ctx, di_dptr positions, di_dptr slot_mapping, di_dptr seqlens_k,
	                      di_dptr cu_seqlens_q, di_dptr block_tables, di_dptr shift_from, di_dptr accepted,
	                      int num_seqs, int num_tokens, int width, int block_size, int num_accepted);
	/* token_mask (structured output, before sample): for each logits row r
	 * of num_rows with m = mask_rows[r] >= 0, every token t of the row
	 * whose bit (masks[m * words + t / 32] >> (t % 32)) & 1 is clear gets
	 * -Inf, words = (vocab + 31) / 32. mask_rows: I32 [num_rows]; masks:
	 * U32 [num_masks, words]. A row whose m is num_masks or more is left
	 * unchanged and sets DI_CHECK_SAMPLE. */
	int (*token_mask)(di_ctx *ctx, di_dptr logits, int num_rows, int vocab, di_dptr mask_rows, di_dptr masks,
	                  int num_masks);

	/* argmax (greedy drafts chained on the device): out[r] = the id of the
	 * largest of logits row r (F32 [num_rows, vocab]), the lowest id on
	 * ties; NaN entries never win; a row with no number above -Inf gives 0.
	 * out: I32 [num_rows]. */
	int (*argmax)(di_ctx *ctx, di_dptr out, di_dptr logits, int num_rows, int vocab);
	/* accept_drafts (speculative verification on the device): for each of
	 * num_entries entries e of layout (I32 [num_entries, 4]: s0, n, d0,
	 * base), a = the largest a <= n with tokens[s0 + j] == drafts[d0 + j]
	 * for all j < a; out (I32 [3, num_entries]) gets a, tokens[s0 + a] and
	 * base + a. An entry whose indexes fall outside tokens (num_tokens) or
	 * drafts (num_drafts), or whose n is negative, gets zeros and sets
	 * DI_CHECK_ACCEPT. */
	int (*accept_drafts)(di_ctx *ctx, di_dptr out, di_dptr tokens, int num_tokens, di_dptr drafts, int num_drafts,
	                     di_dptr layout, int num_entries);
	/* --- sliding-window ring buffers, attention sinks, Gemma and gpt-oss
	 * operations (kernels.RingAttentioner, AttentionSinker, GemmaOpser,
	 * BiasedMoEer) --- */
	/* attention_sinks: attention with per-head sink logits (sinks: F32
	 * [num_heads], 0: none) that join each row's softmax denominator and
	 * add no value. */
	int (*attention_sinks)(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k_cache, di_dptr v_cache,
	                       const di_attn_meta *m, int num_heads, int num_kv_heads, int head_dim, float scale,
	                       int sliding_window, int input_dtype, int cache_dtype, di_dptr sinks);
	/* ring_attention: attention of a sliding-window layer whose history is
	 * in ring buffers k_ring and v_ring (cache_dtype, [num_slots, window,
	 * num_kv_heads head_dim]; position p of the sequence in slot s at row
	 * s*window + p%window), the step's keys and values in k and v (F32
	 * [num_tokens, num_kv_heads head_dim], not yet in the ring). slots: I32
	 * [num_seqs]. m: cu_seqlens_q, seqlens_k, num_seqs, num_tokens and
	 * max_seqlen_q are read; the block fields are not. max_seqlen_k bounds
	 * seqlens_k. Decode rows' keys and values are written into their ring
	 * rows (as write_cache would write them). sinks as attention_sinks.
	 * Capturable. */
	int (*ring_attention)(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k, di_dptr v, di_dptr k_ring,
	                      di_dptr v_ring, di_dptr slots, int num_slots, const di_attn_meta *m, int max_seqlen_k,
	                      int num_heads, int num_kv_heads, int head_dim, float scale, int window, int input_dtype,
	                      int cache_dtype, di_dptr sinks);
	/* scale: out[i] = x[i] * s over n float32 values (out may be x). */
	int (*scale)(di_ctx *ctx, di_dptr out, di_dptr x, uint64_t n, float s);
	/* gelu_tanh_mul: out[r, j] = gelu_tanh(gate_up[r, j]) * gate_up[r, n + j]. */
	int (*gelu_tanh_mul)(di_ctx *ctx, di_dptr out, di_dptr gate_up, int rows, int n);
	/* softcap: x[i] = c * tanh(x[i] / c) over n float32 values. */
	int (*softcap)(di_ctx *ctx, di_dptr x, uint64_t n, float c);
	/* moe_clamped_swiglu: moe with biases (gate_up_bias F32 [num_experts,
	 * 2 inter], down_bias F32 [num_experts, hidden]) and gpt-oss's clamped
	 * SwiGLU: g' = min(g, limit), u' = clamp(u, -limit, limit), act = (u' +
	 * 1) g' sigmoid(alpha g'). Grouped on the device (no host wait, so
	 * capturable), in token chunks of at most 1024 (token, k) pairs. */
	int (*moe_clamped_swiglu)(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, di_dptr gate_up,
	                          di_dptr gate_up_bias, di_dptr down, di_dptr down_bias, int w_dtype, int num_tokens,
	                          int top_k, int hidden, int inter, int num_experts, float limit, float alpha);
	/* --- FP8 block-scaled weights (di_fp8_weight; kernels.FP8Weighter) --- */
	/* fp8_linear: out[m, n] (F32) = x[m, k] (F32) w^T (+ bias F32 [n]). AUTO:
	 * the GEMV up to 8 rows, else cuBLASLt's block-scaled FP8 GEMM where the
	 * weight has lt_scales (unless di_options.disable_fp8_lt; cuBLASLt may
	 * pick another algorithm for another row count, so those rows are not
	 * batch-invariant, as cuBLAS's 16-bit GEMMs are not), else the library's
	 * tensor-core GEMM where block_k >= 128 (a row's bits do not depend on
	 * the other rows there, nor on the GEMV). */
	int (*fp8_linear)(di_ctx *ctx, di_dptr out, di_dptr x, const di_fp8_weight *w, di_dptr bias, int m, int n,
	                  int k, int path);
	/* fp8_moe: moe with FP8 expert weights (gate_up [experts, 2 inter,
	 * hidden], down [experts, hidden, inter]), grouped on the device with
	 * no host wait at every batch where block_k >= 128 and hidden and inter
	 * are multiples of 128: tensor-core projections over float32-accurate
	 * activations, the small-batch kernel below moe_gemm_pairs pairs and
	 * the grouped GEMM (the same bits) from it (fp8_moe.cu). Other shapes
	 * group on the device with GEMV projections up to 1024 pairs (while
	 * capturing, up to about 12k); larger batches of them (AUTO), and
	 * tensor-core shapes above 1024 pairs with moe_gemm_pairs negative,
	 * group on the host (one small copy and a wait) and run one grouped
	 * GEMM launch per projection. */
	int (*fp8_moe)(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, const di_fp8_weight *gate_up,
	               const di_fp8_weight *down, int num_tokens, int top_k, int hidden, int inter, int num_experts,
	               int path);
	/* fp8_dequant: out[rows, k] = the weight's values, out_dtype DI_F32
	 * (exact) or DI_BF16 (the float32 value rounded to nearest even). */
	int (*fp8_dequant)(di_ctx *ctx, di_dptr out, int out_dtype, const di_fp8_weight *w, int rows, int k);
	/* fp8_lt_peak: the time of cuBLASLt's FP8 GEMM with one scale a tensor
	 * (its fastest FP8 form: the reference peak of benchmarks), m x n x k,
	 * E4M3 inputs of hashed bytes, BF16 out, iters back-to-back launches
	 * after one warm-up; *ms the mean. Allocates and frees its own buffers
	 * (not for use during a capture). DI_ERR_UNSUPPORTED where cuBLASLt has
	 * no algorithm. */
	int (*fp8_lt_peak)(di_ctx *ctx, int m, int n, int k, int iters, float *ms);
	/* --- MLA over 16- and 8-bit latent caches on tensor cores
	 * (kernels/cuda/attention_mla_tc.cu; kernels.MLACacher) --- */
	/* mla_write_cache: row slot_mapping[t] (-1: skip) of cache ([num_slots]
	 * rows) gets ckv[t] (F32 [num_tokens, kvl]) and kpe[t] (F32
	 * [num_tokens, rope]): cache_dtype DI_F32, DI_F16 or DI_BF16 rows of kvl
	 * + rope elements, rounded to nearest; DI_F8E4M3 the packed row of
	 * kernels.MLAF8RowBytes(kvl, rope) bytes: kvl E4M3 values, each group
	 * of 128 divided by its float32 scale (amax / 448; 1 for zeros), the
	 * rope part as F16, then the scales. A slot past the cache sets
	 * DI_CHECK_WRITE_CACHE. */
	int (*mla_write_cache)(di_ctx *ctx, di_dptr cache, int cache_dtype, di_dptr ckv, di_dptr kpe,
	                       di_dptr slot_mapping, int num_tokens, int kvl, int rope, int num_slots);
	/* mla_attention_tc: mla_attention over a cache of cache_dtype DI_F16,
	 * DI_BF16 or DI_F8E4M3 (written by mla_write_cache), for kv_lora_rank
	 * 128 or 512 and rope_dim 16 to 64 in steps of 16; DI_ERR_UNSUPPORTED
	 * otherwise. The absorbed queries and the probabilities are rounded to
	 * half (BF16 for a BF16 cache), float32 accumulation; a row's bits
	 * depend on its own keys only. */
	int (*mla_attention_tc)(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, int cache_dtype, di_dptr wkvb,
	                        int w_dtype, const di_attn_meta *m, int num_heads, int nope_dim, int rope_dim,
	                        int kv_lora_rank, int v_head_dim, float scale);
	/* mla_latent_attention: the latent half of mla_attention_tc: olat (F32
	 * [num_tokens, num_heads, kvl]) = softmax(q_lat . cache rows) . c_kv rows
	 * per head, with q_lat (F16, BF16 for a BF16 cache: [num_tokens,
	 * num_heads, kvl + rope]) already absorbed and multiplied by the softmax
	 * scale times log2(e). */
	int (*mla_latent_attention)(di_ctx *ctx, di_dptr olat, di_dptr q_lat, di_dptr cache, int cache_dtype,
	                            const di_attn_meta *m, int num_heads, int kvl, int rope);
	/* --- MXFP4 expert weights (kernels.MXFP4Weighter; kernels/cuda/mxfp4.go,
	 * mxfp4.cuh) --- */
	/* moe_clamped_swiglu_mxfp4: moe_clamped_swiglu with MXFP4 gate_up
	 * ([num_experts, 2 inter, hidden]) and down ([num_experts, hidden,
	 * inter]) weights: *_blocks the 4-bit codes (k/2 bytes a row of k
	 * columns, 16-byte aligned, each row's rearranged into the device layout
	 * of kernels/cuda/mxfp4.cuh, as MXFP4Weight uploads them; as stored,
	 * element c is the low nibble of byte c/2 for even c, the high one for
	 * odd c), *_scales the E8M0 exponents (k/32
	 * bytes a row, element c under scale c/32; 255 is not a valid scale),
	 * element = E2M1(code) * 2^(scale - 127). hidden and inter multiples of
	 * 32. The codes are widened to BF16 in the kernels' registers: the
	 * result is moe_clamped_swiglu's with w_dtype DI_BF16 over the weights
	 * widened to BF16, bit for bit. Capturable. */
	int (*moe_clamped_swiglu_mxfp4)(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights,
	                                di_dptr gate_up_blocks, di_dptr gate_up_scales, di_dptr gate_up_bias,
	                                di_dptr down_blocks, di_dptr down_scales, di_dptr down_bias, int num_tokens,
	                                int top_k, int hidden, int inter, int num_experts, float limit, float alpha);
	/* --- block-quantized weights (di_quant_weight; kernels.QuantWeighter) --- */
	/* quant_linear: out[m, n] (F32) = x[m, k] (F32, 16-byte aligned) w^T (+
	 * bias F32 [n]), the path as di_quant_path says; on the GEMV a row's bits
	 * do not depend on the other rows. */
	int (*quant_linear)(di_ctx *ctx, di_dptr out, di_dptr x, const di_quant_weight *w, di_dptr bias, int m, int n,
	                    int k, int path);
	/* quant_logits: logits with a block-quantized head: the rows gathered and
	 * normalized in float32 (as logits does for an F32 head), then
	 * quant_linear's AUTO path. */
	int (*quant_logits)(di_ctx *ctx, di_dptr out, di_dptr hidden, di_dptr rows, int num_rows, int num_hidden,
	                    di_dptr norm, const di_quant_weight *head, int dim, int vocab, float eps);
	/* quant_embedding: out[t] (F32 [num_tokens, hidden]) = row ids[t] of the
	 * table dequantized, bit for bit as ggml's dequantize_row_*; an id outside
	 * [0, vocab) gives zeros and sets DI_CHECK_EMBEDDING. */
	int (*quant_embedding)(di_ctx *ctx, di_dptr out, const di_quant_weight *table, di_dptr ids, int num_tokens,
	                       int hidden, int vocab);
	/* quant_moe: moe over block-quantized experts (gate_up [experts, 2 inter,
	 * hidden], down [experts, hidden, inter]), grouped on the device in token
	 * chunks of at most 1024 (token, k) pairs: no host wait, capturable. An
	 * id outside the experts sets DI_CHECK_MOE. */
	int (*quant_moe)(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights, const di_quant_weight *gate_up,
	                 const di_quant_weight *down, int num_tokens, int top_k, int hidden, int inter, int num_experts);
	/* quant_dequant: out[rows, k] = the weight's values: out_dtype DI_F32
	 * bit for bit as dequantize_row_*, DI_BF16 those values rounded to
	 * nearest. */
	int (*quant_dequant)(di_ctx *ctx, di_dptr out, int out_dtype, const di_quant_weight *w, int rows, int k);
	/* --- MLA prefill in the non-absorbed form (kernels/cuda/attention_mla_prefill.cu) --- */
	/* mla_attention_pf: mla_attention_tc, except that the sequences with at
	 * least DI_MLA_PREFILL_MIN_ROWS query rows run FlashAttention-style on
	 * tensor cores without absorption, for nope_dim 128, rope_dim 64,
	 * v_head_dim 128, kv_lora_rank 128 or 512 over a DI_F16, DI_BF16 or
	 * DI_F8E4M3 cache: their visible keys' latents are expanded to per-head K_nope and
	 * V (wkvb's rows, a fixed-order product, rounded to the cache's type)
	 * and attended in key tiles aligned to absolute positions (a row's bits
	 * do not depend on its batch or on how its prompt is chunked). An 8-bit
	 * (DI_F8E4M3) cache's rows are widened to half as mla_attention_tc
	 * widens them, and the operands are half. Every other row, and every
	 * row for other sizes or of a call of several sequences during graph
	 * capture, takes mla_attention_tc. With prefill rows, more than one
	 * sequence and no hint (NULL), or a hint whose bound on the expanded
	 * rows would cost more passes over the heads than the call's query
	 * rows, the host waits for three counts of the call's plan (one small
	 * copy). */
	int (*mla_attention_pf)(di_ctx *ctx, di_dptr out, di_dptr q, di_dptr cache, int cache_dtype, di_dptr wkvb,
	                        int w_dtype, const di_attn_meta *m, int num_heads, int nope_dim, int rope_dim,
	                        int kv_lora_rank, int v_head_dim, float scale, const di_mla_pf_hint *hint);
	/* mla_prepare (kernels.MLAPreparer): from token t's q (F32
	 * num_heads*(nope+rope) values, row t of q_in, q_stride floats a row)
	 * and kv_a row [c_kv (kvl) k_pe (rope)] (row t of kva, kva_stride
	 * floats a row), q (F32 [num_tokens, num_heads*(nope+rope)]) gets the
	 * row's q with each head's rope dimensions rotated as rope rotates
	 * them (positions, cos, sin [max_pos, rope/2], interleaved pairs or
	 * halves), and row slot_mapping[t] (-1: skip) of cache gets c_kv
	 * RMS-normalized by normw (F32 [kvl], eps) and k_pe rotated, in the
	 * cache's layout as mla_write_cache writes them: the bits of
	 * split_columns, rms_norm, two ropes and mla_write_cache. q_in and
	 * kva are views of DeepSeek's fused q / kv_a projection (q_in its
	 * start, kva nope+rope floats a head in, both strides its row), or
	 * q_in is q itself (rotated in place) and kva kv_a's own product.
	 * kvl at most 4096; a position outside the tables sets DI_CHECK_ROPE,
	 * a slot past the cache DI_CHECK_WRITE_CACHE. */
	int (*mla_prepare)(di_ctx *ctx, di_dptr q, di_dptr cache, int cache_dtype, di_dptr q_in, int q_stride, di_dptr kva,
	                   int kva_stride, di_dptr normw, di_dptr slot_mapping, di_dptr positions, di_dptr cos, di_dptr sin,
	                   int num_tokens, int max_pos, int num_heads, int nope, int rope, int kvl, int interleaved,
	                   float eps, int num_slots);
	/* moe_set_add: the MoE operations that follow (moe, fp8_moe,
	 * quant_moe, moe_clamped_swiglu and its MXFP4 form) write
	 * out + add (F32, the shape of out, row r of out at row r of add) in
	 * their combine pass, with the bits of the MoE followed by add: each
	 * element's routed sum, rounded to float, plus add's. add 0 clears it;
	 * clearing returns DI_ERR_INVALID when an addend was set and no
	 * combine pass wrote into out since (the operation took a path
	 * without one, so out lacks the addend). */
	int (*moe_set_add)(di_ctx *ctx, di_dptr out, di_dptr add);
	/* gated_linear: act (F32 [m, n]) = silu(x gate^T) * (x up^T) for the
	 * gate/up weight w ([2n, k] of w_dtype, gate rows first) and x (F32
	 * [m, k]): the bits of linear into gu (F32 [m, 2n], scratch) followed
	 * by silu_mul; where the GEMV serves the linear, one paired GEMV
	 * writes act without gu. */
	int (*gated_linear)(di_ctx *ctx, di_dptr act, di_dptr gu, di_dptr x, di_dptr w, int w_dtype, int m, int n,
	                    int k);
	/* gemm_stats: the context's cuBLASLt plan counters. Cost: none. */
	int (*gemm_stats)(di_ctx *ctx, di_gemm_stats *out);
	/* moe_set_route: the next moe runs moe_route's routing itself (the
	 * same arguments; its ids, weights, token and expert counts must be
	 * the moe's), writing ids and weights as moe_route would: in the
	 * decode path's grouping launch where that takes it (at most 8
	 * tokens, one block grouping), else as a launch of its own first.
	 * ids 0 clears it; clearing returns DI_ERR_INVALID when a routing was
	 * set and no moe ran it since. */
	int (*moe_set_route)(di_ctx *ctx, di_dptr ids, di_dptr weights, di_dptr logits, di_dptr bias, int num_tokens,
	                     int num_experts, int top_k, int scoring, int method, int num_groups, int topk_groups,
	                     int norm_topk_prob, float scaling_factor);
	/* embed_norm_concat: out (F32 [rows, 2h]) = [RMSNorm(table[ids];
	 * enorm), RMSNorm(x; xnorm)] for table [vocab, h] of table_dtype, ids
	 * I32 [rows], x F32 [rows, h], the norms' weights F32 [h]: the bits of
	 * embedding, two rms_norms and concat, in one launch. An id outside the
	 * table gives a row of zeros (before its norm) and DI_CHECK_EMBEDDING. */
	int (*embed_norm_concat)(di_ctx *ctx, di_dptr out, di_dptr table, int table_dtype, di_dptr ids, di_dptr enorm,
	                         di_dptr x, di_dptr xnorm, int rows, int h, int vocab, float eps);
} di_api;

/* di_get_api fills *out for a caller built against abi_version; it returns
 * DI_ERR_UNSUPPORTED (and leaves out->abi_version set to the library's
 * version) when the versions differ. */
int di_get_api(uint32_t abi_version, di_api *out);

#ifdef __cplusplus
}
#endif

#endif /* DEEPINFER_CUDA_H */
