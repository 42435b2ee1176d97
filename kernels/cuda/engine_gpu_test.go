package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/bench"
	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/kernels/cuda"
	"github.com/deepinfer/deepinfer-go/llm"
)

// skipWithoutGPU skips t where no library or device can be opened (unless
// cuda.LibraryEnv names a library, which must then work).
func skipWithoutGPU(t *testing.T) {
	t.Helper()
	b, err := cuda.New(cuda.Options{})
	if err != nil {
		if os.Getenv(cuda.LibraryEnv) == "" && (errors.Is(err, cuda.ErrNoLibrary) || errors.Is(err, cuda.ErrNoDevice)) {
			t.Skipf("GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	b.Close()
}

// newLLM starts an engine from a YAML config; the caller closes it.
func newLLM(t *testing.T, yaml string) *llm.LLM {
	t.Helper()
	cfg, err := config.Parse("gpu.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	l, err := llm.NewLLM(cfg, llm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// randomPrompts returns n prompts of minLen + r.IntN(spread) token ids in
// [3, vocab) (past the fixtures' special ids), drawn from r in order.
func randomPrompts(r *rand.Rand, n, minLen, spread, vocab int) []llm.Prompt {
	prompts := make([]llm.Prompt, n)
	for i := range prompts {
		ids := make([]int, minLen+r.IntN(spread))
		for j := range ids {
			ids[j] = 3 + r.IntN(vocab-3)
		}
		prompts[i] = llm.Prompt{IDs: ids}
	}
	return prompts
}

// The engine on the GPU with CUDA graphs on and off (and ZOS on): the same
// greedy tokens for a request alone, and the agreement over 64 requests
// whose decode batches pad to the captured sizes.
func TestGPUEngineGraphs(t *testing.T) {
	skipWithoutGPU(t)
	dir := t.TempDir()
	spec := random.Llama{Vocab: 512, Hidden: 256, Intermediate: 512, Layers: 4, Heads: 8, KVHeads: 2, HeadDim: 32,
		MaxPositions: 1024, BOS: 1, EOS: 2}
	if err := random.WriteLlama(dir, spec, 9); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(4, 4))
	prompts := randomPrompts(r, 64, 5, 100, spec.Vocab)
	params := engine.DefaultSamplingParams()
	params.Temperature = 0
	params.MaxTokens = 32
	params.IgnoreEOS = true
	run := func(graphs, zos bool, ps []llm.Prompt) ([][]int, time.Duration) {
		t.Helper()
		yaml := fmt.Sprintf(`model: %s
device: cuda
cache: {num_blocks: 1024, block_size: 16}
engine: {max_num_seqs: 64, max_num_batched_tokens: 4096}
zos: {enabled: %v}
cuda_graph: {enabled: %v, batch_sizes: [1, 2, 4, 8, 16, 32, 64]}
pipeline:
  sample: greedy
`, dir, zos, graphs)
		l := newLLM(t, yaml)
		defer l.Close()
		return generateTimed(t, l, ps, params)
	}
	agree := func(a, b [][]int) int {
		n := 0
		for i := range a {
			if slices.Equal(a[i], b[i]) {
				n++
			}
		}
		return n
	}
	aloneOff, _ := run(false, false, prompts[:1])
	aloneOn, _ := run(true, false, prompts[:1])
	if !slices.Equal(aloneOff[0], aloneOn[0]) {
		t.Errorf("one request: graphs on %v, off %v", aloneOn[0], aloneOff[0])
	}
	off, tOff := run(false, false, prompts)
	on, tOn := run(true, false, prompts)
	onZOS, tOnZOS := run(true, true, prompts)
	nOn, nZOS := agree(off, on), agree(off, onZOS)
	t.Logf("engine graphs: greedy agreement with graphs off: graphs on %d/64, graphs on + ZOS %d/64; one request alone: %v; wall %v off, %v on, %v on+ZOS (64 x 32 tokens)",
		nOn, nZOS, slices.Equal(aloneOff[0], aloneOn[0]), tOff.Round(time.Millisecond), tOn.Round(time.Millisecond), tOnZOS.Round(time.Millisecond))
	// Float32 weights and float32 GEMMs: a padded batch can change cuBLAS's
	// algorithm, which moves logits by rounding; greedy ties that close are
	// rare on this model.
	if nOn < 60 || nZOS < 60 {
		t.Errorf("greedy agreement with graphs off: %d/64 and %d/64, want at least 60", nOn, nZOS)
	}
}

// The shipped default model (assets/deepseek-tiny: MLA and MoE layers, BF16
// weights) in the engine with CUDA graphs on and off: the same greedy tokens
// (one request alone, and 32 requests whose decode batches pad to the
// captured sizes), and the decode rate both ways.
func TestGPUEngineGraphsDefaultModel(t *testing.T) {
	skipWithoutGPU(t)
	dir, err := filepath.Abs("../../assets/deepseek-tiny")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 5))
	prompts := randomPrompts(r, 32, 4, 60, 8192)
	run := func(graphs bool, ps []llm.Prompt, maxTokens int) ([][]int, time.Duration) {
		t.Helper()
		params := engine.DefaultSamplingParams()
		params.Temperature = 0
		params.MaxTokens = maxTokens
		params.IgnoreEOS = true
		yaml := fmt.Sprintf(`model: %s
device: cuda
cache: {num_blocks: 1024, block_size: 16}
engine: {max_num_seqs: 32, max_num_batched_tokens: 4096}
cuda_graph: {enabled: %v, batch_sizes: [1, 2, 4, 8, 16, 32]}
pipeline:
  sample: greedy
`, dir, graphs)
		cfg, err := config.Parse("gpu.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		l, err := llm.NewLLM(cfg, llm.Options{})
		if err != nil {
			t.Fatalf("graphs %v: %v", graphs, err)
		}
		defer l.Close()
		return generateTimed(t, l, ps, params)
	}
	const aloneTokens, crowdTokens = 256, 64
	aloneOff, tAloneOff := run(false, prompts[:1], aloneTokens)
	aloneOn, tAloneOn := run(true, prompts[:1], aloneTokens)
	off, tOff := run(false, prompts, crowdTokens)
	on, tOn := run(true, prompts, crowdTokens)
	n := 0
	for i := range off {
		if slices.Equal(off[i], on[i]) {
			n++
		}
	}
	rate := func(reqs, tokens int, d time.Duration) float64 { return float64(reqs*tokens) / d.Seconds() }
	t.Logf("default model graphs: one request alone identical: %v; 32 requests: %d/32 identical; "+
		"1 x %d tokens: off %v (%.0f tok/s), on %v (%.0f tok/s); 32 x %d tokens: off %v (%.0f tok/s), on %v (%.0f tok/s)",
		slices.Equal(aloneOff[0], aloneOn[0]), n, aloneTokens,
		tAloneOff.Round(time.Millisecond), rate(1, aloneTokens, tAloneOff), tAloneOn.Round(time.Millisecond), rate(1, aloneTokens, tAloneOn),
		crowdTokens, tOff.Round(time.Millisecond), rate(32, crowdTokens, tOff), tOn.Round(time.Millisecond), rate(32, crowdTokens, tOn))
	if !slices.Equal(aloneOff[0], aloneOn[0]) {
		t.Errorf("one request: graphs on %v, off %v", aloneOn[0], aloneOff[0])
	}
	// BF16 weights: a padded batch can change cuBLAS's algorithm for the
	// dense layers (5 rows and up), which moves logits by rounding.
	if n < 28 {
		t.Errorf("greedy agreement with graphs off: %d/32, want at least 28", n)
	}
}

// With cache.num_blocks 0 the engine sizes the KV cache from the memory free
// after the weights less the activations of a profiling forward pass of the
// largest step: the measured peak holds at least that step's hidden states
// and grows with max_num_batched_tokens, and the engine still generates.
func TestGPUEngineMemoryPlan(t *testing.T) {
	skipWithoutGPU(t)
	dir := t.TempDir()
	spec := random.Llama{Vocab: 512, Hidden: 256, Intermediate: 512, Layers: 2, Heads: 8, KVHeads: 2, HeadDim: 32,
		MaxPositions: 2048, BOS: 1, EOS: 2}
	if err := random.WriteLlama(dir, spec, 3); err != nil {
		t.Fatal(err)
	}
	plan := func(tokens int) llm.MemoryPlan {
		t.Helper()
		yaml := fmt.Sprintf("model: %s\ndevice: cuda\ncache: {num_blocks: 0, block_size: 16, memory_fraction: 0.5}\n"+
			"engine: {max_num_seqs: 16, max_num_batched_tokens: %d, max_model_len: 1024}\npipeline: {sample: greedy}\n", dir, tokens)
		l := newLLM(t, yaml)
		defer l.Close()
		p := engine.DefaultSamplingParams()
		p.MaxTokens, p.IgnoreEOS = 4, true
		out, err := l.Generate(context.Background(), []llm.Prompt{{IDs: []int{5, 6, 7}}}, p, nil)
		if err != nil || len(out) != 1 || len(out[0].Outputs) != 1 || len(out[0].Outputs[0].TokenIDs) != 4 {
			t.Fatalf("generate after sizing: %v, %v", out, err)
		}
		return l.MemoryPlan()
	}
	small, large := plan(1024), plan(8192)
	for _, c := range []struct {
		p      llm.MemoryPlan
		tokens int
	}{{small, 1024}, {large, 8192}} {
		if min := uint64(c.tokens * spec.Hidden * 4); c.p.ActivationPeak < min {
			t.Errorf("%d tokens: activation peak %d bytes, below one [%d, %d] float32 activation (%d)", c.tokens, c.p.ActivationPeak, c.tokens, spec.Hidden, min)
		}
		// 16 sequences of 1024 tokens in blocks of 16, plus one: the cap,
		// far below what half of an H200's memory holds.
		if c.p.Available == 0 || c.p.KVBlocks != 16*64+1 {
			t.Errorf("%d tokens: plan %+v, want memory available and %d blocks", c.tokens, c.p, 16*64+1)
		}
	}
	if large.ActivationPeak <= small.ActivationPeak {
		t.Errorf("activation peak %d bytes at 8192 tokens, not above %d at 1024", large.ActivationPeak, small.ActivationPeak)
	}
	t.Logf("memory plan: activation peak %.1f MB at 1024 tokens, %.1f MB at 8192; %.1f GB available after the weights",
		float64(small.ActivationPeak)/1e6, float64(large.ActivationPeak)/1e6, float64(large.Available)/1e9)
}

// generateTimed runs ps on l and returns each request's tokens (failing t on
// any error) and the wall time of the call.
func generateTimed(t *testing.T, l *llm.LLM, ps []llm.Prompt, params engine.SamplingParams) ([][]int, time.Duration) {
	t.Helper()
	start := time.Now()
	res, err := l.Generate(context.Background(), ps, params, nil)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	out := make([][]int, len(res))
	for i, c := range res {
		if c.Outputs[0].Err != nil {
			t.Fatal(c.Outputs[0].Err)
		}
		out[i] = c.Outputs[0].TokenIDs
	}
	return out, took
}

// The shipped default model, one request at a time (ZOS and CUDA graphs on,
// as configs/cuda.yaml), in fresh engines of one process: every engine
// gives the same greedy tokens, also with every device allocation filled
// with NaN bytes first (cuda.fill_uninitialized_memory), where a kernel
// that reads memory nobody wrote shows. Later engines take their memory
// from blocks the earlier ones freed, so a read of stale memory would show
// as an engine that differs.
func TestGPUEngineRepeatable(t *testing.T) {
	skipWithoutGPU(t)
	run := defaultModelProse(t, 1)
	want := run("cuda: {fill_uninitialized_memory: false}")
	for i, fill := range []bool{false, true, false, true} {
		got := run(fmt.Sprintf("cuda: {fill_uninitialized_memory: %v}", fill))
		compareGreedy(t, fmt.Sprintf("engine %d (fill_uninitialized_memory %v)", i+2, fill), "the first engine's", got, want)
	}
}

// The shipped default model, one request at a time (ZOS and CUDA graphs
// on): speculative decoding with its MTP layer (k = 1, 2, 4), prompt
// lookup (k = 4) and the DSpark drafter (k = 6) gives the greedy tokens of
// plain decoding. A verify step's rows (up to 7 here, padded to the graph
// size 8) take the GEMV kernels (the engine raises their row limit to 8
// with more than 3 drafts), whose rows' bits do not depend on their
// batch, as a decode row alone does.
func TestGPUEngineSpeculativeSameTokens(t *testing.T) {
	skipWithoutGPU(t)
	drafter, err := filepath.Abs("../../assets/dspark-tiny")
	if err != nil {
		t.Fatal(err)
	}
	run := defaultModelProse(t, 1)
	want := run("")
	for _, spec := range []string{"{method: mtp, num_speculative_tokens: 1, adaptive: false}",
		"{method: mtp, num_speculative_tokens: 2, adaptive: false}", "{method: mtp, num_speculative_tokens: 4, adaptive: false}",
		"{method: ngram, num_speculative_tokens: 4, adaptive: false}",
		"{method: dspark, num_speculative_tokens: 6, confidence_threshold: 0.3, adaptive: false, draft_model: " + drafter + "}"} {
		got := run("speculative: " + spec)
		compareGreedy(t, spec, "without speculation", got, want)
	}
}

// defaultModelProse returns a function that runs 32 prose prompts, the
// list repeat times over, through a fresh engine on the shipped default
// model (ZOS, graphs and prefix caching on, one sequence at a time, the
// requests in order), greedy, 96 tokens each, with extra YAML added to
// the config.
func defaultModelProse(t *testing.T, repeat int) func(extra string) [][]int {
	dir, err := filepath.Abs("../../assets/deepseek-tiny")
	if err != nil {
		t.Fatal(err)
	}
	passages, err := bench.ProsePrompts(bench.TextWorkloadOptions{NumPrompts: 32, MinLen: 16, MaxLen: 128, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var prompts []llm.Prompt
	for range repeat {
		for _, p := range passages {
			prompts = append(prompts, llm.Prompt{Text: p.Text})
		}
	}
	params := engine.DefaultSamplingParams()
	params.Temperature = 0
	params.MaxTokens = 96
	return func(extra string) [][]int {
		t.Helper()
		l := newLLM(t, fmt.Sprintf(`model: %s
device: cuda
engine: {max_num_seqs: 1}
zos: {enabled: true}
cuda_graph: {enabled: true, batch_sizes: [1, 2, 4, 8, 16]}
%s
`, dir, extra))
		defer l.Close()
		out, _ := generateTimed(t, l, prompts, params)
		return out
	}
}

// compareGreedy reports each request whose tokens in got differ from want.
func compareGreedy(t *testing.T, what, against string, got, want [][]int) {
	t.Helper()
	for j := range want {
		if !slices.Equal(got[j], want[j]) {
			k := 0
			for k < min(len(got[j]), len(want[j])) && got[j][k] == want[j][k] {
				k++
			}
			t.Errorf("%s: request %d differs from %s from output token %d (%d vs %d tokens)", what, j, against, k, len(got[j]), len(want[j]))
		}
	}
}

// The shipped default model with prefix caching (ZOS and graphs on, one
// sequence at a time): each prose prompt twice in one engine, the second
// time served from the prefix cache but for its last partial block, gives
// mostly the same greedy tokens as the first (a miss). Not all: the
// suffix's few rows take the GEMV kernels and the whole prompt's cuBLAS,
// which round differently, so a near tie can flip (the CPU backend's
// kernels are batch-invariant and agree on every request). The figure is
// logged; the bound only catches a hit that reads the wrong blocks.
func TestGPUEnginePrefixHitAgreement(t *testing.T) {
	skipWithoutGPU(t)
	run := defaultModelProse(t, 2)
	twice := run("")
	n := len(twice) / 2
	same := 0
	for i := range n {
		if slices.Equal(twice[i], twice[n+i]) {
			same++
		}
	}
	t.Logf("prefix hit vs miss: %d/%d requests identical", same, n)
	if same < n*3/4 {
		t.Errorf("prefix hit vs miss: %d/%d requests identical, want at least %d", same, n, n*3/4)
	}
}
