// quant.cu: linears, logits, embeddings and dequantization over
// block-quantized weights in llama.cpp's formats (kernels.QuantWeighter:
// Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, as GGUF files store them; layout in
// deepinfer_cuda.h's di_quant_weight). The blocks stay as stored on the
// device (4.5 to 8.5 bits a weight).
//
// Linear, two paths:
//   - GEMV (up to DI_QUANT_GEMV_ROWS rows): float32 activations, each
//     weight widened in registers from its block (see di_quant_gemv in
//     quant.cuh for the order of the sums). Against the CPU backend (x
//     times the dequantized weight, float32) it differs by float32
//     rounding: the summation order, the scale applied to a group's sum
//     (Q8_0, Q4_0, Q6_K), the one rounding of d sc q - dmin m (Q4_K, Q5_K).
//   - GEMM (more rows): the weight dequantized per call, a tile of up to
//     64 MiB at a time, into scratch, then cuBLAS: in GEMM mode round
//     the weights and x rounded to BF16 (tensor cores, float32
//     accumulation: each product off by up to 2^-7 relative), in GEMM
//     mode split both float32 (an SGEMM: float32 accuracy, no tensor
//     cores). A first version: the dequantized tile costs 2 (4) bytes a
//     weight written and read again, which a GEMM widening tiles into
//     shared memory would not.
// Batch invariance: a row on the GEMV has the bits it has alone; cuBLAS
// (more than DI_QUANT_GEMV_ROWS rows) is not guaranteed to be, and a row
// on the GEMV and the same row on the GEMM differ by rounding.
//
// Embedding and quant_dequant write the weights bit for bit as
// dequantize_row_* (the CPU backend's simd.Dequantize) computes them.
#include <algorithm>

#include "quant.cuh"

// ---------------------------------------------------------------- widening

__device__ __forceinline__ float di_hbits(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)(h & 0xffffu))); }

// di_q4f writes the four bytes of v (element e in byte e) as floats less
// (off - 2^23): the bits byte | 0x4B000000 are the float 2^23 + byte, from
// which subtracting off is exact (the results are small integers). A byte
// permute and a subtraction a value, where an integer-to-float conversion
// would run at a quarter of the float rate.
__device__ __forceinline__ void di_q4f(uint32_t v, float off, float *o) {
#pragma unroll
	for (int e = 0; e < 4; e++) o[e] = __fsub_rn(__uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | e)), off);
}

#define DI_Q_MAGIC 8388608.f // 2^23

// di_qsm_k4 unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K
// or Q5_K block from its 12 packed bytes (get_scale_min_k4), the bytes
// being the words s0, s1, s2 (little-endian).
__device__ __forceinline__ void di_qsm_k4(int j, uint32_t s0, uint32_t s1, uint32_t s2, float &sc, float &m) {
	auto byte = [&](int i) -> uint32_t {
		const uint32_t w = i < 4 ? s0 : (i < 8 ? s1 : s2);
		return (w >> (8 * (i & 3))) & 0xffu;
	};
	uint32_t a, b;
	if (j < 4) {
		a = byte(j) & 63;
		b = byte(j + 4) & 63;
	} else {
		a = (byte(j + 4) & 0xf) | ((byte(j - 4) >> 6) << 4);
		b = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
	}
	sc = (float)a;
	m = (float)b;
}

// Format traits of the GEMV: UNIT weights a lane's step, BLOCK weights a
// block; load(row, u, nb) reads unit u of a row of nb blocks, dot<R>
// multiplies it with R rows of x (xr[r] the row's first element, the first
// mm rows valid) into acc.

// Q8_0: a unit is a block (32 bytes of int8, its f16 d behind the blocks).
struct di_qf_q8_0 {
	static constexpr int UNIT = 32, BLOCK = 32;
	struct Raw {
		uint4 a, b;
		uint32_t d;
	};
	static __device__ __forceinline__ Raw load(const uint8_t *row, int u, int nb) {
		Raw r;
		const uint4 *p = reinterpret_cast<const uint4 *>(row + 32 * u);
		r.a = __ldcs(p);
		r.b = __ldcs(p + 1);
		r.d = __ldcs(reinterpret_cast<const unsigned short *>(row + 32 * nb) + u);
		return r;
	}
	template <int R>
	static __device__ __forceinline__ void dot(const Raw &w, int u, const float *const *xr, int mm, float *acc) {
		const uint32_t v[8] = {w.a.x, w.a.y, w.a.z, w.a.w, w.b.x, w.b.y, w.b.z, w.b.w};
		float q[32];
#pragma unroll
		for (int i = 0; i < 8; i++) di_q4f(v[i] ^ 0x80808080u, DI_Q_MAGIC + 128.f, q + 4 * i);
		const float d = di_hbits(w.d);
#pragma unroll
		for (int r = 0; r < R; r++) {
			if (r >= mm) break;
			const float4 *xp = reinterpret_cast<const float4 *>(xr[r] + 32 * u);
			float s = 0.f;
#pragma unroll
			for (int i = 0; i < 8; i++) {
				const float4 x = xp[i];
				s = __fmaf_rn(q[4 * i], x.x, s);
				s = __fmaf_rn(q[4 * i + 1], x.y, s);
				s = __fmaf_rn(q[4 * i + 2], x.z, s);
				s = __fmaf_rn(q[4 * i + 3], x.w, s);
			}
			acc[r] = __fmaf_rn(s, d, acc[r]);
		}
	}
};

// Q4_0: a unit is a block (16 bytes: weight l in the low nibble of byte l,
// weight 16 + l in its high nibble; value q - 8).
struct di_qf_q4_0 {
	static constexpr int UNIT = 32, BLOCK = 32;
	struct Raw {
		uint4 q;
		uint32_t d;
	};
	static __device__ __forceinline__ Raw load(const uint8_t *row, int u, int nb) {
		Raw r;
		r.q = __ldcs(reinterpret_cast<const uint4 *>(row + 16 * u));
		r.d = __ldcs(reinterpret_cast<const unsigned short *>(row + 16 * nb) + u);
		return r;
	}
	template <int R>
	static __device__ __forceinline__ void dot(const Raw &w, int u, const float *const *xr, int mm, float *acc) {
		const uint32_t v[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
		float q[32];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			di_q4f(v[i] & 0x0F0F0F0Fu, DI_Q_MAGIC + 8.f, q + 4 * i);
			di_q4f((v[i] >> 4) & 0x0F0F0F0Fu, DI_Q_MAGIC + 8.f, q + 16 + 4 * i);
		}
		const float d = di_hbits(w.d);
#pragma unroll
		for (int r = 0; r < R; r++) {
			if (r >= mm) break;
			const float4 *xp = reinterpret_cast<const float4 *>(xr[r] + 32 * u);
			float s = 0.f;
#pragma unroll
			for (int i = 0; i < 8; i++) {
				const float4 x = xp[i];
				s = __fmaf_rn(q[4 * i], x.x, s);
				s = __fmaf_rn(q[4 * i + 1], x.y, s);
				s = __fmaf_rn(q[4 * i + 2], x.z, s);
				s = __fmaf_rn(q[4 * i + 3], x.w, s);
			}
			acc[r] = __fmaf_rn(s, d, acc[r]);
		}
	}
};

// di_qk_dot accumulates the 16 + 16 weights lo and hi (at x offsets 0 and
// 32 from base) into each row's acc, in column order.
template <int R>
__device__ __forceinline__ void di_qk_dot(const float *lo, const float *hi, int base, const float *const *xr, int mm,
                                          float *acc) {
#pragma unroll
	for (int r = 0; r < R; r++) {
		if (r >= mm) break;
		const float4 *xp = reinterpret_cast<const float4 *>(xr[r] + base);
		float a = acc[r];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const float4 x = xp[i];
			a = __fmaf_rn(lo[4 * i], x.x, a);
			a = __fmaf_rn(lo[4 * i + 1], x.y, a);
			a = __fmaf_rn(lo[4 * i + 2], x.z, a);
			a = __fmaf_rn(lo[4 * i + 3], x.w, a);
		}
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const float4 x = xp[8 + i];
			a = __fmaf_rn(hi[4 * i], x.x, a);
			a = __fmaf_rn(hi[4 * i + 1], x.y, a);
			a = __fmaf_rn(hi[4 * i + 2], x.z, a);
			a = __fmaf_rn(hi[4 * i + 3], x.w, a);
		}
		acc[r] = a;
	}
}

// di_qk4_scaled_dot finishes a Q4_K or Q5_K unit u (see di_qf_q4_k) whose
// codes lo (sub-block 2c) and hi (2c + 1) are widened to floats: each
// becomes d sc q - dmin m (one fused rounding) with the block header hdr's
// scales, then the unit's products are accumulated (di_qk_dot).
template <int R>
__device__ __forceinline__ void di_qk4_scaled_dot(const uint4 &hdr, int u, float *lo, float *hi, const float *const *xr,
                                                  int mm, float *acc) {
	const int c = (u >> 1) & 3, h = u & 1;
	float sc1, m1, sc2, m2;
	di_qsm_k4(2 * c, hdr.y, hdr.z, hdr.w, sc1, m1);
	di_qsm_k4(2 * c + 1, hdr.y, hdr.z, hdr.w, sc2, m2);
	const float d = di_hbits(hdr.x), dmin = di_hbits(hdr.x >> 16);
	const float d1 = __fmul_rn(d, sc1), n1 = -__fmul_rn(dmin, m1);
	const float d2 = __fmul_rn(d, sc2), n2 = -__fmul_rn(dmin, m2);
#pragma unroll
	for (int i = 0; i < 16; i++) {
		lo[i] = __fmaf_rn(d1, lo[i], n1);
		hi[i] = __fmaf_rn(d2, hi[i], n2);
	}
	di_qk_dot<R>(lo, hi, 256 * (u >> 3) + 64 * c + 16 * h, xr, mm, acc);
}

// Q4_K: unit u is block u / 8, chunk c = (u / 2) % 4 of its qs (32 bytes:
// sub-block 2c in the low nibbles, 2c + 1 in the high ones), half h = u % 2
// of the chunk: 16 bytes, weights 64c + 16h + (0..15) and 64c + 32 + 16h +
// (0..15) of the block.
struct di_qf_q4_k {
	static constexpr int UNIT = 32, BLOCK = 256;
	struct Raw {
		uint4 hdr, q;
	};
	static __device__ __forceinline__ Raw load(const uint8_t *row, int u, int) {
		const uint8_t *blk = row + 144 * (u >> 3);
		Raw r;
		r.hdr = __ldg(reinterpret_cast<const uint4 *>(blk));
		r.q = __ldcs(reinterpret_cast<const uint4 *>(blk + 16 + 32 * ((u >> 1) & 3) + 16 * (u & 1)));
		return r;
	}
	template <int R>
	static __device__ __forceinline__ void dot(const Raw &w, int u, const float *const *xr, int mm, float *acc) {
		const uint32_t v[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
		float lo[16], hi[16];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			di_q4f(v[i] & 0x0F0F0F0Fu, DI_Q_MAGIC, lo + 4 * i);
			di_q4f((v[i] >> 4) & 0x0F0F0F0Fu, DI_Q_MAGIC, hi + 4 * i);
		}
		di_qk4_scaled_dot<R>(w.hdr, u, lo, hi, xr, mm, acc);
	}
};

// Q5_K: Q4_K's units with the fifth bits: qh[l] bit 2c for the low-nibble
// weight l of chunk c, bit 2c + 1 for the high one (the unit's 16 qh
// bytes are those of its half h).
struct di_qf_q5_k {
	static constexpr int UNIT = 32, BLOCK = 256;
	struct Raw {
		uint4 hdr, qh, q;
	};
	static __device__ __forceinline__ Raw load(const uint8_t *row, int u, int) {
		const uint8_t *blk = row + 176 * (u >> 3);
		Raw r;
		r.hdr = __ldg(reinterpret_cast<const uint4 *>(blk));
		r.qh = __ldg(reinterpret_cast<const uint4 *>(blk + 16 + 16 * (u & 1)));
		r.q = __ldcs(reinterpret_cast<const uint4 *>(blk + 48 + 32 * ((u >> 1) & 3) + 16 * (u & 1)));
		return r;
	}
	template <int R>
	static __device__ __forceinline__ void dot(const Raw &w, int u, const float *const *xr, int mm, float *acc) {
		const int c = (u >> 1) & 3;
		const uint32_t v[4] = {w.q.x, w.q.y, w.q.z, w.q.w}, b[4] = {w.qh.x, w.qh.y, w.qh.z, w.qh.w};
		float lo[16], hi[16];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const uint32_t l5 = (v[i] & 0x0F0F0F0Fu) | (((b[i] >> (2 * c)) & 0x01010101u) << 4);
			const uint32_t h5 = ((v[i] >> 4) & 0x0F0F0F0Fu) | (((b[i] >> (2 * c + 1)) & 0x01010101u) << 4);
			di_q4f(l5, DI_Q_MAGIC, lo + 4 * i);
			di_q4f(h5, DI_Q_MAGIC, hi + 4 * i);
		}
		di_qk4_scaled_dot<R>(w.hdr, u, lo, hi, xr, mm, acc);
	}
};

// Q6_K: unit u (64 weights) is block u / 4, half n = (u / 2) % 2 (128
// weights), quarter-row lh = u % 2: l in 16 lh .. 16 lh + 15 of the half's
// four groups yy[l], yy[l + 32], yy[l + 64], yy[l + 96] (scales is + 0, 2,
// 4, 6 with is = lh), built from ql[l], ql[l + 32] and qh[l].
struct di_qf_q6_k {
	static constexpr int UNIT = 64, BLOCK = 256;
	struct Raw {
		uint4 a, b, h;
		uint2 sc;
		uint32_t d;
	};
	static __device__ __forceinline__ Raw load(const uint8_t *row, int u, int nb) {
		const int blk = u >> 2, n = (u >> 1) & 1, lh = u & 1;
		const uint8_t *body = row + 208 * blk;
		Raw r;
		r.a = __ldcs(reinterpret_cast<const uint4 *>(body + 64 * n + 16 * lh));
		r.b = __ldcs(reinterpret_cast<const uint4 *>(body + 64 * n + 32 + 16 * lh));
		r.h = __ldcs(reinterpret_cast<const uint4 *>(body + 128 + 32 * n + 16 * lh));
		r.sc = __ldg(reinterpret_cast<const uint2 *>(body + 192 + 8 * n));
		r.d = __ldg(reinterpret_cast<const unsigned short *>(row + 208 * nb) + blk);
		return r;
	}
	template <int R>
	static __device__ __forceinline__ void dot(const Raw &w, int u, const float *const *xr, int mm, float *acc) {
		const int n = (u >> 1) & 1, lh = u & 1;
		const float d = di_hbits(w.d);
		const uint32_t a[4] = {w.a.x, w.a.y, w.a.z, w.a.w}, b[4] = {w.b.x, w.b.y, w.b.z, w.b.w},
		               h[4] = {w.h.x, w.h.y, w.h.z, w.h.w};
		const int base = 256 * (u >> 2) + 128 * n + 16 * lh;
#pragma unroll
		for (int g = 0; g < 4; g++) {
			const int si = lh + 2 * g; // the group's scale: byte si of the half's 8
			const uint32_t sw = si < 4 ? w.sc.x : w.sc.y;
			const float ds = __fmul_rn(d, (float)(int8_t)((sw >> (8 * (si & 3))) & 0xffu));
			float q[16];
#pragma unroll
			for (int i = 0; i < 4; i++) {
				uint32_t v;
				if (g == 0) v = (a[i] & 0x0F0F0F0Fu) | ((h[i] & 0x03030303u) << 4);
				else if (g == 1) v = (b[i] & 0x0F0F0F0Fu) | (((h[i] >> 2) & 0x03030303u) << 4);
				else if (g == 2) v = ((a[i] >> 4) & 0x0F0F0F0Fu) | (((h[i] >> 4) & 0x03030303u) << 4);
				else v = ((b[i] >> 4) & 0x0F0F0F0Fu) | (((h[i] >> 6) & 0x03030303u) << 4);
				di_q4f(v, DI_Q_MAGIC + 32.f, q + 4 * i);
			}
#pragma unroll
			for (int r = 0; r < R; r++) {
				if (r >= mm) break;
				const float4 *xp = reinterpret_cast<const float4 *>(xr[r] + base + 32 * g);
				float s = 0.f;
#pragma unroll
				for (int i = 0; i < 4; i++) {
					const float4 x = xp[i];
					s = __fmaf_rn(q[4 * i], x.x, s);
					s = __fmaf_rn(q[4 * i + 1], x.y, s);
					s = __fmaf_rn(q[4 * i + 2], x.z, s);
					s = __fmaf_rn(q[4 * i + 3], x.w, s);
				}
				acc[r] = __fmaf_rn(s, ds, acc[r]);
			}
		}
	}
};

// ---------------------------------------------------------------- GEMV

#define QV_WARPS 8
#define QV_THREADS (QV_WARPS * 32)

// di_qgemv_col computes column j for rows lo .. lo + rows of out (R at a
// time) from the column's weight row wr of format F. The first unit of the
// weights is loaded before the dependent-launch wait (weights are never
// written by a kernel) unless the caller has waited already.
template <class F, int R>
__device__ __forceinline__ void di_qgemv_col(float *out, const float *x, const int *order, int div, const uint8_t *wr,
                                             const float *bias, int lo, int rows, int n, int j, int k, int lane,
                                             bool waited) {
	const int units = k / F::UNIT, nb = k / F::BLOCK;
	typename F::Raw cur{}, nxt{};
	if (lane < units) cur = F::load(wr, lane, nb);
	if (!waited) di_pdl_wait();
	for (int r0 = 0; r0 < rows; r0 += R) {
		const int mm = min(R, rows - r0);
		const float *xr[R];
#pragma unroll
		for (int r = 0; r < R; r++) {
			const int row = lo + r0 + (r < mm ? r : 0);
			xr[r] = x + (size_t)(order ? order[row] / div : row) * k;
		}
		float acc[R];
#pragma unroll
		for (int r = 0; r < R; r++) acc[r] = 0.f;
		if (r0 > 0 && lane < units) cur = F::load(wr, lane, nb);
		for (int u = lane; u < units; u += 32) {
			if (u + 32 < units) nxt = F::load(wr, u + 32, nb);
			F::template dot<R>(cur, u, xr, mm, acc);
			cur = nxt;
		}
#pragma unroll
		for (int r = 0; r < R; r++) {
			const float v = di_warp_sum(acc[r]);
			if (lane == 0 && r < mm) out[(size_t)(lo + r0 + r) * n + j] = bias ? __fadd_rn(v, bias[j]) : v;
		}
	}
}

// One warp a column j (QV_WARPS columns a block), blockIdx.y the expert.
// FMT: the format of every row (a kernel of that format's registers), or
// 0: each row's from its table entry.
template <int FMT, int R>
__global__ void __launch_bounds__(QV_THREADS)
    di_quant_gemv_k(float *out, const float *x, const int *order, int div, di_quantw w, const float *bias,
                    const int *offsets, int m, int n, int k) {
	const int lane = threadIdx.x & 31, j = blockIdx.x * QV_WARPS + (threadIdx.x >> 5), ex = blockIdx.y;
	if (j >= n) return;
	int lo = 0, rows = m;
	if (offsets) {
		di_pdl_wait();
		lo = offsets[ex];
		rows = offsets[ex + 1] - lo;
		if (rows <= 0) return;
	}
	int fmt;
	const uint8_t *wr = di_qrow(w, (size_t)ex * n + j, fmt);
	if (FMT != 0) fmt = FMT;
	const bool waited = offsets != nullptr;
	switch (fmt) {
	case DI_Q8_0: di_qgemv_col<di_qf_q8_0, R>(out, x, order, div, wr, bias, lo, rows, n, j, k, lane, waited); break;
	case DI_Q4_0: di_qgemv_col<di_qf_q4_0, R>(out, x, order, div, wr, bias, lo, rows, n, j, k, lane, waited); break;
	case DI_Q4_K: di_qgemv_col<di_qf_q4_k, R>(out, x, order, div, wr, bias, lo, rows, n, j, k, lane, waited); break;
	case DI_Q5_K: di_qgemv_col<di_qf_q5_k, R>(out, x, order, div, wr, bias, lo, rows, n, j, k, lane, waited); break;
	case DI_Q6_K: di_qgemv_col<di_qf_q6_k, R>(out, x, order, div, wr, bias, lo, rows, n, j, k, lane, waited); break;
	default: break; // formats are checked when the weight is built
	}
}

template <int FMT, int R>
static void quant_gemv_launch(di_ctx *ctx, float *out, const float *x, const int *order, int div, const di_quantw &w,
                              const float *bias, const int *offsets, int m, int n, int k, int experts, bool pdl) {
	const dim3 grid((unsigned)((n + QV_WARPS - 1) / QV_WARPS), (unsigned)experts);
	if (pdl)
		di_launch(ctx, di_quant_gemv_k<FMT, R>, grid, QV_THREADS, 0, out, x, order, div, w, bias, offsets, m, n, k);
	else
		di_quant_gemv_k<FMT, R><<<grid, QV_THREADS, 0, ctx->stream>>>(out, x, order, div, w, bias, offsets, m, n, k);
}

template <int FMT>
static void quant_gemv_rows(di_ctx *ctx, float *out, const float *x, const int *order, int div, const di_quantw &w,
                            const float *bias, const int *offsets, int m, int n, int k, int experts, bool pdl) {
	if (offsets || m > 4)
		quant_gemv_launch<FMT, 8>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl);
	else if (m > 2)
		quant_gemv_launch<FMT, 4>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl);
	else if (m > 1)
		quant_gemv_launch<FMT, 2>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl);
	else
		quant_gemv_launch<FMT, 1>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl);
}

int di_quant_gemv(di_ctx *ctx, float *out, const float *x, const int *order, int div, const di_quantw &w,
                  const float *bias, const int *offsets, int m, int n, int k, int experts, bool pdl) {
	if (n == 0 || experts == 0 || (!offsets && m == 0)) return DI_OK;
	switch (w.format) {
	case DI_Q8_0: quant_gemv_rows<DI_Q8_0>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	case DI_Q4_0: quant_gemv_rows<DI_Q4_0>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	case DI_Q4_K: quant_gemv_rows<DI_Q4_K>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	case DI_Q5_K: quant_gemv_rows<DI_Q5_K>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	case DI_Q6_K: quant_gemv_rows<DI_Q6_K>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	default: quant_gemv_rows<0>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	}
	return di_check_launch(ctx, "quant gemv");
}

// ---------------------------------------------------------------- dequantization

// di_qdeq32 writes weights 32u .. 32u + 31 of a row of nb blocks of format
// fmt into y, each as dequantize_row_* computes it (float32, the same
// roundings: d * q, d * (q - 8), d * sc * q - dmin * m, d * sc * (q - 32)).
__device__ __forceinline__ void di_qdeq32(int fmt, const uint8_t *row, int u, int nb, float *y) {
	switch (fmt) {
	case DI_Q8_0: {
		const float d = di_hbits(reinterpret_cast<const unsigned short *>(row + 32 * nb)[u]);
		const int8_t *q = reinterpret_cast<const int8_t *>(row + 32 * u);
#pragma unroll
		for (int l = 0; l < 32; l++) y[l] = __fmul_rn((float)q[l], d);
		break;
	}
	case DI_Q4_0: {
		const float d = di_hbits(reinterpret_cast<const unsigned short *>(row + 16 * nb)[u]);
		const uint8_t *q = row + 16 * u;
#pragma unroll
		for (int l = 0; l < 16; l++) {
			y[l] = __fmul_rn((float)((int)(q[l] & 0xf) - 8), d);
			y[l + 16] = __fmul_rn((float)((int)(q[l] >> 4) - 8), d);
		}
		break;
	}
	case DI_Q4_K:
	case DI_Q5_K: {
		const bool q5 = fmt == DI_Q5_K;
		const int s = u & 7, c = s >> 1, hi = s & 1;
		const uint8_t *blk = row + (q5 ? 176 : 144) * (u >> 3);
		const uint4 hdr = *reinterpret_cast<const uint4 *>(blk);
		float sc, m;
		di_qsm_k4(s, hdr.y, hdr.z, hdr.w, sc, m);
		const float d1 = __fmul_rn(di_hbits(hdr.x), sc), m1 = __fmul_rn(di_hbits(hdr.x >> 16), m);
		const uint8_t *qh = blk + 16, *qs = blk + (q5 ? 48 : 16) + 32 * c;
#pragma unroll
		for (int l = 0; l < 32; l++) {
			int v = hi ? qs[l] >> 4 : qs[l] & 0xf;
			if (q5 && ((qh[l] >> s) & 1)) v += 16;
			y[l] = __fsub_rn(__fmul_rn(d1, (float)v), m1);
		}
		break;
	}
	case DI_Q6_K: {
		const int b = u >> 3, s = u & 7, n = s >> 2, g = s & 3;
		const uint8_t *body = row + 208 * b;
		const float d = di_hbits(reinterpret_cast<const unsigned short *>(row + 208 * nb)[b]);
		const uint8_t *ql = body + 64 * n, *qh = body + 128 + 32 * n;
		const int8_t *sc = reinterpret_cast<const int8_t *>(body + 192 + 8 * n);
#pragma unroll
		for (int l = 0; l < 32; l++) {
			const int lb = (g & 1) ? ql[l + 32] : ql[l];
			const int lo4 = (g & 2) ? lb >> 4 : lb & 0xf;
			const int q = lo4 | (((qh[l] >> (2 * g)) & 3) << 4);
			y[l] = __fmul_rn(__fmul_rn(d, (float)sc[l / 16 + 2 * g]), (float)(q - 32));
		}
		break;
	}
	default:
#pragma unroll
		for (int l = 0; l < 32; l++) y[l] = 0.f;
	}
}

__device__ __forceinline__ int di_qblock(int fmt) { return fmt == DI_Q8_0 || fmt == DI_Q4_0 ? 32 : 256; }

__device__ __forceinline__ void di_qstore32(float *dst, const float *y) {
#pragma unroll
	for (int i = 0; i < 8; i++)
		reinterpret_cast<float4 *>(dst)[i] = make_float4(y[4 * i], y[4 * i + 1], y[4 * i + 2], y[4 * i + 3]);
}
__device__ __forceinline__ void di_qstore32(__nv_bfloat16 *dst, const float *y) {
#pragma unroll
	for (int i = 0; i < 4; i++) {
		uint32_t p[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const unsigned lo = di_bits16(__float2bfloat16_rn(y[8 * i + 2 * e]));
			const unsigned hi = di_bits16(__float2bfloat16_rn(y[8 * i + 2 * e + 1]));
			p[e] = lo | (hi << 16);
		}
		reinterpret_cast<uint4 *>(dst)[i] = make_uint4(p[0], p[1], p[2], p[3]);
	}
}

// di_quant_rows_k writes rows dequantized into out[rows, k] (of T: float,
// or bfloat16 rounded to nearest): row i is matrix row ids[i] when ids is
// set (an id outside [0, vocab) gives zeros and sets DI_CHECK_EMBEDDING),
// else row0 + i. One thread a 32-weight unit.
template <typename T>
__global__ void di_quant_rows_k(T *out, di_quantw w, const int *ids, int row0, int rows, int vocab, int k,
                                unsigned *check) {
	di_pdl_wait();
	const int units = k >> 5;
	const size_t total = (size_t)rows * units;
	for (size_t it = blockIdx.x * (size_t)blockDim.x + threadIdx.x; it < total; it += (size_t)gridDim.x * blockDim.x) {
		const int i = (int)(it / units), u = (int)(it % units);
		T *dst = out + (size_t)i * k + 32 * u;
		float y[32];
		size_t r = (size_t)row0 + i;
		if (ids) {
			const int id = ids[i];
			if (id < 0 || id >= vocab) {
				if (u == 0) atomicOr(check, DI_CHECK_EMBEDDING);
#pragma unroll
				for (int l = 0; l < 32; l++) y[l] = 0.f;
				di_qstore32(dst, y);
				continue;
			}
			r = (size_t)id;
		}
		int fmt;
		const uint8_t *row = di_qrow(w, r, fmt);
		di_qdeq32(fmt, row, u, k / di_qblock(fmt), y);
		di_qstore32(dst, y);
	}
}

template <typename T>
static int quant_rows(di_ctx *ctx, T *out, const di_quantw &w, const int *ids, int row0, int rows, int vocab, int k,
                      const char *op) {
	if (rows == 0 || k == 0) return DI_OK;
	di_launch(ctx, di_quant_rows_k<T>, di_grid((size_t)rows * (k >> 5), 256), 256, 0, out, w, ids, row0, rows, vocab, k,
	          ctx->check);
	return di_check_launch(ctx, op);
}

// ---------------------------------------------------------------- GEMM (dequantize, cuBLAS)

#define QG_TILE_BYTES ((size_t)64 << 20) // the dequantized weight tile of one cuBLAS call

// quant_gemm computes out = x w^T (+ bias) with the weight dequantized a
// tile of rows at a time into scratch (BF16 in GEMM mode round, with x
// rounded to BF16 once; float32 in split mode) and cuBLAS writing the
// tile's columns of out.
static int quant_gemm(di_ctx *ctx, float *out, const float *x, const di_quantw &w, const float *bias, int m, int n,
                      int k) {
	const bool split = ctx->gemm_mode == DI_GEMM_SPLIT;
	const size_t es = split ? 4 : 2;
	size_t tile = (size_t)n;
	if (tile * k * es > QG_TILE_BYTES) tile = std::max((size_t)64, QG_TILE_BYTES / ((size_t)k * es) / 64 * 64);
	void *ws = nullptr, *xs = nullptr;
	int rc = di_scratch(ctx, tile * k * es + 16, &ws);
	if (rc == DI_OK && !split) rc = di_scratch(ctx, (size_t)m * k * 2 + 16, &xs);
	if (rc == DI_OK && !split) rc = di_narrow(ctx, xs, DI_BF16, x, (size_t)m * k);
	const cudaDataType_t t = split ? CUDA_R_32F : CUDA_R_16BF;
	const void *xa = split ? (const void *)x : (const void *)xs;
	for (size_t j0 = 0; rc == DI_OK && j0 < (size_t)n; j0 += tile) {
		const int nt = (int)std::min(tile, (size_t)n - j0);
		if (split)
			rc = quant_rows(ctx, (float *)ws, w, nullptr, (int)j0, nt, n, k, "quant linear: dequantize");
		else
			rc = quant_rows(ctx, (__nv_bfloat16 *)ws, w, nullptr, (int)j0, nt, n, k, "quant linear: dequantize");
		if (rc != DI_OK) break;
		// Row-major out[m, n] columns j0.. = x[m, k] tile[nt, k]^T: column-major
		// out^T (leading dimension n) = tile^T' x^T'.
		const float alpha = 1.f, beta = 0.f;
		const cublasStatus_t s = cublasGemmEx(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, nt, m, k, &alpha, ws, t, k, xa, t, k,
		                                      &beta, out + j0, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		if (s != CUBLAS_STATUS_SUCCESS)
			rc = di_fail(ctx, DI_ERR_CUBLAS, "quant linear: cublasGemmEx m=%d n=%d k=%d: status %d", m, nt, k, (int)s);
	}
	if (rc == DI_OK && bias) rc = di_add_into(ctx, out, nullptr, bias, m, n);
	di_scratch_free(ctx, xs);
	di_scratch_free(ctx, ws);
	return rc;
}

// ---------------------------------------------------------------- entry points

int di_quant_weight_of(di_ctx *ctx, const char *op, const di_quant_weight *src, di_quantw *w) {
	if (!src || !src->data || !src->rows)
		return di_fail(ctx, DI_ERR_INVALID, "%s: missing the weight's data or row table", op);
	if (src->data % 16 != 0) return di_fail(ctx, DI_ERR_INVALID, "%s: weight data not 16-byte aligned", op);
	switch (src->format) {
	case 0: case DI_Q8_0: case DI_Q4_0: case DI_Q4_K: case DI_Q5_K: case DI_Q6_K: break;
	default: return di_fail(ctx, DI_ERR_INVALID, "%s: format %d", op, src->format);
	}
	w->data = DI_PTR(const uint8_t, src->data);
	w->rows = DI_PTR(const unsigned long long, src->rows);
	w->format = src->format;
	return DI_OK;
}

static int quant_linear(di_ctx *ctx, float *out, const float *x, const di_quantw &w, const float *bias, int m, int n,
                        int k, int path) {
	if (m == 0 || n == 0) return DI_OK;
	if (k % 32 != 0 || ((uintptr_t)x % 16) != 0)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "quant linear: k %d must be a multiple of 32 with 16-byte aligned x", k);
	const bool gemv = path == DI_QUANT_GEMV || k == 0 || (path == DI_QUANT_AUTO && m <= DI_QUANT_GEMV_ROWS);
	if (gemv) return di_quant_gemv(ctx, out, x, nullptr, 1, w, bias, nullptr, m, n, k, 1, true);
	return quant_gemm(ctx, out, x, w, bias, m, n, k);
}

extern "C" int di_op_quant_linear(di_ctx *ctx, di_dptr out, di_dptr x, const di_quant_weight *wt, di_dptr bias, int m,
                                  int n, int k, int path) {
	di_quantw w;
	const int rc = di_quant_weight_of(ctx, "quant linear", wt, &w);
	if (rc != DI_OK) return rc;
	return quant_linear(ctx, DI_PTR(float, out), DI_PTR(const float, x), w, DI_PTR(const float, bias), m, n, k, path);
}

extern "C" int di_op_quant_logits(di_ctx *ctx, di_dptr out, di_dptr hidden, di_dptr rows, int num_rows,
                                  int num_hidden, di_dptr norm, const di_quant_weight *head, int dim, int vocab,
                                  float eps) {
	di_quantw w;
	int rc = di_quant_weight_of(ctx, "quant logits", head, &w);
	if (rc != DI_OK || num_rows == 0) return rc;
	void *xs = nullptr;
	rc = di_scratch(ctx, (size_t)num_rows * dim * sizeof(float) + 16, &xs);
	if (rc != DI_OK) return rc;
	rc = di_gather_norm(ctx, (float *)xs, DI_PTR(const float, hidden), DI_PTR(const int, rows), num_rows, num_hidden,
	                    DI_PTR(const float, norm), dim, eps);
	if (rc == DI_OK) rc = quant_linear(ctx, DI_PTR(float, out), (const float *)xs, w, nullptr, num_rows, vocab, dim, DI_QUANT_AUTO);
	di_scratch_free(ctx, xs);
	return rc;
}

extern "C" int di_op_quant_embedding(di_ctx *ctx, di_dptr out, const di_quant_weight *table, di_dptr ids,
                                     int num_tokens, int hidden, int vocab) {
	di_quantw w;
	const int rc = di_quant_weight_of(ctx, "quant embedding", table, &w);
	if (rc != DI_OK) return rc;
	if (hidden % 32 != 0) return di_fail(ctx, DI_ERR_INVALID, "quant embedding: hidden %d not a multiple of 32", hidden);
	return quant_rows(ctx, DI_PTR(float, out), w, DI_PTR(const int, ids), 0, num_tokens, vocab, hidden, "embedding");
}

extern "C" int di_op_quant_dequant(di_ctx *ctx, di_dptr out, int out_dtype, const di_quant_weight *wt, int rows,
                                   int k) {
	di_quantw w;
	const int rc = di_quant_weight_of(ctx, "quant dequantize", wt, &w);
	if (rc != DI_OK) return rc;
	if (k % 32 != 0) return di_fail(ctx, DI_ERR_INVALID, "quant dequantize: k %d not a multiple of 32", k);
	if (out_dtype == DI_F32) return quant_rows(ctx, DI_PTR(float, out), w, nullptr, 0, rows, rows, k, "quant dequantize");
	if (out_dtype == DI_BF16)
		return quant_rows(ctx, DI_PTR(__nv_bfloat16, out), w, nullptr, 0, rows, rows, k, "quant dequantize");
	return di_fail(ctx, DI_ERR_UNSUPPORTED, "quant dequantize: out dtype %d (want F32 or BF16)", out_dtype);
}
