package simd

import (
	"sync"
	"time"
)

// PeakFLOPS measures the float32 FMA throughput of workers goroutines
// running register-resident FMA chains (AVX-512 where the CPU has it, else
// AVX2 with FMA): the compute ceiling that MFU figures divide by. It is the
// larger of two readings, each the best of 12 short windows (about 1-2 ms
// each): all workers at once, and one worker alone times workers. A
// ceiling read low overstates every MFU figure divided by it: on a shared
// 2-vCPU VM the all-workers reading fell to 176 GFLOP/s, where others read
// 305-346, whenever the second vCPU was away for the whole probe, and the
// one-worker reading does not depend on it. ok is false where the CPU
// has neither (no ceiling is claimed). Cost: 25-50 ms of the workers,
// once per backend.
func PeakFLOPS(workers int) (flopsPerSecond float64, ok bool) {
	probe, flopsPerRound, iters := fmaPeak, 768.0, 250_000 // rounds of 24 independent 16-lane FMAs
	if _, ok := fmaPeak(1); !ok {
		probe, flopsPerRound, iters = fmaPeakAVX2, 192, 1_000_000 // 12 independent 8-lane FMAs
	}
	if _, ok := probe(1); !ok || workers < 1 {
		return 0, false
	}
	// best is the highest rate of n goroutines running the probe at once.
	best := func(n int) float64 {
		b := 0.0
		for range 12 {
			var wg sync.WaitGroup
			start := time.Now()
			for range n {
				wg.Go(func() { probe(iters) })
			}
			wg.Wait()
			if s := time.Since(start).Seconds(); s > 0 {
				b = max(b, float64(n)*float64(iters)*flopsPerRound/s)
			}
		}
		return b
	}
	peak := max(best(workers), float64(workers)*best(1))
	return peak, peak > 0
}
