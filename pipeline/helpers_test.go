package pipeline

import (
	"context"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"
)

// counter is a Source of 0..n-1.
type counter struct{ i, n int }

func (c *counter) Next(ctx context.Context) (int, error) {
	if c.i >= c.n {
		return 0, io.EOF
	}
	c.i++
	return c.i - 1, nil
}

// collector is a Sink that keeps what it gets.
type collector[T any] struct {
	mu  sync.Mutex
	got []T
}

func (c *collector[T]) Consume(_ context.Context, v T) error {
	c.mu.Lock()
	c.got = append(c.got, v)
	c.mu.Unlock()
	return nil
}

func (c *collector[T]) items() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]T(nil), c.got...)
}

// closeRecorder counts Close calls.
type closeRecorder struct {
	Stage[int, int]
	closed int
}

func (c *closeRecorder) Close() error { c.closed++; return nil }

func double() Stage[int, int] {
	return StageFunc[int, int](func(_ context.Context, v int) (int, error) { return 2 * v, nil })
}

// noLeaks returns a check that the goroutine count is back to where it was.
func noLeaks(t *testing.T) func() {
	t.Helper()
	before := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<16)
				n := runtime.Stack(buf, true)
				t.Fatalf("goroutines leaked: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:n])
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// waitFor polls cond until it holds; it fails the test after 5 seconds.
// It waits for a state to be reached, it measures no time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
