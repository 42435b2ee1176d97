package cuda

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// handoffMutex is the backend's mutex: a sync.Mutex whose Unlock yields the
// processor when another goroutine waits for it. Unlock readies the waiter
// into this processor's run-next slot, and while the unlocking goroutine
// runs on (a stage building its step's views after its last backend call)
// another processor takes it from there only after a sleep that timer
// slack stretches to tens of microseconds: the step loop's next backend
// call (the sample stage's, say) waited 40-90 us for the prepare stage's
// host work on an H200 host. Yielding hands the processor to the waiter at
// once. Cost: an atomic add on a contended Lock, an atomic load on every
// Unlock, and a yield on an Unlock that has a waiter
// (BenchmarkHandoffMutex).
type handoffMutex struct {
	mu      sync.Mutex
	waiting atomic.Int32
}

// Lock locks m.
func (m *handoffMutex) Lock() {
	if m.mu.TryLock() {
		return
	}
	m.waiting.Add(1)
	m.mu.Lock()
	m.waiting.Add(-1)
}

// Unlock unlocks m and yields when a goroutine waits for it.
func (m *handoffMutex) Unlock() {
	m.mu.Unlock()
	if m.waiting.Load() > 0 {
		runtime.Gosched()
	}
}
