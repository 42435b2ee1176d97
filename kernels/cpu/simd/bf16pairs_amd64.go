//go:build amd64 && cgo

package simd

/*
#include "bf16pairs_amd64.h"
*/
import "C"

import (
	"fmt"

	"golang.org/x/sys/cpu"
)

func init() {
	// VDPBF16PS is the definition of LinearBF16Pairs' arithmetic. Without
	// it (AVX2 CPUs, AVX-512 before Cooper Lake and Zen 4) float32 FMAs
	// under DAZ and FTZ compute the same bits (kernels_avx2.c).
	native512 := hasAVX512() && cpu.X86.HasAVX512BF16
	for _, p := range available {
		switch {
		case p.name == "avx512" && native512:
			nativeLinearBF16Pairs[p.name] = func(out []float32, ldo int, x, w []uint16, m, k, ncols int) {
				C.di_linear_bf16pairs_avx512(fptr(out), C.int64_t(ldo), u16ptr(x), u16ptr(w), C.int64_t(m), C.int64_t(k), C.int64_t(ncols))
			}
		case p.name == "avx2" || p.name == "avx512":
			nativeLinearBF16Pairs[p.name] = func(out []float32, ldo int, x, w []uint16, m, k, ncols int) {
				if C.di_linear_bf16pairs_avx2(fptr(out), C.int64_t(ldo), u16ptr(x), u16ptr(w), C.int64_t(m), C.int64_t(k), C.int64_t(ncols)) != 0 {
					panic(fmt.Sprintf("simd: LinearBF16Pairs (avx2): no memory for the split rows (k=%d)", k))
				}
			}
		}
	}
}
