package llm

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/spec"
)

// homogeneity is the chi-square test that two samples come from one
// distribution: categories rarer than 5 expected in either sample are
// pooled. It returns the p-value and the categories used.
func homogeneity(a, b map[string]int) (float64, int) {
	na, nb := 0, 0
	for _, c := range a {
		na += c
	}
	for _, c := range b {
		nb += c
	}
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var oa, ob []int
	restA, restB := 0, 0
	for k := range keys {
		tot := a[k] + b[k]
		if float64(tot)*float64(min(na, nb))/float64(na+nb) < 5 {
			restA, restB = restA+a[k], restB+b[k]
			continue
		}
		oa, ob = append(oa, a[k]), append(ob, b[k])
	}
	oa, ob = append(oa, restA), append(ob, restB)
	stat, df := 0.0, len(oa)-1
	for i := range oa {
		tot := float64(oa[i] + ob[i])
		if tot == 0 {
			df--
			continue
		}
		for _, c := range [][2]float64{{float64(oa[i]), float64(na)}, {float64(ob[i]), float64(nb)}} {
			e := tot * c[1] / float64(na+nb)
			stat += (c[0] - e) * (c[0] - e) / e
		}
	}
	return spec.ChiSquarePValue(stat, df), df + 1
}

// Sampled output with speculation has the target's distribution: on the
// shipped model with its MTP drafter, the third and fourth tokens (drafted
// by the MTP layer and verified: a fork's first decode has no draft) of
// 400 seeded samples pass a chi-square
// homogeneity test against 400 samples without speculation drawn with
// other seeds; the same test tells apart the same model at another
// temperature, so it has the power to fail.
func TestSpeculativeSampledDistribution(t *testing.T) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	const n = 400
	sample := func(method string, seed int64, temperature float32) [2]map[string]int {
		l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
			c.Pipeline.Impl = nil
			c.Engine.MaxNumSeqs = n
			c.Engine.MaxNumBatchedTokens = 2048
			c.Cache.NumBlocks = 2 * n
			c.Speculative.Method = method
			c.Speculative.NumSpeculativeTokens = 2
		}), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return laterTokenCounts(t, l, n, seed, temperature, method != "")
	}
	on := sample("mtp", 1, 1)
	off := sample("", 100000, 1)
	cold := sample("", 200000, 0.5)
	checkSameDistribution(t, on, off)
	pc, cc := homogeneity(off[0], cold[0])
	t.Logf("third token: p = %.3g over %d categories (temperature 1 vs 0.5)", pc, cc)
	if pc > 1e-3 {
		t.Errorf("third token: the test cannot tell temperature 1 from 0.5: p = %.3g", pc)
	}
}

// laterTokenCounts draws n seeded samples of 5 tokens continuing "The old
// house" at temperature (ignore_eos) and counts the third and the fourth
// token's values; with speculative, it also checks that drafts were
// accepted (the samples went through verification).
func laterTokenCounts(t *testing.T, l *LLM, n int, seed int64, temperature float32, speculative bool) [2]map[string]int {
	t.Helper()
	p := engine.DefaultSamplingParams()
	p.N, p.MaxTokens, p.Temperature, p.Seed, p.IgnoreEOS = n, 5, temperature, &seed, true
	res, err := l.Generate(context.Background(), []Prompt{{Text: "The old house"}}, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := [2]map[string]int{{}, {}}
	for _, o := range res[0].Outputs {
		if len(o.TokenIDs) != 5 {
			t.Fatalf("%d tokens", len(o.TokenIDs))
		}
		out[0][fmt.Sprint(o.TokenIDs[2])]++
		out[1][fmt.Sprint(o.TokenIDs[3])]++
	}
	if speculative {
		sp := l.StepStats().Spec()
		if sp.NumAcceptedTokens == 0 {
			t.Errorf("no draft accepted (%d drafted)", sp.NumDraftTokens)
		}
		t.Logf("%d of %d draft tokens accepted", sp.NumAcceptedTokens, sp.NumDraftTokens)
	}
	return out
}

// checkSameDistribution fails when a chi-square homogeneity test rejects
// that on and off (counts of the third and fourth tokens) come from one
// distribution (p < 1e-3), or when there are too few categories for the
// test to say anything.
func checkSameDistribution(t *testing.T, on, off [2]map[string]int) {
	t.Helper()
	for i, what := range []string{"third token", "fourth token"} {
		p, cats := homogeneity(on[i], off[i])
		t.Logf("%s: p = %.3g over %d categories (speculation on vs off)", what, p, cats)
		if p < 1e-3 {
			t.Errorf("%s: speculation changes the distribution: p = %.3g", what, p)
		}
		if cats < 3 {
			t.Errorf("%s: only %d categories: the test says nothing", what, cats)
		}
	}
}
