package engine

import (
	"errors"
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/kernels/sampling"
)

// ErrInvalidRequest is wrapped by every error that rejects a request at the
// door: bad sampling parameters, an empty prompt, token ids outside the
// vocabulary, a prompt longer than the model's context.
var ErrInvalidRequest = errors.New("invalid request")

// MaxLogprobs is the largest number of log-probabilities a request may ask
// for per position (SamplingParams.Logprobs and PromptLogprobs), as vLLM's
// default max_logprobs.
const MaxLogprobs = 20

// MaxLogitBias is the largest absolute value of one logit_bias entry (the
// OpenAI API's range).
const MaxLogitBias = 100

// SamplingParams are the per-request decoding settings, with vLLM's names
// and meanings. Start from DefaultSamplingParams: the zero value is not the
// default (its MaxTokens and TopP are invalid). A SamplingParams handed to
// the Scheduler is copied and never changed afterwards; the copy is shared,
// read-only, with the sequences of the request and the metadata of each
// step.
type SamplingParams struct {
	// N is the number of output sequences generated for the prompt (>= 1).
	// The children share the prompt's KV blocks (see Scheduler).
	N int
	// Temperature scales the logits; 0 means greedy (>= 0).
	Temperature float32
	// TopP keeps the smallest set of tokens whose probability mass reaches
	// TopP, in (0, 1]; 1 disables it.
	TopP float32
	// TopK keeps the K most likely tokens; 0 or -1 disables it (vLLM's
	// two spellings of "off"), otherwise >= 1.
	TopK int
	// MinP drops tokens whose probability is below MinP times the most
	// likely token's, in [0, 1]; 0 disables it.
	MinP float32
	// RepetitionPenalty divides positive (multiplies negative) logits of
	// tokens seen in the prompt or output; 1 disables it (> 0).
	RepetitionPenalty float32
	// PresencePenalty is subtracted once from the logit of every token
	// present in the output, in [-2, 2].
	PresencePenalty float32
	// FrequencyPenalty is subtracted from a token's logit once per
	// occurrence in the output, in [-2, 2].
	FrequencyPenalty float32
	// LogitBias adds a bias in [-100, 100] to the logit of a token id.
	LogitBias map[int]float32
	// Seed makes sampling reproducible for the request; nil means random.
	Seed *int64
	// MaxTokens is the largest number of output tokens (>= 1).
	MaxTokens int
	// MinTokens is the number of output tokens generated before EOS or a
	// stop token may end the sequence, in [0, MaxTokens].
	MinTokens int
	// IgnoreEOS keeps generating after the EOS token.
	IgnoreEOS bool
	// Stop strings end the sequence when they appear in the output text;
	// they are checked by post-processing, not by the Scheduler.
	Stop []string
	// StopTokenIDs end the sequence when sampled (the token is kept in the
	// output).
	StopTokenIDs []int
	// Logprobs is the number of log-probabilities returned per output
	// token, in [0, MaxLogprobs]; nil returns none. The sampled token's own
	// log-probability is always included when non-nil.
	Logprobs *int
	// PromptLogprobs is the number of log-probabilities returned per
	// prompt token, in [0, MaxLogprobs]; nil returns none. Requests that ask
	// for them bypass the prefix cache (a cached prefix has no logits).
	PromptLogprobs *int
	// SkipSpecialTokens drops special tokens from the output text.
	SkipSpecialTokens bool
	// StructuredOutput, when not nil, constrains the output to a JSON
	// schema, regular expression, choice or grammar (see StructuredOutput).
	StructuredOutput *StructuredOutput
}

// DefaultSamplingParams returns vLLM's defaults: one sequence, temperature 1,
// no top-p/top-k/min-p filtering, no penalties, 16 output tokens, special
// tokens skipped.
func DefaultSamplingParams() SamplingParams {
	return SamplingParams{
		N:                 1,
		Temperature:       1,
		TopP:              1,
		TopK:              0,
		MinP:              0,
		RepetitionPenalty: 1,
		MaxTokens:         16,
		SkipSpecialTokens: true,
	}
}

// Greedy reports whether sampling reduces to argmax (temperature ~ 0).
func (p *SamplingParams) Greedy() bool { return p.Temperature < sampling.GreedyEpsilon }

// Validate checks every field against its allowed range. vocabSize is the
// model's vocabulary size; token ids in LogitBias and StopTokenIDs must lie
// in [0, vocabSize). A vocabSize <= 0 skips the token-id checks. The first
// violation is returned, naming the field and its range, and wraps
// ErrInvalidRequest. Cost: O(len(LogitBias) + len(StopTokenIDs) + len(Stop)).
func (p *SamplingParams) Validate(vocabSize int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: sampling params: "+format, append([]any{ErrInvalidRequest}, args...)...)
	}
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	switch {
	case p.N < 1:
		return bad("n must be >= 1, got %d", p.N)
	case !finite(p.Temperature) || p.Temperature < 0:
		return bad("temperature must be >= 0, got %v", p.Temperature)
	case !finite(p.TopP) || p.TopP <= 0 || p.TopP > 1:
		return bad("top_p must be in (0, 1], got %v", p.TopP)
	case p.TopK < -1:
		return bad("top_k must be -1 or 0 (disabled) or >= 1, got %d", p.TopK)
	case !finite(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return bad("min_p must be in [0, 1], got %v", p.MinP)
	case !finite(p.RepetitionPenalty) || p.RepetitionPenalty <= 0:
		return bad("repetition_penalty must be > 0, got %v", p.RepetitionPenalty)
	case !finite(p.PresencePenalty) || p.PresencePenalty < -2 || p.PresencePenalty > 2:
		return bad("presence_penalty must be in [-2, 2], got %v", p.PresencePenalty)
	case !finite(p.FrequencyPenalty) || p.FrequencyPenalty < -2 || p.FrequencyPenalty > 2:
		return bad("frequency_penalty must be in [-2, 2], got %v", p.FrequencyPenalty)
	case p.MaxTokens < 1:
		return bad("max_tokens must be >= 1, got %d", p.MaxTokens)
	case p.MinTokens < 0:
		return bad("min_tokens must be >= 0, got %d", p.MinTokens)
	case p.MinTokens > p.MaxTokens:
		return bad("min_tokens must be <= max_tokens (%d), got %d", p.MaxTokens, p.MinTokens)
	case p.Logprobs != nil && (*p.Logprobs < 0 || *p.Logprobs > MaxLogprobs):
		return bad("logprobs must be in [0, %d], got %d", MaxLogprobs, *p.Logprobs)
	case p.PromptLogprobs != nil && (*p.PromptLogprobs < 0 || *p.PromptLogprobs > MaxLogprobs):
		return bad("prompt_logprobs must be in [0, %d], got %d", MaxLogprobs, *p.PromptLogprobs)
	}
	for id, bias := range p.LogitBias {
		if vocabSize > 0 && (id < 0 || id >= vocabSize) {
			return bad("logit_bias token id must be in [0, %d), got %d", vocabSize, id)
		}
		if !finite(bias) || bias < -MaxLogitBias || bias > MaxLogitBias {
			return bad("logit_bias[%d] must be in [-%d, %d], got %v", id, MaxLogitBias, MaxLogitBias, bias)
		}
	}
	for i, id := range p.StopTokenIDs {
		if vocabSize > 0 && (id < 0 || id >= vocabSize) {
			return bad("stop_token_ids[%d] must be in [0, %d), got %d", i, vocabSize, id)
		}
	}
	for i, s := range p.Stop {
		if s == "" {
			return bad("stop[%d] must not be empty", i)
		}
	}
	return p.StructuredOutput.Validate()
}

// clone returns a deep copy, so that the caller's maps and slices can change
// without touching the scheduled request.
func (p *SamplingParams) clone() *SamplingParams {
	c := *p
	if p.LogitBias != nil {
		c.LogitBias = make(map[int]float32, len(p.LogitBias))
		for k, v := range p.LogitBias {
			c.LogitBias[k] = v
		}
	}
	if p.Seed != nil {
		s := *p.Seed
		c.Seed = &s
	}
	if p.Logprobs != nil {
		n := *p.Logprobs
		c.Logprobs = &n
	}
	if p.PromptLogprobs != nil {
		n := *p.PromptLogprobs
		c.PromptLogprobs = &n
	}
	c.Stop = append([]string(nil), p.Stop...)
	c.StopTokenIDs = append([]int(nil), p.StopTokenIDs...)
	c.StructuredOutput = p.StructuredOutput.clone()
	return &c
}
