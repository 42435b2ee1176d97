package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// 256 concurrent streamed requests on loopback, a third of them dropped
// by their client at a random point (before the answer, after a few
// chunks): every request ends, the completed ones are whole, no block or
// request leaks, and the goroutine count returns to its baseline.
func TestLoadWithDisconnects(t *testing.T) {
	const numRequests = 256
	ts := startServer(t, nil, Options{})
	// Warm up, then take the baseline.
	if status, body := post(t, ts.url+"/v1/completions", map[string]any{"prompt": "warm", "max_tokens": 2}); status != 200 {
		t.Fatalf("warm-up: %d %s", status, body)
	}
	http.DefaultClient.CloseIdleConnections()
	time.Sleep(200 * time.Millisecond) // let connection goroutines end
	baseline := runtime.NumGoroutine()

	transport := &http.Transport{MaxIdleConnsPerHost: numRequests, MaxConnsPerHost: 0}
	client := &http.Client{Transport: transport}
	var completed, dropped, failed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, numRequests)
	for i := range numRequests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			maxTokens := 1 + rng.IntN(48)
			drop := rng.IntN(3) == 0
			dropAfter := rng.IntN(4) // chunks read before the drop; 0: before the answer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			path, body := "/v1/completions", map[string]any{
				"prompt": strings.Repeat("ab ", 1+rng.IntN(40)), "max_tokens": maxTokens, "ignore_eos": true, "stream": true,
				"stream_options": map[string]bool{"include_usage": true},
			}
			if i%2 == 1 {
				path, body = "/v1/chat/completions", map[string]any{
					"messages":   []map[string]string{{"role": "user", "content": strings.Repeat("cd ", 1+rng.IntN(40))}},
					"max_tokens": maxTokens, "ignore_eos": true, "stream": true, "stream_options": map[string]bool{"include_usage": true},
				}
			}
			data, _ := json.Marshal(body)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+path, bytes.NewReader(data))
			req.Header.Set("Content-Type", "application/json")
			if drop && dropAfter == 0 {
				time.AfterFunc(time.Duration(rng.IntN(20))*time.Millisecond, cancel)
			}
			resp, err := client.Do(req)
			if err != nil {
				if drop && ctx.Err() != nil {
					dropped.Add(1)
					return
				}
				failed.Add(1)
				errs <- fmt.Errorf("request %d: %w", i, err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				failed.Add(1)
				errs <- fmt.Errorf("request %d: status %d", i, resp.StatusCode)
				return
			}
			if drop {
				buf := make([]byte, 1)
				for range dropAfter * 40 { // about dropAfter chunks
					if _, err := resp.Body.Read(buf); err != nil {
						break
					}
				}
				cancel()
				dropped.Add(1)
				return
			}
			events, done, err := sseEvents(resp.Body)
			if err != nil || !done {
				failed.Add(1)
				errs <- fmt.Errorf("request %d: stream ended without [DONE]: %v", i, err)
				return
			}
			var u struct {
				Usage *Usage `json:"usage"`
			}
			if json.Unmarshal([]byte(events[len(events)-1]), &u) != nil || u.Usage == nil || u.Usage.CompletionTokens != maxTokens {
				failed.Add(1)
				errs <- fmt.Errorf("request %d: last event %s, want usage with %d tokens", i, events[len(events)-1], maxTokens)
				return
			}
			completed.Add(1)
		}()
	}
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()
	select {
	case <-allDone:
	case <-time.After(60 * time.Second):
		t.Fatal("requests did not all end within 60s")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d completed, %d dropped, %d failed", completed.Load(), dropped.Load(), failed.Load())
	if completed.Load()+dropped.Load() != numRequests || dropped.Load() == 0 {
		t.Fatalf("completed %d + dropped %d != %d", completed.Load(), dropped.Load(), numRequests)
	}
	var state string
	if !waitFor(5*time.Second, func() (ok bool) { ok, state = engineIdle(ts.eng); return ok && ts.NumPending() == 0 }) {
		t.Fatalf("after the load: %s, pending %d", state, ts.NumPending())
	}
	transport.CloseIdleConnections()
	var n int
	if !waitFor(5*time.Second, func() bool { n = runtime.NumGoroutine(); return n <= baseline }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: %d, baseline %d\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
	}
}
