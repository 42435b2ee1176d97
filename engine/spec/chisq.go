package spec

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat/distuv"
)

// ChiSquare returns Pearson's chi-square statistic of observed counts
// against expected weights, and its degrees of freedom. expected holds one
// weight per cell (probabilities or expected counts: it is normalized to
// the total of observed). Cells of expected weight 0 do not count towards
// the statistic or df, unless observed there, which gives stat = +Inf (an
// impossible outcome happened); with no observations stat is 0. df is the
// number of cells of positive expected weight, minus 1. The chi-square
// approximation wants an expected count of about 5 or more in every
// counted cell: pool rarer cells first.
//
// It panics when the lengths differ, an observed count is negative, or the
// expected weights have a NaN, negative or infinite entry or sum to 0.
// Cost: O(len(observed)); no allocation.
func ChiSquare(observed []int, expected []float64) (stat float64, df int) {
	if len(observed) != len(expected) {
		panic(fmt.Sprintf("spec.ChiSquare: %d observed cells, %d expected", len(observed), len(expected)))
	}
	var n int
	var total float64
	cells := 0
	for i, e := range expected {
		if !(e >= 0) || math.IsInf(e, 1) {
			panic(fmt.Sprintf("spec.ChiSquare: expected weight %d is %v", i, e))
		}
		if observed[i] < 0 {
			panic(fmt.Sprintf("spec.ChiSquare: observed count %d is %d", i, observed[i]))
		}
		if e > 0 {
			cells++
		}
		total += e
		n += observed[i]
	}
	if !(total > 0) {
		panic("spec.ChiSquare: expected weights sum to 0")
	}
	df = cells - 1
	if n == 0 {
		return 0, df
	}
	scale := float64(n) / total
	for i, e := range expected {
		o := float64(observed[i])
		if e == 0 {
			if o > 0 {
				return math.Inf(1), df
			}
			continue
		}
		e *= scale
		stat += (o - e) * (o - e) / e
	}
	return stat, df
}

// ChiSquarePValue returns the probability that a chi-square variable with
// df degrees of freedom is at least stat: the p-value of ChiSquare's
// statistic (small values reject the hypothesis that the counts follow the
// expected weights). It is 0 for stat = +Inf; with df < 1 (one counted
// cell, where the statistic is 0 unless an impossible outcome happened) it
// is 1 for stat <= 0 and 0 otherwise. Cost: one regularized incomplete
// gamma function (gonum's distuv.ChiSquared).
func ChiSquarePValue(stat float64, df int) float64 {
	switch {
	case math.IsNaN(stat):
		return math.NaN()
	case math.IsInf(stat, 1):
		return 0
	case df < 1 && stat <= 0:
		return 1
	case df < 1:
		return 0
	case stat <= 0:
		return 1
	}
	return distuv.ChiSquared{K: float64(df)}.Survival(stat)
}
