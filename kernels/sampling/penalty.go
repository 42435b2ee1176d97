package sampling

import (
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// History is what the penalties of one row read: the token ids of the
// request's prompt and of its output so far. When Penalty is non-nil it is
// used instead of the two slices, which are then ignored. History is only
// read when a penalty is active (RepetitionPenalty != 1, PresencePenalty or
// FrequencyPenalty != 0).
type History struct {
	PromptTokenIDs []int32
	OutputTokenIDs []int32
	// Penalty holds incremental counts of the same tokens, so that long
	// histories are not rescanned at every step.
	Penalty *PenaltyState
}

// PenaltyState keeps, for one sequence, the set of prompt tokens and the
// number of occurrences of each output token, so that applying the penalties
// costs O(distinct tokens) instead of O(prompt + output). It is not safe for
// concurrent use; a forked sequence needs its own Clone.
type PenaltyState struct {
	prompt map[int32]struct{}
	output map[int32]int32
	// num_output_tokens counts every appended token, repeats included.
	numOutputTokens int
}

// NewPenaltyState returns the state of a sequence with the given prompt and
// no output yet. Ids are checked against the vocabulary when the state is
// applied. Cost: O(len(promptTokenIDs)).
func NewPenaltyState(promptTokenIDs []int32) *PenaltyState {
	s := &PenaltyState{
		prompt: make(map[int32]struct{}, len(promptTokenIDs)),
		output: make(map[int32]int32),
	}
	for _, t := range promptTokenIDs {
		s.prompt[t] = struct{}{}
	}
	return s
}

// AppendOutput records newly generated output tokens. Cost: O(len(ids)).
func (s *PenaltyState) AppendOutput(ids ...int32) {
	for _, t := range ids {
		s.output[t]++
	}
	s.numOutputTokens += len(ids)
}

// NumOutputTokens is the number of output tokens appended so far.
func (s *PenaltyState) NumOutputTokens() int { return s.numOutputTokens }

// Clone returns an independent copy (for a forked sequence).
// Cost: O(distinct tokens).
func (s *PenaltyState) Clone() *PenaltyState {
	c := &PenaltyState{
		prompt:          make(map[int32]struct{}, len(s.prompt)),
		output:          make(map[int32]int32, len(s.output)),
		numOutputTokens: s.numOutputTokens,
	}
	for t := range s.prompt {
		c.prompt[t] = struct{}{}
	}
	for t, n := range s.output {
		c.output[t] = n
	}
	return c
}

// MaskTokens sets logits[id] to -Inf for every id (a token that must not be
// sampled at this step, such as EOS while the output is shorter than
// min_tokens). Every id is checked before any logit is written; an id outside
// [0, len(logits)) is an error wrapping kernels.ErrOutOfRange.
// Cost: O(len(ids)).
//
// Masking before Sample also hides the tokens from the raw logprobs; vLLM
// takes the raw logprobs before its min-tokens mask, which Params.Masked
// reproduces.
func MaskTokens(logits []float32, ids []int32) error {
	for i, id := range ids {
		if id < 0 || int(id) >= len(logits) {
			return fmt.Errorf("sampling: mask: ids[%d] = %d not in [0, %d): %w", i, id, len(logits), kernels.ErrOutOfRange)
		}
	}
	negInf := float32(math.Inf(-1))
	for _, id := range ids {
		logits[id] = negInf
	}
	return nil
}

// applyBias adds p.LogitBias in place. Ids were validated.
func applyBias(logits []float32, p *Params) {
	for id, bias := range p.LogitBias {
		logits[id] += bias
	}
}

// penalize applies vLLM's penalties to one logit x: repetition (for a token
// of the prompt or the output), then frequency and presence (for a token of
// the output, count > 0), in float32 as vLLM does.
func penalize(x float32, p *Params, count int32) float32 {
	if p.RepetitionPenalty != 1 {
		if x > 0 {
			x /= p.RepetitionPenalty
		} else {
			x *= p.RepetitionPenalty
		}
	}
	if count > 0 {
		x -= p.FrequencyPenalty * float32(count)
		x -= p.PresencePenalty
	}
	return x
}

// applyPenalties applies the penalties of p in place from h. Each token is
// penalized once, from its own counts, so the result does not depend on the
// order in which the tokens are visited. Cost: O(distinct tokens) with a
// PenaltyState, O(len(prompt) + len(output)) otherwise.
func (s *Scratch) applyPenalties(logits []float32, p *Params, h History) error {
	vocabSize := len(logits)
	if st := h.Penalty; st != nil {
		for t := range st.prompt {
			if t < 0 || int(t) >= vocabSize {
				return fmt.Errorf("sampling: penalty state: prompt token id %d not in [0, %d): %w", t, vocabSize, kernels.ErrOutOfRange)
			}
		}
		for t := range st.output {
			if t < 0 || int(t) >= vocabSize {
				return fmt.Errorf("sampling: penalty state: output token id %d not in [0, %d): %w", t, vocabSize, kernels.ErrOutOfRange)
			}
		}
		for t := range st.prompt {
			if _, ok := st.output[t]; !ok {
				logits[t] = penalize(logits[t], p, 0)
			}
		}
		for t, n := range st.output {
			logits[t] = penalize(logits[t], p, n)
		}
		return nil
	}

	// Dense per-token marks in the scratch, cleared again before returning.
	s.growPenalty(vocabSize)
	s.touched = s.touched[:0]
	var err error
	mark := func(ids []int32, what string, isOutput bool) {
		for i, t := range ids {
			if t < 0 || int(t) >= vocabSize {
				err = fmt.Errorf("sampling: history: %s[%d] = %d not in [0, %d): %w", what, i, t, vocabSize, kernels.ErrOutOfRange)
				return
			}
			if !s.seen[t] {
				s.seen[t] = true
				s.touched = append(s.touched, t)
			}
			if isOutput {
				s.counts[t]++
			}
		}
	}
	mark(h.PromptTokenIDs, "prompt_token_ids", false)
	if err == nil {
		mark(h.OutputTokenIDs, "output_token_ids", true)
	}
	for _, t := range s.touched {
		if err == nil {
			logits[t] = penalize(logits[t], p, s.counts[t])
		}
		s.seen[t] = false
		s.counts[t] = 0
	}
	return err
}
