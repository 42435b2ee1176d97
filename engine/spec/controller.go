package spec

import (
	"math/bits"
	"time"
)

// Controller picks how many drafts a decode step verifies, 0 (speculation
// off) to K, by measuring: for each batch size class (the running
// sequences' count rounded down to a power of two) it keeps the decode
// throughput (tokens emitted per second of wall time between step
// completions) of every draft length it tried, and runs the fastest. Each
// choice runs for a window of steps (a quarter window for a length's first
// measurement). Unmeasured lengths in a class are
// tried first (K, 0 and 1, then 2..K-1 once some length beat none); every
// ExploreEvery windows one other length is measured, in turn, so a class
// whose balance changes
// (longer contexts, another workload) is noticed. The draft length never
// changes a token: verification is lossless at any length.
//
// It decides from measurements rather than from a cost model, because
// what a draft costs and earns depends on the backend, the drafter, the
// workload and the batch (on a GPU a verify step of 64 sequences is no
// longer bound by reading the weights; an MTP layer trained one token ahead
// is seldom right four tokens ahead), and the engine may run on any of
// them. The cost: a slower length runs one window in ExploreEvery.
//
// Not safe for concurrent use: the schedule stage owns it.
type Controller struct {
	// K is the longest draft (num_speculative_tokens). Window is the
	// number of decode steps per measurement; ExploreEvery re-measures
	// another length once in that many windows.
	K, Window, ExploreEvery int

	classes map[int]*classStats
	last    time.Time
}

// classStats are one batch size class's throughputs per draft length
// (tokens per second; 0: not measured), the window in progress (its draft
// length and what it measured so far), the windows run since the last
// exploration and the length explored last. Each class keeps its own
// window, so a batch that moves between two classes measures both.
type classStats struct {
	rate     []float64
	cur      window
	since    int
	explored int
}

type window struct {
	k, length, steps, tokens int
	time                     time.Duration
}

// NewController returns a Controller for drafts of up to k tokens with
// windows of window steps that re-measures another length once in
// exploreEvery windows.
func NewController(k, window, exploreEvery int) *Controller {
	return &Controller{K: max(k, 1), Window: max(window, 1), ExploreEvery: max(exploreEvery, 2), classes: map[int]*classStats{}}
}

// class maps a running-sequence count to its class.
func class(numRunning int) int { return bits.Len(uint(max(numRunning, 1))) }

// Decide returns the longest draft the step about to be planned, with
// numRunning sequences running, should verify (0: none). Cost: O(K).
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
	}
	c.next(st)
	return st.cur.k
}

// next starts a class's next window: a first measurement of a length is a
// quarter window (at least 2 steps), so that trying every length costs
// little even in a short run; the others are whole windows.
func (c *Controller) next(st *classStats) {
	k := c.choose(st)
	length := c.Window
	if st.rate[k] == 0 {
		length = max(c.Window/4, 2)
	}
	st.cur = window{k: k, length: length}
}

// choose returns the draft length of a class's next window.
func (c *Controller) choose(st *classStats) int {
	// Unmeasured lengths first: K, 0 and 1; the others only once some
	// draft length has beaten none (drafts that lose at both ends seldom
	// win in the middle, and each try costs a window).
	best := 0
	for k, r := range st.rate {
		if r > st.rate[best] {
			best = k
		}
	}
	order := []int{c.K, 0, 1}
	if best > 0 {
		for k := 2; k < c.K; k++ {
			order = append(order, k)
		}
	}
	for _, k := range order {
		if st.rate[k] == 0 {
			return k // not measured yet
		}
	}
	if st.since < c.ExploreEvery {
		return best
	}
	st.since = 0
	for range c.K + 1 { // the next length in turn, other than the best
		st.explored = (st.explored + 1) % (c.K + 1)
		if st.explored != best {
			return st.explored
		}
	}
	return best
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

func (c *Controller) stats(k int) *classStats {
	st := c.classes[k]
	if st == nil {
		st = &classStats{rate: make([]float64, c.K+1)}
		c.next(st)
		c.classes[k] = st
	}
	return st
}
