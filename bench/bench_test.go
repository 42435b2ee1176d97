package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/server"
	"github.com/deepinfer/deepinfer-go/server/servertest"
)

func TestSummarize(t *testing.T) {
	seq := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(n - i) // descending: Summarize sorts a copy
		}
		return xs
	}
	tests := []struct {
		name string
		xs   []float64
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one", []float64{3}, Summary{Count: 1, Mean: 3, Median: 3, P90: 3, P99: 3, Min: 3, Max: 3}},
		{"four", []float64{4, 1, 3, 2}, Summary{Count: 4, Mean: 2.5, Median: 2, P90: 4, P99: 4, Min: 1, Max: 4}},
		{"1..100", seq(100), Summary{Count: 100, Mean: 50.5, Median: 50, P90: 90, P99: 99, Min: 1, Max: 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.xs...)
			if got := Summarize(in); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range in {
				if in[i] != tc.xs[i] {
					t.Fatal("Summarize modified its input")
				}
			}
		})
	}
}

func TestWritePlots(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "plots")
	files, err := WritePlots(dir, []Distribution{{"ttft", "ms", []float64{1, 2, 2, 3, 10}}, {"empty", "ms", nil}})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || filepath.Base(files[0]) != "ttft.png" {
		t.Fatalf("files %v", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil || !bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")) || len(data) < 1000 {
		t.Fatalf("not a PNG: %d bytes, %v", len(data), err)
	}
}

// startServer serves the servertest model on a loopback port.
func startServer(t *testing.T) (string, *llm.Engine) {
	t.Helper()
	return startServerWith(t, server.Options{ModelName: "tiny"})
}

// startServerWith is startServer with the server's options.
func startServerWith(t *testing.T, opts server.Options) (string, *llm.Engine) {
	t.Helper()
	dir := t.TempDir()
	if err := servertest.WriteModel(dir, 5); err != nil {
		t.Fatal(err)
	}
	cfg, err := servertest.Config(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := llm.New(cfg, llm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(eng, opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		eng.Close()
	})
	return "http://" + ln.Addr().String(), eng
}

// The serving benchmark against a loopback server: Poisson arrivals,
// random token prompts (vocabulary from /v1/models), chat with random
// words and with prompts from a list; failures are counted, not fatal.
func TestRunServe(t *testing.T) {
	url, _ := startServer(t)
	tests := []struct {
		name       string
		opts       ServeOptions
		completed  int
		failed     int
		errContain string
	}{
		{"completions random", ServeOptions{NumPrompts: 24, RequestRate: 400, InputLen: 16, OutputLen: 6, RangeRatio: 0.5}, 24, 0, ""},
		{"chat random words", ServeOptions{Endpoint: "/v1/chat/completions", NumPrompts: 8, InputLen: 10, OutputLen: 5, MaxConcurrency: 3}, 8, 0, ""},
		{"prompt list", ServeOptions{NumPrompts: 6, Prompts: []string{"hello there", "abc"}, OutputLen: 4, RequestRate: math.Inf(1)}, 6, 0, ""},
		{"too long", ServeOptions{NumPrompts: 3, InputLen: 8, OutputLen: 5000}, 0, 3, "maximum context length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			o.BaseURL = url
			var progress bytes.Buffer
			o.Progress = &progress
			r, err := RunServe(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if r.Completed != tc.completed || r.Failed != tc.failed || r.Model != "tiny" || len(r.Requests) != o.NumPrompts {
				t.Fatalf("completed %d failed %d (model %q, %d requests), want %d and %d; errors %v", r.Completed, r.Failed, r.Model, len(r.Requests), tc.completed, tc.failed, r.Errors)
			}
			if tc.errContain != "" && (len(r.Errors) != 1 || !strings.Contains(r.Errors[0], tc.errContain)) {
				t.Fatalf("errors %v, want one with %q", r.Errors, tc.errContain)
			}
			if progress.Len() == 0 || !strings.HasSuffix(progress.String(), "\n") {
				t.Errorf("progress bar %q: want output ending its line", progress.String())
			}
			if tc.completed == 0 {
				return
			}
			lo, hi := o.OutputLen, o.OutputLen
			if o.RangeRatio > 0 {
				lo, hi = int(float64(lo)*(1-o.RangeRatio)), int(float64(hi)*(1+o.RangeRatio))
			}
			for i, q := range r.Requests {
				if q.OutputTokens < lo || q.OutputTokens > hi || q.PromptTokens < 1 || q.TTFT <= 0 || q.TTFT > q.Latency {
					t.Fatalf("request %d: %+v", i, q)
				}
				// One gap per text chunk after the first; a token that adds no
				// text (a special token of the random model) sends no chunk.
				if len(q.ITLs) > q.OutputTokens-1 {
					t.Fatalf("request %d: %d ITLs for %d tokens", i, len(q.ITLs), q.OutputTokens)
				}
			}
			if r.TTFTMillis.Count != tc.completed || r.E2EMillis.Count != tc.completed || r.OutputThroughput <= 0 || r.TTFTMillis.P99 < r.TTFTMillis.Median {
				t.Fatalf("summaries: %+v %+v, throughput %v", r.TTFTMillis, r.E2EMillis, r.OutputThroughput)
			}
			if tc.name == "completions random" {
				// Poisson arrivals at 400/s: 24 requests span about 60 ms, not 0.
				if last := r.Requests[len(r.Requests)-1].SentAt; last < 5 {
					t.Fatalf("last request sent at %v ms: arrivals not spread", last)
				}
			}
			data, err := json.Marshal(r)
			if err != nil || !bytes.Contains(data, []byte(`"ttft_ms":{"count":`)) {
				t.Fatalf("JSON: %v %s", err, data[:min(200, len(data))])
			}
		})
	}
}

// A server started with an API key serves the benchmark that sends it,
// and no other.
func TestRunServeAPIKey(t *testing.T) {
	url, _ := startServerWith(t, server.Options{ModelName: "tiny", APIKey: "sesame"})
	o := ServeOptions{BaseURL: url, Model: "tiny", NumPrompts: 3, InputLen: 8, OutputLen: 3, RequestRate: math.Inf(1)}
	if _, err := RunServe(context.Background(), o); err == nil || !strings.Contains(err.Error(), "status 401") {
		t.Fatalf("without the key: %v, want the server's 401", err)
	}
	o.APIKey = "sesame"
	r, err := RunServe(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Completed != 3 || r.Failed != 0 {
		t.Fatalf("with the key: %d completed, %d failed (%v)", r.Completed, r.Failed, r.Errors)
	}
}

func TestRunServeBadOptions(t *testing.T) {
	for _, o := range []ServeOptions{
		{BaseURL: "http://127.0.0.1:1", NumPrompts: 0, OutputLen: 1},
		{BaseURL: "http://127.0.0.1:1", NumPrompts: 1, OutputLen: 1, RangeRatio: 1},
		{BaseURL: "http://127.0.0.1:1", NumPrompts: 1, OutputLen: 1, Endpoint: "/v1/embeddings"},
		{BaseURL: "http://127.0.0.1:1", NumPrompts: 1, OutputLen: 1, InputLen: 4}, // nothing listens: no model
	} {
		if _, err := RunServe(context.Background(), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// The offline benchmark through LLM.Generate: every sequence generates its
// max_tokens, and the report adds up.
func TestRunOffline(t *testing.T) {
	dir := t.TempDir()
	if err := servertest.WriteModel(dir, 5); err != nil {
		t.Fatal(err)
	}
	cfg, err := servertest.Config(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := llm.NewLLM(cfg, llm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	o := OfflineOptions{NumSeqs: 12, MinInputLen: 4, MaxInputLen: 40, MinOutputLen: 2, MaxOutputLen: 12, Temperature: 0.6, MaxTokenID: 10000, Seed: 1}
	tooLong := o
	tooLong.MaxInputLen = l.MaxModelLen()
	if _, err := RunOffline(context.Background(), l, tooLong); err == nil || !strings.Contains(err.Error(), "past max_model_len") {
		t.Fatalf("requests longer than max_model_len: %v", err)
	}
	var progress bytes.Buffer
	o.Progress = &progress
	r, err := RunOffline(context.Background(), l, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Failed != 0 || len(r.TTFTs) != 12 || len(r.E2Els) != 12 || r.TotalOutputTokens < 12*2 || r.TotalOutputTokens > 12*12 || r.TotalInputTokens < 12*4 {
		t.Fatalf("result %+v", r)
	}
	if r.OutputThroughput <= 0 || math.Abs(r.OutputThroughput*r.DurationSeconds-float64(r.TotalOutputTokens)) > 1e-6*float64(r.TotalOutputTokens) {
		t.Fatalf("throughput %v over %vs for %d tokens", r.OutputThroughput, r.DurationSeconds, r.TotalOutputTokens)
	}
	if progress.Len() == 0 || !strings.HasSuffix(progress.String(), "\n") {
		t.Errorf("progress bar %q: want output ending its line", progress.String())
	}
	if _, err := RunOffline(context.Background(), l, OfflineOptions{NumSeqs: 1, MinInputLen: 5, MaxInputLen: 4, MinOutputLen: 1, MaxOutputLen: 1, MaxTokenID: 10}); err == nil {
		t.Error("bad input lengths accepted")
	}
}

func TestPercentiles(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i)
	}
	dists := []Distribution{{"ttft", "ms", xs}, {"itl", "ms", nil}, {"e2el", "ms", []float64{5}}}
	tests := []struct {
		name    string
		metrics []string
		ps      []float64
		want    map[string]float64
	}{
		{"vLLM default", []string{"ttft", "tpot", "itl"}, []float64{99}, map[string]float64{"p99_ttft_ms": 99}},
		{"several", []string{"ttft", "e2el"}, []float64{50, 90, 99.9}, map[string]float64{
			"p50_ttft_ms": 50, "p90_ttft_ms": 90, "p99.9_ttft_ms": 100, "p50_e2el_ms": 5, "p90_e2el_ms": 5, "p99.9_e2el_ms": 5}},
		{"none", nil, []float64{99}, map[string]float64{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Percentiles(dists, tc.metrics, tc.ps)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
	if got := Percentile(xs, 90); got != 90 {
		t.Fatalf("Percentile(1..100, 90) = %v", got)
	}
	if got := Percentile(nil, 90); got != 0 {
		t.Fatalf("Percentile(nil) = %v", got)
	}
}

// The offline workload samples greedily by default, as vLLM's benchmark.
func TestDefaultOfflineTemperature(t *testing.T) {
	if o := DefaultOffline(); o.Temperature != 0 || o.NumSeqs != 256 || o.MinInputLen != 100 || o.MaxOutputLen != 1024 {
		t.Fatalf("DefaultOffline() = %+v", o)
	}
}
