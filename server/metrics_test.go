package server

import (
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepinfer/deepinfer-go/stages"
)

// scrape returns the /metrics text.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("metrics: %d %v", resp.StatusCode, err)
	}
	return string(data)
}

// value returns the value of the sample whose line starts with prefix
// (name and labels), failing the test when absent.
func value(t *testing.T, text, prefix string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("no sample %q in:\n%s", prefix, text)
	return 0
}

// /metrics counts what the server answered, with vLLM's names under the
// deepinfer: prefix, and reports the step loop's stages.
func TestMetrics(t *testing.T) {
	ts := startServer(t, nil, Options{ModelName: "tiny"})
	var gen, prompt int
	for i := range 3 {
		_, body := post(t, ts.url+"/v1/completions", map[string]any{"model": "tiny", "prompt": strings.Repeat("x", 5+i), "max_tokens": 4 + i, "ignore_eos": true})
		u := decode[CompletionResponse](t, body).Usage
		gen += u.CompletionTokens
		prompt += u.PromptTokens
	}
	post(t, ts.url+"/v1/completions", map[string]any{"model": "nope", "prompt": "x"})
	text := scrape(t, ts.url)
	label := `{model_name="tiny"}`
	checks := []struct {
		sample string
		want   float64
	}{
		{"deepinfer:generation_tokens_total" + label, float64(gen)},
		{"deepinfer:prompt_tokens_total" + label, float64(prompt)},
		{"deepinfer:time_to_first_token_seconds_count" + label, 3},
		{"deepinfer:e2e_request_latency_seconds_count" + label, 3},
		{"deepinfer:request_queue_time_seconds_count" + label, 3},
		{"deepinfer:inter_token_latency_seconds_count" + label, float64(gen - 3)},
		{"deepinfer:request_generation_tokens_sum" + label, float64(gen)},
		{`deepinfer:request_success_total{finished_reason="length",model_name="tiny"}`, 3},
		{"deepinfer:num_requests_running" + label, 0},
		{"deepinfer:num_requests_waiting" + label, 0},
		{"deepinfer:kv_cache_usage_perc" + label, 0},
		{"deepinfer:num_preemptions_total" + label, 0},
		{"deepinfer:num_requests_in_flight" + label, 0},
	}
	for _, c := range checks {
		if got := value(t, text, c.sample+" "); got != c.want {
			t.Errorf("%s = %v, want %v", c.sample, got, c.want)
		}
	}
	for _, c := range []string{"deepinfer:step_host_gap_seconds" + label, "deepinfer:prefix_cache_queries_total" + label, "deepinfer:engine_steps_total" + label, `deepinfer:stage_items_total{model_name="tiny",stage="forward"}`} {
		if got := value(t, text, c+" "); got <= 0 {
			t.Errorf("%s = %v, want > 0", c, got)
		}
	}
	for _, stage := range []string{"tokenize", "schedule", "prepare", "forward", "sample", "postprocess"} {
		value(t, text, `deepinfer:stage_busy_seconds_total{model_name="tiny",stage="`+stage+`"}`)
		value(t, text, `deepinfer:stage_wait_in_seconds_total{model_name="tiny",stage="`+stage+`"}`)
	}
	if got := value(t, text, "deepinfer:prefix_cache_hits_total"+label+" "); got > value(t, text, "deepinfer:prefix_cache_queries_total"+label+" ") {
		t.Errorf("more prefix-cache hits than queries")
	}
}

// The device timeline metrics: absent on the CPU backend, and on a backend
// with device markers the counters and the idle ratio of the stats.
func TestDeviceMetrics(t *testing.T) {
	ts := startServer(t, nil, Options{ModelName: "tiny"})
	if text := scrape(t, ts.url); strings.Contains(text, "deepinfer:device_") {
		t.Errorf("device metrics on a backend without device markers:\n%s", text)
	}
	reg := prometheus.NewRegistry()
	d := stages.DeviceTimes{Timed: true,
		All:    stages.StepPairs{N: 8, Busy: 36 * time.Millisecond, Span: 40 * time.Millisecond},
		Decode: stages.StepPairs{N: 6, Busy: 29400 * time.Microsecond, Span: 30 * time.Millisecond}}
	registerDeviceMetrics(reg, func() stages.DeviceTimes { return d })
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		switch {
		case m.Counter != nil:
			got[mf.GetName()] = m.GetCounter().GetValue()
		case m.Gauge != nil:
			got[mf.GetName()] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		metricDeviceBusy: 0.036, metricDeviceSpan: 0.040, metricDeviceDecodeBusy: 0.0294, metricDeviceDecodeSpan: 0.030, metricDeviceIdle: 0.1,
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || math.Abs(g-w) > 1e-9 {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, w)
		}
	}
}
