package spec

import (
	"math"
	"reflect"
	"testing"
	"time"
)

func TestGateCost(t *testing.T) {
	conf := [][]float64{{0.9, 0.5 / 0.9, 0.2}, {0.6, 0.5}, {0.3}} // P: 0.9 0.5 0.1 | 0.6 0.3 | 0.3
	all := []int{3, 2, 1}
	for _, tc := range []struct {
		name         string
		limits       []int
		base, perRow float64
		want         []int
	}{
		// Rows cost nothing: every draft pays.
		{"free rows", all, 1, 0, []int{3, 2, 1}},
		// A row costs a whole step's share of a token: no draft earns it.
		{"rows only", all, 0, 1, []int{0, 0, 0}},
		// base 10, perRow 1: rates 3/13, 3.9/14, 4.5/15, 5/16, 5.3/17,
		// 5.6/18, 5.7/19 for B = 0..6: the best is B = 3 (0.9, 0.6, 0.5).
		{"fixed cost", all, 10, 1, []int{2, 1, 0}},
		// A cheaper row takes the drafts at 0.3 too (B = 5: 5.6/20.5 =
		// 0.2732 against 5.0/19.5 = 0.2564 at B = 3 and 5.7/21 at B = 6).
		{"cheap rows", all, 18, 0.5, []int{2, 2, 1}},
		// Limits bound every sequence.
		{"limits", []int{1, 0, 1}, 1, 0, []int{1, 0, 1}},
		// Not a cost (a non-positive step): every draft the limits allow.
		{"no cost", all, -5, 1, []int{3, 2, 1}},
	} {
		if got := GateCost(conf, tc.limits, tc.base, tc.perRow); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: GateCost = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := GateCost(nil, nil, 1, 1); len(got) != 0 {
		t.Errorf("no sequences: %v", got)
	}
}

// GateCost's choice is the best of every budget: no prefix-closed set of
// drafts has a higher rate (checked by brute force over each sequence's
// prefix lengths).
func TestGateCostIsBest(t *testing.T) {
	conf := [][]float64{{0.95, 0.9, 0.4}, {0.7, 0.7, 0.7}, {0.2, 0.9}, {0.99}}
	limits := []int{3, 3, 2, 1}
	rate := func(n []int, base, perRow float64) float64 {
		tokens, rows := float64(len(conf)), float64(len(conf))
		for s, k := range n {
			p := 1.0
			for j := range k {
				p *= conf[s][j]
				tokens += p
				rows++
			}
		}
		return tokens / (base + perRow*rows)
	}
	for _, c := range []struct{ base, perRow float64 }{{1, 0.01}, {4, 0.3}, {4, 1}, {1, 0.5}, {10, 0.2}} {
		got := GateCost(conf, limits, c.base, c.perRow)
		best := 0.0
		n := make([]int, len(conf))
		var walk func(s int)
		walk = func(s int) {
			if s == len(conf) {
				best = math.Max(best, rate(n, c.base, c.perRow))
				return
			}
			for k := 0; k <= limits[s]; k++ {
				n[s] = k
				walk(s + 1)
			}
		}
		walk(0)
		if r := rate(got, c.base, c.perRow); r < best*(1-1e-12) {
			t.Errorf("base %g perRow %g: GateCost %v rate %g, best %g", c.base, c.perRow, got, r, best)
		}
	}
}

func TestRowCost(t *testing.T) {
	step := func(rows int, base, perRow float64) time.Duration {
		return time.Duration((base + perRow*float64(rows)) * float64(time.Second))
	}
	c := NewRowCost()
	if _, _, ok := c.Line(8); ok {
		t.Fatal("a line with no steps")
	}
	// Steps of 8 sequences at 8 rows only: no spread, no slope.
	for range 40 {
		c.Observe(8, 8, step(8, 0.002, 0.0005))
	}
	if _, _, ok := c.Line(8); ok {
		t.Error("a line from steps of one row count")
	}
	// Rows 8..20: the line comes out exactly; a stall is left out.
	for i := range 40 {
		c.Observe(8, 8+i%13, step(8+i%13, 0.002, 0.0005))
	}
	c.Observe(8, 9, time.Second)
	base, perRow, ok := c.Line(8)
	if !ok || math.Abs(base-0.002) > 1e-9 || math.Abs(perRow-0.0005) > 1e-9 {
		t.Errorf("line %g + %g*rows (ok %v), want 0.002 + 0.0005*rows", base, perRow, ok)
	}
	// 8 to 15 sequences are one class; 16 another, still empty.
	if _, _, ok := c.Line(15); !ok {
		t.Error("15 sequences: not 8's class")
	}
	if _, _, ok := c.Line(16); ok {
		t.Error("16 sequences: a line without steps")
	}
	// The machine slows down: newer steps take over the line.
	for i := range 600 {
		c.Observe(8, 8+i%13, step(8+i%13, 0.004, 0.001))
	}
	if base, perRow, _ := c.Line(8); math.Abs(base-0.004) > 1e-4 || math.Abs(perRow-0.001) > 1e-5 {
		t.Errorf("after the change: %g + %g*rows, want 0.004 + 0.001*rows", base, perRow)
	}
	// Rows that stop varying fade the spread: the line is withdrawn.
	for range 600 {
		c.Observe(8, 8, step(8, 0.004, 0.001))
	}
	if _, _, ok := c.Line(8); ok {
		t.Error("a line after 600 steps of one row count")
	}
}
