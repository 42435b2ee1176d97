// ops.cu: the elementwise, normalization, embedding, RoPE, cache-write,
// placeholder and GEMM-based operations of the CUDA backend. One kernel
// section and one launcher per operation; the launchers are the di_op_*
// entry points the runtime puts in the ABI table.
//
// Numerics follow kernels/cpu where it is cheap to do so: RMSNorm sums
// squares in float64, so that the two backends agree to float32 rounding on
// everything but the GEMMs and SiLU (float32 here, a few ulps).
#include "common.cuh"

// ---------------------------------------------------------------- probe

__global__ void di_probe_k(int *p) {
	if (p) *p = 1;
}

extern "C" cudaError_t di_probe_kernel(void) {
	di_probe_k<<<1, 1>>>(nullptr);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess) return e;
	return cudaDeviceSynchronize();
}

// ---------------------------------------------------------------- widen

template <typename T> __global__ void di_widen_k(float *dst, const T *src, size_t n) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dst[i] = di_to_f32(src[i]);
}

extern "C" int di_op_widen(di_ctx *ctx, float *dst, const void *src, int src_dtype, size_t n) {
	DI_DISPATCH_WEIGHT(src_dtype, T,
	                   di_widen_k<T><<<di_grid(n, 256), 256, 0, ctx->stream>>>(dst, (const T *)src, n));
	return di_check_launch(ctx, "widen");
}

// narrow converts float32 activations to the GEMM input dtype.
template <typename T> __global__ void di_narrow_k(T *dst, const float *src, size_t n) {
	di_pdl_wait();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dst[i] = di_from_f32<T>(src[i]);
}

int di_narrow(di_ctx *ctx, void *dst, int dtype, const float *src, size_t n) {
	if (n == 0) return DI_OK;
	if (dtype == DI_BF16)
		di_launch(ctx, di_narrow_k<__nv_bfloat16>, di_grid(n, 256), 256, 0, (__nv_bfloat16 *)dst, src, n);
	else if (dtype == DI_F16)
		di_launch(ctx, di_narrow_k<__half>, di_grid(n, 256), 256, 0, (__half *)dst, src, n);
	else
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "narrow: dtype %d (want BF16 or F16)", dtype);
	return di_check_launch(ctx, "narrow");
}

// ---------------------------------------------------------------- embedding

template <typename T>
__global__ void di_embedding_k(float *out, const T *table, const int *ids, int hidden, int vocab, unsigned *check) {
	di_pdl_wait();
	const int i = blockIdx.x;
	const int id = ids[i];
	float *dst = out + (size_t)i * hidden;
	if (id < 0 || id >= vocab) {
		if (threadIdx.x == 0) atomicOr(check, DI_CHECK_EMBEDDING);
		for (int j = threadIdx.x; j < hidden; j += blockDim.x) dst[j] = 0.f;
		return;
	}
	const T *src = table + (size_t)id * hidden;
	for (int j = threadIdx.x; j < hidden; j += blockDim.x) dst[j] = di_to_f32(src[j]);
}

extern "C" int di_op_embedding(di_ctx *ctx, di_dptr out, di_dptr table, int table_dtype, di_dptr ids,
                               int num_tokens, int hidden, int vocab) {
	if (num_tokens == 0) return DI_OK;
	DI_DISPATCH_WEIGHT(table_dtype, T,
	                   di_launch(ctx, di_embedding_k<T>, num_tokens, 256, 0, DI_PTR(float, out),
	                             DI_PTR(const T, table), DI_PTR(const int, ids), hidden, vocab, ctx->check));
	return di_check_launch(ctx, "embedding");
}

// ---------------------------------------------------------------- rms_norm

// One block per row. With a residual: residual += x first. Each thread
// touches the same columns in every pass, so out may alias x. A row of at
// most RMS_HELD values a thread is held in registers: every load (the
// weight's before griddepcontrol.wait, as weights are never written) is in
// flight at once, where the loop below waits for each load in turn (its
// store to the residual may alias the next load) and reads the row again
// for the output. Both sum the squares in the same order: the same bits.
// TO is out's type: float, or the 16-bit type of the linear that reads out
// (each value rounded to nearest, as the linear's narrowing pass would).
//
// The held path's sums are those of a block of NT = norm_threads(n)
// threads (virtual thread t holding columns t + k NT, k < K), run by NT /
// V threads that each stand in for V of them (di_block_sum_virtual): the
// same bits at any V, with more rows a multiprocessor holds at once (V > 1
// only where the held path serves, n <= K * NT, K <= RMS_HELD; V = 1 takes
// K = RMS_HELD).
template <typename TO, int V, int K>
__global__ void di_rms_norm_k(TO *out, float *residual, const float *x, const float *w, int n, float eps) {
	di_pdl_trigger(); // the next kernel (usually a GEMV) streams its weights meanwhile
	__shared__ double red[32];
	const size_t row = blockIdx.x;
	const int tid = threadIdx.x, nt = V * blockDim.x;
	const float *xr = x + row * n;
	float *src = residual ? residual + row * n : const_cast<float *>(xr);
	TO *o = out + row * n;
	// Column of virtual thread i of this thread, value k.
	const int t0 = (tid & 31) + V * (tid & ~31);
	auto col = [&](int i, int k) { return t0 + 32 * i + k * nt; };
	if (V > 1 || n <= K * nt) {
		float wv[V][K], v[V][K];
#pragma unroll
		for (int i = 0; i < V; i++)
#pragma unroll
			for (int k = 0; k < K; k++) wv[i][k] = col(i, k) < n ? w[col(i, k)] : 0.f;
		di_pdl_wait();
#pragma unroll
		for (int i = 0; i < V; i++)
#pragma unroll
			for (int k = 0; k < K; k++) v[i][k] = col(i, k) < n ? xr[col(i, k)] : 0.f;
		if (residual) {
			float rv[V][K];
#pragma unroll
			for (int i = 0; i < V; i++)
#pragma unroll
				for (int k = 0; k < K; k++) rv[i][k] = col(i, k) < n ? src[col(i, k)] : 0.f;
#pragma unroll
			for (int i = 0; i < V; i++)
#pragma unroll
				for (int k = 0; k < K; k++) {
					v[i][k] = rv[i][k] + v[i][k];
					if (col(i, k) < n) src[col(i, k)] = v[i][k];
				}
		}
		float r;
		if constexpr (V == 1) r = di_rms_held_scale(v[0], n, eps, red); // K == RMS_HELD
		else {
			// di_rms_held_scale's sums, V virtual threads at a time.
			double s[V];
#pragma unroll
			for (int i = 0; i < V; i++) {
				s[i] = 0;
#pragma unroll
				for (int k = 0; k < K; k++)
					if (col(i, k) < n) s[i] = __fma_rn((double)v[i][k], (double)v[i][k], s[i]);
			}
			r = di_rms_scale(di_block_sum_virtual<V>(s, red), n, eps);
		}
#pragma unroll
		for (int i = 0; i < V; i++)
#pragma unroll
			for (int k = 0; k < K; k++)
				if (col(i, k) < n) o[col(i, k)] = di_from_f32<TO>((v[i][k] * r) * wv[i][k]);
		return;
	}
	di_pdl_wait();
	double s = 0;
	for (int j = tid; j < n; j += nt) {
		float v = xr[j];
		if (residual) {
			v = src[j] + v;
			src[j] = v;
		}
		s += (double)v * (double)v;
	}
	s = di_block_sum(s, red);
	const float r = di_rms_scale(s, n, eps);
	for (int j = tid; j < n; j += nt) o[j] = di_from_f32<TO>((src[j] * r) * w[j]);
}

// RMS_VIRTUAL is the V of di_rms_norm_k for batches of at least
// RMS_VIRTUAL_ROWS rows a multiprocessor (fewer threads a row, more rows
// resident; the same bits), where the held path serves; 1 turns it off.
#ifndef RMS_VIRTUAL
#define RMS_VIRTUAL 4
#endif
#define RMS_VIRTUAL_ROWS 2

template <typename TO>
static void di_rms_norm_launch(di_ctx *ctx, TO *out, float *res, const float *x, const float *w, int rows, int n,
                               float eps) {
	const int nt = norm_threads(n);
	if constexpr (RMS_VIRTUAL > 1) {
		const int sms = ctx->sm_count > 0 ? ctx->sm_count : 132;
		const int k = (n + nt - 1) / nt; // values a virtual thread holds
		if (nt >= 32 * RMS_VIRTUAL && k <= RMS_HELD && rows >= RMS_VIRTUAL_ROWS * sms) {
			const int threads = nt / RMS_VIRTUAL;
			if (k == 1) di_launch(ctx, di_rms_norm_k<TO, RMS_VIRTUAL, 1>, rows, threads, 0, out, res, x, w, n, eps);
			else if (k == 2) di_launch(ctx, di_rms_norm_k<TO, RMS_VIRTUAL, 2>, rows, threads, 0, out, res, x, w, n, eps);
			else di_launch(ctx, di_rms_norm_k<TO, RMS_VIRTUAL, RMS_HELD>, rows, threads, 0, out, res, x, w, n, eps);
			return;
		}
	}
	di_launch(ctx, di_rms_norm_k<TO, 1, RMS_HELD>, rows, nt, 0, out, res, x, w, n, eps);
}

extern "C" int di_op_rms_norm(di_ctx *ctx, di_dptr out, int out_dtype, di_dptr residual, di_dptr x, di_dptr weight,
                              int rows, int n, float eps) {
	if (rows == 0) return DI_OK;
	float *res = DI_PTR(float, residual);
	const float *xp = DI_PTR(const float, x), *wp = DI_PTR(const float, weight);
	switch (out_dtype) {
	case DI_F32: di_rms_norm_launch(ctx, DI_PTR(float, out), res, xp, wp, rows, n, eps); break;
	case DI_BF16: di_rms_norm_launch(ctx, DI_PTR(__nv_bfloat16, out), res, xp, wp, rows, n, eps); break;
	case DI_F16: di_rms_norm_launch(ctx, DI_PTR(__half, out), res, xp, wp, rows, n, eps); break;
	default:
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "rms_norm: out dtype %d (want F32, BF16 or F16)", out_dtype);
	}
	return di_check_launch(ctx, residual ? "add_rms_norm" : "rms_norm");
}

// ---------------------------------------------------------------- linear

// narrow_split writes hi = round(x) and lo = round(x - hi) in T.
template <typename T> __global__ void di_narrow_split_k(T *hi, T *lo, const float *src, size_t n) {
	di_pdl_wait();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		const float v = src[i];
		const T h = di_from_f32<T>(v);
		hi[i] = h;
		lo[i] = di_from_f32<T>(v - di_to_f32(h));
	}
}

__global__ void di_add_into_k(float *out, const float *a, const float *bias, size_t rows, int n) {
	const size_t total = rows * (size_t)n;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
		float v = out[i];
		if (a) v += a[i];
		if (bias) v += bias[i % n];
		out[i] = v;
	}
}

extern "C" int di_add_into(di_ctx *ctx, float *out, const float *a, const float *bias, size_t rows, int n) {
	if (rows == 0 || n == 0) return DI_OK;
	di_add_into_k<<<di_grid(rows * n, 256), 256, 0, ctx->stream>>>(out, a, bias, rows, n);
	return di_check_launch(ctx, "add_into");
}

// ---------------------------------------------------------------- small-batch GEMV

// For a few rows (ctx->gemv, default 4: di_options.gemv_rows) cuBLAS is
// latency-bound on small weights (a 2 MB weight takes 13-20 us) and needs x
// narrowed by a kernel of its own first; the GEMV kernel below reads x as
// float32, rounds it as the GEMM path does, and streams each weight row once
// with 16-byte streaming loads. Numerics are those of the GEMM path: 16-bit
// weights multiply x rounded to their dtype (or its hi and lo parts in
// DI_GEMM_SPLIT, summed separately and added at the end), float32 weights
// multiply x as is; float32 accumulation, in an order that does not depend on
// the other rows.

#define GEMV_MAX_ROWS DI_GEMV_MAX_ROWS // the kernel's limit (8); ctx->gemv rows (default 4) are routed to it

// di_chunk8 holds 8 weight elements as loaded: 16 bytes for 16-bit types,
// 32 for float.
template <typename W> struct di_chunk8 {
	uint4 v[sizeof(W) / 2];
};

// di_ldcs8 loads a chunk with the streaming (evict-first) hint: each weight
// is read once per call, x and the outputs should keep the cache.
template <typename W> __device__ __forceinline__ void di_ldcs8(di_chunk8<W> &c, const W *p) {
	const uint4 *q = reinterpret_cast<const uint4 *>(p);
#pragma unroll
	for (int i = 0; i < (int)(sizeof(W) / 2); i++) c.v[i] = __ldcs(q + i);
}

template <typename W> __device__ __forceinline__ void di_unpack8(const di_chunk8<W> &c, float *o) {
	di_load8(reinterpret_cast<const W *>(c.v), o);
}

// di_silu is x * sigmoid(x) in float32 with the accurate expf (the CPU
// backend evaluates it in float64; the two agree to a few float32 ulps).
// It was float64 here too, which made the prefill's silu_mul compute-bound.
__device__ __forceinline__ float di_silu(float x) { return x / (1.f + expf(-x)); }

// di_gemv_block_k is the GEMV with the k dimension spread over a block:
// each block computes C (default GEMVB_COLS) output columns for all m <= R
// rows, its 256 threads striding over k in 8-element chunks (thread t takes
// chunks t, t+256, ...; U (GEMVB_UNROLL) chunks of every column in flight),
// each chunk of x loaded once and rounded once for the C columns. The
// partial sums are added over each warp in a fixed tree, then over the 8
// warps in warp order: a row's bits do not depend on the other rows, nor on
// C and U. (A warp per output column, 8 loads in flight a lane, measured
// 1.2-2x slower at every Llama-3.2-1B shape: NOTES.md.)
#define GEMVB_COLS 4
#define GEMVB_UNROLL 2
#define GEMVB_THREADS 256

//
// PAIRED (the gate/up weight of a gated MLP, n = 2 inter rows, gate rows
// first): a block's C columns are C/2 gate rows j0 .. j0 + C/2 - 1 and the
// up rows inter + j0 .., and its epilogue writes out[r, j] = silu(gate) *
// up (out [m, inter], no bias): silu_mul's value of the columns this
// kernel computes unpaired, so the bits of the linear and silu_mul.
template <typename W, bool SPLIT, int R, int C = GEMVB_COLS, int U = GEMVB_UNROLL, bool PAIRED = false>
__global__ void __launch_bounds__(GEMVB_THREADS, 2)
    di_gemv_block_k(float *out, const float *x, const W *w, const float *bias, int m, int n, int k) {
	constexpr int NW = GEMVB_THREADS / 32, STRIDE = GEMVB_THREADS * 8 * U, H = PAIRED ? C / 2 : C;
	static_assert(!PAIRED || C % 2 == 0, "di_gemv_block_k: paired columns come in pairs");
	__shared__ float red[NW][C * R * (SPLIT ? 2 : 1)];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int half = PAIRED ? n / 2 : n; // output columns: inter when paired
	const int j0 = blockIdx.x * H;
	const int nh = half - j0 < H ? half - j0 : H; // valid output columns of the block
	// Column c's weight row and whether it exists.
	auto wrow = [&](int c) { return PAIRED && c >= H ? half + j0 + c - H : j0 + c; };
	auto live = [&](int c) { return (PAIRED && c >= H ? c - H : c) < nh; };
	di_chunk8<W> raw[U][C];
	// load queues the weight chunks of the stride starting at base.
	auto load = [&](int base) {
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int i = base + u * GEMVB_THREADS * 8;
#pragma unroll
			for (int c = 0; c < C; c++)
				if (i < k && live(c)) di_ldcs8(raw[u][c], w + (size_t)wrow(c) * k + i);
		}
	};
	// The weights are never written by a kernel, so the first stride is
	// loaded before the wait: launched early, the block streams its weights
	// while the kernel producing x finishes (the norms, silu_mul and the
	// decode merge trigger their dependents at their start for this).
	load(tid * 8);
	di_pdl_wait();
	float acc[C][R], lo[C][R];
#pragma unroll
	for (int c = 0; c < C; c++)
#pragma unroll
		for (int r = 0; r < R; r++) acc[c][r] = lo[c][r] = 0.f;
	for (int base = tid * 8; base < k; base += STRIDE) {
		if (base != tid * 8) load(base);
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int i = base + u * GEMVB_THREADS * 8;
			if (i >= k) break;
#pragma unroll
			for (int r = 0; r < R; r++) {
				if (r >= m) break;
				float xv[8], xl[8];
				di_load8(x + (size_t)r * k + i, xv);
#pragma unroll
				for (int e = 0; e < 8; e++) {
					if (sizeof(W) != sizeof(float)) {
						const float hi = di_to_f32(di_from_f32<W>(xv[e]));
						if (SPLIT) xl[e] = di_to_f32(di_from_f32<W>(xv[e] - hi));
						xv[e] = hi;
					}
				}
				// Widening a chunk per row, not once for all rows, measured
				// faster at one row (fewer live registers; NOTES.md).
#pragma unroll
				for (int c = 0; c < C; c++) {
					if (!live(c)) continue;
					float wv[8];
					di_unpack8(raw[u][c], wv);
					float a = acc[c][r], b = lo[c][r];
#pragma unroll
					for (int e = 0; e < 8; e++) {
						a += wv[e] * xv[e];
						if (SPLIT) b += wv[e] * xl[e];
					}
					acc[c][r] = a, lo[c][r] = b;
				}
			}
		}
	}
#pragma unroll
	for (int c = 0; c < C; c++)
#pragma unroll
		for (int r = 0; r < R; r++) {
			const float a = di_warp_sum(acc[c][r]);
			if (lane == 0) red[warp][c * R + r] = a;
			if (SPLIT) {
				const float b = di_warp_sum(lo[c][r]);
				if (lane == 0) red[warp][C * R + c * R + r] = b;
			}
		}
	__syncthreads();
	// sum is column c's value for row r: the warps' sums in warp order.
	auto sum = [&](int c, int r) {
		float v = 0.f, vl = 0.f;
#pragma unroll
		for (int q = 0; q < NW; q++) {
			v += red[q][c * R + r];
			if (SPLIT) vl += red[q][C * R + c * R + r];
		}
		if (SPLIT) v += vl;
		return v;
	};
	if (tid < H * R) {
		const int c = tid / R, r = tid % R;
		if (c < nh && r < m) {
			if (PAIRED) {
				out[(size_t)r * half + j0 + c] = di_silu(sum(c, r)) * sum(c + H, r);
			} else {
				float v = sum(c, r);
				if (bias) v += bias[j0 + c];
				out[(size_t)r * n + j0 + c] = v;
			}
		}
	}
}

template <typename W, bool SPLIT, bool PAIRED = false>
static void gemv_block(di_ctx *ctx, float *out, const float *x, const W *w, const float *bias, int m, int n, int k) {
	// Blocks over the output columns: n, or n / 2 paired (C / 2 a block).
	const int cols = PAIRED ? n / 2 : n, per = PAIRED ? GEMVB_COLS / 2 : GEMVB_COLS;
	const unsigned grid = (unsigned)((cols + per - 1) / per);
	// One row with k within one pass of the block's threads (8 elements
	// each): the second unrolled chunk would be past k, so the same
	// registers hold the first chunk of twice the columns instead (twice
	// the weight bytes in flight; a column's sums are those of the
	// narrow layout, so the bits are too).
	constexpr int WIDE = 2 * GEMVB_COLS;
	constexpr int U = GEMVB_UNROLL, C = GEMVB_COLS;
	if (m <= 1 && ctx->gemv_wide && k <= GEMVB_THREADS * 8) {
		const int wper = PAIRED ? WIDE / 2 : WIDE;
		di_launch(ctx, di_gemv_block_k<W, SPLIT, 1, WIDE, 1, PAIRED>, (unsigned)((cols + wper - 1) / wper),
		          GEMVB_THREADS, 0, out, x, w, bias, m, n, k);
	} else if (m <= 1)
		di_launch(ctx, di_gemv_block_k<W, SPLIT, 1, C, U, PAIRED>, grid, GEMVB_THREADS, 0, out, x, w, bias, m, n, k);
	else if (m <= 2)
		di_launch(ctx, di_gemv_block_k<W, SPLIT, 2, C, U, PAIRED>, grid, GEMVB_THREADS, 0, out, x, w, bias, m, n, k);
	else if (m <= 4)
		di_launch(ctx, di_gemv_block_k<W, SPLIT, 4, C, U, PAIRED>, grid, GEMVB_THREADS, 0, out, x, w, bias, m, n, k);
	else
		di_launch(ctx, di_gemv_block_k<W, SPLIT, 8, C, U, PAIRED>, grid, GEMVB_THREADS, 0, out, x, w, bias, m, n, k);
}

// gemv_ok reports whether the GEMV kernel serves this shape: one row with
// any weight, or up to ctx->gemv rows with a weight of at most
// ctx->gemv_max_elems elements (di_options.gemv_max_elems, default 4 Mi;
// the defaults are the crossovers with cuBLAS measured on an H200, see
// NOTES.md); k a multiple of 8 and 16-byte aligned rows.
static bool gemv_ok(const di_ctx *ctx, const float *x, const void *w, int m, int n, int k) {
	return m >= 1 && m <= ctx->gemv && m <= GEMV_MAX_ROWS && (m == 1 || (size_t)n * k <= ctx->gemv_max_elems) &&
	       k % 8 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % 16) == 0;
}

static int gemv(di_ctx *ctx, float *out, const float *x, const void *w, int w_dtype, const float *bias, int m, int n,
                int k) {
	const bool split = ctx->gemm_mode == DI_GEMM_SPLIT;
	switch (w_dtype) {
	case DI_F32:
		gemv_block<float, false>(ctx, out, x, (const float *)w, bias, m, n, k);
		break;
	case DI_BF16:
		if (split)
			gemv_block<__nv_bfloat16, true>(ctx, out, x, (const __nv_bfloat16 *)w, bias, m, n, k);
		else
			gemv_block<__nv_bfloat16, false>(ctx, out, x, (const __nv_bfloat16 *)w, bias, m, n, k);
		break;
	case DI_F16:
		if (split)
			gemv_block<__half, true>(ctx, out, x, (const __half *)w, bias, m, n, k);
		else
			gemv_block<__half, false>(ctx, out, x, (const __half *)w, bias, m, n, k);
		break;
	default:
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "linear: weight dtype %d", w_dtype);
	}
	return di_check_launch(ctx, "linear (gemv)");
}

// gemm_f32_input runs out[m,n] = x[m,k] w^T (+ bias) with float32 x, on the
// first path that serves the shape:
//   1. the skinny GEMM (gemm_skinny.cu) for BF16/F16 weights and 1..64 rows
//      (ctx->skinny, di_options.skinny_rows: 0, the default, turns it off), k a multiple
//      of 8, 16-byte aligned x and w: tensor cores, the weights read once, and
//      a row's bits independent of the batch (its doc states the contract);
//   2. the GEMV kernel for 1..ctx->gemv rows (di_options.gemv_rows, default 4;
//      negative turns it off) and weights of at most ctx->gemv_max_elems: with
//      the skinny GEMM on, that is F32 weights only;
//   3. cuBLAS. For 16-bit weights x is narrowed to the weight dtype
//      (DI_GEMM_ROUND) or split into hi and lo rows of one GEMM over 2m rows
//      whose halves are then summed (DI_GEMM_SPLIT).
// Every path reads the weights once and rounds x the same way; they differ
// in summation order only.
static int gemm_f32_input(di_ctx *ctx, float *out, const float *x, const void *w, int w_dtype, const float *bias, int m,
                          int n, int k) {
	if (n == 0) return DI_OK;
	if (k > 0 && di_skinny_ok(ctx, x, w, w_dtype, m, n, k)) return di_skinny_linear(ctx, out, x, w, w_dtype, bias, m, n, k);
	if (k > 0 && gemv_ok(ctx, x, w, m, n, k)) return gemv(ctx, out, x, w, w_dtype, bias, m, n, k);
	int rc;
	if (w_dtype == DI_F32) {
		rc = di_gemm(ctx, out, x, w, DI_F32, m, n, k);
		if (rc == DI_OK && bias) rc = di_add_into(ctx, out, nullptr, bias, m, n);
		return rc;
	}
	if (w_dtype != DI_BF16 && w_dtype != DI_F16) return di_fail(ctx, DI_ERR_UNSUPPORTED, "linear: weight dtype %d", w_dtype);
	const bool split = ctx->gemm_mode == DI_GEMM_SPLIT;
	const size_t count = (size_t)m * k;
	void *xs = nullptr, *tmp = nullptr;
	rc = di_scratch(ctx, (split ? 2 : 1) * count * 2 + 16, &xs);
	if (rc != DI_OK) return rc;
	if (split) rc = di_scratch(ctx, (size_t)2 * m * n * sizeof(float), &tmp);
	if (rc == DI_OK) {
		if (w_dtype == DI_BF16) {
			auto *h = (__nv_bfloat16 *)xs;
			if (split)
				di_launch(ctx, di_narrow_split_k<__nv_bfloat16>, di_grid(count, 256), 256, 0, h, h + count, x, count);
			else
				di_launch(ctx, di_narrow_k<__nv_bfloat16>, di_grid(count, 256), 256, 0, h, x, count);
		} else {
			auto *h = (__half *)xs;
			if (split)
				di_launch(ctx, di_narrow_split_k<__half>, di_grid(count, 256), 256, 0, h, h + count, x, count);
			else
				di_launch(ctx, di_narrow_k<__half>, di_grid(count, 256), 256, 0, h, x, count);
		}
		rc = di_check_launch(ctx, "linear: narrow");
	}
	if (rc == DI_OK && !split) {
		rc = di_gemm(ctx, out, xs, w, w_dtype, m, n, k);
		if (rc == DI_OK && bias) rc = di_add_into(ctx, out, nullptr, bias, m, n);
	} else if (rc == DI_OK) {
		float *t = (float *)tmp;
		rc = di_gemm(ctx, t, xs, w, w_dtype, 2 * m, n, k);
		if (rc == DI_OK) {
			// out = hi rows + lo rows (+ bias): copy the hi half, then add.
			cudaError_t e = cudaMemcpyAsync(out, t, (size_t)m * n * sizeof(float), cudaMemcpyDeviceToDevice, ctx->stream);
			rc = e == cudaSuccess ? di_add_into(ctx, out, t + (size_t)m * n, bias, m, n) : di_cuda_fail(ctx, e, "linear: copy");
		}
	}
	di_scratch_free(ctx, tmp);
	di_scratch_free(ctx, xs);
	return rc;
}

extern "C" int di_op_linear_input_dtype(di_ctx *ctx, int w_dtype, int m) {
	if (ctx->gemm_mode != DI_GEMM_ROUND || (w_dtype != DI_BF16 && w_dtype != DI_F16)) return DI_F32;
	if (m <= ctx->skinny && m <= 64) return DI_F32;            // di_skinny_ok's rows
	if (m <= ctx->gemv && m <= GEMV_MAX_ROWS) return DI_F32;   // gemv_ok's rows
	return w_dtype;                                            // cuBLAS after di_narrow_k
}

extern "C" int di_op_linear(di_ctx *ctx, di_dptr out, di_dptr x, int x_dtype, di_dptr w, int w_dtype, di_dptr bias,
                            int m, int n, int k) {
	if (m == 0) return DI_OK;
	if (x_dtype == DI_F32)
		return gemm_f32_input(ctx, DI_PTR(float, out), DI_PTR(const float, x), DI_PTR(const void, w), w_dtype,
		                      DI_PTR(const float, bias), m, n, k);
	if (x_dtype != w_dtype || (w_dtype != DI_BF16 && w_dtype != DI_F16))
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "linear: x dtype %d with weights of dtype %d", x_dtype, w_dtype);
	// x already rounded to the weights' type: gemm_f32_input's cuBLAS path
	// without its narrowing pass.
	int rc = di_gemm(ctx, DI_PTR(float, out), DI_PTR(const void, x), DI_PTR(const void, w), w_dtype, m, n, k);
	if (rc == DI_OK && bias) rc = di_add_into(ctx, DI_PTR(float, out), nullptr, DI_PTR(const float, bias), m, n);
	return rc;
}

// di_op_gated_linear: act[m, n] = silu(x gate^T) * (x up^T) for the
// gate/up weight w [2n, k] (gate rows first) and float32 x: where the
// GEMV serves the linear (as gemm_f32_input would pick it), one paired GEMV
// writes act; otherwise the linear into gu [m, 2n] and silu_mul. The same
// bits either way.
extern "C" int di_op_gated_linear(di_ctx *ctx, di_dptr act, di_dptr gu, di_dptr x, di_dptr w, int w_dtype, int m,
                                  int n, int k) {
	if (m == 0 || n == 0) return DI_OK;
	float *a = DI_PTR(float, act);
	const float *xs = DI_PTR(const float, x);
	const void *ws = DI_PTR(const void, w);
	const bool plain = w_dtype == DI_F32 || w_dtype == DI_BF16 || w_dtype == DI_F16;
	if (!plain || k <= 0 || di_skinny_ok(ctx, xs, ws, w_dtype, m, 2 * n, k) || !gemv_ok(ctx, xs, ws, m, 2 * n, k)) {
		const int rc = gemm_f32_input(ctx, DI_PTR(float, gu), xs, ws, w_dtype, nullptr, m, 2 * n, k);
		return rc != DI_OK ? rc : di_op_silu_mul(ctx, act, gu, m, n);
	}
	const bool split = ctx->gemm_mode == DI_GEMM_SPLIT;
	switch (w_dtype) {
	case DI_F32:
		gemv_block<float, false, true>(ctx, a, xs, (const float *)ws, nullptr, m, 2 * n, k);
		break;
	case DI_BF16:
		if (split)
			gemv_block<__nv_bfloat16, true, true>(ctx, a, xs, (const __nv_bfloat16 *)ws, nullptr, m, 2 * n, k);
		else
			gemv_block<__nv_bfloat16, false, true>(ctx, a, xs, (const __nv_bfloat16 *)ws, nullptr, m, 2 * n, k);
		break;
	default:
		if (split)
			gemv_block<__half, true, true>(ctx, a, xs, (const __half *)ws, nullptr, m, 2 * n, k);
		else
			gemv_block<__half, false, true>(ctx, a, xs, (const __half *)ws, nullptr, m, 2 * n, k);
	}
	return di_check_launch(ctx, "gated_linear (gemv)");
}

// ---------------------------------------------------------------- silu_mul

// di_silu: see the GEMV above (its paired form applies it too).

// blockIdx.y strides over rows, x over groups of 4 columns of a row (float4
// loads when n is a multiple of 4): no integer division per element, and
// four elements of gate and up in flight per thread.
__global__ void di_silu_mul_k(float *out, const float *gate_up, int rows, int n) {
	di_pdl_trigger(); // the next kernel (usually a GEMV) streams its weights meanwhile
	di_pdl_wait();
	const int j = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
	if (j >= n) return;
	const bool vec = n % 4 == 0;
	for (int r = blockIdx.y; r < rows; r += gridDim.y) {
		const float *g = gate_up + (size_t)r * 2 * n;
		float *o = out + (size_t)r * n;
		if (vec) {
			const float4 a = *reinterpret_cast<const float4 *>(g + j), u = *reinterpret_cast<const float4 *>(g + n + j);
			*reinterpret_cast<float4 *>(o + j) =
			    make_float4(di_silu(a.x) * u.x, di_silu(a.y) * u.y, di_silu(a.z) * u.z, di_silu(a.w) * u.w);
		} else {
			for (int e = j; e < j + 4 && e < n; e++) o[e] = di_silu(g[e]) * g[n + e];
		}
	}
}

extern "C" int di_op_silu_mul(di_ctx *ctx, di_dptr out, di_dptr gate_up, int rows, int n) {
	if (rows == 0 || n == 0) return DI_OK;
	const int groups = (n + 3) / 4;
	const dim3 grid((groups + 255) / 256, rows < 65535 ? rows : 65535);
	di_launch(ctx, di_silu_mul_k, grid, 256, 0, DI_PTR(float, out), DI_PTR(const float, gate_up), rows, n);
	return di_check_launch(ctx, "silu_mul");
}

// di_silu_mul16_k is di_silu_mul_k over 16-bit gate_up rows (T: bf16 or
// half), the product rounded to T: 8 columns a thread (16-byte loads when n
// is a multiple of 8).
template <typename T> __global__ void di_silu_mul16_k(T *out, const T *gate_up, int rows, int n) {
	di_pdl_wait();
	const int j = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
	if (j >= n) return;
	const bool vec = n % 8 == 0;
	for (int r = blockIdx.y; r < rows; r += gridDim.y) {
		const T *g = gate_up + (size_t)r * 2 * n;
		T *o = out + (size_t)r * n;
		if (vec) {
			const uint4 a = *reinterpret_cast<const uint4 *>(g + j), u = *reinterpret_cast<const uint4 *>(g + n + j);
			const T *av = reinterpret_cast<const T *>(&a), *uv = reinterpret_cast<const T *>(&u);
			uint4 res;
			T *rv = reinterpret_cast<T *>(&res);
#pragma unroll
			for (int e = 0; e < 8; e++) rv[e] = di_from_f32<T>(di_silu(di_to_f32(av[e])) * di_to_f32(uv[e]));
			*reinterpret_cast<uint4 *>(o + j) = res;
		} else {
			for (int e = j; e < j + 8 && e < n; e++)
				o[e] = di_from_f32<T>(di_silu(di_to_f32(g[e])) * di_to_f32(g[n + e]));
		}
	}
}

// di_op_gated_mlp runs a gated MLP with its intermediates in the weights'
// 16-bit type: x narrowed, [g u] = x gate_up^T out of cuBLAS in T, silu(g)*u
// in T, then the down projection into float32 out. Against Linear, SiLUMul,
// Linear it moves half the intermediate bytes and skips the narrowing
// before the down projection; g and u are rounded to T where those keep
// float32. Scratch: m x (hidden + 3n) elements of T for the call.
template <typename T>
static int gated_mlp(di_ctx *ctx, float *out, const float *x, const T *x16, const void *gate_up, const void *down,
                     int w_dtype, int m, int n, int hidden) {
	const size_t nx = (size_t)m * hidden, ngu = (size_t)m * 2 * n, nact = (size_t)m * n;
	auto round_up = [](size_t c) { return (c + 127) / 128 * 128; }; // 256-byte aligned parts
	void *buf = nullptr;
	int rc = di_scratch(ctx, (round_up(nx) + round_up(ngu) + round_up(nact)) * sizeof(T), &buf);
	if (rc != DI_OK) return rc;
	T *xs = (T *)buf, *gu = xs + round_up(nx), *act = gu + round_up(ngu);
	if (x16) {
		xs = const_cast<T *>(x16); // already rounded (by rms_norm)
	} else {
		di_launch(ctx, di_narrow_k<T>, di_grid(nx, 256), 256, 0, xs, x, nx);
		rc = di_check_launch(ctx, "gated_mlp: narrow");
	}
	if (rc == DI_OK) rc = di_gemm_to(ctx, gu, w_dtype, xs, gate_up, w_dtype, m, 2 * n, hidden);
	if (rc == DI_OK) {
		const int groups = (n + 7) / 8;
		const dim3 grid((groups + 255) / 256, m < 65535 ? m : 65535);
		di_launch(ctx, di_silu_mul16_k<T>, grid, 256, 0, act, (const T *)gu, m, n);
		rc = di_check_launch(ctx, "gated_mlp: silu_mul");
	}
	if (rc == DI_OK) rc = di_gemm(ctx, out, act, down, w_dtype, m, hidden, n);
	di_scratch_free(ctx, buf);
	return rc;
}

extern "C" int di_op_gated_mlp(di_ctx *ctx, di_dptr out, di_dptr x, int x_dtype, di_dptr gate_up, di_dptr down,
                               int w_dtype, int m, int n, int hidden) {
	if (m == 0) return DI_OK;
	if (x_dtype != DI_F32 && x_dtype != w_dtype)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "gated_mlp: x dtype %d with weights of dtype %d", x_dtype, w_dtype);
	float *o = DI_PTR(float, out);
	const bool x32 = x_dtype == DI_F32;
	const float *xp = x32 ? DI_PTR(const float, x) : nullptr;
	const void *gw = DI_PTR(const void, gate_up), *dw = DI_PTR(const void, down);
	if (w_dtype == DI_BF16)
		return gated_mlp<__nv_bfloat16>(ctx, o, xp, x32 ? nullptr : DI_PTR(const __nv_bfloat16, x), gw, dw, w_dtype, m,
		                                n, hidden);
	if (w_dtype == DI_F16)
		return gated_mlp<__half>(ctx, o, xp, x32 ? nullptr : DI_PTR(const __half, x), gw, dw, w_dtype, m, n, hidden);
	return di_fail(ctx, DI_ERR_UNSUPPORTED, "gated_mlp: weight dtype %d (want bf16 or f16)", w_dtype);
}

// ---------------------------------------------------------------- add, concat

__global__ void di_add_k(float *out, const float *a, const float *b, size_t n) {
	di_pdl_wait();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		out[i] = a[i] + b[i];
}

extern "C" int di_op_add(di_ctx *ctx, di_dptr out, di_dptr a, di_dptr b, uint64_t n) {
	if (n == 0) return DI_OK;
	di_launch(ctx, di_add_k, di_grid(n, 256), 256, 0, DI_PTR(float, out), DI_PTR(const float, a),
	          DI_PTR(const float, b), n);
	return di_check_launch(ctx, "add");
}

__global__ void di_concat_k(float *out, const float *a, const float *b, size_t rows, int m, int n) {
	const int w = m + n;
	const size_t total = rows * (size_t)w;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
		const size_t r = i / w;
		const int j = (int)(i % w);
		out[i] = j < m ? a[r * m + j] : b[r * n + (j - m)];
	}
}

struct di_split_args {
	float *part[DI_MAX_SPLIT];
	int lo[DI_MAX_SPLIT + 1]; // first column of each part; lo[nparts] is the total width
};

// One thread per V columns of a row (blockIdx.y strides over rows): no
// integer division per element. V = 4 (float4 copies) when the pitch, every
// part's width and every pointer allow it (di_op_split_columns checks), else
// 1. Started by di_launch.
template <int V>
__global__ void di_split_columns_k(const float *x, int rows, int pitch, int nparts, di_split_args a) {
	di_pdl_wait();
	const int j = (blockIdx.x * blockDim.x + threadIdx.x) * V;
	if (j >= a.lo[nparts]) return;
	int p = 0;
	while (p + 1 < nparts && j >= a.lo[p + 1]) p++;
	const int pw = a.lo[p + 1] - a.lo[p], col = j - a.lo[p];
	float *dst = a.part[p];
	for (int r = blockIdx.y; r < rows; r += gridDim.y) {
		if constexpr (V == 4)
			*reinterpret_cast<float4 *>(dst + (size_t)r * pw + col) =
			    *reinterpret_cast<const float4 *>(x + (size_t)r * pitch + j);
		else
			dst[(size_t)r * pw + col] = x[(size_t)r * pitch + j];
	}
}

extern "C" int di_op_split_columns(di_ctx *ctx, di_dptr x, int rows, int x_pitch, int nparts, const di_dptr *parts,
                                   const int *widths) {
	if (nparts < 1 || nparts > DI_MAX_SPLIT)
		return di_fail(ctx, DI_ERR_INVALID, "split_columns: %d parts (1..%d)", nparts, DI_MAX_SPLIT);
	di_split_args a;
	a.lo[0] = 0;
	for (int i = 0; i < nparts; i++) {
		a.part[i] = DI_PTR(float, parts[i]);
		a.lo[i + 1] = a.lo[i] + widths[i];
	}
	const int w = a.lo[nparts];
	if (rows == 0 || w == 0) return DI_OK;
	bool vec = x % 16 == 0 && x_pitch % 4 == 0;
	for (int i = 0; i < nparts; i++) vec = vec && widths[i] % 4 == 0 && parts[i] % 16 == 0;
	const int v = vec ? 4 : 1;
	const dim3 grid((w / v + 255) / 256, rows < 65535 ? rows : 65535);
	if (vec)
		di_launch(ctx, di_split_columns_k<4>, grid, dim3(256), 0, DI_PTR(const float, x), rows, x_pitch, nparts, a);
	else
		di_launch(ctx, di_split_columns_k<1>, grid, dim3(256), 0, DI_PTR(const float, x), rows, x_pitch, nparts, a);
	return di_check_launch(ctx, "split_columns");
}

extern "C" int di_op_concat(di_ctx *ctx, di_dptr out, di_dptr a, di_dptr b, int rows, int m, int n) {
	if (rows == 0 || m + n == 0) return DI_OK;
	di_concat_k<<<di_grid((size_t)rows * (m + n), 256), 256, 0, ctx->stream>>>(
	    DI_PTR(float, out), DI_PTR(const float, a), DI_PTR(const float, b), rows, m, n);
	return di_check_launch(ctx, "concat");
}

// ---------------------------------------------------------------- embed_norm_concat

// di_norm_row writes out[j] = (x_j * r) * w[j] for the n values x_j =
// load(j) of one row, r their RMSNorm 1/rms: di_rms_norm_k's arithmetic
// without a residual (its held path up to RMS_HELD values a thread, else
// its loop), so the block must have norm_threads(n) threads, as it does.
template <typename Load>
__device__ __forceinline__ void di_norm_row(float *out, Load load, const float *w, int n, float eps, double *red) {
	const int tid = threadIdx.x, nt = blockDim.x;
	if (n <= RMS_HELD * nt) {
		float wv[RMS_HELD], v[RMS_HELD];
#pragma unroll
		for (int k = 0; k < RMS_HELD; k++) {
			const int j = tid + k * nt;
			wv[k] = j < n ? w[j] : 0.f;
			v[k] = j < n ? load(j) : 0.f;
		}
		const float r = di_rms_held_scale(v, n, eps, red);
#pragma unroll
		for (int k = 0; k < RMS_HELD; k++) {
			const int j = tid + k * nt;
			if (j < n) out[j] = (v[k] * r) * wv[k];
		}
		return;
	}
	double s = 0;
	for (int j = tid; j < n; j += nt) {
		const float v = load(j);
		s += (double)v * (double)v;
	}
	s = di_block_sum(s, red);
	const float r = di_rms_scale(s, n, eps);
	for (int j = tid; j < n; j += nt) out[j] = (load(j) * r) * w[j];
}

// di_embed_norm_concat_k: grid (rows, 2), norm_threads(h) threads. Block
// (r, 0) writes out[r, :h] = RMSNorm(table[ids[r]]; enorm), block (r, 1)
// out[r, h:] = RMSNorm(x[r]; xnorm): the bits of embedding (an id outside
// the table gives a row of zeros and DI_CHECK_EMBEDDING), the two
// rms_norms and concat, in one launch whose two norms run side by side.
template <typename T>
__global__ void di_embed_norm_concat_k(float *out, const T *table, const int *ids, const float *enorm, const float *x,
                                       const float *xnorm, int h, int vocab, float eps, unsigned *check) {
	di_pdl_trigger(); // the next kernel (the projection) streams its weights meanwhile
	__shared__ double red[32];
	di_pdl_wait();
	const size_t row = blockIdx.x;
	float *o = out + row * 2 * h + (size_t)blockIdx.y * h;
	if (blockIdx.y == 0) {
		const int id = ids[row];
		const bool ok = id >= 0 && id < vocab;
		if (!ok && threadIdx.x == 0) atomicOr(check, DI_CHECK_EMBEDDING);
		const T *src = table + (size_t)(ok ? id : 0) * h;
		di_norm_row(o, [&](int j) { return ok ? di_to_f32(src[j]) : 0.f; }, enorm, h, eps, red);
	} else {
		const float *src = x + row * h;
		di_norm_row(o, [&](int j) { return src[j]; }, xnorm, h, eps, red);
	}
}

extern "C" int di_op_embed_norm_concat(di_ctx *ctx, di_dptr out, di_dptr table, int table_dtype, di_dptr ids,
                                       di_dptr enorm, di_dptr x, di_dptr xnorm, int rows, int h, int vocab, float eps) {
	if (rows == 0 || h == 0) return DI_OK;
	const dim3 grid((unsigned)rows, 2);
	DI_DISPATCH_WEIGHT(table_dtype, T,
	                   di_launch(ctx, di_embed_norm_concat_k<T>, grid, norm_threads(h), 0, DI_PTR(float, out),
	                             DI_PTR(const T, table), DI_PTR(const int, ids), DI_PTR(const float, enorm),
	                             DI_PTR(const float, x), DI_PTR(const float, xnorm), h, vocab, eps, ctx->check));
	return di_check_launch(ctx, "embed_norm_concat");
}

// ---------------------------------------------------------------- rope

// One block per token; threads over (head, pair). Started by di_launch.
__global__ void di_rope_k(float *x, const int *positions, const float *cosv, const float *sinv, int max_pos,
                          int num_heads, int head_size, int offset, int rotary_dim, int interleaved,
                          unsigned *check) {
	di_pdl_wait();
	const int i = blockIdx.x;
	const int pos = positions[i];
	if (pos < 0 || pos >= max_pos) {
		if (threadIdx.x == 0) atomicOr(check, DI_CHECK_ROPE);
		return;
	}
	const int half = rotary_dim / 2;
	const float *c = cosv + (size_t)pos * half;
	const float *s = sinv + (size_t)pos * half;
	float *row = x + (size_t)i * num_heads * head_size;
	for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
		const int h = idx / half, j = idx % half;
		float *v = row + h * head_size + offset;
		const int a = interleaved ? 2 * j : j;
		const int b = interleaved ? 2 * j + 1 : j + half;
		di_rotate(v, a, b, c[j], s[j]);
	}
}

extern "C" int di_op_rope(di_ctx *ctx, di_dptr x, di_dptr positions, di_dptr cos, di_dptr sin, int num_tokens,
                          int max_pos, int num_heads, int head_size, int offset, int rotary_dim, int interleaved) {
	if (num_tokens == 0) return DI_OK;
	int threads = norm_threads(num_heads * rotary_dim / 2);
	if (threads > 256) threads = 256;
	di_launch(ctx, di_rope_k, dim3(num_tokens), dim3(threads), 0, DI_PTR(float, x), DI_PTR(const int, positions),
	          DI_PTR(const float, cos), DI_PTR(const float, sin), max_pos, num_heads, head_size, offset, rotary_dim,
	          interleaved, ctx->check);
	return di_check_launch(ctx, "rope");
}

// ---------------------------------------------------------------- write_cache

template <typename T>
__global__ void di_write_cache_k(T *cache, const float *src, const int *slots, int w, int width, int col, int num_slots,
                                 unsigned *check) {
	const int i = blockIdx.x;
	const int slot = slots[i];
	if (slot == -1) return;
	if (slot < -1 || slot >= num_slots) {
		if (threadIdx.x == 0) atomicOr(check, DI_CHECK_WRITE_CACHE);
		return;
	}
	T *dst = cache + (size_t)slot * width + col;
	const float *s = src + (size_t)i * w;
	for (int j = threadIdx.x; j < w; j += blockDim.x) dst[j] = di_from_f32<T>(s[j]);
}

extern "C" int di_op_write_cache(di_ctx *ctx, di_dptr cache, di_dptr src, di_dptr slot_mapping, int num_tokens, int w,
                                 int width, int col, int num_slots, int cache_dtype) {
	if (num_tokens == 0 || w == 0) return DI_OK;
	const int threads = norm_threads(w) > 256 ? 256 : norm_threads(w);
	const float *sp = DI_PTR(const float, src);
	const int *sm = DI_PTR(const int, slot_mapping);
	switch (cache_dtype) {
	case DI_F32:
		di_write_cache_k<<<num_tokens, threads, 0, ctx->stream>>>(DI_PTR(float, cache), sp, sm, w, width, col,
		                                                          num_slots, ctx->check);
		break;
	case DI_F16:
		di_write_cache_k<<<num_tokens, threads, 0, ctx->stream>>>(DI_PTR(__half, cache), sp, sm, w, width, col,
		                                                          num_slots, ctx->check);
		break;
	case DI_F8E4M3:
		di_write_cache_k<<<num_tokens, threads, 0, ctx->stream>>>(DI_PTR(__nv_fp8_e4m3, cache), sp, sm, w, width, col,
		                                                          num_slots, ctx->check);
		break;
	default:
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "write_cache: cache dtype %d (want F32, F16 or F8E4M3)", cache_dtype);
	}
	return di_check_launch(ctx, "write_cache");
}

// ---------------------------------------------------------------- qkv_prepare

#define QKV_MAX_HEAD_DIM 512
#define QKV_TOKENS 4 // tokens a block: their loads are in flight together

// One block per (QKV_TOKENS tokens, head slot): slots [0, H) are q heads,
// [H, H+Hkv) k heads, [H+Hkv, H+2Hkv) v heads; norm_threads(head_dim)
// threads, thread j holding element j of each token's head (head_dim <=
// threads). Each element takes the operations of split_columns, rms_norm,
// rope and write_cache in the same order, so the bits are theirs. Every
// global load is issued before anything waits on one: the norm weight
// before griddepcontrol.wait (weights are never written), then the rows,
// positions and cache slots of all the block's tokens together, then the
// RoPE angles of their positions, which land while the per-head RMSNorm
// sums the squares of all tokens in one block reduction (the same sums as
// one reduction per token). Pairs are rotated through shared memory.
template <typename T> __global__ void di_qkv_prepare_k(di_qkv a, unsigned *check) {
	__shared__ float h[QKV_TOKENS][QKV_MAX_HEAD_DIM];
	__shared__ double red[QKV_TOKENS][32];
	const int t0 = blockIdx.x * QKV_TOKENS, slot_head = blockIdx.y, d = a.head_dim, j = threadIdx.x;
	const int nt = min(QKV_TOKENS, a.num_tokens - t0);
	const int nh = a.num_heads, nkv = a.num_kv_heads, width = nkv * d;
	const bool is_q = slot_head < nh, is_v = slot_head >= nh + nkv, mine = j < d;
	const float *norm = is_v ? nullptr : DI_PTR(const float, is_q ? a.q_norm : a.k_norm);
	const float nw = norm && mine ? norm[j] : 0.f;
	di_pdl_wait();
	const size_t pitch = (size_t)(nh + 2 * nkv) * d;
	const float *src = DI_PTR(const float, a.qkv) + (size_t)t0 * pitch + (size_t)slot_head * d;
	const int *slots = DI_PTR(const int, a.slot_mapping) + t0;
	float x[QKV_TOKENS];
	int pos[QKV_TOKENS], slot[QKV_TOKENS];
#pragma unroll
	for (int tt = 0; tt < QKV_TOKENS; tt++) {
		x[tt] = tt < nt && mine ? src[tt * pitch + j] : 0.f;
		pos[tt] = tt < nt && !is_v ? DI_PTR(const int, a.positions)[t0 + tt] : 0;
		slot[tt] = tt < nt && !is_q ? slots[tt] : -1;
	}
	// slot_ok: the row is written to the caches (-1: skipped; out of range:
	// reported and skipped).
	auto slot_ok = [&](int sl) {
		if (sl < -1 || sl >= a.num_slots) {
			if (j == 0) atomicOr(check, DI_CHECK_WRITE_CACHE);
			return false;
		}
		return sl != -1;
	};
	if (is_v) {
		T *vc = DI_PTR(T, a.v_cache) + (size_t)(slot_head - nh - nkv) * d;
#pragma unroll
		for (int tt = 0; tt < QKV_TOKENS; tt++)
			if (tt < nt && slot_ok(slot[tt]) && mine) vc[(size_t)slot[tt] * width + j] = di_from_f32<T>(x[tt]);
		return;
	}
	const int half = a.rotary_dim / 2;
	float cv[QKV_TOKENS], sv[QKV_TOKENS];
#pragma unroll
	for (int tt = 0; tt < QKV_TOKENS; tt++) {
		const bool ok = tt < nt && pos[tt] >= 0 && pos[tt] < a.max_pos && j < half;
		cv[tt] = ok ? DI_PTR(const float, a.cos)[(size_t)pos[tt] * half + j] : 0.f;
		sv[tt] = ok ? DI_PTR(const float, a.sin)[(size_t)pos[tt] * half + j] : 0.f;
	}
	if (norm) {
		const int lane = j & 31, warp = j >> 5, nwarps = blockDim.x >> 5;
		double ss[QKV_TOKENS];
#pragma unroll
		for (int tt = 0; tt < QKV_TOKENS; tt++) {
			ss[tt] = mine ? (double)x[tt] * (double)x[tt] : 0.0;
			ss[tt] = di_warp_sum(ss[tt]);
			if (lane == 0) red[tt][warp] = ss[tt];
		}
		__syncthreads();
#pragma unroll
		for (int tt = 0; tt < QKV_TOKENS; tt++) {
			const double r = di_warp_sum(lane < nwarps ? red[tt][lane] : 0.0);
			x[tt] = (x[tt] * di_rms_scale(r, d, a.eps)) * nw;
		}
	}
#pragma unroll
	for (int tt = 0; tt < QKV_TOKENS; tt++)
		if (mine) h[tt][j] = x[tt];
	__syncthreads();
	for (int tt = 0; tt < nt; tt++) {
		if (pos[tt] < 0 || pos[tt] >= a.max_pos) {
			if (j == 0) atomicOr(check, DI_CHECK_ROPE);
			continue;
		}
		if (j < half)
			di_rotate(h[tt] + a.rot_offset, a.interleaved ? 2 * j : j, a.interleaved ? 2 * j + 1 : j + half, cv[tt],
			          sv[tt]);
	}
	__syncthreads();
	if (!mine) return;
	for (int tt = 0; tt < nt; tt++) {
		if (is_q)
			DI_PTR(float, a.q)[(size_t)(t0 + tt) * nh * d + (size_t)slot_head * d + j] = h[tt][j];
		else if (slot_ok(slot[tt]))
			DI_PTR(T, a.k_cache)[(size_t)slot[tt] * width + (size_t)(slot_head - nh) * d + j] = di_from_f32<T>(h[tt][j]);
	}
}

extern "C" int di_op_qkv_prepare(di_ctx *ctx, const di_qkv *a) {
	if (a->head_dim < 1 || a->head_dim > QKV_MAX_HEAD_DIM)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "qkv_prepare: head_dim %d (1..%d)", a->head_dim, QKV_MAX_HEAD_DIM);
	if (a->num_tokens == 0) return DI_OK;
	const dim3 grid((a->num_tokens + QKV_TOKENS - 1) / QKV_TOKENS, a->num_heads + 2 * a->num_kv_heads);
	const int threads = norm_threads(a->head_dim);
	switch (a->cache_dtype) {
	case DI_F32:
		di_launch(ctx, di_qkv_prepare_k<float>, grid, threads, 0, *a, ctx->check);
		break;
	case DI_F16:
		di_launch(ctx, di_qkv_prepare_k<__half>, grid, threads, 0, *a, ctx->check);
		break;
	case DI_F8E4M3:
		di_launch(ctx, di_qkv_prepare_k<__nv_fp8_e4m3>, grid, threads, 0, *a, ctx->check);
		break;
	default:
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "qkv_prepare: cache dtype %d (want F32, F16 or F8E4M3)", a->cache_dtype);
	}
	return di_check_launch(ctx, "qkv_prepare");
}

// ---------------------------------------------------------------- resolve_placeholders

__global__ void di_resolve_k(int *ids, const int *from_row, const int *sampled, int n, int r, unsigned *check) {
	di_pdl_wait();
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
		const int f = from_row[i];
		if (f < 0) continue;
		if (f >= r) {
			atomicOr(check, DI_CHECK_RESOLVE);
			continue;
		}
		ids[i] = sampled[f];
	}
}

extern "C" int di_op_resolve_placeholders(di_ctx *ctx, di_dptr ids, di_dptr from_row, di_dptr sampled,
                                          int num_tokens, int num_sampled) {
	if (num_tokens == 0) return DI_OK;
	di_launch(ctx, di_resolve_k, di_grid(num_tokens, 256), 256, 0, DI_PTR(int, ids), DI_PTR(const int, from_row),
	          DI_PTR(const int, sampled), num_tokens, num_sampled, ctx->check);
	return di_check_launch(ctx, "resolve_placeholders");
}

// ---------------------------------------------------------------- shift_accepted

#define SHIFT_THREADS 64

// One block per sequence. Every value that decides whether sequence s is
// shifted (its row, its count, its token range) is the same for the whole
// block, so the early returns are uniform; the new positions of all its
// tokens are checked before any is written, so a sequence that sets
// DI_CHECK_SHIFT is left as it was. Thread 0 alone updates seqlens_k[s].
__global__ void __launch_bounds__(SHIFT_THREADS)
di_shift_k(int *positions, int *slots, int *seqlens_k, const int *cu, const int *tables, const int *shift_from,
           const int *accepted, int num_tokens, int width, int block_size, int r, unsigned *check) {
	di_pdl_wait();
	const int s = blockIdx.x;
	const int f = shift_from[s];
	if (f < 0) return;
	if (f >= r) {
		if (threadIdx.x == 0) atomicOr(check, DI_CHECK_SHIFT);
		return;
	}
	const int a = accepted[f];
	const int b = cu[s], e = cu[s + 1];
	if (a < 0 || b < 0 || b > e || e > num_tokens) {
		if (threadIdx.x == 0) atomicOr(check, DI_CHECK_SHIFT);
		return;
	}
	const int *table = tables + (size_t)s * width;
	int bad = 0;
	for (int i = b + (int)threadIdx.x; i < e; i += blockDim.x) {
		const long long p = (long long)positions[i] + a;
		if (p < 0 || p / block_size >= width || table[p / block_size] < 0) bad = 1;
	}
	if (__syncthreads_or(bad)) {
		if (threadIdx.x == 0) atomicOr(check, DI_CHECK_SHIFT);
		return;
	}
	// Each thread rewrites the tokens it checked: positions[i] is read and
	// written by one thread only.
	for (int i = b + (int)threadIdx.x; i < e; i += blockDim.x) {
		const int p = positions[i] + a;
		positions[i] = p;
		slots[i] = table[p / block_size] * block_size + p % block_size;
	}
	if (threadIdx.x == 0) seqlens_k[s] += a;
}

extern "C" int di_op_shift_accepted(di_ctx *ctx, di_dptr positions, di_dptr slot_mapping, di_dptr seqlens_k,
                                    di_dptr cu_seqlens_q, di_dptr block_tables, di_dptr shift_from, di_dptr accepted,
                                    int num_seqs, int num_tokens, int width, int block_size, int num_accepted) {
	if (num_seqs < 0 || num_tokens < 0 || width < 0 || block_size <= 0 || num_accepted < 0)
		return di_fail(ctx, DI_ERR_INVALID,
		               "shift_accepted: %d sequences, %d tokens, block table width %d, block size %d, %d accepted rows",
		               num_seqs, num_tokens, width, block_size, num_accepted);
	if (num_seqs == 0) return DI_OK;
	di_launch(ctx, di_shift_k, (unsigned)num_seqs, SHIFT_THREADS, 0, DI_PTR(int, positions), DI_PTR(int, slot_mapping),
	          DI_PTR(int, seqlens_k), DI_PTR(const int, cu_seqlens_q), DI_PTR(const int, block_tables),
	          DI_PTR(const int, shift_from), DI_PTR(const int, accepted), num_tokens, width, block_size, num_accepted,
	          ctx->check);
	return di_check_launch(ctx, "shift_accepted");
}

// ---------------------------------------------------------------- logits

// One block per sampled row: gather and normalize (float64 sum of squares as
// rms_norm) into a buffer that then goes through the linear path: float32,
// or (T 16-bit) rounded as the linear path would round it.
template <typename T>
__global__ void di_gather_norm_k(T *dst, const float *hidden, const int *rows, int num_hidden, const float *norm,
                                 int dim, float eps, unsigned *check) {
	di_pdl_trigger(); // the next kernel (usually a GEMV) streams its weights meanwhile
	di_pdl_wait();
	__shared__ double red[32];
	const int r = blockIdx.x;
	const int src_row = rows ? rows[r] : r;
	T *d = dst + (size_t)r * dim;
	if (src_row < 0 || src_row >= num_hidden) {
		if (threadIdx.x == 0) atomicOr(check, DI_CHECK_LOGITS);
		for (int j = threadIdx.x; j < dim; j += blockDim.x) d[j] = di_from_f32<T>(0.f);
		return;
	}
	const float *x = hidden + (size_t)src_row * dim;
	float scale = 1.f;
	if (norm) {
		double s = 0;
		for (int j = threadIdx.x; j < dim; j += blockDim.x) s += (double)x[j] * (double)x[j];
		s = di_block_sum(s, red);
		scale = (float)(1.0 / sqrt(s / dim + (double)eps));
	}
	for (int j = threadIdx.x; j < dim; j += blockDim.x) d[j] = di_from_f32<T>(norm ? (x[j] * scale) * norm[j] : x[j]);
}

int di_gather_norm(di_ctx *ctx, float *dst, const float *hidden, const int *rows, int num_rows, int num_hidden,
                   const float *norm, int dim, float eps) {
	if (num_rows == 0) return DI_OK;
	di_launch(ctx, di_gather_norm_k<float>, num_rows, norm_threads(dim), 0, dst, hidden, rows, num_hidden, norm, dim, eps,
	          ctx->check);
	return di_check_launch(ctx, "logits: gather");
}

extern "C" int di_op_logits(di_ctx *ctx, di_dptr out, di_dptr hidden, di_dptr rows, int num_rows, int num_hidden,
                            di_dptr norm, di_dptr head, int head_dtype, int dim, int vocab, float eps) {
	if (num_rows == 0) return DI_OK;
	// Rows the linear path would round to 16 bits are rounded here instead
	// (one pass over them less, the same bits).
	const int xdt = di_op_linear_input_dtype(ctx, head_dtype, num_rows);
	void *xs = nullptr;
	int rc = di_scratch(ctx, (size_t)num_rows * dim * sizeof(float) + 16, &xs);
	if (rc != DI_OK) return rc;
	const float *h = DI_PTR(const float, hidden), *nw = DI_PTR(const float, norm);
	const int *rw = DI_PTR(const int, rows);
	if (xdt == DI_BF16)
		di_launch(ctx, di_gather_norm_k<__nv_bfloat16>, num_rows, norm_threads(dim), 0, (__nv_bfloat16 *)xs, h, rw,
		          num_hidden, nw, dim, eps, ctx->check);
	else if (xdt == DI_F16)
		di_launch(ctx, di_gather_norm_k<__half>, num_rows, norm_threads(dim), 0, (__half *)xs, h, rw, num_hidden, nw,
		          dim, eps, ctx->check);
	else
		di_launch(ctx, di_gather_norm_k<float>, num_rows, norm_threads(dim), 0, (float *)xs, h, rw, num_hidden, nw, dim,
		          eps, ctx->check);
	rc = di_check_launch(ctx, "logits: gather");
	if (rc == DI_OK)
		rc = di_op_linear(ctx, out, (di_dptr)xs, xdt, head, head_dtype, 0, num_rows, vocab, dim);
	di_scratch_free(ctx, xs);
	return rc;
}
