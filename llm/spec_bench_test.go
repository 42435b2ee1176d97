package llm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/bench"
	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
)

// BenchmarkSpeculative generates editing requests (bench.EditingPrompts: a
// held-out passage, an instruction, and the passage's start again with a
// few words changed) greedily on the shipped model with speculation off
// (none), prompt lookup (ngram) and the model's MTP layer (mtp), k = 4, at
// batch sizes 1 and 8 (engine.max_num_seqs; 8 requests each), and reports
// output tokens/s and the mean accepted length (tokens a sequence emits per
// verify step). Skipped without the model (assets/deepseek-tiny).
//
//	go test -run X -bench Speculative -benchtime 1x ./llm
//
// deepinfer bench --speculative none,ngram,mtp --workload editing --batch 1,8
// runs the same comparison with more requests and checks the outputs.
func BenchmarkSpeculative(b *testing.B) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		b.Skip("no default model:", err)
	}
	const numPrompts = 8
	params := engine.DefaultSamplingParams()
	params.Temperature, params.MaxTokens, params.IgnoreEOS = 0, 32, true
	var prompts []llm.Prompt // tokenized by the first engine
	for _, method := range []string{"none", "ngram", "mtp"} {
		for _, batch := range []int{1, 8} {
			b.Run(fmt.Sprintf("method=%s/batch=%d", method, batch), func(b *testing.B) {
				cfg := config.Default()
				cfg.Model = dir
				cfg.Pipeline.Impl = nil
				cfg.Engine.MaxNumSeqs = batch
				cfg.Engine.MaxModelLen = 512
				cfg.Speculative.Method = method
				cfg.Speculative.NumSpeculativeTokens = 4
				if err := cfg.Validate(); err != nil {
					b.Fatal(err)
				}
				l, err := llm.NewLLM(&cfg, llm.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				if prompts == nil {
					tok := l.Tokenizer()
					texts, err := bench.EditingPrompts(bench.TextWorkloadOptions{NumPrompts: numPrompts, MinLen: 96, MaxLen: 160,
						Count: func(s string) int { return len(tok.Encode(s, false)) }})
					if err != nil {
						b.Fatal(err)
					}
					for _, t := range texts {
						prompts = append(prompts, llm.Prompt{IDs: tok.Encode(t.Text, true)})
					}
				}
				// Warm-up: one request, off the clock and off the counts.
				if _, err := l.Generate(context.Background(), prompts[:1], params, nil); err != nil {
					b.Fatal(err)
				}
				spec0 := l.StepStats().Spec()
				b.ResetTimer()
				start := time.Now()
				var tokens int
				for range b.N {
					res, err := l.Generate(context.Background(), prompts, params, nil)
					if err != nil {
						b.Fatal(err)
					}
					for _, c := range res {
						tokens += len(c.Outputs[0].TokenIDs)
					}
				}
				elapsed := time.Since(start)
				b.StopTimer()
				sp := l.StepStats().Spec().Sub(spec0)
				b.ReportMetric(float64(tokens)/elapsed.Seconds(), "tok/s")
				b.ReportMetric(sp.MeanAcceptedLength(), "accepted-len")
				b.ReportMetric(sp.AcceptanceRate(), "accept-rate")
				b.Logf("%s", l.Backend().Name())
			})
		}
	}
}
