// Command peer-bench measures this engine against llama.cpp on the same
// weights: it writes a Hugging Face Llama directory with random weights
// (or takes one with -model), writes it as GGUF files in F32, BF16, Q8_0 and
// Q4_K_M (package ggufwrite), then, for each file and round, runs llama.cpp
// (tools/cpu/peer.mjs through the npm package node-llama-cpp) and this
// engine (package llm, loading the GGUF file) one after the other, each in
// a fresh process, with the same thread count, the same prompt token ids
// and the same number of greedily decoded tokens (EOS ignored on both
// sides). The order of the two alternates from round to round. Before each
// round and after the last, it measures the memory bandwidth with the same
// thread count over buffers far larger than the caches, and it probes the
// read bandwidth again right before and after every run, so that each run
// is also set against the roofline of its own window (the "own read roof"
// column: on a shared machine the bandwidth drifts by tens of percent
// within a benchmark).
//
//	npm install --prefix .cache/node-llama-cpp node-llama-cpp@3.21.1
//	go run ./tools/cpu/peer-bench [-t 2] [-p 512] [-n 64] [-r 3] [-types f32,bf16,q8_0,q4_k_m] [-acts auto,none,llama_cpp] [-simd auto|avx2|avx512] [-kv auto|f16] [-model DIR] [-out DIR]
//
// -simd sets the engine's cpu.simd. llama.cpp picks its own CPU variant;
// to compare the AVX2 paths on an AVX-512 machine, point -node-modules at
// a copy of node-llama-cpp's node_modules whose libggml-cpu variants above
// haswell are removed.
//
// It prints, per format, the medians over the rounds of each side's
// prefill and decode rates (prompt tokens over the time to the first
// generated token; the other generated tokens over the time after it), the
// engine's ratios to llama.cpp, decode as a share of the DRAM roofline
// (the weight bytes one decode token reads, over the median copy and read
// bandwidths), how many generated tokens both sides agreed on, and the SIMD
// path each side ran. -acts lists the engine's activation roundings to run
// (cpu.activation_rounding: auto, the default, rounds activations as
// llama.cpp does for quantized and BF16 weights, the latter multiplied in
// VDPBF16PS arithmetic as under bf16; none keeps float32 everywhere;
// llama_cpp rounds for 16-bit weights and multiplies in float32; bf16 is
// auto for the GGUF files benchmarked here), an engine row per format each.
// llama.cpp keeps its own defaults (F16 K/V cache, flash attention auto)
// unless -peer-kv sets the cache type; this engine keeps K/V in IEEE half
// too (cache.kv_cache_dtype auto, for GGUF files) unless -kv sets another
// (f32: float32).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/gguf"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/models/ggufwrite"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
	"github.com/deepinfer/deepinfer-go/llm"
)

// defaultModel is a 153M-parameter Llama (GQA, untied embeddings): 12
// layers of 8.65M plus a 24.6M embedding and a 24.6M LM head. Every matrix
// row is a whole number of 256-weight blocks, so Q4_K_M's K-quants apply
// to all of them.
var defaultModel = random.Llama{Vocab: 32000, Hidden: 768, Intermediate: 3072, Layers: 12, Heads: 12, KVHeads: 4,
	HeadDim: 64, MaxPositions: 2048, BOS: 0, EOS: 1}

type options struct {
	model, tokenizer, out, nodeModules, peerScript, peerKV string
	kv                                                     string // the engine's cache.kv_cache_dtype
	simd                                                   string // the engine's cpu.simd
	types                                                  []string
	threads, prompt, gen, rounds, bwMiB                    int
	acts                                                   []string
	seed                                                   uint64
}

func main() {
	var o options
	child := flag.String("engine-child", "", "internal: run the engine once on this GGUF file and print the result as JSON")
	ids := flag.String("ids", "", "internal: comma-separated prompt ids of -engine-child")
	flag.StringVar(&o.model, "model", "", "Hugging Face Llama/Qwen directory to benchmark (default: a random-weight 153M Llama written into -out)")
	flag.StringVar(&o.tokenizer, "tokenizer", "assets/deepseek-tiny", "folder of the tokenizer.json given to the random model (the prompt is token ids either way)")
	flag.StringVar(&o.out, "out", "", "work folder for the model and GGUF files, kept afterwards (default: a temporary folder, removed)")
	flag.StringVar(&o.nodeModules, "node-modules", ".cache/node-llama-cpp/node_modules", "node_modules holding node-llama-cpp")
	flag.StringVar(&o.peerScript, "peer", "tools/cpu/peer.mjs", "the llama.cpp runner script")
	flag.StringVar(&o.peerKV, "peer-kv", "", "llama.cpp's K/V cache type (f16, f32; default: llama.cpp's own, f16)")
	flag.StringVar(&o.kv, "kv", "auto", "this engine's cache.kv_cache_dtype (auto: IEEE half for GGUF files, llama.cpp's default; f32: float32)")
	types := flag.String("types", "f32,bf16,q8_0,q4_k_m", "GGUF weight types, comma-separated (any of "+strings.Join(ggufwrite.Presets, ", ")+")")
	flag.IntVar(&o.threads, "t", 2, "threads, both engines and the bandwidth measurement")
	flag.IntVar(&o.prompt, "p", 512, "prompt tokens (prefill)")
	flag.IntVar(&o.gen, "n", 64, "generated tokens (greedy, EOS ignored)")
	flag.IntVar(&o.rounds, "r", 3, "rounds; the table gives the median")
	flag.IntVar(&o.bwMiB, "bw-mib", 1024, "size of each bandwidth buffer, MiB (far above the last-level cache)")
	acts := flag.String("acts", "auto", "the engine's cpu.activation_rounding settings to run, comma-separated: auto, none, llama_cpp, bf16 (an engine row each)")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the random weights and the prompt")
	flag.StringVar(&o.simd, "simd", "auto", "the engine's cpu.simd: auto, avx2, avx512 or go (with -node-modules holding a node-llama-cpp whose faster CPU variants are removed, both sides on one path)")
	flag.Parse()
	o.types = strings.Split(*types, ",")
	o.acts = strings.Split(*acts, ",")
	for _, a := range o.acts {
		if a != "auto" && a != "none" && a != "llama_cpp" && a != "bf16" {
			fmt.Fprintf(os.Stderr, "peer-bench: -acts: %q is not auto, none, llama_cpp or bf16\n", a)
			os.Exit(2)
		}
	}
	if *child != "" {
		if err := engineChild(*child, *ids, o.threads, o.gen, o.acts[0], o.simd, o.kv); err != nil {
			fmt.Fprintln(os.Stderr, "peer-bench engine:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "peer-bench:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.threads < 1 || o.prompt < 1 || o.gen < 2 || o.rounds < 1 {
		return errors.New("-t, -p and -r must be at least 1, -n at least 2")
	}
	nodeModules, err := filepath.Abs(o.nodeModules)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(nodeModules, "node-llama-cpp")); err != nil {
		return fmt.Errorf("node-llama-cpp not found under %s: npm install --prefix %s node-llama-cpp@3.21.1",
			nodeModules, filepath.Dir(nodeModules))
	}
	work := o.out
	if work == "" {
		if work, err = os.MkdirTemp("", "peer-bench-"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	} else if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	modelDir, tokDir := o.model, ""
	if modelDir == "" {
		modelDir, tokDir = filepath.Join(work, "llama-153m"), o.tokenizer
		fmt.Fprintf(os.Stderr, "writing a random-weight Llama into %s\n", modelDir)
		if err := random.WriteLlamaWithTokenizer(modelDir, defaultModel, o.seed, o.tokenizer); err != nil {
			return err
		}
	}

	// The prompt: random ids past the special tokens, the same for both.
	var cfg struct {
		Vocab int `json:"vocab_size"`
		kvShape
	}
	if data, err := os.ReadFile(filepath.Join(modelDir, "config.json")); err != nil {
		return err
	} else if err := json.Unmarshal(data, &cfg); err != nil || cfg.Vocab < 1000 {
		return fmt.Errorf("%s/config.json: vocab_size %d (%v)", modelDir, cfg.Vocab, err)
	}
	r := rand.New(rand.NewPCG(o.seed, 3))
	prompt := make([]string, o.prompt)
	for i := range prompt {
		prompt[i] = strconv.Itoa(256 + r.IntN(cfg.Vocab-256))
	}
	ids := strings.Join(prompt, ",")

	peerKV := kvBytesPerToken(cfg.kvShape, o.prompt, o.gen, kvElemBytes(o.peerKV, 2))
	engineKV := kvBytesPerToken(cfg.kvShape, o.prompt, o.gen, kvElemBytes(o.kv, 2)) // auto: half for a GGUF file

	var fs []formatRuns
	files := map[string]string{}
	for _, typ := range o.types {
		path := filepath.Join(work, filepath.Base(modelDir)+"-"+typ+".gguf")
		fmt.Fprintf(os.Stderr, "writing %s\n", path)
		var buf bytes.Buffer
		if err := ggufwrite.Write(&buf, modelDir, tokDir, typ); err != nil {
			return err
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			return err
		}
		f, err := gguf.Parse(buf.Bytes())
		if err != nil {
			return err
		}
		files[typ] = path
		f0 := formatRuns{typ: typ, bytesPerToken: decodeBytesPerToken(f.Tensors), peer: side{name: "llama.cpp", kvBytes: peerKV}}
		for _, a := range o.acts {
			f0.engines = append(f0.engines, side{name: "engine " + a, acts: a, kvBytes: engineKV})
		}
		fs = append(fs, f0)
	}

	bw := newBandwidth(o.bwMiB<<20, o.threads)
	var copies, reads []float64
	measureBW := func() {
		c, rd := bw.measure()
		copies, reads = append(copies, c), append(reads, rd)
		fmt.Fprintf(os.Stderr, "bandwidth: copy %.1f GB/s (read+write), read %.1f GB/s\n", c/1e9, rd/1e9)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for round := range o.rounds {
		measureBW()
		for i := range fs {
			f := &fs[i]
			path := files[f.typ]
			// Alternate who goes first, so that neither always runs on a
			// machine the other just warmed or heated.
			steps := []func() error{
				func() error { return runPeer(o, f, path, nodeModules, ids, round, bw) },
				func() error { return runEngines(o, f, self, path, ids, round, bw) },
			}
			if round%2 == 1 {
				steps[0], steps[1] = steps[1], steps[0]
			}
			for _, s := range steps {
				if err := s(); err != nil {
					return err
				}
			}
		}
	}
	measureBW()
	copyBW, readBW := median(copies), median(reads)

	fmt.Printf("\npeer benchmark: %d threads, %d prompt tokens, %d generated (greedy, EOS ignored), median of %d rounds, each run a fresh process\n",
		o.threads, o.prompt, o.gen, o.rounds)
	fmt.Printf("model: %s; llama.cpp: node-llama-cpp (K/V %s); this engine: K/V %s\n", filepath.Base(modelDir), kvName(o.peerKV), strings.Replace(o.kv, "auto", "auto (f16 for GGUF files)", 1))
	fmt.Printf("bandwidth (%d threads, %d MiB buffers, median of %d): copy %.1f GB/s read+write [%.1f..%.1f], read %.1f GB/s [%.1f..%.1f]\n",
		o.threads, o.bwMiB, len(copies), copyBW/1e9, minOf(copies)/1e9, maxOf(copies)/1e9, readBW/1e9, minOf(reads)/1e9, maxOf(reads)/1e9)
	fmt.Printf("cpu: %s; Go SIMD: %s\n", cpuModel(), simd.Default().Name())
	for _, name := range []string{"engine", "llama.cpp"} {
		fmt.Printf("%s ran: %s\n", name, strings.Join(backends(fs)[name], "; "))
	}
	fmt.Println()
	writeTable(os.Stdout, fs, copyBW, readBW, o.gen)
	fmt.Println()
	writeRoofs(os.Stdout, fs, copyBW, readBW)
	return nil
}

// kvElemBytes is the bytes of one K/V cache value of a cache type as the
// flags name it (-kv: auto is float32; -peer-kv: "" is llama.cpp's f16),
// def for "" and "auto".
func kvElemBytes(kv string, def int) int {
	switch kv {
	case "f32", "fp32", "float32":
		return 4
	case "f16", "fp16", "float16", "bf16":
		return 2
	case "fp8", "fp8_e4m3":
		return 1
	}
	return def
}

func kvName(kv string) string {
	if kv == "" {
		return "f16, llama.cpp's default"
	}
	return kv
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// cpuModel is the CPU's model name and the SIMD flags that matter here.
func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	var name string
	var flags []string
	for line := range strings.SplitSeq(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			if name == "" {
				name = strings.TrimSpace(v)
			}
		case "flags":
			if flags == nil {
				have := map[string]bool{}
				for f := range strings.FieldsSeq(v) {
					have[f] = true
				}
				flags = []string{}
				for _, f := range []string{"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8"} {
					if have[f] {
						flags = append(flags, f)
					}
				}
			}
		}
	}
	return fmt.Sprintf("%s, %d logical CPUs, flags %s", name, runtime.NumCPU(), strings.Join(flags, " "))
}

// probed runs run between two read probes of bw and sets the result's
// ReadBps to their mean.
func probed(bw *bandwidth, run func() (runResult, error)) (runResult, error) {
	before := bw.read()
	res, err := run()
	res.ReadBps = (before + bw.read()) / 2
	return res, err
}

// runPeer runs llama.cpp once on path, between two probes of bw.
func runPeer(o options, f *formatRuns, path, nodeModules, ids string, round int, bw *bandwidth) error {
	args := []string{o.peerScript, "-m", path, "--ids", ids, "-n", strconv.Itoa(o.gen), "-t", strconv.Itoa(o.threads),
		"-c", strconv.Itoa(max(1024, o.prompt+o.gen))}
	if o.peerKV != "" {
		args = append(args, "--kv", o.peerKV)
	}
	cmd := exec.Command("node", args...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+nodeModules)
	res, err := probed(bw, func() (runResult, error) { return runJSON(cmd) })
	if err != nil {
		return fmt.Errorf("llama.cpp on %s: %w", filepath.Base(path), err)
	}
	res.Backend = strings.TrimPrefix(res.Backend, "CPU : ")
	if err := checkRun(res, o); err != nil {
		return fmt.Errorf("llama.cpp on %s: %w", filepath.Base(path), err)
	}
	f.peer.runs = append(f.peer.runs, res)
	logRun(f.typ, f.peer.name, round, res)
	return nil
}

// runEngines runs this engine once on path in a fresh process of this
// program, per engine setting, each between two probes of bw.
func runEngines(o options, f *formatRuns, self, path, ids string, round int, bw *bandwidth) error {
	for i := range f.engines {
		s := &f.engines[i]
		args := []string{"-engine-child", path, "-ids", ids, "-n", strconv.Itoa(o.gen), "-t", strconv.Itoa(o.threads),
			"-acts", s.acts, "-simd", o.simd, "-kv", o.kv}
		res, err := probed(bw, func() (runResult, error) { return runJSON(exec.Command(self, args...)) })
		if err != nil {
			return fmt.Errorf("%s on %s: %w", s.name, filepath.Base(path), err)
		}
		if err := checkRun(res, o); err != nil {
			return fmt.Errorf("%s on %s: %w", s.name, filepath.Base(path), err)
		}
		s.runs = append(s.runs, res)
		logRun(f.typ, s.name, round, res)
	}
	return nil
}

func logRun(typ, name string, round int, r runResult) {
	fmt.Fprintf(os.Stderr, "round %d %-7s %-18s prefill %7.1f tok/s, decode %6.2f tok/s, read probes %.1f GB/s\n", round+1, typ, name,
		r.PrefillTokS, r.DecodeTokS, r.ReadBps/1e9)
}

// checkRun checks that a run decoded the prompt and token count asked.
func checkRun(r runResult, o options) error {
	if len(r.PromptIDs) != o.prompt || len(r.IDs) != o.gen {
		return fmt.Errorf("ran %d prompt tokens and generated %d, want %d and %d", len(r.PromptIDs), len(r.IDs), o.prompt, o.gen)
	}
	if r.PrefillTokS <= 0 || r.DecodeTokS <= 0 {
		return fmt.Errorf("no rates in the result")
	}
	return nil
}

// runJSON runs cmd and parses the last line of its output as a runResult.
func runJSON(cmd *exec.Cmd) (runResult, error) {
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		return runResult{}, fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	var res runResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return runResult{}, fmt.Errorf("output %q: %w", lines[len(lines)-1], err)
	}
	return res, nil
}

// engineChild loads the GGUF file at path with package llm on the CPU and
// generates n tokens greedily (EOS ignored) after the prompt ids, printing
// a runResult line. Prefill is the prompt over the time from submitting
// the request to the first generated token; decode the other n-1 tokens
// over the time after it, as peer.mjs times llama.cpp.
func engineChild(path, ids string, threads, n int, acts, simd, kv string) error {
	var prompt []int
	for s := range strings.SplitSeq(ids, ",") {
		id, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("-ids: %w", err)
		}
		prompt = append(prompt, id)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	cfg := config.Default()
	cfg.Model = abs
	cfg.Device = "cpu"
	cfg.CPU.Threads = threads
	cfg.CPU.ActivationRounding = acts
	cfg.CPU.SIMD = simd
	cfg.Cache.KVCacheDType = kv
	cfg.Engine.MaxNumSeqs = 1
	cfg.Engine.MaxModelLen = len(prompt) + n
	cfg.Cache.NumBlocks = (len(prompt)+n+cfg.Cache.BlockSize-1)/cfg.Cache.BlockSize + 1
	cfg.Cache.PrefixCaching = false
	if err := cfg.Validate(); err != nil {
		return err
	}
	l, err := llm.NewLLM(&cfg, llm.Options{})
	if err != nil {
		return err
	}
	defer l.Close()
	params := engine.DefaultSamplingParams()
	params.Temperature = 0
	params.MaxTokens = n
	params.IgnoreEOS = true
	var tFirst, tLast time.Time
	got := 0
	t0 := time.Now()
	res, err := l.Generate(context.Background(), []llm.Prompt{{IDs: prompt}}, params, func(o engine.RequestOutput) {
		if len(o.TokenIDs) == 0 {
			return
		}
		now := time.Now()
		if got == 0 {
			tFirst = now
		}
		got += len(o.TokenIDs)
		tLast = now
	})
	if err != nil {
		return err
	}
	out := res[0].Outputs[0]
	if out.Err != nil {
		return out.Err
	}
	r := runResult{
		PromptIDs:   make([]int32, len(prompt)),
		PrefillTokS: float64(len(prompt)) / tFirst.Sub(t0).Seconds(),
		DecodeTokS:  float64(got-1) / tLast.Sub(tFirst).Seconds(),
		Backend:     l.Backend().Name(),
		Format:      models.WeightFormat(l.Model()),
	}
	for i, id := range prompt {
		r.PromptIDs[i] = int32(id)
	}
	for _, id := range out.TokenIDs {
		r.IDs = append(r.IDs, int32(id))
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	fmt.Println(string(data))
	return nil
}
