package stages

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

func TestResponder(t *testing.T) {
	var got []engine.RequestOutput
	req := &engine.Request{ID: "r", Params: engine.SamplingParams{N: 2}, OnOutput: func(o engine.RequestOutput) { got = append(got, o) }}
	live := NewResponder()
	if err := live.Add(req); err != nil {
		t.Fatal(err)
	}
	if err := live.Add(req); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Errorf("duplicate id: %v", err)
	}
	steps := []struct {
		out  engine.RequestOutput
		want bool
	}{
		{engine.RequestOutput{RequestID: "r", Index: 0, TokenIDs: []int{1}}, true},
		{engine.RequestOutput{RequestID: "r", Index: 0, Finished: true}, true},
		{engine.RequestOutput{RequestID: "r", Index: 0, TokenIDs: []int{2}}, false}, // after finish
		{engine.RequestOutput{RequestID: "r", Index: 5}, false},                     // no such sequence
		{engine.RequestOutput{RequestID: "x"}, false},                               // unknown request
	}
	for i, s := range steps {
		if got := live.Emit(s.out); got != s.want {
			t.Errorf("emit %d = %v, want %v", i, got, s.want)
		}
	}
	emptied := make(chan error, 1)
	go func() { emptied <- live.WaitEmpty(context.Background()) }()
	if !live.Fail("r", engine.FinishAbort, nil) || live.Has("r") || live.Len() != 0 {
		t.Fatal("Fail did not close the request")
	}
	if err := <-emptied; err != nil {
		t.Fatalf("WaitEmpty = %v", err)
	}
	last := got[len(got)-1]
	if len(got) != 3 || last.Index != 1 || !last.Finished || last.FinishReason != engine.FinishAbort {
		t.Errorf("outputs %+v: want the open sequence 1 aborted", got)
	}
	if live.Fail("r", engine.FinishAbort, nil) {
		t.Error("a second Fail found the request")
	}
	// Drop forgets without answering.
	quiet := &engine.Request{ID: "q", OnOutput: func(engine.RequestOutput) { t.Error("a dropped request was answered") }}
	if err := live.Add(quiet); err != nil {
		t.Fatal(err)
	}
	live.Drop("q")
	if live.Len() != 0 {
		t.Error("Drop kept the request")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	live.Add(&engine.Request{ID: "w"})
	if err := live.WaitEmpty(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitEmpty with a live request and a done ctx = %v", err)
	}
}

// ResolvePlaceholders takes the previous step's tokens from its device
// tensor when the sampler left one, else from its host samples, and refuses
// a previous step that is not the one before.
func TestResolvePlaceholders(t *testing.T) {
	ops := cpu.New(cpu.Options{Threads: 1})
	defer ops.Close()
	step := func(id engine.StepID) *ScheduledStep {
		return &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: id}}
	}
	fromRow, err := kernels.FromI32(ops, []int32{-1, 2, 0}, 3)
	if err != nil {
		t.Fatal(err)
	}
	devTokens, err := kernels.FromI32(ops, []int32{70, 80, 90}, 3)
	if err != nil {
		t.Fatal(err)
	}
	samples := []Sample{{Token: 7}, {Token: 8}, {Token: 9}}
	for _, tc := range []struct {
		name string
		prev *SampledStep
		want []int32
		err  bool
	}{
		{"host samples", &SampledStep{ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{ScheduledStep: step(4)}}, Samples: samples}, []int32{5, 9, 7}, false},
		{"device tokens", &SampledStep{ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{ScheduledStep: step(4)}}, Tokens: devTokens}, []int32{5, 90, 70}, false},
		{"wrong step", &SampledStep{ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{ScheduledStep: step(3)}}, Samples: samples}, nil, true},
		{"no previous step", nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, err := kernels.FromI32(ops, []int32{5, int32(engine.PlaceholderToken), int32(engine.PlaceholderToken)}, 3)
			if err != nil {
				t.Fatal(err)
			}
			ps := &PreparedStep{ScheduledStep: step(5), FromRow: fromRow, Previous: tc.prev}
			err = ResolvePlaceholders(ops, ps, ids)
			if tc.err {
				if err == nil {
					t.Fatal("resolved against the wrong step")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := kernels.ToI32(ops, ids)
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.want {
				if got[i] != tc.want[i] {
					t.Fatalf("ids = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// PendingTokens reads a placeholder's token from the previous step's
// outputs, which the lagged edge from postprocess delivers.
func TestPendingTokens(t *testing.T) {
	res := &ForwardResult{PreparedStep: &PreparedStep{ScheduledStep: &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: 8}}}}
	res.PreviousOutputs = &StepOutputs{StepID: 7, Sampled: []engine.SampledTokens{{TokenIDs: []int{11}}, {TokenIDs: []int{12}}}}
	if got := PendingTokens(res, &engine.SequenceMetadata{InputFromRow: 1}); len(got) != 1 || got[0] != 12 {
		t.Errorf("pending = %v, want [12]", got)
	}
	if got := PendingTokens(res, &engine.SequenceMetadata{InputFromRow: -1}); got != nil {
		t.Errorf("no placeholder gave %v", got)
	}
	res.PreviousOutputs.StepID = 6
	if got := PendingTokens(res, &engine.SequenceMetadata{InputFromRow: 1}); got != nil {
		t.Errorf("outputs of step 6 used for step 8: %v", got)
	}
}

// The schedule stage owns the scheduler: it applies the finishes
// post-processing reports, answers what the scheduler ends on its own, and
// answers a drain once nothing is unfinished and nothing is in flight.
func TestScheduleFeedback(t *testing.T) {
	sched, err := engine.NewScheduler(engine.SchedulerConfig{MaxNumSeqs: 4, MaxNumBatchedTokens: 64, MaxModelLen: 64,
		BlockSize: 4, NumBlocks: 32, VocabSize: 100, EOSTokenIDs: []int{2}})
	if err != nil {
		t.Fatal(err)
	}
	resp := NewResponder()
	var outs []engine.RequestOutput
	for _, id := range []string{"a", "b"} {
		p := engine.DefaultSamplingParams()
		p.MaxTokens = 8
		if err := resp.Add(&engine.Request{ID: id, Params: p, OnOutput: func(o engine.RequestOutput) { outs = append(outs, o) }}); err != nil {
			t.Fatal(err)
		}
	}
	s := NewSchedule(ScheduleDeps{Scheduler: sched, Responder: resp})
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		p := engine.DefaultSamplingParams()
		p.MaxTokens = 8
		if err := s.Add(ctx, Admission{Seq: engine.NewSequence(id, []int{5, 6, 7}, p, time.Now())}); err != nil {
			t.Fatal(err)
		}
	}
	drained := make(chan struct{})
	s.Add(ctx, Admission{Drain: drained})
	step, ok, err := s.Plan(ctx)
	if err != nil || !ok {
		t.Fatalf("Plan = %v, %v", ok, err)
	}
	// Row 0 ("a") samples EOS: the scheduler ends it, and post-processing
	// (as the test plays it) did not report it: the stage answers it. Row 1
	// ("b") ends on a stop string post-processing found.
	var sampled []engine.SampledTokens
	var bID engine.SeqID
	for _, m := range step.Seqs {
		tok := 9
		if m.RequestID == "a" {
			tok = 2
		} else {
			bID = m.SeqID
		}
		sampled = append(sampled, engine.SampledTokens{SeqID: m.SeqID, TokenIDs: []int{tok}})
	}
	fb := &StepOutputs{StepID: step.Outputs.StepID, Sampled: sampled,
		Finished: []engine.FinishedSequence{{SeqID: bID, RequestID: "b", Reason: engine.FinishStop}}}
	select {
	case <-drained:
		t.Fatal("drained with a step in flight")
	default:
	}
	if err := s.Feedback(ctx, fb); err != nil {
		t.Fatal(err)
	}
	if sched.HasUnfinished() {
		t.Error("the scheduler still runs a sequence that post-processing ended")
	}
	if len(outs) != 1 || outs[0].RequestID != "a" || !outs[0].Finished || outs[0].FinishReason != engine.FinishStop {
		t.Errorf("outputs %+v: want a's finish answered by the schedule stage", outs)
	}
	select {
	case <-drained:
	default:
		t.Error("not drained once idle")
	}
}

// ForwardTime never decreases when its source switches from the host's
// clock to the device timeline, which trails it.
func TestForwardTimeIsMonotonic(t *testing.T) {
	var s Stats
	s.ForwardNanos.Store(int64(5 * time.Millisecond))
	if got := s.ForwardTime(); got != 5*time.Millisecond {
		t.Fatalf("host time %v", got)
	}
	s.deviceTimed.Store(true)
	s.forwardDeferred.Store(true)
	s.devBusy.Store(int64(3 * time.Millisecond)) // the timeline trails
	if got := s.ForwardTime(); got != 5*time.Millisecond {
		t.Errorf("after the switch: %v, want the 5ms already reported", got)
	}
	s.devBusy.Store(int64(7 * time.Millisecond))
	if got := s.ForwardTime(); got != 7*time.Millisecond {
		t.Errorf("once the timeline caught up: %v, want 7ms", got)
	}
}

// Each forward pass counts in the bucket of its own tokens.
func TestStepTokenCounts(t *testing.T) {
	var s Stats
	for _, tokens := range []int{1, 1, 8, 9, 300, 20000} {
		s.record(&engine.SchedulerOutputs{NumPrefillTokens: tokens - 1, NumDecodeTokens: 1}, engine.StepCost{}, time.Millisecond)
	}
	got := s.StepTokenCounts()
	want := make([]int64, len(StepTokenBounds)+1)
	want[0], want[1], want[2], want[7], want[len(want)-1] = 2, 1, 1, 1, 1 // 1, 1 | 8 | 9 | 300 (<= 512) | past 16384
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("bucket counts %v, want %v", got, want)
		}
	}
	if s.Steps.Load() != 6 {
		t.Errorf("%d steps", s.Steps.Load())
	}
}
