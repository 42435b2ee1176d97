// ring.cu: attention of sliding-window layers whose keys and values live in
// per-sequence ring buffers (state slots; kernels.RingAttentioner) instead
// of paged blocks. The ring tensors are [num_slots, window, kv_width]: the
// sequence in slot s keeps the key of position p at row s*window +
// p%window. The step's own keys arrive apart (k and v, float32 rows, not
// yet in the ring).
//
// di_op_ring_attention reuses the paged kernels (attention_decode.cu,
// attention_prefill.cu) over block tables built on the device, so that a
// row gets the bits the paged attention gives it over the same keys with
// SlidingWindow = window (key tiles and decode chunks are aligned to
// absolute positions; block tables only change addresses):
//   - Decode rows (one query row): the row's own key is written into its
//     ring row first (the row and value the caller's write_cache writes
//     again afterwards), then the ring itself is the paged cache, with
//     block size window and every block-table entry of the sequence equal
//     to its slot: position p maps to slot*window + p%window. No copy.
//   - Prefill rows (two or more query rows, or every row when head_dim is
//     past the split decode's limit): their later keys would overwrite ring
//     rows that their earlier rows still see, so each such sequence's
//     visible keys are gathered into a scratch paged cache of RING_BLOCK-key
//     blocks (the ring's history, then the step's keys rounded to the cache
//     type exactly as write_cache rounds them), at their absolute positions,
//     and the prefill kernels run over it. Positions before the oldest key
//     any row sees map to the sequence's first scratch block: never visible,
//     so never weighed.
// Nothing is read back to the host: the scratch sizes follow from the
// host-side bounds (num_seqs, num_tokens, max_seqlen_q, max_seqlen_k), so
// a decode step is capturable in a CUDA graph.
// Cost: the paged attention's, plus for a step with prefill rows one copy
// of each prefill sequence's window of keys and values.
#include "attention.cuh"

#define RING_BLOCK 16 // keys per block of the prefill scratch cache

// di_ring_decode_k: for every sequence s, block-table row s (width
// entries) holds slots[s] (-1 for a slot outside the ring, which the
// attention kernels report), and a decode row's key and value (query row
// cu[s], position seqlens_k[s]-1) are written into its ring row.
template <typename T>
__global__ void di_ring_decode_k(int *bt, int width, T *k_ring, T *v_ring, const float *k, const float *v,
                                 const int *slots, const int *cu, const int *seqlens_k, int num_slots, int window,
                                 int kv_width, unsigned *check) {
	const int s = blockIdx.x;
	int slot = slots[s];
	if (slot < 0 || slot >= num_slots) {
		if (threadIdx.x == 0) atomicOr(check, DI_CHECK_ATTENTION);
		slot = -1;
	}
	for (int i = threadIdx.x; i < width; i += blockDim.x) bt[(size_t)s * width + i] = slot;
	const int q0 = cu[s], kl = seqlens_k[s];
	if (slot < 0 || cu[s + 1] - q0 != 1 || kl < 1) return;
	const size_t dst = ((size_t)slot * window + (kl - 1) % window) * kv_width, src = (size_t)q0 * kv_width;
	for (int e = threadIdx.x; e < kv_width; e += blockDim.x) {
		k_ring[dst + e] = di_from_f32<T>(k[src + e]);
		v_ring[dst + e] = di_from_f32<T>(v[src + e]);
	}
}

// di_ring_prefill_table_k (one block) ranks the sequences that go through
// the scratch cache (every one when all is set, else those of two or more
// query rows) and fills their block-table rows (width entries): sequence
// of rank r owns scratch blocks [r*cap, (r+1)*cap), its logical block lb0 +
// j (lb0: the block of its oldest visible key) is block r*cap + j, earlier
// logical blocks map to r*cap. info[2s], info[2s+1] = (rank or -1, lb0).
// Rows of other sequences point at block 0 (their rows are not computed
// from this table).
#define RING_TABLE_THREADS 1024
__global__ void __launch_bounds__(RING_TABLE_THREADS)
    di_ring_prefill_table_k(int *bt, int *info, int width, const int *cu, const int *seqlens_k, int num_seqs,
                            int cap, int max_ranked, int window, int all, unsigned *check) {
	__shared__ int scan[RING_TABLE_THREADS];
	const int tid = threadIdx.x;
	const int per = (num_seqs + RING_TABLE_THREADS - 1) / RING_TABLE_THREADS;
	const int lo = min(num_seqs, tid * per), hi = min(num_seqs, lo + per);
	int n = 0;
	for (int s = lo; s < hi; s++) n += all || cu[s + 1] - cu[s] >= 2;
	scan[tid] = n;
	__syncthreads();
	for (int o = 1; o < RING_TABLE_THREADS; o <<= 1) {
		const int x = tid >= o ? scan[tid - o] : 0;
		__syncthreads();
		scan[tid] += x;
		__syncthreads();
	}
	int r = scan[tid] - n; // rank of this thread's first ranked sequence
	for (int s = lo; s < hi; s++) {
		const int ql = cu[s + 1] - cu[s], kl = seqlens_k[s];
		int *row = bt + (size_t)s * width;
		if (!(all || ql >= 2)) {
			info[2 * s] = -1, info[2 * s + 1] = 0;
			for (int i = 0; i < width; i++) row[i] = 0;
			continue;
		}
		const int p0 = max(0, kl - ql - window + 1), lb0 = p0 / RING_BLOCK;
		const bool bad = r >= max_ranked || ql < 0 || kl < ql || kl - lb0 * RING_BLOCK > cap * RING_BLOCK;
		if (bad) atomicOr(check, DI_CHECK_ATTENTION);
		info[2 * s] = bad ? -1 : r, info[2 * s + 1] = lb0;
		for (int i = 0; i < width; i++) row[i] = bad ? -1 : r * cap + max(0, min(i - lb0, cap - 1));
		r++;
	}
}

// di_ring_fill_k: block (x, s) fills scratch rows [x*RING_FILL_ROWS, ..)
// of ranked sequence s (di_ring_prefill_table_k's info): position pos =
// lb0*RING_BLOCK + row holds the ring's key for history positions still in
// the window, the step's own key (rounded to T as write_cache rounds it)
// for new positions, zeros elsewhere.
#define RING_FILL_ROWS 8
template <typename T>
__global__ void di_ring_fill_k(T *tk, T *tv, const T *k_ring, const T *v_ring, const float *k, const float *v,
                               const int *info, const int *slots, const int *cu, const int *seqlens_k, int num_slots,
                               int window, int kv_width, int cap, unsigned *check) {
	const int s = blockIdx.y, r = info[2 * s];
	if (r < 0) return;
	const int lb0 = info[2 * s + 1];
	const int q0 = cu[s], ql = cu[s + 1] - q0, kl = seqlens_k[s], hist = kl - ql;
	const int p0 = max(0, hist - window + 1);
	const int slot = slots[s];
	const bool slot_ok = slot >= 0 && slot < num_slots;
	if (!slot_ok && hist > p0 && blockIdx.x == 0 && threadIdx.x == 0) atomicOr(check, DI_CHECK_ATTENTION);
	for (int rr = blockIdx.x * RING_FILL_ROWS; rr < min((blockIdx.x + 1) * RING_FILL_ROWS, cap * RING_BLOCK); rr++) {
		const int pos = lb0 * RING_BLOCK + rr;
		const size_t dst = ((size_t)r * cap * RING_BLOCK + rr) * kv_width;
		if (pos >= hist && pos < kl) {
			const size_t src = (size_t)(q0 + pos - hist) * kv_width;
			for (int e = threadIdx.x; e < kv_width; e += blockDim.x) {
				tk[dst + e] = di_from_f32<T>(k[src + e]);
				tv[dst + e] = di_from_f32<T>(v[src + e]);
			}
		} else if (pos >= p0 && pos < hist && slot_ok) {
			const size_t src = ((size_t)slot * window + pos % window) * kv_width;
			for (int e = threadIdx.x; e < kv_width; e += blockDim.x) {
				tk[dst + e] = k_ring[src + e];
				tv[dst + e] = v_ring[src + e];
			}
		} else {
			for (int e = threadIdx.x; e < kv_width; e += blockDim.x) {
				tk[dst + e] = di_from_f32<T>(0.f);
				tv[dst + e] = di_from_f32<T>(0.f);
			}
		}
	}
}

template <typename T>
static int ring_attention(di_ctx *ctx, di_outp outp, di_dptr q, di_dptr k, di_dptr v, di_dptr k_ring, di_dptr v_ring,
                          di_dptr slots, int num_slots, const di_attn_meta *m, int max_seqlen_k, int num_heads,
                          int num_kv_heads, int head_dim, float scale, int window, int input_dtype,
                          const float *sinks) {
	const int *cu = DI_PTR(const int, m->cu_seqlens_q), *sk = DI_PTR(const int, m->seqlens_k);
	const int *sl = DI_PTR(const int, slots);
	const float *qp = DI_PTR(const float, q), *kp = DI_PTR(const float, k), *vp = DI_PTR(const float, v);
	T *kr = DI_PTR(T, k_ring), *vr = DI_PTR(T, v_ring);
	const int kv_width = num_kv_heads * head_dim;
	const bool split = head_dim <= DEC_MAX_D, decode_only = m->max_seqlen_q == 1;
	const bool tc_in = (input_dtype == DI_BF16 || input_dtype == DI_F16) && ctx->gemm_mode == DI_GEMM_ROUND &&
	                   (head_dim == 64 || head_dim == 128);
	int rc = DI_OK;
	if (split) {
		const int width = (max_seqlen_k + window - 1) / window;
		void *bt = nullptr;
		rc = di_scratch(ctx, (size_t)m->num_seqs * width * sizeof(int), &bt);
		if (rc != DI_OK) return rc;
		di_ring_decode_k<T><<<m->num_seqs, 128, 0, ctx->stream>>>((int *)bt, width, kr, vr, kp, vp, sl, cu, sk,
		                                                           num_slots, window, kv_width, ctx->check);
		rc = di_check_launch(ctx, "ring_attention (decode table)");
		if (rc == DI_OK) {
			di_attn_meta rm = *m;
			rm.block_size = window, rm.num_blocks = num_slots, rm.max_blocks_per_seq = width;
			rm.block_tables = (di_dptr)(uintptr_t)bt;
			const bool tc = tc_in && ((q | k_ring | v_ring) % 16 == 0);
			const int vec4 = (head_dim % 4 == 0) && ((k_ring | v_ring) % 16 == 0);
			rc = di_attention_decode<T>(ctx, outp, qp, kr, vr, cu, sk, (const int *)bt, &rm, num_heads, num_kv_heads,
			                            head_dim, scale, window, tc, decode_only, vec4, sinks);
		}
		di_scratch_free(ctx, bt);
		if (rc != DI_OK || decode_only) return rc;
	}
	// Sequences through the scratch cache: with the decode rows done above,
	// those of two or more query rows, at most one per two rows.
	const int ranked = split ? min(m->num_seqs, m->num_tokens / 2) : m->num_seqs;
	if (ranked <= 0) return DI_OK;
	const int mq = m->max_seqlen_q > 0 ? m->max_seqlen_q : m->num_tokens;
	const int cap = (window - 1 + mq + RING_BLOCK - 1) / RING_BLOCK + 1; // blocks per ranked sequence
	const int width = (max_seqlen_k + RING_BLOCK - 1) / RING_BLOCK;
	const size_t rows = (size_t)ranked * cap * RING_BLOCK;
	void *bt = nullptr, *info = nullptr, *tk = nullptr, *tv = nullptr;
	rc = di_scratch(ctx, (size_t)m->num_seqs * width * sizeof(int), &bt);
	if (rc == DI_OK) rc = di_scratch(ctx, (size_t)m->num_seqs * 2 * sizeof(int), &info);
	if (rc == DI_OK) rc = di_scratch(ctx, rows * kv_width * sizeof(T), &tk);
	if (rc == DI_OK) rc = di_scratch(ctx, rows * kv_width * sizeof(T), &tv);
	if (rc == DI_OK) {
		di_ring_prefill_table_k<<<1, RING_TABLE_THREADS, 0, ctx->stream>>>(
		    (int *)bt, (int *)info, width, cu, sk, m->num_seqs, cap, ranked, window, split ? 0 : 1, ctx->check);
		rc = di_check_launch(ctx, "ring_attention (prefill table)");
	}
	if (rc == DI_OK) {
		const dim3 grid((unsigned)((cap * RING_BLOCK + RING_FILL_ROWS - 1) / RING_FILL_ROWS), (unsigned)m->num_seqs);
		di_ring_fill_k<T><<<grid, 128, 0, ctx->stream>>>((T *)tk, (T *)tv, kr, vr, kp, vp, (const int *)info, sl, cu,
		                                                 sk, num_slots, window, kv_width, cap, ctx->check);
		rc = di_check_launch(ctx, "ring_attention (gather)");
	}
	if (rc == DI_OK) {
		di_attn_meta pm = *m;
		pm.block_size = RING_BLOCK, pm.num_blocks = ranked * cap, pm.max_blocks_per_seq = width;
		pm.block_tables = (di_dptr)(uintptr_t)bt;
		const di_dptr tkd = (di_dptr)(uintptr_t)tk, tvd = (di_dptr)(uintptr_t)tv;
		const bool tc = tc_in && ((q | tkd | tvd) % 16 == 0);
		const int vec4 = (head_dim % 4 == 0) && ((tkd | tvd) % 16 == 0);
		rc = di_attention_prefill<T>(ctx, outp, q, qp, (const T *)tk, (const T *)tv, cu, sk, (const int *)bt, &pm,
		                             num_heads, num_kv_heads, head_dim, scale, window, tc, split, vec4, sinks);
	}
	if (tv) di_scratch_free(ctx, tv);
	if (tk) di_scratch_free(ctx, tk);
	if (info) di_scratch_free(ctx, info);
	if (bt) di_scratch_free(ctx, bt);
	return rc;
}

extern "C" int di_op_ring_attention(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr q, di_dptr k, di_dptr v,
                                    di_dptr k_ring, di_dptr v_ring, di_dptr slots, int num_slots,
                                    const di_attn_meta *m, int max_seqlen_k, int num_heads, int num_kv_heads,
                                    int head_dim, float scale, int window, int input_dtype, int cache_dtype,
                                    di_dptr sinks) {
	if (m->num_tokens == 0) return DI_OK;
	if (window <= 0 || num_slots <= 0 || max_seqlen_k <= 0)
		return di_fail(ctx, DI_ERR_INVALID, "ring_attention: window %d, %d slots, max_seqlen_k %d", window, num_slots,
		               max_seqlen_k);
	if (out_dtype != DI_F32 && out_dtype != DI_BF16 && out_dtype != DI_F16)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "ring_attention: out dtype %d (want F32, BF16 or F16)", out_dtype);
	if (head_dim > ATT_MAX_COLS * ATT_THREADS)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "ring_attention: head_dim %d > %d", head_dim,
		               ATT_MAX_COLS * ATT_THREADS);
	if (m->num_tokens > 0x7fffffff || num_heads > 65535 || m->num_seqs > 65535)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "ring_attention: grid %d tokens x %d heads x %d sequences",
		               m->num_tokens, num_heads, m->num_seqs);
	if (out_dtype != DI_F32) {
		// Float32 results into scratch, then rounded to nearest: the bits of
		// the paged attention's 16-bit output.
		const size_t n = (size_t)m->num_tokens * num_heads * head_dim;
		void *tmp = nullptr;
		int rc = di_scratch(ctx, n * sizeof(float), &tmp);
		if (rc != DI_OK) return rc;
		rc = di_op_ring_attention(ctx, (di_dptr)(uintptr_t)tmp, DI_F32, q, k, v, k_ring, v_ring, slots, num_slots, m,
		                          max_seqlen_k, num_heads, num_kv_heads, head_dim, scale, window, input_dtype,
		                          cache_dtype, sinks);
		if (rc == DI_OK) rc = di_narrow(ctx, DI_PTR(void, out), out_dtype, (const float *)tmp, n);
		di_scratch_free(ctx, tmp);
		return rc;
	}
	const di_outp outp{DI_PTR(void, out), DI_F32};
	const float *sp = DI_PTR(const float, sinks);
	switch (cache_dtype) {
	case DI_F32:
		return ring_attention<float>(ctx, outp, q, k, v, k_ring, v_ring, slots, num_slots, m, max_seqlen_k, num_heads,
		                             num_kv_heads, head_dim, scale, window, input_dtype, sp);
	case DI_F16:
		return ring_attention<__half>(ctx, outp, q, k, v, k_ring, v_ring, slots, num_slots, m, max_seqlen_k,
		                              num_heads, num_kv_heads, head_dim, scale, window, input_dtype, sp);
	case DI_F8E4M3:
		return ring_attention<__nv_fp8_e4m3>(ctx, outp, q, k, v, k_ring, v_ring, slots, num_slots, m, max_seqlen_k,
		                                     num_heads, num_kv_heads, head_dim, scale, window, input_dtype, sp);
	}
	return di_fail(ctx, DI_ERR_UNSUPPORTED, "ring_attention: cache dtype %d (want F32, F16 or F8E4M3)", cache_dtype);
}
