//go:build amd64 && cgo

package simd

/*
#include "bf16pairs_amd64.h"
*/
import "C"

import "golang.org/x/sys/cpu"

func init() {
	// VDPBF16PS is the definition of LinearBF16Pairs' arithmetic; without
	// it (AVX2 CPUs, AVX-512 before Cooper Lake and Zen 4) the Go loop
	// computes the same bits.
	if !hasAVX512() || !cpu.X86.HasAVX512BF16 {
		return
	}
	for _, p := range available {
		if p.name != "avx512" {
			continue
		}
		nativeLinearBF16Pairs[p.name] = func(out []float32, ldo int, x, w []uint16, m, k, ncols int) {
			C.di_linear_bf16pairs_avx512(fptr(out), C.int64_t(ldo), u16ptr(x), u16ptr(w), C.int64_t(m), C.int64_t(k), C.int64_t(ncols))
		}
	}
}
