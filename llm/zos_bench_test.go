package llm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
)

// BenchmarkZOS runs one workload with heavy post-processing (128 requests,
// each with several stop strings, detokenized token by token) with ZOS off
// and on, and reports output tokens/s and the host time exposed between two
// forward passes (gap-us/step). The model is the shipped default when
// present (assets/deepseek-tiny), else the random tiny Llama with a
// character tokenizer; set DEEPINFER_BENCH_MODEL to use another directory.
//
//	go test -run X -bench ZOS -benchtime 2x ./llm
//
// host-us/step is the time between two forward passes minus the sampling
// of the step before (device work in the design). Measured on a shared
// 2-core machine with the default model: ZOS off 447-515 us, on 38-57 us
// (8.5-11.9%; goal < 10%). On the way there: sampling over all cores and
// one-memmove logits copies (sample 22 ms -> 5-8 ms a step). The step
// loop's two orderings are lagged edges of the graph (sample -> forward,
// postprocess -> sample); see the commit log for the figures measured since.
func BenchmarkZOS(b *testing.B) {
	dir := os.Getenv("DEEPINFER_BENCH_MODEL")
	if dir == "" {
		if _, err := os.Stat(filepath.Join("..", "assets", "deepseek-tiny", "tokenizer.json")); err == nil {
			dir = filepath.Join("..", "assets", "deepseek-tiny")
		}
	}
	if dir == "" {
		dir = tinyLlama(b)
		writeCharTokenizer(b, dir)
	}
	params := engine.DefaultSamplingParams()
	params.Temperature, params.MaxTokens, params.IgnoreEOS = 0.8, 64, true
	seed := int64(1)
	params.Seed = &seed
	// Stop strings that rarely match: every step pays for the checks.
	params.Stop = []string{"stop here", "END OF TEXT", "###", "\n\n\n\n", "zzzz", "QQQQ", "0000", "unlikely"}
	ps := make([]Prompt, 128)
	for i := range ps {
		ps[i] = Prompt{Text: fmt.Sprintf("request %d: the quick brown fox jumps over the lazy dog", i)}
	}
	for _, zos := range []bool{false, true} {
		b.Run(fmt.Sprintf("zos=%v", zos), func(b *testing.B) {
			cfg := config.Default()
			cfg.Model = dir
			cfg.ZOS.Enabled = zos
			cfg.Engine.MaxNumSeqs = 128
			cfg.Engine.MaxNumBatchedTokens = 4096
			cfg.Pipeline.Impl = nil
			if os.Getenv("DEEPINFER_BENCH_THREADS") != "" {
				fmt.Sscan(os.Getenv("DEEPINFER_BENCH_THREADS"), &cfg.CPU.Threads)
			}
			if err := cfg.Validate(); err != nil {
				b.Fatal(err)
			}
			l, err := NewLLM(&cfg, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.ResetTimer()
			start := time.Now()
			var tokens int
			for range b.N {
				res, err := l.Generate(context.Background(), ps, params, nil)
				if err != nil {
					b.Fatal(err)
				}
				for _, c := range res {
					tokens += len(c.Outputs[0].TokenIDs)
				}
			}
			elapsed := time.Since(start)
			st := l.StepStats()
			b.ReportMetric(float64(tokens)/elapsed.Seconds(), "tok/s")
			b.ReportMetric(float64(st.MeanGap().Microseconds()), "gap-us/step")
			b.ReportMetric(float64(st.MeanExposedHost().Microseconds()), "host-us/step")
			for _, ns := range l.Graph().Stats() {
				if ns.Name == SlotSample {
					// Sampling's wait for the step before's post-processing:
					// the lagged edge postprocess -> sample.
					b.ReportMetric(float64(ns.WaitLag.Nanoseconds())/1e3/float64(st.Steps.Load()), "postwait-us/step")
				}
			}
			b.ReportMetric(float64(st.SampleNanos.Load())/1e3/float64(st.Steps.Load()), "sample-us/step")
			b.ReportMetric(float64(st.ForwardTime().Microseconds())/float64(st.Steps.Load()), "fwd-us/step")
		})
	}
}
