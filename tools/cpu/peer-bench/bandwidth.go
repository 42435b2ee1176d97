package main

import (
	"sync"
	"time"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// bandwidth measures the memory bandwidth with the benchmark's thread
// count, over buffers far larger than the caches: a parallel copy (bytes
// read plus bytes written per second, as the repository's CPU benchmarks
// count it) and a parallel streaming read (a SIMD dot product of the buffer
// with itself: the roofline of a GEMV). Each figure is the best of a few
// passes.
type bandwidth struct {
	threads  int
	src, dst []float32
	sums     []float32
}

func newBandwidth(bytes, threads int) *bandwidth {
	n := bytes / 4
	b := &bandwidth{threads: threads, src: make([]float32, n), dst: make([]float32, n), sums: make([]float32, threads)}
	for i := range b.src {
		b.src[i] = 1
	}
	copy(b.dst, b.src) // fault the pages in
	return b
}

// parallel runs f over threads contiguous slices of [0, n) and returns the
// wall time.
func (b *bandwidth) parallel(n int, f func(w, lo, hi int)) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	for w := range b.threads {
		lo, hi := n*w/b.threads, n*(w+1)/b.threads
		wg.Go(func() { f(w, lo, hi) })
	}
	wg.Wait()
	return time.Since(start)
}

// measure returns the copy and read bandwidths in bytes per second.
func (b *bandwidth) measure() (copyBps, readBps float64) {
	bytes := float64(len(b.src)) * float64(unsafe.Sizeof(b.src[0]))
	best := time.Duration(1 << 62)
	for range 3 {
		best = min(best, b.parallel(len(b.src), func(_, lo, hi int) { copy(b.dst[lo:hi], b.src[lo:hi]) }))
	}
	return 2 * bytes / best.Seconds(), b.read()
}

// read returns the read bandwidth in bytes per second: the best of three
// passes of the streaming read (about 0.1 s over 1 GiB at 30 GB/s).
func (b *bandwidth) read() float64 {
	bytes := float64(len(b.src)) * float64(unsafe.Sizeof(b.src[0]))
	best := time.Duration(1 << 62)
	for range 3 {
		best = min(best, b.parallel(len(b.src), func(w, lo, hi int) {
			// Chunks of 1 MiB: Dot's float32 sum stays exact for a buffer of ones.
			const chunk = 1 << 18
			for i := lo; i < hi; i += chunk {
				b.sums[w] += simd.Dot(b.src[i:min(hi, i+chunk)], b.src[i:min(hi, i+chunk)])
			}
		}))
	}
	return bytes / best.Seconds()
}
