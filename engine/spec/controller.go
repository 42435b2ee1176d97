package spec

import (
	"math/bits"
	"slices"
	"time"
)

// Controller picks how many drafts a decode step verifies, 0 (speculation
// off) to K, by measuring: for each batch size class (the running
// sequences' count rounded down to a power of two) it runs one length, the
// class's best, and now and then compares a neighbour of it (best-1 or
// best+1) against it.
//
// A comparison runs the neighbour for half a window, then the best for
// half a window, right after it; the ratio is the neighbour's rate over
// the mean of the best's rates in its windows just before and just after
// (only the one after when the best has none before: a new class, a new
// best). A window's rate is the tokens its steps emitted over the wall
// time they took (each step's time runs from the completion of the step
// before), without its slowest decode-only step when it has four or more;
// its first step after a change of length is not measured (it still
// carries the old length's drafts or lacks the new one's).
//
// Steps that also carry prompt chunks (mixed steps: new requests joining
// a running batch) are measured apart. They cost several decode steps (on
// a GPU they run eagerly; on a CPU the prompt's tokens are computed), and a
// draft length costs there too (the drafter's pass over the prompt rows),
// so they must count; but a window of 8 to 16 steps holds zero, one or two
// of them by chance, which moved a window's rate by 20% or more, and
// dropping a window's slowest step, as a stall filter, dropped exactly
// them (on an H100 at batch 64 that kept MTP's drafts on: they won the
// decode steps by 9% and lost the run by 10%). So a window's rate is
// stratified: its decode-only steps give the time a token takes (without
// the slowest of them), and a length's mixed steps, pooled over the
// class's recent windows at that length, give the time a prompt token
// adds beyond a decode step (the step's time less the window's mean
// decode step); the class's recent steps give the prompt tokens per
// emitted token, a property of the workload that no length changes. The
// rate is one over (time a token + prompt tokens a token x time a prompt
// token): the run's throughput at that length, joining included, without
// the luck of how many mixed steps a window caught. A machine whose speed
// drifts (a shared host, a vCPU away for a while, another process) slows
// the windows around the neighbour's alike, and a stall in one step does
// not count, so the ratio holds where rates measured far apart would not;
// a comparison whose two windows of the best disagree by more than Drift
// is void and runs again (up to MaxVoids times in a row). The neighbour
// replaces the best after two wins in a row by more than Margin: one win,
// however large, may come from a swing in the machine's speed that the
// neighbour's window caught and the best's two windows did not. A window
// spans at least WindowSequences sequence-steps (64 steps at one
// sequence), since the tokens a step emits vary with the drafts its
// sequences happen to get accepted.
//
// It searches by hill climbing: throughput over the draft length rises
// while a longer draft earns more than it costs and falls after, so only
// the best length's neighbours are compared, each once, and the climb
// moves to one that wins. Every ExploreEvery windows of the best one
// neighbour is compared again, down and up in turn, so a class whose
// balance changes (longer contexts, another workload) is followed; each
// comparison that leaves the best where it was doubles the class's
// interval, up to MaxExploreFactor times ExploreEvery, and one that moves
// it sets the interval back.
//
// A class first seen starts from its nearest compared class: at its best
// length, with the lengths that lost there by more than Inherit counted
// as lost here too until the class's first re-comparison. A batch
// draining through classes as its requests finish (64 running, then 63,
// 31, 15, ...) thus does not pay in every class for drafts its neighbour
// found much slower, and a length near the best is still compared. A
// class is seeded again until one of its steps is measured, so a class
// passed through during a prefill (whose steps are not measured) takes
// its seed when it is really used. A fresh engine starts at 1 draft, so
// that the prompts of its first requests pass through drafters with a KV
// cache of their own (MTP, a draft model).
//
// It decides from measurements rather than from a cost model, because
// what a draft costs and earns depends on the backend, the drafter, the
// workload and the batch (on a GPU a verify step of 64 sequences is no
// longer bound by reading the weights; on a CPU a verify row costs about
// a decode row at any batch; an MTP layer trained one token ahead is
// seldom right four tokens ahead), and the engine may run on any of them.
// The cost: in a new class one or two comparisons of each neighbour, and
// afterwards half a window of a neighbour every ExploreEvery to
// MaxExploreFactor*ExploreEvery windows. The draft length never changes a
// token: verification is lossless at any length.
//
// Not safe for concurrent use: the schedule stage owns it.
type Controller struct {
	// K is the longest draft (num_speculative_tokens). Window is the
	// number of decode steps the best length runs between decisions;
	// ExploreEvery compares a neighbour of the best again once in that
	// many windows.
	K, Window, ExploreEvery int

	classes map[int]*classStats
	last    time.Time
}

// Margin is how much faster a neighbour must be than the best, in each of
// two comparisons in a row, to replace it (a ratio above 1+Margin).
const Margin = 0.02

// Drift: a comparison whose two windows of the best (before and after the
// neighbour's) differ by more than this share of the faster is void and
// runs again: the machine's speed moved under it.
const Drift = 0.25

// MaxVoids bounds the void comparisons in a row: on a machine whose speed
// swings every few steps nearly every comparison would be void, and
// retrying without end would run the neighbour half the time; the next
// one counts as measured.
const MaxVoids = 2

// Inherit: a new class counts as lost the lengths that its nearest
// compared class measured below 1-Inherit of that class's best.
const Inherit = 0.15

// WindowSequences is the least number of sequence-steps a window of the
// best spans (a neighbour's, half of it): a step's tokens vary with the
// drafts accepted, and at one sequence a window of Window steps would
// measure that luck more than the rate.
const WindowSequences = 64

// PoolSteps bounds the history a class pools for its prompt costs: past
// it, the pooled sums are halved, so that older steps weigh less and a
// changing workload is followed.
const PoolSteps = 256

// MaxExploreFactor bounds how far a class's re-comparisons back off: at
// most one in MaxExploreFactor*ExploreEvery windows of the best.
const MaxExploreFactor = 8

// classStats are one batch size class's state: its best length, each
// length's rate relative to the best in its last comparison (0: not
// compared), the window in progress and the comparison it belongs to.
// Each class keeps its own window, so a batch that moves between two
// classes measures both.
type classStats struct {
	window   int // steps of a window of the best: Window, more for small batches
	best     int
	ratio    []float64
	measured bool // a step of this class has been measured
	cur      window
	// prompt is, per draft length, its mixed steps' pooled time beyond a
	// decode step and their prompt tokens; joins the class's measured
	// steps' prompt and emitted tokens (see Controller).
	prompt []pooled
	joins  pooled
	before float64 // the rate of the best's last window (0: none since the best changed)

	trial    bool    // the window in progress runs the neighbour cand
	pending  bool    // cand's window is done; the best's next window decides
	cand     int     // the neighbour being compared
	candRate float64 // its rate
	wins     int     // comparisons in a row the neighbour won
	void     bool    // the last comparison is void (the best's windows disagreed)
	voids    int     // void comparisons in a row

	since, every int // windows of the best since the last comparison; the interval
	up           bool
	exploring    bool // the comparison in progress is a re-comparison
}

// window is a run of steps at draft length k: length measured steps after
// skip unmeasured ones, and what the measured ones emitted, took and
// carried of prompts.
type window struct {
	k, length, skip int
	tokens          []int
	times           []time.Duration
	prefill         []int // prompt tokens of each step (0: a decode step)
}

// windowDone reports whether the class's window is complete: it has its
// length and, where the class has seen prompts join, a mixed step of its
// length has been pooled or is in it (else the length's prompt cost would
// be a guess), or it has run MixedStretch times its length.
func (st *classStats) windowDone() bool {
	w := &st.cur
	n := len(w.times)
	if n < w.length {
		return false
	}
	if st.joins.a == 0 || st.prompt[w.k].n > 0 || n >= MixedStretch*w.length {
		return true
	}
	for _, p := range w.prefill {
		if p > 0 {
			return true
		}
	}
	return false
}

// MixedStretch bounds how far a window runs past its length to catch a
// mixed step of a length that has none pooled, as a multiple of its
// length.
const MixedStretch = 4

// pooled is a running pair of sums (a over b), halved past PoolSteps
// samples.
type pooled struct {
	a, b float64
	n    int
}

func (p *pooled) add(a, b float64) {
	if p.n >= PoolSteps {
		p.a, p.b, p.n = p.a/2, p.b/2, p.n/2
	}
	p.a, p.b, p.n = p.a+a, p.b+b, p.n+1
}

// ratio is a over b (0 when b is not positive).
func (p pooled) ratio() float64 {
	if p.b <= 0 {
		return 0
	}
	return p.a / p.b
}

// decode returns the seconds a token takes in the window's decode steps,
// without the slowest of them when there are four or more (a stall, or a
// vCPU away, in one step does not move the figure), and their mean step
// time; ok false when the window has no decode step.
func (w *window) decode() (perToken, perStep float64, ok bool) {
	n, slow := 0, -1
	for i, p := range w.prefill {
		if p == 0 {
			n++
			if slow < 0 || w.times[i] > w.times[slow] {
				slow = i
			}
		}
	}
	if n < 4 {
		slow = -1
	}
	var tokens, steps int
	var took time.Duration
	for i, p := range w.prefill {
		if p == 0 && i != slow {
			tokens, steps, took = tokens+w.tokens[i], steps+1, took+w.times[i]
		}
	}
	if tokens == 0 || took <= 0 {
		return 0, 0, false
	}
	return took.Seconds() / float64(tokens), took.Seconds() / float64(steps), true
}

// measure pools window w's steps into the class's sums (its prompt
// tokens a token, and its length's time a prompt token) and returns its
// estimate of the throughput at its length in tokens per second (see
// Controller): one over the decode steps' time a token plus the class's
// prompt tokens a token times the length's time a prompt token. A window
// without decode steps gives its tokens over its time.
func (st *classStats) measure(w *window) float64 {
	perToken, perStep, ok := w.decode()
	for i, p := range w.prefill {
		st.joins.add(float64(p), float64(w.tokens[i]))
		if p > 0 && ok {
			st.prompt[w.k].add(w.times[i].Seconds()-perStep, float64(p))
		}
	}
	if !ok {
		var tokens int
		var took time.Duration
		for i := range w.times {
			tokens, took = tokens+w.tokens[i], took+w.times[i]
		}
		if took <= 0 {
			return 0
		}
		return float64(tokens) / took.Seconds()
	}
	// A length with no mixed step yet takes the class's pooled cost.
	c := st.prompt[w.k]
	if c.n == 0 {
		for _, o := range st.prompt {
			c.a, c.b, c.n = c.a+o.a, c.b+o.b, c.n+o.n
		}
	}
	return 1 / (perToken + st.joins.ratio()*max(0, c.ratio()))
}

// NewController returns a Controller for drafts of up to k tokens with
// windows of window steps that compares a neighbour of the best length
// again once in exploreEvery windows.
func NewController(k, window, exploreEvery int) *Controller {
	return &Controller{K: max(k, 1), Window: max(window, 1), ExploreEvery: max(exploreEvery, 2), classes: map[int]*classStats{}}
}

// class maps a running-sequence count to its class.
func class(numRunning int) int { return bits.Len(uint(max(numRunning, 1))) }

// Decide returns the longest draft the step about to be planned, with
// numRunning sequences running, should verify (0: none). Cost: O(K +
// Window) when a window ends, O(classes * K) while a class has no
// measured step.
func (c *Controller) Decide(numRunning int) int {
	st := c.stats(class(numRunning))
	if !st.windowDone() {
		return st.cur.k
	}
	c.finish(st)
	c.next(st)
	return st.cur.k
}

// finish closes a class's completed window: a neighbour's window waits
// for the best's next one; a best window decides a comparison waiting
// for it, against the mean of the best's windows before and after the
// neighbour's.
func (c *Controller) finish(st *classStats) {
	rate := st.measure(&st.cur)
	if st.trial {
		st.trial, st.pending, st.candRate = false, true, rate
		return
	}
	st.since++
	before := st.before
	st.before = rate
	if !st.pending {
		return
	}
	st.pending = false
	if before > 0 {
		if min(before, rate) < (1-Drift)*max(before, rate) && st.voids < MaxVoids {
			st.void = true // the machine's speed moved: compare again
			st.voids++
			return
		}
		rate = (before + rate) / 2
	}
	st.voids = 0
	r := 0.0
	if rate > 0 {
		r = st.candRate / rate
	}
	st.ratio[st.cand] = r
	if r > 1+Margin {
		st.wins++
	} else {
		st.wins = 0
	}
	switch {
	case st.wins >= 2:
		// The neighbour is the new best: every ratio was relative to the
		// old one, and the best's last rate is not its own.
		for k := range st.ratio {
			st.ratio[k] /= r
		}
		st.best, st.ratio[st.cand], st.before = st.cand, 1, 0
		st.endComparison(c, true)
	case st.wins == 1:
		// Compare once more to confirm.
	default:
		st.endComparison(c, false)
	}
}

// endComparison ends a comparison; a re-comparison that moved the best
// resets the interval, one that did not doubles it.
func (st *classStats) endComparison(c *Controller, moved bool) {
	st.wins = 0
	if !st.exploring {
		return
	}
	st.exploring = false
	if moved {
		st.every = c.ExploreEvery
	} else {
		st.every = min(2*st.every, MaxExploreFactor*c.ExploreEvery)
	}
}

// next starts a class's next window: the best's for half a window after
// a neighbour's (the comparison's second half), a neighbour's again to
// confirm a win, a neighbour of the best not compared yet (the climb),
// else the best, except once in the class's interval, when a neighbour
// is compared again.
func (c *Controller) next(st *classStats) {
	b := st.best
	switch {
	case st.pending:
		c.run(st, b, max(st.window/2, 2))
		return
	case st.wins == 1 || st.void:
		st.void = false
		c.compare(st, st.cand)
		return
	}
	for _, k := range []int{b - 1, b + 1} {
		if k >= 0 && k <= c.K && st.ratio[k] == 0 {
			c.compare(st, k)
			return
		}
	}
	if st.every == 0 {
		st.every = c.ExploreEvery
	}
	if st.since < st.every {
		c.run(st, b, st.window)
		return
	}
	st.since = 0
	st.up = !st.up
	st.exploring = true
	switch {
	case b == 0:
		c.compare(st, 1)
	case b == c.K:
		c.compare(st, c.K-1)
	case st.up:
		c.compare(st, b+1)
	default:
		c.compare(st, b-1)
	}
}

// compare runs neighbour k for half a window (at least 2 steps).
func (c *Controller) compare(st *classStats, k int) {
	st.cand, st.trial = k, true
	c.run(st, k, max(st.window/2, 2))
}

// run starts a window of length measured steps at draft length k; after
// a window of another length its first step is not measured (it still
// carries the old length's drafts, or lacks the new one's).
func (c *Controller) run(st *classStats, k, length int) {
	skip := 0
	if k != st.cur.k || st.cur.length == 0 {
		skip = 1
	}
	st.cur = window{k: k, length: length, skip: skip, tokens: st.cur.tokens[:0], times: st.cur.times[:0], prefill: st.cur.prefill[:0]}
}

// Observe records a step with decode rows planned with numRunning
// sequences running and a draft limit of k (Decide's answer) that emitted
// tokens and completed at done; prefill counts the prompt tokens it also
// carried (0: a decode step). It counts toward its class's window when
// that window runs k (a step planned before the window began is not its
// own). Steps that also carry prompt chunks count too, since a draft
// length's cost shows there as well (the engine's schedule stage observes
// them); steps of prompts alone go to Skip: they would measure the
// prompts.
func (c *Controller) Observe(numRunning, k, tokens, prefill int, done time.Time) {
	st := c.stats(class(numRunning))
	if !c.last.IsZero() && done.After(c.last) && st.cur.k == k && !st.windowDone() {
		st.measured = true
		if st.cur.skip > 0 {
			st.cur.skip--
		} else {
			st.cur.tokens = append(st.cur.tokens, tokens)
			st.cur.times = append(st.cur.times, done.Sub(c.last))
			st.cur.prefill = append(st.cur.prefill, prefill)
		}
	}
	c.last = done
}

// Skip records a step that is not measured (prompt chunks alone): the
// next observed step's time starts at its completion.
func (c *Controller) Skip(done time.Time) { c.last = done }

// Best returns the draft length the class of numRunning sequences runs
// between comparisons (1 for a class never seen).
func (c *Controller) Best(numRunning int) int {
	if st := c.classes[class(numRunning)]; st != nil {
		return st.best
	}
	return min(1, c.K)
}

// Ratios returns, for draft lengths 0..K, each one's rate relative to the
// best length's in its last comparison in the class of numRunning
// sequences (1 for the best; 0: not compared).
func (c *Controller) Ratios(numRunning int) []float64 {
	st := c.classes[class(numRunning)]
	if st == nil {
		return make([]float64, c.K+1)
	}
	return slices.Clone(st.ratio)
}

// stats returns class cl's state, (re)seeding it from the nearest class
// with a completed comparison (the smaller on a tie) while none of its
// own steps has been measured.
func (c *Controller) stats(cl int) *classStats {
	st := c.classes[cl]
	if st != nil && st.measured {
		return st
	}
	var from *classStats
	dist := -1
	for other, o := range c.classes {
		if other == cl || !o.compared() {
			continue
		}
		d := other - cl
		if d < 0 {
			d = -d
		}
		if dist < 0 || d < dist || (d == dist && other < cl) {
			from, dist = o, d
		}
	}
	if st == nil {
		st = &classStats{ratio: make([]float64, c.K+1), window: max(c.Window, WindowSequences>>(cl-1)), prompt: make([]pooled, c.K+1)}
		c.classes[cl] = st
	}
	st.best = min(1, c.K)
	clear(st.ratio)
	if from != nil {
		st.best = from.best
		for k, r := range from.ratio {
			if r > 0 && r < 1-Inherit {
				st.ratio[k] = r
			}
		}
	}
	st.ratio[st.best] = 1
	st.trial, st.pending, st.wins, st.before = false, false, 0, 0
	st.cur = window{}
	c.next(st)
	return st
}

// compared reports whether a comparison has completed in the class.
func (st *classStats) compared() bool {
	for k, r := range st.ratio {
		if r > 0 && k != st.best {
			return true
		}
	}
	return false
}
