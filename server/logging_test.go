package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/stages"
)

// logCapture is an io.Writer for a JSON slog handler that keeps the
// records, safe for concurrent use.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *logCapture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(p)
}

// records returns the records whose message is msg.
func (c *logCapture) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(c.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// startLoggedServer starts a test server whose logger writes JSON records
// at INFO and above to the returned capture.
func startLoggedServer(t *testing.T) (*testServer, *logCapture) {
	t.Helper()
	c := &logCapture{}
	logger := slog.New(slog.NewJSONHandler(c, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return startServer(t, nil, Options{ModelName: "tiny", Logger: logger}), c
}

// Each engine request that finishes writes one INFO line with its id,
// prompt and output tokens, TTFT, latency and finish reason.
func TestRequestLogLine(t *testing.T) {
	tests := []struct {
		name   string
		body   map[string]any
		reason string
	}{
		{"length", map[string]any{"prompt": "hello there", "max_tokens": 5, "ignore_eos": true}, "length"},
		{"n=2", map[string]any{"prompt": "abc", "max_tokens": 3, "n": 2, "ignore_eos": true}, "length"},
		{"one token", map[string]any{"prompt": "x", "max_tokens": 1}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, logs := startLoggedServer(t)
			status, body := post(t, ts.url+"/v1/completions", tt.body)
			if status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
			resp := decode[CompletionResponse](t, body)
			// The line is written before the last output reaches the
			// handler, so before the answer.
			recs := logs.records(t, "request finished")
			if len(recs) != 1 {
				t.Fatalf("%d request lines, want 1: %v", len(recs), recs)
			}
			rec := recs[0]
			if rec["level"] != "INFO" {
				t.Errorf("level %v, want INFO", rec["level"])
			}
			if id, _ := rec["request_id"].(string); !strings.HasPrefix(id, resp.ID) {
				t.Errorf("request_id %q, want the response id %q and a prompt index", id, resp.ID)
			}
			n, _ := tt.body["n"].(int)
			want := map[string]float64{
				"prompt_tokens": float64(resp.Usage.PromptTokens),
				"output_tokens": float64(resp.Usage.CompletionTokens),
				"n":             float64(max(1, n)),
			}
			for k, w := range want {
				if got, _ := rec[k].(float64); got != w {
					t.Errorf("%s = %v, want %v", k, rec[k], w)
				}
			}
			// slog's JSON handler writes durations in nanoseconds.
			ttft, _ := rec["ttft"].(float64)
			e2e, _ := rec["e2e"].(float64)
			if ttft <= 0 || e2e < ttft {
				t.Errorf("ttft %v, e2e %v: want 0 < ttft <= e2e", rec["ttft"], rec["e2e"])
			}
			reason, _ := rec["finish_reason"].(string)
			if reason == "" || tt.reason != "" && reason != tt.reason {
				t.Errorf("finish_reason %q, want %q", reason, tt.reason)
			}
			if fr := resp.Choices[0].FinishReason; fr == nil || reason != *fr {
				t.Errorf("finish_reason %q, the response's %v", reason, fr)
			}
		})
	}
}

// While requests run, a throughput line comes every interval with the
// token rates, the running and waiting sequences and the KV-cache usage;
// once idle the loop stops.
func TestThroughputLogLine(t *testing.T) {
	ts, logs := startLoggedServer(t)
	ts.metrics.logInterval.Store(int64(time.Millisecond))
	for range 3 {
		if status, body := post(t, ts.url+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 8, "ignore_eos": true}); status != 200 {
			t.Fatalf("status %d: %s", status, body)
		}
	}
	var recs []map[string]any
	if !waitFor(5*time.Second, func() bool { recs = logs.records(t, "engine throughput"); return len(recs) > 0 }) {
		t.Fatal("no throughput line")
	}
	var gen float64
	for _, rec := range recs {
		if rec["level"] != "INFO" {
			t.Errorf("level %v, want INFO", rec["level"])
		}
		for _, k := range []string{"prompt_tokens_per_s", "generation_tokens_per_s", "running", "waiting", "kv_cache_usage_pct", "prefix_cache_hit_rate_pct"} {
			v, ok := rec[k].(float64)
			if !ok || v < 0 {
				t.Errorf("%s = %v in %v", k, rec[k], rec)
			}
		}
		gen += rec["generation_tokens_per_s"].(float64)
		if v, ok := rec["spec_decode"]; ok {
			t.Errorf("spec_decode = %v without speculative decoding", v)
		}
	}
	if gen <= 0 {
		t.Errorf("no generation throughput in %v", recs)
	}
	if !waitFor(5*time.Second, func() bool { return !ts.metrics.logRunning.Load() }) {
		t.Error("the throughput loop still runs on an idle server")
	}
}

// When drafts are verified in an interval, the throughput line carries
// speculative decoding's acceptance over it (the drafts are recorded by
// hand here: the test model's engine does not draft).
func TestThroughputLogLineSpec(t *testing.T) {
	ts, logs := startLoggedServer(t)
	ts.metrics.logInterval.Store(int64(5 * time.Millisecond))
	st := ts.eng.StepStats()
	var rec map[string]any
	found := waitFor(10*time.Second, func() bool {
		// The request starts the loop, which runs an interval past it:
		// drafts recorded now count in one of its next lines.
		if status, body := post(t, ts.url+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 8, "ignore_eos": true}); status != 200 {
			t.Fatalf("status %d: %s", status, body)
		}
		st.RecordSpec(4, 2)
		st.RecordSpec(0, 0)
		for _, r := range logs.records(t, "engine throughput") {
			if _, ok := r["spec_decode"]; ok {
				rec = r
				return true
			}
		}
		return false
	})
	if !found {
		t.Fatal("no throughput line with spec_decode")
	}
	// Every draft of the interval drafted 4 tokens and accepted the first 2.
	if got, want := rec["spec_decode"], "accept 0.50, mean len 3.0, per-pos 1.00/1.00/0.00/0.00"; got != want {
		t.Errorf("spec_decode = %v, want %q", got, want)
	}
	acc, _ := rec["spec_accepted_tokens"].(float64)
	drafted, _ := rec["spec_draft_tokens"].(float64)
	if acc <= 0 || drafted != 2*acc {
		t.Errorf("spec_accepted_tokens %v, spec_draft_tokens %v: want 2 of every 4", rec["spec_accepted_tokens"], rec["spec_draft_tokens"])
	}
}

func TestSpecLogAttrs(t *testing.T) {
	var st stages.Stats
	st.RecordSpec(3, 3)
	st.RecordSpec(3, 1)
	got := map[string]string{}
	for _, a := range specLogAttrs(st.Spec()) {
		got[a.Key] = a.Value.String()
	}
	want := map[string]string{
		"spec_decode":          "accept 0.67, mean len 3.0, per-pos 1.00/0.50/0.50",
		"spec_accepted_tokens": "4",
		"spec_draft_tokens":    "6",
	}
	if !maps.Equal(got, want) {
		t.Errorf("specLogAttrs = %v, want %v", got, want)
	}
}
