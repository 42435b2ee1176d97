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
