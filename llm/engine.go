package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/gguf"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
	"github.com/deepinfer/deepinfer-go/kernels/cuda"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// Errors of AddRequest besides engine.ErrInvalidRequest.
var (
	// ErrClosed: the engine was closed.
	ErrClosed = errors.New("llm: engine closed")
	// ErrQueueFull: engine.max_waiting requests are already waiting; try later.
	ErrQueueFull = errors.New("llm: waiting queue full")
)

// Options tune New beyond the config file.
type Options struct {
	// Stages is the registry the step loop's implementations come from;
	// nil means pipeline.DefaultRegistry() (which this package's stages fill).
	Stages *pipeline.Registry
	// Models maps architectures to constructors; nil means models.Builtin().
	Models *models.Registry
	// ManualSteps makes the step loop plan a step only when Step is
	// called, as vLLM's LLMEngine.step; otherwise it runs on its own.
	ManualSteps bool
	// Grammars, when not nil, compiles the requests' structured-output
	// constraints in place of the built-in compiler (engine/structured over
	// engine/grammar, sized by config structured_output): another grammar
	// engine plugs in here.
	Grammars stages.GrammarCompiler
	// Backend, when not nil, is the backend the engine runs on instead of
	// the one it would build from cfg (device and its cpu or cuda keys): a
	// backend with settings the config has no key for, such as the CUDA
	// backend's kernel switches, or one that several engines use. Its
	// name must start with cfg.Device ("cpu", "cuda"). The engine does not
	// close it: the caller does, after the engine's Close. Engines on one
	// CUDA backend share its stream, and an engine with cuda_graph on
	// captures its graphs on that stream while New runs: start such an
	// engine while no other engine on the backend runs.
	Backend kernels.Ops
}

// Engine is the LLMEngine: it owns the backend, the model, the KV cache,
// the scheduler and the step loop (a pipeline graph running on its own
// goroutines from New until Close). Safe for concurrent use.
type Engine struct {
	cfg     *config.Config
	ops     kernels.Ops
	ownsOps bool // ops was built here (not Options.Backend): Close closes it
	model   models.Model
	tok     *tokenizer.Tokenizer
	sched   *engine.Scheduler
	env     *stages.Env
	graph   *pipeline.Graph

	memPlan MemoryPlan

	// maxPromptBytes bounds the bytes of a text prompt: max_model_len
	// tokens of the tokenizer's longest token (0 without a tokenizer).
	maxPromptBytes int

	requests *requestQueue
	cancel   context.CancelFunc
	done     chan struct{}
	runErr   error
}

// New loads the model and tokenizer named by cfg, sizes the KV cache,
// builds the step loop from cfg's stage choices and starts it.
func New(cfg *config.Config, opts Options) (*Engine, error) {
	if opts.Stages == nil {
		opts.Stages = pipeline.DefaultRegistry()
	}
	if opts.Models == nil {
		opts.Models = models.Builtin()
	}
	e := &Engine{cfg: cfg, done: make(chan struct{}), ownsOps: opts.Backend == nil}
	isGGUF := models.IsGGUF(cfg.Model) // read once: the backend's activations and the loader both need it
	switch {
	case opts.Backend != nil:
		if !strings.HasPrefix(opts.Backend.Name(), cfg.Device) {
			return nil, fmt.Errorf("llm: %w: Options.Backend is %s but the config's device is %q", config.ErrInvalid, opts.Backend.Name(), cfg.Device)
		}
		e.ops = opts.Backend
	case cfg.Device == "cpu":
		if _, err := simd.Pick(cfg.CPU.SIMD); err != nil && !cfg.CPU.PureGo {
			return nil, fmt.Errorf("llm: %w: cpu.simd %s: %w", config.ErrInvalid, cfg.CPU.SIMD, err)
		}
		e.ops = cpu.New(cpu.Options{Threads: cfg.CPU.Threads, PureGo: cfg.CPU.PureGo, SIMD: cfg.CPU.SIMD, KVCacheDType: CPUKVCacheDType(cfg.Cache.KVDType(), isGGUF), Activations: CPUActivations(cfg.CPU.ActivationRounding, isGGUF)})
	case cfg.Device == "cuda":
		ops, err := cuda.New(cudaOptions(cfg))
		if err != nil {
			return nil, fmt.Errorf("llm: %w", err)
		}
		e.ops = ops
	default:
		return nil, fmt.Errorf("llm: device %q: want cpu or cuda", cfg.Device)
	}
	ok := false
	defer func() {
		if !ok {
			e.closeOps()
		}
	}()

	maxModelLen := cfg.Engine.MaxModelLen
	// A GGUF file's metadata (vocabulary included: a tenth of a second for
	// a 128k vocabulary) is parsed once, for the config check, the weights
	// and the tokenizer.
	var gf *gguf.File
	if isGGUF {
		var err error
		if gf, err = gguf.Open(cfg.Model); err != nil {
			return nil, fmt.Errorf("llm: %w", err)
		}
		defer gf.Close()
	}
	if err := checkModelFiles(cfg, gf); err != nil {
		return nil, err
	}
	model, err := opts.Models.Load(e.ops, cfg.Model, models.Options{MaxModelLen: maxModelLen, Quantization: cfg.Quantization,
		SlidingWindowPaged: cfg.Cache.SlidingWindowPaged, GGUF: gf})
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	e.model = model
	if cfg.Device == "cpu" && opts.Backend == nil {
		warnSlowBF16Pairs(cfg, isGGUF, models.WeightFormat(model))
	}
	mcfg := model.Config()
	if maxModelLen == 0 {
		maxModelLen = mcfg.MaxPositionEmbeddings
	}

	tokDir := cfg.Tokenizer
	if tokDir == "" {
		tokDir = cfg.Model
	}
	if cfg.Tokenizer == "" && gf != nil {
		if e.tok, err = ggufTokenizer(cfg.Model, gf); err != nil {
			return nil, fmt.Errorf("llm: %w", err)
		}
	} else if _, err := os.Stat(filepath.Join(tokDir, "tokenizer.json")); err == nil {
		if e.tok, err = tokenizer.Load(tokDir); err != nil {
			return nil, fmt.Errorf("llm: %w", err)
		}
	} else if cfg.Tokenizer != "" {
		return nil, fmt.Errorf("llm: tokenizer: %w", err)
	}
	if e.tok != nil {
		e.maxPromptBytes = maxPromptBytes(maxModelLen, e.tok.MaxTokenBytes())
	}

	maxBatched := max(cfg.Engine.StepTokens(cfg.Device), cfg.Engine.MaxNumSeqs)
	if !cfg.Engine.ChunkedPrefill {
		// Whole prompts must fit one step, as vLLM sizes it without chunking.
		maxBatched = max(maxBatched, maxModelLen)
	}
	spec := model.KVCacheSpec()
	if err := checkKVCacheDType(cfg.Cache, spec); err != nil {
		return nil, err
	}
	drafter, err := loadDrafter(cfg, e.ops, model, e.tok, opts.Models, maxModelLen)
	if err != nil {
		return nil, err
	}
	if spec.RingLayers > 0 && drafter.env.NumSpeculativeTokens > 0 {
		// Rejected drafts would overwrite ring entries the next step needs.
		return nil, fmt.Errorf("llm: %w: speculative decoding with sliding-window ring buffers (%s) is not supported; "+
			"set cache.sliding_window_paged: true to keep those layers paged", config.ErrInvalid, mcfg.Architectures)
	}
	bytesPerBlock := spec.BytesPerBlock(cfg.Cache.BlockSize)
	if drafter.cacheSpec != nil {
		// The drafter's cache shares the target's blocks: each block holds both.
		bytesPerBlock += drafter.cacheSpec.BytesPerBlock(cfg.Cache.BlockSize)
	}
	numBlocks := cfg.Cache.NumBlocks
	budget := cfg.Cache.CPUMemoryGiB * (1 << 30)
	if numBlocks == 0 {
		if dev, ok := e.ops.(*cuda.Backend); ok {
			// A device backend: cache.memory_fraction of the memory free
			// after the weights, less the activations of the largest step.
			if budget, e.memPlan, err = deviceKVBudget(dev, model, cfg.Cache.MemoryFraction, maxBatched, maxModelLen,
				cfg.Engine.MaxNumSeqs, cfg.Cache.BlockSize); err != nil {
				return nil, fmt.Errorf("llm: %w", err)
			}
		}
	}
	kv := planKV(spec, budget, bytesPerBlock, cfg.Cache.BlockSize, numBlocks, cfg.Cache.NumStateSlots,
		stateCheckpoints(cfg, spec), cfg.Engine.MaxNumSeqs, maxModelLen)
	numBlocks = kv.KVBlocks
	e.memPlan.StateSlots, e.memPlan.StateSlotBytes, e.memPlan.BlockBytes = kv.StateSlots, kv.StateSlotBytes, kv.BlockBytes
	e.memPlan.StateCheckpoints = kv.StateCheckpoints
	if err := checkHostMemory(cfg, int64(bytesPerBlock), hostMemoryBytes()); err != nil {
		return nil, err
	}
	if numBlocks < 1 {
		return nil, fmt.Errorf("llm: the KV budget (cache.cpu_memory_gib %g, or cache.memory_fraction of free device memory less %d bytes of activations) holds no block of %d bytes",
			cfg.Cache.CPUMemoryGiB, e.memPlan.ActivationPeak, bytesPerBlock)
	}
	e.memPlan.KVBlocks = numBlocks
	cache, err := model.NewKVCache(numBlocks, cfg.Cache.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("llm: kv cache: %w", err)
	}
	if err := cache.AllocStateSlots(e.ops, kv.StateSlots+kv.StateCheckpoints); err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	if drafter.newCache != nil {
		if drafter.env.DraftCache, err = drafter.newCache(numBlocks, cfg.Cache.BlockSize); err != nil {
			return nil, fmt.Errorf("llm: drafter kv cache: %w", err)
		}
	}
	e.sched, err = engine.NewScheduler(engine.SchedulerConfig{
		MaxNumSeqs:           cfg.Engine.MaxNumSeqs,
		MaxNumBatchedTokens:  maxBatched,
		MaxModelLen:          maxModelLen,
		EnableChunkedPrefill: cfg.Engine.ChunkedPrefill,
		ChunkSize:            cfg.Engine.PrefillChunkSize,
		AdmissionBatch:       int(math.Ceil(cfg.Engine.AdmissionFraction * float64(cfg.Engine.MaxNumSeqs))),
		BlockSize:            cfg.Cache.BlockSize,
		NumBlocks:            numBlocks,
		// A prefix-cache hit skips computing the prefix, but a ring
		// buffer holds only what its sequence computed: with ring layers
		// a hit needs a checkpoint of the rings, and without checkpoint
		// slots every sequence computes its prompt from the start.
		EnablePrefixCaching:  cfg.Cache.PrefixCaching && (spec.RingLayers == 0 || kv.StateCheckpoints > 0),
		NumStateSlots:        kv.StateSlots,
		NumStateCheckpoints:  kv.StateCheckpoints,
		EOSTokenIDs:          mcfg.EOSTokenIDs,
		VocabSize:            mcfg.VocabSize,
		NumSpeculativeTokens: drafter.env.NumSpeculativeTokens,
		NumLookaheadSlots:    drafter.lookahead,
		SpecDisableBatchSize: cfg.Speculative.DisableByBatchSize,
	})
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}

	weightBytes := 2.0
	if mcfg.DType == "float32" {
		weightBytes = 4
	}
	flops, err := engine.NewFlopsEstimator(modelShape(mcfg, weightBytes, float64(spec.DType.Size())))
	if err != nil {
		flops = nil // unusual shapes only lose the MFU figure
	}

	e.requests = newRequestQueue(cfg.Engine.MaxWaiting)
	e.env = &stages.Env{
		Model: model, Ops: e.ops, Cache: cache, Tokenizer: e.tok, Scheduler: e.sched,
		Requests: e.requests, Responder: stages.NewResponder(), Seed: cfg.Seed,
		Flops: flops, Stats: &stages.Stats{}, ManualSteps: opts.ManualSteps, InFlight: cfg.InFlight(),
		CUDAGraph:   stages.CUDAGraph{Enabled: cfg.CUDAGraph.Enabled, BatchSizes: cfg.CUDAGraph.BatchSizes},
		Speculative: drafter.env,
		Resubmit:    e.requests.pushControl,
	}
	if opts.Grammars != nil {
		e.env.Grammars = opts.Grammars
	} else if e.tok != nil && e.tok.VocabSize() <= mcfg.VocabSize {
		// Structured output masks the model's logits by the tokenizer's
		// vocabulary (ids past it, padding, are never allowed).
		if e.env.Grammars, err = newGrammarCompiler(e.tok, mcfg.EOSTokenIDs, cfg.StructuredOutput); err != nil {
			return nil, fmt.Errorf("llm: %w", err)
		}
	}
	pspec, err := CheckedSpec(cfg, opts.Stages)
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	if e.graph, err = pspec.Build(opts.Stages, e.env); err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	// Device work of the stages (warm-up, CUDA graph capture) runs here,
	// before the loop, and fails New.
	if err := e.graph.Start(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("llm: %w", err)
	}
	go func() {
		defer close(e.done)
		e.runErr = e.graph.Run(ctx)
		// Whatever is still live can no longer be served.
		reason := fmt.Errorf("llm: engine stopped")
		if e.runErr != nil {
			reason = fmt.Errorf("llm: engine failed: %w", e.runErr)
		}
		e.env.Responder.FailAll(engine.FinishError, reason)
	}()
	ok = true
	return e, nil
}

// checkKVCacheDType reports, wrapping config.ErrInvalid, a cache whose
// element type is not the one cache.kv_cache_dtype asked for: both backends
// honour fp8 for GQA models, the CUDA backend also for MLA models of
// kv_lora_rank 128 or 512 (DeepSeek's), while other MLA models keep their
// latent cache (and a backend that could not keep a cache in 8 bits would
// keep its own type rather than fail); the CPU backend honours f16 and f32
// for GQA and MLA models, the CUDA backend where it picks that type itself.
// Auto accepts any type.
func checkKVCacheDType(c config.Cache, spec models.KVCacheSpec) error {
	want := c.KVDType()
	if want == 0 || spec.DType == want {
		return nil
	}
	return fmt.Errorf("llm: %w: cache.kv_cache_dtype %s asks for %v KV caches, but the model's %s cache got %v: "+
		"fp8 needs a GQA model, or an MLA model of DeepSeek's latent sizes on the CUDA backend (MLA models such as DeepSeek keep a float32 or f16 latent cache on the CPU backend); "+
		"f16 needs the CPU backend (GQA and MLA models), or 16-bit weights in GEMM mode round on the CUDA backend; "+
		"f32 needs the CPU backend, or GEMM mode split or float32 weights on the CUDA backend; use kv_cache_dtype: auto otherwise",
		config.ErrInvalid, c.KVCacheDType, want, spec.Layout, spec.DType)
}

// maxPromptBytes is the longest text, in bytes, that can encode to at most
// maxModelLen tokens when no token is longer than maxTokenBytes bytes: a
// longer text cannot fit and is refused before it is tokenized. It
// saturates instead of overflowing; maxTokenBytes below 1 counts as 1.
func maxPromptBytes(maxModelLen, maxTokenBytes int) int {
	maxTokenBytes = max(maxTokenBytes, 1)
	if maxModelLen > math.MaxInt/maxTokenBytes {
		return math.MaxInt
	}
	return maxModelLen * maxTokenBytes
}

// checkModelFiles refuses, before any weight is read, model files whose
// values cannot be served: engine.max_model_len above the model's
// max_position_embeddings (unless engine.allow_long_max_model_len), and
// negative special-token ids in tokenizer_config.json (negative ids in
// config.json are refused by weights.ParseConfig). A config.json that does
// not parse is left to the model loader, which reports it. A GGUF file's
// config comes from its metadata (gf, the parsed file; nil for a
// directory). Cost: reading two small JSON files.
func checkModelFiles(cfg *config.Config, gf *gguf.File) error {
	configPath := filepath.Join(cfg.Model, "config.json")
	var wc *weights.Config
	var err error
	if gf != nil {
		configPath = cfg.Model + " (GGUF metadata)"
		wc, err = models.GGUFConfig(gf)
	} else {
		wc, err = weights.ReadConfig(configPath)
	}
	if err == nil {
		if n, limit := cfg.Engine.MaxModelLen, derivedMaxModelLen(wc); n > limit && !cfg.Engine.AllowLongMaxModelLen {
			return fmt.Errorf("llm: %w: engine.max_model_len %d exceeds the model's max_position_embeddings %d (%s, with its rope scaling): "+
				"positions past the trained context give garbage; lower engine.max_model_len, or set "+
				"engine.allow_long_max_model_len: true to serve them anyway",
				config.ErrInvalid, n, limit, configPath)
		}
	}
	tokDir := cfg.Tokenizer
	if tokDir == "" {
		tokDir = cfg.Model
	}
	path := filepath.Join(tokDir, "tokenizer_config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil // optional; the tokenizer loader reports what it needs
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(data, &raw) != nil {
		return nil // the tokenizer loader reports malformed files
	}
	for _, key := range slices.Sorted(maps.Keys(raw)) {
		if !strings.HasSuffix(key, "_token_id") {
			continue
		}
		var ids []int
		var one int
		switch {
		case json.Unmarshal(raw[key], &one) == nil:
			ids = []int{one}
		case json.Unmarshal(raw[key], &ids) == nil:
		default:
			continue // null, or not an id: not ours to judge
		}
		for _, id := range ids {
			if id < 0 {
				return fmt.Errorf("llm: %w: %s: %s is %d; token ids cannot be negative", config.ErrInvalid, path, key, id)
			}
		}
	}
	return nil
}

// derivedMaxModelLen is the longest context the model's config.json
// supports, as vLLM derives it: max_position_embeddings, times the rope
// scaling factor for linear and dynamic scaling, and yarn's
// original_max_position_embeddings times its factor (llama3 scaling is
// already in max_position_embeddings).
func derivedMaxModelLen(c *weights.Config) int {
	n := c.MaxPositionEmbeddings
	switch r := c.Rope; r.Type {
	case "linear", "dynamic":
		return int(float64(n) * max(r.Factor, 1))
	case "yarn":
		if r.OriginalMaxPositionEmbeddings > 0 {
			n = r.OriginalMaxPositionEmbeddings
		}
		return max(int(float64(n)*max(r.Factor, 1)), c.MaxPositionEmbeddings)
	}
	return n
}

// hostMemoryBytes is the machine's memory (MemTotal of /proc/meminfo), 0
// when unknown (not Linux, or unreadable). Cost: reading one small file.
func hostMemoryBytes() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0
		}
		kib, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kib <= 0 {
			return 0
		}
		return kib << 10
	}
	return 0
}

// checkHostMemory refuses a CPU KV cache larger than the machine's memory
// (memBytes; 0 means unknown and skips the check): cache.num_blocks blocks
// of blockBytes each, or cache.cpu_memory_gib when num_blocks is 0. Such a
// cache could only be allocated by swapping or be killed for memory. CUDA
// caches are sized from the device's free memory and are not checked here.
func checkHostMemory(cfg *config.Config, blockBytes, memBytes int64) error {
	if cfg.Device != "cpu" || memBytes <= 0 {
		return nil
	}
	gib := func(b float64) float64 { return b / (1 << 30) }
	if n := int64(cfg.Cache.NumBlocks); n > 0 {
		if blockBytes > 0 && n > memBytes/blockBytes {
			return fmt.Errorf("llm: %w: cache.num_blocks %d of %d bytes need %.1f GiB, more than this machine's %.1f GiB of memory",
				config.ErrInvalid, n, blockBytes, gib(float64(n)*float64(blockBytes)), gib(float64(memBytes)))
		}
		return nil
	}
	if want := cfg.Cache.CPUMemoryGiB * (1 << 30); want > float64(memBytes) {
		return fmt.Errorf("llm: %w: cache.cpu_memory_gib %g is more than this machine's %.1f GiB of memory",
			config.ErrInvalid, cfg.Cache.CPUMemoryGiB, gib(float64(memBytes)))
	}
	return nil
}

// Done is closed when the step loop has ended (after Close, or on a fatal
// error); Err then says why.
func (e *Engine) Done() <-chan struct{} { return e.done }

// Err is the step loop's error once Done is closed, nil before and after a
// clean Close.
func (e *Engine) Err() error {
	select {
	case <-e.done:
		return e.runErr
	default:
		return nil
	}
}

// Config returns the engine's configuration.
func (e *Engine) Config() *config.Config { return e.cfg }

// Tokenizer returns the model's tokenizer, or nil when it has none.
func (e *Engine) Tokenizer() *tokenizer.Tokenizer { return e.tok }

// Model returns the loaded model.
func (e *Engine) Model() models.Model { return e.model }

// MemoryPlan returns how the KV cache was sized.
func (e *Engine) MemoryPlan() MemoryPlan { return e.memPlan }

// Backend returns the kernels backend.
func (e *Engine) Backend() kernels.Ops { return e.ops }

// Graph returns the running step loop (for stats and renders).
func (e *Engine) Graph() *pipeline.Graph { return e.graph }

// PeakFLOPS is the backend's compute ceiling for MFU figures (measured or
// known), 0 when the backend states none.
func (e *Engine) PeakFLOPS() float64 {
	if p, ok := e.ops.(interface{ PeakFLOPS() float64 }); ok {
		return p.PeakFLOPS()
	}
	return 0
}

// MFU is the model FLOPs utilization of the forward passes so far: the
// FlopsEstimator's count over forward time, divided by PeakFLOPS; 0 when
// either is unknown.
func (e *Engine) MFU() float64 {
	peak, secs := e.PeakFLOPS(), e.env.Stats.ForwardTime().Seconds()
	if peak <= 0 || secs <= 0 {
		return 0
	}
	return e.env.Stats.FLOPs() / secs / peak
}

// StepStats are the step loop's counters (tokens, forward time, FLOPs).
func (e *Engine) StepStats() *stages.Stats { return e.env.Stats }

// MaxModelLen is the longest sequence (prompt plus output tokens) the
// engine serves: engine.max_model_len, or the model's positions when unset.
func (e *Engine) MaxModelLen() int { return e.sched.Config().MaxModelLen }

// SchedulerStats is a snapshot of the scheduler's queues and counters.
func (e *Engine) SchedulerStats() engine.SchedulerStats { return e.sched.Stats() }

// AddRequest submits req. A request that is bad on its face is refused
// here with an error wrapping engine.ErrInvalidRequest and never enqueued:
// sampling params out of range, token ids outside the vocabulary, an empty
// prompt, text without a tokenizer, an id already live, a token prompt
// longer than max_model_len or than the whole KV cache, prompt tokens plus
// max_tokens over max_model_len (vLLM's rule: nothing is cut silently), and
// a text prompt longer in bytes than max_model_len tokens of the
// tokenizer's longest token (refused before any tokenization). A text
// whose token count turns out too large once tokenized is answered through
// req.OnOutput with FinishError. AddRequest also fails when the engine is
// closed or its waiting queue (engine.max_waiting) is full. Cost:
// O(prompt ids); a text prompt is not read.
func (e *Engine) AddRequest(req *engine.Request) error {
	return e.add(req, func(sub stages.Submission) error { return e.requests.push(sub) })
}

// AddRequestWait is AddRequest that waits while the waiting queue is full
// (until ctx ends).
func (e *Engine) AddRequestWait(ctx context.Context, req *engine.Request) error {
	return e.add(req, func(sub stages.Submission) error { return e.requests.pushWait(ctx, sub) })
}

func (e *Engine) add(req *engine.Request, push func(stages.Submission) error) error {
	if err := e.validate(req); err != nil {
		return err
	}
	select {
	case <-e.done:
		return fmt.Errorf("%w: the step loop ended: %v", ErrClosed, e.runErr)
	default:
	}
	// Registered before it is queued, so that an Abort that follows finds
	// it, and its abort travels behind it.
	if err := e.env.Responder.Add(req); err != nil {
		return fmt.Errorf("request %q: %w", req.ID, err)
	}
	if err := push(stages.Submission{Request: req}); err != nil {
		e.env.Responder.Drop(req.ID)
		return err
	}
	return nil
}

// validate applies the checks that need no tokenization.
func (e *Engine) validate(req *engine.Request) error {
	sc := e.sched.Config()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("request %q: %w: "+format, append([]any{req.ID, engine.ErrInvalidRequest}, args...)...)
	}
	if err := req.Params.Validate(sc.VocabSize); err != nil {
		return fmt.Errorf("request %q: %w", req.ID, err)
	}
	if req.Params.N > sc.MaxNumSeqs {
		return bad("n = %d exceeds engine.max_num_seqs %d", req.Params.N, sc.MaxNumSeqs)
	}
	switch ids := req.PromptTokenIDs; {
	case len(ids) > 0:
		if len(ids) > sc.MaxModelLen {
			return bad("prompt of %d tokens exceeds max_model_len %d", len(ids), sc.MaxModelLen)
		}
		// Compared without adding: max_tokens may be as large as an int goes.
		if req.Params.MaxTokens > sc.MaxModelLen-len(ids) {
			return bad("this model's maximum context length is %d tokens, but %d prompt tokens plus max_tokens %d exceed it; reduce the prompt or max_tokens",
				sc.MaxModelLen, len(ids), req.Params.MaxTokens)
		}
		if need := (len(ids) + sc.BlockSize - 1) / sc.BlockSize; need > sc.NumBlocks {
			return bad("prompt of %d tokens needs %d KV blocks of %d tokens, but the whole cache has %d blocks (cache.num_blocks, or the memory budget)",
				len(ids), need, sc.BlockSize, sc.NumBlocks)
		}
		for i, id := range ids {
			if id < 0 || id >= sc.VocabSize {
				return bad("prompt token %d is %d, outside the vocabulary [0, %d)", i, id, sc.VocabSize)
			}
		}
	case req.Prompt == "":
		return bad("the prompt is empty")
	case e.tok == nil:
		return bad("the model has no tokenizer: give the prompt as token ids")
	case len(req.Prompt) > e.maxPromptBytes:
		// Refused before tokenization: the work would be unbounded.
		return bad("prompt of %d bytes cannot fit max_model_len %d: no token is longer than %d bytes, so at most %d bytes fit",
			len(req.Prompt), sc.MaxModelLen, e.tok.MaxTokenBytes(), e.maxPromptBytes)
	case req.Params.MaxTokens > sc.MaxModelLen-1:
		// A prompt has at least one token; its exact count is known only
		// once tokenized.
		return bad("this model's maximum context length is %d tokens, but max_tokens %d leaves no room for a prompt; reduce max_tokens",
			sc.MaxModelLen, req.Params.MaxTokens)
	}
	return nil
}

// ErrNotManual is returned by Step on an engine that runs its own steps.
var ErrNotManual = errors.New("llm: Step needs an engine built with Options.ManualSteps")

// Step runs one step of the loop: it schedules what the scheduler picks
// now (new requests submitted with AddRequest included: the ask travels
// behind them through the loop's request queue), runs it, and returns the
// request outputs it produced (also delivered to each request's OnOutput).
// With nothing to schedule it returns no outputs at once. Only for engines
// built with Options.ManualSteps; Step calls are served in order, one step
// planned per call.
func (e *Engine) Step(ctx context.Context) ([]engine.RequestOutput, error) {
	if !e.env.ManualSteps {
		return nil, ErrNotManual
	}
	ask := stages.NewStepAsk()
	if !e.requests.pushControl(stages.Submission{Step: ask}) {
		return nil, fmt.Errorf("%w: the engine is closing", ErrClosed)
	}
	select {
	case out := <-ask.Done:
		return out.Outputs, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.done:
		return nil, fmt.Errorf("%w: %v", ErrClosed, e.runErr)
	}
}

// Abort stops a request wherever it is: its open sequences are answered
// with FinishAbort at once, and the abort travels through the loop's
// request queue to the scheduler, behind the request itself. It reports
// whether the request was live.
func (e *Engine) Abort(requestID string) bool {
	live := e.env.Responder.Fail(requestID, engine.FinishAbort, nil)
	if live {
		e.requests.pushControl(stages.Submission{Abort: requestID})
	}
	return live
}

// NumLive is the number of requests not fully answered.
func (e *Engine) NumLive() int { return e.env.Responder.Len() }

// HasUnfinished reports whether any request is still being served.
func (e *Engine) HasUnfinished() bool {
	return e.env.Responder.Len() > 0 || e.sched.HasUnfinished()
}

// FlushInflight waits until no request is unfinished and the step still in
// flight after the last one (with ZOS, the step planned before the last
// finish was known) has been collected, or until ctx ends. The engine
// stays open. It sends a drain marker through the loop's request queue;
// the schedule stage answers it once the scheduler is idle.
func (e *Engine) FlushInflight(ctx context.Context) error {
	drained := make(chan struct{})
	if !e.requests.pushControl(stages.Submission{Drain: drained}) {
		select { // the loop is ending on its own
		case <-e.done:
			return e.runErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.done:
		return e.runErr
	}
}

// Close stops accepting requests, lets the step loop finish the ones it
// has (aborts still reach it), and releases the backend. It returns the
// step loop's error, if any. An engine driven by Step finishes nothing on
// its own: Close ends its loop at once, and the requests it still holds
// are answered with an error.
func (e *Engine) Close() error {
	e.requests.close()
	if !e.env.ManualSteps {
		waitCtx, stop := context.WithCancel(context.Background())
		go func() {
			select {
			case <-e.done:
			case <-waitCtx.Done():
			}
			stop()
		}()
		e.env.Responder.WaitEmpty(waitCtx)
		stop()
	}
	e.requests.end()
	<-e.done
	e.cancel()
	return errors.Join(e.runErr, e.closeOps())
}

// closeOps closes the backend when the engine built it (not
// Options.Backend).
func (e *Engine) closeOps() error {
	if !e.ownsOps {
		return nil
	}
	return e.ops.Close()
}

// Shutdown is Close with a deadline: when ctx ends first, the step loop is
// cancelled and the remaining requests are answered with an error.
func (e *Engine) Shutdown(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- e.Close() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		e.cancel()
		return errors.Join(ctx.Err(), <-errc)
	}
}

// ggufTokenizer builds the tokenizer (with its chat template) from the
// metadata of f, the parsed GGUF file at path; nil, and no error, for a
// file that stores none. Cost: the tokenizer's build.
func ggufTokenizer(path string, f *gguf.File) (*tokenizer.Tokenizer, error) {
	if _, ok := f.Get("tokenizer.ggml.model"); !ok {
		return nil, nil
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return tok, nil
}

// warnSlowBF16Pairs logs one line when a model whose weight formats
// (models.WeightFormat) include BF16 meets bfloat16 activations
// (cpu.activation_rounding: bf16, or auto with a GGUF file: isGGUF) on the
// pure-Go kernels, whose loop gives the SIMD paths' bits far more slowly.
func warnSlowBF16Pairs(cfg *config.Config, isGGUF bool, formats string) {
	if CPUActivations(cfg.CPU.ActivationRounding, isGGUF) != cpu.ActBF16 || !slices.Contains(strings.Split(formats, "+"), "BF16") {
		return
	}
	name := cfg.CPU.SIMD
	if cfg.CPU.PureGo {
		name = "go"
	}
	if impl, err := simd.Pick(name); err == nil && !impl.HasNativeBF16Pairs() {
		slog.Warn("bfloat16 activations on the pure-Go kernels: products with BF16 weights run a Go loop (the SIMD paths' bits, far slower)",
			"simd", impl.Name(), "cpu.activation_rounding", cfg.CPU.ActivationRounding)
	}
}

// CPUKVCacheDType is the CPU backend's K/V cache type for
// cache.kv_cache_dtype's element type kv (0: auto): under auto a model
// directory keeps float32 caches (the float32 reference of transformers),
// and a GGUF file gets IEEE half, llama.cpp's default cache type (its
// --cache-type-k and -v f16), half the memory and half the bytes a decode
// row's attention reads, as auto's activations follow llama.cpp for GGUF
// files (CPUActivations). A type asked for is kept.
func CPUKVCacheDType(kv kernels.DType, gguf bool) kernels.DType {
	if kv == 0 && gguf {
		return kernels.F16
	}
	return kv
}

// CPUActivations is the CPU backend's mode for cpu.activation_rounding
// (validated: auto or empty, none, llama_cpp, bf16; anything else reads as
// auto); gguf says whether the model is a GGUF file, whose BF16 weights meet
// bfloat16 activations under auto, as in llama.cpp. Tools that build the
// backend themselves take the engine's mode from it.
func CPUActivations(rounding string, gguf bool) cpu.ActRounding {
	switch rounding {
	case "none":
		return cpu.ActFloat32
	case "llama_cpp":
		return cpu.ActLlamaCpp
	case "bf16":
		return cpu.ActBF16
	}
	if gguf {
		return cpu.ActBF16
	}
	return cpu.ActLlamaCppQuantized
}
