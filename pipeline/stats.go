package pipeline

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// State is what a node is doing right now.
type State int32

const (
	StateIdle    State = iota // not started or finished
	StateBusy                 // inside Process, Next, Consume, Add, Feedback or Plan
	StateWaitIn               // blocked waiting for input
	StateWaitOut              // blocked sending output (backpressure)
)

func (s State) String() string {
	switch s {
	case StateIdle:
		return "idle"
	case StateBusy:
		return "busy"
	case StateWaitIn:
		return "wait-in"
	case StateWaitOut:
		return "wait-out"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// stageStats are a node's counters, written by its goroutine and read by
// anyone through atomics. The clock is read only when the node blocks (an
// empty input, a full output): the fast paths read none. Busy time is the
// node's running time less its blocked time, so a hop through an edge that
// did not block counts as the node's own work.
type stageStats struct {
	items           atomic.Int64
	waitIn, waitOut atomic.Int64 // nanoseconds blocked
	waitLag         atomic.Int64 // the part of waitIn spent on lagged inputs
	finished        atomic.Int64 // nanoseconds since epoch when the node ended; 0 while it runs
	maxQueue        atomic.Int64
	state           atomic.Int32
	started         atomic.Int64 // nanoseconds since epoch when the run started; 0 before
	timed           bool
	epoch           time.Time // time base, set by Build

	// mu orders the wait counters' updates with blockedSince, so that a
	// reader of busy never subtracts a wait twice or not at all: busy then
	// never decreases. Taken only when the node blocks, and by readers.
	mu           sync.Mutex
	blockedSince int64 // nanoseconds since epoch when the current wait began; 0: not blocked
}

// block marks the start of a wait and returns its start time.
func (s *stageStats) block() int64 {
	t := s.now()
	s.mu.Lock()
	s.blockedSince = t
	s.mu.Unlock()
	return t
}

// unblock ends the wait begun at t, adds its length to the counters
// given, and returns the length.
func (s *stageStats) unblock(t int64, counters ...*atomic.Int64) int64 {
	d := s.now() - t
	s.mu.Lock()
	for _, c := range counters {
		c.Add(d)
	}
	s.blockedSince = 0
	s.mu.Unlock()
	return d
}

// busy is the node's running time so far less its blocked time.
func (s *stageStats) busy() time.Duration {
	start := s.started.Load()
	if start == 0 || !s.timed {
		return 0
	}
	end := s.finished.Load()
	if end == 0 {
		end = s.now()
	}
	s.mu.Lock()
	blocked := s.waitIn.Load() + s.waitOut.Load()
	if b := s.blockedSince; b > 0 {
		blocked += max(0, end-b) // the wait still going on
	}
	s.mu.Unlock()
	return time.Duration(max(0, end-start-blocked))
}

// now returns monotonic nanoseconds since the graph was built, or 0 when
// timing is off.
func (s *stageStats) now() int64 {
	if !s.timed {
		return 0
	}
	return int64(time.Since(s.epoch))
}

func (s *stageStats) setState(st State) { s.state.Store(int32(st)) }

func (s *stageStats) observeQueue(n int) {
	if int64(n) > s.maxQueue.Load() {
		s.maxQueue.Store(int64(n))
	}
}

// StageStats is a snapshot of one node's counters.
type StageStats struct {
	Name     string
	Kind     Kind
	Items    int64         // items processed (produced, for a source)
	Busy     time.Duration // running time less blocked time: the node's own work
	WaitIn   time.Duration // time blocked on input
	WaitOut  time.Duration // time blocked on output (downstream full)
	WaitLag  time.Duration // the part of WaitIn spent waiting on lagged inputs (an earlier item downstream)
	QueueLen int           // items waiting in the node's input now
	QueueCap int           // capacity of the node's input
	MaxQueue int           // most items seen waiting in the input
	State    State
}

// FormatStats renders snapshots as an aligned table, busiest node first is
// left to the caller: rows keep the order given.
func FormatStats(stats []StageStats) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "stage\tkind\titems\tbusy\twait-in\t(lagged)\twait-out\tqueue\tmax-queue\tstate\t")
	for _, s := range stats {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\t\n",
			s.Name, s.Kind, s.Items, round(s.Busy), round(s.WaitIn), round(s.WaitLag), round(s.WaitOut),
			s.QueueLen, s.QueueCap, s.MaxQueue, s.State)
	}
	w.Flush()
	return b.String()
}

// Bottleneck returns the node with the most busy time, the first place to
// look when a graph is slow; ok is false for an empty slice.
func Bottleneck(stats []StageStats) (StageStats, bool) {
	if len(stats) == 0 {
		return StageStats{}, false
	}
	best := stats[0]
	for _, s := range stats[1:] {
		if s.Busy > best.Busy {
			best = s
		}
	}
	return best, true
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(time.Microsecond)
	}
	return d
}

func durationOf(a *atomic.Int64) time.Duration { return time.Duration(a.Load()) }
