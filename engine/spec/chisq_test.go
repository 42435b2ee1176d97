package spec

import (
	"math"
	"strings"
	"testing"
)

func TestChiSquare(t *testing.T) {
	cases := []struct {
		name     string
		observed []int
		expected []float64
		stat     float64
		df       int
	}{
		{"perfect fit", []int{25, 25, 50}, []float64{0.25, 0.25, 0.5}, 0, 2},
		// (60-50)^2/50 + (40-50)^2/50 = 4.
		{"two cells", []int{60, 40}, []float64{0.5, 0.5}, 4, 1},
		{"expected as counts", []int{60, 40}, []float64{50, 50}, 4, 1},
		{"expected as weights", []int{60, 40}, []float64{3, 3}, 4, 1},
		{"impossible cell unobserved", []int{60, 0, 40}, []float64{0.5, 0, 0.5}, 4, 1},
		{"impossible cell observed", []int{60, 1, 40}, []float64{0.5, 0, 0.5}, math.Inf(1), 1},
		{"no observations", []int{0, 0}, []float64{0.5, 0.5}, 0, 1},
		{"single cell", []int{10}, []float64{1}, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stat, df := ChiSquare(c.observed, c.expected)
			if close := stat == c.stat || math.Abs(stat-c.stat) <= 1e-12; !close || df != c.df {
				t.Fatalf("ChiSquare(%v, %v) = %v, %d; want %v, %d", c.observed, c.expected, stat, df, c.stat, c.df)
			}
		})
	}
}

func TestChiSquarePValue(t *testing.T) {
	cases := []struct {
		stat float64
		df   int
		want float64
	}{
		{3.841458820694124, 1, 0.05}, // the 95% quantiles
		{5.991464547107979, 2, 0.05},
		{18.307038053275146, 10, 0.05},
		{4, 1, 0.04550026389635842},
		{0, 3, 1},
		{math.Inf(1), 3, 0},
		{0, 0, 1},
		{2, 0, 0},
	}
	for _, c := range cases {
		if got := ChiSquarePValue(c.stat, c.df); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("ChiSquarePValue(%v, %d) = %v, want %v", c.stat, c.df, got, c.want)
		}
	}
	if got := ChiSquarePValue(math.NaN(), 2); !math.IsNaN(got) {
		t.Errorf("ChiSquarePValue(NaN, 2) = %v, want NaN", got)
	}
}

func TestChiSquarePanics(t *testing.T) {
	cases := []struct {
		name     string
		observed []int
		expected []float64
		want     string
	}{
		{"lengths", []int{1, 2}, []float64{1}, "2 observed cells, 1 expected"},
		{"negative count", []int{1, -2}, []float64{1, 1}, "observed count 1 is -2"},
		{"negative weight", []int{1, 2}, []float64{1, -1}, "expected weight 1 is -1"},
		{"NaN weight", []int{1, 2}, []float64{math.NaN(), 1}, "expected weight 0 is NaN"},
		{"infinite weight", []int{1, 2}, []float64{math.Inf(1), 1}, "expected weight 0 is +Inf"},
		{"zero weights", []int{1, 2}, []float64{0, 0}, "expected weights sum to 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if r, _ := recover().(string); !strings.Contains(r, c.want) {
					t.Fatalf("panic %q, want one containing %q", r, c.want)
				}
			}()
			ChiSquare(c.observed, c.expected)
		})
	}
}
