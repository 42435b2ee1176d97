package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// ServeOptions shape a serving benchmark against an OpenAI-compatible
// server.
type ServeOptions struct {
	// BaseURL is the server's root, e.g. http://127.0.0.1:8000.
	BaseURL string
	// Endpoint is /v1/completions (default) or /v1/chat/completions.
	Endpoint string
	// Model is the "model" field; "" asks GET /v1/models for the first one.
	Model string
	// NumPrompts is the number of requests sent.
	NumPrompts int
	// RequestRate is the mean arrival rate in requests per second: gaps
	// are exponential (a Poisson process). 0 or +Inf sends all at once.
	RequestRate float64
	// MaxConcurrency bounds the requests in flight; 0: unbounded.
	MaxConcurrency int
	// Prompts, when non-empty, are the prompt texts, used in turn;
	// otherwise prompts are random: token ids for completions (ids below
	// VocabSize, which 0 takes from GET /v1/models' vocab_size), random
	// lowercase words for chat, InputLen long (tokens or words).
	Prompts   []string
	InputLen  int
	VocabSize int
	// OutputLen is max_tokens of every request, generated with ignore_eos.
	OutputLen int
	// RangeRatio draws random input and output lengths uniformly in
	// [len*(1-r), len*(1+r)] (vLLM's random_range_ratio); 0: fixed.
	RangeRatio  float64
	Temperature float32
	Seed        uint64
	// Client sends the requests; nil: a client with a transport of its own.
	Client *http.Client
	// APIKey, when set, goes with every request as a bearer token (a
	// server started with --api-key).
	APIKey string
	// Progress receives a progress bar over finished requests, with their
	// rate since the start, ended by a newline when the run ends; nil:
	// none.
	Progress io.Writer
}

// RequestResult is one request's measurements (milliseconds from its
// send).
type RequestResult struct {
	Success      bool      `json:"success"`
	Error        string    `json:"error,omitempty"`
	PromptTokens int       `json:"prompt_tokens"`
	OutputTokens int       `json:"output_tokens"`
	TTFT         float64   `json:"ttft_ms"`
	Latency      float64   `json:"latency_ms"`
	ITLs         []float64 `json:"itl_ms,omitempty"`
	SentAt       float64   `json:"sent_at_ms"` // since the benchmark's start
}

// ServeResult is the report of a serving benchmark, with vLLM's
// benchmark_serving fields: times in milliseconds, throughputs per second.
type ServeResult struct {
	Mode              string          `json:"mode"`
	BaseURL           string          `json:"base_url"`
	Endpoint          string          `json:"endpoint"`
	Model             string          `json:"model"`
	NumPrompts        int             `json:"num_prompts"`
	RequestRate       float64         `json:"request_rate"` // +Inf is written as 0
	MaxConcurrency    int             `json:"max_concurrency"`
	Completed         int             `json:"completed"`
	Failed            int             `json:"failed"`
	DurationSeconds   float64         `json:"duration_s"`
	TotalInputTokens  int             `json:"total_input_tokens"`
	TotalOutputTokens int             `json:"total_output_tokens"`
	RequestThroughput float64         `json:"request_throughput"`
	OutputThroughput  float64         `json:"output_throughput"`
	TotalThroughput   float64         `json:"total_token_throughput"`
	TTFTMillis        Summary         `json:"ttft_ms"`
	TPOTMillis        Summary         `json:"tpot_ms"`
	ITLMillis         Summary         `json:"itl_ms"`
	E2EMillis         Summary         `json:"e2el_ms"`
	Errors            []string        `json:"errors,omitempty"` // distinct messages of failed requests
	Requests          []RequestResult `json:"requests"`
	// Percentiles are extra percentiles of the latencies, keyed as vLLM's
	// results ("p99_ttft_ms"); filled by the caller (see Percentiles).
	Percentiles map[string]float64 `json:"percentiles,omitempty"`
}

// Distributions are the result's samples for WritePlots.
func (r *ServeResult) Distributions() []Distribution {
	var ttft, tpot, itl, e2e []float64
	for _, q := range r.Requests {
		if !q.Success {
			continue
		}
		ttft = append(ttft, q.TTFT)
		e2e = append(e2e, q.Latency)
		if q.OutputTokens > 1 {
			tpot = append(tpot, (q.Latency-q.TTFT)/float64(q.OutputTokens-1))
		}
		itl = append(itl, q.ITLs...)
	}
	return []Distribution{{"ttft", "ms", ttft}, {"tpot", "ms", tpot}, {"itl", "ms", itl}, {"e2el", "ms", e2e}}
}

// RunServe sends the workload to the server and measures every streamed
// answer: time to the first text, gaps between text chunks (ITL), time per
// output token after the first (TPOT) and end-to-end latency. A request
// fails on a transport error, a non-200 status or an error event; the
// benchmark fails only when it cannot start (bad options, no model) or ctx
// ends.
func RunServe(ctx context.Context, o ServeOptions) (*ServeResult, error) {
	if o.NumPrompts < 1 || o.OutputLen < 1 {
		return nil, fmt.Errorf("bench: serve: num prompts (%d) and output length (%d) must be >= 1", o.NumPrompts, o.OutputLen)
	}
	if o.RangeRatio < 0 || o.RangeRatio >= 1 {
		return nil, fmt.Errorf("bench: serve: range ratio must be in [0, 1), got %g", o.RangeRatio)
	}
	if o.Endpoint == "" {
		o.Endpoint = "/v1/completions"
	}
	chat := strings.HasSuffix(o.Endpoint, "/chat/completions")
	if !chat && !strings.HasSuffix(o.Endpoint, "/completions") {
		return nil, fmt.Errorf("bench: serve: endpoint %q is neither /v1/completions nor /v1/chat/completions", o.Endpoint)
	}
	base := strings.TrimRight(o.BaseURL, "/")
	client := o.Client
	if client == nil {
		tr := &http.Transport{MaxIdleConnsPerHost: 1024}
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr}
	}
	if o.APIKey != "" {
		c := *client
		c.Transport = bearer{key: o.APIKey, next: c.Transport}
		client = &c
	}
	if o.Model == "" || (len(o.Prompts) == 0 && !chat && o.VocabSize == 0) {
		card, err := firstModel(ctx, client, base)
		if err != nil {
			return nil, err
		}
		if o.Model == "" {
			o.Model = card.ID
		}
		if o.VocabSize == 0 {
			o.VocabSize = card.VocabSize
		}
	}
	if len(o.Prompts) == 0 && !chat && o.VocabSize < 1 {
		return nil, errors.New("bench: serve: random token prompts need the vocabulary size: the server reports none, give it")
	}
	if len(o.Prompts) == 0 && o.InputLen < 1 {
		return nil, fmt.Errorf("bench: serve: input length must be >= 1, got %d", o.InputLen)
	}

	rng := rand.New(rand.NewPCG(o.Seed, 0x5e7e))
	bodies := make([][]byte, o.NumPrompts)
	for i := range bodies {
		b, err := json.Marshal(o.body(i, chat, rng))
		if err != nil {
			return nil, fmt.Errorf("bench: serve: %w", err)
		}
		bodies[i] = b
	}
	gaps := make([]time.Duration, o.NumPrompts)
	if o.RequestRate > 0 && !math.IsInf(o.RequestRate, 1) {
		for i := 1; i < len(gaps); i++ {
			gaps[i] = time.Duration(rng.ExpFloat64() / o.RequestRate * float64(time.Second))
		}
	}

	var sem chan struct{}
	if o.MaxConcurrency > 0 {
		sem = make(chan struct{}, o.MaxConcurrency)
	}
	results := make([]RequestResult, o.NumPrompts)
	var wg sync.WaitGroup
	bar := newProgress(o.Progress, o.NumPrompts, "serve", "req")
	start := time.Now()
	next := start
	for i := range bodies {
		next = next.Add(gaps[i])
		if d := time.Until(next); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if ctx.Err() != nil {
			break
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = send(ctx, client, base+o.Endpoint, bodies[i], start)
			if sem != nil {
				<-sem
			}
			bar.add()
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	bar.finish()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bench: serve: %w", err)
	}
	return o.report(base, results, wall), nil
}

// body is request i's JSON body.
func (o *ServeOptions) body(i int, chat bool, rng *rand.Rand) map[string]any {
	vary := func(n int) int {
		if o.RangeRatio == 0 {
			return n
		}
		lo, hi := int(float64(n)*(1-o.RangeRatio)), int(float64(n)*(1+o.RangeRatio))
		return max(1, lo+rng.IntN(hi-lo+1))
	}
	outLen := vary(o.OutputLen)
	b := map[string]any{
		"model": o.Model, "max_tokens": outLen, "ignore_eos": true, "temperature": o.Temperature,
		"stream": true, "stream_options": map[string]bool{"include_usage": true},
	}
	var text string
	var ids []int
	switch {
	case len(o.Prompts) > 0:
		text = o.Prompts[i%len(o.Prompts)]
	case chat:
		n := vary(o.InputLen)
		words := make([]string, n)
		for j := range words {
			w := make([]byte, 2+rng.IntN(6))
			for k := range w {
				w[k] = byte('a' + rng.IntN(26))
			}
			words[j] = string(w)
		}
		text = strings.Join(words, " ")
	default:
		ids = make([]int, vary(o.InputLen))
		for j := range ids {
			ids[j] = rng.IntN(o.VocabSize)
		}
	}
	switch {
	case chat:
		b["messages"] = []map[string]string{{"role": "user", "content": text}}
	case ids != nil:
		b["prompt"] = ids
	default:
		b["prompt"] = text
	}
	return b
}

// bearer adds an API key to every request it sends.
type bearer struct {
	key  string
	next http.RoundTripper // nil: http.DefaultTransport
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	next := b.next
	if next == nil {
		next = http.DefaultTransport
	}
	return next.RoundTrip(r)
}

// modelCard is the part of GET /v1/models the benchmark reads.
type modelCard struct {
	ID        string `json:"id"`
	VocabSize int    `json:"vocab_size"`
}

func firstModel(ctx context.Context, client *http.Client, base string) (modelCard, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return modelCard{}, fmt.Errorf("bench: serve: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return modelCard{}, fmt.Errorf("bench: serve: list models: %w", err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []modelCard `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK || len(list.Data) == 0 {
		return modelCard{}, fmt.Errorf("bench: serve: GET %s/v1/models: status %d, no model listed (%v)", base, resp.StatusCode, err)
	}
	return list.Data[0], nil
}

// streamChunk is the part of a streamed chunk the benchmark reads, for
// both endpoints.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// send posts one streamed request and measures it.
func send(ctx context.Context, client *http.Client, url string, body []byte, start time.Time) RequestResult {
	sent := time.Now()
	res := RequestResult{SentAt: ms(sent.Sub(start))}
	fail := func(format string, args ...any) RequestResult {
		res.Success, res.Error = false, fmt.Sprintf(format, args...)
		return res
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fail("%v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fail("%v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var e streamChunk
		if json.Unmarshal(data, &e) == nil && e.Error != nil {
			return fail("status %d: %s", resp.StatusCode, e.Error.Message)
		}
		return fail("status %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var last time.Time
	numChunks, done := 0, false
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) {
			continue
		}
		data := line[len("data: "):]
		if string(data) == "[DONE]" {
			done = true
			break
		}
		now := time.Now()
		var c streamChunk
		if err := json.Unmarshal(data, &c); err != nil {
			return fail("bad chunk %q: %v", data, err)
		}
		if c.Error != nil {
			return fail("error event: %s", c.Error.Message)
		}
		if c.Usage != nil {
			res.PromptTokens, res.OutputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
		text := false
		for _, ch := range c.Choices {
			text = text || ch.Text != "" || ch.Delta.Content != ""
		}
		if !text {
			continue
		}
		numChunks++
		if last.IsZero() {
			res.TTFT = ms(now.Sub(sent))
		} else {
			res.ITLs = append(res.ITLs, ms(now.Sub(last)))
		}
		last = now
	}
	if err := sc.Err(); err != nil {
		return fail("reading the stream: %v", err)
	}
	if !done {
		return fail("the stream ended without [DONE]")
	}
	res.Latency = ms(time.Since(sent))
	if res.OutputTokens == 0 {
		res.OutputTokens = numChunks // a server that sends no usage: one token per chunk
	}
	if numChunks == 0 {
		res.TTFT = res.Latency
	}
	res.Success = true
	return res
}

// report aggregates the requests.
func (o *ServeOptions) report(base string, reqs []RequestResult, wall time.Duration) *ServeResult {
	rate := o.RequestRate
	if math.IsInf(rate, 1) {
		rate = 0
	}
	r := &ServeResult{
		Mode: "serve", BaseURL: base, Endpoint: o.Endpoint, Model: o.Model, NumPrompts: o.NumPrompts,
		RequestRate: rate, MaxConcurrency: o.MaxConcurrency, DurationSeconds: wall.Seconds(), Requests: reqs,
	}
	seen := map[string]bool{}
	for _, q := range reqs {
		if !q.Success {
			r.Failed++
			if !seen[q.Error] && len(r.Errors) < 20 {
				seen[q.Error] = true
				r.Errors = append(r.Errors, q.Error)
			}
			continue
		}
		r.Completed++
		r.TotalInputTokens += q.PromptTokens
		r.TotalOutputTokens += q.OutputTokens
	}
	secs := wall.Seconds()
	r.RequestThroughput = float64(r.Completed) / secs
	r.OutputThroughput = float64(r.TotalOutputTokens) / secs
	r.TotalThroughput = float64(r.TotalInputTokens+r.TotalOutputTokens) / secs
	d := r.Distributions()
	r.TTFTMillis, r.TPOTMillis, r.ITLMillis, r.E2EMillis = Summarize(d[0].Values), Summarize(d[1].Values), Summarize(d[2].Values), Summarize(d[3].Values)
	return r
}
