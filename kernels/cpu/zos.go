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
