package server

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
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
	metricQueueTime         = "deepinfer:request_queue_time_seconds"
	metricPrefillTime       = "deepinfer:request_prefill_time_seconds"
	metricDecodeTime        = "deepinfer:request_decode_time_seconds"
	metricInferenceTime     = "deepinfer:request_inference_time_seconds"
	metricTPOT              = "deepinfer:time_per_output_token_seconds"
	metricParamsMaxTokens   = "deepinfer:request_params_max_tokens"
	metricParamsN           = "deepinfer:request_params_n"
	metricIterationTokens   = "deepinfer:iteration_tokens_total"
	metricCacheConfig       = "deepinfer:cache_config_info"

	// Speculative decoding, registered only when the engine drafts
	// (speculative.method set), as vLLM registers its own only with a
	// speculative config.
	metricSpecDrafts         = "deepinfer:spec_decode_num_drafts_total"
	metricSpecDraftTokens    = "deepinfer:spec_decode_num_draft_tokens_total"
	metricSpecAccepted       = "deepinfer:spec_decode_num_accepted_tokens_total"
	metricSpecAcceptedPerPos = "deepinfer:spec_decode_num_accepted_tokens_per_pos_total"
)

// Histogram buckets: vLLM's, with finer low buckets for fast CPU models.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets  = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	e2eBuckets  = []float64{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	// nBuckets are vLLM's for the n request parameter.
	nBuckets = []float64{1, 2, 5, 10, 20}
	// phaseBuckets are for a request's prefill, decode and inference
	// times: vLLM's request latency buckets, with finer low ones.
	phaseBuckets = append([]float64{0.001, 0.0025, 0.005}, e2eBuckets...)
)

// metrics are the server's Prometheus collectors, in a registry of its own.
type metrics struct {
	reg                             *prometheus.Registry
	ttft, itl, e2e, queue           prometheus.Histogram
	promptTokensHist, genTokensHist prometheus.Histogram
	success                         *prometheus.CounterVec
	rejected                        *prometheus.CounterVec
	promptTokens, genTokens         prometheus.Counter

	// Observed when a request finishes (observeOutput).
	prefill, decode, inference prometheus.Histogram
	maxTokensParam, nParam     prometheus.Histogram

	// timing holds the scheduled and first-token times of the requests
	// that have produced a token and not finished, for the phase
	// histograms and the request's log line.
	timingMu sync.Mutex
	timing   map[*request]requestTiming

	// Throughput log state (logging.go).
	logInterval     atomic.Int64 // nanoseconds between throughput lines
	logRunning      atomic.Bool  // a throughput loop runs
	logPromptTokens atomic.Int64 // prompt tokens of requests that produced their first token
	logOutputTokens atomic.Int64 // tokens generated
}

// requestTiming is when a request's first step was planned and when its
// first token came.
type requestTiming struct {
	scheduled, firstToken time.Time
}

// engineView is what the metrics read from the engine at scrape time.
type engineView interface {
	SchedulerStats() engine.SchedulerStats
	StepStats() *stages.Stats
	Graph() *pipeline.Graph
	Config() *config.Config
}

// newMetrics registers the server's metrics for model over eng: the
// request histograms and counters the server observes (observeOutput and
// onOutput), and the engine's counters and gauges, read at scrape time.
// Every counter is monotonic (monotonic clamps the ones read from the
// engine). Cost at scrape time: a few scheduler snapshots (each
// O(queued sequences) under the scheduler's lock), a few atomic loads, and
// one snapshot per pipeline stage.
func newMetrics(model string, maxModelLen int, eng engineView, inFlight func() float64) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), timing: map[*request]requestTiming{}}
	m.logInterval.Store(int64(defaultThroughputInterval))
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
	// vLLM's time_per_output_token_seconds is observed with the
	// inter-token latency, per output token: the same observations.
	m.itl = teeHistogram{
		hist(metricITL, "Histogram of inter-token latency in seconds (between two outputs of one sequence).", itlBuckets),
		hist(metricTPOT, "Histogram of time per output token in seconds (time since the sequence's previous token; vLLM's, the same observations as inter_token_latency).", itlBuckets),
	}
	m.queue = hist(metricQueueTime, "Histogram of time requests spent waiting before their first step was scheduled.", ttftBuckets)
	m.e2e = hist(metricE2E, "Histogram of end-to-end request latency in seconds (arrival to the last sequence's finish).", e2eBuckets)
	m.prefill = hist(metricPrefillTime, "Histogram of time requests spent in prefill in seconds (first step scheduled to first token), for requests that produced a token.", phaseBuckets)
	m.decode = hist(metricDecodeTime, "Histogram of time requests spent in decode in seconds (first token to the last sequence's finish), for requests that produced a token.", phaseBuckets)
	m.inference = hist(metricInferenceTime, "Histogram of time requests spent running in seconds (first step scheduled to the last sequence's finish: prefill plus decode), for requests that produced a token.", phaseBuckets)
	tokenBuckets := tokenBuckets(maxModelLen)
	m.promptTokensHist = hist(metricPromptTokensHist, "Number of prompt tokens per finished request.", tokenBuckets)
	m.genTokensHist = hist(metricGenTokensHist, "Number of generated tokens per finished request (all its sequences).", tokenBuckets)
	m.maxTokensParam = hist(metricParamsMaxTokens, "Histogram of the max_tokens request parameter (as the engine received it), per finished request.", tokenBuckets)
	m.nParam = hist(metricParamsN, "Histogram of the n request parameter, per finished request.", nBuckets)
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
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, monotonic(f)))
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
	// ForwardTime switches from the host's wait to the device timeline
	// after the first deferred step, and the timeline lags a step or two:
	// monotonic holds the counter until the timeline catches up.
	counterFunc(metricForwardSeconds, "Time spent in forward passes, in seconds.", func() float64 { return eng.StepStats().ForwardTime().Seconds() })
	if eng.StepStats().DeviceTimes().Timed {
		registerDeviceMetrics(r, eng.StepStats().DeviceTimes)
	}
	r.MustRegister(newStageCollector(eng.Graph))
	r.MustRegister(newIterationCollector(eng.StepStats))
	if cfg := eng.Config(); cfg != nil && cfg.Speculative.Enabled() {
		r.MustRegister(newSpecCollector(eng.StepStats, cfg.Speculative.NumSpeculativeTokens))
	}
	registerCacheConfig(r, eng.Config(), eng.SchedulerStats())
	return m
}

// teeHistogram observes each value in both histograms; it is the first
// for everything else (both are registered on their own).
type teeHistogram struct {
	prometheus.Histogram
	also prometheus.Histogram
}

func (t teeHistogram) Observe(v float64) {
	t.Histogram.Observe(v)
	t.also.Observe(v)
}

// monotonic returns f as a counter's value: the largest value f has
// returned, so that a source that briefly reads lower (one that switches
// between two clocks, or reads two atomics apart) never makes the exported
// counter decrease, which Prometheus' rate() would read as a reset. Safe
// for concurrent use; cost: f plus a mutex.
func monotonic(f func() float64) func() float64 {
	var mu sync.Mutex
	var high float64
	return func() float64 {
		v := f()
		mu.Lock()
		defer mu.Unlock()
		high = max(high, v)
		return high
	}
}

// registerCacheConfig registers deepinfer:cache_config_info, vLLM's
// cache_config_info: a gauge of value 1 whose labels describe the KV cache
// (st: the scheduler's, for the blocks and state slots the engine has).
// Its value never changes.
func registerCacheConfig(r prometheus.Registerer, cfg *config.Config, st engine.SchedulerStats) {
	if cfg == nil {
		return
	}
	c := cfg.Cache
	dtype := c.KVCacheDType
	if dtype == "" {
		dtype = "auto"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: metricCacheConfig,
		Help: "Information of the KV cache's configuration (vLLM's CacheConfig); the value is 1.",
		ConstLabels: prometheus.Labels{
			"block_size":             strconv.Itoa(c.BlockSize),
			"num_blocks":             strconv.Itoa(st.NumBlocks),
			"num_gpu_blocks":         strconv.Itoa(st.NumBlocks), // vLLM's name, on any device
			"cache_dtype":            dtype,
			"enable_prefix_caching":  strconv.FormatBool(c.PrefixCaching),
			"gpu_memory_utilization": strconv.FormatFloat(c.MemoryFraction, 'g', -1, 64),
			"num_state_slots":        strconv.Itoa(st.NumStateSlots),
			"device":                 cfg.Device,
		},
	})
	g.Set(1)
	r.MustRegister(g)
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
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, monotonic(func() float64 { return f(times()).Seconds() })))
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
// (pipeline.Graph.Stats) at scrape time, each held monotonic per stage (see
// monotonic). Cost: one snapshot of a few atomics per stage per scrape.
type stageCollector struct {
	graph                              func() *pipeline.Graph
	busy, waitIn, waitOut, items, qlen *prometheus.Desc

	mu   sync.Mutex
	high map[string]*[4]float64 // per stage: busy, wait in, wait out, items exported so far
}

func newStageCollector(graph func() *pipeline.Graph) *stageCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"stage"}, nil)
	}
	return &stageCollector{
		graph:   graph,
		busy:    desc(metricStageBusy, "Time a pipeline stage spent working (running time less time blocked), in seconds."),
		waitIn:  desc(metricStageWaitIn, "Time a pipeline stage spent blocked waiting for input, in seconds (a wait counts once it ends)."),
		waitOut: desc(metricStageWaitOut, "Time a pipeline stage spent blocked on a full output (backpressure), in seconds (a wait counts once it ends)."),
		items:   desc(metricStageItems, "Items a pipeline stage processed."),
		qlen:    desc(metricStageQueue, "Items waiting in a pipeline stage's input now."),
		high:    map[string]*[4]float64{},
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
	stats := g.Stats()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range stats {
		h := c.high[s.Name]
		if h == nil {
			h = new([4]float64)
			c.high[s.Name] = h
		}
		for i, v := range [4]float64{s.Busy.Seconds(), s.WaitIn.Seconds(), s.WaitOut.Seconds(), float64(s.Items)} {
			h[i] = max(h[i], v)
		}
		ch <- prometheus.MustNewConstMetric(c.busy, prometheus.CounterValue, h[0], s.Name)
		ch <- prometheus.MustNewConstMetric(c.waitIn, prometheus.CounterValue, h[1], s.Name)
		ch <- prometheus.MustNewConstMetric(c.waitOut, prometheus.CounterValue, h[2], s.Name)
		ch <- prometheus.MustNewConstMetric(c.items, prometheus.CounterValue, h[3], s.Name)
		ch <- prometheus.MustNewConstMetric(c.qlen, prometheus.GaugeValue, float64(s.QueueLen), s.Name)
	}
}

// iterationCollector reports deepinfer:iteration_tokens_total, vLLM's
// histogram of the tokens (prompt plus decode) of one engine step, from
// the step loop's per-step bucket counts (stages.Stats.StepTokenCounts)
// and its token counters. Every series only grows. Cost: a few atomic
// loads per scrape.
type iterationCollector struct {
	stats func() *stages.Stats
	desc  *prometheus.Desc
}

func newIterationCollector(stats func() *stages.Stats) *iterationCollector {
	return &iterationCollector{
		stats: stats,
		desc:  prometheus.NewDesc(metricIterationTokens, "Histogram of the number of tokens per engine step (prompt and decode).", nil, nil),
	}
}

func (c *iterationCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *iterationCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	if st == nil {
		return
	}
	// A step's bucket is counted before its tokens are added: _sum may
	// trail _count by the step being recorded, never the other way.
	counts := st.StepTokenCounts()
	tokens := uint64(max(0, st.PrefillTokens.Load()+st.DecodeTokens.Load()))
	cum := make(map[float64]uint64, len(stages.StepTokenBounds))
	var n uint64
	for i, b := range stages.StepTokenBounds {
		n += uint64(counts[i])
		cum[float64(b)] = n
	}
	n += uint64(counts[len(counts)-1])
	ch <- prometheus.MustNewConstHistogram(c.desc, n, float64(tokens), cum)
}

// specCollector reports vLLM's spec-decode counters from the step loop's
// (stages.Stats.Spec): drafts verified, draft tokens, accepted tokens, and
// accepted tokens per draft position (label position, from 0), for
// positions 0..k-1 from the start (k: num_speculative_tokens, as vLLM)
// and any later position a draft reached. Every series is held monotonic
// (see monotonic). Cost: one snapshot (a few dozen atomic loads) per
// scrape.
type specCollector struct {
	stats                            func() *stages.Stats
	k                                int
	drafts, tokens, accepted, perPos *prometheus.Desc

	mu   sync.Mutex
	high [3]float64 // drafts, draft tokens, accepted tokens exported so far
	pos  []float64  // accepted tokens per position exported so far
}

func newSpecCollector(stats func() *stages.Stats, k int) *specCollector {
	return &specCollector{
		stats:    stats,
		k:        min(max(k, 0), stages.MaxSpecPositions),
		drafts:   prometheus.NewDesc(metricSpecDrafts, "Number of spec decoding drafts: sequence-steps whose draft tokens were verified.", nil, nil),
		tokens:   prometheus.NewDesc(metricSpecDraftTokens, "Number of draft tokens proposed and verified.", nil, nil),
		accepted: prometheus.NewDesc(metricSpecAccepted, "Number of accepted draft tokens.", nil, nil),
		perPos:   prometheus.NewDesc(metricSpecAcceptedPerPos, "Number of accepted tokens per draft position (from 0).", []string{"position"}, nil),
	}
}

func (c *specCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.drafts, c.tokens, c.accepted, c.perPos} {
		ch <- d
	}
}

func (c *specCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	if st == nil {
		return
	}
	sp := st.Spec()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, v := range [3]int64{sp.NumDrafts, sp.NumDraftTokens, sp.NumAcceptedTokens} {
		c.high[i] = max(c.high[i], float64(v))
	}
	for len(c.pos) < max(c.k, len(sp.AcceptedPerPos)) {
		c.pos = append(c.pos, 0)
	}
	for i, v := range sp.AcceptedPerPos {
		c.pos[i] = max(c.pos[i], float64(v))
	}
	ch <- prometheus.MustNewConstMetric(c.drafts, prometheus.CounterValue, c.high[0])
	ch <- prometheus.MustNewConstMetric(c.tokens, prometheus.CounterValue, c.high[1])
	ch <- prometheus.MustNewConstMetric(c.accepted, prometheus.CounterValue, c.high[2])
	for i, v := range c.pos {
		ch <- prometheus.MustNewConstMetric(c.perPos, prometheus.CounterValue, v, strconv.Itoa(i))
	}
}

// observeOutput records what the request histograms, the per-request log
// line and the throughput log need of one output o of r, received at now;
// done says r's last sequence just finished. onOutput calls it for every
// output it keeps, holding r's group lock, after it updated r's counters.
//
// The first output of r that carries a scheduled time keeps r's scheduled
// and first-token times; when r is done they give its prefill, decode and
// inference times (for requests that produced a token), its parameters
// are observed and its log line is written (logRequest). Cost per output:
// an atomic add; at r's first token and at its end, a map access under a
// mutex, and at its end a few histogram observations and one log record.
func (s *Server) observeOutput(r *request, o *engine.RequestOutput, now time.Time, done bool) {
	m := s.metrics
	s.startThroughputLog() // before counting o: the loop's first line counts it
	m.logOutputTokens.Add(int64(len(o.TokenIDs)))
	var t requestTiming
	started, first := false, false // r has produced a token; this is its first
	if !o.ScheduledTime.IsZero() || done {
		m.timingMu.Lock()
		t, started = m.timing[r]
		if !started && !o.ScheduledTime.IsZero() {
			t = requestTiming{scheduled: o.ScheduledTime, firstToken: o.FirstTokenTime}
			if t.firstToken.IsZero() {
				t.firstToken = now
			}
			started, first = true, true
			m.timing[r] = t
		}
		if done {
			delete(m.timing, r)
		}
		m.timingMu.Unlock()
	}
	if first {
		m.logPromptTokens.Add(int64(len(r.promptTokenIDs)))
	}
	if !done {
		return
	}
	finish := o.FinishTime
	if finish.IsZero() {
		finish = now
	}
	if started {
		m.prefill.Observe(max(0, t.firstToken.Sub(t.scheduled).Seconds()))
		m.decode.Observe(max(0, finish.Sub(t.firstToken).Seconds()))
		m.inference.Observe(max(0, finish.Sub(t.scheduled).Seconds()))
	}
	if r.params.MaxTokens > 0 {
		m.maxTokensParam.Observe(float64(r.params.MaxTokens))
	}
	m.nParam.Observe(float64(max(1, r.params.N)))
	s.logRequest(r, t, started, now)
}
