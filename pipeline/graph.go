package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/sourcegraph/conc/panics"
	"golang.org/x/sync/errgroup"
)

// DefaultCapacity is the capacity of an edge declared with capacity 0.
const DefaultCapacity = 1

// Edge is one declared connection. A feedback edge closes a loop: it goes
// from the loop's tail back to a Planner and bounds the items in flight.
//
// A lagged edge (Lag >= 1) is a dependency between two stages of one loop
// that points back against the flow: the consumer To, before it processes
// its item k, waits for the producer From's value for item k-Lag (From
// comes after To in the loop). It carries From's output (or what From
// publishes early, see LaggedPublisher) besides From's main edge; To reads
// it with ReadLagged, or only waits for it. A step loop uses two: forward
// of step N+1 needs the tokens sampled at step N, and sampling of step N+1
// must see step N post-processed. The graph blocks on, times (WaitLag),
// cancels and draws lagged edges like any other.
type Edge struct {
	From        string `yaml:"from"`
	To          string `yaml:"to"`
	Capacity    int    `yaml:"capacity"`      // items the edge buffers; 0 means DefaultCapacity
	Feedback    bool   `yaml:"feedback"`      // the edge returns results to a Planner
	MaxInFlight int    `yaml:"max_in_flight"` // feedback edges: items allowed between the planner and this edge (>= 1)
	Lag         int    `yaml:"lag"`           // lagged edges: how many items earlier the producer's value is (>= 1); 0 for other edges
}

// Graph is a set of named nodes and the edges between them. Declare with
// Add, Connect and Feedback, then Run (which calls Build). A graph runs once.
//
// Graph is not safe for concurrent declaration; once Build has returned,
// Stats may be called from any goroutine at any time.
type Graph struct {
	order   []string
	nodes   map[string]*graphNode
	edges   []Edge
	timed   bool
	built   bool
	started bool
	ran     atomic.Bool
	declErr []error
}

type graphNode struct {
	name  string
	node  *Node
	label string // e.g. "sample=default", shown in renders
	rt    nodeRuntime
	stats stageStats
}

// Option configures a Graph.
type Option func(*Graph)

// WithoutTiming turns off the per-item clock reads behind the busy and wait
// times (item counts, queue depths and states are still kept).
func WithoutTiming() Option { return func(g *Graph) { g.timed = false } }

// New returns an empty graph.
func New(opts ...Option) *Graph {
	g := &Graph{nodes: map[string]*graphNode{}, timed: true}
	for _, o := range opts {
		o(g)
	}
	return g
}

// Add declares a node. Names must be unique and non-empty; errors are
// reported by Build.
func (g *Graph) Add(name string, n *Node) *Graph { return g.add(name, "", n) }

func (g *Graph) add(name, label string, n *Node) *Graph {
	switch {
	case name == "":
		g.declErr = append(g.declErr, errors.New("pipeline: a node has an empty name"))
	case n == nil:
		g.declErr = append(g.declErr, fmt.Errorf("pipeline: node %q is nil", name))
	case g.nodes[name] != nil:
		g.declErr = append(g.declErr, fmt.Errorf("pipeline: node %q declared twice", name))
	default:
		g.order = append(g.order, name)
		g.nodes[name] = &graphNode{name: name, node: n, label: label}
	}
	return g
}

// Connect declares an edge from one node's output to another's input.
func (g *Graph) Connect(from, to string, capacity int) *Graph {
	g.edges = append(g.edges, Edge{From: from, To: to, Capacity: capacity})
	return g
}

// Feedback declares the edge that closes a loop, from its tail back to the
// Planner at its head, with at most maxInFlight items inside the loop.
func (g *Graph) Feedback(from, to string, maxInFlight int) *Graph {
	g.edges = append(g.edges, Edge{From: from, To: to, Feedback: true, MaxInFlight: maxInFlight})
	return g
}

// Lagged declares a lagged edge: stage to's item k waits for stage from's
// item k-lag (see Edge.Lag).
func (g *Graph) Lagged(from, to string, lag int) *Graph {
	g.edges = append(g.edges, Edge{From: from, To: to, Lag: lag})
	return g
}

// Build checks the declarations and wires the edges: every name exists,
// every producer type fits its consumer, each node has the edges its kind
// needs, and the only cycles are loops closed by a feedback edge. All
// problems are reported together. Build is idempotent.
func (g *Graph) Build() error {
	if g.built {
		return nil
	}
	errs := append([]error(nil), g.declErr...)
	outs := map[string]int{}
	ins := map[string]int{}
	for _, e := range g.edges {
		from, to := g.nodes[e.From], g.nodes[e.To]
		if from == nil || to == nil {
			for _, n := range []string{e.From, e.To} {
				if g.nodes[n] == nil {
					errs = append(errs, fmt.Errorf("pipeline: edge %s -> %s: no node named %q", e.From, e.To, n))
				}
			}
			continue
		}
		if e.Lag != 0 {
			errs = append(errs, g.checkLagged(e, from, to)...)
			continue
		}
		outs[e.From]++
		if from.node.out == nil {
			errs = append(errs, fmt.Errorf("pipeline: edge %s -> %s: %s %q has no output", e.From, e.To, from.node.kind, e.From))
			continue
		}
		want := to.node.in
		if e.Feedback {
			want = to.node.fb
			if to.node.kind != KindPlanner {
				errs = append(errs, fmt.Errorf("pipeline: feedback edge %s -> %s: %q is a %s, not a planner", e.From, e.To, e.To, to.node.kind))
				continue
			}
			if e.MaxInFlight < 1 {
				errs = append(errs, fmt.Errorf("pipeline: feedback edge %s -> %s: max in flight must be at least 1, got %d", e.From, e.To, e.MaxInFlight))
				continue
			}
		} else {
			ins[e.To]++
		}
		if want == nil {
			errs = append(errs, fmt.Errorf("pipeline: edge %s -> %s: %s %q has no input", e.From, e.To, to.node.kind, e.To))
			continue
		}
		if !assignable(from.node.out, want) {
			errs = append(errs, fmt.Errorf("pipeline: type mismatch on edge %s -> %s: %q produces %v but %q consumes %v",
				e.From, e.To, e.From, from.node.out, e.To, want))
		}
	}
	for _, name := range g.order {
		n := g.nodes[name]
		if outs[name] > 1 {
			errs = append(errs, fmt.Errorf("pipeline: node %q has %d outgoing edges; a node feeds exactly one edge", name, outs[name]))
		}
		if n.node.out != nil && outs[name] == 0 {
			errs = append(errs, fmt.Errorf("pipeline: the output of %s %q (%v) is not connected", n.node.kind, name, n.node.out))
		}
		if (n.node.kind == KindStage || n.node.kind == KindSink) && ins[name] == 0 {
			errs = append(errs, fmt.Errorf("pipeline: the input of %s %q (%v) is not connected", n.node.kind, name, n.node.in))
		}
	}
	if len(errs) == 0 {
		errs = append(errs, g.checkLoops()...)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	g.wire()
	g.built = true
	return nil
}

// checkLagged checks a lagged edge's own declaration; checkLoops checks
// where its ends sit.
func (g *Graph) checkLagged(e Edge, from, to *graphNode) []error {
	var errs []error
	if e.Lag < 1 || e.Feedback {
		errs = append(errs, fmt.Errorf("pipeline: lagged edge %s -> %s: lag must be at least 1 on a non-feedback edge, got %d", e.From, e.To, e.Lag))
	}
	if from.node.kind != KindStage || to.node.kind != KindStage {
		errs = append(errs, fmt.Errorf("pipeline: lagged edge %s -> %s: both ends must be stages, got a %s and a %s", e.From, e.To, from.node.kind, to.node.kind))
	}
	return errs
}

// checkLoops verifies that the graph without feedback edges is acyclic and
// that each feedback edge's tail is reachable from its planner, and marks
// the stages inside each loop.
func (g *Graph) checkLoops() []error {
	next := map[string]string{}
	indeg := map[string]int{}
	for _, e := range g.edges {
		if !e.Feedback && e.Lag == 0 {
			next[e.From] = e.To
			indeg[e.To]++
		}
	}
	// Kahn's algorithm over forward edges.
	var queue []string
	for _, n := range g.order {
		if indeg[n] == 0 {
			queue = append(queue, n)
		}
	}
	seen := 0
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		seen++
		if m, ok := next[n]; ok {
			if indeg[m]--; indeg[m] == 0 {
				queue = append(queue, m)
			}
		}
	}
	if seen != len(g.order) {
		var cyc []string
		for _, n := range g.order {
			if indeg[n] > 0 {
				cyc = append(cyc, n)
			}
		}
		sort.Strings(cyc)
		return []error{fmt.Errorf("pipeline: cycle without a feedback edge through %v", cyc)}
	}
	var (
		errs  []error
		paths [][]string
	)
	for _, e := range g.edges {
		if !e.Feedback {
			continue
		}
		var path []string
		for n, ok := next[e.To]; ; n, ok = next[n] {
			if !ok {
				errs = append(errs, fmt.Errorf("pipeline: feedback edge %s -> %s: %q is not downstream of planner %q", e.From, e.To, e.From, e.To))
				path = nil
				break
			}
			path = append(path, n)
			if n == e.From {
				break
			}
		}
		for _, n := range path {
			g.nodes[n].rt.inLoop = true
		}
		paths = append(paths, path)
	}
	for _, e := range g.edges {
		if e.Lag > 0 && !pointsBack(paths, e.From, e.To) {
			errs = append(errs, fmt.Errorf("pipeline: lagged edge %s -> %s: %q must come before %q inside one loop (a lagged edge points back against the flow)", e.From, e.To, e.To, e.From))
		}
	}
	return errs
}

// pointsBack reports whether to comes before from on one of the loops' paths.
func pointsBack(paths [][]string, from, to string) bool {
	for _, p := range paths {
		i, j := slices.Index(p, to), slices.Index(p, from)
		if i >= 0 && j > i {
			return true
		}
	}
	return false
}

// wire creates the ports and points each producer at its consumer.
func (g *Graph) wire() {
	epoch := time.Now()
	for _, name := range g.order {
		n := g.nodes[name]
		n.stats.timed = g.timed
		n.stats.epoch = epoch
		n.rt.stats = &n.stats
	}
	capacity := func(e Edge) int {
		if e.Capacity > 0 {
			return e.Capacity
		}
		return DefaultCapacity
	}
	for _, e := range g.edges {
		to := g.nodes[e.To]
		if e.Lag > 0 {
			from := g.nodes[e.From]
			// A backward edge holds at most lag values: the producer is
			// behind the consumer. One more slot keeps every send
			// non-blocking.
			p := from.node.newLagged(e.Lag + 1)
			p.addProducer()
			from.rt.lagOuts = append(from.rt.lagOuts, p)
			to.rt.lagIns = append(to.rt.lagIns, laggedIn{from: e.From, port: p, lag: e.Lag, read: to.node.reader(from.node.out)})
			continue
		}
		if e.Feedback {
			// The loop bound keeps at most MaxInFlight items on this edge.
			to.rt.fb = to.node.newFeedback(e.MaxInFlight)
			to.rt.maxInFlight = e.MaxInFlight
			continue
		}
		if to.rt.in == nil {
			to.rt.in = to.node.newInput(capacity(e))
		} else if c := capacity(e); c > to.rt.in.capacity() {
			to.rt.in = to.node.newInput(c) // several producers: the largest capacity wins
		}
	}
	for _, e := range g.edges {
		if e.Lag > 0 {
			continue
		}
		from, to := g.nodes[e.From], g.nodes[e.To]
		if e.Feedback {
			from.rt.out = to.rt.fb
		} else {
			from.rt.out = to.rt.in
		}
		from.rt.out.addProducer()
	}
	for _, name := range g.order {
		if n := g.nodes[name]; n.node.kind == KindPlanner && n.rt.in == nil {
			n.rt.in = n.node.newInput(0) // a planner fed by nothing: its input is closed from the start
			n.rt.in.addProducer()
			n.rt.in.producerDone()
		}
	}
}

// ErrAlreadyRan is returned by a second Run of the same graph.
var ErrAlreadyRan = errors.New("pipeline: graph already ran")

// StageError is the error of one node, as Run returns it.
type StageError struct {
	Stage string
	Err   error
}

func (e *StageError) Error() string { return fmt.Sprintf("pipeline: stage %q: %v", e.Stage, e.Err) }
func (e *StageError) Unwrap() error { return e.Err }

// Start builds the graph if needed and calls Start on every node that is
// a Starter, one at a time in declaration order (see Starter). When one
// fails, every node's Close is called and the error, naming the node, is
// returned; the graph cannot run then. Start is idempotent; Run calls it.
func (g *Graph) Start(ctx context.Context) error {
	if err := g.Build(); err != nil {
		return err
	}
	if g.started {
		return nil
	}
	g.started = true
	for _, name := range g.order {
		n := g.nodes[name]
		s, ok := n.node.impl.(Starter)
		if !ok {
			continue
		}
		if err := s.Start(ctx); err != nil {
			g.ran.Store(true)
			g.closeAll()
			return &StageError{Stage: name, Err: fmt.Errorf("start: %w", err)}
		}
	}
	return nil
}

// closeAll closes every node that is a Closer (a graph that will not run).
func (g *Graph) closeAll() {
	for _, name := range g.order {
		if c, ok := g.nodes[name].node.impl.(Closer); ok {
			c.Close()
		}
	}
}

// Run builds the graph if needed and runs every node on its own goroutine
// until all sources have ended and every edge has drained, or until the
// first error, panic or cancellation, which cancels all nodes. The error
// names the node it came from (see StageError); a cancellation of ctx is
// returned as ctx.Err(). Every goroutine Run starts has ended when it
// returns, and every node's Close has been called.
func (g *Graph) Run(ctx context.Context) error {
	if g.ran.Load() {
		return ErrAlreadyRan
	}
	if err := g.Start(ctx); err != nil {
		return err
	}
	if g.ran.Swap(true) {
		return ErrAlreadyRan
	}
	eg, runCtx := errgroup.WithContext(ctx)
	for _, name := range g.order {
		n := g.nodes[name]
		n.rt.stop = make(chan struct{})
		n.stats.started.Store(max(1, n.stats.now()))
	}
	stopAll := context.AfterFunc(runCtx, func() {
		for _, name := range g.order {
			close(g.nodes[name].rt.stop)
		}
	})
	defer stopAll()
	for _, name := range g.order {
		n := g.nodes[name]
		eg.Go(func() error { return n.exec(runCtx) })
	}
	err := eg.Wait()
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return ctx.Err()
	}
	return err
}

func (n *graphNode) exec(ctx context.Context) (err error) {
	var pc panics.Catcher
	pc.Try(func() { err = n.node.run(ctx, &n.rt) })
	if r := pc.Recovered(); r != nil {
		err = r.AsError()
	}
	n.stats.state.Store(int32(StateIdle))
	n.stats.finished.Store(max(1, n.stats.now()))
	// A node that failed leaves its edges open: the run is being cancelled,
	// and a closed edge would only make its consumers fail too, with an
	// error that could reach Run before this one.
	if err == nil {
		if n.rt.out != nil {
			n.rt.out.producerDone()
		}
		for _, p := range n.rt.lagOuts {
			p.producerDone()
		}
	}
	if c, ok := n.node.impl.(Closer); ok {
		if cerr := c.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close: %w", cerr))
		}
	}
	if err != nil {
		return &StageError{Stage: n.name, Err: err}
	}
	return nil
}

// Stats returns a snapshot of every node's counters in declaration order.
// It is safe to call while the graph runs, once Build has returned.
func (g *Graph) Stats() []StageStats {
	out := make([]StageStats, 0, len(g.order))
	for _, name := range g.order {
		n := g.nodes[name]
		s := StageStats{
			Name:     name,
			Kind:     n.node.kind,
			Items:    n.stats.items.Load(),
			Busy:     n.stats.busy(),
			WaitIn:   durationOf(&n.stats.waitIn),
			WaitOut:  durationOf(&n.stats.waitOut),
			WaitLag:  durationOf(&n.stats.waitLag),
			MaxQueue: int(n.stats.maxQueue.Load()),
			State:    State(n.stats.state.Load()),
		}
		if n.rt.in != nil {
			s.QueueLen, s.QueueCap = n.rt.in.length(), n.rt.in.capacity()
		}
		out = append(out, s)
	}
	return out
}
