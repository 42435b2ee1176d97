package server

import (
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/pipeline"
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

// scrapeSettled returns the /metrics text once the engine's gauges show
// no sequence and no KV block in use. The server counts a request before
// it answers, but the scheduler frees a finished sequence's blocks on its
// next pass, after the answer: the gauges lag the answer by a step.
func scrapeSettled(t *testing.T, url, label string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		text := scrape(t, url)
		idle := value(t, text, "deepinfer:kv_cache_usage_perc"+label+" ") == 0 &&
			value(t, text, "deepinfer:num_requests_running"+label+" ") == 0 &&
			value(t, text, "deepinfer:num_requests_waiting"+label+" ") == 0
		if idle || time.Now().After(deadline) {
			return text
		}
		time.Sleep(10 * time.Millisecond)
	}
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
	label := `{model_name="tiny"}`
	text := scrapeSettled(t, ts.url, label)
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

// vLLM's request phase, parameter, per-token, per-step and cache families:
// present after a few requests, with plausible values.
func TestMetricsVLLMFamilies(t *testing.T) {
	ts := startServer(t, nil, Options{ModelName: "tiny"})
	var gen int
	for i := range 3 {
		_, body := post(t, ts.url+"/v1/completions", map[string]any{"model": "tiny", "prompt": strings.Repeat("x", 5+i), "max_tokens": 4 + i, "ignore_eos": true})
		gen += decode[CompletionResponse](t, body).Usage.CompletionTokens
	}
	_, body := post(t, ts.url+"/v1/completions", map[string]any{"model": "tiny", "prompt": "y", "max_tokens": 3, "n": 2, "ignore_eos": true})
	gen += decode[CompletionResponse](t, body).Usage.CompletionTokens
	const finished = 4
	label := `{model_name="tiny"}`
	text := scrapeSettled(t, ts.url, label)
	steps := value(t, text, "deepinfer:engine_steps_total"+label+" ")
	checks := []struct {
		sample   string
		min, max float64
	}{
		{"deepinfer:request_prefill_time_seconds_count" + label, finished, finished},
		{"deepinfer:request_decode_time_seconds_count" + label, finished, finished},
		{"deepinfer:request_inference_time_seconds_count" + label, finished, finished},
		{"deepinfer:request_queue_time_seconds_count" + label, finished, finished},
		{"deepinfer:request_decode_time_seconds_sum" + label, 0, math.Inf(1)},
		// Every token but each sequence's first has an inter-token latency.
		{"deepinfer:time_per_output_token_seconds_count" + label, float64(gen - 5), float64(gen - 5)},
		{"deepinfer:time_per_output_token_seconds_sum" + label, 0, math.Inf(1)},
		{"deepinfer:request_params_max_tokens_count" + label, finished, finished},
		{"deepinfer:request_params_max_tokens_sum" + label, 4 + 5 + 6 + 3, 4 + 5 + 6 + 3},
		{`deepinfer:request_params_max_tokens_bucket{model_name="tiny",le="5"}`, 3, 3},
		{"deepinfer:request_params_n_count" + label, finished, finished},
		{"deepinfer:request_params_n_sum" + label, 1 + 1 + 1 + 2, 1 + 1 + 1 + 2},
		{`deepinfer:request_params_n_bucket{model_name="tiny",le="1"}`, 3, 3},
		{"deepinfer:iteration_tokens_total_count" + label, steps, steps},
		// Each step computes at least one token; all the prompts and
		// every generated token but the last of each sequence.
		{"deepinfer:iteration_tokens_total_sum" + label, steps, math.Inf(1)},
		{`deepinfer:iteration_tokens_total_bucket{model_name="tiny",le="+Inf"}`, steps, steps},
	}
	for _, c := range checks {
		if got := value(t, text, c.sample+" "); got < c.min || got > c.max {
			t.Errorf("%s = %v, want in [%v, %v]", c.sample, got, c.min, c.max)
		}
	}
	if steps <= 0 {
		t.Errorf("engine_steps_total = %v", steps)
	}
	// prefill + decode = inference, per request and so in sum.
	sum := func(name string) float64 {
		return value(t, text, "deepinfer:request_"+name+"_time_seconds_sum"+label+" ")
	}
	if p, d, i := sum("prefill"), sum("decode"), sum("inference"); math.Abs(p+d-i) > 1e-6*max(1, i) || p < 0 || d < 0 {
		t.Errorf("prefill %v + decode %v != inference %v", p, d, i)
	}
	info := ""
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "deepinfer:cache_config_info{") {
			info = line
		}
	}
	cfg, st := ts.eng.Config(), ts.eng.SchedulerStats()
	for _, want := range []string{
		`block_size="` + strconv.Itoa(cfg.Cache.BlockSize) + `"`,
		`num_blocks="` + strconv.Itoa(st.NumBlocks) + `"`,
		`num_gpu_blocks="` + strconv.Itoa(st.NumBlocks) + `"`,
		`enable_prefix_caching="` + strconv.FormatBool(cfg.Cache.PrefixCaching) + `"`,
		`cache_dtype="`, `model_name="tiny"`,
	} {
		if !strings.Contains(info, want) {
			t.Errorf("cache_config_info %q lacks %s", info, want)
		}
	}
	if !strings.HasSuffix(info, "} 1") {
		t.Errorf("cache_config_info %q: want value 1", info)
	}
}

// sample is one line of the text exposition: a series and its value.
type sample struct {
	family, series string
	value          float64
}

// counterSamples returns the samples of text's counters and histograms
// (whose buckets, count and sum only grow), keyed by series.
func counterSamples(t *testing.T, text string) map[string]sample {
	t.Helper()
	types := map[string]string{}
	out := map[string]sample{}
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		series := line[:i]
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		name, _, _ := strings.Cut(series, "{")
		family := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && types[base] == "histogram" {
				family = base
			}
		}
		switch types[family] {
		case "counter", "histogram":
			out[series] = sample{family, series, v}
		default:
			if strings.HasSuffix(family, "_total") {
				t.Errorf("%s: a _total family of type %q", family, types[family])
			}
		}
	}
	return out
}

// decreases lists the series of prev that cur lacks or has lower.
func decreases(prev, cur map[string]sample) []string {
	var out []string
	for k, p := range prev {
		switch c, ok := cur[k]; {
		case !ok:
			out = append(out, fmt.Sprintf("%s disappeared", k))
		case c.value < p.value:
			out = append(out, fmt.Sprintf("%s decreased: %v -> %v", k, p.value, c.value))
		}
	}
	sort.Strings(out)
	return out
}

// The monotonicity check itself: it parses counters and histogram series
// only, and flags a decrease or a series gone.
func TestDecreases(t *testing.T) {
	const before = `# TYPE a_total counter
a_total{x="1"} 5
# TYPE g gauge
g 9
# TYPE h histogram
h_bucket{le="1"} 2
h_sum 3.5
h_count 2
`
	tests := []struct {
		name, after string
		want        []string
	}{
		{"same", before, nil},
		{"gauge falls", strings.Replace(before, "g 9", "g 1", 1), nil},
		{"counter falls", strings.Replace(before, `a_total{x="1"} 5`, `a_total{x="1"} 4.5`, 1), []string{`a_total{x="1"} decreased: 5 -> 4.5`}},
		{"histogram falls", strings.Replace(before, "h_sum 3.5", "h_sum 3", 1), []string{"h_sum decreased: 3.5 -> 3"}},
		{"series gone", strings.Replace(before, "h_count 2\n", "", 1), []string{"h_count disappeared"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decreases(counterSamples(t, before), counterSamples(t, tt.after))
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// No counter (nor histogram series) exported on /metrics ever decreases:
// scraped over and over while requests run, and while the server is idle
// (where a stage's busy time once counted waiting and then fell back).
func TestMetricsMonotonic(t *testing.T) {
	ts := startServer(t, nil, Options{ModelName: "tiny"})
	prev := map[string]sample{}
	var scrapes int
	check := func() {
		scrapes++
		cur := counterSamples(t, scrape(t, ts.url))
		for _, e := range decreases(prev, cur) {
			t.Errorf("scrape %d: %s", scrapes, e)
		}
		prev = cur
	}
	check() // before any request
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 6 {
				body := fmt.Sprintf(`{"prompt": %q, "max_tokens": %d, "ignore_eos": true, "n": %d}`, strings.Repeat("ab ", 1+(w*7+i)%20), 2+(w+i)%9, 1+i%2)
				resp, err := http.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	phases := []struct {
		name string
		wait func() bool // whether the phase is over
	}{
		{"requests running", func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		}},
		{"idle", func() bool { return scrapes >= 30 }},
	}
	for _, ph := range phases {
		n := scrapes
		for !ph.wait() || scrapes-n < 10 {
			check()
			time.Sleep(5 * time.Millisecond) // pacing: idle stages sit waiting for input meanwhile
		}
	}
	if prev[`deepinfer:stage_busy_seconds_total{model_name="tiny",stage="forward"}`].value <= 0 {
		t.Errorf("no forward busy time after the requests")
	}
	if len(prev) < 20 {
		t.Errorf("only %d counter series", len(prev))
	}
}

// monotonic holds a source's highest value.
func TestMonotonic(t *testing.T) {
	tests := []struct {
		name     string
		in, want []float64
	}{
		{"growing", []float64{0, 1, 2.5, 2.5, 3}, []float64{0, 1, 2.5, 2.5, 3}},
		{"dips", []float64{0, 5, 3, 4, 6, 1}, []float64{0, 5, 5, 5, 6, 6}},
		{"starts high", []float64{2, 0, 0, 3}, []float64{2, 2, 2, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			i := 0
			f := monotonic(func() float64 { v := tt.in[i]; i++; return v })
			for j, w := range tt.want {
				if got := f(); got != w {
					t.Errorf("call %d: %v, want %v", j, got, w)
				}
			}
		})
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

// fakeEngine is an engineView over a config and step stats of the test's.
type fakeEngine struct {
	cfg   *config.Config
	stats *stages.Stats
}

func (f fakeEngine) SchedulerStats() engine.SchedulerStats { return engine.SchedulerStats{} }
func (f fakeEngine) StepStats() *stages.Stats              { return f.stats }
func (f fakeEngine) Graph() *pipeline.Graph                { return nil }
func (f fakeEngine) Config() *config.Config                { return f.cfg }

// scrapeHandler serves m's /metrics and returns the exposition text.
func scrapeHandler(t *testing.T, m *metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// specSamples parses the deepinfer:spec_decode_ samples of the exposition
// text: series (name and labels) to value, and the TYPE of each family.
func specSamples(t *testing.T, text string) (map[string]float64, map[string]string) {
	t.Helper()
	samples, types := map[string]float64{}, map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" && strings.HasPrefix(f[2], "deepinfer:spec_decode_") {
			types[f[2]] = f[3]
		}
		if !strings.HasPrefix(line, "deepinfer:spec_decode_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		samples[line[:i]] = v
	}
	return samples, types
}

// With speculative decoding on, /metrics carries vLLM's spec-decode
// counters with RecordSpec's exact counts, positions 0..k-1 from the
// start; with it off, none of them.
func TestMetricsSpecDecode(t *testing.T) {
	cfg := new(config.Config)
	*cfg = config.Default()
	cfg.Speculative.Method = "ngram"
	cfg.Speculative.NumSpeculativeTokens = 4
	st := new(stages.Stats)
	m := newMetrics("tiny", 64, fakeEngine{cfg, st}, func() float64 { return 0 })
	const (
		drafts   = `deepinfer:spec_decode_num_drafts_total{model_name="tiny"}`
		tokens   = `deepinfer:spec_decode_num_draft_tokens_total{model_name="tiny"}`
		accepted = `deepinfer:spec_decode_num_accepted_tokens_total{model_name="tiny"}`
	)
	pos := func(i int) string {
		return `deepinfer:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="` + strconv.Itoa(i) + `"}`
	}
	check := func(when string, want map[string]float64) {
		t.Helper()
		got, types := specSamples(t, scrapeHandler(t, m))
		if !maps.Equal(got, want) {
			t.Errorf("%s: spec samples\n%v\nwant\n%v", when, got, want)
		}
		for _, name := range []string{metricSpecDrafts, metricSpecDraftTokens, metricSpecAccepted, metricSpecAcceptedPerPos} {
			if types[name] != "counter" {
				t.Errorf("%s: %s has TYPE %q, want counter", when, name, types[name])
			}
		}
	}
	check("before any draft", map[string]float64{drafts: 0, tokens: 0, accepted: 0, pos(0): 0, pos(1): 0, pos(2): 0, pos(3): 0})

	st.RecordSpec(4, 4)
	st.RecordSpec(4, 1)
	st.RecordSpec(0, 0) // nothing drafted: not a draft
	st.RecordSpec(3, 2)
	st.RecordSpec(4, 0)
	check("after four drafts", map[string]float64{drafts: 4, tokens: 15, accepted: 7, pos(0): 3, pos(1): 2, pos(2): 1, pos(3): 1})

	// A draft longer than k (a drafter that does not keep to it) adds its
	// positions.
	st.RecordSpec(6, 6)
	check("after a longer draft", map[string]float64{drafts: 5, tokens: 21, accepted: 13,
		pos(0): 4, pos(1): 3, pos(2): 2, pos(3): 2, pos(4): 1, pos(5): 1})

	plain := config.Default()
	off := newMetrics("tiny", 64, fakeEngine{&plain, st}, func() float64 { return 0 })
	if got, _ := specSamples(t, scrapeHandler(t, off)); len(got) != 0 {
		t.Errorf("speculative decoding off: spec samples %v, want none", got)
	}
	ts := startServer(t, nil, Options{ModelName: "tiny"})
	if text := scrape(t, ts.url); strings.Contains(text, "deepinfer:spec_decode_") {
		t.Errorf("spec-decode metrics on an engine without speculative decoding:\n%s", text)
	}
}
