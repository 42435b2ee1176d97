package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/llm"
)

// OfflineOptions shape the offline workload. The defaults (DefaultOffline)
// are nano-vllm's bench.py workload: 256 sequences of 100..1024 random
// prompt tokens (ids below 10000), each generating 100..1024 tokens with
// ignore_eos, at temperature 0 (greedy, the default of vLLM's benchmarks;
// nano-vllm samples at 0.6).
type OfflineOptions struct {
	NumSeqs                    int
	MinInputLen, MaxInputLen   int
	MinOutputLen, MaxOutputLen int
	Temperature                float32
	// MaxTokenID bounds the random prompt ids (exclusive; capped by the
	// model's vocabulary).
	MaxTokenID int
	Seed       uint64
	// Progress receives a progress bar over finished sequences, with their
	// rate since the start, ended by a newline when the run ends; nil:
	// none.
	Progress io.Writer
}

// DefaultOffline returns nano-vllm's workload, sampled greedily.
func DefaultOffline() OfflineOptions {
	return OfflineOptions{NumSeqs: 256, MinInputLen: 100, MaxInputLen: 1024, MinOutputLen: 100, MaxOutputLen: 1024, Temperature: 0, MaxTokenID: 10000}
}

func (o *OfflineOptions) validate() error {
	switch {
	case o.NumSeqs < 1:
		return fmt.Errorf("bench: offline: num seqs must be >= 1, got %d", o.NumSeqs)
	case o.MinInputLen < 1 || o.MaxInputLen < o.MinInputLen:
		return fmt.Errorf("bench: offline: input lengths must satisfy 1 <= min <= max, got %d..%d", o.MinInputLen, o.MaxInputLen)
	case o.MinOutputLen < 1 || o.MaxOutputLen < o.MinOutputLen:
		return fmt.Errorf("bench: offline: output lengths must satisfy 1 <= min <= max, got %d..%d", o.MinOutputLen, o.MaxOutputLen)
	case o.MaxTokenID < 1:
		return fmt.Errorf("bench: offline: max token id must be >= 1, got %d", o.MaxTokenID)
	}
	return nil
}

// OfflineResult is the report of an offline run. Times are in
// milliseconds, throughputs per second of wall time.
type OfflineResult struct {
	Mode              string  `json:"mode"`
	NumRequests       int     `json:"num_requests"`
	Failed            int     `json:"failed"`
	DurationSeconds   float64 `json:"duration_s"`
	TotalInputTokens  int     `json:"total_input_tokens"`
	TotalOutputTokens int     `json:"total_output_tokens"`
	RequestThroughput float64 `json:"request_throughput"`
	OutputThroughput  float64 `json:"output_throughput"`
	TotalThroughput   float64 `json:"total_token_throughput"`
	TTFTMillis        Summary `json:"ttft_ms"`
	TPOTMillis        Summary `json:"tpot_ms"`
	E2EMillis         Summary `json:"e2el_ms"`
	// Percentiles are extra percentiles of the latencies, keyed as vLLM's
	// results ("p99_ttft_ms"); filled by the caller (see Percentiles).
	Percentiles map[string]float64 `json:"percentiles,omitempty"`
	// Per-request samples (milliseconds), in prompt order.
	TTFTs []float64 `json:"ttfts_ms"`
	TPOTs []float64 `json:"tpots_ms"`
	E2Els []float64 `json:"e2els_ms"`
}

// Distributions are the result's samples for WritePlots.
func (r *OfflineResult) Distributions() []Distribution {
	return []Distribution{{"ttft", "ms", r.TTFTs}, {"tpot", "ms", r.TPOTs}, {"e2el", "ms", r.E2Els}}
}

// RunOffline generates the workload with l.Generate after a one-request
// warm-up and reports its throughput (generated tokens over wall time, as
// nano-vllm) and per-request latencies. Each prompt has its own max_tokens,
// so each is one Generate call; all are submitted at once.
func RunOffline(ctx context.Context, l *llm.LLM, o OfflineOptions) (*OfflineResult, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if n, limit := o.MaxInputLen+o.MaxOutputLen, l.MaxModelLen(); n > limit {
		return nil, fmt.Errorf("bench: offline: the longest request, %d input + %d output tokens, is past max_model_len %d: lower the lengths or raise --max-model-len",
			o.MaxInputLen, o.MaxOutputLen, limit)
	}
	maxID := min(o.MaxTokenID, l.Model().Config().VocabSize)
	rng := rand.New(rand.NewPCG(o.Seed, 0xbe7c4))
	prompts := make([]llm.Prompt, o.NumSeqs)
	params := make([]engine.SamplingParams, o.NumSeqs)
	for i := range prompts {
		ids := make([]int, o.MinInputLen+rng.IntN(o.MaxInputLen-o.MinInputLen+1))
		for j := range ids {
			ids[j] = rng.IntN(maxID)
		}
		prompts[i] = llm.Prompt{IDs: ids}
		p := engine.DefaultSamplingParams()
		p.Temperature = o.Temperature
		p.IgnoreEOS = true
		p.MaxTokens = o.MinOutputLen + rng.IntN(o.MaxOutputLen-o.MinOutputLen+1)
		params[i] = p
	}
	warm := engine.DefaultSamplingParams()
	warm.Temperature = o.Temperature
	warm.MaxTokens = 2
	if _, err := l.Generate(ctx, []llm.Prompt{{IDs: []int{0, 1, 2}}}, warm, nil); err != nil {
		return nil, fmt.Errorf("bench: offline: warm-up: %w", err)
	}

	results := make([]llm.Completion, o.NumSeqs)
	errs := make([]error, o.NumSeqs)
	var wg sync.WaitGroup
	bar := newProgress(o.Progress, o.NumSeqs, "offline", "seq") // its clock starts with the workload
	onToken := func(out engine.RequestOutput) {
		if out.Finished {
			bar.add()
		}
	}
	start := time.Now()
	for i := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := l.Generate(ctx, prompts[i:i+1], params[i], onToken)
			if len(res) == 1 {
				results[i] = res[0]
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	bar.finish()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bench: offline: %w", err)
	}

	r := &OfflineResult{Mode: "offline", NumRequests: o.NumSeqs, DurationSeconds: wall.Seconds()}
	for i, c := range results {
		out := c.Outputs[0]
		if out.Err != nil || out.FinishReason == engine.FinishError || out.FinishReason == engine.FinishAbort {
			r.Failed++
			continue
		}
		r.TotalInputTokens += len(prompts[i].IDs)
		n := len(out.TokenIDs)
		r.TotalOutputTokens += n
		ttft := ms(out.TTFT)
		r.TTFTs = append(r.TTFTs, ttft)
		r.E2Els = append(r.E2Els, ms(out.Latency))
		if n > 1 {
			r.TPOTs = append(r.TPOTs, (ms(out.Latency)-ttft)/float64(n-1))
		}
	}
	secs := wall.Seconds()
	r.RequestThroughput = float64(o.NumSeqs-r.Failed) / secs
	r.OutputThroughput = float64(r.TotalOutputTokens) / secs
	r.TotalThroughput = float64(r.TotalInputTokens+r.TotalOutputTokens) / secs
	r.TTFTMillis, r.TPOTMillis, r.E2EMillis = Summarize(r.TTFTs), Summarize(r.TPOTs), Summarize(r.E2Els)
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
