package stages

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// The postprocess slot: *SampledStep -> *StepOutputs, the tail of the step
// loop. A stage of this slot appends each row's token to its sequence's
// output, detokenizes, checks stop strings and the token-level finish rule
// (engine.CheckFinish), emits each sequence's increment through
// PostprocessDeps.Responder, and reports the step (Sampled, one entry per
// row; Finished) on the feedback edge to schedule, which applies it to the
// scheduler. With ZOS a sequence finished at step N still has a row in step
// N+1 (planned before N's tokens were known): that row is discarded, never
// emitted, though it is still reported in Sampled. Outputs of requests that
// are no longer live (aborted) are dropped by the Responder.
type PostprocessStage = pipeline.Stage[*SampledStep, *StepOutputs]

// PostprocessDeps is what a postprocess stage gets.
type PostprocessDeps struct {
	Tokenizer   *tokenizer.Tokenizer // nil: outputs carry no text
	Responder   *Responder
	EOSTokenIDs []int
	MaxModelLen int
}

// RegisterPostprocess registers a postprocess implementation in r (nil:
// the default registry).
func RegisterPostprocess[O any](r *pipeline.Registry, name string, defaults O, build func(PostprocessDeps, O) (PostprocessStage, error)) {
	register(r, "postprocess", name, defaults, func(e *Env) PostprocessDeps {
		d := PostprocessDeps{Tokenizer: e.Tokenizer, Responder: e.Responder}
		if e.Scheduler != nil {
			c := e.Scheduler.Config()
			d.EOSTokenIDs, d.MaxModelLen = c.EOSTokenIDs, c.MaxModelLen
		}
		return d
	}, build, nil)
}

func init() {
	RegisterPostprocess(nil, "default", NoOptions{}, func(d PostprocessDeps, _ NoOptions) (PostprocessStage, error) {
		return NewPostprocess(d), nil
	})
}

// StepOutputs is what post-processing reports back to the schedule stage
// (the loop's feedback edge) and, on the lagged edge, to the sample stage
// of the next step.
type StepOutputs struct {
	StepID engine.StepID
	// Sampled has one entry per sample row of the step (Rows order): the
	// tokens the row appended. The schedule stage hands it to
	// Scheduler.ProcessOutputs.
	Sampled []engine.SampledTokens
	// Finished are the sequences post-processing ended at this step (stop
	// strings, EOS, stop ids, length: engine.CheckFinish), already answered.
	Finished []engine.FinishedSequence
	// NumTokens counts the tokens appended by the step.
	NumTokens int
	Done      time.Time
	// Outputs are the request outputs the step emitted.
	Outputs []engine.RequestOutput
}

// Postprocess is the built-in postprocess stage: it detokenizes each
// sequence's tokens incrementally, checks stop strings and the finish rule,
// and emits each sequence's output increment.
type Postprocess struct {
	d    PostprocessDeps
	seqs map[engine.SeqID]*seqText
	// done remembers, for a few steps, the sequences that finished and the
	// step they finished at: with two steps in flight a finished sequence
	// still has a row in the next step, which is discarded unseen.
	done map[engine.SeqID]engine.StepID
}

// seqText is the text state of one output sequence.
type seqText struct {
	scheduled      time.Time              // when the sequence's first step was planned
	promptLogprobs []engine.TokenLogprobs // gathered over prefill chunks until the first output
	stream         *tokenizer.DecodeStream
	stop           *tokenizer.StopChecker
	firstToken     time.Time
	numOut         int // output tokens so far
}

// NewPostprocess returns the built-in postprocess stage.
func NewPostprocess(d PostprocessDeps) *Postprocess {
	return &Postprocess{d: d, seqs: map[engine.SeqID]*seqText{}, done: map[engine.SeqID]engine.StepID{}}
}

func (p *Postprocess) state(r RowRef) *seqText {
	st := p.seqs[r.SeqID]
	if st != nil {
		return st
	}
	m := r.Meta
	st = &seqText{}
	if tok := p.d.Tokenizer; tok != nil {
		st.stream = tok.NewDecodeStream(m.TokenIDs[:m.NumPromptTokens], m.Params.SkipSpecialTokens)
		st.stop = tokenizer.NewStopChecker(m.Params.Stop, false)
	}
	p.seqs[r.SeqID] = st
	return st
}

func (p *Postprocess) Process(_ context.Context, step *SampledStep) (*StepOutputs, error) {
	id := step.Outputs.StepID
	for _, ids := range [][]engine.SeqID{step.Outputs.FinishedSeqIDs, step.Outputs.AbortedSeqIDs} {
		for _, seq := range ids {
			delete(p.seqs, seq)
			if _, ok := p.done[seq]; !ok {
				p.done[seq] = id
			}
		}
	}
	for seq, at := range p.done {
		if id-at > 2 {
			delete(p.done, seq)
		}
	}
	outcomes := step.Outcomes()
	sampled := make([]engine.SampledTokens, len(outcomes))
	numTokens := 0
	for i, o := range outcomes {
		sampled[i] = engine.SampledTokens{SeqID: o.Ref.SeqID, TokenIDs: o.TokenIDs}
		if step.Drafts != nil {
			sampled[i].Drafts = step.Drafts[i]
		}
		numTokens += len(o.TokenIDs)
	}
	var finished []engine.FinishedSequence
	for i := range step.Seqs {
		m := &step.Seqs[i]
		if _, gone := p.done[m.SeqID]; gone {
			continue
		}
		if st := p.state(RowRef{Meta: m, SeqID: m.SeqID, Index: m.SampleIndex, RequestID: m.RequestID}); st.scheduled.IsZero() {
			st.scheduled = step.Planned
		}
	}
	for i, pr := range step.PromptRows {
		st := p.state(RowRef{Meta: pr.Meta, SeqID: pr.Meta.SeqID, Index: pr.Meta.SampleIndex, RequestID: pr.Meta.RequestID})
		st.promptLogprobs = append(st.promptLogprobs, step.PromptLogprobs[i])
	}
	now := time.Now()
	var gathered []engine.RequestOutput
	for _, o := range outcomes {
		r := o.Ref
		if _, gone := p.done[r.SeqID]; gone {
			continue // learned one step late: this row's work is discarded
		}
		st := p.state(r)
		out := engine.RequestOutput{RequestID: r.RequestID, Index: r.Index}
		if st.scheduled.IsZero() { // a fork: scheduled with its parent
			st.scheduled = step.Planned
			if parent := p.seqs[r.Meta.SeqID]; parent != nil && !parent.scheduled.IsZero() {
				st.scheduled = parent.scheduled
			}
		}
		if st.firstToken.IsZero() {
			st.firstToken = now
			out.ScheduledTime = st.scheduled
			if r.Index == 0 {
				out.PromptTokenIDs = r.Meta.TokenIDs[:r.Meta.NumPromptTokens]
				out.NumCachedTokens = r.Meta.NumCachedTokens
				out.PromptLogprobs = st.promptLogprobs
			}
		}
		out.FirstTokenTime = st.firstToken
		for j, tok := range o.TokenIDs {
			if r.Grammar != nil && !commitGrammar(r.Grammar, &out, tok) {
				break
			}
			p.appendToken(st, r, &out, tok, o.Logprobs[j])
			if !out.Finished && r.Grammar != nil && r.Grammar.IsTerminated() {
				// EOS under the grammar with ignore_eos: the constraint
				// is complete, so is the output.
				p.finishText(st, &out)
				out.Finished, out.FinishReason = true, engine.FinishStop
			}
			if out.Finished {
				break
			}
		}
		if out.Finished {
			out.FinishTime = now
			delete(p.seqs, r.SeqID)
			p.done[r.SeqID] = id
			finished = append(finished, engine.FinishedSequence{SeqID: r.SeqID, RequestID: r.RequestID, Index: r.Index, Reason: out.FinishReason, Err: out.Err})
		}
		if p.d.Responder.Emit(out) {
			gathered = append(gathered, out)
		}
	}
	return &StepOutputs{StepID: id, Sampled: sampled, Finished: finished, NumTokens: numTokens, Done: now, Outputs: gathered}, nil
}

// appendToken adds one emitted token to a sequence's output increment:
// its text (with stop strings checked) and logprobs, and the finish the
// token-level rule finds (engine.CheckFinish), flushing the text the
// stream still holds when the sequence ends.
func (p *Postprocess) appendToken(st *seqText, r RowRef, out *engine.RequestOutput, tok int, lp *engine.TokenLogprobs) {
	out.TokenIDs = append(out.TokenIDs, tok)
	if lp != nil {
		out.Logprobs = append(out.Logprobs, *lp)
	}
	st.numOut++
	if st.stream != nil {
		delta := st.stream.Step(tok)
		text, stopped := st.stop.Append(delta)
		out.Text += text
		if stopped {
			_, matched := st.stop.Stopped()
			out.Finished, out.FinishReason, out.StopReason = true, engine.FinishStop, matched
			return
		}
	}
	rule := engine.RuleFor(r.Meta.Params, p.d.EOSTokenIDs, p.d.MaxModelLen)
	reason := engine.CheckFinish(rule, st.numOut, r.Meta.NumPromptTokens+st.numOut, tok)
	if reason == engine.FinishNone {
		return
	}
	out.Finished, out.FinishReason = true, reason
	if reason == engine.FinishStop {
		out.StopReason = strconv.Itoa(tok)
	}
	p.finishText(st, out)
}

// finishText flushes the text the stream still holds (a character the
// last token left incomplete) into an output that ends now; a stop string
// in it ends the text there.
func (p *Postprocess) finishText(st *seqText, out *engine.RequestOutput) {
	if st.stream == nil {
		return
	}
	more, stopped := st.stop.Append(st.stream.Flush())
	out.Text += more
	if stopped {
		_, out.StopReason = st.stop.Stopped()
		out.FinishReason = engine.FinishStop
	} else {
		out.Text += st.stop.Flush()
	}
}

// commitGrammar commits an emitted token to the sequence's structured-output
// matcher. A token the grammar refuses (a sample stage that did not apply
// the row's mask) ends the sequence with FinishError before the token, and
// commitGrammar reports false.
func commitGrammar(g engine.GrammarMatcher, out *engine.RequestOutput, tok int) bool {
	err := g.Commit(tok)
	if err == nil {
		return true
	}
	out.Finished, out.FinishReason, out.Err = true, engine.FinishError, fmt.Errorf("structured output: the sampled token broke the constraint: %w", err)
	return false
}
