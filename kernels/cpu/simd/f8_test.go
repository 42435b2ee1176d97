package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// f8Block is the scale block of the f8 test weights: small, so that the
// shapes of linearShapes cross many blocks.
const f8Block = 32

// randF8Weights draws E4M3 bytes (every finite encoding, subnormals
// included) and per-block scales for an [n][k] matrix, with rows pointing
// at scale rows out of order, as stacked matrices do. It returns the
// weights and their dequantized values.
func randF8Weights(r *rand.Rand, n, k, block int) (F8Weights, []float32) {
	kb := (k + block - 1) / block
	numScaleRows := max(1, (n+2)/3)
	w := F8Weights{Data: make([]uint8, n*k), Scales: make([]float32, numScaleRows*kb),
		ScaleRow: make([]int32, n), BlockK: block}
	for i := range w.Data {
		b := uint8(r.IntN(256))
		if b&0x7f == 0x7f { // NaN encodings are not weights
			b--
		}
		w.Data[i] = b
	}
	for i := range w.Scales {
		w.Scales[i] = float32(math.Exp(r.NormFloat64()*3)) / 448
	}
	for j := range w.ScaleRow {
		w.ScaleRow[j] = int32(r.IntN(numScaleRows))
	}
	wf := make([]float32, n*k)
	for j := range n {
		w.RowF32(wf[j*k:(j+1)*k], j, k)
	}
	return w, wf
}

// f8Impls are Impls and the variants of their FP8 paths (AVX-512 without
// its VBMI widening where the CPU has VBMI).
func f8Impls() []*Impl { return append(Impls(), f8Variants()...) }

// f8dtype runs LinearF8 in the dtype-generic batch-invariance test. Its
// weights know only n*k, so the matrix is drawn on first use for the shape
// it is used with (the same one every time).
var f8dtype = dtype{
	name: "f8",
	weights: func(r *rand.Rand, num int) (any, []float32) {
		return &f8Lazy{seed: r.Uint64()}, nil
	},
	linear: func(p *Impl, out, x []float32, w any, m, n, k, j0, j1 int) {
		p.LinearF8(out, x, w.(*f8Lazy).get(n, k), m, n, k, j0, j1)
	},
}

type f8Lazy struct {
	seed uint64
	w    F8Weights
	n, k int
}

func (f *f8Lazy) get(n, k int) F8Weights {
	if f.w.Data == nil || f.n != n || f.k != k {
		f.w, _ = randF8Weights(rand.New(rand.NewPCG(f.seed, uint64(n*k))), n, k, f8Block)
		f.n, f.k = n, k
	}
	return f.w
}

// TestLinearF8BatchInvariance: a row's outputs are the same bits whatever
// the batch size, its neighbours and the column split (k = 1500 crosses
// many scale blocks).
func TestLinearF8BatchInvariance(t *testing.T) {
	for _, k := range []int{77, 1500} {
		for _, p := range f8Impls() {
			testBatchInvariance(t, p, f8dtype, 40, k)
		}
	}
}

// f8ViaF32 is LinearF8 spelt with LinearF32: for each column, the rows of x
// scaled for its scale row (f8ScaleActs) against its widened row; the bits
// every path must give.
func f8ViaF32(p *Impl, out, x []float32, w F8Weights, m, n, k, j0, j1 int) {
	xs, row, col := make([]float32, m*k), make([]float32, k), make([]float32, m)
	for j := j0; j < j1; j++ {
		f8ScaleActs(xs, x, w, int(w.ScaleRow[j]), m, k)
		w.rowWidened(row, j, k)
		p.LinearF32(col, xs, row, m, 1, k, 0, 1)
		for i, v := range col {
			out[i*n+j] = v
		}
	}
}

// TestLinearF8 checks every implementation against a float64 product of the
// dequantized weights (within rounding), against the pure-Go path (bit for
// bit), and against LinearF32 of the scaled activations and the widened
// weights (bit for bit: see LinearF8).
func TestLinearF8(t *testing.T) {
	for _, p := range f8Impls() {
		for _, block := range []int{16, 32, 64, 128} {
			for _, sh := range linearShapes {
				t.Run(fmt.Sprintf("%s/block%d/m%d_n%d_k%d", p, block, sh.m, sh.n, sh.k), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(sh.m*1000+sh.n), uint64(sh.k+block)))
					m, n, k := sh.m, sh.n, sh.k
					x := randVec(r, m*k)
					w, wf := randF8Weights(r, n, k, block)
					out, ref, viaF32 := filled(m*n), filled(m*n), filled(m*n)
					p.LinearF8(out, x, w, m, n, k, 0, n)
					goImpl.LinearF8(ref, x, w, m, n, k, 0, n)
					f8ViaF32(p, viaF32, x, w, m, n, k, 0, n)
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
							if !sameBits(got, ref[i*n+j]) || !sameBits(got, viaF32[i*n+j]) {
								t.Fatalf("out[%d][%d] = %#08x, go path %#08x, f32 over scaled rows %#08x", i, j,
									math.Float32bits(got), math.Float32bits(ref[i*n+j]), math.Float32bits(viaF32[i*n+j]))
							}
						}
					}
				})
			}
		}
	}
}

// TestLinearF8Panels: with more rows than their register tiles take (AVX2:
// 4, AVX-512: 8) the SIMD paths widen panels of about 384 KiB of float32
// columns; k = 4100 makes them 16 columns, so n = 70 over [3, 67) crosses
// several, starting and ending inside one, with a partial last scale
// block; 70 rows cross the 64 rows scaled at a time. The scale rows come
// in runs of 1 to 20 columns, as the 128-row blocks of real checkpoints
// give runs that panels and column splits cut. Bit for bit against the Go
// path and against LinearF32 of the scaled rows, for row counts on both
// sides of every switch.
func TestLinearF8Panels(t *testing.T) {
	const n, k, j0, j1 = 70, 4100, 3, 67
	r := rand.New(rand.NewPCG(11, 12))
	w, _ := randF8Weights(r, n, k, 128)
	for j := 0; j < n; {
		run := 1 + r.IntN(20)
		sr := int32(r.IntN(len(w.Scales) / ((k + 127) / 128)))
		for ; run > 0 && j < n; run, j = run-1, j+1 {
			w.ScaleRow[j] = sr
		}
	}
	for _, p := range f8Impls() {
		for _, m := range []int{1, 2, 3, 4, 5, 8, 9, 16, 70} {
			x := randVec(r, m*k)
			out, ref, viaF32 := filled(m*n), filled(m*n), filled(m*n)
			p.LinearF8(out, x, w, m, n, k, j0, j1)
			goImpl.LinearF8(ref, x, w, m, n, k, j0, j1)
			f8ViaF32(p, viaF32, x, w, m, n, k, j0, j1)
			for i, v := range out {
				if !sameBits(v, ref[i]) || !sameBits(v, viaF32[i]) {
					t.Fatalf("%s m=%d: out[%d][%d] = %#08x, go path %#08x, f32 over scaled rows %#08x", p, m, i/n, i%n,
						math.Float32bits(v), math.Float32bits(ref[i]), math.Float32bits(viaF32[i]))
				}
				if j := i % n; (j < j0 || j >= j1) && math.Float32bits(v) != math.Float32bits(sentinel) {
					t.Fatalf("%s m=%d: out[%d][%d] outside [%d, %d) written", p, m, i/n, j, j0, j1)
				}
			}
		}
	}
}

// TestLinearF8Magnitudes: the AVX2 and AVX-512 register tiles widen to 2^-120
// the weights' values (no conversion instruction) when the scaled rows of
// a run of columns stay below 2^16 in magnitude, and through half floats
// otherwise; the bits must not tell which. Activations of magnitude 1,
// 1e6 (every run falls back), and 1 with one outlier of 1e5 (the runs of
// the outlier's block scales fall back, the others not), each bit for bit
// against the Go path.
func TestLinearF8Magnitudes(t *testing.T) {
	const n, k = 40, 300
	r := rand.New(rand.NewPCG(21, 22))
	w, _ := randF8Weights(r, n, k, 128)
	for _, p := range f8Impls() {
		for _, m := range []int{1, 2, 3, 4, 5, 8} {
			for _, tc := range []struct {
				name    string
				scale   float32
				outlier bool
			}{{"unit", 1, false}, {"large", 1e6, false}, {"outlier", 1, true}} {
				x := randVec(r, m*k)
				for i := range x {
					x[i] *= tc.scale
				}
				if tc.outlier {
					x[r.IntN(len(x))] = 1e5
				}
				out, ref := filled(m*n), filled(m*n)
				p.LinearF8(out, x, w, m, n, k, 0, n)
				goImpl.LinearF8(ref, x, w, m, n, k, 0, n)
				for i, v := range out {
					if !sameBits(v, ref[i]) {
						t.Fatalf("%s m=%d %s: out[%d][%d] = %#08x, go path %#08x", p, m, tc.name, i/n, i%n,
							math.Float32bits(v), math.Float32bits(ref[i]))
					}
				}
			}
		}
	}
}

func TestF8Value(t *testing.T) {
	for _, tc := range []struct {
		b    uint8
		want float32
	}{
		{0x00, 0}, {0x80, float32(math.Copysign(0, -1))}, {0x01, 0x1p-9}, {0x07, 7 * 0x1p-9},
		{0x08, 0x1p-6}, {0x38, 1}, {0x3c, 1.5}, {0xb8, -1}, {0x7e, 448}, {0xfe, -448},
		{0x7f, 480}, {0xff, -480},
	} {
		if got := F8Value(tc.b); math.Float32bits(got) != math.Float32bits(tc.want) {
			t.Errorf("F8Value(%#02x) = %g, want %g", tc.b, got, tc.want)
		}
	}
}

func TestF8WeightsCheck(t *testing.T) {
	good := F8Weights{Data: make([]uint8, 4*40), Scales: make([]float32, 2*3), ScaleRow: []int32{0, 1, 1, 0}, BlockK: 16}
	if err := good.Check(4, 40); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(w *F8Weights)
	}{
		{"block not a power of two", func(w *F8Weights) { w.BlockK = 48 }},
		{"block below 16", func(w *F8Weights) { w.BlockK = 8 }},
		{"short data", func(w *F8Weights) { w.Data = w.Data[:10] }},
		{"scale row out of range", func(w *F8Weights) { w.ScaleRow = []int32{0, 2, 1, 0} }},
		{"negative scale row", func(w *F8Weights) { w.ScaleRow = []int32{0, -1, 1, 0} }},
		{"infinite scale", func(w *F8Weights) { w.Scales = []float32{1, 1, float32(math.Inf(1)), 1, 1, 1} }},
		{"NaN scale", func(w *F8Weights) { w.Scales = []float32{1, 1, float32(math.NaN()), 1, 1, 1} }},
	} {
		w := good
		tc.edit(&w)
		if err := w.Check(4, 40); err == nil {
			t.Errorf("%s: Check passed", tc.name)
		}
	}
}

// BenchmarkLinearDecodeF8: one row (decode) against 2048x2048 weights,
// FP8 against BF16 on every path, cycling through 64 copies so that the
// weights stream from memory. Reports weight GB/s read and rows per second.
func BenchmarkLinearDecodeF8(b *testing.B) {
	const n, k, copies = 2048, 2048, 64
	r := rand.New(rand.NewPCG(1, 2))
	x := randVec(r, k)
	out := make([]float32, n)
	f8s := make([]F8Weights, copies)
	bf := make([][]uint16, copies)
	for c := range copies {
		f8s[c], _ = randF8Weights(r, n, k, 128)
		bf[c] = make([]uint16, n*k)
		for i := range bf[c] {
			bf[c][i] = f32ToBF16(float32(r.NormFloat64()))
		}
	}
	for _, p := range f8Impls() {
		for _, dt := range []string{"bf16", "f8"} {
			b.Run(p.Name()+"/"+dt, func(b *testing.B) {
				i, bytes := 0, 2*n*k
				if dt == "f8" {
					bytes = n*k + 4*n*k/(128*128)
				}
				for b.Loop() {
					if dt == "f8" {
						p.LinearF8(out, x, f8s[i%copies], 1, n, k, 0, n)
					} else {
						p.LinearBF16(out, x, bf[i%copies], 1, n, k, 0, n)
					}
					i++
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(bytes)/sec/1e9, "GB/s")
				b.ReportMetric(1/sec, "rows/s")
			})
		}
	}
}
