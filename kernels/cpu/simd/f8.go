package simd

import (
	"fmt"
	"math"
	"math/bits"
)

// F8Weights is a matrix [n][k] of OCP FP8 E4M3 weights with one float32
// scale per row and per block of BlockK columns (DeepSeek-V3's "fp8" format
// once its 128x128 blocks are spread to rows): element (j, kk) stands for
//
//	F8Value(Data[j*k+kk]) * Scales[ScaleRow[j]*ceil(k/BlockK) + kk/BlockK]
//
// rounded once to float32. ScaleRow lets rows share a row of scales (the
// 128 rows of one block) and lets matrices with different block grids be
// stacked (q, k and v fused; gate and up fused).
type F8Weights struct {
	Data     []uint8   // n*k bytes, row-major
	Scales   []float32 // rows of ceil(k/BlockK) scales
	ScaleRow []int32   // n entries, each a row of Scales
	BlockK   int       // columns per scale: a power of two, at least 16
}

// f8Table maps an E4M3 byte to its value: exponent bias 7, subnormals
// m * 2^-9, largest finite 448. The two NaN encodings (0x7F, 0xFF) widen
// to +-480 here as in the SIMD paths, which reinterpret the byte as a half
// of 2^-8 its value; loaders refuse them.
var f8Table = func() (t [256]float32) {
	for b := range 256 {
		t[b] = f16ToF32(f8ToF16Bits(uint8(b))) * 256
	}
	return t
}()

// f8ToF16Bits places an E4M3 byte's sign, exponent and mantissa in an IEEE
// half: the half's value is the E4M3 value times 2^-8 (exact, subnormals
// included), which is how the SIMD paths widen it.
func f8ToF16Bits(b uint8) uint16 {
	return uint16(b&0x80)<<8 | uint16(b&0x7f)<<7
}

// F8Value returns the value of an E4M3 byte as the kernels read it (exact;
// NaN encodings read as +-480, see F8Weights).
func F8Value(b uint8) float32 { return f8Table[b] }

// maxF8Scale bounds scales: the SIMD paths multiply a scale by 256 before
// use, which must stay exact.
const maxF8Scale = 0x1p100

// Check reports whether w describes a valid [n][k] matrix: lengths, a
// power-of-two BlockK of at least 16, scale rows in range, and finite scales
// of magnitude below 2^100. Cost: one pass over ScaleRow and Scales; meant
// for once per weight (kernels/cpu checks at load), not per product.
func (w F8Weights) Check(n, k int) error {
	if err := w.checkRows(n, k, 0, n); err != nil {
		return err
	}
	for i, s := range w.Scales {
		if !(math.Abs(float64(s)) < maxF8Scale) {
			return fmt.Errorf("simd: fp8 weights: scale %d is %g, want finite and below 2^100", i, s)
		}
	}
	return nil
}

// checkRows is what a product over rows [j0, j1) needs to stay in bounds:
// the lengths and block of Check, and the scale rows of rows [j0, j1) in
// range. Cost: O(j1 - j0).
func (w F8Weights) checkRows(n, k, j0, j1 int) error {
	if w.BlockK < 16 || bits.OnesCount(uint(w.BlockK)) != 1 {
		return fmt.Errorf("simd: fp8 weights: block of %d columns, want a power of two >= 16", w.BlockK)
	}
	if len(w.Data) < n*k || len(w.ScaleRow) < n {
		return fmt.Errorf("simd: fp8 weights: %d bytes and %d scale rows for a [%d][%d] matrix", len(w.Data), len(w.ScaleRow), n, k)
	}
	kb := (k + w.BlockK - 1) / w.BlockK
	if kb == 0 {
		return nil
	}
	rows := len(w.Scales) / kb
	for j := j0; j < j1; j++ {
		if r := w.ScaleRow[j]; r < 0 || int(r) >= rows {
			return fmt.Errorf("simd: fp8 weights: row %d uses scale row %d of %d", j, r, rows)
		}
	}
	return nil
}

// LinearF8 is LinearF32 with w in FP8 E4M3 with block scales, the scales
// applied to the activations: every weight is widened exactly (its E4M3
// value times 2^-8), every activation multiplied by 256 times the scale of
// the weight's block (one rounding: f8ScaleActs), and the products reduced
// in the canonical order, so the result is bit for bit LinearF32 of the
// scaled activations and the widened weights, on every path. Scaling the
// activations costs k multiplies a row per run of columns that share a
// scale row (128 columns in DeepSeek's and Qwen's checkpoints), where
// scaling the weights cost one multiply a weight: on the one-row path the
// widening and the FMA are all that is left a weight. Decode widens in
// registers (AVX-512: up to 8 rows, AVX2: up to 4) and reads one byte a
// weight plus 4 bytes a block of BlockK; with more rows the SIMD paths
// widen a panel of columns once into an L2-sized float32 buffer and run
// LinearF32's kernel on it, so prefill runs at float32 GEMM speed. It
// panics if a slice is too short, the block is not a power of two >= 16,
// or a row in [j0, j1) names a scale row out of range (O(j1 - j0) checks);
// scales are taken to pass Check, done once per weight. Cost besides the
// product: a scratch of min(m, f8ScaledRows) rows of k float32s.
func (p *Impl) LinearF8(out, x []float32, w F8Weights, m, n, k, j0, j1 int) {
	checkLinear("LinearF8", len(out), len(x), len(w.Data), m, n, k, j0, j1)
	if err := w.checkRows(n, k, j0, j1); err != nil {
		panic(err.Error())
	}
	if m == 0 || j0 == j1 {
		return
	}
	xs := f8Scratch.get(min(m, f8ScaledRows) * k)
	p.linearF8(out, x, w, m, n, k, j0, j1, *xs)
	f8Scratch.put(xs)
}

// f8ScaledRows bounds the activation rows LinearF8 scales at a time (the
// panel path's row chunk; the register paths take at most 8).
const f8ScaledRows = 64

// f8Scratch holds LinearF8's scaled activations, one buffer per concurrent
// call.
var f8Scratch floatPool

// f8ScaleActs writes into xs the rows [0, m) of x (k columns) scaled for the
// weight rows that use scale row sr: xs[i][kk] = x[i][kk] * (256 * scale of
// kk's block), rounded once (256 * scale is exact: scales pass Check).
func f8ScaleActs(xs, x []float32, w F8Weights, sr, m, k int) {
	kb := (k + w.BlockK - 1) / w.BlockK
	scales := w.Scales[sr*kb : (sr+1)*kb]
	for i := range m {
		src, dst := x[i*k:(i+1)*k], xs[i*k:(i+1)*k]
		for bi, s := range scales {
			lo, hi := bi*w.BlockK, min((bi+1)*w.BlockK, k)
			s *= 256
			for kk := lo; kk < hi; kk++ {
				dst[kk] = src[kk] * s
			}
		}
	}
}

// rowWidened writes row j of w widened into dst[:k]: each E4M3 value times
// 2^-8 (exact), what every path multiplies the scaled activations by.
func (w F8Weights) rowWidened(dst []float32, j, k int) {
	row := w.Data[j*k : (j+1)*k]
	dst = dst[:k]
	for i, b := range row {
		dst[i] = f8Table[b] * (1.0 / 256)
	}
}

// LinearF8 runs Default().LinearF8.
func LinearF8(out, x []float32, w F8Weights, m, n, k, j0, j1 int) {
	defaultImpl.LinearF8(out, x, w, m, n, k, j0, j1)
}

// RowF32 writes row j of w dequantized into dst[:k] (see F8Weights).
// Cost: one table look-up and one multiply per element.
func (w F8Weights) RowF32(dst []float32, j, k int) {
	kb := (k + w.BlockK - 1) / w.BlockK
	scales := w.Scales[int(w.ScaleRow[j])*kb : (int(w.ScaleRow[j])+1)*kb]
	row := w.Data[j*k : (j+1)*k]
	dst = dst[:k]
	for bi, s := range scales {
		lo := bi * w.BlockK
		hi := min(lo+w.BlockK, k)
		d, src := dst[lo:hi], row[lo:hi]
		for i, b := range src {
			d[i] = f8Table[b] * s
		}
	}
}

// linearF8Go is the canonical LinearF8: for each run of columns that share
// a scale row, the m rows scaled once (f8ScaleActs), then each column's
// widened row dotted with them.
func linearF8Go(out, x []float32, w F8Weights, m, n, k, j0, j1 int, xs []float32) {
	v := rowScratch.get(k)
	defer rowScratch.put(v)
	buf := *v
	for i0 := 0; i0 < m; i0 += f8ScaledRows {
		mr := min(f8ScaledRows, m-i0)
		sr := int32(-1)
		for j := j0; j < j1; j++ {
			if w.ScaleRow[j] != sr {
				sr = w.ScaleRow[j]
				f8ScaleActs(xs, x[i0*k:], w, int(sr), mr, k)
			}
			w.rowWidened(buf, j, k)
			for i := range mr {
				out[(i0+i)*n+j] = dotGo(xs[i*k:(i+1)*k], buf)
			}
		}
	}
}
