package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/stages"
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
	// Workload is WorkloadRandom ("" too), WorkloadProse or
	// WorkloadEditing. The text workloads cut their passages from the
	// held-out corpus (Corpus), MinInputLen..MaxInputLen tokens long, and
	// need the model's tokenizer; MaxTokenID is random's only.
	Workload string
	// Progress receives a progress bar over finished sequences, with their
	// rate since the start, ended by a newline when the run ends; nil:
	// none.
	Progress io.Writer
}

// DefaultOffline returns nano-vllm's workload, sampled greedily.
func DefaultOffline() OfflineOptions {
	return OfflineOptions{NumSeqs: 256, MinInputLen: 100, MaxInputLen: 1024, MinOutputLen: 100, MaxOutputLen: 1024, Temperature: 0, MaxTokenID: 10000,
		Workload: WorkloadRandom}
}

// DefaultTextOffline returns the defaults of a text workload (WorkloadProse,
// WorkloadEditing): 16 passages of 128..256 tokens, each generating 64..128
// tokens with ignore_eos, greedily. An editing prompt is about 1.3 times
// its passage; its continuation repeats the other three quarters of the
// passage, 96..192 tokens.
func DefaultTextOffline(workload string) OfflineOptions {
	o := DefaultOffline()
	o.Workload, o.NumSeqs = workload, 16
	o.MinInputLen, o.MaxInputLen, o.MinOutputLen, o.MaxOutputLen = 128, 256, 64, 128
	return o
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
	case o.Workload != "" && !slices.Contains(Workloads, o.Workload):
		return fmt.Errorf("bench: offline: workload must be one of %s, got %q", strings.Join(Workloads, ", "), o.Workload)
	}
	return nil
}

// OfflineResult is the report of an offline run. Times are in
// milliseconds, throughputs per second of wall time.
type OfflineResult struct {
	Mode              string  `json:"mode"`
	Workload          string  `json:"workload"`
	Backend           string  `json:"backend"` // the kernels, as the stats line names them: "cpu(avx2, 2 threads)"
	Weights           string  `json:"weights"` // the weights' dtypes, most bytes first: "BF16", "F8_E4M3+BF16"
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
	// Speculative is the run's drafting (the warm-up's left out) when the
	// engine speculates; nil otherwise.
	Speculative *SpecSummary `json:"speculative,omitempty"`
	// StepTimes are the run's steps by kind and the loop's mean time for
	// each (the warm-up's left out): on CUDA, decode steps replay graphs
	// and steps carrying prompt chunks run eagerly.
	StepTimes stages.StepTimes `json:"step_times"`

	outputs [][]int // each request's output token ids, in prompt order
}

// Distributions are the result's samples for WritePlots.
func (r *OfflineResult) Distributions() []Distribution {
	return []Distribution{{"ttft", "ms", r.TTFTs}, {"tpot", "ms", r.TPOTs}, {"e2el", "ms", r.E2Els}}
}

// RunOffline generates the workload with l.Generate after a short warm-up
// and reports its throughput (generated tokens over wall time, as
// nano-vllm) and per-request latencies. Each prompt has its own max_tokens,
// so each is one Generate call; all are submitted at once.
func RunOffline(ctx context.Context, l *llm.LLM, o OfflineOptions) (*OfflineResult, error) {
	w, err := buildOffline(l, o)
	if err != nil {
		return nil, err
	}
	return runOffline(ctx, l, w, o.Progress, "offline")
}

// offlineWorkload is the requests of an offline run, built once and run on
// any number of engines of the same model.
type offlineWorkload struct {
	name    string
	prompts []llm.Prompt
	params  []engine.SamplingParams
}

// buildOffline draws o's requests: random token ids, or the text
// workloads' prompts tokenized by l's tokenizer. It fails when a request
// would pass l's max_model_len.
func buildOffline(l *llm.LLM, o OfflineOptions) (*offlineWorkload, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	w := &offlineWorkload{name: o.Workload, prompts: make([]llm.Prompt, o.NumSeqs), params: make([]engine.SamplingParams, o.NumSeqs)}
	if w.name == "" {
		w.name = WorkloadRandom
	}
	limit := l.MaxModelLen()
	rng := rand.New(rand.NewPCG(o.Seed, 0xbe7c4))
	if w.name == WorkloadRandom {
		if n := o.MaxInputLen + o.MaxOutputLen; n > limit {
			return nil, fmt.Errorf("bench: offline: the longest request, %d input + %d output tokens, is past max_model_len %d: lower the lengths or raise --max-model-len",
				o.MaxInputLen, o.MaxOutputLen, limit)
		}
		maxID := min(o.MaxTokenID, l.Model().Config().VocabSize)
		for i := range w.prompts {
			ids := make([]int, o.MinInputLen+rng.IntN(o.MaxInputLen-o.MinInputLen+1))
			for j := range ids {
				ids[j] = rng.IntN(maxID)
			}
			w.prompts[i] = llm.Prompt{IDs: ids}
		}
	} else {
		tok := l.Tokenizer()
		if tok == nil {
			return nil, fmt.Errorf("bench: offline: the %s workload needs the model's tokenizer; the model has none", w.name)
		}
		to := TextWorkloadOptions{NumPrompts: o.NumSeqs, MinLen: o.MinInputLen, MaxLen: o.MaxInputLen, Seed: o.Seed,
			Count: func(s string) int { return len(tok.Encode(s, false)) }}
		build := ProsePrompts
		if w.name == WorkloadEditing {
			build = EditingPrompts
		}
		texts, err := build(to)
		if err != nil {
			return nil, err
		}
		for i, t := range texts {
			w.prompts[i] = llm.Prompt{IDs: tok.Encode(t.Text, true)}
		}
	}
	for i := range w.params {
		p := engine.DefaultSamplingParams()
		p.Temperature = o.Temperature
		p.IgnoreEOS = true
		p.MaxTokens = o.MinOutputLen + rng.IntN(o.MaxOutputLen-o.MinOutputLen+1)
		w.params[i] = p
		if n := len(w.prompts[i].IDs) + p.MaxTokens; n > limit {
			return nil, fmt.Errorf("bench: offline: request %d, %d prompt + %d output tokens, is past max_model_len %d: lower the lengths or raise --max-model-len",
				i, len(w.prompts[i].IDs), p.MaxTokens, limit)
		}
	}
	return w, nil
}

// runOffline runs w on l as RunOffline describes; label names the progress
// bar.
func runOffline(ctx context.Context, l *llm.LLM, w *offlineWorkload, progressTo io.Writer, label string) (*OfflineResult, error) {
	n := len(w.prompts)
	// The warm-up repeats itself, so that prompt lookup drafts too.
	warm := engine.DefaultSamplingParams()
	warm.Temperature = w.params[0].Temperature
	warm.MaxTokens = 4
	if _, err := l.Generate(ctx, []llm.Prompt{{IDs: []int{0, 1, 2, 1, 2, 1, 2}}}, warm, nil); err != nil {
		return nil, fmt.Errorf("bench: offline: warm-up: %w", err)
	}

	spec0, times0 := l.StepStats().Spec(), l.StepStats().StepTimes()
	bar := newProgress(progressTo, n, label, "seq") // its clock starts with the workload
	onToken := func(out engine.RequestOutput) {
		if out.Finished {
			bar.add()
		}
	}
	// The requests arrive in order, all at once (vLLM's offline
	// benchmark), so that a run repeats itself: which of two prompts with a
	// common prefix finds it in the prefix cache depends on the order.
	start := time.Now()
	results, err := l.GenerateEach(ctx, w.prompts, w.params, onToken)
	wall := time.Since(start)
	bar.finish()
	if err != nil {
		return nil, fmt.Errorf("bench: offline: %w", err)
	}

	r := &OfflineResult{Mode: "offline", Workload: w.name, Backend: l.Backend().Name(), Weights: models.WeightFormat(l.Model()), NumRequests: n, DurationSeconds: wall.Seconds()}
	r.outputs = make([][]int, n)
	for i, c := range results {
		out := c.Outputs[0]
		r.outputs[i] = out.TokenIDs
		if out.Err != nil || out.FinishReason == engine.FinishError || out.FinishReason == engine.FinishAbort {
			r.Failed++
			continue
		}
		r.TotalInputTokens += len(w.prompts[i].IDs)
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
	r.RequestThroughput = float64(n-r.Failed) / secs
	r.OutputThroughput = float64(r.TotalOutputTokens) / secs
	r.TotalThroughput = float64(r.TotalInputTokens+r.TotalOutputTokens) / secs
	r.TTFTMillis, r.TPOTMillis, r.E2EMillis = Summarize(r.TTFTs), Summarize(r.TPOTs), Summarize(r.E2Els)
	r.StepTimes = l.StepStats().StepTimes().Sub(times0)
	if sp := l.Config().Speculative; sp.Enabled() {
		r.Speculative = newSpecSummary(sp.Method, sp.NumSpeculativeTokens, l.StepStats().Spec().Sub(spec0))
	}
	return r, nil
}

// SpecSummary is speculative decoding over a run: vLLM's spec-decode
// metrics (see stages.SpecStats).
type SpecSummary struct {
	Method               string `json:"method"`
	NumSpeculativeTokens int    `json:"num_speculative_tokens"`
	NumDrafts            int64  `json:"num_drafts"`
	NumDraftTokens       int64  `json:"num_draft_tokens"`
	NumAcceptedTokens    int64  `json:"num_accepted_tokens"`
	// AcceptanceRate is the share of draft tokens accepted;
	// MeanAcceptedLength the tokens a sequence emits per verify step (1 +
	// accepted per draft); both 0 when nothing was drafted.
	AcceptanceRate       float64   `json:"acceptance_rate"`
	MeanAcceptedLength   float64   `json:"mean_accepted_length"`
	PerPosAcceptanceRate []float64 `json:"per_position_acceptance_rate"`
	// DraftLimitShares[l] is the share of steps with decode rows that the
	// adaptive draft-length controller planned with a limit of l drafts
	// (nil without the controller): how much of the run drafted at all.
	DraftLimitShares []float64 `json:"draft_limit_shares,omitempty"`
}

func newSpecSummary(method string, k int, sp stages.SpecStats) *SpecSummary {
	return &SpecSummary{
		Method: method, NumSpeculativeTokens: k,
		NumDrafts: sp.NumDrafts, NumDraftTokens: sp.NumDraftTokens, NumAcceptedTokens: sp.NumAcceptedTokens,
		AcceptanceRate: sp.AcceptanceRate(), MeanAcceptedLength: sp.MeanAcceptedLength(), PerPosAcceptanceRate: sp.PerPosAcceptanceRate(),
		DraftLimitShares: sp.LimitShares(),
	}
}

// LimitsString writes DraftLimitShares as the stats line does
// (stages.LimitSharesString); empty without them.
func (s *SpecSummary) LimitsString() string {
	if s == nil {
		return ""
	}
	return stages.LimitSharesString(s.DraftLimitShares)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
