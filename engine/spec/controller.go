package spec

import (
	"math/bits"
	"time"
)

// Controller picks how many drafts a decode step verifies, 0 (speculation
// off) to K, by measuring: for each batch size class (the running
// sequences' count rounded down to a power of two) it keeps the decode
// throughput (tokens emitted per second of wall time between step
// completions) of the draft lengths it tried, and runs the fastest. Each
// choice runs for a window of steps (a quarter window, at least 2 steps,
// for a length's first measurement in a class).
//
// It searches by hill climbing: throughput over the draft length rises
// while a longer draft earns more than it costs and falls after, so only
// the best length's neighbours are measured (best-1 and best+1, each once,
// then the climb moves to whichever beat it). A class starts at the best
// length of the nearest class measured (1 in a fresh engine): a batch
// whose size moves through classes, as one does while its requests
// finish, does not pay for lengths its neighbour class already found
// slow. Every ExploreEvery windows one neighbour of the best is measured
// again, down and up in turn, so a class whose balance changes (longer
// contexts, another workload) is followed; each such measurement that
// leaves the best length where it was doubles the class's interval, up to
// MaxExploreFactor times ExploreEvery, and one that moves it sets the
// interval back to ExploreEvery. So on a steady workload where a
// neighbour is much slower (a draft that costs a decode row, on a CPU)
// the measurements of it cost less and less: 1/9 of the windows at first,
// 1/65 once backed off. The draft length never changes a token:
// verification is lossless at any length.
//
// It decides from measurements rather than from a cost model, because
// what a draft costs and earns depends on the backend, the drafter, the
// workload and the batch (on a GPU a verify step of 64 sequences is no
// longer bound by reading the weights; an MTP layer trained one token ahead
// is seldom right four tokens ahead), and the engine may run on any of
// them. The cost: one window of a neighbouring length in ExploreEvery to
// MaxExploreFactor*ExploreEvery, and in a new class the quarter windows of
// its start and its neighbours.
//
// Not safe for concurrent use: the schedule stage owns it.
type Controller struct {
	// K is the longest draft (num_speculative_tokens). Window is the
	// number of decode steps per measurement; ExploreEvery re-measures
	// a neighbour of the best length once in that many windows.
	K, Window, ExploreEvery int

	classes map[int]*classStats
	last    time.Time
}

// classStats are one batch size class's throughputs per draft length
// (tokens per second; 0: not measured), the window in progress (its draft
// length and what it measured so far), the windows run since the last
// exploration and the direction of the next one. Each class keeps its own
// window, so a batch that moves between two classes measures both.
type classStats struct {
	rate  []float64
	cur   window
	since int
	up    bool
	// every is the windows between two re-measurements (ExploreEvery to
	// MaxExploreFactor*ExploreEvery); exploring is set while the window in
	// progress re-measures a neighbour of the length best was then.
	every     int
	exploring bool
	from      int
}

// MaxExploreFactor bounds how far a class's re-measurements back off: at
// most one window in MaxExploreFactor*ExploreEvery + 1.
const MaxExploreFactor = 8

type window struct {
	k, length, steps, tokens int
	time                     time.Duration
}

// NewController returns a Controller for drafts of up to k tokens with
// windows of window steps that re-measures a neighbour of the best length
// once in exploreEvery windows.
func NewController(k, window, exploreEvery int) *Controller {
	return &Controller{K: max(k, 1), Window: max(window, 1), ExploreEvery: max(exploreEvery, 2), classes: map[int]*classStats{}}
}

// class maps a running-sequence count to its class.
func class(numRunning int) int { return bits.Len(uint(max(numRunning, 1))) }

// Decide returns the longest draft the step about to be planned, with
// numRunning sequences running, should verify (0: none). Cost: O(K) when
// a window ends, O(classes) when a class is first seen.
func (c *Controller) Decide(numRunning int) int {
	st := c.stats(class(numRunning))
	if st.cur.steps < st.cur.length {
		return st.cur.k
	}
	if st.cur.time > 0 {
		rate := float64(st.cur.tokens) / st.cur.time.Seconds()
		if r := &st.rate[st.cur.k]; *r == 0 {
			*r = rate
		} else {
			*r = (*r + rate) / 2
		}
		st.since++
		if st.exploring {
			st.exploring = false
			if st.best() == st.from {
				st.every = min(2*st.every, MaxExploreFactor*c.ExploreEvery)
			} else {
				st.every = c.ExploreEvery
			}
		}
	}
	c.start(st, c.choose(st))
	return st.cur.k
}

// start begins a class's window at draft length k: a first measurement
// of a length is a quarter window (at least 2 steps), so that trying a
// length costs little even in a short run; the others are whole windows.
func (c *Controller) start(st *classStats, k int) {
	length := c.Window
	if st.rate[k] == 0 {
		length = max(c.Window/4, 2)
	}
	st.cur = window{k: k, length: length}
}

// best is the class's fastest measured length (0 when none is measured).
func (st *classStats) best() int {
	b := 0
	for k, r := range st.rate {
		if r > st.rate[b] {
			b = k
		}
	}
	return b
}

// choose returns the draft length of a class's next window: an unmeasured
// neighbour of the best length first (the climb), else the best, except
// once in the class's interval (ExploreEvery, backed off while the best
// holds), when a neighbour is measured again.
func (c *Controller) choose(st *classStats) int {
	b := st.best()
	for _, k := range []int{b - 1, b + 1} {
		if k >= 0 && k <= c.K && st.rate[k] == 0 {
			return k
		}
	}
	if st.every == 0 {
		st.every = c.ExploreEvery
	}
	if st.since < st.every {
		return b
	}
	st.since = 0
	st.up = !st.up
	st.exploring, st.from = true, b
	switch {
	case b == 0:
		return 1
	case b == c.K:
		return c.K - 1
	case st.up:
		return b + 1
	default:
		return b - 1
	}
}

// Observe records a decode step planned with numRunning sequences
// running and a draft limit of k (Decide's answer) that emitted tokens and
// completed at done. It counts toward its class's window when that window
// measures k (a step planned before the window began is not its own).
// Steps of other kinds (a prefill in the batch) go to Skip: they would
// measure the prompts.
func (c *Controller) Observe(numRunning, k, tokens int, done time.Time) {
	if st := c.stats(class(numRunning)); !c.last.IsZero() && done.After(c.last) && st.cur.k == k {
		st.cur.time += done.Sub(c.last)
		st.cur.tokens += tokens
		st.cur.steps++
	}
	c.last = done
}

// Skip records a step that is not measured (a prefill or mixed step): the
// next observed step's time starts at its completion.
func (c *Controller) Skip(done time.Time) { c.last = done }

// Rates returns the measured throughputs (tokens/s; 0 when not measured)
// of draft lengths 0..K for the class of numRunning sequences.
func (c *Controller) Rates(numRunning int) []float64 {
	st := c.classes[class(numRunning)]
	if st == nil {
		return make([]float64, c.K+1)
	}
	return append([]float64(nil), st.rate...)
}

// stats returns class cl's statistics, starting a new class at the best
// length of the nearest class with a measurement (the smaller on a tie;
// 1 when there is none).
func (c *Controller) stats(cl int) *classStats {
	st := c.classes[cl]
	if st != nil {
		return st
	}
	k, dist := 1, -1
	for other, o := range c.classes {
		d := other - cl
		if d < 0 {
			d = -d
		}
		if o.best() == 0 && o.rate[0] == 0 {
			continue // nothing measured there yet
		}
		if dist < 0 || d < dist || (d == dist && other < cl) {
			k, dist = o.best(), d
		}
	}
	st = &classStats{rate: make([]float64, c.K+1)}
	c.start(st, min(k, c.K))
	c.classes[cl] = st
	return st
}
