// wgmma.cuh: Hopper's warpgroup MMA (wgmma) in the library's kernels: the
// shared-memory matrix descriptor of the 128-byte swizzle, the fences and
// the group waits, and the products the kernels issue (both operands from
// shared memory, or A from registers). Only sm_90a builds have wgmma
// (MW_HAS_WGMMA); elsewhere every helper compiles to nothing and the
// kernels that need it trap, which di_wg_arch_ok keeps from being launched.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>

#ifndef DI_ARCH
#define DI_ARCH "unknown"
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MW_HAS_WGMMA 1
#endif

// di_wg_desc is the wgmma matrix descriptor of a K-major tile at shared
// address saddr in the 128-byte swizzle: rows of 128 bytes, groups of 8
// rows 1024 bytes apart (the stride field), the leading field unused.
__device__ __forceinline__ uint64_t di_wg_desc(unsigned saddr) {
	uint64_t d = (uint64_t)((saddr & 0x3FFFF) >> 4);
	d |= (uint64_t)1 << 16;    // leading byte offset (unused with this swizzle)
	d |= (uint64_t)64 << 32;   // stride byte offset: 1024 >> 4
	d |= (uint64_t)1 << 62;    // 128-byte swizzle
	return d;
}

__device__ __forceinline__ void di_wg_fence() {
#ifdef MW_HAS_WGMMA
	asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void di_wg_commit() {
#ifdef MW_HAS_WGMMA
	asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void di_wg_wait() {
#ifdef MW_HAS_WGMMA
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// di_fence_async_shared orders this thread's shared-memory writes (cp.async
// included) before later reads of the async proxy (wgmma's operands).
__device__ __forceinline__ void di_fence_async_shared() {
#ifdef MW_HAS_WGMMA
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

#define MW_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MW_REGS                                                                                                        \
	"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "      \
	"%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
	"%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// di_wg_mma adds A (64 x 16, descriptor a) times B^T (128 x 16, descriptor
// b) to the 64 x 128 float32 tile d of the warpgroup (D += A B^T).
#ifdef MW_HAS_WGMMA
#define MW_MMA(ty)                                                                                                     \
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                            \
	             "wgmma.mma_async.sync.aligned.m64n128k16.f32." ty "." ty " " MW_REGS ", %64, %65, p, 1, 1, 0, 0;\n}\n" \
	             : MW_D8(0), MW_D8(8), MW_D8(16), MW_D8(24), MW_D8(32), MW_D8(40), MW_D8(48), MW_D8(56)                 \
	             : "l"(a), "l"(b))
#else
#define MW_MMA(ty)
#endif
template <typename T> __device__ __forceinline__ void di_wg_mma(float *d, uint64_t a, uint64_t b) {
	if constexpr (std::is_same_v<T, __nv_bfloat16>) MW_MMA("bf16");
	else MW_MMA("f16");
}


// di_wg_mma_rs adds A (64 x 16, from registers: warp w of the warpgroup
// holds rows 16 w .. + 15 as mma.sync's m16n8k16 A fragment, a[0..3]) times
// B^T (N x 16, descriptor b, K-major) to the 64 x N float32 tile d, N 64 or
// 128; with acc 0, d is set to the product instead (whatever d held). Element 4 j + 2 h + e of a thread's d is row 16 w + lane / 4 + 8 h,
// column 8 j + 2 (lane % 4) + e: mma.sync's m16n8 accumulator of columns
// 8 j .. 8 j + 7.
#ifdef MW_HAS_WGMMA
#define MW_MMA_RS64(ty)                                                                                                \
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                          \
	             "wgmma.mma_async.sync.aligned.m64n64k16.f32." ty "." ty " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n" \
	             : MW_D8(0), MW_D8(8), MW_D8(16), MW_D8(24)                                                         \
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc))
#define MW_MMA_RS128(ty)                                                                                               \
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                          \
	             "wgmma.mma_async.sync.aligned.m64n128k16.f32." ty "." ty " " MW_REGS ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n" \
	             : MW_D8(0), MW_D8(8), MW_D8(16), MW_D8(24), MW_D8(32), MW_D8(40), MW_D8(48), MW_D8(56)                 \
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc))
#else
#define MW_MMA_RS64(ty)
#define MW_MMA_RS128(ty)
#endif
template <typename T, int N>
__device__ __forceinline__ void di_wg_mma_rs(float *d, const uint32_t (&a)[4], uint64_t b, int acc = 1) {
	static_assert(N == 64 || N == 128, "di_wg_mma_rs: N is 64 or 128");
	if constexpr (N == 64) {
		if constexpr (std::is_same_v<T, __nv_bfloat16>) MW_MMA_RS64("bf16");
		else MW_MMA_RS64("f16");
	} else {
		if constexpr (std::is_same_v<T, __nv_bfloat16>) MW_MMA_RS128("bf16");
		else MW_MMA_RS128("f16");
	}
}

// di_wg_arch_ok says whether the library was built for sm_90a, the only
// target with wgmma (kernels using it trap on other builds).
static inline bool di_wg_arch_ok() { return strcmp(DI_ARCH, "sm_90a") == 0; }
