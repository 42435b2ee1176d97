package stages

import (
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
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
