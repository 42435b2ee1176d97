package simd

import "math"

// fma32 returns a*b+c rounded once to float32, as the FMA instructions of
// the SIMD paths compute it.
//
// The product of two float32 values is exact in float64, so r = a*b + c in
// float64 carries a single rounding; rounding r to float32 rounds twice. That
// second rounding differs from a single one only when r lands exactly on a
// midpoint between two float32 values while the exact sum was not r: then the
// exact sum lies on one side of the midpoint, and r is moved one float64 ulp
// to that side before the final rounding. Cost: a few float64 operations, and
// a slow path only in the rare midpoint and subnormal cases.
func fma32(a, b, c float32) float32 {
	r := float64(a)*float64(b) + float64(c) // one rounding: the product is exact
	bits := math.Float64bits(r)
	// Fast path: r not on a float32 midpoint (the low 29 bits of the float64
	// mantissa are not 1000...0) and not in the float32 subnormal range.
	if bits&(1<<29-1) != 1<<28 && bits&(0x7ff<<52) >= (1023-126)<<52 {
		return float32(r)
	}
	return fma32Slow(a, b, c)
}

// fma32Slow handles the float32 subnormal range and the midpoints.
func fma32Slow(a, b, c float32) float32 {
	p := float64(a) * float64(b) // exact
	c64 := float64(c)
	r := p + c64
	bits := math.Float64bits(r)
	if exp := int(bits>>52&0x7ff) - 1023; exp < -126 {
		// float32 subnormal range (or zero): the midpoints are the odd
		// multiples of 2^-150, and r * 2^150 is exact.
		t := r * 0x1p150
		if t != math.Trunc(t) || math.Mod(t, 2) == 0 {
			return float32(r)
		}
	}
	// r is a float32 midpoint: the error of r decides the side (TwoSum).
	bb := r - p
	e := (p - (r - bb)) + (c64 - bb)
	switch {
	case e > 0:
		r = math.Nextafter(r, math.Inf(1))
	case e < 0:
		r = math.Nextafter(r, math.Inf(-1))
	}
	return float32(r)
}
