package simd

import (
	"errors"
	"fmt"
	"strings"
)

// ErrUnknownImpl is returned by Lookup for a name that is not an
// implementation available on this CPU.
var ErrUnknownImpl = errors.New("simd: unknown or unavailable implementation")

// Impl is one implementation of the kernels: the pure-Go reference or a SIMD
// path. Every Impl computes the canonical reduction order of the package doc,
// so all of them return the same bits for the same inputs (NaN payloads
// aside). An Impl is immutable and safe for concurrent use.
type Impl struct {
	name       string
	peak       fmaProbe // the path's FMA probe (PeakFLOPS); zero on the pure-Go path
	linearF32  func(out, x, w []float32, m, n, k, j0, j1 int)
	linearBF16 func(out, x []float32, w []uint16, m, n, k, j0, j1 int)
	linearF16  func(out, x []float32, w []uint16, m, n, k, j0, j1 int)
	linearF8   func(out, x []float32, w F8Weights, m, n, k, j0, j1 int, xs []float32)
	dot        func(a, b []float32) float32
	axpy       func(a float32, x, y []float32)
	scale      func(a float32, x []float32)
	bf16ToF32  func(dst []float32, src []uint16)
	f16ToF32   func(dst []float32, src []uint16)
	f16Rows    func(dst []float32, src []uint16, rows []int32, ld, k int)
	f32ToBF16  func(dst []uint16, src []float32)
	f32ToF16   func(dst []uint16, src []float32)

	// The attention building blocks of attn.go.
	exp             func(dst, src []float32)
	onlineSoftmax   func(s []float32, m, n int, scale float32, lo, hi []int32, rowMax, rowSum, alpha []float32)
	linearF32Gather func(out, x, w []float32, rows []int32, ldw, m, k int)
	linearF16Gather func(out, x []float32, w []uint16, rows []int32, ldw, m, k int)
	linearF32KMajor func(out []float32, ldo int, x []float32, ldx int, w []float32, m, n, k int)
	accumRows       func(acc, alpha, p, w []float32, rows []int32, ldw, m, k int)
	accumRowsF16    func(acc, alpha, p []float32, w []uint16, rows []int32, ldw, m, k int)
	prefetchRows    func(w []float32, rows []int32, ldw, k int)
	accumRowsPF     func(acc, alpha, p, w []float32, rows []int32, ldw, m, k int, pfRows []int32, pfK int)
	siluMul         func(dst, gate, up []float32)
	scaleRows       func(dst, x, w []float32, n int, scales [4]float32, rows int)
}

// goImpl is the pure-Go implementation.
var goImpl = &Impl{
	name:       "go",
	linearF32:  linearF32Go,
	linearBF16: linearBF16Go,
	linearF16:  linearF16Go,
	linearF8:   linearF8Go,
	dot:        dotGo,
	axpy:       axpyGo,
	scale:      scaleGo,
	bf16ToF32:  bf16ToF32Go,
	f16ToF32:   f16ToF32Go,
	f16Rows:    f16RowsGo,
	f32ToBF16:  f32ToBF16Go,
	f32ToF16:   f32ToF16Go,

	exp:             expSliceGo,
	onlineSoftmax:   onlineSoftmaxGo,
	linearF32Gather: linearF32GatherGo,
	linearF16Gather: linearF16GatherGo,
	linearF32KMajor: linearF32KMajorGo,
	accumRows:       accumRowsGo,
	accumRowsF16:    accumRowsF16Go,
	prefetchRows:    func([]float32, []int32, int, int) {},
	accumRowsPF:     accumRowsPFGo,
	siluMul:         siluMulGo,
	scaleRows:       scaleRowsGo,
}

// available lists the implementations this CPU runs, pure Go first and the
// fastest last; defaultImpl is the one the package-level functions use. Both
// are set once at program start and never change.
var (
	available   = append([]*Impl{goImpl}, nativeImpls()...)
	defaultImpl = available[len(available)-1]
)

// Pick returns the implementation a configuration names: "auto" (or "")
// the fastest available, "go", "avx2" or "avx512" that one, or an error
// wrapping ErrUnknownImpl when this CPU (or build) lacks it.
func Pick(name string) (*Impl, error) {
	switch n := strings.ToLower(strings.TrimSpace(name)); n {
	case "", "auto":
		return defaultImpl, nil
	default:
		return Lookup(n)
	}
}

// Impls returns the implementations available on this CPU: "go" first, then
// "avx2" and "avx512" where the CPU and the build (cgo on amd64) allow them.
func Impls() []*Impl { return append([]*Impl(nil), available...) }

// Default returns the implementation the package-level functions use: the
// fastest available.
func Default() *Impl { return defaultImpl }

// Lookup returns the available implementation with the given name.
func Lookup(name string) (*Impl, error) {
	for _, p := range available {
		if p.name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("simd: implementation %q (available: %s): %w", name, names(), ErrUnknownImpl)
}

func names() string {
	var s []string
	for _, p := range available {
		s = append(s, p.name)
	}
	return strings.Join(s, ", ")
}

// Name is the implementation's name: "go", "avx2" or "avx512".
func (p *Impl) Name() string { return p.name }

// String returns the name.
func (p *Impl) String() string { return p.name }

func checkLinear(op string, numOut, numX, numW, m, n, k, j0, j1 int) {
	switch {
	case m < 0 || n < 0 || k < 0:
		panic(fmt.Sprintf("simd: %s: negative shape m=%d n=%d k=%d", op, m, n, k))
	case j0 < 0 || j0 > j1 || j1 > n:
		panic(fmt.Sprintf("simd: %s: column range [%d,%d) outside [0,%d)", op, j0, j1, n))
	case numOut < m*n:
		panic(fmt.Sprintf("simd: %s: len(out)=%d < m*n=%d", op, numOut, m*n))
	case numX < m*k:
		panic(fmt.Sprintf("simd: %s: len(x)=%d < m*k=%d", op, numX, m*k))
	case numW < n*k:
		panic(fmt.Sprintf("simd: %s: len(w)=%d < n*k=%d", op, numW, n*k))
	}
}

// LinearF32 computes out[i*n+j] = sum over kk of x[i*k+kk]*w[j*k+kk] for rows
// i in [0,m) and columns j in [j0,j1): x is [m][k], w is [n][k] (the
// nn.Linear layout), out is [m][n] and its columns outside [j0,j1) are left
// untouched; out must not overlap x or w. Each element is reduced in the
// canonical order, so it does not depend on m, on the other rows of x, or on
// the column range. It panics if a slice is too short for the shape or the
// range is not within [0,n).
//
// Cost: 2*m*(j1-j0)*k flops. The SIMD paths read w's columns [j0,j1) from
// memory once, in blocks of about 384 KiB that stay in L2 while every block
// of 4 rows of x (kept in L1) runs against them; m = 1 (decode) streams w
// at memory bandwidth, m in the hundreds (prefill) runs near the FMA peak
// (see BENCH.md).
func (p *Impl) LinearF32(out, x, w []float32, m, n, k, j0, j1 int) {
	checkLinear("LinearF32", len(out), len(x), len(w), m, n, k, j0, j1)
	if m == 0 || j0 == j1 {
		return
	}
	p.linearF32(out, x, w, m, n, k, j0, j1)
}

// LinearBF16 is LinearF32 with w in bfloat16, widened to float32 on the fly.
func (p *Impl) LinearBF16(out, x []float32, w []uint16, m, n, k, j0, j1 int) {
	checkLinear("LinearBF16", len(out), len(x), len(w), m, n, k, j0, j1)
	if m == 0 || j0 == j1 {
		return
	}
	p.linearBF16(out, x, w, m, n, k, j0, j1)
}

// LinearF16 is LinearF32 with w in IEEE half precision, widened on the fly.
func (p *Impl) LinearF16(out, x []float32, w []uint16, m, n, k, j0, j1 int) {
	checkLinear("LinearF16", len(out), len(x), len(w), m, n, k, j0, j1)
	if m == 0 || j0 == j1 {
		return
	}
	p.linearF16(out, x, w, m, n, k, j0, j1)
}

// Dot returns the sum of a[i]*b[i] in the canonical order: the same bits as
// LinearF32 with m = n = 1. It panics if the lengths differ. Cost: 2*len(a)
// flops.
func (p *Impl) Dot(a, b []float32) float32 {
	if len(a) != len(b) {
		panic(fmt.Sprintf("simd: Dot: len(a)=%d != len(b)=%d", len(a), len(b)))
	}
	return p.dot(a, b)
}

// Axpy computes y[i] += a*x[i] with one rounding per element (fused
// multiply-add). It panics if the lengths differ.
func (p *Impl) Axpy(a float32, x, y []float32) {
	if len(x) != len(y) {
		panic(fmt.Sprintf("simd: Axpy: len(x)=%d != len(y)=%d", len(x), len(y)))
	}
	p.axpy(a, x, y)
}

// Scale computes x[i] *= a.
func (p *Impl) Scale(a float32, x []float32) { p.scale(a, x) }

// BF16ToF32 widens src into dst[:len(src)] (exact). It panics if dst is
// shorter than src.
func (p *Impl) BF16ToF32(dst []float32, src []uint16) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("simd: BF16ToF32: len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	p.bf16ToF32(dst, src)
}

// F16ToF32 widens IEEE halves in src into dst[:len(src)] (exact, subnormals
// included; a NaN keeps sign and payload and is quieted). It panics if dst is
// shorter than src.
func (p *Impl) F16ToF32(dst []float32, src []uint16) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("simd: F16ToF32: len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	p.f16ToF32(dst, src)
}

// F32ToF16 rounds src into dst[:len(src)] to IEEE half as the scalar
// F32ToF16 does (nearest even; overflow gives ±Inf, every NaN 0x7e00 with
// its sign, subnormals are rounded). It panics if dst is shorter than src.
func (p *Impl) F32ToF16(dst []uint16, src []float32) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("simd: F32ToF16: len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	p.f32ToF16(dst, src)
}

func f32ToF16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = F32ToF16(f)
	}
}

// F16Rows widens the IEEE-half rows of src that rows names into dst, one
// after another: dst[j*k:(j+1)*k] = F16ToF32 of src[rows[j]*ld:][:k], j <
// len(rows) (a 16-bit K/V cache's key or value rows gathered into a tile).
// It panics if dst is shorter than len(rows)*k or a row falls outside src.
// Cost: one pass over the halves, one call for all the rows.
func (p *Impl) F16Rows(dst []float32, src []uint16, rows []int32, ld, k int) {
	if len(dst) < len(rows)*k {
		panic(fmt.Sprintf("simd: F16Rows: len(dst)=%d < %d rows of %d", len(dst), len(rows), k))
	}
	checkGather("F16Rows", src, rows, ld, k)
	if len(rows) == 0 || k == 0 {
		return
	}
	p.f16Rows(dst, src, rows, ld, k)
}

func f16RowsGo(dst []float32, src []uint16, rows []int32, ld, k int) {
	for j, r := range rows {
		f16ToF32Go(dst[j*k:(j+1)*k], src[int(r)*ld:int(r)*ld+k])
	}
}

// F32ToBF16 rounds src into dst[:len(src)] to the nearest bfloat16, ties to
// even; every NaN becomes 0x7fc0 (as PyTorch), overflow gives ±Inf,
// subnormals are rounded, not flushed. It panics if dst is shorter than src.
func (p *Impl) F32ToBF16(dst []uint16, src []float32) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("simd: F32ToBF16: len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	p.f32ToBF16(dst, src)
}

// LinearF32 runs Default().LinearF32.
func LinearF32(out, x, w []float32, m, n, k, j0, j1 int) {
	defaultImpl.LinearF32(out, x, w, m, n, k, j0, j1)
}

// LinearBF16 runs Default().LinearBF16.
func LinearBF16(out, x []float32, w []uint16, m, n, k, j0, j1 int) {
	defaultImpl.LinearBF16(out, x, w, m, n, k, j0, j1)
}

// LinearF16 runs Default().LinearF16.
func LinearF16(out, x []float32, w []uint16, m, n, k, j0, j1 int) {
	defaultImpl.LinearF16(out, x, w, m, n, k, j0, j1)
}

// Dot runs Default().Dot.
func Dot(a, b []float32) float32 { return defaultImpl.Dot(a, b) }

// Axpy runs Default().Axpy: y += a*x.
func Axpy(a float32, x, y []float32) { defaultImpl.Axpy(a, x, y) }

// Scale runs Default().Scale: x *= a.
func Scale(a float32, x []float32) { defaultImpl.Scale(a, x) }

// BF16ToF32 runs Default().BF16ToF32.
func BF16ToF32(dst []float32, src []uint16) { defaultImpl.BF16ToF32(dst, src) }

// F16ToF32 runs Default().F16ToF32.
func F16ToF32(dst []float32, src []uint16) { defaultImpl.F16ToF32(dst, src) }

// F32ToBF16 runs Default().F32ToBF16.
func F32ToBF16(dst []uint16, src []float32) { defaultImpl.F32ToBF16(dst, src) }
