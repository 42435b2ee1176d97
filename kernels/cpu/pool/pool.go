// Package pool is a persistent worker pool for the CPU kernels: a parallel for
// loop over [0,n) that runs on long-lived worker goroutines plus the caller.
//
// A Pool of size p owns p-1 worker goroutines, started by New and stopped by
// Close; the goroutine that calls For is the p-th worker. For starts no
// goroutine: it publishes one job, wakes idle workers through a buffered
// channel, claims chunks itself with an atomic counter, and waits for the
// chunks that workers claimed.
//
// An idle worker polls for the next job for spinWait before it blocks, and
// the caller of For polls for the chunks that workers still run for as long
// before it blocks: a decode step calls For a few hundred times with a few
// microseconds of serial work in between, and waking a blocked thread (a
// futex wake, on a VM also the wake-up of a halted vCPU) cost about 20 µs a
// call, as much as the second core saved on 40 µs of work (BenchmarkForGap,
// two cores: 42-43 µs a call with one worker and with two blocking ones,
// 25 µs with two polling ones). A worker therefore keeps its core busy up to
// spinWait after its last job. The cost of an empty For in a tight loop is
// one 64-byte allocation, a few atomic and channel operations and the
// polling worker's share of the chunks: 0.5-0.8 µs on two cores (0.2 µs
// when the worker blocked and the caller ran every chunk itself), against
// 3 µs for a goroutine per chunk joined by a sync.WaitGroup (BenchmarkFor).
//
// Several goroutines may call For on one Pool at the same time: calls do not
// serialize, they share the workers (a worker finishes the chunks of one job,
// then takes the next job it is woken for), and each caller always makes
// progress on its own chunks, so For may also be called from inside fn
// (nested loops) without deadlock.
package pool

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// chunksPerWorker is how many chunks For cuts per worker. More than one chunk
// per worker lets a worker whose core is busy with another process hand its
// share to the others; the cost is that many more calls of fn.
const chunksPerWorker = 4

// spinWait is how long an idle worker polls for a new job, and the caller of
// For for its unfinished chunks, before blocking. It bounds the CPU time an
// idle pool burns after a loop.
const spinWait = 200 * time.Microsecond

// spinCheck is how many polls run between two looks at the clock (and yields
// of the processor to other goroutines) while spinning.
const spinCheck = 64

// Pool runs parallel loops on a fixed set of persistent goroutines.
// The zero value is not usable; create one with New.
type Pool struct {
	numWorkers int           // workers including the caller of For
	wake       chan *job     // one pointer per worker woken; buffered, never closed
	quit       chan struct{} // closed by Close
	closeOnce  sync.Once
	exited     sync.WaitGroup // the worker goroutines
}

// job is one call of For: chunks [0,numChunks) of [0,n), claimed through next.
type job struct {
	fn        func(lo, hi int)
	n         int
	grain     int
	numChunks int
	next      atomic.Int64   // next chunk to claim
	left      atomic.Int64   // chunks not yet finished, polled by the caller
	pending   sync.WaitGroup // chunks not yet finished, waited on after polling
	panicked  atomic.Pointer[PanicError]
}

// PanicError is the value For panics with when fn panicked in any chunk: the
// first panic's value and the stack of the goroutine where it happened.
type PanicError struct {
	Value any    // the value fn panicked with
	Stack []byte // stack of the panicking goroutine, from runtime/debug.Stack
}

// Error implements error.
func (e *PanicError) Error() string {
	return fmt.Sprintf("pool: panic in parallel loop: %v\n\n%s", e.Value, e.Stack)
}

// Unwrap returns the panic value if it is an error, so errors.Is and
// errors.As see through a PanicError.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// New returns a pool of n workers: n-1 goroutines plus the caller of For.
// n <= 0 means runtime.NumCPU(). A pool of one worker runs every loop on the
// caller. Call Close to stop the goroutines.
func New(n int) *Pool {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	p := &Pool{
		numWorkers: n,
		wake:       make(chan *job, 4*n),
		quit:       make(chan struct{}),
	}
	p.exited.Add(n - 1)
	for range n - 1 {
		go p.work()
	}
	return p
}

// NumWorkers is the number of workers including the caller of For.
func (p *Pool) NumWorkers() int { return p.numWorkers }

// Close stops the worker goroutines and waits until they have exited; a worker
// busy with a chunk finishes it first. Close is idempotent. For still works
// after Close, running every chunk on the caller.
func (p *Pool) Close() {
	p.closeOnce.Do(func() { close(p.quit) })
	p.exited.Wait()
}

// For calls fn(lo, hi) on contiguous chunks that cover [0, n) exactly once,
// in parallel on the pool's workers and the caller, and returns when every
// call has returned. Chunks have near-equal sizes; their number is at most
// 4 * NumWorkers and at most n. n <= 0 returns at once.
//
// fn must be safe to call concurrently on disjoint chunks. If fn panics in
// any chunk, For waits for the other chunks (chunks not yet started are
// skipped), then panics in the caller with a *PanicError that holds the first
// panic's value and stack.
func (p *Pool) For(n int, fn func(lo, hi int)) {
	p.ForGrain(n, 1, fn)
}

// ForGrain is For with chunk boundaries at multiples of grain (only the last
// chunk may end off the grid, at n): kernels use it to give every chunk whole
// SIMD vectors or whole micro-tiles. grain < 1 is taken as 1.
func (p *Pool) ForGrain(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	numGrains := (n + grain - 1) / grain
	numChunks := min(numGrains, chunksPerWorker*p.numWorkers)
	if p.numWorkers == 1 || numChunks == 1 {
		fn(0, n)
		return
	}
	j := &job{fn: fn, n: n, grain: grain, numChunks: numChunks}
	j.pending.Add(numChunks)
	j.left.Store(int64(numChunks))
	// Wake at most one worker per chunk beyond the caller's first. A full
	// channel means every worker already has work queued: the caller then
	// runs the chunks nobody claims.
	numWoken := min(numChunks-1, p.numWorkers-1)
wake:
	for range numWoken {
		select {
		case p.wake <- j:
		default:
			break wake
		}
	}
	j.run()
	j.await()
	if pe := j.panicked.Load(); pe != nil {
		panic(pe)
	}
}

// bounds returns chunk c's range: grains spread evenly over the chunks.
func (j *job) bounds(c int) (lo, hi int) {
	numGrains := (j.n + j.grain - 1) / j.grain
	lo = c * numGrains / j.numChunks * j.grain
	hi = min((c+1)*numGrains/j.numChunks*j.grain, j.n)
	return lo, hi
}

// run claims and runs chunks until none is left.
func (j *job) run() {
	for {
		c := int(j.next.Add(1) - 1)
		if c >= j.numChunks {
			return
		}
		j.runChunk(c)
	}
}

// await returns when every chunk has finished: it polls for spinWait, then
// blocks.
func (j *job) await() {
	start := time.Now()
	for i := 1; j.left.Load() > 0; i++ {
		if i%spinCheck == 0 {
			if time.Since(start) > spinWait {
				break
			}
			runtime.Gosched()
		}
	}
	j.pending.Wait()
}

func (j *job) runChunk(c int) {
	defer j.left.Add(-1) // after Done: await's Wait then never blocks
	defer j.pending.Done()
	defer func() {
		if v := recover(); v != nil {
			j.panicked.CompareAndSwap(nil, &PanicError{Value: v, Stack: debug.Stack()})
		}
	}()
	if j.panicked.Load() != nil {
		return // a chunk already failed: skip the rest
	}
	lo, hi := j.bounds(c)
	j.fn(lo, hi)
}

// work is one worker goroutine's loop.
func (p *Pool) work() {
	defer p.exited.Done()
	for {
		if j := p.poll(); j != nil {
			j.run()
			continue
		}
		select {
		case j := <-p.wake:
			j.run()
		case <-p.quit:
			return
		}
	}
}

// poll returns the next job if one is posted within spinWait, else nil (also
// once the pool is closed). It reads the queue's length, which takes no lock,
// and receives only when a job is there, so that the spin does not contend
// for the channel's lock with the caller of For that posts.
func (p *Pool) poll() *job {
	start := time.Now()
	for i := 1; ; i++ {
		if len(p.wake) > 0 {
			select {
			case j := <-p.wake:
				return j
			default: // another worker took it
			}
		}
		if i%spinCheck == 0 {
			select {
			case <-p.quit:
				return nil
			default:
			}
			if time.Since(start) > spinWait {
				return nil
			}
			runtime.Gosched()
		}
	}
}
