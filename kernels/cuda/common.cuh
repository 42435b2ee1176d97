// common.cuh: device helpers shared by the kernel files of the CUDA backend.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "internal.h"

#define DI_PTR(T, p) reinterpret_cast<T *>(static_cast<uintptr_t>(p))

__device__ __forceinline__ float di_to_f32(float v) { return v; }
__device__ __forceinline__ float di_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float di_to_f32(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T di_from_f32(float v);
template <> __device__ __forceinline__ float di_from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 di_from_f32<__nv_bfloat16>(float v) {
	return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half di_from_f32<__half>(float v) { return __float2half_rn(v); }

template <typename T> __device__ __forceinline__ T di_warp_sum(T v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

// di_block_sum returns the sum of v over the block to every thread. shared
// must hold 32 values of T. blockDim.x is a multiple of 32.
template <typename T> __device__ T di_block_sum(T v, T *shared) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
	v = di_warp_sum(v);
	__syncthreads(); // shared may be in use by a previous reduction
	if (lane == 0) shared[warp] = v;
	__syncthreads();
	T s = lane < nwarps ? shared[lane] : T(0);
	return di_warp_sum(s);
}

// di_load8 reads 8 consecutive elements (16-byte aligned for float, 16 bytes
// for 16-bit types) as float32.
__device__ __forceinline__ void di_load8(const float *p, float *o) {
	const float4 a = *reinterpret_cast<const float4 *>(p), b = *reinterpret_cast<const float4 *>(p + 4);
	o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}
__device__ __forceinline__ void di_load8(const __nv_bfloat16 *p, float *o) {
	const uint4 u = *reinterpret_cast<const uint4 *>(p);
	const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
	for (int q = 0; q < 4; q++) {
		const float2 f = __bfloat1622float2(h[q]);
		o[2 * q] = f.x, o[2 * q + 1] = f.y;
	}
}
__device__ __forceinline__ void di_load8(const __half *p, float *o) {
	const uint4 u = *reinterpret_cast<const uint4 *>(p);
	const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
	for (int q = 0; q < 4; q++) {
		const float2 f = __half22float2(h[q]);
		o[2 * q] = f.x, o[2 * q + 1] = f.y;
	}
}

// di_dispatch runs body with T bound to the C++ type of a weight dtype.
#define DI_DISPATCH_WEIGHT(dtype, T, ...)                   \
	switch (dtype) {                                        \
	case DI_F32: {                                          \
		using T = float;                                    \
		__VA_ARGS__;                                        \
		break;                                              \
	}                                                       \
	case DI_BF16: {                                         \
		using T = __nv_bfloat16;                            \
		__VA_ARGS__;                                        \
		break;                                              \
	}                                                       \
	case DI_F16: {                                          \
		using T = __half;                                   \
		__VA_ARGS__;                                        \
		break;                                              \
	}                                                       \
	default:                                                \
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "dtype %d", (int)(dtype)); \
	}

// di_find_seq returns the sequence s with cu[s] <= i < cu[s+1] (binary search
// over num_seqs+1 offsets; empty sequences are skipped).
__device__ __forceinline__ int di_find_seq(const int *cu, int num_seqs, int i) {
	int lo = 0, hi = num_seqs - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) >> 1;
		if (cu[mid] <= i) lo = mid;
		else hi = mid - 1;
	}
	return lo;
}

// di_grid returns a 1-D grid size covering n items with threads per block.
static inline unsigned di_grid(size_t n, int threads) {
	size_t g = (n + threads - 1) / threads;
	if (g < 1) g = 1;
	if (g > 65535u * 16u) g = 65535u * 16u; // kernels loop grid-stride
	return (unsigned)g;
}
