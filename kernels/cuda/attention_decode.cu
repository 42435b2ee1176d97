// attention_decode.cu: the split-over-keys decode kernels of GQA attention
// (attention.cu says which rows go where): float32 CUDA cores
// (di_decode_attn_k), tensor cores with the query heads as the tile rows
// (di_decode_attn_tc_k) or the keys (di_decode_attn_km_k), 8-bit caches
// widened in registers (di_decode_attn_f8_k), the chunks' combine
// (di_decode_combine_k), and di_attention_decode, which picks among them.
#include "attention_tc.cuh"

// ---------------------------------------------------------------- decode: split over keys

// The chunking and limits of the split are in attention.cuh (DEC_*,
// di_dec_chunk, di_dec_sub).

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
// in ascending order and writes the normalized output (with head h's sink
// logit in the denominator when sinks is set).
__global__ void di_decode_combine_k(di_outp out, const float *part_acc, const float2 *part_ml, const int *cu,
                                    int num_heads, int head_dim, int nsplit, const float *sinks) {
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
			inv_l = di_sink_inv<false>(mx, l, di_sink(sinks, h, 1.f));
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

// ---------------------------------------------------------------- decode: launch

// di_dec_blocks_per_row is how many blocks a (decode row, KV head) of
// di_decode_attn_f8_k (and of di_decode_attn_km_k, unless ctx->dec_km_cpb
// is 0) gets, each taking an even run of the row's chunks
// (di_dec_chunk_keys): enough that rows times that fill ctx->dec_blocks_per_sm
// (32; di_options.decode_blocks_per_sm) blocks a multiprocessor, at most nsplit;
// ctx->dec_cpb = n (decode_chunks_per_block) asks ceil(nsplit / n) instead. A chunk's
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

template <typename T>
int di_attention_decode(di_ctx *ctx, di_outp outp, const float *qp, const T *kp, const T *vp, const int *cu,
                        const int *sk, const int *bt, const di_attn_meta *m, int num_heads, int num_kv_heads,
                        int head_dim, float scale, int sliding_window, bool tc, bool decode_only, int vec4,
                        const float *sinks) {
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
		          (const float *)acc, (const float2 *)ml, cu, num_heads, head_dim, nsplit, sinks);
		rc = di_check_launch(ctx, "attention (decode combine)");
	}
	di_scratch_free(ctx, acc);
	di_scratch_free(ctx, ml);
	return rc;
}

#define DI_ATTENTION_DECODE(T)                                                                                \
	template int di_attention_decode<T>(di_ctx *, di_outp, const float *, const T *, const T *, const int *,   \
	                                    const int *, const int *, const di_attn_meta *, int, int, int, float, int, \
	                                    bool, bool, int, const float *);
DI_ATTENTION_DECODE(float)
DI_ATTENTION_DECODE(__half)
DI_ATTENTION_DECODE(__nv_fp8_e4m3)
#undef DI_ATTENTION_DECODE
