package stages

import "testing"

// The device sampler takes the drafters' greedy row as it is.
func TestGreedyRowIsValid(t *testing.T) {
	row := greedyRow()
	if err := row.Check(8192, nil); err != nil {
		t.Fatal(err)
	}
}
