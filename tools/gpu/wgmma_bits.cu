// wgmma_bits.cu: does wgmma.m64n128k16 give mma.sync.m16n8k16's bits for the
// same k16 slices in natural order and the same float32 accumulator? A
// stand-alone check (no library): on the GPU machine,
//
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/wgbits tools/gpu/wgmma_bits.cu && /tmp/wgbits
//
// Cases: 1, 4 and 32 k16 steps, 40 draws each (operands of one scale or of
// exponents spread over 2^-12..2^12; a zero or random accumulator). It
// prints the first draws of each and every draw whose 64 x 128 outputs
// differ in bits (how many), and the total last.
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

__device__ __forceinline__ uint64_t desc(unsigned saddr) {
	uint64_t d = (uint64_t)((saddr & 0x3FFFF) >> 4);
	d |= (uint64_t)1 << 16;
	d |= (uint64_t)64 << 32;
	d |= (uint64_t)1 << 62;
	return d;
}
#define D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define REGS                                                                                                        \
	"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "      \
	"%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
	"%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// A [64][KS] and B [128][KS] bf16 (KS = 16 * steps), C [64][128]; D out.
__global__ void wg_k(float *out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const float *C, int steps) {
	__shared__ __align__(1024) unsigned char sa[64 * 128];
	__shared__ __align__(1024) unsigned char sb[128 * 128];
	const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t4 = lane & 3, w = tid >> 5;
	float d[64];
	for (int i = 0; i < 64; i++) {
		const int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t4 + (i & 1);
		d[i] = C[row * 128 + col];
	}
	for (int s = 0; s < steps; s++) {
		__syncthreads();
		// k columns 16 s .. 16 s + 15 into chunks 0, 1 of each 128-byte row (swizzled).
		for (int c = tid; c < 64 * 2; c += 128) {
			const int r = c >> 1, part = c & 1;
			memcpy(sa + r * 128 + ((part ^ (r & 7)) << 4), A + r * 16 * steps + 16 * s + 8 * part, 16);
		}
		for (int c = tid; c < 128 * 2; c += 128) {
			const int r = c >> 1, part = c & 1;
			memcpy(sb + r * 128 + ((part ^ (r & 7)) << 4), B + r * 16 * steps + 16 * s + 8 * part, 16);
		}
		asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
		__syncthreads();
		const uint64_t da = desc((unsigned)__cvta_generic_to_shared(sa)), db = desc((unsigned)__cvta_generic_to_shared(sb));
		asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
		             "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " REGS ", %64, %65, p, 1, 1, 0, 0;\n}\n"
		             : D8(0), D8(8), D8(16), D8(24), D8(32), D8(40), D8(48), D8(56)
		             : "l"(da), "l"(db));
		asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
		asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
	}
	for (int i = 0; i < 64; i++) {
		const int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t4 + (i & 1);
		out[row * 128 + col] = d[i];
	}
}

__device__ __forceinline__ unsigned ld2(const __nv_bfloat16 *p) { return *reinterpret_cast<const unsigned *>(p); }

__global__ void mma_k(float *out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const float *C, int steps) {
	const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t4 = lane & 3, w = tid >> 5;
	const int ks = 16 * steps;
	for (int j = 0; j < 16; j++) {
		const int r0 = 16 * w + g, c0 = 8 * j + 2 * t4;
		float d[4] = {C[r0 * 128 + c0], C[r0 * 128 + c0 + 1], C[(r0 + 8) * 128 + c0], C[(r0 + 8) * 128 + c0 + 1]};
		for (int s = 0; s < steps; s++) {
			const int k = 16 * s + 2 * t4;
			const unsigned a0 = ld2(A + r0 * ks + k), a1 = ld2(A + (r0 + 8) * ks + k), a2 = ld2(A + r0 * ks + k + 8),
			               a3 = ld2(A + (r0 + 8) * ks + k + 8);
			const int n = 8 * j + g;
			const unsigned b0 = ld2(B + n * ks + k), b1 = ld2(B + n * ks + k + 8);
			asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
			    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
			    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
		}
		out[r0 * 128 + c0] = d[0], out[r0 * 128 + c0 + 1] = d[1];
		out[(r0 + 8) * 128 + c0] = d[2], out[(r0 + 8) * 128 + c0 + 1] = d[3];
	}
}

int main() {
	std::mt19937 rng(7);
	const int steps_list[] = {1, 4, 32};
	long total = 0, diff = 0;
	for (int steps : steps_list) {
		const int ks = 16 * steps;
		for (int trial = 0; trial < 40; trial++) {
			std::vector<__nv_bfloat16> a(64 * ks), b(128 * ks);
			std::vector<float> c(64 * 128);
			std::uniform_real_distribution<float> u(-1, 1);
			std::uniform_int_distribution<int> e(-12, 12);
			const bool wide = trial % 2;
			for (auto &x : a) x = __float2bfloat16(u(rng) * (wide ? ldexpf(1, e(rng)) : 1));
			for (auto &x : b) x = __float2bfloat16(u(rng) * (wide ? ldexpf(1, e(rng)) : 1));
			for (auto &x : c) x = trial % 4 < 2 ? 0.f : u(rng) * (wide ? ldexpf(1, e(rng)) : 4);
			__nv_bfloat16 *da, *db;
			float *dc, *o1, *o2;
			cudaMalloc(&da, a.size() * 2), cudaMalloc(&db, b.size() * 2), cudaMalloc(&dc, c.size() * 4);
			cudaMalloc(&o1, c.size() * 4), cudaMalloc(&o2, c.size() * 4);
			cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
			cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
			cudaMemcpy(dc, c.data(), c.size() * 4, cudaMemcpyHostToDevice);
			wg_k<<<1, 128>>>(o1, da, db, dc, steps);
			mma_k<<<1, 128>>>(o2, da, db, dc, steps);
			std::vector<float> r1(c.size()), r2(c.size());
			cudaMemcpy(r1.data(), o1, c.size() * 4, cudaMemcpyDeviceToHost);
			cudaMemcpy(r2.data(), o2, c.size() * 4, cudaMemcpyDeviceToHost);
			cudaError_t err = cudaGetLastError();
			if (err != cudaSuccess) { printf("cuda error %s\n", cudaGetErrorString(err)); return 1; }
			long nd = 0;
			double maxrel = 0;
			for (size_t i = 0; i < r1.size(); i++) {
				if (memcmp(&r1[i], &r2[i], 4)) nd++;
				double den = fabs((double)r2[i]) + 1e-30;
				maxrel = fmax(maxrel, fabs((double)r1[i] - r2[i]) / den);
			}
			total += r1.size(), diff += nd;
			if (trial < 4 || nd) printf("steps %d trial %d (wide %d, c %s): %ld of %zu differ, max rel %.3g\n", steps, trial, wide,
			                            trial % 4 < 2 ? "zero" : "random", nd, r1.size(), maxrel);
			cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(o1), cudaFree(o2);
		}
	}
	printf("wgbits: %ld of %ld elements differ in bits between wgmma and mma.sync\n", diff, total);
	return 0;
}
