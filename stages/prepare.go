package stages

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// The prepare slot: *ScheduledStep -> *PreparedStep. A stage of this slot
// lays a step out as the model's flat batch in backend memory (input ids,
// positions, slot mapping, block tables, cu_seqlens), lists the rows that
// sample (Rows, SampleRows) and the prompt rows scored for prompt_logprobs,
// and marks inputs that are placeholders for tokens of the step before
// (FromRow; see ResolvePlaceholders). It must not wait for the step
// before: with ZOS it runs while that step is still being sampled.
type PrepareStage = pipeline.Stage[*ScheduledStep, *PreparedStep]

// PrepareDeps is what a prepare stage gets.
type PrepareDeps struct {
	Ops       kernels.Ops
	BlockSize int // tokens per KV block
	NumBlocks int // blocks in the KV cache (bounds the block tables)
	// NumSpeculativeTokens is the scheduler's k (0: no speculative
	// decoding): with it, placeholder inputs index the previous step's
	// next-input table, 1+k entries a sample row.
	NumSpeculativeTokens int
	Stats                *Stats
	// RingWindow is the window of the model's ring-buffer layers
	// (models.KVCacheSpec.RingWindow; 0: none): the batch then carries
	// each sequence's state slot and the ring slot mapping.
	RingWindow int
	// InFlight is the step loop's bound on steps in flight (Env.InFlight;
	// 0: unknown, every step uploads into a buffer of its own).
	InFlight int
}

// RegisterPrepare registers a prepare implementation in r (nil: the
// default registry).
func RegisterPrepare[O any](r *pipeline.Registry, name string, defaults O, build func(PrepareDeps, O) (PrepareStage, error)) {
	register(r, "prepare", name, defaults, func(e *Env) PrepareDeps {
		d := PrepareDeps{Ops: e.Ops, Stats: e.Stats, InFlight: e.InFlight}
		if e.Scheduler != nil {
			d.NumSpeculativeTokens = e.Scheduler.Config().NumSpeculativeTokens
		}
		if e.Cache != nil {
			d.BlockSize, d.NumBlocks = e.Cache.BlockSize, e.Cache.NumBlocks
			d.RingWindow = e.Cache.Spec.RingWindow
		}
		return d
	}, build, nil)
}

func init() {
	RegisterPrepare(nil, "default", NoOptions{}, func(d PrepareDeps, _ NoOptions) (PrepareStage, error) {
		return newPrepare(d), nil
	})
}

// RowRef says which sequence a logits row samples for. Without
// speculative decoding each logits row is one of the scheduler's sample
// rows; with it, a decode verifying d drafts has d+1 logits rows, all with
// the same Row, at Offset 0..d: the row at Offset j scores the token after
// the sequence's last known token and its first j drafts.
type RowRef struct {
	Meta      *engine.SequenceMetadata
	SeqID     engine.SeqID
	Index     int // the sequence's index among its request's n outputs
	RequestID string
	Row       int // the scheduler's sample row (SequenceMetadata.SampleRow, or a fork's)
	Offset    int // drafts before this row (0 without speculation)
	// Grammar is the sequence's structured-output matcher (nil: none):
	// the sample stage masks the row by it (after the row's Offset drafts),
	// post-processing commits the row's tokens to it.
	Grammar engine.GrammarMatcher
}

// PreparedStep is a step's input in backend memory (prepare -> forward).
type PreparedStep struct {
	*ScheduledStep
	Batch *models.ForwardBatch
	// SampleRows (I32) are the token rows whose logits are computed: one per
	// entry of Rows (a forked sequence repeats its parent's row), then one
	// per PromptRows entry.
	SampleRows kernels.Tensor
	// RowsInOrder reports that SampleRows are the batch's token rows
	// 0..NumTokens-1 in order (a decode step without forks or prompt
	// logprobs): a forward pass that computed every row's logits may hand
	// those on.
	RowsInOrder bool
	// Rows has one entry per logits row that samples, in the scheduler's
	// sample-row order (a speculative decode's rows together, by Offset).
	Rows []RowRef
	// PromptRows are extra logits rows, after the sample rows, that score
	// prompt tokens for prompt_logprobs.
	PromptRows []PromptRow
	// FromRow (I32 [num_tokens]) is set when inputs are placeholders: the
	// entry of the previous step's next-input table each input comes from
	// (its sample row, or with speculative decoding row*(1+k)+j), -1 for
	// known ones.
	FromRow kernels.Tensor
	// ShiftFrom (I32 [Batch's sequences]) is set when some sequence's layout assumes
	// the previous step accepted no draft (SequenceMetadata.Shifted):
	// the forward stage shifts them by the accepted counts of the step
	// before (kernels.Ops.ShiftAccepted) before it runs.
	ShiftFrom kernels.Tensor
	// Relayout, when set, lays the step out again with each shifted
	// decode (SequenceMetadata.Shifted) verifying no more drafts than the
	// step before proposed for it: drafts[r] for the sequence whose
	// placeholders come from that step's sample row r. The step was planned
	// before those drafts existed, with room for k each; the rows past a
	// shorter draft would be padding, computed and ignored. The prepare
	// stage sets it; TrimDrafts calls it, at most once a step (the new
	// layout's memory is the step's: a second call would reuse it). nil:
	// the step runs as laid out.
	Relayout func(drafts []int) (*PreparedStep, error)
	// Previous is the step before's *SampledStep, which the loop's lagged
	// edge from sample hands the forward slot before this step runs (nil
	// for the first step). Forward reads its Tokens (or Samples) to resolve
	// FromRow's placeholders: see ResolvePlaceholders. It is set only while
	// the forward stage's Process runs (the chain of steps would otherwise
	// keep every step alive).
	Previous *SampledStep
}

// PromptRow is a row whose logits score the prompt token that follows it.
type PromptRow struct {
	Meta *engine.SequenceMetadata
	Next int // the prompt token the row scores
}

// prepare lays a scheduled step out as the model's flat batch in backend
// memory and lists the rows that sample.
//
// A step's batch lives in one upload buffer, which the stage reuses for
// the step InFlight+1 later (bufs, by step id): by the time that step is
// planned, the step's outputs have come back around the loop, and every
// reader of its batch (forward, verify, draft) has queued its work ahead
// of the new upload. So a PreparedStep's Batch and its other tensors are
// valid until its outputs come back around the loop.
//
// A step laid out again with fewer drafts (Relayout, on the forward
// stage's goroutine) has a ring of buffers of its own (trimBufs), indexed
// the same way.
type prepare struct {
	d        PrepareDeps
	bufs     []kernels.Tensor // nil: InFlight unknown, a new buffer every step
	trimBufs []kernels.Tensor
	trimSeqs [][]engine.SequenceMetadata // the relaid-out steps' metadata, a ring like trimBufs
	scratch  sync.Pool                   // of *layoutScratch: Process and Relayout may lay out at once
}

func newPrepare(d PrepareDeps) *prepare {
	p := &prepare{d: d}
	p.scratch.New = func() any { return new(layoutScratch) }
	if d.InFlight > 0 {
		p.bufs = make([]kernels.Tensor, d.InFlight+1)
		p.trimBufs = make([]kernels.Tensor, d.InFlight+1)
		p.trimSeqs = make([][]engine.SequenceMetadata, d.InFlight+1)
	}
	return p
}

func (p *prepare) Process(_ context.Context, step *ScheduledStep) (*PreparedStep, error) {
	out, placeholders, err := p.layout(step, bufFor(p.bufs, step))
	if err != nil {
		return nil, err
	}
	if p.d.Stats != nil {
		p.d.Stats.Placeholders.Add(int64(placeholders))
	}
	out.Relayout = func(drafts []int) (*PreparedStep, error) {
		var into []engine.SequenceMetadata
		slot := seqsFor(p.trimSeqs, step)
		if slot != nil {
			into = *slot
		}
		trimmed, err := trimScheduled(step, drafts, into)
		if err != nil {
			return nil, fmt.Errorf("prepare: step %d: %w", step.Outputs.StepID, err)
		}
		if slot != nil {
			*slot = trimmed.Seqs // grown, for the step that takes the slot next
		}
		out, kept, err := p.layout(trimmed, bufFor(p.trimBufs, step))
		if err == nil && p.d.Stats != nil {
			p.d.Stats.Placeholders.Add(int64(kept - placeholders)) // the rows dropped resolve nothing
		}
		return out, err
	}
	return out, nil
}

// seqsFor is the entry of ring seqs that holds step's trimmed metadata
// (nil: the ring is unknown, a new copy each time). Like the upload
// buffers, an entry is reused InFlight+1 steps later, when every reader
// of the step it held is done with it.
func seqsFor(seqs [][]engine.SequenceMetadata, step *ScheduledStep) *[]engine.SequenceMetadata {
	if len(seqs) == 0 {
		return nil
	}
	return &seqs[int(step.Outputs.StepID)%len(seqs)]
}

// bufFor is the buffer of ring bufs that step uploads into (nil: the ring
// is unknown, a new buffer).
func bufFor(bufs []kernels.Tensor, step *ScheduledStep) *kernels.Tensor {
	if len(bufs) == 0 {
		return nil
	}
	return &bufs[int(step.Outputs.StepID)%len(bufs)]
}

// trimScheduled returns a copy of step whose shifted decodes verify at
// most drafts[r] drafts each (r: the sample row of the step before that
// their placeholders come from): the last rows of each longer one are
// dropped, with their counts in the copy's outputs. Nothing else changes:
// the kept rows' tokens, positions and slots, the shift, the KV the
// scheduler reserved. step itself is not modified (its metadata may be
// recycled by the scheduler). The copy is made in into's array when it
// has room (nil: a new one). Cost: one copy of the step's metadata.
func trimScheduled(step *ScheduledStep, drafts []int, into []engine.SequenceMetadata) (*ScheduledStep, error) {
	out := *step.Outputs
	seqs := append(into[:0], step.Seqs...)
	for i := range seqs {
		m := &seqs[i]
		if !m.Shifted || m.NumDrafts == 0 {
			continue
		}
		if m.InputFromRow < 0 || m.InputFromRow >= len(drafts) {
			return nil, fmt.Errorf("sequence %d: placeholders from row %d, the step before drafted for %d rows", m.SeqID, m.InputFromRow, len(drafts))
		}
		drop := m.NumDrafts - min(max(drafts[m.InputFromRow], 0), m.NumDrafts)
		if drop == 0 {
			continue
		}
		q := m.SeqlenQ - drop
		m.NumDrafts -= drop
		m.SeqlenQ, m.SeqlenK = q, m.SeqlenK-drop
		m.InputTokenIDs, m.SlotMapping = m.InputTokenIDs[:q:q], m.SlotMapping[:q:q]
		out.NumBatchedTokens -= drop
		out.NumDecodeTokens -= drop
		out.NumDraftTokens -= drop
	}
	return &ScheduledStep{Outputs: &out, Seqs: seqs, Planned: step.Planned}, nil
}

// layoutScratch is the host memory one layout call works in: the host
// batch's arrays, the per-row arrays that go up with it, each sequence's
// ids and block table, and the packed upload. None of it outlives the
// call (the upload reads its source during the call only), so the arrays
// are reused from call to call through prepare.scratch; they grow to the
// largest step and stay.
type layoutScratch struct {
	h                                            models.HostBatch
	ids, tables                                  []int32
	fromRow, shiftFrom, sampleRows, promptRowIdx []int32
}

// reset empties s for step: the host batch with room for its tokens and
// its sequences, each decode row counted as one (the prepare stage lays a
// decode's rows out as sequences of one token), and the ids and tables
// arenas with room for every sequence's. Cost: no allocation once the
// arrays have grown to the steps' size.
func (s *layoutScratch) reset(step *ScheduledStep, blockSize, ringWindow int) {
	t := step.Outputs.NumBatchedTokens
	n := step.Outputs.NumPrefillSeqs + step.Outputs.NumDecodeTokens
	tables := 0
	for i := range step.Seqs {
		tables += len(step.Seqs[i].BlockTable)
	}
	h := &s.h
	h.BlockSize, h.RingWindow = blockSize, ringWindow
	h.InputIDs, h.Positions, h.SlotMapping = grow32(h.InputIDs, t), grow32(h.Positions, t), grow32(h.SlotMapping, t)
	h.CuSeqlensQ, h.SeqlensK = append(grow32(h.CuSeqlensQ, n+1), 0), grow32(h.SeqlensK, n)
	clear(h.BlockTables[:cap(h.BlockTables)]) // drop the last step's tables
	h.BlockTables = slices.Grow(h.BlockTables[:0], n)
	h.StateSlots = h.StateSlots[:0]
	if ringWindow > 0 {
		h.StateSlots = grow32(h.StateSlots, n)
	}
	s.ids, s.tables = grow32(s.ids, t), grow32(s.tables, tables)
	s.fromRow, s.shiftFrom = grow32(s.fromRow, t), grow32(s.shiftFrom, len(step.Seqs)+step.Outputs.NumDraftTokens)
	s.sampleRows = grow32(s.sampleRows, step.Outputs.NumSampleRows+step.Outputs.NumDraftTokens)
	s.promptRowIdx = s.promptRowIdx[:0]
}

// grow32 returns xs emptied, with room for n values.
func grow32(xs []int32, n int) []int32 { return slices.Grow(xs[:0], n) }

// take returns the next n values of arena (which has room for them), and
// moves arena's end past them.
func take(arena *[]int32, n int) []int32 {
	a := *arena
	*arena = a[:len(a)+n]
	return a[len(a) : len(a)+n : len(a)+n]
}

// layout lays step out into *buf (see models.HostBatch.UploadReusing) and
// returns it with the number of placeholder inputs. It reads p.d only, so
// the forward stage's Relayout may run it beside Process.
func (p *prepare) layout(step *ScheduledStep, buf *kernels.Tensor) (*PreparedStep, int, error) {
	sc := p.scratch.Get().(*layoutScratch)
	defer p.scratch.Put(sc)
	sc.reset(step, p.d.BlockSize, p.d.RingWindow)
	h := &sc.h
	numRows := step.Outputs.NumSampleRows
	rows := make([]RowRef, 0, numRows+step.Outputs.NumDraftTokens)
	sampleRows, fromRow, shiftFrom, promptRowIdx := sc.sampleRows, sc.fromRow, sc.shiftFrom, sc.promptRowIdx
	idArena, tableArena := sc.ids, sc.tables
	var promptRows []PromptRow
	numPlaceholders, shifted := 0, false
	// Placeholders index the draft stage's table of the step before (1 + k
	// entries a sample row), or its sampled tokens when it drafted nothing.
	stride := 1 + p.d.NumSpeculativeTokens
	if step.Outputs.PlaceholdersFromSamples {
		stride = 1
	}
	nextRow := 0
	for i := range step.Seqs {
		m := &step.Seqs[i]
		first := int32(len(h.InputIDs))
		for pos := m.PromptLogprobsFrom; pos >= 0 && pos < m.PromptLogprobsTo; pos++ {
			promptRows = append(promptRows, PromptRow{Meta: m, Next: m.TokenIDs[pos+1]})
			promptRowIdx = append(promptRowIdx, first+int32(pos-m.PosStart))
		}
		ids := take(&idArena, len(m.InputTokenIDs))
		for j, id := range m.InputTokenIDs {
			from := int32(-1)
			if id == engine.PlaceholderToken {
				if m.InputFromRow < 0 {
					return nil, 0, fmt.Errorf("prepare: step %d: sequence %d: a placeholder without a source row", step.Outputs.StepID, m.SeqID)
				}
				from = int32(m.InputFromRow*stride + j)
				numPlaceholders++
			}
			ids[j] = int32(id)
			fromRow = append(fromRow, from)
		}
		shift := int32(-1)
		if m.Shifted {
			shift, shifted = int32(m.InputFromRow), true
		}
		table := take(&tableArena, len(m.BlockTable))
		for j, b := range m.BlockTable {
			table[j] = int32(b)
		}
		if m.Prefill {
			h.AddSequence(ids, m.PosStart, table)
			shiftFrom = append(shiftFrom, shift)
			if h.RingWindow > 0 {
				h.StateSlots = append(h.StateSlots, int32(m.StateSlot))
			}
		} else {
			// A decode's rows (its last token and the drafts it verifies)
			// are laid out as decode rows of one token each, every one
			// with its own key count over the sequence's block table: the
			// decode attention kernels give each the bits it would have
			// as a plain decode, and verify steps replay the decode CUDA
			// graphs. The step writes all their keys before any attends.
			for j := range ids {
				h.AddSequence(ids[j:j+1:j+1], m.PosStart+j, table)
				shiftFrom = append(shiftFrom, shift)
				if h.RingWindow > 0 {
					h.StateSlots = append(h.StateSlots, int32(m.StateSlot))
				}
			}
		}
		if !m.Sample {
			continue
		}
		if m.SampleRow != nextRow || m.NumDrafts >= len(ids) {
			return nil, 0, fmt.Errorf("prepare: step %d: sequence %d samples row %d with %d drafts over %d inputs, want row %d",
				step.Outputs.StepID, m.SeqID, m.SampleRow, m.NumDrafts, len(ids), nextRow)
		}
		last := int32(len(h.InputIDs) - 1)
		for j := 0; j <= m.NumDrafts; j++ {
			rows = append(rows, RowRef{Meta: m, SeqID: m.SeqID, Index: m.SampleIndex, RequestID: m.RequestID, Row: m.SampleRow, Offset: j, Grammar: m.Grammar})
			sampleRows = append(sampleRows, last-int32(m.NumDrafts-j))
		}
		nextRow++
		for j, fork := range m.ForkSeqIDs {
			ref := RowRef{Meta: m, SeqID: fork, Index: j + 1, RequestID: m.RequestID, Row: nextRow}
			if m.ForkGrammars != nil {
				ref.Grammar = m.ForkGrammars[j]
			}
			rows = append(rows, ref)
			sampleRows = append(sampleRows, last)
			nextRow++
		}
	}
	if nextRow != numRows {
		return nil, 0, fmt.Errorf("prepare: step %d: %d sample rows laid out, the scheduler planned %d", step.Outputs.StepID, nextRow, numRows)
	}
	placeholders := numPlaceholders > 0
	// The placeholders' sources, the shifts and the rows that sample go up
	// with the batch, in one copy.
	var extra [][]int32
	if placeholders {
		extra = append(extra, fromRow)
	}
	if shifted {
		extra = append(extra, shiftFrom)
	}
	all := append(sampleRows, promptRowIdx...)
	if len(all) > 0 {
		extra = append(extra, all)
	}
	// The grown arrays go back to the scratch for the next call.
	sc.sampleRows, sc.fromRow, sc.shiftFrom, sc.promptRowIdx = all[:0], fromRow[:0], shiftFrom[:0], promptRowIdx[:0]
	batch, views, err := h.UploadReusing(p.d.Ops, p.d.NumBlocks, buf, extra...)
	if err != nil {
		return nil, 0, fmt.Errorf("prepare: step %d: %w", step.Outputs.StepID, err)
	}
	out := &PreparedStep{ScheduledStep: step, Batch: batch, Rows: rows, PromptRows: promptRows}
	if placeholders {
		// Resolved by the forward stage right before it runs, as a device
		// stream would: step N's tokens may still be being sampled.
		out.FromRow, views = views[0], views[1:]
	}
	if shifted {
		// So are the shifts; the kernels size their scratch for the longest.
		out.ShiftFrom, views = views[0], views[1:]
		batch.Attn.MaxSeqlenK += p.d.NumSpeculativeTokens
	}
	if len(all) > 0 {
		out.SampleRows = views[0]
		out.RowsInOrder = len(all) == batch.NumTokens
		for i, r := range all {
			if int(r) != i {
				out.RowsInOrder = false
				break
			}
		}
	}
	return out, numPlaceholders, nil
}
