package pipeline

import (
	"context"
	"errors"
)

// Stage maps one input item to one output item. Process is called from a
// single goroutine, one item at a time, in the order items arrive; a stage
// starts no goroutines of its own. Returning ErrSkip drops the item (not
// allowed inside a loop, where every item must come back as feedback).
type Stage[In, Out any] interface {
	Process(ctx context.Context, in In) (Out, error)
}

// StageFunc adapts a function to a Stage.
type StageFunc[In, Out any] func(ctx context.Context, in In) (Out, error)

// Process calls f.
func (f StageFunc[In, Out]) Process(ctx context.Context, in In) (Out, error) { return f(ctx, in) }

// Source produces the items that enter a graph. Next returns io.EOF when
// there are no more; any other error fails the run.
type Source[Out any] interface {
	Next(ctx context.Context) (Out, error)
}

// Waiter is implemented by a Source whose items come from outside the graph
// (a queue of requests, say). The graph calls Wait before each Next and
// counts the time it blocks as waiting for input rather than as the
// source's work. Wait returns nil once Next will not block for long (an item
// is there, or the source has ended), or ctx's error.
type Waiter interface {
	Wait(ctx context.Context) error
}

// SourceFunc adapts a function to a Source.
type SourceFunc[Out any] func(ctx context.Context) (Out, error)

// Next calls f.
func (f SourceFunc[Out]) Next(ctx context.Context) (Out, error) { return f(ctx) }

// Sink consumes items at the end of a graph.
type Sink[In any] interface {
	Consume(ctx context.Context, in In) error
}

// SinkFunc adapts a function to a Sink.
type SinkFunc[In any] func(ctx context.Context, in In) error

// Consume calls f.
func (f SinkFunc[In]) Consume(ctx context.Context, in In) error { return f(ctx, in) }

// Planner is the head of a loop. It absorbs work from its input (Add) and
// results that come back around the loop (Feedback), and emits new work with
// Plan whenever the loop has room: Plan is called only while fewer than the
// feedback edge's MaxInFlight items are in the loop, and returns ok=false
// when it has nothing to emit now. The run of a planner ends when its input
// is closed, nothing is in flight and Plan returns ok=false.
//
// All three methods are called from one goroutine.
type Planner[In, Fb, Out any] interface {
	Add(ctx context.Context, in In) error
	Feedback(ctx context.Context, fb Fb) error
	Plan(ctx context.Context) (out Out, ok bool, err error)
}

// Waker is implemented by a Planner that can get work from outside its
// edges (a caller asking for a step, say): a receive on the channel makes
// the graph call Plan again even though no input or feedback arrived.
type Waker interface {
	Wake() <-chan struct{}
}

// Starter is implemented by nodes with work to do before any item flows:
// device warm-up, CUDA graph capture, loading a table. Constructors (and
// registry factories) stay cheap and side-effect free, so that a graph can
// be built, checked and drawn on a machine that could not run it; Start
// does the rest. Graph.Start calls Start on every node, one at a time in
// declaration order, before Run starts any node; a failure stops there,
// closes the nodes and is returned with the node's name.
type Starter interface {
	Start(ctx context.Context) error
}

// LaggedPublisher is implemented by a stage whose lagged edges (see
// Edge.Lag) may receive its output for an item before Process returns. The
// graph calls PublishLagged once, before the run, with a function that sends
// a value on every lagged edge leaving the node; Process may call it at most
// once per item (later calls for the same item are ignored). When Process
// returns without having called it, the graph sends Process's output. The
// published value need not be complete (a sample stage publishes its
// device-side tokens while their host copy is still on the way); the edge's
// consumer reads only what the producer's contract says is there early.
// Cost: one channel send per lagged edge, never blocking (the edge holds
// lag+1 items, more than a backward edge can have in flight).
type LaggedPublisher[Out any] interface {
	PublishLagged(publish func(Out))
}

// Closer is implemented by nodes that hold resources. The graph calls Close
// once, after the node's goroutine has finished, whatever the outcome.
type Closer interface {
	Close() error
}

// ErrSkip, returned by Stage.Process, drops the item without error.
var ErrSkip = errors.New("pipeline: skip item")
