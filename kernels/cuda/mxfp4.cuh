// mxfp4.cuh: MXFP4 expert weights on the device (kernels.MXFP4Weighter):
// the device layout of the 4-bit codes, and their widening to BF16 in
// registers for moe.cu's MXFP4 expert kernels (di_mx_mma_k, di_mx_gemv_k).
//
// Values: element c of a [rows, k] matrix row (k a multiple of 32) is
// E2M1(code) * 2^(scale - 127) under the row's scale c/32 (E8M0; 255 is
// refused at load). BF16 holds every such value exactly (subnormals, and
// the infinities of the largest codes under scales 253 and 254, included):
// the widening here gives the bits of kernels.F32ToBF16(kernels.MXFP4ToF32),
// the BF16 weight models widen to for backends without MXFP4 kernels.
//
// Scales: as stored, k/32 bytes a row, row after row.
//
// Codes: k/2 bytes a row, row after row, but permuted within each row by
// MXFP4Weight at upload (mxfp4.go, mxfp4DeviceRows), so that each lane of
// the kernels loads the codes it needs with one 16-byte (tensor cores) or
// 8-byte (GEMV) load and widens eight of them with nine integer operations:
//   - A word is the 4 bytes of codes of 8 consecutive columns 8q .. 8q + 7
//     of a 32-column block (q = 0..3; the checkpoint's word q of the
//     block's 16 bytes), its bits rearranged (below).
//   - A segment is 16 blocks (512 columns, 256 bytes). In a full segment,
//     block lb (0..15; chain lb % 4, step lb / 4) and word q lie at byte
//     64 (lb % 4) + 16 q + 4 pi(lb / 4), pi = (0, 2, 1, 3): the tensor-core
//     kernel's warp of chain c loads, for a weight row, the 16 bytes at
//     64 c + 16 q with the words of its four steps in the segment, and the
//     GEMV's lane L the 8 bytes at 64 ((L / 4) % 4) + 16 (L % 4) + 8 (L / 16)
//     with the words of its two 256-column steps.
//   - The last k/32 % 16 blocks of a row (the tail, when k is not a multiple
//     of 512) keep their natural place: block lb of the tail at 16 lb, word q
//     at 16 lb + 4 q.
//   - Bits of a word: the widened pair q (elements 2q, 2q + 1 of the word as
//     a BF16 pair, element 2q in the low half) is
//       pair 0 = w & DI_MX_MASK, pair 1 = rotr(w, 4) & DI_MX_MASK,
//       pair 2 = rotr(w, 10) & DI_MX_MASK,
//       pair 3 = (rotr(w, 14) & 0x80C080C0) | (rotr(w, 6) & 0x01000100),
//     each half holding its code's sign at bit 15 and its magnitude bits
//     (e1 e0 m) at bits 8, 7, 6: the BF16 whose value is E2M1(code) * 2^-126
//     (e = 0 gives the subnormal m * 2^-127), so that one multiply by
//     2^(scale - 1) gives the element (two for scales above 128, whose power
//     BF16 cannot hold).
#pragma once

#include "common.cuh"

#define DI_MX_MASK 0x81C081C0u

// di_mx_bits rearranges a device word of 8 codes into the BF16 pairs of
// their values times 2^-126 (see the file comment): element 2q of the
// word in the low half of component q. 9 integer operations.
__device__ __forceinline__ uint4 di_mx_bits(uint32_t w) {
	uint4 o;
	o.x = w & DI_MX_MASK;
	o.y = __funnelshift_r(w, w, 4) & DI_MX_MASK;
	o.z = __funnelshift_r(w, w, 10) & DI_MX_MASK;
	o.w = (__funnelshift_r(w, w, 14) & 0x80C080C0u) | ((w >> 6) & 0x01000100u);
	return o;
}

// di_bf16x2_mul multiplies two pairs of BF16 values (one fma.rn.bf16x2 with
// a -0 addend, which adds nothing to any product, -0 included). Products
// that are BF16 values (every product the widening forms) are exact;
// subnormal operands and results are kept (bf16 arithmetic has no
// flush-to-zero).
__device__ __forceinline__ uint32_t di_bf16x2_mul(uint32_t a, uint32_t b) {
	uint32_t r;
	asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
	return r;
}

// di_mx_pow is 2^(s - 1) as a BF16 pair, for an E8M0 scale s <= 128 (its
// exponent field s + 126): one integer multiply-add.
__device__ __forceinline__ uint32_t di_mx_pow(uint32_t s) { return s * 0x00800080u + 0x3F003F00u; }

// di_mx_widen widens a device word of 8 codes under the scale s (0..254)
// to the 8 BF16 values of its columns, as the 16 bytes a BF16 row holds
// them (element 2q in the low half of component q). BIG: some scale of the
// weight exceeds 128; the product then takes two multiplies, by
// 2^(min(s, 128) - 1) and by 2^(max(s, 128) - 128) (1 for s <= 128), both
// exact. Cost: 9 integer operations, one multiply-add for the power, 4 (8
// for BIG) bf16x2 multiplies.
template <bool BIG> __device__ __forceinline__ uint4 di_mx_widen(uint32_t w, uint32_t s) {
	uint4 o = di_mx_bits(w);
	if (!BIG) {
		const uint32_t p = di_mx_pow(s);
		o.x = di_bf16x2_mul(o.x, p), o.y = di_bf16x2_mul(o.y, p), o.z = di_bf16x2_mul(o.z, p),
		o.w = di_bf16x2_mul(o.w, p);
	} else {
		const uint32_t p = di_mx_pow(min(s, 128u)), q = (max(s, 128u) - 1u) * 0x00800080u;
		o.x = di_bf16x2_mul(di_bf16x2_mul(o.x, p), q), o.y = di_bf16x2_mul(di_bf16x2_mul(o.y, p), q);
		o.z = di_bf16x2_mul(di_bf16x2_mul(o.z, p), q), o.w = di_bf16x2_mul(di_bf16x2_mul(o.w, p), q);
	}
	return o;
}

// di_mx_f32 spreads the 8 widened values of di_mx_widen to float32 (exact).
__device__ __forceinline__ void di_mx_f32(const uint4 &u, float *o) {
	o[0] = __uint_as_float(u.x << 16), o[1] = __uint_as_float(u.x & 0xffff0000u);
	o[2] = __uint_as_float(u.y << 16), o[3] = __uint_as_float(u.y & 0xffff0000u);
	o[4] = __uint_as_float(u.z << 16), o[5] = __uint_as_float(u.z & 0xffff0000u);
	o[6] = __uint_as_float(u.w << 16), o[7] = __uint_as_float(u.w & 0xffff0000u);
}

// di_mx_byte is byte i (0..3) of v.
__device__ __forceinline__ uint32_t di_mx_byte(uint32_t v, int i) { return (v >> (8 * i)) & 0xffu; }

// di_mx_word is component i (0..3) of v.
__device__ __forceinline__ uint32_t di_mx_word(const uint4 &v, int i) {
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// di_cp_async4 and di_cp_async8 queue 4- and 8-byte copies from global to
// shared memory (cp.async.ca; both addresses aligned to the size), in the
// groups di_cp_async_commit closes (common.cuh).
__device__ __forceinline__ void di_cp_async4(void *dst, const void *src) {
	const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void di_cp_async8(void *dst, const void *src) {
	const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(src) : "memory");
}
