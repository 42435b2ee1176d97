package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// streamResult reads a completion stream to its end and returns the text
// length, the last finish reason and whether [DONE] came.
func streamResult(t *testing.T, resp *http.Response) (finish string, done bool) {
	t.Helper()
	defer resp.Body.Close()
	events, done, _ := sseEvents(resp.Body)
	for _, ev := range events {
		c := decode[CompletionResponse](t, []byte(ev))
		if len(c.Choices) > 0 && c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	return finish, done
}

// Shutdown within its deadline: new requests are refused while the one in
// flight runs to its end.
func TestShutdownDrains(t *testing.T) {
	ts := startServer(t, nil, Options{})
	resp := openStream(t, context.Background(), ts.url+"/v1/completions", map[string]any{"prompt": "a", "max_tokens": 600, "ignore_eos": true})
	if _, err := resp.Body.Read(make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shut <- ts.Shutdown(ctx)
	}()
	if !waitFor(2*time.Second, func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return ts.draining
	}) {
		t.Fatal("not draining")
	}
	// The listener stays open while draining: new generation requests
	// and /health get 503 with Retry-After, as load balancers expect.
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/completions", `{"prompt": "b"}`},
		{"POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}]}`},
		{"GET", "/health", ""},
	} {
		status, h, body := send(t, tc.method, ts.url+tc.path, map[string]string{"Content-Type": "application/json"}, tc.body)
		if status != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
			t.Fatalf("%s %s while draining: status %d, Retry-After %q, want 503 with Retry-After: %s", tc.method, tc.path, status, h.Get("Retry-After"), body)
		}
		checkError(t, body, status, "shutting down")
	}
	if finish, done := streamResult(t, resp); finish != "length" || !done {
		t.Fatalf("in-flight stream ended with %q, [DONE] %v; want length", finish, done)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// Drained: the listener is closed.
	if r, err := http.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "b"}`)); err == nil {
		r.Body.Close()
		t.Fatalf("after Shutdown: status %d, want a refused connection", r.StatusCode)
	}
}

// Shutdown past its deadline aborts what still runs: the stream ends with
// finish_reason "abort" and [DONE], and the engine holds nothing.
func TestShutdownAbortsAtDeadline(t *testing.T) {
	ts := startServer(t, nil, Options{})
	resp := openStream(t, context.Background(), ts.url+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "go on"}}, "ignore_eos": true})
	if _, err := resp.Body.Read(make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := ts.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want the deadline", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Shutdown took %v", d)
	}
	defer resp.Body.Close()
	events, done, _ := sseEvents(resp.Body)
	last := decode[ChatCompletionChunk](t, []byte(events[len(events)-1]))
	if !done || len(last.Choices) != 1 || last.Choices[0].FinishReason == nil || *last.Choices[0].FinishReason != "abort" {
		t.Fatalf("stream ended with %s, [DONE] %v; want finish_reason abort", events[len(events)-1], done)
	}
	var state string
	if !waitFor(2*time.Second, func() (ok bool) { ok, state = engineIdle(ts.eng); return ok }) {
		t.Fatalf("engine after shutdown: %s", state)
	}
}
