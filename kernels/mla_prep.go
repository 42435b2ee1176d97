package kernels

import "fmt"

// MLAPrep is the work between DeepSeek's q and kv_a projections and MLA
// attention: split the projection's row into q, the latent c_kv and the
// rope key k_pe, RMS-normalize c_kv, rotate q's rope dimensions and k_pe by
// RoPE, and write [c_kv k_pe] into the layer's latent cache. The
// projections come one of two ways:
//   - QKVA set: q and kv_a fused in one product (q not compressed), Q is
//     written;
//   - KVA set (QKVA nil): kv_a's own product, and q, from its own products
//     (q compressed: q_a, its norm, q_b), already in Q, which is rotated in
//     place.
type MLAPrep struct {
	QKVA Tensor // F32 [T, NumHeads*(NopeDim+RopeDim) + KVLoraRank + RopeDim] (read only)
	KVA  Tensor // F32 [T, KVLoraRank + RopeDim] (read only), where QKVA is nil
	Q    Tensor // F32 [T, NumHeads*(NopeDim+RopeDim)], out: q with its rope dimensions rotated (in: q, with KVA)

	Cache       Tensor // latent cache [blocks, block_size, width] in its layout (see MLACacher)
	SlotMapping Tensor // I32 [T]: cache slot of each row (-1: not written)
	Positions   Tensor // I32 [T]
	Cos, Sin    Tensor // F32 [max_pos, RopeDim/2]

	KVNorm Tensor // F32 [KVLoraRank]: kv_a_layernorm's weight
	Eps    float32

	MLA         MLAParams
	Interleaved bool // RoPE rotates interleaved pairs (DeepSeek V2), else halves

	// CKV and KPE are F32 [T, KVLoraRank] and [T, RopeDim] scratch rows for
	// backends that do not fuse the steps (PrepareMLA's composition); a
	// fusing backend ignores them.
	CKV, KPE Tensor
}

// MLAPreparer is implemented by backends that run MLAPrep's steps as one
// fused operation. PrepareMLA must give the bits of PrepareMLASteps: the
// same q and the same cache contents. Cost: one read of the projection,
// one write of q and of the cache rows.
type MLAPreparer interface {
	PrepareMLA(a MLAPrep) error
}

// PrepareMLA runs a on ops: fused when ops implements MLAPreparer, else as
// PrepareMLASteps.
func PrepareMLA(ops Ops, a MLAPrep) error {
	if f, ok := ops.(MLAPreparer); ok {
		return f.PrepareMLA(a)
	}
	return PrepareMLASteps(ops, a)
}

// PrepareMLASteps runs a as separate operations: SplitColumns of a.QKVA
// into a.Q, a.CKV and a.KPE (of a.KVA into a.CKV and a.KPE), then
// PrepareMLALatent. It is the reference a fused MLAPreparer is held to.
func PrepareMLASteps(ops Ops, a MLAPrep) error {
	if a.CKV == nil || a.KPE == nil {
		return fmt.Errorf("kernels: mla_prepare: the unfused steps need CKV and KPE scratch rows: %w", ErrShape)
	}
	if (a.QKVA == nil) == (a.KVA == nil) {
		return fmt.Errorf("kernels: mla_prepare: want one of QKVA and KVA: %w", ErrShape)
	}
	var err error
	if a.QKVA != nil {
		err = ops.SplitColumns(a.QKVA, a.Q, a.CKV, a.KPE)
	} else {
		err = ops.SplitColumns(a.KVA, a.CKV, a.KPE)
	}
	if err != nil {
		return err
	}
	return PrepareMLALatent(ops, a)
}

// PrepareMLALatent runs the steps after the split, over a.Q, a.CKV and
// a.KPE as they stand (a.QKVA and a.KVA are not read): RMSNorm of c_kv, RoPE of q (its
// rope dimensions after NopeDim in each head) and of k_pe, then the cache
// write (writeMLACacheRows).
func PrepareMLALatent(ops Ops, a MLAPrep) error {
	d := a.MLA
	if err := ops.RMSNorm(a.CKV, a.CKV, a.KVNorm, a.Eps); err != nil {
		return err
	}
	rp := RoPEParams{NumHeads: d.NumHeads, HeadSize: d.NopeDim + d.RopeDim, Offset: d.NopeDim, RotaryDim: d.RopeDim,
		Interleaved: a.Interleaved}
	if err := ops.RoPE(a.Q, a.Positions, a.Cos, a.Sin, rp); err != nil {
		return err
	}
	rp = RoPEParams{NumHeads: 1, HeadSize: d.RopeDim, RotaryDim: d.RopeDim, Interleaved: a.Interleaved}
	if err := ops.RoPE(a.KPE, a.Positions, a.Cos, a.Sin, rp); err != nil {
		return err
	}
	return writeMLACacheRows(ops, a.Cache, a.CKV, a.KPE, a.SlotMapping, d)
}

// writeMLACacheRows writes [c_kv k_pe] into an MLA latent cache: through
// MLACacher.WriteMLACache where the backend narrows the cache (its type is
// not the activations'), else with two WriteCache calls.
func writeMLACacheRows(ops Ops, cache, ckv, kpe, slotMapping Tensor, d MLAParams) error {
	if mc, ok := ops.(MLACacher); ok && cache.DType() != ops.ActivationDType() {
		return mc.WriteMLACache(cache, ckv, kpe, slotMapping, d)
	}
	if err := ops.WriteCache(cache, ckv, slotMapping, 0); err != nil {
		return err
	}
	return ops.WriteCache(cache, kpe, slotMapping, d.KVLoraRank)
}
