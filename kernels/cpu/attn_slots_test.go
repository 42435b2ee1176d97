package cpu

import "testing"

// TestPlanSlots: attnPlan.slots writes attnPlan.slot of every key of the
// range, for ranges that start, end and cross block boundaries.
func TestPlanSlots(t *testing.T) {
	pl := &attnPlan{blockSize: 16, blocks: [][]int32{{7, 2, 9, 0, 5}, {3}}}
	cases := []struct {
		name     string
		seq, t0  int
		numSlots int
	}{
		{"one key", 0, 0, 1},
		{"one block", 0, 0, 16},
		{"mid-block start", 0, 5, 11},
		{"across blocks", 0, 13, 40},
		{"all keys", 0, 0, 80},
		{"from a later block", 0, 33, 47},
		{"another sequence", 1, 2, 14},
		{"empty", 0, 10, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := make([]int32, tc.numSlots)
			pl.slots(got, tc.seq, tc.t0)
			for j, v := range got {
				if want := pl.slot(tc.seq, tc.t0+j); int(v) != want {
					t.Fatalf("key %d: slot %d, want %d", tc.t0+j, v, want)
				}
			}
		})
	}
}
