package engine

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestSamplingParamsValidate(t *testing.T) {
	intp := func(v int) *int { return &v }
	nan := float32(math.NaN())
	cases := []struct {
		name string
		mod  func(*SamplingParams)
		want string // "" means valid; otherwise a substring of the error
	}{
		{"defaults", func(p *SamplingParams) {}, ""},
		{"greedy", func(p *SamplingParams) { p.Temperature = 0 }, ""},
		{"top_k -1", func(p *SamplingParams) { p.TopK = -1 }, ""},
		{"top_k 40", func(p *SamplingParams) { p.TopK = 40 }, ""},
		{"everything set", func(p *SamplingParams) {
			p.N, p.TopP, p.MinP, p.RepetitionPenalty = 3, 0.9, 0.05, 1.2
			p.PresencePenalty, p.FrequencyPenalty = -2, 2
			p.LogitBias = map[int]float32{0: -100, 99: 100}
			p.MaxTokens, p.MinTokens = 10, 10
			p.StopTokenIDs = []int{0, 99}
			p.Stop = []string{"\n\n"}
			p.Logprobs, p.PromptLogprobs = intp(0), intp(MaxLogprobs)
		}, ""},
		{"n", func(p *SamplingParams) { p.N = 0 }, "n must be >= 1, got 0"},
		{"temperature", func(p *SamplingParams) { p.Temperature = -0.1 }, "temperature must be >= 0"},
		{"temperature NaN", func(p *SamplingParams) { p.Temperature = nan }, "temperature must be >= 0"},
		{"top_p 0", func(p *SamplingParams) { p.TopP = 0 }, "top_p must be in (0, 1], got 0"},
		{"top_p above 1", func(p *SamplingParams) { p.TopP = 1.5 }, "top_p must be in (0, 1]"},
		{"top_k", func(p *SamplingParams) { p.TopK = -2 }, "top_k must be -1 or 0 (disabled) or >= 1, got -2"},
		{"min_p", func(p *SamplingParams) { p.MinP = 1.01 }, "min_p must be in [0, 1]"},
		{"min_p negative", func(p *SamplingParams) { p.MinP = -0.5 }, "min_p must be in [0, 1]"},
		{"repetition_penalty", func(p *SamplingParams) { p.RepetitionPenalty = 0 }, "repetition_penalty must be > 0"},
		{"presence_penalty", func(p *SamplingParams) { p.PresencePenalty = 2.5 }, "presence_penalty must be in [-2, 2]"},
		{"frequency_penalty", func(p *SamplingParams) { p.FrequencyPenalty = -2.5 }, "frequency_penalty must be in [-2, 2]"},
		{"frequency_penalty NaN", func(p *SamplingParams) { p.FrequencyPenalty = nan }, "frequency_penalty must be in [-2, 2]"},
		{"max_tokens", func(p *SamplingParams) { p.MaxTokens = 0 }, "max_tokens must be >= 1, got 0"},
		{"min_tokens negative", func(p *SamplingParams) { p.MinTokens = -1 }, "min_tokens must be >= 0"},
		{"min_tokens above max", func(p *SamplingParams) { p.MinTokens = 17 }, "min_tokens must be <= max_tokens (16), got 17"},
		{"logprobs", func(p *SamplingParams) { p.Logprobs = intp(-1) }, "logprobs must be in [0, 20], got -1"},
		{"logprobs max", func(p *SamplingParams) { p.Logprobs = intp(MaxLogprobs + 1) }, "logprobs must be in [0, 20], got 21"},
		{"prompt_logprobs", func(p *SamplingParams) { p.PromptLogprobs = intp(21) }, "prompt_logprobs must be in [0, 20]"},
		{"logit_bias id", func(p *SamplingParams) { p.LogitBias = map[int]float32{100: 1} }, "logit_bias token id must be in [0, 100), got 100"},
		{"logit_bias negative id", func(p *SamplingParams) { p.LogitBias = map[int]float32{-1: 1} }, "logit_bias token id"},
		{"logit_bias value", func(p *SamplingParams) { p.LogitBias = map[int]float32{5: 101} }, "logit_bias[5] must be in [-100, 100]"},
		{"stop_token_ids", func(p *SamplingParams) { p.StopTokenIDs = []int{1, 100} }, "stop_token_ids[1] must be in [0, 100), got 100"},
		{"stop", func(p *SamplingParams) { p.Stop = []string{"x", ""} }, "stop[1] must not be empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := DefaultSamplingParams()
			c.mod(&p)
			err := p.Validate(100)
			if c.want == "" {
				if err != nil {
					t.Fatalf("valid params rejected: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an ErrInvalidRequest containing %q", err, c.want)
			}
		})
	}
}

func TestSamplingParamsUnknownVocab(t *testing.T) {
	p := DefaultSamplingParams()
	p.LogitBias = map[int]float32{1 << 30: 1}
	p.StopTokenIDs = []int{1 << 30}
	if err := p.Validate(0); err != nil {
		t.Fatalf("vocab size 0 should skip token-id checks: %v", err)
	}
}

func TestSamplingParamsCloneIsDeep(t *testing.T) {
	p := DefaultSamplingParams()
	seed := int64(7)
	p.Seed = &seed
	p.LogitBias = map[int]float32{1: 2}
	p.StopTokenIDs = []int{3}
	seq := NewSequence("r", []int{1, 2}, p, zeroTime)
	p.LogitBias[1] = 50
	p.StopTokenIDs[0] = 9
	seed = 8
	got := seq.Params()
	if got.LogitBias[1] != 2 || got.StopTokenIDs[0] != 3 || *got.Seed != 7 {
		t.Fatalf("sequence params changed with the caller's: %+v", got)
	}
}

func ExampleSamplingParams_Validate() {
	p := DefaultSamplingParams()
	p.TopP = 1.5
	fmt.Println(p.Validate(32000))
	p.TopP = 0.9
	p.LogitBias = map[int]float32{32000: 5}
	fmt.Println(p.Validate(32000))
	// Output:
	// invalid request: sampling params: top_p must be in (0, 1], got 1.5
	// invalid request: sampling params: logit_bias token id must be in [0, 32000), got 32000
}
