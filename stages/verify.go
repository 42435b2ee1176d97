package stages

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/spec"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// The verify slot (speculative decoding): *SampledStep -> *SampledStep,
// after sample. A stage of this slot turns the samples of each
// speculative decode's rows into the tokens the sequence emits
// (SampledStep.Verified, one entry per sample row of the scheduler): the
// drafts the target accepts, then the target's own token after them. The
// drafts a row verifies are StepDrafts; the step before's outputs arrive
// as ForwardResult.PreviousOutputs, as for the sample slot.
type VerifyStage = pipeline.Stage[*SampledStep, *SampledStep]

// VerifyDeps is what a verify stage gets.
type VerifyDeps struct {
	Stats *Stats // nil: not counted
}

// RegisterVerify registers a verify implementation in r (nil: the default
// registry).
func RegisterVerify[O any](r *pipeline.Registry, name string, defaults O, build func(VerifyDeps, O) (VerifyStage, error)) {
	register(r, "verify", name, defaults, func(e *Env) VerifyDeps { return VerifyDeps{Stats: e.Stats} }, build, nil)
}

func init() {
	RegisterVerify(nil, "default", NoOptions{}, func(d VerifyDeps, _ NoOptions) (VerifyStage, error) {
		return &verify{d: d}, nil
	})
}

// verify is lossless verification by sample-and-compare. The sample stage
// drew the token of the row at Offset j from the target's distribution
// after the sequence's tokens and its first j drafts (penalties, masks and
// the draw's output position included), with the draw the request would
// make at that output position without speculation. The row emits the
// longest prefix of drafts that equals those tokens, then the token at the
// first mismatch (or after the last draft). Every drafter here is
// deterministic (its q is one-hot), and for a one-hot q this is exactly
// rejection sampling (accept d with probability p(d); on rejection draw
// from p without d, renormalized: see engine/spec), so the output
// distribution is the target's; with greedy rows it is the longest
// matching prefix plus the bonus token. Because the draws are keyed by
// (seed, output position), a seeded request emits the same tokens with
// speculation on or off wherever the target's logits are the same.
type verify struct{ d VerifyDeps }

func (v *verify) Process(_ context.Context, step *SampledStep) (*SampledStep, error) {
	rows := step.Rows
	out := make([]VerifiedRow, 0, step.Outputs.NumSampleRows)
	for i := 0; i < len(rows); {
		ref := rows[i]
		n := 1 + ref.Meta.NumDrafts
		if ref.SeqID != ref.Meta.SeqID || ref.Offset != 0 {
			n = 1 // a fork samples one row of its parent's last chunk
		}
		if i+n > len(rows) || rows[i+n-1].Row != ref.Row || rows[i+n-1].Offset != n-1 {
			return nil, fmt.Errorf("verify: step %d: sample row %d does not have %d logits rows", step.Outputs.StepID, ref.Row, n)
		}
		target := make([]int, n)
		for j := range n {
			target[j] = step.Samples[i+j].Token
		}
		drafts := StepDrafts(step.ForwardResult, ref.Meta)
		if n == 1 {
			drafts = nil
		}
		a := spec.VerifyGreedy(drafts, target[:len(drafts)+1])
		vr := VerifiedRow{Ref: ref, TokenIDs: target[:a+1], NumDrafts: len(drafts), Logprobs: make([]*engine.TokenLogprobs, a+1)}
		for j := range a + 1 {
			vr.Logprobs[j] = step.Samples[i+j].Logprobs
		}
		if v.d.Stats != nil && ref.Meta.NumDrafts > 0 {
			v.d.Stats.RecordSpec(len(drafts), a)
		}
		out = append(out, vr)
		i += n
	}
	if len(out) != step.Outputs.NumSampleRows {
		return nil, fmt.Errorf("verify: step %d: %d outcomes, the scheduler planned %d sample rows", step.Outputs.StepID, len(out), step.Outputs.NumSampleRows)
	}
	step.Verified = out
	return step, nil
}
