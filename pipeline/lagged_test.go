package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// recorder is a stage that logs its items and what its lagged inputs gave.
type recorder struct {
	name string
	log  *eventLog
	seen []int // lagged values read, in order
}

type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(format string, args ...any) {
	l.mu.Lock()
	l.events = append(l.events, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *eventLog) index(ev string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, e := range l.events {
		if e == ev {
			return i
		}
	}
	return -1
}

func (r *recorder) Process(_ context.Context, v int) (int, error) {
	r.log.add("%s%d", r.name, v)
	return v, nil
}

func (r *recorder) read(_ context.Context, v int) error {
	r.seen = append(r.seen, v)
	return nil
}

// earlyPublisher publishes v*10 on its lagged edges before finishing v.
type earlyPublisher struct {
	publish func(int)
	log     *eventLog
}

func (e *earlyPublisher) PublishLagged(p func(int)) { e.publish = p }
func (e *earlyPublisher) Process(_ context.Context, v int) (int, error) {
	e.log.add("c%d", v) // before publishing: the consumer may run at once
	e.publish(v * 10)
	e.publish(-1) // a second call for the same item is ignored
	return v, nil
}

// A step loop's two lagged edges: a (forward) waits for c (sample) of the
// item before, b waits for d (postprocess) of the item before. With two
// items in flight, every item k of a comes after item k-1 of c, every item k
// of b after item k-1 of d, and a reads c's values in order, lagging by one.
func TestLaggedEdgesOrderALoop(t *testing.T) {
	defer noLeaks(t)()
	const n = 30
	for _, inFlight := range []int{1, 2, 3} {
		t.Run(fmt.Sprint("in_flight=", inFlight), func(t *testing.T) {
			log := &eventLog{}
			a := &recorder{name: "a", log: log}
			b := &recorder{name: "b", log: log}
			d := &recorder{name: "d", log: log}
			head := &loopHead{n: n}
			g := New().
				Add("schedule", NewPlanner[struct{}, int, int](head)).
				Add("a", ReadLagged(NewStage[int, int](a), a.read)).
				Add("b", NewStage[int, int](b)).
				Add("c", NewStage[int, int](&earlyPublisher{log: log})).
				Add("d", ReadLagged(NewStage[int, int](d), d.read)).
				Connect("schedule", "a", 4).
				Connect("a", "b", 4).
				Connect("b", "c", 4).
				Connect("c", "d", 4).
				Feedback("d", "schedule", inFlight).
				Lagged("c", "a", 1).
				Lagged("d", "b", 1)
			if err := g.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			for k := 1; k < n; k++ {
				if log.index(fmt.Sprint("c", k-1)) > log.index(fmt.Sprint("a", k)) {
					t.Errorf("a%d ran before c%d", k, k-1)
				}
				if log.index(fmt.Sprint("d", k-1)) > log.index(fmt.Sprint("b", k)) {
					t.Errorf("b%d ran before d%d", k, k-1)
				}
			}
			if len(a.seen) != n-1 {
				t.Fatalf("a read %d lagged values, want %d", len(a.seen), n-1)
			}
			for k, v := range a.seen {
				if v != 10*k {
					t.Fatalf("a's lagged value before item %d = %d, want %d (c's early value for item %d)", k+1, v, 10*k, k)
				}
			}
			if len(d.seen) != 0 {
				t.Errorf("d has no lagged input but read %v", d.seen)
			}
			if len(head.feedback) != n {
				t.Errorf("%d items came back, want %d", len(head.feedback), n)
			}
		})
	}
}

// A stage that fails while another waits on a lagged edge cancels the run:
// nothing hangs.
func TestLaggedEdgeFailureCancels(t *testing.T) {
	defer noLeaks(t)()
	boom := errors.New("boom")
	fail := StageFunc[int, int](func(_ context.Context, v int) (int, error) {
		if v == 6 { // item 3, doubled
			return 0, boom
		}
		return v, nil
	})
	g := New().
		Add("schedule", NewPlanner[struct{}, int, int](&loopHead{n: 10})).
		Add("a", NewStage(double())).
		Add("c", NewStage[int, int](fail)).
		Connect("schedule", "a", 1).
		Connect("a", "c", 1).
		Feedback("c", "schedule", 2).
		Lagged("c", "a", 1)
	err := g.Run(context.Background())
	var se *StageError
	if !errors.Is(err, boom) || !errors.As(err, &se) || se.Stage != "c" {
		t.Fatalf("Run = %v, want boom from stage c", err)
	}
}

func TestLaggedEdgeBuildErrors(t *testing.T) {
	loop := func() *Graph {
		return New().
			Add("schedule", NewPlanner[struct{}, int, int](&loopHead{n: 1})).
			Add("a", NewStage(double())).
			Add("b", NewStage(double())).
			Connect("schedule", "a", 1).
			Connect("a", "b", 1).
			Feedback("b", "schedule", 1)
	}
	for _, tc := range []struct {
		name string
		g    *Graph
		want string
	}{
		{"forward", loop().Lagged("a", "b", 1), `"b" must come before "a" inside one loop`},
		{"zero lag", loop().Add("c", NewStage(double())).Connect("b", "c", 1).Lagged("b", "a", 0), "no node"},
		{"negative lag", loop().Lagged("b", "a", -1), "lag must be at least 1"},
		{"planner end", loop().Lagged("b", "schedule", 1), "both ends must be stages"},
		{"unknown node", loop().Lagged("zz", "a", 1), `no node named "zz"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.g.Build()
			if tc.name == "zero lag" {
				// A lag of 0 declares a plain edge: b then feeds two edges.
				if err == nil || !strings.Contains(err.Error(), "outgoing edges") {
					t.Fatalf("Build = %v, want an error about b's two outgoing edges", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// Lagged edges appear in renders, distinct from forward and feedback edges.
func TestLaggedEdgeRenders(t *testing.T) {
	g := New().
		Add("schedule", NewPlanner[struct{}, int, int](&loopHead{n: 1})).
		Add("a", NewStage(double())).
		Add("b", NewStage(double())).
		Connect("schedule", "a", 1).
		Connect("a", "b", 1).
		Feedback("b", "schedule", 2).
		Lagged("b", "a", 1)
	if err := g.Build(); err != nil {
		t.Fatal(err)
	}
	top := g.Topology()
	if m := top.Mermaid(nil); !strings.Contains(m, "-.-o") || !strings.Contains(m, "lagged 1") {
		t.Errorf("mermaid has no lagged edge:\n%s", m)
	}
	if d := top.DOT(nil); !strings.Contains(d, `"b" -> "a" [label="lagged 1`) || !strings.Contains(d, "style=dotted") {
		t.Errorf("dot has no lagged edge:\n%s", d)
	}
}

// starter records Start and Close calls.
type starter struct {
	Stage[int, int]
	name    string
	log     *eventLog
	failErr error
}

func (s *starter) Start(context.Context) error {
	s.log.add("start %s", s.name)
	return s.failErr
}

func (s *starter) Close() error {
	s.log.add("close %s", s.name)
	return nil
}

// Start runs every node's Start in declaration order before any item
// flows; a failing Start closes the nodes and keeps the graph from running.
func TestStartPhase(t *testing.T) {
	defer noLeaks(t)()
	t.Run("ok", func(t *testing.T) {
		log := &eventLog{}
		first := &starter{Stage: double(), name: "first", log: log}
		second := &starter{Stage: StageFunc[int, int](func(_ context.Context, v int) (int, error) {
			log.add("item %d", v)
			return v, nil
		}), name: "second", log: log}
		out := &collector[int]{}
		g := New().
			Add("src", NewSource[int](&counter{n: 2})).
			Add("first", NewStage[int, int](first)).
			Add("second", NewStage[int, int](second)).
			Add("sink", NewSink[int](out)).
			Connect("src", "first", 1).Connect("first", "second", 1).Connect("second", "sink", 1)
		if err := g.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := g.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		starts := 0
		for _, ev := range log.events {
			if strings.HasPrefix(ev, "start") {
				starts++
			}
		}
		if log.index("start first") != 0 || log.index("start second") != 1 || log.index("item 0") < 2 || starts != 2 {
			t.Errorf("events %v: want both starts, once each and in order, before the first item", log.events)
		}
	})
	t.Run("fails", func(t *testing.T) {
		log := &eventLog{}
		bad := &starter{Stage: double(), name: "bad", log: log, failErr: errors.New("no device")}
		g := New().
			Add("src", NewSource[int](&counter{n: 2})).
			Add("bad", NewStage[int, int](bad)).
			Add("sink", NewSink[int](&collector[int]{})).
			Connect("src", "bad", 1).Connect("bad", "sink", 1)
		err := g.Run(context.Background())
		var se *StageError
		if !errors.As(err, &se) || se.Stage != "bad" || !strings.Contains(err.Error(), "start: no device") {
			t.Fatalf("Run = %v, want the start error of stage bad", err)
		}
		if log.index("close bad") < 0 {
			t.Errorf("a failed start did not close the node: %v", log.events)
		}
		if err := g.Run(context.Background()); !errors.Is(err, ErrAlreadyRan) {
			t.Errorf("Run after a failed start = %v, want ErrAlreadyRan", err)
		}
	})
}
