package simd

import (
	"sync"
	"time"
)

// fmaProbe is one path's FMA throughput probe: run(iters) runs iters rounds
// of register-resident FMA chains of flopsPerRound flops and reports
// whether the CPU runs it; iters is a window of about 1-2 ms.
type fmaProbe struct {
	run           func(iters int) (float32, bool)
	flopsPerRound float64
	iters         int
}

// PeakFLOPS measures the float32 FMA throughput of workers goroutines
// running register-resident FMA chains in this path's vectors (8 lanes on
// AVX2, 16 on AVX-512; the pure-Go path measures the widest the CPU has):
// the compute ceiling that MFU figures of a run on this path divide by. A
// run restricted to AVX2 on a CPU with two 512-bit FMA units reaches half
// the AVX-512 ceiling at best, as a CPU without AVX-512 would. It is the
// larger of two readings, each the best of 12 short windows (about 1-2 ms
// each): all workers at once, and one worker alone times workers. A
// ceiling read low overstates every MFU figure divided by it: on a shared
// 2-vCPU VM the all-workers reading fell to 176 GFLOP/s, where others read
// 305-346, whenever the second vCPU was away for the whole probe, and the
// one-worker reading does not depend on it. ok is false where the CPU
// runs no probe (no ceiling is claimed). Cost: 25-50 ms of the workers,
// once per call.
func (p *Impl) PeakFLOPS(workers int) (flopsPerSecond float64, ok bool) {
	probe := p.probe()
	if probe.run == nil || workers < 1 {
		return 0, false
	}
	if _, ok := probe.run(1); !ok {
		return 0, false
	}
	// best is the highest rate of n goroutines running the probe at once.
	best := func(n int) float64 {
		b := 0.0
		for range 12 {
			var wg sync.WaitGroup
			start := time.Now()
			for range n {
				wg.Go(func() { probe.run(probe.iters) })
			}
			wg.Wait()
			if s := time.Since(start).Seconds(); s > 0 {
				b = max(b, float64(n)*float64(probe.iters)*probe.flopsPerRound/s)
			}
		}
		return b
	}
	peak := max(best(workers), float64(workers)*best(1))
	return peak, peak > 0
}

// probe is the FMA probe PeakFLOPS runs: the path's own, or on the pure-Go
// path the widest available (zero where there is none).
func (p *Impl) probe() fmaProbe {
	if p.peak.run != nil {
		return p.peak
	}
	var widest fmaProbe
	for _, q := range available { // slowest first: the last with a probe wins
		if q.peak.run != nil {
			widest = q.peak
		}
	}
	return widest
}
