package stages

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
)

// Stats are the step loop's counters, updated by the stages and read by
// anyone (atomics).
type Stats struct {
	Steps         atomic.Int64
	PrefillTokens atomic.Int64 // prompt tokens computed
	DecodeTokens  atomic.Int64 // decode tokens computed
	ForwardNanos  atomic.Int64 // time inside the forward stage
	GapNanos      atomic.Int64 // time between two forward passes
	ExposedNanos  atomic.Int64 // the part of each gap that is not sampling: host time the device waits for
	Gaps          atomic.Int64 // gaps measured (steps after the first of a busy period)
	Placeholders  atomic.Int64 // inputs resolved from the previous step on the backend (ZOS)
	SampleNanos   atomic.Int64 // sampling work (device work in the design: it sits between two forwards)
	lastSample    atomic.Int64 // the latest step's sampling work, in nanoseconds
	PostWaitNanos atomic.Int64 // time sampling waited for the previous step's post-processing
	flopBits      atomic.Uint64
	byteBits      atomic.Uint64
}

func addFloat(a *atomic.Uint64, v float64) {
	for {
		old := a.Load()
		if a.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// record counts one forward pass.
func (s *Stats) record(out *engine.SchedulerOutputs, cost engine.StepCost, d time.Duration) {
	s.Steps.Add(1)
	s.PrefillTokens.Add(int64(out.NumPrefillTokens))
	s.DecodeTokens.Add(int64(out.NumDecodeTokens))
	s.ForwardNanos.Add(int64(d))
	addFloat(&s.flopBits, cost.FLOPs())
	addFloat(&s.byteBits, cost.Bytes())
}

// FLOPs is the estimated floating-point work of all forward passes so far.
func (s *Stats) FLOPs() float64 { return math.Float64frombits(s.flopBits.Load()) }

// Bytes is the estimated memory traffic of all forward passes so far.
func (s *Stats) Bytes() float64 { return math.Float64frombits(s.byteBits.Load()) }

// ForwardTime is the time spent in forward passes.
func (s *Stats) ForwardTime() time.Duration { return time.Duration(s.ForwardNanos.Load()) }

// recordGap counts the time between the end of a forward pass and the
// start of the next. A gap longer than a second is an idle engine, not
// host overhead, and is not counted.
// The sampling of the step before the gap (device work in the design) is
// not counted as exposed: by the time a forward pass starts, the previous
// step has been sampled in both modes (ZOS waits for its tokens).
func (s *Stats) recordGap(d time.Duration) {
	if d < time.Second {
		s.GapNanos.Add(int64(d))
		s.ExposedNanos.Add(max(0, int64(d)-s.lastSample.Load()))
		s.Gaps.Add(1)
	}
}

// recordSample counts one step's sampling work.
func (s *Stats) recordSample(d time.Duration) {
	s.SampleNanos.Add(int64(d))
	s.lastSample.Store(int64(d))
}

// MeanExposedHost is the mean time between two forward passes that is
// neither forward nor sampling work: the host time the device waits for.
func (s *Stats) MeanExposedHost() time.Duration {
	n := s.Gaps.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(s.ExposedNanos.Load() / n)
}

// MeanGap is the mean host time between two forward passes.
func (s *Stats) MeanGap() time.Duration {
	n := s.Gaps.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(s.GapNanos.Load() / n)
}
