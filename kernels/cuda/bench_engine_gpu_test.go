package cuda_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/bench"
	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/cuda"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/stages"
)

// Engine-level benchmarks on the GPU, at published model shapes with random
// BF16 weights built in memory (no files), through the whole step loop
// (llm.LLM on configs/cuda.yaml: CUDA graphs on), cheapest first so that a
// run cut short keeps the most figures:
//
//   - BenchmarkGPUEngineDecodeLlama1B: decode at batch 1 and 32 with 256
//     tokens of context on the Llama-3.2-1B shape, ZOS on and off: the
//     device idle share between consecutive decode steps (goal < 2% with
//     ZOS), and the step against its floor.
//   - BenchmarkGPUEngineDecodeDeepSeekV2Lite: the same at batch 1, 8, 64 and 256 on
//     the DeepSeek-V2-Lite shape (all 27 layers, 15.7B parameters), ZOS on,
//     against the floor of the active weight bytes of a step over 4.2 TB/s
//     (activeWeightBytes).
//   - BenchmarkGPUEngineOfflineQwen3: nano-vllm's offline workload on the
//     Qwen3-0.6B shape (256 requests, prompt and output lengths uniform in
//     100..1024, seeded, ignore_eos, temperature 0.6; all 256 sequences in
//     flight, 16384 batched tokens, as nano-vllm), ZOS off, on, on with an
//     8-bit KV cache (cache.kv_cache_dtype fp8), and that with decode
//     attention chunks of 512 keys (cuda.decode_attention_chunk, the
//     throughput setting): output and total tokens/s (goal > 30k output
//     tok/s) and the device idle share between consecutive decode steps.
//   - BenchmarkGPUEngineOfflineDeepSeekV2Lite: the same workload on the
//     DeepSeek-V2-Lite shape, ZOS on, 16-bit and 8-bit latent caches.
//   - BenchmarkGPUEngineGptOss20BDecode: decode at batch 1 and 64 on the
//     gpt-oss-20B shape cut to 4 of its 24 layers, experts stored as MXFP4,
//     against the floor of the bytes the step reads as the backend holds the
//     experts (gptOssStepBytes: MXFP4 on backends with MXFP4 kernels, as
//     the CUDA backend now is, BF16 on the others), with the other floor
//     beside it.
//   - BenchmarkGPUEngineGemma3Offline: nano-vllm's offline workload (as
//     Qwen3's) on the Gemma-3-1B shape, its sliding-window layers in rings
//     and, for comparison, in paged blocks.
//
// The device idle share is 1 - busy/span over pairs of consecutive decode
// steps, from markers on the stream (stages.DeviceTimes): busy is a step's
// forward pass (layers and LM head), span the device time from its start to
// the next step's start. Work queued on the device between the two that is
// not the forward pass (sampling on the device, input uploads) counts as
// idle: the figure is an upper bound of the device's idle time.
//
// Each measurement logs one line starting "engine |", collected by
// tools/gpu/check.sh. Run with -test.benchtime 1x: one workload each.
//
// DEEPINFER_ENGINE_BENCH=tiny runs the same code on the CPU backend with the
// tiny fixture configs (tools/configs/*.json) and small workloads, so that
// its logic is exercised on a machine without a GPU:
//
//	DEEPINFER_ENGINE_BENCH=tiny go test -run X -bench GPUEngine -benchtime 1x ./kernels/cuda
//
// DEEPINFER_ENGINE_BENCH_SEQS overrides the number of offline requests.
// DEEPINFER_ENGINE_BENCH_GRAPH_STEP sets the captured decode batch sizes:
// 1, 2, 4, 8 and then multiples of it up to max_num_seqs (default 16, as
// nano-vllm captures), or 0 for powers of two (what rounds 1-11 measured).
// The DEEPINFER_CUDA_* switches of this package's tests (testenv_test.go)
// reach the engine's backend too (cuda.ApplyTestEnv).
const engineBenchEnv = "DEEPINFER_ENGINE_BENCH"

// copyBandwidth is the H200's measured copy bandwidth (bytes/s), the floor
// of a decode step being its weight bytes over it.
const copyBandwidth = 4.2e12

// engineMode reports whether the benchmark runs tiny on the CPU, and skips
// it where no GPU is usable (unless the library path is set: then any
// failure to open the device fails the benchmark).
func engineMode(b *testing.B) (tiny bool) {
	b.Helper()
	switch v := os.Getenv(engineBenchEnv); v {
	case "tiny":
		return true
	case "":
	default:
		b.Fatalf("%s=%q: want tiny or unset", engineBenchEnv, v)
	}
	g, err := cuda.New(cuda.Options{})
	if err != nil {
		if os.Getenv(cuda.LibraryEnv) == "" && (errors.Is(err, cuda.ErrNoLibrary) || errors.Is(err, cuda.ErrNoDevice)) {
			b.Skipf("GPU benchmark skipped: %v (set %s=tiny to run its code path on the CPU)", err, engineBenchEnv)
		}
		b.Fatal(err)
	}
	g.Close()
	return false
}

// shapeConfig returns the config.json of a real shape (tools/configs/real)
// or, tiny, of the fixture config of the same architecture.
func shapeConfig(b testing.TB, real, tiny string, isTiny bool) ([]byte, *weights.Config) {
	b.Helper()
	path := filepath.Join("..", "..", "tools", "configs", "real", real+".json")
	if isTiny {
		path = filepath.Join("..", "..", "tools", "configs", tiny+".json")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := weights.ParseConfig(raw)
	if err != nil {
		b.Fatalf("%s: %v", path, err)
	}
	return raw, cfg
}

// weightSpec is one tensor a model reads: a matrix (random), a norm weight
// (near 1) or a small vector (biases), all BF16; or, U8, the blocks of
// MXFP4 codes (random bytes) or the E8M0 scales (mxfp4Scale) of MXFP4
// experts.
type weightSpec struct {
	name  string
	shape []int
	kind  byte // 'm', 'n', 's'; 'b', 'e' (U8)
}

// mxfp4Scale is the E8M0 exponent of every MXFP4 block fastWeights writes:
// 2^-7, so that the codes (|value| <= 6) give weights within ±0.047, as the
// BF16 matrices' ±0.03.
const mxfp4Scale = 127 - 7

// weightSpecs lists every tensor the architecture of cfg reads, with the
// names and shapes of models.RandomWeights (checked by
// TestEngineBenchWeights).
func weightSpecs(cfg *weights.Config) ([]weightSpec, error) {
	var out []weightSpec
	add := func(kind byte, name string, shape ...int) { out = append(out, weightSpec{name, shape, kind}) }
	mlp := func(p string, h, inter int, bias bool) {
		add('m', p+"gate_proj.weight", inter, h)
		add('m', p+"up_proj.weight", inter, h)
		add('m', p+"down_proj.weight", h, inter)
		if bias {
			add('s', p+"gate_proj.bias", inter)
			add('s', p+"up_proj.bias", inter)
			add('s', p+"down_proj.bias", h)
		}
	}
	h := cfg.HiddenSize
	arch := ""
	if len(cfg.Architectures) > 0 {
		arch = cfg.Architectures[0]
	}
	// Gemma's norms scale by 1 + weight (near 0 here, as models.RandomWeights),
	// and its embeddings are tied unless config.json says otherwise
	// (Gemma3TextConfig's default, which the model applies).
	finalNorm, tied := byte('n'), cfg.TieWordEmbeddings
	if arch == "Gemma3ForCausalLM" {
		finalNorm = 's'
		if _, ok := cfg.Raw["tie_word_embeddings"]; !ok {
			tied = true
		}
	}
	add('m', "model.embed_tokens.weight", cfg.VocabSize, h)
	add(finalNorm, "model.norm.weight", h)
	if !tied {
		add('m', "lm_head.weight", cfg.VocabSize, h)
	}
	switch arch {
	case "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM":
		qd, kvd := cfg.NumAttentionHeads*cfg.HeadDim, cfg.NumKeyValueHeads*cfg.HeadDim
		for i := range cfg.NumHiddenLayers {
			p := fmt.Sprintf("model.layers.%d.", i)
			a := p + "self_attn."
			add('n', p+"input_layernorm.weight", h)
			add('n', p+"post_attention_layernorm.weight", h)
			add('m', a+"q_proj.weight", qd, h)
			add('m', a+"k_proj.weight", kvd, h)
			add('m', a+"v_proj.weight", kvd, h)
			add('m', a+"o_proj.weight", h, qd)
			if cfg.AttentionBias {
				add('s', a+"q_proj.bias", qd)
				add('s', a+"k_proj.bias", kvd)
				add('s', a+"v_proj.bias", kvd)
				if cfg.ModelType != "qwen2" {
					add('s', a+"o_proj.bias", h)
				}
			}
			if cfg.ModelType == "qwen3" {
				add('n', a+"q_norm.weight", cfg.HeadDim)
				add('n', a+"k_norm.weight", cfg.HeadDim)
			}
			mlp(p+"mlp.", h, cfg.IntermediateSize, cfg.MLPBias)
		}
	case "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM":
		nh, nope, rope, kvl, vd := cfg.NumAttentionHeads, cfg.QKNopeHeadDim, cfg.QKRopeHeadDim, cfg.KVLoraRank, cfg.VHeadDim
		n := cfg.NumHiddenLayers
		if arch == "DeepseekV3ForCausalLM" {
			n += cfg.NumNextNPredictLayers
		}
		for i := range n {
			p := fmt.Sprintf("model.layers.%d.", i)
			a := p + "self_attn."
			add('n', p+"input_layernorm.weight", h)
			add('n', p+"post_attention_layernorm.weight", h)
			if cfg.QLoraRank > 0 {
				add('m', a+"q_a_proj.weight", cfg.QLoraRank, h)
				add('n', a+"q_a_layernorm.weight", cfg.QLoraRank)
				add('m', a+"q_b_proj.weight", nh*(nope+rope), cfg.QLoraRank)
				if cfg.AttentionBias {
					add('s', a+"q_a_proj.bias", cfg.QLoraRank)
				}
			} else {
				add('m', a+"q_proj.weight", nh*(nope+rope), h)
			}
			add('m', a+"kv_a_proj_with_mqa.weight", kvl+rope, h)
			add('n', a+"kv_a_layernorm.weight", kvl)
			add('m', a+"kv_b_proj.weight", nh*(nope+vd), kvl)
			add('m', a+"o_proj.weight", h, nh*vd)
			if cfg.AttentionBias {
				add('s', a+"kv_a_proj_with_mqa.bias", kvl+rope)
				add('s', a+"o_proj.bias", h)
			}
			if !cfg.IsMoELayer(i) {
				mlp(p+"mlp.", h, cfg.IntermediateSize, false)
			} else {
				e, inter := cfg.NRoutedExperts, cfg.MoEIntermediateSize
				add('m', p+"mlp.gate.weight", e, h)
				if cfg.TopKMethod == "noaux_tc" {
					add('s', p+"mlp.gate.e_score_correction_bias", e)
				}
				for x := range e {
					mlp(fmt.Sprintf("%smlp.experts.%d.", p, x), h, inter, false)
				}
				if cfg.NSharedExperts > 0 {
					mlp(p+"mlp.shared_experts.", h, inter*cfg.NSharedExperts, false)
				}
			}
			if i >= cfg.NumHiddenLayers {
				add('n', p+"enorm.weight", h)
				add('n', p+"hnorm.weight", h)
				add('m', p+"eh_proj.weight", h, 2*h)
				add('n', p+"shared_head.norm.weight", h)
			}
		}
	case "Gemma3ForCausalLM":
		qd, kvd := cfg.NumAttentionHeads*cfg.HeadDim, cfg.NumKeyValueHeads*cfg.HeadDim
		for i := range cfg.NumHiddenLayers {
			p := fmt.Sprintf("model.layers.%d.", i)
			a := p + "self_attn."
			for _, n := range []string{"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"} {
				add('s', p+n+".weight", h)
			}
			add('m', a+"q_proj.weight", qd, h)
			add('m', a+"k_proj.weight", kvd, h)
			add('m', a+"v_proj.weight", kvd, h)
			add('m', a+"o_proj.weight", h, qd)
			add('s', a+"q_norm.weight", cfg.HeadDim)
			add('s', a+"k_norm.weight", cfg.HeadDim)
			mlp(p+"mlp.", h, cfg.IntermediateSize, false)
		}
	case "GptOssForCausalLM":
		// The official checkpoints' layout: experts as MXFP4 (blocks 'b',
		// E8M0 scales 'e'), everything else as stored.
		nh, qd, kvd := cfg.NumAttentionHeads, cfg.NumAttentionHeads*cfg.HeadDim, cfg.NumKeyValueHeads*cfg.HeadDim
		e, inter := cfg.NRoutedExperts, cfg.IntermediateSize
		if h%32 != 0 || inter%32 != 0 {
			return nil, fmt.Errorf("engine bench weights: %s: hidden %d, intermediate %d: MXFP4 experts need multiples of 32", arch, h, inter)
		}
		for i := range cfg.NumHiddenLayers {
			p := fmt.Sprintf("model.layers.%d.", i)
			a, x := p+"self_attn.", p+"mlp.experts."
			add('n', p+"input_layernorm.weight", h)
			add('n', p+"post_attention_layernorm.weight", h)
			add('m', a+"q_proj.weight", qd, h)
			add('m', a+"k_proj.weight", kvd, h)
			add('m', a+"v_proj.weight", kvd, h)
			add('m', a+"o_proj.weight", h, qd)
			add('s', a+"q_proj.bias", qd)
			add('s', a+"k_proj.bias", kvd)
			add('s', a+"v_proj.bias", kvd)
			add('s', a+"o_proj.bias", h)
			add('s', a+"sinks", nh)
			add('m', p+"mlp.router.weight", e, h)
			add('s', p+"mlp.router.bias", e)
			add('s', x+"gate_up_proj_bias", e, 2*inter)
			add('s', x+"down_proj_bias", e, h)
			add('b', x+"gate_up_proj_blocks", e, 2*inter, h/32, 16)
			add('e', x+"gate_up_proj_scales", e, 2*inter, h/32)
			add('b', x+"down_proj_blocks", e, h, inter/32, 16)
			add('e', x+"down_proj_scales", e, h, inter/32)
		}
	default:
		return nil, fmt.Errorf("engine bench weights: architecture %q: %w", arch, models.ErrUnknownArchitecture)
	}
	return out, nil
}

// fastWeights serves every tensor of cfg's model from three shared buffers
// of random BF16 values (matrices uniform in [-0.03, 0.03], norm weights
// near 1, small vectors in [-0.01, 0.01]), filled once on all cores: a
// 15.7B-parameter model costs one buffer of its largest matrix plus
// matrixSlack (420 + 64 MB for DeepSeek-V2-Lite) and well under a second.
// Each matrix is a window of its buffer starting at an offset of its own,
// so no two matrices hold the same values: with one start for all, every
// layer, expert and router was the same matrix, and MoE routing, which
// follows the values, was far from what a trained model's is. MXFP4
// experts (gpt-oss) share two more U8 buffers: random code bytes and
// scales of mxfp4Scale.
func fastWeights(cfg *weights.Config) (models.MemWeights, error) {
	specs, err := weightSpecs(cfg)
	if err != nil {
		return nil, err
	}
	largest := map[byte]int{}
	for _, s := range specs {
		n := 1
		for _, d := range s.shape {
			n *= d
		}
		largest[s.kind] = max(largest[s.kind], n)
	}
	fill := func(n int, seed uint64, val func(r *rand.Rand) float32) []byte {
		buf := make([]byte, 2*n)
		parts := runtime.NumCPU()
		var wg sync.WaitGroup
		for p := range parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(seed, uint64(p)))
				for i := p * n / parts; i < (p+1)*n/parts; i++ {
					binary.LittleEndian.PutUint16(buf[2*i:], kernels.F32ToBF16(val(r)))
				}
			}()
		}
		wg.Wait()
		return buf
	}
	bufs := map[byte][]byte{
		'm': fill(largest['m']+matrixSlack, 1, func(r *rand.Rand) float32 { return float32(r.Float64()*2-1) * 0.03 }),
		'n': fill(largest['n'], 2, func(r *rand.Rand) float32 { return 1 + float32(r.Float64()*2-1)*0.1 }),
		's': fill(largest['s'], 3, func(r *rand.Rand) float32 { return float32(r.Float64()*2-1) * 0.01 }),
	}
	if n := largest['b']; n > 0 { // MXFP4 codes: random bytes
		buf := make([]byte, n)
		parts := runtime.NumCPU()
		var wg sync.WaitGroup
		for p := range parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(5, uint64(p)))
				for i := p * n / parts; i < (p+1)*n/parts; i++ {
					buf[i] = byte(r.Uint32())
				}
			}()
		}
		wg.Wait()
		bufs['b'] = buf
	}
	if n := largest['e']; n > 0 {
		bufs['e'] = slices.Repeat([]byte{mxfp4Scale}, n)
	}
	w := make(models.MemWeights, len(specs))
	for i, s := range specs {
		n := 1
		for _, d := range s.shape {
			n *= d
		}
		dt, size, off := weights.BF16, 2, 0
		if s.kind == 'b' || s.kind == 'e' {
			dt, size = weights.U8, 1
		}
		if s.kind == 'm' {
			off = matrixOffset(i)
		}
		w[s.name] = weights.Tensor{Name: s.name, DType: dt, Shape: s.shape, Data: bufs[s.kind][size*off : size*(off+n)], File: "random"}
	}
	return w, nil
}

// matrixSlack is the elements of fastWeights' matrix buffer past its
// largest matrix: the room for the matrices' distinct starts.
const matrixSlack = 1 << 25

// matrixOffset is the start, in elements, of fastWeights' i-th tensor in
// the matrix buffer: i*4099 mod matrixSlack, distinct for every i below
// matrixSlack (4099 is odd, so the map is a bijection).
func matrixOffset(i int) int { return i * 4099 % matrixSlack }

// activeWeightBytes is the weight bytes one decode step of batch sequences
// reads (BF16, 2 bytes a parameter), the numerator of its floor:
//
//	attention (every layer) + dense MLPs + routers + shared experts + LM head
//	+ routed experts: per MoE layer, top_k for one token; for batch B the
//	  expected number of distinct experts when each token picks top_k of E
//	  uniformly: U(B) = E * (1 - (1 - top_k/E)^B)
//
// with DeepSeek's attention q_proj (or q_a_proj + q_b_proj),
// kv_a_proj_with_mqa, kv_b_proj and o_proj. Norms and the gathered embedding
// rows are left out (under 0.1%); MTP layers do not run. It returns the
// bytes and U(B).
func activeWeightBytes(c *weights.Config, batch int) (bytes, experts float64) {
	h, params := float64(c.HiddenSize), 0.0
	params += float64(c.VocabSize) * h // LM head (the embedding when tied)
	if len(c.Architectures) > 0 && (c.Architectures[0] == "DeepseekV2ForCausalLM" || c.Architectures[0] == "DeepseekV3ForCausalLM") {
		nh, nope, rope := float64(c.NumAttentionHeads), float64(c.QKNopeHeadDim), float64(c.QKRopeHeadDim)
		kvl, vd := float64(c.KVLoraRank), float64(c.VHeadDim)
		attn := h*(kvl+rope) + kvl*nh*(nope+vd) + nh*vd*h
		if c.QLoraRank > 0 {
			attn += h*float64(c.QLoraRank) + float64(c.QLoraRank)*nh*(nope+rope)
		} else {
			attn += h * nh * (nope + rope)
		}
		e, k := float64(c.NRoutedExperts), float64(c.NumExpertsPerTok)
		if batch == 1 {
			experts = k
		} else {
			experts = e * (1 - math.Pow(1-k/e, float64(batch)))
		}
		expert := 3 * h * float64(c.MoEIntermediateSize)
		for i := range c.NumHiddenLayers {
			params += attn
			if c.IsMoELayer(i) {
				params += e*h + float64(c.NSharedExperts)*expert + experts*expert
			} else {
				params += 3 * h * float64(c.IntermediateSize)
			}
		}
		return 2 * params, experts
	}
	qd, kvd := float64(c.NumAttentionHeads*c.HeadDim), float64(c.NumKeyValueHeads*c.HeadDim)
	params += float64(c.NumHiddenLayers) * (h*(qd+2*kvd) + qd*h + 3*h*float64(c.IntermediateSize))
	return 2 * params, 0
}

// engineOpts are what a benchmark changes in configs/cuda.yaml.
type engineOpts struct {
	zos                 bool
	maxSeqs, maxBatched int
	maxModelLen         int
	tiny                bool // the CPU backend, no graphs
	name                string
	raw                 []byte // config.json
	cfg                 *weights.Config
	w                   models.MemWeights
	graphSizes          []int  // nil: graphBatchSizes(maxSeqs)
	kvCache             string // cache.kv_cache_dtype ("": the config's)
	decodeChunk         int    // cuda.decode_attention_chunk (0: the backend's)
	slidingPaged        bool   // cache.sliding_window_paged
	prefillChunk        int    // engine.prefill_chunk_size (0: the config's)
}

// envPrefillChunk is DEEPINFER_ENGINE_BENCH_PREFILL_CHUNK, the
// engine.prefill_chunk_size every engine benchmark then runs with (0 when
// unset or not a positive count).
func envPrefillChunk() int {
	c, err := strconv.Atoi(os.Getenv(engineBenchEnv + "_PREFILL_CHUNK"))
	if err != nil || c < 1 {
		return 0
	}
	return c
}

// startEngine starts the engine of configs/cuda.yaml on a model folder
// holding only config.json and an empty weights file; the architecture's
// constructor is given o.w instead of the folder's tensors.
func startEngine(b *testing.B, o engineOpts) *llm.LLM {
	b.Helper()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), o.raw, 0o644); err != nil {
		b.Fatal(err)
	}
	// A safetensors file with an empty header: the checkpoint opens, the
	// tensors come from memory.
	empty := append(binary.LittleEndian.AppendUint64(nil, 2), "{}"...)
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), empty, 0o644); err != nil {
		b.Fatal(err)
	}
	reg := models.NewRegistry()
	w := o.w
	if err := reg.Register(o.cfg.Architectures[0], func(_ string, ops kernels.Ops, c *weights.Config, _ models.Weights, mo models.Options) (models.Model, error) {
		if g, ok := ops.(*cuda.Backend); ok {
			// The DEEPINFER_CUDA_* switches of the test environment (tools/gpu/check.sh's
			// profile phase and AB_ENVS), before the engine queues any work.
			if err := cuda.ApplyTestEnv(g); err != nil {
				return nil, err
			}
		}
		return models.Builtin().New(ops, c, w, mo)
	}); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Load(filepath.Join("..", "..", "configs", "cuda.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	cfg.Model = dir
	cfg.ZOS.Enabled = o.zos
	cfg.CUDA.DecodeAttentionChunk = o.decodeChunk
	if o.kvCache != "" {
		cfg.Cache.KVCacheDType = o.kvCache
	}
	cfg.Cache.SlidingWindowPaged = o.slidingPaged
	cfg.Engine.MaxNumSeqs = o.maxSeqs
	cfg.Engine.MaxNumBatchedTokens = max(o.maxBatched, o.maxSeqs)
	if c := envPrefillChunk(); c > 0 {
		cfg.Engine.PrefillChunkSize = c // any benchmark's, for comparisons in one call
	} else if o.prefillChunk > 0 {
		cfg.Engine.PrefillChunkSize = o.prefillChunk
	}
	cfg.Engine.MaxModelLen = o.maxModelLen
	cfg.CUDAGraph.BatchSizes = o.graphSizes
	if cfg.CUDAGraph.BatchSizes == nil {
		if cfg.CUDAGraph.BatchSizes, err = graphBatchSizes(o.maxSeqs); err != nil {
			b.Fatal(err)
		}
	}
	if o.tiny {
		cfg.Device = "cpu"
		cfg.CUDAGraph.Enabled = false
	}
	if os.Getenv(engineBenchEnv+"_GRAPHS") == "0" { // for the profile (DEEPINFER_CUDA_PROFILE), which sees eager work only
		cfg.CUDAGraph.Enabled = false
	}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	l, err := llm.NewLLM(cfg, llm.Options{Models: reg})
	if err != nil {
		b.Fatalf("%s: %v", o.name, err)
	}
	b.Logf("%s: engine up on %s in %v (ZOS %v, graphs %v %v, max_num_seqs %d, max_num_batched_tokens %d, max_model_len %d)",
		o.name, l.Backend().Name(), time.Since(start).Round(time.Millisecond), onOff(cfg.ZOS.Enabled), onOff(cfg.CUDAGraph.Enabled),
		cfg.CUDAGraph.BatchSizes, cfg.Engine.MaxNumSeqs, cfg.Engine.MaxNumBatchedTokens, cfg.Engine.MaxModelLen)
	return l
}

// graphBatchSizes is the captured decode batch sizes for up to maxSeqs
// sequences: 1, 2, 4, 8, then multiples of DEEPINFER_ENGINE_BENCH_GRAPH_STEP
// (16 unless set; 0: powers of two), and maxSeqs. A decode step pads up to
// the next size, so the step bounds the padded rows every kernel of the
// step runs over.
func graphBatchSizes(maxSeqs int) ([]int, error) {
	step := 16
	if v := os.Getenv(engineBenchEnv + "_GRAPH_STEP"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s_GRAPH_STEP=%q: want 0 (powers of two) or a positive step", engineBenchEnv, v)
		}
		step = n
	}
	var sizes []int
	for n := 1; n < maxSeqs && (n <= 8 || step == 0); n *= 2 {
		sizes = append(sizes, n)
	}
	if step > 0 {
		for n := (8/step + 1) * step; n < maxSeqs; n += step {
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 || sizes[len(sizes)-1] < maxSeqs {
		sizes = append(sizes, maxSeqs)
	}
	return sizes, nil
}

// kvName names a cache.kv_cache_dtype override for the figures' lines.
func kvName(kv string) string {
	if kv == "" {
		return "auto"
	}
	return kv
}

func onOff(v bool) string {
	if v {
		return "on"
	}
	return "off"
}

// flushTimeline runs two more steps (a one-token prompt, two tokens) so
// that the device pairs of the steps before, read a step late, are counted
// before the caller's snapshot. Its own pairs start with a prefill step,
// so they never count as decode pairs.
func flushTimeline(b *testing.B, l *llm.LLM) {
	b.Helper()
	p := engine.DefaultSamplingParams()
	p.Temperature, p.MaxTokens, p.IgnoreEOS = 0, 2, true
	if _, err := l.Generate(context.Background(), []llm.Prompt{{IDs: []int{1}}}, p, nil); err != nil {
		b.Fatal(err)
	}
}

// prefillProfile, when the backend profiles (DEEPINFER_CUDA_PROFILE=1),
// runs batch prompts of promptLen tokens to their second token (the
// prefill, one decode step and the timeline flush of decodeRun) and
// returns that run's profile, resetting it, for the decode run's profile
// to subtract; nil otherwise. The prompts differ from decodeRun's (another
// seed) so that no prefix cache makes the two prefills differ.
func prefillProfile(b *testing.B, l *llm.LLM, batch, promptLen int, seed uint64) []cuda.OpTime {
	b.Helper()
	g, ok := l.Backend().(*cuda.Backend)
	if !ok {
		return nil
	}
	if prof, err := g.OpProfile(false); err != nil || prof == nil {
		return nil
	}
	if _, err := g.OpProfile(true); err != nil {
		b.Fatal(err)
	}
	decodeRun(b, l, batch, promptLen, 2, seed+1<<20)
	prof, err := g.OpProfile(true)
	if err != nil {
		b.Fatal(err)
	}
	return prof
}

// logOpProfile logs the per-operation device times of a CUDA backend opened
// with the profile on (DEEPINFER_CUDA_PROFILE=1; nothing otherwise), largest
// first, and resets them.
func logOpProfile(b *testing.B, ops kernels.Ops) {
	b.Helper()
	if g, ok := ops.(*cuda.Backend); ok {
		cuda.LogProfile(b, g)
	}
}

// pct formats an idle share, or n/a.
func pct(p stages.StepPairs) string {
	f, ok := p.IdleFraction()
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.2f%%", 100*f)
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// timelineNote says why there is no device timeline, if there is none.
func timelineNote(d stages.DeviceTimes) string {
	switch {
	case d.Err != "":
		return " (timeline off: " + d.Err + ")"
	case !d.Timed:
		return " (no device markers on this backend)"
	}
	return ""
}

// decodeRun generates newTokens tokens for each of batch random prompts of
// promptLen tokens, all submitted at once, and returns the measurement
// line's figures.
type decodeFigures struct {
	tpot time.Duration // mean time per output token after the first
	dev  stages.DeviceTimes
	// steps and graphSteps count the run's steps and those served by a
	// captured graph (Stats.GraphSteps).
	steps, graphSteps int64
}

func decodeRun(b *testing.B, l *llm.LLM, batch, promptLen, newTokens int, seed uint64) decodeFigures {
	b.Helper()
	r := rand.New(rand.NewPCG(seed, 11))
	vocab := min(l.Model().Config().VocabSize, 10000)
	prompts := make([]llm.Prompt, batch)
	for i := range prompts {
		ids := make([]int, promptLen)
		for j := range ids {
			ids[j] = r.IntN(vocab)
		}
		prompts[i] = llm.Prompt{IDs: ids}
	}
	p := engine.DefaultSamplingParams()
	s := int64(seed)
	p.Temperature, p.MaxTokens, p.IgnoreEOS, p.Seed = 0.6, newTokens, true, &s
	st := l.StepStats()
	before, steps0, graphs0 := st.DeviceTimes(), st.Steps.Load(), st.GraphSteps.Load()
	res, err := l.Generate(context.Background(), prompts, p, nil)
	if err != nil {
		b.Fatal(err)
	}
	flushTimeline(b, l)
	var sum time.Duration
	for _, c := range res {
		o := c.Outputs[0]
		if o.Err != nil {
			b.Fatal(o.Err)
		}
		if n := len(o.TokenIDs); n != newTokens {
			b.Fatalf("%d tokens generated, want %d", n, newTokens)
		}
		sum += (o.Latency - o.TTFT) / time.Duration(newTokens-1)
	}
	return decodeFigures{tpot: sum / time.Duration(batch), dev: st.DeviceTimes().Sub(before),
		steps: st.Steps.Load() - steps0, graphSteps: st.GraphSteps.Load() - graphs0}
}

// decodeBench runs decodeRun at each batch size with ZOS as given and logs
// one line per batch: tokens/s from the time per output token, the device
// step (span) and forward (busy) times of consecutive decode steps, the
// floor of the step's active weight bytes, and the device idle share.
func decodeBench(b *testing.B, tiny bool, name string, raw []byte, mcfg *weights.Config, batches []int, zosModes []bool) {
	w, err := fastWeights(mcfg)
	if err != nil {
		b.Fatal(err)
	}
	promptLen, newTokens := 256, 128
	if tiny {
		promptLen, newTokens = 16, 8
		name += "-tiny(cpu)"
	}
	maxBatch := batches[len(batches)-1]
	for _, zos := range zosModes {
		b.Run("zos="+onOff(zos), func(b *testing.B) {
			l := startEngine(b, engineOpts{zos: zos, maxSeqs: maxBatch, maxBatched: 8192, maxModelLen: promptLen + newTokens + 16,
				tiny: tiny, name: name, raw: raw, cfg: mcfg, w: w})
			defer l.Close()
			for _, batch := range batches {
				b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
					for range b.N {
						base := prefillProfile(b, l, batch, promptLen, uint64(batch))
						f := decodeRun(b, l, batch, promptLen, newTokens, uint64(batch))
						active, experts := activeWeightBytes(mcfg, batch)
						floor := time.Duration(active / copyBandwidth * float64(time.Second))
						ctxMid := promptLen + newTokens/2
						kv := float64(batch*ctxMid) * float64(l.Model().KVCacheSpec().BytesPerBlock(1)) // every layer's cache of a token
						wall := float64(batch) / f.tpot.Seconds()
						d := f.dev.Decode
						b.ReportMetric(wall, "tok/s")
						b.ReportMetric(millis(f.tpot), "tpot-ms")
						if idle, ok := d.IdleFraction(); ok {
							b.ReportMetric(100*idle, "decode-idle-%")
							b.ReportMetric(millis(d.MeanBusy()), "fwd-ms")
						}
						expertNote := ""
						if experts > 0 {
							expertNote = fmt.Sprintf(", %.1f experts a MoE layer", experts)
						}
						ratio := "n/a"
						if d.N > 0 {
							ratio = fmt.Sprintf("%.2fx", float64(d.MeanBusy())/float64(floor))
						}
						b.Logf("engine | %s decode batch %d, context %d+%d, ZOS %s | %.0f tok/s (TPOT %.3f ms) | device step %.3f ms, forward %.3f ms = %s the floor %.3f ms (%.2f GB active weights%s / 4.2 TB/s; KV read %.2f GB more) | device idle between decode steps %s (%d pairs)%s | %d of %d steps on CUDA graphs",
							name, batch, promptLen, newTokens, onOff(zos), wall, millis(f.tpot), millis(d.MeanSpan()), millis(d.MeanBusy()), ratio,
							millis(floor), active/1e9, expertNote, kv/1e9, pct(d), d.N, timelineNote(f.dev), f.graphSteps, f.steps)
						if g, ok := l.Backend().(*cuda.Backend); ok {
							cuda.LogProfileLess(b, g, base) // the decode steps alone
						}
					}
				})
			}
		})
	}
}

// BenchmarkGPUEngineDecodeLlama1B: see the comment at the top of the file.
func BenchmarkGPUEngineDecodeLlama1B(b *testing.B) {
	tiny := engineMode(b)
	raw, mcfg := shapeConfig(b, "llama-3.2-1b", "llama", tiny)
	batches := []int{1, 32}
	if tiny {
		batches = []int{1, 4}
	}
	decodeBench(b, tiny, "llama-3.2-1b", raw, mcfg, batches, []bool{true, false})
}

// BenchmarkGPUEngineDecodeDeepSeekV2Lite: see the comment at the top of the
// file.
func BenchmarkGPUEngineDecodeDeepSeekV2Lite(b *testing.B) {
	tiny := engineMode(b)
	raw, mcfg := shapeConfig(b, "deepseek-v2-lite", "deepseek-v2", tiny)
	batches := []int{1, 8, 64, 256}
	if tiny {
		batches = []int{1, 4}
	}
	decodeBench(b, tiny, "deepseek-v2-lite", raw, mcfg, batches, []bool{true})
}

// BenchmarkGPUEngineOfflineQwen3: see the comment at the top of the file.
func BenchmarkGPUEngineOfflineQwen3(b *testing.B) {
	tiny := engineMode(b)
	raw, mcfg := shapeConfig(b, "qwen3-0.6b", "qwen3", tiny)
	variants := []offlineVariant{{false, "", 0}, {true, "", 0}, {true, "fp8", 0}, {true, "fp8", 512}}
	offlineBench(b, tiny, "qwen3-0.6b", raw, mcfg, variants)
}

// BenchmarkGPUEngineOfflineDeepSeekV2Lite is nano-vllm's offline workload
// (as BenchmarkGPUEngineOfflineQwen3) on the DeepSeek-V2-Lite shape (all
// 27 layers), ZOS on, with 16-bit and 8-bit latent caches.
func BenchmarkGPUEngineOfflineDeepSeekV2Lite(b *testing.B) {
	tiny := engineMode(b)
	raw, mcfg := shapeConfig(b, "deepseek-v2-lite", "deepseek-v2", tiny)
	offlineBench(b, tiny, "deepseek-v2-lite", raw, mcfg, []offlineVariant{{true, "", 0}, {true, "fp8", 0}})
}

// offlineVariant is one engine setting of offlineBench.
type offlineVariant struct {
	zos   bool
	kv    string // cache.kv_cache_dtype; "" the default
	chunk int    // cuda.decode_attention_chunk; 0 the backend's
}

// offlineWorkload is nano-vllm's offline workload (bench.DefaultOffline,
// or a small one in tiny mode; the request count from the environment's
// _SEQS when set) and the engine limits that keep all of it in flight at
// once, as nano-vllm does (512 sequences, 16384 tokens).
func offlineWorkload(b *testing.B, tiny bool) (opts bench.OfflineOptions, maxSeqs, maxBatched int) {
	opts = bench.DefaultOffline()
	maxSeqs, maxBatched = 256, 16384
	if tiny {
		opts.NumSeqs, opts.MinInputLen, opts.MaxInputLen, opts.MinOutputLen, opts.MaxOutputLen = 8, 8, 32, 4, 16
		maxSeqs, maxBatched = 8, 256
	}
	if v := os.Getenv(engineBenchEnv + "_SEQS"); v != "" {
		var err error
		if opts.NumSeqs, err = strconv.Atoi(v); err != nil || opts.NumSeqs < 1 {
			b.Fatalf("%s_SEQS=%q: want a positive count", engineBenchEnv, v)
		}
	}
	return opts, maxSeqs, maxBatched
}

// offlineBench runs nano-vllm's offline workload (bench.DefaultOffline,
// all requests in flight at once) on a fresh engine per variant and run.
// In tiny mode (the CPU backend) only the variants without an 8-bit cache
// run.
func offlineBench(b *testing.B, tiny bool, name string, raw []byte, mcfg *weights.Config, variants []offlineVariant) {
	w, err := fastWeights(mcfg)
	if err != nil {
		b.Fatal(err)
	}
	opts, maxSeqs, maxBatched := offlineWorkload(b, tiny)
	if tiny {
		name += "-tiny(cpu)"
		var cpuVariants []offlineVariant
		for _, v := range variants {
			if v.kv == "" { // the CPU backend keeps float32 caches
				cpuVariants = append(cpuVariants, v)
			}
		}
		variants = cpuVariants
	}
	goals := "idle < 2% with ZOS"
	if strings.HasPrefix(name, "qwen3-0.6b") {
		goals = "output > 30000 tok/s, " + goals
	}
	for _, v := range variants {
		zos, sub := v.zos, "zos="+onOff(v.zos)
		if v.kv != "" {
			sub += ",kv=" + v.kv
		}
		if v.chunk != 0 {
			sub += fmt.Sprintf(",chunk=%d", v.chunk)
		}
		b.Run(sub, func(b *testing.B) {
			// A fresh engine each run: the workload's prompts are the same
			// every run (one seed), and a second run on one engine would
			// find them in the prefix cache (about 10% faster on an H200).
			// The figures time bench.RunOffline alone, not the start-up.
			for range b.N {
				b.StopTimer()
				l := startEngine(b, engineOpts{zos: zos, maxSeqs: maxSeqs, maxBatched: maxBatched, maxModelLen: opts.MaxInputLen + opts.MaxOutputLen,
					tiny: tiny, name: name, raw: raw, cfg: mcfg, w: w, kvCache: v.kv, decodeChunk: v.chunk})
				b.StartTimer()
				st := l.StepStats()
				before, steps0, graphs0 := st.DeviceTimes(), st.Steps.Load(), st.GraphSteps.Load()
				r, err := bench.RunOffline(context.Background(), l, opts)
				if err != nil {
					b.Fatal(err)
				}
				flushTimeline(b, l)
				logOpProfile(b, l.Backend())
				dev := l.StepStats().DeviceTimes().Sub(before)
				if r.Failed > 0 {
					b.Errorf("%d of %d requests failed", r.Failed, r.NumRequests)
				}
				b.ReportMetric(r.OutputThroughput, "out-tok/s")
				b.ReportMetric(r.TotalThroughput, "total-tok/s")
				if f, ok := dev.Decode.IdleFraction(); ok {
					b.ReportMetric(100*f, "decode-idle-%")
				}
				chunk := "the backend's"
				if v.chunk != 0 {
					chunk = strconv.Itoa(v.chunk)
				}
				b.Logf("engine | %s offline %d requests, ZOS %s, KV cache %s, decode chunk %s | output %.0f tok/s, total %.0f tok/s (%d in + %d out tokens in %.2f s) | device idle between decode steps %s of %.3f ms/step (%d pairs), all steps %s%s | %d of %d steps on CUDA graphs | goals: %s",
					name, r.NumRequests, onOff(zos), kvName(v.kv), chunk, r.OutputThroughput, r.TotalThroughput, r.TotalInputTokens, r.TotalOutputTokens, r.DurationSeconds,
					pct(dev.Decode), millis(dev.Decode.MeanSpan()), dev.Decode.N, pct(dev.All), timelineNote(dev),
					st.GraphSteps.Load()-graphs0, st.Steps.Load()-steps0, goals)
				b.StopTimer()
				l.Close()
				b.StartTimer()
			}
		})
	}
}

// The in-memory weights of the engine benchmarks name and shape every
// tensor as models.RandomWeights does, and build each architecture's model
// (checked on the tiny fixture configs, on the CPU backend).
func TestEngineBenchWeights(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 2})
	defer c.Close()
	for _, name := range []string{"llama", "mistral", "qwen3", "deepseek-v2", "deepseek-v3"} {
		t.Run(name, func(t *testing.T) {
			_, cfg := shapeConfig(t, "", name, true)
			want, err := models.RandomWeights(cfg, kernels.BF16, 1)
			if err != nil {
				t.Fatal(err)
			}
			got, err := fastWeights(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Errorf("%d tensors, want %d", len(got), len(want))
			}
			for n, wt := range want {
				gt, ok := got[n]
				if !ok {
					t.Errorf("tensor %s missing", n)
					continue
				}
				if fmt.Sprint(gt.Shape) != fmt.Sprint(wt.Shape) || gt.DType != weights.BF16 || len(gt.Data) != len(wt.Data) {
					t.Errorf("tensor %s: %v %v (%d bytes), want %v %v (%d bytes)", n, gt.DType, gt.Shape, len(gt.Data), weights.BF16, wt.Shape, len(wt.Data))
				}
			}
			// No two matrices of the same size hold the same values.
			seen := map[string]string{}
			for n, gt := range got {
				if strings.HasSuffix(n, "norm.weight") || len(gt.Shape) != 2 {
					continue
				}
				key := fmt.Sprint(gt.Shape, gt.Data[:min(len(gt.Data), 64)])
				if other, dup := seen[key]; dup {
					t.Errorf("matrices %s and %s hold the same values", n, other)
				}
				seen[key] = n
			}
			if _, err := models.Builtin().New(c, cfg, got, models.Options{MaxModelLen: 64}); err != nil {
				t.Fatalf("building the model from the bench weights: %v", err)
			}
		})
	}
}

// The floor's formula on DeepSeek-V2-Lite (15.7B parameters): at batch 1
// the six routed experts a layer, at batch 64 nearly all 64.
func TestActiveWeightBytes(t *testing.T) {
	_, ds := shapeConfig(t, "deepseek-v2-lite", "", false)
	_, ll := shapeConfig(t, "llama-3.2-1b", "", false)
	tests := []struct {
		name        string
		cfg         *weights.Config
		batch       int
		gb, experts float64 // want, to 0.5%
	}{
		// 27 x 13.76M attention + 67.2M dense MLP + 26 x (0.13M router +
		// 17.3M shared + 6 x 8.65M) + 209.7M head = 2.451B parameters.
		{"deepseek batch 1", ds, 1, 4.902, 6},
		// 64 x (1 - (58/64)^64) = 63.88 experts: 15.48B parameters.
		{"deepseek batch 64", ds, 64, 30.96, 63.88},
		// 16 x (2048 x (2048 + 2 x 512) + 2048 x 2048 + 3 x 2048 x 8192) + 128256 x 2048 (tied head) = 1.236B.
		{"llama", ll, 32, 2.471, 0},
	}
	for _, tc := range tests {
		bytes, experts := activeWeightBytes(tc.cfg, tc.batch)
		if math.Abs(bytes/1e9-tc.gb) > 0.005*tc.gb || math.Abs(experts-tc.experts) > 0.005*max(tc.experts, 1) {
			t.Errorf("%s: %.3f GB, %.2f experts; want %.3f GB, %.2f experts", tc.name, bytes/1e9, experts, tc.gb, tc.experts)
		}
	}
}

// The engine benchmarks' captured batch sizes: nano-vllm's by default,
// powers of two with step 0, any step, and a bad setting refused.
func TestGraphBatchSizes(t *testing.T) {
	for _, c := range []struct {
		step    string
		maxSeqs int
		want    []int
	}{
		{"", 256, []int{1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256}},
		{"", 8, []int{1, 2, 4, 8}},
		{"", 64, []int{1, 2, 4, 8, 16, 32, 48, 64}},
		{"0", 256, []int{1, 2, 4, 8, 16, 32, 64, 128, 256}},
		{"0", 100, []int{1, 2, 4, 8, 16, 32, 64, 100}},
		{"5", 24, []int{1, 2, 4, 8, 10, 15, 20, 24}},
		{"", 1, []int{1}},
	} {
		t.Setenv(engineBenchEnv+"_GRAPH_STEP", c.step)
		got, err := graphBatchSizes(c.maxSeqs)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("step %q, %d sequences: %v, %v; want %v", c.step, c.maxSeqs, got, err, c.want)
		}
	}
	t.Setenv(engineBenchEnv+"_GRAPH_STEP", "-3")
	if _, err := graphBatchSizes(16); err == nil {
		t.Error("a negative step was accepted")
	}
}

// fp8Block is the scale block of the FP8 checkpoints the benchmarks write:
// DeepSeek-V3's quantization_config.weight_block_size.
var fp8Block = [2]int{128, 128}

// fp8Checkpoint returns the model of raw and w as DeepSeek ships its FP8
// checkpoints: config.json with quantization_config {quant_method: fp8,
// fmt: e4m3, activation_scheme: dynamic, weight_block_size: [128, 128]},
// every linear layer's matrix (models.IsFP8Linear) stored as F8_E4M3 with
// its "_scale_inv" F32 tensor of one scale per 128 x 128 block; the
// embeddings, norms, routers and LM head as they were. The matrices share
// one buffer of random bytes (uniform values in [-0.03, 0.03], as
// fastWeights' BF16 ones, at the scale 0.03 / 448 every block shares), so
// that a 15.7B-parameter model costs one buffer of its largest matrix.
func fp8Checkpoint(raw []byte, w models.MemWeights) ([]byte, *weights.Config, models.MemWeights, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, nil, nil, fmt.Errorf("fp8 checkpoint: config.json: %w", err)
	}
	q, err := json.Marshal(map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
		"weight_block_size": fp8Block[:]})
	if err != nil {
		return nil, nil, nil, err
	}
	obj["quantization_config"] = q
	rawF, err := json.Marshal(obj)
	if err != nil {
		return nil, nil, nil, err
	}
	cfg, err := weights.ParseConfig(rawF)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("fp8 checkpoint: %w", err)
	}
	largest, scales := 0, 0
	for name, t := range w {
		if models.IsFP8Linear(name) && len(t.Shape) == 2 {
			n, k := t.Shape[0], t.Shape[1]
			largest = max(largest, n*k)
			scales = max(scales, ((n+fp8Block[0]-1)/fp8Block[0])*((k+fp8Block[1]-1)/fp8Block[1]))
		}
	}
	const amax = 0.03
	data := make([]byte, largest)
	parts := runtime.NumCPU()
	var wg sync.WaitGroup
	for p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(4, uint64(p)))
			for i := p * largest / parts; i < (p+1)*largest/parts; i++ {
				data[i] = kernels.F32ToF8E4M3(float32(r.Float64()*2-1) * 448)
			}
		}()
	}
	wg.Wait()
	scaleBytes := make([]byte, 4*scales)
	for i := range scales {
		binary.LittleEndian.PutUint32(scaleBytes[4*i:], math.Float32bits(amax/448))
	}
	out := make(models.MemWeights, len(w))
	for name, t := range w {
		if !models.IsFP8Linear(name) || len(t.Shape) != 2 {
			out[name] = t
			continue
		}
		n, k := t.Shape[0], t.Shape[1]
		out[name] = weights.Tensor{Name: name, DType: weights.F8E4M3, Shape: t.Shape, Data: data[:n*k], File: "random"}
		sn := weights.ScaleInvName(name)
		sr, sc := (n+fp8Block[0]-1)/fp8Block[0], (k+fp8Block[1]-1)/fp8Block[1]
		out[sn] = weights.Tensor{Name: sn, DType: weights.F32, Shape: []int{sr, sc}, Data: scaleBytes[:4*sr*sc], File: "random"}
	}
	return rawF, cfg, out, nil
}

// activeFP8Bytes is activeWeightBytes for an FP8 checkpoint of c: the
// linear layers' weights a byte each plus their float32 scale per 128 x
// 128 block, the LM head and the MoE routers (kept as stored) two bytes
// each. It returns the bytes and the experts a MoE layer (as
// activeWeightBytes).
func activeFP8Bytes(c *weights.Config, batch int) (bytes, experts float64) {
	bf16, experts := activeWeightBytes(c, batch)
	h := float64(c.HiddenSize)
	other := float64(c.VocabSize) * h // the LM head
	for i := range c.NumHiddenLayers {
		if c.IsMoELayer(i) {
			other += float64(c.NRoutedExperts) * h // the router
		}
	}
	linear := bf16/2 - other
	return linear*(1+4.0/float64(fp8Block[0]*fp8Block[1])) + 2*other, experts
}

// prefillFLOPs is the GEMM work of a prefill of tokens tokens on c: two
// FLOPs a token for each parameter of activeWeightBytes at batch 1 (top_k
// experts a token), less the LM head (which runs on the last row only).
// Attention's own products are left out.
func prefillFLOPs(c *weights.Config, tokens int) float64 {
	bytes, _ := activeWeightBytes(c, 1)
	return 2 * float64(tokens) * (bytes/2 - float64(c.VocabSize)*float64(c.HiddenSize))
}

// BenchmarkFP8EngineDeepSeekV2Lite runs the DeepSeek-V2-Lite shape (all 27
// layers, random weights) through the engine of configs/cuda.yaml (ZOS and
// CUDA graphs on) with BF16 weights and then with the same model as an FP8
// checkpoint (fp8Checkpoint: F8_E4M3 linears with 128 x 128 block scales,
// as DeepSeek ships V3), each on a fresh engine, and logs "fp8 | engine"
// lines that tools/gpu/check.sh's fp8 phase tabulates:
//
//   - decode at batch 1 and 64 (256 prompt tokens, 64 generated, temperature
//     0.6, ignore_eos): tokens/s, the device forward pass against the
//     format's own floor (activeWeightBytes for BF16, activeFP8Bytes for FP8,
//     over 4.2 TB/s);
//   - a prefill of 4096 tokens (one prompt, one token generated; the second
//     of two such prompts, so that the first pays the one-time costs): its
//     time to first token and TFLOP/s of the linear layers' work
//     (prefillFLOPs; attention left out, so a lower bound of the rate);
//   - last, FP8 against BF16: tokens/s at each batch (the goal: >=
//     1.6x at batch 1) and the prefill rate.
//
// Its name keeps it out of the engine phase's default pattern (GPUEngine).
// DEEPINFER_ENGINE_BENCH=tiny runs it on the CPU backend with the tiny
// DeepSeek-V2 fixture config (see the top of the file).
func BenchmarkFP8EngineDeepSeekV2Lite(b *testing.B) {
	tiny := engineMode(b)
	raw, mcfg := shapeConfig(b, "deepseek-v2-lite", "deepseek-v2", tiny)
	w, err := fastWeights(mcfg)
	if err != nil {
		b.Fatal(err)
	}
	rawF, cfgF, wF, err := fp8Checkpoint(raw, w)
	if err != nil {
		b.Fatal(err)
	}
	name, batches := "deepseek-v2-lite", []int{1, 64}
	promptLen, newTokens, prefillLen := 256, 64, 4096
	graphs := []int{1, 64}
	if tiny {
		name, batches = "deepseek-v2-tiny(cpu)", []int{1, 4}
		promptLen, newTokens, prefillLen = 16, 8, 64
		graphs = nil
	}
	type figures struct {
		tokS      map[int]float64 // by batch
		prefillMS float64
	}
	got := map[string]*figures{}
	for _, v := range []struct {
		format string
		raw    []byte
		cfg    *weights.Config
		w      models.MemWeights
		bytes  func(*weights.Config, int) (float64, float64)
	}{{"bf16", raw, mcfg, w, activeWeightBytes}, {"fp8", rawF, cfgF, wF, activeFP8Bytes}} {
		b.Run("weights="+v.format, func(b *testing.B) {
			f := &figures{tokS: map[int]float64{}}
			got[v.format] = f
			// The 4096-token prompt is prefilled in one step (one chunk), as
			// a prefill benchmark measures it; DEEPINFER_ENGINE_BENCH_PREFILL_CHUNK
			// sets another chunk (reference.yaml's 512: eight steps).
			chunk := envPrefillChunk()
			if chunk == 0 {
				chunk = prefillLen
			}
			l := startEngine(b, engineOpts{zos: true, maxSeqs: batches[len(batches)-1], maxBatched: max(8192, prefillLen),
				maxModelLen: max(promptLen+newTokens, prefillLen+1) + 16, tiny: tiny, name: name + " " + v.format,
				raw: v.raw, cfg: v.cfg, w: v.w, graphSizes: graphs, prefillChunk: chunk})
			defer l.Close()
			format := "n/a"
			if wf, ok := l.Model().(interface{ WeightFormat() string }); ok {
				format = wf.WeightFormat()
			}
			for _, batch := range batches {
				fig := decodeRun(b, l, batch, promptLen, newTokens, uint64(batch))
				active, experts := v.bytes(v.cfg, batch)
				floor := time.Duration(active / copyBandwidth * float64(time.Second))
				tokS := float64(batch) / fig.tpot.Seconds()
				f.tokS[batch] = tokS
				d := fig.dev.Decode
				ratio := "n/a"
				if d.N > 0 {
					ratio = fmt.Sprintf("%.2fx", float64(d.MeanBusy())/float64(floor))
				}
				b.ReportMetric(tokS, fmt.Sprintf("tok/s/batch=%d", batch))
				b.Logf("fp8 | engine %s %s decode batch %d, context %d+%d | %.0f tok/s (TPOT %.3f ms) | device forward %.3f ms = %s its floor %.3f ms (%.2f GB active weights, %.1f experts a MoE layer, / 4.2 TB/s) | %d of %d steps on CUDA graphs | weights %s%s",
					name, v.format, batch, promptLen, newTokens, tokS, millis(fig.tpot), millis(d.MeanBusy()), ratio, millis(floor),
					active/1e9, experts, fig.graphSteps, fig.steps, format, timelineNote(fig.dev))
				logOpProfile(b, l.Backend()) // with DEEPINFER_CUDA_PROFILE=1: this batch's device time per operation
			}
			// Prefill: the second of two prompts (different tokens, so that
			// the prefix cache serves none of the second).
			vocab := min(l.Model().Config().VocabSize, 10000)
			p := engine.DefaultSamplingParams()
			p.Temperature, p.MaxTokens, p.IgnoreEOS = 0, 1, true
			var ttft time.Duration
			for run := range 2 {
				r := rand.New(rand.NewPCG(uint64(run), 77))
				ids := make([]int, prefillLen)
				for i := range ids {
					ids[i] = r.IntN(vocab)
				}
				res, err := l.Generate(context.Background(), []llm.Prompt{{IDs: ids}}, p, nil)
				if err != nil {
					b.Fatal(err)
				}
				o := res[0].Outputs[0]
				if o.Err != nil {
					b.Fatal(o.Err)
				}
				ttft = o.TTFT
				if g, ok := l.Backend().(*cuda.Backend); ok && run == 0 {
					if _, err := g.OpProfile(true); err != nil { // the second prompt's profile alone
						b.Fatal(err)
					}
				}
			}
			logOpProfile(b, l.Backend()) // with DEEPINFER_CUDA_PROFILE=1: the second prefill's device time per operation
			// The two prefills' device time (the timeline reads a step's
			// markers two steps later: the flush's two steps resolve the
			// pairs that start at the two prefills), so that TTFT less it
			// is the host's share.
			st := l.StepStats()
			before := st.DeviceTimes()
			flushTimeline(b, l)
			dev := st.DeviceTimes().Sub(before)
			devNote := "device time n/a" + timelineNote(dev)
			if dev.All.N == 2 {
				devNote = fmt.Sprintf("device forward %.2f ms a prefill (mean of the two)", millis(dev.All.MeanBusy()))
			}
			flops := prefillFLOPs(v.cfg, prefillLen)
			f.prefillMS = millis(ttft)
			b.ReportMetric(millis(ttft), "prefill-ms")
			b.Logf("fp8 | engine %s %s prefill %d tokens in chunks of %d | TTFT %.2f ms | %.1f TFLOP/s of the linear layers (%.2f TFLOP; attention left out) | %s | weights %s",
				name, v.format, prefillLen, chunk, millis(ttft), flops/ttft.Seconds()/1e12, flops/1e12, devNote, format)
		})
	}
	bf, fp := got["bf16"], got["fp8"]
	if bf == nil || fp == nil || bf.prefillMS == 0 || fp.prefillMS == 0 {
		return // a run failed or was filtered out: nothing to compare
	}
	line := fmt.Sprintf("fp8 | engine %s FP8 vs BF16, same run |", name)
	for _, batch := range batches {
		line += fmt.Sprintf(" batch %d: %.0f vs %.0f tok/s = %.2fx;", batch, fp.tokS[batch], bf.tokS[batch], fp.tokS[batch]/bf.tokS[batch])
	}
	line += fmt.Sprintf(" prefill %d tokens: %.2f vs %.2f ms = %.2fx | goal: batch 1 >= 1.60x", prefillLen, fp.prefillMS, bf.prefillMS, bf.prefillMS/fp.prefillMS)
	b.Log(line)
}

// The FP8 checkpoint of the engine benchmark: config.json declares
// DeepSeek's quantization_config, every linear matrix is F8_E4M3 with a
// scale tensor of its block grid, everything else is as it was, the
// model builds from it on the CPU backend with FP8 linears, and its floor
// counts a byte a linear weight (checked on DeepSeek-V2-Lite's figures).
func TestEngineBenchFP8Checkpoint(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 2})
	defer c.Close()
	for _, name := range []string{"deepseek-v2", "deepseek-v3", "qwen3"} {
		t.Run(name, func(t *testing.T) {
			raw, cfg := shapeConfig(t, "", name, true)
			w, err := fastWeights(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, cfgF, wF, err := fp8Checkpoint(raw, w)
			if err != nil {
				t.Fatal(err)
			}
			if q := cfgF.Quantization; q.Method != "fp8" || q.WeightBlockSize != fp8Block {
				t.Fatalf("quantization_config parsed as %+v", q)
			}
			if cfgF.HiddenSize != cfg.HiddenSize || cfgF.NumHiddenLayers != cfg.NumHiddenLayers || cfgF.VocabSize != cfg.VocabSize {
				t.Fatalf("config changed: %+v", cfgF)
			}
			nf8 := 0
			for n, wt := range w {
				gt := wF[n]
				if !models.IsFP8Linear(n) || len(wt.Shape) != 2 {
					if gt.DType != wt.DType || len(gt.Data) != len(wt.Data) {
						t.Errorf("%s: %v, want it as stored (%v)", n, gt.DType, wt.DType)
					}
					continue
				}
				nf8++
				s, ok := wF[weights.ScaleInvName(n)]
				rows, cols := (wt.Shape[0]+127)/128, (wt.Shape[1]+127)/128
				if gt.DType != weights.F8E4M3 || len(gt.Data) != wt.Shape[0]*wt.Shape[1] || !ok || s.DType != weights.F32 ||
					!slices.Equal(s.Shape, []int{rows, cols}) || len(s.Data) != 4*rows*cols {
					t.Errorf("%s: %v %d bytes, scales %v %v (%d bytes)", n, gt.DType, len(gt.Data), s.DType, s.Shape, len(s.Data))
				}
			}
			if nf8 == 0 || len(wF) != len(w)+nf8 {
				t.Fatalf("%d FP8 matrices, %d tensors for %d", nf8, len(wF), len(w))
			}
			m, err := models.Builtin().New(c, cfgF, wF, models.Options{MaxModelLen: 64})
			if err != nil {
				t.Fatalf("building the model from the FP8 checkpoint: %v", err)
			}
			if f, ok := m.(interface{ WeightFormat() string }); !ok || !strings.HasPrefix(f.WeightFormat(), "F8_E4M3") {
				t.Errorf("weight format of %T: want F8_E4M3 first", m)
			}
		})
	}
	_, ds := shapeConfig(t, "deepseek-v2-lite", "", false)
	for _, tc := range []struct {
		batch int
		gb    float64 // want, to 0.5%
	}{
		// 2.451B active parameters less the 209.7M head and 26 x 131k
		// routers, a byte each and 4 bytes a 128 x 128 block, plus those two
		// in BF16: 2.2384 + 0.4262 GB.
		{1, 2.665},
		// 15.48B active parameters at batch 64: 15.271 + 0.426 GB.
		{64, 15.70},
	} {
		if got, _ := activeFP8Bytes(ds, tc.batch); math.Abs(got/1e9-tc.gb) > 0.005*tc.gb {
			t.Errorf("activeFP8Bytes(deepseek-v2-lite, %d) = %.3f GB, want %.3f", tc.batch, got/1e9, tc.gb)
		}
	}
	// 2 x 4096 x (2.451B - 209.7M head) = 18.36 TFLOP.
	if got := prefillFLOPs(ds, 4096); math.Abs(got/1e12-18.36) > 0.005*18.36 {
		t.Errorf("prefillFLOPs(deepseek-v2-lite, 4096) = %.3f TFLOP, want 18.36", got/1e12)
	}
}

// gptOss20BConfig is openai/gpt-oss-20b's config.json as published (24
// layers alternating 128-token windows and full attention, learned sinks,
// 32 experts top-4 in MXFP4, YaRN).
const gptOss20BConfig = `{
  "architectures": ["GptOssForCausalLM"],
  "attention_bias": true,
  "attention_dropout": 0.0,
  "eos_token_id": 200002,
  "experts_per_token": 4,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2880,
  "initial_context_length": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 2880,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 131072,
  "model_type": "gpt_oss",
  "num_attention_heads": 64,
  "num_experts_per_tok": 4,
  "num_hidden_layers": 24,
  "num_key_value_heads": 8,
  "num_local_experts": 32,
  "output_router_logits": false,
  "pad_token_id": 199999,
  "quantization_config": {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4"
  },
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "rope_type": "yarn",
    "truncate": false
  },
  "rope_theta": 150000,
  "router_aux_loss_coef": 0.9,
  "sliding_window": 128,
  "swiglu_limit": 7.0,
  "tie_word_embeddings": false,
  "transformers_version": "4.55.0.dev0",
  "use_cache": true,
  "vocab_size": 201088
}`

// gemma3_1BConfig is google/gemma-3-1b-it's config.json as published (26
// layers, five of 512-token windows to every global one, tied embeddings
// by Gemma3TextConfig's default).
const gemma3_1BConfig = `{
  "architectures": ["Gemma3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": null,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": [1, 106],
  "final_logit_softcapping": null,
  "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 1152,
  "initializer_range": 0.02,
  "intermediate_size": 6912,
  "max_position_embeddings": 32768,
  "model_type": "gemma3_text",
  "num_attention_heads": 4,
  "num_hidden_layers": 26,
  "num_key_value_heads": 1,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": 512,
  "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0",
  "use_cache": true,
  "vocab_size": 262144
}`

// gptOssBenchLayers is how many of gpt-oss-20B's 24 layers the decode
// benchmark builds (a sliding and a full one twice): the experts are
// widened from MXFP4 at load on backends without MXFP4 kernels, on one
// core, about 0.8G values a layer.
const gptOssBenchLayers = 4

// windowShapeConfig returns the config.json raw (a published config above)
// cut to its first layers (0: all; layer_types cut to match) or, tiny, the
// parity fixture's testdata/models/<fixture>/config.json.
func windowShapeConfig(b testing.TB, raw string, layers int, fixture string, tiny bool) ([]byte, *weights.Config) {
	b.Helper()
	data := []byte(raw)
	if tiny {
		path := filepath.Join("..", "..", "testdata", "models", fixture, "config.json")
		var err error
		if data, err = os.ReadFile(path); err != nil {
			b.Fatal(err)
		}
	} else if layers > 0 {
		var obj map[string]json.RawMessage
		var types []string
		if err := json.Unmarshal(data, &obj); err != nil {
			b.Fatal(err)
		}
		if t, ok := obj["layer_types"]; ok {
			if err := json.Unmarshal(t, &types); err != nil || len(types) < layers {
				b.Fatalf("layer_types %s: want at least %d (%v)", t, layers, err)
			}
			obj["layer_types"], _ = json.Marshal(types[:layers])
		}
		obj["num_hidden_layers"], _ = json.Marshal(layers)
		var err error
		if data, err = json.Marshal(obj); err != nil {
			b.Fatal(err)
		}
	}
	cfg, err := weights.ParseConfig(data)
	if err != nil {
		b.Fatalf("config of %s: %v", fixture, err)
	}
	return data, cfg
}

// mxfp4Bytes is the bytes an MXFP4 weight takes a parameter: half a byte
// of code and its share of the E8M0 scale byte of its 32-value block.
const mxfp4Bytes = 0.5 + 1.0/32

// gptOssStepBytes is the weight bytes one decode step of batch sequences
// reads on gpt-oss c when its experts take expertBytes a parameter (2 as
// BF16, mxfp4Bytes as MXFP4) and the rest is BF16:
//
//	per layer: attention q, k, v, o + router + U(B) experts' gate, up and
//	  down (3 x hidden x intermediate each), U(B) as in activeWeightBytes
//	  (top_k for one token, E (1 - (1 - top_k/E)^B) for B)
//	+ LM head
//
// Biases, sinks, norms and the gathered embedding rows are left out (under
// 0.1%). It returns the bytes and U(B).
func gptOssStepBytes(c *weights.Config, batch int, expertBytes float64) (bytes, experts float64) {
	h := float64(c.HiddenSize)
	qd, kvd := float64(c.NumAttentionHeads*c.HeadDim), float64(c.NumKeyValueHeads*c.HeadDim)
	e, k := float64(c.NRoutedExperts), float64(c.NumExpertsPerTok)
	experts = k
	if batch > 1 {
		experts = e * (1 - math.Pow(1-k/e, float64(batch)))
	}
	dense := float64(c.VocabSize)*h + float64(c.NumHiddenLayers)*(h*(qd+2*kvd)+qd*h+e*h)
	expert := 3 * h * float64(c.IntermediateSize)
	return 2*dense + expertBytes*float64(c.NumHiddenLayers)*experts*expert, experts
}

// weightFormatOf names the dtypes model m keeps its weights in
// (models.WeightFormat), or n/a.
func weightFormatOf(m models.Model) string {
	if f := models.WeightFormat(m); f != "" {
		return f
	}
	return "n/a"
}

// BenchmarkGPUEngineGptOss20BDecode runs the gpt-oss-20B shape cut to its
// first gptOssBenchLayers layers (random weights, experts as MXFP4 as the
// official checkpoints ship them) through the engine of configs/cuda.yaml
// (ZOS and CUDA graphs on): decode at batch 1 and 64 with 256 prompt
// tokens and 128 generated (temperature 0.6, ignore_eos; the context runs
// past the 128-token window, so the rings wrap), on one engine. Each line
// gives tokens/s and the device forward pass against the floor of the
// weight bytes the step reads over 4.2 TB/s (gptOssStepBytes) with the
// experts as this backend holds them (its weight format says which): MXFP4
// where the backend computes with it (kernels.MXFP4Weighter: the CUDA and
// CPU backends keep the blocks and widen them in the expert kernels), 4.25
// bits an expert parameter; BF16, two bytes, where the model widened them
// at load. The line also gives the MXFP4 floor. At 4 layers the LM head (1.16 GB) is
// about half the bytes of a batch-1 step.
func BenchmarkGPUEngineGptOss20BDecode(b *testing.B) {
	tiny := engineMode(b)
	raw, mcfg := windowShapeConfig(b, gptOss20BConfig, gptOssBenchLayers, filepath.Join("gpt-oss", "mxfp4"), tiny)
	w, err := fastWeights(mcfg)
	if err != nil {
		b.Fatal(err)
	}
	name := fmt.Sprintf("gpt-oss-20b (%d of 24 layers)", mcfg.NumHiddenLayers)
	batches, promptLen, newTokens := []int{1, 64}, 256, 128
	if tiny {
		name, batches, promptLen, newTokens = "gpt-oss-tiny(cpu)", []int{1, 4}, 16, 8
	}
	l := startEngine(b, engineOpts{zos: true, maxSeqs: batches[len(batches)-1], maxBatched: 8192, maxModelLen: promptLen + newTokens + 16,
		tiny: tiny, name: name, raw: raw, cfg: mcfg, w: w})
	defer l.Close()
	format := weightFormatOf(l.Model())
	for _, batch := range batches {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			for range b.N {
				f := decodeRun(b, l, batch, promptLen, newTokens, uint64(batch))
				bf16, experts := gptOssStepBytes(mcfg, batch, 2)
				mx, _ := gptOssStepBytes(mcfg, batch, mxfp4Bytes)
				read, readAs := bf16, "experts BF16, widened from MXFP4 at load"
				if strings.Contains(format, "MXFP4") {
					read, readAs = mx, "experts MXFP4"
				}
				floor := time.Duration(read / copyBandwidth * float64(time.Second))
				mxFloor := time.Duration(mx / copyBandwidth * float64(time.Second))
				tokS := float64(batch) / f.tpot.Seconds()
				d := f.dev.Decode
				b.ReportMetric(tokS, "tok/s")
				b.ReportMetric(millis(f.tpot), "tpot-ms")
				ratio := "n/a"
				if d.N > 0 {
					ratio = fmt.Sprintf("%.2fx", float64(d.MeanBusy())/float64(floor))
					b.ReportMetric(millis(d.MeanBusy()), "fwd-ms")
				}
				b.Logf("engine | %s decode batch %d, context %d+%d, ZOS on | %.0f tok/s (TPOT %.3f ms) | device step %.3f ms, forward %.3f ms = %s the floor %.3f ms (%.2f GB read a step, %s, %.1f experts a layer, / 4.2 TB/s) | with MXFP4 experts the floor would be %.3f ms (%.2f GB) | device idle between decode steps %s (%d pairs)%s | %d of %d steps on CUDA graphs | weights %s",
					name, batch, promptLen, newTokens, tokS, millis(f.tpot), millis(d.MeanSpan()), millis(d.MeanBusy()), ratio,
					millis(floor), read/1e9, readAs, experts, millis(mxFloor), mx/1e9, pct(d), d.N, timelineNote(f.dev),
					f.graphSteps, f.steps, format)
				logOpProfile(b, l.Backend())
			}
		})
	}
}

// BenchmarkGPUEngineGemma3Offline runs nano-vllm's offline workload (as
// BenchmarkGPUEngineOfflineQwen3: 256 requests, prompt and output lengths
// uniform in 100..1024, all in flight, 16384 batched tokens) on the whole
// Gemma-3-1B shape (random weights) through the engine of configs/cuda.yaml
// (ZOS and CUDA graphs on), each variant on a fresh engine: its
// sliding-window layers in per-sequence rings of 512 tokens (the default),
// then in paged blocks of the whole context (cache.sliding_window_paged,
// the debug switch). Each line gives output and total tokens/s, the device
// idle share between decode steps, the steps on graphs and the KV bytes of
// a sequence of the longest length.
func BenchmarkGPUEngineGemma3Offline(b *testing.B) {
	tiny := engineMode(b)
	raw, mcfg := windowShapeConfig(b, gemma3_1BConfig, 0, "gemma3/f32", tiny)
	w, err := fastWeights(mcfg)
	if err != nil {
		b.Fatal(err)
	}
	opts, maxSeqs, maxBatched := offlineWorkload(b, tiny)
	name := "gemma-3-1b"
	if tiny {
		name = "gemma3-tiny(cpu)"
	}
	maxLen := opts.MaxInputLen + opts.MaxOutputLen
	for _, paged := range []bool{false, true} {
		sub, where := "sliding=ring", "rings"
		if paged {
			sub, where = "sliding=paged", "paged blocks (sliding_window_paged)"
		}
		b.Run(sub, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				l := startEngine(b, engineOpts{zos: true, maxSeqs: maxSeqs, maxBatched: maxBatched, maxModelLen: maxLen,
					tiny: tiny, name: name, raw: raw, cfg: mcfg, w: w, slidingPaged: paged})
				b.StartTimer()
				spec := l.Model().KVCacheSpec()
				st := l.StepStats()
				before, steps0, graphs0 := st.DeviceTimes(), st.Steps.Load(), st.GraphSteps.Load()
				r, err := bench.RunOffline(context.Background(), l, opts)
				if err != nil {
					b.Fatal(err)
				}
				flushTimeline(b, l)
				logOpProfile(b, l.Backend())
				dev := l.StepStats().DeviceTimes().Sub(before)
				if r.Failed > 0 {
					b.Errorf("%d of %d requests failed", r.Failed, r.NumRequests)
				}
				if !paged && spec.RingLayers == 0 {
					b.Errorf("no ring layers in the cache of %s (%+v)", name, spec)
				}
				b.ReportMetric(r.OutputThroughput, "out-tok/s")
				b.ReportMetric(r.TotalThroughput, "total-tok/s")
				if f, ok := dev.Decode.IdleFraction(); ok {
					b.ReportMetric(100*f, "decode-idle-%")
				}
				b.Logf("engine | %s offline %d requests, ZOS on, sliding-window layers in %s | output %.0f tok/s, total %.0f tok/s (%d in + %d out tokens in %.2f s) | device idle between decode steps %s of %.3f ms/step (%d pairs), all steps %s%s | %d of %d steps on CUDA graphs | KV of a %d-token sequence %.1f MB (%d paged layers, %d ring layers of %d tokens, %v)",
					name, r.NumRequests, where, r.OutputThroughput, r.TotalThroughput, r.TotalInputTokens, r.TotalOutputTokens, r.DurationSeconds,
					pct(dev.Decode), millis(dev.Decode.MeanSpan()), dev.Decode.N, pct(dev.All), timelineNote(dev),
					st.GraphSteps.Load()-graphs0, st.Steps.Load()-steps0,
					maxLen, float64(spec.BytesPerSequence(maxLen, l.Config().Cache.BlockSize))/1e6, spec.NumLayers, spec.RingLayers, spec.RingWindow, spec.DType)
				b.StopTimer()
				l.Close()
				b.StartTimer()
			}
		})
	}
}

// The in-memory weights of the Gemma 3 and gpt-oss benchmarks name, shape
// and type every tensor as the parity fixtures' checkpoints do (the MXFP4
// experts U8, the rest BF16 where the fixtures store F32), and build each
// model on the CPU backend.
func TestEngineBenchWindowWeights(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 2})
	defer c.Close()
	for _, fixture := range []string{"gemma3/f32", "gpt-oss/mxfp4"} {
		t.Run(fixture, func(t *testing.T) {
			dir := filepath.Join("..", "..", "testdata", "models", fixture)
			_, cfg := windowShapeConfig(t, "", 0, fixture, true)
			ck, err := weights.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			got, err := fastWeights(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(ck.Names()) {
				t.Errorf("%d tensors, the fixture has %d", len(got), len(ck.Names()))
			}
			for _, n := range ck.Names() {
				wt, err := ck.Tensor(n)
				if err != nil {
					t.Fatal(err)
				}
				gt, ok := got[n]
				want := weights.BF16
				if wt.DType == weights.U8 {
					want = weights.U8
				}
				switch {
				case !ok:
					t.Errorf("tensor %s missing", n)
				case !slices.Equal(gt.Shape, wt.Shape) || gt.DType != want || len(gt.Data) != len(wt.Data)/wt.DType.Size()*want.Size():
					t.Errorf("tensor %s: %v %v (%d bytes), want %v %v", n, gt.DType, gt.Shape, len(gt.Data), want, wt.Shape)
				}
			}
			m, err := models.Builtin().New(c, cfg, got, models.Options{MaxModelLen: 64})
			if err != nil {
				t.Fatalf("building the model from the bench weights: %v", err)
			}
			if spec := m.KVCacheSpec(); spec.RingLayers == 0 || spec.RingWindow != cfg.SlidingWindow {
				t.Errorf("KV cache %+v: want ring layers of window %d", spec, cfg.SlidingWindow)
			}
		})
	}
	// The real shapes parse as published, cut as asked.
	_, g := windowShapeConfig(t, gemma3_1BConfig, 0, "gemma3", false)
	_, o := windowShapeConfig(t, gptOss20BConfig, 4, "gpt-oss", false)
	if g.HiddenSize != 1152 || g.NumHiddenLayers != 26 || g.HeadDim != 256 || g.SlidingWindow != 512 || g.VocabSize != 262144 {
		t.Errorf("gemma-3-1b config parsed as %+v", g)
	}
	if o.NumHiddenLayers != 4 || len(o.LayerTypes) != 4 || o.NRoutedExperts != 32 || o.NumExpertsPerTok != 4 ||
		o.SlidingWindow != 128 || o.Quantization.Method != "mxfp4" {
		t.Errorf("gpt-oss-20b config cut to 4 layers parsed as %+v", o)
	}
	// Their tensors hold the published models' parameter counts (MXFP4
	// blocks two values a byte, scales not counted).
	_, o24 := windowShapeConfig(t, gptOss20BConfig, 0, "gpt-oss", false)
	for _, tc := range []struct {
		name string
		cfg  *weights.Config
		want int
	}{{"gemma-3-1b", g, 999_885_952}, {"gpt-oss-20b", o24, 20_914_757_184}} {
		specs, err := weightSpecs(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, s := range specs {
			n := 1
			for _, d := range s.shape {
				n *= d
			}
			switch s.kind {
			case 'b':
				n *= 2
			case 'e':
				n = 0
			}
			total += n
		}
		if total != tc.want {
			t.Errorf("%s: %d parameters, want %d", tc.name, total, tc.want)
		}
	}
}

// The gpt-oss floor's formula on gpt-oss-20B: 1.218B dense parameters at 24
// layers (LM head 579.1M + 24 x (26.54M attention + 92k router)), 24.88M an
// expert; at batch 1 with all 24 layers, 3.6B active parameters (the
// published figure).
func TestGptOssStepBytes(t *testing.T) {
	_, full := windowShapeConfig(t, gptOss20BConfig, 0, "gpt-oss", false)
	_, cut := windowShapeConfig(t, gptOss20BConfig, gptOssBenchLayers, "gpt-oss", false)
	for _, tc := range []struct {
		name               string
		cfg                *weights.Config
		batch              int
		bf16, mxfp4, nexps float64 // GB, GB, experts; want, to 0.5%
	}{
		// 4 layers: 685.7M dense + 4 x 4 x 24.88M experts.
		{"4 layers batch 1", cut, 1, 2.168, 1.583, 4},
		// 32 x (1 - (28/32)^64) = 31.99 experts a layer.
		{"4 layers batch 64", cut, 64, 7.740, 3.063, 31.99},
		{"24 layers batch 1", full, 1, 7.214, 3.706, 4},
		{"24 layers batch 64", full, 64, 40.65, 12.59, 31.99},
	} {
		bf16, n := gptOssStepBytes(tc.cfg, tc.batch, 2)
		mx, _ := gptOssStepBytes(tc.cfg, tc.batch, mxfp4Bytes)
		if math.Abs(bf16/1e9-tc.bf16) > 0.005*tc.bf16 || math.Abs(mx/1e9-tc.mxfp4) > 0.005*tc.mxfp4 || math.Abs(n-tc.nexps) > 0.005*tc.nexps {
			t.Errorf("%s: BF16 %.3f GB, MXFP4 %.3f GB, %.2f experts; want %.3f, %.3f, %.2f", tc.name, bf16/1e9, mx/1e9, n, tc.bf16, tc.mxfp4, tc.nexps)
		}
	}
}
