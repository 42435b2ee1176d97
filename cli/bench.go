package cli

import (
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/bench"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func newBenchCmd(reg *pipeline.Registry) *cobra.Command {
	var (
		mode, configPath, resultFile, plotDir string
		off                                   = bench.DefaultOffline()
		seed                                  int64
		srv                                   = bench.ServeOptions{NumPrompts: 200, InputLen: 256, OutputLen: 128}
		baseURL, promptFile                   string
		rate                                  float64
		temperature                           float32
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark offline throughput (--mode offline) or a running server (--mode serve)",
		Long: "bench --mode offline runs nano-vllm's workload through the engine in this process\n" +
			"(random prompts of --min-input-len..--max-input-len tokens, --min-output-len..--max-output-len\n" +
			"tokens each with ignore_eos) and reports throughput and per-request latencies.\n" +
			"bench --mode serve sends --num-prompts streamed requests to --base-url with Poisson arrivals at\n" +
			"--request-rate (inf: all at once), random or file prompts, and reports throughput, TTFT, TPOT,\n" +
			"ITL and end-to-end latency (mean, p50, p90, p99). Both write --result-file (JSON) and PNG\n" +
			"histograms into --plot-dir when given.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			var progress io.Writer
			if isTerminal(stderr) {
				progress = stderr
			}
			var (
				result any
				dists  []bench.Distribution
			)
			switch mode {
			case "offline":
				cfg, err := config.Load(configPath)
				if err != nil {
					return err
				}
				l, err := llm.NewLLM(cfg, llm.Options{Stages: reg})
				if err != nil {
					return err
				}
				defer l.Close()
				off.Seed, off.Temperature, off.Progress = uint64(seed), temperature, progress
				r, err := bench.RunOffline(ctx, l, off)
				if err != nil {
					return err
				}
				printOffline(stdout, r)
				if d := deviceIdle(l.StepStats().DeviceTimes()); d != "" {
					fmt.Fprintln(stdout, "Device timeline:", d)
				}
				result, dists = r, r.Distributions()
			case "serve":
				srv.BaseURL, srv.RequestRate, srv.Seed, srv.Temperature, srv.Progress = baseURL, rate, uint64(seed), temperature, progress
				if promptFile != "" {
					texts, err := readPrompts(nil, promptFile, nil)
					if err != nil {
						return err
					}
					srv.Prompts = texts
				}
				r, err := bench.RunServe(ctx, srv)
				if err != nil {
					return err
				}
				printServe(stdout, r)
				result, dists = r, r.Distributions()
			default:
				return fmt.Errorf("bench: --mode must be offline or serve, got %q", mode)
			}
			if resultFile != "" {
				if err := bench.WriteJSON(resultFile, result); err != nil {
					return err
				}
				fmt.Fprintln(stderr, "result:", resultFile)
			}
			if plotDir != "" {
				files, err := bench.WritePlots(plotDir, dists)
				if err != nil {
					return err
				}
				fmt.Fprintln(stderr, "plots:", strings.Join(files, " "))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&mode, "mode", "offline", "offline (engine in this process) or serve (a running server)")
	fl.StringVar(&resultFile, "result-file", "", "write the result as JSON to this file")
	fl.StringVar(&plotDir, "plot-dir", "", "write PNG histograms of the latency distributions into this folder")
	fl.Int64Var(&seed, "seed", 0, "seed of the random workload")
	fl.Float32Var(&temperature, "temperature", 0.6, "sampling temperature of every request")
	// offline
	fl.StringVarP(&configPath, "config", "c", "configs/default.yaml", "offline: engine config (YAML)")
	fl.IntVar(&off.NumSeqs, "num-seqs", off.NumSeqs, "offline: number of sequences")
	fl.IntVar(&off.MinInputLen, "min-input-len", off.MinInputLen, "offline: shortest random prompt, in tokens")
	fl.IntVar(&off.MaxInputLen, "max-input-len", off.MaxInputLen, "offline: longest random prompt, in tokens")
	fl.IntVar(&off.MinOutputLen, "min-output-len", off.MinOutputLen, "offline: fewest tokens generated per sequence")
	fl.IntVar(&off.MaxOutputLen, "max-output-len", off.MaxOutputLen, "offline: most tokens generated per sequence")
	fl.IntVar(&off.MaxTokenID, "max-token-id", off.MaxTokenID, "offline: random prompt ids are below this (and the vocabulary size)")
	// serve
	fl.StringVar(&baseURL, "base-url", "http://127.0.0.1:8000", "serve: the server's root URL")
	fl.StringVar(&srv.Endpoint, "endpoint", "/v1/completions", "serve: /v1/completions or /v1/chat/completions")
	fl.StringVar(&srv.Model, "model", "", "serve: model name; default: the first of GET /v1/models")
	fl.IntVar(&srv.NumPrompts, "num-prompts", srv.NumPrompts, "serve: number of requests")
	fl.Float64Var(&rate, "request-rate", math.Inf(1), "serve: mean requests per second (Poisson arrivals); inf sends all at once")
	fl.IntVar(&srv.MaxConcurrency, "max-concurrency", 0, "serve: most requests in flight; 0 is unbounded")
	fl.StringVar(&promptFile, "dataset-path", "", "serve: prompts, one per line or JSONL with a \"prompt\" field; default: random prompts")
	fl.IntVar(&srv.InputLen, "input-len", srv.InputLen, "serve: random prompt length (token ids for completions, words for chat)")
	fl.IntVar(&srv.OutputLen, "output-len", srv.OutputLen, "serve: max_tokens of every request (ignore_eos)")
	fl.Float64Var(&srv.RangeRatio, "range-ratio", 0, "serve: draw input and output lengths in [len*(1-r), len*(1+r)]")
	fl.IntVar(&srv.VocabSize, "vocab-size", 0, "serve: random token ids are below this; 0 asks GET /v1/models")
	return cmd
}

func printOffline(w io.Writer, r *bench.OfflineResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "==== Offline Benchmark Result ====")
	fmt.Fprintf(tw, "Requests (failed):\t%d (%d)\n", r.NumRequests, r.Failed)
	fmt.Fprintf(tw, "Duration (s):\t%.2f\n", r.DurationSeconds)
	fmt.Fprintf(tw, "Input / output tokens:\t%d / %d\n", r.TotalInputTokens, r.TotalOutputTokens)
	fmt.Fprintf(tw, "Request throughput (req/s):\t%.2f\n", r.RequestThroughput)
	fmt.Fprintf(tw, "Output token throughput (tok/s):\t%.2f\n", r.OutputThroughput)
	fmt.Fprintf(tw, "Total token throughput (tok/s):\t%.2f\n", r.TotalThroughput)
	tw.Flush()
	printSummaries(w, []string{"TTFT", "TPOT", "E2E latency"}, []bench.Summary{r.TTFTMillis, r.TPOTMillis, r.E2EMillis})
}

func printServe(w io.Writer, r *bench.ServeResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "==== Serving Benchmark Result ====")
	fmt.Fprintf(tw, "Endpoint:\t%s%s (%s)\n", r.BaseURL, r.Endpoint, r.Model)
	fmt.Fprintf(tw, "Successful / failed requests:\t%d / %d\n", r.Completed, r.Failed)
	fmt.Fprintf(tw, "Duration (s):\t%.2f\n", r.DurationSeconds)
	fmt.Fprintf(tw, "Input / output tokens:\t%d / %d\n", r.TotalInputTokens, r.TotalOutputTokens)
	fmt.Fprintf(tw, "Request throughput (req/s):\t%.2f\n", r.RequestThroughput)
	fmt.Fprintf(tw, "Output token throughput (tok/s):\t%.2f\n", r.OutputThroughput)
	fmt.Fprintf(tw, "Total token throughput (tok/s):\t%.2f\n", r.TotalThroughput)
	tw.Flush()
	printSummaries(w, []string{"TTFT", "TPOT", "ITL", "E2E latency"}, []bench.Summary{r.TTFTMillis, r.TPOTMillis, r.ITLMillis, r.E2EMillis})
	for _, e := range r.Errors {
		fmt.Fprintln(w, "error:", e)
	}
}

func printSummaries(w io.Writer, names []string, sums []bench.Summary) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ms\tmean\tp50\tp90\tp99\tcount\t")
	for i, s := range sums {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t\n", names[i], s.Mean, s.Median, s.P90, s.P99, s.Count)
	}
	tw.Flush()
}
