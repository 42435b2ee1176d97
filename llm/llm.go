package llm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
)

// LLM is the offline API: generate completions for a batch of prompts.
type LLM struct {
	*Engine
	nextID atomic.Int64
}

// New LLM starts an engine for cfg (see New).
func NewLLM(cfg *config.Config, opts Options) (*LLM, error) {
	e, err := New(cfg, opts)
	if err != nil {
		return nil, err
	}
	return &LLM{Engine: e}, nil
}

// Prompt is one input: text, or token ids when IDs is non-empty.
type Prompt struct {
	Text string
	IDs  []int
}

// Completion is the whole answer to one prompt.
type Completion struct {
	RequestID       string
	PromptTokenIDs  []int
	PromptLogprobs  []engine.TokenLogprobs // PromptLogprobs[i] scores prompt token i+1
	NumCachedTokens int
	Outputs         []CompletionOutput // one per sequence (n)
}

// CompletionOutput is one generated sequence.
type CompletionOutput struct {
	Index        int
	Text         string
	TokenIDs     []int
	Logprobs     []engine.TokenLogprobs
	FinishReason engine.FinishReason
	StopReason   string
	Err          error
	// TTFT is the time from arrival to the first token; Latency to the end.
	TTFT, Latency time.Duration
}

// Generate runs every prompt with params and returns their completions in
// prompt order. It returns when all are finished or ctx ends (the rest are
// aborted). A request that fails alone has Err set on its outputs.
// onToken, when non-nil, sees every output increment as it is produced.
func (l *LLM) Generate(ctx context.Context, prompts []Prompt, params engine.SamplingParams, onToken func(engine.RequestOutput)) ([]Completion, error) {
	return l.generate(ctx, prompts, func(int) engine.SamplingParams { return params }, onToken)
}

// GenerateEach is Generate with params[i] for prompts[i] (vLLM's
// LLM.generate with a list of sampling parameters). The requests arrive
// in prompt order, so that a run repeats itself: which of two prompts
// with a common prefix finds it cached, for one, depends on that order.
func (l *LLM) GenerateEach(ctx context.Context, prompts []Prompt, params []engine.SamplingParams, onToken func(engine.RequestOutput)) ([]Completion, error) {
	if len(params) != len(prompts) {
		return nil, fmt.Errorf("llm: generate: %d prompts but %d sampling parameters: want one for each prompt", len(prompts), len(params))
	}
	return l.generate(ctx, prompts, func(i int) engine.SamplingParams { return params[i] }, onToken)
}

func (l *LLM) generate(ctx context.Context, prompts []Prompt, paramsOf func(int) engine.SamplingParams, onToken func(engine.RequestOutput)) ([]Completion, error) {
	results := make([]Completion, len(prompts))
	var mu sync.Mutex
	var wg sync.WaitGroup
	ids := make([]string, len(prompts))
	for i, p := range prompts {
		params := paramsOf(i)
		n := max(1, params.N)
		id := "gen-" + strconv.FormatInt(l.nextID.Add(1), 10)
		ids[i] = id
		results[i] = Completion{RequestID: id, Outputs: make([]CompletionOutput, n)}
		for j := range results[i].Outputs {
			results[i].Outputs[j].Index = j
		}
		wg.Add(n)
		res := &results[i]
		req := &engine.Request{
			ID: id, Prompt: p.Text, PromptTokenIDs: p.IDs, Params: params, Arrival: time.Now(),
			OnOutput: func(o engine.RequestOutput) {
				mu.Lock()
				if o.PromptTokenIDs != nil {
					res.PromptTokenIDs = o.PromptTokenIDs
					res.PromptLogprobs = o.PromptLogprobs
				}
				if o.NumCachedTokens > 0 {
					res.NumCachedTokens = o.NumCachedTokens
				}
				if o.Index >= 0 && o.Index < len(res.Outputs) {
					out := &res.Outputs[o.Index]
					out.Text += o.Text
					out.TokenIDs = append(out.TokenIDs, o.TokenIDs...)
					out.Logprobs = append(out.Logprobs, o.Logprobs...)
					if !o.FirstTokenTime.IsZero() && out.TTFT == 0 {
						out.TTFT = o.FirstTokenTime.Sub(o.ArrivalTime)
					}
					if o.Finished {
						out.FinishReason, out.StopReason, out.Err = o.FinishReason, o.StopReason, o.Err
						out.Latency = o.FinishTime.Sub(o.ArrivalTime)
					}
				}
				mu.Unlock()
				if onToken != nil {
					onToken(o)
				}
				if o.Finished {
					wg.Done()
				}
			},
		}
		if err := l.AddRequestWait(ctx, req); errors.Is(err, engine.ErrInvalidRequest) {
			// This prompt alone fails; the others go on.
			for j := range res.Outputs {
				res.Outputs[j].Err, res.Outputs[j].FinishReason = err, engine.FinishError
			}
			wg.Add(-n)
			continue
		} else if err != nil {
			// Abort what was submitted; the rest never started.
			for _, id := range ids[:i] {
				l.Abort(id)
			}
			wg.Add(-n)
			wg.Wait()
			return results, err
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return results, l.FlushInflight(ctx)
	case <-ctx.Done():
		for _, id := range ids {
			l.Abort(id)
		}
		<-done
		return results, ctx.Err()
	}
}
