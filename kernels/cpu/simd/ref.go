package simd

import (
	"math"
	"sync"
)

// The pure-Go path: the reference every SIMD path is tested against, and the
// fallback where no SIMD path is available. It computes the canonical order
// of the package doc exactly, with fma32 for each fused multiply-add.

// lanes is the width of the canonical reduction: lane l of a dot product
// accumulates the products at kk ≡ l (mod lanes), in increasing kk.
const lanes = 16

// dotGo is the canonical dot product of a and w[:len(a)].
func dotGo(a, w []float32) float32 {
	var acc [lanes]float32
	k := len(a)
	w = w[:k]
	kk := 0
	for ; kk+lanes <= k; kk += lanes {
		a, w := a[kk:kk+lanes], w[kk:kk+lanes]
		for l := range lanes {
			// fma32 by hand: its fast path, inlined (the compiler will not).
			r := float64(a[l])*float64(w[l]) + float64(acc[l])
			if b := math.Float64bits(r); b&(1<<29-1) != 1<<28 && b&(0x7ff<<52) >= (1023-126)<<52 {
				acc[l] = float32(r)
			} else {
				acc[l] = fma32Slow(a[l], w[l], acc[l])
			}
		}
	}
	for l := 0; kk+l < k; l++ {
		acc[l] = fma32(a[kk+l], w[kk+l], acc[l])
	}
	return reduce16(&acc)
}

// reduce16 is the canonical horizontal sum: halves added pairwise, lane l
// with lane l+8, then l+4, l+2, l+1 (the order of the SIMD paths' shuffles).
func reduce16(v *[lanes]float32) float32 {
	var s8 [8]float32
	for l := range 8 {
		s8[l] = v[l] + v[l+8]
	}
	var s4 [4]float32
	for l := range 4 {
		s4[l] = s8[l] + s8[l+4]
	}
	s2 := [2]float32{s4[0] + s4[2], s4[1] + s4[3]}
	return s2[0] + s2[1]
}

// floatPool reuses float32 buffers across calls.
type floatPool struct{ p sync.Pool }

// get returns a buffer of n floats (contents undefined).
func (fp *floatPool) get(n int) *[]float32 {
	if v, ok := fp.p.Get().(*[]float32); ok && cap(*v) >= n {
		*v = (*v)[:n]
		return v
	}
	v := make([]float32, n)
	return &v
}

func (fp *floatPool) put(v *[]float32) { fp.p.Put(v) }

// rowScratch holds the Go path's k-long rows, one per concurrent call (a
// worker of the caller's pool), reused across calls.
var rowScratch floatPool

// linearGo computes out[i*n+j] for i in [0,m), j in [j0,j1): row j of W is
// widened into one k-long buffer by row, then dotted with every row of x.
func linearGo(out, x []float32, m, n, k, j0, j1 int, row func(buf []float32, j int)) {
	v := rowScratch.get(k)
	buf := *v
	for j := j0; j < j1; j++ {
		row(buf, j)
		for i := range m {
			out[i*n+j] = dotGo(x[i*k:i*k+k], buf)
		}
	}
	rowScratch.put(v)
}

func linearF32Go(out, x, w []float32, m, n, k, j0, j1 int) {
	linearGo(out, x, m, n, k, j0, j1, func(buf []float32, j int) {
		copy(buf, w[j*k:j*k+k])
	})
}

func linearBF16Go(out, x []float32, w []uint16, m, n, k, j0, j1 int) {
	linearGo(out, x, m, n, k, j0, j1, func(buf []float32, j int) {
		bf16ToF32Go(buf, w[j*k:j*k+k])
	})
}

func linearF16Go(out, x []float32, w []uint16, m, n, k, j0, j1 int) {
	linearGo(out, x, m, n, k, j0, j1, func(buf []float32, j int) {
		f16ToF32Go(buf, w[j*k:j*k+k])
	})
}

func axpyGo(a float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] = fma32(a, v, y[i])
	}
}

func scaleGo(a float32, x []float32) {
	for i := range x {
		x[i] *= a
	}
}

func bf16ToF32Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = bf16ToF32(h)
	}
}

func f16ToF32Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = f16ToF32(h)
	}
}

func f32ToBF16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = f32ToBF16(f)
	}
}
