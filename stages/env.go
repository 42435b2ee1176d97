package stages

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// Env is what the engine builds once and hands every stage factory as
// pipeline.Args.Deps. A stage never sees it whole: each slot's Register
// function gives its factory only that slot's typed dependencies
// (TokenizeDeps, ScheduleDeps, ...), so what a stage may touch is written in
// its signature. Only the schedule stage gets the Scheduler.
type Env struct {
	Model models.Model
	Ops   kernels.Ops
	Cache *models.KVCache
	// Tokenizer may be nil: prompts must then be token ids and outputs carry
	// no text.
	Tokenizer *tokenizer.Tokenizer
	Scheduler *engine.Scheduler
	// Requests feeds the requests slot; it ends (io.EOF) to end the run.
	Requests pipeline.Source[Submission]
	// Responder answers requests (emits their outputs); see Responder.
	Responder *Responder
	// Seed gives requests without a seed of their own a reproducible one.
	Seed int64
	// Flops estimates each step's work (nil: not estimated); Stats counts.
	Flops *engine.FlopsEstimator
	Stats *Stats
	// CUDAGraph is the forward stage's graph capture (config cuda_graph).
	CUDAGraph CUDAGraph
	// ManualSteps makes the schedule stage plan a step only when a
	// Submission asks for one (LLMEngine.Step).
	ManualSteps bool
	// InFlight is the step loop's bound on steps in flight
	// (pipeline.Loop.MaxInFlight; 0: unknown): the prepare stage reuses a
	// step's upload buffer InFlight steps later at the earliest.
	InFlight int
	// Speculative is the speculative decoding setup for the draft stage
	// (NumSpeculativeTokens 0: off).
	Speculative Speculative
	// Grammars compiles the structured-output constraints of requests
	// (nil: the model has no tokenizer, and such requests are refused).
	Grammars GrammarCompiler
	// Resubmit puts a control item (a compiled grammar) back on the
	// requests slot's queue, to reach the schedule stage in order; false
	// once the queue has ended.
	Resubmit func(Submission) bool
}

// GrammarCompiler compiles a structured-output constraint off the step
// loop (engine/structured.Compiler): done is called once, on another
// goroutine, with the grammar or the error that fails the request.
type GrammarCompiler interface {
	CompileAsync(ctx context.Context, spec *engine.StructuredOutput, done func(engine.Grammar, error))
}

// Speculative is what the draft stage needs beyond the target model
// (config speculative; validated when the config loads).
type Speculative struct {
	NumSpeculativeTokens int // k: the longest draft
	// PromptLookupMin and PromptLookupMax bound the n-grams the ngram
	// drafter matches.
	PromptLookupMin, PromptLookupMax int
	// DisableBatchSize > 0: the scheduler plans steps with a draft limit
	// of 0 while at least this many sequences run (drafters follow the
	// step's limit, SchedulerOutputs.DraftLimit).
	DisableBatchSize int
	// Adaptive turns drafts on and off by measuring (spec.Controller).
	Adaptive bool
	// DraftModel is the draft_model drafter's model (nil for others).
	DraftModel models.Model
	// DSpark is the dspark drafter's model (nil for others), with its
	// per-sequence confidence threshold and the cap on the draft tokens a
	// step verifies (0: none), or, with VerifyBudgetAuto, a budget chosen
	// each step from the measured cost of a row (spec.GateCost), gating
	// only at the batch sizes where it is measured faster than verifying
	// every draft unread.
	DSpark                 *models.DSpark
	ConfidenceThreshold    float64
	MaxVerifyTokensPerStep int
	VerifyBudgetAuto       bool
	// VerifyOnDevice lets the sample stage hand a step on before its host
	// samples arrive (SampledStep.Await completes it), so that the verify
	// stage verifies on the device and a DeviceDrafter drafts from that
	// device verification: the next step's forward pass is then queued
	// before the host has the step's tokens. Set with zero-overhead
	// scheduling when no stage is inserted after sample or verify (an
	// inserted stage expects complete steps).
	VerifyOnDevice bool
	// DraftCache is the drafter's own paged KV cache, with the target's
	// block layout (the same block tables address both): the MTP layers'
	// or the draft model's; nil for a drafter without one.
	DraftCache *models.KVCache
}

// CUDAGraph says which decode batch sizes the forward stage captures as
// CUDA graphs (config cuda_graph; validated when the config loads).
type CUDAGraph struct {
	Enabled    bool
	BatchSizes []int // ascending, positive
}

// env extracts the *Env a factory was given.
func env(a pipeline.Args) (*Env, error) {
	e, ok := a.Deps.(*Env)
	if !ok || e == nil {
		return nil, fmt.Errorf("stages: %s=%s needs a *stages.Env as its deps, got %T (build the graph with llm.New)", a.Slot, a.Impl, a.Deps)
	}
	return e, nil
}

// vocabSize is the model's vocabulary (0 without a model).
func (e *Env) vocabSize() int {
	if e.Model == nil {
		return 0
	}
	return e.Model.Config().VocabSize
}

// NoOptions is the options type of a stage that takes none: any key is
// refused.
type NoOptions struct{}

// register adds a stage implementation whose factory needs deps D from the
// Env and options O; wrap turns the built stage into its node (a slot's
// lagged inputs, say).
func register[D, In, Out, O any](r *pipeline.Registry, slot, name string, defaults O, deps func(*Env) D,
	build func(D, O) (pipeline.Stage[In, Out], error), wrap func(pipeline.Stage[In, Out]) *pipeline.Node) {
	pipeline.RegisterOptions(r, slot, name, defaults, func(a pipeline.Args, o O) (*pipeline.Node, error) {
		e, err := env(a)
		if err != nil {
			return nil, err
		}
		s, err := build(deps(e), o)
		if err != nil {
			return nil, err
		}
		if wrap == nil {
			return pipeline.NewStage(s), nil
		}
		return wrap(s), nil
	})
}

// InsertDeps is what an inserted stage (any registered slot placed with
// pipeline.insert, between two of the step loop's slots) gets.
type InsertDeps struct {
	Ops       kernels.Ops
	Tokenizer *tokenizer.Tokenizer // nil when the model has none
	VocabSize int
	Stats     *Stats
}

// RegisterInsert registers, in r (nil: the default registry), a stage to
// insert between two slots of the step loop, under its own slot name and
// implementation name, with options of type O (decoded strictly from YAML
// and checked with O's Validate method when it has one; see
// pipeline.RegisterOptions). Its input and output types must fit the edge
// it goes on: *ForwardResult -> *ForwardResult after forward (a logits
// processor), *SampledStep -> *SampledStep after sample, *StepOutputs ->
// *StepOutputs after postprocess (an output observer: it sees every
// step's outputs and must pass the *StepOutputs on, since the loop's
// feedback edge runs through it). The graph checks the types when it is
// built. Such a stage must not drop items (pipeline.ErrSkip fails the run).
func RegisterInsert[In, Out, O any](r *pipeline.Registry, slot, name string, defaults O, build func(InsertDeps, O) (pipeline.Stage[In, Out], error)) {
	register(r, slot, name, defaults, func(e *Env) InsertDeps {
		return InsertDeps{Ops: e.Ops, Tokenizer: e.Tokenizer, VocabSize: e.vocabSize(), Stats: e.Stats}
	}, build, nil)
}

// laggedSlot wraps a slot's stage so that the value its lagged input
// delivers (the step before's) reaches the stage through its input, set
// by set for the length of one Process call only: a step that kept it
// would keep the step before alive, and that one the step before it.
type laggedSlot[In, Out, L any] struct {
	passLifecycle
	inner pipeline.Stage[In, Out]
	set   func(In, L) // the zero L clears the field
	prev  L
}

// withLagged returns the node of s with its lagged input of type L.
func withLagged[In, Out, L any](s pipeline.Stage[In, Out], set func(In, L)) *pipeline.Node {
	w := &laggedSlot[In, Out, L]{passLifecycle: passLifecycle{s}, inner: s, set: set}
	return pipeline.ReadLagged(pipeline.NewStage[In, Out](w), w.read)
}

func (w *laggedSlot[In, Out, L]) read(_ context.Context, v L) error {
	w.prev = v
	return nil
}

// Process hands the stage the lagged value with its input.
func (w *laggedSlot[In, Out, L]) Process(ctx context.Context, in In) (Out, error) {
	var zero L
	w.set(in, w.prev)
	w.prev = zero
	out, err := w.inner.Process(ctx, in)
	w.set(in, zero)
	return out, err
}

// PublishLagged passes the graph's early publishing to a stage that
// publishes early (pipeline.LaggedPublisher).
func (w *laggedSlot[In, Out, L]) PublishLagged(publish func(Out)) {
	if p, ok := w.inner.(pipeline.LaggedPublisher[Out]); ok {
		p.PublishLagged(publish)
	}
}

// passLifecycle forwards Start and Close to a wrapped stage that has them.
type passLifecycle struct{ inner any }

// Start calls the wrapped stage's Start, if any.
func (p passLifecycle) Start(ctx context.Context) error {
	if s, ok := p.inner.(pipeline.Starter); ok {
		return s.Start(ctx)
	}
	return nil
}

// Close calls the wrapped stage's Close, if any.
func (p passLifecycle) Close() error {
	if c, ok := p.inner.(pipeline.Closer); ok {
		return c.Close()
	}
	return nil
}
