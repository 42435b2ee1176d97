package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

func newTestBackend(t testing.TB, threads int) *Backend {
	t.Helper()
	b := New(Options{Threads: threads})
	t.Cleanup(func() { b.Close() })
	return b
}

func randVals(r *rand.Rand, n int, scale float32) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = (r.Float32()*2 - 1) * scale
	}
	return xs
}

// roundTo rounds values to what a tensor of dtype stores, so that reference
// computations see exactly the weights the kernel sees.
func roundTo(dt kernels.DType, xs []float32) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		switch dt {
		case kernels.BF16:
			out[i] = kernels.BF16ToF32(kernels.F32ToBF16(x))
		case kernels.F16:
			out[i] = kernels.F16ToF32(kernels.F32ToF16(x))
		default:
			out[i] = x
		}
	}
	return out
}

// put allocates a tensor of dtype dt holding xs (rounded to dt).
func put(t testing.TB, b *Backend, dt kernels.DType, xs []float32, shape ...int) kernels.Tensor {
	t.Helper()
	ten, err := b.Alloc(dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	switch dt {
	case kernels.F32:
		raw = kernels.F32Bytes(xs)
	case kernels.BF16, kernels.F16:
		u := make([]uint16, len(xs))
		for i, x := range xs {
			if dt == kernels.BF16 {
				u[i] = kernels.F32ToBF16(x)
			} else {
				u[i] = kernels.F32ToF16(x)
			}
		}
		raw = kernels.U16Bytes(u)
	}
	if err := b.Upload(ten, raw, dt); err != nil {
		t.Fatal(err)
	}
	return ten
}

func putI32(t testing.TB, b *Backend, xs []int32, shape ...int) kernels.Tensor {
	t.Helper()
	ten, err := kernels.FromI32(b, xs, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}

func alloc(t testing.TB, b *Backend, shape ...int) kernels.Tensor {
	t.Helper()
	ten, err := b.Alloc(kernels.F32, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}

func vals(ten kernels.Tensor) []float32 { return ten.(*Tensor).f32 }

// allocDT is alloc for any dtype.
func allocDT(t testing.TB, b *Backend, dt kernels.DType, shape ...int) kernels.Tensor {
	t.Helper()
	ten, err := b.Alloc(dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}

// maxRelErr is max|got-want| / max|want|.
func maxRelErr(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		num = math.Max(num, math.Abs(float64(got[i])-float64(want[i])))
		den = math.Max(den, math.Abs(float64(want[i])))
	}
	if den == 0 {
		return num
	}
	return num / den
}

func checkClose(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	if e := maxRelErr(got, want); e > tol || math.IsNaN(e) {
		t.Errorf("%s: max relative error %.3g > %.3g", what, e, tol)
	}
}

func checkIdentical(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d is %v, want bit-identical %v", what, i, got[i], want[i])
		}
	}
}
