package pool

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestForCoversRangeOnce(t *testing.T) {
	tests := []struct {
		workers, n, grain int
	}{
		{1, 10, 1},
		{2, 0, 1},
		{2, -3, 1},
		{2, 1, 1},
		{2, 2, 1},
		{2, 7, 1},
		{2, 1000, 1},
		{3, 1000, 16},
		{4, 17, 16},
		{4, 33, 16},
		{8, 5, 1},
		{8, 100003, 64},
		{2, 10, 0}, // grain < 1 is 1
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("w%d/n%d/g%d", tc.workers, tc.n, tc.grain), func(t *testing.T) {
			p := New(tc.workers)
			defer p.Close()
			hits := make([]atomic.Int32, max(tc.n, 0))
			var calls atomic.Int32
			var bad atomic.Value
			p.ForGrain(tc.n, tc.grain, func(lo, hi int) {
				calls.Add(1)
				g := max(tc.grain, 1)
				if lo >= hi || lo < 0 || hi > tc.n {
					bad.Store(fmt.Sprintf("bad chunk [%d,%d)", lo, hi))
				}
				if lo%g != 0 || (hi%g != 0 && hi != tc.n) {
					bad.Store(fmt.Sprintf("chunk [%d,%d) off the grain-%d grid", lo, hi, g))
				}
				for i := lo; i < hi; i++ {
					hits[i].Add(1)
				}
			})
			if v := bad.Load(); v != nil {
				t.Fatal(v)
			}
			for i := range hits {
				if h := hits[i].Load(); h != 1 {
					t.Fatalf("index %d covered %d times", i, h)
				}
			}
			maxChunks := chunksPerWorker * tc.workers
			if c := int(calls.Load()); c > maxChunks || (tc.n > 0 && c == 0) {
				t.Fatalf("%d calls of fn, want 1..%d", c, maxChunks)
			}
		})
	}
}

func TestForUsesWorkers(t *testing.T) {
	p := New(4)
	defer p.Close()
	// Every chunk blocks until all 4 chunks have started: For returns only if
	// four goroutines (three workers plus the caller) ran them at the same time.
	var started sync.WaitGroup
	started.Add(4)
	done := make(chan struct{})
	go func() {
		p.For(4, func(lo, hi int) {
			started.Done()
			started.Wait()
		})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("For(4) on a pool of 4 did not run its chunks concurrently")
	}
}

func TestForPanicPropagates(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name  string
		value any
	}{
		{"string", "bad chunk"},
		{"error", errBoom},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := New(3)
			defer p.Close()
			var running, finished atomic.Int32
			got := func() (r any) {
				defer func() { r = recover() }()
				p.For(12, func(lo, hi int) {
					running.Add(1)
					defer running.Add(-1)
					if lo == 0 {
						panic(tc.value)
					}
					time.Sleep(time.Millisecond)
					finished.Add(1)
				})
				return nil
			}()
			if n := running.Load(); n != 0 {
				t.Fatalf("%d chunks still running after For panicked", n)
			}
			pe, ok := got.(*PanicError)
			if !ok {
				t.Fatalf("recovered %T %v, want *PanicError", got, got)
			}
			if pe.Value != tc.value {
				t.Fatalf("PanicError.Value = %v, want %v", pe.Value, tc.value)
			}
			if !strings.Contains(string(pe.Stack), "TestForPanicPropagates") {
				t.Fatalf("stack does not show the panicking function:\n%s", pe.Stack)
			}
			if err, isErr := tc.value.(error); isErr && !errors.Is(pe, err) {
				t.Fatalf("errors.Is(PanicError, %v) = false", err)
			}
			// The pool is still usable.
			var sum atomic.Int64
			p.For(100, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					sum.Add(int64(i))
				}
			})
			if sum.Load() != 4950 {
				t.Fatalf("sum after panic = %d, want 4950", sum.Load())
			}
		})
	}
}

func TestForConcurrentCallers(t *testing.T) {
	p := New(3)
	defer p.Close()
	const numCallers, n = 6, 5000
	var wg sync.WaitGroup
	sums := make([]int64, numCallers)
	for c := range numCallers {
		wg.Go(func() {
			for range 20 {
				var sum atomic.Int64
				p.For(n, func(lo, hi int) {
					var s int64
					for i := lo; i < hi; i++ {
						s += int64(i)
					}
					sum.Add(s)
				})
				sums[c] = sum.Load()
			}
		})
	}
	wg.Wait()
	for c, s := range sums {
		if want := int64(n * (n - 1) / 2); s != want {
			t.Fatalf("caller %d: sum %d, want %d", c, s, want)
		}
	}
}

func TestForNested(t *testing.T) {
	p := New(2)
	defer p.Close()
	var total atomic.Int64
	p.For(8, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			p.For(100, func(lo, hi int) {
				total.Add(int64(hi - lo))
			})
		}
	})
	if total.Load() != 800 {
		t.Fatalf("nested For covered %d indices, want 800", total.Load())
	}
}

// workerGoroutines counts goroutines whose stack shows the pool's worker loop.
func workerGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "pool.(*Pool).work(")
}

// settledWorkerGoroutines is workerGoroutines once two counts 10 ms apart
// agree: a worker of a pool closed by an earlier test has called Done but
// may not have exited yet, and must not count in a baseline.
func settledWorkerGoroutines(t *testing.T) int {
	n := workerGoroutines()
	for start := time.Now(); time.Since(start) < 5*time.Second; {
		time.Sleep(10 * time.Millisecond)
		m := workerGoroutines()
		if m == n {
			return n
		}
		n = m
	}
	t.Fatalf("worker goroutine count still changing after 5 s (%d)", n)
	return 0
}

func TestCloseStopsWorkers(t *testing.T) {
	base := settledWorkerGoroutines(t)
	pools := []*Pool{New(4), New(2), New(1)}
	// A goroutine just started may not be in the stack dump yet.
	for start := time.Now(); workerGoroutines()-base != 3+1; time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d worker goroutines running, want 4", workerGoroutines()-base)
		}
	}
	for _, p := range pools {
		p.For(1000, func(lo, hi int) {})
		p.Close()
		p.Close() // idempotent
	}
	// Close waits for each worker's deferred Done; the goroutine itself may
	// take a moment more to disappear from the stack dump.
	deadline := time.Now().Add(5 * time.Second)
	for workerGoroutines() != base {
		if time.Now().After(deadline) {
			t.Fatalf("%d worker goroutines outlive Close", workerGoroutines()-base)
		}
		time.Sleep(time.Millisecond)
	}
	// For after Close runs everything on the caller.
	var n atomic.Int32
	pools[0].For(50, func(lo, hi int) { n.Add(int32(hi - lo)) })
	if n.Load() != 50 {
		t.Fatalf("For after Close covered %d, want 50", n.Load())
	}
}

func TestNewDefaultSize(t *testing.T) {
	p := New(0)
	defer p.Close()
	if p.NumWorkers() != runtime.NumCPU() {
		t.Fatalf("New(0).NumWorkers() = %d, want %d", p.NumWorkers(), runtime.NumCPU())
	}
}

func ExamplePool_For() {
	p := New(0) // one worker per core
	defer p.Close()
	x := make([]float32, 1000)
	p.For(len(x), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x[i] = float32(i) * 0.5
		}
	})
	fmt.Println(x[0], x[999])
	// Output: 0 499.5
}

// BenchmarkFor measures the fixed cost of a parallel loop with an empty body:
// the pool against a goroutine per chunk joined by a sync.WaitGroup, with the
// same number of chunks.
func BenchmarkFor(b *testing.B) {
	numWorkers := runtime.NumCPU()
	numChunks := chunksPerWorker * numWorkers
	b.Run("pool", func(b *testing.B) {
		p := New(numWorkers)
		defer p.Close()
		fn := func(lo, hi int) {}
		for b.Loop() {
			p.For(1<<20, fn)
		}
	})
	b.Run("waitgroup", func(b *testing.B) {
		fn := func(lo, hi int) {}
		n := 1 << 20
		for b.Loop() {
			var wg sync.WaitGroup
			for c := range numChunks {
				lo, hi := c*n/numChunks, (c+1)*n/numChunks
				wg.Go(func() { fn(lo, hi) })
			}
			wg.Wait()
		}
	})
	b.Run("waitgroup-per-worker", func(b *testing.B) {
		fn := func(lo, hi int) {}
		n := 1 << 20
		for b.Loop() {
			var wg sync.WaitGroup
			for c := range numWorkers {
				lo, hi := c*n/numWorkers, (c+1)*n/numWorkers
				wg.Go(func() { fn(lo, hi) })
			}
			wg.Wait()
		}
	})
}

// busy spins for about d on the calling goroutine without blocking.
func busy(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// BenchmarkForGap measures a loop as a decode step runs it: each call's
// chunks hold a few microseconds of work, and the caller does serial work
// between calls, long enough for an idle worker to block. One op is one
// call plus its gap; compare with the same body run on one worker.
func BenchmarkForGap(b *testing.B) {
	const work = 40 * time.Microsecond // of the whole loop, on one worker
	for _, gap := range []time.Duration{2 * time.Microsecond, 20 * time.Microsecond} {
		for _, workers := range []int{1, runtime.NumCPU()} {
			b.Run(fmt.Sprintf("gap=%v/workers=%d", gap, workers), func(b *testing.B) {
				p := New(workers)
				defer p.Close()
				n := chunksPerWorker * runtime.NumCPU()
				fn := func(lo, hi int) { busy(work * time.Duration(hi-lo) / time.Duration(n)) }
				for b.Loop() {
					p.For(n, fn)
					busy(gap)
				}
			})
		}
	}
}
