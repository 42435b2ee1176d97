package simd

import (
	"fmt"
	"math"
	"math/big"
)

// nativeLinearBF16Pairs holds the SIMD paths of LinearBF16Pairs by Impl
// name: out[i*ldo+j] for the m rows of x and the ncols rows of w (lengths
// checked by the caller); set by the amd64 cgo build for its SIMD Impls
// (VDPBF16PS with AVX512_BF16, float32 FMAs under DAZ and FTZ without).
// Impls without one run the pure-Go loop.
var nativeLinearBF16Pairs = map[string]func(out []float32, ldo int, x, w []uint16, m, k, ncols int){}

// HasNativeBF16Pairs reports whether p runs LinearBF16Pairs in C with SIMD
// (AVX512_BF16's VDPBF16PS, or on the AVX2 path float32 FMAs with MXCSR's
// DAZ and FTZ set for the call) rather than the pure-Go loop, which gives
// the same bits some hundred times slower.
func (p *Impl) HasNativeBF16Pairs() bool { return nativeLinearBF16Pairs[p.name] != nil }

// LinearBF16Pairs runs Default().LinearBF16Pairs.
func LinearBF16Pairs(out []float32, x, w []uint16, m, n, k, j0, j1 int) {
	defaultImpl.LinearBF16Pairs(out, x, w, m, n, k, j0, j1)
}

// LinearBF16Pairs computes out[i*n+j] = sum_kk x[i][kk] * W[j][kk] with x
// (m rows already rounded by RoundBF16) and W both bfloat16, in the
// arithmetic of AVX512_BF16's VDPBF16PS: 16 float32 lane accumulators, lane
// l taking, for each step of 32 values starting at s, the product of pair
// member s+2l+1 and then that of s+2l, each added to the lane with one
// rounding to nearest even, bfloat16 inputs that are subnormal read as
// zero and subnormal sums flushed to zero; values past k count as zeros.
// The lanes are then summed by the canonical tree (reduce16). A result
// depends only on its own row of x, its row of W and k: never on m, on the
// other rows or on [j0, j1), so the product is batch invariant. Rows i in
// [0, m), columns j in [j0, j1); it panics on slices too short for the
// shape. Cost: 2*m*(j1-j0)*k flops, half the instructions of a float32
// product where the CPU has the instruction, about a float32 product's
// time on the AVX2 path (HasNativeBF16Pairs).
func (p *Impl) LinearBF16Pairs(out []float32, x, w []uint16, m, n, k, j0, j1 int) {
	if m < 0 || k < 0 || j0 < 0 || j0 > j1 || j1 > n || len(out) < m*n || len(x) < m*k || len(w) < n*k {
		panic(fmt.Sprintf("simd: LinearBF16Pairs: m=%d n=%d k=%d j=[%d,%d): len(out)=%d len(x)=%d len(w)=%d",
			m, n, k, j0, j1, len(out), len(x), len(w)))
	}
	if m == 0 || j0 == j1 {
		return
	}
	// out[j0:] holds every element written: the last is (m-1)*n + j1-1 - j0.
	if f := nativeLinearBF16Pairs[p.name]; f != nil {
		f(out[j0:], n, x, w[j0*k:j1*k], m, k, j1-j0)
		return
	}
	var row pairsRow
	for i := range m {
		row.set(x[i*k : (i+1)*k])
		for j := j0; j < j1; j++ {
			out[i*n+j] = row.dot(w[j*k : (j+1)*k])
		}
	}
}

// pairsRow is an activation row of the pure-Go loop, prepared once for all
// the columns it meets: its values zero-padded to whole steps of 32, also
// widened to float64, and per step whether any is subnormal (such a step
// takes bf16PairFMA's exact code). Reused across rows.
type pairsRow struct {
	raw []uint16
	f   []float64
	sub []bool
}

func (r *pairsRow) set(x []uint16) {
	steps := (len(x) + 2*lanes - 1) / (2 * lanes)
	n := steps * 2 * lanes
	r.raw = append(r.raw[:0], x...)
	for len(r.raw) < n {
		r.raw = append(r.raw, 0)
	}
	r.f = r.f[:0]
	for _, h := range r.raw {
		r.f = append(r.f, float64(bf16ToF32(h)))
	}
	r.sub = r.sub[:0]
	for s := range steps {
		var flags uint64
		for _, h := range r.raw[s*2*lanes : (s+1)*2*lanes] {
			flags |= subnormalBF16(h)
		}
		r.sub = append(r.sub, flags != 0)
	}
}

// dot is LinearBF16Pairs' dot product of the row and w[:k], k the row's
// length.
func (r *pairsRow) dot(w []uint16) float32 {
	var acc [lanes]float32
	k := len(w)
	for s := range r.sub {
		lo := s * 2 * lanes
		var ws []uint16
		if lo+2*lanes <= k {
			ws = w[lo : lo+2*lanes]
		} else { // the last step, its values past k zeros
			var pad [2 * lanes]uint16
			copy(pad[:], w[lo:])
			ws = pad[:]
		}
		if r.sub[s] || !pairsStepFast(&acc, r.f[lo:lo+2*lanes], ws) {
			pairsStep(&acc, r.raw[lo:lo+2*lanes], ws)
		}
	}
	return reduce16(&acc)
}

// pairsStep adds one step of 32 values to the lanes: lane l takes the pair
// (2l+1, 2l) of xs and ws, the odd member first, through bf16PairFMA.
func pairsStep(acc *[lanes]float32, xs, ws []uint16) {
	xs, ws = xs[:2*lanes], ws[:2*lanes]
	for l := range lanes {
		acc[l] = bf16PairFMA(xs[2*l+1], ws[2*l+1], acc[l])
		acc[l] = bf16PairFMA(xs[2*l], ws[2*l], acc[l])
	}
}

// pairsStepFast adds the step of the activations xf (widened, none
// subnormal) and the weights ws as pairsStep would, and reports whether it
// did: no weight subnormal (DAZ would read it as zero) and every new
// accumulator zero or a finite normal float32 (nothing to flush; the next
// add starts from such an accumulator). Each product of two bfloat16
// values is exact in float64, and the float64 sum of it and a normal or
// zero float32 accumulator, rounded to float32, is the single rounding of
// the exact sum: exact when the two exponents lie within 37 of each other
// (16 + 37 <= 53 bits), and otherwise the larger term rounded, as the
// smaller one lies below half its float32 ulp. Otherwise acc is left as it
// was and the caller runs pairsStep. The checks are branch-free flags.
func pairsStepFast(acc *[lanes]float32, xf []float64, ws []uint16) bool {
	xf, ws = xf[:2*lanes], ws[:2*lanes]
	var flags uint64
	for _, h := range ws {
		flags |= subnormalBF16(h)
	}
	if flags != 0 {
		return false
	}
	var next [lanes]float32
	for l := range lanes {
		odd := float32(float64(acc[l]) + xf[2*l+1]*float64(bf16ToF32(ws[2*l+1])))
		c := float32(float64(odd) + xf[2*l]*float64(bf16ToF32(ws[2*l])))
		flags |= notNormalOrZero(odd) | notNormalOrZero(c)
		next[l] = c
	}
	if flags != 0 {
		return false
	}
	*acc = next
	return true
}

// subnormalBF16 is 1 where the bfloat16 h is subnormal (exponent field 0,
// mantissa not), else 0.
func subnormalBF16(h uint16) uint64 {
	return (uint64(uint16(h&0x7fff-1)) - 0x7f) >> 63
}

// notNormalOrZero is 0 where v is a zero or a finite normal float32, else 1
// (subnormal, infinite or NaN).
func notNormalOrZero(v float32) uint64 {
	b := uint64(math.Float32bits(v) & 0x7fffffff)
	sub := (uint64(uint32(b)-1) - 0x7fffff) >> 63 // 1 <= b <= 0x7fffff
	return sub | (b+0x800000)>>31                 // b >= 0x7f800000
}

// minNormal32 is the smallest positive normal float32, 2^-126.
const minNormal32 = 0x1p-126

// bf16PairFMA is one step of VDPBF16PS: c + a*b rounded once to float32
// (nearest, ties to even), with a, b and c read as zero when subnormal and
// a subnormal result flushed to a zero of its sign.
func bf16PairFMA(a, b uint16, c float32) float32 {
	// The usual case inline: a and b normal, c normal or zero, a product
	// and a sum inside float32's normal range. The product of two
	// bfloat16 values has at most 16 significant bits, exact in float64;
	// where it is also a float32 value, rounding the float64 sum of two
	// float32 values to float32 is the single rounding of the exact sum
	// (53 >= 2*24 + 2).
	if ea, eb, ec := a&0x7f80, b&0x7f80, math.Float32bits(c)&0x7f800000; ea != 0 && ea != 0x7f80 && eb != 0 && eb != 0x7f80 && ec != 0x7f800000 && (ec != 0 || c == 0) {
		prod := float64(bf16ToF32(a)) * float64(bf16ToF32(b))
		if ap := math.Abs(prod); ap >= minNormal32 && ap <= math.MaxFloat32 {
			if r := prod + float64(c); math.Abs(r) >= minNormal32 && math.Abs(r) <= math.MaxFloat32 {
				return float32(r)
			}
		}
	}
	return bf16PairFMASlow(a, b, c)
}

// bf16PairFMASlow is bf16PairFMA for every input: subnormals, zeros,
// infinities, NaNs, products and sums outside float32's normal range.
func bf16PairFMASlow(a, b uint16, c float32) float32 {
	fa, fb := bf16ToF32(daz16(a)), bf16ToF32(daz16(b))
	if math.Float32bits(c)&0x7f800000 == 0 {
		c = math.Float32frombits(math.Float32bits(c) & 0x80000000)
	}
	prod := float64(fa) * float64(fb)
	var r float64
	if ap := math.Abs(prod); ap == 0 || ap >= minNormal32 && ap <= math.MaxFloat32 || math.IsInf(prod, 0) || math.IsNaN(prod) {
		r = prod + float64(c)
	} else {
		r = exactSum(prod, float64(c))
	}
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return float32(r)
	}
	return ftz32(r)
}

// daz16 reads a subnormal bfloat16 as a zero of its sign.
func daz16(h uint16) uint16 {
	if h&0x7f80 == 0 {
		return h & 0x8000
	}
	return h
}

// exactSum rounds a + b to 24 significant bits (nearest, ties to even)
// with an unbounded exponent, as a float64 (for products outside
// float32's normal range, where the float64 sum could round twice).
func exactSum(a, b float64) float64 {
	s := new(big.Float).SetPrec(2200).SetMode(big.ToNearestEven) // exact for any two float64s
	s.Add(new(big.Float).SetFloat64(a), new(big.Float).SetFloat64(b))
	s.SetPrec(24)
	f, _ := s.Float64()
	return f
}

// ftz32 rounds r to float32, a result below the normal range (after
// rounding to 24 significant bits) flushed to a zero of its sign.
func ftz32(r float64) float32 {
	if math.Abs(r) >= minNormal32 {
		return float32(r) // overflow gives the infinity the hardware gives
	}
	// Round to 24 bits with an unbounded exponent: scaled into the normal
	// range, rounded there, scaled back exactly.
	v := float32(r * 0x1p100)
	if math.Abs(float64(v)) >= minNormal32*0x1p100 {
		return float32(float64(v) * 0x1p-100)
	}
	return math.Float32frombits(math.Float32bits(v) & 0x80000000)
}
