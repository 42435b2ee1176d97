package stages

import (
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// ScheduledStep is the scheduler's plan for one step (schedule -> prepare).
type ScheduledStep struct {
	Outputs *engine.SchedulerOutputs
	Seqs    []engine.SequenceMetadata
	Planned time.Time
}

// RowRef says which sequence a logits row samples for.
type RowRef struct {
	Meta      *engine.SequenceMetadata
	SeqID     engine.SeqID
	Index     int // the sequence's index among its request's n outputs
	RequestID string
}

// PreparedStep is a step's input in backend memory (prepare -> forward).
type PreparedStep struct {
	*ScheduledStep
	Batch *models.ForwardBatch
	// SampleRows (I32) are the token rows whose logits are computed: one per
	// sample row of the step (a forked sequence repeats its parent's row),
	// then one per PromptRows entry.
	SampleRows kernels.Tensor
	Rows       []RowRef
	// PromptRows are extra logits rows, after the sample rows, that score
	// prompt tokens for prompt_logprobs.
	PromptRows []PromptRow
	// FromRow (I32 [num_tokens]) is set when inputs are placeholders: the
	// previous step's sample row each input comes from, -1 for known ones.
	FromRow kernels.Tensor
}

// PromptRow is a row whose logits score the prompt token that follows it.
type PromptRow struct {
	Meta *engine.SequenceMetadata
	Next int // the prompt token the row scores
}

// ForwardResult holds the logits of a step's sample rows (forward -> sample).
type ForwardResult struct {
	*PreparedStep
	Logits kernels.Tensor // F32 [len(Rows)+len(PromptRows), vocab]

	sampleStart time.Time // when sampling began, for Stats.SampleNanos
}

// Sample is the outcome of one sample row.
type Sample struct {
	Token    int
	Logprobs *engine.TokenLogprobs // nil unless the request asked for logprobs
}

// SampledStep carries the sampled tokens (sample -> postprocess).
type SampledStep struct {
	*ForwardResult
	Samples []Sample // one per row of Rows
	// PromptLogprobs has one entry per PromptRows row.
	PromptLogprobs []engine.TokenLogprobs
}

// StepOutputs is what post-processing reports back to the scheduler (the
// loop's feedback edge).
type StepOutputs struct {
	StepID   engine.StepID
	Finished []engine.FinishedSequence
	// NumTokens counts the tokens appended by the step.
	NumTokens int
	Done      time.Time
	// Outputs are the request outputs the step emitted (kept only when the
	// loop is driven by a StepGate).
	Outputs []engine.RequestOutput
}
