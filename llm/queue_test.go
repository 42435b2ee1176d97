package llm

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/stages"
)

func TestRequestQueue(t *testing.T) {
	req := func(id string) stages.Submission { return stages.Submission{Request: &engine.Request{ID: id}} }
	t.Run("bounded FIFO", func(t *testing.T) {
		q := newRequestQueue(2)
		for _, id := range []string{"a", "b"} {
			if err := q.push(req(id)); err != nil {
				t.Fatal(err)
			}
		}
		if err := q.push(req("c")); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("third push = %v, want ErrQueueFull", err)
		}
		for _, want := range []string{"a", "b"} {
			r, err := q.Next(context.Background())
			if err != nil || r.Request.ID != want {
				t.Fatalf("Next = %v, %v; want %s", r, err, want)
			}
		}
		if err := q.push(req("c")); err != nil {
			t.Fatalf("push after draining: %v", err)
		}
	})
	t.Run("unbounded", func(t *testing.T) {
		q := newRequestQueue(0)
		for range 10000 {
			if err := q.push(req("x")); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("close refuses requests, carries control items, end ends", func(t *testing.T) {
		q := newRequestQueue(0)
		q.push(req("a"))
		q.close()
		if err := q.push(req("b")); !errors.Is(err, ErrClosed) {
			t.Fatalf("push after close = %v", err)
		}
		if !q.pushControl(stages.Submission{Abort: "a"}) {
			t.Fatal("an abort after close was refused")
		}
		if r, err := q.Next(context.Background()); err != nil || r.Request.ID != "a" {
			t.Fatalf("Next = %v, %v", r, err)
		}
		if r, err := q.Next(context.Background()); err != nil || r.Abort != "a" {
			t.Fatalf("Next = %v, %v; want the abort of a", r, err)
		}
		q.end()
		if q.pushControl(stages.Submission{Abort: "a"}) {
			t.Fatal("an abort after end was taken")
		}
		if _, err := q.Next(context.Background()); !errors.Is(err, io.EOF) {
			t.Fatalf("Next on a closed empty queue = %v, want io.EOF", err)
		}
	})
	t.Run("wait wakes on push and honours ctx", func(t *testing.T) {
		q := newRequestQueue(0)
		got := make(chan string)
		go func() {
			r, _ := q.Next(context.Background())
			got <- r.Request.ID
		}()
		q.push(req("late"))
		if id := <-got; id != "late" {
			t.Fatalf("got %s", id)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := q.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait on an empty queue = %v", err)
		}
	})
	t.Run("pushWait waits for room", func(t *testing.T) {
		q := newRequestQueue(1)
		q.push(req("a"))
		done := make(chan error, 1)
		go func() { done <- q.pushWait(context.Background(), req("b")) }()
		if r, err := q.Next(context.Background()); err != nil || r.Request.ID != "a" {
			t.Fatalf("Next = %v, %v", r, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("pushWait = %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := q.pushWait(ctx, req("c")); !errors.Is(err, context.Canceled) {
			t.Fatalf("pushWait on a full queue with a done ctx = %v", err)
		}
	})
}
