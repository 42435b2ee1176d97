package spec

import "time"

// RowCost estimates a step's duration from its rows, as a line fitted to
// the steps measured: duration = Base + PerRow*rows, one line per batch
// size class (the sequences' count rounded down to a power of two, as
// Controller classes it). Verifying a draft adds a row to a step; PerRow
// is what that row costs at the batch the engine runs, which is what a
// budget of verified draft tokens must weigh against the tokens it earns
// (GateCost).
//
// The fit is a least-squares line over the class's steps, each weighted
// Decay^(steps since): old steps fade, so the line follows a batch whose
// context grows or a machine whose speed changes. A step whose duration
// exceeds Outlier times the class's weighted mean is left out (a stall, a
// collection, a step shared with other work). The line is trusted once
// the class holds Min steps' weight and its rows spread (a weighted
// variance of at least MinSpread rows squared): the rows must vary for a
// slope to be measured. They do while drafts are gated, since sequences
// verify different numbers of drafts from step to step; where a gate held
// them still for long enough the spread fades and the line is withdrawn,
// which lets the caller verify more for a while and measure again.
//
// Not safe for concurrent use: the draft stage owns it.
type RowCost struct {
	Decay     float64 // weight kept by a step at each newer step, in (0, 1)
	Min       float64 // weight before the line is trusted
	MinSpread float64 // weighted variance of rows before the slope is trusted
	Outlier   float64 // durations beyond this multiple of the mean are left out

	classes map[int]*rowFit
}

// NewRowCost returns a RowCost with the engine's defaults: a step weighs
// half after about 70 newer steps, the line is trusted after 16 steps'
// weight whose rows spread by half a row (standard deviation), and a step
// slower than 4 times the mean is left out.
func NewRowCost() *RowCost {
	return &RowCost{Decay: 0.99, Min: 16, MinSpread: 0.25, Outlier: 4}
}

// rowFit holds a class's weighted sums.
type rowFit struct{ w, x, y, xx, xy float64 }

// Observe records a step of seqs sequences and rows rows that took d.
// Cost: O(1).
func (c *RowCost) Observe(seqs, rows int, d time.Duration) {
	if rows <= 0 || d <= 0 {
		return
	}
	if c.classes == nil {
		c.classes = make(map[int]*rowFit)
	}
	f := c.classes[class(seqs)]
	if f == nil {
		f = &rowFit{}
		c.classes[class(seqs)] = f
	}
	x, y := float64(rows), d.Seconds()
	if f.w >= c.Min && y > c.Outlier*f.y/f.w {
		return
	}
	f.w, f.x, f.y, f.xx, f.xy = c.Decay*f.w+1, c.Decay*f.x+x, c.Decay*f.y+y, c.Decay*f.xx+x*x, c.Decay*f.xy+x*y
}

// Line returns the fitted duration of a step in seqs' class: base + perRow
// * rows, in seconds; ok false while the class has too few steps or too
// little spread in their rows, or the fit is not a cost (a negative
// slope, or a step of seqs rows that would take no time). Cost: O(1).
func (c *RowCost) Line(seqs int) (base, perRow float64, ok bool) {
	f := c.classes[class(seqs)]
	if f == nil || f.w < c.Min {
		return 0, 0, false
	}
	mx, my := f.x/f.w, f.y/f.w
	varX := f.xx/f.w - mx*mx
	if varX < c.MinSpread {
		return 0, 0, false
	}
	perRow = (f.xy/f.w - mx*my) / varX
	base = my - perRow*mx
	if perRow < 0 || base+perRow*float64(seqs) <= 0 {
		return 0, 0, false
	}
	return base, perRow, true
}

// GateCost deals draft tokens to the sequences of a step so as to
// maximize the step's expected tokens per second: with n sequences each
// emitting 1 + its accepted drafts, and B drafts verified in all taking
// rows n + B, the rate is (n + sum of the verified drafts' P_j) / (base +
// perRow*(n + B)). Sequence s may verify up to limits[s] drafts, with
// confidences conf[s]; drafts are taken best first as in GateBudget (the
// highest P_j, a sequence's j-th after its (j-1)-th), so for each B the
// best set is the first B, and GateCost keeps the B of the highest rate
// (the smallest on a tie). A draft pays while its P_j exceeds perRow
// times the rate so far. It returns the number of drafts each sequence
// verifies. Cost: O(D log D) for D drafts in all.
func GateCost(conf [][]float64, limits []int, base, perRow float64) []int {
	all := allowedDrafts(conf, limits)
	rankDrafts(all)
	rows := float64(len(conf))
	if base+perRow*rows <= 0 || perRow < 0 { // not a cost: every draft
		return draftCounts(len(conf), all)
	}
	tokens := rows
	bestB, bestRate := 0, tokens/(base+perRow*rows)
	for b, c := range all {
		tokens += c.p
		if r := tokens / (base + perRow*(rows+float64(b+1))); r > bestRate {
			bestB, bestRate = b+1, r
		}
	}
	return draftCounts(len(conf), all[:bestB])
}
