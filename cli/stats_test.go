package cli

import (
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/stages"
)

func TestDeviceIdle(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		in   stages.DeviceTimes
		want string
	}{
		{"cpu backend", stages.DeviceTimes{}, ""},
		{"no pairs yet", stages.DeviceTimes{Timed: true}, "device outside forward passes n/a (no consecutive steps measured)"},
		{"failed", stages.DeviceTimes{Timed: true, Err: "device timeline: start marker: boom"}, "device timeline off: device timeline: start marker: boom"},
		{"all and decode", stages.DeviceTimes{Timed: true,
			All:    stages.StepPairs{N: 4, Busy: 9 * ms, Span: 10 * ms},
			Decode: stages.StepPairs{N: 2, Busy: 4900 * time.Microsecond, Span: 5 * ms}},
			"device outside forward passes 10.0% of 2.500 ms/step (decode steps 2.0% of 2.500 ms)"},
		{"prefill only", stages.DeviceTimes{Timed: true, All: stages.StepPairs{N: 1, Busy: 3 * ms, Span: 4 * ms}},
			"device outside forward passes 25.0% of 4.000 ms/step"},
	}
	for _, tc := range tests {
		if got := deviceIdle(tc.in); got != tc.want {
			t.Errorf("%s: deviceIdle = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestSpecPart(t *testing.T) {
	var none stages.Stats
	if got := specPart(none.Spec()); got != "" {
		t.Errorf("no drafts: specPart = %q, want empty", got)
	}
	if got := specReport(none.Spec()); got != "" {
		t.Errorf("no drafts: specReport = %q, want empty", got)
	}
	var st stages.Stats
	st.RecordSpec(0, 0) // nothing drafted
	for _, a := range []int{4, 3, 1, 0, 2} {
		st.RecordSpec(4, a)
	}
	// 10 of 20 accepted over 5 drafts; per position 4, 3, 2, 1 of 5.
	if got, want := specPart(st.Spec()), " | spec: accept 0.50, mean len 3.0, per-pos 0.80/0.60/0.40/0.20"; got != want {
		t.Errorf("specPart = %q, want %q", got, want)
	}
	if got, want := specReport(st.Spec()), "accept 0.50, mean len 3.0, per-pos 0.80/0.60/0.40/0.20 (accepted 10 of 20 draft tokens, 5 drafts)"; got != want {
		t.Errorf("specReport = %q, want %q", got, want)
	}
}

func TestGraphNodesPart(t *testing.T) {
	tests := []struct {
		in   []stages.GraphNodes
		want string
	}{
		{nil, ""},
		{[]stages.GraphNodes{{Rows: 1, Nodes: 131}}, "; forward graph: 131 nodes (1 row)"},
		{[]stages.GraphNodes{{Rows: 1, Nodes: 131}, {Rows: 8, Nodes: 140}, {Rows: 64, Nodes: 158}},
			"; forward graphs: 131 nodes (1 row) to 158 (64 rows)"},
	}
	for _, tc := range tests {
		if got := graphNodesPart(tc.in); got != tc.want {
			t.Errorf("graphNodesPart(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
