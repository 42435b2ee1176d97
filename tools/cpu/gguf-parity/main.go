// Command gguf-parity checks that this engine and llama.cpp produce the
// same greedy tokens on the same GGUF files. It writes a random-weight
// Llama and Qwen3 (and with -models the MoE ones: Qwen3-MoE, Mixtral, a
// DeepSeek V3) as Hugging Face directories with the given tokenizer, a
// GGUF file of each in every weight type asked for (package ggufwrite),
// then for each file and prompt runs greedy decoding here (the model loaded
// from the GGUF file on the CPU backend) and in llama.cpp (tools/cpu/peer.mjs
// through node-llama-cpp, K/V cache in F32, flash attention off), and
// prints, per run, how many of the first N tokens match and, at the first
// difference, this engine's logit margin between its token and llama.cpp's:
//
//	npm install --prefix .cache/node-llama-cpp node-llama-cpp@3.21.1
//	go run ./tools/cpu/gguf-parity -out DIR [-n 32] [-t 2] [-types f32,f16,bf16,q8_0,q4_0,q4_k_m,q5_k_m] [-acts auto|none|llama_cpp|bf16] [-self]
//
// With -self llama.cpp also runs each prompt of more than one id a token
// at a time (its decode kernels instead of its batched ones for the
// prompt), and the self column counts how many of those tokens match its
// own one-pass run: llama.cpp's agreement with itself, the scale for the
// matched column; matched-1 counts this engine's tokens that match that
// token-at-a-time run.
//
// Prompts are token ids (llama.cpp evaluates them as given), so the
// comparison does not depend on either tokenizer. A difference at a
// near-tie is expected for the quantized types: llama.cpp rounds the
// activations to 8-bit blocks before its integer dot products (and to
// bfloat16 for BF16 weights). -acts is the engine's
// cpu.activation_rounding: auto (the default) rounds activations as
// llama.cpp does for the quantized and BF16 weights (the latter in
// VDPBF16PS arithmetic), none keeps them in float32, llama_cpp rounds them
// for BF16 and F16 weights and widens them for float32 products.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/models/ggufwrite"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/llm"
)

// configs are the random models: rows of whole 256-weight blocks, so that
// Q4_K_M's K-quants apply to every matrix. Embeddings are untied: with
// random tied ones the input token is the top logit and greedy decoding
// repeats it, which matches trivially.
var configs = map[string]map[string]any{
	"llama": {"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "vocab_size": 8192,
		"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
		"max_position_embeddings": 1024, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1, "dtype": "float32"},
	"qwen3": {"architectures": []string{"Qwen3ForCausalLM"}, "model_type": "qwen3", "vocab_size": 8192,
		"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
		"max_position_embeddings": 1024, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1, "dtype": "float32"},
	// The MoE ones are written as llama.cpp can run them: every layer
	// sparse and the top-k weights renormalized (qwen3moe), DeepSeek V3's
	// routing (llama.cpp scores expert groups by their two best experts)
	// and mscale equal to mscale_all_dim.
	"qwen3moe": {"architectures": []string{"Qwen3MoeForCausalLM"}, "model_type": "qwen3_moe", "vocab_size": 8192,
		"hidden_size": 256, "intermediate_size": 768, "moe_intermediate_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
		"norm_topk_prob": true, "num_hidden_layers": 4, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
		"max_position_embeddings": 1024, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1, "dtype": "float32"},
	"mixtral": {"architectures": []string{"MixtralForCausalLM"}, "model_type": "mixtral", "vocab_size": 8192,
		"hidden_size": 256, "intermediate_size": 256, "num_local_experts": 8, "num_experts_per_tok": 2,
		"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
		"max_position_embeddings": 1024, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1, "dtype": "float32"},
	"deepseek3": {"architectures": []string{"DeepseekV3ForCausalLM"}, "model_type": "deepseek_v3", "vocab_size": 8192,
		"hidden_size": 256, "intermediate_size": 768, "moe_intermediate_size": 256, "num_hidden_layers": 4,
		"num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 256, "kv_lora_rank": 256,
		"qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "n_routed_experts": 8,
		"num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
		"topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true, "routed_scaling_factor": 2.5,
		"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 1024, "tie_word_embeddings": false,
		"rope_scaling": map[string]any{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 32,
			"beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
		"bos_token_id": 0, "eos_token_id": 1, "dtype": "float32"},
}

func main() {
	out := flag.String("out", "", "work folder for the model folders and GGUF files")
	tokDir := flag.String("tokenizer", "assets/deepseek-tiny", "folder of the tokenizer.json the models get (8192 tokens)")
	nodeModules := flag.String("node-modules", ".cache/node-llama-cpp/node_modules", "node_modules holding node-llama-cpp")
	n := flag.Int("n", 32, "tokens to generate per prompt")
	threads := flag.Int("t", 2, "threads, both engines")
	types := flag.String("types", strings.Join(ggufwrite.Presets, ","), "GGUF weight types")
	archs := flag.String("models", "llama,qwen3", "models: llama, qwen3, qwen3moe, mixtral, deepseek3")
	seed := flag.Uint64("seed", 1, "seed of the weights and prompts")
	acts := flag.String("acts", "auto", "the engine's cpu.activation_rounding: auto, none, llama_cpp or bf16")
	self := flag.Bool("self", false, "also run llama.cpp with each prompt evaluated a token at a time and count how many of its tokens match its own one-pass run (the self column)")
	ppl := flag.Int("ppl", 256, "tokens of the fixed text whose perplexity both engines compute per file (0: none)")
	kv := flag.String("kv", "auto", "the engine's K/V cache: auto or f32 (float32, as llama.cpp's side here, whatever the engine's own default for GGUF files) or f16")
	flag.Parse()
	kvDType, ok := map[string]kernels.DType{"auto": 0, "f32": kernels.F32, "f16": kernels.F16}[*kv]
	if !ok {
		fmt.Fprintf(os.Stderr, "gguf-parity: -kv %q is not auto, f32 or f16\n", *kv)
		os.Exit(2)
	}
	if !slices.Contains([]string{"auto", "none", "llama_cpp", "bf16"}, *acts) {
		fmt.Fprintf(os.Stderr, "gguf-parity: -acts %q is not auto, none, llama_cpp or bf16\n", *acts)
		os.Exit(2)
	}
	mode := llm.CPUActivations(*acts, true) // the engine's mode for a GGUF file
	if *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	o := options{out: *out, tokDir: *tokDir, nodeModules: *nodeModules, peerScript: "tools/cpu/peer.mjs", n: *n, threads: *threads, self: *self,
		pplLen: *ppl, acts: mode, kv: kvDType, types: strings.Split(*types, ","), archs: strings.Split(*archs, ","), seed: *seed, log: os.Stderr}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "gguf-parity:", err)
		os.Exit(1)
	}
}

type result struct {
	model, typ, prompt string
	matched, n         int
	self               int // llama.cpp's tokens with its prompt a token at a time that match its own one-pass run (-1: not run)
	matchedOne         int // this engine's tokens that match that token-at-a-time run (-1: not run)
	distinct           int // distinct tokens among this engine's n
	detail             string
}

// options are a parity run's settings (the flags).
type options struct {
	out, tokDir, nodeModules string
	peerScript               string // tools/cpu/peer.mjs, from the working directory
	n, threads               int    // greedy tokens per prompt (0: no greedy runs), threads of both engines
	self                     bool   // also run llama.cpp with its prompt a token at a time, against itself
	pplLen                   int    // tokens of the perplexity text (0 or 1: none)
	acts                     cpu.ActRounding
	kv                       kernels.DType // the K/V cache type (0: the backend's, float32)
	types, archs             []string
	seed                     uint64
	log                      io.Writer // a line per run as it finishes
}

// run measures and prints both tables.
func run(o options) error {
	results, ppls, err := measure(o)
	if err != nil {
		return err
	}
	fmt.Printf("\n%-6s %-20s %-12s %-8s %-10s %-10s %-8s %s\n", "model", "type", "prompt", "matched", "self", "matched-1", "distinct", "first difference")
	for _, res := range results {
		self, one := "-", "-"
		if res.self >= 0 {
			self, one = fmt.Sprintf("%d/%d", res.self, res.n), fmt.Sprintf("%d/%d", res.matchedOne, res.n)
		}
		fmt.Printf("%-6s %-20s %-12s %2d/%-5d %-10s %-10s %-8d %s\n", res.model, res.typ, res.prompt, res.matched, res.n, self, one, res.distinct, res.detail)
	}
	if len(ppls) > 0 {
		fmt.Printf("\nperplexity over %d fixed random tokens (the first one not scored)\n%-6s %-8s %-12s %-12s %s\n", o.pplLen, "model", "type", "engine", "llama.cpp", "difference")
		for _, p := range ppls {
			fmt.Printf("%-6s %-8s %-12.4f %-12.4f %+.3f%%\n", p.model, p.typ, p.ours, p.theirs, p.diff())
		}
	}
	return nil
}

// measure writes the models and their GGUF files into o.out and runs both
// engines on each file: greedy decoding of the fixed prompts and the
// perplexity of the fixed text.
func measure(o options) ([]result, []pplResult, error) {
	r := rand.New(rand.NewPCG(o.seed, 7))
	prompts := [][]int32{}
	for _, l := range []int{1, 6, 23, 70} {
		p := make([]int32, l)
		for i := range p {
			p[i] = int32(7 + r.IntN(8192-7)) // past the special tokens
		}
		prompts = append(prompts, p)
	}
	// The perplexity text: fixed random ids past the special tokens.
	text := make([]int32, o.pplLen)
	for i := range text {
		text[i] = int32(7 + r.IntN(8192-7))
	}
	var results []result
	var ppls []pplResult
	for _, arch := range o.archs {
		cfgMap, ok := configs[arch]
		if !ok {
			return nil, nil, fmt.Errorf("model %q: want one of llama, qwen3, qwen3moe, mixtral, deepseek3", arch)
		}
		dir := filepath.Join(o.out, arch)
		if err := writeModel(dir, o.tokDir, cfgMap, o.seed); err != nil {
			return nil, nil, err
		}
		for _, typ := range o.types {
			var buf bytes.Buffer
			if err := ggufwrite.Write(&buf, dir, "", typ); err != nil {
				return nil, nil, err
			}
			path := filepath.Join(o.out, arch+"-"+typ+".gguf")
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				return nil, nil, err
			}
			if o.pplLen > 1 {
				ours, err := enginePPL(path, text, o.threads, o.acts, o.kv)
				if err != nil {
					return nil, nil, err
				}
				theirs, err := peerPPL(o.peerScript, path, o.nodeModules, text, o.threads)
				if err != nil {
					return nil, nil, err
				}
				pr := pplResult{model: arch, typ: typ, ours: ours, theirs: theirs}
				ppls = append(ppls, pr)
				fmt.Fprintf(o.log, "%s %s perplexity over %d tokens: %.4f here, %.4f llama.cpp (%+.3f%%)\n", arch, typ, len(text), ours, theirs, pr.diff())
			}
			if o.n == 0 { // perplexity only
				continue
			}
			for pi, prompt := range prompts {
				ours, logits, format, err := engineGreedy(path, prompt, o.n, o.threads, o.acts, o.kv)
				if err != nil {
					return nil, nil, err
				}
				theirs, err := peerGreedy(o.peerScript, path, o.nodeModules, prompt, o.n, o.threads, 512)
				if err != nil {
					return nil, nil, err
				}
				res := result{model: arch, typ: typ + " (" + format + ")", prompt: fmt.Sprintf("#%d (%d ids)", pi, len(prompt)), n: o.n, self: -1, matchedOne: -1}
				if o.self && len(prompt) > 1 {
					one, err := peerGreedy(o.peerScript, path, o.nodeModules, prompt, o.n, o.threads, 1)
					if err != nil {
						return nil, nil, err
					}
					res.self = commonPrefix(theirs, one)
					res.matchedOne = commonPrefix(ours, one)
				}
				seen := map[int32]bool{}
				for _, id := range ours {
					seen[id] = true
				}
				res.distinct = len(seen)
				res.matched = commonPrefix(ours, theirs)
				if res.matched < o.n && res.matched < len(theirs) {
					i := res.matched
					lg := logits[i]
					a, b := ours[i], theirs[i]
					sorted := slices.Clone(lg)
					sort.Slice(sorted, func(x, y int) bool { return sorted[x] > sorted[y] })
					res.detail = fmt.Sprintf("token %d: ours %d (logit %.5f), llama.cpp %d (our logit %.5f, rank %d): margin %.5f = %.2g of the logit spread",
						i, a, lg[a], b, lg[b], rank(lg, b), lg[a]-lg[b], float64(lg[a]-lg[b])/float64(sorted[0]-sorted[len(sorted)-1]))
				}
				results = append(results, res)
				fmt.Fprintf(o.log, "%s %s %s: %d/%d (%d distinct; llama.cpp against itself %d, this engine against llama.cpp a token at a time %d) %s\n", res.model, res.typ, res.prompt, res.matched, o.n, res.distinct, res.self, res.matchedOne, res.detail)
			}
		}
	}
	return results, ppls, nil
}

// commonPrefix is how many leading tokens a and b share.
func commonPrefix(a, b []int32) int {
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return n
}

// pplResult is the perplexity of the fixed text under one file, here and
// in llama.cpp.
type pplResult struct {
	model, typ   string
	ours, theirs float64
}

// diff is the engine's perplexity over llama.cpp's, minus one, in percent.
func (p pplResult) diff() float64 { return 100 * (p.ours/p.theirs - 1) }

// enginePPL loads the GGUF file at path and returns the perplexity of
// text: exp of the mean over i >= 1 of -log softmax(logits after
// text[:i])[text[i]], from one forward pass over the whole text, the
// log-softmax in float64.
func enginePPL(path string, text []int32, threads int, acts cpu.ActRounding, kv kernels.DType) (float64, error) {
	e, err := openEngine(path, threads, acts, kv, len(text))
	if err != nil {
		return 0, err
	}
	defer e.close()
	rows := make([]int32, len(text)-1)
	for i := range rows {
		rows[i] = int32(i)
	}
	v, err := e.logits(text, 0, rows)
	if err != nil {
		return 0, err
	}
	vocab := len(v) / len(rows)
	var nll float64
	for i := range rows {
		row := v[i*vocab : (i+1)*vocab]
		mx := float64(slices.Max(row))
		var sum float64
		for _, x := range row {
			sum += math.Exp(float64(x) - mx)
		}
		nll += mx + math.Log(sum) - float64(row[text[i+1]])
	}
	return math.Exp(nll / float64(len(rows))), nil
}

// peerPPL is enginePPL in llama.cpp (peer.mjs --ppl, K/V in F32, flash
// attention off).
func peerPPL(script, path, nodeModules string, text []int32, threads int) (float64, error) {
	var res struct {
		NLL        []float64 `json:"nll"`
		Candidates int       `json:"candidates"`
	}
	if err := runPeer(script, path, nodeModules, text, &res, "-t", fmt.Sprint(threads), "--kv", "f32", "--no-fa", "--ppl"); err != nil {
		return 0, err
	}
	if len(res.NLL) != len(text)-1 {
		return 0, fmt.Errorf("peer: %d log-probabilities for %d tokens", len(res.NLL), len(text))
	}
	var nll float64
	for _, x := range res.NLL {
		nll += x
	}
	return math.Exp(nll / float64(len(res.NLL))), nil
}

// rank is the number of logits above lg[id].
func rank(lg []float32, id int32) int {
	k := 0
	for _, v := range lg {
		if v > lg[id] {
			k++
		}
	}
	return k
}

// writeModel writes config.json, model.safetensors (random F32 weights)
// and the tokenizer files into dir.
func writeModel(dir, tokDir string, cfgMap map[string]any, seed uint64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(cfgMap, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		return err
	}
	cfg, err := weights.ParseConfig(data)
	if err != nil {
		return err
	}
	w, err := models.RandomWeights(cfg, kernels.F32, seed)
	if err != nil {
		return err
	}
	var ts []weights.Tensor
	for _, name := range w.Names() {
		ts = append(ts, w[name])
	}
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		return err
	}
	return random.CopyTokenizer(dir, tokDir)
}

// engineGreedy loads the GGUF file at path and decodes n tokens greedily
// after prompt, returning them, the logits each was chosen from, and the
// weight format.
func engineGreedy(path string, prompt []int32, n, threads int, acts cpu.ActRounding, kv kernels.DType) ([]int32, [][]float32, string, error) {
	e, err := openEngine(path, threads, acts, kv, len(prompt)+n)
	if err != nil {
		return nil, nil, "", err
	}
	defer e.close()
	var ids []int32
	var all [][]float32
	next, cached := prompt, 0
	for len(ids) < n {
		v, err := e.logits(next, cached, []int32{int32(len(next) - 1)})
		if err != nil {
			return nil, nil, "", err
		}
		best := int32(0)
		for i, x := range v {
			if x > v[best] {
				best = int32(i)
			}
		}
		ids = append(ids, best)
		all = append(all, v)
		cached += len(next)
		next = []int32{best}
	}
	return ids, all, models.WeightFormat(e.m), nil
}

// engine is a GGUF file loaded on a CPU backend with a paged KV cache for
// one sequence.
type engine struct {
	ops       *cpu.Backend
	m         models.Model
	cache     *models.KVCache
	table     []int32 // the sequence's block table: blocks 0, 1, 2, ...
	blockSize int
}

// openEngine loads the GGUF file at path with room for tokens tokens and
// its K/V cache of type kv.
func openEngine(path string, threads int, acts cpu.ActRounding, kv kernels.DType, tokens int) (*engine, error) {
	ops := cpu.New(cpu.Options{Threads: threads, Activations: acts, KVCacheDType: kv})
	m, err := models.Builtin().Load(ops, path, models.Options{MaxModelLen: max(1024, tokens)})
	if err != nil {
		ops.Close()
		return nil, err
	}
	const blockSize = 16
	numBlocks := tokens/blockSize + 2
	cache, err := m.NewKVCache(numBlocks, blockSize)
	if err != nil {
		ops.Close()
		return nil, err
	}
	table := make([]int32, numBlocks)
	for i := range table {
		table[i] = int32(i)
	}
	return &engine{ops: ops, m: m, cache: cache, table: table, blockSize: blockSize}, nil
}

func (e *engine) close() { e.ops.Close() }

// logits runs ids after cached tokens of the sequence through the model
// and returns the logits of the given rows of ids, row after row.
func (e *engine) logits(ids []int32, cached int, rows []int32) ([]float32, error) {
	h := models.HostBatch{BlockSize: e.blockSize}
	h.AddSequence(ids, cached, e.table[:(cached+len(ids)+e.blockSize-1)/e.blockSize])
	b, err := h.Upload(e.ops, len(e.table))
	if err != nil {
		return nil, err
	}
	hidden, err := e.m.Forward(context.Background(), e.cache, b)
	if err != nil {
		return nil, err
	}
	r, err := e.ops.Alloc(kernels.I32, len(rows))
	if err != nil {
		return nil, err
	}
	if err := e.ops.Upload(r, kernels.I32Bytes(rows), kernels.I32); err != nil {
		return nil, err
	}
	lg, err := e.m.ComputeLogits(hidden, r)
	if err != nil {
		return nil, err
	}
	return kernels.ToF32(e.ops, lg)
}

// peerGreedy runs llama.cpp on the same file and prompt.
// batch is the most tokens llama.cpp evaluates in one pass (1: the prompt a
// token at a time, through its decode kernels).
func peerGreedy(script, path, nodeModules string, prompt []int32, n, threads, batch int) ([]int32, error) {
	var res struct {
		IDs []int32 `json:"ids"`
	}
	err := runPeer(script, path, nodeModules, prompt, &res, "-n", fmt.Sprint(n), "-t", fmt.Sprint(threads), "--kv", "f32", "--no-fa", "--batch", fmt.Sprint(batch))
	return res.IDs, err
}

// runPeer runs script (tools/cpu/peer.mjs) on the GGUF file at path with
// ids as the prompt and the extra arguments, and decodes its last output
// line into res.
func runPeer(script, path, nodeModules string, ids []int32, res any, args ...string) error {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	abs, err := filepath.Abs(nodeModules)
	if err != nil {
		return err
	}
	cmd := exec.Command("node", append([]string{script, "-m", path, "--ids", strings.Join(s, ",")}, args...)...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+abs)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("peer: %v: %s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), res); err != nil {
		return fmt.Errorf("peer output %q: %w", lines[len(lines)-1], err)
	}
	return nil
}
