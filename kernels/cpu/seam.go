package cpu

import (
	"github.com/deepinfer/deepinfer-go/kernels/cpu/pool"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// kernelSet holds the inner loops the kernels are built from. Each function
// computes every output element with one fixed reduction order that does not
// depend on how many rows or which column range it is given (see package
// simd), which is what makes the kernels batch-invariant.
type kernelSet struct {
	name string
	// peak measures the path's FMA ceiling (simd.Impl.PeakFLOPS).
	peak func(workers int) (float64, bool)
	// linear* compute out[i*n+j] = sum_kk x[i*k+kk] * w[j*k+kk] for rows i in
	// [0, m) and columns j in [j0, j1); w is [n][k] in nn.Linear layout.
	linearF32  func(out, x, w []float32, m, n, k, j0, j1 int)
	linearBF16 func(out, x []float32, w []uint16, m, n, k, j0, j1 int)
	linearF16  func(out, x []float32, w []uint16, m, n, k, j0, j1 int)
	linearF8   func(out, x []float32, w simd.F8Weights, m, n, k, j0, j1 int)
	// linearQuant is the same with w [n] rows of t's blocks.
	linearQuant func(out, x []float32, w []byte, t simd.QuantType, m, n, k, j0, j1 int)
	dot         func(a, b []float32) float32
	axpy        func(a float32, x, y []float32) // y += a*x
	bf16ToF32   func(dst []float32, src []uint16)
	f16ToF32    func(dst []float32, src []uint16)
	// f32ToF16 rounds to IEEE half (simd.Impl.F32ToF16), f16Rows widens
	// gathered IEEE-half rows (simd.Impl.F16Rows).
	f32ToF16 func(dst []uint16, src []float32)
	f16Rows  func(dst []float32, src []uint16, rows []int32, ld, k int)

	// Attention's building blocks (simd.Impl.OnlineSoftmax,
	// LinearF32Gather, LinearF32KMajor, AccumRows): a row's bits never depend on the other
	// rows of a call.
	onlineSoftmax   func(s []float32, m, n int, scale float32, lo, hi []int32, rowMax, rowSum, alpha []float32)
	linearF32Gather func(out, x, w []float32, rows []int32, ldw, m, k int)
	linearF32KMajor func(out []float32, ldo int, x []float32, ldx int, w []float32, m, n, k int)
	accumRows       func(acc, alpha, p, w []float32, rows []int32, ldw, m, k int)
	// linearF16Gather and accumRowsF16 are the two over IEEE-half rows,
	// widened in registers (simd.Impl.LinearF16Gather, AccumRowsF16).
	linearF16Gather func(out, x []float32, w []uint16, rows []int32, ldw, m, k int)
	accumRowsF16    func(acc, alpha, p []float32, w []uint16, rows []int32, ldw, m, k int)
	// accumRowsPrefetch is accumRows that also fetches rows pfRows of w
	// into L2 (simd.Impl.AccumRowsPrefetch).
	accumRowsPrefetch func(acc, alpha, p, w []float32, rows []int32, ldw, m, k int, pfRows []int32, pfK int)
	// prefetchRows asks for the first k floats of rows of w
	// (simd.Impl.PrefetchRows).
	prefetchRows func(w []float32, rows []int32, ldw, k int)
	siluMul      func(dst, gate, up []float32) // simd.Impl.SiLUMul
	// scaleRows multiplies rows by their scales and a weight
	// (simd.Impl.ScaleRows: RMSNorm's last step).
	scaleRows func(dst, x, w []float32, n int, scales [4]float32, rows int)

	// linearQuantLlama is llama.cpp's product of activation rows quantized
	// by simd.QuantizeActs with w's rows (simd.LinearQuantLlama), and
	// linear16Llama its product of 16-bit activation rows with 16-bit
	// weights (simd.Linear16Llama).
	linearQuantLlama func(out []float32, a, w []byte, t simd.QuantType, m, n, k, j0, j1 int)
	linear16Llama    func(out []float32, x, w []uint16, bf16 bool, m, n, k, j0, j1 int)
	// linearBF16Pairs is the product of bfloat16 activation rows with
	// BF16 weights in VDPBF16PS arithmetic (simd.LinearBF16Pairs, ActBF16).
	linearBF16Pairs func(out []float32, x, w []uint16, m, n, k, j0, j1 int)
	// quantizeActs and roundBF16 round activation rows for those products
	// (simd.Impl.QuantizeActs, RoundBF16) on the same instruction set.
	quantizeActs func(dst []byte, x []float32, t simd.QuantType, m, k int) int
	roundBF16    func(dst []uint16, src []float32)
}

// selectKernels picks the fastest simd implementation of this CPU, or the
// pure-Go one. All of them return the same bits.
func selectKernels(pureGo bool, name string) kernelSet {
	if pureGo {
		name = "go"
	}
	impl, err := simd.Pick(name)
	if err != nil {
		impl = simd.Default()
	}
	return kernelSet{
		name:        impl.Name(),
		peak:        impl.PeakFLOPS,
		linearF32:   impl.LinearF32,
		linearBF16:  impl.LinearBF16,
		linearF16:   impl.LinearF16,
		linearF8:    impl.LinearF8,
		linearQuant: impl.LinearQuant,
		dot:         impl.Dot,
		axpy:        impl.Axpy,
		bf16ToF32:   impl.BF16ToF32,
		f16ToF32:    impl.F16ToF32,
		f16Rows:     impl.F16Rows,
		f32ToF16:    impl.F32ToF16,

		onlineSoftmax:     impl.OnlineSoftmax,
		linearF32Gather:   impl.LinearF32Gather,
		linearF16Gather:   impl.LinearF16Gather,
		accumRowsF16:      impl.AccumRowsF16,
		linearF32KMajor:   impl.LinearF32KMajor,
		accumRows:         impl.AccumRows,
		accumRowsPrefetch: impl.AccumRowsPrefetch,
		prefetchRows:      impl.PrefetchRows,
		siluMul:           impl.SiLUMul,
		scaleRows:         impl.ScaleRows,

		linearQuantLlama: impl.LinearQuantLlama,
		linear16Llama:    impl.Linear16Llama,
		linearBF16Pairs:  impl.LinearBF16Pairs,
		quantizeActs:     impl.QuantizeActs,
		roundBF16:        impl.RoundBF16,
	}
}

// runner is the parallel-for the kernels use: For calls fn on disjoint chunks
// [lo, hi) that cover [0, n), possibly concurrently, and returns when all are
// done. Kernels never let a result depend on the chunking.
type runner interface {
	For(n int, fn func(lo, hi int))
	Close()
}

func newRunner(n int) runner { return pool.New(n) }
