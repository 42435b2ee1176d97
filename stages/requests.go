package stages

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
)

// The requests slot is the loop's source: a pipeline.Source[Submission]
// (the engine's request queue, Env.Requests). Everything that reaches the
// scheduler travels through it in submission order: new requests, aborts,
// and a caller's asks for one step or for the loop to drain, so an abort
// always reaches the scheduler after the request it names, and a step
// asked for after a submission sees that submission.

// Submission is one item of the requests slot. Exactly one field is set.
type Submission struct {
	Request *engine.Request
	// Abort names a live request to drop from the scheduler; the engine has
	// answered it already (FinishAbort).
	Abort string
	// Step asks the schedule stage for one step (engines built with
	// ManualSteps): it is answered with that step's outputs.
	Step *StepAsk
	// Drain is closed by the schedule stage once the scheduler holds no
	// unfinished sequence and no step is in flight.
	Drain chan struct{}
	// Grammar reports that a sequence's structured-output constraint has
	// compiled (or failed to): the schedule stage, which started the
	// compile, moves the sequence on (engine.Scheduler.GrammarReady).
	Grammar *GrammarReady
}

// GrammarReady is the outcome of one sequence's grammar compile.
type GrammarReady struct {
	SeqID     engine.SeqID
	RequestID string
	Grammar   engine.Grammar // nil when Err is set
	Err       error
}

// StepAsk is a caller's request for one step; Done receives its outputs
// (an empty StepOutputs when there was nothing to schedule).
type StepAsk struct {
	Done chan *StepOutputs // buffered, capacity 1
}

// NewStepAsk returns an ask whose Done channel never blocks its sender.
func NewStepAsk() *StepAsk { return &StepAsk{Done: make(chan *StepOutputs, 1)} }

// Responder tracks the live requests: whom to answer and which of their
// sequences are still going. The engine registers a request when it is
// submitted (so an abort that follows always finds it); tokenize answers a
// bad one, postprocess emits outputs, the schedule stage answers what the
// scheduler ends. Nothing is emitted twice or after a sequence's finish.
// Safe for concurrent use.
type Responder struct {
	mu    sync.Mutex
	live  map[string]*liveRequest
	empty chan struct{} // closed (and replaced) whenever the table becomes empty
}

type liveRequest struct {
	req  *engine.Request
	done []bool // per sequence index
	left int
}

// NewResponder returns an empty table.
func NewResponder() *Responder {
	return &Responder{live: map[string]*liveRequest{}, empty: make(chan struct{})}
}

// Add registers req; an id already live is an error.
func (r *Responder) Add(req *engine.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.live[req.ID]; dup {
		return fmt.Errorf("%w: request id %q is already in use", engine.ErrInvalidRequest, req.ID)
	}
	n := max(1, req.Params.N)
	r.live[req.ID] = &liveRequest{req: req, done: make([]bool, n), left: n}
	return nil
}

// Drop forgets a request without answering it (one the engine could not
// queue after all).
func (r *Responder) Drop(id string) {
	r.mu.Lock()
	if r.live[id] != nil {
		r.forgetLocked(id)
	}
	r.mu.Unlock()
}

// Has reports whether the request is live.
func (r *Responder) Has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.live[id]
	return ok
}

// Len is the number of live requests.
func (r *Responder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

// Emit delivers out to its request and reports whether it did. A Finished
// output closes its sequence; the request is forgotten after its last.
// Outputs for a closed sequence or an unknown request are dropped: nothing
// is emitted twice or after finish.
func (r *Responder) Emit(out engine.RequestOutput) bool {
	r.mu.Lock()
	lr := r.live[out.RequestID]
	if lr == nil || out.Index < 0 || out.Index >= len(lr.done) || lr.done[out.Index] {
		r.mu.Unlock()
		return false
	}
	if out.Finished {
		lr.done[out.Index] = true
		if lr.left--; lr.left == 0 {
			r.forgetLocked(out.RequestID)
		}
	}
	r.mu.Unlock()
	out.ArrivalTime = lr.req.Arrival
	if lr.req.OnOutput != nil {
		lr.req.OnOutput(out)
	}
	return true
}

// Fail answers every open sequence of a request with reason (and err), and
// forgets it; it reports whether the request was live.
func (r *Responder) Fail(id string, reason engine.FinishReason, err error) bool {
	r.mu.Lock()
	lr := r.live[id]
	if lr != nil {
		r.forgetLocked(id)
	}
	r.mu.Unlock()
	if lr == nil {
		return false
	}
	now := time.Now()
	for i, done := range lr.done {
		if !done && lr.req.OnOutput != nil {
			lr.req.OnOutput(engine.RequestOutput{
				RequestID: id, Index: i, Finished: true, FinishReason: reason, Err: err,
				ArrivalTime: lr.req.Arrival, FinishTime: now,
			})
		}
	}
	return true
}

// FailAll answers every live request with reason and err.
func (r *Responder) FailAll(reason engine.FinishReason, err error) {
	r.mu.Lock()
	ids := make([]string, 0, len(r.live))
	for id := range r.live {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	for _, id := range ids {
		r.Fail(id, reason, err)
	}
}

// forgetLocked drops a request and signals an empty table.
func (r *Responder) forgetLocked(id string) {
	delete(r.live, id)
	if len(r.live) == 0 {
		close(r.empty)
		r.empty = make(chan struct{})
	}
}

// WaitEmpty returns once no request is live, or ctx's error.
func (r *Responder) WaitEmpty(ctx context.Context) error {
	for {
		r.mu.Lock()
		n, ch := len(r.live), r.empty
		r.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
