package simd

import (
	"sync"
	"time"
)

// PeakFLOPS measures the float32 FMA throughput of workers goroutines
// running register-resident AVX-512 FMA chains at once: the practical
// compute ceiling that MFU figures divide by. It takes the best of 12
// short windows (about 1-2 ms each): a ceiling read low overstates every
// MFU figure divided by it, and on a shared 2-vCPU VM one run in a few of
// 4 windows read 176 GFLOP/s where the others read 305-346. ok is false
// where the CPU lacks AVX-512 (no ceiling is claimed). Cost: 12-25 ms of
// all workers, once per backend.
func PeakFLOPS(workers int) (flopsPerSecond float64, ok bool) {
	if _, ok := fmaPeak(1); !ok || workers < 1 {
		return 0, false
	}
	const iters = 250_000     // rounds of 24 independent 16-lane FMAs
	const flopsPerRound = 768 // 24 FMAs x 16 lanes x 2 flops
	best := 0.0
	for range 12 {
		var wg sync.WaitGroup
		start := time.Now()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fmaPeak(iters)
			}()
		}
		wg.Wait()
		if s := time.Since(start).Seconds(); s > 0 {
			best = max(best, float64(workers)*iters*flopsPerRound/s)
		}
	}
	return best, best > 0
}
