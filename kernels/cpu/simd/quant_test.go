package simd

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/pool"
)

// quantRows quantizes n random rows of k weights (normal, scale 0.05, with
// a few outliers) as type t and returns the blocks and the dequantized rows.
func quantRows(t QuantType, r *rand.Rand, n, k int) ([]byte, []float32) {
	rb, _ := t.RowBytes(k)
	src := make([]float32, n*k)
	for i := range src {
		src[i] = float32(r.NormFloat64() * 0.05)
		if r.IntN(97) == 0 {
			src[i] *= 20
		}
	}
	w := make([]byte, n*rb)
	t.Quantize(w, src)
	deq := make([]float32, n*k)
	t.Dequantize(deq, w)
	return w, deq
}

// TestQuantBlocks decodes hand-made blocks whose values follow from the
// layout of ggml-common.h.
func TestQuantBlocks(t *testing.T) {
	h := func(f float32) []byte { return binary.LittleEndian.AppendUint16(nil, F32ToF16(f)) }
	q8 := append(h(0.5), make([]byte, 32)...)
	q8[2], q8[2+31] = 0xff, 100 // -1 and 100
	q4 := append(h(-2), make([]byte, 16)...)
	q4[2] = 0x3a // element 0: 10-8 = 2, element 16: 3-8 = -5
	q4k := make([]byte, 144)
	copy(q4k, h(0.25))
	copy(q4k[2:], h(1))
	q4k[4+1] = 2      // sub-block 1 scale 2
	q4k[4+5] = 3      // sub-block 1 min 3
	q4k[4+8] = 0x21   // sub-block 4: scale low 1, min low 2
	q4k[4+0] = 1 << 6 // sub-block 4: scale high bits 1 -> 17
	q4k[16+0] = 0xf0  // weight 32 (sub-block 1): 15
	q4k[16+64] = 0x07 // weight 128 (sub-block 4): 7
	q6k := make([]byte, 210)
	copy(q6k[208:], h(0.5))
	q6k[192+6] = 0xfe // scale of weights 96..111: -2
	q6k[0] = 0x50     // weight 64 low nibble... high nibble 5
	q6k[128] = 0x30   // qh bits 4-5 of l=0: 3 -> weight 64
	tests := []struct {
		typ   QuantType
		block []byte
		want  map[int]float32
	}{
		{QuantQ8_0, q8, map[int]float32{0: -0.5, 31: 50, 1: 0}},
		{QuantQ4_0, q4, map[int]float32{0: -4, 16: 10, 1: 16}},
		{QuantQ4_K, q4k, map[int]float32{32: 0.25*2*15 - 3, 33: -3, 128: 0.25*17*7 - 2, 0: 0}},
		{QuantQ6_K, q6k, map[int]float32{64: 0, 96: 0.5 * -2 * -32, 1: 0}},
	}
	for _, tc := range tests {
		y := make([]float32, tc.typ.BlockSize())
		tc.typ.Dequantize(y, tc.block)
		for i, want := range tc.want {
			if y[i] != want {
				t.Errorf("%s weight %d = %g, want %g", tc.typ, i, y[i], want)
			}
		}
	}
}

// TestQuantizeError bounds the error of quantize + dequantize on normal
// weights: the relative RMS error of each format.
func TestQuantizeError(t *testing.T) {
	bounds := map[QuantType]float64{QuantQ8_0: 0.006, QuantQ4_0: 0.12, QuantQ4_K: 0.08, QuantQ5_K: 0.04, QuantQ6_K: 0.02}
	r := rand.New(rand.NewPCG(3, 3))
	for _, typ := range QuantTypes {
		const k = 4096
		src := make([]float32, k)
		for i := range src {
			src[i] = float32(r.NormFloat64())
		}
		rb, _ := typ.RowBytes(k)
		w := make([]byte, rb)
		if n := typ.Quantize(w, src); n != rb {
			t.Fatalf("%s: wrote %d bytes, want %d", typ, n, rb)
		}
		deq := make([]float32, k)
		typ.Dequantize(deq, w)
		var se, ss float64
		for i := range src {
			se += math.Pow(float64(deq[i]-src[i]), 2)
			ss += math.Pow(float64(src[i]), 2)
		}
		if rel := math.Sqrt(se / ss); rel > bounds[typ] {
			t.Errorf("%s: relative RMS error %.4f > %.4f", typ, rel, bounds[typ])
		}
	}
}

func TestF32ToF16(t *testing.T) {
	for h := range 1 << 16 {
		f := f16ToF32(uint16(h))
		if f != f { // NaN: any NaN becomes 0x7e00 with its sign
			if got := F32ToF16(f); got != uint16(h)&0x8000|0x7e00 {
				t.Fatalf("NaN %#04x -> %#04x", h, got)
			}
			continue
		}
		if got := F32ToF16(f); got != uint16(h) {
			t.Fatalf("%#04x (%g) -> %#04x", h, f, got)
		}
	}
	tests := []struct {
		f    float32
		want uint16
	}{
		{1 + 0x1p-11, 0x3c00},           // tie to even (down)
		{1 + 3*0x1p-11, 0x3c02},         // tie to even (up)
		{65520, 0x7c00},                 // rounds to Inf
		{0x1p-25, 0},                    // half the smallest subnormal: tie to 0
		{0x1p-25 + 0x1p-35, 1},          // above the tie
		{float32(math.Inf(-1)), 0xfc00}, // -Inf
	}
	for _, tc := range tests {
		if got := F32ToF16(tc.f); got != tc.want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
}

// TestLinearQuant checks every implementation against the float64 product
// with the dequantized weights (bound: k * 2^-24 * sum |x*w|, the worst
// case of a float32 sum of k products), and bit for bit against the pure-Go
// float32 product over the dequantized matrix, for several batch sizes and
// column ranges (batch invariance).
func TestLinearQuant(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, typ := range QuantTypes {
		for _, sh := range []struct{ n, k int }{{5, typ.BlockSize()}, {19, 4 * typ.BlockSize()}, {3, 1024 + 256}} {
			if sh.k%typ.BlockSize() != 0 {
				continue
			}
			w, deq := quantRows(typ, r, sh.n, sh.k)
			const m = 9
			x := randVec(r, m*sh.k)
			ref := make([]float32, m*sh.n)
			goImpl.LinearF32(ref, x, deq, m, sh.n, sh.k, 0, sh.n)
			for i := range m {
				for j := range sh.n {
					var exact, mag float64
					for kk := range sh.k {
						p := float64(x[i*sh.k+kk]) * float64(deq[j*sh.k+kk])
						exact += p
						mag += math.Abs(p)
					}
					if err := math.Abs(float64(ref[i*sh.n+j]) - exact); err > float64(sh.k)*0x1p-24*mag {
						t.Fatalf("%s %v: (%d,%d) = %g, float64 %g", typ, sh, i, j, ref[i*sh.n+j], exact)
					}
				}
			}
			for _, impl := range Impls() {
				name := fmt.Sprintf("%s/%s/n%d_k%d", impl, typ, sh.n, sh.k)
				for _, rowsM := range []int{1, 2, 3, 4, 5, m} {
					out := make([]float32, rowsM*sh.n)
					// Two column ranges, as two threads would split them.
					mid := sh.n / 3
					impl.LinearQuant(out, x, w, typ, rowsM, sh.n, sh.k, 0, mid)
					impl.LinearQuant(out, x, w, typ, rowsM, sh.n, sh.k, mid, sh.n)
					for idx, v := range out {
						if math.Float32bits(v) != math.Float32bits(ref[idx]) {
							t.Fatalf("%s m=%d: out[%d] = %g, want %g (bits)", name, rowsM, idx, v, ref[idx])
						}
					}
				}
			}
		}
	}
}

func TestLinearQuantPanics(t *testing.T) {
	x := make([]float32, 32)
	out := make([]float32, 1)
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"unknown type", func() { LinearQuant(out, x, make([]byte, 34), QuantType(99), 1, 1, 32, 0, 1) }},
		{"partial block", func() { LinearQuant(out, x, make([]byte, 34), QuantQ8_0, 1, 1, 16, 0, 1) }},
		{"short w", func() { LinearQuant(out, x, make([]byte, 33), QuantQ8_0, 1, 1, 32, 0, 1) }},
		{"short x", func() { LinearQuant(out, x[:31], make([]byte, 34), QuantQ8_0, 1, 1, 32, 0, 1) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", tc.name)
				}
			}()
			tc.f()
		}()
	}
}

// BenchmarkQuantGEMV measures decode GEMV over quantized weights rotating
// through 512 MiB (weights come from memory, as in a decode step), against
// the parallel copy bandwidth measured right before on the same pool:
//
//	go test -run XXX -bench QuantGEMV -benchtime 200x ./kernels/cpu/simd
//
// GB/s counts the stored bytes of w read per second; best_x_copy compares
// the best window with the copy (read + written) figure, best_x_read with
// the streaming-read one.
func BenchmarkQuantGEMV(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 5))
	benchQuantGEMV(b, r, func(impl *Impl, typ QuantType, m, k int) quantRowsRun {
		x := randVec(r, m*k)
		return func(out []float32, w []byte, n, lo, hi int) { impl.LinearQuant(out, x, w, typ, m, n, k, lo, hi) }
	})
}

// quantRowsRun computes rows lo..hi of the product of one run's
// activations with the quantized weights w ([n, k]) into out.
type quantRowsRun func(out []float32, w []byte, n, lo, hi int)

// benchQuantGEMV is the body of the decode GEMV benchmarks over quantized
// weights (BenchmarkQuantGEMV, BenchmarkQuantLlamaGEMV): every type and
// decode shape, weights (drawn from r) rotating through coldBytes, m = 1
// and 4 activation rows; prep makes one run's activations and its product. It
// reports the bytes of w read per second (overall and of the best
// window), the copy bandwidth measured right before on the same pool, the
// best window against copy and streaming read, and weights per second.
func benchQuantGEMV(b *testing.B, r *rand.Rand, prep func(impl *Impl, typ QuantType, m, k int) quantRowsRun) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	roof := newRoofline(p)
	impl := benchImpl(b)
	for _, typ := range QuantTypes {
		for _, sh := range gemvShapes {
			rb, err := typ.RowBytes(sh.k)
			if err != nil {
				continue
			}
			wbytes := sh.n * rb
			numCopies := max(1, coldBytes/wbytes)
			w0, _ := quantRows(typ, r, sh.n, sh.k)
			ws := make([][]byte, numCopies)
			for i := range ws {
				ws[i] = append([]byte(nil), w0...)
			}
			for _, m := range []int{1, 4} {
				b.Run(fmt.Sprintf("%s/%s/%s/m%d", impl, typ, sh.name, m), func(b *testing.B) {
					run := prep(impl, typ, m, sh.k)
					out := make([]float32, m*sh.n)
					copyBW, readBW := roof.copyGBps(), roof.readGBps()
					i := 0
					win := newBestWindow(max(4, (1<<20)/wbytes))
					for b.Loop() {
						w := ws[i%numCopies]
						i++
						p.ForGrain(sh.n, 16, func(lo, hi int) { run(out, w, sh.n, lo, hi) })
						win.done()
					}
					best := float64(wbytes) / win.bestSec / 1e9
					b.ReportMetric(float64(wbytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
					b.ReportMetric(best, "best_GB/s")
					b.ReportMetric(copyBW, "copy_GB/s")
					b.ReportMetric(best/copyBW, "best_x_copy")
					b.ReportMetric(best/readBW, "best_x_read")
					b.ReportMetric(float64(sh.n*sh.k)/win.bestSec/1e9, "best_Gweights/s")
				})
			}
		}
	}
}
