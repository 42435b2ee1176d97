package spec

import (
	"cmp"
	"math"
	"slices"
)

// Confidence-gated verification (DSpark). A drafter that predicts, for
// each draft position j, the probability c_j that the target accepts d_j
// given that it accepted d_0..d_{j-1}, predicts the probability that the
// target accepts at least j+1 drafts as the running product
// P_j = c_0*...*c_j, and the expected number of accepted drafts among the
// first n as P_0 + ... + P_{n-1}. Verifying a draft costs a row of the
// target's forward pass whether or not it is accepted; these helpers
// choose how many drafts each sequence verifies.

// GatePrefix returns how many of a sequence's drafts to verify: the
// longest prefix whose predicted cumulative acceptance P_j clears
// threshold (0 when even the first does not; every draft at threshold 0).
// conf holds c_0, c_1, ... Cost: O(len(conf)).
func GatePrefix(conf []float64, threshold float64) int {
	p := 1.0
	for j, c := range conf {
		p *= c
		if p < threshold {
			return j
		}
	}
	return len(conf)
}

// GateBudget deals a step's budget of verified draft tokens to sequences.
// Sequence s may verify up to limits[s] drafts, with confidences conf[s];
// each draft a sequence adds costs one verified token and earns its
// predicted cumulative acceptance P_j. Drafts are taken, best first, by
// their expected accepted tokens per verified token (P_j itself, since
// each costs one), a sequence's j-th draft only after its (j-1)-th: since
// P_j never increases with j, that is the greedy optimum of expected
// accepted tokens for the budget. Ties go to the lower sequence index.
// budget < 0 means no limit (the limits alone). It returns the number of
// drafts each sequence verifies. Cost: O(D log D) for D drafts in all.
func GateBudget(conf [][]float64, limits []int, budget int) []int {
	all := allowedDrafts(conf, limits)
	if budget < 0 || budget >= len(all) {
		return draftCounts(len(conf), all)
	}
	n := make([]int, len(conf))
	rankDrafts(all)
	for _, c := range all {
		if budget == 0 {
			break
		}
		if c.pos == n[c.seq] { // the next draft of its sequence
			n[c.seq]++
			budget--
		}
	}
	return n
}

// gatedDraft is draft pos of sequence seq, with its predicted cumulative
// acceptance p (P_pos).
type gatedDraft struct {
	seq, pos int
	p        float64
}

// allowedDrafts lists the drafts limits allow, by sequence then position.
func allowedDrafts(conf [][]float64, limits []int) []gatedDraft {
	var all []gatedDraft
	for s, c := range conf {
		p := 1.0
		for j := 0; j < min(limits[s], len(c)); j++ {
			p *= c[j]
			all = append(all, gatedDraft{s, j, p})
		}
	}
	return all
}

// draftCounts returns, for each of numSeqs sequences, how many drafts it
// verifies when it verifies drafts (a prefix of each sequence's).
func draftCounts(numSeqs int, drafts []gatedDraft) []int {
	n := make([]int, numSeqs)
	for _, c := range drafts {
		n[c.seq] = max(n[c.seq], c.pos+1)
	}
	return n
}

// rankDrafts sorts drafts best first: by P descending, then sequence,
// then position. Within a sequence P never increases, so each
// sequence's drafts stay in order. Cost: O(D log D).
func rankDrafts(all []gatedDraft) {
	slices.SortStableFunc(all, func(a, b gatedDraft) int {
		if c := cmp.Compare(b.p, a.p); c != 0 {
			return c
		}
		if c := cmp.Compare(a.seq, b.seq); c != 0 {
			return c
		}
		return cmp.Compare(a.pos, b.pos)
	})
}

// ExpectedAccepted returns P_0 + ... + P_{n-1}, the expected number of
// drafts the target accepts among the first n (see GatePrefix).
func ExpectedAccepted(conf []float64, n int) float64 {
	p, sum := 1.0, 0.0
	for j := 0; j < n && j < len(conf); j++ {
		p *= conf[j]
		sum += p
	}
	return sum
}

// ReliabilityBin is one bin of a reliability table: the predictions in
// [Lo, Hi) (the last bin includes 1), their mean and the measured rate.
type ReliabilityBin struct {
	Lo, Hi              float64
	Count               int
	Predicted, Measured float64
}

// Reliability bins predicted probabilities pred against outcomes hit into
// bins equal bins of [0, 1] and returns the table and the expected
// calibration error: sum over bins of Count/N * |Predicted - Measured|.
// Cost: O(len(pred)).
func Reliability(pred []float64, hit []bool, bins int) ([]ReliabilityBin, float64) {
	table := make([]ReliabilityBin, bins)
	for i := range table {
		table[i].Lo, table[i].Hi = float64(i)/float64(bins), float64(i+1)/float64(bins)
	}
	for i, p := range pred {
		b := min(int(math.Floor(p*float64(bins))), bins-1)
		b = max(b, 0)
		table[b].Count++
		table[b].Predicted += p
		if hit[i] {
			table[b].Measured++
		}
	}
	ece := 0.0
	for i := range table {
		b := &table[i]
		if b.Count == 0 {
			continue
		}
		b.Predicted /= float64(b.Count)
		b.Measured /= float64(b.Count)
		ece += float64(b.Count) / float64(len(pred)) * math.Abs(b.Predicted-b.Measured)
	}
	return table, ece
}
