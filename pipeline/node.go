package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"runtime"
)

// Kind says what role a node plays in a graph.
type Kind int

const (
	KindSource Kind = iota
	KindStage
	KindPlanner
	KindSink
)

func (k Kind) String() string {
	switch k {
	case KindSource:
		return "source"
	case KindStage:
		return "stage"
	case KindPlanner:
		return "planner"
	case KindSink:
		return "sink"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Node is a type-erased graph node made by NewSource, NewStage, NewPlanner
// or NewSink. A Node belongs to at most one graph and runs once.
type Node struct {
	kind        Kind
	in, fb, out reflect.Type // nil where the kind has no such port
	impl        any          // the user's value, for Close and Start
	newInput    func(capacity int) port
	newFeedback func(capacity int) port
	newLagged   func(capacity int) port // a port of the node's output type, for lagged edges leaving it
	lagReaders  []lagReader             // see ReadLagged
	run         func(ctx context.Context, rt *nodeRuntime) error
}

// Kind returns the node's role.
func (n *Node) Kind() Kind { return n.kind }

// InType is the type of the node's main input (nil for a source).
func (n *Node) InType() reflect.Type { return n.in }

// FeedbackType is the type a planner accepts on its feedback edge (nil otherwise).
func (n *Node) FeedbackType() reflect.Type { return n.fb }

// OutType is the type of the node's output (nil for a sink).
func (n *Node) OutType() reflect.Type { return n.out }

// lagReader hands the values of a lagged input of type typ to the stage.
type lagReader struct {
	typ  reflect.Type
	read func(ctx context.Context, v any) error
}

// ReadLagged makes the stage node n read the values that arrive on its
// lagged inputs whose producers' output is assignable to T: before Process
// is called for item k, read is called with the producer's value for item
// k-lag. A lagged input that no reader accepts still orders the stage (the
// stage waits for the value) and its value is dropped. ReadLagged returns n
// and panics when n is not a stage node (a programming error).
func ReadLagged[T any](n *Node, read func(ctx context.Context, v T) error) *Node {
	if n == nil || n.kind != KindStage {
		panic("pipeline: ReadLagged needs a stage node")
	}
	n.lagReaders = append(n.lagReaders, lagReader{typ: typeOf[T](), read: func(ctx context.Context, v any) error {
		return read(ctx, v.(T))
	}})
	return n
}

// reader returns the first reader that accepts values of type out (nil: none).
func (n *Node) reader(out reflect.Type) func(context.Context, any) error {
	for _, r := range n.lagReaders {
		if assignable(out, r.typ) {
			return r.read
		}
	}
	return nil
}

// laggedIn is one lagged edge into a node, as the node sees it.
type laggedIn struct {
	from string
	port port
	lag  int
	read func(context.Context, any) error // nil: ordering only
}

// nodeRuntime is what a node sees while it runs: its ports, its loop bound and
// its counters.
type nodeRuntime struct {
	in, fb, out port
	lagIns      []laggedIn // lagged edges into the node
	lagOuts     []port     // lagged edges leaving the node
	maxInFlight int        // planners: bound of the loop they head; 0 = no loop
	inLoop      bool       // stages between a planner and its feedback edge
	stats       *stageStats
	// stop is closed when the run is cancelled. Each node has its own, so
	// that blocked sends and receives do not all contend on ctx.Done().
	stop chan struct{}
}

func inputOf[T any](rt *nodeRuntime) *inPort[T] { return rt.in.(*inPort[T]) }

// recv takes the next item from p; ok is false when p is closed. An item
// already waiting is taken without reading the clock; otherwise the time
// spent blocked is charged to wait-in.
func recv[T any](ctx context.Context, stop <-chan struct{}, p *inPort[T], st *stageStats) (v T, ok bool, err error) {
	if n := len(p.ch); n > 0 {
		st.observeQueue(n)
		select {
		case v, ok = <-p.ch:
			return v, ok, nil
		default:
		}
	}
	st.setState(StateWaitIn)
	t := st.block()
	select {
	case v, ok = <-p.ch:
	case <-stop:
		err = ctx.Err()
	}
	st.unblock(t, &st.waitIn)
	return v, ok, err
}

// emit sends v; when the edge is full, the time spent blocked is charged to
// wait-out.
func emit[Out any](ctx context.Context, stop <-chan struct{}, s sender[Out], v Out, st *stageStats) error {
	if s.try(v) {
		return nil
	}
	st.setState(StateWaitOut)
	t := st.block()
	sent := s.send(stop, v)
	st.unblock(t, &st.waitOut)
	if !sent {
		return ctx.Err()
	}
	return nil
}

// awaitLagged receives, before item k, the value of each lagged input that
// item k depends on (the producer's item k-lag) and hands it to the input's
// reader. The time blocked is charged to wait-in and to wait-lagged.
func awaitLagged(ctx context.Context, rt *nodeRuntime, k int64) error {
	st := rt.stats
	for i := range rt.lagIns {
		in := &rt.lagIns[i]
		if k < int64(in.lag) {
			continue
		}
		var (
			v           any
			ok, stopped bool
		)
		if in.port.length() > 0 {
			v, ok, stopped = in.port.recvAny(rt.stop)
		} else {
			st.setState(StateWaitIn)
			t := st.block()
			v, ok, stopped = in.port.recvAny(rt.stop)
			st.unblock(t, &st.waitIn, &st.waitLag)
		}
		if stopped {
			return ctx.Err()
		}
		if !ok {
			return fmt.Errorf("lagged input from %q ended before item %d", in.from, k)
		}
		if in.read != nil {
			work(st)
			if err := in.read(ctx, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// publishLagged sends v on every lagged edge leaving the node.
func publishLagged(ctx context.Context, rt *nodeRuntime, v any) error {
	for _, p := range rt.lagOuts {
		if !p.sendAny(rt.stop, v) {
			return ctx.Err()
		}
	}
	return nil
}

// work marks the node busy. Busy time is not clocked per item: it is the
// node's running time less the time it spent blocked (see stageStats).
func work(st *stageStats) { st.setState(StateBusy) }

// done counts one item.
func done(st *stageStats) { st.items.Add(1) }

// NewSource wraps a Source. Its goroutine calls Next until io.EOF.
func NewSource[Out any](s Source[Out]) *Node {
	return &Node{
		kind: KindSource, out: typeOf[Out](), impl: s,
		run: func(ctx context.Context, rt *nodeRuntime) error {
			out := senderFor[Out](rt.out)
			st := rt.stats
			waiter, _ := s.(Waiter)
			for {
				if waiter != nil {
					st.setState(StateWaitIn)
					t := st.block()
					err := waiter.Wait(ctx)
					st.unblock(t, &st.waitIn)
					if err != nil {
						return err
					}
				}
				work(st)
				v, err := s.Next(ctx)
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return err
				}
				done(st)
				if err := emit(ctx, rt.stop, out, v, st); err != nil {
					return err
				}
			}
		},
	}
}

// NewStage wraps a Stage.
func NewStage[In, Out any](s Stage[In, Out]) *Node {
	return &Node{
		kind: KindStage, in: typeOf[In](), out: typeOf[Out](), impl: s,
		newInput:  func(c int) port { return newInPort[In](c) },
		newLagged: func(c int) port { return newInPort[Out](c) },
		run: func(ctx context.Context, rt *nodeRuntime) error {
			in := inputOf[In](rt)
			out := senderFor[Out](rt.out)
			st := rt.stats
			// published: this item's value already went out on the lagged
			// edges (LaggedPublisher); pubErr: that send was cancelled.
			var (
				published bool
				pubErr    error
			)
			if p, ok := s.(LaggedPublisher[Out]); ok && len(rt.lagOuts) > 0 {
				p.PublishLagged(func(v Out) {
					if !published {
						published = true
						pubErr = publishLagged(ctx, rt, v)
						// The stage goes on inside Process, often into a
						// blocking call (a device wait in cgo) that keeps
						// this goroutine's processor: the consumer just
						// readied would wait in its run-next slot until the
						// call returns or the runtime retakes the processor
						// (BenchmarkEarlyPublishWake). Yield, so that it
						// runs now.
						runtime.Gosched()
					}
				})
			}
			var k int64
			for {
				v, ok, err := recv(ctx, rt.stop, in, st)
				if !ok {
					return err
				}
				if err := awaitLagged(ctx, rt, k); err != nil {
					return err
				}
				k++
				work(st)
				published, pubErr = false, nil
				res, err := s.Process(ctx, v)
				done(st)
				if errors.Is(err, ErrSkip) {
					if rt.inLoop || len(rt.lagOuts) > 0 {
						return fmt.Errorf("dropped an item inside a loop: %w", err)
					}
					continue
				}
				if err != nil {
					return err
				}
				if pubErr != nil {
					return pubErr
				}
				// The main edge first, the lagged edges last: the Go
				// scheduler runs the goroutine readied last first on this
				// core, and a lagged consumer (the loop's next forward
				// pass, say) is the one the loop waits on.
				if err := emit(ctx, rt.stop, out, res, st); err != nil {
					return err
				}
				if !published && len(rt.lagOuts) > 0 {
					if err := publishLagged(ctx, rt, res); err != nil {
						return err
					}
				}
			}
		},
	}
}

// NewSink wraps a Sink.
func NewSink[In any](s Sink[In]) *Node {
	return &Node{
		kind: KindSink, in: typeOf[In](), impl: s,
		newInput: func(c int) port { return newInPort[In](c) },
		run: func(ctx context.Context, rt *nodeRuntime) error {
			in := inputOf[In](rt)
			st := rt.stats
			for {
				v, ok, err := recv(ctx, rt.stop, in, st)
				if !ok {
					return err
				}
				work(st)
				err = s.Consume(ctx, v)
				done(st)
				if err != nil {
					return err
				}
			}
		},
	}
}

// NewPlanner wraps a Planner, the head of a loop. Without a feedback edge
// the planner is unbounded: Plan is called after every input until it
// returns ok=false.
func NewPlanner[In, Fb, Out any](p Planner[In, Fb, Out]) *Node {
	return &Node{
		kind: KindPlanner, in: typeOf[In](), fb: typeOf[Fb](), out: typeOf[Out](), impl: p,
		newInput:    func(c int) port { return newInPort[In](c) },
		newFeedback: func(c int) port { return newInPort[Fb](c) },
		run: func(ctx context.Context, rt *nodeRuntime) error {
			return runPlanner(ctx, p, rt)
		},
	}
}

func runPlanner[In, Fb, Out any](ctx context.Context, p Planner[In, Fb, Out], rt *nodeRuntime) error {
	in := inputOf[In](rt)
	var fb *inPort[Fb]
	if rt.fb != nil {
		fb = rt.fb.(*inPort[Fb])
	}
	out := senderFor[Out](rt.out)
	st := rt.stats
	inCh := in.ch
	inFlight := 0
	var wake <-chan struct{}
	if w, ok := p.(Waker); ok {
		wake = w.Wake()
	}
	for {
		// Emit while the loop has room and there is work.
		for rt.maxInFlight == 0 || inFlight < rt.maxInFlight {
			work(st)
			v, ok, err := p.Plan(ctx)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			done(st)
			if err := emit(ctx, rt.stop, out, v, st); err != nil {
				return err
			}
			if rt.maxInFlight > 0 {
				inFlight++
			}
		}
		if inCh == nil && inFlight == 0 {
			return nil
		}
		var fbCh chan Fb
		if fb != nil && inFlight > 0 {
			fbCh = fb.ch
		}
		st.observeQueue(len(in.ch))
		st.setState(StateWaitIn)
		t := st.block()
		select {
		case v, ok := <-inCh:
			st.unblock(t, &st.waitIn)
			if !ok {
				inCh = nil
				continue
			}
			work(st)
			err := p.Add(ctx, v)
			if err != nil {
				return err
			}
		case v, ok := <-fbCh:
			st.unblock(t, &st.waitIn)
			if !ok {
				return fmt.Errorf("feedback edge closed with %d items in flight", inFlight)
			}
			inFlight--
			work(st)
			err := p.Feedback(ctx, v)
			if err != nil {
				return err
			}
		case <-wake:
			st.unblock(t, &st.waitIn)
		case <-rt.stop:
			st.unblock(t, &st.waitIn)
			return ctx.Err()
		}
	}
}
