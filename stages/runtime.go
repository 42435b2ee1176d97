package stages

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// Runtime is what the engine shares with its stages: the factories of this
// package take it as pipeline.Args.Deps.
type Runtime struct {
	Scheduler *engine.Scheduler
	Model     models.Model
	Ops       kernels.Ops
	Cache     *models.KVCache
	// Tokenizer may be nil: prompts must then be token ids and outputs carry
	// no text.
	Tokenizer *tokenizer.Tokenizer
	// Requests feeds the requests stage; it ends (io.EOF) to end the run.
	Requests pipeline.Source[*engine.Request]
	// Live tracks the requests being served.
	Live *Requests
	// Seed gives requests without a seed of their own a reproducible one.
	Seed int64
	// VocabSize bounds token ids.
	VocabSize int
	// Flops estimates each step's work (nil: not estimated); Stats counts.
	Flops *engine.FlopsEstimator
	Stats *Stats
	// ZOS carries sampled tokens from step N to step N+1 and orders
	// sampling after post-processing; see MetadataZOS.
	ZOS *MetadataZOS
	// Gate, when set, makes the loop plan a step only when asked (Step).
	Gate *StepGate
	// Front counts requests submitted and not yet handed to the scheduler
	// (or refused): the engine adds, tokenize and schedule subtract.
	Front atomic.Int64
}

// registerStage registers a stage whose factory needs only the *Runtime.
func registerStage[In, Out any](slot, name string, mk func(*Runtime) pipeline.Stage[In, Out]) {
	pipeline.Register(slot, name, func(a pipeline.Args) (*pipeline.Node, error) {
		rt, err := runtimeOf(a)
		if err != nil {
			return nil, err
		}
		return pipeline.NewStage(mk(rt)), nil
	})
}

// runtimeOf extracts the *Runtime a factory was given.
func runtimeOf(a pipeline.Args) (*Runtime, error) {
	rt, ok := a.Deps.(*Runtime)
	if !ok || rt == nil {
		return nil, fmt.Errorf("stages: %s=%s needs a *stages.Runtime, got %T", a.Slot, a.Impl, a.Deps)
	}
	return rt, nil
}

// Requests tracks the live requests: whom to answer and which of their
// sequences are still going. Tokenize registers a request, post-processing
// answers it, the engine aborts it. Safe for concurrent use.
type Requests struct {
	mu   sync.Mutex
	live map[string]*liveRequest
}

type liveRequest struct {
	req  *engine.Request
	done []bool // per sequence index
	left int
}

// NewRequests returns an empty table.
func NewRequests() *Requests { return &Requests{live: map[string]*liveRequest{}} }

// Add registers req; an id already live is an error.
func (r *Requests) Add(req *engine.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.live[req.ID]; dup {
		return fmt.Errorf("%w: request id %q is already in use", engine.ErrInvalidRequest, req.ID)
	}
	n := max(1, req.Params.N)
	r.live[req.ID] = &liveRequest{req: req, done: make([]bool, n), left: n}
	return nil
}

// Has reports whether the request is live.
func (r *Requests) Has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.live[id]
	return ok
}

// Len is the number of live requests.
func (r *Requests) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

// Emit delivers out to its request and reports whether it did. A Finished
// output closes its sequence; the request is forgotten after its last.
// Outputs for a closed sequence or an unknown request are dropped: nothing
// is emitted twice or after finish.
func (r *Requests) Emit(out engine.RequestOutput) bool {
	r.mu.Lock()
	lr := r.live[out.RequestID]
	if lr == nil || out.Index < 0 || out.Index >= len(lr.done) || lr.done[out.Index] {
		r.mu.Unlock()
		return false
	}
	if out.Finished {
		lr.done[out.Index] = true
		if lr.left--; lr.left == 0 {
			delete(r.live, out.RequestID)
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
func (r *Requests) Fail(id string, reason engine.FinishReason, err error) bool {
	r.mu.Lock()
	lr := r.live[id]
	delete(r.live, id)
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
func (r *Requests) FailAll(reason engine.FinishReason, err error) {
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
