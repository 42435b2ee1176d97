package spec

import (
	"math/bits"
	"time"
)

// Controller turns speculative decoding on or off by measuring it: for
// each batch size class (the running sequences' count rounded down to a
// power of two) it keeps the decode throughput (tokens emitted per second
// of wall time between step completions) with drafts and without, and
// picks the faster. Each choice runs for a window of steps; an arm not yet
// measured in a class is tried first, and every ExploreEvery windows the
// other arm is measured again, so a class whose balance changes (longer
// contexts, another workload) is noticed. Turning drafts off never
// changes a token: verification is lossless either way.
//
// It decides from measurements rather than from a cost model, because
// what speculation costs depends on the backend, the drafter and the batch
// (on a GPU a verify step of 64 sequences is no longer bound by reading
// the weights; on a CPU a draft model's passes can cost more than they
// save), and the engine may run on any of them. The cost: a measured-worse
// arm runs one window in ExploreEvery.
//
// Not safe for concurrent use: the schedule stage owns it.
type Controller struct {
	// Window is the number of decode steps per measurement; ExploreEvery
	// re-measures the other arm once in that many windows.
	Window, ExploreEvery int

	classes map[int]*classStats
	cur     struct {
		class  int
		on     bool
		steps  int
		tokens int
		time   time.Duration
	}
	last time.Time
}

// classStats are the two arms' throughputs in one batch size class
// (tokens per second; 0: not measured) and the windows run since the
// loser was last measured.
type classStats struct {
	rate  [2]float64 // [off, on]
	since int
}

// NewController returns a Controller with windows of window steps that
// re-measures the losing arm once in exploreEvery windows.
func NewController(window, exploreEvery int) *Controller {
	c := &Controller{Window: max(window, 1), ExploreEvery: max(exploreEvery, 2), classes: map[int]*classStats{}}
	c.cur.on = true
	c.cur.class = -1
	return c
}

// class maps a running-sequence count to its class.
func class(numRunning int) int { return bits.Len(uint(max(numRunning, 1))) }

// Decide returns whether the step about to be planned, with numRunning
// sequences running, should verify drafts. Cost: O(1).
func (c *Controller) Decide(numRunning int) bool {
	k := class(numRunning)
	if k == c.cur.class && c.cur.steps < c.Window {
		return c.cur.on
	}
	if c.cur.class >= 0 && c.cur.steps >= c.Window && c.cur.time > 0 {
		st := c.stats(c.cur.class)
		arm := 0
		if c.cur.on {
			arm = 1
		}
		rate := float64(c.cur.tokens) / c.cur.time.Seconds()
		if st.rate[arm] == 0 {
			st.rate[arm] = rate
		} else {
			st.rate[arm] = (st.rate[arm] + rate) / 2
		}
		st.since++
	}
	st := c.stats(k)
	on := st.rate[1] >= st.rate[0] // a tie (both unmeasured) tries drafts first
	switch {
	case st.rate[1] == 0:
		on = true
	case st.rate[0] == 0:
		on = false
	case st.since >= c.ExploreEvery:
		on = !on // measure the loser again
		st.since = 0
	}
	c.cur.class, c.cur.on, c.cur.steps, c.cur.tokens, c.cur.time = k, on, 0, 0, 0
	return on
}

// Observe records a decode step that Decide planned and that emitted
// tokens, completing at done. Steps of other kinds (a prefill in the
// batch) should not be observed: they would measure the prompts.
func (c *Controller) Observe(tokens int, done time.Time) {
	if !c.last.IsZero() && done.After(c.last) {
		c.cur.time += done.Sub(c.last)
		c.cur.tokens += tokens
		c.cur.steps++
	}
	c.last = done
}

// Skip records a step that is not measured (a prefill or mixed step): the
// next observed step's time starts at its completion.
func (c *Controller) Skip(done time.Time) { c.last = done }

// Rates returns the measured throughputs (tokens/s; 0 when not measured)
// without and with drafts for the class of numRunning sequences.
func (c *Controller) Rates(numRunning int) (off, on float64) {
	st := c.classes[class(numRunning)]
	if st == nil {
		return 0, 0
	}
	return st.rate[0], st.rate[1]
}

func (c *Controller) stats(k int) *classStats {
	st := c.classes[k]
	if st == nil {
		st = &classStats{}
		c.classes[k] = st
	}
	return st
}
