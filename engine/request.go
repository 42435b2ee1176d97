package engine

import "time"

// Request is one generation request as it enters the step loop.
type Request struct {
	// ID identifies the request for Abort and in outputs; unique among live requests.
	ID string
	// Prompt is the text to complete; ignored when PromptTokenIDs is set.
	Prompt string
	// PromptTokenIDs, when non-empty, are used as the prompt as they are.
	PromptTokenIDs []int
	Params         SamplingParams
	Arrival        time.Time
	// OnOutput receives every RequestOutput of the request, in order, from
	// the engine's post-processing goroutine; it must not block (queue the
	// output and return). The last output of each of the n sequences has
	// Finished set.
	OnOutput func(RequestOutput)
}

// TokenLogprob is one candidate token and its log-probability.
type TokenLogprob struct {
	TokenID int
	Logprob float32
}

// TokenLogprobs are the log-probabilities reported for one position: the
// chosen token's and the top candidates'.
type TokenLogprobs struct {
	TokenID int
	Logprob float32
	Top     []TokenLogprob
}

// RequestOutput is an increment of one output sequence of a request: the
// text and tokens added since the previous output of that sequence.
type RequestOutput struct {
	RequestID string
	// Index is the sequence's index among the request's n outputs.
	Index int
	// Text and TokenIDs are this output's increment. Text never ends in the
	// middle of a multi-byte character and stops before a matched stop string.
	Text     string
	TokenIDs []int
	// Logprobs has one entry per token in TokenIDs when the request asked for them.
	Logprobs []TokenLogprobs
	// PromptTokenIDs (and PromptLogprobs, when asked) come with the first
	// output of the request's first sequence. PromptLogprobs[i] scores prompt
	// token i+1 (the first prompt token has none, as in vLLM's leading None).
	PromptTokenIDs []int
	PromptLogprobs []TokenLogprobs
	// NumCachedTokens counts prompt tokens served by the prefix cache.
	NumCachedTokens int

	Finished     bool
	FinishReason FinishReason
	// StopReason is the stop string or stop token that ended the sequence, if any.
	StopReason string
	// Err explains FinishError.
	Err error

	ArrivalTime time.Time
	// ScheduledTime is when the sequence's first step was planned (its
	// queue time is ScheduledTime - ArrivalTime); set with the first token.
	ScheduledTime  time.Time
	FirstTokenTime time.Time // when the sequence's first token was emitted
	FinishTime     time.Time // set with Finished
}
