package stages

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/spec"
	"github.com/deepinfer/deepinfer-go/kernels"
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
	Ops   kernels.Ops
	// Device (Speculative.VerifyOnDevice): verify on the device too
	// (SampledStep.DeviceVerified) when the step's tokens are in backend
	// memory, and leave the host verification to SampledStep.Await when
	// the host samples have not arrived.
	Device bool
}

// RegisterVerify registers a verify implementation in r (nil: the default
// registry).
func RegisterVerify[O any](r *pipeline.Registry, name string, defaults O, build func(VerifyDeps, O) (VerifyStage, error)) {
	register(r, "verify", name, defaults, func(e *Env) VerifyDeps {
		return VerifyDeps{Stats: e.Stats, Ops: e.Ops, Device: e.Speculative.VerifyOnDevice}
	}, build, nil)
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
type verify struct {
	d VerifyDeps
	// outcomes hold each step's DeviceVerified and layouts its layout,
	// by step id: a step's outcome is read by its draft stage and the
	// next step's forward pass, both queued before this stage runs two
	// steps later, so a buffer comes back three steps later (no
	// allocation a step). A layout is only read, and uploaded only when
	// it changes (kernels.UploadI32Held).
	outcomes [3]kernels.Tensor
	layouts  [3]kernels.HeldI32
}

func (v *verify) Process(_ context.Context, step *SampledStep) (*SampledStep, error) {
	if v.d.Device && step.Tokens != nil && DraftFree(step) {
		// Nothing to verify, and no drafter reads a device outcome: the
		// host half only, deferred as below.
		return step, step.deferHost(func() error { return v.host(step) })
	}
	if v.d.Device && step.Tokens != nil && step.Batch != nil && step.Outputs.NumSampleRows > 0 {
		if err := v.onDevice(step); err != nil {
			return nil, err
		}
		return step, step.deferHost(func() error { return v.host(step) })
	}
	if err := step.Await(); err != nil {
		return nil, err
	}
	return step, v.host(step)
}

// DraftFree reports whether step was planned with speculation off
// (SchedulerOutputs.DraftLimit 0: SetDraftLimit(0), disable_by_batch_size):
// it verifies no drafts, and its drafter proposes none, so its verify and
// draft stages pass it on without device work and the next step takes its
// placeholders from its sampled tokens, unshifted
// (SchedulerOutputs.PlaceholdersFromSamples).
func DraftFree(step *SampledStep) bool {
	return step.Outputs.DraftLimit == 0 && step.Outputs.NumDraftTokens == 0
}

// sampleEntries groups step's sample rows by the scheduler's sample rows
// (the entries of Verified, in order): the first row of each and how many
// rows it has (1 + its drafts; 1 for a fork, which samples one row of its
// parent's last chunk).
func sampleEntries(step *SampledStep) ([]RowRef, []int, error) {
	rows := step.Rows
	var refs []RowRef
	var counts []int
	for i := 0; i < len(rows); {
		ref := rows[i]
		n := 1 + ref.Meta.NumDrafts
		if ref.SeqID != ref.Meta.SeqID || ref.Offset != 0 {
			n = 1
		}
		if i+n > len(rows) || rows[i+n-1].Row != ref.Row || rows[i+n-1].Offset != n-1 {
			return nil, nil, fmt.Errorf("verify: step %d: sample row %d does not have %d logits rows", step.Outputs.StepID, ref.Row, n)
		}
		refs = append(refs, ref)
		counts = append(counts, n)
		i += n
	}
	if len(refs) != step.Outputs.NumSampleRows {
		return nil, nil, fmt.Errorf("verify: step %d: %d outcomes, the scheduler planned %d sample rows", step.Outputs.StepID, len(refs), step.Outputs.NumSampleRows)
	}
	return refs, counts, nil
}

// onDevice queues the device half: kernels.AcceptDrafts over the step's
// device tokens and its input ids (where the drafts it verifies sit: row
// from+1+j of a sequence whose first sampling row is from), into
// step.DeviceVerified. Cost: one upload of 4 ints an entry and one small
// kernel; no host round trip, and no allocation once the stage's buffers
// have grown.
func (v *verify) onDevice(step *SampledStep) error {
	refs, counts, err := sampleEntries(step)
	if err != nil {
		return err
	}
	first := tokenRows(step)
	seqIndex := make(map[engine.SeqID]int, len(step.Seqs))
	for i := range step.Seqs {
		seqIndex[step.Seqs[i].SeqID] = i
	}
	layout := make([]int32, 0, 4*len(refs))
	s0 := 0
	for e, ref := range refs {
		m := ref.Meta
		n := 0
		if counts[e] > 1 {
			n = len(StepDrafts(step.ForwardResult, m))
		}
		i, ok := seqIndex[m.SeqID]
		if !ok {
			return fmt.Errorf("verify: step %d: sample row %d's sequence is not in the step", step.Outputs.StepID, ref.Row)
		}
		from := first[i] + m.SeqlenQ - 1 - m.NumDrafts
		layout = append(layout, int32(s0), int32(n), int32(from+1), int32(from))
		s0 += counts[e]
	}
	ops, n := v.d.Ops, len(refs)
	slot := int(step.Outputs.StepID) % len(v.outcomes)
	buf := &v.outcomes[slot]
	if *buf == nil || kernels.NumElements(*buf) < 3*n {
		*buf, err = kernels.AllocEmpty(ops, kernels.I32, 6*n)
	}
	// Every entry's three values are written (kernels.AcceptDraftsInto).
	if err == nil {
		if step.DeviceVerified, err = ops.Rows(*buf, 0, 3*n); err == nil {
			step.DeviceVerified, err = ops.Reshape(step.DeviceVerified, 3, n)
		}
	}
	var lt kernels.Tensor
	if err == nil {
		if lt, err = kernels.UploadI32Held(ops, &v.layouts[slot], layout); err == nil {
			lt, err = ops.Reshape(lt, n, 4)
		}
	}
	if err == nil {
		err = kernels.AcceptDraftsInto(ops, step.DeviceVerified, step.Tokens, step.Batch.InputIDs, lt)
	}
	if err != nil {
		return fmt.Errorf("verify: step %d: %w", step.Outputs.StepID, err)
	}
	return nil
}

// host verifies on the host from the step's samples (Verified).
func (v *verify) host(step *SampledStep) error {
	refs, counts, err := sampleEntries(step)
	if err != nil {
		return err
	}
	out := make([]VerifiedRow, 0, len(refs))
	i := 0
	for e, ref := range refs {
		n := counts[e]
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
	step.Verified = out
	return nil
}
