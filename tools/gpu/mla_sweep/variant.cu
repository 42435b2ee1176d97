// variant.cu: one shape of the MLA latent kernel for the sweep (sweep.cu).
// Compiled once per variant (run.sh): -DV_FUNC=name -DV_SRC='"file"' with
// the kernels section of attention_mla_tc.cu (everything above its host
// side) and either -DV_BASE (the file is an older revision: its
// di_mla_tc_k<KVL, D, CT>) or -DV_BK, -DV_W, -DV_NS, -DV_NS8, -DV_BULK
// (the shape of the current di_mla_tc_k; V_NS for F16 caches, V_NS8 for
// FP8), and -DV_MINB (the launch bounds' blocks a multiprocessor, which
// caps the registers; 0 or absent: di_mla_tc_minb's). Each copy lives in its own namespace, and the file's C entry points
// are renamed, so that all variants link into one program.
#define V_CAT2(a, b) a##b
#define V_CAT(a, b) V_CAT2(a, b)
#define di_op_mla_write_cache V_CAT(V_FUNC, _write_cache)
#define di_op_mla_prepare V_CAT(V_FUNC, _prepare)
#define di_op_mla_latent_attention V_CAT(V_FUNC, _latent_attention)
#define di_op_mla_attention_tc V_CAT(V_FUNC, _attention_tc)

#include "attention_tc.cuh"
#include "sweep.h"

namespace V_CAT(V_FUNC, _ns) {
#include V_SRC
} // namespace
using namespace V_CAT(V_FUNC, _ns);

#define V_KVL 512

// set_smem raises k's dynamic shared-memory limit to bytes unless *done
// (one per kernel) already has it.
template <typename K> static cudaError_t set_smem(K k, size_t bytes, size_t *done) {
	if (bytes <= *done) return cudaSuccess;
	const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
	if (e == cudaSuccess) *done = bytes;
	return e;
}

#ifdef V_BASE
template <int D, typename CT> static auto v_kernel() { return di_mla_tc_k<V_KVL, D, CT>; }
template <typename CT> static size_t v_smem(int rope) { return di_mla_tc_layout(V_KVL, rope, di_is_fp8<CT>).total; }
template <int D, typename CT> static int v_go(int mode, const SweepArgs *a) {
	using T16 = typename di_mla_t16<CT>::type;
	const int hg = (a->num_heads + MLA_HG - 1) / MLA_HG;
	if (mode & 1) {
		auto k = v_kernel<D, CT>();
		const size_t smem = v_smem<CT>(a->rope);
		static size_t done = 0; // one a kernel: v_go<D, CT>
		const cudaError_t e = set_smem(k, smem, &done);
		if (e != cudaSuccess) return (int)e;
		const int rb = di_is_fp8<CT> ? ::di_mla_f8_row_bytes(V_KVL, a->rope) : (V_KVL + a->rope) * 2;
		k<<<dim3(a->rows, a->nsplit, hg * D), MLA_TC_THREADS, smem>>>(
		    a->po, a->pml, static_cast<const T16 *>(a->ql), a->cache, a->cu, a->seqlens_k, a->block_tables, a->num_seqs,
		    a->max_blocks, a->block_size, a->num_blocks, a->num_heads, a->rope, rb, 0, a->nsplit, a->check);
	}
	if (mode & 2)
		di_mla_combine_k<<<dim3(a->rows, a->num_heads), 128>>>(a->olat, a->po, a->pml, a->num_heads, V_KVL, a->nsplit);
	return (int)cudaGetLastError();
}
#else
#ifndef V_MINB
#define V_MINB 0 // blocks a multiprocessor in the launch bounds; 0: di_mla_tc_minb's
#endif
template <typename CT> constexpr int v_ns() { return di_is_fp8<CT> ? V_NS8 : V_NS; }
template <typename CT> constexpr int v_minb() {
	return V_MINB > 0 ? V_MINB : di_mla_tc_minb<V_KVL, di_is_fp8<CT>, V_BK, v_ns<CT>()>();
}
template <int D, typename CT> static auto v_kernel() {
	return di_mla_tc_k<V_KVL, D, CT, V_BK, V_W, v_ns<CT>(), V_BULK != 0, v_minb<CT>()>;
}
template <typename CT> static size_t v_smem(int rope) {
	return di_mla_tc_layout(V_KVL, rope, di_is_fp8<CT>, V_BK, v_ns<CT>()).total;
}
template <int D, typename CT> static int v_go(int mode, const SweepArgs *a) {
	using T16 = typename di_mla_t16<CT>::type;
	const int hg = (a->num_heads + MLA_HG - 1) / MLA_HG;
	if (mode & 1) {
		auto k = v_kernel<D, CT>();
		const size_t smem = v_smem<CT>(a->rope);
		static size_t done = 0; // one a kernel: v_go<D, CT>
		const cudaError_t e = set_smem(k, smem, &done);
		if (e != cudaSuccess) return (int)e;
		k<<<dim3(a->rows, a->nsplit, hg * D), 32 * V_W, smem>>>(
		    a->po, a->pml, static_cast<const T16 *>(a->ql), a->cache, a->cu, a->seqlens_k, a->block_tables, a->num_seqs,
		    a->max_blocks, a->block_size, a->num_blocks, a->num_heads, a->rope, 0, a->nsplit, a->check);
	}
	if (mode & 2)
		di_mla_combine_k<<<dim3(a->rows, a->num_heads), 128>>>(a->olat, a->po, a->pml, a->num_heads, V_KVL, a->nsplit);
	return (int)cudaGetLastError();
}
#endif

extern "C" int V_FUNC(int cdt, int d, int mode, const SweepArgs *a) {
	if (cdt == 0) {
		if (d == 4) return v_go<4, __half>(mode, a);
		if (d == 2) return v_go<2, __half>(mode, a);
		return v_go<1, __half>(mode, a);
	}
	if (d == 4) return v_go<4, __nv_fp8_e4m3>(mode, a);
	if (d == 2) return v_go<2, __nv_fp8_e4m3>(mode, a);
	return v_go<1, __nv_fp8_e4m3>(mode, a);
}

extern "C" int V_CAT(V_FUNC, _info)(int cdt, int *regs, int *local, int *smem) {
	cudaFuncAttributes at;
	cudaError_t e;
	if (cdt == 0) {
		e = cudaFuncGetAttributes(&at, v_kernel<1, __half>());
		*smem = (int)v_smem<__half>(64);
	} else {
		e = cudaFuncGetAttributes(&at, v_kernel<1, __nv_fp8_e4m3>());
		*smem = (int)v_smem<__nv_fp8_e4m3>(64);
	}
	*regs = at.numRegs;
	*local = (int)at.localSizeBytes;
	return (int)e;
}
