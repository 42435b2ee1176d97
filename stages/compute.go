package stages

import (
	"context"
	"fmt"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func init() {
	pipeline.Register("prepare", "default", func(a pipeline.Args) (*pipeline.Node, error) {
		rt, err := runtimeOf(a)
		if err != nil {
			return nil, err
		}
		return pipeline.NewStage[*ScheduledStep, *PreparedStep](&prepare{rt: rt}), nil
	})
	pipeline.Register("forward", "default", func(a pipeline.Args) (*pipeline.Node, error) {
		rt, err := runtimeOf(a)
		if err != nil {
			return nil, err
		}
		return pipeline.NewStage[*PreparedStep, *ForwardResult](&forward{rt: rt}), nil
	})
}

// prepare lays a scheduled step out as the model's flat batch in backend
// memory and lists the rows that sample.
type prepare struct{ rt *Runtime }

func (p *prepare) Process(_ context.Context, step *ScheduledStep) (*PreparedStep, error) {
	h := &models.HostBatch{BlockSize: p.rt.Cache.BlockSize}
	numRows := step.Outputs.NumSampleRows
	rows := make([]RowRef, numRows)
	sampleRows := make([]int32, numRows)
	var promptRows []PromptRow
	var promptRowIdx []int32
	fromRow := make([]int32, 0, step.Outputs.NumBatchedTokens)
	placeholders := false
	for i := range step.Seqs {
		m := &step.Seqs[i]
		first := int32(len(h.InputIDs))
		for pos := m.PromptLogprobsFrom; pos >= 0 && pos < m.PromptLogprobsTo; pos++ {
			promptRows = append(promptRows, PromptRow{Meta: m, Next: m.TokenIDs[pos+1]})
			promptRowIdx = append(promptRowIdx, first+int32(pos-m.PosStart))
		}
		ids := make([]int32, len(m.InputTokenIDs))
		for j, id := range m.InputTokenIDs {
			from := int32(-1)
			if id == engine.PlaceholderToken {
				if m.InputFromRow < 0 {
					return nil, fmt.Errorf("prepare: step %d: sequence %d: a placeholder without a source row", step.Outputs.StepID, m.SeqID)
				}
				from = int32(m.InputFromRow)
				placeholders = true
				if p.rt.Stats != nil {
					p.rt.Stats.Placeholders.Add(1)
				}
			}
			ids[j] = int32(id)
			fromRow = append(fromRow, from)
		}
		table := make([]int32, len(m.BlockTable))
		for j, b := range m.BlockTable {
			table[j] = int32(b)
		}
		h.AddSequence(ids, m.PosStart, table)
		if !m.Sample {
			continue
		}
		last := int32(len(h.InputIDs) - 1)
		put := func(r int, id engine.SeqID, index int) error {
			if r < 0 || r >= numRows {
				return fmt.Errorf("prepare: step %d: sample row %d outside [0, %d)", step.Outputs.StepID, r, numRows)
			}
			rows[r] = RowRef{Meta: m, SeqID: id, Index: index, RequestID: m.RequestID}
			sampleRows[r] = last
			return nil
		}
		if err := put(m.SampleRow, m.SeqID, m.SampleIndex); err != nil {
			return nil, err
		}
		for j, fork := range m.ForkSeqIDs {
			if err := put(m.SampleRow+1+j, fork, j+1); err != nil {
				return nil, err
			}
		}
	}
	batch, err := h.Upload(p.rt.Ops, p.rt.Cache.NumBlocks)
	if err != nil {
		return nil, fmt.Errorf("prepare: step %d: %w", step.Outputs.StepID, err)
	}
	out := &PreparedStep{ScheduledStep: step, Batch: batch, Rows: rows, PromptRows: promptRows}
	if placeholders {
		// Resolved by the forward stage right before it runs, as a device
		// stream would: step N's tokens may still be being sampled.
		if out.FromRow, err = kernels.FromI32(p.rt.Ops, fromRow, len(fromRow)); err != nil {
			return nil, fmt.Errorf("prepare: step %d: %w", step.Outputs.StepID, err)
		}
	}
	if all := append(sampleRows, promptRowIdx...); len(all) > 0 {
		if out.SampleRows, err = kernels.FromI32(p.rt.Ops, all, len(all)); err != nil {
			return nil, fmt.Errorf("prepare: step %d: %w", step.Outputs.StepID, err)
		}
	}
	return out, nil
}

// forward runs the model over the paged KV cache and computes the logits of
// the rows that sample. It also measures the gap between the end of one
// forward pass and the start of the next: the time the device would idle
// while the host works between steps.
type forward struct {
	rt      *Runtime
	lastEnd time.Time
}

func (f *forward) Process(ctx context.Context, step *PreparedStep) (*ForwardResult, error) {
	if err := copyBlocks(f.rt, step.Outputs.BlockCopies); err != nil {
		return nil, fmt.Errorf("forward: step %d: %w", step.Outputs.StepID, err)
	}
	if step.FromRow != nil {
		if err := f.rt.ZOS.resolvePlaceholders(ctx, f.rt.Ops, step.ScheduledStep, step.Batch.InputIDs, step.FromRow); err != nil {
			return nil, fmt.Errorf("forward: %w", err)
		}
	}
	start := time.Now()
	if f.rt.Stats != nil && !f.lastEnd.IsZero() {
		f.rt.Stats.recordGap(start.Sub(f.lastEnd))
	}
	defer func() { f.lastEnd = time.Now() }()
	hidden, err := f.rt.Model.Forward(ctx, f.rt.Cache, step.Batch)
	if err != nil {
		return nil, fmt.Errorf("forward: step %d: %w", step.Outputs.StepID, err)
	}
	res := &ForwardResult{PreparedStep: step}
	if step.SampleRows != nil {
		if res.Logits, err = f.rt.Model.ComputeLogits(hidden, step.SampleRows); err != nil {
			return nil, fmt.Errorf("forward: step %d: logits: %w", step.Outputs.StepID, err)
		}
	}
	if err := f.rt.Ops.Sync(); err != nil {
		return nil, fmt.Errorf("forward: step %d: %w", step.Outputs.StepID, err)
	}
	if f.rt.Stats != nil {
		var cost engine.StepCost
		if f.rt.Flops != nil {
			cost = f.rt.Flops.Estimate(step.Seqs)
		}
		f.rt.Stats.record(step.Outputs, cost, time.Since(start))
	}
	return res, nil
}

// copyBlocks performs the scheduler's copy-on-write block copies in every
// layer's cache, through the host (rare: only when a forked sequence first
// writes a shared partial block).
func copyBlocks(rt *Runtime, copies []engine.BlockCopy) error {
	if len(copies) == 0 {
		return nil
	}
	var buf []byte
	for _, layer := range [][]kernels.Tensor{rt.Cache.K, rt.Cache.V} {
		for _, t := range layer {
			for _, c := range copies {
				src, err := rt.Ops.Rows(t, c.Src, c.Src+1)
				if err != nil {
					return err
				}
				dst, err := rt.Ops.Rows(t, c.Dst, c.Dst+1)
				if err != nil {
					return err
				}
				n := kernels.NumElements(src) * src.DType().Size()
				if cap(buf) < n {
					buf = make([]byte, n)
				}
				if err := rt.Ops.Download(buf[:n], src); err != nil {
					return err
				}
				if err := rt.Ops.Upload(dst, buf[:n], src.DType()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
