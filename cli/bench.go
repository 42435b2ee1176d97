package cli

import (
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/bench"
	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func newBenchCmd(reg *pipeline.Registry) *cobra.Command {
	var (
		bf benchFlags
		ef engineFlags
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark offline throughput (--mode offline), a running server (--mode serve) or grammar masks (--mode grammar)",
		Long: "Flags are named as vLLM's `vllm bench throughput` and `vllm bench serve` name them.\n" +
			"bench --mode offline runs nano-vllm's workload through the engine in this process\n" +
			"(--num-prompts random prompts of --min-input-len..--max-input-len tokens, each generating\n" +
			"--min-output-len..--max-output-len tokens with ignore_eos; --input-len/--output-len with\n" +
			"--random-range-ratio give the lengths as vLLM does) and reports throughput, per-request\n" +
			"latencies and the steps by kind (decode rows alone, with prompt chunks, prompts alone) with\n" +
			"the loop's mean time for each.\n" +
			"bench --mode serve sends --num-prompts streamed requests to --base-url with Poisson arrivals at\n" +
			"--request-rate (inf: all at once), random prompts (--dataset-name random) or a prompt file\n" +
			"(--dataset-name custom --dataset-path FILE), and reports throughput, TTFT, TPOT, ITL and\n" +
			"end-to-end latency (mean, p50 and --metric-percentiles of --percentile-metrics).\n" +
			"--workload picks the offline prompts: random (the above), prose (passages of the default\n" +
			"model's held-out text, continued freely) or editing (requests shaped as code-editing and\n" +
			"rewriting ones: a passage, an instruction, and the passage's start again with a few words\n" +
			"changed, so that the continuation largely repeats the prompt: prompt lookup's best case).\n" +
			"The text workloads cut passages of --min-input-len..--max-input-len tokens (default 128..256)\n" +
			"and generate --min-output-len..--max-output-len tokens (default 64..128), 16 prompts by default.\n" +
			"--speculative none,ngram,mtp compares speculative-decoding methods in one run: the same\n" +
			"requests with each method (none, speculation off, is the baseline, added when missing) at\n" +
			"each --batch size (engine.max_num_seqs, e.g. 1,8), each on a fresh engine, in alternating\n" +
			"order, drafting --num-speculative-tokens tokens; a table gives output tok/s, the ratio to\n" +
			"none at the same batch, mean accepted length, acceptance rate and the CPU kernels' path,\n" +
			"and \"outputs identical\" says whether every method generated the baseline's tokens;\n" +
			"--rounds N repeats every run N times (order alternating) and reports each median run, after\n" +
			"--num-warmup-runs untimed runs of other prompts (default 1: a process's first run pays for\n" +
			"lazily loaded kernels and new device allocations).\n" +
			"Both sample at --temperature (default 0, greedy, as vLLM's benchmark), write the result as\n" +
			"JSON with --save-result or --result-filename (into --result-dir) and PNG histograms into\n" +
			"--plot-dir when given.\n" +
			"bench --mode grammar runs MaskBench's protocol (the JSON Schema files of --data, each with\n" +
			"instances to accept or refuse) through engine/grammar with the --tokenizer's vocabulary, in one\n" +
			"goroutine: per file, the schema's conversion to GBNF (--whitespace), compilation and first mask\n" +
			"(TTFM; a failure is a compile error, counted by the keyword it names), then for each instance,\n" +
			"from a fresh matcher, one timed mask per token of its text until a token is refused; a valid\n" +
			"instance refused is a validation error, an invalid one accepted an invalidation error. It reports\n" +
			"the files by outcome (passing, compile errors, timeouts past --timeout, validation and\n" +
			"invalidation errors) and the TTFM and time-per-mask percentiles in microseconds.\n" +
			"bench --mode memory prints the KV memory a sequence of Gemma 3 and gpt-oss shapes takes at 8k and\n" +
			"32k tokens with their sliding-window layers in ring buffers and all paged, and how many 8k\n" +
			"sequences fit at once on an H200 each way (the engine's memory-plan arithmetic; no model is loaded).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if bf.mode == "memory" { // no engine: the memory plan's arithmetic over published shapes
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "KV memory per sequence (BF16 caches, blocks of 16) and concurrent 8k sequences on an H200 (%d GiB less the weights):\n", llm.H200Bytes>>30)
				llm.PrintWindowKVFigures(out, llm.WindowKVFigures(llm.WindowModelShapes, llm.H200Bytes, 16))
				return nil
			}
			opts, err := bf.options(cmd, time.Now())
			if err != nil {
				return err
			}
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
			switch opts.mode {
			case "grammar":
				g := opts.grammar
				tok, err := tokenizer.Load(opts.tokenizerDir)
				if err != nil {
					return fmt.Errorf("bench: --tokenizer: %w", err)
				}
				g.Tokenizer, g.TokenizerName, g.Progress = tok, opts.tokenizerDir, progress
				r, err := bench.RunGrammar(ctx, g)
				if err != nil {
					return err
				}
				printGrammar(stdout, r)
				result = r
			case "offline":
				cfg, _, err := ef.load("")
				if err != nil {
					return err
				}
				if opts.numSpecTokens > 0 {
					cfg.Speculative.NumSpeculativeTokens = opts.numSpecTokens
				}
				if opts.speculative != nil {
					sp := *opts.speculative
					sp.Engine = llm.Options{Stages: reg}
					sp.Progress, sp.Log = progress, stderr
					r, err := bench.RunSpeculative(ctx, cfg, sp)
					if err != nil {
						return err
					}
					printSpeculative(stdout, r)
					result = r
					break
				}
				if len(opts.batches) == 1 {
					cfg.Engine.MaxNumSeqs = opts.batches[0]
					cfg.Engine.MaxNumBatchedTokens = max(cfg.Engine.StepTokens(cfg.Device), opts.batches[0])
				}
				if err := cfg.Validate(); err != nil {
					return fmt.Errorf("bench: %w", err)
				}
				if so := opts.structured; so != nil {
					so.Offline.Progress, so.Log, so.Engine = progress, stderr, llm.Options{Stages: reg}
					r, err := bench.RunStructured(ctx, cfg, *so)
					if err != nil {
						return err
					}
					printStructured(stdout, r)
					result = r
					break
				}
				l, err := llm.NewLLM(cfg, llm.Options{Stages: reg})
				if err != nil {
					return err
				}
				defer l.Close()
				off := opts.offline
				off.Progress = progress
				r, err := bench.RunOffline(ctx, l, off)
				if err != nil {
					return err
				}
				dists = r.Distributions()
				r.Percentiles = bench.Percentiles(dists, opts.metrics, opts.percentiles)
				printOffline(stdout, r, opts)
				if d := deviceIdle(l.StepStats().DeviceTimes()); d != "" {
					fmt.Fprintln(stdout, "Device timeline:", d)
				}
				if sp := specReport(l.StepStats().Spec()); sp != "" {
					fmt.Fprintln(stdout, "Speculative decoding:", sp)
				}
				result = r
			case "serve":
				srv := opts.serve
				srv.Progress = progress
				if opts.datasetPath != "" {
					texts, err := readPrompts(nil, opts.datasetPath, nil)
					if err != nil {
						return err
					}
					srv.Prompts = texts
				}
				r, err := bench.RunServe(ctx, srv)
				if err != nil {
					return err
				}
				dists = r.Distributions()
				r.Percentiles = bench.Percentiles(dists, opts.metrics, opts.percentiles)
				printServe(stdout, r, opts)
				result = r
			}
			if opts.resultPath != "" {
				if dir := filepath.Dir(opts.resultPath); dir != "." {
					if err := os.MkdirAll(dir, 0o755); err != nil {
						return fmt.Errorf("bench: %w", err)
					}
				}
				if err := bench.WriteJSON(opts.resultPath, result); err != nil {
					return err
				}
				fmt.Fprintln(stderr, "result:", opts.resultPath)
			}
			if opts.plotDir != "" {
				files, err := bench.WritePlots(opts.plotDir, dists)
				if err != nil {
					return err
				}
				fmt.Fprintln(stderr, "plots:", strings.Join(files, " "))
			}
			return nil
		},
	}
	bf.register(cmd)
	ef.register(cmd, engineFlagSet{}) // offline: --config and the engine flags
	return cmd
}

// benchFlags are the values of deepinfer bench's flags. Names follow
// vLLM's `vllm bench serve` and `vllm bench throughput`; the names earlier
// versions of this command used stay accepted as hidden aliases
// (benchAliases).
type benchFlags struct {
	mode                                                 string
	numPrompts                                           int
	inputLen, outputLen                                  int
	rangeRatio                                           float64
	minInputLen, maxInputLen, minOutputLen, maxOutputLen int
	maxTokenID, vocabSize                                int
	datasetName, datasetPath                             string
	baseURL, endpoint, model, apiKey                     string
	requestRate                                          float64
	maxConcurrency                                       int
	seed                                                 int64
	temperature                                          float32
	saveResult                                           bool
	resultDir, resultFilename, plotDir                   string
	percentileMetrics, metricPercentiles                 string
	workload, speculative, batch                         string
	numSpecTokens, rounds, warmupRuns                    int
	jsonSchema                                           string
	// mode grammar
	dataDir, tokenizerDir, whitespace string
	timeout                           time.Duration
	limit                             int
}

// Defaults that depend on --mode.
const (
	benchServeNumPrompts = 200
	benchServeInputLen   = 256
	benchServeOutputLen  = 128
)

// benchAliases maps each earlier flag name of deepinfer bench to the flag
// that replaced it; the old names parse into the same value and are hidden
// from the help.
var benchAliases = map[string]string{
	"num-seqs":    "num-prompts",
	"range-ratio": "random-range-ratio",
	"result-file": "result-filename",
}

// benchThroughputNames are the names `vllm bench throughput` gives to
// flags that `vllm bench serve` spells otherwise; both are shown.
var benchThroughputNames = map[string]string{
	"input-len":  "random-input-len",
	"output-len": "random-output-len",
}

// benchMetrics are the names --percentile-metrics accepts, with the row
// label of the report.
var benchMetrics = map[string]string{"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}

// register adds the flags to cmd.
func (f *benchFlags) register(cmd *cobra.Command) {
	def := bench.DefaultOffline()
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "mode", "offline", "offline (engine in this process, as vllm bench throughput), serve (a running server, as vllm bench serve), grammar (MaskBench's JSON Schema mask benchmark) or memory (KV memory of sliding-window models, rings vs paged)")
	fl.IntVar(&f.numPrompts, "num-prompts", 0, fmt.Sprintf("number of requests; default: %d offline (text workloads %d), %d serve", def.NumSeqs, bench.DefaultTextOffline(bench.WorkloadProse).NumSeqs, benchServeNumPrompts))
	fl.IntVar(&f.inputLen, "random-input-len", 0, fmt.Sprintf("random prompt length in tokens (words for chat); default: %d serve, --min-input-len..--max-input-len offline", benchServeInputLen))
	fl.IntVar(&f.outputLen, "random-output-len", 0, fmt.Sprintf("max_tokens of every request (ignore_eos); default: %d serve, --min-output-len..--max-output-len offline", benchServeOutputLen))
	fl.Float64Var(&f.rangeRatio, "random-range-ratio", 0, "draw input and output lengths uniformly in [len*(1-r), len*(1+r)], r in [0, 1) (offline: of --input-len/--output-len)")
	fl.StringVar(&f.datasetName, "dataset-name", "random", "random (random prompts) or custom (serve: prompts of --dataset-path)")
	fl.StringVar(&f.datasetPath, "dataset-path", "", "serve: prompt file of the custom dataset, one per line or JSONL with a \"prompt\" field")
	fl.Int64Var(&f.seed, "seed", 0, "seed of the random workload")
	fl.Float32Var(&f.temperature, "temperature", 0, "sampling temperature of every request; 0 is greedy")
	fl.BoolVar(&f.saveResult, "save-result", false, "write the result as JSON (--result-dir/--result-filename)")
	fl.StringVar(&f.resultDir, "result-dir", "", "folder of the JSON result; default: the working directory")
	fl.StringVar(&f.resultFilename, "result-filename", "", "file name of the JSON result (implies --save-result); default: deepinfer-bench-MODE-TIME.json")
	fl.StringVar(&f.percentileMetrics, "percentile-metrics", "ttft,tpot,itl,e2el", "comma-separated metrics whose percentiles are reported: ttft, tpot, itl, e2el")
	fl.StringVar(&f.metricPercentiles, "metric-percentiles", "90,99", "comma-separated percentiles reported (besides mean and p50), each in (0, 100]")
	fl.StringVar(&f.plotDir, "plot-dir", "", "write PNG histograms of the latency distributions into this folder")
	// offline
	fl.IntVar(&f.minInputLen, "min-input-len", def.MinInputLen, "offline: shortest random prompt (text workloads: passage), in tokens; text workloads default to 128")
	fl.IntVar(&f.maxInputLen, "max-input-len", def.MaxInputLen, "offline: longest random prompt (text workloads: passage), in tokens; text workloads default to 256")
	fl.IntVar(&f.minOutputLen, "min-output-len", def.MinOutputLen, "offline: fewest tokens generated per sequence; text workloads default to 64")
	fl.IntVar(&f.maxOutputLen, "max-output-len", def.MaxOutputLen, "offline: most tokens generated per sequence; text workloads default to 128")
	fl.IntVar(&f.maxTokenID, "max-token-id", def.MaxTokenID, "offline: random prompt ids are below this (and the vocabulary size)")
	fl.StringVar(&f.workload, "workload", bench.WorkloadRandom, "offline prompts: random (token ids), prose (held-out text passages, continued) or editing (a passage, an instruction and its start again with a few words changed, so that the continuation largely repeats the prompt: prompt lookup's best case); the text workloads' --*-input-len is the passage's")
	fl.StringVar(&f.speculative, "speculative", "", "offline: compare speculative-decoding methods (comma-separated speculative.method values, e.g. none,ngram,mtp; none, the baseline, is added when missing) on the same requests, each on a fresh engine")
	fl.IntVar(&f.numSpecTokens, "num-speculative-tokens", 0, "offline: draft length k (speculative.num_speculative_tokens) of every method; default: the config's")
	fl.IntVar(&f.warmupRuns, "num-warmup-runs", 1, "offline, with --speculative: untimed runs of a workload of other prompts before the measured ones (a process's first run pays once for lazily loaded kernels and new device allocations)")
	fl.IntVar(&f.rounds, "rounds", 1, "offline, with --speculative: run every method and batch size this many times, in alternating order, and report each one's median run (for noisy machines)")
	fl.StringVar(&f.jsonSchema, "json-schema", "", "offline: compare the workload without and with this JSON Schema constraint (a file, or \"default\": an array of at least 64 records, which no output of the benchmark's length can complete) on one engine, in alternating order (--rounds); reports the constrained decode step rate as a ratio to the unconstrained")
	fl.StringVar(&f.batch, "batch", "", "offline: engine.max_num_seqs (sequences in one step), overriding --max-num-seqs; with --speculative a comma-separated list, every method running at each (e.g. 1,8)")
	// serve
	fl.StringVar(&f.baseURL, "base-url", "http://127.0.0.1:8000", "serve: the server's root URL")
	fl.StringVar(&f.apiKey, "api-key", os.Getenv("DEEPINFER_API_KEY"), "serve: the server's API key (default $DEEPINFER_API_KEY)")
	fl.StringVar(&f.endpoint, "endpoint", "/v1/completions", "serve: /v1/completions or /v1/chat/completions")
	fl.StringVar(&f.model, "model", "", "serve: model name; default: the first of GET /v1/models")
	fl.Float64Var(&f.requestRate, "request-rate", math.Inf(1), "serve: mean requests per second (Poisson arrivals); inf sends all at once")
	fl.IntVar(&f.maxConcurrency, "max-concurrency", 0, "serve: most requests in flight; 0 is unbounded")
	fl.IntVar(&f.vocabSize, "vocab-size", 0, "serve: random token ids are below this; 0 asks GET /v1/models")
	// grammar
	fl.StringVar(&f.dataDir, "data", "", "grammar: folder of MaskBench files (*.json with \"schema\" and \"tests\")")
	fl.StringVar(&f.tokenizerDir, "tokenizer", "", "grammar: tokenizer folder (tokenizer.json) whose vocabulary the masks cover and which encodes the instances, e.g. Llama 3's")
	fl.DurationVar(&f.timeout, "timeout", bench.DefaultGrammarTimeout, "grammar: time limit of one file (conversion, compilation and all its instances)")
	fl.IntVar(&f.limit, "limit", 0, "grammar: run only the first N files (in name order); 0: all")
	fl.StringVar(&f.whitespace, "whitespace", grammarDefaultWhitespace, "grammar: JSON whitespace the schemas' grammars allow: flexible (any, up to 8 characters per gap), python (exactly json.dumps' \", \" and \": \") or compact (none)")
	// Other spellings share the flag's value.
	for name, target := range benchThroughputNames {
		fl.Var(fl.Lookup(target).Value, name, "same as --"+target+" (vllm bench throughput's name)")
	}
	for old, target := range benchAliases {
		fl.Var(fl.Lookup(target).Value, old, "alias of --"+target)
		fl.MarkHidden(old)
	}
}

// benchOptions are one run's options, resolved from the flags.
type benchOptions struct {
	mode         string
	grammar      bench.GrammarOptions // mode grammar, without its tokenizer
	tokenizerDir string               // mode grammar
	offline      bench.OfflineOptions // mode offline
	serve        bench.ServeOptions   // mode serve
	datasetPath  string               // serve: prompt file; "" for random prompts
	resultPath   string               // JSON result; "" for none
	plotDir      string
	metrics      []string  // of benchMetrics, in the given order
	percentiles  []float64 // in (0, 100]
	// offline: the --speculative comparison (nil: a plain run), the
	// --batch sizes and --num-speculative-tokens (0: the config's).
	speculative   *bench.SpeculativeOptions
	batches       []int
	numSpecTokens int
	// offline: the structured-output comparison (nil: none).
	structured *bench.StructuredOptions
}

// benchChanged reports whether the flag name, or one of its other spellings,
// was given on the command line.
func benchChanged(cmd *cobra.Command, name string) bool {
	fl := cmd.Flags()
	if f := fl.Lookup(name); f != nil && f.Changed {
		return true
	}
	for _, other := range []map[string]string{benchAliases, benchThroughputNames} {
		for alias, target := range other {
			if target == name {
				if f := fl.Lookup(alias); f != nil && f.Changed {
					return true
				}
			}
		}
	}
	return false
}

// options resolves the parsed flags of cmd into a run's options, applying
// the defaults of the mode; now names a default result file. It fails on
// an unknown mode, dataset, metric or percentile and on contradicting
// flags. Cost: O(flags).
func (f *benchFlags) options(cmd *cobra.Command, now time.Time) (benchOptions, error) {
	o := benchOptions{mode: f.mode, plotDir: f.plotDir}
	if f.mode != "offline" && f.mode != "serve" && f.mode != "grammar" {
		return o, fmt.Errorf("bench: --mode must be offline, serve or grammar, got %q", f.mode)
	}
	if err := f.checkGrammarFlags(cmd); err != nil {
		return o, err
	}
	for m := range strings.SplitSeq(f.percentileMetrics, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		if _, ok := benchMetrics[m]; !ok {
			return o, fmt.Errorf("bench: --percentile-metrics: unknown metric %q (ttft, tpot, itl, e2el)", m)
		}
		o.metrics = append(o.metrics, m)
	}
	for s := range strings.SplitSeq(f.metricPercentiles, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := strconv.ParseFloat(s, 64)
		if err != nil || !(p > 0 && p <= 100) {
			return o, fmt.Errorf("bench: --metric-percentiles: %q is not a percentile in (0, 100]", s)
		}
		o.percentiles = append(o.percentiles, p)
	}
	if f.saveResult || f.resultFilename != "" {
		name := f.resultFilename
		if name == "" {
			name = fmt.Sprintf("deepinfer-bench-%s-%s.json", f.mode, now.Format("20060102-150405"))
		}
		o.resultPath = name
		if f.resultDir != "" && !filepath.IsAbs(name) {
			o.resultPath = filepath.Join(f.resultDir, name)
		}
	}
	if f.mode == "grammar" {
		switch {
		case f.dataDir == "":
			return o, fmt.Errorf("bench: --mode grammar needs --data (a folder of MaskBench files)")
		case f.tokenizerDir == "":
			return o, fmt.Errorf("bench: --mode grammar needs --tokenizer (a tokenizer folder)")
		case f.timeout <= 0:
			return o, fmt.Errorf("bench: --timeout must be > 0, got %v", f.timeout)
		case f.limit < 0:
			return o, fmt.Errorf("bench: --limit must be >= 0, got %d", f.limit)
		case !slices.Contains([]string{"flexible", "python", "compact"}, f.whitespace):
			return o, fmt.Errorf("bench: --whitespace must be flexible, python or compact, got %q", f.whitespace)
		}
		o.grammar = bench.GrammarOptions{DataDir: f.dataDir, Whitespace: f.whitespace, Timeout: f.timeout, Limit: f.limit}
		o.tokenizerDir = f.tokenizerDir
		return o, nil
	}
	if f.rangeRatio < 0 || f.rangeRatio >= 1 {
		return o, fmt.Errorf("bench: --random-range-ratio must be in [0, 1), got %g", f.rangeRatio)
	}
	custom := f.datasetName == "custom" || (f.datasetPath != "" && !benchChanged(cmd, "dataset-name"))
	switch {
	case f.datasetName != "random" && f.datasetName != "custom":
		return o, fmt.Errorf("bench: --dataset-name must be random or custom, got %q", f.datasetName)
	case custom && f.datasetPath == "":
		return o, fmt.Errorf("bench: --dataset-name custom needs --dataset-path")
	case !custom && f.datasetPath != "":
		return o, fmt.Errorf("bench: --dataset-path needs --dataset-name custom")
	case custom && f.mode == "offline":
		return o, fmt.Errorf("bench: --mode offline runs random prompts only (--dataset-name random)")
	}

	if !slices.Contains(bench.Workloads, f.workload) {
		return o, fmt.Errorf("bench: --workload must be one of %s, got %q", strings.Join(bench.Workloads, ", "), f.workload)
	}
	if f.mode == "serve" {
		for _, name := range []string{"workload", "speculative", "num-speculative-tokens", "batch", "rounds", "num-warmup-runs"} {
			if benchChanged(cmd, name) {
				return o, fmt.Errorf("bench: --%s is for --mode offline", name)
			}
		}
	}
	if f.rounds < 1 {
		return o, fmt.Errorf("bench: --rounds must be >= 1, got %d", f.rounds)
	}
	if f.warmupRuns < 0 {
		return o, fmt.Errorf("bench: --num-warmup-runs must be >= 0, got %d", f.warmupRuns)
	}
	if f.numSpecTokens < 0 {
		return o, fmt.Errorf("bench: --num-speculative-tokens must be >= 1, got %d", f.numSpecTokens)
	}
	o.numSpecTokens = f.numSpecTokens
	for s := range strings.SplitSeq(f.batch, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		b, err := strconv.Atoi(s)
		if err != nil || b < 1 {
			return o, fmt.Errorf("bench: --batch: %q is not a batch size >= 1", s)
		}
		if !slices.Contains(o.batches, b) {
			o.batches = append(o.batches, b)
		}
	}
	var methods []string
	for m := range strings.SplitSeq(f.speculative, ",") {
		if m = strings.TrimSpace(m); m != "" {
			methods = append(methods, m)
		}
	}
	switch {
	case benchChanged(cmd, "speculative") && len(methods) == 0:
		return o, fmt.Errorf("bench: --speculative needs methods, e.g. none,ngram,mtp")
	case len(methods) == 0 && len(o.batches) > 1:
		return o, fmt.Errorf("bench: several --batch sizes need --speculative (give --speculative none to compare batch sizes alone)")
	case f.jsonSchema != "" && (len(methods) > 0 || len(o.batches) > 1 || f.mode != "offline"):
		return o, fmt.Errorf("bench: --json-schema is for --mode offline, with one --batch size and without --speculative")
	case len(methods) == 0 && benchChanged(cmd, "rounds") && f.jsonSchema == "":
		return o, fmt.Errorf("bench: --rounds needs --speculative or --json-schema")
	case len(methods) > 0 && f.plotDir != "":
		return o, fmt.Errorf("bench: --plot-dir is not for --speculative runs")
	}

	if f.mode == "offline" {
		off := bench.DefaultOffline()
		if f.workload != bench.WorkloadRandom {
			off = bench.DefaultTextOffline(f.workload)
		}
		if benchChanged(cmd, "num-prompts") {
			off.NumSeqs = f.numPrompts
		}
		if benchChanged(cmd, "min-input-len") {
			off.MinInputLen = f.minInputLen
		}
		if benchChanged(cmd, "max-input-len") {
			off.MaxInputLen = f.maxInputLen
		}
		if benchChanged(cmd, "min-output-len") {
			off.MinOutputLen = f.minOutputLen
		}
		if benchChanged(cmd, "max-output-len") {
			off.MaxOutputLen = f.maxOutputLen
		}
		if benchChanged(cmd, "random-input-len") {
			if benchChanged(cmd, "min-input-len") || benchChanged(cmd, "max-input-len") {
				return o, fmt.Errorf("bench: give --input-len or --min-input-len/--max-input-len, not both")
			}
			off.MinInputLen, off.MaxInputLen = lengthRange(f.inputLen, f.rangeRatio)
		}
		if benchChanged(cmd, "random-output-len") {
			if benchChanged(cmd, "min-output-len") || benchChanged(cmd, "max-output-len") {
				return o, fmt.Errorf("bench: give --output-len or --min-output-len/--max-output-len, not both")
			}
			off.MinOutputLen, off.MaxOutputLen = lengthRange(f.outputLen, f.rangeRatio)
		}
		off.MaxTokenID, off.Seed, off.Temperature = f.maxTokenID, uint64(f.seed), f.temperature
		o.offline = off
		if len(methods) > 0 {
			o.speculative = &bench.SpeculativeOptions{Offline: off, Methods: methods, NumSpeculativeTokens: f.numSpecTokens, Batches: o.batches, Rounds: f.rounds, WarmupRuns: f.warmupRuns}
		}
		if f.jsonSchema != "" {
			schema := bench.LongJSONSchema
			if f.jsonSchema != "default" {
				data, err := os.ReadFile(f.jsonSchema)
				if err != nil {
					return o, fmt.Errorf("bench: --json-schema: %w", err)
				}
				schema = string(data)
			}
			o.structured = &bench.StructuredOptions{Offline: off, Rounds: f.rounds,
				Constraint: engine.StructuredOutput{JSONSchema: schema, Whitespace: "compact"}}
		}
		return o, nil
	}
	srv := bench.ServeOptions{
		BaseURL: f.baseURL, Endpoint: f.endpoint, Model: f.model, APIKey: f.apiKey,
		NumPrompts: benchServeNumPrompts, InputLen: benchServeInputLen, OutputLen: benchServeOutputLen,
		RequestRate: f.requestRate, MaxConcurrency: f.maxConcurrency, VocabSize: f.vocabSize,
		RangeRatio: f.rangeRatio, Temperature: f.temperature, Seed: uint64(f.seed),
	}
	if benchChanged(cmd, "num-prompts") {
		srv.NumPrompts = f.numPrompts
	}
	if benchChanged(cmd, "random-input-len") {
		srv.InputLen = f.inputLen
	}
	if benchChanged(cmd, "random-output-len") {
		srv.OutputLen = f.outputLen
	}
	o.serve = srv
	if custom {
		o.datasetPath = f.datasetPath
	}
	return o, nil
}

// lengthRange is vLLM's random length range of n with range ratio r:
// [n*(1-r), n*(1+r)], at least 1 token.
func lengthRange(n int, r float64) (lo, hi int) {
	lo = max(1, int(float64(n)*(1-r)))
	return lo, max(lo, int(float64(n)*(1+r)))
}

func printOffline(w io.Writer, r *bench.OfflineResult, o benchOptions) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "==== Offline Benchmark Result ====")
	fmt.Fprintf(tw, "Backend (weights):\t%s (%s)\n", r.Backend, r.Weights)
	fmt.Fprintf(tw, "Requests (failed):\t%d (%d)\n", r.NumRequests, r.Failed)
	fmt.Fprintf(tw, "Duration (s):\t%.2f\n", r.DurationSeconds)
	fmt.Fprintf(tw, "Input / output tokens:\t%d / %d\n", r.TotalInputTokens, r.TotalOutputTokens)
	fmt.Fprintf(tw, "Request throughput (req/s):\t%.2f\n", r.RequestThroughput)
	fmt.Fprintf(tw, "Output token throughput (tok/s):\t%.2f\n", r.OutputThroughput)
	fmt.Fprintf(tw, "Total token throughput (tok/s):\t%.2f\n", r.TotalThroughput)
	if st := r.StepTimes.String(); st != "" {
		fmt.Fprintf(tw, "Steps (loop time each):\t%s\n", st)
	}
	tw.Flush()
	printSummaries(w, r.Distributions(), o.metrics, o.percentiles)
}

// printSpeculative writes the comparison of speculative methods: one row
// per method and batch size, then whether every output equals the
// baseline's.
func printSpeculative(w io.Writer, r *bench.SpeculativeResult) {
	rounds, spread := "", ""
	if r.Rounds > 1 {
		rounds, spread = fmt.Sprintf(", median of %d rounds", r.Rounds), "\tspread"
	}
	if r.WarmupRuns > 0 {
		rounds += fmt.Sprintf(", after %d untimed", r.WarmupRuns)
	}
	fmt.Fprintf(w, "==== Speculative Decoding Benchmark (%s workload, %d requests, k=%d, temperature %g%s) ====\n",
		r.Workload, r.NumRequests, r.NumSpeculativeTokens, r.Temperature, rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "method\tbatch\toutput tok/s%s\tvs none\tmean accepted len\tacceptance\tper-position\tdraft limits\tTPOT ms\tbackend\n", spread)
	for _, run := range r.Runs {
		res := run.Result
		mal, acc, pos, lim := "-", "-", "-", "-"
		if sp := res.Speculative; sp != nil {
			if l := sp.LimitsString(); l != "" {
				lim = l
			}
			mal, acc = fmt.Sprintf("%.2f", sp.MeanAcceptedLength), fmt.Sprintf("%.2f", sp.AcceptanceRate)
			if len(sp.PerPosAcceptanceRate) > 0 {
				parts := make([]string, len(sp.PerPosAcceptanceRate))
				for i, p := range sp.PerPosAcceptanceRate {
					parts[i] = fmt.Sprintf("%.2f", p)
				}
				pos = strings.Join(parts, "/")
			}
		}
		sp := ""
		if r.Rounds > 1 {
			// half the rounds' range, over the median
			sp = fmt.Sprintf("\t±%.0f%%", 50*(slices.Max(run.RoundThroughputs)-slices.Min(run.RoundThroughputs))/max(res.OutputThroughput, 1e-9))
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%s\t%.2fx\t%s\t%s\t%s\t%s\t%.2f\t%s\n",
			run.Method, run.Batch, res.OutputThroughput, sp, run.Speedup, mal, acc, pos, lim, res.TPOTMillis.Mean, res.Backend)
	}
	tw.Flush()
	if r.OutputsIdentical {
		fmt.Fprintln(w, "outputs identical: yes")
		return
	}
	var diffs []string
	for _, run := range r.Runs {
		if !run.SameOutputs {
			d := fmt.Sprintf("%s at batch %d: %d of %d requests differ, the first %s",
				run.Method, run.Batch, run.NumDiffer, run.Result.NumRequests, run.FirstDiff)
			if rounds := len(run.RoundThroughputs); rounds > 1 {
				d += fmt.Sprintf(", in rounds %s of %d", joinInts(run.DifferRounds), rounds)
			}
			diffs = append(diffs, d)
		}
	}
	fmt.Fprintf(w, "outputs identical: no (%s)\n", strings.Join(diffs, "; "))
}

func printServe(w io.Writer, r *bench.ServeResult, o benchOptions) {
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
	printSummaries(w, r.Distributions(), o.metrics, o.percentiles)
	for _, e := range r.Errors {
		fmt.Fprintln(w, "error:", e)
	}
}

// printSummaries writes one row per metric (in the order given; metrics
// without samples are left out) with its mean, p50, each of percentiles
// and the sample count. Cost: one sort per metric and percentile.
func printSummaries(w io.Writer, dists []bench.Distribution, metrics []string, percentiles []float64) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "ms\tmean\tp50\t")
	for _, p := range percentiles {
		fmt.Fprintf(tw, "p%s\t", strconv.FormatFloat(p, 'f', -1, 64))
	}
	fmt.Fprintln(tw, "count\t")
	for _, m := range metrics {
		i := slices.IndexFunc(dists, func(d bench.Distribution) bool { return d.Name == m })
		if i < 0 || len(dists[i].Values) == 0 {
			continue
		}
		s := bench.Summarize(dists[i].Values)
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t", benchMetrics[m], s.Mean, s.Median)
		for _, p := range percentiles {
			fmt.Fprintf(tw, "%.2f\t", bench.Percentile(dists[i].Values, p))
		}
		fmt.Fprintf(tw, "%d\t\n", s.Count)
	}
	tw.Flush()
}

// grammarDefaultWhitespace is --whitespace's default: "python", exactly
// json.dumps' separators, as MaskBench's texts are written. On the 5,697
// MaskBench files here with Llama 3's tokenizer it passed one file more
// than "flexible" (4,981 against 4,980: a file that flexible's larger
// grammar took past the 10 s timeout), with the same compile, validation
// and invalidation errors.
const grammarDefaultWhitespace = "python"

// grammarFlags are the flags of --mode grammar alone; grammarCommonFlags
// the other flags it takes.
var (
	grammarFlags       = []string{"data", "tokenizer", "timeout", "limit", "whitespace"}
	grammarCommonFlags = []string{"mode", "save-result", "result-dir", "result-filename", "result-file"}
)

// checkGrammarFlags rejects the grammar flags in the other modes and, in
// --mode grammar, any flag given other than grammarFlags and
// grammarCommonFlags. Cost: O(flags).
func (f *benchFlags) checkGrammarFlags(cmd *cobra.Command) error {
	fl := cmd.Flags()
	if f.mode != "grammar" {
		for _, name := range grammarFlags {
			if fl.Changed(name) {
				return fmt.Errorf("bench: --%s is for --mode grammar", name)
			}
		}
		return nil
	}
	given := 0
	for _, name := range append(slices.Clone(grammarFlags), grammarCommonFlags...) {
		if fl.Changed(name) {
			given++
		}
	}
	if fl.NFlag() > given {
		return fmt.Errorf("bench: --mode grammar takes only --%s and --save-result, --result-dir, --result-filename",
			strings.Join(grammarFlags, ", --"))
	}
	return nil
}

// printGrammar writes MaskBench's table: files by outcome, the compile
// errors' keywords, and the TTFM and time-per-mask percentiles in
// microseconds.
func printGrammar(w io.Writer, r *bench.GrammarResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "==== Grammar Benchmark Result (MaskBench protocol) ====")
	fmt.Fprintf(tw, "Data:\t%s\n", r.DataDir)
	fmt.Fprintf(tw, "Tokenizer:\t%s (%d tokens; vocabulary built once, %.0f ms)\n", r.Tokenizer, r.VocabSize, r.VocabMillis)
	fmt.Fprintf(tw, "Vocabulary trie:\t%.1f ms (built once, shared by every schema's Compile; not in TTFM)\n", r.TrieMillis)
	fmt.Fprintf(tw, "JSON whitespace:\t%s\n", r.Whitespace)
	fmt.Fprintf(tw, "CPU:\t%s (one goroutine)\n", r.CPU)
	fmt.Fprintf(tw, "Duration (s):\t%.2f\n", r.DurationSeconds)
	interrupted := ""
	if r.Interrupted {
		interrupted = " (interrupted)"
	}
	fmt.Fprintf(tw, "Files:\t%d%s\n", r.Files, interrupted)
	fmt.Fprintf(tw, "Passing:\t%d\n", r.Passing)
	kws := make([]string, 0, 10)
	for i, k := range r.CompileErrorKeywords {
		if i == 10 {
			kws = append(kws, "...")
			break
		}
		kws = append(kws, fmt.Sprintf("%s %d", k.Keyword, k.Files))
	}
	top := ""
	if len(kws) > 0 {
		top = " (" + strings.Join(kws, ", ") + ")"
	}
	fmt.Fprintf(tw, "Compile errors:\t%d%s\n", r.CompileErrors, top)
	fmt.Fprintf(tw, "Timeouts (%gs):\t%d\n", r.TimeoutSeconds, r.Timeouts)
	fmt.Fprintf(tw, "Validation errors:\t%d (valid instances refused: %d of %d)\n", r.ValidationErrors, r.TestValidationErrors, r.ValidTests)
	fmt.Fprintf(tw, "Invalidation errors:\t%d (invalid instances accepted: %d of %d)\n", r.InvalidationErrors, r.TestInvalidationErrors, r.InvalidTests)
	if r.MaskCommitMismatches > 0 {
		fmt.Fprintf(tw, "Mask/commit mismatches:\t%d\n", r.MaskCommitMismatches)
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "µs\tp25\tp50\tp75\tp90\tp95\tp99\tp99.9\tmax\tmean\tcount\t")
	for _, row := range []struct {
		name string
		p    bench.GrammarPercentiles
	}{{"TTFM", r.TTFM}, {"mask", r.Mask}} {
		p := row.p
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t\n", row.name,
			p.P25, p.P50, p.P75, p.P90, p.P95, p.P99, p.P999, p.Max, p.Mean, p.Count)
	}
	tw.Flush()
}

// printStructured prints the structured-output comparison.
func printStructured(w io.Writer, r *bench.StructuredResult) {
	fmt.Fprintf(w, "Structured output (%s) at batch %d, %d requests, %s, median of %d rounds:\n", r.Kind, r.Batch, r.NumRequests, r.Backend, r.Rounds)
	fmt.Fprintf(w, "  %-14s %12s %14s\n", "", "output tok/s", "median TPOT ms")
	for _, row := range []struct {
		name string
		r    *bench.OfflineResult
	}{{"unconstrained", r.Unconstrained}, {"constrained", r.Constrained}} {
		fmt.Fprintf(w, "  %-14s %12.1f %14.3f\n", row.name, row.r.OutputThroughput, row.r.TPOTMillis.Median)
	}
	fmt.Fprintf(w, "  step rate, constrained / unconstrained: %.3f (throughput %.3f)\n", r.StepRateRatio, r.ThroughputRatio)
	if r.EndedEarly > 0 {
		fmt.Fprintf(w, "  %d constrained outputs ended before max_tokens: their batch ran smaller\n", r.EndedEarly)
	}
}

// joinInts writes xs as "1, 2, 3".
func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}
