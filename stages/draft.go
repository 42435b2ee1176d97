package stages

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/spec"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// The draft slot (speculative decoding): *SampledStep -> *SampledStep,
// after verify and before postprocess. Drafting after verification means
// a drafter sees what the step emitted (and, for MTP, the target's hidden
// states of the step), so its drafts follow the sequence's real last
// token, and the next step can verify them in the same forward pass that
// computes that token's KV. A stage of this slot sets, for every entry of
// SampledStep.Verified, the drafts of the sequence's next step
// (SampledStep.Drafts, at most k each, none allowed), and leaves in backend
// memory the next step's input table and accepted counts (Next, Accepted).
// Its output is the loop's lagged input of the forward slot: with ZOS the
// next step, planned before these drafts existed, reads its inputs and
// its shift from them on the device. Drafters implement Drafter and are
// registered with RegisterDraft, which supplies the rest.
type DraftStage = pipeline.Stage[*SampledStep, *SampledStep]

// Drafter proposes the drafts of each sequence's next step.
type Drafter interface {
	// Propose returns, for each entry of step.Verified, up to k tokens to
	// follow its TokenIDs (SequenceHistory gives the whole sequence). It
	// runs once per step, in step order, before the next step's forward
	// pass.
	Propose(ctx context.Context, step *SampledStep) ([][]int, error)
}

// recordDraft records a model drafter's passes since start in s
// (Stats.RecordDraft); deferred where the passes begin.
func recordDraft(s *Stats, start time.Time) { s.RecordDraft(time.Since(start)) }

// DraftDeps is what a drafter gets.
type DraftDeps struct {
	Ops         kernels.Ops
	Model       models.Model // the target
	Speculative Speculative
	BlockSize   int
	NumBlocks   int
	MaxModelLen int
	// CUDAGraph is the engine's graph capture (config cuda_graph): a
	// drafter may capture its own passes for the same sizes.
	CUDAGraph CUDAGraph
	Stats     *Stats
}

// RegisterDraft registers a drafter in r (nil: the default registry) as an
// implementation of the draft slot.
func RegisterDraft[O any](r *pipeline.Registry, name string, defaults O, build func(DraftDeps, O) (Drafter, error)) {
	register(r, "draft", name, defaults, func(e *Env) DraftDeps {
		d := DraftDeps{Ops: e.Ops, Model: e.Model, Speculative: e.Speculative, Stats: e.Stats, CUDAGraph: e.CUDAGraph}
		if e.Cache != nil {
			d.BlockSize, d.NumBlocks = e.Cache.BlockSize, e.Cache.NumBlocks
		}
		if e.Scheduler != nil {
			d.MaxModelLen = e.Scheduler.Config().MaxModelLen
		}
		return d
	}, func(d DraftDeps, o O) (DraftStage, error) {
		p, err := build(d, o)
		if err != nil {
			return nil, err
		}
		return &draftStage{d: d, drafter: p}, nil
	}, nil)
}

// DeviceDrafter is a Drafter that can leave its drafts in backend memory,
// so that the next step's forward pass is queued before they reach the
// host.
type DeviceDrafter interface {
	Drafter
	// ProposeOnDevice queues the drafter's work for step and returns
	// without waiting for it: what Propose returns, as DeviceDrafts. A
	// drafter that must read part of its own work back to decide its
	// drafts' lengths (DSpark's confidence gate) waits for that work only,
	// never for the step's host samples.
	ProposeOnDevice(ctx context.Context, step *SampledStep) (DeviceDrafts, error)
}

// DeviceVerifiedDrafter is a DeviceDrafter that can draft from the
// verify stage's device half (SampledStep.DeviceVerified) before the
// step's host samples and Verified exist, so that the next step's forward
// pass is queued while the host still waits for this step's tokens.
type DeviceVerifiedDrafter interface {
	DeviceDrafter
	// ProposeFromDevice is ProposeOnDevice reading the step's outcome
	// (accepted counts, last tokens, the rows of their hidden states)
	// from step.DeviceVerified and its sampled tokens from step.Tokens;
	// it must not read Samples or Verified. ok false: not for this step
	// (the stage then waits for the host and calls ProposeOnDevice).
	ProposeFromDevice(ctx context.Context, step *SampledStep) (dd DeviceDrafts, ok bool, err error)
}

// DeviceDrafts are drafts in backend memory: At[r][j] is the index in
// Tokens (I32) of draft j of entry r of SampledStep.Verified.
type DeviceDrafts struct {
	Tokens kernels.Tensor // nil when no entry has a draft
	At     [][]int32
}

// Host brings the drafts to the host (one download).
func (dd DeviceDrafts) Host(ops kernels.Ops) ([][]int, error) {
	fetch, err := dd.fetch(ops)
	if err != nil {
		return nil, err
	}
	return fetch()
}

// fetch starts bringing the drafts to the host behind the queued work.
func (dd DeviceDrafts) fetch(ops kernels.Ops) (func() ([][]int, error), error) {
	out := make([][]int, len(dd.At))
	if dd.Tokens == nil {
		return func() ([][]int, error) { return out, nil }, nil
	}
	fetch, err := kernels.FetchI32Async(ops, dd.Tokens)
	if err != nil {
		return nil, err
	}
	return func() ([][]int, error) {
		all, err := fetch()
		if err != nil {
			return nil, err
		}
		for r, at := range dd.At {
			out[r] = make([]int, len(at))
			for j, i := range at {
				if int(i) >= len(all) {
					return nil, fmt.Errorf("draft %d of row %d at %d: %d drafts: %w", j, r, i, len(all), kernels.ErrOutOfRange)
				}
				out[r][j] = int(all[i])
			}
		}
		return out, nil
	}, nil
}

// draftStage runs a Drafter and publishes its drafts for the next step.
// With a DeviceDrafter it publishes the next step's inputs early, on the
// lagged edge to forward, before the drafts reach the host: the device
// then runs the drafter and the next forward pass back to back while the
// host waits for the drafts.
type draftStage struct {
	d       DraftDeps
	drafter Drafter
	early   func(*SampledStep)
	// tables are the upload buffers of the next-input tables, by step id:
	// a step's table is read by the next step's forward pass only, queued
	// before this stage runs for the step after that, so a buffer comes
	// back three steps later (no allocation a step). The upload is
	// skipped when the buffer already holds the table arrays
	// (kernels.UploadI32Held): the kernels write only the table, every
	// entry of it, before anything reads it.
	tables [3]kernels.HeldI32
}

// uploadTable uploads a step's table arrays into the step's buffer.
func (s *draftStage) uploadTable(step *SampledStep, host []int32) (kernels.Tensor, error) {
	return kernels.UploadI32Held(s.d.Ops, &s.tables[int(step.Outputs.StepID)%len(s.tables)], host)
}

// PublishLagged keeps the graph's early publishing (pipeline.LaggedPublisher).
func (s *draftStage) PublishLagged(p func(*SampledStep)) { s.early = p }

func (s *draftStage) Process(ctx context.Context, step *SampledStep) (*SampledStep, error) {
	if DraftFree(step) {
		return s.draftFree(step)
	}
	if dv, ok := s.drafter.(DeviceVerifiedDrafter); ok && step.DeviceVerified != nil {
		done, err := s.fromDevice(ctx, dv, step)
		if err != nil {
			return nil, fmt.Errorf("draft: step %d: %w", step.Outputs.StepID, err)
		}
		if done {
			return step, nil
		}
	}
	if err := step.Await(); err != nil {
		return nil, err
	}
	if step.Verified == nil {
		return nil, fmt.Errorf("draft: step %d: not verified (the verify slot must come before draft)", step.Outputs.StepID)
	}
	id := step.Outputs.StepID
	var drafts [][]int
	var dd DeviceDrafts
	dev, onDevice := s.drafter.(DeviceDrafter)
	var err error
	if onDevice {
		dd, err = dev.ProposeOnDevice(ctx, step)
	} else {
		drafts, err = s.drafter.Propose(ctx, step)
	}
	if err != nil {
		return nil, fmt.Errorf("draft: step %d: %w", id, err)
	}
	count := func(r int) int {
		if onDevice {
			return len(dd.At[r])
		}
		return len(drafts[r])
	}
	n := len(drafts)
	if onDevice {
		n = len(dd.At)
	}
	if n != len(step.Verified) {
		return nil, fmt.Errorf("draft: step %d: %d drafts for %d sample rows", id, n, len(step.Verified))
	}
	k := s.d.Speculative.NumSpeculativeTokens
	stride := 1 + k
	// The next step's input table: per row its last emitted token, then its
	// drafts (device drafts land through fromRow), padded with that token.
	next := make([]int32, n*stride)
	fromRow := make([]int32, n*stride)
	accepted := make([]int32, n)
	step.NextDrafts = make([]int, n)
	for r, v := range step.Verified {
		step.NextDrafts[r] = min(count(r), k)
		if !onDevice && len(drafts[r]) > k {
			drafts[r] = drafts[r][:k]
		}
		last := v.TokenIDs[len(v.TokenIDs)-1]
		row := next[r*stride : (r+1)*stride]
		for j := range row {
			row[j] = int32(last)
			fromRow[r*stride+j] = -1
			if j > 0 && j <= min(count(r), k) {
				if onDevice {
					fromRow[r*stride+j] = dd.At[r][j-1]
				} else {
					row[j] = int32(drafts[r][j-1])
				}
			}
		}
		accepted[r] = int32(len(v.TokenIDs) - 1)
	}
	if len(next) == 0 {
		step.Drafts = make([][]int, n)
		return step, nil
	}
	host := append(next, accepted...)
	if onDevice && dd.Tokens != nil {
		host = append(host, fromRow...)
	}
	both, err := s.uploadTable(step, host)
	if err == nil {
		if step.Next, err = s.d.Ops.Rows(both, 0, len(next)); err == nil {
			step.Accepted, err = s.d.Ops.Rows(both, len(next), len(next)+len(accepted))
		}
	}
	if err == nil && onDevice && dd.Tokens != nil {
		var from kernels.Tensor
		if from, err = s.d.Ops.Rows(both, len(next)+len(accepted), len(host)); err == nil {
			err = s.d.Ops.ResolvePlaceholders(step.Next, from, dd.Tokens)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("draft: step %d: %w", id, err)
	}
	if !onDevice {
		step.Drafts = drafts
		return step, nil
	}
	fetch, err := dd.fetch(s.d.Ops)
	if err != nil {
		return nil, fmt.Errorf("draft: step %d: %w", id, err)
	}
	if s.early != nil {
		s.early(&SampledStep{ForwardResult: step.ForwardResult, Next: step.Next, Accepted: step.Accepted, NextDrafts: step.NextDrafts})
	}
	if step.Drafts, err = fetch(); err != nil {
		return nil, fmt.Errorf("draft: step %d: %w", id, err)
	}
	for r := range step.Drafts {
		if len(step.Drafts[r]) > k {
			step.Drafts[r] = step.Drafts[r][:k]
		}
	}
	return step, nil
}

// draftFree passes on a step planned with speculation off (DraftFree):
// no drafts, no input table, no accepted counts; the next step reads its
// placeholders from the step's sampled tokens, as without speculation, so
// the step is published as soon as they are queued (with zero-overhead
// scheduling), before its host samples arrive. Cost: no backend call.
func (s *draftStage) draftFree(step *SampledStep) (*SampledStep, error) {
	if s.early != nil && step.Tokens != nil {
		s.early(&SampledStep{ForwardResult: step.ForwardResult, Tokens: step.Tokens})
	}
	if err := step.Await(); err != nil {
		return nil, err
	}
	if step.Verified == nil {
		return nil, fmt.Errorf("draft: step %d: not verified (the verify slot must come before draft)", step.Outputs.StepID)
	}
	step.Drafts = make([][]int, len(step.Verified))
	return step, nil
}

// fromDevice drafts from the verify stage's device half: it builds the
// next step's input table on the device (each row's last emitted token
// from DeviceVerified, then its drafts, padded with that token),
// publishes it early with the device accepted counts, then waits for the
// host half (SampledStep.Await) and checks that the host verification
// agrees with the device's. done false: the drafter declined the step.
func (s *draftStage) fromDevice(ctx context.Context, dv DeviceVerifiedDrafter, step *SampledStep) (bool, error) {
	dd, ok, err := dv.ProposeFromDevice(ctx, step)
	if err != nil || !ok {
		return false, err
	}
	ops := s.d.Ops
	n := len(dd.At)
	if n != step.Outputs.NumSampleRows {
		return false, fmt.Errorf("%d drafts for %d sample rows", n, step.Outputs.NumSampleRows)
	}
	k := s.d.Speculative.NumSpeculativeTokens
	stride := 1 + k
	if n == 0 {
		return false, nil
	}
	// One upload: the table (overwritten everywhere), then where each entry
	// takes its last token from (emitted) and its drafts from (dd.Tokens).
	host := make([]int32, 3*n*stride)
	fromLast, fromDraft := host[n*stride:2*n*stride], host[2*n*stride:]
	step.NextDrafts = make([]int, n)
	for r := range n {
		step.NextDrafts[r] = min(len(dd.At[r]), k)
		for j := range stride {
			i := r*stride + j
			fromLast[i], fromDraft[i] = int32(r), -1
			if j > 0 && j <= min(len(dd.At[r]), k) {
				fromLast[i], fromDraft[i] = -1, dd.At[r][j-1]
			}
		}
	}
	all, err := s.uploadTable(step, host)
	if err != nil {
		return false, err
	}
	part := func(i int) (kernels.Tensor, error) { return ops.Rows(all, i*n*stride, (i+1)*n*stride) }
	var lastT, draftT, emitted kernels.Tensor
	if step.Next, err = part(0); err == nil {
		if lastT, err = part(1); err == nil {
			draftT, err = part(2)
		}
	}
	if err == nil {
		if emitted, err = ops.Rows(step.DeviceVerified, 1, 2); err == nil {
			emitted, err = ops.Reshape(emitted, n)
		}
	}
	if err == nil {
		if step.Accepted, err = ops.Rows(step.DeviceVerified, 0, 1); err == nil {
			step.Accepted, err = ops.Reshape(step.Accepted, n)
		}
	}
	if err == nil {
		err = ops.ResolvePlaceholders(step.Next, lastT, emitted)
	}
	if err == nil && dd.Tokens != nil {
		err = ops.ResolvePlaceholders(step.Next, draftT, dd.Tokens)
	}
	if err != nil {
		return false, err
	}
	fetchDrafts, err := dd.fetch(ops)
	if err != nil {
		return false, err
	}
	fetchVerified, err := kernels.FetchI32Async(ops, step.DeviceVerified)
	if err != nil {
		return false, err
	}
	if s.early != nil {
		s.early(&SampledStep{ForwardResult: step.ForwardResult, Next: step.Next, Accepted: step.Accepted, NextDrafts: step.NextDrafts})
	}
	if err := step.Await(); err != nil {
		return false, err
	}
	dev, err := fetchVerified()
	if err != nil {
		return false, err
	}
	if step.Drafts, err = fetchDrafts(); err != nil {
		return false, err
	}
	for r, v := range step.Verified {
		if a := len(v.TokenIDs) - 1; int(dev[r]) != a || int(dev[n+r]) != v.TokenIDs[a] {
			return false, fmt.Errorf("sample row %d: the device verified %d drafts ending in token %d, the host %d ending in %d", r, dev[r], dev[n+r], a, v.TokenIDs[a])
		}
		if len(step.Drafts[r]) > k {
			step.Drafts[r] = step.Drafts[r][:k]
		}
	}
	return true, nil
}

// Start starts the drafter when it has device work to do before the loop
// (graph capture).
func (s *draftStage) Start(ctx context.Context) error {
	if st, ok := s.drafter.(pipeline.Starter); ok {
		return st.Start(ctx)
	}
	return nil
}

// Close closes the drafter when it holds resources.
func (s *draftStage) Close() error {
	if c, ok := s.drafter.(pipeline.Closer); ok {
		return c.Close()
	}
	return nil
}

// SequenceHistory returns every token of v's sequence after the step: the
// tokens its metadata knew, the step before's (PendingTokens) and the ones
// v emits. Cost: one copy of the sequence's tokens.
func SequenceHistory(step *SampledStep, v VerifiedRow) []int {
	m := v.Ref.Meta
	known := m.TokenIDs
	if v.Ref.SeqID != m.SeqID {
		known = known[:m.NumPromptTokens] // a fork: its parent's prompt
	}
	return slices.Concat(known, PendingTokens(step.ForwardResult, m), v.TokenIDs)
}

// rowPosition returns the position of the token that v's sequence emitted
// last in this step, minus one: the position of the row whose output is
// that token (the device's, shift included).
func rowPosition(step *SampledStep, v VerifiedRow) int {
	return samplePosition(step, v.Ref.Meta) + len(v.TokenIDs) - 1
}

// samplePosition is the position of m's first sampling row (the device's,
// shift included): rowPosition with no draft accepted.
func samplePosition(step *SampledStep, m *engine.SequenceMetadata) int {
	pos := m.PosStart + m.SeqlenQ - 1 - m.NumDrafts
	if m.Shifted {
		if prev := PendingTokens(step.ForwardResult, m); len(prev) > 0 {
			pos += len(prev) - 1
		}
	}
	return pos
}

// tokenRows returns the first batch row of each of step's sequences.
func tokenRows(step *SampledStep) []int {
	first := make([]int, len(step.Seqs)+1)
	for i := range step.Seqs {
		first[i+1] = first[i] + step.Seqs[i].SeqlenQ
	}
	return first
}

func init() {
	RegisterDraft(nil, "ngram", NoOptions{}, func(d DraftDeps, _ NoOptions) (Drafter, error) {
		return &ngramDrafter{d: d}, nil
	})
	RegisterDraft(nil, "mtp", NoOptions{}, func(d DraftDeps, _ NoOptions) (Drafter, error) {
		return newMTPDrafter(d)
	})
	RegisterDraft(nil, "draft_model", NoOptions{}, func(d DraftDeps, _ NoOptions) (Drafter, error) {
		return newModelDrafter(d)
	})
}

// draftLimit is how many drafts a drafter proposes after step: the limit
// the step was planned with (the adaptive controller's choice; 0 while
// SpecDisableBatchSize sequences run: the scheduler decides, so drafter
// and scheduler never disagree), on the guess that the next step's is the
// same. At 0 a drafter skips the step; one with its own KV (MTP, a
// draft model) then leaves the step's positions unwritten: drafting off
// costs nothing, and once drafts are back on its attention reads stale
// entries there, which only lowers how often its drafts are accepted (the
// adaptive controller measures that too); verification stays lossless.
func draftLimit(d DraftDeps, step *SampledStep) int {
	return min(step.Outputs.DraftLimit, d.Speculative.NumSpeculativeTokens)
}

// chainRow is one sequence that drafts by running a model one token at a
// time: its next input token at position pos, with the metadata that
// gives its block table.
type chainRow struct {
	out       int // its entry in step.Verified
	meta      *engine.SequenceMetadata
	pos       int
	token     int
	hiddenRow int // the row of the drafter's last output that feeds it (MTP)
}

// chainBatch lays rows out as a decode batch (one token each) and uploads
// it. A row whose position falls outside its block table or the context
// is dropped: rows keeps the ones laid out.
func chainBatch(d DraftDeps, rows []chainRow) (*models.ForwardBatch, []chainRow, error) {
	kept := rows[:0]
	for _, r := range rows {
		if chainFits(d, r.meta, r.pos) {
			kept = append(kept, r)
		}
	}
	if len(kept) == 0 {
		return nil, nil, nil
	}
	b, err := chainBatchAt(d, kept, 0)
	return b, kept, err
}

// greedyRow is the sample row of a greedy draft (kernels.GreedyRow).
func greedyRow() kernels.SampleRow { return kernels.GreedyRow() }

// greedyTokens is kernels.GreedyTokens: the argmax of each of the first n
// rows of logits.
func greedyTokens(ops kernels.Ops, logits kernels.Tensor, n int) ([]int, error) {
	return kernels.GreedyTokens(ops, logits, n)
}

// ngramDrafter is prompt lookup (vLLM's ngram method, spec.PromptLookup):
// the tokens that followed the earliest earlier occurrence of the longest
// recurring suffix of the sequence (prompt and output), n in
// [prompt_lookup_min, prompt_lookup_max]. Host only; it writes no KV.
type ngramDrafter struct{ d DraftDeps }

func (n *ngramDrafter) Propose(_ context.Context, step *SampledStep) ([][]int, error) {
	sp := n.d.Speculative
	out := make([][]int, len(step.Verified))
	k := draftLimit(n.d, step)
	if k == 0 {
		return out, nil
	}
	for r, v := range step.Verified {
		out[r] = spec.PromptLookup(SequenceHistory(step, v), sp.PromptLookupMin, sp.PromptLookupMax, k)
	}
	return out, nil
}
