// Package sampling is the host reference sampler: it turns one row of f32
// logits into a token exactly as vLLM's V1 sampler defines each knob, and
// reports the logprobs vLLM reports. It is pure Go, deterministic and
// batch-invariant: a row's result depends only on its logits and its
// kernels.SampleRow (settings, edits, seed and step), never on other rows
// or threads. The row is the same argument the device samplers take
// (kernels.DeviceSampler), checked by the same kernels.SampleRow.Check.
//
// The order of operations, per row, follows vllm/v1/sample/sampler.py:
//
//  1. If the row asks for Logprobs, the raw row is kept for the logprobs
//     (vLLM's default logprobs_mode "raw_logprobs": the log-softmax of the
//     model's logits before any mask, bias, penalty or temperature; vLLM's
//     "processed" modes are not offered).
//  2. The row's Edits, token by token: the mask sets -Inf (the min-tokens
//     processor), then the bias is added, then the penalties of a seen
//     token: repetition (prompt and output tokens), then frequency and
//     presence (output tokens, Count > 0).
//  3. Greedy rows take the argmax, lowest id on ties, and stop here.
//  4. Otherwise: temperature, min-p, top-k, top-p (each on the distribution
//     the previous steps left), then one draw from the renormalized
//     distribution by inverse CDF with Uniform(Seed, Step, DrawSample).
//
// The draw has vLLM's distribution but not its token stream: vLLM races
// exponential noise from a torch generator; here one Philox uniform per row
// walks the cumulative distribution, which costs no random number per token
// and can be reproduced by a device kernel.
//
// Filtering never sorts the whole vocabulary: top-k is a selection of the K-th
// largest logit, min-p a threshold, and top-p bins the survivors by
// probability and sorts only the bin where the top-p mass is reached.
package sampling

import (
	"fmt"
	"math"
	"slices"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// Scratch holds the buffers of Sample so that a call allocates nothing once
// they have grown to the vocabulary. The zero value is ready to use. A Scratch
// is not safe for concurrent use: give each worker its own.
type Scratch struct {
	raw   []float32 // copy of the row for the raw logprobs
	cands []cand    // tokens that survive filtering
	heap  []float32 // top-k min-heap
	keys  []uint32  // top-k radix select keys
	radix [2048]int32
	top   []TokenLogprob
	seen  []bool // the row check's duplicate marks; all false between calls
}

// cand is a token that survived filtering, with its unnormalized
// probability w = exp((z - zmax) / T), computed as (z - zmax) * (1/T).
type cand struct {
	z  float32
	id int32
	w  float64
}

// Sample draws the next token of one row.
//
// logits is the row (length = vocabulary size). Sample modifies it in place
// at the ids of r's edits, which afterwards hold their edited values, and
// at the tokens r.Allowed masks, which hold -Inf (as a
// kernels.DeviceSampler leaves its logits); other entries are unchanged.
// r is checked by kernels.SampleRow.Check (an invalid row leaves the
// logits untouched) and only read: its Seed and Step key the random draw,
// so the same (Seed, Step) gives the same token in any batch and after
// recompute; with Logprobs it reports the raw row's logprobs. s may be nil
// (buffers are then allocated); Result.Top aliases s.
//
// Errors: an invalid row (kernels.ErrSampleParams, kernels.ErrOutOfRange);
// an empty row, or NaN/+Inf at a token that is not masked, or anywhere
// when r.Logprobs (ErrInvalidLogits); every token -Inf (ErrNoCandidates).
//
// Cost, V = vocabulary size: the edits cost O(len(r.Edits)) (checked, then
// applied); greedy is one pass; sampling adds one exp per token that
// survives min-p and top-k (K exps with top-k), a pass for the K-th largest
// logit with top-k, and with top-p two passes over the survivors plus a
// sort of those in the bin where the top-p mass is reached (1/16 nat wide;
// on a flat distribution a large share of the row). Logprobs add a copy of
// the row and two passes with one exp per token.
func Sample(logits []float32, r *kernels.SampleRow, s *Scratch) (Result, error) {
	vocabSize := len(logits)
	if vocabSize == 0 {
		return Result{}, fmt.Errorf("sampling: empty logits row: %w", ErrInvalidLogits)
	}
	if s == nil {
		s = new(Scratch)
	}
	if len(r.Edits) > 0 && len(s.seen) < vocabSize {
		s.seen = make([]bool, vocabSize)
	}
	if err := r.Check(vocabSize, s.seen); err != nil {
		return Result{}, fmt.Errorf("sampling: row: %w", err)
	}
	if r.Logprobs {
		s.raw = append(s.raw[:0], logits...)
	}
	applyEdits(logits, r)

	best, err := argmax(logits)
	if err != nil {
		return Result{}, err
	}
	token := best
	if !r.Greedy {
		token = s.sampleRandom(logits, float64(logits[best]), r)
	}
	if !r.Logprobs {
		return Result{Token: token}, nil
	}
	s.top = slices.Grow(s.top[:0], min(r.NumLogprobs, vocabSize))
	return rawLogprobs(s.raw, token, r.NumLogprobs, s.top)
}

// argmax returns the index of the largest logit, the lowest index on ties.
func argmax(logits []float32) (int32, error) {
	best := int32(-1)
	bestVal := float32(math.Inf(-1))
	for i, v := range logits {
		if v > bestVal {
			bestVal, best = v, int32(i)
		} else if v != v {
			return 0, fmt.Errorf("sampling: logit %d is NaN: %w", i, ErrInvalidLogits)
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("sampling: all %d logits are -Inf: %w", len(logits), ErrNoCandidates)
	}
	if bestVal > math.MaxFloat32 {
		return 0, fmt.Errorf("sampling: logit %d is +Inf: %w", best, ErrInvalidLogits)
	}
	return best, nil
}

// ceil32 is the smallest float32 f with float64(f) >= x.
func ceil32(x float64) float32 {
	f := float32(x)
	if float64(f) < x {
		f = math.Nextafter32(f, float32(math.Inf(1)))
	}
	return f
}

// sampleRandom applies temperature, min-p, top-k and top-p to the edited
// row and draws a token. zmax is the row's largest logit (finite).
func (s *Scratch) sampleRandom(logits []float32, zmax float64, r *kernels.SampleRow) int32 {
	return draw(s.filter(logits, zmax, r), Uniform(r.Seed, r.Step, DrawSample))
}

// filter returns the tokens that survive temperature, min-p, top-k and top-p
// with their unnormalized probabilities, in index order, or in topP's order
// when top-p is on. The result aliases s.cands and always holds
// the largest logit's token.
func (s *Scratch) filter(logits []float32, zmax float64, r *kernels.SampleRow) []cand {
	temp := float64(r.Temperature)
	// Min-p and top-k both keep the tokens at or above a logit cut: min-p's
	// p_i >= min_p * p_max is z_i >= zmax + T ln(min_p); top-k's is the K-th
	// largest logit (temperature keeps the order). The initial cut drops -Inf.
	cut := float32(-math.MaxFloat32)
	if r.MinP > 0 {
		cut = max(cut, ceil32(zmax+temp*math.Log(float64(r.MinP))))
	}
	if r.TopK > 0 && r.TopK < len(logits) {
		cut = max(cut, s.kthLargest(logits, r.TopK))
	}

	if cap(s.cands) < len(logits) {
		s.cands = make([]cand, len(logits))
	}
	c := s.cands[:len(logits)]
	invTemp := 1 / temp
	n := 0
	total := 0.0
	for i, z := range logits {
		if z >= cut {
			w := math.Exp((float64(z) - zmax) * invTemp)
			c[n] = cand{z: z, id: int32(i), w: w}
			n++
			total += w
		}
	}
	c = c[:n]
	if r.TopP < 1 {
		c = topP(c, total, zmax, invTemp, float64(r.TopP))
	}
	return c
}

// draw picks a token from the survivors c by inverse CDF with the uniform u
// in [0, 1), walking c in its order. The sum is taken in the same order as
// the walk, so the last positive-weight survivor always closes it.
func draw(c []cand, u float64) int32 {
	kept := 0.0
	for _, e := range c {
		kept += e.w
	}
	target := u * kept
	acc := 0.0
	last := c[0].id
	for _, e := range c {
		if e.w == 0 {
			continue
		}
		acc += e.w
		last = e.id
		if acc > target {
			return e.id
		}
	}
	// Not reached: u < 1 makes target < kept, and acc ends at kept.
	return last
}

// Top-p bins: a survivor's bin is its distance below the largest logit, in
// nats after temperature, over topPBinWidth; the last bin takes the rest. A
// token of a lower bin has a larger logit than any token of a higher bin.
const (
	topPBinWidth = 1.0 / 16
	topPNumBins  = 512
)

func topPBin(z float32, zmax, invTemp float64) int {
	d := (zmax - float64(z)) * invTemp * (1 / topPBinWidth)
	if d >= topPNumBins-1 {
		return topPNumBins - 1
	}
	return int(d)
}

// topPMargin is the relative margin that keeps the bin shortcuts of topP
// exact despite the rounding of sums taken in different orders.
const topPMargin = 1e-9

// topP keeps the tokens of c that have less than topP * total mass before
// them in the order by logit descending, ties by lower id (total is the mass
// of c), and returns them: first those of the bins entirely below the limit,
// in index order, then the rest in sorted order.
//
// Only the boundary bin is sorted. The boundary bin is the first whose
// cumulative mass reaches the limit: a token of a later bin has at least the
// limit before it and is dropped; a token of an earlier bin has less than the
// mass of the earlier bins before it and is kept. If the earlier bins' mass
// is within topPMargin of the limit, they are sorted too.
func topP(c []cand, total, zmax, invTemp, topP float64) []cand {
	limit := topP * total
	var mass [topPNumBins]float64
	for _, e := range c {
		mass[topPBin(e.z, zmax, invTemp)] += e.w
	}
	boundary := topPNumBins - 1
	below := 0.0 // mass of the bins before the boundary bin
	for b := range mass {
		if below+mass[b] >= limit*(1+topPMargin) {
			boundary = b
			break
		}
		below += mass[b]
	}
	firstSorted := boundary
	if below >= limit*(1-topPMargin) {
		firstSorted = 0
	}
	// Drop the bins after the boundary; move the surely kept tokens to the
	// front in index order (the others' order does not matter: they are
	// sorted next).
	n, numKept := 0, 0
	for _, e := range c {
		b := topPBin(e.z, zmax, invTemp)
		if b > boundary {
			continue
		}
		c[n] = e
		if b < firstSorted {
			c[n], c[numKept] = c[numKept], c[n]
			numKept++
		}
		n++
	}
	c = c[:n]
	slices.SortFunc(c[numKept:], func(a, b cand) int {
		switch {
		case a.z > b.z:
			return -1
		case a.z < b.z:
			return 1
		}
		return int(a.id - b.id)
	})
	before := 0.0
	for _, e := range c[:numKept] {
		before += e.w
	}
	for numKept < len(c) && before < limit {
		before += c[numKept].w
		numKept++
	}
	return c[:numKept]
}

// logSumExp returns log(sum(exp(x))) in float64, or an error for NaN, +Inf
// or a row that is all -Inf.
func logSumExp(x []float32) (float64, error) {
	m := float32(math.Inf(-1))
	for i, v := range x {
		if v > m {
			m = v
		} else if v != v {
			return 0, fmt.Errorf("sampling: logprobs: logit %d is NaN: %w", i, ErrInvalidLogits)
		}
	}
	if m > math.MaxFloat32 {
		return 0, fmt.Errorf("sampling: logprobs: a logit is +Inf: %w", ErrInvalidLogits)
	}
	if math.IsInf(float64(m), -1) {
		return 0, fmt.Errorf("sampling: logprobs: all %d logits are -Inf: %w", len(x), ErrNoCandidates)
	}
	mf := float64(m)
	sum := 0.0
	for _, v := range x {
		sum += math.Exp(float64(v) - mf)
	}
	return mf + math.Log(sum), nil
}

// rawLogprobs fills a Result for token from the log-softmax of raw: its
// logprob, its rank and the n (clamped to the vocabulary) most likely tokens,
// written into top[:0].
func rawLogprobs(raw []float32, token int32, n int, top []TokenLogprob) (Result, error) {
	lse, err := logSumExp(raw)
	if err != nil {
		return Result{}, err
	}
	lp := float32(float64(raw[token]) - lse)
	rank := 0
	for _, v := range raw {
		if float32(float64(v)-lse) >= lp {
			rank++
		}
	}
	return Result{
		Token:   token,
		Logprob: lp,
		Rank:    rank,
		Top:     topLogprobs(top, raw, lse, min(n, len(raw))),
	}, nil
}

// PromptLogprobs returns the logprobs of one prompt position (vLLM's
// prompt_logprobs): logits is the row that predicts the prompt token next;
// the Result holds next's logprob and rank and the n most likely tokens
// (clamped to the vocabulary), from the log-softmax of the raw row. logits is
// not modified; Result.Top is newly allocated. Errors: next outside the row
// (kernels.ErrOutOfRange), n < 0 (kernels.ErrSampleParams), NaN or +Inf
// (ErrInvalidLogits), all -Inf (ErrNoCandidates). Cost: two passes with one
// exp per token, plus O(V log n) for the top entries.
func PromptLogprobs(logits []float32, next int32, n int) (Result, error) {
	if len(logits) == 0 {
		return Result{}, fmt.Errorf("sampling: prompt logprobs: empty logits row: %w", ErrInvalidLogits)
	}
	if next < 0 || int(next) >= len(logits) {
		return Result{}, fmt.Errorf("sampling: prompt logprobs: token %d not in [0, %d): %w", next, len(logits), kernels.ErrOutOfRange)
	}
	if n < 0 {
		return Result{}, fmt.Errorf("sampling: prompt logprobs: n must be >= 0, got %d: %w", n, kernels.ErrSampleParams)
	}
	return rawLogprobs(logits, next, n, make([]TokenLogprob, 0, min(n, len(logits))))
}
