package stages

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func init() {
	pipeline.Register("requests", "default", func(a pipeline.Args) (*pipeline.Node, error) {
		rt, err := runtimeOf(a)
		if err != nil {
			return nil, err
		}
		return pipeline.NewSource[*engine.Request](rt.Requests), nil
	})
	registerStage("tokenize", "default", func(rt *Runtime) pipeline.Stage[*engine.Request, *engine.Sequence] {
		return newTokenize(rt)
	})
	pipeline.Register("schedule", "default", func(a pipeline.Args) (*pipeline.Node, error) {
		rt, err := runtimeOf(a)
		if err != nil {
			return nil, err
		}
		return pipeline.NewPlanner[*engine.Sequence, *StepOutputs, *ScheduledStep](&schedule{rt: rt}), nil
	})
}

// tokenize turns a request into a validated sequence. A bad request is
// answered here with FinishError and goes no further (pipeline.ErrSkip).
type tokenize struct {
	rt   *Runtime
	seed *rand.Rand // seeds requests that bring none, in arrival order
}

func newTokenize(rt *Runtime) *tokenize {
	return &tokenize{rt: rt, seed: rand.New(rand.NewPCG(uint64(rt.Seed), 0x5eed))}
}

func (t *tokenize) Process(_ context.Context, req *engine.Request) (*engine.Sequence, error) {
	seq, err := t.sequence(req)
	if err != nil {
		t.rt.Front.Add(-1)
		if errors.Is(err, errDuplicateID) {
			// The live request with this id must not be answered on its behalf.
			if req.OnOutput != nil {
				req.OnOutput(engine.RequestOutput{RequestID: req.ID, Finished: true, FinishReason: engine.FinishError, Err: err, FinishTime: time.Now()})
			}
			return nil, pipeline.ErrSkip
		}
		t.rt.Live.Fail(req.ID, engine.FinishError, err)
		return nil, pipeline.ErrSkip
	}
	return seq, nil
}

var errDuplicateID = errors.New("duplicate request id")

func (t *tokenize) sequence(req *engine.Request) (*engine.Sequence, error) {
	if err := t.rt.Live.Add(req); err != nil {
		return nil, fmt.Errorf("%w: %w", errDuplicateID, err)
	}
	params := req.Params
	if params.Seed == nil {
		s := int64(t.seed.Uint64() >> 1)
		params.Seed = &s
	}
	if err := params.Validate(t.rt.VocabSize); err != nil {
		return nil, err
	}
	ids := req.PromptTokenIDs
	if len(ids) == 0 {
		if t.rt.Tokenizer == nil {
			return nil, fmt.Errorf("%w: the model has no tokenizer: give the prompt as token ids", engine.ErrInvalidRequest)
		}
		for _, id := range t.rt.Tokenizer.Encode(req.Prompt, true) {
			ids = append(ids, int(id))
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: the prompt is empty", engine.ErrInvalidRequest)
	}
	for i, id := range ids {
		if id < 0 || id >= t.rt.VocabSize {
			return nil, fmt.Errorf("%w: prompt token %d is %d, outside the vocabulary [0, %d)", engine.ErrInvalidRequest, i, id, t.rt.VocabSize)
		}
	}
	arrival := req.Arrival
	if arrival.IsZero() {
		arrival = time.Now()
	}
	return engine.NewSequence(req.ID, ids, params, arrival), nil
}

// schedule is the head of the step loop: it adds sequences to the
// scheduler and plans a step whenever the loop has room. It recycles the
// metadata of a step once that step's outputs come back around the loop
// (nothing downstream reads it any more), which saves the scheduler's
// largest per-step allocation.
type schedule struct {
	rt    *Runtime
	spare [][]engine.SequenceMetadata
	busy  map[engine.StepID][]engine.SequenceMetadata
	asked map[engine.StepID]*stepAsk // gated steps waiting for their outputs
}

// Wake lets a StepGate's Step reach a planner waiting for input.
func (s *schedule) Wake() <-chan struct{} {
	if s.rt.Gate == nil {
		return nil
	}
	return s.rt.Gate.wake
}

func (s *schedule) Add(_ context.Context, seq *engine.Sequence) error {
	defer s.rt.Front.Add(-1)
	id := seq.RequestID()
	if _, err := s.rt.Scheduler.Add(seq); err != nil {
		// A request the scheduler refuses (too long, ...) fails alone.
		s.rt.Live.Fail(id, engine.FinishError, err)
		return nil
	}
	if !s.rt.Live.Has(id) {
		s.rt.Scheduler.Abort(id) // aborted while it was being tokenized
	}
	return nil
}

func (s *schedule) Feedback(_ context.Context, done *StepOutputs) error {
	if a, ok := s.asked[done.StepID]; ok {
		delete(s.asked, done.StepID)
		a.done <- done
	}
	if buf, ok := s.busy[done.StepID]; ok {
		delete(s.busy, done.StepID)
		s.spare = append(s.spare, buf[:0])
	}
	return nil
}

func (s *schedule) Plan(context.Context) (*ScheduledStep, bool, error) {
	var ask *stepAsk
	if s.rt.Gate != nil {
		if ask = s.rt.Gate.next(); ask == nil {
			return nil, false, nil // driven by Step: nothing asked
		}
	}
	var buf []engine.SequenceMetadata
	if n := len(s.spare); n > 0 {
		buf, s.spare = s.spare[n-1], s.spare[:n-1]
	}
	out, metas := s.rt.Scheduler.ScheduleInto(buf)
	if out.Kind != engine.StepEmpty {
		if s.busy == nil {
			s.busy = map[engine.StepID][]engine.SequenceMetadata{}
		}
		s.busy[out.StepID] = metas
	} else if buf != nil {
		s.spare = append(s.spare, buf)
	}
	for _, f := range out.Finished {
		s.rt.Live.Fail(f.RequestID, f.Reason, f.Err)
	}
	if out.Kind == engine.StepEmpty {
		if ask != nil {
			ask.done <- emptyStep
		}
		return nil, false, nil
	}
	if ask != nil {
		if s.asked == nil {
			s.asked = map[engine.StepID]*stepAsk{}
		}
		s.asked[out.StepID] = ask
	}
	return &ScheduledStep{Outputs: out, Seqs: metas, Planned: time.Now()}, true, nil
}
