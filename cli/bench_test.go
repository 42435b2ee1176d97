package cli

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/bench"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/server"
)

// deepinfer bench in both modes, small: the report, the JSON file and the
// plots.
func TestBenchCommand(t *testing.T) {
	cfgPath := writeServeConfig(t)
	dir := t.TempDir()

	// offline
	resultFile := filepath.Join(dir, "offline.json")
	out, err := run(t, "bench", "--mode", "offline", "--config", cfgPath, "--num-prompts", "6", "--min-input-len", "4", "--max-input-len", "20",
		"--min-output-len", "3", "--max-output-len", "8", "--result-file", resultFile) // --result-file: the old name of --result-filename
	if err != nil {
		t.Fatalf("offline: %v\n%s", err, out)
	}
	for _, want := range []string{"Offline Benchmark Result", "Output token throughput", "Steps (loop time each):", "decode ", "TTFT", "E2E latency", "p90", "p99"} {
		if !strings.Contains(out, want) {
			t.Errorf("offline output lacks %q:\n%s", want, out)
		}
	}
	var off struct {
		Mode        string `json:"mode"`
		NumRequests int    `json:"num_requests"`
		TTFT        struct {
			Count int `json:"count"`
		} `json:"ttft_ms"`
		StepTimes struct {
			Decode struct {
				Steps int64 `json:"steps"`
				Mean  int64 `json:"mean_ns"`
			} `json:"decode"`
		} `json:"step_times"`
	}
	readJSON(t, resultFile, &off)
	if off.Mode != "offline" || off.NumRequests != 6 || off.TTFT.Count != 6 || off.StepTimes.Decode.Steps == 0 || off.StepTimes.Decode.Mean <= 0 {
		t.Fatalf("offline JSON: %+v", off)
	}

	// serve, against a server on a loopback port
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := llm.New(cfg, llm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	srv, err := server.New(eng, server.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	prompts := filepath.Join(dir, "prompts.jsonl")
	if err := os.WriteFile(prompts, []byte("{\"prompt\": \"hello there\"}\n{\"prompt\": \"how are you\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	resultFile, plotDir := filepath.Join(dir, "results", "serve.json"), filepath.Join(dir, "serve-plots")
	out, err = run(t, "bench", "--mode", "serve", "--base-url", "http://"+ln.Addr().String(), "--endpoint", "/v1/chat/completions",
		"--num-prompts", "10", "--request-rate", "200", "--dataset-name", "custom", "--dataset-path", prompts, "--random-output-len", "6",
		"--result-dir", filepath.Join(dir, "results"), "--result-filename", "serve.json", "--plot-dir", plotDir,
		"--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99.9")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, out)
	}
	for _, want := range []string{"Serving Benchmark Result", "Successful / failed requests:     10 / 0", "ITL", "TTFT", "p99.9"} {
		if !strings.Contains(out, want) {
			t.Errorf("serve output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "TPOT") || strings.Contains(out, "E2E latency") {
		t.Errorf("serve output has rows not in --percentile-metrics:\n%s", out)
	}
	var sv struct {
		Completed         int                `json:"completed"`
		TotalOutputTokens int                `json:"total_output_tokens"`
		Percentiles       map[string]float64 `json:"percentiles"`
	}
	readJSON(t, resultFile, &sv)
	if sv.Completed != 10 || sv.TotalOutputTokens != 60 {
		t.Fatalf("serve JSON: %+v", sv)
	}
	if _, ok := sv.Percentiles["p99.9_ttft_ms"]; !ok || len(sv.Percentiles) != 4 {
		t.Fatalf("serve JSON percentiles: %v, want p50 and p99.9 of ttft and itl", sv.Percentiles)
	}
	for _, f := range []string{"ttft.png", "tpot.png", "itl.png", "e2el.png"} {
		if _, err := os.Stat(filepath.Join(plotDir, f)); err != nil {
			t.Error(err)
		}
	}
	if _, err := run(t, "bench", "--mode", "online"); err == nil || !strings.Contains(err.Error(), "--mode must be offline, serve or grammar") {
		t.Fatalf("bad mode: %v", err)
	}
}

// deepinfer bench --speculative on the editing workload with the shipped
// model, small: the table has a row per method and batch size, with the
// method's acceptance and the rounds' spread, and the outputs equal the
// baseline's (greedy); the JSON result holds every run.
func TestBenchSpeculative(t *testing.T) {
	model, err := filepath.Abs(filepath.Join("..", "assets", "deepseek-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(model, "model.safetensors")); err != nil {
		t.Skip("no default model:", err)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tiny.yaml")
	if err := os.WriteFile(cfgPath, []byte("model: "+model+"\nengine:\n  max_model_len: 256\ncpu:\n  threads: 2\nspeculative:\n  adaptive: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	resultFile := filepath.Join(dir, "spec.json")
	out, err := run(t, "bench", "--config", cfgPath, "--speculative", "none,ngram", "--workload", "editing", "--batch", "1,2",
		"--num-prompts", "2", "--min-input-len", "40", "--max-input-len", "60", "--output-len", "6", "--num-speculative-tokens", "2",
		"--rounds", "2", "--result-filename", resultFile)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"Speculative Decoding Benchmark (editing workload, 2 requests, k=2, temperature 0, median of 2 rounds, after 1 untimed)",
		"method  batch  output tok/s  spread  vs none  mean accepted len  acceptance", "outputs identical: yes", "cpu(", "±"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	rows := 0
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 4 || (f[0] != "none" && f[0] != "ngram") {
			continue
		}
		rows++
		if f[0] == "none" && (f[4] != "1.00x" || f[5] != "-") || f[0] == "ngram" && f[5] == "-" {
			t.Errorf("row %q", line)
		}
	}
	if rows != 4 {
		t.Errorf("%d rows, want 4:\n%s", rows, out)
	}
	var res struct {
		Mode             string `json:"mode"`
		Rounds           int    `json:"rounds"`
		WarmupRuns       int    `json:"warmup_runs"`
		OutputsIdentical bool   `json:"outputs_identical"`
		Runs             []struct {
			Method string `json:"method"`
			Batch  int    `json:"batch"`
			Result struct {
				TotalOutputTokens int `json:"total_output_tokens"`
				Speculative       *struct {
					MeanAcceptedLength float64 `json:"mean_accepted_length"`
				} `json:"speculative"`
			} `json:"result"`
		} `json:"runs"`
	}
	readJSON(t, resultFile, &res)
	if res.Mode != "speculative" || !res.OutputsIdentical || len(res.Runs) != 4 || res.Rounds != 2 || res.WarmupRuns != 1 {
		t.Fatalf("JSON: %+v", res)
	}
	for _, r := range res.Runs {
		if r.Result.TotalOutputTokens != 12 || (r.Method == "ngram") != (r.Result.Speculative != nil) {
			t.Errorf("JSON run %+v", r)
		}
	}
}

// deepinfer bench --mode grammar on two small MaskBench files with a
// character tokenizer: the report's counts and the JSON result.
func TestBenchGrammar(t *testing.T) {
	dir := t.TempDir()
	tokDir, data := filepath.Join(dir, "tok"), filepath.Join(dir, "data")
	for _, d := range []string{tokDir, data} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	vocab := map[string]int{"<unk>": 0}
	for c := ' '; c <= '~'; c++ {
		vocab[string(c)] = len(vocab)
	}
	tok, err := json.Marshal(map[string]any{
		"version":      "1.0",
		"added_tokens": []map[string]any{{"id": 0, "content": "<unk>", "special": true}},
		"normalizer":   nil, "pre_tokenizer": nil, "post_processor": nil, "decoder": map[string]any{"type": "Fuse"},
		"model": map[string]any{"type": "BPE", "unk_token": "<unk>", "vocab": vocab, "merges": []string{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		filepath.Join(tokDir, "tokenizer.json"): string(tok),
		filepath.Join(data, "ok.json"): `{"schema": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}, "tests": [` +
			`{"description": "two", "valid": true, "data": [true, false], "text": "[true, false]"},` +
			`{"description": "three", "valid": false, "data": [true, true, true], "text": "[true, true, true]"}]}`,
		filepath.Join(data, "unsupported.json"): `{"schema": {"type": "object", "dependentRequired": {"a": ["b"]}}, "tests": []}`,
	}
	for path, text := range files {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	resultFile := filepath.Join(dir, "grammar.json")
	out, err := run(t, "bench", "--mode", "grammar", "--data", data, "--tokenizer", tokDir, "--timeout", "5s",
		"--result-filename", resultFile)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"Grammar Benchmark Result", "JSON whitespace:      python", "CPU:", "Files:                2\n",
		"Passing:              1\n", "Compile errors:       1 (dependentRequired 1)", "Timeouts (5s):        0\n",
		"Validation errors:    0 (valid instances refused: 0 of 1)", "Invalidation errors:  0 (invalid instances accepted: 0 of 1)",
		"p25", "p99.9", "TTFM", "mask"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	var res struct {
		Mode     string `json:"mode"`
		Files    int    `json:"files"`
		Passing  int    `json:"passing"`
		Keywords []struct {
			Keyword string `json:"keyword"`
			Files   int    `json:"files"`
		} `json:"compile_error_keywords"`
		Mask struct {
			Count int `json:"count"`
		} `json:"mask_us"`
	}
	readJSON(t, resultFile, &res)
	// masks: "[true, false]" whole (13), "[true, true" then the refused "," (12)
	if res.Mode != "grammar" || res.Files != 2 || res.Passing != 1 || len(res.Keywords) != 1 || res.Keywords[0].Keyword != "dependentRequired" || res.Mask.Count != 25 {
		t.Fatalf("JSON: %+v", res)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// parseBench parses args as deepinfer bench's flags and resolves them.
func parseBench(t *testing.T, args ...string) (benchOptions, error) {
	t.Helper()
	var f benchFlags
	cmd := &cobra.Command{Use: "bench"}
	f.register(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		return benchOptions{}, err
	}
	return f.options(cmd, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}

// The flags spelled as vLLM's benchmarks and their old names (hidden
// aliases) parse to the same options.
func TestBenchFlagAliases(t *testing.T) {
	tests := []struct {
		name     string
		new, old []string
	}{
		{"offline count", []string{"--num-prompts", "7"}, []string{"--num-seqs", "7"}},
		{"serve count", []string{"--mode", "serve", "--num-prompts", "9"}, []string{"--mode", "serve", "--num-seqs", "9"}},
		{"serve lengths", []string{"--mode", "serve", "--random-input-len", "64", "--random-output-len", "16", "--random-range-ratio", "0.25"},
			[]string{"--mode", "serve", "--input-len", "64", "--output-len", "16", "--range-ratio", "0.25"}},
		{"throughput lengths", []string{"--random-input-len", "100", "--random-output-len", "50", "--random-range-ratio", "0.5"},
			[]string{"--input-len", "100", "--output-len", "50", "--range-ratio", "0.5"}},
		{"result file", []string{"--result-filename", "out.json"}, []string{"--result-file", "out.json"}},
		{"prompt file", []string{"--mode", "serve", "--dataset-name", "custom", "--dataset-path", "p.jsonl"},
			[]string{"--mode", "serve", "--dataset-path", "p.jsonl"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, err := parseBench(t, tc.new...)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseBench(t, tc.old...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%v parses to\n%+v\n%v to\n%+v", tc.old, got, tc.new, want)
			}
			if reflect.DeepEqual(want, mustParseBench(t, modeArgs(tc.new)...)) {
				t.Fatalf("%v changed nothing", tc.new)
			}
		})
	}
	cmd := newBenchCmd(nil)
	for old, target := range benchAliases {
		if f := cmd.Flags().Lookup(old); f == nil || !f.Hidden || cmd.Flags().Lookup(target) == nil {
			t.Errorf("--%s: want a hidden alias of --%s", old, target)
		}
	}
	for _, name := range []string{"num-prompts", "random-input-len", "random-output-len", "random-range-ratio", "dataset-name", "dataset-path",
		"request-rate", "max-concurrency", "result-dir", "result-filename", "save-result", "seed", "base-url", "endpoint", "model",
		"percentile-metrics", "metric-percentiles", "temperature", "input-len", "output-len"} {
		if f := cmd.Flags().Lookup(name); f == nil || f.Hidden {
			t.Errorf("--%s missing or hidden", name)
		}
	}
}

// modeArgs keeps only the --mode of args.
func modeArgs(args []string) []string {
	for i, a := range args {
		if a == "--mode" {
			return args[i : i+2]
		}
	}
	return nil
}

func mustParseBench(t *testing.T, args ...string) benchOptions {
	t.Helper()
	o, err := parseBench(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// What the flags resolve to: the defaults of each mode (temperature 0 in
// both, as vLLM's benchmark), vLLM's length ranges, the result path and
// the rejected combinations.
func TestBenchOptions(t *testing.T) {
	def := bench.DefaultOffline()
	tests := []struct {
		name    string
		args    []string
		check   func(o benchOptions) bool
		wantErr string
	}{
		{"offline defaults", nil, func(o benchOptions) bool {
			return reflect.DeepEqual(o.offline, def) && o.offline.Temperature == 0 && o.resultPath == "" &&
				reflect.DeepEqual(o.metrics, []string{"ttft", "tpot", "itl", "e2el"}) && reflect.DeepEqual(o.percentiles, []float64{90, 99})
		}, ""},
		{"serve defaults", []string{"--mode", "serve"}, func(o benchOptions) bool {
			s := o.serve
			return s.Temperature == 0 && s.NumPrompts == 200 && s.InputLen == 256 && s.OutputLen == 128 && math.IsInf(s.RequestRate, 1) &&
				s.BaseURL == "http://127.0.0.1:8000" && s.Endpoint == "/v1/completions" && o.datasetPath == ""
		}, ""},
		{"temperature", []string{"--mode", "serve", "--temperature", "0.7"}, func(o benchOptions) bool { return o.serve.Temperature == 0.7 }, ""},
		{"offline input-len with range ratio", []string{"--input-len", "100", "--random-range-ratio", "0.5"}, func(o benchOptions) bool {
			return o.offline.MinInputLen == 50 && o.offline.MaxInputLen == 150 && o.offline.MinOutputLen == def.MinOutputLen
		}, ""},
		{"offline fixed output", []string{"--output-len", "32"}, func(o benchOptions) bool {
			return o.offline.MinOutputLen == 32 && o.offline.MaxOutputLen == 32
		}, ""},
		{"save-result default name", []string{"--save-result", "--result-dir", "res"}, func(o benchOptions) bool {
			return o.resultPath == filepath.Join("res", "deepinfer-bench-offline-20260102-030405.json")
		}, ""},
		{"serve flags", []string{"--mode", "serve", "--base-url", "http://h:1", "--endpoint", "/v1/chat/completions", "--model", "m",
			"--request-rate", "4", "--max-concurrency", "3", "--seed", "5", "--vocab-size", "100"}, func(o benchOptions) bool {
			s := o.serve
			return s.BaseURL == "http://h:1" && s.Endpoint == "/v1/chat/completions" && s.Model == "m" && s.RequestRate == 4 &&
				s.MaxConcurrency == 3 && s.Seed == 5 && s.VocabSize == 100
		}, ""},
		{"bad mode", []string{"--mode", "online"}, nil, "--mode must be offline, serve or grammar"},
		{"grammar defaults", []string{"--mode", "grammar", "--data", "d", "--tokenizer", "tk"}, func(o benchOptions) bool {
			return o.grammar == bench.GrammarOptions{DataDir: "d", Whitespace: "python", Timeout: 10 * time.Second} && o.tokenizerDir == "tk" && o.resultPath == ""
		}, ""},
		{"grammar flags", []string{"--mode", "grammar", "--data", "d", "--tokenizer", "tk", "--timeout", "2.5s", "--limit", "30", "--whitespace", "flexible",
			"--save-result", "--result-dir", "res"}, func(o benchOptions) bool {
			return o.grammar == bench.GrammarOptions{DataDir: "d", Whitespace: "flexible", Timeout: 2500 * time.Millisecond, Limit: 30} &&
				o.resultPath == filepath.Join("res", "deepinfer-bench-grammar-20260102-030405.json")
		}, ""},
		{"grammar without data", []string{"--mode", "grammar", "--tokenizer", "tk"}, nil, "--mode grammar needs --data"},
		{"grammar without tokenizer", []string{"--mode", "grammar", "--data", "d"}, nil, "--mode grammar needs --tokenizer"},
		{"grammar bad timeout", []string{"--mode", "grammar", "--data", "d", "--tokenizer", "tk", "--timeout", "0s"}, nil, "--timeout must be > 0"},
		{"grammar bad limit", []string{"--mode", "grammar", "--data", "d", "--tokenizer", "tk", "--limit", "-1"}, nil, "--limit must be >= 0"},
		{"grammar bad whitespace", []string{"--mode", "grammar", "--data", "d", "--tokenizer", "tk", "--whitespace", "pretty"}, nil, "--whitespace must be flexible, python or compact"},
		{"grammar with offline flag", []string{"--mode", "grammar", "--data", "d", "--tokenizer", "tk", "--num-prompts", "3"}, nil, "--mode grammar takes only --data"},
		{"grammar with plots", []string{"--mode", "grammar", "--data", "d", "--tokenizer", "tk", "--plot-dir", "p"}, nil, "--mode grammar takes only"},
		{"offline with grammar flag", []string{"--data", "d"}, nil, "--data is for --mode grammar"},
		{"serve with grammar flag", []string{"--mode", "serve", "--limit", "3"}, nil, "--limit is for --mode grammar"},
		{"bad metric", []string{"--percentile-metrics", "ttft,foo"}, nil, `unknown metric "foo"`},
		{"bad percentile", []string{"--metric-percentiles", "0"}, nil, "not a percentile"},
		{"bad ratio", []string{"--random-range-ratio", "1"}, nil, "--random-range-ratio must be in [0, 1)"},
		{"bad dataset", []string{"--dataset-name", "sharegpt"}, nil, "--dataset-name must be random or custom"},
		{"custom without path", []string{"--mode", "serve", "--dataset-name", "custom"}, nil, "needs --dataset-path"},
		{"path with random", []string{"--mode", "serve", "--dataset-name", "random", "--dataset-path", "p"}, nil, "needs --dataset-name custom"},
		{"offline custom", []string{"--dataset-path", "p"}, nil, "random prompts only"},
		{"both length forms", []string{"--input-len", "10", "--max-input-len", "20"}, nil, "not both"},
		{"editing defaults", []string{"--workload", "editing"}, func(o benchOptions) bool {
			return reflect.DeepEqual(o.offline, bench.DefaultTextOffline(bench.WorkloadEditing)) && o.offline.Temperature == 0 && o.speculative == nil
		}, ""},
		{"prose lengths", []string{"--workload", "prose", "--num-prompts", "5", "--max-input-len", "300", "--output-len", "20"}, func(o benchOptions) bool {
			off := o.offline
			return off.Workload == "prose" && off.NumSeqs == 5 && off.MinInputLen == 128 && off.MaxInputLen == 300 && off.MinOutputLen == 20 && off.MaxOutputLen == 20
		}, ""},
		{"speculative comparison", []string{"--workload", "editing", "--speculative", "ngram, mtp", "--batch", "1,8,1", "--num-speculative-tokens", "3"}, func(o benchOptions) bool {
			sp := o.speculative
			return sp != nil && reflect.DeepEqual(sp.Methods, []string{"ngram", "mtp"}) && reflect.DeepEqual(sp.Batches, []int{1, 8}) &&
				sp.NumSpeculativeTokens == 3 && reflect.DeepEqual(sp.Offline, o.offline) && o.numSpecTokens == 3
		}, ""},
		{"one batch", []string{"--batch", "4"}, func(o benchOptions) bool {
			return reflect.DeepEqual(o.batches, []int{4}) && o.speculative == nil
		}, ""},
		{"bad workload", []string{"--workload", "chat"}, nil, "--workload must be one of random, prose, editing"},
		{"serve workload", []string{"--mode", "serve", "--workload", "editing"}, nil, "--workload is for --mode offline"},
		{"serve speculative", []string{"--mode", "serve", "--speculative", "ngram"}, nil, "--speculative is for --mode offline"},
		{"bad batch", []string{"--speculative", "ngram", "--batch", "1,x"}, nil, `--batch: "x" is not a batch size`},
		{"batches without speculative", []string{"--batch", "1,8"}, nil, "several --batch sizes need --speculative"},
		{"empty speculative", []string{"--speculative", ","}, nil, "--speculative needs methods"},
		{"speculative plots", []string{"--speculative", "ngram", "--plot-dir", "p"}, nil, "--plot-dir is not for --speculative"},
		{"bad k", []string{"--num-speculative-tokens", "-1"}, nil, "--num-speculative-tokens must be >= 1"},
		{"rounds", []string{"--speculative", "mtp", "--rounds", "3"}, func(o benchOptions) bool { return o.speculative.Rounds == 3 }, ""},
		{"rounds without speculative", []string{"--rounds", "3"}, nil, "--rounds needs --speculative"},
		{"bad rounds", []string{"--speculative", "mtp", "--rounds", "0"}, nil, "--rounds must be >= 1"},
		{"warm-up by default", []string{"--speculative", "mtp"}, func(o benchOptions) bool { return o.speculative.WarmupRuns == 1 }, ""},
		{"no warm-up", []string{"--speculative", "mtp", "--num-warmup-runs", "0"}, func(o benchOptions) bool { return o.speculative.WarmupRuns == 0 }, ""},
		{"bad warm-up", []string{"--speculative", "mtp", "--num-warmup-runs", "-1"}, nil, "--num-warmup-runs must be >= 0"},
		{"serve warm-up", []string{"--mode", "serve", "--num-warmup-runs", "2"}, nil, "--num-warmup-runs is for --mode offline"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseBench(t, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(o) {
				t.Fatalf("options %+v", o)
			}
		})
	}
	if f := newBenchCmd(nil).Flags().Lookup("temperature"); f == nil || f.DefValue != "0" {
		t.Fatalf("--temperature default %v, want 0", f)
	}
}

// The table's last line names, for a method whose outputs differ from the
// baseline's first round, how many requests differ, where the first does
// and in which rounds.
func TestPrintSpeculativeDiffers(t *testing.T) {
	res := &bench.OfflineResult{NumRequests: 32, OutputThroughput: 100}
	r := &bench.SpeculativeResult{Workload: "prose", NumRequests: 32, Rounds: 3, Runs: []bench.SpeculativeRun{
		{Method: "none", Batch: 1, Result: res, RoundThroughputs: []float64{100, 100, 100}, NumDiffer: 1,
			FirstDiff: "request 26 from output token 3 (92 vs 92 tokens)", DifferRounds: []int{2, 3}},
		{Method: "mtp", Batch: 1, Result: res, RoundThroughputs: []float64{100, 100, 100}, SameOutputs: true},
	}}
	var out strings.Builder
	printSpeculative(&out, r)
	want := "outputs identical: no (none at batch 1: 1 of 32 requests differ, the first request 26 from output token 3 (92 vs 92 tokens), in rounds 2, 3 of 3)"
	if !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}
