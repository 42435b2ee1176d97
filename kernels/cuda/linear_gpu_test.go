package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// The GEMV kernel (here for up to 8 rows): a row's bits do not depend on the other
// rows, and it agrees with the cuBLAS path (DEEPINFER_CUDA_GEMV=0), which
// has the same rounding of the inputs, to float32 summation order.
func TestGPUGEMV(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		t.Setenv("DEEPINFER_CUDA_GEMV", "8")
		p := newPair(t, mode)
		t.Setenv("DEEPINFER_CUDA_GEMV", "0")
		ref := newGPU(t, mode)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
			t.Run(fmt.Sprintf("%s/%s", mode, dt), func(t *testing.T) {
				const m, n, k = 8, 1000, 2048
				xs, ws, bs := randVals(p.r, m*k, 1), hostBytes(dt, randVals(p.r, n*k, 0.05)), randVals(p.r, n, 1)
				run := func(g *Backend, rows int) []float32 {
					x := upload(t, g, kernels.F32, kernels.F32Bytes(xs[3*k:(3+rows)*k]), kernels.F32, rows, k)
					w := upload(t, g, dt, ws, dt, n, k)
					b := upload(t, g, kernels.F32, kernels.F32Bytes(bs), kernels.F32, n)
					out, err := g.Alloc(kernels.F32, rows, n)
					if err != nil {
						t.Fatal(err)
					}
					if err := g.Linear(out, x, w, b); err != nil {
						t.Fatal(err)
					}
					return p.f32(g, out)
				}
				five, one := run(p.g, 5), run(p.g, 1)
				for i := range one {
					if math.Float32bits(one[i]) != math.Float32bits(five[i]) {
						t.Fatalf("row alone differs from the row among 5 at %d: %v vs %v", i, one[i], five[i])
					}
				}
				if e := maxRelErr(five, run(ref, 5)); e > 1e-5 || math.IsNaN(e) {
					t.Errorf("GEMV vs cuBLAS: max relative difference %.3g", e)
				}
			})
		}
	}
}
