package spec

import (
	"math"
	"reflect"
	"testing"
)

func TestGatePrefix(t *testing.T) {
	conf := []float64{0.9, 0.8, 0.5, 0.9}
	// Cumulative: 0.9, 0.72, 0.36, 0.324.
	for _, c := range []struct {
		threshold float64
		want      int
	}{{0, 4}, {0.3, 4}, {0.33, 3}, {0.5, 2}, {0.8, 1}, {0.95, 0}} {
		if got := GatePrefix(conf, c.threshold); got != c.want {
			t.Errorf("threshold %g: %d drafts, want %d", c.threshold, got, c.want)
		}
	}
	if got := GatePrefix(nil, 0.5); got != 0 {
		t.Errorf("no drafts: %d", got)
	}
	if got := ExpectedAccepted(conf, 3); math.Abs(got-(0.9+0.72+0.36)) > 1e-12 {
		t.Errorf("expected accepted %g", got)
	}
}

func TestGateBudget(t *testing.T) {
	conf := [][]float64{
		{0.9, 0.9, 0.9}, // cumulative 0.9, 0.81, 0.729
		{0.5, 0.99},     // 0.5, 0.495
		{0.95, 0.2},     // 0.95, 0.19
	}
	limits := []int{3, 2, 2}
	for _, c := range []struct {
		budget int
		want   []int
	}{
		{-1, []int{3, 2, 2}},
		{0, []int{0, 0, 0}},
		{1, []int{0, 0, 1}},
		{2, []int{1, 0, 1}},
		{4, []int{3, 0, 1}},
		{5, []int{3, 1, 1}},
		{6, []int{3, 2, 1}},
		{100, []int{3, 2, 2}},
	} {
		if got := GateBudget(conf, limits, c.budget); !reflect.DeepEqual(got, c.want) {
			t.Errorf("budget %d: %v, want %v", c.budget, got, c.want)
		}
	}
	// Limits cut before the budget does.
	if got := GateBudget(conf, []int{1, 0, 2}, 10); !reflect.DeepEqual(got, []int{1, 0, 2}) {
		t.Errorf("limits: %v", got)
	}
	// Whatever the budget, the choice maximises the expected accepted
	// drafts among prefix choices of that total (checked by brute force).
	for budget := 0; budget <= 7; budget++ {
		got := GateBudget(conf, limits, budget)
		best := 0.0
		for a := 0; a <= 3; a++ {
			for b := 0; b <= 2; b++ {
				for c := 0; c <= 2; c++ {
					if a+b+c <= budget {
						best = math.Max(best, ExpectedAccepted(conf[0], a)+ExpectedAccepted(conf[1], b)+ExpectedAccepted(conf[2], c))
					}
				}
			}
		}
		sum := 0.0
		for s, n := range got {
			sum += ExpectedAccepted(conf[s], n)
		}
		if math.Abs(sum-best) > 1e-12 {
			t.Errorf("budget %d: %v expects %g accepted, the best is %g", budget, got, sum, best)
		}
	}
}

func TestReliability(t *testing.T) {
	pred := []float64{0.05, 0.15, 0.15, 0.95, 1.0, 0.95}
	hit := []bool{false, true, false, true, true, false}
	table, ece := Reliability(pred, hit, 10)
	if table[0].Count != 1 || table[1].Count != 2 || table[9].Count != 3 {
		t.Fatalf("counts %+v", table)
	}
	// |0.05-0| * 1/6 + |0.15-0.5| * 2/6 + |0.9667-0.6667| * 3/6
	want := 0.05/6 + 0.35*2/6 + (2.9/3-2.0/3)*3/6
	if math.Abs(ece-want) > 1e-12 {
		t.Errorf("ECE %g, want %g", ece, want)
	}
}
