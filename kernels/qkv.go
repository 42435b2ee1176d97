package kernels

import "fmt"

// QKV is the work between a fused q/k/v projection and attention in the
// Llama family: split the projection's rows into q, k and v heads,
// RMS-normalize each q and k head (Qwen3; optional), rotate q and k by RoPE,
// and write k and v into the layer's caches.
type QKV struct {
	QKV Tensor // F32 [T, (NumHeads+2*NumKVHeads)*HeadDim], the projection (read only)
	Q   Tensor // F32 [T, NumHeads*HeadDim], out: normalized and rotated q

	KCache, VCache Tensor // [blocks, block_size, NumKVHeads*HeadDim] in the cache dtype
	SlotMapping    Tensor // I32 [T]: cache slot of each row (-1: not written)
	Positions      Tensor // I32 [T]
	Cos, Sin       Tensor // F32 [max_pos, RotaryDim/2]

	QNorm, KNorm Tensor // F32 [HeadDim] weights of the per-head RMSNorm; both nil for none
	Eps          float32

	NumHeads, NumKVHeads, HeadDim int
	// RoPE: Offset, RotaryDim and Interleaved of the rotation; NumHeads and
	// HeadSize are set from the fields above.
	RoPE RoPEParams

	// K and V are F32 [T, NumKVHeads*HeadDim] scratch rows for backends
	// that do not fuse the steps (PrepareQKV's composition); a fusing
	// backend ignores them.
	K, V Tensor
}

// QKVPreparer is implemented by backends that run QKV's steps as one fused
// operation. PrepareQKV must give the bits of PrepareQKVSteps: the same q and
// the same cache contents. Cost: one read of the projection, one write of q,
// k and v.
type QKVPreparer interface {
	PrepareQKV(a QKV) error
}

// PrepareQKV runs a on ops: fused when ops implements QKVPreparer, else as
// PrepareQKVSteps.
func PrepareQKV(ops Ops, a QKV) error {
	if f, ok := ops.(QKVPreparer); ok {
		return f.PrepareQKV(a)
	}
	return PrepareQKVSteps(ops, a)
}

// PrepareQKVSteps runs a as separate operations: SplitColumns into a.Q, a.K
// and a.V, RMSNorm of each head, RoPE of q and k, WriteCache of k and v. It
// is the reference a fused QKVPreparer is held to.
func PrepareQKVSteps(ops Ops, a QKV) error {
	if (a.QNorm == nil) != (a.KNorm == nil) {
		return fmt.Errorf("kernels: qkv: QNorm and KNorm are both set or both nil: %w", ErrShape)
	}
	if a.K == nil || a.V == nil {
		return fmt.Errorf("kernels: qkv: the unfused steps need K and V scratch rows: %w", ErrShape)
	}
	if err := ops.SplitColumns(a.QKV, a.Q, a.K, a.V); err != nil {
		return err
	}
	t := a.QKV.Shape()[0]
	if a.QNorm != nil {
		qh, err := ops.Reshape(a.Q, t*a.NumHeads, a.HeadDim)
		if err != nil {
			return err
		}
		kh, err := ops.Reshape(a.K, t*a.NumKVHeads, a.HeadDim)
		if err != nil {
			return err
		}
		if err := ops.RMSNorm(qh, qh, a.QNorm, a.Eps); err != nil {
			return err
		}
		if err := ops.RMSNorm(kh, kh, a.KNorm, a.Eps); err != nil {
			return err
		}
	}
	rp := a.RoPE
	rp.NumHeads, rp.HeadSize = a.NumHeads, a.HeadDim
	if err := ops.RoPE(a.Q, a.Positions, a.Cos, a.Sin, rp); err != nil {
		return err
	}
	rp.NumHeads = a.NumKVHeads
	if err := ops.RoPE(a.K, a.Positions, a.Cos, a.Sin, rp); err != nil {
		return err
	}
	if err := ops.WriteCache(a.KCache, a.K, a.SlotMapping, 0); err != nil {
		return err
	}
	return ops.WriteCache(a.VCache, a.V, a.SlotMapping, 0)
}
