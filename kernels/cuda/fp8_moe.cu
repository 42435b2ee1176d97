// fp8_moe.cu: the expert MLP over FP8 block-scaled expert weights (the MoE
// of kernels.Ops with weights built by kernels.FP8Weighter).
//
// Three paths:
//   - device, tensor cores (block_k >= 128 and hidden and intermediate
//     multiples of 128, as in every published FP8 checkpoint; at every
//     batch size unless Options.MoEGEMMPairs is negative, and always while
//     a graph is captured): the pairs are grouped by expert on the device
//     (up to FP8_MOE_DEVICE_PAIRS pairs di_moe_group_block: one block, a
//     stable counting sort, run by the last block of f8m_prep_k, whose other
//     blocks are f8m_split_k's: they carry x to the tensor cores, F16 hi and
//     lo parts, below; above, di_moe_group's three launches, the same
//     grouping, and f8m_split_k), the gate/up projection runs,
//     f8m_split_k<act> applies the SiLU-mul in float32 (di_moe_act_f32's
//     formula) and splits its result the same way, the down projection
//     runs, and di_moe_combine sums each token's k outputs in k order. Each
//     projection is f8m_mma_k (each expert's weights streamed once per 32
//     of its rows; decode) or, from ctx->moe_gemm_pairs pairs (2048 by
//     default), f8m_gemm_k (a grouped GEMM over tiles of 128 weight rows by
//     64 rows of one expert, both operands staged in shared memory; prefill),
//     which sums every output in f8m_mma_k's order: the same bits. No host
//     wait at any size; all kernels start with programmatic dependent launch
//     (di_launch).
//   - device, GEMV (the batches up to about 12k pairs where block_k < 128
//     or a size is not a multiple of 128): the same grouping, the projections
//     as grouped FP8 GEMVs over float32 activations (di_fp8_gemv with the
//     expert offsets: each expert's weights read once per 8 of its rows),
//     SiLU-mul in float32 between them, the same combine.
//   - host (DI_FP8_GEMM forced; AUTO above FP8_MOE_DEVICE_PAIRS pairs where
//     block_k >= 128 but a size is not a multiple of 128, or with
//     Options.MoEGEMMPairs negative): the routing ids are copied to the host
//     and grouped there (one small copy and a wait), the gathered rows are
//     quantized per 128 columns (di_fp8_quant) and both projections run as
//     one grouped tensor-core GEMM launch each (di_fp8_gemm over the
//     experts' offsets).
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
// that row alone; T, a block's slot and the choice between f8m_mma_k and
// f8m_gemm_k change no sum), so a token alone gives the bits it has in any
// batch, of any size, on the tensor-core device path. The device paths
// differ from each other by rounding (which one runs depends on the
// weights' shape and block size only), and from the host path by its
// activations' E4M3 rounding (which is why the host path, before the
// grouped GEMM, gave a token other bits above 1024 pairs than below).
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

// ---------------------------------------------------------------- tensor-core GEMM (large batches)

// f8m_gemm_k is f8m_mma_k for large batches (from ctx->moe_gemm_pairs
// pairs, Options.MoEGEMMPairs): the same projection as a grouped GEMM that
// stages both operands in shared memory and reads an expert's weights once
// per F8G_BN of its rows (f8m_mma_k: once per 8 T), its activations once
// per F8G_BM weight rows (f8m_mma_k: once per 32). Block (blockIdx.x,
// blockIdx.y) computes F8G_BM weight rows (output columns) by F8G_BN
// grouped rows of one expert: the blockIdx.y-th of all experts' row tiles
// (ceil(rows / F8G_BN) an expert, in expert order), found from the
// grouping's offsets on the device, so the grid is an upper bound that does
// not depend on the routing (graph capture; blocks past the last tile
// return at once), as di_moe_gemm_k's. Eight warps, 4 over the weight rows
// by 2 over the grouped rows, each hold 32 x 32 sums; a three-stage
// cp.async ring stages 64 columns of k a stage (8 KB of weight bytes, 16 KB
// of the 64 rows' hi and lo parts, their 16-byte chunks permuted by row so
// that the fragment reads are conflict-free).
//
// Numerics: every output element is f8m_mma_k's sum, bit for bit, so a
// token's result does not depend on which kernel its batch size selects.
// f8m_mma_k deals the 128-column units of k to four warps (warp w: units
// w, w + 4, ...), each summing a unit's products from zero on the tensor
// cores (two 64-column steps, in each the four m16n8k16 mmas hi then lo,
// over the lane's 4-byte words in order), promoting it as acc =
// fma(part * 2^e, block scale, acc) in unit order, and adds the four
// accumulators in warp order. This kernel walks the 64-column steps in
// that order (the stages take units 0, 4, 8, ..., then 1, 5, ..., then 2,
// ..., then 3, ...), feeds each mma the same fragments (E4M3 weights widened
// to F16 with the same cvt, the same words of the activations' parts),
// applies the same promotion at each unit's end, and keeps the sum of the
// finished passes (((S0 + S1) + S2), 32 floats a thread, 32 KB a block) in
// shared memory while the next pass accumulates in registers from zero; a
// pass without units adds zero, as f8m_mma_k's idle warp does. The weights
// are mma's A operand and the grouped rows its B operand, as there; each
// element of an mma tile is its own dot product and rows past the expert's
// count are never stored, so the result is batch-invariant.
//
// Cost: 2 * 2 * rows * n * k flops on mma.sync (hi and lo), an expert's
// weights read once per 64 of its rows, the activations (4 bytes a value:
// hi and lo) once per 128 output columns; 104 KB of shared memory and at
// most 128 registers a thread (some accumulators spill around a unit's
// promotion), two blocks a multiprocessor. On an H200 at DeepSeek-V2-Lite's
// shapes it runs at about 40% of the tensor pipe (latency-bound: NOTES.md),
// and the hi + lo parts double the mma work of one 16-bit operand.
// F8G_PREFETCH 1 (the default) loads each unit's scales one unit ahead
// into shared memory; 0 loads them from global memory at the unit's start
// (V2-Lite at 4096 tokens: 3.35 against 3.41 ms a MoE call; NOTES.md).
#ifndef F8G_PREFETCH
#define F8G_PREFETCH 1
#endif
#define F8G_BM 128 // weight rows (output columns) a block
#define F8G_WARPS 8
#define F8G_STAGES 3
#define F8G_MINB 2 // blocks a multiprocessor
#define F8G_BN 64 // grouped rows a block
#define F8G_BK 64 // columns of k a stage: one of f8m_mma_k's steps
#define F8G_THREADS (F8G_WARPS * 32)
#define F8G_WM (F8G_BM / 32)                // warps over the weight rows (32 each); 2 over the grouped rows
#define F8G_A_BYTES (F8G_BM * F8G_BK)       // a stage's weight bytes
#define F8G_B_BYTES (F8G_BN * F8G_BK * 2)   // a stage's hi (or lo) part
#define F8G_STAGE_BYTES (F8G_A_BYTES + 2 * F8G_B_BYTES)
#define F8G_SMEM ((size_t)F8G_STAGES * F8G_STAGE_BYTES + (size_t)F8G_THREADS * 32 * sizeof(float))
#define F8G_BCOPIES (F8G_BN * 8 / F8G_THREADS) // 16-byte copies of each part a thread a stage

// f8g_unit is the t-th 128-column unit of k in f8m_mma_k's order: pass
// w's units w, w + 4, ... (f8m_mma_k's warp w), the passes in turn. Stage s
// takes unit f8g_unit(s / 2), its half s % 2.
__device__ __forceinline__ int f8g_unit(int t, int nu) {
#pragma unroll
	for (int w = 0; w < F8M_WARPS; w++) {
		const int c = (nu - w + 3) >> 2;
		if (t < c) return w + F8M_WARPS * t;
		t -= c;
	}
	return 0;
}

// f8g_bidx is the staged position of an activation part's 16-byte chunk ch
// (8 halves) of row r: rows of 64 halves, the chunks of row r permuted by
// r % 8, so that a warp's reads (8 rows, chunks 2 t4 + q2) hit every bank once.
__device__ __forceinline__ int f8g_bidx(int r, int ch) { return r * F8G_BK + ((ch ^ (r & 7)) << 3); }

__global__ void __launch_bounds__(F8G_THREADS, F8G_MINB) f8m_gemm_k(const f8m_proj p) {
	extern __shared__ __align__(16) unsigned char f8g_sh[];
	__shared__ int xrow[F8G_BN]; // the block's activation rows (clamped into the tile's rows)
#if F8G_PREFETCH
	__shared__ float sws[2][F8G_BM], sxs[2][F8G_BN]; // units' block and activation scales, by unit parity
#endif
	float *st = reinterpret_cast<float *>(f8g_sh + (size_t)F8G_STAGES * F8G_STAGE_BYTES); // [32][F8G_THREADS]
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	di_pdl_wait();
	// The block's tile: the blockIdx.y-th row tile over the experts.
	int ex, r0;
	di_moe_row_tile(p.offsets, p.num_experts, F8G_BN, blockIdx.y, lane, ex, r0);
	if (ex < 0) return;
	const int lo = p.offsets[ex] + r0, m = min(F8G_BN, p.offsets[ex + 1] - lo);
	const int k = p.k, nu = k / F8M_UNIT, n = p.n, j0 = F8G_BM * (int)blockIdx.x;
	if (tid < F8G_BN) {
		const int row = lo + (tid < m ? tid : 0);
		xrow[tid] = p.order ? p.order[row] / p.div : row;
	}
	__syncthreads();
	// This thread's copies a stage: 16 bytes of two weight rows, of one or two rows' hi and lo parts.
	const uint8_t *asrc[2];
	int adst[2];
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int c = tid + F8G_THREADS * i, r = c >> 2, part = c & 3;
		asrc[i] = p.w.data + ((size_t)ex * n + min(j0 + r, n - 1)) * k + 16 * part;
		adst[i] = r * F8G_BK + 16 * part;
	}
	size_t boff[F8G_BCOPIES];
	int bdst[F8G_BCOPIES];
#pragma unroll
	for (int i = 0; i < F8G_BCOPIES; i++) {
		const int c = tid + F8G_THREADS * i, r = c >> 3, ch = c & 7;
		boff[i] = (size_t)xrow[r] * k + 8 * ch;
		bdst[i] = f8g_bidx(r, ch);
	}
	auto issue = [&](int s) {
		const int kc = f8g_unit(s >> 1, nu) * F8M_UNIT + 64 * (s & 1);
		unsigned char *stage = f8g_sh + (size_t)(s % F8G_STAGES) * F8G_STAGE_BYTES;
		__half *bh = reinterpret_cast<__half *>(stage + F8G_A_BYTES), *bl = bh + F8G_BN * F8G_BK;
#pragma unroll
		for (int i = 0; i < 2; i++) di_cp_async16(stage + adst[i], asrc[i] + kc, true);
#pragma unroll
		for (int i = 0; i < F8G_BCOPIES; i++) {
			di_cp_async16(bh + bdst[i], p.xh + boff[i] + kc, true);
			di_cp_async16(bl + bdst[i], p.xl + boff[i] + kc, true);
		}
	};
	const int wm = warp % F8G_WM, wn = warp / F8G_WM;
	const int steps = 2 * nu;
#pragma unroll
	for (int s = 0; s < F8G_STAGES - 1; s++) {
		if (s < steps) issue(s);
		di_cp_async_commit();
	}
#if F8G_PREFETCH
	// The scale this thread fetches for each unit: block scale of weight row
	// tid (tid < F8G_BM) or activation scale of grouped row tid - F8G_BM.
	const bool fw = tid < F8G_BM, fx = !fw && tid < F8G_BM + F8G_BN;
	size_t fbase = 0;
	if (fw) fbase = (size_t)p.w.scale_row[(size_t)ex * n + min(j0 + tid, n - 1)] * p.w.scale_cols;
	if (fx) fbase = (size_t)xrow[tid - F8G_BM] * nu;
	auto fetch = [&](int u) {
		return fw ? p.w.scales[fbase + ((u * F8M_UNIT) >> p.w.bk_shift)] : fx ? p.xf[fbase + u] : 0.f;
	};
	auto put = [&](int buf, float v) {
		if (fw) sws[buf][tid] = v;
		if (fx) sxs[buf][tid - F8G_BM] = v;
	};
	put(0, fetch(0)); // unit 0 (read after the first stage's barrier)
#else
	// The scale offsets of this lane's weight rows (A tile mi, rows g and g + 8).
	int wsr[2][2];
#pragma unroll
	for (int mi = 0; mi < 2; mi++)
#pragma unroll
		for (int h = 0; h < 2; h++)
			wsr[mi][h] = p.w.scale_row[(size_t)ex * n + min(j0 + 32 * wm + 16 * mi + g + 8 * h, n - 1)] * p.w.scale_cols;
#endif
	float acc[2][4][4], part[2][4][4];
#pragma unroll
	for (int mi = 0; mi < 2; mi++)
#pragma unroll
		for (int ni = 0; ni < 4; ni++)
#pragma unroll
			for (int q = 0; q < 4; q++) acc[mi][ni][q] = 0.f;
	int s = 0, t = 0;
#pragma unroll 1
	for (int w = 0; w < F8M_WARPS; w++) {
		const int c = (nu - w + 3) >> 2;
#pragma unroll 1
		for (int i = 0; i < c; i++, t++) {
			const int u = w + F8M_WARPS * i;
#if F8G_PREFETCH
			// The next unit's scale, loaded now and stored after this unit's first half.
			const bool more = t + 1 < nu;
			const float next = more ? fetch(f8g_unit(t + 1, nu)) : 0.f;
#else
			// The unit's block scales (this lane's weight rows) and activation scales (its grouped rows).
			const int sc = (u * F8M_UNIT) >> p.w.bk_shift;
			float ws[2][2], xs[4][2];
#pragma unroll
			for (int mi = 0; mi < 2; mi++)
#pragma unroll
				for (int h = 0; h < 2; h++) ws[mi][h] = p.w.scales[wsr[mi][h] + sc];
#pragma unroll
			for (int ni = 0; ni < 4; ni++)
#pragma unroll
				for (int e = 0; e < 2; e++) xs[ni][e] = p.xf[(size_t)xrow[32 * wn + 8 * ni + 2 * t4 + e] * nu + u];
#endif
			(void)u;
#pragma unroll
			for (int mi = 0; mi < 2; mi++)
#pragma unroll
				for (int ni = 0; ni < 4; ni++)
#pragma unroll
					for (int q = 0; q < 4; q++) part[mi][ni][q] = 0.f;
#pragma unroll 1
			for (int half = 0; half < 2; half++, s++) {
				di_cp_async_wait<F8G_STAGES - 2>();
				__syncthreads(); // stage s has landed for every thread; stage s - 1's slot is free
				if (s + F8G_STAGES - 1 < steps) issue(s + F8G_STAGES - 1);
				di_cp_async_commit();
				const unsigned char *stage = f8g_sh + (size_t)(s % F8G_STAGES) * F8G_STAGE_BYTES;
				const __half *bh = reinterpret_cast<const __half *>(stage + F8G_A_BYTES), *bl = bh + F8G_BN * F8G_BK;
				// The lane's 16 weight bytes of rows g and g + 8 of A tile mi (columns 16 t4 ..).
				uint4 aw[2][2];
#pragma unroll
				for (int mi = 0; mi < 2; mi++)
#pragma unroll
					for (int h = 0; h < 2; h++)
						aw[mi][h] =
						    *reinterpret_cast<const uint4 *>(stage + (32 * wm + 16 * mi + g + 8 * h) * F8G_BK + 16 * t4);
#pragma unroll
				for (int q2 = 0; q2 < 2; q2++) {
					// mmas qq = 2 q2 and 2 q2 + 1: words qq of the lane's weight bytes, widened as f8m_mma_k does.
					unsigned af[2][2][4];
#pragma unroll
					for (int mi = 0; mi < 2; mi++)
#pragma unroll
						for (int qv = 0; qv < 2; qv++) {
							const int qq = 2 * q2 + qv;
							const unsigned r0w[4] = {aw[mi][0].x, aw[mi][0].y, aw[mi][0].z, aw[mi][0].w};
							const unsigned r8w[4] = {aw[mi][1].x, aw[mi][1].y, aw[mi][1].z, aw[mi][1].w};
							di_e4m3x4_to_h2x2(r0w[qq], af[mi][qv][0], af[mi][qv][2]);
							di_e4m3x4_to_h2x2(r8w[qq], af[mi][qv][1], af[mi][qv][3]);
						}
#pragma unroll
					for (int ni = 0; ni < 4; ni++) {
						// Grouped row 32 wn + 8 ni + g, halves 16 t4 + 8 q2 .. + 7: words 2 qq, 2 qq + 1 of mma qq.
						const int o = f8g_bidx(32 * wn + 8 * ni + g, 2 * t4 + q2);
						const uint4 hb = *reinterpret_cast<const uint4 *>(bh + o);
						const uint4 lb = *reinterpret_cast<const uint4 *>(bl + o);
#pragma unroll
						for (int mi = 0; mi < 2; mi++) {
							const unsigned *f0 = af[mi][0], *f1 = af[mi][1];
							float *d = part[mi][ni];
							di_mma16816<__half>(d, f0[0], f0[1], f0[2], f0[3], hb.x, hb.y);
							di_mma16816<__half>(d, f0[0], f0[1], f0[2], f0[3], lb.x, lb.y);
							di_mma16816<__half>(d, f1[0], f1[1], f1[2], f1[3], hb.z, hb.w);
							di_mma16816<__half>(d, f1[0], f1[1], f1[2], f1[3], lb.z, lb.w);
						}
					}
				}
#if F8G_PREFETCH
				if (half == 0 && more) put((t + 1) & 1, next);
#endif
			}
			// The unit's end: acc += part 2^e (the grouped row's scale) * block scale (the weight row's).
#if F8G_PREFETCH
			float ws[2][2], xs[4][2];
#pragma unroll
			for (int mi = 0; mi < 2; mi++)
#pragma unroll
				for (int h = 0; h < 2; h++) ws[mi][h] = sws[t & 1][32 * wm + 16 * mi + g + 8 * h];
#pragma unroll
			for (int ni = 0; ni < 4; ni++)
#pragma unroll
				for (int e = 0; e < 2; e++) xs[ni][e] = sxs[t & 1][32 * wn + 8 * ni + 2 * t4 + e];
#endif
#pragma unroll
			for (int mi = 0; mi < 2; mi++)
#pragma unroll
				for (int ni = 0; ni < 4; ni++)
#pragma unroll
					for (int q = 0; q < 4; q++)
						acc[mi][ni][q] = __fmaf_rn(__fmul_rn(part[mi][ni][q], xs[ni][q & 1]), ws[mi][q >> 1], acc[mi][ni][q]);
		}
		if (w < F8M_WARPS - 1) { // the finished passes' sum: S0, then (S0 + S1), then ((S0 + S1) + S2)
#pragma unroll
			for (int mi = 0; mi < 2; mi++)
#pragma unroll
				for (int ni = 0; ni < 4; ni++)
#pragma unroll
					for (int q = 0; q < 4; q++) {
						float &v = st[((mi * 4 + ni) * 4 + q) * F8G_THREADS + tid];
						v = w == 0 ? acc[mi][ni][q] : __fadd_rn(v, acc[mi][ni][q]);
						acc[mi][ni][q] = 0.f;
					}
		}
	}
	di_cp_async_wait<0>();
	// Element q of tile (mi, ni): weight row 32 wm + 16 mi + g + 8 (q >> 1), grouped row 32 wn + 8 ni + 2 t4 + (q & 1).
#pragma unroll
	for (int mi = 0; mi < 2; mi++)
#pragma unroll
		for (int ni = 0; ni < 4; ni++)
#pragma unroll
			for (int q = 0; q < 4; q++) {
				const int j = j0 + 32 * wm + 16 * mi + g + 8 * (q >> 1), r = 32 * wn + 8 * ni + 2 * t4 + (q & 1);
				if (j < n && r < m)
					p.out[(size_t)(lo + r) * n + j] =
					    __fadd_rn(st[((mi * 4 + ni) * 4 + q) * F8G_THREADS + tid], acc[mi][ni][q]);
			}
}

// f8g_grid is the grid of a projection of n weight rows over pairs grouped
// rows: column tiles of F8G_BM, and an upper bound of the experts' row tiles
// (sum of ceil(rows / F8G_BN) over at most min(experts, pairs) experts with
// rows).
static dim3 f8g_grid(size_t pairs, int num_experts, int n) {
	const size_t busy = pairs < (size_t)num_experts ? pairs : (size_t)num_experts;
	const size_t tiles = (pairs + (F8G_BN - 1) * busy) / F8G_BN;
	return dim3((unsigned)((n + F8G_BM - 1) / F8G_BM), (unsigned)(tiles > 0 ? tiles : 1));
}

// f8g_ok says whether f8m_gemm_k's grid fits CUDA's limits for pairs rows.
static bool f8g_ok(size_t pairs, int num_experts) { return f8g_grid(pairs, num_experts, 1).y <= 65535u; }

static int f8g_launch(di_ctx *ctx, const f8m_proj &p, size_t pairs) {
	cudaError_t e = cudaFuncSetAttribute(f8m_gemm_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)F8G_SMEM);
	if (e == cudaSuccess)
		e = cudaFuncSetAttribute(f8m_gemm_k, cudaFuncAttributePreferredSharedMemoryCarveout,
		                         cudaSharedmemCarveoutMaxShared);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "fp8 moe: grouped gemm: cudaFuncSetAttribute");
	di_launch(ctx, f8m_gemm_k, f8g_grid(pairs, p.num_experts, p.n), dim3(F8G_THREADS), F8G_SMEM, p);
	return di_check_launch(ctx, "fp8 moe: grouped gemm");
}

// fp8_moe_tc runs the tensor-core device path: the grouping and split x
// (one f8m_prep_k where one block groups the pairs, else di_moe_group and
// f8m_split), gate/up, SiLU-mul and split, down, combine: five launches, all
// with programmatic dependent launch. The projections run on f8m_mma_k, or
// with gemm on f8m_gemm_k (the same bits). Scratch: 4 bytes a value of x and of
// the activations (hi and lo), 8 of the gate/up outputs, 4 of the down
// outputs, and the scales.
static int fp8_moe_tc(di_ctx *ctx, float *out, const float *x, const float *weights, const di_fp8w &gu,
                      const di_fp8w &dn, const int *ids, int *offsets, int *order, int *row_of, int num_tokens,
                      int top_k, int hidden, int inter, int num_experts, bool gemm) {
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
	const f8m_proj pgu{gu, 2 * inter, hidden, offsets, num_experts, xh, xl, xf, order, top_k, g};
	const f8m_proj pdn{dn, hidden, inter, offsets, num_experts, ah, al, af, nullptr, 1, ye};
	if (rc == DI_OK) rc = gemm ? f8g_launch(ctx, pgu, pairs) : f8m_project(ctx, pgu, slots, num_tokens, pairs);
	if (rc == DI_OK) rc = f8m_split<true>(ctx, ah, al, af, g, (int)pairs, inter);
	if (rc == DI_OK) rc = gemm ? f8g_launch(ctx, pdn, pairs) : f8m_project(ctx, pdn, slots, num_tokens, pairs);
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
	// Tensor-core shapes group on the device at any size (di_moe_group) and,
	// unless moe_gemm_pairs is 0 (Options.MoEGEMMPairs negative), stay there
	// above FP8_MOE_DEVICE_PAIRS too: from moe_gemm_pairs pairs on
	// f8m_gemm_k, below on f8m_mma_k, the same bits. The GEMV path keeps the
	// one-block grouping's limit.
	const bool tc_shape = f8m_ok(gu, hidden) && f8m_ok(dn, inter);
	const bool group_ok = di_moe_group_ok(pairs, num_experts);
	const bool tc_device = tc_shape && group_ok && ctx->moe_gemm_pairs > 0;
	const bool device_fits = tc_shape ? group_ok : (pairs + num_experts + 1) * sizeof(int) <= 48 * 1024;
	bool host = !capturing && (path == DI_FP8_GEMM ||
	                           (path == DI_FP8_AUTO && pairs > FP8_MOE_DEVICE_PAIRS && gemm_ok && !tc_device) ||
	                           (path == DI_FP8_AUTO && !device_fits));
	if (path == DI_FP8_GEMM && (capturing || !gemm_ok))
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8 moe: the GEMM path needs block_k >= %d and no graph capture",
		               DI_FP8_GROUP);
	if (host && !gemm_ok)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "fp8 moe: %zu pairs need the GEMM path, which needs block_k >= %d",
		               pairs, DI_FP8_GROUP);
	if (!host && !device_fits)
		return di_fail(ctx, capturing ? DI_ERR_CAPTURING : DI_ERR_UNSUPPORTED,
		               "fp8 moe: %zu pairs over %d experts do not fit the device grouping", pairs, num_experts);
	void *d_index = nullptr;
	// [offsets (num_experts + 1) | order (pairs) | row_of (pairs)]
	rc = di_scratch(ctx, (num_experts + 1 + 2 * pairs) * sizeof(int), &d_index);
	if (rc != DI_OK) return rc;
	int *offsets = (int *)d_index, *order = offsets + num_experts + 1, *row_of = order + pairs;
	int max_rows = 0;
	const bool tc = !host && tc_shape; // fp8_moe_tc groups on its own
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
	if (rc == DI_OK && tc) {
		const bool gemm = ctx->moe_gemm_pairs > 0 && pairs >= (size_t)ctx->moe_gemm_pairs && f8g_ok(pairs, num_experts);
		rc = fp8_moe_tc(ctx, DI_PTR(float, out), DI_PTR(const float, x), DI_PTR(const float, weights), gu, dn,
		                DI_PTR(const int, ids), offsets, order, row_of, num_tokens, top_k, hidden, inter, num_experts,
		                gemm);
	}
	else if (rc == DI_OK)
		rc = fp8_moe_run(ctx, DI_PTR(float, out), DI_PTR(const float, x), DI_PTR(const float, weights), gu, dn, offsets,
		                 order, row_of, num_tokens, top_k, hidden, inter, num_experts, host, max_rows);
	di_scratch_free(ctx, d_index);
	return rc;
}
