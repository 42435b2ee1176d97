package stages

import (
	"errors"
	"fmt"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// The sample slot: *ForwardResult -> *SampledStep. A stage of this slot
// draws one token per row of Rows (Samples, in row order; Logprobs when the
// row's params ask) and scores PromptRows (PromptLogprobs). It runs after
// the step before has been post-processed: the loop's lagged edge from
// postprocess delivers that step's *StepOutputs as
// ForwardResult.PreviousOutputs before Process, so penalties, masks and
// stop state include its tokens (a sequence whose input was a placeholder
// finds that token there, see PendingTokens). Its output also travels on
// the lagged edge to forward, whose next step resolves its placeholders
// from Tokens or Samples; a stage that samples on the device may publish
// early (pipeline.LaggedPublisher[*SampledStep]) a *SampledStep with only
// Tokens set.
type SampleStage = pipeline.Stage[*ForwardResult, *SampledStep]

// SampleDeps is what a sample stage gets.
type SampleDeps struct {
	Ops         kernels.Ops
	VocabSize   int
	EOSTokenIDs []int
	Stats       *Stats // nil: not counted
	// Defer (Speculative.VerifyOnDevice) hands a step sampled on the device
	// on before its host samples arrive (SampledStep.Await completes it),
	// and gives a step sampled on the host its tokens in backend memory
	// too, for the verify stage's device half.
	Defer bool
}

// RegisterSample registers a sample implementation in r (nil: the default
// registry).
func RegisterSample[O any](r *pipeline.Registry, name string, defaults O, build func(SampleDeps, O) (SampleStage, error)) {
	register(r, "sample", name, defaults, func(e *Env) SampleDeps {
		var eos []int
		if e.Scheduler != nil {
			eos = e.Scheduler.Config().EOSTokenIDs
		}
		return SampleDeps{Ops: e.Ops, VocabSize: e.vocabSize(), EOSTokenIDs: eos, Stats: e.Stats, Defer: e.Speculative.VerifyOnDevice}
	}, build, func(s SampleStage) *pipeline.Node {
		// The step before's outputs stay on the result (the verify and draft
		// stages read them too): a *StepOutputs holds no step, so keeping it
		// keeps no chain of steps alive.
		return withLagged(s, func(res *ForwardResult, prev *StepOutputs) {
			if prev != nil {
				res.PreviousOutputs = prev
			}
		})
	})
}

// PendingTokens returns, for a sequence whose input this step was a
// placeholder (m.InputFromRow >= 0), the token(s) the step before sampled
// for it, which its metadata (planned before they were known) lacks; nil
// otherwise.
func PendingTokens(res *ForwardResult, m *engine.SequenceMetadata) []int {
	if st := previousRow(res, m); st != nil {
		return st.TokenIDs
	}
	return nil
}

// StepDrafts returns the drafts a speculative decode verifies in this step
// (m.NumDrafts at most; nil for other rows): its known input tokens after
// the first, or, when its inputs were placeholders, the drafts the step
// before proposed (fewer than m.NumDrafts when the drafter proposed fewer:
// the rows past them are padding, verified against nothing).
func StepDrafts(res *ForwardResult, m *engine.SequenceMetadata) []int {
	if m.NumDrafts == 0 {
		return nil
	}
	if !m.Shifted {
		return m.InputTokenIDs[1 : 1+m.NumDrafts]
	}
	st := previousRow(res, m)
	if st == nil {
		return nil
	}
	return st.Drafts[:min(len(st.Drafts), m.NumDrafts)]
}

// previousRow returns the previous step's outcome for m's placeholder
// inputs (nil when m has none).
func previousRow(res *ForwardResult, m *engine.SequenceMetadata) *engine.SampledTokens {
	prev := res.PreviousOutputs
	if m.InputFromRow < 0 || prev == nil || prev.StepID != res.Outputs.StepID-1 || m.InputFromRow >= len(prev.Sampled) {
		return nil
	}
	return &prev.Sampled[m.InputFromRow]
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
	// Tokens, when not nil, holds the same tokens in backend memory (I32
	// [len(Rows)]): a sampler on the device leaves them there for the next
	// step's placeholders, and may publish the step on the lagged edge to
	// forward with only Tokens set, before Samples arrive on the host.
	Tokens kernels.Tensor
	// PromptLogprobs has one entry per PromptRows row.
	PromptLogprobs []engine.TokenLogprobs
	// DeviceVerified, when not nil, is the verify stage's verification on
	// the device (kernels.DraftAccepter), I32 [3, sample rows of the
	// scheduler]: per Verified entry the accepted draft count, the last
	// emitted token and the batch row of that token's hidden state.
	DeviceVerified kernels.Tensor
	// pending completes the step's host half (its Samples, then its
	// Verified) when the sample stage handed the step on before its host
	// samples arrived (Speculative.VerifyOnDevice); see Await.
	pending []func() error

	// With speculative decoding the verify stage sets Verified, and the
	// draft stage Drafts, Next and Accepted (see those slots).
	//
	// Verified has one entry per sample row of the scheduler: the tokens
	// the row emits (accepted drafts, then the target's next token).
	Verified []VerifiedRow
	// Drafts has one entry per sample row: the drafter's proposal for the
	// sequence's next step (up to k tokens; none is allowed).
	Drafts [][]int
	// Next (I32 [rows*(1+k)]) is the next step's input table in backend
	// memory: per sample row, the row's last emitted token then its drafts
	// (padded to k with that token); a placeholder input of the next step
	// reads it (ResolvePlaceholders). Accepted (I32 [rows]) is each row's
	// accepted draft count, by which the next step's layout shifts
	// (ShiftAccepted).
	Next, Accepted kernels.Tensor
	// NextDrafts (host), when not nil, has one entry per sample row: the
	// drafts its entries of Next hold (at most k; the rest are padding).
	// The draft stage sets it with Next, before the next step's forward
	// pass, which then drops the padding rows (TrimDrafts).
	NextDrafts []int
}

// Await completes the step's host half when the sample stage handed it on
// early (Speculative.VerifyOnDevice): it waits for the host samples and
// runs the host work the stages deferred, in order. A stage that reads
// Samples or Verified of such a step calls it first; it is a no-op
// otherwise and after the first call. Not safe for concurrent use.
func (s *SampledStep) Await() error {
	for len(s.pending) > 0 {
		f := s.pending[0]
		s.pending = s.pending[1:]
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// deferHost adds host work that Await runs after what is already pending, or
// runs it now when nothing is.
func (s *SampledStep) deferHost(f func() error) error {
	if len(s.pending) == 0 {
		return f()
	}
	s.pending = append(s.pending, f)
	return nil
}

// VerifiedRow is the outcome of one of the scheduler's sample rows.
type VerifiedRow struct {
	Ref       RowRef
	TokenIDs  []int                   // 1..NumDrafts+1 tokens
	Logprobs  []*engine.TokenLogprobs // per token; nil entries when not asked
	NumDrafts int                     // drafts verified
}

// Outcomes returns the step's outcome per sample row of the scheduler:
// Verified when a verify stage set it, else one token per row of Rows.
func (s *SampledStep) Outcomes() []VerifiedRow {
	if s.Verified != nil {
		return s.Verified
	}
	out := make([]VerifiedRow, len(s.Rows))
	for i, r := range s.Rows {
		out[i] = VerifiedRow{Ref: r, TokenIDs: []int{s.Samples[i].Token}, Logprobs: []*engine.TokenLogprobs{s.Samples[i].Logprobs}}
	}
	return out
}

// hostLogits downloads a step's logits as rows of float32 into buf (grown
// as needed and returned for reuse: sampling runs one step at a time).
func hostLogits(ops kernels.Ops, res *ForwardResult, buf *[]float32) ([][]float32, error) {
	if res.Logits == nil {
		return nil, nil
	}
	flat, err := kernels.ToF32Into(ops, res.Logits, *buf)
	if err != nil {
		return nil, err
	}
	*buf = flat
	shape := res.Logits.Shape()
	rows, vocab := shape[0], shape[1]
	out := make([][]float32, rows)
	for r := range out {
		out[r] = flat[r*vocab : (r+1)*vocab : (r+1)*vocab]
	}
	return out, nil
}

// sampleOnDevice samples every row of a step on the backend, which keeps
// the tokens, and publishes them for the next step's placeholders without
// an upload. rows has one entry per res.Rows.
//
// On a kernels.AsyncDeviceSampler the device tokens are published before
// their host copy arrives, so the next step's forward pass (which resolves
// its placeholders from them on the device) is queued behind the sampling
// while this stage waits for the copy: the device does not idle between
// the two passes for the host's round trip. Without early publishing (a
// speculative step loop: the draft stage feeds the next pass) the async
// path still waits for the copy alone, with the backend free for the other
// stages' work meanwhile.
func sampleOnDevice(d SampleDeps, early func(*SampledStep), dev kernels.DeviceSampler, res *ForwardResult, rows []kernels.SampleRow, timer *sampleTimer) (*SampledStep, error) {
	var (
		tokens kernels.Tensor
		host   []int32
		err    error
	)
	// finish turns the host tokens (or the sampling's error) into the step.
	finish := func(out *SampledStep, host []int32, err error) error {
		if err != nil {
			var rowErr *kernels.SampleRowError
			if errors.As(err, &rowErr) && rowErr.Row >= 0 && rowErr.Row < len(res.Rows) {
				return fmt.Errorf("sample: step %d: request %q: %w", res.Outputs.StepID, res.Rows[rowErr.Row].RequestID, err)
			}
			return fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
		}
		out.Samples = make([]Sample, len(res.Rows))
		for r := range out.Samples {
			out.Samples[r] = Sample{Token: int(host[r])}
		}
		return endSample(d, out, tokens)
	}
	if a, ok := dev.(kernels.AsyncDeviceSampler); ok {
		var fetch func() ([]int32, error)
		timed := timer.begin(d)
		if tokens, fetch, err = a.SampleTokensAsync(res.Logits, rows); err == nil {
			if timed {
				timer.end()
			}
			if early != nil { // the next forward pass can queue behind the sampling now
				early(&SampledStep{ForwardResult: res, Tokens: tokens})
			}
			wait := func() ([]int32, error) {
				host, err := fetch()
				if err == nil && timed {
					o := res.Outputs
					timer.read(d, o.NumPrefillTokens == 0 && o.NumDecodeTokens > 0)
				}
				return host, err
			}
			if d.Defer {
				out := &SampledStep{ForwardResult: res, Tokens: tokens}
				out.pending = []func() error{func() error {
					host, err := wait()
					return finish(out, host, err)
				}}
				return out, nil
			}
			host, err = wait()
		}
	} else {
		tokens, host, err = dev.SampleTokens(res.Logits, rows)
	}
	out := &SampledStep{ForwardResult: res}
	if err := finish(out, host, err); err != nil {
		return nil, err
	}
	return out, nil
}

// startSample starts the step's sample clock.
func startSample(res *ForwardResult) { res.sampleStart = time.Now() }

// beginSample starts the step's sample clock and fetches its logits rows.
func beginSample(d SampleDeps, res *ForwardResult, buf *[]float32) ([][]float32, error) {
	startSample(res)
	rows, err := hostLogits(d.Ops, res, buf)
	if err != nil {
		return nil, fmt.Errorf("sample: step %d: %w", res.Outputs.StepID, err)
	}
	return rows, nil
}

// endSample completes a step: tokens, when not nil, are its tokens in
// backend memory (sampled on the device), kept for the next step's
// placeholders; the step's sample time is recorded (from startSample to
// here: the host path's download and sampling, or the device path's launch
// and wait).
func endSample(d SampleDeps, out *SampledStep, tokens kernels.Tensor) error {
	out.Tokens = tokens
	if d.Stats != nil {
		d.Stats.RecordSample(time.Since(out.sampleStart))
	}
	return nil
}
