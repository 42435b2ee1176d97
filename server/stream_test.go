package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine/config"
)

// openStream posts body with stream true and returns the response.
func openStream(t testing.TB, ctx context.Context, url string, body map[string]any) *http.Response {
	t.Helper()
	body["stream"] = true
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// Streamed answers carry the same text as the whole answers, end with the
// finish reason, the usage chunk and [DONE]; chat streams open with the
// assistant role.
func TestStreaming(t *testing.T) {
	ts := startServer(t, nil, Options{})
	base := map[string]any{"prompt": "once upon a time", "max_tokens": 20, "temperature": 0, "ignore_eos": true}
	_, body := post(t, ts.url+"/v1/completions", base)
	want := decode[CompletionResponse](t, body)

	resp := openStream(t, context.Background(), ts.url+"/v1/completions", map[string]any{
		"prompt": "once upon a time", "max_tokens": 20, "temperature": 0, "ignore_eos": true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events, done, err := sseEvents(resp.Body)
	resp.Body.Close()
	if err != nil || !done {
		t.Fatalf("stream ended without [DONE]: %v", err)
	}
	var text strings.Builder
	var finish string
	var usage *Usage
	for i, ev := range events {
		c := decode[CompletionResponse](t, []byte(ev))
		if c.Object != "text_completion" {
			t.Fatalf("chunk %d: %s", i, ev)
		}
		if c.Usage != nil {
			if i != len(events)-1 || len(c.Choices) != 0 {
				t.Fatalf("usage chunk %d of %d with %d choices", i, len(events), len(c.Choices))
			}
			usage = c.Usage
			continue
		}
		text.WriteString(c.Choices[0].Text)
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	if text.String() != want.Choices[0].Text || finish != "length" {
		t.Fatalf("streamed %q (%s), want %q (length)", text.String(), finish, want.Choices[0].Text)
	}
	if usage == nil || *usage != *want.Usage {
		t.Fatalf("usage %+v, want %+v", usage, want.Usage)
	}

	chatBody := func() map[string]any {
		return map[string]any{"messages": []map[string]string{{"role": "user", "content": "tell me"}}, "max_tokens": 10, "temperature": 0, "ignore_eos": true}
	}
	_, body = post(t, ts.url+"/v1/chat/completions", chatBody())
	wantChat := decode[ChatCompletionResponse](t, body)
	cb := chatBody()
	cb["stream_options"] = map[string]bool{"include_usage": true}
	resp = openStream(t, context.Background(), ts.url+"/v1/chat/completions", cb)
	events, done, err = sseEvents(resp.Body)
	resp.Body.Close()
	if err != nil || !done || len(events) < 3 {
		t.Fatalf("chat stream: %d events, done %v, %v", len(events), done, err)
	}
	first := decode[ChatCompletionChunk](t, []byte(events[0]))
	if first.Object != "chat.completion.chunk" || first.Choices[0].Delta.Role != "assistant" {
		t.Fatalf("first chunk: %s", events[0])
	}
	text.Reset()
	finish = ""
	for _, ev := range events[1 : len(events)-1] {
		c := decode[ChatCompletionChunk](t, []byte(ev))
		if d := c.Choices[0].Delta.Content; d != nil {
			text.WriteString(*d)
		}
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	last := decode[ChatCompletionChunk](t, []byte(events[len(events)-1]))
	if text.String() != *wantChat.Choices[0].Message.Content || finish != "length" || last.Usage == nil || last.Usage.CompletionTokens != 10 {
		t.Fatalf("chat streamed %q (%s, usage %+v), want %q", text.String(), finish, last.Usage, *wantChat.Choices[0].Message.Content)
	}
}

// n = 2, a batch of prompts, stop strings and stop tokens, logprobs.
func TestChoicesStopLogprobs(t *testing.T) {
	ts := startServer(t, nil, Options{})
	// n = 2 with a seed: two choices, reproducible.
	req := map[string]any{"prompt": "abc", "max_tokens": 8, "n": 2, "temperature": 1, "seed": 7, "ignore_eos": true}
	_, body := post(t, ts.url+"/v1/completions", req)
	a := decode[CompletionResponse](t, body)
	_, body = post(t, ts.url+"/v1/completions", req)
	b := decode[CompletionResponse](t, body)
	if len(a.Choices) != 2 || a.Choices[0].Index != 0 || a.Choices[1].Index != 1 || a.Usage.CompletionTokens != 16 {
		t.Fatalf("n = 2: %+v", a)
	}
	for i := range a.Choices {
		if a.Choices[i].Text != b.Choices[i].Text {
			t.Fatalf("seeded choice %d differs: %q vs %q", i, a.Choices[i].Text, b.Choices[i].Text)
		}
	}
	// A batch of two prompts with n = 2: choices indexed prompt*n + i.
	_, body = post(t, ts.url+"/v1/completions", map[string]any{"prompt": []string{"ab", "cd"}, "max_tokens": 3, "n": 2, "ignore_eos": true})
	batch := decode[CompletionResponse](t, body)
	if len(batch.Choices) != 4 || batch.Usage.CompletionTokens != 12 {
		t.Fatalf("batch: %s", body)
	}
	for i, c := range batch.Choices {
		if c.Index != i {
			t.Fatalf("batch choice %d has index %d", i, c.Index)
		}
	}

	// Stop string: cut the greedy text before a substring of it.
	greedy := map[string]any{"prompt": "the quick brown fox", "max_tokens": 30, "temperature": 0, "ignore_eos": true}
	_, body = post(t, ts.url+"/v1/completions", greedy)
	full := decode[CompletionResponse](t, body).Choices[0].Text
	if len(full) < 12 {
		t.Fatalf("greedy text too short: %q", full)
	}
	stop := full[6:9]
	cut := full[:strings.Index(full, stop)]
	greedy["stop"] = stop
	_, body = post(t, ts.url+"/v1/completions", greedy)
	got := decode[CompletionResponse](t, body).Choices[0]
	if got.Text != cut || got.FinishReason == nil || *got.FinishReason != "stop" || got.StopReason != stop {
		t.Fatalf("stop %q: got %q (%v, %v), want %q", stop, got.Text, got.FinishReason, got.StopReason, cut)
	}
	// Stop token: the first greedy token id stops at once, stop_reason is the id.
	delete(greedy, "stop")
	greedy["logprobs"] = 0
	greedy["max_tokens"] = 3
	_, body = post(t, ts.url+"/v1/completions", greedy)
	lp := decode[CompletionResponse](t, body).Choices[0].Logprobs
	if lp == nil || len(lp.Tokens) != 3 {
		t.Fatalf("logprobs: %s", body)
	}
	firstID, ok := ts.tok.TokenToID(lp.Tokens[0])
	if !ok {
		t.Fatalf("token %q not in vocab", lp.Tokens[0])
	}
	greedy["stop_token_ids"] = []int{firstID}
	_, body = post(t, ts.url+"/v1/completions", greedy)
	st := decode[CompletionResponse](t, body).Choices[0]
	if st.FinishReason == nil || *st.FinishReason != "stop" || st.StopReason != float64(firstID) {
		t.Fatalf("stop token %d: %s", firstID, body)
	}

	// Completion logprobs: one entry per token, top-k candidates plus the chosen token.
	_, body = post(t, ts.url+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 5, "logprobs": 3, "temperature": 0, "ignore_eos": true})
	c := decode[CompletionResponse](t, body).Choices[0]
	if c.Logprobs == nil || len(c.Logprobs.Tokens) != 5 || len(c.Logprobs.TokenLogprobs) != 5 || len(c.Logprobs.TopLogprobs) != 5 || strings.Join(c.Logprobs.Tokens, "") != c.Text {
		t.Fatalf("logprobs: %s", body)
	}
	for i, top := range c.Logprobs.TopLogprobs {
		if len(top) < 1 || len(top) > 4 || c.Logprobs.TokenLogprobs[i] > 0 {
			t.Fatalf("position %d: %v, logprob %v", i, top, c.Logprobs.TokenLogprobs[i])
		}
		if lp, ok := top[c.Logprobs.Tokens[i]]; !ok || lp != c.Logprobs.TokenLogprobs[i] {
			t.Fatalf("position %d: greedy token %q not the top entry: %v", i, c.Logprobs.Tokens[i], top)
		}
		if c.Logprobs.TextOffset[i] != len(strings.Join(c.Logprobs.Tokens[:i], "")) {
			t.Fatalf("text offsets %v", c.Logprobs.TextOffset)
		}
	}
	// Prompt logprobs: one entry per prompt token, the first null.
	_, body = post(t, ts.url+"/v1/completions", map[string]any{"prompt": []int{10, 11, 12, 13}, "max_tokens": 1, "prompt_logprobs": 2})
	pl := decode[CompletionResponse](t, body).Choices[0].PromptLogprobs
	if len(pl) != 4 || pl[0] != nil || pl[1]["11"].Logprob > 0 || len(pl[3]) < 2 {
		t.Fatalf("prompt logprobs: %s", body)
	}
	// Chat logprobs with top_logprobs.
	_, body = post(t, ts.url+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 4, "logprobs": true, "top_logprobs": 2, "ignore_eos": true})
	cc := decode[ChatCompletionResponse](t, body).Choices[0]
	if cc.Logprobs == nil || len(cc.Logprobs.Content) != 4 {
		t.Fatalf("chat logprobs: %s", body)
	}
	for _, e := range cc.Logprobs.Content {
		if len(e.TopLogprobs) != 2 || len(e.Bytes) != len(e.Token) || e.TopLogprobs[0].Logprob < e.TopLogprobs[1].Logprob {
			t.Fatalf("chat logprob entry %+v", e)
		}
	}
}

// A client that disconnects mid-stream has its request aborted at once:
// its sequence leaves the scheduler and its KV blocks are free again.
func TestDisconnectFreesBlocks(t *testing.T) {
	ts := startServer(t, nil, Options{})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		ctx, cancel := context.WithCancel(context.Background())
		body := map[string]any{"prompt": strings.Repeat("abc ", 50), "max_tokens": 800, "ignore_eos": true}
		if path == "/v1/chat/completions" {
			body = map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat("abc ", 50)}}, "max_tokens": 800, "ignore_eos": true}
		}
		resp := openStream(t, ctx, ts.url+path, body)
		buf := make([]byte, 256)
		if _, err := resp.Body.Read(buf); err != nil {
			t.Fatal(err)
		}
		if st := ts.eng.SchedulerStats(); st.NumFreeBlocks == st.NumBlocks {
			t.Fatalf("%s: no block in use while streaming", path)
		}
		cancel()
		resp.Body.Close()
		start := time.Now()
		var state string
		if !waitFor(2*time.Second, func() (ok bool) { ok, state = engineIdle(ts.eng); return ok && ts.NumPending() == 0 }) {
			t.Fatalf("%s: after disconnect: %s, pending %d", path, state, ts.NumPending())
		}
		t.Logf("%s: blocks free %v after the disconnect", path, time.Since(start))
	}
}

// Past MaxPending requests are refused with 503 in the error shape.
func TestAdmission(t *testing.T) {
	ts := startServer(t, nil, Options{MaxPending: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := openStream(t, ctx, ts.url+"/v1/completions", map[string]any{"prompt": "a", "max_tokens": 1000, "ignore_eos": true})
	defer resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	status, body := post(t, ts.url+"/v1/completions", map[string]any{"prompt": "b", "max_tokens": 2})
	if status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", status, body)
	}
	if e := decode[ErrorResponse](t, body); e.Error.Type != "ServiceUnavailableError" || !strings.Contains(e.Error.Message, "at capacity: 1 requests in flight (limit 1") {
		t.Fatalf("error %+v", e.Error)
	}
	cancel()
	if !waitFor(2*time.Second, func() bool { return ts.NumPending() == 0 }) {
		t.Fatal("request not released after disconnect")
	}
	if status, body := post(t, ts.url+"/v1/completions", map[string]any{"prompt": "b", "max_tokens": 2}); status != 200 {
		t.Fatalf("after release: %d %s", status, body)
	}
}

// A request still waiting for the scheduler (no answer yet, not even
// headers) is aborted when its client leaves: it leaves the waiting queue
// while the request ahead of it keeps running.
func TestDisconnectWhileWaiting(t *testing.T) {
	ts := startServer(t, func(c *config.Config) { c.Engine.MaxNumSeqs = 1 }, Options{})
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	first := openStream(t, ctx1, ts.url+"/v1/completions", map[string]any{"prompt": "a", "max_tokens": 1000, "ignore_eos": true})
	defer first.Body.Close()
	if _, err := first.Body.Read(make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		data, _ := json.Marshal(map[string]any{"prompt": "b", "max_tokens": 5, "stream": true})
		req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, ts.url+"/v1/completions", bytes.NewReader(data))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	if !waitFor(2*time.Second, func() bool { return ts.eng.SchedulerStats().NumWaiting == 1 }) {
		t.Fatalf("second request not waiting: %+v", ts.eng.SchedulerStats())
	}
	cancel2()
	if err := <-errc; err == nil {
		t.Fatal("the waiting request was answered")
	}
	if !waitFor(time.Second, func() bool { return ts.eng.SchedulerStats().NumWaiting == 0 && ts.NumPending() == 1 }) {
		t.Fatalf("after the disconnect: %+v, pending %d", ts.eng.SchedulerStats(), ts.NumPending())
	}
	if st := ts.eng.SchedulerStats(); st.NumRunning != 1 {
		t.Fatalf("the first request stopped: %+v", st)
	}
}
