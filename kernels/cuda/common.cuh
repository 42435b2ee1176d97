// common.cuh: device helpers shared by the kernel files of the CUDA backend.
#pragma once

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "internal.h"

#define DI_PTR(T, p) reinterpret_cast<T *>(static_cast<uintptr_t>(p))

__device__ __forceinline__ float di_to_f32(float v) { return v; }
__device__ __forceinline__ float di_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float di_to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float di_to_f32(__nv_fp8_e4m3 v) { return static_cast<float>(v); }

template <typename T> __device__ __forceinline__ T di_from_f32(float v);
template <> __device__ __forceinline__ float di_from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 di_from_f32<__nv_bfloat16>(float v) {
	return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half di_from_f32<__half>(float v) { return __float2half_rn(v); }
// 8-bit E4M3 caches (DI_F8E4M3): round to nearest even, subnormals kept,
// beyond +-448 saturated to +-448 (E4M3 has no infinities), NaN stays NaN.
template <> __device__ __forceinline__ __nv_fp8_e4m3 di_from_f32<__nv_fp8_e4m3>(float v) {
	__nv_fp8_e4m3 r;
	r.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
	return r;
}

// di_is_fp8<T>: T is the 8-bit cache element.
template <typename T> constexpr bool di_is_fp8 = std::is_same<T, __nv_fp8_e4m3>::value;

// di_fp8x16_to_half widens 16 E4M3 values (one 16-byte chunk, element 0 in
// the lowest byte) to 16 halves at dst (32 bytes, 16-byte aligned): exact,
// E4M3 being a subset of half.
__device__ __forceinline__ void di_fp8x16_to_half(__half *dst, uint4 v) {
	const uint32_t w[4] = {v.x, v.y, v.z, v.w};
	uint32_t h[8];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] & 0xffffu), __NV_E4M3);
		const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] >> 16), __NV_E4M3);
		h[2 * i] = (uint32_t)lo.x | ((uint32_t)lo.y << 16);
		h[2 * i + 1] = (uint32_t)hi.x | ((uint32_t)hi.y << 16);
	}
	reinterpret_cast<uint4 *>(dst)[0] = make_uint4(h[0], h[1], h[2], h[3]);
	reinterpret_cast<uint4 *>(dst)[1] = make_uint4(h[4], h[5], h[6], h[7]);
}

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

// di_block_sum_virtual is di_block_sum over a block of V times blockDim.x
// "virtual" threads, lane l of warp w standing in for virtual thread
// l + 32 (V w + i) with v[i]: each virtual warp's butterfly and the final
// one over the virtual warps' sums are di_block_sum's, so the result has
// the bits di_block_sum gives a block of V * blockDim.x threads holding the
// same values. V * blockDim.x / 32 is at most 32.
template <int V> __device__ double di_block_sum_virtual(double (&v)[V], double *shared) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = V * (blockDim.x >> 5);
#pragma unroll
	for (int i = 0; i < V; i++) v[i] = di_warp_sum(v[i]);
	__syncthreads(); // shared may be in use by a previous reduction
	if (lane == 0)
#pragma unroll
		for (int i = 0; i < V; i++) shared[V * warp + i] = v[i];
	__syncthreads();
	double s = lane < nwarps ? shared[lane] : 0.0;
	return di_warp_sum(s);
}

// di_rms_scale is RMSNorm's 1/rms from the float64 sum of squares of n
// values (shared by rms_norm, qkv_prepare and mla_prepare, which must give
// the same bits).
__device__ __forceinline__ float di_rms_scale(double sum_sq, int n, float eps) {
	return (float)(1.0 / sqrt(sum_sq / n + (double)eps));
}

// RMS_HELD is the values a thread of the norm kernels holds in registers:
// rows of at most RMS_HELD * blockDim.x values take the held path.
#define RMS_HELD 4

// di_rms_held_scale is RMSNorm's 1/rms over n values held RMS_HELD a
// thread (thread tid holds columns tid + k * blockDim.x; those past n are
// not counted): the float64 squares summed in k order, then di_block_sum.
// Every thread of the block calls it (red: 32 doubles of shared memory).
// rms_norm and mla_prepare share it, so that their norms give the same bits.
__device__ __forceinline__ float di_rms_held_scale(const float (&v)[RMS_HELD], int n, float eps, double *red) {
	const int tid = threadIdx.x, nt = blockDim.x;
	double s = 0;
#pragma unroll
	for (int k = 0; k < RMS_HELD; k++)
		if (tid + k * nt < n) s = __fma_rn((double)v[k], (double)v[k], s); // spelled out: no contraction choice
	s = di_block_sum(s, red);
	return di_rms_scale(s, n, eps);
}

// norm_threads is the block size of the norm kernels for rows of n values
// (the block sum's order follows it).
static inline int norm_threads(int n) {
	int t = 32;
	while (t < n && t < 1024) t <<= 1;
	return t;
}

// di_rotate rotates the pair (v[a], v[b]) by the angle of (c, s) (shared
// by rope, qkv_prepare and mla_prepare, which must give the same bits).
// Each product is rounded before the sum (no fused multiply-add): left to
// itself nvcc contracts one product or the other into an FMA depending on
// the kernel it is inlined in, which made mla_prepare's q differ from
// rope's by an ulp; rounded this way it is also the CPU backend's RoPE.
__device__ __forceinline__ void di_rotate(float *v, int a, int b, float c, float s) {
	const float x0 = v[a], x1 = v[b];
	v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
	v[b] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
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

// ---------------------------------------------------------------- programmatic dependent launch

// di_pdl_wait is called by every kernel that di_launch starts, before it
// touches its inputs or outputs: it waits until the grids the kernel depends on have finished and their
// writes are visible (at once when there are none, or when the kernel was
// launched the ordinary way). Nothing before it may touch global memory
// other than reading weights (which no kernel writes), so a kernel launched
// early cannot read inputs, nor overwrite buffers, that its predecessor
// still uses. The next kernel is scheduled as this one's blocks exit (the
// implicit trigger) unless the kernel calls di_pdl_trigger: an explicit
// launch_dependents in every kernel measured no better at batch 1 (0.942 vs
// 0.941 ms a Llama-3.2-1B step) and worse in the engine at batch 32 (17.0k
// vs 17.6k tok/s) while no kernel had work to do before its wait.
__device__ __forceinline__ void di_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// di_pdl_trigger lets the next kernel on the stream (when di_launch started
// it) be scheduled now rather than as this kernel's blocks exit. Called
// first thing by the small kernels whose successor is usually a GEMV, which
// streams its weights before its own di_pdl_wait; the successor still
// waits for this kernel's completion before it reads what it writes.
__device__ __forceinline__ void di_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// di_launch starts kernel on the context's stream like <<<grid, block, smem>>>,
// allowing it (when ctx->pdl: di_options.disable_pdl unset) to be scheduled while the
// previous kernel on the stream finishes: its launch latency and ramp-up
// overlap that kernel's tail, in eager streams and in captured graphs alike.
// kernel must call di_pdl_wait as di_pdl_wait says. Errors surface in di_check_launch.
template <typename... KArgs, typename... Args>
static inline void di_launch(di_ctx *ctx, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             Args &&...args) {
	cudaLaunchAttribute attr[1];
	attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	attr[0].val.programmaticStreamSerializationAllowed = ctx->pdl ? 1 : 0;
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = ctx->stream;
	cfg.attrs = attr;
	cfg.numAttrs = 1;
	(void)cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
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

// ---------------------------------------------------------------- tensor cores, async copies (sm_80+)

// di_bits16 returns the bits of a 16-bit float.
__device__ __forceinline__ unsigned di_bits16(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned di_bits16(__half v) { return __half_as_ushort(v); }

// di_mma16816 accumulates d += a . b for one m16n8k16 tile on tensor cores:
// a row-major 16x16 and b column-major 16x8, both of the 16-bit type T
// (__nv_bfloat16 or __half) in mma.sync fragment order (a0..a3 hold rows
// lane/4 and lane/4+8, columns 2*(lane%4) + {0,1} and +8; b0, b1 hold rows
// 2*(lane%4) + {0,1} and +8 of column lane/4; the lower element of each
// pair in the low half), d float32 (rows lane/4 and lane/4+8, columns
// 2*(lane%4) + {0,1}). Each element of d is its own dot product: it does not
// depend on the other rows or columns of a and b.
template <typename T>
__device__ __forceinline__ void di_mma16816(float *d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                            unsigned b1);
template <>
__device__ __forceinline__ void di_mma16816<__nv_bfloat16>(float *d, unsigned a0, unsigned a1, unsigned a2,
                                                           unsigned a3, unsigned b0, unsigned b1) {
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void di_mma16816<__half>(float *d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                    unsigned b0, unsigned b1) {
	asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// di_cp_async16 queues a 16-byte copy from global to shared memory that
// bypasses L1 (cp.async.cg); with ok false it writes 16 zero bytes and reads
// nothing (src must still be a valid address). Both addresses are 16-byte
// aligned. di_cp_async_commit closes the group of copies queued since the
// last commit; di_cp_async_wait<N> waits until at most N groups of this
// thread are pending (other threads' copies need a barrier after it).
__device__ __forceinline__ void di_cp_async16(void *dst, const void *src, bool ok) {
	const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void di_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void di_cp_async_wait() {
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// di_smem_u32 is p's shared-memory address.
__device__ __forceinline__ unsigned di_smem_u32(const void *p) {
	return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// mbarriers (sm_90): init with an arrival count (then fence.mbarrier_init
// and a barrier before other threads use it), expect_tx adds bytes that
// bulk copies will complete, arrive counts one arrival, wait spins until
// the phase of the given parity has completed (acquire: the copies' bytes
// and the arriving threads' earlier writes are visible).
__device__ __forceinline__ void di_mbar_init(uint64_t *bar, unsigned count) {
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(di_smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void di_mbar_init_fence() {
	asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void di_mbar_expect_tx(uint64_t *bar, unsigned bytes) {
	asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(di_smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void di_mbar_arrive(uint64_t *bar) {
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(di_smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void di_mbar_wait(uint64_t *bar, unsigned parity) {
	asm volatile("{\n"
	             ".reg .pred P1;\n"
	             "LAB_WAIT:\n"
	             "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
	             "@P1 bra DONE;\n"
	             "bra LAB_WAIT;\n"
	             "DONE:\n"
	             "}\n" ::"r"(di_smem_u32(bar)),
	             "r"(parity)
	             : "memory");
}
// di_cp_async_mbar_arrive makes bar count one arrival of this thread once
// every cp.async it queued before has landed (the arrival is one of those
// bar was initialized to expect: .noinc).
__device__ __forceinline__ void di_cp_async_mbar_arrive(uint64_t *bar) {
	asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(di_smem_u32(bar)) : "memory");
}

// The skinny GEMM (gemm_skinny.cu), reached from the Linear dispatch in ops.cu.
// di_skinny_ok reports whether it serves a linear of m rows over the weight
// [n, k] of w_dtype; di_skinny_linear runs it (see its doc there).
bool di_skinny_ok(di_ctx *ctx, const float *x, const void *w, int w_dtype, int m, int n, int k);
int di_skinny_linear(di_ctx *ctx, float *out, const float *x, const void *w, int w_dtype, const float *bias, int m,
                     int n, int k);
