package bench

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// minRateElapsed is the shortest elapsed time over which the progress bar
// shows a rate: a count over a shorter time is noise (one sequence done
// 10 µs after the clock started reads as 100,000 per second).
const minRateElapsed = 500 * time.Millisecond

// rate is n items over elapsed, per second, computed from the start of
// the workload. ok is false when elapsed is shorter than minRateElapsed
// (or not positive), where no rate is meaningful; the rate is then 0.
// Cost: O(1).
func rate(n int, elapsed time.Duration) (perSec float64, ok bool) {
	if elapsed < minRateElapsed || n < 0 {
		return 0, false
	}
	return float64(n) / elapsed.Seconds(), true
}

// rateText formats rate(n, elapsed) with its unit, e.g. "12.3 seq/s", or
// "-- seq/s" while no rate is meaningful.
func rateText(n int, elapsed time.Duration, unit string) string {
	r, ok := rate(n, elapsed)
	if !ok {
		return fmt.Sprintf("-- %s/s", unit)
	}
	return fmt.Sprintf("%.1f %s/s", r, unit)
}

// progress is a progress bar over finished items of a workload, written
// to a terminal. Its clock starts when it is made (the workload's start),
// so the rate it shows is items over the workload's elapsed time, shown
// only after minRateElapsed; finish ends the bar's line with a newline.
// A nil *progress is a valid bar that writes nothing. Safe for concurrent
// use.
type progress struct {
	bar   *progressbar.ProgressBar
	label string
	unit  string
	total int
	start time.Time

	mu   sync.Mutex
	done int
}

// newProgress starts a bar of total items labelled label (e.g. "offline")
// counting unit (e.g. "seq") on w; nil w: no bar (nil).
func newProgress(w io.Writer, total int, label, unit string) *progress {
	if w == nil || total < 1 {
		return nil
	}
	p := &progress{label: label, unit: unit, total: total, start: time.Now()}
	p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(p.describe(0, 0)), progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(false), progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
	// Start the bar's own clock now, not at the first finished item.
	p.bar.StartWithoutRender()
	return p
}

func (p *progress) describe(done int, elapsed time.Duration) string {
	return fmt.Sprintf("%s %s", p.label, rateText(done, elapsed, p.unit))
}

// add counts one finished item. Cost: one render, at most every 100 ms.
func (p *progress) add() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar.IsFinished() {
		return // more items than total: the line has ended
	}
	p.done++
	desc := p.describe(p.done, time.Since(p.start))
	if p.done >= p.total {
		// The last item: the rate first, then the count that fills the bar
		// and ends its line.
		p.bar.Describe(desc)
		p.bar.Add(1)
		return
	}
	p.bar.Add(1) // the count first: a render shows no rate ahead of its count
	p.bar.Describe(desc)
}

// finish fills the bar, shows the final rate and ends the line: what is
// written next starts on a line of its own. Call it after the last add,
// also when the workload stopped early; later calls do nothing.
func (p *progress) finish() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar.IsFinished() {
		return // the last add filled it and ended the line
	}
	p.bar.Describe(p.describe(p.done, time.Since(p.start)))
	p.bar.Finish()
}
