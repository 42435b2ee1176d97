package kernels

import (
	"errors"
	"fmt"
	"math"
)

// ErrInvalidLogits: a logits row holds NaN or +Inf after its edits, or every
// token of it is -Inf, so no token can be sampled. Device samplers report it
// through a *SampleRowError.
var ErrInvalidLogits = errors.New("invalid logits row")

// ErrSampleParams: a SampleRow field or edit is outside its range.
var ErrSampleParams = errors.New("invalid sample row")

// DeviceSampler is an optional capability of a backend: sampling one token
// per logits row where the logits already are, so that a step's logits
// [rows, vocab] never travel to the host. A backend that implements it
// reproduces the host reference sampler (kernels/sampling, whose package
// doc gives the order of operations) on each row: the edits of the row
// (mask, bias, penalties), then the argmax for a greedy row, or
// temperature, min-p, top-k, top-p and one inverse-CDF draw with the
// Philox uniform of (Seed, Step). Greedy rows give the host's token
// exactly; random rows give it except where the draw falls within
// rounding of the boundary between two tokens (each backend says how its
// arithmetic differs from the host's float64 sums).
//
// Logprobs are not produced: a caller that needs them samples on the host
// (SampleArgs refuses a row whose Logprobs is set).
type DeviceSampler interface {
	// SampleTokens draws one token for each row of logits (F32 [len(rows),
	// vocab]) with the settings of rows[r], and waits for the result. It
	// returns the tokens as a new I32 [len(rows)] tensor in backend memory
	// (for the next step's placeholders, without an upload) and their host
	// copy. The logits are modified in place at the ids of each row's Edits:
	// afterwards they hold the edited values, as the host sampler leaves its
	// row; other entries are unchanged. rows is only read during the call.
	//
	// Errors: arguments that break SampleArgs' contract (ErrShape, ErrDType,
	// ErrSampleParams, ErrOutOfRange); a row with NaN or +Inf after its edits, or with every
	// token at -Inf, as a *SampleRowError wrapping ErrInvalidLogits and
	// naming the first such row.
	SampleTokens(logits Tensor, rows []SampleRow) (tokens Tensor, host []int32, err error)
}

// AsyncDeviceSampler is a DeviceSampler that can hand out the device tokens
// before they are computed, so that work depending on them (the next step's
// forward pass, under zero-overhead scheduling) is queued behind the
// sampling while the host waits for its copy.
type AsyncDeviceSampler interface {
	DeviceSampler
	// SampleTokensAsync queues what SampleTokens does and returns at once:
	// tokens is valid for work queued after the call; fetch waits for the
	// host copy (queued right behind the sampling, so later work does not
	// delay it) and reports SampleTokens' row errors. Call fetch exactly
	// once; a backend may keep at most two fetches outstanding.
	SampleTokensAsync(logits Tensor, rows []SampleRow) (tokens Tensor, fetch func() ([]int32, error), err error)
}

// SampleRow is one logits row's sampling settings: the one argument of
// both the host reference sampler (kernels/sampling.Sample) and the device
// samplers (DeviceSampler), with vLLM's meanings. The caller has already
// resolved the request's params into it (the min-tokens mask, the bias map
// and the penalty history become Edits); Check gives the ranges. The zero
// value is not valid (TopP and RepetitionPenalty 0): start from
// {TopP: 1, RepetitionPenalty: 1}. Samplers only read a row.
type SampleRow struct {
	// Greedy takes the argmax (the lowest id on ties); the filters and the
	// draw are skipped and Temperature is ignored.
	Greedy bool
	// Temperature divides the logits of a random row: finite and > 0 (a
	// caller maps temperatures below the greedy threshold to Greedy).
	Temperature float32
	// TopK keeps the tokens whose logit is at least the K-th largest; <= 0
	// or >= the vocabulary size disables it (-1 is the lowest valid value).
	TopK int
	// TopP keeps the smallest most-likely prefix whose mass reaches TopP;
	// in (0, 1], 1 disables it.
	TopP float32
	// MinP drops tokens less likely than MinP times the most likely one;
	// in [0, 1], 0 disables it.
	MinP float32
	// Seed and Step key the draw: sampling.Uniform(Seed, Step,
	// sampling.DrawSample). Step is the request's output position.
	Seed, Step uint64
	// RepetitionPenalty (> 0, 1: off), PresencePenalty and FrequencyPenalty
	// (finite, 0: off) apply to the edits flagged EditSeen.
	RepetitionPenalty, PresencePenalty, FrequencyPenalty float32
	// Edits change single logits before sampling, at most one per token id.
	Edits []LogitEdit
	// Allowed, when not nil, is a packed bitmask of the tokens the row may
	// take (structured output): token t is allowed when Allowed[t/32] >>
	// (t%32) & 1 is set; every other logit becomes -Inf before the edits.
	// It holds at least (vocab+31)/32 words. nil allows every token.
	Allowed []uint32
	// Logprobs asks the host sampler for the sampled token's logprob and
	// rank under the raw row (before the edits and the temperature), and
	// NumLogprobs (>= 0; > 0 only with Logprobs) asks for that many most
	// likely tokens (clamped to the vocabulary). Device samplers produce no
	// logprobs: SampleArgs rejects a row with Logprobs set.
	Logprobs    bool
	NumLogprobs int
}

// EditFlags say what a LogitEdit does; they combine.
type EditFlags uint32

const (
	// EditMask sets the logit to -Inf (min_tokens: the stop and EOS ids).
	EditMask EditFlags = 1 << iota
	// EditBias adds LogitEdit.Bias (logit_bias).
	EditBias
	// EditSeen marks a token of the prompt or the output: when the row's
	// penalties are active it gets the repetition penalty and, with
	// Count > 0, the frequency and presence penalties.
	EditSeen
)

// LogitEdit is what happens to one token's logit before sampling, in the
// host sampler's order and float32 arithmetic: mask (x = -Inf), bias
// (x += Bias), then, for a seen token of a row whose penalties are active,
// repetition (x /= penalty when x > 0, else x *= penalty), frequency
// (x -= FrequencyPenalty * Count) and presence (x -= PresencePenalty), the
// last two only when Count > 0.
type LogitEdit struct {
	Token int32     // in [0, vocab)
	Count int32     // occurrences of Token in the output so far (>= 0)
	Bias  float32   // finite; read with EditBias
	Flags EditFlags // a combination of EditMask, EditBias and EditSeen
}

// Penalized reports whether the row's penalties change the logits of its
// seen tokens (the host sampler skips the history otherwise).
func (r *SampleRow) Penalized() bool {
	return r.RepetitionPenalty != 1 || r.PresencePenalty != 0 || r.FrequencyPenalty != 0
}

// SampleRowError reports the first logits row that cannot be sampled.
type SampleRowError struct {
	Row    int    // the row of the call
	Reason string // "NaN", "+Inf" or "all -Inf"
	Index  int    // the lowest token id holding Reason's value (-1 for all -Inf)
}

func (e *SampleRowError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("sample row %d: every logit is -Inf after its edits: %v", e.Row, ErrInvalidLogits)
	}
	return fmt.Sprintf("sample row %d: logit %d is %s after its edits: %v", e.Row, e.Index, e.Reason, ErrInvalidLogits)
}

// Unwrap returns ErrInvalidLogits.
func (e *SampleRowError) Unwrap() error { return ErrInvalidLogits }

// SampleArgs checks SampleTokens' arguments and returns the vocabulary
// size: logits F32 [len(rows), vocab] with vocab > 0, each row valid
// (SampleRow.Check) and asking for no logprobs (a device sampler produces
// none). Errors name the backend, the row and the field, and wrap ErrShape
// or ErrDType (logits), ErrSampleParams or ErrOutOfRange (a token id
// outside the vocabulary). seen is scratch for the duplicate check: when
// it holds at least vocab entries, all false, it is used and left all
// false; otherwise one is allocated (vocab bytes) if any row has edits.
// Cost: O(len(rows) + total edits).
func SampleArgs(backend string, logits Tensor, rows []SampleRow, seen []bool) (vocab int, err error) {
	const op = "sample"
	if err = CheckShape(backend, op, "logits", logits, []int{len(rows), -1}, F32); err != nil {
		return 0, err
	}
	vocab = logits.Shape()[1]
	if vocab <= 0 {
		return 0, fmt.Errorf("%s: %s: logits is %v: the vocabulary is empty: %w", backend, op, logits, ErrShape)
	}
	if len(seen) < vocab {
		numEdits := 0
		for i := range rows {
			numEdits += len(rows[i].Edits)
		}
		if numEdits > 0 {
			seen = make([]bool, vocab)
		}
	}
	for r := range rows {
		err := rows[r].Check(vocab, seen)
		if err == nil && rows[r].Logprobs {
			err = fmt.Errorf("logprobs are not produced on the device (sample the row on the host): %w", ErrSampleParams)
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %s: row %d: %w", backend, op, r, err)
		}
	}
	return vocab, nil
}

// Check validates the row for a vocabulary of vocab tokens (> 0): each
// field in its range (see the field docs); each edit's token id in
// [0, vocab) and distinct within the row, its count >= 0, its bias finite
// when EditBias is set, and no unknown flag. It is the one check of a
// sampling row, shared by the host sampler and the device samplers
// (through SampleArgs); the ranges of user-facing values are checked
// before, when a request is admitted. The first violation is returned,
// naming the field, wrapping ErrSampleParams or ErrOutOfRange (a token id
// outside the vocabulary). seen is scratch for the duplicate check: when
// it holds at least vocab entries, all false, it is used and left all
// false; otherwise, if the row has edits, one is allocated (vocab bytes).
// Cost: O(len(Edits)).
func (r *SampleRow) Check(vocab int, seen []bool) error {
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	bad := func(format string, args ...any) error {
		return fmt.Errorf(format+": %w", append(args, ErrSampleParams)...)
	}
	switch {
	case vocab <= 0:
		return bad("vocabulary size must be > 0, got %d", vocab)
	case !r.Greedy && (!finite(r.Temperature) || r.Temperature <= 0):
		return bad("temperature of a random row must be finite and > 0, got %v", r.Temperature)
	case r.TopK < -1:
		return bad("top_k must be -1 or 0 (disabled) or >= 1, got %d", r.TopK)
	case !finite(r.TopP) || r.TopP <= 0 || r.TopP > 1:
		return bad("top_p must be in (0, 1], got %v", r.TopP)
	case !finite(r.MinP) || r.MinP < 0 || r.MinP > 1:
		return bad("min_p must be in [0, 1], got %v", r.MinP)
	case !finite(r.RepetitionPenalty) || r.RepetitionPenalty <= 0:
		return bad("repetition_penalty must be finite and > 0, got %v", r.RepetitionPenalty)
	case !finite(r.PresencePenalty):
		return bad("presence_penalty must be finite, got %v", r.PresencePenalty)
	case !finite(r.FrequencyPenalty):
		return bad("frequency_penalty must be finite, got %v", r.FrequencyPenalty)
	case r.NumLogprobs < 0:
		return bad("num_logprobs must be >= 0, got %d", r.NumLogprobs)
	case r.NumLogprobs > 0 && !r.Logprobs:
		return bad("num_logprobs is %d but logprobs is off", r.NumLogprobs)
	case r.Allowed != nil && len(r.Allowed) < (vocab+31)/32:
		return bad("allowed mask has %d words, a vocabulary of %d needs %d", len(r.Allowed), vocab, (vocab+31)/32)
	}
	if len(r.Edits) == 0 {
		return nil
	}
	if len(seen) < vocab {
		seen = make([]bool, vocab)
	}
	var err error
	n := 0
	for i, e := range r.Edits {
		if e.Token < 0 || int(e.Token) >= vocab {
			err = fmt.Errorf("edits[%d]: token id %d not in [0, %d): %w", i, e.Token, vocab, ErrOutOfRange)
			break
		}
		if seen[e.Token] {
			err = bad("edits[%d]: token id %d appears twice", i, e.Token)
			break
		}
		seen[e.Token] = true
		n = i + 1
		switch {
		case e.Count < 0:
			err = bad("edits[%d]: count must be >= 0, got %d", i, e.Count)
		case e.Flags&EditBias != 0 && !finite(e.Bias):
			err = bad("edits[%d]: bias must be finite, got %v", i, e.Bias)
		case e.Flags&^(EditMask|EditBias|EditSeen) != 0:
			err = bad("edits[%d]: unknown flags %#x", i, uint32(e.Flags))
		}
		if err != nil {
			break
		}
	}
	for _, e := range r.Edits[:n] {
		seen[e.Token] = false
	}
	return err
}

// GreedyRow is the sample row of a plain argmax: greedy, nothing edited
// (the neutral values of the other settings, which SampleRow.Check wants).
func GreedyRow() SampleRow {
	return SampleRow{Greedy: true, Temperature: 1, TopP: 1, RepetitionPenalty: 1}
}

// GreedyTokens returns the highest-scoring token of each of the first n
// rows of logits (F32 [R, vocab], R >= n), the lowest id on ties: on the
// device when the backend samples there (a DeviceSampler; only the tokens
// come back), else from a host copy of the rows. Drafters use it for their
// greedy proposals. Cost: one sampling call or one download of n rows.
func GreedyTokens(ops Ops, logits Tensor, n int) ([]int, error) {
	rows, err := ops.Rows(logits, 0, n)
	if err != nil {
		return nil, err
	}
	out := make([]int, n)
	if dev, ok := ops.(DeviceSampler); ok {
		greedy := make([]SampleRow, n)
		for i := range greedy {
			greedy[i] = GreedyRow()
		}
		_, host, err := dev.SampleTokens(rows, greedy)
		if err != nil {
			return nil, err
		}
		for i, t := range host {
			out[i] = int(t)
		}
		return out, nil
	}
	flat, err := ToF32(ops, rows)
	if err != nil {
		return nil, err
	}
	vocab := logits.Shape()[1]
	for r := range out {
		row := flat[r*vocab : (r+1)*vocab]
		best := 0
		for t, x := range row {
			if x > row[best] {
				best = t
			}
		}
		out[r] = best
	}
	return out, nil
}
