//go:build amd64 && cgo

package simd

/*
#include "quant_amd64.h"
*/
import "C"

import "unsafe"

func init() {
	for _, p := range available {
		var f func(qtype C.int, out, x *C.float, w *C.uint8_t, m, n, k, j0, j1 C.int64_t)
		var dq func(qtype C.int, dst *C.float, w *C.uint8_t, nb C.int64_t)
		switch p.name {
		case "avx2":
			f = func(qtype C.int, out, x *C.float, w *C.uint8_t, m, n, k, j0, j1 C.int64_t) {
				C.di_linear_quant_avx2(qtype, out, x, w, m, n, k, j0, j1)
			}
			dq = func(qtype C.int, dst *C.float, w *C.uint8_t, nb C.int64_t) { C.di_dequant_avx2(qtype, dst, w, nb) }
		case "avx512":
			f = func(qtype C.int, out, x *C.float, w *C.uint8_t, m, n, k, j0, j1 C.int64_t) {
				C.di_linear_quant_avx512(qtype, out, x, w, m, n, k, j0, j1)
			}
			dq = func(qtype C.int, dst *C.float, w *C.uint8_t, nb C.int64_t) { C.di_dequant_avx512(qtype, dst, w, nb) }
		default:
			continue
		}
		// The callers pass whole blocks and a dst of their size.
		nativeDequant[p.name] = func(dst []float32, w []byte, t QuantType) {
			nb := len(w) / t.BlockBytes()
			if len(dst) < nb*t.BlockSize() {
				panic("simd: dequantize: short dst")
			}
			if nb > 0 {
				dq(C.int(t), fptr(dst), (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(w))), C.int64_t(nb))
			}
		}
		// LinearQuant has checked every length, so C stays inside the slices.
		nativeQuant[p.name] = func(out, x []float32, w []byte, t QuantType, m, n, k, j0, j1 int) {
			f(C.int(t), fptr(out), fptr(x), (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(w))),
				C.int64_t(m), C.int64_t(n), C.int64_t(k), C.int64_t(j0), C.int64_t(j1))
		}
	}
}
