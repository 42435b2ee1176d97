package stages

import (
	"fmt"
	"time"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// deviceTimeline measures, on a backend with a device stream, how long the
// device works on each forward pass and how long it goes without forward
// work between two passes. The forward stage records a start marker right
// before a step's forward work is queued (after its inputs are loaded and
// the previous step's tokens resolved) and an end marker right after its
// logits are queued. The pair of steps (N-1, N) is read while step N+1
// runs, after N+1's work is queued: by then step N's logits have been
// waited for, so every marker read has completed and reading never blocks
// the loop.
//
// Three steps of markers are kept in a ring; a slot is recorded again only
// after its pair was read. Not safe for concurrent use: the forward stage
// owns it.
type deviceTimeline struct {
	stats *Stats
	slots [3]stepMarks
	next  uint64           // index of the next step to begin
	now   func() time.Time // the host clock (time.Now)
}

// stepMarks are one step's markers and what the pair needs to know of it.
type stepMarks struct {
	start, end         kernels.DeviceMarker
	hostStart, hostEnd time.Time
	decode             bool
	done               bool // both markers recorded for this step
}

// maxHostGap is the host time between two steps beyond which the engine
// was idle (no work), not overlapping: such a pair is not counted (the
// rule of Stats.recordGap).
const maxHostGap = time.Second

// newDeviceTimeline makes the ring's markers. Cost: six markers.
func newDeviceTimeline(t kernels.DeviceTimer, stats *Stats) (*deviceTimeline, error) {
	d := &deviceTimeline{stats: stats, now: time.Now}
	for i := range d.slots {
		for _, m := range []*kernels.DeviceMarker{&d.slots[i].start, &d.slots[i].end} {
			var err error
			if *m, err = t.NewDeviceMarker(); err != nil {
				d.close()
				return nil, fmt.Errorf("device timeline: %w", err)
			}
		}
	}
	stats.deviceTimed.Store(true)
	return d, nil
}

// begin records the start marker of the next step. decode says whether the
// step is a pure decode step. A step begun and never finished (its forward
// pass failed) leaves its slot to the next step.
func (d *deviceTimeline) begin(decode bool) error {
	s := &d.slots[d.next%3]
	s.done, s.decode = false, decode
	s.hostStart = d.now()
	if err := s.start.Record(); err != nil {
		return fmt.Errorf("device timeline: start marker: %w", err)
	}
	return nil
}

// finish records the end marker of the step begun last, then reads the
// pair of the two steps before it (whose markers have all completed, see
// the type's comment).
func (d *deviceTimeline) finish() error {
	s := &d.slots[d.next%3]
	if err := s.end.Record(); err != nil {
		return fmt.Errorf("device timeline: end marker: %w", err)
	}
	s.hostEnd, s.done = d.now(), true
	k := d.next
	d.next++
	if k < 2 {
		return nil
	}
	a, b := &d.slots[(k-2)%3], &d.slots[(k-1)%3]
	if !a.done || !b.done || b.hostStart.Sub(a.hostEnd) >= maxHostGap {
		return nil
	}
	busy, err := a.end.Since(a.start)
	if err != nil {
		return fmt.Errorf("device timeline: busy time: %w", err)
	}
	span, err := b.start.Since(a.start)
	if err != nil {
		return fmt.Errorf("device timeline: step span: %w", err)
	}
	d.stats.recordDevicePair(busy, span, a.decode && b.decode)
	return nil
}

// close releases the markers.
func (d *deviceTimeline) close() {
	if d == nil {
		return
	}
	for i := range d.slots {
		for _, m := range []kernels.DeviceMarker{d.slots[i].start, d.slots[i].end} {
			if m != nil {
				m.Close()
			}
		}
		d.slots[i] = stepMarks{}
	}
}

// sampleTimer measures the device time of a step's sampling kernels (the
// device sample path), which run between two forward passes: the device
// timeline counts them as device work, not idle time. Markers are recorded
// right before and after the sampling is queued, before anything that
// depends on it, and read once its host copy has arrived. A failing marker
// turns the timer off (the timeline reports its own failures). Not safe for
// concurrent use: one sample stage owns it.
type sampleTimer struct {
	start, stop kernels.DeviceMarker
	off         bool
}

// begin records the start marker when the backend has device markers and
// the timeline is on; it reports whether the step is being timed.
func (t *sampleTimer) begin(rt SampleDeps) bool {
	if t.off || rt.Stats == nil || !rt.Stats.deviceTimed.Load() {
		return false
	}
	if t.start == nil {
		dt, ok := rt.Ops.(kernels.DeviceTimer)
		if !ok {
			t.off = true
			return false
		}
		var err error
		if t.start, err = dt.NewDeviceMarker(); err == nil {
			t.stop, err = dt.NewDeviceMarker()
		}
		if err != nil {
			t.off = true
			return false
		}
	}
	if t.start.Record() != nil {
		t.off = true
		return false
	}
	return true
}

// end records the stop marker.
func (t *sampleTimer) end() {
	if t.stop.Record() != nil {
		t.off = true
	}
}

// read adds the step's sampling time to the stats; the stop marker has
// completed (the host copy queued before it has arrived).
func (t *sampleTimer) read(rt SampleDeps, decode bool) {
	if t.off {
		return
	}
	d, err := t.stop.Since(t.start)
	if err != nil {
		t.off = true
		return
	}
	rt.Stats.recordDeviceSample(d, decode)
}
