package cpu

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// BenchmarkRMSNorm runs RMSNorm and AddRMSNorm over rows of the shipped
// default model's width (256): one row (a batch-1 decode step) and 64 (a
// batch-64 one); a step calls them about 25 times. DEEPINFER_BENCH_SIMD
// picks the backend's cpu.simd. Figures: kernels/cpu/simd/BENCH.md, "RMSNorm
// on the simd path".
func BenchmarkRMSNorm(b *testing.B) {
	const n = 256
	for _, rows := range []int{1, 64} {
		for _, add := range []bool{false, true} {
			name := "rms_norm"
			if add {
				name = "add_rms_norm"
			}
			b.Run(fmt.Sprintf("%s/rows%d", name, rows), func(b *testing.B) {
				be := New(Options{SIMD: os.Getenv("DEEPINFER_BENCH_SIMD")})
				b.Cleanup(func() { be.Close() })
				r := rand.New(rand.NewPCG(3, 4))
				x := put(b, be, kernels.F32, randVals(r, rows*n, 1), rows, n)
				res := put(b, be, kernels.F32, randVals(r, rows*n, 1), rows, n)
				w := put(b, be, kernels.F32, randVals(r, n, 1), n)
				out := alloc(b, be, rows, n)
				for b.Loop() {
					var err error
					if add {
						err = be.AddRMSNorm(out, res, x, w, 1e-6)
					} else {
						err = be.RMSNorm(out, x, w, 1e-6)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkAdd runs Add over rows of the default model's width (256): 1
// and 64 rows, out a third tensor (the forward pass's last residual add,
// and the MoE's shared and routed sums where the backend adds them apart).
// Figures: kernels/cpu/simd/BENCH.md, "RMSNorm on the simd path".
func BenchmarkAdd(b *testing.B) {
	const n = 256
	for _, rows := range []int{1, 64} {
		b.Run(fmt.Sprintf("rows%d", rows), func(b *testing.B) {
			be := New(Options{SIMD: os.Getenv("DEEPINFER_BENCH_SIMD")})
			b.Cleanup(func() { be.Close() })
			r := rand.New(rand.NewPCG(5, 6))
			x := put(b, be, kernels.F32, randVals(r, rows*n, 1), rows, n)
			y := put(b, be, kernels.F32, randVals(r, rows*n, 1), rows, n)
			out := alloc(b, be, rows, n)
			for b.Loop() {
				if err := be.Add(out, x, y); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
