package stages

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// The tokenize slot: Submission -> Admission. A stage of this slot turns a
// new request into a validated *engine.Sequence (encoding its prompt), and
// passes aborts, step asks and drains through unchanged. A request it
// refuses is answered through TokenizeDeps.Responder (Fail with
// FinishError and the reason) and goes no further (pipeline.ErrSkip).
type TokenizeStage = pipeline.Stage[Submission, Admission]

// Admission is what reaches the schedule stage: exactly one field is set.
type Admission struct {
	Seq     *engine.Sequence // a validated new sequence
	Abort   string           // a request to drop
	Step    *StepAsk         // see Submission.Step
	Drain   chan struct{}    // see Submission.Drain
	Grammar *GrammarReady    // see Submission.Grammar
}

// TokenizeDeps is what a tokenize stage gets.
type TokenizeDeps struct {
	Tokenizer *tokenizer.Tokenizer // nil: prompts must be token ids
	VocabSize int
	// MaxModelLen bounds prompt + max_tokens (0: no bound); text is
	// tokenized with this budget, so an overlong prompt costs no more than
	// a fitting one.
	MaxModelLen int
	Seed        int64 // seeds the requests that bring none, in arrival order
	Responder   *Responder
}

// RegisterTokenize registers a tokenize implementation in r (nil: the
// default registry); see RegisterInsert for options.
func RegisterTokenize[O any](r *pipeline.Registry, name string, defaults O, build func(TokenizeDeps, O) (TokenizeStage, error)) {
	register(r, "tokenize", name, defaults, func(e *Env) TokenizeDeps {
		d := TokenizeDeps{Tokenizer: e.Tokenizer, VocabSize: e.vocabSize(), Seed: e.Seed, Responder: e.Responder}
		if e.Scheduler != nil {
			d.MaxModelLen = e.Scheduler.Config().MaxModelLen
		}
		return d
	}, build, nil)
}

func init() {
	pipeline.Register("requests", "default", func(a pipeline.Args) (*pipeline.Node, error) {
		e, err := env(a)
		if err != nil {
			return nil, err
		}
		return pipeline.NewSource[Submission](e.Requests), nil
	})
	RegisterTokenize(nil, "default", NoOptions{}, func(d TokenizeDeps, _ NoOptions) (TokenizeStage, error) {
		return NewTokenize(d), nil
	})
}

// Tokenize is the built-in tokenize stage.
type Tokenize struct {
	d    TokenizeDeps
	seed *rand.Rand
}

// NewTokenize returns the built-in tokenize stage.
func NewTokenize(d TokenizeDeps) *Tokenize {
	return &Tokenize{d: d, seed: rand.New(rand.NewPCG(uint64(d.Seed), 0x5eed))}
}

// Process validates and encodes a request; other submissions pass.
func (t *Tokenize) Process(_ context.Context, sub Submission) (Admission, error) {
	req := sub.Request
	if req == nil {
		return Admission{Abort: sub.Abort, Step: sub.Step, Drain: sub.Drain, Grammar: sub.Grammar}, nil
	}
	if !t.d.Responder.Has(req.ID) {
		// Aborted while it waited: its answer is out, its abort follows.
		return Admission{}, pipeline.ErrSkip
	}
	seq, err := t.sequence(req)
	if err != nil {
		t.d.Responder.Fail(req.ID, engine.FinishError, err)
		return Admission{}, pipeline.ErrSkip
	}
	return Admission{Seq: seq}, nil
}

func (t *Tokenize) sequence(req *engine.Request) (*engine.Sequence, error) {
	params := req.Params
	if params.Seed == nil {
		s := int64(t.seed.Uint64() >> 1)
		params.Seed = &s
	}
	if err := params.Validate(t.d.VocabSize); err != nil {
		return nil, err
	}
	ids := req.PromptTokenIDs
	if len(ids) == 0 {
		if t.d.Tokenizer == nil {
			return nil, fmt.Errorf("%w: the model has no tokenizer: give the prompt as token ids", engine.ErrInvalidRequest)
		}
		var err error
		if ids, err = t.d.Tokenizer.EncodeWithBudget(req.Prompt, true, t.d.MaxModelLen); err != nil {
			return nil, fmt.Errorf("%w: the prompt: %w (max_model_len %d)", engine.ErrInvalidRequest, err, t.d.MaxModelLen)
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: the prompt is empty", engine.ErrInvalidRequest)
	}
	for i, id := range ids {
		if id < 0 || id >= t.d.VocabSize {
			return nil, fmt.Errorf("%w: prompt token %d is %d, outside the vocabulary [0, %d)", engine.ErrInvalidRequest, i, id, t.d.VocabSize)
		}
	}
	if l := t.d.MaxModelLen; l > 0 && (len(ids) > l || params.MaxTokens > l-len(ids)) {
		return nil, fmt.Errorf("%w: the prompt has %d tokens and max_tokens is %d: together past max_model_len %d",
			engine.ErrInvalidRequest, len(ids), params.MaxTokens, l)
	}
	arrival := req.Arrival
	if arrival.IsZero() {
		arrival = time.Now()
	}
	return engine.NewSequence(req.ID, ids, params, arrival), nil
}
