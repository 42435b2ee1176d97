package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
)

func newTestLLM(t *testing.T, cfg *config.Config) (*llm.LLM, error) {
	t.Helper()
	l, err := llm.NewLLM(cfg, llm.Options{})
	if err == nil {
		t.Cleanup(func() { l.Close() })
	}
	return l, err
}

// defaultModelConfig is the default config with the shipped model, small;
// the test is skipped without the model.
func defaultModelConfig(t *testing.T) *config.Config {
	t.Helper()
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Skip("no default model:", err)
	}
	cfg := config.Default()
	cfg.Model = dir
	cfg.CPU.Threads = 2
	cfg.Engine.MaxModelLen = 512
	// The tests check what drafting does; the adaptive controller's choice
	// of draft length depends on timing (spec.Controller has its own tests).
	cfg.Speculative.Adaptive = false
	return &cfg
}

// The comparison of speculative methods on the editing workload: every
// method at every batch size, in alternating order, the baseline first in
// each batch's rows; greedy outputs equal the baseline's; the methods
// drafted and prompt lookup found the repeated passage.
func TestRunSpeculative(t *testing.T) {
	cfg := defaultModelConfig(t)
	off := DefaultTextOffline(WorkloadEditing)
	off.NumSeqs, off.MinInputLen, off.MaxInputLen, off.MinOutputLen, off.MaxOutputLen = 2, 40, 60, 6, 6
	var log bytes.Buffer
	r, err := RunSpeculative(context.Background(), cfg, SpeculativeOptions{
		Offline: off, Methods: []string{"ngram", "mtp"}, NumSpeculativeTokens: 3, Batches: []int{1, 2}, Log: &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Mode != "speculative" || r.Workload != WorkloadEditing || r.NumSpeculativeTokens != 3 || r.NumRequests != 2 || len(r.Runs) != 6 {
		t.Fatalf("result %+v", r)
	}
	wantOrder := []int{0, 1, 2, 5, 4, 3}
	for i, run := range r.Runs {
		method, batch := []string{"none", "ngram", "mtp"}[i%3], 1+i/3
		if run.Method != method || run.Batch != batch || !reflect.DeepEqual(run.Order, []int{wantOrder[i]}) ||
			!reflect.DeepEqual(run.RoundThroughputs, []float64{run.Result.OutputThroughput}) {
			t.Errorf("run %d: %s at %d, order %d; want %s at %d, order %d", i, run.Method, run.Batch, run.Order, method, batch, wantOrder[i])
		}
		if !run.SameOutputs || run.NumDiffer != 0 || run.Speedup <= 0 || run.Result.TotalOutputTokens != 12 {
			t.Errorf("run %d: %+v", i, run)
		}
		sp := run.Result.Speculative
		switch {
		case method == "none" && sp != nil:
			t.Errorf("run %d: none speculated: %+v", i, sp)
		case method != "none" && (sp == nil || sp.Method != method || sp.NumSpeculativeTokens != 3 || sp.NumDrafts == 0 || sp.MeanAcceptedLength < 1):
			t.Errorf("run %d: %s: %+v", i, method, sp)
		case method == "ngram" && sp.AcceptanceRate < 0.3:
			t.Errorf("run %d: ngram on the editing workload accepts %.2f of its drafts", i, sp.AcceptanceRate)
		}
	}
	if !r.OutputsIdentical {
		t.Error("outputs differ")
	}
	if n := strings.Count(log.String(), "\n"); n != 6 || !strings.Contains(log.String(), "bench: mtp at batch 2:") {
		t.Errorf("log:\n%s", log.String())
	}
	// Two rounds at one batch size after a warm-up run of the baseline:
	// none, ngram; then ngram, none. The row is the median (here the
	// slower) round.
	log.Reset()
	r, err = RunSpeculative(context.Background(), cfg, SpeculativeOptions{Offline: off, Methods: []string{"ngram"}, Batches: []int{2}, Rounds: 2, WarmupRuns: 1, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(log.String()), "\n"); len(lines) != 5 || !strings.HasPrefix(lines[0], "bench: warm-up run 1 (none at batch 2, untimed): ") {
		t.Errorf("log with a warm-up run:\n%s", log.String())
	}
	if r.Rounds != 2 || r.WarmupRuns != 1 || len(r.Runs) != 2 || !r.OutputsIdentical || !reflect.DeepEqual(r.Runs[0].Order, []int{0, 3}) || !reflect.DeepEqual(r.Runs[1].Order, []int{1, 2}) {
		t.Fatalf("rounds: %+v", r)
	}
	for _, run := range r.Runs {
		if len(run.RoundThroughputs) != 2 || run.Result.OutputThroughput != min(run.RoundThroughputs[0], run.RoundThroughputs[1]) {
			t.Errorf("rounds: %s: %v, row %.1f", run.Method, run.RoundThroughputs, run.Result.OutputThroughput)
		}
	}
	if _, err := RunSpeculative(context.Background(), cfg, SpeculativeOptions{Offline: off, Batches: []int{0}}); err == nil {
		t.Error("batch 0: no error")
	}
	if _, err := RunSpeculative(context.Background(), cfg, SpeculativeOptions{Offline: off, Methods: []string{"medusa"}, Batches: []int{1}}); err == nil ||
		!strings.Contains(err.Error(), "speculative.method") {
		t.Errorf("unknown method: %v", err)
	}
}

func TestCompareOutputs(t *testing.T) {
	if n, first := compareOutputs([][]int{{1, 2}, {3}}, [][]int{{1, 2}, {3}}); n != 0 || first != "" {
		t.Fatalf("equal: %d %q", n, first)
	}
	n, first := compareOutputs([][]int{{1, 2, 3}, {4}, {5}}, [][]int{{1, 2, 4}, {4}, {6, 7}})
	if n != 2 || first != "request 0 from output token 2 (3 vs 3 tokens)" {
		t.Fatalf("differ: %d %q", n, first)
	}
}

// The DSpark drafter, gated and with gating off (dspark-fixed), in one
// comparison with MTP: greedy outputs equal the baseline's, every method
// drafted, and the fixed drafter verifies more drafts per draft than the
// gated one (at most k: the scheduler cuts drafts at max_tokens).
func TestRunSpeculativeDSpark(t *testing.T) {
	cfg := defaultModelConfig(t)
	cfg.Speculative.DraftModel = filepath.Join("..", "assets", "dspark-tiny")
	cfg.Speculative.ConfidenceThreshold = 0.5
	off := DefaultTextOffline(WorkloadRandom)
	off.NumSeqs, off.MinOutputLen, off.MaxOutputLen = 3, 16, 16
	r, err := RunSpeculative(context.Background(), cfg, SpeculativeOptions{
		Offline: off, Methods: []string{"mtp", "dspark", SpecDSparkFixed}, NumSpeculativeTokens: 4, Batches: []int{2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OutputsIdentical || len(r.Runs) != 4 {
		t.Fatalf("outputs identical %v, %d runs", r.OutputsIdentical, len(r.Runs))
	}
	perDraft := map[string]float64{}
	for _, run := range r.Runs[1:] {
		sp := run.Result.Speculative
		if sp == nil || sp.NumDrafts == 0 || sp.NumAcceptedTokens == 0 {
			t.Fatalf("%s: %+v", run.Method, sp)
		}
		perDraft[run.Method] = float64(sp.NumDraftTokens) / float64(sp.NumDrafts)
	}
	if f, g := perDraft[SpecDSparkFixed], perDraft["dspark"]; f > 4 || f < 3 || g >= f-1 {
		t.Errorf("draft tokens per draft %v: want about 4 for %s and fewer gated", perDraft, SpecDSparkFixed)
	}
}

// A warm-up run draws its own prompts (another seed each), of the same
// shape as the measured workload's: the same prompts would replay the
// baseline's exact steps.
func TestWarmupOffline(t *testing.T) {
	o := DefaultTextOffline(WorkloadProse)
	w0, w1 := warmupOffline(o, 0), warmupOffline(o, 1)
	if w0.Seed == o.Seed || w1.Seed == o.Seed || w0.Seed == w1.Seed {
		t.Fatalf("seeds %d, %d, %d", o.Seed, w0.Seed, w1.Seed)
	}
	w0.Seed = o.Seed
	if !reflect.DeepEqual(w0, o) {
		t.Errorf("the warm-up's workload differs in more than its seed: %+v vs %+v", w0, o)
	}
}
