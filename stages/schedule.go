package stages

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/spec"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// The schedule slot is the head of the step loop: a pipeline.Planner that
// takes Admissions in, gets each step's *StepOutputs back on the loop's
// feedback edge, and plans *ScheduledStep whenever the loop has room (one
// step in flight, or two with ZOS). It is the one owner of the
// engine.Scheduler: it adds and aborts sequences, plans steps, and applies
// each step's outcome (Scheduler.ProcessOutputs, then the finishes
// post-processing found) when the step comes back.
type SchedulePlanner = pipeline.Planner[Admission, *StepOutputs, *ScheduledStep]

// ScheduledStep is the scheduler's plan for one step (schedule -> prepare).
type ScheduledStep struct {
	Outputs *engine.SchedulerOutputs
	Seqs    []engine.SequenceMetadata
	Planned time.Time
}

// ScheduleDeps is what a schedule stage gets.
type ScheduleDeps struct {
	Scheduler   *engine.Scheduler
	Responder   *Responder
	ManualSteps bool // plan a step only when an Admission asks for one
	// Drafts, when not nil, picks the draft length (0 to k) of each step
	// by measuring decode throughput (speculative.adaptive).
	Drafts *spec.Controller
	// Stats (nil: not counted) counts the steps with decode rows at each
	// draft limit Drafts picks (Stats.RecordDraftLimit) and the loop's
	// time per step by kind (Stats.RecordStepTime).
	Stats *Stats
	// Grammars compiles structured-output constraints and Resubmit brings
	// each outcome back as a Submission (see Env); a request with a
	// constraint is refused when Grammars is nil.
	Grammars GrammarCompiler
	Resubmit func(Submission) bool
}

// RegisterSchedule registers a schedule implementation in r (nil: the
// default registry).
func RegisterSchedule[O any](r *pipeline.Registry, name string, defaults O, build func(ScheduleDeps, O) (SchedulePlanner, error)) {
	pipeline.RegisterOptions(r, "schedule", name, defaults, func(a pipeline.Args, o O) (*pipeline.Node, error) {
		e, err := env(a)
		if err != nil {
			return nil, err
		}
		d := ScheduleDeps{Scheduler: e.Scheduler, Responder: e.Responder, ManualSteps: e.ManualSteps, Grammars: e.Grammars, Resubmit: e.Resubmit, Stats: e.Stats}
		if e.Speculative.NumSpeculativeTokens > 0 && e.Speculative.Adaptive {
			d.Drafts = spec.NewController(e.Speculative.NumSpeculativeTokens, 16, 8)
		}
		p, err := build(d, o)
		if err != nil {
			return nil, err
		}
		return pipeline.NewPlanner(p), nil
	})
}

func init() {
	RegisterSchedule(nil, "default", NoOptions{}, func(d ScheduleDeps, _ NoOptions) (SchedulePlanner, error) {
		return NewSchedule(d), nil
	})
}

// Schedule is the built-in schedule stage. It recycles the metadata of a
// step once that step's outputs come back around the loop (nothing
// downstream reads it any more), which saves the scheduler's largest
// per-step allocation.
type Schedule struct {
	d     ScheduleDeps
	spare [][]engine.SequenceMetadata
	busy  map[engine.StepID][]engine.SequenceMetadata
	kinds map[engine.StepID]plannedStep // steps in flight, for the drafts controller and the step times
	// lastDone is the completion time of the latest step that came back.
	lastDone time.Time
	asks     []*StepAsk                 // manual steps not yet planned
	asked    map[engine.StepID]*StepAsk // manual steps in flight
	drains   []chan struct{}            // closed when the scheduler is idle
	done     map[engine.SeqID]bool      // reused by Feedback
	ended    map[engine.SeqID]engine.FinishReason
}

// measuredByDrafts says whether the drafts controller measures a step of
// kind k: every step with decode rows, mixed ones too. A draft length
// costs in mixed steps what it costs in pure decode steps and more (the
// drafter's pass over the new prompts' rows, and the reserved draft slots
// that leave less of the step's token budget to the prompts), and under
// continuous batching at large batches most steps are mixed: new requests
// arrive as others finish. Measured on decode steps alone, the controller
// on an H200 took 2 drafts at batch 64 (0.82x for none in its own
// comparison) in a run where MTP gave 0.88x of no speculation end to end.
// Pure prefill steps measure the prompts alone and are skipped.
func measuredByDrafts(k engine.StepKind) bool {
	return k == engine.StepDecode || k == engine.StepMixed
}

// plannedStep is what the drafts controller and the step times
// (Stats.RecordStepTime) need of a step in flight.
type plannedStep struct {
	kind    engine.StepKind
	running int // running sequences when it was planned
	limit   int // its draft limit
	prefill int // its prompt tokens
	planned time.Time
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// NewSchedule returns the built-in schedule stage.
func NewSchedule(d ScheduleDeps) *Schedule {
	return &Schedule{d: d, busy: map[engine.StepID][]engine.SequenceMetadata{}, kinds: map[engine.StepID]plannedStep{}, asked: map[engine.StepID]*StepAsk{},
		done: map[engine.SeqID]bool{}, ended: map[engine.SeqID]engine.FinishReason{}}
}

// Add applies one admission.
func (s *Schedule) Add(_ context.Context, a Admission) error {
	switch {
	case a.Seq != nil && a.Seq.Params().StructuredOutput != nil:
		s.addConstrained(a.Seq)
	case a.Seq != nil:
		if _, err := s.d.Scheduler.Add(a.Seq); err != nil {
			// A request the scheduler refuses (too long, ...) fails alone.
			s.d.Responder.Fail(a.Seq.RequestID(), engine.FinishError, err)
		}
	case a.Grammar != nil:
		g := a.Grammar
		err := s.d.Scheduler.GrammarReady(g.SeqID, g.Grammar, g.Err)
		switch {
		case errors.Is(err, engine.ErrUnknownSequence):
			// Aborted while its grammar compiled: already answered.
		case err != nil:
			return fmt.Errorf("schedule: %w", err)
		case g.Err != nil:
			s.d.Responder.Fail(g.RequestID, engine.FinishError, fmt.Errorf("grammar: %w", g.Err))
		}
	case a.Abort != "":
		s.d.Scheduler.Abort(a.Abort)
	case a.Step != nil:
		s.asks = append(s.asks, a.Step)
	case a.Drain != nil:
		s.drains = append(s.drains, a.Drain)
	}
	s.checkDrains()
	return nil
}

// addConstrained adds a sequence whose request has a structured-output
// constraint: it waits in the scheduler (StatusWaitingForGrammar) while
// its grammar compiles off the loop; the outcome comes back through the
// requests queue (Submission.Grammar), so steps never wait for it.
func (s *Schedule) addConstrained(seq *engine.Sequence) {
	if s.d.Grammars == nil || s.d.Resubmit == nil {
		s.d.Responder.Fail(seq.RequestID(), engine.FinishError,
			fmt.Errorf("%w: structured output needs the model's tokenizer, and this engine has none", engine.ErrInvalidRequest))
		return
	}
	id, err := s.d.Scheduler.AddWaitingForGrammar(seq)
	if err != nil {
		s.d.Responder.Fail(seq.RequestID(), engine.FinishError, err)
		return
	}
	resubmit := s.d.Resubmit
	s.d.Grammars.CompileAsync(context.Background(), seq.Params().StructuredOutput, func(g engine.Grammar, err error) {
		resubmit(Submission{Grammar: &GrammarReady{SeqID: id, RequestID: seq.RequestID(), Grammar: g, Err: err}})
	})
}

// Feedback applies a step's outcome: the tokens it appended (the
// scheduler's own checks may end sequences: EOS, stop ids, length), then
// the finishes post-processing found (stop strings). Post-processing
// applies the same token checks (engine.CheckFinish) to answer at once; a
// sequence the scheduler ends that post-processing did not is answered
// here, so no request is left open.
func (s *Schedule) Feedback(_ context.Context, out *StepOutputs) error {
	if out.StepID != 0 {
		finished, err := s.d.Scheduler.ProcessOutputs(out.StepID, out.Sampled)
		if err != nil {
			return fmt.Errorf("schedule: %w", err)
		}
		clear(s.done)
		clear(s.ended)
		for _, f := range finished {
			s.done[f.SeqID] = true
		}
		for _, f := range out.Finished {
			s.ended[f.SeqID] = f.Reason
			if s.done[f.SeqID] {
				continue
			}
			if _, err := s.d.Scheduler.FinishSequence(f.SeqID, f.Reason); err != nil && !errors.Is(err, engine.ErrUnknownSequence) {
				return fmt.Errorf("schedule: step %d: %w", out.StepID, err)
			}
		}
		for _, f := range finished {
			if _, ok := s.ended[f.SeqID]; !ok {
				s.d.Responder.Emit(engine.RequestOutput{RequestID: f.RequestID, Index: f.Index, Finished: true,
					FinishReason: f.Reason, Err: f.Err, FinishTime: time.Now()})
			}
		}
	}
	if p, ok := s.kinds[out.StepID]; ok { // (step 0, an empty one, is never planned)
		if !out.Done.IsZero() {
			// The loop's time for the step: from the completion of the
			// step before, or from its planning when the loop had gone
			// idle in between.
			s.d.Stats.RecordStepTime(p.kind, out.Done.Sub(later(p.planned, s.lastDone)))
		}
		if c := s.d.Drafts; c != nil {
			if measuredByDrafts(p.kind) {
				c.Observe(p.running, p.limit, out.NumTokens, p.prefill, out.Done)
			} else {
				c.Skip(out.Done)
			}
		}
		delete(s.kinds, out.StepID)
	}
	if out.Done.After(s.lastDone) {
		s.lastDone = out.Done
	}
	if a, ok := s.asked[out.StepID]; ok {
		delete(s.asked, out.StepID)
		a.Done <- out
	}
	if buf, ok := s.busy[out.StepID]; ok {
		delete(s.busy, out.StepID)
		s.spare = append(s.spare, buf[:0])
	}
	s.checkDrains()
	return nil
}

// Plan schedules the next step, if there is one to run (and, with manual
// steps, one was asked for).
func (s *Schedule) Plan(context.Context) (*ScheduledStep, bool, error) {
	var ask *StepAsk
	if s.d.ManualSteps {
		if len(s.asks) == 0 {
			return nil, false, nil
		}
		ask, s.asks = s.asks[0], s.asks[1:]
	}
	var buf []engine.SequenceMetadata
	if n := len(s.spare); n > 0 {
		buf, s.spare = s.spare[n-1], s.spare[:n-1]
	}
	running, limit := 0, 0
	if c := s.d.Drafts; c != nil {
		running = s.d.Scheduler.NumRunning()
		limit = c.Decide(running)
		s.d.Scheduler.SetDraftLimit(limit)
	}
	out, metas := s.d.Scheduler.ScheduleInto(buf)
	for _, f := range out.Finished {
		s.d.Responder.Fail(f.RequestID, f.Reason, f.Err)
	}
	if out.Kind == engine.StepEmpty {
		if buf != nil {
			s.spare = append(s.spare, buf)
		}
		if ask != nil {
			ask.Done <- &StepOutputs{}
		}
		s.checkDrains()
		return nil, false, nil
	}
	s.busy[out.StepID] = metas
	planned := time.Now()
	if s.d.Drafts != nil || s.d.Stats != nil {
		s.kinds[out.StepID] = plannedStep{kind: out.Kind, running: running, limit: limit, prefill: out.NumPrefillTokens, planned: planned}
	}
	if s.d.Drafts != nil && s.d.Stats != nil && out.NumDecodeSeqs > 0 {
		s.d.Stats.RecordDraftLimit(limit)
	}
	if ask != nil {
		s.asked[out.StepID] = ask
	}
	return &ScheduledStep{Outputs: out, Seqs: metas, Planned: planned}, true, nil
}

// checkDrains closes the drain channels once nothing is unfinished and no
// step is in flight.
func (s *Schedule) checkDrains() {
	if len(s.drains) == 0 || s.d.Scheduler.HasUnfinished() || s.d.Scheduler.NumInflightSteps() > 0 {
		return
	}
	for _, ch := range s.drains {
		close(ch)
	}
	s.drains = s.drains[:0]
}
