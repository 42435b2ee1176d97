// Package tokenban is an example of a stage inserted into the step loop
// from outside package stages: a logits processor after forward that bans
// tokens (their logits become -Inf, so no sampler can draw them),
// registered under its own slot "ban-tokens". A config inserts it:
//
//	pipeline:
//	  insert:
//	    - after: forward
//	      stage: ban-tokens
//	      options: {ids: [17, 42], strings: [" if", "<|eos|>"]}
//
// # The contract it follows
//
// A stage inserted after forward is a pipeline.Stage[*stages.ForwardResult,
// *stages.ForwardResult], registered with stages.RegisterInsert. It gets
// each step's logits (ForwardResult.Logits, F32 [len(Rows) +
// len(PromptRows), vocab], in backend memory: first one row per sampled
// sequence, then the rows that score prompt tokens for prompt_logprobs)
// and must pass every step on (dropping one fails the run). Its factory
// gets stages.InsertDeps: the backend, the tokenizer and the vocabulary
// size, so options naming tokens are checked when the engine is built. A
// graph built without a model (llm.DryGraph, the graph command) has a
// vocabulary size of 0 and no tokenizer; the stage then checks only what
// the options say on their own.
package tokenban

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// Slot is the slot name configs insert the stage under; its one
// implementation is "default".
const Slot = "ban-tokens"

// Options are the stage's options (the insertion's options in YAML).
type Options struct {
	// IDs are token ids to ban, each in [0, vocabulary size).
	IDs []int `yaml:"ids"`
	// Strings ban, each, every token whose text alone (decoded with
	// special tokens kept) is exactly that string: " if" bans a
	// byte-level BPE's "Ġif", "<|eos|>" the special token. A string that
	// no token decodes to is an error. Needs the model's tokenizer.
	Strings []string `yaml:"strings"`
}

// Validate checks what the options say on their own; ids against the
// vocabulary are checked when the engine builds the stage.
func (o *Options) Validate() error {
	for _, id := range o.IDs {
		if id < 0 {
			return fmt.Errorf("ban-tokens: ids: %d is negative", id)
		}
	}
	for i, s := range o.Strings {
		if s == "" {
			return fmt.Errorf("ban-tokens: strings[%d] is empty", i)
		}
	}
	return nil
}

// Register adds the stage to reg (nil: the default registry, where the
// built-in stages are) under the slot "ban-tokens", implementation
// "default". It panics if reg already has it, as every registration does.
func Register(reg *pipeline.Registry) {
	stages.RegisterInsert(reg, Slot, "default", Options{}, New)
}

// New builds the stage: it resolves Strings with d.Tokenizer and checks
// every banned id against d.VocabSize (both skipped when d.VocabSize is 0,
// a graph without a model). Errors name the option at fault. Cost: one
// decode per vocabulary entry when Strings is not empty.
func New(d stages.InsertDeps, o Options) (pipeline.Stage[*stages.ForwardResult, *stages.ForwardResult], error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	b := &ban{ops: d.Ops}
	if d.VocabSize == 0 {
		return b, nil // no model: nothing to check the ids against
	}
	for _, id := range o.IDs {
		if id >= d.VocabSize {
			return nil, fmt.Errorf("ban-tokens: ids: %d is outside the vocabulary [0, %d)", id, d.VocabSize)
		}
		b.ids = append(b.ids, id)
	}
	if len(o.Strings) > 0 {
		if d.Tokenizer == nil {
			return nil, fmt.Errorf("ban-tokens: strings: the model has no tokenizer; ban ids instead")
		}
		ids, err := resolve(d.Tokenizer, min(d.VocabSize, d.Tokenizer.VocabSize()), o.Strings)
		if err != nil {
			return nil, err
		}
		b.ids = append(b.ids, ids...)
	}
	slices.Sort(b.ids)
	b.ids = slices.Compact(b.ids)
	if len(b.ids) >= d.VocabSize {
		return nil, fmt.Errorf("ban-tokens: the options ban all %d tokens of the vocabulary: nothing would be left to sample", d.VocabSize)
	}
	return b, nil
}

// resolve returns the ids below vocab whose text alone is one of strs; a
// string that matches none is an error.
func resolve(tok *tokenizer.Tokenizer, vocab int, strs []string) ([]int, error) {
	want := make(map[string]bool, len(strs))
	for _, s := range strs {
		want[s] = true
	}
	found := map[string]bool{}
	var ids []int
	for id := range vocab {
		if text := tok.Decode([]int{id}, false); want[text] {
			ids = append(ids, id)
			found[text] = true
		}
	}
	for _, s := range strs {
		if !found[s] {
			return nil, fmt.Errorf("ban-tokens: strings: no token of the vocabulary is the text %q", s)
		}
	}
	return ids, nil
}

// ban sets the banned ids' logits to -Inf in every sampled row; the rows
// that score prompt tokens keep the model's logits, so prompt logprobs are
// unchanged. The logprobs of generated tokens come from the banned rows
// (a banned token has logprob -Inf). With nothing to ban it passes each
// step on untouched.
//
// Cost per step with ids to ban: one download of the logits, len(ids)
// stores per sampled row, and an upload into a new logits tensor (the
// forward stage's is left as it was). Not safe for concurrent use (the
// graph calls Process from one goroutine).
type ban struct {
	ops kernels.Ops
	ids []int     // sorted, distinct, in the vocabulary
	buf []float32 // reused host copy of each step's logits
}

func (b *ban) Process(_ context.Context, res *stages.ForwardResult) (*stages.ForwardResult, error) {
	if len(b.ids) == 0 || res.Logits == nil || len(res.Rows) == 0 {
		return res, nil
	}
	flat, err := kernels.ToF32Into(b.ops, res.Logits, b.buf)
	if err != nil {
		return nil, fmt.Errorf("ban-tokens: step %d: %w", res.Outputs.StepID, err)
	}
	b.buf = flat
	shape := res.Logits.Shape()
	vocab := shape[len(shape)-1]
	if b.ids[len(b.ids)-1] >= vocab {
		return nil, fmt.Errorf("ban-tokens: step %d: id %d is outside the logits' %d columns", res.Outputs.StepID, b.ids[len(b.ids)-1], vocab)
	}
	negInf := float32(math.Inf(-1))
	for r := range res.Rows {
		row := flat[r*vocab : (r+1)*vocab]
		for _, id := range b.ids {
			row[id] = negInf
		}
	}
	banned, err := kernels.FromF32(b.ops, flat, shape...)
	if err != nil {
		return nil, fmt.Errorf("ban-tokens: step %d: %w", res.Outputs.StepID, err)
	}
	out := *res
	out.Logits = banned
	return &out, nil
}
