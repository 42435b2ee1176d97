package bench_test

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/bench"
)

func ExampleSummarize() {
	s := bench.Summarize([]float64{12, 10, 11, 40, 13})
	fmt.Printf("n=%d mean=%.1f p50=%g p90=%g p99=%g min=%g max=%g\n", s.Count, s.Mean, s.Median, s.P90, s.P99, s.Min, s.Max)
	// Output: n=5 mean=17.2 p50=12 p90=40 p99=40 min=10 max=40
}
