//go:build amd64 && cgo

package simd

/*
#cgo CFLAGS: -O2
#include "mxfp4_amd64.h"
*/
import "C"

import "unsafe"

// widenMXFP4Native runs the C widening of the implementation named name
// ("avx512" or "avx2", which exist only where the CPU runs them) and
// reports whether there was one. Lengths are checked by the caller.
func widenMXFP4Native(name string, dst []uint16, blocks, scales []byte) bool {
	d := (*C.uint16_t)(unsafe.Pointer(unsafe.SliceData(dst)))
	b := (*C.uint8_t)(unsafe.SliceData(blocks))
	s := (*C.uint8_t)(unsafe.SliceData(scales))
	nb := C.int64_t(len(scales))
	switch name {
	case "avx512":
		C.di_widen_mxfp4_avx512(d, b, s, nb, (*C.uint16_t)(unsafe.Pointer(&mxfp4Table[0])))
	case "avx2":
		C.di_widen_mxfp4_avx2(d, b, s, nb, (*C.uint8_t)(unsafe.Pointer(&mxfp4Split[0])))
	default:
		return false
	}
	return true
}

// gemvMXFP4Native runs the fused C GEMV of the implementation named name
// ("avx512" or "avx2") and reports whether there was one. Lengths are
// checked by the caller.
func gemvMXFP4Native(name string, out, x []float32, blocks, scales []byte, n, k int) bool {
	b, s := (*C.uint8_t)(unsafe.SliceData(blocks)), (*C.uint8_t)(unsafe.SliceData(scales))
	table := (*C.float)(unsafe.Pointer(&mxfp4TableF32[0]))
	switch name {
	case "avx512":
		C.di_gemv_mxfp4_avx512(fptr(out), fptr(x), b, s, C.int64_t(n), C.int64_t(k), table)
	case "avx2":
		C.di_gemv_mxfp4_avx2(fptr(out), fptr(x), b, s, C.int64_t(n), C.int64_t(k), table)
	default:
		return false
	}
	return true
}
