// fp8.cu: linears over FP8 E4M3 weights with float32 block scales
// (kernels.FP8Weighter: DeepSeek-V3 / Qwen3-FP8 checkpoints, 128x128 blocks).
// The weights stay one byte a weight on the device.
//
// Two paths:
//   - GEMV (decode: up to DI_FP8_GEMV_ROWS rows, any block size): float32
//     activations, each weight byte widened in registers (e4m3 -> half,
//     exact, -> float32), the block scale applied once per 16-weight chunk.
//   - GEMM (prefill and larger batches, block_k >= 128): DeepSeek-V3's
//     inference recipe (DeepGEMM's numerics): activations quantized on the
//     device per row and 128 columns to E4M3 with a float32 scale (amax /
//     448), mma.sync m16n8k32 e4m3 x e4m3 -> f32 over each 128-column k tile,
//     the tile's sum promoted into a float32 accumulator times the two
//     scales. The tensor cores' FP8 accumulation keeps fewer bits than
//     float32; promoting every 128 columns bounds what that loses.
//
// Accuracy against the CPU backend (x times the dequantized weight in
// float32): the GEMV differs by float32 summation order only. The GEMM adds
// the activation rounding: |x - dequant(q)| <= 2^-4 |x| for values above
// 2^-6 s (E4M3's normal range relative to the group's scale s = amax / 448)
// and <= 2^-10 s below, so an output differs by at most
// sum_k |w_k| (2^-4 |x_k| + 2^-10 s_k) plus float32 and tensor-core
// rounding; random data sees about 1% of sqrt(sum (w_k x_k)^2).
//
// Batch invariance: both paths compute every output element from its own
// row of x in an order fixed by k and block_k alone, so a row's bits do not
// depend on the other rows of the call; a row computed by the GEMV and the
// same row computed by the GEMM differ (the activation rounding).
#include <initializer_list>

#include "fp8.cuh"

#define DI_FP8_GEMV_ROWS 8 // Linear's auto path: GEMV up to this many rows, the GEMM above

// ---------------------------------------------------------------- GEMV

#define F8V_THREADS 256
#define F8V_UNROLL 2

// di_fp8x16_to_h2 widens a 16-byte chunk of E4M3 weights to 8 half2 (exact).
__device__ __forceinline__ void di_fp8x16_to_h2(__half2 *h, uint4 v) {
	const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] & 0xffffu), __NV_E4M3);
		__half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] >> 16), __NV_E4M3);
		h[2 * i] = *reinterpret_cast<__half2 *>(&lo);
		h[2 * i + 1] = *reinterpret_cast<__half2 *>(&hi);
	}
}

// di_fp8_gemv_k: a block of F8V_THREADS threads computes G = F8V_THREADS / KT
// groups of C output columns; the KT threads of a group stride over k in
// 16-byte chunks (thread t of the group takes chunks t, t + KT, ...), R rows
// at a time (runtime count up to R). Per (row, column) a thread keeps
// acc = fma(sum of the chunk's 16 products, scale, acc) over its chunks in
// ascending order; the warp adds its lanes in an xor tree, the group's warps
// are added in warp order. KT depends on k only (di_fp8_gemv), so the bits
// depend on k, the weights and the row alone.
template <int R, int C, int KT>
__global__ void __launch_bounds__(F8V_THREADS)
    di_fp8_gemv_k(float *out, const float *x, const int *order, int div, di_fp8w w, const float *bias,
                  const int *offsets, int m, int n, int k) {
	constexpr int G = F8V_THREADS / KT, WPG = KT / 32, U = F8V_UNROLL;
	__shared__ float red[F8V_THREADS / 32][R * C];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int grp = tid / KT, tk = tid % KT;
	const int ex = blockIdx.y;
	const int j0 = (blockIdx.x * G + grp) * C;
	const int nch = k >> 4;
	const uint8_t *col[C];
	const float *sp[C];
#pragma unroll
	for (int c = 0; c < C; c++) {
		const int j = min(j0 + c, n - 1);
		const size_t row = (size_t)ex * n + j;
		col[c] = w.data + row * k;
		sp[c] = w.scales + (size_t)w.scale_row[row] * w.scale_cols;
	}
	uint4 raw[U][C];
	auto load = [&](int base) {
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int ci = base + u * KT;
			if (ci < nch) {
#pragma unroll
				for (int c = 0; c < C; c++) raw[u][c] = __ldcs(reinterpret_cast<const uint4 *>(col[c] + ((size_t)ci << 4)));
			}
		}
	};
	// Weights (and their scales) are never written by a kernel: the first
	// stride is loaded before the wait, while the producer of x finishes.
	if (!offsets) load(tk);
	di_pdl_wait();
	int lo = 0, rows = m;
	if (offsets) {
		lo = offsets[ex];
		rows = offsets[ex + 1] - lo;
	}
	for (int r0 = 0; r0 < rows; r0 += R) {
		const int mm = min(R, rows - r0);
		const float *xr[R];
#pragma unroll
		for (int r = 0; r < R; r++) {
			const int row = lo + r0 + (r < mm ? r : 0);
			xr[r] = x + (size_t)(order ? order[row] / div : row) * k;
		}
		float acc[R][C];
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int c = 0; c < C; c++) acc[r][c] = 0.f;
		for (int base = tk; base < nch; base += KT * U) {
			if (base != tk || r0 != 0 || offsets) load(base);
#pragma unroll
			for (int u = 0; u < U; u++) {
				const int ci = base + u * KT;
				if (ci >= nch) break;
				float s[C];
				__half2 h[C][8];
#pragma unroll
				for (int c = 0; c < C; c++) {
					s[c] = sp[c][(ci << 4) >> w.bk_shift];
					di_fp8x16_to_h2(h[c], raw[u][c]);
				}
#pragma unroll
				for (int r = 0; r < R; r++) {
					if (r >= mm) break;
					const float4 *xp = reinterpret_cast<const float4 *>(xr[r] + ((size_t)ci << 4));
					const float4 x0 = xp[0], x1 = xp[1], x2 = xp[2], x3 = xp[3];
					const float xv[16] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w,
					                      x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
#pragma unroll
					for (int c = 0; c < C; c++) {
						float p = 0.f;
#pragma unroll
						for (int e = 0; e < 8; e++) {
							const float2 wf = __half22float2(h[c][e]);
							p = __fmaf_rn(wf.x, xv[2 * e], p);
							p = __fmaf_rn(wf.y, xv[2 * e + 1], p);
						}
						acc[r][c] = __fmaf_rn(p, s[c], acc[r][c]);
					}
				}
			}
		}
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int c = 0; c < C; c++) {
				const float v = di_warp_sum(acc[r][c]);
				if (WPG > 1 && lane == 0) red[warp][r * C + c] = v;
				if (WPG == 1 && lane == 0 && r < mm && j0 + c < n) {
					const float o = bias ? __fadd_rn(v, bias[j0 + c]) : v;
					out[(size_t)(lo + r0 + r) * n + j0 + c] = o;
				}
			}
		if (WPG > 1) {
			__syncthreads();
			if (tk < R * C) {
				const int r = tk / C, c = tk % C;
				if (r < mm && j0 + c < n) {
					float v = red[grp * WPG][tk];
#pragma unroll
					for (int q = 1; q < WPG; q++) v = __fadd_rn(v, red[grp * WPG + q][tk]);
					if (bias) v = __fadd_rn(v, bias[j0 + c]);
					out[(size_t)(lo + r0 + r) * n + j0 + c] = v;
				}
			}
			__syncthreads(); // red is reused by the next rows
		}
	}
}

// fp8_gemv_kt picks the threads a column group strides k with: a chunk
// each where k allows, from 32 to 256. A function of k alone (the bits
// depend on it).
static int fp8_gemv_kt(int k) {
	const int nch = k >> 4;
	if (nch >= 256) return 256;
	if (nch >= 128) return 128;
	if (nch >= 64) return 64;
	return 32;
}

template <int R, int C, int KT>
static void fp8_gemv_launch(di_ctx *ctx, float *out, const float *x, const int *order, int div, const di_fp8w &w,
                            const float *bias, const int *offsets, int m, int n, int k, int experts, bool pdl) {
	constexpr int cols = (F8V_THREADS / KT) * C;
	const dim3 grid((unsigned)((n + cols - 1) / cols), (unsigned)experts);
	if (pdl)
		di_launch(ctx, di_fp8_gemv_k<R, C, KT>, grid, F8V_THREADS, 0, out, x, order, div, w, bias, offsets, m, n, k);
	else
		di_fp8_gemv_k<R, C, KT><<<grid, F8V_THREADS, 0, ctx->stream>>>(out, x, order, div, w, bias, offsets, m, n, k);
}

template <int R, int C>
static void fp8_gemv_rows(di_ctx *ctx, float *out, const float *x, const int *order, int div, const di_fp8w &w,
                          const float *bias, const int *offsets, int m, int n, int k, int experts, bool pdl) {
	switch (fp8_gemv_kt(k)) {
	case 256: fp8_gemv_launch<R, C, 256>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	case 128: fp8_gemv_launch<R, C, 128>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	case 64: fp8_gemv_launch<R, C, 64>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	default: fp8_gemv_launch<R, C, 32>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl); break;
	}
}

int di_fp8_gemv(di_ctx *ctx, float *out, const float *x, const int *order, int div, const di_fp8w &w,
                const float *bias, const int *offsets, int m, int n, int k, int experts, bool pdl) {
	if (n == 0 || experts == 0) return DI_OK;
	if (offsets || m > 4)
		fp8_gemv_rows<8, 2>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl);
	else if (m > 2)
		fp8_gemv_rows<4, 4>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl);
	else if (m > 1)
		fp8_gemv_rows<2, 4>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl);
	else
		fp8_gemv_rows<1, 4>(ctx, out, x, order, div, w, bias, offsets, m, n, k, experts, pdl);
	return di_check_launch(ctx, "fp8 gemv");
}

// ---------------------------------------------------------------- activation quantization

// One warp per (row, group of 128 columns): lane l holds columns 4l..4l+3
// of the group (a multiple of 16 columns is whole or absent).
__global__ void di_fp8_quant_k(uint8_t *q, float *qs, const float *x, const int *order, int div, int rows,
                               int rows_pad, int k, bool group_major) {
	const int groups = (k + DI_FP8_GROUP - 1) / DI_FP8_GROUP;
	const size_t item = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	di_pdl_wait();
	if (item >= (size_t)rows_pad * groups) return;
	const int r = (int)(item / groups), g = (int)(item % groups);
	const int c = g * DI_FP8_GROUP + 4 * lane;
	float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
	if (c < k && r < rows) v = *reinterpret_cast<const float4 *>(x + (size_t)(order ? order[r] / div : r) * k + c);
	float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
	const float s = amax > 0.f ? __fdiv_rn(amax, 448.f) : 1.f;
	if (lane == 0) qs[group_major ? (size_t)g * rows_pad + r : (size_t)r * groups + g] = s;
	if (c < k) {
		const __nv_fp8x2_storage_t a = __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.x, s), __fdiv_rn(v.y, s)),
		                                                         __NV_SATFINITE, __NV_E4M3);
		const __nv_fp8x2_storage_t b = __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.z, s), __fdiv_rn(v.w, s)),
		                                                         __NV_SATFINITE, __NV_E4M3);
		*reinterpret_cast<uint32_t *>(q + (size_t)r * k + c) = (uint32_t)a | ((uint32_t)b << 16);
	}
}

int di_fp8_quant(di_ctx *ctx, uint8_t *q, float *qs, const float *x, const int *order, int div, int rows, int k,
                 bool group_major, int rows_pad) {
	rows_pad = rows_pad > rows ? rows_pad : rows;
	if (rows_pad == 0 || k == 0) return DI_OK;
	const size_t items = (size_t)rows_pad * ((k + DI_FP8_GROUP - 1) / DI_FP8_GROUP);
	di_launch(ctx, di_fp8_quant_k, (unsigned)((items + 7) / 8), 256, 0, q, qs, x, order, div, rows, rows_pad, k,
	          group_major);
	return di_check_launch(ctx, "fp8 quantize activations");
}

// ---------------------------------------------------------------- tensor-core GEMM

// Tiles: BM x 128 outputs a block (BM = 32 MT: MT 4 or 2), 128 columns of k a
// stage, F8G_STAGES stages of cp.async copies in flight. 8 warps, 2 along M
// by 4 along N; a warp's tile is 16 MT rows by 32 columns (4 n8 tiles). Shared
// rows are 128 bytes, their 16-byte chunks swizzled (chunk ^ row % 8) so that
// ldmatrix reads 8 rows without bank conflicts.
#define F8G_BN 128
#define F8G_BK 128
#define F8G_STAGES 4
#define F8G_THREADS 256

__device__ __forceinline__ void di_ldmatrix_x4(unsigned &d0, unsigned &d1, unsigned &d2, unsigned &d3,
                                               const void *p) {
	const unsigned s = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
	             : "r"(s));
}

// di_mma_e4m3 accumulates d += a . b for one m16n8k32 tile of E4M3 values
// (a row-major 16x32, b column-major 32x8; mma.sync fragment order: a0..a3
// hold rows g, g+8, g, g+8 and k 4t..4t+3, 4t..4t+3, 16+4t.., 16+4t..; b0, b1
// k 4t.. and 16+4t.. of column g; g = lane/4, t = lane%4) with float32 d.
// The e4m3 mma.sync needs PTX ISA 8.4 (CUDA 12.4); compilers before it get
// the same products as two m16n8k16 half mmas over the values widened in
// registers (exact: E4M3 is a subset of half; the k permutation is the same
// for a and b), which the GPU build (CUDA 13) never uses.
#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define DI_FP8_MMA 1
#else
#define DI_FP8_MMA 0
#endif

__device__ __forceinline__ void di_mma_e4m3(float *d, const unsigned *a, unsigned b0, unsigned b1) {
#if DI_FP8_MMA
	asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	             "{%0,%1,%2,%3};\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
#pragma unroll
	for (int h = 0; h < 2; h++) {
		const int sh = 16 * h;
		di_mma16816<__half>(d, di_e4m3x2_to_h2(a[0] >> sh), di_e4m3x2_to_h2(a[1] >> sh), di_e4m3x2_to_h2(a[2] >> sh),
		                    di_e4m3x2_to_h2(a[3] >> sh), di_e4m3x2_to_h2(b0 >> sh), di_e4m3x2_to_h2(b1 >> sh));
	}
#endif
}

__device__ __forceinline__ int di_swz(int row, int chunk) { return row * F8G_BK + ((chunk ^ (row & 7)) << 4); }

template <int MT>
__global__ void __launch_bounds__(F8G_THREADS, 1)
    di_fp8_gemm_k(float *out, const uint8_t *aq, const float *as, di_fp8w w, const float *bias, const int *offsets,
                  int m, int n, int k) {
	constexpr int BM = 32 * MT;
	extern __shared__ __align__(128) uint8_t smem[];
	uint8_t *sa = smem, *sb = smem + F8G_STAGES * BM * F8G_BK;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t4 = lane & 3;
	const int ex = blockIdx.z;
	const int n0 = blockIdx.x * F8G_BN, m0 = blockIdx.y * BM;
	di_pdl_wait();
	int lo = 0, rows = m;
	if (offsets) {
		lo = offsets[ex];
		rows = offsets[ex + 1] - lo;
	}
	if (m0 >= rows) return;
	const int ktiles = (k + F8G_BK - 1) / F8G_BK, agroups = ktiles;
	const uint8_t *A = aq + (size_t)lo * k;
	const float *AS = as + (size_t)lo * agroups;
	const uint8_t *B = w.data + (size_t)ex * n * k;
	const int *srow = w.scale_row + (size_t)ex * n;

	auto load_tile = [&](int stage, int kt) {
		const int k0 = kt * F8G_BK;
		uint8_t *da = sa + stage * BM * F8G_BK, *db = sb + stage * F8G_BN * F8G_BK;
#pragma unroll
		for (int i = 0; i < BM * 8 / F8G_THREADS; i++) {
			const int c = tid + i * F8G_THREADS, r = c >> 3, ch = c & 7;
			const bool ok = m0 + r < rows && k0 + ch * 16 < k;
			const uint8_t *src = ok ? A + (size_t)(m0 + r) * k + k0 + ch * 16 : A;
			di_cp_async16(da + di_swz(r, ch), src, ok);
		}
#pragma unroll
		for (int i = 0; i < F8G_BN * 8 / F8G_THREADS; i++) {
			const int c = tid + i * F8G_THREADS, r = c >> 3, ch = c & 7;
			const bool ok = n0 + r < n && k0 + ch * 16 < k;
			const uint8_t *src = ok ? B + (size_t)(n0 + r) * k + k0 + ch * 16 : B;
			di_cp_async16(db + di_swz(r, ch), src, ok);
		}
	};

	// The thread's rows (a scales) and columns (w scale rows).
	int arow[MT][2];
	int wsrow[4][2];
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int h = 0; h < 2; h++) arow[mt][h] = min(m0 + wm * 16 * MT + mt * 16 + g + 8 * h, rows - 1);
#pragma unroll
	for (int nt = 0; nt < 4; nt++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int j = min(n0 + wn * 32 + nt * 8 + 2 * t4 + h, n - 1);
			wsrow[nt][h] = srow[j] * w.scale_cols;
		}

	float acc[MT][4][4];
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int nt = 0; nt < 4; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.f;

#pragma unroll
	for (int s = 0; s < F8G_STAGES - 1; s++) {
		if (s < ktiles) load_tile(s, s);
		di_cp_async_commit();
	}
	for (int kt = 0; kt < ktiles; kt++) {
		di_cp_async_wait<F8G_STAGES - 2>();
		__syncthreads();
		{
			const int nk = kt + F8G_STAGES - 1;
			if (nk < ktiles) load_tile(nk % F8G_STAGES, nk);
			di_cp_async_commit();
		}
		// Scales of this k tile: issued before the products, used after.
		const int wcol = (kt * F8G_BK) >> w.bk_shift;
		float sa_[MT][2], sw_[4][2];
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int h = 0; h < 2; h++) sa_[mt][h] = AS[(size_t)arow[mt][h] * agroups + kt];
#pragma unroll
		for (int nt = 0; nt < 4; nt++)
#pragma unroll
			for (int h = 0; h < 2; h++) sw_[nt][h] = w.scales[wsrow[nt][h] + wcol];

		const uint8_t *ta = sa + (kt % F8G_STAGES) * BM * F8G_BK, *tb = sb + (kt % F8G_STAGES) * F8G_BN * F8G_BK;
		float part[MT][4][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int nt = 0; nt < 4; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++) part[mt][nt][e] = 0.f;
#pragma unroll
		for (int kk = 0; kk < F8G_BK / 32; kk++) {
			unsigned af[MT][4], bf[4][2];
			const int mat = lane >> 3, r8 = lane & 7;
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				const int r = wm * 16 * MT + mt * 16 + r8 + (mat & 1) * 8;
				di_ldmatrix_x4(af[mt][0], af[mt][1], af[mt][2], af[mt][3], ta + di_swz(r, kk * 2 + (mat >> 1)));
			}
#pragma unroll
			for (int np = 0; np < 2; np++) {
				const int r = wn * 32 + np * 16 + r8 + (mat >> 1) * 8;
				di_ldmatrix_x4(bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0], bf[2 * np + 1][1],
				               tb + di_swz(r, kk * 2 + (mat & 1)));
			}
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
#pragma unroll
				for (int nt = 0; nt < 4; nt++) di_mma_e4m3(part[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
		}
		// Promotion: acc += partial * (a_scale * w_scale), in k-tile order.
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int nt = 0; nt < 4; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					acc[mt][nt][e] =
					    __fmaf_rn(part[mt][nt][e], __fmul_rn(sa_[mt][e >> 1], sw_[nt][e & 1]), acc[mt][nt][e]);
	}
	di_cp_async_wait<0>();

	float *O = out + (size_t)lo * n;
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int r = m0 + wm * 16 * MT + mt * 16 + g + 8 * h;
			if (r >= rows) continue;
#pragma unroll
			for (int nt = 0; nt < 4; nt++) {
				const int j = n0 + wn * 32 + nt * 8 + 2 * t4;
				float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
				if (j < n) O[(size_t)r * n + j] = bias ? __fadd_rn(v0, bias[j]) : v0;
				if (j + 1 < n) O[(size_t)r * n + j + 1] = bias ? __fadd_rn(v1, bias[j + 1]) : v1;
			}
		}
}

bool di_fp8_gemm_ok(const di_fp8w &w, int k) { return (1 << w.bk_shift) >= DI_FP8_GROUP && k % 16 == 0; }

template <int MT>
static int fp8_gemm_launch(di_ctx *ctx, float *out, const uint8_t *aq, const float *as, const di_fp8w &w,
                           const float *bias, const int *offsets, int max_rows, int n, int k, int experts) {
	constexpr int BM = 32 * MT;
	const size_t smem = (size_t)F8G_STAGES * (BM + F8G_BN) * F8G_BK;
	cudaError_t e = cudaFuncSetAttribute(di_fp8_gemm_k<MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "fp8 gemm: cudaFuncSetAttribute");
	const dim3 grid((unsigned)((n + F8G_BN - 1) / F8G_BN), (unsigned)((max_rows + BM - 1) / BM), (unsigned)experts);
	di_launch(ctx, di_fp8_gemm_k<MT>, grid, F8G_THREADS, smem, out, aq, as, w, bias, offsets, max_rows, n, k);
	return di_check_launch(ctx, "fp8 gemm");
}

int di_fp8_gemm(di_ctx *ctx, float *out, const uint8_t *aq, const float *as, const di_fp8w &w, const float *bias,
                const int *offsets, int max_rows, int n, int k, int experts) {
	if (max_rows == 0 || n == 0 || experts == 0) return DI_OK;
	// 64-row tiles where 128-row ones leave multiprocessors idle (the bits
	// are the same: a tile's shape does not change any element's sum).
	const size_t tiles128 = (size_t)((n + F8G_BN - 1) / F8G_BN) * ((max_rows + 127) / 128) * experts;
	if (tiles128 < (size_t)ctx->sm_count)
		return fp8_gemm_launch<2>(ctx, out, aq, as, w, bias, offsets, max_rows, n, k, experts);
	return fp8_gemm_launch<4>(ctx, out, aq, as, w, bias, offsets, max_rows, n, k, experts);
}

// ---------------------------------------------------------------- cuBLASLt GEMM

// DeepSeek-V3's recipe on cuBLASLt (12.9 and later, sm_90): D[n, m]
// (column-major, so the row-major out[m, n]) = W^T-op(A) x X(B), A the
// weight's E4M3 bytes ([n, k] row-major: k x n column-major, transposed)
// with one float32 scale a 128x128 block (lt_scales), B the quantized
// activations ([m, k] row-major: k x m column-major) with one a row and
// 128 columns in group-major order (di_fp8_quant's group_major), float32
// accumulation and output. cuBLASLt picks the algorithm per shape, so a
// row's bits may depend on m.

// di_fp8_lt_plan is cuBLASLt's descriptors and algorithm for one shape and
// pointer alignment (cuBLASLt's algorithms assume an alignment).
struct di_fp8_lt_plan : di_lt_desc {
	int m = 0, n = 0, k = 0, align = 0;
};

#define DI_FP8_LT_PLANS 64 // plans kept: shapes past it replace the oldest

struct di_fp8_lt_cache {
	di_fp8_lt_plan plans[DI_FP8_LT_PLANS];
	int used = 0, next = 0;
};

static void lt_plan_clear(di_fp8_lt_plan &p) {
	di_lt_desc_destroy(p);
	p = di_fp8_lt_plan();
}

void di_fp8_lt_free(di_ctx *ctx) {
	if (!ctx->fp8_lt) return;
	for (auto &p : ctx->fp8_lt->plans) lt_plan_clear(p);
	delete ctx->fp8_lt;
	ctx->fp8_lt = nullptr;
}

// lt_align is the largest power of two up to 256 dividing every pointer.
static int lt_align(std::initializer_list<const void *> ptrs) {
	uintptr_t bits = 256;
	for (const void *p : ptrs) bits |= (uintptr_t)p;
	return (int)(bits & (~bits + 1));
}

#define LT_OK(call) ((call) == CUBLAS_STATUS_SUCCESS)

// lt_set_scales points the plan's descriptor at the call's scales.
static bool lt_set_scales(di_fp8_lt_plan &p, const float *ws, const float *xs) {
	return LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof ws)) &&
	       LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs));
}

// lt_plan returns the plan of (m, n, k, align), made on first use (one
// heuristic query, some microseconds of host time), or null without a
// cuBLASLt handle.
static di_fp8_lt_plan *lt_plan(di_ctx *ctx, int m, int n, int k, int align, const float *ws, const float *xs) {
	if (!ctx->lt) return nullptr;
	if (!ctx->fp8_lt) ctx->fp8_lt = new di_fp8_lt_cache();
	di_fp8_lt_cache *c = ctx->fp8_lt;
	for (int i = 0; i < c->used; i++) {
		di_fp8_lt_plan &p = c->plans[i];
		if (p.m == m && p.n == n && p.k == k && p.align == align) return &p;
	}
	const int slot = c->used < DI_FP8_LT_PLANS ? c->used++ : (c->next++ % DI_FP8_LT_PLANS);
	di_fp8_lt_plan &p = c->plans[slot];
	lt_plan_clear(p);
	p.m = m, p.n = n, p.k = k, p.align = align;
	const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	const cublasLtMatmulMatrixScale_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
	                                  bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
	bool good = LT_OK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
	            LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
	            LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) &&
	            LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am)) &&
	            LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm)) &&
	            lt_set_scales(p, ws, xs) && LT_OK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, k, n, k)) &&
	            LT_OK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, k, m, k)) &&
	            LT_OK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, n, m, n)) && di_lt_pick_algo(ctx, p, align);
	p.ok = good;
	return &p;
}

__global__ void di_fp8_add_bias_k(float *out, const float *bias, int m, int n) {
	di_pdl_wait();
	const size_t total = (size_t)m * n;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
		out[i] = __fadd_rn(out[i], bias[i % n]);
}

static int fp8_gemm_lt(di_ctx *ctx, di_fp8_lt_plan &p, float *out, const uint8_t *q, const float *qs,
                       const di_fp8w &w, const float *bias) {
	if (!lt_set_scales(p, w.lt_scales, qs))
		return di_fail(ctx, DI_ERR_CUBLAS, "fp8 linear: cuBLASLt scale pointers (m=%d n=%d k=%d)", p.m, p.n, p.k);
	const float alpha = 1.f, beta = 0.f;
	const cublasStatus_t s = cublasLtMatmul(ctx->lt, p.op, &alpha, w.data, p.a, q, p.b, &beta, out, p.d, out, p.d,
	                                        &p.algo, ctx->cublas_workspace, ctx->cublas_workspace_bytes, ctx->stream);
	if (s != CUBLAS_STATUS_SUCCESS)
		return di_fail(ctx, DI_ERR_CUBLAS, "cublasLtMatmul (fp8 block scales, m=%d n=%d k=%d): status %d", p.m, p.n,
		               p.k, (int)s);
	if (!bias) return DI_OK;
	di_launch(ctx, di_fp8_add_bias_k, di_grid((size_t)p.m * p.n, 256), 256, 0, out, bias, p.m, p.n);
	return di_check_launch(ctx, "fp8 linear bias");
}

// ---------------------------------------------------------------- entry points

static int fp8_weight(di_ctx *ctx, const di_fp8_weight *src, di_fp8w *w) {
	if (!src || !src->data || !src->scales || !src->scale_row || src->scale_cols <= 0)
		return di_fail(ctx, DI_ERR_INVALID, "fp8 weight: missing data, scales or scale rows");
	const int bk = src->block_k;
	if (bk < 16 || (bk & (bk - 1)) != 0)
		return di_fail(ctx, DI_ERR_INVALID, "fp8 weight: block_k %d, want a power of two >= 16", bk);
	if (src->lt_scales && (bk != 128 || src->lt_ld < src->scale_cols || src->lt_ld % 4 != 0))
		return di_fail(ctx, DI_ERR_INVALID, "fp8 weight: cuBLASLt scales with block_k %d and lt_ld %d (%d scale columns)",
		               bk, src->lt_ld, src->scale_cols);
	w->data = DI_PTR(const uint8_t, src->data);
	w->scales = DI_PTR(const float, src->scales);
	w->scale_row = DI_PTR(const int, src->scale_row);
	w->scale_cols = src->scale_cols;
	w->bk_shift = __builtin_ctz((unsigned)bk);
	w->lt_scales = DI_PTR(const float, src->lt_scales);
	w->lt_ld = src->lt_ld;
	return DI_OK;
}

extern "C" int di_op_fp8_linear(di_ctx *ctx, di_dptr out, di_dptr x, const di_fp8_weight *wt, di_dptr bias, int m,
                                int n, int k, int path) {
	di_fp8w w;
	int rc = fp8_weight(ctx, wt, &w);
	if (rc != DI_OK || m == 0 || n == 0) return rc;
	if (k % 16 != 0 || (x % 16) != 0 || (wt->data % 16) != 0)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8 linear: k %d must be a multiple of 16 with 16-byte aligned x and w", k);
	if (path == DI_FP8_LT && (!w.lt_scales || !ctx->lt))
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8 linear: cuBLASLt needs the weight's 128x128 block scales (lt_scales)");
	const bool gemm_ok = di_fp8_gemm_ok(w, k);
	bool lt = path == DI_FP8_LT || (path == DI_FP8_AUTO && m > DI_FP8_GEMV_ROWS && w.lt_scales && ctx->fp8_lt_on);
	bool gemm = path == DI_FP8_GEMM || (path == DI_FP8_AUTO && m > DI_FP8_GEMV_ROWS && gemm_ok);
	if (gemm && !gemm_ok && !lt)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8 linear: the GEMM needs block_k >= %d (have %d)", DI_FP8_GROUP,
		               1 << w.bk_shift);
	if (!gemm && !lt)
		return di_fp8_gemv(ctx, DI_PTR(float, out), DI_PTR(const float, x), nullptr, 1, w, DI_PTR(const float, bias),
		                   nullptr, m, n, k, 1, true);
	// cuBLASLt refuses some row counts (on an H200 with CUDA 13.0, 9 rows);
	// those run padded to the next multiple of 4, else of 16 rows (zeros,
	// their outputs dropped) into scratch, whose first m rows are copied out.
	const int m_pad = lt ? ((m + 15) & ~15) : m;
	const size_t groups = (k + DI_FP8_GROUP - 1) / DI_FP8_GROUP;
	const size_t qbytes = ((size_t)m_pad * k + 255) & ~(size_t)255;
	const size_t sbytes = ((size_t)m_pad * groups * sizeof(float) + 255) & ~(size_t)255;
	const size_t dbytes = lt && m_pad > m ? (size_t)m_pad * n * sizeof(float) : 0;
	void *scratch = nullptr;
	rc = di_scratch(ctx, qbytes + sbytes + dbytes, &scratch);
	if (rc != DI_OK) return rc;
	uint8_t *q = (uint8_t *)scratch;
	float *qs = (float *)(q + qbytes);
	float *padded_out = dbytes ? (float *)(q + qbytes + sbytes) : nullptr;
	di_fp8_lt_plan *plan = nullptr;
	int rows = m;
	if (lt) {
		for (int mp : {m, (m + 3) & ~3, m_pad}) {
			if (plan && mp == rows) continue;
			float *d = mp == m ? DI_PTR(float, out) : padded_out;
			plan = lt_plan(ctx, mp, n, k, lt_align({q, qs, w.data, d}), w.lt_scales, qs);
			rows = mp;
			if (plan && plan->ok) break;
			if (!plan) break;
		}
		if (!plan || !plan->ok) {
			plan = nullptr;
			if (path == DI_FP8_LT || !gemm_ok) {
				di_scratch_free(ctx, scratch);
				return di_fail(ctx, DI_ERR_UNSUPPORTED,
				               "fp8 linear: cuBLASLt has no block-scaled FP8 algorithm for m=%d (or padded to %d) n=%d k=%d", m,
				               m_pad, n, k);
			}
		}
	}
	if (!plan) {
		rc = di_fp8_quant(ctx, q, qs, DI_PTR(const float, x), nullptr, 1, m, k);
		if (rc == DI_OK) rc = di_fp8_gemm(ctx, DI_PTR(float, out), q, qs, w, DI_PTR(const float, bias), nullptr, m, n, k, 1);
		di_scratch_free(ctx, scratch);
		return rc;
	}
	rc = di_fp8_quant(ctx, q, qs, DI_PTR(const float, x), nullptr, 1, m, k, true, rows);
	if (rc == DI_OK && rows == m) rc = fp8_gemm_lt(ctx, *plan, DI_PTR(float, out), q, qs, w, DI_PTR(const float, bias));
	if (rc == DI_OK && rows > m) {
		rc = fp8_gemm_lt(ctx, *plan, padded_out, q, qs, w, nullptr);
		cudaError_t e = rc == DI_OK ? cudaMemcpyAsync(DI_PTR(void, out), padded_out, (size_t)m * n * sizeof(float),
		                                              cudaMemcpyDeviceToDevice, ctx->stream)
		                            : cudaSuccess;
		if (e != cudaSuccess) rc = di_cuda_fail(ctx, e, "fp8 linear: copy of the padded rows");
		if (rc == DI_OK && bias) {
			di_launch(ctx, di_fp8_add_bias_k, di_grid((size_t)m * n, 256), 256, 0, DI_PTR(float, out),
			          DI_PTR(const float, bias), m, n);
			rc = di_check_launch(ctx, "fp8 linear bias");
		}
	}
	di_scratch_free(ctx, scratch);
	return rc;
}

// di_fp8_fill_k fills n bytes with hashed E4M3 values (no NaN).
__global__ void di_fp8_fill_k(uint8_t *p, size_t n, uint32_t seed) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		uint32_t h = (uint32_t)i * 0x9e3779b1u ^ seed;
		h ^= h >> 15, h *= 0x85ebca6bu, h ^= h >> 13;
		uint8_t b = (uint8_t)h;
		if ((b & 0x7f) == 0x7f) b ^= 1;
		p[i] = b;
	}
}

extern "C" int di_op_fp8_lt_peak(di_ctx *ctx, int m, int n, int k, int iters, float *ms) {
	*ms = 0;
	if (!ctx->lt) return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8_lt_peak: no cuBLASLt handle");
	if (m <= 0 || n <= 0 || k <= 0 || k % 16 != 0 || iters <= 0)
		return di_fail(ctx, DI_ERR_INVALID, "fp8_lt_peak: m %d n %d k %d iters %d", m, n, k, iters);
	uint8_t *a = nullptr, *b = nullptr;
	void *d = nullptr;
	cudaEvent_t e0 = nullptr, e1 = nullptr;
	cublasLtMatmulDesc_t op = nullptr;
	cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
	cublasLtMatmulPreference_t pref = nullptr;
	cublasLtMatmulHeuristicResult_t h = {};
	int found = 0, rc = DI_OK;
	const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	const size_t wsb = ctx->cublas_workspace_bytes;
	const float alpha = 1.f, beta = 0.f;
	cudaError_t e = cudaMalloc((void **)&a, (size_t)n * k);
	if (e == cudaSuccess) e = cudaMalloc((void **)&b, (size_t)m * k);
	if (e == cudaSuccess) e = cudaMalloc(&d, (size_t)m * n * 2);
	if (e == cudaSuccess) e = cudaEventCreate(&e0);
	if (e == cudaSuccess) e = cudaEventCreate(&e1);
	if (e != cudaSuccess) {
		rc = di_cuda_fail(ctx, e, "fp8_lt_peak: buffers");
		goto done;
	}
	di_fp8_fill_k<<<1024, 256, 0, ctx->stream>>>(a, (size_t)n * k, 1u);
	di_fp8_fill_k<<<1024, 256, 0, ctx->stream>>>(b, (size_t)m * k, 2u);
	if (!(LT_OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
	      LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
	      LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) &&
	      LT_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k)) &&
	      LT_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k)) &&
	      LT_OK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, m, n)) && LT_OK(cublasLtMatmulPreferenceCreate(&pref)) &&
	      LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb)) &&
	      LT_OK(cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, ld, ld, pref, 1, &h, &found)) && found > 0)) {
		rc = di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8_lt_peak: cuBLASLt has no FP8 algorithm for m=%d n=%d k=%d", m, n, k);
		goto done;
	}
	for (int i = 0; i <= iters; i++) {
		if (i == 1) cudaEventRecord(e0, ctx->stream);
		const cublasStatus_t s = cublasLtMatmul(ctx->lt, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &h.algo,
		                                        ctx->cublas_workspace, wsb, ctx->stream);
		if (s != CUBLAS_STATUS_SUCCESS) {
			rc = di_fail(ctx, DI_ERR_CUBLAS, "fp8_lt_peak: cublasLtMatmul status %d", (int)s);
			goto done;
		}
	}
	cudaEventRecord(e1, ctx->stream);
	if ((e = cudaEventSynchronize(e1)) != cudaSuccess) {
		rc = di_cuda_fail(ctx, e, "fp8_lt_peak: cudaEventSynchronize");
		goto done;
	}
	cudaEventElapsedTime(ms, e0, e1);
	*ms /= iters;
done:
	cudaStreamSynchronize(ctx->stream);
	if (pref) cublasLtMatmulPreferenceDestroy(pref);
	if (la) cublasLtMatrixLayoutDestroy(la);
	if (lb) cublasLtMatrixLayoutDestroy(lb);
	if (ld) cublasLtMatrixLayoutDestroy(ld);
	if (op) cublasLtMatmulDescDestroy(op);
	if (e0) cudaEventDestroy(e0);
	if (e1) cudaEventDestroy(e1);
	cudaFree(a);
	cudaFree(b);
	cudaFree(d);
	return rc;
}

template <typename T>
__global__ void di_fp8_dequant_k(T *out, di_fp8w w, int rows, int k) {
	di_pdl_wait();
	const size_t total = (size_t)rows * k;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
		const size_t r = i / k, c = i % k;
		__nv_fp8_e4m3 v;
		v.__x = w.data[i];
		const float f =
		    __fmul_rn(static_cast<float>(v), w.scales[(size_t)w.scale_row[r] * w.scale_cols + (c >> w.bk_shift)]);
		if constexpr (std::is_same<T, float>::value)
			out[i] = f;
		else
			out[i] = __float2bfloat16_rn(f);
	}
}

extern "C" int di_op_fp8_dequant(di_ctx *ctx, di_dptr out, int out_dtype, const di_fp8_weight *wt, int rows, int k) {
	di_fp8w w;
	int rc = fp8_weight(ctx, wt, &w);
	if (rc != DI_OK || rows == 0 || k == 0) return rc;
	const unsigned grid = di_grid((size_t)rows * k, 256);
	if (out_dtype == DI_F32)
		di_launch(ctx, di_fp8_dequant_k<float>, grid, 256, 0, DI_PTR(float, out), w, rows, k);
	else if (out_dtype == DI_BF16)
		di_launch(ctx, di_fp8_dequant_k<__nv_bfloat16>, grid, 256, 0, DI_PTR(__nv_bfloat16, out), w, rows, k);
	else
		return di_fail(ctx, DI_ERR_INVALID, "fp8 dequantize: output dtype %d, want F32 or BF16", out_dtype);
	return di_check_launch(ctx, "fp8 dequantize");
}
