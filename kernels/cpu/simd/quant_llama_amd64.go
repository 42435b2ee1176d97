//go:build amd64 && cgo

package simd

/*
#include "quant_amd64.h"
*/
import "C"

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The prefetch modes of di_linear_qllama_* (quant_llama.h's QL_PF_L2 and
// QL_PF_L1).
const (
	qlPrefetchL2 = 1
	qlPrefetchL1 = 2
)

func init() {
	// The VNNI kernel's Q8_0/Q4_0 decode tiles prefetch one tile ahead
	// into L1 on AMD CPUs, two tiles into L2 elsewhere (quant_llama.h,
	// QL_PF_L1: measured on a Zen 4 VM and a Xeon); the AVX2 kernel keeps
	// L2 (not measured on an AVX2-only AMD CPU). No result depends on it.
	vnniPrefetch := C.int(qlPrefetchL2)
	if C.di_cpu_is_amd() != 0 {
		vnniPrefetch = qlPrefetchL1
	}
	avx2 := func(qtype C.int, out *C.float, ldo C.int64_t, a, w *C.uint8_t, m, k, ncols C.int64_t) {
		C.di_linear_qllama_avx2(qtype, out, ldo, a, w, m, k, ncols, qlPrefetchL2)
	}
	vnni := func(qtype C.int, out *C.float, ldo C.int64_t, a, w *C.uint8_t, m, k, ncols C.int64_t) {
		C.di_linear_qllama_vnni(qtype, out, ldo, a, w, m, k, ncols, vnniPrefetch)
	}
	hasVNNI := cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX2
	for _, p := range available {
		var f func(qtype C.int, out *C.float, ldo C.int64_t, a, w *C.uint8_t, m, k, ncols C.int64_t)
		switch p.name {
		case "avx2":
			f = avx2
		case "avx512":
			// Every AVX-512 CPU has AVX2; VNNI only changes how the exact
			// integer sums are formed, never a result.
			f = avx2
			if hasVNNI {
				f = vnni
			}
		default:
			continue
		}
		avx512 := p.name == "avx512"
		q8k := func(dst []byte, src []float32) {
			C.di_quantize_q8k_avx2(fptr(src), (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(dst))), C.int64_t(len(src)/256))
		}
		if avx512 && hasVNNI { // built for the VNNI target: only where the CPU has it
			q8k = func(dst []byte, src []float32) {
				C.di_quantize_q8k_vnni(fptr(src), (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(dst))), C.int64_t(len(src)/256))
			}
		}
		nativeQuantizeQ8K[p.name] = q8k
		q80 := func(dst []byte, src []float32) int {
			return int(C.di_quantize_q8_0_avx2(fptr(src), (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(dst))), C.int64_t(len(src)/32)))
		}
		if avx512 && hasVNNI {
			q80 = func(dst []byte, src []float32) int {
				return int(C.di_quantize_q8_0_vnni(fptr(src), (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(dst))), C.int64_t(len(src)/32)))
			}
		}
		nativeQuantizeQ8_0[p.name] = q80
		nativeRoundBF16[p.name] = func(dst []uint16, src []float32) {
			C.di_round_bf16_avx2(fptr(src), u16ptr(dst), C.int64_t(len(src)))
		}
		nativeLinear16Llama[p.name] = func(out []float32, ldo int, x, w []uint16, bf16 bool, m, k, ncols int) bool {
			b := C.int(0)
			if bf16 {
				b = 1
			}
			if avx512 {
				return C.di_linear16_llama_avx512(b, fptr(out), C.int64_t(ldo), u16ptr(x), u16ptr(w),
					C.int64_t(m), C.int64_t(k), C.int64_t(ncols)) != 0
			}
			return C.di_linear16_llama_avx2(b, fptr(out), C.int64_t(ldo), u16ptr(x), u16ptr(w),
				C.int64_t(m), C.int64_t(k), C.int64_t(ncols)) != 0
		}
		nativeQuantLlama[p.name] = func(out []float32, ldo int, a, w []byte, t QuantType, m, k, ncols int) {
			f(C.int(t), fptr(out), C.int64_t(ldo), (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(a))),
				(*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(w))), C.int64_t(m), C.int64_t(k), C.int64_t(ncols))
		}
	}
}
