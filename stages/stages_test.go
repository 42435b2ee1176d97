package stages

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

func TestRequestsTable(t *testing.T) {
	var got []engine.RequestOutput
	req := &engine.Request{ID: "r", Params: engine.SamplingParams{N: 2}, OnOutput: func(o engine.RequestOutput) { got = append(got, o) }}
	live := NewRequests()
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
	if !live.Fail("r", engine.FinishAbort, nil) || live.Has("r") || live.Len() != 0 {
		t.Fatal("Fail did not close the request")
	}
	last := got[len(got)-1]
	if len(got) != 3 || last.Index != 1 || !last.Finished || last.FinishReason != engine.FinishAbort {
		t.Errorf("outputs %+v: want the open sequence 1 aborted", got)
	}
	if live.Fail("r", engine.FinishAbort, nil) {
		t.Error("a second Fail found the request")
	}
}

func TestMetadataZOS(t *testing.T) {
	ops := cpu.New(cpu.Options{Threads: 1})
	defer ops.Close()
	z := NewMetadataZOS()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// Sampling of step 2 waits for post-processing of step 1.
	waited := make(chan error, 1)
	go func() { waited <- z.waitPostprocessed(ctx, 1) }()
	select {
	case err := <-waited:
		t.Fatalf("waitPostprocessed returned before step 1 was post-processed: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	z.postprocessed(1)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}

	// Step 3's placeholders come from step 2's published tokens.
	got := make(chan *zosStep, 1)
	go func() {
		e, err := z.sampled(ctx, 2)
		if err != nil {
			t.Error(err)
		}
		got <- e
	}()
	z.publish(2, nil, nil, []int{7, 8, 9})
	if e := <-got; e.host[1] != 8 {
		t.Errorf("published host tokens %v", e.host)
	}
	m := &engine.SequenceMetadata{InputFromRow: 2}
	if p := z.pendingTokens(3, m); len(p) != 1 || p[0] != 9 {
		t.Errorf("pending tokens %v, want [9]", p)
	}
	if p := z.pendingTokens(3, &engine.SequenceMetadata{InputFromRow: -1}); p != nil {
		t.Errorf("no placeholder gave %v", p)
	}
	z.postprocessed(3) // forgets steps before 3
	if p := z.pendingTokens(3, m); p != nil {
		t.Errorf("step 2 kept after step 3 was post-processed: %v", p)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if _, err := z.sampled(cctx, 9); !errors.Is(err, context.Canceled) {
		t.Errorf("sampled on a cancelled context: %v", err)
	}
}
