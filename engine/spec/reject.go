package spec

import (
	"errors"
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/kernels/sampling"
)

// Errors of RejectionSample.
var (
	// ErrShape: the rows of p and q do not match the draft (row counts) or
	// each other (vocabulary sizes).
	ErrShape = errors.New("probability rows do not match the draft")
	// ErrInvalidDistribution: a probability row has a NaN, negative or
	// +Inf entry, or sums to 0.
	ErrInvalidDistribution = errors.New("invalid probability row")
	// ErrInvalidDraft: a draft token is outside the vocabulary, or has
	// probability 0 under the drafter's row, so that it cannot have been
	// drawn from it.
	ErrInvalidDraft = errors.New("invalid draft token")
)

// Purposes of the uniforms that RejectionSample draws at one position: at
// most one of each per position.
const (
	// PurposeAccept: the acceptance test of draft[j].
	PurposeAccept uint64 = 0
	// PurposeResample: the draw from the residual at the first rejection,
	// or the bonus draw from p[len(draft)].
	PurposeResample uint64 = 1
)

// Uniforms gives the random numbers of a verifier: a uniform in [0, 1) for
// each (position, purpose), where position is the draft position j (0 ..
// len(draft)) and purpose is PurposeAccept or PurposeResample. Values for
// distinct pairs must be independent; calling it twice with one pair must
// give one value (RejectionSample asks for each pair at most once). It is
// called from the verifier's goroutine only. SeededUniforms backs it with
// the engine's counter-based generator.
type Uniforms func(position int, purpose uint64) float64

// SeededUniforms returns the Uniforms of a request with seed whose draft
// starts at output position step: position j, purpose r gives
// sampling.Uniform(seed, step+j, sampling.DrawUser+r). The draw indices
// from sampling.DrawUser on never collide with the sampler's
// (sampling.DrawSample), and positions are output positions, so the
// uniforms of a step are those of the same positions in any batch and after
// recompute. Cost: one Philox block per call; no allocation per call.
func SeededUniforms(seed, step uint64) Uniforms {
	return func(position int, purpose uint64) float64 {
		return sampling.Uniform(seed, step+uint64(position), sampling.DrawUser+purpose)
	}
}

// VerifyGreedy returns the number a of draft tokens kept: the length of the
// longest prefix with draft[j] == target[j], where target[j] is the token
// the target model chose at draft position j (after the context and
// draft[:j]); len(target) must be len(draft)+1 (it panics otherwise). The
// step emits target[:a+1]: the kept draft and the target's token at the
// first mismatch, or the bonus token target[len(draft)] when all match.
// Cost: O(a+1); no allocation.
//
// With a greedy target (target[j] the argmax of p_j) this is exact greedy
// decoding. With a sampling target it is the lossless verifier of a
// deterministic drafter (prompt lookup, a greedy draft model): draw each
// target[j] from p_j independently, with the uniform the non-speculative
// sampler would use at that output position (sampling.Uniform(seed,
// step+j, sampling.DrawSample)), keep draft tokens while target[j] ==
// draft[j], and emit target[:a+1]. This is RejectionSample with one-hot q
// (q_j(draft[j]) = 1), in distribution: RejectionSample accepts draft[j]
// with probability min(1, p_j(draft[j])/1) = P(target[j] == draft[j]); on
// rejection it draws from max(0, p_j - q_j) normalized, which is p_j
// without draft[j], renormalized: the law of target[j] given target[j] !=
// draft[j]; after a full acceptance both draw the bonus from p_K.
// Moreover, for j <= a the context of p_j (the context and draft[:j] =
// target[:j]) and the uniform are those of the non-speculative step at the
// same output position, so the emitted tokens are the very tokens
// non-speculative decoding emits with the same seed, not only equal in law
// (up to the numerics of scoring the positions in one forward pass).
func VerifyGreedy(draft []int, target []int) int {
	if len(target) != len(draft)+1 {
		panic(fmt.Sprintf("spec.VerifyGreedy: %d target tokens for %d draft tokens, want %d", len(target), len(draft), len(draft)+1))
	}
	a := 0
	for a < len(draft) && draft[a] == target[a] {
		a++
	}
	return a
}

// RejectionSample verifies a draft drawn from known distributions by
// speculative rejection sampling (Leviathan et al., ICML 2023; Chen et al.,
// 2023), so that the emitted tokens have exactly the target's distribution.
//
// p holds the target's len(draft)+1 probability rows (p[j] after the
// context and draft[:j]); q the drafter's len(draft) rows (draft[j] was
// drawn from q[j]); all rows have one length, the vocabulary size. Rows
// need not sum to 1: each is normalized by its sum. For j in order,
// draft[j] = x is accepted with probability min(1, p_j(x)/q_j(x)) (uniform
// u(j, PurposeAccept)); at the first rejection the last token is drawn from
// the residual max(0, p_j - q_j), normalized (uniform u(j,
// PurposeResample)), and verification stops; when every draft token is
// accepted the bonus token is drawn from p[len(draft)] (uniform
// u(len(draft), PurposeResample)). A residual of zero mass (p_j == q_j up
// to rounding, where rejection has probability 0 and only rounding can
// reject) is replaced by p_j. Draws walk the cumulative distribution in
// token order. It returns the emitted tokens (a new slice: draft[:accepted]
// followed by the residual or bonus token) and accepted, the number of
// draft tokens kept.
//
// Errors, checked on all rows before any draw so that they do not depend
// on the uniforms: row counts or lengths that do not match (ErrShape); a
// NaN, negative or +Inf entry, or a row summing to 0
// (ErrInvalidDistribution); a draft token outside the vocabulary, or with
// q_j(draft[j]) == 0, which cannot have been drawn from q_j
// (ErrInvalidDraft). The error names the row or position.
//
// Cost, K = len(draft), V = vocabulary size: one pass over each of the
// 2K+1 rows to check and sum it, O(1) per acceptance test, and up to two
// passes over one row for the final draw (three over one pair of rows for a
// residual); allocations: the result (and the row sums beyond 16 draft
// tokens).
func RejectionSample(p, q [][]float32, draft []int, u Uniforms) (tokens []int, accepted int, err error) {
	k := len(draft)
	if len(p) != k+1 {
		return nil, 0, fmt.Errorf("spec: %d target rows for %d draft tokens, want %d: %w", len(p), k, k+1, ErrShape)
	}
	if len(q) != k {
		return nil, 0, fmt.Errorf("spec: %d draft rows for %d draft tokens: %w", len(q), k, ErrShape)
	}
	vocab := len(p[0])
	if vocab == 0 {
		return nil, 0, fmt.Errorf("spec: empty target row 0: %w", ErrShape)
	}
	var buf [33]float64 // the sums of up to 16 draft tokens, on the stack
	sums := buf[:]
	if 2*k+1 > len(buf) {
		sums = make([]float64, 2*k+1)
	}
	sp, sq := sums[:k+1], sums[k+1:]
	for j, row := range p {
		if sp[j], err = rowSum(row, vocab); err != nil {
			return nil, 0, fmt.Errorf("spec: target row %d: %w", j, err)
		}
	}
	for j, row := range q {
		if sq[j], err = rowSum(row, vocab); err != nil {
			return nil, 0, fmt.Errorf("spec: draft row %d: %w", j, err)
		}
	}
	for j, x := range draft {
		if x < 0 || x >= vocab {
			return nil, 0, fmt.Errorf("spec: draft token %d at position %d outside the vocabulary [0, %d): %w", x, j, vocab, ErrInvalidDraft)
		}
		if q[j][x] == 0 {
			return nil, 0, fmt.Errorf("spec: draft token %d at position %d has draft probability 0, so it cannot have been drawn: %w", x, j, ErrInvalidDraft)
		}
	}

	for j, x := range draft {
		pj := float64(p[j][x]) / sp[j]
		qj := float64(q[j][x]) / sq[j]
		// u < p/q, without the division: accepted with probability
		// min(1, p/q).
		if u(j, PurposeAccept)*qj < pj {
			continue
		}
		tokens = make([]int, j+1)
		copy(tokens, draft[:j])
		tokens[j] = drawResidual(p[j], q[j], sp[j], sq[j], u(j, PurposeResample))
		return tokens, j, nil
	}
	tokens = make([]int, k+1)
	copy(tokens, draft)
	tokens[k] = drawRow(p[k], sp[k], u(k, PurposeResample))
	return tokens, k, nil
}

// rowSum checks that row has vocab entries, all finite and >= 0, with a
// positive sum, and returns the sum.
func rowSum(row []float32, vocab int) (float64, error) {
	if len(row) != vocab {
		return 0, fmt.Errorf("%d entries, want %d: %w", len(row), vocab, ErrShape)
	}
	var s float64
	for i, v := range row {
		if !(v >= 0) || math.IsInf(float64(v), 1) {
			return 0, fmt.Errorf("entry %d is %v: %w", i, v, ErrInvalidDistribution)
		}
		s += float64(v)
	}
	if !(s > 0) {
		return 0, fmt.Errorf("sums to 0: %w", ErrInvalidDistribution)
	}
	return s, nil
}

// drawRow draws a token from row/sum by inverse CDF with the uniform r in
// [0, 1): the first token whose cumulative weight exceeds r*sum. Tokens of
// weight 0 are never drawn. sum is rowSum's, so the cumulative weights end
// at sum exactly; when r*sum rounds up to it, the last token of positive
// weight is drawn.
func drawRow(row []float32, sum, r float64) int {
	target := r * sum
	var c float64
	last := -1
	for i, v := range row {
		if v > 0 {
			c += float64(v)
			last = i
			if c > target {
				return i
			}
		}
	}
	return last
}

// drawResidual draws a token from max(0, p/sp - q/sq), normalized, by
// inverse CDF with the uniform r; from p when that residual has no mass.
func drawResidual(p, q []float32, sp, sq, r float64) int {
	resid := func(i int) float64 { return max(0, float64(p[i])/sp-float64(q[i])/sq) }
	var total float64
	for i := range p {
		total += resid(i)
	}
	if !(total > 0) {
		return drawRow(p, sp, r)
	}
	target := r * total
	var c float64
	last := -1
	for i := range p {
		if w := resid(i); w > 0 {
			c += w
			last = i
			if c > target {
				return i
			}
		}
	}
	return last
}
