package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestChainDeliversInOrder(t *testing.T) {
	defer noLeaks(t)()
	for _, capacity := range []int{0, 1, 7, 64} {
		t.Run(fmt.Sprint("capacity=", capacity), func(t *testing.T) {
			out := &collector[int]{}
			g := New().
				Add("src", NewSource[int](&counter{n: 100})).
				Add("double", NewStage(double())).
				Add("sink", NewSink[int](out)).
				Connect("src", "double", capacity).
				Connect("double", "sink", capacity)
			if err := g.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := out.items()
			if len(got) != 100 {
				t.Fatalf("got %d items, want 100", len(got))
			}
			for i, v := range got {
				if v != 2*i {
					t.Fatalf("item %d = %d, want %d", i, v, 2*i)
				}
			}
			for _, s := range g.Stats() {
				if s.Items != 100 {
					t.Errorf("stage %s counted %d items, want 100", s.Name, s.Items)
				}
			}
			if err := g.Run(context.Background()); !errors.Is(err, ErrAlreadyRan) {
				t.Errorf("second Run = %v, want ErrAlreadyRan", err)
			}
		})
	}
}

// A slow sink bounds memory: the producers block, and the items taken from
// the source never exceed what the edges and stages can hold.
func TestBackpressureBoundsQueues(t *testing.T) {
	defer noLeaks(t)()
	const capA, capB = 3, 2
	var produced atomic.Int64
	src := SourceFunc[int](func(ctx context.Context) (int, error) {
		return int(produced.Add(1)), nil // endless
	})
	gate := make(chan struct{})
	sink := SinkFunc[int](func(ctx context.Context, v int) error {
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	g := New().
		Add("src", NewSource[int](src)).
		Add("mid", NewStage(double())).
		Add("sink", NewSink[int](sink)).
		Connect("src", "mid", capA).
		Connect("mid", "sink", capB)
	if err := g.Build(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()

	stateOf := func(name string) StageStats {
		for _, s := range g.Stats() {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no stage %s", name)
		return StageStats{}
	}
	// Everything fills up: sink holds 1, edge B holds capB, mid holds 1, edge A holds capA, src holds 1.
	waitFor(t, "source blocked on output", func() bool {
		return stateOf("src").State == StateWaitOut && stateOf("mid").State == StateWaitOut
	})
	want := int64(1 + capB + 1 + capA + 1)
	if got := produced.Load(); got != want {
		t.Errorf("produced %d items with a blocked sink, want exactly %d", got, want)
	}
	for name, c := range map[string]int{"mid": capA, "sink": capB} {
		s := stateOf(name)
		if s.QueueLen > c || s.MaxQueue > c || s.QueueCap != c {
			t.Errorf("%s: queue %d, max %d, cap %d; want <= %d", name, s.QueueLen, s.MaxQueue, s.QueueCap, c)
		}
	}
	// Release ten items: the source refills exactly that many.
	for range 10 {
		gate <- struct{}{}
	}
	waitFor(t, "source blocked again", func() bool {
		return produced.Load() == want+10 && stateOf("src").State == StateWaitOut
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
}

func TestFailuresStopTheRun(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		mid     Stage[int, int]
		cancel  bool
		wantIs  error
		wantMsg []string
	}{
		{
			name: "error in the middle stage",
			mid: StageFunc[int, int](func(_ context.Context, v int) (int, error) {
				if v == 5 {
					return 0, boom
				}
				return v, nil
			}),
			wantIs:  boom,
			wantMsg: []string{`stage "mid"`, "boom"},
		},
		{
			name: "panic in the middle stage",
			mid: StageFunc[int, int](func(_ context.Context, v int) (int, error) {
				if v == 5 {
					panic("kaboom")
				}
				return v, nil
			}),
			wantMsg: []string{`stage "mid"`, "kaboom"},
		},
		{
			name: "cancelled mid-run",
			mid: StageFunc[int, int](func(ctx context.Context, v int) (int, error) {
				if v == 5 {
					<-ctx.Done() // stuck until cancelled
					return 0, ctx.Err()
				}
				return v, nil
			}),
			cancel: true,
			wantIs: context.Canceled,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer noLeaks(t)()
			closer := &closeRecorder{Stage: tc.mid}
			out := &collector[int]{}
			g := New().
				Add("src", NewSource[int](&counter{n: 1 << 30})). // would run for ages
				Add("mid", NewStage[int, int](closer)).
				Add("sink", NewSink[int](out)).
				Connect("src", "mid", 4).
				Connect("mid", "sink", 4)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				go func() {
					waitFor(t, "five items", func() bool { return len(out.items()) == 5 })
					cancel()
				}()
			}
			errc := make(chan error, 1)
			go func() { errc <- g.Run(ctx) }()
			var err error
			select {
			case err = <-errc:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return")
			}
			if err == nil {
				t.Fatal("Run returned nil")
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("Run = %v, want %v", err, tc.wantIs)
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
			if closer.closed != 1 {
				t.Errorf("Close called %d times, want 1", closer.closed)
			}
		})
	}
}

// loopHead emits items 0..n-1 as the loop allows and records feedback.
type loopHead struct {
	n, next  int
	feedback []int
}

func (h *loopHead) Add(context.Context, struct{}) error { return nil }
func (h *loopHead) Feedback(_ context.Context, v int) error {
	h.feedback = append(h.feedback, v)
	return nil
}
func (h *loopHead) Plan(context.Context) (int, bool, error) {
	if h.next >= h.n {
		return 0, false, nil
	}
	h.next++
	return h.next - 1, true, nil
}

// occupancy counts how many of the loop's stages are working at once.
type occupancy struct {
	active, peak atomic.Int32
	mu           sync.Mutex
	events       []string
}

func (o *occupancy) enter(ev string) {
	n := o.active.Add(1)
	for p := o.peak.Load(); n > p && !o.peak.CompareAndSwap(p, n); p = o.peak.Load() {
	}
	o.mu.Lock()
	o.events = append(o.events, ev)
	o.mu.Unlock()
}

func (o *occupancy) leave() { o.active.Add(-1) }

// With one item in flight, "compute" and "post-process" take strict turns;
// with two, compute of item N+1 overlaps post-processing of item N.
func TestLoopInFlightBound(t *testing.T) {
	const n = 20
	for _, bound := range []int{1, 2} {
		t.Run(fmt.Sprint("bound=", bound), func(t *testing.T) {
			defer noLeaks(t)()
			occ := &occupancy{}
			started := make([]chan struct{}, n+1)
			for i := range started {
				started[i] = make(chan struct{})
			}
			compute := StageFunc[int, int](func(_ context.Context, v int) (int, error) {
				occ.enter(fmt.Sprint("c", v))
				close(started[v])
				defer occ.leave()
				return v, nil
			})
			post := StageFunc[int, int](func(ctx context.Context, v int) (int, error) {
				occ.enter(fmt.Sprint("p", v))
				defer occ.leave()
				if bound == 2 && v+1 < n {
					// Finish item v only once item v+1 is being computed: this
					// can only happen if the loop lets two items in.
					select {
					case <-started[v+1]:
					case <-time.After(5 * time.Second):
						return 0, fmt.Errorf("compute of %d never started while %d was post-processed", v+1, v)
					}
				}
				return v, nil
			})
			head := &loopHead{n: n}
			g := New().
				Add("schedule", NewPlanner[struct{}, int, int](head)).
				Add("compute", NewStage[int, int](compute)).
				Add("post", NewStage[int, int](post)).
				Connect("schedule", "compute", 8).
				Connect("compute", "post", 8).
				Feedback("post", "schedule", bound)
			if err := g.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			if len(head.feedback) != n {
				t.Fatalf("got %d feedback items, want %d", len(head.feedback), n)
			}
			if peak := occ.peak.Load(); peak != int32(bound) {
				t.Errorf("peak occupancy %d, want %d", peak, bound)
			}
			if bound == 1 {
				for i, ev := range occ.events {
					want := fmt.Sprintf("%c%d", "cp"[i%2], i/2)
					if ev != want {
						t.Fatalf("event %d = %s, want %s (strict turns): %v", i, ev, want, occ.events)
					}
				}
			}
		})
	}
}

func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name  string
		build func() *Graph
		want  []string
	}{
		{
			name: "type mismatch names both stages and types",
			build: func() *Graph {
				return New().
					Add("src", NewSource[int](&counter{n: 1})).
					Add("upper", NewStage(StageFunc[string, string](func(_ context.Context, s string) (string, error) { return s, nil }))).
					Add("sink", NewSink[string](&collector[string]{})).
					Connect("src", "upper", 1).Connect("upper", "sink", 1)
			},
			want: []string{`"src" produces int`, `"upper" consumes string`},
		},
		{
			name: "unknown node",
			build: func() *Graph {
				return New().Add("src", NewSource[int](&counter{n: 1})).Connect("src", "nowhere", 1)
			},
			want: []string{`no node named "nowhere"`},
		},
		{
			name: "unconnected input",
			build: func() *Graph {
				return New().Add("sink", NewSink[int](&collector[int]{}))
			},
			want: []string{`input of sink "sink"`},
		},
		{
			name: "cycle without feedback",
			build: func() *Graph {
				return New().Add("a", NewStage(double())).Add("b", NewStage(double())).
					Connect("a", "b", 1).Connect("b", "a", 1)
			},
			want: []string{"cycle without a feedback edge"},
		},
		{
			name: "feedback into a stage",
			build: func() *Graph {
				return New().Add("src", NewSource[int](&counter{n: 1})).Add("a", NewStage(double())).
					Connect("src", "a", 1).Feedback("a", "a", 1)
			},
			want: []string{`"a" is a stage, not a planner`},
		},
		{
			name: "two outputs",
			build: func() *Graph {
				return New().Add("src", NewSource[int](&counter{n: 1})).
					Add("s1", NewSink[int](&collector[int]{})).Add("s2", NewSink[int](&collector[int]{})).
					Connect("src", "s1", 1).Connect("src", "s2", 1)
			},
			want: []string{`"src" has 2 outgoing edges`},
		},
		{
			name: "duplicate name",
			build: func() *Graph {
				return New().Add("x", NewSource[int](&counter{n: 1})).Add("x", NewSink[int](&collector[int]{}))
			},
			want: []string{`"x" declared twice`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.build().Build()
			if err == nil {
				t.Fatal("Build succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

type shape interface{ Area() int }
type square int

func (s square) Area() int { return int(s * s) }

// A producer may feed a consumer whose input is an interface it implements.
func TestInterfaceEdge(t *testing.T) {
	out := &collector[shape]{}
	sq := SourceFunc[square](func() func(context.Context) (square, error) {
		i := 0
		return func(context.Context) (square, error) {
			i++
			if i > 3 {
				return 0, errEOF
			}
			return square(i), nil
		}
	}())
	g := New().Add("src", NewSource[square](sq)).Add("sink", NewSink[shape](out)).Connect("src", "sink", 1)
	if err := g.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	var areas []int
	for _, s := range out.items() {
		areas = append(areas, s.Area())
	}
	if !reflect.DeepEqual(areas, []int{1, 4, 9}) {
		t.Errorf("areas = %v", areas)
	}
}

var errEOF = io.EOF

// waitingSource has one item, available only after the test opens a gate.
type waitingSource struct {
	gate chan struct{}
	done bool
}

func (w *waitingSource) Wait(ctx context.Context) error {
	select {
	case <-w.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *waitingSource) Next(context.Context) (int, error) {
	if w.done {
		return 0, errEOF
	}
	w.done = true
	return 1, nil
}

// A source that waits for outside input reports that time as wait-in.
func TestSourceWaiter(t *testing.T) {
	src := &waitingSource{gate: make(chan struct{})}
	g := New().Add("src", NewSource[int](src)).Add("sink", NewSink[int](&collector[int]{})).Connect("src", "sink", 1)
	if err := g.Build(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- g.Run(context.Background()) }()
	waitFor(t, "the source to wait", func() bool { return g.Stats()[0].State == StateWaitIn })
	time.Sleep(20 * time.Millisecond)
	close(src.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := g.Stats()[0]
	if s.WaitIn < 20*time.Millisecond || s.Busy >= s.WaitIn {
		t.Errorf("source: busy %v, wait-in %v; the wait should be wait-in", s.Busy, s.WaitIn)
	}
}

// wakeHead plans one item per wake-up and nothing otherwise.
type wakeHead struct {
	wake    chan struct{}
	asked   atomic.Int32
	planned int
}

func (h *wakeHead) Add(context.Context, struct{}) error { return nil }
func (h *wakeHead) Feedback(context.Context, int) error { return nil }
func (h *wakeHead) Wake() <-chan struct{}               { return h.wake }
func (h *wakeHead) Plan(context.Context) (int, bool, error) {
	if int(h.asked.Load()) <= h.planned {
		return 0, false, nil
	}
	h.planned++
	return h.planned, true, nil
}

// A planner woken from outside plans without any input or feedback.
func TestPlannerWaker(t *testing.T) {
	defer noLeaks(t)()
	head := &wakeHead{wake: make(chan struct{}, 1)}
	out := &collector[int]{}
	src := SourceFunc[struct{}](func(ctx context.Context) (struct{}, error) {
		<-ctx.Done() // the planner's input never delivers
		return struct{}{}, ctx.Err()
	})
	g := New().
		Add("src", NewSource[struct{}](src)).
		Add("plan", NewPlanner[struct{}, int, int](head)).
		Add("work", NewStage(double())).
		Add("tee", NewStage(StageFunc[int, int](func(_ context.Context, v int) (int, error) {
			out.Consume(context.Background(), v)
			return v, nil
		}))).
		Connect("src", "plan", 1).Connect("plan", "work", 1).Connect("work", "tee", 1).
		Feedback("tee", "plan", 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	for i := 1; i <= 3; i++ {
		head.asked.Add(1)
		head.wake <- struct{}{}
		waitFor(t, fmt.Sprint(i, " items"), func() bool { return len(out.items()) == i })
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if got := out.items(); !reflect.DeepEqual(got, []int{2, 4, 6}) {
		t.Errorf("items %v", got)
	}
}

// A node's busy time never decreases, also while it waits: an idle graph's
// stages report no busy time growing with the clock.
func TestBusyIsMonotonic(t *testing.T) {
	defer noLeaks(t)()
	gate := make(chan struct{})
	src := SourceFunc[int](func(ctx context.Context) (int, error) {
		select {
		case <-gate:
			return 0, io.EOF
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	})
	g := New().
		Add("src", NewSource[int](src)).
		Add("mid", NewStage(double())).
		Add("sink", NewSink[int](&collector[int]{})).
		Connect("src", "mid", 1).
		Connect("mid", "sink", 1)
	if err := g.Build(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- g.Run(context.Background()) }()
	prev := map[string]time.Duration{}
	waitFor(t, "mid waiting", func() bool { return g.Stats()[1].State == StateWaitIn })
	first := g.Stats()[1].Busy
	for range 50 {
		for _, s := range g.Stats() {
			if s.Busy < prev[s.Name] {
				t.Fatalf("%s: busy went from %v down to %v", s.Name, prev[s.Name], s.Busy)
			}
			prev[s.Name] = s.Busy
		}
		time.Sleep(time.Millisecond)
	}
	// 50 ms of waiting for input is not work.
	if grew := g.Stats()[1].Busy - first; grew > 20*time.Millisecond {
		t.Errorf("a waiting stage's busy time grew by %v", grew)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
