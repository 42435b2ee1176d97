//go:build amd64 && cgo

package simd

/*
#cgo CFLAGS: -O2
#include "simd_amd64.h"
#include "attn_amd64.h"
*/
import "C"

import (
	"math/bits"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// minNative is the vector length below which Dot, Axpy, Scale and the
// conversions stay in Go: a cgo call costs tens of nanoseconds, more than the
// Go loop on a handful of elements. Both paths return the same bits, so the
// cut-off cannot change a result.
const minNative = 12

// nativeImpls returns the SIMD paths this CPU runs, slowest first.
func nativeImpls() []*Impl {
	var impls []*Impl
	x := &cpu.X86
	if x.HasAVX2 && x.HasFMA && x.HasF16C {
		impls = append(impls, newNative("avx2", avx2Funcs))
	}
	if hasAVX512() {
		impls = append(impls, newNative("avx512", avx512Funcs))
	}
	return impls
}

// hasAVX512 reports whether the CPU (and OS) run the AVX-512 C functions:
// they are compiled for F, BW, VL and DQ with FMA and F16C.
func hasAVX512() bool {
	x := &cpu.X86
	return x.HasAVX512F && x.HasAVX512BW && x.HasAVX512VL && x.HasAVX512DQ && x.HasFMA && x.HasF16C
}

// fmaPeak runs iters rounds of 24 independent 16-lane FMAs (768 flops per
// round) with AVX-512 and returns a value that depends on all of them; ok is
// false where the CPU lacks AVX-512. The AVX-512 path's FMA probe
// (Impl.PeakFLOPS) and the benchmarks' compute ceiling.
func fmaPeak(iters int) (v float32, ok bool) {
	if !hasAVX512() {
		return 0, false
	}
	return float32(C.di_fma_peak_avx512(C.int64_t(iters))), true
}

// fmaPeakAVX2 runs iters rounds of 12 independent 8-lane FMAs (192 flops
// per round) with AVX2 and returns a value that depends on all of them; ok
// is false where the CPU lacks AVX2 with FMA. The AVX2 path's FMA probe
// (Impl.PeakFLOPS), also on CPUs that have AVX-512.
func fmaPeakAVX2(iters int) (v float32, ok bool) {
	if x := &cpu.X86; !x.HasAVX2 || !x.HasFMA || !x.HasF16C {
		return 0, false
	}
	return float32(C.di_fma_peak_avx2(C.int64_t(iters))), true
}

// cFuncs are one instruction set's C entry points.
type cFuncs struct {
	peak      fmaProbe
	linear    func(dtype C.int, out *C.float, x *C.float, w unsafe.Pointer, m, n, k, j0, j1 C.int64_t)
	linearF8  func(out, x *C.float, w *C.uint8_t, scales *C.float, scaleRow *C.int32_t, shift C.int, m, n, k, j0, j1 C.int64_t, xs *C.float)
	dot       func(a, b *C.float, n C.int64_t) C.float
	axpy      func(a C.float, x, y *C.float, n C.int64_t)
	scale     func(a C.float, x *C.float, n C.int64_t)
	bf16ToF32 func(dst *C.float, src *C.uint16_t, n C.int64_t)
	f16ToF32  func(dst *C.float, src *C.uint16_t, n C.int64_t)
	f16Rows   func(dst *C.float, src *C.uint16_t, rows *C.int32_t, ld, n, k C.int64_t)
	f32ToBF16 func(dst *C.uint16_t, src *C.float, n C.int64_t)
	f32ToF16  func(dst *C.uint16_t, src *C.float, n C.int64_t)

	exp            func(dst, src *C.float, n C.int64_t)
	onlineSoftmax  func(s *C.float, m, n C.int64_t, scale C.float, lo, hi *C.int32_t, rowMax, rowSum, alpha *C.float)
	linearGather   func(out, x, w *C.float, rows *C.int32_t, ldw, m, n, k C.int64_t)
	linearGather16 func(out, x *C.float, w *C.uint16_t, rows *C.int32_t, ldw, m, n, k C.int64_t)
	accumRows      func(acc, alpha, p, w *C.float, rows *C.int32_t, ldw, m, n, k C.int64_t)
	accumRows16    func(acc, alpha, p *C.float, w *C.uint16_t, rows *C.int32_t, ldw, m, n, k C.int64_t)
	accumRowsPF    func(acc, alpha, p, w *C.float, rows *C.int32_t, ldw, m, n, k C.int64_t, pfRows *C.int32_t, pfN, pfK C.int64_t)
	linearKMajor   func(out *C.float, ldo C.int64_t, x *C.float, ldx C.int64_t, w *C.float, m, n, k C.int64_t)
	siluMul        func(dst, gate, up *C.float, n C.int64_t)
	scaleRows      func(dst, x, w *C.float, n C.int64_t, s0, s1, s2, s3 C.float, m C.int64_t)
}

var avx512Funcs = cFuncs{
	peak: fmaProbe{run: fmaPeak, flopsPerRound: 768, iters: 250_000}, // rounds of 24 independent 16-lane FMAs
	linear: func(dtype C.int, out *C.float, x *C.float, w unsafe.Pointer, m, n, k, j0, j1 C.int64_t) {
		C.di_linear_avx512(dtype, out, x, w, m, n, k, j0, j1)
	},
	linearF8: func(out, x *C.float, w *C.uint8_t, scales *C.float, scaleRow *C.int32_t, shift C.int, m, n, k, j0, j1 C.int64_t, xs *C.float) {
		C.di_linear_f8_avx512(out, x, w, scales, scaleRow, shift, m, n, k, j0, j1, cBool(cpu.X86.HasAVX512VBMI), xs)
	},
	dot:       func(a, b *C.float, n C.int64_t) C.float { return C.di_dot_avx512(a, b, n) },
	axpy:      func(a C.float, x, y *C.float, n C.int64_t) { C.di_axpy_avx512(a, x, y, n) },
	scale:     func(a C.float, x *C.float, n C.int64_t) { C.di_scale_avx512(a, x, n) },
	bf16ToF32: func(dst *C.float, src *C.uint16_t, n C.int64_t) { C.di_bf16_to_f32_avx512(dst, src, n) },
	f16ToF32:  func(dst *C.float, src *C.uint16_t, n C.int64_t) { C.di_f16_to_f32_avx512(dst, src, n) },
	f16Rows: func(dst *C.float, src *C.uint16_t, rows *C.int32_t, ld, n, k C.int64_t) {
		C.di_f16_rows_to_f32_avx2(dst, src, rows, ld, n, k) // rows of a head: F16C's 8 lanes suffice
	},
	f32ToBF16: func(dst *C.uint16_t, src *C.float, n C.int64_t) { C.di_f32_to_bf16_avx512(dst, src, n) },
	f32ToF16:  func(dst *C.uint16_t, src *C.float, n C.int64_t) { C.di_f32_to_f16_avx2(dst, src, n) },

	exp: func(dst, src *C.float, n C.int64_t) { C.di_exp_avx512(dst, src, n) },
	onlineSoftmax: func(s *C.float, m, n C.int64_t, scale C.float, lo, hi *C.int32_t, rowMax, rowSum, alpha *C.float) {
		C.di_online_softmax_avx512(s, m, n, scale, lo, hi, rowMax, rowSum, alpha)
	},
	linearGather: func(out, x, w *C.float, rows *C.int32_t, ldw, m, n, k C.int64_t) {
		C.di_linear_gather_avx512(out, x, w, rows, ldw, m, n, k)
	},
	linearGather16: func(out, x *C.float, w *C.uint16_t, rows *C.int32_t, ldw, m, n, k C.int64_t) {
		C.di_linear_gather_f16_avx512(out, x, w, rows, ldw, m, n, k)
	},
	accumRows: func(acc, alpha, p, w *C.float, rows *C.int32_t, ldw, m, n, k C.int64_t) {
		C.di_accum_rows_avx512(acc, alpha, p, w, rows, ldw, m, n, k)
	},
	accumRows16: func(acc, alpha, p *C.float, w *C.uint16_t, rows *C.int32_t, ldw, m, n, k C.int64_t) {
		C.di_accum_rows_f16_avx512(acc, alpha, p, w, rows, ldw, m, n, k)
	},
	accumRowsPF: func(acc, alpha, p, w *C.float, rows *C.int32_t, ldw, m, n, k C.int64_t, pfRows *C.int32_t, pfN, pfK C.int64_t) {
		C.di_accum_rows_pf_avx512(acc, alpha, p, w, rows, ldw, m, n, k, pfRows, pfN, pfK)
	},
	linearKMajor: func(out *C.float, ldo C.int64_t, x *C.float, ldx C.int64_t, w *C.float, m, n, k C.int64_t) {
		C.di_linear_kmajor_avx512(out, ldo, x, ldx, w, m, n, k)
	},
	siluMul: func(dst, gate, up *C.float, n C.int64_t) { C.di_silu_mul_avx512(dst, gate, up, n) },
	scaleRows: func(dst, x, w *C.float, n C.int64_t, s0, s1, s2, s3 C.float, m C.int64_t) {
		C.di_scale_rows_avx512(dst, x, w, n, s0, s1, s2, s3, m)
	},
}

var avx2Funcs = cFuncs{
	peak: fmaProbe{run: fmaPeakAVX2, flopsPerRound: 192, iters: 1_000_000}, // 12 independent 8-lane FMAs
	linear: func(dtype C.int, out *C.float, x *C.float, w unsafe.Pointer, m, n, k, j0, j1 C.int64_t) {
		C.di_linear_avx2(dtype, out, x, w, m, n, k, j0, j1)
	},
	linearF8: func(out, x *C.float, w *C.uint8_t, scales *C.float, scaleRow *C.int32_t, shift C.int, m, n, k, j0, j1 C.int64_t, xs *C.float) {
		C.di_linear_f8_avx2(out, x, w, scales, scaleRow, shift, m, n, k, j0, j1, xs)
	},
	dot:       func(a, b *C.float, n C.int64_t) C.float { return C.di_dot_avx2(a, b, n) },
	axpy:      func(a C.float, x, y *C.float, n C.int64_t) { C.di_axpy_avx2(a, x, y, n) },
	scale:     func(a C.float, x *C.float, n C.int64_t) { C.di_scale_avx2(a, x, n) },
	bf16ToF32: func(dst *C.float, src *C.uint16_t, n C.int64_t) { C.di_bf16_to_f32_avx2(dst, src, n) },
	f16ToF32:  func(dst *C.float, src *C.uint16_t, n C.int64_t) { C.di_f16_to_f32_avx2(dst, src, n) },
	f16Rows: func(dst *C.float, src *C.uint16_t, rows *C.int32_t, ld, n, k C.int64_t) {
		C.di_f16_rows_to_f32_avx2(dst, src, rows, ld, n, k)
	},
	f32ToBF16: func(dst *C.uint16_t, src *C.float, n C.int64_t) { C.di_f32_to_bf16_avx2(dst, src, n) },
	f32ToF16:  func(dst *C.uint16_t, src *C.float, n C.int64_t) { C.di_f32_to_f16_avx2(dst, src, n) },

	exp: func(dst, src *C.float, n C.int64_t) { C.di_exp_avx2(dst, src, n) },
	onlineSoftmax: func(s *C.float, m, n C.int64_t, scale C.float, lo, hi *C.int32_t, rowMax, rowSum, alpha *C.float) {
		C.di_online_softmax_avx2(s, m, n, scale, lo, hi, rowMax, rowSum, alpha)
	},
	linearGather: func(out, x, w *C.float, rows *C.int32_t, ldw, m, n, k C.int64_t) {
		C.di_linear_gather_avx2(out, x, w, rows, ldw, m, n, k)
	},
	linearGather16: func(out, x *C.float, w *C.uint16_t, rows *C.int32_t, ldw, m, n, k C.int64_t) {
		C.di_linear_gather_f16_avx2(out, x, w, rows, ldw, m, n, k)
	},
	accumRows: func(acc, alpha, p, w *C.float, rows *C.int32_t, ldw, m, n, k C.int64_t) {
		C.di_accum_rows_avx2(acc, alpha, p, w, rows, ldw, m, n, k)
	},
	accumRows16: func(acc, alpha, p *C.float, w *C.uint16_t, rows *C.int32_t, ldw, m, n, k C.int64_t) {
		C.di_accum_rows_f16_avx2(acc, alpha, p, w, rows, ldw, m, n, k)
	},
	accumRowsPF: func(acc, alpha, p, w *C.float, rows *C.int32_t, ldw, m, n, k C.int64_t, pfRows *C.int32_t, pfN, pfK C.int64_t) {
		C.di_accum_rows_pf_avx2(acc, alpha, p, w, rows, ldw, m, n, k, pfRows, pfN, pfK)
	},
	linearKMajor: func(out *C.float, ldo C.int64_t, x *C.float, ldx C.int64_t, w *C.float, m, n, k C.int64_t) {
		C.di_linear_kmajor_avx2(out, ldo, x, ldx, w, m, n, k)
	},
	siluMul: func(dst, gate, up *C.float, n C.int64_t) { C.di_silu_mul_avx2(dst, gate, up, n) },
	scaleRows: func(dst, x, w *C.float, n C.int64_t, s0, s1, s2, s3 C.float, m C.int64_t) {
		C.di_scale_rows_avx2(dst, x, w, n, s0, s1, s2, s3, m)
	},
}

// The C kernels scale as many rows of activations at a time as LinearF8's
// scratch holds (a compile error if the two differ).
var _ = [1]struct{}{}[f8ScaledRows-C.DI_F8_SCALED_ROWS]

// f8Variants returns the AVX-512 path with its VBMI widening of FP8 weights
// off, where the CPU has VBMI (else nothing): for the tests, which check
// both ways through against the Go path.
func f8Variants() []*Impl {
	if !hasAVX512() || !cpu.X86.HasAVX512VBMI {
		return nil
	}
	f := avx512Funcs
	f.linearF8 = func(out, x *C.float, w *C.uint8_t, scales *C.float, scaleRow *C.int32_t, shift C.int, m, n, k, j0, j1 C.int64_t, xs *C.float) {
		C.di_linear_f8_avx512(out, x, w, scales, scaleRow, shift, m, n, k, j0, j1, 0, xs)
	}
	return []*Impl{newNative("avx512-novbmi", f)}
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func fptr(s []float32) *C.float     { return (*C.float)(unsafe.Pointer(unsafe.SliceData(s))) }
func i32ptr(s []int32) *C.int32_t   { return (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(s))) }
func u16ptr(s []uint16) *C.uint16_t { return (*C.uint16_t)(unsafe.Pointer(unsafe.SliceData(s))) }

// newNative wraps one instruction set's C functions. The Impl methods have
// checked every length before these run, so the C side never reads or
// writes outside the slices.
func newNative(name string, f cFuncs) *Impl {
	linear := func(dtype C.int, out, x []float32, w unsafe.Pointer, m, n, k, j0, j1 int) {
		f.linear(dtype, fptr(out), fptr(x), w, C.int64_t(m), C.int64_t(n), C.int64_t(k), C.int64_t(j0), C.int64_t(j1))
	}
	return &Impl{
		name: name,
		peak: f.peak,
		linearF32: func(out, x, w []float32, m, n, k, j0, j1 int) {
			linear(C.DI_F32, out, x, unsafe.Pointer(unsafe.SliceData(w)), m, n, k, j0, j1)
		},
		linearBF16: func(out, x []float32, w []uint16, m, n, k, j0, j1 int) {
			linear(C.DI_BF16, out, x, unsafe.Pointer(unsafe.SliceData(w)), m, n, k, j0, j1)
		},
		linearF16: func(out, x []float32, w []uint16, m, n, k, j0, j1 int) {
			linear(C.DI_F16, out, x, unsafe.Pointer(unsafe.SliceData(w)), m, n, k, j0, j1)
		},
		linearF8: func(out, x []float32, w F8Weights, m, n, k, j0, j1 int, xs []float32) {
			f.linearF8(fptr(out), fptr(x), (*C.uint8_t)(unsafe.SliceData(w.Data)), fptr(w.Scales),
				(*C.int32_t)(unsafe.SliceData(w.ScaleRow)), C.int(bits.TrailingZeros(uint(w.BlockK))),
				C.int64_t(m), C.int64_t(n), C.int64_t(k), C.int64_t(j0), C.int64_t(j1), fptr(xs))
		},
		dot: func(a, b []float32) float32 {
			if len(a) < minNative {
				return dotGo(a, b)
			}
			return float32(f.dot(fptr(a), fptr(b), C.int64_t(len(a))))
		},
		axpy: func(a float32, x, y []float32) {
			if len(x) < minNative {
				axpyGo(a, x, y)
				return
			}
			f.axpy(C.float(a), fptr(x), fptr(y), C.int64_t(len(x)))
		},
		scale: func(a float32, x []float32) {
			if len(x) < minNative {
				scaleGo(a, x)
				return
			}
			f.scale(C.float(a), fptr(x), C.int64_t(len(x)))
		},
		bf16ToF32: func(dst []float32, src []uint16) {
			if len(src) < minNative {
				bf16ToF32Go(dst, src)
				return
			}
			f.bf16ToF32(fptr(dst), u16ptr(src), C.int64_t(len(src)))
		},
		f16Rows: func(dst []float32, src []uint16, rows []int32, ld, k int) {
			f.f16Rows(fptr(dst), u16ptr(src), i32ptr(rows), C.int64_t(ld), C.int64_t(len(rows)), C.int64_t(k))
		},
		f16ToF32: func(dst []float32, src []uint16) {
			if len(src) < minNative {
				f16ToF32Go(dst, src)
				return
			}
			f.f16ToF32(fptr(dst), u16ptr(src), C.int64_t(len(src)))
		},
		f32ToF16: func(dst []uint16, src []float32) {
			if len(src) < minNative {
				f32ToF16Go(dst, src)
				return
			}
			f.f32ToF16(u16ptr(dst), fptr(src), C.int64_t(len(src)))
		},
		f32ToBF16: func(dst []uint16, src []float32) {
			if len(src) < minNative {
				f32ToBF16Go(dst, src)
				return
			}
			f.f32ToBF16(u16ptr(dst), fptr(src), C.int64_t(len(src)))
		},
		exp: func(dst, src []float32) {
			if len(src) < minNative {
				expSliceGo(dst, src)
				return
			}
			f.exp(fptr(dst), fptr(src), C.int64_t(len(src)))
		},
		onlineSoftmax: func(s []float32, m, n int, scale float32, lo, hi []int32, rowMax, rowSum, alpha []float32) {
			f.onlineSoftmax(fptr(s), C.int64_t(m), C.int64_t(n), C.float(scale), i32ptr(lo), i32ptr(hi),
				fptr(rowMax), fptr(rowSum), fptr(alpha))
		},
		linearF32Gather: func(out, x, w []float32, rows []int32, ldw, m, k int) {
			f.linearGather(fptr(out), fptr(x), fptr(w), i32ptr(rows), C.int64_t(ldw), C.int64_t(m), C.int64_t(len(rows)), C.int64_t(k))
		},
		linearF16Gather: func(out, x []float32, w []uint16, rows []int32, ldw, m, k int) {
			f.linearGather16(fptr(out), fptr(x), u16ptr(w), i32ptr(rows), C.int64_t(ldw), C.int64_t(m), C.int64_t(len(rows)), C.int64_t(k))
		},
		linearF32KMajor: func(out []float32, ldo int, x []float32, ldx int, w []float32, m, n, k int) {
			f.linearKMajor(fptr(out), C.int64_t(ldo), fptr(x), C.int64_t(ldx), fptr(w), C.int64_t(m), C.int64_t(n), C.int64_t(k))
		},
		accumRowsPF: func(acc, alpha, p, w []float32, rows []int32, ldw, m, k int, pfRows []int32, pfK int) {
			f.accumRowsPF(fptr(acc), fptr(alpha), fptr(p), fptr(w), i32ptr(rows), C.int64_t(ldw), C.int64_t(m), C.int64_t(len(rows)), C.int64_t(k),
				i32ptr(pfRows), C.int64_t(len(pfRows)), C.int64_t(pfK))
		},
		prefetchRows: func(w []float32, rows []int32, ldw, k int) {
			C.di_prefetch_rows(fptr(w), i32ptr(rows), C.int64_t(ldw), C.int64_t(len(rows)), C.int64_t(k))
		},
		accumRows: func(acc, alpha, p, w []float32, rows []int32, ldw, m, k int) {
			f.accumRows(fptr(acc), fptr(alpha), fptr(p), fptr(w), i32ptr(rows), C.int64_t(ldw), C.int64_t(m), C.int64_t(len(rows)), C.int64_t(k))
		},
		accumRowsF16: func(acc, alpha, p []float32, w []uint16, rows []int32, ldw, m, k int) {
			f.accumRows16(fptr(acc), fptr(alpha), fptr(p), u16ptr(w), i32ptr(rows), C.int64_t(ldw), C.int64_t(m), C.int64_t(len(rows)), C.int64_t(k))
		},
		siluMul: func(dst, gate, up []float32) {
			if len(gate) < minNative {
				siluMulGo(dst, gate, up)
				return
			}
			f.siluMul(fptr(dst), fptr(gate), fptr(up), C.int64_t(len(gate)))
		},
		scaleRows: func(dst, x, w []float32, n int, s [4]float32, rows int) {
			if rows*n < minNative {
				scaleRowsGo(dst, x, w, n, s, rows)
				return
			}
			f.scaleRows(fptr(dst), fptr(x), fptr(w), C.int64_t(n), C.float(s[0]), C.float(s[1]), C.float(s[2]), C.float(s[3]), C.int64_t(rows))
		},
	}
}
