package llm

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/deepinfer/deepinfer-go/stages"
)

// requestQueue holds submissions until the step loop's requests stage
// takes them: a FIFO in which new requests are bounded by
// engine.max_waiting (0: unbounded) and control items (aborts, step asks,
// drains) are not. It is the loop's source (pipeline.Source with
// pipeline.Waiter). After close it refuses new requests but still carries
// control items; after end, once empty, Next returns io.EOF.
type requestQueue struct {
	mu          sync.Mutex
	items       []stages.Submission
	numRequests int // requests among items
	limit       int
	closed      bool          // no new requests
	ended       bool          // no items at all; EOF once drained
	signal      chan struct{} // holds a token while items or an end wait to be seen
	space       chan struct{} // closed (and replaced) whenever a request leaves
}

func newRequestQueue(limit int) *requestQueue {
	return &requestQueue{limit: limit, signal: make(chan struct{}, 1), space: make(chan struct{})}
}

func (q *requestQueue) notify() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// push appends a request; it fails when the queue is closed or full.
func (q *requestQueue) push(sub stages.Submission) error {
	_, err := q.tryPush(sub)
	return err
}

// tryPush is push that also returns, when the queue is full, a channel
// closed once a request leaves it.
func (q *requestQueue) tryPush(sub stages.Submission) (<-chan struct{}, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return nil, ErrClosed
	case q.limit > 0 && q.numRequests >= q.limit:
		return q.space, fmt.Errorf("%w: %d requests are waiting (engine.max_waiting): try again later", ErrQueueFull, q.limit)
	}
	q.items = append(q.items, sub)
	q.numRequests++
	q.notify()
	return nil, nil
}

// pushWait is push that waits while the queue is full.
func (q *requestQueue) pushWait(ctx context.Context, sub stages.Submission) error {
	for {
		space, err := q.tryPush(sub)
		if space == nil {
			return err
		}
		select {
		case <-space:
		case <-ctx.Done():
			return fmt.Errorf("llm: %w", ctx.Err())
		}
	}
}

// pushControl appends an abort, step ask or drain; it reports false once
// the queue has ended.
func (q *requestQueue) pushControl(sub stages.Submission) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended {
		return false
	}
	q.items = append(q.items, sub)
	q.notify()
	return true
}

// close refuses new requests from now on.
func (q *requestQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}

// end closes the queue for good: Next returns io.EOF once it is empty.
func (q *requestQueue) end() {
	q.mu.Lock()
	q.closed, q.ended = true, true
	q.mu.Unlock()
	q.notify()
}

// Wait blocks until an item is queued or the queue has ended.
func (q *requestQueue) Wait(ctx context.Context) error {
	for {
		q.mu.Lock()
		ready := len(q.items) > 0 || q.ended
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

// Next takes the oldest item, waiting for one; io.EOF after end.
func (q *requestQueue) Next(ctx context.Context) (stages.Submission, error) {
	for {
		if err := q.Wait(ctx); err != nil {
			return stages.Submission{}, err
		}
		q.mu.Lock()
		if len(q.items) > 0 {
			s := q.items[0]
			q.items[0] = stages.Submission{}
			q.items = q.items[1:]
			if s.Request != nil {
				q.numRequests--
				close(q.space)
				q.space = make(chan struct{})
			}
			if len(q.items) > 0 {
				q.notify()
			}
			q.mu.Unlock()
			return s, nil
		}
		ended := q.ended
		q.mu.Unlock()
		if ended {
			return stages.Submission{}, io.EOF
		}
	}
}
