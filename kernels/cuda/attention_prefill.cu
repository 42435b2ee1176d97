// attention_prefill.cu: the GQA attention kernels of every row that the
// split decode does not take (attention.cu says which rows go where):
// query-tiled prefill on tensor cores (di_prefill_attn_tc_k over float32
// caches, di_prefill_attn_tc16_k over half and 8-bit ones,
// di_prefill_attn_gqa_k for a KV head's query heads at once) or on float32
// CUDA cores (di_prefill_attn_k), the plain kernel of one block per (row,
// head) for large head sizes (di_attention_k), and di_attention_prefill,
// which picks among them.
#include "attention_tc.cuh"

// ---------------------------------------------------------------- plain: one block per (row, head)

template <typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    di_attention_k(float *out, const float *q, const T *kc, const T *vc, const int *cu, const int *seqlens_k,
                   const int *block_tables, int num_seqs, int max_blocks, int block_size, int num_blocks,
                   int num_heads, int num_kv_heads, int head_dim, float scale, int window, int skip_decode,
                   unsigned *check, const float *sinks) {
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
	const float inv = di_sink_inv<false>(m, l, di_sink(sinks, h, 1.f));
#pragma unroll
	for (int c = 0; c < ATT_MAX_COLS; c++) {
		const int e = tid + c * ATT_THREADS;
		if (e < head_dim) o[e] = acc[c] * inv;
	}
}

// ---------------------------------------------------------------- prefill: query rows and staging

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
                      int vec4, unsigned *check, const float *sinks) {
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
		const float inv = di_sink_inv<false>(m[i], l[i], di_sink(sinks, h, 1.f));
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
// The building blocks these kernels share with the tensor-core decode
// kernels (tile sizes, staging, ldmatrix, the softmax update) are in
// attention_tc.cuh.

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
// sink: the head's sink logit in log2 units (-inf: none; di_sink_inv).
template <int D>
__device__ __forceinline__ void di_tc16_store(di_outp out, size_t row0, size_t stride, const float (&o)[D / 8][4],
                                              const float (&m)[2], const float (&l)[2], int r0, int nq, float sink) {
	const int t4 = threadIdx.x & 3;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		float li = l[i];
		li += __shfl_xor_sync(0xffffffffu, li, 1);
		li += __shfl_xor_sync(0xffffffffu, li, 2);
		const int r = r0 + 8 * i;
		if (r >= nq) continue;
		const float inv = di_sink_inv<true>(m[i], li, sink);
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
                         unsigned *check, const float *sinks) {
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
	di_tc16_store<D>(out, ((size_t)(q0 + j0) * num_heads + h) * D, (size_t)num_heads * D, o, m, l, r0, nq,
	                 di_sink(sinks, h, 1.4426950408889634f));
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
                           int window, unsigned *check, const float *sinks) {
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
	di_tc16_store<D>(out, ((size_t)(q0 + j0) * num_heads + h) * D, (size_t)num_heads * D, o, m, l, r0, nq,
	                 di_sink(sinks, h, 1.4426950408889634f));
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
                          int window, unsigned *check, const float *sinks) {
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
	di_tc16_store<D>(out, ((size_t)(q0 + j0) * num_heads + h) * D, (size_t)num_heads * D, o, m, l, r0, nq,
	                 di_sink(sinks, h, 1.4426950408889634f));
}

// ---------------------------------------------------------------- prefill: launch

// di_prefill_tc launches di_prefill_attn_tc_k for head size D.
template <int D, typename T>
static int di_prefill_tc(di_ctx *ctx, di_outp op, const float *qp, const T *kp, const T *vp, const int *cu,
                         const int *sk, const int *bt, const di_attn_meta *m, int num_heads, int num_kv_heads,
                         float scale, int window, const float *sinks) {
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
				    num_heads, num_kv_heads, scale * 1.4426950408889634f, window, ctx->check, sinks);
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
		    num_kv_heads, scale * 1.4426950408889634f, window, ctx->check, sinks);
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
		    num_kv_heads, scale * 1.4426950408889634f, window, ctx->check, sinks);
		return di_check_launch(ctx, "attention (prefill, tensor cores)");
	}
}

template <typename T>
int di_attention_prefill(di_ctx *ctx, di_outp outp, di_dptr q, const float *qp, const T *kp, const T *vp,
                         const int *cu, const int *sk, const int *bt, const di_attn_meta *m, int num_heads,
                         int num_kv_heads, int head_dim, float scale, int sliding_window, bool tc, bool split,
                         int vec4, const float *sinks) {
	float *op = static_cast<float *>(outp.p); // the float32 kernels' output (out_dtype DI_F32)
	if (tc && head_dim == 64)
		return di_prefill_tc<64>(ctx, outp, qp, kp, vp, cu, sk, bt, m, num_heads, num_kv_heads, scale, sliding_window,
		                        sinks);
	if (tc && head_dim == 128)
		return di_prefill_tc<128>(ctx, outp, qp, kp, vp, cu, sk, bt, m, num_heads, num_kv_heads, scale, sliding_window,
		                        sinks);
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
		    num_kv_heads, head_dim, scale, sliding_window, vec4 && q % 16 == 0, ctx->check, sinks);
		return di_check_launch(ctx, "attention (prefill)");
	}
	const size_t shmem = (head_dim + ATT_TILE) * sizeof(float) + ATT_TILE * sizeof(int);
	dim3 grid(m->num_tokens, num_heads);
	di_attention_k<<<grid, ATT_THREADS, shmem, ctx->stream>>>(
	    op, qp, kp, vp, cu, sk, bt, m->num_seqs, m->max_blocks_per_seq, m->block_size, m->num_blocks, num_heads,
	    num_kv_heads, head_dim, scale, sliding_window, split ? 1 : 0, ctx->check, sinks);
	return di_check_launch(ctx, "attention");
}

#define DI_ATTENTION_PREFILL(T)                                                                                  \
	template int di_attention_prefill<T>(di_ctx *, di_outp, di_dptr, const float *, const T *, const T *,         \
	                                     const int *, const int *, const int *, const di_attn_meta *, int, int, int, \
	                                     float, int, bool, bool, int, const float *);
DI_ATTENTION_PREFILL(float)
DI_ATTENTION_PREFILL(__half)
DI_ATTENTION_PREFILL(__nv_fp8_e4m3)
#undef DI_ATTENTION_PREFILL
