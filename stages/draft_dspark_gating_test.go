package stages

import (
	"fmt"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/spec"
)

// With the step budget "auto" the DSpark drafter measures, per batch
// size, whether gating (reading the confidences back) pays, on the steps
// each choice drafted for: where the read costs more than the rows it
// saves it ends up verifying every draft unread, and where gating pays it
// keeps gating. Each simulated step's turn and tokens follow the choice
// made when the step before drafted for it. Drafting from the device's
// verification, a step has no host outcome when the drafter sees it (its
// sample rows are known, its samples and Verified not yet): the outcome
// arrives before the next step, as the draft stage awaits it.
func TestDSparkAutoMeasuresGating(t *testing.T) {
	const rows, steps = 8, 2000
	cases := []struct {
		name      string
		gated     time.Duration // a turn after a gated drafting step
		gatedTok  int           // its tokens
		unread    time.Duration // a turn after one that verified every draft unread
		unreadTok int
		wantRead  bool
	}{
		// An H100 at batch 8: rows nearly free, the read costs a fifth.
		{"read costs more than it saves", 12 * time.Millisecond, 24, 10 * time.Millisecond, 27, false},
		// A compute-bound CPU: the rows gating drops cost more than the read.
		{"gating pays", 10 * time.Millisecond, 24, 14 * time.Millisecond, 27, true},
	}
	for _, fromDevice := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/fromDevice=%v", tc.name, fromDevice), func(t *testing.T) {
				clock := time.Unix(0, 0)
				p := &dsparkDrafter{cost: spec.NewRowCost(), gating: spec.NewController(1, 16, 8), now: func() time.Time { return clock }}
				read, reads := true, 0
				for id := engine.StepID(1); id <= steps; id++ {
					turn, tok := tc.unread, tc.unreadTok
					if read {
						turn, tok = tc.gated, tc.gatedTok
					}
					clock = clock.Add(turn)
					verified := make([]VerifiedRow, rows)
					for i := range verified {
						verified[i].TokenIDs = make([]int, tok/rows+min(1, max(0, tok%rows-i)))
					}
					step := &SampledStep{ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{ScheduledStep: &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: id, NumDecodeSeqs: rows}}}}, Verified: verified}
					if fromDevice {
						step.Verified, step.Rows = nil, make([]RowRef, rows)
					}
					p.observe(step)
					read = p.readsConfidence(step, rows)
					if fromDevice {
						step.Verified = verified // the host outcome, awaited before the next step
					}
					if id > steps/2 && read {
						reads++
					}
				}
				share := float64(reads) / (steps / 2)
				t.Logf("gated in %.3f of the second half's steps", share)
				if tc.wantRead && share < 0.85 || !tc.wantRead && share > 0.15 {
					t.Errorf("gated in %.2f of the second half's steps, want gating %v", share, tc.wantRead)
				}
			})
		}
	}
}
