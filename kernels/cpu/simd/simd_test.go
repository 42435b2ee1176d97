package simd

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// dtype runs one Linear* variant on weights generated from float32 values.
type dtype struct {
	name string
	// weights returns w (in the dtype) and the exact float32 values it holds.
	weights func(r *rand.Rand, num int) (w any, wf []float32)
	linear  func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int)
}

var dtypes = []dtype{
	{
		name: "f32",
		weights: func(r *rand.Rand, num int) (any, []float32) {
			w := randVec(r, num)
			return w, w
		},
		linear: func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
			p.LinearF32(out, x, w.([]float32), m, n, k, j0, j1)
		},
	},
	{
		name: "bf16",
		weights: func(r *rand.Rand, num int) (any, []float32) {
			w := make([]uint16, num)
			wf := make([]float32, num)
			for i := range w {
				w[i] = f32ToBF16(float32(r.NormFloat64()))
				wf[i] = bf16ToF32(w[i])
			}
			return w, wf
		},
		linear: func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
			p.LinearBF16(out, x, w.([]uint16), m, n, k, j0, j1)
		},
	},
	{
		name: "f16",
		weights: func(r *rand.Rand, num int) (any, []float32) {
			w := make([]uint16, num)
			wf := make([]float32, num)
			for i := range w {
				// sign, exponent 0..29 (subnormals to ~2^14), any mantissa
				w[i] = uint16(r.IntN(2))<<15 | uint16(r.IntN(30))<<10 | uint16(r.IntN(1024))
				wf[i] = f16ToF32(w[i])
			}
			return w, wf
		},
		linear: func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
			p.LinearF16(out, x, w.([]uint16), m, n, k, j0, j1)
		},
	},
}

func randVec(r *rand.Rand, num int) []float32 {
	v := make([]float32, num)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// sentinel marks output cells a kernel must not write.
var sentinel = math.Float32frombits(0x7fc0dead)

func filled(num int) []float32 {
	out := make([]float32, num)
	for i := range out {
		out[i] = sentinel
	}
	return out
}

// checkUntouched fails unless out holds the sentinel outside columns [j0,j1).
func checkUntouched(t *testing.T, out []float32, m, n, j0, j1 int) {
	t.Helper()
	for i := range m {
		for j := range n {
			if (j < j0 || j >= j1) && math.Float32bits(out[i*n+j]) != 0x7fc0dead {
				t.Fatalf("out[%d][%d] written outside column range [%d,%d)", i, j, j0, j1)
			}
		}
	}
}

var linearShapes = []struct{ m, n, k int }{
	{1, 1, 1}, {1, 1, 0}, {1, 1, 17}, {1, 5, 15}, {2, 3, 16}, {3, 7, 31},
	{4, 9, 33}, {5, 17, 100}, {7, 33, 64}, {8, 20, 257}, {9, 5, 48},
	{13, 19, 130}, {17, 37, 200}, {64, 24, 96}, {70, 12, 1000},
	// k past the L1 chunk of the SIMD tiles (AVX-512: 1024 f32, 1280
	// bf16/f16 for the 6 x 4 tiles of 6 rows and more, 1024/1360 for 4
	// rows, 816..910 for 1-2 rows), n past a group of tiles (8 tiles of 4
	// columns, 16 of 4 or 8).
	{9, 70, 2100}, {2, 140, 1700}, {1, 20, 4111}, {6, 67, 1373},
}

// TestLinearMatchesReference checks every implementation and dtype against a
// float64 product (within rounding) and against the pure-Go path (bit for bit).
func TestLinearMatchesReference(t *testing.T) {
	for _, p := range Impls() {
		for _, dt := range dtypes {
			for _, sh := range linearShapes {
				t.Run(fmt.Sprintf("%s/%s/m%d_n%d_k%d", p, dt.name, sh.m, sh.n, sh.k), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(sh.m*1000+sh.n), uint64(sh.k)))
					m, n, k := sh.m, sh.n, sh.k
					x := randVec(r, m*k)
					w, wf := dt.weights(r, n*k)
					out := filled(m * n)
					dt.linear(p, out, x, w, m, n, k, 0, n)
					ref := filled(m * n)
					dt.linear(goImpl, ref, x, w, m, n, k, 0, n)
					for i := range m {
						for j := range n {
							var exact, mag float64
							for kk := range k {
								v := float64(x[i*k+kk]) * float64(wf[j*k+kk])
								exact += v
								mag += math.Abs(v)
							}
							got := out[i*n+j]
							if math.Abs(float64(got)-exact) > 2e-6*mag*math.Sqrt(float64(k)+1)+1e-30 {
								t.Fatalf("out[%d][%d] = %g, exact %g (sum |x*w| %g)", i, j, got, exact, mag)
							}
							if !sameBits(got, ref[i*n+j]) {
								t.Fatalf("out[%d][%d] = %g (%#08x), go path %g (%#08x)", i, j,
									got, math.Float32bits(got), ref[i*n+j], math.Float32bits(ref[i*n+j]))
							}
						}
					}
				})
			}
		}
	}
}

// TestLinearBatchInvariance checks that a row's outputs are the same bits
// whatever the batch size, the neighbouring rows and the column split.
func TestLinearBatchInvariance(t *testing.T) {
	const n = 40
	// k = 1500 runs m > 4 through the k-chunked SIMD loop, m <= 4 through
	// the streaming one.
	for _, k := range []int{77, 1500} {
		for _, p := range Impls() {
			for _, dt := range dtypes {
				testBatchInvariance(t, p, dt, n, k)
			}
		}
	}
}

func testBatchInvariance(t *testing.T, p *Impl, dt dtype, n, k int) {
	t.Run(fmt.Sprintf("%s/%s/k%d", p, dt.name, k), func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		w, _ := dt.weights(r, n*k)
		x64 := randVec(r, 64*k)
		full := filled(64 * n)
		dt.linear(p, full, x64, w, 64, n, k, 0, n)
		check := func(what string, got []float32, row int) {
			t.Helper()
			for j := range n {
				if !sameBits(got[j], full[row*n+j]) {
					t.Fatalf("%s: row %d col %d = %#08x, m=64 gave %#08x", what, row, j,
						math.Float32bits(got[j]), math.Float32bits(full[row*n+j]))
				}
			}
		}
		// m=1, one row at a time.
		for i := range 64 {
			out := filled(n)
			dt.linear(p, out, x64[i*k:(i+1)*k], w, 1, n, k, 0, n)
			check("m=1", out, i)
		}
		// m=7 and m=5: the same rows among fresh neighbours, at every position.
		for _, mm := range []int{5, 7, 8, 9} {
			for pos := range mm {
				row := (pos*13 + mm) % 64
				x := randVec(r, mm*k)
				copy(x[pos*k:], x64[row*k:(row+1)*k])
				out := filled(mm * n)
				dt.linear(p, out, x, w, mm, n, k, 0, n)
				check(fmt.Sprintf("m=%d pos %d", mm, pos), out[pos*n:(pos+1)*n], row)
			}
		}
		// Column splits of the m=64 product.
		for _, cuts := range [][]int{{0, 1, n}, {0, 16, 32, n}, {0, 3, 4, 21, 39, n}, {0, 17, n}} {
			out := filled(64 * n)
			for c := 0; c+1 < len(cuts); c++ {
				dt.linear(p, out, x64, w, 64, n, k, cuts[c], cuts[c+1])
			}
			for i := range 64 {
				check(fmt.Sprintf("split %v", cuts), out[i*n:(i+1)*n], i)
			}
		}
	})
}

// TestLinearColumnRange checks that columns outside [j0,j1) stay untouched.
func TestLinearColumnRange(t *testing.T) {
	ranges := []struct{ m, n, k, j0, j1 int }{
		{1, 10, 20, 0, 0}, {1, 10, 20, 3, 4}, {1, 40, 33, 5, 37}, {3, 40, 16, 0, 1},
		{6, 40, 50, 39, 40}, {9, 33, 64, 1, 32}, {64, 20, 17, 7, 19},
	}
	for _, p := range Impls() {
		for _, dt := range dtypes {
			for _, rg := range ranges {
				t.Run(fmt.Sprintf("%s/%s/m%d_n%d_k%d_[%d,%d)", p, dt.name, rg.m, rg.n, rg.k, rg.j0, rg.j1), func(t *testing.T) {
					r := rand.New(rand.NewPCG(11, uint64(rg.j0)))
					x := randVec(r, rg.m*rg.k)
					w, _ := dt.weights(r, rg.n*rg.k)
					out := filled(rg.m * rg.n)
					dt.linear(p, out, x, w, rg.m, rg.n, rg.k, rg.j0, rg.j1)
					checkUntouched(t, out, rg.m, rg.n, rg.j0, rg.j1)
					for i := range rg.m {
						for j := rg.j0; j < rg.j1; j++ {
							if math.Float32bits(out[i*rg.n+j]) == 0x7fc0dead {
								t.Fatalf("out[%d][%d] not written", i, j)
							}
						}
					}
				})
			}
		}
	}
}

func TestLinearSpecialValues(t *testing.T) {
	const m, n, k = 3, 5, 40
	inf := float32(math.Inf(1))
	for _, p := range Impls() {
		t.Run(p.name, func(t *testing.T) {
			x := make([]float32, m*k)
			w := make([]float32, n*k)
			for i := range x {
				x[i] = 1
			}
			for i := range w {
				w[i] = 0.5
			}
			x[0*k+3] = inf                      // row 0: +Inf against positive weights
			x[1*k+20] = float32(math.NaN())     // row 1: NaN
			w[2*k+39] = -inf                    // column 2: -Inf, tail lane
			w[3*k+0], w[3*k+16] = 3e38, 3e38    // column 3: lane 0 overflows to +Inf
			w[4*k+1], w[4*k+17] = 1e-45, -1e-45 // column 4: subnormals
			out := filled(m * n)
			p.LinearF32(out, x, w, m, n, k, 0, n)
			ref := filled(m * n)
			goImpl.LinearF32(ref, x, w, m, n, k, 0, n)
			for i := range out {
				if !sameBits(out[i], ref[i]) {
					t.Fatalf("out[%d] = %g, go path %g", i, out[i], ref[i])
				}
			}
			if !math.IsInf(float64(out[0]), 1) || !isNaN32(out[1*n]) || !isNaN32(out[0*n+2]) || !math.IsInf(float64(out[2*n+3]), 1) {
				t.Fatalf("special values not propagated: %v", out)
			}
		})
	}
}

func TestVectorOpsMatchGo(t *testing.T) {
	lengths := []int{0, 1, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 255, 256, 257, 1000, 4099}
	r := rand.New(rand.NewPCG(5, 6))
	for _, p := range Impls() {
		for _, num := range lengths {
			for _, off := range []int{0, 1, 3} { // unaligned starts
				t.Run(fmt.Sprintf("%s/len%d/off%d", p, num, off), func(t *testing.T) {
					a := randVec(r, num+off)[off:]
					b := randVec(r, num+off)[off:]
					if got, want := p.Dot(a, b), dotGo(a, b); !sameBits(got, want) {
						t.Fatalf("Dot = %g, go %g", got, want)
					}
					alpha := float32(r.NormFloat64())
					y1 := append([]float32(nil), b...)
					y2 := append([]float32(nil), b...)
					p.Axpy(alpha, a, y1)
					axpyGo(alpha, a, y2)
					for i := range y1 {
						if !sameBits(y1[i], y2[i]) {
							t.Fatalf("Axpy y[%d] = %g, go %g", i, y1[i], y2[i])
						}
					}
					copy(y1, a)
					copy(y2, a)
					p.Scale(alpha, y1)
					scaleGo(alpha, y2)
					for i := range y1 {
						if !sameBits(y1[i], y2[i]) {
							t.Fatalf("Scale x[%d] = %g, go %g", i, y1[i], y2[i])
						}
					}
					h := make([]uint16, num+off)[off:]
					for i := range h {
						h[i] = uint16(r.Uint32())
					}
					f1 := filled(num + 1)
					f2 := filled(num + 1)
					p.F16ToF32(f1, h)
					f16ToF32Go(f2, h)
					for i := range f1 { // f1[num] must keep the sentinel
						if math.Float32bits(f1[i]) != math.Float32bits(f2[i]) {
							t.Fatalf("F16ToF32 dst[%d] = %#08x, go %#08x", i, math.Float32bits(f1[i]), math.Float32bits(f2[i]))
						}
					}
					p.BF16ToF32(f1, h)
					for i := range h {
						if math.Float32bits(f1[i]) != uint32(h[i])<<16 {
							t.Fatalf("BF16ToF32 dst[%d] = %#08x from %#04x", i, math.Float32bits(f1[i]), h[i])
						}
					}
					if math.Float32bits(f1[num]) != 0x7fc0dead {
						t.Fatalf("BF16ToF32 wrote past len(src)")
					}
					for i := range f1[:num] {
						f1[i] = math.Float32frombits(r.Uint32())
					}
					b1 := make([]uint16, num+1)
					b2 := make([]uint16, num+1)
					b1[num], b2[num] = 0xbeef, 0xbeef
					p.F32ToBF16(b1, f1[:num])
					f32ToBF16Go(b2, f1[:num])
					for i := range b1 {
						if b1[i] != b2[i] {
							t.Fatalf("F32ToBF16 dst[%d] = %#04x, go %#04x (src %#08x)", i, b1[i], b2[i], math.Float32bits(f1[i]))
						}
					}
				})
			}
		}
	}
}

// TestConversionsExhaustive runs every 16-bit pattern through each path.
func TestConversionsExhaustive(t *testing.T) {
	h := make([]uint16, 1<<16)
	for i := range h {
		h[i] = uint16(i)
	}
	for _, p := range Impls() {
		t.Run(p.name, func(t *testing.T) {
			f := make([]float32, len(h))
			p.F16ToF32(f, h)
			for i, v := range f {
				if want := f16ToF32(h[i]); math.Float32bits(v) != math.Float32bits(want) {
					t.Fatalf("F16ToF32(%#04x) = %#08x, want %#08x", h[i], math.Float32bits(v), math.Float32bits(want))
				}
			}
			p.BF16ToF32(f, h)
			back := make([]uint16, len(h))
			p.F32ToBF16(back, f)
			for i := range h {
				want := h[i]
				if isNaN32(f[i]) {
					want = 0x7fc0
				}
				if back[i] != want {
					t.Fatalf("F32ToBF16(BF16ToF32(%#04x)) = %#04x, want %#04x", h[i], back[i], want)
				}
			}
		})
	}
}

func TestPanicsOnBadShapes(t *testing.T) {
	p := Default()
	tests := []panicCase{
		{"short out", func() { p.LinearF32(make([]float32, 3), make([]float32, 8), make([]float32, 8), 2, 2, 4, 0, 2) }},
		{"short x", func() { p.LinearF32(make([]float32, 4), make([]float32, 7), make([]float32, 8), 2, 2, 4, 0, 2) }},
		{"short w", func() { p.LinearBF16(make([]float32, 4), make([]float32, 8), make([]uint16, 7), 2, 2, 4, 0, 2) }},
		{"range past n", func() { p.LinearF16(make([]float32, 4), make([]float32, 8), make([]uint16, 8), 2, 2, 4, 0, 3) }},
		{"reversed range", func() { p.LinearF32(make([]float32, 4), make([]float32, 8), make([]float32, 8), 2, 2, 4, 2, 1) }},
		{"dot lengths", func() { p.Dot(make([]float32, 3), make([]float32, 4)) }},
		{"axpy lengths", func() { p.Axpy(1, make([]float32, 3), make([]float32, 4)) }},
		{"short dst", func() { p.BF16ToF32(make([]float32, 3), make([]uint16, 4)) }},
	}
	expectPanics(t, tests)
}

func TestLookup(t *testing.T) {
	p, err := Lookup("go")
	if err != nil || p != goImpl {
		t.Fatalf("Lookup(go) = %v, %v", p, err)
	}
	if _, err := Lookup("sse9"); err == nil {
		t.Fatal("Lookup(sse9) succeeded")
	}
	impls := Impls()
	best := impls[len(impls)-1].name
	tests := []struct{ name, want string }{
		{"go", "go"}, {"GO", "go"}, {"", best}, {"auto", best}, {best, best}, {"bogus", ""}, {"sse9", ""},
	}
	for _, tc := range tests {
		got, err := Pick(tc.name)
		switch {
		case tc.want == "" && !errors.Is(err, ErrUnknownImpl):
			t.Errorf("Pick(%q) = %v, %v; want ErrUnknownImpl", tc.name, got, err)
		case tc.want != "" && (err != nil || got.name != tc.want):
			t.Errorf("Pick(%q) = %v, %v; want %s", tc.name, got, err, tc.want)
		}
	}
}

func ExampleLinearBF16() {
	// W: 2 output columns over k=3 inputs, in bfloat16 (nn.Linear layout).
	wf := []float32{1, 2, 3, -1, 0.5, 0.25}
	w := make([]uint16, len(wf))
	F32ToBF16(w, wf)
	x := []float32{1, 1, 2} // one row
	out := make([]float32, 2)
	LinearBF16(out, x, w, 1, 2, 3, 0, 2)
	fmt.Println(out)
	// Output: [9 0]
}

// TestPeakFLOPS: every path claims a ceiling wherever AVX-512 or AVX2
// with FMA runs, measured in its own vectors (the AVX2 path with 8-lane
// FMAs even where the CPU has AVX-512; the pure-Go path with the widest the
// CPU has), and it is plausible.
func TestPeakFLOPS(t *testing.T) {
	_, has512 := fmaPeak(1)
	_, has2 := fmaPeakAVX2(1)
	if v, ok := fmaPeakAVX2(1000); ok && (math.IsNaN(float64(v)) || math.IsInf(float64(v), 0)) {
		t.Errorf("AVX2 probe returned %v", v)
	}
	widest := 0.0
	switch {
	case has512:
		widest = 768
	case has2:
		widest = 192
	}
	for _, p := range Impls() {
		want := map[string]float64{"go": widest, "avx2": 192, "avx512": 768, "avx512-novbmi": 768}[p.Name()]
		if got := p.probe().flopsPerRound; got != want {
			t.Errorf("%s: probe of %v flops a round, want %v", p, got, want)
		}
		peak, ok := p.PeakFLOPS(2)
		if has := has512 || has2; has != ok {
			t.Fatalf("%s: PeakFLOPS ok = %v on a machine where AVX-512 is %v and AVX2 %v", p, ok, has512, has2)
		}
		// Between 1 GFLOP/s and 10 TFLOP/s for two workers: a sanity range, not a timing.
		if ok && (peak < 1e9 || peak > 1e13) {
			t.Errorf("%s: peak %.3g FLOP/s is not plausible", p, peak)
		}
	}
}

// panicCase is a call that must panic (a contract violation).
type panicCase struct {
	name string
	call func()
}

// expectPanics runs each case in a subtest and fails the ones that return.
func expectPanics(t *testing.T, cases []panicCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tc.call()
		})
	}
}

// TestF16Rows: F16Rows gathers the rows it names (repeated and out of
// order), widens each as F16ToF32 does on every path, for row widths with
// and without a vector tail, and writes nothing past len(rows)*k.
func TestF16Rows(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const ld, numRows = 100, 9
	src := make([]uint16, ld*numRows)
	for i := range src {
		src[i] = uint16(r.Uint32())
	}
	rows := []int32{3, 0, 8, 3, 5}
	for _, p := range Impls() {
		for _, k := range []int{1, 7, 16, 24, 64, 100} {
			dst := filled(len(rows)*k + 1)
			p.F16Rows(dst, src, rows, ld, k)
			for j, row := range rows {
				for e := range k {
					want := f16ToF32(src[int(row)*ld+e])
					if got := dst[j*k+e]; math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%s k=%d: dst[%d] (row %d, %d) = %#08x, want %#08x", p.Name(), k, j*k+e, row, e, math.Float32bits(got), math.Float32bits(want))
					}
				}
			}
			if math.Float32bits(dst[len(rows)*k]) != 0x7fc0dead {
				t.Fatalf("%s k=%d: wrote past len(rows)*k", p.Name(), k)
			}
		}
		for name, f := range map[string]func(){
			"short dst":   func() { p.F16Rows(make([]float32, 5), src, rows, ld, 2) },
			"row outside": func() { p.F16Rows(make([]float32, 64), src, []int32{int32(numRows)}, ld, 16) },
			"negative":    func() { p.F16Rows(make([]float32, 64), src, []int32{-1}, ld, 16) },
		} {
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("%s: F16Rows with %s did not panic", p.Name(), name)
					}
				}()
				f()
			}()
		}
	}
}

// TestF32ToF16Rows: every path rounds as the scalar F32ToF16 on random bit
// patterns (NaNs with payloads, infinities, subnormal results, overflow)
// and on the values around the half's edges, tails included.
func TestF32ToF16Rows(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	src := []float32{65504, 65519.996, 65520, -65520, 6.1035156e-05, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), -float32(math.NaN()), 0, float32(math.Copysign(0, -1))}
	for range 4000 {
		src = append(src, math.Float32frombits(r.Uint32()))
		src = append(src, float32(r.NormFloat64()*math.Exp(8*r.NormFloat64())))
	}
	src = append(src, math.Float32frombits(0x7f800001), math.Float32frombits(0xffc12345))
	want := make([]uint16, len(src))
	for i, f := range src {
		want[i] = F32ToF16(f)
	}
	for _, p := range Impls() {
		for _, n := range []int{len(src), 13, 7} {
			got := make([]uint16, n+1)
			got[n] = 0xbeef
			p.F32ToF16(got, src[:n])
			for i := range n {
				if got[i] != want[i] {
					t.Fatalf("%s: F32ToF16(%#08x) = %#04x, want %#04x", p.Name(), math.Float32bits(src[i]), got[i], want[i])
				}
			}
			if got[n] != 0xbeef {
				t.Fatalf("%s: F32ToF16 wrote past len(src)", p.Name())
			}
		}
	}
}
