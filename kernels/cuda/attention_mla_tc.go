package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

var _ kernels.MLACacher = (*Backend)(nil)

// mlaTCShape reports whether the tensor-core MLA kernels take the latent
// sizes of p: kv_lora_rank 128 or 512 (DeepSeek-V2/V3: 512) and a rope
// dim of 16 to 64 in steps of 16.
func mlaTCShape(p kernels.MLAParams) bool {
	return (p.KVLoraRank == 128 || p.KVLoraRank == 512) && p.RopeDim > 0 && p.RopeDim <= 64 && p.RopeDim%16 == 0
}

// MLACacheLayout implements kernels.MLACacher with the rule of the GQA
// caches (KVCacheDType): the packed 8-bit row under Options.KVCacheDType
// F8E4M3, half rows for 16-bit weights in GEMM mode round, float32 rows
// otherwise, and for latent sizes the tensor-core kernels do not take
// (mlaTCShape).
func (b *Backend) MLACacheLayout(weights kernels.DType, p kernels.MLAParams) (kernels.DType, int) {
	w := p.KVLoraRank + p.RopeDim
	if !mlaTCShape(p) {
		return kernels.F32, w
	}
	switch dt := b.KVCacheDType(weights); dt {
	case kernels.F8E4M3:
		return dt, kernels.MLAF8RowBytes(p.KVLoraRank, p.RopeDim)
	case kernels.F16:
		return dt, w
	}
	return kernels.F32, w
}

// mlaCacheDTypes are the latent caches' element types besides F32.
var mlaCacheDTypes = []kernels.DType{kernels.F16, kernels.BF16, kernels.F8E4M3}

// mlaCache checks a latent cache [blocks, block_size, width] for p (its
// width from its dtype, see kernels.MLACacheLayout) and returns its rows.
func mlaCache(op string, c *Tensor, p kernels.MLAParams) (slots int, err error) {
	width := p.KVLoraRank + p.RopeDim
	if c.dtype == kernels.F8E4M3 {
		width = kernels.MLAF8RowBytes(p.KVLoraRank, p.RopeDim)
	}
	if err := kernels.CheckShape("cuda", op, "cache", c, []int{-1, -1, width}, append([]kernels.DType{kernels.F32}, mlaCacheDTypes...)...); err != nil {
		return 0, err
	}
	if c.dtype != kernels.F32 && !mlaTCShape(p) {
		return 0, fmt.Errorf("cuda: %s: a %v latent cache needs kv_lora_rank 128 or 512 and a rope dim of 16 to 64 in steps of 16, got %+v: %w",
			op, c.dtype, p, kernels.ErrDType)
	}
	return c.shape[0] * c.shape[1], nil
}

// WriteMLACache implements kernels.MLACacher: one kernel writes c_kv and
// k_pe into each token's cache row, rounded or packed (8-bit: per 128
// columns a float32 scale, kernels.MLAF8RowBytes). A slot outside the
// cache is reported by the next Download or Sync.
func (b *Backend) WriteMLACache(cache, ckv, kpe, slotMapping kernels.Tensor, p kernels.MLAParams) error {
	const op = "mla_write_cache"
	c, err := asCUDA(op, "cache", cache)
	if err != nil {
		return err
	}
	x, err := asCUDA(op, "ckv", ckv)
	if err != nil {
		return err
	}
	xp, err := asCUDA(op, "kpe", kpe)
	if err != nil {
		return err
	}
	sm, err := asCUDA(op, "slot_mapping", slotMapping)
	if err != nil {
		return err
	}
	if p.KVLoraRank <= 0 || p.RopeDim <= 0 {
		return fmt.Errorf("cuda: %s: params %+v: %w", op, p, kernels.ErrShape)
	}
	slots, err := mlaCache(op, c, p)
	if err != nil {
		return err
	}
	if err := kernels.CheckShape("cuda", op, "ckv", x, []int{-1, p.KVLoraRank}, kernels.F32); err != nil {
		return err
	}
	t := x.shape[0]
	if err := kernels.CheckShape("cuda", op, "kpe", xp, []int{t, p.RopeDim}, kernels.F32); err != nil {
		return err
	}
	if err := kernels.CheckShape("cuda", op, "slot_mapping", sm, []int{t}, kernels.I32); err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_mla_write_cache(b.lib.api, b.ctx, c.ptr(), C.int(c.dtype), x.ptr(), xp.ptr(), sm.ptr(), C.int(t),
			C.int(p.KVLoraRank), C.int(p.RopeDim), C.int(slots))
	}, c, x, xp, sm)
}

var _ kernels.MLAPreparer = (*Backend)(nil)

// PrepareMLA implements kernels.MLAPreparer: unless
// Options.DisableFusedMLAPrepare, one kernel a call (a block a token) splits the fused q / kv_a
// projection (or takes q in place and kv_a's own rows: MLAPrep.KVA),
// normalizes c_kv, rotates q's rope dimensions and k_pe and
// writes the cache row, with the bits of kernels.PrepareMLASteps (the same
// shared device code for the norm's sum, the rotation and the row's
// rounding or packing). Without the option, and for shapes the kernel does
// not take (kv_lora_rank above 4096, an odd rope dim, an 8-bit cache whose
// rank is not a multiple of 128), the steps run. Bad positions and slots
// are reported by the next Download or Sync.
func (b *Backend) PrepareMLA(a kernels.MLAPrep) error {
	const op = "mla_prepare"
	d := a.MLA
	if !b.mlaPrepare || d.KVLoraRank <= 0 || d.KVLoraRank > 4096 || d.RopeDim <= 0 || d.RopeDim%2 != 0 || d.NumHeads <= 0 || d.NopeDim < 0 ||
		(a.Cache != nil && a.Cache.DType() == kernels.F8E4M3 && (d.KVLoraRank%128 != 0 || d.RopeDim%8 != 0)) {
		return kernels.PrepareMLASteps(b, a)
	}
	if (a.QKVA == nil) == (a.KVA == nil) {
		return fmt.Errorf("cuda: %s: want one of QKVA and KVA: %w", op, kernels.ErrShape)
	}
	src, srcName := a.QKVA, "qkva"
	if a.KVA != nil {
		src, srcName = a.KVA, "kva"
	}
	ts := map[string]kernels.Tensor{srcName: src, "q": a.Q, "cache": a.Cache, "kv_norm": a.KVNorm,
		"slot_mapping": a.SlotMapping, "positions": a.Positions, "cos": a.Cos, "sin": a.Sin}
	cu := make(map[string]*Tensor, len(ts))
	for name, t := range ts {
		c, err := asCUDA(op, name, t)
		if err != nil {
			return err
		}
		cu[name] = c
	}
	c := cu["cache"]
	slots, err := mlaCache(op, c, d)
	if err != nil {
		return err
	}
	qd := d.NumHeads * (d.NopeDim + d.RopeDim)
	x := cu[srcName]
	width := qd + d.KVLoraRank + d.RopeDim // the fused row [q c_kv k_pe]
	if a.KVA != nil {
		width = d.KVLoraRank + d.RopeDim
	}
	if err := kernels.CheckShape("cuda", op, srcName, x, []int{-1, width}, kernels.F32); err != nil {
		return err
	}
	t := x.shape[0]
	half := d.RopeDim / 2
	if err := kernels.CheckShape("cuda", op, "cos", cu["cos"], []int{-1, half}, kernels.F32); err != nil {
		return err
	}
	for _, s := range []struct {
		name  string
		shape []int
		dt    kernels.DType
	}{{"q", []int{t, qd}, kernels.F32}, {"kv_norm", []int{d.KVLoraRank}, kernels.F32},
		{"slot_mapping", []int{t}, kernels.I32}, {"positions", []int{t}, kernels.I32},
		{"sin", []int{cu["cos"].shape[0], half}, kernels.F32}} {
		if err := kernels.CheckShape("cuda", op, s.name, cu[s.name], s.shape, s.dt); err != nil {
			return err
		}
	}
	il := 0
	if a.Interleaved {
		il = 1
	}
	q, w, sm, ps, cs, sn := cu["q"], cu["kv_norm"], cu["slot_mapping"], cu["positions"], cu["cos"], cu["sin"]
	return b.launch(op, func() C.int {
		// q's source and kv_a's: the fused row's two parts, or q in place
		// and kv_a's own rows.
		qIn, qStride, kva := x.ptr(), width, x.ptr()+C.di_dptr(4*qd)
		if a.KVA != nil {
			qIn, qStride, kva = q.ptr(), qd, x.ptr()
		}
		return C.c_mla_prepare(b.lib.api, b.ctx, q.ptr(), c.ptr(), C.int(c.dtype), qIn, C.int(qStride), kva, C.int(width),
			w.ptr(), sm.ptr(), ps.ptr(), cs.ptr(), sn.ptr(), C.int(t), C.int(cs.shape[0]), C.int(d.NumHeads),
			C.int(d.NopeDim), C.int(d.RopeDim), C.int(d.KVLoraRank), C.int(il), C.float(a.Eps), C.int(slots))
	}, q, c, x, w, sm, ps, cs, sn)
}

// MLALatentAttention is the latent half of MLAAttention over a 16- or
// 8-bit latent cache (FlashMLA's kernel): olat F32 [T, NumHeads,
// KVLoraRank] gets, per query row and head, the softmax over the row's
// visible keys (the causal rule of Attention) of q_lat · cache row,
// applied to the keys' c_kv. qlat [T, NumHeads, KVLoraRank+RopeDim] is F16
// (BF16 over a BF16 cache): the absorbed query followed by q_pe, already
// multiplied by Scale * log2(e). A row's bits depend on its own keys only.
// Cost: one read of each row's visible cache rows per group of 16 heads
// (MLAAttention's absorptions excluded).
func (b *Backend) MLALatentAttention(olat, qlat, cache kernels.Tensor, m *kernels.AttentionMetadata, p kernels.MLAParams) error {
	const op = "mla_latent_attention"
	o, err := asCUDA(op, "olat", olat)
	if err != nil {
		return err
	}
	q, err := asCUDA(op, "qlat", qlat)
	if err != nil {
		return err
	}
	c, err := asCUDA(op, "cache", cache)
	if err != nil {
		return err
	}
	if _, err := mlaCache(op, c, p); err != nil {
		return err
	}
	if c.dtype == kernels.F32 {
		return fmt.Errorf("cuda: %s: cache is F32, want F16, BF16 or F8E4M3: %w", op, kernels.ErrDType)
	}
	qdt := kernels.F16
	if c.dtype == kernels.BF16 {
		qdt = kernels.BF16
	}
	nh, kvl, rope := p.NumHeads, p.KVLoraRank, p.RopeDim
	if err := kernels.CheckShape("cuda", op, "qlat", q, []int{-1, nh, kvl + rope}, qdt); err != nil {
		return err
	}
	t := q.shape[0]
	if err := kernels.CheckShape("cuda", op, "olat", o, []int{t, nh, kvl}, kernels.F32); err != nil {
		return err
	}
	cm, keep, err := attnMeta(op, m, t, c.shape[0], c.shape[1])
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_mla_latent_attention(b.lib.api, b.ctx, o.ptr(), q.ptr(), c.ptr(), C.int(c.dtype), &cm, C.int(nh), C.int(kvl), C.int(rope))
	}, append(keep, o, q, c)...)
}
