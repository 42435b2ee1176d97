package cpu

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// ringSrc is where ring attention finds keys: a sequence's history in its
// slot of the ring tensors, the step's own keys in the new rows k and v.
type ringSrc struct {
	window int
	slot   []int   // per sequence
	k, v   *Tensor // F32 [T, kv width]: the step's keys and values
}

// gather copies key pos of sequence s (head columns [kvOff, kvOff+d)) into
// kt and its value into vt (d elements each). Positions before the ring's
// oldest entry are outside every window of the step: they enter as zeros
// (masked like the rest of the tile).
func (r *ringSrc) gather(pl *attnPlan, s, pos, kvOff, d int, kc, vc *Tensor, kt, vt []float32) {
	hist := pl.kLen[s] - pl.qLen[s]
	kvWidth := r.k.shape[1]
	switch {
	case pos >= hist: // a key of this step, rounded as the ring will keep it
		base := (pl.qStart[s]+pos-hist)*kvWidth + kvOff
		switch kc.dtype {
		case kernels.F8E4M3:
			for e, x := range r.k.f32[base : base+d] {
				kt[e] = f8e4m3Values[kernels.F32ToF8E4M3(x)]
			}
			for e, x := range r.v.f32[base : base+d] {
				vt[e] = f8e4m3Values[kernels.F32ToF8E4M3(x)]
			}
			return
		case kernels.F16:
			for e, x := range r.k.f32[base : base+d] {
				kt[e] = kernels.F16ToF32(kernels.F32ToF16(x))
			}
			for e, x := range r.v.f32[base : base+d] {
				vt[e] = kernels.F16ToF32(kernels.F32ToF16(x))
			}
			return
		}
		copy(kt, r.k.f32[base:base+d])
		copy(vt, r.v.f32[base:base+d])
	case pos >= hist-r.window && pos >= 0: // in the ring
		base := (r.slot[s]*r.window+pos%r.window)*kvWidth + kvOff
		switch kc.dtype {
		case kernels.F8E4M3:
			for e, x := range kc.u8[base : base+d] {
				kt[e] = f8e4m3Values[x]
			}
			for e, x := range vc.u8[base : base+d] {
				vt[e] = f8e4m3Values[x]
			}
			return
		case kernels.F16:
			for e, x := range kc.u16[base : base+d] {
				kt[e] = kernels.F16ToF32(x)
			}
			for e, x := range vc.u16[base : base+d] {
				vt[e] = kernels.F16ToF32(x)
			}
			return
		}
		copy(kt, kc.f32[base:base+d])
		copy(vt, vc.f32[base:base+d])
	default:
		clear(kt)
		clear(vt)
	}
}

// RingAttention is sliding-window attention over per-sequence ring buffers
// plus the step's own keys; see kernels.RingAttentioner. It shares
// Attention's tiling, so a row gets the bits Attention gives it over the
// same keys in paged blocks.
func (b *Backend) RingAttention(out, q, k, v, kRing, vRing, slots kernels.Tensor, m *kernels.AttentionMetadata, p kernels.AttentionParams) error {
	const op = "ring_attention"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	var ts [7]*Tensor
	for i, a := range []struct {
		name string
		t    kernels.Tensor
	}{{"out", out}, {"q", q}, {"k", k}, {"v", v}, {"k_ring", kRing}, {"v_ring", vRing}, {"slots", slots}} {
		c, err := asCPU(op, a.name, a.t)
		if err != nil {
			return err
		}
		ts[i] = c
	}
	o, qs, ks, vs, kc, vc, sl := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6]
	t, numSlots, err := kernels.RingAttentionShapes("cpu", o, qs, ks, vs, kc, vc, sl, p, nil, cacheTypes)
	if err != nil {
		return err
	}
	if m == nil {
		return fmt.Errorf("cpu: %s: nil metadata: %w", op, kernels.ErrShape)
	}
	pl, err := planSeqs(op, m, t, 0, m.BlockSize, false)
	if err != nil {
		return err
	}
	if len(sl.i32) != m.NumSeqs {
		return fmt.Errorf("cpu: %s: %d slots for %d sequences: %w", op, len(sl.i32), m.NumSeqs, kernels.ErrShape)
	}
	r := &ringSrc{window: p.SlidingWindow, slot: make([]int, m.NumSeqs), k: ks, v: vs}
	for s, x := range sl.i32 {
		if x < 0 || int(x) >= numSlots {
			return fmt.Errorf("cpu: %s: slots[%d] = %d, the ring has %d slots: %w", op, s, x, numSlots, kernels.ErrOutOfRange)
		}
		r.slot[s] = int(x)
	}
	pl.ring = r
	if pl.sinks, err = sinkValues(op, p); err != nil {
		return err
	}
	b.attendGQAItems(pl, p, qs.f32, kc, vc, o.f32, true)
	return nil
}
