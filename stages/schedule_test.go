package stages

import (
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/spec"
)

// The drafts controller measures every step with decode rows (pure decode
// and mixed) and skips steps of prompt chunks alone.
func TestMeasuredByDrafts(t *testing.T) {
	for _, tc := range []struct {
		kind engine.StepKind
		want bool
	}{
		{engine.StepEmpty, false},
		{engine.StepPrefill, false},
		{engine.StepDecode, true},
		{engine.StepMixed, true},
	} {
		if got := measuredByDrafts(tc.kind); got != tc.want {
			t.Errorf("measuredByDrafts(%v) = %v, want %v", tc.kind, got, tc.want)
		}
	}
}

// A workload where drafts pay on pure decode steps and cost more on mixed
// ones (a new prompt's chunk among the decode rows: the drafter's pass
// over the prompt, the draft slots taking the prompt's budget), every
// other step mixed, as under continuous batching at a large batch. End to
// end no drafts is faster; measuring the steps measuredByDrafts names, the
// controller finds that, where measuring decode steps alone it would run
// one draft.
func TestDraftsControllerSeesMixedSteps(t *testing.T) {
	ms := time.Millisecond
	// Per draft length 0, 1: tokens a step emits and a step's time.
	tokens := []int{64, 110}
	decode := []time.Duration{10 * ms, 14 * ms} // 6400 vs 7857 tokens/s
	mixed := []time.Duration{20 * ms, 40 * ms}  // 3200 vs 2750
	// End to end (one of each): 128/30 ms = 4267 against 220/54 ms = 4074.
	run := func(measured func(engine.StepKind) bool) []int {
		c := spec.NewController(1, 16, 8)
		now := time.Unix(0, 0)
		c.Skip(now)
		count := make([]int, 2)
		for i := range 16 * 200 {
			kind, took := engine.StepDecode, decode
			if i%2 == 1 {
				kind, took = engine.StepMixed, mixed
			}
			k := c.Decide(64)
			count[k]++
			now = now.Add(took[k])
			if measured(kind) {
				c.Observe(64, k, tokens[k], 0, now)
			} else {
				c.Skip(now)
			}
		}
		return count
	}
	if got := run(measuredByDrafts); got[0] < 8*got[1] {
		t.Errorf("measuring mixed steps: steps at 0 and 1 drafts %v, want mostly 0", got)
	}
	decodeOnly := func(k engine.StepKind) bool { return k == engine.StepDecode }
	if got := run(decodeOnly); got[1] < 8*got[0] {
		t.Errorf("measuring decode steps alone: steps at 0 and 1 drafts %v, want mostly 1 (the test's premise)", got)
	}
}
