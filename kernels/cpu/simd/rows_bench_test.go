package simd

import (
	"fmt"
	"testing"
)

// BenchmarkLinearRows runs LinearBF16 on one goroutine at the default
// model's decode shapes (k = 256: the LM head's 8192 columns, the
// attention and expert projections) for 1 to 8 rows, and reports the time
// per row: where a row count takes another path (the widened GEMM from 6
// rows) or pays twice for the weights (5 rows: a speculative decode's
// verify rows at k = 4). Compare row counts within one run.
//
//	go test -run '^$' -bench LinearRows -benchtime 2000x ./kernels/cpu/simd
func BenchmarkLinearRows(b *testing.B) {
	for _, sh := range []struct{ n, k int }{{8192, 256}, {1024, 256}, {384, 256}, {256, 256}} {
		w := make([]uint16, sh.n*sh.k)
		for i := range w {
			w[i] = 0x3c00 + uint16(i%97) // bf16 values in [0.0078, 0.011)
		}
		for _, m := range []int{1, 2, 4, 5, 6, 8} {
			x := make([]float32, m*sh.k)
			for i := range x {
				x[i] = float32(i%7) * 0.1
			}
			out := make([]float32, m*sh.n)
			b.Run(fmt.Sprintf("n%d_k%d/m%d", sh.n, sh.k, m), func(b *testing.B) {
				for range b.N {
					LinearBF16(out, x, w, m, sh.n, sh.k, 0, sh.n)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(m), "ns/row")
			})
		}
	}
}
