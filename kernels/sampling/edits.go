package sampling

import (
	"math"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// applyEdits applies r's allowed-token mask and then its edits to logits
// in place, each token in vLLM's order and float32 arithmetic: mask, bias,
// then the penalties (see kernels.LogitEdit), the penalties only when
// r.Penalized(). Each token has at most one edit, so the result does not
// depend on the order of the edits. The ids were checked
// (kernels.SampleRow.Check). Cost: O(len(r.Edits)), plus O(vocab) with an
// allowed mask (words whose bits are all set are skipped).
func applyEdits(logits []float32, r *kernels.SampleRow) {
	penalized := r.Penalized()
	negInf := float32(math.Inf(-1))
	if r.Allowed != nil {
		applyAllowed(logits, r.Allowed)
	}
	for _, e := range r.Edits {
		x := logits[e.Token]
		if e.Flags&kernels.EditMask != 0 {
			x = negInf
		}
		if e.Flags&kernels.EditBias != 0 {
			x += e.Bias
		}
		if penalized && e.Flags&kernels.EditSeen != 0 {
			x = penalize(x, r, e.Count)
		}
		logits[e.Token] = x
	}
}

// penalize applies vLLM's penalties to one logit x of a token of the
// prompt or the output: repetition, then frequency and presence (for a
// token of the output, count > 0), in float32 as vLLM does.
func penalize(x float32, r *kernels.SampleRow, count int32) float32 {
	if r.RepetitionPenalty != 1 {
		if x > 0 {
			x /= r.RepetitionPenalty
		} else {
			x *= r.RepetitionPenalty
		}
	}
	if count > 0 {
		x -= r.FrequencyPenalty * float32(count)
		x -= r.PresencePenalty
	}
	return x
}

// applyAllowed sets the logits of the tokens whose bit of allowed is clear
// to -Inf.
func applyAllowed(logits []float32, allowed []uint32) {
	negInf := float32(math.Inf(-1))
	for w := 0; w*32 < len(logits); w++ {
		word := allowed[w]
		if word == ^uint32(0) {
			continue
		}
		hi := min(len(logits), w*32+32)
		for t := w * 32; t < hi; t++ {
			if word>>(t&31)&1 == 0 {
				logits[t] = negInf
			}
		}
	}
}
