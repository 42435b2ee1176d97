package config

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// MaxCPUMemoryGiB is the largest cache.cpu_memory_gib a config may name
// (64 TiB, past any machine's memory); the engine also refuses, at load, a
// value above the memory of the machine it runs on.
const MaxCPUMemoryGiB = 1 << 16

// Validate checks ranges and the consistency of the sections; each problem
// names the key and what it allows. All problems are reported together.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalid, key, fmt.Sprintf(format, args...)))
	}
	if c.Model == "" {
		bad("model", "must name a model directory")
	}
	if c.Quantization != "" && c.Quantization != "fp8" {
		bad("quantization", "must be \"\" or fp8, got %q", c.Quantization)
	}
	if c.Device != "cpu" && c.Device != "cuda" {
		bad("device", "must be cpu or cuda, got %q", c.Device)
	}
	e := c.Engine
	if e.MaxNumSeqs < 1 {
		bad("engine.max_num_seqs", "must be at least 1, got %d", e.MaxNumSeqs)
	}
	if e.MaxNumBatchedTokens < 0 {
		bad("engine.max_num_batched_tokens", "must be 0 (the device's) or positive, got %d", e.MaxNumBatchedTokens)
	}
	if e.MaxNumBatchedTokens > 0 && e.MaxNumBatchedTokens < e.MaxNumSeqs {
		bad("engine.max_num_batched_tokens", "must be at least engine.max_num_seqs (%d) so every running sequence can decode, got %d", e.MaxNumSeqs, e.MaxNumBatchedTokens)
	}
	if e.MaxModelLen < 0 {
		bad("engine.max_model_len", "must be 0 (the model's) or positive, got %d", e.MaxModelLen)
	}
	if e.PrefillChunkSize < 1 {
		bad("engine.prefill_chunk_size", "must be at least 1, got %d", e.PrefillChunkSize)
	}
	if !(e.AdmissionFraction >= 0 && e.AdmissionFraction <= 1) {
		bad("engine.admission_fraction", "must be in [0, 1] (0: a prompt joins as soon as it fits), got %g", e.AdmissionFraction)
	}
	if e.MaxWaiting < 0 {
		bad("engine.max_waiting", "must be 0 (unbounded) or positive, got %d", e.MaxWaiting)
	}
	k := c.Cache
	if k.BlockSize < 1 || k.BlockSize > 1024 || k.BlockSize&(k.BlockSize-1) != 0 {
		bad("cache.block_size", "must be a power of two in [1, 1024], got %d", k.BlockSize)
	}
	if k.NumBlocks < 0 {
		bad("cache.num_blocks", "must be 0 (derive from memory) or positive, got %d", k.NumBlocks)
	}
	if k.MemoryFraction <= 0 || k.MemoryFraction > 1 {
		bad("cache.memory_fraction", "must be in (0, 1], got %g", k.MemoryFraction)
	}
	if k.CPUMemoryGiB <= 0 || k.CPUMemoryGiB > MaxCPUMemoryGiB {
		bad("cache.cpu_memory_gib", "must be in (0, %d] GiB (and at most the machine's memory, checked at load), got %g", MaxCPUMemoryGiB, k.CPUMemoryGiB)
	}
	if k.NumStateSlots < 0 {
		bad("cache.num_state_slots", "must be 0 (max_num_seqs) or positive, got %d", k.NumStateSlots)
	}
	if k.StateCheckpoints < -1 {
		bad("cache.state_checkpoints", "must be -1 (none), 0 (auto) or positive, got %d", k.StateCheckpoints)
	}
	if _, ok := parseKVCacheDType(k.KVCacheDType); !ok {
		bad("cache.kv_cache_dtype", "must be auto (or empty), f32 (fp32, float32), f16 (fp16, float16), fp8 or fp8_e4m3, got %q", k.KVCacheDType)
	}
	if c.CPU.Threads < 0 {
		bad("cpu.threads", "must be 0 (all cores) or positive, got %d", c.CPU.Threads)
	}
	switch c.CPU.SIMD {
	case "", "auto", "go", "avx2", "avx512":
	default:
		bad("cpu.simd", "must be auto, go, avx2 or avx512, got %q", c.CPU.SIMD)
	}
	switch c.CPU.ActivationRounding {
	case "", "auto", "none", "llama_cpp", "bf16":
	default:
		bad("cpu.activation_rounding", "must be auto, none, llama_cpp or bf16, got %q", c.CPU.ActivationRounding)
	}
	if m := c.CUDA.GEMM; m != "" && m != "round" && m != "split" {
		bad("cuda.gemm", "must be round or split, got %q", m)
	} else if m == "split" && c.Device != "cuda" {
		bad("cuda.gemm", "split needs device: cuda")
	}
	if ch := c.CUDA.DecodeAttentionChunk; ch < 0 || ch%128 != 0 {
		bad("cuda.decode_attention_chunk", "must be 0 (the backend's) or a positive multiple of 128, got %d", ch)
	} else if ch > 0 && c.Device != "cuda" {
		bad("cuda.decode_attention_chunk", "needs device: cuda")
	}
	if r := c.CUDA.SkinnyGEMMRows; r < 0 || r > 64 {
		bad("cuda.skinny_gemm_rows", "must be in [0, 64] (0: off), got %d", r)
	} else if r > 0 && c.Device != "cuda" {
		bad("cuda.skinny_gemm_rows", "needs device: cuda")
	}
	if c.CUDA.FillUninitializedMemory && c.Device != "cuda" {
		bad("cuda.fill_uninitialized_memory", "needs device: cuda")
	}
	if c.CUDA.GEMMPlans && c.Device != "cuda" {
		bad("cuda.gemm_plans", "needs device: cuda")
	}
	if c.CUDA.MoEBatchInvariant && c.Device != "cuda" {
		bad("cuda.moe_batch_invariant", "needs device: cuda")
	}
	g := c.CUDAGraph
	if g.Enabled && len(g.BatchSizes) == 0 {
		bad("cuda_graph.batch_sizes", "must list at least one size when cuda_graph.enabled is true")
	}
	for i, s := range g.BatchSizes {
		if s < 1 {
			bad("cuda_graph.batch_sizes", "sizes must be positive, got %d", s)
		}
		if i > 0 && s <= g.BatchSizes[i-1] {
			bad("cuda_graph.batch_sizes", "sizes must be strictly ascending, got %v", g.BatchSizes)
			break
		}
	}
	if g.Enabled && c.Device != "cuda" {
		bad("cuda_graph.enabled", "needs device: cuda")
	}
	s := c.Speculative
	methods := []string{"", "none", "ngram", "mtp", "draft_model", "dspark"}
	if !slices.Contains(methods, s.Method) {
		bad("speculative.method", "must be none (or empty), ngram, mtp, draft_model or dspark, got %q", s.Method)
	}
	if s.NumSpeculativeTokens < 1 || s.NumSpeculativeTokens > 16 {
		bad("speculative.num_speculative_tokens", "must be in [1, 16], got %d", s.NumSpeculativeTokens)
	}
	if s.ConfidenceThreshold < 0 || s.ConfidenceThreshold > 1 {
		bad("speculative.confidence_threshold", "must be in [0, 1], got %g", s.ConfidenceThreshold)
	}
	if (s.Method == "dspark" || s.Method == "draft_model") && s.DraftModel == "" {
		bad("speculative.draft_model", "must name the drafter's directory when speculative.method is %s", s.Method)
	}
	if s.MaxVerifyTokensPerStep.Tokens < 0 {
		bad("speculative.max_verify_tokens_per_step", "must be >= 0 (0: no cap) or auto, got %d", s.MaxVerifyTokensPerStep.Tokens)
	}
	if s.DisableByBatchSize < 0 {
		bad("speculative.disable_by_batch_size", "must be >= 0 (0: never), got %d", s.DisableByBatchSize)
	}
	if s.PromptLookupMin < 1 || s.PromptLookupMax < s.PromptLookupMin {
		bad("speculative.prompt_lookup_min/prompt_lookup_max", "need 1 <= prompt_lookup_min <= prompt_lookup_max, got %d and %d", s.PromptLookupMin, s.PromptLookupMax)
	}
	o := c.StructuredOutput
	if o.Workers < 1 {
		bad("structured_output.workers", "must be at least 1, got %d", o.Workers)
	}
	if o.CacheSize < 0 {
		bad("structured_output.cache_size", "must be 0 or positive, got %d", o.CacheSize)
	}
	if o.CompileTimeoutS < 0 || math.IsNaN(o.CompileTimeoutS) || math.IsInf(o.CompileTimeoutS, 0) {
		bad("structured_output.compile_timeout_s", "must be 0 (no bound) or positive seconds, got %v", o.CompileTimeoutS)
	}
	if c.Pipeline.EdgeCapacity < 1 {
		bad("pipeline.edge_capacity", "must be at least 1, got %d", c.Pipeline.EdgeCapacity)
	}
	return errors.Join(errs...)
}

// InFlight is the number of steps the step loop keeps in flight: 1 with
// strict turns, 2 with ZOS.
func (c *Config) InFlight() int {
	if c.ZOS.Enabled {
		return 2
	}
	return 1
}
