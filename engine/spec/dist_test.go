package spec

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels/sampling"
)

// The distribution tests run the engine's loop on toy models over a
// vocabulary of 6 tokens: the "target model" and the drafter are Markov
// chains (a row depends on the last token only), a step drafts
// draftLen tokens, the target scores them, a verifier keeps a prefix, and
// steps repeat until the sequence has emitLen tokens. The emitted prefixes
// of many sequences must follow the target chain's exact law.
const (
	vocab    = 6
	draftLen = 3
	emitLen  = 3
	trials   = 200_000
	// controlTrials runs the negative controls, whose p-values are 0 to
	// machine precision long before this.
	controlTrials = 20_000
	// minPValue is the significance of every chi-square check: with fixed
	// seeds the tests are deterministic, and a correct verifier passes
	// with a wide margin.
	minPValue = 1e-4
)

// chain is a Markov chain over the vocabulary: start is the row after the
// prompt, next[x] the row after token x.
type chain struct {
	start []float32
	next  [vocab][]float32
}

func (c *chain) row(last int) []float32 {
	if last < 0 {
		return c.start
	}
	return c.next[last]
}

// target is the "target model". Token 5 has probability 0 at the start.
var target = chain{
	start: []float32{0.30, 0.05, 0.20, 0.15, 0.30, 0},
	next: [vocab][]float32{
		{0.10, 0.30, 0.05, 0.25, 0.10, 0.20},
		{0.40, 0.05, 0.15, 0.10, 0.20, 0.10},
		{0.05, 0.10, 0.50, 0.10, 0.05, 0.20},
		{0.20, 0.20, 0.20, 0.10, 0.25, 0.05},
		{0.15, 0.05, 0.10, 0.30, 0.30, 0.10},
		{0.25, 0.15, 0.15, 0.15, 0.15, 0.15},
	},
}

// drafter is the draft model: it proposes token 5 (impossible under the
// target) at the start and never token 0 there (likely under the target);
// after token 4 it equals the target.
var drafter = chain{
	start: []float32{0, 0.25, 0.25, 0.10, 0.10, 0.30},
	next: [vocab][]float32{
		{0.30, 0.10, 0.20, 0.05, 0.30, 0.05},
		{0.10, 0.30, 0.10, 0.30, 0.10, 0.10},
		{0.20, 0.20, 0.20, 0.20, 0.10, 0.10},
		{0.05, 0.45, 0.10, 0.10, 0.20, 0.10},
		{0.15, 0.05, 0.10, 0.30, 0.30, 0.10},
		{0.50, 0.10, 0.10, 0.10, 0.10, 0.10},
	},
}

// drawFrom draws from row (any positive sum) by inverse CDF with uniform r.
func drawFrom(row []float32, r float64) int {
	var sum float64
	for _, v := range row {
		sum += float64(v)
	}
	return drawRow(row, sum, r)
}

// oneHot[x] is the row of a deterministic drafter that proposes x.
var oneHot = func() (rows [vocab][]float32) {
	for x := range rows {
		rows[x] = make([]float32, vocab)
		rows[x][x] = 1
	}
	return rows
}()

// argmax is the greedy drafter's choice, the lowest token on ties.
func argmax(row []float32) int {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return best
}

// verifier verifies one step whose draft starts at output position step of
// the sequence with seed, and returns the emitted tokens.
type verifier func(p, q [][]float32, draft []int, seed, step uint64) ([]int, error)

// rejection is RejectionSample with the engine's uniforms.
func rejection(p, q [][]float32, draft []int, seed, step uint64) ([]int, error) {
	tokens, _, err := RejectionSample(p, q, draft, SeededUniforms(seed, step))
	return tokens, err
}

// sampleAndCompare is the verifier of a deterministic drafter: sample every
// target token with the non-speculative sampler's uniform for its output
// position, then VerifyGreedy. q is unused.
func sampleAndCompare(p, _ [][]float32, draft []int, seed, step uint64) ([]int, error) {
	t := make([]int, len(p))
	for j, row := range p {
		t[j] = drawFrom(row, sampling.Uniform(seed, step+uint64(j), sampling.DrawSample))
	}
	return t[:VerifyGreedy(draft, t)+1], nil
}

// acceptAll is a wrong verifier: it keeps every draft token.
func acceptAll(p, _ [][]float32, draft []int, seed, step uint64) ([]int, error) {
	bonus := drawFrom(p[len(draft)], SeededUniforms(seed, step)(len(draft), PurposeResample))
	return append(slices.Clone(draft), bonus), nil
}

// resampleFromP is a wrong verifier with a classic bug: on rejection it
// draws from p instead of the residual max(0, p - q).
func resampleFromP(p, q [][]float32, draft []int, seed, step uint64) ([]int, error) {
	u := SeededUniforms(seed, step)
	for j, x := range draft {
		pj, qj := float64(p[j][x]), float64(q[j][x])
		if u(j, PurposeAccept)*qj >= pj {
			return append(slices.Clone(draft[:j]), drawFrom(p[j], u(j, PurposeResample))), nil
		}
	}
	return append(slices.Clone(draft), drawFrom(p[len(draft)], u(len(draft), PurposeResample))), nil
}

// generate emits the first n tokens of the sequence with seed by
// speculative steps. With greedy the drafter proposes its argmax (q
// one-hot), otherwise it samples from its chain with r.
func generate(n int, seed uint64, greedy bool, verify verifier, r *rand.Rand) ([]int, error) {
	out := make([]int, 0, n+draftLen)
	last := -1
	p := make([][]float32, draftLen+1)
	q := make([][]float32, draftLen)
	draft := make([]int, draftLen)
	for len(out) < n {
		ctx := last
		for j := range draftLen {
			p[j] = target.row(ctx)
			if greedy {
				draft[j] = argmax(drafter.row(ctx))
				q[j] = oneHot[draft[j]]
			} else {
				q[j] = drafter.row(ctx)
				draft[j] = drawFrom(q[j], r.Float64())
			}
			ctx = draft[j]
		}
		p[draftLen] = target.row(ctx)
		tokens, err := verify(p, q, draft, seed, uint64(len(out)))
		if err != nil {
			return nil, err
		}
		out = append(out, tokens...)
		last = out[len(out)-1]
	}
	return out[:n], nil
}

// prefixLaw returns the target chain's exact probability of every sequence
// of n tokens, indexed in base vocab (first token most significant), from
// the normalized float32 rows the verifiers see.
func prefixLaw(n int) []float64 {
	norm := func(row []float32) []float64 {
		var s float64
		for _, v := range row {
			s += float64(v)
		}
		out := make([]float64, len(row))
		for i, v := range row {
			out[i] = float64(v) / s
		}
		return out
	}
	law := norm(target.start)
	for range n - 1 {
		next := make([]float64, len(law)*vocab)
		for idx, pr := range law {
			row := norm(target.row(idx % vocab))
			for y, py := range row {
				next[idx*vocab+y] = pr * py
			}
		}
		law = next
	}
	return law
}

// distributionPValues runs trials sequences (seeds 0 .. trials-1) and returns the chi-square
// p-values of their first 1, 2, ..., emitLen tokens against the target's
// law.
func distributionPValues(t *testing.T, trials int, greedy bool, verify verifier) []float64 {
	t.Helper()
	counts := make([][]int, emitLen)
	for n := range counts {
		size := vocab
		for range n {
			size *= vocab
		}
		counts[n] = make([]int, size)
	}
	r := rand.New(rand.NewPCG(11, 12))
	for seed := range uint64(trials) {
		tokens, err := generate(emitLen, seed, greedy, verify, r)
		if err != nil {
			t.Fatal(err)
		}
		idx := 0
		for n, x := range tokens {
			idx = idx*vocab + x
			counts[n][idx]++
		}
	}
	pvals := make([]float64, emitLen)
	for n := range counts {
		stat, df := ChiSquare(counts[n], prefixLaw(n+1))
		pvals[n] = ChiSquarePValue(stat, df)
	}
	return pvals
}

// TestDistribution checks that speculative decoding emits the target's
// law: the first token, the first two (joint) and the first three (joint),
// by chi-square, for RejectionSample with a sampling drafter, and for a
// greedy (one-hot) drafter verified both by RejectionSample and by
// sample-and-compare (VerifyGreedy over independently sampled target
// tokens). The negative controls run the same check (on fewer sequences)
// on wrong verifiers and must fail it, so that the check has the power to
// fail.
func TestDistribution(t *testing.T) {
	cases := []struct {
		name   string
		greedy bool
		verify verifier
		wrong  bool // a negative control: some check must fail
	}{
		{"rejection sampling drafter", false, rejection, false},
		{"rejection greedy drafter", true, rejection, false},
		{"sample-and-compare greedy drafter", true, sampleAndCompare, false},
		{"control accept all", false, acceptAll, true},
		{"control resample from p", false, resampleFromP, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			trials := trials
			if c.wrong {
				trials = controlTrials
			}
			pvals := distributionPValues(t, trials, c.greedy, c.verify)
			t.Logf("p-values of the first 1..%d tokens: %.3g", emitLen, pvals)
			minP := slices.Min(pvals)
			if !c.wrong && minP <= minPValue {
				t.Fatalf("emitted tokens do not follow the target: p-values %.3g, want all > %g", pvals, minPValue)
			}
			if c.wrong && minP > minPValue {
				t.Fatalf("a wrong verifier passed: p-values %.3g, want one <= %g", pvals, minPValue)
			}
		})
	}
}

// TestSampleAndCompareMatchesNonSpeculative checks the stronger property of
// VerifyGreedy: with the sampler's uniform for each output position, the
// tokens emitted with a deterministic drafter (here prompt lookup) are
// exactly those of non-speculative decoding with the same seed.
func TestSampleAndCompareMatchesNonSpeculative(t *testing.T) {
	prompt := []int{0, 1, 2, 3, 0, 1, 2}
	const n = 24
	accepted := 0
	for seed := range uint64(300) {
		// Non-speculative: one token per step.
		want := make([]int, 0, n)
		last := prompt[len(prompt)-1]
		for s := range uint64(n) {
			x := drawFrom(target.row(last), sampling.Uniform(seed, s, sampling.DrawSample))
			want = append(want, x)
			last = x
		}

		// Speculative, drafting by prompt lookup over prompt and output.
		history := slices.Clone(prompt)
		var got []int
		for len(got) < n {
			draft := PromptLookup(history, 1, 3, draftLen)
			p := make([][]float32, len(draft)+1)
			ctx := history[len(history)-1]
			for j := range p {
				p[j] = target.row(ctx)
				if j < len(draft) {
					ctx = draft[j]
				}
			}
			tokens, err := sampleAndCompare(p, nil, draft, seed, uint64(len(got)))
			if err != nil {
				t.Fatal(err)
			}
			accepted += len(tokens) - 1
			got = append(got, tokens...)
			history = append(history, tokens...)
		}
		if !slices.Equal(got[:n], want) {
			t.Fatalf("seed %d: speculative %v, non-speculative %v", seed, got[:n], want)
		}
	}
	if accepted == 0 {
		t.Fatal("no draft token was ever accepted: the test compares nothing")
	}
	t.Logf("%d draft tokens accepted", accepted)
}

func ExampleRejectionSample() {
	// Target rows after the context, and after the context and draft[0];
	// the drafter's row.
	p := [][]float32{{0.3, 0.7}, {0.5, 0.5}}
	q := [][]float32{{0.6, 0.4}}
	draft := []int{0} // drawn from q[0]; accepted with probability 0.3/0.6
	tokens, accepted, err := RejectionSample(p, q, draft, SeededUniforms(42, 0))
	fmt.Println(len(tokens) == accepted+1, err)
	// Output: true <nil>
}
