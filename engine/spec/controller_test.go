package spec

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// model is a synthetic engine: a step verifying k drafts emits
// tokens[k] tokens in stepTime[k].
type model struct {
	tokens   []int
	stepTime []time.Duration
}

// run drives c for steps decode steps with n running sequences and
// returns how many steps ran at each draft length.
func (m model) run(c *Controller, now *time.Time, n, steps int) []int {
	return m.runScaled(c, now, n, steps, func() float64 { return 1 })
}

// runScaled is run with each step's time multiplied by scale().
func (m model) runScaled(c *Controller, now *time.Time, n, steps int, scale func() float64) []int {
	return drive(c, now, n, steps, len(m.tokens), func(k int) (int, time.Duration, int) {
		return m.tokens[k], time.Duration(float64(m.stepTime[k]) * scale()), 0
	})
}

// drive runs c for steps steps with n running sequences, each step at the
// length c decides taking what step says (tokens emitted, time, prompt
// tokens), and returns how many steps ran at each of the lengths
// 0..lengths-1.
func drive(c *Controller, now *time.Time, n, steps, lengths int, step func(k int) (int, time.Duration, int)) []int {
	count := make([]int, lengths)
	for range steps {
		k := c.Decide(n)
		count[k]++
		tokens, took, prefill := step(k)
		*now = now.Add(took)
		c.Observe(n, k, tokens, prefill, *now)
	}
	return count
}

func TestController(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name  string
		m     model
		wantK int
		// never lists lengths the climb must not try: past a neighbour
		// slower than the best, throughput only falls.
		never []int
	}{
		// tokens/s: 1000, 1500, 1600, 1440: two drafts are fastest.
		{"a middle length wins", model{[]int{1, 2, 2, 3}, []time.Duration{ms, 4 * ms / 3, 5 * ms / 4, 25 * ms / 12}}, 2, nil},
		// 1000, 800, 700, 600: drafts cost.
		{"drafts cost", model{[]int{1, 2, 2, 3}, []time.Duration{ms, 5 * ms / 2, 20 * ms / 7, 5 * ms}}, 0, []int{3}},
		// 1000, 1200, 1500, 2000: the longest wins.
		{"the longest wins", model{[]int{1, 2, 3, 4}, []time.Duration{ms, 5 * ms / 3, 2 * ms, 2 * ms}}, 3, nil},
		// 1000, 1400, 1000, 500: one draft.
		{"one draft", model{[]int{1, 2, 2, 2}, []time.Duration{ms, 10 * ms / 7, 2 * ms, 4 * ms}}, 1, []int{3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := NewController(3, 16, 8)
			now := time.Unix(0, 0)
			c.Skip(now)
			const steps = 16 * 120
			count := tc.m.run(c, &now, 8, steps)
			rates := c.Ratios(8)
			if share := float64(count[tc.wantK]) / steps; share < 0.8 {
				t.Errorf("length %d ran %.2f of the steps (%v; rates %v)", tc.wantK, share, count, rates)
			}
			// The best length's neighbours are measured again, so a change
			// in balance would be followed.
			for _, k := range []int{tc.wantK - 1, tc.wantK + 1} {
				if k >= 0 && k <= 3 && count[k] < 2*(16/4+1) {
					t.Errorf("neighbour %d ran %d steps: never measured again (%v)", k, count[k], count)
				}
			}
			for _, k := range tc.never {
				if count[k] != 0 {
					t.Errorf("length %d ran %d steps; the climb should stop before it (%v; rates %v)", k, count[k], count, rates)
				}
			}
		})
	}
}

// A new class starts at the best length of the nearest class measured, so
// a batch moving through classes (requests finishing) does not pay again
// for lengths its neighbour found slow.
func TestControllerSeedsNewClass(t *testing.T) {
	ms := time.Millisecond
	costs := model{[]int{1, 2, 2, 3, 3}, []time.Duration{ms, 4 * ms, 5 * ms, 8 * ms, 9 * ms}}
	c := NewController(4, 16, 8)
	now := time.Unix(0, 0)
	c.Skip(now)
	costs.run(c, &now, 64, 16*6)
	if got := c.Decide(40); got != 0 {
		t.Fatalf("the class of 40 sequences starts at %d drafts, want 0 (the class of 64's best; ratios %v)", got, c.Ratios(64))
	}
	// Length 1 lost by far at 64 sequences (0.5), so the new class does
	// not compare it before its first re-comparison (after 8 windows).
	count := costs.run(c, &now, 40, 16*8)
	if count[1]+count[2]+count[3]+count[4] != 0 {
		t.Errorf("steps per length in the new class: %v", count)
	}
	if got := NewController(4, 16, 8).Best(1); got != 1 {
		t.Errorf("a fresh controller starts at %d drafts, want 1", got)
	}
}

// Classes are measured apart: drafts pay at one sequence and cost at 64.
func TestControllerClasses(t *testing.T) {
	ms := time.Millisecond
	pays := model{[]int{1, 3}, []time.Duration{ms, 2 * ms}}
	costs := model{[]int{1, 2}, []time.Duration{ms, 4 * ms}}
	c := NewController(1, 8, 8)
	now := time.Unix(0, 0)
	c.Skip(now)
	var on1, on64 int
	for range 40 {
		on1 += pays.run(c, &now, 1, 8)[1]
		on64 += costs.run(c, &now, 64, 8)[1]
	}
	if b1, b64 := c.Best(1), c.Best(64); b1 != 1 || b64 != 0 {
		t.Errorf("best length at batch 1: %d (ratios %v), at 64: %d (%v)", b1, c.Ratios(1), b64, c.Ratios(64))
	}
	if on1 < 320*7/10 || on64 > 320*3/10 {
		t.Errorf("drafts in %d of 320 steps at batch 1, %d of 320 at batch 64", on1, on64)
	}
}

// A batch that moves between two classes at every step (7 and 8 running)
// still completes windows in both and settles on the faster length.
func TestControllerAlternatingClasses(t *testing.T) {
	ms := time.Millisecond
	m := model{[]int{1, 3}, []time.Duration{ms, 2 * ms}}
	c := NewController(1, 8, 8)
	now := time.Unix(0, 0)
	c.Skip(now)
	on := 0
	for i := range 1600 {
		on += m.run(c, &now, 7+i%2, 1)[1]
	}
	for _, n := range []int{7, 8} {
		if b := c.Best(n); b != 1 {
			t.Errorf("%d running: best length %d (ratios %v)", n, b, c.Ratios(n))
		}
	}
	if on < 1600*7/10 {
		t.Errorf("drafts in %d of 1600 steps", on)
	}
}

// A step planned with another length than its class's window measures
// (planned before the window began) does not count toward it.
func TestControllerAttributesSteps(t *testing.T) {
	c := NewController(2, 8, 8)
	now := time.Unix(0, 0)
	c.Skip(now)
	// observe runs steps of n tokens each taking the given times.
	observe := func(k, n int, times ...time.Duration) {
		for _, d := range times {
			now = now.Add(d)
			c.Observe(16, k, n, 0, now)
		}
	}
	ms := time.Millisecond
	// A fresh class (16 sequences: windows of 8 steps) starts at 1 draft
	// and first compares its neighbour 0: half a window, 4 measured steps
	// after one that is not measured.
	if k := c.Decide(16); k != 0 {
		t.Fatalf("a fresh class first runs %d drafts, want 0 (compared with its start, 1)", k)
	}
	observe(2, 100, ms, ms, ms) // steps of another length: ignored
	observe(0, 1, 7*ms, ms, ms, ms)
	if c.Decide(16) != 0 {
		t.Fatal("a window ended on steps planned with another length, or before its own 4")
	}
	observe(0, 1, 3*ms) // 1000 tokens/s without the slowest step (3 ms)
	// Then the best for half a window: the ratio is to its rate, also
	// without its slowest step.
	if k := c.Decide(16); k != 1 {
		t.Fatalf("after the neighbour's window the class runs %d drafts, want 1", k)
	}
	observe(1, 3, 9*ms, 5*ms, 2*ms, 2*ms, 2*ms) // 1500 tokens/s
	c.Decide(16)
	if r := c.Ratios(16)[0]; math.Abs(r-2.0/3) > 1e-9 {
		t.Errorf("length 0 measured at %v of the best, want 2/3", r)
	}
}

// On a steady workload where the best length's neighbour is much slower,
// the re-measurements of it back off (one window in 9, 17, ... up to one in
// MaxExploreFactor*8+1), and a change in balance is still followed: once
// the neighbour turns faster, the next re-measurement finds it and the
// interval starts over.
func TestControllerBacksOff(t *testing.T) {
	ms := time.Millisecond
	// tokens/s: 1000, 650, 500: drafts cost.
	slow := model{[]int{1, 2, 2}, []time.Duration{ms, 40 * ms / 13, 4 * ms}}
	c := NewController(2, 16, 8)
	now := time.Unix(0, 0)
	c.Skip(now)
	const windows = 400
	count := slow.run(c, &now, 4, 16*windows)
	// Without the back-off a neighbour takes one window in 9: about 44
	// windows here. With it: the first quarter window, then about 8.
	if count[1] == 0 || count[1] > 16*12 {
		t.Errorf("draft length 1 ran %d steps of %d; want it measured again, but in at most 12 windows (%v)", count[1], 16*windows, count)
	}
	if count[2] != 0 {
		t.Errorf("length 2 ran %d steps past a slower neighbour (%v)", count[2], count)
	}
	// Now one draft pays: 1000 against 1500 tokens/s.
	fast := model{[]int{1, 3, 2}, []time.Duration{ms, 2 * ms, 4 * ms}}
	steps := 16 * (MaxExploreFactor*8 + 2)
	fast.run(c, &now, 4, steps)
	after := fast.run(c, &now, 4, 16*50)
	if share := float64(after[1]) / float64(16*50); share < 0.8 {
		t.Errorf("after the change length 1 ran %.2f of the steps (%v); want the change followed within %d windows", share, after, MaxExploreFactor*8+2)
	}
}

// noisyMachine runs m on a machine whose speed drifts: every step's time
// is scaled by a jitter (±jitter, uniform) and, during slow spells (each
// step starts one with probability 1/spellEvery, lasting 20-200 steps), by
// slowdown, as on a shared host or a VM whose vCPU is away at times.
type noisyMachine struct {
	m          model
	rng        *rand.Rand
	jitter     float64
	slowdown   float64
	spellEvery int
	spell      int
}

func (n *noisyMachine) run(c *Controller, now *time.Time, running, steps int) []int {
	return n.m.runScaled(c, now, running, steps, func() float64 {
		f := 1 + n.jitter*(2*n.rng.Float64()-1)
		if n.spell == 0 && n.rng.IntN(n.spellEvery) == 0 {
			n.spell = 20 + n.rng.IntN(181)
		}
		if n.spell > 0 {
			n.spell--
			f *= n.slowdown
		}
		return f
	})
}

// On a machine whose speed drifts by 2x for spells of 20-200 steps, with
// ±15% jitter a step, the controller still runs the faster length most of
// the time, whether the drafts cost 15% (a CPU verify row costs about a
// decode row) or pay 30%. Comparing windows measured seconds apart (an
// earlier version of this controller) kept the drafts that cost 15%
// through slow spells of the no-draft windows: in its worst run the faster
// length ran in 0.55 of the steps.
func TestControllerNoisyMachine(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name  string
		m     model
		wantK int
	}{
		// tokens/s: 1000 against 850: drafts cost.
		{"drafts cost 15%", model{[]int{1, 17}, []time.Duration{ms, 20 * ms}}, 0},
		// 1000 against 425: drafts cost a lot (twice the time for 1.7 tokens).
		{"drafts cost 2x", model{[]int{10, 17}, []time.Duration{10 * ms, 40 * ms}}, 0},
		// 1000 against 1300: drafts pay.
		{"drafts pay 30%", model{[]int{10, 13}, []time.Duration{10 * ms, 10 * ms}}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const runs, steps = 20, 1000
			worst, mean := 1.0, 0.0
			for seed := range uint64(runs) {
				n := &noisyMachine{m: tc.m, rng: rand.New(rand.NewPCG(seed, 7)), jitter: 0.15, slowdown: 2, spellEvery: 100}
				c := NewController(1, 16, 8)
				now := time.Unix(0, 0)
				c.Skip(now)
				count := n.run(c, &now, 8, steps)
				share := float64(count[tc.wantK]) / steps
				worst, mean = min(worst, share), mean+share/runs
			}
			t.Logf("length %d ran %.3f of the steps on average, %.3f in the worst of %d runs", tc.wantK, mean, worst, runs)
			if worst < 0.75 || mean < 0.85 {
				t.Errorf("length %d ran %.2f of the steps on average and %.2f in the worst of %d runs, want at least 0.85 and 0.75", tc.wantK, mean, worst, runs)
			}
		})
	}
}

// A batch draining through classes (64 running, then fewer as requests
// finish), on a backend where one draft costs twice a decode row's time
// (17 tokens in 2.5 times a plain step) from 4 sequences up, and pays below: the classes after the first inherit
// its verdict and run no drafts until their first re-comparison (after
// ExploreEvery windows), and the small classes, at that re-comparison,
// find the drafts that pay there.
func TestControllerDrain(t *testing.T) {
	ms := time.Millisecond
	costs := model{[]int{10, 17}, []time.Duration{10 * ms, 25 * ms}}
	pays := model{[]int{10, 17}, []time.Duration{10 * ms, 11 * ms}}
	c := NewController(1, 16, 8)
	now := time.Unix(0, 0)
	c.Skip(now)
	first := costs.run(c, &now, 64, 100)
	drafted := 0
	for n := 63; n >= 4; n-- {
		drafted += costs.run(c, &now, n, 3)[1]
	}
	if drafted != 0 {
		t.Errorf("the draining classes ran %d steps with drafts (first class: %v)", drafted, first)
	}
	for n := 3; n >= 1; n -= 2 {
		w := max(16, WindowSequences>>(class(n)-1)) // a window of the class
		count := pays.run(c, &now, n, w*8+4*w+w*8)
		if count[1] < w*8 {
			t.Errorf("%d sequences: steps per length %v; want drafts from the first re-comparison on", n, count)
		}
	}
}

// At one sequence a step's tokens vary with the drafts it happens to get
// accepted (here 0.68, 0.42, 0.25 and 0 at positions 1 to 4) and its time
// by ±15%: the controller still gets within 3% of the best fixed length's
// throughput, on backends where a draft costs a tenth of a step to a whole
// one (best lengths 2, 1, 1 and 0): 0.974, 0.992, 0.997 and 0.991. Windows
// span 64 sequence-steps at one sequence; with 16 steps the luck of a few
// steps weighs more (0.969 where a draft costs a tenth of a step).
func TestControllerRandomAcceptance(t *testing.T) {
	acc := []float64{0.68, 0.42, 0.25, 0}
	for _, cost := range []float64{0.1, 0.25, 0.5, 1} {
		stepTime := func(k int) float64 { return 1 + cost*float64(k) } // ms
		best, expect, p := 0.0, 1.0, 1.0
		for k := 0; k <= 4; k++ {
			if k > 0 {
				p *= acc[k-1]
				expect += p
			}
			best = max(best, expect/stepTime(k))
		}
		var got float64
		const seeds, steps = 10, 6000
		for seed := range uint64(seeds) {
			rng := rand.New(rand.NewPCG(seed, 3))
			c := NewController(4, 16, 8)
			now := time.Unix(0, 0)
			c.Skip(now)
			tokens, total := 0, 0.0
			for range steps {
				k := c.Decide(1)
				n := 1
				for j := 0; j < k && rng.Float64() < acc[j]; j++ {
					n++
				}
				d := stepTime(k) * (1 + 0.15*(2*rng.Float64()-1))
				now = now.Add(time.Duration(d * float64(time.Millisecond)))
				tokens, total = tokens+n, total+d
				c.Observe(1, k, n, 0, now)
			}
			got += float64(tokens) / total / best / seeds
		}
		t.Logf("a draft costing %.2f of a step: %.3f of the best length's throughput", cost, got)
		if got < 0.97 {
			t.Errorf("a draft costing %.2f of a step: %.3f of the best length's throughput, want at least 0.97", cost, got)
		}
	}
}

// On a machine whose speed swings by 2x every few steps, so that the two
// windows of the best around nearly every comparison disagree, the void
// comparisons are retried at most MaxVoids times in a row and then taken
// as measured: the controller does not spend its steps comparing. Before
// that bound, a swing every 6 steps kept the drafts that cost 15% in half
// the steps; with a one-win switch, a swing every 11 steps (the neighbour's
// window fast, both of the best's slow) kept them in a quarter.
func TestControllerSwingingMachine(t *testing.T) {
	ms := time.Millisecond
	costs := model{[]int{1, 17}, []time.Duration{ms, 20 * ms}} // drafts cost 15%
	for _, period := range []int{3, 6, 11} {
		step := 0
		c := NewController(1, 16, 8)
		now := time.Unix(0, 0)
		c.Skip(now)
		const steps = 4000
		count := costs.runScaled(c, &now, 8, steps, func() float64 {
			step++
			if (step/period)%2 == 1 {
				return 2
			}
			return 1
		})
		share := float64(count[1]) / steps
		t.Logf("speed swinging every %d steps: drafts in %.3f of the steps", period, share)
		if share > 0.2 {
			t.Errorf("speed swinging every %d steps: drafts in %.2f of the steps (%v)", period, share, count)
		}
	}
}

// joiningModel is a synthetic engine under continuous batching: a step at
// draft length k emits tokens[k] tokens in stepTime[k], except that once
// in about joinEvery emitted tokens (uniform in half to one and a half
// times that) a prompt of about prompt tokens (the same spread) joins, and
// that step (a mixed step) takes promptCost[k] more for each prompt token.
type joiningModel struct {
	tokens               []int
	stepTime, promptCost []time.Duration
	joinEvery, prompt    int
	sinceJoin, nextJoin  int
	rng                  *rand.Rand
}

func (m *joiningModel) run(c *Controller, now *time.Time, n, steps int) []int {
	spread := func(x int) int { return x/2 + m.rng.IntN(x+1) }
	return drive(c, now, n, steps, len(m.tokens), func(k int) (int, time.Duration, int) {
		tokens, took, prefill := m.tokens[k], m.stepTime[k], 0
		if m.sinceJoin >= m.nextJoin {
			prefill = spread(m.prompt)
			took += time.Duration(prefill) * m.promptCost[k]
			m.sinceJoin, m.nextJoin = 0, spread(m.joinEvery)
		}
		m.sinceJoin += tokens
		return tokens, took, prefill
	})
}

// Mixed steps (prompts joining the batch) are rare and costly, and a draft
// length costs there too: the controller counts them, pooled, beside the
// decode steps. The first case is an H100's at batch 64 with MTP (the
// shipped model, prompts joining 16 at a time, about 1,500 prompt tokens a
// mixed step, one in about 820 emitted tokens): in decode steps alone
// drafts win (57, 98, 135 tokens in 0.57, 0.90, 1.22 ms), but a mixed step
// takes 1.55 ms without drafts and 4.5 ms with, so over the run no drafts
// is about 16% faster; dropping each window's slowest step (a mixed one)
// kept drafts on. The third is a CPU's at batch 8: a 200-token prompt
// takes 20 ms, 15% more with MTP's layer over it, one in 96 tokens, and a
// verify step of 1.83 tokens a row costs about twice a decode step: no
// drafts is about 10% faster, but mixed steps of 10 to 30 ms among decode
// steps of 3 to 5 ms made windows' plain rates swing by more than that.
func TestControllerMixedSteps(t *testing.T) {
	us := time.Microsecond
	cases := []struct {
		name  string
		m     joiningModel
		wantK int
	}{
		{"drafts cost in mixed steps", joiningModel{tokens: []int{57, 98, 135}, stepTime: []time.Duration{570 * us, 900 * us, 1220 * us},
			promptCost: []time.Duration{650 * time.Nanosecond, 2430 * time.Nanosecond, 2190 * time.Nanosecond}, joinEvery: 820, prompt: 1500}, 0},
		{"drafts pay in both", joiningModel{tokens: []int{57, 98, 135}, stepTime: []time.Duration{570 * us, 600 * us, 1000 * us},
			promptCost: []time.Duration{650 * time.Nanosecond, 870 * time.Nanosecond, 1070 * time.Nanosecond}, joinEvery: 820, prompt: 1500}, 1},
		{"a CPU at batch 8", joiningModel{tokens: []int{8, 15, 18}, stepTime: []time.Duration{2800 * us, 5400 * us, 7400 * us},
			promptCost: []time.Duration{100 * us, 115 * us, 130 * us}, joinEvery: 96, prompt: 200}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(4) {
				c := NewController(2, 16, 8)
				now := time.Unix(0, 0)
				c.Skip(now)
				m := tc.m
				m.rng = rand.New(rand.NewPCG(seed, 3))
				const steps = 3000
				count := m.run(c, &now, 64, steps)
				if share := float64(count[tc.wantK]) / steps; share < 0.75 {
					t.Errorf("seed %d: length %d ran %.2f of the steps (%v; ratios %v)", seed, tc.wantK, share, count, c.Ratios(64))
				}
			}
		})
	}
}
