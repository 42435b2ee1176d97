// Package typical is an example of a stage that replaces a slot of the step
// loop from outside package stages: a sample stage that draws from the
// locally typical set (Meister et al., "Locally Typical Sampling", 2022;
// transformers' typical_p), registered under the slot "sample" as
// "typical". A config selects it and sets its options:
//
//	pipeline:
//	  sample: typical
//	  options:
//	    sample: {typical_p: 0.9, min_tokens_to_keep: 1}
//
// # The contract it follows
//
// A sample stage is a pipeline.Stage[*stages.ForwardResult,
// *stages.SampledStep] (stages.SampleStage). For each step it gets the
// logits of the step's rows (ForwardResult.Logits, F32 [len(Rows) +
// len(PromptRows), vocab], in backend memory) and returns one
// stages.Sample per row of Rows, in row order, plus one PromptLogprobs
// entry per PromptRows row. Each row's request settings are in
// Rows[r].Meta.Params; a row whose input was a placeholder (zero-overhead
// scheduling: the step was planned before the previous step's tokens were
// known) finds that token with stages.PendingTokens, so its output count
// and penalty history are complete. The stage leaves SampledStep.Tokens
// nil: the next step's forward pass then takes the tokens from Samples.
// stages.RegisterSample wraps it so that the previous step's outputs reach
// it (ForwardResult.PreviousOutputs) before Process runs.
package typical

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/sampling"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// Name is the implementation name of the sampler in the slot "sample".
const Name = "typical"

// Options are the sampler's options (pipeline.options.sample in YAML).
type Options struct {
	// TypicalP is the probability mass of the typical set, in (0, 1]; 1
	// turns the filter off (the stage then samples exactly as the built-in
	// sample stage's host path).
	TypicalP float64 `yaml:"typical_p"`
	// MinTokensToKeep is the fewest tokens the typical set keeps, >= 1.
	MinTokensToKeep int `yaml:"min_tokens_to_keep"`
}

// DefaultOptions are the options a config that sets none gets.
func DefaultOptions() Options { return Options{TypicalP: 0.95, MinTokensToKeep: 1} }

// Validate checks the ranges; a config with bad options fails when it is
// checked, before any model loads.
func (o *Options) Validate() error {
	if !(o.TypicalP > 0 && o.TypicalP <= 1) {
		return fmt.Errorf("typical: typical_p must be in (0, 1], got %g", o.TypicalP)
	}
	if o.MinTokensToKeep < 1 {
		return fmt.Errorf("typical: min_tokens_to_keep must be >= 1, got %d", o.MinTokensToKeep)
	}
	return nil
}

// Register adds the sampler to reg (nil: the default registry, where the
// built-in stages are) under the slot "sample" and the name "typical". It
// panics if reg already has it, as every registration does.
func Register(reg *pipeline.Registry) {
	stages.RegisterSample(reg, Name, DefaultOptions(), func(d stages.SampleDeps, o Options) (stages.SampleStage, error) {
		return &sampler{d: d, filter: Filter{TypicalP: o.TypicalP, MinKeep: o.MinTokensToKeep}}, nil
	})
}

// sampler samples every row on the host. A row with temperature above
// sampling.GreedyEpsilon is restricted to its typical set (computed after
// the request's masks, logit bias and penalties, at its temperature) by
// masking the other tokens; then kernels/sampling draws from what is left
// with the request's other settings (top-k, top-p, min-p) and its seeded
// stream, and reports logprobs from the raw row, as the built-in sampler
// does. A greedy row takes the argmax: the limit of the typical set as the
// temperature goes to 0, where the distribution collapses onto the argmax
// (entropy 0, surprisal 0).
//
// Cost per step: one download of the logits; per sampled row with the
// filter on, one pass with an exp per token and a sort of the vocabulary
// (O(V log V)), then sampling.Sample's cost. Rows run one after another on
// the stage's goroutine. Not safe for concurrent use (the graph calls
// Process from one goroutine).
type sampler struct {
	d       stages.SampleDeps
	filter  Filter
	logits  []float32 // reused host copy of each step's logits
	scratch sampling.Scratch
	masked  []int32   // reused mask of one row
	proc    []float32 // reused processed copy of one row
	raw     []float32 // reused raw copy of one row, for its logprobs
}

func (s *sampler) Process(_ context.Context, res *stages.ForwardResult) (*stages.SampledStep, error) {
	if s.d.Stats != nil {
		defer func(start time.Time) { s.d.Stats.RecordSample(time.Since(start)) }(time.Now())
	}
	out := &stages.SampledStep{ForwardResult: res, Samples: make([]stages.Sample, len(res.Rows))}
	if res.Logits == nil {
		return out, nil
	}
	flat, err := kernels.ToF32Into(s.d.Ops, res.Logits, s.logits)
	if err != nil {
		return nil, fmt.Errorf("typical: step %d: %w", res.Outputs.StepID, err)
	}
	s.logits = flat
	vocab := res.Logits.Shape()[1]
	row := func(i int) []float32 { return flat[i*vocab : (i+1)*vocab : (i+1)*vocab] }
	// Prompt logprobs first: sampling edits its row in place.
	for i, pr := range res.PromptRows {
		got, err := sampling.PromptLogprobs(row(len(res.Rows)+i), int32(pr.Next), *pr.Meta.Params.PromptLogprobs)
		if err != nil {
			return nil, fmt.Errorf("typical: step %d: prompt logprobs of %q: %w", res.Outputs.StepID, pr.Meta.RequestID, err)
		}
		out.PromptLogprobs = append(out.PromptLogprobs, tokenLogprobs(pr.Next, got))
	}
	for r, ref := range res.Rows {
		smp, err := s.sampleRow(row(r), res, ref)
		if err != nil {
			return nil, fmt.Errorf("typical: step %d: request %q: %w", res.Outputs.StepID, ref.RequestID, err)
		}
		out.Samples[r] = smp
	}
	return out, nil
}

// sampleRow samples one row (edited in place). The tokens outside the
// typical set are set to -Inf in the row before sampling; the logprobs,
// when asked, are then taken from a copy of the raw row, as the built-in
// sampler reports them.
func (s *sampler) sampleRow(logits []float32, res *stages.ForwardResult, ref stages.RowRef) (stages.Sample, error) {
	row, err := sampleRow(ref.Meta, ref.Index, s.d.EOSTokenIDs, stages.PendingTokens(res, ref.Meta), len(logits))
	if err != nil {
		return stages.Sample{}, err
	}
	filtered := !row.Greedy && s.filter.TypicalP < 1
	logprobs, numLogprobs := row.Logprobs, row.NumLogprobs
	if filtered {
		if logprobs {
			s.raw = append(s.raw[:0], logits...)
			row.Logprobs, row.NumLogprobs = false, 0
		}
		s.proc = processed(s.proc[:0], logits, &row)
		s.masked = s.filter.Outside(s.masked[:0], s.proc, row.Temperature)
		for _, id := range s.masked {
			logits[id] = float32(math.Inf(-1))
		}
	}
	got, err := sampling.Sample(logits, &row, &s.scratch)
	if err != nil {
		return stages.Sample{}, err
	}
	if filtered && logprobs {
		if got, err = sampling.PromptLogprobs(s.raw, got.Token, numLogprobs); err != nil {
			return stages.Sample{}, err
		}
	}
	smp := stages.Sample{Token: int(got.Token)}
	if logprobs {
		lp := tokenLogprobs(int(got.Token), got)
		smp.Logprobs = &lp
	}
	return smp, nil
}

func tokenLogprobs(token int, r sampling.Result) engine.TokenLogprobs {
	lp := engine.TokenLogprobs{TokenID: token, Logprob: r.Logprob}
	for _, t := range r.Top {
		lp.Top = append(lp.Top, engine.TokenLogprob{TokenID: int(t.Token), Logprob: t.Logprob})
	}
	return lp
}

// sampleRow builds a row's kernels.SampleRow from its request settings,
// as the built-in sample stage does: a temperature below
// sampling.GreedyEpsilon is greedy; the index-th output of a seeded
// request draws from seed+index; the step is the output position, which
// counts pending, the tokens of the previous step not yet in the metadata
// (zero-overhead scheduling); while the output is shorter than min_tokens
// the stop ids (and EOS, unless ignore_eos) are masked; the logit bias, and
// when a penalty is active the prompt and output history, become one edit
// per token id. Errors: a token id outside the vocabulary. Cost:
// O(masked + bias + history).
func sampleRow(m *engine.SequenceMetadata, index int, eos, pending []int, vocab int) (kernels.SampleRow, error) {
	rp := m.Params
	numOut := len(m.TokenIDs) + len(pending) - m.NumPromptTokens
	r := kernels.SampleRow{
		Greedy: rp.Temperature < sampling.GreedyEpsilon, Temperature: rp.Temperature,
		TopK: rp.TopK, TopP: rp.TopP, MinP: rp.MinP, Step: uint64(numOut),
		RepetitionPenalty: rp.RepetitionPenalty, PresencePenalty: rp.PresencePenalty, FrequencyPenalty: rp.FrequencyPenalty,
	}
	if rp.Seed != nil {
		r.Seed = uint64(*rp.Seed) + uint64(index)
	}
	if rp.Logprobs != nil {
		r.Logprobs, r.NumLogprobs = true, *rp.Logprobs
	}
	at := map[int]int{} // token id -> its edit
	var err error
	edit := func(what string, t int) *kernels.LogitEdit {
		if t < 0 || t >= vocab {
			if err == nil {
				err = fmt.Errorf("%s token id %d not in [0, %d): %w", what, t, vocab, kernels.ErrOutOfRange)
			}
			return &kernels.LogitEdit{}
		}
		k, ok := at[t]
		if !ok {
			k = len(r.Edits)
			at[t] = k
			r.Edits = append(r.Edits, kernels.LogitEdit{Token: int32(t)})
		}
		return &r.Edits[k]
	}
	if numOut < rp.MinTokens {
		for _, t := range rp.StopTokenIDs {
			edit("stop", t).Flags |= kernels.EditMask
		}
		if !rp.IgnoreEOS {
			for _, t := range eos {
				edit("eos", t).Flags |= kernels.EditMask
			}
		}
	}
	for t, bias := range rp.LogitBias {
		e := edit("logit_bias", t)
		e.Flags |= kernels.EditBias
		e.Bias = bias
	}
	if r.Penalized() {
		for _, t := range m.TokenIDs[:m.NumPromptTokens] {
			edit("prompt", t).Flags |= kernels.EditSeen
		}
		for _, out := range [2][]int{m.TokenIDs[m.NumPromptTokens:], pending} {
			for _, t := range out {
				e := edit("output", t)
				e.Flags |= kernels.EditSeen
				e.Count++
			}
		}
	}
	return r, err
}

// processed appends to dst a copy of logits with r's edits applied (masks,
// logit bias and penalties, in vLLM's order and arithmetic, as
// kernels/sampling), the distribution the typical set is taken from, and
// returns it. r's token ids lie in the vocabulary (sampleRow checks them).
// Cost: O(V + edits).
func processed(dst, logits []float32, r *kernels.SampleRow) []float32 {
	x := append(dst, logits...)
	for _, e := range r.Edits {
		v := x[e.Token]
		if e.Flags&kernels.EditMask != 0 {
			v = float32(math.Inf(-1))
		}
		if e.Flags&kernels.EditBias != 0 {
			v += e.Bias
		}
		if r.Penalized() && e.Flags&kernels.EditSeen != 0 {
			if r.RepetitionPenalty != 1 {
				if v > 0 {
					v /= r.RepetitionPenalty
				} else {
					v *= r.RepetitionPenalty
				}
			}
			if e.Count > 0 {
				v -= r.FrequencyPenalty * float32(e.Count)
				v -= r.PresencePenalty
			}
		}
		x[e.Token] = v
	}
	return x
}

// Filter computes typical sets. The typical set of a distribution p at a
// temperature is the smallest set of tokens, taken in order of how close
// each token's surprisal -log p(t) is to the entropy H (ties by lower id),
// whose mass reaches TypicalP: a token is kept while the mass of the
// tokens before it is below TypicalP, and the first MinKeep tokens always
// are. The zero value is not valid: set TypicalP in (0, 1] and MinKeep
// >= 1. Not safe for concurrent use (it reuses a buffer).
type Filter struct {
	TypicalP float64
	MinKeep  int
	cands    []cand // reused
}

type cand struct {
	id    int32
	p     float64
	score float64 // |surprisal - entropy|
}

// Outside appends to dst the ids of logits' tokens outside the typical set
// of softmax(logits / temperature) and returns it. Tokens at -Inf are in
// neither (never appended: they are already out). temperature must be
// > 0. Cost: one exp per finite token and a sort of them, O(V log V).
func (f *Filter) Outside(dst []int32, logits []float32, temperature float32) []int32 {
	inv := 1 / float64(temperature)
	zmax := math.Inf(-1)
	for _, z := range logits {
		zmax = max(zmax, float64(z)*inv)
	}
	if math.IsInf(zmax, 0) || math.IsNaN(zmax) {
		return dst // all -Inf, or +Inf or NaN: sampling.Sample reports the row
	}
	c := f.cands[:0]
	sum := 0.0
	for i, z := range logits {
		if math.IsInf(float64(z), -1) {
			continue
		}
		w := math.Exp(float64(z)*inv - zmax)
		c = append(c, cand{id: int32(i), p: w})
		sum += w
	}
	f.cands = c
	lse := zmax + math.Log(sum)
	entropy := 0.0
	for i := range c {
		c[i].p /= sum
		if c[i].p > 0 {
			entropy -= c[i].p * (float64(logits[c[i].id])*inv - lse)
		}
	}
	for i := range c {
		c[i].score = math.Abs(-(float64(logits[c[i].id])*inv - lse) - entropy)
	}
	slices.SortFunc(c, func(a, b cand) int {
		if a.score != b.score {
			if a.score < b.score {
				return -1
			}
			return 1
		}
		return int(a.id - b.id)
	})
	mass := 0.0
	for k, e := range c {
		if k >= f.MinKeep && mass >= f.TypicalP {
			dst = append(dst, e.id)
		}
		mass += e.p
	}
	return dst
}
