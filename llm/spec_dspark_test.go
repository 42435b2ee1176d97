package llm

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
)

// dsparkDir is the shipped DSpark drafter of the default model.
var dsparkDir = filepath.Join("..", "assets", "dspark-tiny")

// The DSpark drafter changes no token: the random workload (greedy and
// seeded sampling, n > 1, stops, prefix-cache hits, preemption) gives the
// same outputs with it as without speculation, ZOS off and on.
func TestSpeculativeDSparkSameTokens(t *testing.T) {
	testSpeculativeSameTokens(t, filepath.Join("..", "assets", "deepseek-tiny"), []struct{ method, draft string }{{"dspark", dsparkDir}}, 1)
}

// Confidence gating and the step budget change how many drafts each
// sequence verifies, never a token: long greedy and seeded continuations
// of a batch of prompts come out the same with DSpark at thresholds 0
// (every draft), 0.5 and 0.9, with and without a budget of verified draft
// tokens per step, ZOS off and on, as without speculation. Gating is seen
// to work: a higher threshold verifies fewer draft tokens per draft and
// accepts a larger share of them, and no decode row is computed that
// neither verifies a draft nor emits a token.
func TestSpeculativeDSparkGating(t *testing.T) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	prompts := []Prompt{{Text: "func main() {"}, {Text: "The old house"}, {Text: "\tif err != nil {"},
		{Text: "It was a dark and stormy night"}, {Text: "package main\n\nimport ("}, {Text: "ORLANDO\t"}}
	type variant struct {
		threshold float64
		budget    config.VerifyBudget
	}
	run := func(method string, v variant, zos bool) ([]string, float64, float64) {
		l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
			c.Pipeline.Impl = nil
			c.ZOS.Enabled = zos
			c.Engine.MaxNumBatchedTokens = 256
			c.Cache.NumBlocks = 256
			c.Speculative.Method = method
			c.Speculative.DraftModel = dsparkDir
			c.Speculative.NumSpeculativeTokens = 6
			c.Speculative.ConfidenceThreshold = v.threshold
			c.Speculative.MaxVerifyTokensPerStep = v.budget
		}), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var out []string
		for _, temp := range []float32{0, 0.8} {
			p := engine.DefaultSamplingParams()
			seed := int64(5)
			p.Temperature, p.MaxTokens, p.IgnoreEOS, p.Seed = temp, 40, true, &seed
			res, err := l.Generate(context.Background(), prompts, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				out = append(out, fmt.Sprint(r.Outputs[0].TokenIDs))
			}
		}
		// Every decode row computed is a sequence's last token or a draft
		// it verifies: none is padding, ZOS on or off (TrimDrafts drops
		// the rows a shorter draft leaves empty).
		st := l.StepStats()
		sp := st.Spec()
		if rows, seqs := st.DecodeTokens.Load(), st.DecodeSeqs.Load(); rows != seqs+sp.NumDraftTokens {
			t.Errorf("%s %+v zos %v: %d decode rows for %d decodes and %d draft tokens verified", method, v, zos, rows, seqs, sp.NumDraftTokens)
		}
		if method == "" {
			return out, 0, 0
		}
		if sp.NumDrafts == 0 || sp.NumAcceptedTokens == 0 {
			t.Errorf("%+v zos %v: %d drafts, %d accepted", v, zos, sp.NumDrafts, sp.NumAcceptedTokens)
			return out, 0, 0
		}
		perDraft := float64(sp.NumDraftTokens) / float64(sp.NumDrafts)
		share := float64(sp.NumAcceptedTokens) / float64(sp.NumDraftTokens)
		t.Logf("threshold %.1f budget %v zos %v: %d drafts, %.2f draft tokens each, %.1f%% accepted, mean accepted length %.2f",
			v.threshold, v.budget, zos, sp.NumDrafts, perDraft, 100*share, 1+float64(sp.NumAcceptedTokens)/float64(sp.NumDrafts))
		return out, perDraft, share
	}
	want, _, _ := run("", variant{}, false)
	for _, zos := range []bool{false, true} {
		var perDraft, share []float64
		for _, v := range []variant{{0, config.VerifyBudget{}}, {0.5, config.VerifyBudget{}}, {0.9, config.VerifyBudget{}}, {0.5, config.VerifyBudget{Tokens: 8}}, {0, config.VerifyBudget{Auto: true}}} {
			got, pd, sh := run("dspark", v, zos)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%+v zos %v: outputs differ from speculation off", v, zos)
				for i := range want {
					if got[i] != want[i] {
						t.Errorf("  %d: off %s\n     on  %s", i, want[i], got[i])
					}
				}
			}
			perDraft, share = append(perDraft, pd), append(share, sh)
		}
		if !(perDraft[0] > perDraft[1] && perDraft[1] > perDraft[2]) {
			t.Errorf("zos %v: draft tokens per draft %v do not fall as the threshold rises", zos, perDraft)
		}
		if !(share[0] < share[1] && share[1] < share[2]) {
			t.Errorf("zos %v: accepted shares %v do not rise with the threshold", zos, share)
		}
	}
}

// Sampled output with DSpark has the target's distribution: the third and
// fourth tokens of 400 seeded samples pass a chi-square homogeneity test
// against 400 samples without speculation drawn with other seeds (the
// power of the test on this prompt is checked by
// TestSpeculativeSampledDistribution).
func TestSpeculativeDSparkSampledDistribution(t *testing.T) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	const n = 400
	sample := func(method string, seed int64) [2]map[string]int {
		l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
			c.Pipeline.Impl = nil
			c.Engine.MaxNumSeqs = n
			c.Engine.MaxNumBatchedTokens = 4096
			c.Cache.NumBlocks = 3 * n
			c.Speculative.Method = method
			c.Speculative.DraftModel = dsparkDir
			c.Speculative.NumSpeculativeTokens = 3
			c.Speculative.ConfidenceThreshold = 0
		}), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return laterTokenCounts(t, l, n, seed, 1, method != "")
	}
	on := sample("dspark", 1)
	off := sample("", 100000)
	checkSameDistribution(t, on, off)
}
