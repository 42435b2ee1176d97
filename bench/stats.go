// Package bench measures the engine: offline throughput through
// llm.LLM.Generate (the nano-vllm workload, or text workloads cut from the
// default model's held-out text, editing requests among them), a
// comparison of speculative-decoding methods on one workload
// (RunSpeculative), and online serving against an OpenAI-compatible server
// (Poisson arrivals, streamed answers), reported as mean and p50/p90/p99
// summaries computed with gonum's stat package, a JSON result and PNG
// histograms of the latency distributions.
package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/gonum/stat"
)

// Summary describes a sample: its size, mean, empirical quantiles (the
// smallest sample value with at least that fraction of the samples at or
// below it, gonum's stat.Empirical) and extremes. All zero for an empty
// sample.
type Summary struct {
	Count  int     `json:"count"`
	Mean   float64 `json:"mean"`
	Median float64 `json:"p50"`
	P90    float64 `json:"p90"`
	P99    float64 `json:"p99"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// Summarize computes the Summary of xs (not modified). Cost: a sorted copy,
// O(n log n).
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	sorted := slices.Clone(xs)
	slices.Sort(sorted)
	q := func(p float64) float64 { return stat.Quantile(p, stat.Empirical, sorted, nil) }
	return Summary{
		Count: len(sorted), Mean: stat.Mean(sorted, nil),
		Median: q(0.5), P90: q(0.9), P99: q(0.99),
		Min: sorted[0], Max: sorted[len(sorted)-1],
	}
}

// WriteJSON writes v, indented, to path.
func WriteJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// Percentile is the empirical p-th percentile (0 < p <= 100) of xs, as
// Summary computes its quantiles; 0 for an empty sample. xs is not
// modified. Cost: a sorted copy, O(n log n).
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sorted := slices.Clone(xs)
	slices.Sort(sorted)
	return stat.Quantile(p/100, stat.Empirical, sorted, nil)
}

// Percentiles returns, for each distribution named in metrics (e.g.
// "ttft", "e2el") and each percentile p in ps (0 < p <= 100), the p-th
// percentile of its samples, keyed as vLLM's benchmark results name them:
// "p99_ttft_ms" (the distribution's unit ends the key). Metrics with no
// distribution or no samples are left out. Cost: one sorted copy per
// metric, O(n log n).
func Percentiles(dists []Distribution, metrics []string, ps []float64) map[string]float64 {
	out := map[string]float64{}
	for _, name := range metrics {
		i := slices.IndexFunc(dists, func(d Distribution) bool { return d.Name == name })
		if i < 0 || len(dists[i].Values) == 0 {
			continue
		}
		d := dists[i]
		sorted := slices.Clone(d.Values)
		slices.Sort(sorted)
		for _, p := range ps {
			key := "p" + strconv.FormatFloat(p, 'f', -1, 64) + "_" + d.Name
			if d.Unit != "" {
				key += "_" + d.Unit
			}
			out[key] = stat.Quantile(p/100, stat.Empirical, sorted, nil)
		}
	}
	return out
}
