package sampling

import "errors"

// Sentinel errors. Errors from this package wrap one of them, or one of
// kernels' for the row's arguments: kernels.ErrSampleParams for a field or
// edit outside its range, kernels.ErrOutOfRange for a token id outside the
// vocabulary (see kernels.SampleRow.Check).
var (
	// ErrInvalidLogits: the row is empty or holds NaN or +Inf.
	ErrInvalidLogits = errors.New("invalid logits")
	// ErrNoCandidates: every token of the row is -Inf after its edits, so
	// there is nothing to sample.
	ErrNoCandidates = errors.New("no token left to sample")
)

// GreedyEpsilon is the temperature under which a request samples greedily
// (argmax), as vLLM's _SAMPLING_EPS: a caller that builds a
// kernels.SampleRow sets Greedy for such a temperature.
const GreedyEpsilon = 1e-5

// TokenLogprob is one entry of a logprobs list.
type TokenLogprob struct {
	Token   int32
	Logprob float32
}

// Result is the outcome of sampling one row.
type Result struct {
	// Token is the sampled token id.
	Token int32
	// Logprob is Token's log-probability under the raw distribution (see
	// Sample); 0 unless the row asks for Logprobs.
	Logprob float32
	// Rank is the number of tokens whose raw logprob is >= Token's (1 for
	// the most likely token; ties count), as vLLM's; 0 unless the row asks
	// for Logprobs.
	Rank int
	// Top holds the row's NumLogprobs most likely tokens of the raw
	// distribution, by logprob descending, ties by lower id. It aliases the
	// Scratch passed to Sample and is overwritten by the next call that
	// uses it.
	Top []TokenLogprob
}
