package sampling

import (
	"errors"
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// Sentinel errors. Errors from this package wrap one of them (or
// kernels.ErrOutOfRange for a token id outside the vocabulary) with the
// field or value at fault.
var (
	// ErrInvalidParams: a Params field is outside its range.
	ErrInvalidParams = errors.New("invalid sampling params")
	// ErrInvalidLogits: the row is empty or holds NaN or +Inf.
	ErrInvalidLogits = errors.New("invalid logits")
	// ErrNoCandidates: every token of the row is -Inf after masking, bias
	// and penalties, so there is nothing to sample.
	ErrNoCandidates = errors.New("no token left to sample")
)

// GreedyEpsilon is the temperature under which sampling is greedy (argmax),
// as vLLM's _SAMPLING_EPS.
const GreedyEpsilon = 1e-5

// Params are the per-row sampling settings, with vLLM's meanings. The engine
// converts a request's SamplingParams into a Params (and, per step, sets
// Masked). Start from DefaultParams: the zero value is not valid (its TopP and
// RepetitionPenalty are 0). Sample only reads a Params.
type Params struct {
	// Temperature divides the logits before filtering; below GreedyEpsilon
	// (0 included) sampling is greedy and TopK, TopP and MinP are ignored.
	// Must be finite and >= 0.
	Temperature float32
	// TopK keeps the tokens whose (temperature-scaled) logit is at least the
	// K-th largest one, so ties with the K-th token are kept, as vLLM does.
	// 0 or -1 disables it; K >= vocabulary size keeps everything.
	TopK int
	// TopP keeps the smallest prefix of the tokens sorted by probability
	// (ties by lower id first) whose mass reaches TopP: a token is kept when
	// the mass of the tokens before it is below TopP. In (0, 1]; 1 disables it.
	TopP float32
	// MinP drops the tokens whose probability is below MinP times the most
	// likely token's, after temperature. In [0, 1]; 0 disables it.
	MinP float32
	// RepetitionPenalty applies to every token present in the prompt or the
	// output: a positive logit is divided by it, a negative one multiplied.
	// Must be > 0; 1 disables it.
	RepetitionPenalty float32
	// PresencePenalty is subtracted once from the logit of each token present
	// in the output (OpenAI semantics). Must be finite; 0 disables it.
	PresencePenalty float32
	// FrequencyPenalty times the number of occurrences of a token in the
	// output is subtracted from its logit. Must be finite; 0 disables it.
	FrequencyPenalty float32
	// LogitBias adds a bias to the logit of a token id, before the penalties.
	// Ids must lie in the vocabulary; biases must be finite.
	LogitBias map[int32]float32
	// Masked token ids are set to -Inf at this step (the stop and EOS ids while
	// the output is shorter than min_tokens, banned words): after the raw
	// logprobs are taken and before the bias, as vLLM's min-tokens processor.
	// Ids must lie in the vocabulary.
	Masked []int32
	// Seed keys the random stream of the request: the draw for output
	// position step is a function of (Seed, step) only. The engine assigns a
	// seed at admission to requests that set none. Rows that share a seed and
	// logits draw the same tokens: each child of an n > 1 request needs its
	// own seed.
	Seed uint64
	// Seeded records that the request set Seed itself. The host sampler
	// draws from the keyed stream either way; the flag tells a caller or a
	// device sampler that this row's stream must be reproduced exactly
	// (vLLM gives such requests their own generator).
	Seeded bool
	// Logprobs asks for Result.Logprob and Result.Rank of the sampled token
	// and for NumLogprobs top entries in Result.Top.
	Logprobs bool
	// NumLogprobs is the number of most likely tokens reported in Result.Top
	// (>= 0; > 0 only with Logprobs). Values above the vocabulary size are
	// clamped to it.
	NumLogprobs int
}

// DefaultParams returns vLLM's defaults: temperature 1, no top-k, top-p or
// min-p filtering, no penalties, no bias, no logprobs, seed 0.
func DefaultParams() Params {
	return Params{Temperature: 1, TopP: 1, RepetitionPenalty: 1}
}

// Greedy reports whether p reduces to argmax (Temperature < GreedyEpsilon).
func (p *Params) Greedy() bool { return p.Temperature < GreedyEpsilon }

// hasPenalties reports whether any penalty changes the logits.
func (p *Params) hasPenalties() bool {
	return p.RepetitionPenalty != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0
}

// topKActive reports whether top-k filters a row of vocabSize tokens.
func (p *Params) topKActive(vocabSize int) bool { return p.TopK > 0 && p.TopK < vocabSize }

// Validate checks every field for a vocabulary of vocabSize tokens (> 0) and
// returns the first violation, naming the field, wrapping ErrInvalidParams
// (or kernels.ErrOutOfRange for a token id). Cost: O(len(LogitBias) +
// len(Masked)).
func (p *Params) Validate(vocabSize int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("sampling: params: "+format+": %w", append(args, ErrInvalidParams)...)
	}
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	switch {
	case vocabSize <= 0:
		return bad("vocabulary size must be > 0, got %d", vocabSize)
	case !finite(p.Temperature) || p.Temperature < 0:
		return bad("temperature must be finite and >= 0, got %v", p.Temperature)
	case p.TopK < -1:
		return bad("top_k must be -1 or 0 (disabled) or >= 1, got %d", p.TopK)
	case !finite(p.TopP) || p.TopP <= 0 || p.TopP > 1:
		return bad("top_p must be in (0, 1], got %v", p.TopP)
	case !finite(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return bad("min_p must be in [0, 1], got %v", p.MinP)
	case !finite(p.RepetitionPenalty) || p.RepetitionPenalty <= 0:
		return bad("repetition_penalty must be finite and > 0, got %v", p.RepetitionPenalty)
	case !finite(p.PresencePenalty):
		return bad("presence_penalty must be finite, got %v", p.PresencePenalty)
	case !finite(p.FrequencyPenalty):
		return bad("frequency_penalty must be finite, got %v", p.FrequencyPenalty)
	case p.NumLogprobs < 0:
		return bad("num_logprobs must be >= 0, got %d", p.NumLogprobs)
	case p.NumLogprobs > 0 && !p.Logprobs:
		return bad("num_logprobs is %d but logprobs is off", p.NumLogprobs)
	}
	for id, bias := range p.LogitBias {
		if id < 0 || int(id) >= vocabSize {
			return fmt.Errorf("sampling: params: logit_bias token id %d not in [0, %d): %w", id, vocabSize, kernels.ErrOutOfRange)
		}
		if !finite(bias) {
			return bad("logit_bias[%d] must be finite, got %v", id, bias)
		}
	}
	for i, id := range p.Masked {
		if id < 0 || int(id) >= vocabSize {
			return fmt.Errorf("sampling: params: masked[%d] = %d not in [0, %d): %w", i, id, vocabSize, kernels.ErrOutOfRange)
		}
	}
	return nil
}

// TokenLogprob is one entry of a logprobs list.
type TokenLogprob struct {
	Token   int32
	Logprob float32
}

// Result is the outcome of sampling one row.
type Result struct {
	// Token is the sampled token id.
	Token int32
	// Logprob is Token's log-probability under the raw distribution (see
	// Sample); 0 unless Params.Logprobs.
	Logprob float32
	// Rank is the number of tokens whose raw logprob is >= Token's (1 for
	// the most likely token; ties count), as vLLM's; 0 unless Params.Logprobs.
	Rank int
	// Top holds the NumLogprobs most likely tokens of the raw distribution,
	// by logprob descending, ties by lower id. It aliases the Scratch passed
	// to Sample and is overwritten by the next call that uses it.
	Top []TokenLogprob
}
