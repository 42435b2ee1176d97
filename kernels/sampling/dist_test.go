package sampling

import (
	"fmt"
	"slices"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// chiSquareAlpha is the significance level of the goodness-of-fit tests. The
// draws come from fixed seeds, so each test is deterministic; the level only
// decides how far from the reference distribution a (seeded) run may be.
const chiSquareAlpha = 1e-4

// chiSquare returns Pearson's statistic of the counts against the
// probabilities want for n draws and the critical value at chiSquareAlpha.
// Categories expected fewer than 5 times are pooled into one; categories of
// probability 0 must not be observed at all (reported as an error).
func chiSquare(counts []int, want []float64, n int) (stat, crit float64, err error) {
	pooledObs, pooledExp := 0.0, 0.0
	numBins := 0
	for i, c := range counts {
		e := want[i] * float64(n)
		switch {
		case want[i] == 0:
			if c != 0 {
				return 0, 0, fmt.Errorf("token %d has probability 0 but was drawn %d times", i, c)
			}
		case e < 5:
			pooledObs += float64(c)
			pooledExp += e
		default:
			d := float64(c) - e
			stat += d * d / e
			numBins++
		}
	}
	if pooledExp > 0 {
		d := pooledObs - pooledExp
		stat += d * d / pooledExp
		numBins++
	}
	if numBins < 2 {
		return 0, 0, fmt.Errorf("only %d category: nothing to test", numBins)
	}
	return stat, distuv.ChiSquared{K: float64(numBins - 1)}.Quantile(1 - chiSquareAlpha), nil
}

// drawCounts samples the row numDraws times (steps 0..numDraws-1) and counts
// the tokens.
func drawCounts(t *testing.T, raw []float32, p *kernels.SampleRow, numDraws int) []int {
	t.Helper()
	counts := make([]int, len(raw))
	s := new(Scratch)
	z := make([]float32, len(raw))
	r := *p
	for step := range uint64(numDraws) {
		copy(z, raw)
		r.Step = step
		res, err := Sample(z, &r, s)
		if err != nil {
			t.Fatal(err)
		}
		counts[res.Token]++
	}
	return counts
}

// TestDistribution draws 20000 tokens per case and compares their counts with
// the exact filtered, renormalized distribution of the plain reference.
func TestDistribution(t *testing.T) {
	const numDraws = 20000
	raw := randomRow(64, 1.5, 41)
	params := func(f func(*kernels.SampleRow)) kernels.SampleRow {
		p := defaultRow()
		p.Seed = 1234
		f(&p)
		return p
	}
	edits := inputs{
		bias:   map[int32]float32{7: 2, 8: -1},
		masked: []int32{9},
		prompt: []int32{0, 1, 2, 3},
		output: []int32{3, 4, 4, 5},
	}
	tests := []struct {
		name    string
		p       kernels.SampleRow
		edits   bool // the row has the edits of edits
		minKept int  // the case must keep at least this many tokens (else the test is weak)
	}{
		{"temperature 1", params(func(p *kernels.SampleRow) {}), false, 64},
		{"temperature 0.5", params(func(p *kernels.SampleRow) { p.Temperature = 0.5 }), false, 64},
		{"temperature 2", params(func(p *kernels.SampleRow) { p.Temperature = 2 }), false, 64},
		{"top_k 5", params(func(p *kernels.SampleRow) { p.TopK = 5 }), false, 5},
		{"top_p 0.8", params(func(p *kernels.SampleRow) { p.TopP = 0.8 }), false, 10},
		{"min_p 0.1", params(func(p *kernels.SampleRow) { p.MinP = 0.1 }), false, 10},
		{"combined", params(func(p *kernels.SampleRow) { p.Temperature, p.TopK, p.TopP, p.MinP = 0.7, 10, 0.9, 0.05 }), false, 5},
		{"bias and penalties, then filters", params(func(p *kernels.SampleRow) {
			p.Temperature, p.TopP, p.TopK = 1.2, 0.95, 30
			p.RepetitionPenalty, p.FrequencyPenalty, p.PresencePenalty = 1.3, 0.3, 0.2
		}), true, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := raw
			if tt.edits {
				z = refProcess(raw, &tt.p, edits)
				tt.p = withEdits(tt.p, edits)
			}
			want := refDist(z, &tt.p)
			kept := 0
			for _, w := range want {
				if w > 0 {
					kept++
				}
			}
			if kept < tt.minKept {
				t.Fatalf("the case keeps %d tokens, want at least %d", kept, tt.minKept)
			}
			counts := drawCounts(t, raw, &tt.p, numDraws)
			stat, crit, err := chiSquare(counts, want, numDraws)
			if err != nil {
				t.Fatal(err)
			}
			if stat > crit {
				t.Fatalf("chi-square %.1f > critical %.1f (kept %d tokens)", stat, crit, kept)
			}
			t.Logf("chi-square %.1f, critical %.1f, kept %d tokens", stat, crit, kept)
		})
	}
}

// TestDistributionPower checks that the goodness-of-fit test above can fail:
// draws compared with a neighbouring distribution must be rejected.
func TestDistributionPower(t *testing.T) {
	const numDraws = 20000
	raw := randomRow(64, 1.5, 41)
	p := defaultRow()
	p.Seed = 1234
	counts := drawCounts(t, raw, &p, numDraws)
	wrongT := p
	wrongT.Temperature = 0.9
	stat, crit, err := chiSquare(counts, refDist(raw, &wrongT), numDraws)
	if err != nil || stat <= crit {
		t.Fatalf("temperature 1 draws against temperature 0.9: chi-square %.1f, critical %.1f, %v", stat, crit, err)
	}
	// Draws from top-k 5 hit only 5 tokens: against the full distribution the
	// statistic is far above the critical value.
	topK := p
	topK.TopK = 5
	counts = drawCounts(t, raw, &topK, numDraws)
	if stat, crit, err := chiSquare(counts, refDist(raw, &p), numDraws); err != nil || stat <= crit {
		t.Fatalf("top-k draws against the full distribution: chi-square %.1f, critical %.1f, %v", stat, crit, err)
	}
	// And against a distribution that forbids a drawn token it errors.
	topK.TopK = 4
	if _, _, err := chiSquare(counts, refDist(raw, &topK), numDraws); err == nil {
		t.Fatal("top-k 5 draws against top-k 4: no error for the fifth token")
	}
	if slices.Max(counts) == numDraws {
		t.Fatal("all draws gave one token")
	}
}
