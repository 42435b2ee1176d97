package simd

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The quantizers below write the blocks llama.cpp's quantize_row_*_ref
// write for the same float32 input, bit for bit (the reference functions
// llama-quantize uses when no importance matrix is given). Every step is
// float32 arithmetic in the C code's order; Go rounds each float32
// operation, so no expression here may be fused or widened.

// Quantize writes src (a whole number of blocks of weights) into dst as
// blocks of type t, returning the bytes written. It panics on an unknown
// type, a partial block or a short dst. Cost: about 30 (Q8_0, Q4_0) to
// 3,000 (K-quants, which search the best scale) flops per weight.
func (t QuantType) Quantize(dst []byte, src []float32) int {
	bs, bb := t.BlockSize(), t.BlockBytes()
	if bs == 0 || len(src)%bs != 0 {
		panic(fmt.Sprintf("simd: Quantize %s: %d weights is not a whole number of blocks", t, len(src)))
	}
	nb := len(src) / bs
	if len(dst) < nb*bb {
		panic(fmt.Sprintf("simd: Quantize %s: len(dst)=%d < %d", t, len(dst), nb*bb))
	}
	for b := range nb {
		x, y := src[b*bs:(b+1)*bs], dst[b*bb:(b+1)*bb]
		switch t {
		case QuantQ8_0:
			quantQ8_0(y, x)
		case QuantQ4_0:
			quantQ4_0(y, x)
		case QuantQ4_K:
			quantQ4K(y, x)
		case QuantQ5_K:
			quantQ5K(y, x)
		case QuantQ6_K:
			quantQ6K(y, x)
		}
	}
	return nb * bb
}

// F32ToF16 rounds f to the nearest IEEE half, ties to even, as ggml's
// GGML_FP32_TO_FP16 does: overflow gives ±Inf, every NaN 0x7e00 with f's
// sign, subnormals are rounded (not flushed).
func F32ToF16(f float32) uint16 {
	const scaleToInf = float32(0x1p+112)
	const scaleToZero = float32(0x1p-110)
	base := abs32(f) * scaleToInf
	base *= scaleToZero
	w := math.Float32bits(f)
	shl1 := w + w
	sign := w & 0x80000000
	bias := shl1 & 0xff000000
	if bias < 0x71000000 {
		bias = 0x71000000
	}
	base = math.Float32frombits(bias>>1+0x07800000) + base
	bits := math.Float32bits(base)
	expBits := bits >> 13 & 0x00007c00
	mantBits := bits & 0x00000fff
	nonsign := expBits + mantBits
	if shl1 > 0xff000000 {
		nonsign = 0x7e00
	}
	return uint16(sign>>16 | nonsign)
}

func abs32(f float32) float32 { return math.Float32frombits(math.Float32bits(f) &^ (1 << 31)) }

func putHalf(b []byte, f float32) { binary.LittleEndian.PutUint16(b, F32ToF16(f)) }

// nearestInt rounds as ggml's nearest_int: to nearest, ties to even, for
// |f| <= 4194303.
func nearestInt(f float32) int {
	v := f + 12582912
	return int(int32(math.Float32bits(v)&0x007fffff) - 0x00400000)
}

func quantQ8_0(y []byte, x []float32) {
	var amax float32
	for _, v := range x {
		amax = max32(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putHalf(y, d)
	for j, v := range x {
		y[2+j] = byte(int8(math.Round(float64(v * id))))
	}
}

// max32 is C's MAX(a, b): a if a > b else b.
func max32(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

func quantQ4_0(y []byte, x []float32) {
	var amax, mx float32
	for _, v := range x {
		if amax < abs32(v) {
			amax, mx = abs32(v), v
		}
	}
	d := mx / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putHalf(y, d)
	for j := range 16 {
		x0 := x[j] * id
		x1 := x[16+j] * id
		xi0 := min(15, uint8(int8(x0+8.5)))
		xi1 := min(15, uint8(int8(x1+8.5)))
		y[2+j] = xi0 | xi1<<4
	}
}

// makeQKX2Quants is make_qkx2_quants: an asymmetric nmax-level
// quantization of x with weights, searching nstep+1 scales around the
// min/max one. It returns the scale and the negated min.
func makeQKX2Quants(nmax int, x, weights []float32, l, laux []uint8, rmin, rdelta float32, nstep int) (scale, theMin float32) {
	n := len(x)
	mn, mx := x[0], x[0]
	sumW := weights[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		if x[i] < mn {
			mn = x[i]
		}
		if x[i] > mx {
			mx = x[i]
		}
		w := weights[i]
		sumW += w
		sumX += w * x[i]
	}
	if mn > 0 {
		mn = 0
	}
	if mx == mn {
		for i := range n {
			l[i] = 0
		}
		return 0, -mn
	}
	iscale := float32(nmax) / (mx - mn)
	scale = 1 / iscale
	var bestError float32
	for i := range n {
		li := nearestInt(iscale * (x[i] - mn))
		l[i] = uint8(max(0, min(nmax, li)))
		diff := scale*float32(l[i]) + mn - x[i]
		diff = diff * diff
		bestError += weights[i] * diff
	}
	if nstep < 1 {
		return scale, -mn
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + rdelta*float32(is) + float32(nmax)) / (mx - mn)
		var sumL, sumL2, sumXL float32
		for i := range n {
			li := nearestInt(iscale * (x[i] - mn))
			li = max(0, min(nmax, li))
			laux[i] = uint8(li)
			w := weights[i]
			fl := float32(li)
			sumL += w * fl
			sumL2 += w * fl * fl
			sumXL += w * fl * x[i]
		}
		D := sumW*sumL2 - sumL*sumL
		if D > 0 {
			thisScale := (sumW*sumXL - sumX*sumL) / D
			thisMin := (sumL2*sumX - sumL*sumXL) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curError float32
			for i := range n {
				diff := thisScale*float32(laux[i]) + thisMin - x[i]
				diff = diff * diff
				curError += weights[i] * diff
			}
			if curError < bestError {
				copy(l[:n], laux[:n])
				bestError = curError
				scale = thisScale
				mn = thisMin
			}
		}
	}
	return scale, -mn
}

// quantK45 is the common part of quantize_row_q4_K_ref and _q5_K_ref:
// it fills the block header (d, dmin, packed scales) and returns the
// levels L[256] in 0..nmax.
func quantK45(y []byte, x []float32, nmax int, rmin, rdelta float32, nstep int) (L [256]uint8) {
	var laux [32]uint8
	var weights [32]float32
	var mins, scales [8]float32
	var maxScale, maxMin float32
	for j := range 8 {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += v * v
		}
		avX := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			weights[l] = avX + abs32(v)
		}
		scales[j], mins[j] = makeQKX2Quants(nmax, xs, weights[:], L[32*j:32*j+32], laux[:], rmin, rdelta, nstep)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	sc := y[4:16]
	clear(sc)
	for j := range 8 {
		ls := min(63, uint8(nearestInt(invScale*scales[j])))
		lm := min(63, uint8(nearestInt(invMin*mins[j])))
		if j < 4 {
			sc[j] = ls
			sc[j+4] = lm
		} else {
			sc[j+4] = ls&0xf | (lm&0xf)<<4
			sc[j-4] |= (ls >> 4) << 6
			sc[j] |= (lm >> 4) << 6
		}
	}
	putHalf(y, maxScale/63)
	putHalf(y[2:], maxMin/63)
	dAll, dmin := half(y), half(y[2:])
	for j := range 8 {
		s, m := scaleMinK4(j, sc)
		d := dAll * float32(s)
		if d == 0 {
			continue
		}
		dm := dmin * float32(m)
		for ii := range 32 {
			l := nearestInt((x[32*j+ii] + dm) / d)
			L[32*j+ii] = uint8(max(0, min(nmax, l)))
		}
	}
	return L
}

func quantQ4K(y []byte, x []float32) {
	L := quantK45(y, x, 15, -1, 0.1, 20)
	q := y[16:144]
	for j := 0; j < 256; j += 64 {
		for l := range 32 {
			q[l] = L[j+l] | L[j+l+32]<<4
		}
		q = q[32:]
	}
}

func quantQ5K(y []byte, x []float32) {
	L := quantK45(y, x, 31, -0.5, 0.1, 15)
	qh, ql := y[16:48], y[48:176]
	clear(qh)
	m1, m2 := uint8(1), uint8(2)
	for n := 0; n < 256; n += 64 {
		for j := range 32 {
			l1, l2 := L[n+j], L[n+j+32]
			if l1 > 15 {
				l1 -= 16
				qh[j] |= m1
			}
			if l2 > 15 {
				l2 -= 16
				qh[j] |= m2
			}
			ql[j] = l1 | l2<<4
		}
		m1 <<= 2
		m2 <<= 2
		ql = ql[32:]
	}
}

// groupMaxEps is ggml's GROUP_MAX_EPS: a group below it is all zero.
const groupMaxEps = float32(1e-15)

// makeQXQuants is make_qx_quants with rmse_type 1 and no importance
// weights (w = x*x): a symmetric quantization to levels -nmax..nmax-1,
// stored as 0..2*nmax-1 in l, searching 19 scales. It returns the scale.
func makeQXQuants(nmax int, x []float32, l []int8) float32 {
	var mx, amax float32
	for _, v := range x {
		if ax := abs32(v); ax > amax {
			amax, mx = ax, v
		}
	}
	if amax < groupMaxEps {
		for i := range x {
			l[i] = 0
		}
		return 0
	}
	clamp := func(v int) int { return max(-nmax, min(nmax-1, v)) }
	iscale := float32(-nmax) / mx
	var sumLX, sumL2 float32
	for i, v := range x {
		li := clamp(nearestInt(iscale * v))
		l[i] = int8(li + nmax)
		w := v * v
		sumLX += w * v * float32(li)
		sumL2 += w * float32(li) * float32(li)
	}
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(float32(nmax) + 0.1*float32(is)) / mx
		sumLX, sumL2 = 0, 0
		for _, v := range x {
			li := clamp(nearestInt(iscale * v))
			w := v * v
			sumLX += w * v * float32(li)
			sumL2 += w * float32(li) * float32(li)
		}
		if sumL2 > 0 && sumLX*sumLX > best*sumL2 {
			for i, v := range x {
				l[i] = int8(nmax + clamp(nearestInt(iscale*v)))
			}
			scale = sumLX / sumL2
			best = scale * sumLX
		}
	}
	return scale
}

func quantQ6K(y []byte, x []float32) {
	var L [256]int8
	var scales [16]float32
	var maxScale, maxAbsScale float32
	for ib := range 16 {
		s := makeQXQuants(32, x[16*ib:16*ib+16], L[16*ib:16*ib+16])
		scales[ib] = s
		if as := abs32(s); as > maxAbsScale {
			maxAbsScale, maxScale = as, s
		}
	}
	if maxAbsScale < groupMaxEps {
		clear(y[:210])
		return
	}
	iscale := -128 / maxScale
	putHalf(y[208:], 1/iscale)
	sc := y[192:208]
	for ib := range 16 {
		sc[ib] = byte(int8(min(127, nearestInt(iscale*scales[ib]))))
	}
	dAll := half(y[208:])
	for j := range 16 {
		d := dAll * float32(int8(sc[j]))
		if d == 0 {
			continue
		}
		for ii := range 16 {
			l := nearestInt(x[16*j+ii] / d)
			L[16*j+ii] = int8(max(-32, min(31, l)) + 32)
		}
	}
	ql, qh := y[0:128], y[128:192]
	for j := 0; j < 256; j += 128 {
		for l := range 32 {
			q1 := uint8(L[j+l]) & 0xf
			q2 := uint8(L[j+l+32]) & 0xf
			q3 := uint8(L[j+l+64]) & 0xf
			q4 := uint8(L[j+l+96]) & 0xf
			ql[l] = q1 | q3<<4
			ql[l+32] = q2 | q4<<4
			qh[l] = uint8(L[j+l])>>4 | (uint8(L[j+l+32])>>4)<<2 | (uint8(L[j+l+64])>>4)<<4 | (uint8(L[j+l+96])>>4)<<6
		}
		ql = ql[64:]
		qh = qh[32:]
	}
}
