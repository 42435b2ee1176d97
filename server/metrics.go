package server

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// Metric names follow vLLM's ("vllm:" becomes "deepinfer:") where the
// quantity is the same, so existing dashboards need only the prefix
// changed. Every metric carries the label model_name.
const (
	metricTTFT              = "deepinfer:time_to_first_token_seconds"
	metricITL               = "deepinfer:inter_token_latency_seconds"
	metricE2E               = "deepinfer:e2e_request_latency_seconds"
	metricPromptTokensHist  = "deepinfer:request_prompt_tokens"
	metricGenTokensHist     = "deepinfer:request_generation_tokens"
	metricSuccess           = "deepinfer:request_success_total"
	metricRejected          = "deepinfer:request_rejected_total"
	metricPromptTokens      = "deepinfer:prompt_tokens_total"
	metricGenerationTokens  = "deepinfer:generation_tokens_total"
	metricRunning           = "deepinfer:num_requests_running"
	metricWaiting           = "deepinfer:num_requests_waiting"
	metricKVUsage           = "deepinfer:kv_cache_usage_perc"
	metricPreemptions       = "deepinfer:num_preemptions_total"
	metricPrefixQueries     = "deepinfer:prefix_cache_queries_total"
	metricPrefixHits        = "deepinfer:prefix_cache_hits_total"
	metricSteps             = "deepinfer:engine_steps_total"
	metricForwardSeconds    = "deepinfer:engine_forward_seconds_total"
	metricStageBusy         = "deepinfer:stage_busy_seconds_total"
	metricStageWaitIn       = "deepinfer:stage_wait_in_seconds_total"
	metricStageWaitOut      = "deepinfer:stage_wait_out_seconds_total"
	metricStageItems        = "deepinfer:stage_items_total"
	metricStageQueue        = "deepinfer:stage_queue_length"
	metricRequestsInFlight  = "deepinfer:num_requests_in_flight"
	metricRequestsInFlightH = "number of engine requests admitted by the server and not finished"
)

// Histogram buckets: vLLM's, with finer low buckets for fast CPU models.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets  = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	e2eBuckets  = []float64{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// metrics are the server's Prometheus collectors, in a registry of its own.
type metrics struct {
	reg                             *prometheus.Registry
	ttft, itl, e2e, queue           prometheus.Histogram
	promptTokensHist, genTokensHist prometheus.Histogram
	success                         *prometheus.CounterVec
	rejected                        *prometheus.CounterVec
	promptTokens, genTokens         prometheus.Counter
}

// engineView is what the metrics read from the engine at scrape time.
type engineView interface {
	SchedulerStats() engine.SchedulerStats
	StepStats() *stages.Stats
	Graph() *pipeline.Graph
}

func newMetrics(model string, maxModelLen int, eng engineView, inFlight func() float64) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	r := prometheus.WrapRegistererWith(prometheus.Labels{"model_name": model}, m.reg)
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
		r.MustRegister(h)
		return h
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		r.MustRegister(c)
		return c
	}
	m.ttft = hist(metricTTFT, "Histogram of time to first token in seconds (arrival at the server to the first token).", ttftBuckets)
	m.itl = hist(metricITL, "Histogram of inter-token latency in seconds (between two outputs of one sequence).", itlBuckets)
	m.queue = hist("deepinfer:request_queue_time_seconds", "Histogram of time requests spent waiting before their first step was scheduled.", ttftBuckets)
	m.e2e = hist(metricE2E, "Histogram of end-to-end request latency in seconds (arrival to the last sequence's finish).", e2eBuckets)
	tokenBuckets := tokenBuckets(maxModelLen)
	m.promptTokensHist = hist(metricPromptTokensHist, "Number of prompt tokens per finished request.", tokenBuckets)
	m.genTokensHist = hist(metricGenTokensHist, "Number of generated tokens per finished request (all its sequences).", tokenBuckets)
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricSuccess, Help: "Count of finished requests by the finish reason of their first sequence."}, []string{"finished_reason"})
	r.MustRegister(m.success)
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricRejected, Help: "Count of requests refused at admission (queue full or shutting down)."}, []string{"reason"})
	r.MustRegister(m.rejected)
	m.promptTokens = counter(metricPromptTokens, "Number of prompt tokens of requests that produced their first token.")
	m.genTokens = counter(metricGenerationTokens, "Number of generated tokens.")

	gauge := func(name, help string, f func() float64) {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	counterFunc := func(name, help string, f func() float64) {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
	}
	gauge(metricRunning, "Number of sequences running on the engine (decoding, or prefilling in chunks).", func() float64 {
		st := eng.SchedulerStats()
		return float64(st.NumRunning + st.NumPrompted)
	})
	gauge(metricWaiting, "Number of sequences waiting to be scheduled (incl. preempted and waiting for a grammar).", func() float64 {
		st := eng.SchedulerStats()
		return float64(st.NumWaiting + st.NumWaitingForGrammar)
	})
	gauge("deepinfer:step_host_gap_seconds", "Mean host time between two forward passes that is neither forward nor sampling work (the device's idle gap; small with ZOS).", func() float64 {
		return eng.StepStats().MeanExposedHost().Seconds()
	})
	gauge(metricKVUsage, "KV-cache usage: fraction of blocks in use, 1 means full.", func() float64 { return eng.SchedulerStats().BlockUsage })
	gauge(metricRequestsInFlight, metricRequestsInFlightH, inFlight)
	counterFunc(metricPreemptions, "Cumulative number of preemptions.", func() float64 { return float64(eng.SchedulerStats().NumPreemptions) })
	counterFunc(metricPrefixQueries, "Prefix-cache queries, in tokens.", func() float64 { return float64(eng.SchedulerStats().PrefixCache.NumQueryTokens) })
	counterFunc(metricPrefixHits, "Prefix-cache hits, in tokens.", func() float64 { return float64(eng.SchedulerStats().PrefixCache.NumHitTokens) })
	counterFunc(metricSteps, "Number of forward passes of the step loop.", func() float64 { return float64(eng.StepStats().Steps.Load()) })
	counterFunc(metricForwardSeconds, "Time spent in forward passes, in seconds.", func() float64 { return eng.StepStats().ForwardTime().Seconds() })
	if eng.StepStats().DeviceTimes().Timed {
		registerDeviceMetrics(r, eng.StepStats().DeviceTimes)
	}
	r.MustRegister(newStageCollector(eng.Graph))
	return m
}

// Device timeline metrics, registered only for backends with device markers
// (stages.DeviceTimes.Timed; the CUDA backend).
const (
	metricDeviceBusy       = "deepinfer:device_busy_seconds_total"
	metricDeviceSpan       = "deepinfer:device_step_span_seconds_total"
	metricDeviceDecodeBusy = "deepinfer:device_decode_busy_seconds_total"
	metricDeviceDecodeSpan = "deepinfer:device_decode_step_span_seconds_total"
	metricDeviceIdle       = "deepinfer:device_idle_between_steps_ratio"
)

// registerDeviceMetrics exposes the forward stage's device timeline: busy
// and span counters over pairs of consecutive steps (all steps, and decode
// steps), from which 1 - rate(busy)/rate(span) is the device's idle share
// between steps over any window, and that share since start as a gauge.
// Cost at scrape time: a few atomic loads per metric.
func registerDeviceMetrics(r prometheus.Registerer, times func() stages.DeviceTimes) {
	counter := func(name, help string, f func(stages.DeviceTimes) time.Duration) {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return f(times()).Seconds() }))
	}
	counter(metricDeviceBusy, "Device time of forward passes that were followed by another step, in seconds (markers on the device stream before and after each pass).",
		func(d stages.DeviceTimes) time.Duration { return d.All.Busy })
	counter(metricDeviceSpan, "Device time from the start of a forward pass to the start of the next, summed over pairs of consecutive steps, in seconds.",
		func(d stages.DeviceTimes) time.Duration { return d.All.Span })
	counter(metricDeviceDecodeBusy, "The device busy time of pairs of consecutive decode steps, in seconds.",
		func(d stages.DeviceTimes) time.Duration { return d.Decode.Busy })
	counter(metricDeviceDecodeSpan, "The device step span of pairs of consecutive decode steps, in seconds.",
		func(d stages.DeviceTimes) time.Duration { return d.Decode.Span })
	r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricDeviceIdle,
		Help: "Share of device time between consecutive forward passes that is not forward work, since start (0 until two steps have run)."},
		func() float64 {
			f, _ := times().All.IdleFraction()
			return f
		}))
}

// tokenBuckets are 1-2-5 buckets up to maxModelLen, as vLLM's.
func tokenBuckets(maxModelLen int) []float64 {
	var out []float64
	for scale := 1; ; scale *= 10 {
		for _, m := range []int{1, 2, 5} {
			v := m * scale
			if v > max(maxModelLen, 1) {
				return out
			}
			out = append(out, float64(v))
		}
	}
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// stageCollector reports the step loop's per-stage counters
// (pipeline.Graph.Stats) at scrape time. Cost: one snapshot of a few atomics
// per stage per scrape.
type stageCollector struct {
	graph                              func() *pipeline.Graph
	busy, waitIn, waitOut, items, qlen *prometheus.Desc
}

func newStageCollector(graph func() *pipeline.Graph) *stageCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"stage"}, nil)
	}
	return &stageCollector{
		graph:   graph,
		busy:    desc(metricStageBusy, "Time a pipeline stage spent working (running time less time blocked), in seconds."),
		waitIn:  desc(metricStageWaitIn, "Time a pipeline stage spent blocked waiting for input, in seconds."),
		waitOut: desc(metricStageWaitOut, "Time a pipeline stage spent blocked on a full output (backpressure), in seconds."),
		items:   desc(metricStageItems, "Items a pipeline stage processed."),
		qlen:    desc(metricStageQueue, "Items waiting in a pipeline stage's input now."),
	}
}

func (c *stageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.busy, c.waitIn, c.waitOut, c.items, c.qlen} {
		ch <- d
	}
}

func (c *stageCollector) Collect(ch chan<- prometheus.Metric) {
	g := c.graph()
	if g == nil {
		return
	}
	for _, s := range g.Stats() {
		ch <- prometheus.MustNewConstMetric(c.busy, prometheus.CounterValue, s.Busy.Seconds(), s.Name)
		ch <- prometheus.MustNewConstMetric(c.waitIn, prometheus.CounterValue, s.WaitIn.Seconds(), s.Name)
		ch <- prometheus.MustNewConstMetric(c.waitOut, prometheus.CounterValue, s.WaitOut.Seconds(), s.Name)
		ch <- prometheus.MustNewConstMetric(c.items, prometheus.CounterValue, float64(s.Items), s.Name)
		ch <- prometheus.MustNewConstMetric(c.qlen, prometheus.GaugeValue, float64(s.QueueLen), s.Name)
	}
}
