package llm

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/deepinfer/deepinfer-go/engine"
)

// requestQueue holds submitted requests until the step loop's requests
// stage takes them: a FIFO bounded by engine.max_waiting (0: unbounded). It
// is the loop's source (pipeline.Source with pipeline.Waiter).
type requestQueue struct {
	mu     sync.Mutex
	items  []*engine.Request
	limit  int
	closed bool
	signal chan struct{} // holds a token while items or a close wait to be seen
}

func newRequestQueue(limit int) *requestQueue {
	return &requestQueue{limit: limit, signal: make(chan struct{}, 1)}
}

func (q *requestQueue) notify() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// push appends req; it fails when the queue is closed or full.
func (q *requestQueue) push(req *engine.Request) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return ErrClosed
	case q.limit > 0 && len(q.items) >= q.limit:
		return fmt.Errorf("%w: %d requests are waiting (engine.max_waiting): try again later", ErrQueueFull, q.limit)
	}
	q.items = append(q.items, req)
	q.notify()
	return nil
}

// close ends the queue: Next returns io.EOF once it is empty.
func (q *requestQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.notify()
}

// Wait blocks until a request is queued or the queue is closed.
func (q *requestQueue) Wait(ctx context.Context) error {
	for {
		q.mu.Lock()
		ready := len(q.items) > 0 || q.closed
		q.mu.Unlock()
		if ready {
			return nil
		}
		select {
		case <-q.signal:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Next takes the oldest request, waiting for one; io.EOF after close.
func (q *requestQueue) Next(ctx context.Context) (*engine.Request, error) {
	for {
		if err := q.Wait(ctx); err != nil {
			return nil, err
		}
		q.mu.Lock()
		if len(q.items) > 0 {
			r := q.items[0]
			q.items[0] = nil
			q.items = q.items[1:]
			if len(q.items) > 0 {
				q.notify()
			}
			q.mu.Unlock()
			return r, nil
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return nil, io.EOF
		}
	}
}
