package stages

import (
	"context"
	"errors"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/spec"
)

func init() {
	RegisterDraft(nil, "dspark", NoOptions{}, func(d DraftDeps, _ NoOptions) (Drafter, error) {
		return newDSparkDrafter(d)
	})
}

// dsparkDrafter drafts with a DSpark block drafter (models.DSpark) and
// gates what the next step verifies by the drafter's confidence.
//
// After each step, for every sequence that sampled (a fork's first step
// excepted: its parent's row saw the parent's token), one DSpark pass
// conditioned on the target's hidden state at the row of the sequence's
// last emitted token proposes min(k, block size) greedy drafts with a
// confidence each (the predicted probability that the target accepts the
// draft given that it accepted the ones before). Gating then keeps:
//
//   - per sequence, the longest prefix whose predicted cumulative
//     acceptance clears speculative.confidence_threshold (0 drafts
//     allowed: spec.GatePrefix);
//   - across the step, when speculative.max_verify_tokens_per_step > 0, at
//     most that many draft tokens, dealt to the drafts with the highest
//     expected accepted tokens per verified token (spec.GateBudget).
//
// The CPU fixes these lengths; the scheduler then verifies each
// sequence's drafts. Without ZOS a sequence's next step holds exactly its
// drafts, so fewer drafts are fewer rows in the verify forward pass. With
// ZOS the next step was laid out before the drafts existed, with k
// placeholder rows per sequence: the rows past a shorter draft are
// padding, verified against nothing (the outputs are the same; the rows
// are computed anyway: the device-side batch remap that would drop them
// is not built yet).
//
// The drafter writes no KV cache, so a rejection rolls nothing back.
// Drafts are deterministic (q one-hot), as the verify stage requires.
// Cost per step: the DSpark pass (block layers over block-size rows per
// sequence, then one LM-head row per sequence and drafted position; the
// positions stop once no sequence's cumulative confidence clears the
// threshold) and the host work of gating, O(D log D) for D drafts.
type dsparkDrafter struct {
	d DraftDeps
}

func newDSparkDrafter(d DraftDeps) (*dsparkDrafter, error) {
	if d.Model == nil {
		return &dsparkDrafter{d: d}, nil // a dry build (deepinfer graph)
	}
	if d.Speculative.DSpark == nil {
		return nil, errors.New("draft=dspark: no DSpark drafter loaded (speculative.draft_model)")
	}
	return &dsparkDrafter{d: d}, nil
}

func (p *dsparkDrafter) Propose(ctx context.Context, step *SampledStep) ([][]int, error) {
	d := p.d
	drafts := make([][]int, len(step.Verified))
	k := min(draftLimit(d, step), d.Speculative.DSpark.BlockSize())
	if k == 0 || len(step.Verified) == 0 {
		return drafts, nil
	}
	res := step.ForwardResult
	if res.Hidden == nil {
		return nil, fmt.Errorf("draft=dspark: step %d: the forward stage kept no hidden states", step.Outputs.StepID)
	}
	first := tokenRows(step)
	seqIndex := make(map[engine.SeqID]int, len(step.Seqs))
	for i := range step.Seqs {
		seqIndex[step.Seqs[i].SeqID] = i
	}
	var outs []int
	var rows, last []int32
	for r, v := range step.Verified {
		m := v.Ref.Meta
		if v.Ref.SeqID != m.SeqID {
			continue // a fork
		}
		i := seqIndex[m.SeqID]
		outs = append(outs, r)
		rows = append(rows, int32(first[i]+m.SeqlenQ-1-m.NumDrafts+len(v.TokenIDs)-1))
		last = append(last, int32(v.TokenIDs[len(v.TokenIDs)-1]))
	}
	if len(outs) == 0 {
		return drafts, nil
	}
	got, err := d.Speculative.DSpark.Draft(ctx, res.Hidden, rows, last, k, d.Speculative.ConfidenceThreshold)
	if err != nil {
		return nil, err
	}
	limits := make([]int, len(outs))
	for n, conf := range got.Confidence {
		limits[n] = spec.GatePrefix(conf, d.Speculative.ConfidenceThreshold)
	}
	budget := -1
	if b := d.Speculative.MaxVerifyTokensPerStep; b > 0 {
		budget = b
	}
	lengths := spec.GateBudget(got.Confidence, limits, budget)
	for n, r := range outs {
		drafts[r] = got.Tokens[n][:lengths[n]]
	}
	return drafts, nil
}
