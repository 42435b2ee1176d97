// fp8_moe.cu: the expert MLP over FP8 block-scaled expert weights (the MoE
// of kernels.Ops with weights built by kernels.FP8Weighter).
//
// Three paths:
//   - device, tensor cores (up to FP8_MOE_DEVICE_PAIRS (token, k) pairs,
//     every decode batch, and always while a graph is captured, where
//     block_k >= 128 and hidden and intermediate are multiples of 128, as in
//     every published FP8 checkpoint): the pairs are grouped by expert on
//     the device (di_moe_group_block: one block, a stable counting sort, run
//     by the last block of f8m_prep_k, whose other blocks are f8m_split_k's:
//     they carry x to the tensor cores, F16 hi and lo parts, below),
//     f8m_mma_k runs the gate/up projection, f8m_split_k<act> applies the
//     SiLU-mul in float32 (di_moe_act_f32's formula) and splits its result
//     the same way, f8m_mma_k runs the down projection, and di_moe_combine
//     sums each token's k outputs in k order. No host wait; all five kernels
//     start with programmatic dependent launch (di_launch).
//   - device, GEMV (the same batches where block_k < 128 or a size is not a
//     multiple of 128): the same grouping, the projections as grouped FP8
//     GEMVs over float32 activations (di_fp8_gemv with the expert offsets:
//     each expert's weights read once per 8 of its rows), SiLU-mul in
//     float32 between them, the same combine.
//   - host (larger batches, prefill; block_k >= 128): the routing ids are
//     copied to the host and grouped there (one small copy and a wait), the
//     gathered rows are quantized per 128 columns (di_fp8_quant) and both
//     projections run as one grouped tensor-core GEMM launch each
//     (di_fp8_gemm over the experts' offsets).
//
// f8m_mma_k, block (x, y): the y-th expert that has rows (in expert order;
// the grid has min(experts, pairs) rows of blocks, so that a decode step
// launches blocks for its few experts only, as moe.cu's MXFP4 kernels do)
// and its weight rows 32x .. 32x + 31: two A operands of mma.sync m16n8k16
// (F16), widened from E4M3 in registers (one cvt for two weights; exact,
// E4M3 being a subset of F16), against the expert's grouped rows in tiles of
// 8 (the B operand, shared by the two A tiles; T tiles a pass over the
// weights, T = 1, 2 or 4 by the rows an expert is likely to have). Its four
// warps deal the 128-column units of k among them (warp w: units w, w + 4,
// ...; a unit is one weight block column and one activation scale) and take
// a unit in two 64-column steps. A warp streams its steps' weight bytes through a copy
// ring of its own in shared memory (F8M_STAGES steps of 2 KB in flight; a
// lane copies with cp.async the 16 bytes of its rows g, g + 8, g + 16 and
// g + 24 at columns 16 t4 that it alone reads back, g = lane / 4, t4 =
// lane % 4, so no barrier is needed), and per tile reads the hi and lo
// parts of its tile row at the same columns; the four mmas of a step take
// the lane's 4-byte words in order (the same permutation of the reduction
// index for A and B, as di_moe_mma_k does). A unit's products, hi and lo,
// are summed on the tensor cores in float32 from zero, then
// acc = fma(sum * 2^e, block scale, acc) in unit order: the 128x128 block
// scales applied per K block in float32. At the end of a pass each warp
// leaves its sums in its ring and each output is the four warps' sums added
// in warp order.
//
// Activations on the tensor cores: F16 has 11 significant bits and a
// range to 65504, and the activations (massive ones included) may exceed
// it. f8m_split_k scales each row's 128-column unit by a power of two 2^-e
// so that its largest magnitude lies in [2^14, 2^15) (e clamped to
// [-100, 113]) and writes hi = f16(v') and lo = f16(v' - hi) (v' = v 2^-e)
// and 2^e. hi + lo differs from v' by at most 2^-22 |v'| + 2^-25, that is
// by 2^-22 of the value or 2^-39 of the unit's largest one: float32's
// precision where it matters, so no output moves by more than float32
// summation order from the CPU backend's (float32 x times the dequantized
// weight), as with the GEMV path (TestGPUFP8MoE states the bound). The lo
// part costs a second mma a step and twice the activation loads, no weight
// bytes. BF16 instead of F16 would need integer work to widen each weight
// and still two parts for float32's accuracy; rounding the activations
// once (one part) would move outputs by about 2^-12 relative, beyond the
// tests' bound.
//
// Why tensor cores at every size, 1 token included: batch invariance asks
// that an output element be the same fixed-order sum whatever the number of
// rows its expert has, so one kernel serves 1 to 1024 pairs. A CUDA-core
// GEMV over float32 activations spends an FMA and a 4-byte load of x per
// weight and row: at 64 tokens (6 rows an expert on DeepSeek-V2-Lite) 3.3
// G FMAs, about 100 us at the H200's FP32 peak, as long as streaming the
// 553 MB of weights takes (132 us); the tensor cores take 8 rows an mma, so
// the kernel stays bound by the weights' bytes (52 MB, 12 us at 4.2 TB/s, at
// one token; the 8x wasted tensor-core work there costs issue slots only).
//
// Numerics and batch invariance: on every path each output element is a
// fixed-order sum over its own token's values (the split of a row depends on
// that row alone; T and a block's slot change no sum), so a token alone gives
// the bits it has in any batch. The device paths differ from each other by
// rounding (which one runs depends on the weights' shape and block size
// only), and from the host path by its activations' E4M3 rounding.
#include <vector>

#include "fp8.cuh"
#include "moe.cuh"

#define FP8_MOE_DEVICE_PAIRS 1024
#define F8M_WARPS 4
#define F8M_UNIT 128 // columns of k: a warp's share at a time, one activation scale
#define F8M_ROWS 32   // weight rows a block of f8m_mma_k
#define F8M_STAGES 4  // 64-column steps (2 KB) a warp of f8m_mma_k has in flight

// ---------------------------------------------------------------- activation split

// f8m_exponent is e with max_abs * 2^-e in [2^14, 2^15) for a normal
// max_abs, clamped to [-100, 113] (so that 2^e and 2^-e are normal floats;
// zero and subnormal maxima take -100, infinity 113).
__device__ __forceinline__ int f8m_exponent(float max_abs) {
	const int e = ((__float_as_int(max_abs) >> 23) & 0xff) - 127 - 14;
	return min(max(e, -100), 113);
}

__device__ __forceinline__ float f8m_pow2(int e) { return __int_as_float((127 + e) << 23); }

// f8m_split_k writes, for rows rows of k columns (k a multiple of 128), one
// warp a (row, 128-column unit): v' = v 2^-e with e = f8m_exponent(the
// unit's largest |v|), hi = f16(v'), lo = f16(v' - hi) (0 where v' is
// infinite, so that an infinite v stays infinite) into hi and lo [rows, k]
// and 2^e into f [rows, k / 128]. v is src[r, c] (src [rows, k]), or with
// ACT the SiLU-mul of the gate/up outputs src [rows, 2k]: (float)(gate /
// (1 + exp(-gate)) in float64) * up, di_moe_act_f32's value.
//
// f8m_split_item is one warp's item (row item / (k / 128), unit item % (k /
// 128)); f8m_split_k runs 8 items a block.
template <bool ACT>
__device__ __forceinline__ void f8m_split_item(__half *hi, __half *lo, float *f, const float *src, int rows, int k,
                                               size_t item) {
	const int nu = k / F8M_UNIT, lane = threadIdx.x & 31;
	if (item >= (size_t)rows * nu) return;
	const int r = (int)(item / nu), u = (int)(item % nu), c = u * F8M_UNIT + 4 * lane;
	float v[4];
	if (ACT) {
		const float *row = src + (size_t)r * 2 * k;
		const float4 g = *reinterpret_cast<const float4 *>(row + c), up = *reinterpret_cast<const float4 *>(row + k + c);
		const float gs[4] = {g.x, g.y, g.z, g.w}, us[4] = {up.x, up.y, up.z, up.w};
#pragma unroll
		for (int i = 0; i < 4; i++) v[i] = (float)((double)gs[i] / (1.0 + exp(-(double)gs[i]))) * us[i];
	} else {
		const float4 x = *reinterpret_cast<const float4 *>(src + (size_t)r * k + c);
		v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
	}
	float m = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
	const int e = f8m_exponent(m);
	const float down = f8m_pow2(-e);
	__half h[4], l[4];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const float s = __fmul_rn(v[i], down);
		h[i] = __float2half_rn(s);
		const float d = isinf(s) ? 0.f : __fsub_rn(s, __half2float(h[i]));
		l[i] = __float2half_rn(d);
	}
	const size_t o = (size_t)r * k + c;
	*reinterpret_cast<uint2 *>(hi + o) =
	    make_uint2((unsigned)__half_as_ushort(h[0]) | ((unsigned)__half_as_ushort(h[1]) << 16),
	               (unsigned)__half_as_ushort(h[2]) | ((unsigned)__half_as_ushort(h[3]) << 16));
	*reinterpret_cast<uint2 *>(lo + o) =
	    make_uint2((unsigned)__half_as_ushort(l[0]) | ((unsigned)__half_as_ushort(l[1]) << 16),
	               (unsigned)__half_as_ushort(l[2]) | ((unsigned)__half_as_ushort(l[3]) << 16));
	if (lane == 0) f[(size_t)r * nu + u] = f8m_pow2(e);
}

template <bool ACT>
__global__ void __launch_bounds__(256) f8m_split_k(__half *hi, __half *lo, float *f, const float *src, int rows, int k) {
	di_pdl_wait();
	f8m_split_item<ACT>(hi, lo, f, src, rows, k, (size_t)blockIdx.x * 8 + (threadIdx.x >> 5));
}

// f8m_prep_k is the decode path's first kernel: blocks 0 .. split_blocks - 1
// are f8m_split_k<false> over x, block split_blocks groups the pairs
// (di_moe_group_block, di_moe_group_smem bytes of dynamic shared memory):
// one launch where di_moe_group and f8m_split took two.
__global__ void __launch_bounds__(256)
    f8m_prep_k(__half *hi, __half *lo, float *f, const float *x, int rows, int k, unsigned split_blocks, int *offsets,
               int *order, int *row_of, const int *ids, int pairs, int num_experts, unsigned *check) {
	extern __shared__ int f8m_group_sh[];
	di_pdl_wait();
	if (blockIdx.x == split_blocks) {
		di_moe_group_block(f8m_group_sh, offsets, order, row_of, ids, pairs, num_experts, check);
		return;
	}
	f8m_split_item<false>(hi, lo, f, x, rows, k, (size_t)blockIdx.x * 8 + (threadIdx.x >> 5));
}

template <bool ACT>
static int f8m_split(di_ctx *ctx, __half *hi, __half *lo, float *f, const float *src, int rows, int k) {
	const size_t items = (size_t)rows * (k / F8M_UNIT);
	if (items == 0) return DI_OK;
	di_launch(ctx, f8m_split_k<ACT>, dim3((unsigned)((items + 7) / 8)), dim3(256), 0, hi, lo, f, src, rows, k);
	return di_check_launch(ctx, ACT ? "fp8 moe: silu_mul" : "fp8 moe: split x");
}

// ---------------------------------------------------------------- tensor-core projection

// f8m_proj is one projection of f8m_mma_k: weight w ([experts * n, k]),
// the grouping's offsets, the activations' hi and lo parts (rows of k
// halves) and scales f (rows of k / 128), grouped row r reading activation
// row order[r] / div (order set) or r, out [grouped rows, n] float32.
struct f8m_proj {
	di_fp8w w;
	int n, k;
	const int *offsets;
	int num_experts;
	const __half *xh, *xl;
	const float *xf;
	const int *order;
	int div;
	float *out;
};

// f8m_expert is the slot-th expert (in expert order) with rows, or -1 when
// fewer have rows; each warp finds it on its own (one round of loads per
// 128 experts).
__device__ __forceinline__ int f8m_expert(const int *offsets, int num_experts, int slot) {
	const int lane = threadIdx.x & 31;
	int seen = 0;
	for (int e0 = 0; e0 < num_experts; e0 += 128) {
		bool has[4];
#pragma unroll
		for (int q = 0; q < 4; q++) {
			const int e = e0 + 32 * q + lane;
			has[q] = e < num_experts && offsets[e + 1] > offsets[e];
		}
#pragma unroll
		for (int q = 0; q < 4; q++) {
			const unsigned b = __ballot_sync(0xffffffffu, has[q]);
			const int c = __popc(b);
			if (slot < seen + c) {
				const unsigned hit = __ballot_sync(0xffffffffu, has[q] && __popc(b & ((1u << lane) - 1u)) == slot - seen);
				return e0 + 32 * q + __ffs(hit) - 1;
			}
			seen += c;
		}
	}
	return -1;
}

// f8m_mma_k: see the file's comment. T tiles of 8 rows a pass. Shared
// memory: the warps' copy rings (F8M_STAGES steps of 2 KB each), which also
// take the warps' sums at the end of a pass.
template <int T>
__global__ void __launch_bounds__(F8M_WARPS * 32, T == 1 ? 4 : 3) f8m_mma_k(f8m_proj p) {
	// ring[warp][stage][q][lane]: lane's 16 bytes of weight row g + 8 q (rows
	// consecutive in a lane's order, so a warp's 16-byte reads and copies are
	// conflict-free).
	__shared__ __align__(16) uint4 ring[F8M_WARPS][F8M_STAGES][4][32];
	di_pdl_wait();
	const int ex = f8m_expert(p.offsets, p.num_experts, blockIdx.y);
	if (ex < 0) return;
	const int lo = p.offsets[ex], rows = p.offsets[ex + 1] - lo;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
	const int k = p.k, nu = k / F8M_UNIT, j0 = F8M_ROWS * blockIdx.x;
	const size_t row0 = (size_t)ex * p.n + j0 + g; // this lane's weight rows: row0 + 8 q, q = 0..3
	const uint8_t *wr = p.w.data + row0 * k + 16 * t4;
	int sr[4]; // the rows' scales: p.w.scales + sr[q]
#pragma unroll
	for (int q = 0; q < 4; q++) sr[q] = p.w.scale_row[row0 + 8 * q] * p.w.scale_cols;
	const int steps = warp < nu ? 2 * ((nu - 1 - warp) / F8M_WARPS + 1) : 0; // 64-column steps: two a unit
	uint4(*slots)[4][32] = ring[warp];
	// issue queues step t's copies (unit warp + 4 (t / 2), half t % 2) into slot t % F8M_STAGES.
	auto issue = [&](int t) {
		if (t < steps) {
			const size_t c = (size_t)(warp + F8M_WARPS * (t >> 1)) * F8M_UNIT + 64 * (t & 1);
#pragma unroll
			for (int q = 0; q < 4; q++) di_cp_async16(&slots[t % F8M_STAGES][q][lane], wr + 8 * q * (size_t)k + c, true);
		}
		di_cp_async_commit();
	};
	for (int r0 = 0; r0 < rows; r0 += 8 * T) {
		const int m = min(8 * T, rows - r0), tiles = (m + 7) >> 3;
		if (r0 > 0) __syncthreads(); // the previous pass's sums in the rings have been read
#pragma unroll
		for (int t = 0; t < F8M_STAGES; t++) issue(t);
		auto src = [&](int r) {
			const int row = lo + r0 + (r < m ? r : 0);
			return p.order ? p.order[row] / p.div : row;
		};
		// Per tile: this lane's B column (tile row g) and the activation scale
		// rows of its accumulators' columns (tile rows 2 t4 and 2 t4 + 1).
		int xo[T], fo0[T], fo1[T];
#pragma unroll
		for (int tl = 0; tl < T; tl++) {
			xo[tl] = src(8 * tl + g) * k + 16 * t4;
			fo0[tl] = src(8 * tl + 2 * t4) * nu;
			fo1[tl] = src(8 * tl + 2 * t4 + 1) * nu;
		}
		// acc[h][tl]: A tile h (weight rows 16 h + g, + 8) by tile tl; part: the unit's sum.
		float acc[2][T][4], part[2][T][4], ws[4], xs0[T], xs1[T];
#pragma unroll
		for (int h = 0; h < 2; h++)
#pragma unroll
			for (int tl = 0; tl < T; tl++)
#pragma unroll
				for (int e = 0; e < 4; e++) acc[h][tl][e] = 0.f;
		for (int t = 0; t < steps; t++) {
			di_cp_async_wait<F8M_STAGES - 1>(); // step t's copies (this lane's) have landed
			const int u = warp + F8M_WARPS * (t >> 1), c = u * F8M_UNIT + 64 * (t & 1);
			if ((t & 1) == 0) {
				// A new unit: its block scales and activation scales, used at its end.
				const int sc = (u * F8M_UNIT) >> p.w.bk_shift;
#pragma unroll
				for (int q = 0; q < 4; q++) ws[q] = p.w.scales[sr[q] + sc];
#pragma unroll
				for (int tl = 0; tl < T; tl++) {
					xs0[tl] = tl < tiles ? p.xf[fo0[tl] + u] : 0.f;
					xs1[tl] = tl < tiles ? p.xf[fo1[tl] + u] : 0.f;
#pragma unroll
					for (int h = 0; h < 2; h++)
#pragma unroll
						for (int e = 0; e < 4; e++) part[h][tl][e] = 0.f;
				}
			}
			unsigned a[2][4][4]; // A tile h, mma qq: rows g and g + 8, words qq, low then high halves
			{
				uint4 wq[4];
#pragma unroll
				for (int q = 0; q < 4; q++) wq[q] = slots[t % F8M_STAGES][q][lane];
#pragma unroll
				for (int h = 0; h < 2; h++) {
					const uint4 A = wq[2 * h], B = wq[2 * h + 1];
					const unsigned aw[4] = {A.x, A.y, A.z, A.w}, bw[4] = {B.x, B.y, B.z, B.w};
#pragma unroll
					for (int qq = 0; qq < 4; qq++) {
						di_e4m3x4_to_h2x2(aw[qq], a[h][qq][0], a[h][qq][2]);
						di_e4m3x4_to_h2x2(bw[qq], a[h][qq][1], a[h][qq][3]);
					}
				}
			}
			issue(t + F8M_STAGES); // into the slot just read (its words are in a)
#pragma unroll
			for (int tl = 0; tl < T; tl++) {
				if (tl < tiles) {
					const __half *xh = p.xh + xo[tl] + c, *xl = p.xl + xo[tl] + c;
					const uint4 h0 = __ldg(reinterpret_cast<const uint4 *>(xh));
					const uint4 h1 = __ldg(reinterpret_cast<const uint4 *>(xh + 8));
					const uint4 l0 = __ldg(reinterpret_cast<const uint4 *>(xl));
					const uint4 l1 = __ldg(reinterpret_cast<const uint4 *>(xl + 8));
					const unsigned hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
					const unsigned lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
#pragma unroll
					for (int h = 0; h < 2; h++)
#pragma unroll
						for (int qq = 0; qq < 4; qq++) {
							const unsigned *f = a[h][qq];
							di_mma16816<__half>(part[h][tl], f[0], f[1], f[2], f[3], hw[2 * qq], hw[2 * qq + 1]);
							di_mma16816<__half>(part[h][tl], f[0], f[1], f[2], f[3], lw[2 * qq], lw[2 * qq + 1]);
						}
				}
			}
			if (t & 1) {
				// The unit's end: acc += part 2^e (the column's row's activation scale) * block scale (the weight row's).
#pragma unroll
				for (int tl = 0; tl < T; tl++) {
					if (tl < tiles) {
#pragma unroll
						for (int h = 0; h < 2; h++)
#pragma unroll
							for (int e = 0; e < 4; e++)
								acc[h][tl][e] = __fmaf_rn(__fmul_rn(part[h][tl][e], e & 1 ? xs1[tl] : xs0[tl]),
								                          ws[2 * h + (e >> 1)], acc[h][tl][e]);
					}
				}
			}
		}
		di_cp_async_wait<0>();
		__syncwarp(); // every lane's copies have landed: the sums may go over any of them
		// The sums into the warp's own ring, then each output is the four
		// warps' sums added in warp order.
		float *mine = reinterpret_cast<float *>(ring[warp]);
#pragma unroll
		for (int h = 0; h < 2; h++)
#pragma unroll
			for (int tl = 0; tl < T; tl++)
#pragma unroll
				for (int e = 0; e < 4; e++) mine[((h * T + tl) * 4 + e) * 32 + lane] = acc[h][tl][e];
		__syncthreads();
		for (int i = threadIdx.x; i < 32 * 8 * T; i += F8M_WARPS * 32) {
			// Accumulator e of (A tile h, tile tl) in lane ln: weight row 16 h + ln / 4 + 8 (e / 2), tile row 2 (ln % 4) + e % 2.
			const int ln = i & 31, idx = i >> 5, e = idx & 3, tl = (idx >> 2) % T, h = (idx >> 2) / T;
			const int r = 8 * tl + 2 * (ln & 3) + (e & 1), j = j0 + 16 * h + (ln >> 2) + 8 * (e >> 1);
			if (r < m) {
				const float *w0 = reinterpret_cast<const float *>(ring[0]) + idx * 32 + ln;
				float v = w0[0];
#pragma unroll
				for (int wi = 1; wi < F8M_WARPS; wi++) v = __fadd_rn(v, w0[wi * F8M_STAGES * 4 * 32 * 4]);
				p.out[(size_t)(lo + r0 + r) * p.n + j] = v;
			}
		}
	}
}

template <int T> static int f8m_launch(di_ctx *ctx, const f8m_proj &p, int slots) {
	di_launch(ctx, f8m_mma_k<T>, dim3((unsigned)(p.n / F8M_ROWS), (unsigned)slots), dim3(F8M_WARPS * 32), 0, p);
	return di_check_launch(ctx, "fp8 moe: projection");
}

// f8m_project runs projection p over slots expert slots, in passes of 8, 16
// or 32 rows: as many as an expert is likely to have, the fewer the better
// (T = 4 holds twice T = 2's accumulators: three blocks a multiprocessor
// instead of four). An expert has at most num_tokens rows (top-k ids being
// distinct) and about pairs / num_experts on average; 3 standard deviations
// of a Poisson count are allowed over it. The bits do not depend on the
// choice.
static int f8m_project(di_ctx *ctx, const f8m_proj &p, int slots, int num_tokens, size_t pairs) {
	const double avg = (double)pairs / p.num_experts, likely = avg + 3 * sqrt(avg);
	const double rows = likely < num_tokens ? likely : num_tokens;
	if (rows <= 8) return f8m_launch<1>(ctx, p, slots);
	if (rows <= 16) return f8m_launch<2>(ctx, p, slots);
	return f8m_launch<4>(ctx, p, slots);
}

// f8m_ok reports whether the tensor-core device path serves the weight w
// over k columns.
static bool f8m_ok(const di_fp8w &w, int k) { return (1 << w.bk_shift) >= F8M_UNIT && k % F8M_UNIT == 0; }

// fp8_moe_tc runs the tensor-core device path: the grouping and split x
// (one f8m_prep_k where one block groups the pairs, else di_moe_group and
// f8m_split), gate/up, SiLU-mul and split, down, combine: five launches, all
// with programmatic dependent launch. Scratch: 4 bytes a value of x and of
// the activations (hi and lo), 8 of the gate/up outputs, 4 of the down
// outputs, and the scales.
static int fp8_moe_tc(di_ctx *ctx, float *out, const float *x, const float *weights, const di_fp8w &gu,
                      const di_fp8w &dn, const int *ids, int *offsets, int *order, int *row_of, int num_tokens,
                      int top_k, int hidden, int inter, int num_experts) {
	const size_t pairs = (size_t)num_tokens * top_k, nx = (size_t)num_tokens * hidden, na = pairs * inter;
	auto align = [](size_t b) { return (b + 255) & ~(size_t)255; };
	const size_t b_xh = align(nx * sizeof(__half)), b_xf = align(nx / F8M_UNIT * sizeof(float));
	const size_t b_g = align(pairs * 2 * inter * sizeof(float)), b_ah = align(na * sizeof(__half));
	const size_t b_af = align(na / F8M_UNIT * sizeof(float)), b_ye = align(pairs * hidden * sizeof(float));
	void *buf = nullptr;
	int rc = di_scratch(ctx, 2 * b_xh + b_xf + b_g + 2 * b_ah + b_af + b_ye, &buf);
	if (rc != DI_OK) return rc;
	char *c = (char *)buf;
	__half *xh = (__half *)c, *xl = (__half *)(c + b_xh);
	float *xf = (float *)(c + 2 * b_xh);
	float *g = (float *)(c + 2 * b_xh + b_xf);
	c += 2 * b_xh + b_xf + b_g;
	__half *ah = (__half *)c, *al = (__half *)(c + b_ah);
	float *af = (float *)(c + 2 * b_ah), *ye = (float *)(c + 2 * b_ah + b_af);
	const int slots = (size_t)num_experts < pairs ? num_experts : (int)pairs;
	if (di_moe_group_one(pairs, num_experts)) {
		const unsigned split_blocks = (unsigned)((nx / F8M_UNIT + 7) / 8);
		const size_t shared = di_moe_group_smem(pairs, num_experts);
		di_launch(ctx, f8m_prep_k, dim3(split_blocks + 1), dim3(256), shared, xh, xl, xf, x, num_tokens, hidden,
		          split_blocks, offsets, order, row_of, ids, (int)pairs, num_experts, ctx->check);
		rc = di_check_launch(ctx, "fp8 moe: group");
	} else {
		rc = di_moe_group(ctx, offsets, order, row_of, ids, (int)pairs, num_experts, "fp8 moe: group");
		if (rc == DI_OK) rc = f8m_split<false>(ctx, xh, xl, xf, x, num_tokens, hidden);
	}
	if (rc == DI_OK)
		rc = f8m_project(ctx, f8m_proj{gu, 2 * inter, hidden, offsets, num_experts, xh, xl, xf, order, top_k, g}, slots,
		                 num_tokens, pairs);
	if (rc == DI_OK) rc = f8m_split<true>(ctx, ah, al, af, g, (int)pairs, inter);
	if (rc == DI_OK)
		rc = f8m_project(ctx, f8m_proj{dn, hidden, inter, offsets, num_experts, ah, al, af, nullptr, 1, ye}, slots,
		                 num_tokens, pairs);
	if (rc == DI_OK) rc = di_moe_combine(ctx, out, ye, row_of, weights, num_tokens, top_k, hidden, "fp8 moe: combine");
	di_scratch_free(ctx, buf);
	return rc;
}

// fp8_moe_run runs both projections and the combine once the grouping
// (offsets, order, row_of on the device) exists. gemm: the host path's
// tensor-core GEMMs (max_rows: the largest expert's row count), else the
// GEMVs.
static int fp8_moe_run(di_ctx *ctx, float *out, const float *x, const float *weights, const di_fp8w &gu,
                       const di_fp8w &dn, const int *offsets, const int *order, const int *row_of, int num_tokens,
                       int top_k, int hidden, int inter, int num_experts, bool gemm, int max_rows) {
	const size_t pairs = (size_t)num_tokens * top_k;
	void *g = nullptr, *act = nullptr, *ye = nullptr, *q = nullptr;
	int rc = di_scratch(ctx, pairs * 2 * inter * sizeof(float), &g);
	if (rc == DI_OK) rc = di_scratch(ctx, pairs * inter * sizeof(float), &act);
	if (rc == DI_OK) rc = di_scratch(ctx, pairs * hidden * sizeof(float), &ye);
	const int kmax = hidden > inter ? hidden : inter;
	const size_t qbytes = (pairs * kmax + 15) & ~(size_t)15;
	if (rc == DI_OK && gemm)
		rc = di_scratch(ctx, qbytes + pairs * ((kmax + DI_FP8_GROUP - 1) / DI_FP8_GROUP) * sizeof(float), &q);
	float *gh = (float *)g, *ah = (float *)act, *yh = (float *)ye;
	uint8_t *qa = (uint8_t *)q;
	float *qs = (float *)(qa + qbytes);
	if (rc == DI_OK) {
		if (gemm) {
			rc = di_fp8_quant(ctx, qa, qs, x, order, top_k, (int)pairs, hidden);
			if (rc == DI_OK) rc = di_fp8_gemm(ctx, gh, qa, qs, gu, nullptr, offsets, max_rows, 2 * inter, hidden, num_experts);
		} else {
			rc = di_fp8_gemv(ctx, gh, x, order, top_k, gu, nullptr, offsets, 0, 2 * inter, hidden, num_experts, false);
		}
	}
	if (rc == DI_OK) {
		rc = di_moe_act_f32(ctx, ah, gh, pairs, inter, "fp8 moe: silu_mul");
	}
	if (rc == DI_OK) {
		if (gemm) {
			rc = di_fp8_quant(ctx, qa, qs, ah, nullptr, 1, (int)pairs, inter);
			if (rc == DI_OK) rc = di_fp8_gemm(ctx, yh, qa, qs, dn, nullptr, offsets, max_rows, hidden, inter, num_experts);
		} else {
			rc = di_fp8_gemv(ctx, yh, ah, nullptr, 1, dn, nullptr, offsets, 0, hidden, inter, num_experts, false);
		}
	}
	if (rc == DI_OK)
		rc = di_moe_combine(ctx, out, yh, row_of, weights, num_tokens, top_k, hidden, "fp8 moe: combine");
	if (q) di_scratch_free(ctx, q);
	di_scratch_free(ctx, ye);
	di_scratch_free(ctx, act);
	di_scratch_free(ctx, g);
	return rc;
}

static int fp8_weight_of(di_ctx *ctx, const char *name, const di_fp8_weight *src, di_fp8w *w) {
	if (!src || !src->data || !src->scales || !src->scale_row || src->scale_cols <= 0 || src->block_k < 16 ||
	    (src->block_k & (src->block_k - 1)) != 0)
		return di_fail(ctx, DI_ERR_INVALID, "fp8 moe: %s: missing pointers or block_k %d not a power of two >= 16", name,
		               src ? src->block_k : 0);
	w->data = DI_PTR(const uint8_t, src->data);
	w->scales = DI_PTR(const float, src->scales);
	w->scale_row = DI_PTR(const int, src->scale_row);
	w->scale_cols = src->scale_cols;
	w->bk_shift = __builtin_ctz((unsigned)src->block_k);
	return DI_OK;
}

extern "C" int di_op_fp8_moe(di_ctx *ctx, di_dptr out, di_dptr x, di_dptr ids, di_dptr weights,
                             const di_fp8_weight *gate_up, const di_fp8_weight *down, int num_tokens, int top_k,
                             int hidden, int inter, int num_experts, int path) {
	di_fp8w gu, dn;
	int rc = fp8_weight_of(ctx, "gate_up", gate_up, &gu);
	if (rc == DI_OK) rc = fp8_weight_of(ctx, "down", down, &dn);
	if (rc != DI_OK || num_tokens == 0) return rc;
	if (hidden % 16 != 0 || inter % 16 != 0 || (x % 16) != 0 || (gate_up->data % 16) != 0 || (down->data % 16) != 0)
		return di_fail(ctx, DI_ERR_UNSUPPORTED,
		               "fp8 moe: hidden %d and intermediate %d must be multiples of 16 with 16-byte aligned x and weights",
		               hidden, inter);
	cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
	cudaStreamIsCapturing(ctx->stream, &cap);
	const bool capturing = cap != cudaStreamCaptureStatusNone;
	const size_t pairs = (size_t)num_tokens * top_k;
	const bool gemm_ok = di_fp8_gemm_ok(gu, hidden) && di_fp8_gemm_ok(dn, inter);
	const bool device_fits = (pairs + num_experts + 1) * sizeof(int) <= 48 * 1024;
	bool host = !capturing && (path == DI_FP8_GEMM || (path == DI_FP8_AUTO && pairs > FP8_MOE_DEVICE_PAIRS && gemm_ok) ||
	                           (path == DI_FP8_AUTO && !device_fits));
	if (path == DI_FP8_GEMM && (capturing || !gemm_ok))
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8 moe: the GEMM path needs block_k >= %d and no graph capture",
		               DI_FP8_GROUP);
	if (host && !gemm_ok)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8 moe: %zu pairs need the GEMM path, which needs block_k >= %d",
		               pairs, DI_FP8_GROUP);
	if (!host && !device_fits)
		return di_fail(ctx, capturing ? DI_ERR_CAPTURING : DI_ERR_UNSUPPORTED,
		               "fp8 moe: %zu pairs over %d experts do not fit the device grouping (at most %d)", pairs,
		               num_experts, (int)(48 * 1024 / sizeof(int)) - num_experts - 1);
	void *d_index = nullptr;
	// [offsets (num_experts + 1) | order (pairs) | row_of (pairs)]
	rc = di_scratch(ctx, (num_experts + 1 + 2 * pairs) * sizeof(int), &d_index);
	if (rc != DI_OK) return rc;
	int *offsets = (int *)d_index, *order = offsets + num_experts + 1, *row_of = order + pairs;
	int max_rows = 0;
	const bool tc = !host && f8m_ok(gu, hidden) && f8m_ok(dn, inter); // fp8_moe_tc groups on its own
	if (!host && !tc) {
		rc = di_moe_group(ctx, offsets, order, row_of, DI_PTR(const int, ids), (int)pairs, num_experts,
		                  "fp8 moe: group");
	} else if (host) {
		std::vector<int> host_ids(pairs);
		cudaError_t e = cudaMemcpyAsync(host_ids.data(), DI_PTR(const int, ids), pairs * sizeof(int),
		                                cudaMemcpyDeviceToHost, ctx->stream);
		if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
		if (e != cudaSuccess) rc = di_cuda_fail(ctx, e, "fp8 moe: read routing ids");
		std::vector<int> index(num_experts + 1 + 2 * pairs, 0);
		for (size_t p = 0; rc == DI_OK && p < pairs; p++) {
			const int id = host_ids[p];
			if (id < 0 || id >= num_experts)
				rc = di_fail(ctx, DI_ERR_OUT_OF_RANGE, "fp8 moe: ids[%zu][%zu] = %d, %d experts", p / top_k, p % top_k,
				             id, num_experts);
			else
				index[id + 1]++;
		}
		if (rc == DI_OK) {
			for (int i = 0; i < num_experts; i++) {
				max_rows = index[i + 1] > max_rows ? index[i + 1] : max_rows;
				index[i + 1] += index[i];
			}
			std::vector<int> next(index.begin(), index.begin() + num_experts);
			int *ord = index.data() + num_experts + 1, *rof = ord + pairs;
			for (size_t p = 0; p < pairs; p++) {
				const int r = next[host_ids[p]]++;
				ord[r] = (int)p;
				rof[p] = r;
			}
			e = cudaMemcpyAsync(d_index, index.data(), index.size() * sizeof(int), cudaMemcpyHostToDevice, ctx->stream);
			// Wait, so that index may be freed on return whatever the copy path.
			if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
			if (e != cudaSuccess) rc = di_cuda_fail(ctx, e, "fp8 moe: upload grouping");
		}
	}
	if (rc == DI_OK && tc)
		rc = fp8_moe_tc(ctx, DI_PTR(float, out), DI_PTR(const float, x), DI_PTR(const float, weights), gu, dn,
		                DI_PTR(const int, ids), offsets, order, row_of, num_tokens, top_k, hidden, inter, num_experts);
	else if (rc == DI_OK)
		rc = fp8_moe_run(ctx, DI_PTR(float, out), DI_PTR(const float, x), DI_PTR(const float, weights), gu, dn, offsets,
		                 order, row_of, num_tokens, top_k, hidden, inter, num_experts, host, max_rows);
	di_scratch_free(ctx, d_index);
	return rc;
}
