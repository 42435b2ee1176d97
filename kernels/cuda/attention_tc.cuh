// attention_tc.cuh: the tensor-core building blocks that the prefill
// (attention_prefill.cu) and decode (attention_decode.cu) kernels of GQA
// attention share: cache-block division, the tile sizes, half conversion
// and staging, ldmatrix, and the online-softmax update of an m16 score
// tile. mma.sync m16n8k16 with half inputs and float32 accumulation.
#pragma once

#include "attention.cuh"

// di_block_div maps a key position to its cache block and the offset in
// it, by shifts when the block size is a power of two (all in practice)
// instead of an integer division (tens of instructions).
struct di_block_div {
	int size, shift; // shift < 0: divide
	__device__ __forceinline__ explicit di_block_div(int block_size) {
		size = block_size;
		shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
	}
	__device__ __forceinline__ int block(int t) const { return shift >= 0 ? t >> shift : t / size; }
	__device__ __forceinline__ int slot(int blk, int t) const { return blk * size + (t - block(t) * size); }
};

// di_exp2_ftz is 2^x by the MUFU instruction alone (ex2.approx.ftz: about
// 2 ulp, results below 2^-126 flushed to zero; -inf gives 0), without
// exp2f's rescaling for subnormal results. The prefill softmax weights
// feed sums of at least 1 and half-precision products, where a subnormal
// float32 weight counts for nothing either way.
__device__ __forceinline__ float di_exp2_ftz(float x) {
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

#define TC_BQ 64
#define TC_BK 64
#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)

__device__ __forceinline__ uint32_t di_half2_bits(float lo, float hi) {
	__half2 h = __floats2half2_rn(lo, hi);
	return *reinterpret_cast<uint32_t *>(&h);
}

// di_stage_half converts rows of D floats to half in shared memory: row r
// from base + rowsel[r]*stride (zeros where rowsel[r] < 0) to dst + r*ld.
// Rows are 16-byte aligned; each thread keeps four float4 loads in flight.
template <int D, typename T>
__device__ __forceinline__ void di_stage_half(__half *dst, int ld, const T *base, size_t stride,
                                              const int *rowsel, int rows) {
	constexpr int per = D / 4;
	const int nt = blockDim.x, total = rows * per;
	for (int f0 = threadIdx.x; f0 < total; f0 += nt * 4) {
		float4 v[4];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int f = f0 + u * nt;
			v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
			if (f < total) {
				const int r = f / per, sl = rowsel[r];
				if (sl >= 0) v[u] = di_load4(base + (size_t)sl * stride + (f - r * per) * 4);
			}
		}
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int f = f0 + u * nt;
			if (f >= total) continue;
			const int r = f / per, e = (f - r * per) * 4;
			uint2 w;
			w.x = di_half2_bits(v[u].x, v[u].y);
			w.y = di_half2_bits(v[u].z, v[u].w);
			*reinterpret_cast<uint2 *>(dst + r * ld + e) = w;
		}
	}
}

// di_fp8_rows_to_half widens rows [r0, r0+n) of an 8-bit tile ([rows][D]
// bytes) into the half tile dst ([rows][D+8]); threads [t, t+nt) of the
// caller share the work (a warp its own rows, or the whole block).
template <int D>
__device__ __forceinline__ void di_fp8_rows_to_half(__half *dst, const unsigned char *src, int r0, int n, int t,
                                                    int nt) {
	constexpr int LQ = D + 8, CH = D / 16;
	for (int c = t; c < n * CH; c += nt) {
		const int r = r0 + c / CH, e = (c % CH) * 16;
		di_fp8x16_to_half(dst + r * LQ + e, *reinterpret_cast<const uint4 *>(src + r * D + e));
	}
}

__device__ __forceinline__ void di_ldmatrix_x4(uint32_t *r, const void *smem) {
	const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(s));
}
__device__ __forceinline__ void di_ldmatrix_x4_trans(uint32_t *r, const void *smem) {
	const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(s));
}

// di_softmax_step folds row half i (0: the thread's row g, 1: row g+8)
// of a warp's m16 score tile sc (NT n8 tiles, scaled to log2 units and
// masked with -inf; mx: the thread's max of them) into the running max m
// and sum l (the thread's share; the quad adds at the end), turns the
// scores into probabilities and returns the factor alpha by which the
// row's output must be scaled before this tile's products are added
// (di_softmax_update applies it). FTZ: 2^x by di_exp2_ftz (the prefill
// kernels), else exp2f (decode).
template <bool FTZ, int NT>
__device__ __forceinline__ float di_softmax_step(float (&sc)[NT][4], float (&m)[2], float (&l)[2], int i, float mx) {
	auto ex2 = [](float x) { return FTZ ? di_exp2_ftz(x) : exp2f(x); };
	mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
	mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
	const float m_new = fmaxf(m[i], mx);
	float alpha = 1.f, sum = 0.f;
	if (m_new != -CUDART_INF_F) {
		alpha = ex2(m[i] - m_new);
#pragma unroll
		for (int nt = 0; nt < NT; nt++) {
#pragma unroll
			for (int c = 0; c < 2; c++) {
				const float p = ex2(sc[nt][2 * i + c] - m_new);
				sc[nt][2 * i + c] = p;
				sum += p;
			}
		}
	} else {
#pragma unroll
		for (int nt = 0; nt < NT; nt++) sc[nt][2 * i] = sc[nt][2 * i + 1] = 0.f;
	}
	l[i] = l[i] * alpha + sum;
	m[i] = m_new;
	return alpha;
}

// di_softmax_update is di_softmax_step with the output o scaled by alpha.
template <bool FTZ, int NT, int ND>
__device__ __forceinline__ void di_softmax_update(float (&sc)[NT][4], float (&m)[2], float (&l)[2],
                                                  float (&o)[ND][4], int i, float mx) {
	const float alpha = di_softmax_step<FTZ>(sc, m, l, i, mx);
#pragma unroll
	for (int nd = 0; nd < ND; nd++) {
		o[nd][2 * i] *= alpha;
		o[nd][2 * i + 1] *= alpha;
	}
}

// The 8-bit MLA latent cache (cache.kv_cache_dtype fp8), read by the
// absorbed kernels (attention_mla_tc.cu) and the prefill kernels
// (attention_mla_prefill.cu): MLA_F8_GROUP latent columns share a float32
// scale.
#define MLA_F8_GROUP 128

// di_mla_f8_row_bytes is the packed 8-bit row: kvl E4M3 bytes, rope halves,
// kvl / MLA_F8_GROUP float32 scales, padded to 16 bytes (656 for
// DeepSeek's 512 + 64). Keep in step with kernels.MLAF8RowBytes.
__host__ __device__ __forceinline__ int di_mla_f8_row_bytes(int kvl, int rope) {
	return (kvl + 2 * rope + 4 * (kvl / MLA_F8_GROUP) + 15) / 16 * 16;
}

// di_fp8x4_scaled_half widens four E4M3 values (w, lowest byte first) as
// the MLA kernels widen an 8-bit latent row: each value times its group's
// scale in float32, rounded to half; lo gets values 0 and 1, hi 2 and 3.
__device__ __forceinline__ void di_fp8x4_scaled_half(uint32_t w, float scale, uint32_t &lo, uint32_t &hi) {
	const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
	const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
	const float2 fa = __half22float2(__half2(a)), fb = __half22float2(__half2(b));
	lo = di_half2_bits(__fmul_rn(fa.x, scale), __fmul_rn(fa.y, scale));
	hi = di_half2_bits(__fmul_rn(fb.x, scale), __fmul_rn(fb.y, scale));
}
