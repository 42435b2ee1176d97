package llm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// ErrClosed is returned by AddRequest after Close.
var ErrClosed = errors.New("llm: engine closed")

// Options tune New beyond the config file.
type Options struct {
	// Stages is the registry the step loop's implementations come from;
	// nil means pipeline.DefaultRegistry() (which this package's stages fill).
	Stages *pipeline.Registry
	// Models maps architectures to constructors; nil means models.Builtin().
	Models *models.Registry
}

// Engine is the LLMEngine: it owns the backend, the model, the KV cache,
// the scheduler and the step loop (a pipeline graph running on its own
// goroutines from New until Close). Safe for concurrent use.
type Engine struct {
	cfg   *config.Config
	ops   kernels.Ops
	model models.Model
	tok   *tokenizer.Tokenizer
	sched *engine.Scheduler
	rt    *stages.Runtime
	graph *pipeline.Graph

	mu       sync.RWMutex // guards requests against Close
	closed   bool
	requests chan *engine.Request
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
	if cfg.Device != "cpu" {
		return nil, fmt.Errorf("llm: device %q is not available in this build; use device: cpu", cfg.Device)
	}
	e := &Engine{cfg: cfg, done: make(chan struct{})}
	e.ops = cpu.New(cpu.Options{Threads: cfg.CPU.Threads, PureGo: cfg.CPU.PureGo})
	ok := false
	defer func() {
		if !ok {
			e.ops.Close()
		}
	}()

	maxModelLen := cfg.Engine.MaxModelLen
	model, err := opts.Models.Load(e.ops, cfg.Model, models.Options{MaxModelLen: maxModelLen})
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	e.model = model
	mcfg := model.Config()
	if maxModelLen == 0 {
		maxModelLen = mcfg.MaxPositionEmbeddings
	}

	tokDir := cfg.Tokenizer
	if tokDir == "" {
		tokDir = cfg.Model
	}
	if _, err := os.Stat(filepath.Join(tokDir, "tokenizer.json")); err == nil {
		if e.tok, err = tokenizer.Load(tokDir); err != nil {
			return nil, fmt.Errorf("llm: %w", err)
		}
	} else if cfg.Tokenizer != "" {
		return nil, fmt.Errorf("llm: tokenizer: %w", err)
	}

	spec := model.KVCacheSpec()
	numBlocks := cfg.Cache.NumBlocks
	if numBlocks == 0 {
		numBlocks = int(cfg.Cache.CPUMemoryGiB * (1 << 30) / float64(spec.BytesPerBlock(cfg.Cache.BlockSize)))
		numBlocks = min(numBlocks, cfg.Engine.MaxNumSeqs*((maxModelLen+cfg.Cache.BlockSize-1)/cfg.Cache.BlockSize)+1)
	}
	if numBlocks < 1 {
		return nil, fmt.Errorf("llm: cache.cpu_memory_gib %g holds no block of %d bytes", cfg.Cache.CPUMemoryGiB, spec.BytesPerBlock(cfg.Cache.BlockSize))
	}
	cache, err := model.NewKVCache(numBlocks, cfg.Cache.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("llm: kv cache: %w", err)
	}
	maxBatched := max(cfg.Engine.MaxNumBatchedTokens, cfg.Engine.MaxNumSeqs)
	if !cfg.Engine.ChunkedPrefill {
		// Whole prompts must fit one step, as vLLM sizes it without chunking.
		maxBatched = max(maxBatched, maxModelLen)
	}
	e.sched, err = engine.NewScheduler(engine.SchedulerConfig{
		MaxNumSeqs:           cfg.Engine.MaxNumSeqs,
		MaxNumBatchedTokens:  maxBatched,
		MaxModelLen:          maxModelLen,
		EnableChunkedPrefill: cfg.Engine.ChunkedPrefill,
		ChunkSize:            cfg.Engine.PrefillChunkSize,
		BlockSize:            cfg.Cache.BlockSize,
		NumBlocks:            numBlocks,
		EnablePrefixCaching:  cfg.Cache.PrefixCaching,
		NumStateSlots:        cfg.Cache.NumStateSlots,
		EOSTokenIDs:          mcfg.EOSTokenIDs,
		VocabSize:            mcfg.VocabSize,
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

	e.requests = make(chan *engine.Request, max(1, cfg.Engine.MaxWaiting))
	e.rt = &stages.Runtime{
		Scheduler: e.sched, Model: model, Ops: e.ops, Cache: cache, Tokenizer: e.tok,
		Requests: e.requests, Live: stages.NewRequests(), Seed: cfg.Seed, VocabSize: mcfg.VocabSize,
		Flops: flops, Stats: &stages.Stats{}, ZOS: stages.NewMetadataZOS(),
	}
	pspec, err := Spec(cfg)
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	if e.graph, err = pspec.Build(opts.Stages, e.rt); err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() {
		defer close(e.done)
		e.runErr = e.graph.Run(ctx)
		// Whatever is still live can no longer be served.
		reason := fmt.Errorf("llm: engine stopped")
		if e.runErr != nil {
			reason = fmt.Errorf("llm: engine failed: %w", e.runErr)
		}
		e.rt.Live.FailAll(engine.FinishError, reason)
	}()
	ok = true
	return e, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() *config.Config { return e.cfg }

// Tokenizer returns the model's tokenizer, or nil when it has none.
func (e *Engine) Tokenizer() *tokenizer.Tokenizer { return e.tok }

// Model returns the loaded model.
func (e *Engine) Model() models.Model { return e.model }

// Backend returns the kernels backend.
func (e *Engine) Backend() kernels.Ops { return e.ops }

// Graph returns the running step loop (for stats and renders).
func (e *Engine) Graph() *pipeline.Graph { return e.graph }

// StepStats are the step loop's counters (tokens, forward time, FLOPs).
func (e *Engine) StepStats() *stages.Stats { return e.rt.Stats }

// SchedulerStats is a snapshot of the scheduler's queues and counters.
func (e *Engine) SchedulerStats() engine.SchedulerStats { return e.sched.Stats() }

// AddRequest submits req. Bad requests are answered through req.OnOutput
// with FinishError; AddRequest itself fails only when the engine is closed
// or its waiting queue (engine.max_waiting) is full.
func (e *Engine) AddRequest(req *engine.Request) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return ErrClosed
	}
	select {
	case e.requests <- req:
		return nil
	case <-e.done:
		return fmt.Errorf("%w: %v", ErrClosed, e.runErr)
	default:
		return fmt.Errorf("llm: %d requests are waiting (engine.max_waiting): try again later", cap(e.requests))
	}
}

// Abort stops a request wherever it is; its open sequences are answered
// with FinishAbort. It reports whether the request was live.
func (e *Engine) Abort(requestID string) bool {
	e.sched.Abort(requestID)
	return e.rt.Live.Fail(requestID, engine.FinishAbort, nil)
}

// NumLive is the number of requests not fully answered.
func (e *Engine) NumLive() int { return e.rt.Live.Len() }

// HasUnfinished reports whether any request is still being served.
func (e *Engine) HasUnfinished() bool { return e.rt.Live.Len() > 0 || e.sched.HasUnfinished() }

// FlushInflight waits until no request is unfinished and the step still in
// flight after the last one (with ZOS, the step planned before the last
// finish was known) has been collected, or until ctx ends. The engine
// stays open. Cost: polls every millisecond while it waits.
func (e *Engine) FlushInflight(ctx context.Context) error {
	for e.HasUnfinished() || e.sched.NumInflightSteps() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.done:
			return e.runErr
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// Close stops accepting requests, lets the step loop finish the ones it
// has, and releases the backend. It returns the step loop's error, if any.
func (e *Engine) Close() error {
	e.mu.Lock()
	if !e.closed {
		e.closed = true
		close(e.requests)
	}
	e.mu.Unlock()
	<-e.done
	e.cancel()
	return errors.Join(e.runErr, e.ops.Close())
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
