package simd

import (
	"fmt"
	"math"
)

// Attention building blocks: a vectorized exponential, the online-softmax
// step of one key tile, and the two products of a tile whose key and value
// rows are gathered by index (a paged cache read in place). Every path
// computes the same operations in the same order, so all of them return the
// same bits (NaN payloads aside), and a row's results never depend on the
// other rows of a call.

// The exponential: n = round(x*log2(e)) (nearest, ties to even), r = x -
// n*ln2 in two fused steps (Cody-Waite, ln2 = expLn2Hi + expLn2Lo), e^r =
// 1 + r + r^2*P(r) with P of degree 5 in Horner form, one fused
// multiply-add a step, and the result scaled by 2^n with one rounding (which
// also rounds subnormal results correctly). x is first clamped to
// [expMin, expMax]: e^expMin rounds to +0 and e^expMax overflows to +Inf.
// Error: at most 1 ulp against float32(math.Exp(float64(x))), measured over
// every float32 in [-110, 89] (TestExpAccuracy repeats it on a sweep).
const (
	expMin   = -110
	expMax   = 89
	expLog2E = float32(1.44269504088896341)
	expLn2Hi = float32(0.693359375)
	expLn2Lo = float32(-2.12194440e-4)
	expP0    = float32(1.9875691500e-4)
	expP1    = float32(1.3981999507e-3)
	expP2    = float32(8.3334519073e-3)
	expP3    = float32(4.1665795894e-2)
	expP4    = float32(1.6666665459e-1)
	expP5    = float32(5.0000001201e-1)
)

// expGo is the reference of the exponential above; the SIMD paths compute
// the same operations lane by lane.
func expGo(x float32) float32 {
	if x != x {
		return x
	}
	x = min(max(x, expMin), expMax)
	n := float32(math.RoundToEven(float64(float32(x * expLog2E))))
	r := fma32(-n, expLn2Hi, x)
	r = fma32(-n, expLn2Lo, r)
	q := fma32(expP0, r, expP1)
	q = fma32(q, r, expP2)
	q = fma32(q, r, expP3)
	q = fma32(q, r, expP4)
	q = fma32(q, r, expP5)
	y := fma32(q, float32(r*r), r) + 1
	// y * 2^n is exact in float64 (n in [-159, 129]); the conversion rounds
	// once, to nearest even, subnormals included.
	return float32(float64(y) * math.Float64frombits(uint64(int64(n)+1023)<<52))
}

func expSliceGo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = expGo(x)
	}
}

// onlineSoftmaxGo is the reference of Impl.OnlineSoftmax.
func onlineSoftmaxGo(s []float32, m, n int, scale float32, lo, hi []int32, rowMax, rowSum, alpha []float32) {
	for i := range m {
		row := s[i*n : (i+1)*n]
		a, b := int(lo[i]), int(hi[i])
		if a >= b {
			clear(row)
			alpha[i] = 1
			continue
		}
		tmax := row[a] * scale
		for _, v := range row[a+1 : b] {
			tmax = maxOrdered(tmax, v*scale)
		}
		mOld := rowMax[i]
		mNew := maxOrdered(mOld, tmax)
		var acc [lanes]float32
		for j, v := range row {
			e := float32(0)
			if j >= a && j < b {
				e = expGo(fma32(v, scale, -mNew))
			}
			row[j] = e
			acc[j%lanes] += e
		}
		alpha[i] = expGo(mOld - mNew)
		rowSum[i] = fma32(rowSum[i], alpha[i], reduce16(&acc))
		rowMax[i] = mNew
	}
}

// maxOrdered is max(a, b) as the SIMD max instructions compute it with b
// as their second operand: b unless a > b (so NaN in either gives b, and
// equal zeros give b).
func maxOrdered(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

// linearF32GatherGo is the reference of Impl.LinearF32Gather.
func linearF32GatherGo(out, x, w []float32, rows []int32, ldw, m, k int) {
	n := len(rows)
	for j, rw := range rows {
		wr := w[int(rw)*ldw : int(rw)*ldw+k]
		for i := range m {
			out[i*n+j] = dotGo(x[i*k:i*k+k], wr)
		}
	}
}

// linearF16GatherGo is the reference of Impl.LinearF16Gather: each
// gathered row widened, then linearF32GatherGo's dot products.
func linearF16GatherGo(out, x []float32, w []uint16, rows []int32, ldw, m, k int) {
	n := len(rows)
	wr := make([]float32, k)
	for j, rw := range rows {
		f16ToF32Go(wr, w[int(rw)*ldw:int(rw)*ldw+k])
		for i := range m {
			out[i*n+j] = dotGo(x[i*k:i*k+k], wr)
		}
	}
}

// linearF32KMajorGo is the reference of Impl.LinearF32KMajor: each column
// of w copied out, then dotGo.
func linearF32KMajorGo(out []float32, ldo int, x []float32, ldx int, w []float32, m, n, k int) {
	col := make([]float32, k)
	for c := range n {
		for kk := range col {
			col[kk] = w[kk*n+c]
		}
		for i := range m {
			out[i*ldo+c] = dotGo(x[i*ldx:i*ldx+k], col)
		}
	}
}

// accumRowsPFGo is the pure-Go Impl.AccumRowsPrefetch: accumRowsGo, no
// prefetch.
func accumRowsPFGo(acc, alpha, p, w []float32, rows []int32, ldw, m, k int, _ []int32, _ int) {
	accumRowsGo(acc, alpha, p, w, rows, ldw, m, k)
}

// accumRowsGo is the reference of Impl.AccumRows.
func accumRowsGo(acc, alpha, p, w []float32, rows []int32, ldw, m, k int) {
	n := len(rows)
	for i := range m {
		pr, dst := p[i*n:(i+1)*n], acc[i*k:(i+1)*k]
		for c := range dst {
			var s float32
			for j, rw := range rows {
				if pr[j] != 0 {
					s = fma32(pr[j], w[int(rw)*ldw+c], s)
				}
			}
			dst[c] = fma32(dst[c], alpha[i], s)
		}
	}
}

// accumRowsF16Go is the reference of Impl.AccumRowsF16: the gathered rows
// widened (exactly) into a dense float32 tile, then accumRowsGo over it.
func accumRowsF16Go(acc, alpha, p []float32, w []uint16, rows []int32, ldw, m, k int) {
	wide, dense := make([]float32, len(rows)*k), make([]int32, len(rows))
	for j, rw := range rows {
		f16ToF32Go(wide[j*k:(j+1)*k], w[int(rw)*ldw:int(rw)*ldw+k])
		dense[j] = int32(j)
	}
	accumRowsGo(acc, alpha, p, wide, dense, k, m, k)
}

// Exp sets dst[i] = e^src[i] for i < len(src): within 1 ulp of the
// correctly rounded value (see expMin), subnormal results included; e^x is
// +0 for x <= -104 (and -Inf), +Inf past float32's range, NaN for NaN.
// It panics if dst is shorter than src. Cost: about 15 vector instructions
// per 16 (AVX-512) or 8 (AVX2) elements.
func (p *Impl) Exp(dst, src []float32) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("simd: Exp: len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	p.exp(dst, src)
}

// OnlineSoftmax runs one key tile of the online softmax of m rows: row i of
// s (n scores, s[i*n:(i+1)*n]) sees the keys [lo[i], hi[i]) of the tile and
// carries the running max rowMax[i] (-Inf before the first tile) and
// denominator rowSum[i] (0 before the first tile). For a row that sees some
// key, with mNew = max(rowMax[i], max over seen j of s[j]*scale):
//
//	s[j]      = exp(fma(s[j], scale, -mNew)) for seen j, +0 for the others
//	alpha[i]  = exp(rowMax[i] - mNew), the factor of the row's previous output
//	rowSum[i] = fma(rowSum[i], alpha[i], sum of the new s[j])
//	rowMax[i] = mNew
//
// exp is Exp's; the sum runs in the canonical order of Dot (lane j%16, then
// the tree), so the keys a row does not see, being +0, change no bit. A row
// that sees no key is set to +0 with alpha 1 and its state unchanged. It
// panics unless 0 <= lo[i], hi[i] <= n and the slices hold m rows. Cost: two
// passes over the m*n scores and one exponential per seen score.
func (p *Impl) OnlineSoftmax(s []float32, m, n int, scale float32, lo, hi []int32, rowMax, rowSum, alpha []float32) {
	switch {
	case m < 0 || n < 0 || len(s) < m*n:
		panic(fmt.Sprintf("simd: OnlineSoftmax: len(s)=%d for m=%d n=%d", len(s), m, n))
	case len(lo) < m || len(hi) < m || len(rowMax) < m || len(rowSum) < m || len(alpha) < m:
		panic(fmt.Sprintf("simd: OnlineSoftmax: row slices shorter than m=%d", m))
	}
	for i := range m {
		if lo[i] < 0 || hi[i] > int32(n) {
			panic(fmt.Sprintf("simd: OnlineSoftmax: row %d sees [%d, %d), tile has %d keys", i, lo[i], hi[i], n))
		}
	}
	if m == 0 {
		return
	}
	p.onlineSoftmax(s, m, n, scale, lo, hi, rowMax, rowSum, alpha)
}

// checkGather panics unless every row index r gives w[r*ldw : r*ldw+k].
func checkGather[T float32 | uint16](op string, w []T, rows []int32, ldw, k int) {
	if ldw < 0 || k < 0 {
		panic(fmt.Sprintf("simd: %s: negative ldw=%d or k=%d", op, ldw, k))
	}
	for j, r := range rows {
		if r < 0 || int(r)*ldw+k > len(w) {
			panic(fmt.Sprintf("simd: %s: rows[%d]=%d: w[%d:%d] outside len(w)=%d", op, j, r, int(r)*ldw, int(r)*ldw+k, len(w)))
		}
	}
}

// checkGatherProduct panics unless out holds m rows of n and x m rows of k
// (LinearF32Gather and LinearF16Gather).
func checkGatherProduct(op string, out, x []float32, m, n, k int) {
	if m < 0 || len(out) < m*n || len(x) < m*k {
		panic(fmt.Sprintf("simd: %s: len(out)=%d, len(x)=%d for m=%d n=%d k=%d", op, len(out), len(x), m, n, k))
	}
}

// checkAccumRows panics unless acc holds m rows of k, alpha m values and
// probs m rows of n (AccumRows and its variants).
func checkAccumRows(op string, acc, alpha, probs []float32, m, n, k int) {
	if m < 0 || len(acc) < m*k || len(alpha) < m || len(probs) < m*n {
		panic(fmt.Sprintf("simd: %s: len(acc)=%d, len(alpha)=%d, len(p)=%d for m=%d n=%d k=%d",
			op, len(acc), len(alpha), len(probs), m, n, k))
	}
}

// LinearF32Gather is LinearF32 over the rows of w that rows names:
// out[i*n+j] = Dot(x[i*k:(i+1)*k], w[rows[j]*ldw:][:k]) for i < m, j < n =
// len(rows), bit for bit what LinearF32 gives on those rows copied into a
// dense [n][k] matrix. out must not overlap x or w. It panics if a slice is
// too short or a row falls outside w. Cost: 2*m*n*k flops, each gathered
// row read from cache once per 4 rows of x.
func (p *Impl) LinearF32Gather(out, x, w []float32, rows []int32, ldw, m, k int) {
	checkGatherProduct("LinearF32Gather", out, x, m, len(rows), k)
	checkGather("LinearF32Gather", w, rows, ldw, k)
	if m == 0 || len(rows) == 0 {
		return
	}
	p.linearF32Gather(out, x, w, rows, ldw, m, k)
}

// LinearF16Gather is LinearF32Gather over rows of IEEE-half values (ldw
// in halves): out[i*n+j] = Dot(x[i*k:(i+1)*k], the row w[rows[j]*ldw:][:k]
// widened), bit for bit what LinearF32Gather gives on the rows widened
// into float32 (the widening is exact), without the copy: attention over a
// half K cache read in place. It panics where LinearF32Gather does. Cost:
// 2*m*n*k flops, half the bytes of a float32 row per gathered row.
func (p *Impl) LinearF16Gather(out, x []float32, w []uint16, rows []int32, ldw, m, k int) {
	checkGatherProduct("LinearF16Gather", out, x, m, len(rows), k)
	checkGather("LinearF16Gather", w, rows, ldw, k)
	if m == 0 || len(rows) == 0 {
		return
	}
	p.linearF16Gather(out, x, w, rows, ldw, m, k)
}

// LinearF32KMajor is LinearF32 over a weight stored k-major, with strided
// rows: out[i*ldo+c] = Dot(x[i*ldx:][:k], column c of w) for i < m and c <
// n, where w is [k][n] (w[kk*n+c] is weight kk of column c), bit for bit
// what LinearF32 gives with w transposed into [n][k]. It is the
// absorption of MLA's query into the latent space, q_nope W_UK per head,
// with W_UK as the checkpoint stores it and q_nope read in place from the
// query rows. The SIMD paths run each of the canonical 16 lane sums of a
// dot product as a chain of FMAs with 16 (AVX2: 8) columns in a vector and
// the reduction tree as adds of whole vectors: no horizontal shuffles,
// which at k = 32 cost more than the FMAs. out must not overlap x or w. It
// panics if a slice is too short. Cost: 2*m*n*k flops, one broadcast of x
// per FMA.
func (p *Impl) LinearF32KMajor(out []float32, ldo int, x []float32, ldx int, w []float32, m, n, k int) {
	if m < 0 || n < 0 || k < 0 || ldo < n || ldx < k || len(w) < k*n ||
		(m > 0 && (len(out) < (m-1)*ldo+n || len(x) < (m-1)*ldx+k)) {
		panic(fmt.Sprintf("simd: LinearF32KMajor: len(out)=%d, len(x)=%d, len(w)=%d for m=%d n=%d k=%d ldo=%d ldx=%d",
			len(out), len(x), len(w), m, n, k, ldo, ldx))
	}
	if m == 0 || n == 0 {
		return
	}
	p.linearF32KMajor(out, ldo, x, ldx, w, m, n, k)
}

// AccumRowsPrefetch is AccumRows (the same bits) that also asks for the
// first pfK floats of the rows of w that pfRows names, into L2, spread
// over its key steps on the AVX-512 path (a burst ahead of it on AVX2;
// nothing on the pure-Go path): attention's next latent tile fetched while
// this one's P.V runs from the caches. It panics where AccumRows does or a
// row of pfRows falls outside w. Cost: AccumRows' plus one prefetch per 64
// bytes asked for.
func (p *Impl) AccumRowsPrefetch(acc, alpha, probs, w []float32, rows []int32, ldw, m, k int, pfRows []int32, pfK int) {
	checkAccumRows("AccumRowsPrefetch", acc, alpha, probs, m, len(rows), k)
	checkGather("AccumRowsPrefetch", w, rows, ldw, k)
	checkGather("AccumRowsPrefetch", w, pfRows, ldw, pfK)
	if m == 0 || k == 0 {
		p.PrefetchRows(w, pfRows, ldw, pfK)
		return
	}
	p.accumRowsPF(acc, alpha, probs, w, rows, ldw, m, k, pfRows, pfK)
}

// PrefetchRows asks the cache hierarchy for the first k floats of the rows
// of w that rows names (w[rows[j]*ldw:][:k]), into L2 where the SIMD paths
// run; the pure-Go path does nothing. It computes nothing and never
// faults. Cost: one prefetch instruction per 64 bytes.
func (p *Impl) PrefetchRows(w []float32, rows []int32, ldw, k int) {
	checkGather("PrefetchRows", w, rows, ldw, k)
	if len(rows) == 0 || k == 0 {
		return
	}
	p.prefetchRows(w, rows, ldw, k)
}

// AccumRows adds a probability-weighted sum of gathered rows of w into each
// of m accumulator rows: with n = len(rows), for i < m and c < k,
//
//	pv = sum over j < n of p[i*n+j] * w[rows[j]*ldw + c]
//	acc[i*k+c] = fma(acc[i*k+c], alpha[i], pv)
//
// where pv starts at +0 and takes one fused multiply-add per j in
// increasing j, skipping the j with p[i*n+j] == 0 (an exact no-op
// otherwise, so a row's bits do not depend on trailing or masked keys). It
// is attention's P·V step without transposing V. out must not overlap the
// inputs. It panics if a slice is too short or a row falls outside w. Cost:
// 2*m*n*k flops; each gathered row is read once per 4 rows of acc.
func (p *Impl) AccumRows(acc, alpha, probs, w []float32, rows []int32, ldw, m, k int) {
	checkAccumRows("AccumRows", acc, alpha, probs, m, len(rows), k)
	checkGather("AccumRows", w, rows, ldw, k)
	if m == 0 || k == 0 {
		return
	}
	p.accumRows(acc, alpha, probs, w, rows, ldw, m, k)
}

// AccumRowsF16 is AccumRows over rows of IEEE-half values (ldw in
// halves), each value widened exactly: bit for bit what AccumRows gives on
// the rows widened into float32, without the copy (attention's P·V over a
// half V cache read in place). It panics where AccumRows does. Cost:
// AccumRows' flops, half its bytes per gathered row.
func (p *Impl) AccumRowsF16(acc, alpha, probs []float32, w []uint16, rows []int32, ldw, m, k int) {
	checkAccumRows("AccumRowsF16", acc, alpha, probs, m, len(rows), k)
	checkGather("AccumRowsF16", w, rows, ldw, k)
	if m == 0 || k == 0 {
		return
	}
	p.accumRowsF16(acc, alpha, probs, w, rows, ldw, m, k)
}

// scaleRowsGo is the reference of Impl.ScaleRows.
func scaleRowsGo(dst, x, w []float32, n int, scales [4]float32, rows int) {
	w = w[:n]
	for i, r := range scales[:rows] {
		xi, di := x[i*n:(i+1)*n], dst[i*n:(i+1)*n]
		for j, v := range xi {
			di[j] = (v * r) * w[j]
		}
	}
}

// ScaleRows sets dst[i*n+j] = (x[i*n+j] * scales[i]) * w[j] for rows i <
// rows (at most 4) of n elements of x: RMSNorm's last step, a row times
// its scale, then times the weight, each product rounded, so every path
// gives the same bits. dst may be x. The scales come by value, so that a
// caller's need not live on the heap. It panics if rows is outside [0, 4]
// or a slice is too short. Cost: two multiplies an element, vectorized,
// one call for all the rows.
func (p *Impl) ScaleRows(dst, x, w []float32, n int, scales [4]float32, rows int) {
	if rows < 0 || rows > 4 || n < 0 || len(w) < n || len(x) < rows*n || len(dst) < rows*n {
		panic(fmt.Sprintf("simd: ScaleRows: %d rows of %d: len(dst)=%d, len(x)=%d, len(w)=%d", rows, n, len(dst), len(x), len(w)))
	}
	if n == 0 || rows == 0 {
		return
	}
	p.scaleRows(dst, x, w, n, scales, rows)
}

// siluMulGo is the reference of Impl.SiLUMul.
func siluMulGo(dst, gate, up []float32) {
	dst, up = dst[:len(gate)], up[:len(gate)]
	for i, g := range gate {
		dst[i] = siluGo(g) * up[i]
	}
}

// siluGo is x*sigmoid(x) with e = exp(-|x|) in (0, 1]: x/(1+e) for x >= 0,
// x*e/(1+e) below (so e never overflows); NaN stays NaN.
func siluGo(x float32) float32 {
	e := expGo(-abs32(x))
	num := x
	if x < 0 {
		num = x * e
	}
	return num / (1 + e)
}

// SiLUMul sets dst[i] = silu(gate[i]) * up[i] for i < len(gate), silu(x) =
// x*sigmoid(x) computed as siluGo: Exp's e^-|x|, then one division, so
// within a few ulp of the exact value for every x, with no overflow for
// large |x|. It panics if dst or up is shorter than gate. Cost: one Exp, a
// division and two multiplies per element, vectorized.
func (p *Impl) SiLUMul(dst, gate, up []float32) {
	if len(dst) < len(gate) || len(up) < len(gate) {
		panic(fmt.Sprintf("simd: SiLUMul: len(dst)=%d, len(up)=%d < len(gate)=%d", len(dst), len(up), len(gate)))
	}
	p.siluMul(dst, gate, up)
}

// Exp runs Default().Exp.
func Exp(dst, src []float32) { defaultImpl.Exp(dst, src) }
