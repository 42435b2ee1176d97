// Package config is the engine's YAML schema: one file declares the whole
// run (model, device, engine limits, cache, ZOS, CUDA graphs, speculative
// decoding, structured output and the pipeline's stage choices).
//
// Decoding is strict: an unknown key fails with its line number and the
// nearest valid key, a value of the wrong type fails with its line, and
// Validate checks ranges. Every default lives in Default, and
// configs/reference.yaml spells all of them out with comments (a test keeps
// the two equal).
package config

import (
	"fmt"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// Config is one engine run.
type Config struct {
	// Model is a Hugging Face model directory (config.json, *.safetensors,
	// tokenizer.json). A relative path is relative to the config file.
	Model string `yaml:"model"`
	// Tokenizer is a directory with tokenizer.json; empty means Model.
	Tokenizer string `yaml:"tokenizer"`
	// Device is "cpu" or "cuda".
	Device string `yaml:"device"`
	// Quantization "fp8" quantizes a float checkpoint's linear layers at
	// load to FP8 E4M3 in 128x128 blocks (scale = amax/448, DeepSeek-V3's
	// recipe; embeddings, LM head and routers stay as stored), so that
	// decode reads one byte a weight (both backends: kernels.FP8Weighter;
	// a backend without it fails the load, naming it). "" keeps the
	// checkpoint's dtypes (an FP8 checkpoint runs as FP8 either way).
	Quantization string `yaml:"quantization"`
	// Seed seeds requests that set no seed of their own.
	Seed int64 `yaml:"seed"`

	Engine           Engine           `yaml:"engine"`
	Cache            Cache            `yaml:"cache"`
	CPU              CPU              `yaml:"cpu"`
	CUDA             CUDA             `yaml:"cuda"`
	ZOS              ZOS              `yaml:"zos"`
	CUDAGraph        CUDAGraph        `yaml:"cuda_graph"`
	Speculative      Speculative      `yaml:"speculative"`
	StructuredOutput StructuredOutput `yaml:"structured_output"`
	Chat             Chat             `yaml:"chat"`
	Pipeline         Pipeline         `yaml:"pipeline"`
}

// Chat configures how chat requests become prompts.
type Chat struct {
	// ParseSpecialTokensInContent tokenizes message contents with special
	// tokens recognized, as the rendered template's own control tokens
	// are: a user who types the end-of-turn token's text then ends the
	// turn. Off (the default), contents are tokenized as plain text and
	// only the template's control tokens are special.
	ParseSpecialTokensInContent bool `yaml:"parse_special_tokens_in_content"`
}

// Engine holds the scheduler's limits.
type Engine struct {
	MaxNumSeqs          int  `yaml:"max_num_seqs"`           // sequences in one step
	MaxNumBatchedTokens int  `yaml:"max_num_batched_tokens"` // tokens in one step; 0 = the device's (StepTokens)
	MaxModelLen         int  `yaml:"max_model_len"`          // prompt + output; 0 = the model's max_position_embeddings
	ChunkedPrefill      bool `yaml:"chunked_prefill"`        // split long prompts over steps
	PrefillChunkSize    int  `yaml:"prefill_chunk_size"`     // tokens per prefill chunk when chunked
	MaxWaiting          int  `yaml:"max_waiting"`            // requests queued before admission fails; 0 = unbounded
	// AdmissionFraction > 0: while sequences decode, waiting prompts join
	// a step only when this share of max_num_seqs (rounded up) fits at
	// once, or all that wait do, so that fewer steps carry prompt chunks
	// (engine.SchedulerConfig.AdmissionBatch). 0: each as soon as it fits.
	AdmissionFraction float64 `yaml:"admission_fraction"`
	// AllowLongMaxModelLen lets max_model_len exceed the model's
	// max_position_embeddings (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN): the
	// engine then serves positions the model was never trained on, whose
	// outputs may be garbage. Off, such a config is refused at load.
	AllowLongMaxModelLen bool `yaml:"allow_long_max_model_len"`
}

// StepTokens is MaxNumBatchedTokens, or where it is 0 the device's
// default: 512 tokens a step on the CPU (llama.cpp's micro-batch; a step's
// activations stay in the caches, and the default model's 64-prompt run is
// about 1.2x faster than with 2048) and 2048 on CUDA.
func (e Engine) StepTokens(device string) int {
	switch {
	case e.MaxNumBatchedTokens > 0:
		return e.MaxNumBatchedTokens
	case device == "cuda":
		return 2048
	}
	return 512
}

// Cache sizes the paged KV cache and the per-sequence state slots.
type Cache struct {
	BlockSize      int     `yaml:"block_size"`      // tokens per KV block
	NumBlocks      int     `yaml:"num_blocks"`      // 0 = derive from memory
	MemoryFraction float64 `yaml:"memory_fraction"` // cuda: share of the device memory free after the weights for activations (a profiling pass) and KV
	CPUMemoryGiB   float64 `yaml:"cpu_memory_gib"`  // cpu: KV cache budget when num_blocks is 0
	PrefixCaching  bool    `yaml:"prefix_caching"`  // reuse full blocks with the same prefix
	NumStateSlots  int     `yaml:"num_state_slots"` // 0 = max_num_seqs
	// StateCheckpoints is, for models whose sliding-window layers keep
	// ring buffers in state slots, how many more state slots prefix
	// caching keeps as checkpoints of a sequence's rings at block
	// boundaries (a hit reaches the deepest checkpoint its cached blocks
	// cover; each costs a state slot of memory). 0 = auto (a quarter of
	// max_num_seqs, at least one, within the memory budget); -1 = none,
	// which turns prefix caching off for such models.
	StateCheckpoints int `yaml:"state_checkpoints"`
	// KVCacheDType is the element type of the K and V caches: "auto" (or
	// empty) keeps the backend's choice (the CPU backend's: float32 for a
	// model directory, f16 for a GGUF file, as llama.cpp); "f32" (or
	// "fp32", "float32") asks for float32 (the CPU backend, or where the
	// CUDA backend picks it itself); "f16" (or "fp16", "float16")
	// stores them in IEEE half (lossy, half of float32's bytes, llama.cpp's
	// default; GQA models' K and V and MLA models' latent rows on the CPU
	// backend, and on the CUDA backend where it picks half itself: 16-bit
	// weights in GEMM mode round);
	// "fp8" or "fp8_e4m3" in OCP FP8 E4M3 (lossy, a quarter of float32's
	// bytes; either backend for GQA models; MLA models of kv_lora_rank 128
	// or 512 on the CUDA backend, as packed rows with a scale per 128
	// latent values; other MLA models keep their latent cache).
	KVCacheDType string `yaml:"kv_cache_dtype"`
	// SlidingWindowPaged is a debug switch for models whose sliding-window
	// layers keep their keys and values in per-sequence ring buffers of
	// window tokens (the state slots, e.g. Gemma 3): true keeps those
	// layers in paged blocks of the whole context instead, as the full
	// layers (more memory, fewer sequences; prefix caching then applies).
	SlidingWindowPaged bool `yaml:"sliding_window_paged"`
}

// KVDType maps KVCacheDType to the element type it asks of the backend: 0
// for auto (the backend's choice), kernels.F32 for f32, fp32 or float32,
// kernels.F16 for f16, fp16 or float16,
// and kernels.F8E4M3 for fp8 or fp8_e4m3.
// An unknown value (which Validate rejects) also gives 0.
func (c Cache) KVDType() kernels.DType {
	dt, _ := parseKVCacheDType(c.KVCacheDType)
	return dt
}

// parseKVCacheDType maps a cache.kv_cache_dtype spelling to its element
// type; ok is false for an unknown spelling.
func parseKVCacheDType(s string) (dt kernels.DType, ok bool) {
	switch s {
	case "", "auto":
		return 0, true
	case "f32", "fp32", "float32":
		return kernels.F32, true
	case "f16", "fp16", "float16":
		return kernels.F16, true
	case "fp8", "fp8_e4m3":
		return kernels.F8E4M3, true
	}
	return 0, false
}

// CPU configures the CPU backend.
type CPU struct {
	Threads int  `yaml:"threads"` // worker threads; 0 = all cores
	PureGo  bool `yaml:"pure_go"` // use the plain-Go kernels (reference path, slower)
	// SIMD names the CPU kernels' inner loops: auto (the fastest this CPU
	// runs), go, avx2 or avx512. The engine refuses a path the CPU lacks.
	SIMD string `yaml:"simd"`
	// ActivationRounding is how activations enter products with GGUF
	// block-quantized, BF16 and F16 weights:
	//   - "auto" (or empty; the default): GGUF block-quantized weights (Q8_0,
	//     Q4_0, the K-quants) meet activations rounded as llama.cpp's CPU
	//     backend rounds them, to 8-bit Q8_0/Q8_K blocks multiplied with
	//     integer dot products (the arithmetic of llama.cpp, ollama and
	//     vLLM's GGUF kernels, so a GGUF file gives llama.cpp's tokens),
	//     and a GGUF file's BF16 weights meet bfloat16 activations as
	//     under "bf16" (llama.cpp rounds them so for BF16 weights); every
	//     other weight format, and a model directory's BF16 weights, meet
	//     float32 activations;
	//   - "none": float32 activations everywhere, the exact product with the
	//     stored weights;
	//   - "llama_cpp": llama.cpp's rounding for BF16 and F16 weights too
	//     (activations rounded to the weights' 16-bit type), so that greedy
	//     tokens follow llama.cpp's on 16-bit GGUF files as well;
	//   - "bf16": as auto, and every BF16 weight meets activations rounded
	//     to bfloat16, multiplied in pairs with AVX512_BF16's VDPBF16PS
	//     arithmetic (the rounding llama.cpp, vLLM's CPU backend and
	//     PyTorch give BF16 models): on CPUs with that instruction, products
	//     with BF16 weights run about twice as fast (prefill); the AVX2
	//     kernels give the same bits with float32 FMAs at the float32
	//     kernels' speed, the pure-Go path with a far slower loop.
	// The CUDA backend multiplies GGUF blocks with float32 activations (as
	// "none" does here), so comparing a quantized GGUF file's tokens across
	// the two backends takes "none" on the CPU.
	ActivationRounding string `yaml:"activation_rounding"`
}

// CUDA configures the CUDA backend (device: cuda): the tuning meant for
// production runs. The backend's other switches pick between kernels of
// one contract for measurements and have no key.
type CUDA struct {
	// GEMM is how float32 activations enter GEMMs with BF16 or F16
	// weights: "round" (or empty; the default) rounds them to the weights'
	// type, one tensor-core product; "split" splits them into a high and a
	// low 16-bit part, about float32 accuracy at twice the tensor-core work
	// (the weights still read once), and keeps 16-bit models' KV caches in
	// float32 (unless cache.kv_cache_dtype is fp8).
	GEMM string `yaml:"gemm"`
	// DecodeAttentionChunk is the key count of a split decode row's
	// attention chunk: 0 keeps the backend's (256), else a positive multiple
	// of 128. The trade-off: longer chunks leave fewer partial results to
	// merge (throughput over many rows), shorter ones give a lone long row
	// more blocks (latency at batch 1). A row's bits depend on this and on
	// its own length alone, never on its batch.
	DecodeAttentionChunk int `yaml:"decode_attention_chunk"`
	// SkinnyGEMMRows sends 16-bit linears of up to this many rows (at most
	// 64; 0, the default: off) to the backend's skinny GEMM, whose rows get
	// the same bits alone or in any batch; slower than cuBLAS at the shapes
	// measured.
	SkinnyGEMMRows int `yaml:"skinny_gemm_rows"`
	// FillUninitializedMemory fills every device allocation with NaN
	// bytes (0xFF) before use, so that a kernel reading memory nobody
	// wrote shows (NaN logits, the sampler's check) instead of reading
	// what the memory's last owner left. For debugging: one memset an
	// allocation; tokens change only where such a read exists.
	FillUninitializedMemory bool `yaml:"fill_uninitialized_memory"`
	// GEMMPlans runs linears of more than 16 rows through cuBLASLt with
	// an algorithm chosen once per shape and bucket of row counts, instead
	// of cuBLAS choosing again for every new row count (cuda.Options).
	GEMMPlans bool `yaml:"gemm_plans"`
	// MoEBatchInvariant keeps MoE batches of 2048 (token, expert) pairs
	// and more over 16-bit experts on the mma.sync grouped GEMM, which
	// gives the bits of the smaller batches' kernels, so that a token's
	// MoE output does not depend on how many tokens share its step,
	// instead of the default wgmma GEMM (sm_90a builds; about 1.5x faster
	// at prefill sizes), whose sums differ from them in rounding
	// (cuda.Options.DisableMoEWGMMA).
	MoEBatchInvariant bool `yaml:"moe_batch_invariant"`
}

// ZOS is zero-overhead scheduling: post-processing of step N overlaps the
// forward pass of step N+1.
type ZOS struct {
	Enabled bool `yaml:"enabled"`
}

// CUDAGraph configures CUDA Graph capture of decode steps.
type CUDAGraph struct {
	Enabled    bool  `yaml:"enabled"`
	BatchSizes []int `yaml:"batch_sizes"` // captured decode batch sizes, ascending
}

// Speculative configures speculative decoding; Method "" or "none" turns
// it off.
type Speculative struct {
	// Method picks the drafter: ngram (prompt lookup), mtp (the target's
	// multi-token-prediction layers), draft_model (a smaller model of the
	// same vocabulary, DraftModel) or dspark.
	Method               string  `yaml:"method"`
	NumSpeculativeTokens int     `yaml:"num_speculative_tokens"` // draft length k
	ConfidenceThreshold  float64 `yaml:"confidence_threshold"`   // dspark: verify the draft prefix above this confidence
	DraftModel           string  `yaml:"draft_model"`            // draft_model, dspark: the drafter's directory
	PromptLookupMin      int     `yaml:"prompt_lookup_min"`      // ngram: shortest suffix looked up
	PromptLookupMax      int     `yaml:"prompt_lookup_max"`      // ngram: longest suffix looked up
	// DisableByBatchSize > 0 verifies no drafts in a step planned while at
	// least this many sequences run (vLLM's
	// speculative_disable_by_batch_size); 0: never.
	DisableByBatchSize int `yaml:"disable_by_batch_size"`
	// Adaptive measures decode throughput with drafts and without for each
	// batch size class and verifies drafts only where they are faster
	// (engine/spec.Controller). Outputs are the same either way.
	Adaptive bool `yaml:"adaptive"`
	// MaxVerifyTokensPerStep (dspark) is the budget of draft tokens one
	// step verifies across the batch: a number > 0 caps them, and they go
	// to the drafts with the highest predicted acceptance
	// (engine/spec.GateBudget); 0: no cap beyond k and the confidence
	// threshold per sequence; "auto": as many as maximize the step's
	// expected tokens per second on the measured cost of a verified row at
	// the running batch (engine/spec.GateCost, spec.RowCost), and where
	// gating is measured slower than verifying every draft (its read of
	// the confidences costs a device that verifies rows nearly free more
	// than the rows it saves), every draft unread, the threshold included.
	MaxVerifyTokensPerStep VerifyBudget `yaml:"max_verify_tokens_per_step"`
}

// VerifyBudget is speculative.max_verify_tokens_per_step: Tokens draft
// tokens a step (0: no cap), or, written "auto" in YAML, a budget derived
// each step from the measured cost of a row (Auto; Tokens is then 0).
type VerifyBudget struct {
	Tokens int
	Auto   bool
}

// UnmarshalYAML reads an integer or "auto".
func (b *VerifyBudget) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == "auto" {
		*b = VerifyBudget{Auto: true}
		return nil
	}
	var tokens int
	if n.Kind != yaml.ScalarNode || n.Decode(&tokens) != nil {
		return fmt.Errorf("expected an integer or \"auto\", got %q", n.Value)
	}
	*b = VerifyBudget{Tokens: tokens}
	return nil
}

// MarshalYAML writes what UnmarshalYAML reads.
func (b VerifyBudget) MarshalYAML() (any, error) {
	if b.Auto {
		return "auto", nil
	}
	return b.Tokens, nil
}

// String is the YAML value.
func (b VerifyBudget) String() string {
	if b.Auto {
		return "auto"
	}
	return strconv.Itoa(b.Tokens)
}

// Enabled reports whether speculative decoding is on.
func (s Speculative) Enabled() bool { return s.Method != "" && s.Method != "none" }

// StructuredOutput configures grammar compilation for JSON schema, regex and
// EBNF constraints.
type StructuredOutput struct {
	Workers   int `yaml:"workers"`    // compile goroutines
	CacheSize int `yaml:"cache_size"` // compiled grammars kept
	// CompileTimeoutS bounds one grammar compile, in seconds (0: none); a
	// constraint that takes longer fails its request.
	CompileTimeoutS float64 `yaml:"compile_timeout_s"`
}

// Pipeline picks the implementation of each stage slot (any key that is
// not one of the others names a slot), inserts extra stages, passes options
// to implementations, and sizes the edges. Slot names are checked when the
// step loop is built, against its layout.
type Pipeline struct {
	Impl         map[string]string         `yaml:",inline"`
	Insert       []pipeline.Insertion      `yaml:"insert"`
	Options      map[string]map[string]any `yaml:"options"`
	EdgeCapacity int                       `yaml:"edge_capacity"` // items each edge buffers
}

// Choices returns the stage choices for pipeline.Layout.Resolve.
func (p Pipeline) Choices() pipeline.Choices {
	return pipeline.Choices{Impl: p.Impl, Insert: p.Insert, Options: p.Options}
}

// Default returns the configuration every file starts from.
func Default() Config {
	return Config{
		Model:  "../assets/deepseek-tiny",
		Device: "cpu",
		Engine: Engine{
			MaxNumSeqs:       64,
			ChunkedPrefill:   true,
			PrefillChunkSize: 512,
			MaxWaiting:       1024,
		},
		Cache: Cache{
			BlockSize:      16,
			MemoryFraction: 0.9,
			CPUMemoryGiB:   1,
			PrefixCaching:  true,
			KVCacheDType:   "auto",
		},
		CPU:       CPU{SIMD: "auto", ActivationRounding: "auto"},
		CUDA:      CUDA{GEMM: "round"},
		CUDAGraph: CUDAGraph{BatchSizes: []int{1, 2, 4, 8, 16, 32, 64}},
		Speculative: Speculative{
			NumSpeculativeTokens: 4,
			ConfidenceThreshold:  0.5,
			PromptLookupMin:      2,
			PromptLookupMax:      4,
			Adaptive:             true,
		},
		StructuredOutput: StructuredOutput{Workers: 2, CacheSize: 256, CompileTimeoutS: 10},
		Pipeline:         Pipeline{EdgeCapacity: 2},
	}
}
