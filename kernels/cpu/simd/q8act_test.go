package simd

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// The references below transcribe llama.cpp's scalar formulas statement by
// statement (quantize_row_q8_K_ref and the ggml_vec_dot_*_generic
// functions: scales unpacked through the utmp words, weights expanded into
// aux8, products through aux16 into aux32). Each float32 multiply-add that
// the C compiler contracts into a fused one in the shipped libraries is
// written as fma32. The K-quant dot products keep the generic integers and
// apply the block's scales once, to their sum (dotKQ8K).

func refQuantQ8K(x []float32) []byte {
	y := make([]byte, len(x)/256*Q8KBlockBytes)
	for i := 0; i < len(x)/256; i++ {
		xb, yb := x[256*i:256*i+256], y[Q8KBlockBytes*i:]
		var mx, amax float32
		for j := range 256 {
			ax := float32(math.Abs(float64(xb[j])))
			if ax > amax {
				amax = ax
				mx = xb[j]
			}
		}
		if amax == 0 {
			continue
		}
		iscale := float32(-127.0) / mx
		for j := range 256 {
			v := nearestInt(iscale * xb[j])
			if v > 127 {
				v = 127
			}
			yb[4+j] = byte(int8(v))
		}
		for j := range 16 {
			sum := 0
			for ii := range 16 {
				sum += int(int8(yb[4+16*j+ii]))
			}
			binary.LittleEndian.PutUint16(yb[260+2*j:], uint16(int16(sum)))
		}
		binary.LittleEndian.PutUint32(yb, math.Float32bits(1/iscale))
	}
	return y
}

func refHalf(b []byte) float32 { return f16ToF32(binary.LittleEndian.Uint16(b)) }

func refDot(t QuantType, k int, w, a []byte) float32 {
	var sumf float32
	switch t {
	case QuantQ8_0:
		for ib := 0; ib < k/32; ib++ {
			x, y := w[34*ib:], a[34*ib:]
			sumi := 0
			for j := range 32 {
				sumi += int(int8(x[2+j])) * int(int8(y[2+j]))
			}
			sumf = fma32(float32(sumi), refHalf(x)*refHalf(y), sumf)
		}
		return sumf
	case QuantQ4_0:
		for ib := 0; ib < k/32; ib++ {
			x, y := w[18*ib:], a[34*ib:]
			sumi0, sumi1 := 0, 0
			for j := range 16 {
				v0 := int(x[2+j]&0x0f) - 8
				v1 := int(x[2+j]>>4) - 8
				sumi0 += v0 * int(int8(y[2+j]))
				sumi1 += v1 * int(int8(y[2+j+16]))
			}
			sumf = fma32(float32(sumi0+sumi1)*refHalf(x), refHalf(y), sumf)
		}
		return sumf
	}
	bb := t.BlockBytes()
	for i := 0; i < k/256; i++ {
		x, y := w[bb*i:bb*(i+1)], a[Q8KBlockBytes*i:]
		yd := math.Float32frombits(binary.LittleEndian.Uint32(y))
		q8 := y[4:260]
		bsum := func(j int) int { return int(int16(binary.LittleEndian.Uint16(y[260+2*j:]))) }
		var aux8 [256]int8
		var scales [16]int
		var mins [8]int
		var d, dmin float32
		switch t {
		case QuantQ4_K, QuantQ5_K:
			d, dmin = refHalf(x), refHalf(x[2:])
			var utmp [4]uint32
			for u := range 3 {
				utmp[u] = binary.LittleEndian.Uint32(x[4+4*u:])
			}
			const kmask1, kmask2, kmask3 = 0x3f3f3f3f, 0x0f0f0f0f, 0x03030303
			utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4)
			uaux := utmp[1] & kmask1
			utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4)
			utmp[2] = uaux
			utmp[0] &= kmask1
			for j := range 8 {
				sc := int(byte(utmp[j/4] >> (8 * (j % 4))))
				scales[2*j], scales[2*j+1] = sc, sc // one scale per 32: two groups of 16
				mins[j] = int(byte(utmp[2+j/4] >> (8 * (j % 4))))
			}
			var qs, qh []byte
			if t == QuantQ4_K {
				qs = x[16:144]
			} else {
				qh, qs = x[16:48], x[48:176]
			}
			a, m := 0, byte(1)
			for j := range 4 {
				for l := range 32 {
					aux8[a+l] = int8(qs[32*j+l] & 0xf)
					if qh != nil && qh[l]&m != 0 {
						aux8[a+l] += 16
					}
				}
				a += 32
				m <<= 1
				for l := range 32 {
					aux8[a+l] = int8(qs[32*j+l] >> 4)
					if qh != nil && qh[l]&m != 0 {
						aux8[a+l] += 16
					}
				}
				a += 32
				m <<= 1
			}
		case QuantQ6_K:
			d = refHalf(x[208:])
			for j := range 16 {
				scales[j] = int(int8(x[192+j]))
			}
			for h := range 2 {
				ql, qh := x[64*h:], x[128+32*h:]
				for l := range 32 {
					aux8[128*h+l] = int8(ql[l]&0xf|((qh[l]>>0)&3)<<4) - 32
					aux8[128*h+l+32] = int8(ql[l+32]&0xf|((qh[l]>>2)&3)<<4) - 32
					aux8[128*h+l+64] = int8(ql[l]>>4|((qh[l]>>4)&3)<<4) - 32
					aux8[128*h+l+96] = int8(ql[l+32]>>4|((qh[l]>>6)&3)<<4) - 32
				}
			}
		}
		sumi := 0
		if t != QuantQ6_K {
			for j := range 16 {
				sumi += bsum(j) * mins[j/2]
			}
		}
		var aux32 [8]int32
		for g := range 32 { // 8 values at a time, 16 per scale
			scale := int32(scales[g/2])
			var aux16 [8]int16
			for l := range 8 {
				aux16[l] = int16(int8(q8[8*g+l])) * int16(aux8[8*g+l])
			}
			for l := range 8 {
				aux32[l] += scale * int32(aux16[l])
			}
		}
		// The engine's float step (dotKQ8K): the lanes' integers summed,
		// then one multiply-add per block; the generic code's is
		// sums[l] = fma(dd, aux32[l], sums[l]) and sumf += sums[0..7] at
		// the end.
		isum := int32(0)
		for l := range 8 {
			isum += aux32[l]
		}
		dd := d * yd
		sumf = fma32(dd, float32(isum), sumf)
		if t != QuantQ6_K {
			dm := dmin * yd
			sumf = fma32(-dm, float32(sumi), sumf)
		}
	}
	return sumf
}

// actDists are activation rows of different shapes: normal, heavy-tailed
// (a few large values dominate each block), sparse, a block of zeros, and
// one with the same magnitude everywhere (ties for the largest value).
var actDists = map[string]func(r *rand.Rand, i int) float32{
	"normal": func(r *rand.Rand, i int) float32 { return float32(r.NormFloat64()) },
	"heavy":  func(r *rand.Rand, i int) float32 { return float32(r.NormFloat64() * math.Exp(2*r.NormFloat64())) },
	"sparse": func(r *rand.Rand, i int) float32 {
		if r.IntN(6) == 0 {
			return float32(r.NormFloat64())
		}
		return 0
	},
	"zeroblock": func(r *rand.Rand, i int) float32 {
		if i < 256 {
			return 0
		}
		return float32(r.NormFloat64())
	},
	"ties": func(r *rand.Rand, i int) float32 { return float32(1 - 2*(i%2)) },
}

// edgeDists are activation rows the SIMD quantizers hand to the scalar
// code or must round as it does: NaNs, infinities, subnormals, negative
// zeros and values near float32's largest.
var edgeDists = map[string]func(r *rand.Rand, i int) float32{
	"nan": func(r *rand.Rand, i int) float32 {
		return [...]float32{float32(r.NormFloat64()), float32(math.NaN())}[min(1, i%97)^1]
	},
	"allnan": func(r *rand.Rand, i int) float32 { return float32(math.NaN()) },
	"inf": func(r *rand.Rand, i int) float32 {
		return [...]float32{float32(r.NormFloat64()), float32(math.Inf(-1))}[min(1, i%131)^1]
	},
	"subnormal": func(r *rand.Rand, i int) float32 { return float32(r.NormFloat64()) * 1e-39 },
	"negzero":   func(r *rand.Rand, i int) float32 { return float32(math.Copysign(0, -1)) },
	"huge":      func(r *rand.Rand, i int) float32 { return float32(r.NormFloat64()) * 3e38 },
}

// randWeightRows returns n rows of k weights of type t: quantized random
// values, and for the K-quants also raw random bytes with moderate scales
// (every 6-bit scale, min and code pattern).
func randWeightRows(r *rand.Rand, t QuantType, n, k int, raw bool) []byte {
	rb, _ := t.RowBytes(k)
	w := make([]byte, n*rb)
	if !raw {
		x := make([]float32, n*k)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 0.05)
		}
		t.Quantize(w, x)
		return w
	}
	for i := range w {
		w[i] = byte(r.Uint32())
	}
	bb := t.BlockBytes()
	for b := 0; b < len(w)/bb; b++ {
		blk := w[b*bb : (b+1)*bb]
		s := F32ToF16(float32(r.Float64()*0.01 + 1e-4))
		switch t {
		case QuantQ6_K:
			binary.LittleEndian.PutUint16(blk[208:], s)
		case QuantQ4_K, QuantQ5_K:
			binary.LittleEndian.PutUint16(blk, s)
			binary.LittleEndian.PutUint16(blk[2:], F32ToF16(float32(r.Float64()*0.01)))
		default:
			binary.LittleEndian.PutUint16(blk, s)
		}
	}
	return w
}

// TestQuantizeQ8K: the Q8_K activation blocks of QuantizeQ8K (the SIMD
// path of the default Impl) and of each path alone (the pure-Go one and
// every native one) are those of the transcribed quantize_row_q8_K_ref,
// byte for byte, and decode back to within half a step of the input.
// Blocks with NaNs, infinities, subnormals and values beyond nearest_int's
// range give the scalar code's bytes too.
func TestQuantizeQ8K(t *testing.T) {
	const k = 1024
	paths := map[string]func(dst []byte, src []float32){
		"QuantizeQ8K": func(dst []byte, src []float32) {
			if n := QuantizeQ8K(dst, src); n != len(dst) {
				t.Fatalf("wrote %d bytes, want %d", n, len(dst))
			}
		},
		"go": func(dst []byte, src []float32) { quantizeQ8KGo(dst, src) },
	}
	for name, f := range nativeQuantizeQ8K {
		paths[name] = f
	}
	for _, p := range Impls() {
		paths[p.Name()+"/QuantizeActs"] = func(dst []byte, src []float32) { p.QuantizeActs(dst, src, QuantQ4_K, 1, len(src)) }
	}
	edges := edgeDists
	for pname, f := range paths {
		for _, dists := range []map[string]func(r *rand.Rand, i int) float32{actDists, edges} {
			for name, dist := range dists {
				_, edge := edges[name]
				r := rand.New(rand.NewPCG(1, uint64(len(name))))
				for range 20 {
					x := make([]float32, k)
					for i := range x {
						x[i] = dist(r, i)
					}
					got := make([]byte, k/256*Q8KBlockBytes)
					f(got, x)
					want := refQuantQ8K(x)
					for i := range got {
						if got[i] != want[i] {
							t.Fatalf("%s %s: byte %d = %#x, reference %#x", pname, name, i, got[i], want[i])
						}
					}
					if edge {
						continue
					}
					for b := range k / 256 {
						blk := got[b*Q8KBlockBytes:]
						d := math.Float32frombits(binary.LittleEndian.Uint32(blk))
						for j := range 256 {
							v := d * float32(int8(blk[4+j]))
							if diff := math.Abs(float64(v - x[256*b+j])); diff > 0.5001*math.Abs(float64(d)) {
								t.Fatalf("%s %s: block %d value %d: %g decodes to %g (d %g)", pname, name, b, j, x[256*b+j], v, d)
							}
						}
					}
				}
			}
		}
	}
	// Every native Impl of an amd64 cgo build has one.
	for _, p := range Impls() {
		if _, ok := nativeQuantizeQ8K[p.Name()]; !ok && len(nativeQuantLlama) > 0 && p.Name() != "go" {
			t.Errorf("%s: no native QuantizeQ8K", p.Name())
		}
	}
}

// TestLinearQuantLlama: every output of LinearQuantLlama is the
// transcribed generic dot product of its weight row and activation row,
// bit for bit, on every Impl, whatever the number of rows (the SIMD tiles
// of 1 to 4 rows and their remainders) and the column range (tiles of 4
// or 8 weight rows and partial ones; the repacked tiles of 16).
func TestLinearQuantLlama(t *testing.T) {
	// From 16 rows on the AVX-512 VNNI path repacks 16 weight rows at a time.
	// k = 96 and 352 are odd numbers of 32-weight blocks (the VNNI decode
	// tile's last block alone; Q8_0/Q4_0 only), 40 weight rows let one row
	// prefetch tiles ahead.
	// The AVX2 repacked tiles take 16 weight rows and four activation rows
	// a step, then the last one to three rows together (17, 18 and 23
	// rows).
	shapes := []struct{ m, n, k int }{{5, 9, 512}, {17, 19, 512}, {1, 17, 256}, {2, 3, 768}, {3, 8, 256},
		{9, 13, 256}, {4, 1, 512}, {16, 33, 256}, {3, 27, 96}, {1, 40, 352}, {18, 35, 256}, {23, 16, 96}}
	if raceEnabled {
		shapes = shapes[:2]
	}
	for _, p := range Impls() {
		for _, sh := range shapes {
			m, n, k := sh.m, sh.n, sh.k
			for _, typ := range QuantTypes {
				if k%typ.BlockSize() != 0 {
					continue
				}
				for _, raw := range []bool{false, true} {
					if raw && typ.BlockSize() != 256 {
						continue
					}
					for name, dist := range actDists {
						r := rand.New(rand.NewPCG(uint64(typ), uint64(len(name)+n)))
						w := randWeightRows(r, typ, n, k, raw)
						out, a, ab, rb := runQuantLlama(p, typ, w, func(i int) float32 { return dist(r, i%k) }, m, n, k)
						j0, j1 := min(2, n), min(7, n)
						part := make([]float32, n)
						for i := range m {
							// One row, a column range: the same bits.
							for j := range part {
								part[j] = float32(math.NaN())
							}
							p.LinearQuantLlama(part, a[i*ab:(i+1)*ab], w, typ, 1, n, k, j0, j1)
							for j := range n {
								want := refDot(typ, k, w[j*rb:(j+1)*rb], a[i*ab:(i+1)*ab])
								if got := out[i*n+j]; math.Float32bits(got) != math.Float32bits(want) {
									t.Fatalf("%s %dx%dx%d %s raw=%v %s: out[%d,%d] = %g, reference %g",
										p.Name(), m, n, k, typ, raw, name, i, j, got, want)
								}
								if j >= j0 && j < j1 && math.Float32bits(part[j]) != math.Float32bits(want) {
									t.Fatalf("%s %s %s: row %d alone, column %d = %g, in the batch %g", p.Name(), typ, name, i, j, part[j], want)
								}
								if (j < j0 || j >= j1) && !math.IsNaN(float64(part[j])) {
									t.Fatalf("%s %s %s: column %d outside [%d, %d) written", p.Name(), typ, name, j, j0, j1)
								}
							}
						}
					}
				}
			}
		}
	}
}

// runQuantLlama rounds m rows of k activations (x(i) the i-th value) for
// typ and multiplies them by the n weight rows w on p: the outputs, the
// rounded rows and the activation and weight row bytes.
func runQuantLlama(p *Impl, typ QuantType, w []byte, x func(i int) float32, m, n, k int) (out []float32, a []byte, ab, rb int) {
	xs := make([]float32, m*k)
	for i := range xs {
		xs[i] = x(i)
	}
	ab, _ = ActRowBytes(typ, k)
	a = make([]byte, m*ab)
	QuantizeActs(a, xs, typ, m, k)
	rb, _ = typ.RowBytes(k)
	out = make([]float32, m*n)
	p.LinearQuantLlama(out, a, w, typ, m, n, k, 0, n)
	return out, a, ab, rb
}

// TestLinearQuantLlamaLargestCodes: Q4_K, Q5_K and Q6_K rows whose codes
// (and Q4_K/Q5_K scales and mins) are all at their largest, and Q8_0 and
// Q4_0 rows whose weights are all -128 and -8 (a Q8_0 file may hold -128,
// which llama.cpp's quantizer never writes), against activations that all
// round to -127 (the "ones" rows: every product of a block of one sign),
// put the kernels' integer sums at the ends of their range (the AVX2
// prefill step's int16 sums of four Q4_K/Q5_K quads, 31496, or two Q6_K
// quads, 32004; the AVX2 decode tiles' vpmaddubsw pairs of Q8_0 products,
// 2*128*127); the outputs stay vecDotLlama's bit for bit.
func TestLinearQuantLlamaLargestCodes(t *testing.T) {
	const n, k = 19, 512
	dists := map[string]func(r *rand.Rand, i int) float32{
		"normal": actDists["normal"],
		"ties":   actDists["ties"],
		"ones":   func(r *rand.Rand, i int) float32 { return 1 },
	}
	for _, p := range Impls() {
		for _, typ := range []QuantType{QuantQ4_K, QuantQ5_K, QuantQ6_K, QuantQ8_0, QuantQ4_0} {
			for _, m := range []int{3, 16, 19} { // 16 and 19 rows: the repacked tiles, four rows a step and the rest
				for acts, dist := range dists {
					r := rand.New(rand.NewPCG(uint64(typ), uint64(m)))
					w := randWeightRows(r, typ, n, k, true)
					bb := typ.BlockBytes()
					lo, hi, code := 4, bb, byte(0xFF) // Q4_K/Q5_K: past d and dmin (scales, mins, (qh,) qs)
					switch typ {
					case QuantQ6_K:
						lo, hi = 0, 208 // ql, qh, scales (-1 each), not d
					case QuantQ8_0:
						code = 0x80 // -128
						lo = 2      // past d
					case QuantQ4_0:
						code = 0x00 // both nibbles 0: -8
						lo = 2
					}
					for b := 0; b < len(w)/bb; b++ {
						for i := lo; i < hi; i++ {
							w[b*bb+i] = code
						}
					}
					out, a, ab, rb := runQuantLlama(p, typ, w, func(i int) float32 { return dist(r, i%k) }, m, n, k)
					for i := range m {
						for j := range n {
							want := refDot(typ, k, w[j*rb:(j+1)*rb], a[i*ab:(i+1)*ab])
							if got := out[i*n+j]; math.Float32bits(got) != math.Float32bits(want) {
								t.Fatalf("%s %s m=%d %s: out[%d,%d] = %g, reference %g", p.Name(), typ, m, acts, i, j, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// TestLinearQuantLlamaAccuracy: rounding the activations costs about 2^-8
// of each product, so results stay close to LinearQuant's float32 ones.
func TestLinearQuantLlamaAccuracy(t *testing.T) {
	const m, n, k = 3, 16, 1024
	r := rand.New(rand.NewPCG(3, 4))
	for _, typ := range QuantTypes {
		w := randWeightRows(r, typ, n, k, false)
		x := make([]float32, m*k)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		ab, _ := ActRowBytes(typ, k)
		a := make([]byte, m*ab)
		QuantizeActs(a, x, typ, m, k)
		got, want := make([]float32, m*n), make([]float32, m*n)
		LinearQuantLlama(got, a, w, typ, m, n, k, 0, n)
		LinearQuant(want, x, w, typ, m, n, k, 0, n)
		var num, den float64
		for i := range got {
			num += float64(got[i]-want[i]) * float64(got[i]-want[i])
			den += float64(want[i]) * float64(want[i])
		}
		if rel := math.Sqrt(num / den); rel > 0.02 || rel == 0 {
			t.Errorf("%s: relative RMS difference from the float32 product %.3g, want in (0, 0.02]", typ, rel)
		}
	}
}

// TestLinear16Llama: x rounded to the weights' 16-bit type, exact
// products summed in float64 and rounded once; one row alone gives the
// same bits as in a batch.
func TestLinear16Llama(t *testing.T) {
	// Below 4 rows the AVX-512 path transposes in registers (m = 1, 2, 3).
	shapes := []struct{ m, n, k int }{{4, 6, 300}, {5, 19, 37}, {1, 16, 64}, {9, 33, 24}, {2, 21, 45}, {3, 50, 19}}
	r := rand.New(rand.NewPCG(5, 6))
	for _, sh := range shapes {
		m, n, k := sh.m, sh.n, sh.k
		for _, bf16 := range []bool{true, false} {
			x := make([]float32, m*k)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			wf := make([]float32, n*k)
			for i := range wf {
				wf[i] = float32(r.NormFloat64() * 0.1)
			}
			xh, w := make([]uint16, m*k), make([]uint16, n*k)
			widen := f16ToF32
			if bf16 {
				RoundBF16(xh, x)
				RoundBF16(w, wf)
				widen = bf16ToF32
			} else {
				RoundF16(xh, x)
				RoundF16(w, wf)
			}
			for i, h := range xh {
				if bf16 && h != f32ToBF16(x[i]) || !bf16 && h != F32ToF16(x[i]) {
					t.Fatalf("bf16=%v: x[%d] = %g rounded to %#x", bf16, i, x[i], h)
				}
			}
			for _, p := range Impls() {
				out := make([]float32, m*n)
				p.Linear16Llama(out, xh, w, bf16, m, n, k, 0, n)
				one := make([]float32, n)
				for i := range m {
					p.Linear16Llama(one, xh[i*k:(i+1)*k], w, bf16, 1, n, k, 1, n)
					for j := range n {
						var s float64
						for kk := range k {
							s += float64(widen(xh[i*k+kk])) * float64(widen(w[j*k+kk]))
						}
						if got := out[i*n+j]; got != float32(s) {
							t.Fatalf("%s %dx%dx%d bf16=%v: out[%d,%d] = %g, want %g", p.Name(), m, n, k, bf16, i, j, got, float32(s))
						}
						if j >= 1 && one[j] != out[i*n+j] {
							t.Fatalf("%s bf16=%v: row %d alone, column %d = %g, in the batch %g", p.Name(), bf16, i, j, one[j], out[i*n+j])
						}
					}
				}
			}
		}
	}
	// bfloat16 products that overflow or underflow float32 (Inf, NaN,
	// zeros): every Impl gives the pure-Go bits.
	const m, n, k = 3, 17, 40
	xh, w := make([]uint16, m*k), make([]uint16, n*k)
	vals := []float32{3e30, -3e30, 1e-30, 0, float32(math.Inf(1)), 1, -2.5}
	for i := range xh {
		xh[i] = f32ToBF16(vals[r.IntN(len(vals))])
	}
	for i := range w {
		w[i] = f32ToBF16(vals[r.IntN(len(vals))] * float32(r.NormFloat64()))
	}
	want := make([]float32, m*n)
	goImpl.Linear16Llama(want, xh, w, true, m, n, k, 0, n)
	for _, p := range Impls() {
		got := make([]float32, m*n)
		p.Linear16Llama(got, xh, w, true, m, n, k, 0, n)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
				t.Fatalf("%s: extreme values: out[%d] = %g, pure Go %g", p.Name(), i, got[i], want[i])
			}
		}
	}
}

// TestQuantizeQ8_0Acts: the activations' Q8_0 quantization on every SIMD
// path gives QuantQ8_0.Quantize's bytes (llama.cpp's
// quantize_row_q8_0_ref): random rows, rows whose products land on ties
// (amax 127, so that id is 1 and x.5 rounds away from zero), and rows with
// NaNs, infinities, subnormals, zeros and huge values, which the SIMD
// paths hand to the Go code block by block.
func TestQuantizeQ8_0Acts(t *testing.T) {
	const k = 1024
	paths := map[string]func(dst []byte, src []float32){}
	for _, p := range Impls() {
		paths[p.Name()+"/QuantizeActs"] = func(dst []byte, src []float32) { p.QuantizeActs(dst, src, QuantQ8_0, 1, len(src)) }
	}
	for name, f := range nativeQuantizeQ8_0 {
		paths[name] = func(dst []byte, src []float32) { quantizeQ8_0With(f, dst, src) }
	}
	dists := map[string]func(r *rand.Rand, i int) float32{
		"ties": func(r *rand.Rand, i int) float32 {
			if i%32 == 0 {
				return 127
			}
			return float32(r.IntN(254)-127) + 0.5
		},
	}
	for _, ds := range []map[string]func(r *rand.Rand, i int) float32{actDists, edgeDists} {
		for name, dist := range ds {
			dists[name] = dist
		}
	}
	for pname, f := range paths {
		for name, dist := range dists {
			r := rand.New(rand.NewPCG(2, uint64(len(name))))
			for range 20 {
				x := make([]float32, k)
				for i := range x {
					x[i] = dist(r, i)
				}
				got, want := make([]byte, k/32*34), make([]byte, k/32*34)
				f(got, x)
				QuantQ8_0.Quantize(want, x)
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("%s %s: byte %d (block %d) = %#x, reference %#x", pname, name, i, i/34, got[i], want[i])
					}
				}
			}
		}
	}
	// Every native Impl of an amd64 cgo build has one.
	for _, p := range Impls() {
		if _, ok := nativeQuantizeQ8_0[p.Name()]; !ok && len(nativeQuantLlama) > 0 && p.Name() != "go" {
			t.Errorf("%s: no native Q8_0 activation quantization", p.Name())
		}
	}
}

// TestRoundBF16Native: every SIMD path of RoundBF16, and every Impl's
// RoundBF16 (its own path), gives the Go loop's bits for any float32 bits
// (NaNs of either sign and payload, infinities, subnormals, ties both ways,
// the largest finite values that round up to infinity), at every length of
// a vector step and its tail.
func TestRoundBF16Native(t *testing.T) {
	edges := []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7f800001, 0x7fc00000, 0xffffffff, 0x7fffffff,
		0x00000001, 0x807fffff, 0x3f808000, 0x3f818000, 0x3f807fff, 0x7f7fffff, 0xff7f8000, 0x7f7f7fff}
	r := rand.New(rand.NewPCG(5, 6))
	src := make([]float32, 4099)
	for i := range src {
		if i < len(edges) {
			src[i] = math.Float32frombits(edges[i])
		} else {
			src[i] = math.Float32frombits(r.Uint32())
		}
	}
	want := make([]uint16, len(src))
	roundBF16Go(want, src)
	paths := map[string]func(dst []uint16, src []float32){}
	for name, f := range nativeRoundBF16 {
		paths[name] = f
	}
	for _, p := range Impls() {
		paths[p.Name()+"/RoundBF16"] = p.RoundBF16
	}
	for name, f := range paths {
		for _, n := range []int{1, 7, 15, 16, 17, 31, 33, len(src) - 3} {
			for _, off := range []int{0, 3} {
				got := make([]uint16, n)
				f(got, src[off:off+n])
				for i := range got {
					if got[i] != want[off+i] {
						t.Fatalf("%s n=%d off=%d: value %d (bits %#08x) -> %#04x, want %#04x",
							name, n, off, i, math.Float32bits(src[off+i]), got[i], want[off+i])
					}
				}
			}
		}
	}
}
