package models

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// windowLayers is where a model with sliding-window layers keeps each
// layer's keys and values: the sliding layers in per-sequence ring buffers
// of window tokens (the state slots; KVCacheSpec.RingLayers) unless rings
// is off (Options.SlidingWindowPaged, or no sliding layer), every other
// layer in paged blocks. Gemma 3 and gpt-oss embed it.
type windowLayers struct {
	window             int
	rings              bool // sliding layers in ring buffers
	numPaged, numRings int
}

// place decides the layout for layers whose sliding flags are given and
// returns each layer's index into KVCache.K/V, or RingK/RingV for a ring
// layer. Errors: sliding layers without a positive window, or rings on a
// backend without ring attention.
func (w *windowLayers) place(ops kernels.Ops, arch string, sliding []bool, paged bool) ([]int, error) {
	anySliding := false
	for _, s := range sliding {
		anySliding = anySliding || s
	}
	if anySliding && w.window <= 0 {
		return nil, fmt.Errorf("models: %s: sliding layers with sliding_window %d: %w", arch, w.window, ErrConfig)
	}
	w.rings = anySliding && !paged
	if _, ok := ops.(kernels.RingAttentioner); w.rings && !ok {
		return nil, fmt.Errorf("models: %s: backend %s has no ring-buffer attention for the sliding-window state slots; "+
			"cache.sliding_window_paged: true keeps those layers in paged blocks: %w", arch, ops.Name(), ErrConfig)
	}
	idx := make([]int, len(sliding))
	for i, s := range sliding {
		if s && w.rings {
			idx[i] = w.numRings
			w.numRings++
		} else {
			idx[i] = w.numPaged
			w.numPaged++
		}
	}
	return idx, nil
}

// kvCacheSpec is the cache of the layout: GQA paged layers of width, plus
// the rings. o is a layer's output projection, whose dtype picks the
// backend's cache dtype (nil: the activation dtype).
func (w *windowLayers) kvCacheSpec(ops kernels.Ops, width int, o kernels.Tensor) KVCacheSpec {
	dt := ops.ActivationDType()
	if k, ok := ops.(kernels.KVCacheDTyper); ok && o != nil {
		dt = k.KVCacheDType(computeDType(o.DType()))
	}
	s := KVCacheSpec{Layout: KVLayoutGQA, NumLayers: w.numPaged, Width: width, DType: dt}
	if w.numRings > 0 {
		s.RingLayers, s.RingWindow = w.numRings, w.window
	}
	return s
}

// checkBatch refuses a batch without the state slots the ring layers need.
func (w *windowLayers) checkBatch(arch string, b *ForwardBatch) error {
	if w.numRings > 0 && (b.StateSlots == nil || b.RingSlotMapping == nil) {
		return fmt.Errorf("models: %s: the batch has no state slots for the ring layers (HostBatch.RingWindow): %w", arch, ErrBatch)
	}
	return nil
}
