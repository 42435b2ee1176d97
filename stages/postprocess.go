package stages

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func init() {
	registerStage("postprocess", "default", func(rt *Runtime) pipeline.Stage[*SampledStep, *StepOutputs] {
		return newPostprocess(rt)
	})
}

// postprocess appends a step's sampled tokens (Scheduler.ProcessOutputs),
// detokenizes them incrementally, checks stop strings and emits each
// sequence's output increment.
type postprocess struct {
	rt   *Runtime
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
}

func newPostprocess(rt *Runtime) *postprocess {
	return &postprocess{rt: rt, seqs: map[engine.SeqID]*seqText{}, done: map[engine.SeqID]engine.StepID{}}
}

func (p *postprocess) state(r RowRef) *seqText {
	st := p.seqs[r.SeqID]
	if st != nil {
		return st
	}
	m := r.Meta
	st = &seqText{}
	if tok := p.rt.Tokenizer; tok != nil {
		prompt := make([]int32, m.NumPromptTokens)
		for i, id := range m.TokenIDs[:m.NumPromptTokens] {
			prompt[i] = int32(id)
		}
		st.stream = tok.NewDecodeStream(prompt, m.Params.SkipSpecialTokens)
		st.stop = tokenizer.NewStopChecker(m.Params.Stop, false)
	}
	p.seqs[r.SeqID] = st
	return st
}

func (p *postprocess) Process(_ context.Context, step *SampledStep) (*StepOutputs, error) {
	id := step.Outputs.StepID
	defer p.rt.ZOS.postprocessed(id)
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
	sampled := make([]engine.SampledTokens, len(step.Rows))
	for i, r := range step.Rows {
		sampled[i] = engine.SampledTokens{SeqID: r.SeqID, TokenIDs: []int{step.Samples[i].Token}}
	}
	finished, err := p.rt.Scheduler.ProcessOutputs(step.Outputs.StepID, sampled)
	if err != nil {
		return nil, fmt.Errorf("postprocess: %w", err)
	}
	byID := make(map[engine.SeqID]engine.FinishedSequence, len(finished))
	for _, f := range finished {
		byID[f.SeqID] = f
	}
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
	for i, r := range step.Rows {
		if _, gone := p.done[r.SeqID]; gone {
			continue // learned one step late: this row's work is discarded
		}
		st := p.state(r)
		s := step.Samples[i]
		out := engine.RequestOutput{
			RequestID: r.RequestID, Index: r.Index, TokenIDs: []int{s.Token},
		}
		if s.Logprobs != nil {
			out.Logprobs = []engine.TokenLogprobs{*s.Logprobs}
		}
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
				out.PromptLogprobs = st.promptLogprobs
			}
		}
		out.FirstTokenTime = st.firstToken
		if st.stream != nil {
			delta := st.stream.Step(int32(s.Token))
			text, stopped := st.stop.Append(delta)
			out.Text = text
			if stopped {
				_, matched := st.stop.Stopped()
				if _, finishedHere := byID[r.SeqID]; !finishedHere {
					// A sequence already finished (its row was in flight) is unknown: fine.
					if _, err := p.rt.Scheduler.FinishSequence(r.SeqID, engine.FinishStop); err != nil && !errors.Is(err, engine.ErrUnknownSequence) {
						return nil, fmt.Errorf("postprocess: stop string: %w", err)
					}
				}
				out.Finished, out.FinishReason, out.StopReason = true, engine.FinishStop, matched
			}
		}
		if f, ok := byID[r.SeqID]; ok && !out.Finished {
			if st.stream != nil {
				out.Text += st.stop.Flush()
			}
			out.Finished, out.FinishReason, out.Err = true, f.Reason, f.Err
			if f.Reason == engine.FinishStop && len(f.OutputTokenIDs) > 0 {
				out.StopReason = fmt.Sprint(f.OutputTokenIDs[len(f.OutputTokenIDs)-1])
			}
		}
		if out.Finished {
			out.FinishTime = now
			delete(p.seqs, r.SeqID)
			p.done[r.SeqID] = id
		}
		if p.rt.Live.Emit(out) && p.rt.Gate != nil {
			gathered = append(gathered, out)
		}
	}
	return &StepOutputs{StepID: step.Outputs.StepID, Finished: finished, NumTokens: len(sampled), Done: now, Outputs: gathered}, nil
}
