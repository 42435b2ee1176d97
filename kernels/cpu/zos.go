package cpu

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// ResolvePlaceholders implements kernels.Ops: ids[i] = sampled[fromRow[i]]
// where fromRow[i] >= 0.
func (b *Backend) ResolvePlaceholders(ids, fromRow, sampled kernels.Tensor) error {
	const op = "resolve_placeholders"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	id, err := asCPU(op, "ids", ids)
	if err != nil {
		return err
	}
	from, err := asCPU(op, "from_row", fromRow)
	if err != nil {
		return err
	}
	smp, err := asCPU(op, "sampled", sampled)
	if err != nil {
		return err
	}
	if _, _, err := kernels.ResolveShapes("cpu", id, from, smp); err != nil {
		return err
	}
	for i, r := range from.i32 {
		if r < 0 {
			continue
		}
		if int(r) >= len(smp.i32) {
			return fmt.Errorf("cpu: %s: from_row[%d] = %d, step has %d sampled rows: %w", op, i, r, len(smp.i32), kernels.ErrOutOfRange)
		}
		id.i32[i] = smp.i32[r]
	}
	return nil
}

// ShiftAccepted implements kernels.Ops: shifts the positions, slots and
// key counts of the sequences laid out before their previous step's
// accepted draft counts were known.
func (b *Backend) ShiftAccepted(m *kernels.AttentionMetadata, positions, shiftFrom, accepted kernels.Tensor) error {
	const op = "shift_accepted"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	r, width, err := kernels.ShiftShapes("cpu", m, positions, shiftFrom, accepted)
	if err != nil {
		return err
	}
	ts := map[string]kernels.Tensor{"cu_seqlens_q": m.CuSeqlensQ, "seqlens_k": m.SeqlensK, "block_tables": m.BlockTables,
		"slot_mapping": m.SlotMapping, "positions": positions, "shift_from": shiftFrom, "accepted": accepted}
	c := map[string]*Tensor{}
	for name, x := range ts {
		t, err := asCPU(op, name, x)
		if err != nil {
			return err
		}
		c[name] = t
	}
	cu, seqK, tables, slots, pos := c["cu_seqlens_q"].i32, c["seqlens_k"].i32, c["block_tables"].i32, c["slot_mapping"].i32, c["positions"].i32
	acc := c["accepted"].i32
	bs := int32(m.BlockSize)
	shift := c["shift_from"].i32
	// Check every sequence before writing any, so that an error changes nothing.
	for s, from := range shift {
		if from < 0 {
			continue
		}
		if int(from) >= r || acc[from] < 0 {
			return fmt.Errorf("cpu: %s: shift_from[%d] = %d, %d accepted rows: %w", op, s, from, r, kernels.ErrOutOfRange)
		}
		for i := cu[s]; i < cu[s+1]; i++ {
			p := pos[i] + acc[from]
			if blk := int(p / bs); blk >= width || tables[s*width+blk] < 0 {
				return fmt.Errorf("cpu: %s: sequence %d: position %d has no block: %w", op, s, p, kernels.ErrOutOfRange)
			}
		}
	}
	for s, from := range shift {
		if from < 0 {
			continue
		}
		a := acc[from]
		for i := cu[s]; i < cu[s+1]; i++ {
			p := pos[i] + a
			pos[i] = p
			slots[i] = tables[s*width+int(p/bs)]*bs + p%bs
		}
		seqK[s] += a
	}
	return nil
}

// Argmax implements kernels.Argmaxer: out[r] = kernels.ArgmaxRow of
// logits row r. Cost: one pass over logits.
func (b *Backend) Argmax(out, logits kernels.Tensor) error {
	const op = "argmax"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	rows, vocab, err := kernels.CheckArgmax("cpu", out, logits)
	if err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	l, err := asCPU(op, "logits", logits)
	if err != nil {
		return err
	}
	for r := range rows {
		o.i32[r] = int32(kernels.ArgmaxRow(l.f32[r*vocab : (r+1)*vocab]))
	}
	return nil
}

// AcceptDrafts implements kernels.DraftAccepter (kernels.AcceptHost over
// the tensors' memory).
func (b *Backend) AcceptDrafts(out, tokens, drafts, layout kernels.Tensor) error {
	const op = "accept_drafts"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	if _, err := kernels.CheckAcceptDrafts("cpu", out, tokens, drafts, layout); err != nil {
		return err
	}
	ts := make([]*Tensor, 4)
	for i, x := range []kernels.Tensor{out, tokens, drafts, layout} {
		t, err := asCPU(op, "arg", x)
		if err != nil {
			return err
		}
		ts[i] = t
	}
	res, err := kernels.AcceptHost(ts[1].i32, ts[2].i32, ts[3].i32)
	if err != nil {
		return fmt.Errorf("cpu: %s: %w", op, err)
	}
	copy(ts[0].i32, res)
	return nil
}
