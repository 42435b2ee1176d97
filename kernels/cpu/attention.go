package cpu

import (
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// WriteCache scatters rows of src into cache slots.
func (b *Backend) WriteCache(cache, src, slotMapping kernels.Tensor, col int) error {
	const op = "write_cache"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	c, err := asCPU(op, "cache", cache)
	if err != nil {
		return err
	}
	s, err := asCPU(op, "src", src)
	if err != nil {
		return err
	}
	sm, err := asCPU(op, "slot_mapping", slotMapping)
	if err != nil {
		return err
	}
	if err := checkShape(op, "cache", c, []int{-1, -1, -1}, kernels.F32); err != nil {
		return err
	}
	numSlots, width := c.shape[0]*c.shape[1], c.shape[2]
	if err := checkShape(op, "src", s, []int{-1, -1}, kernels.F32); err != nil {
		return err
	}
	t, w := s.shape[0], s.shape[1]
	if col < 0 || col+w > width {
		return fmt.Errorf("cpu: %s: columns [%d, %d) of cache %v: %w", op, col, col+w, c, kernels.ErrShape)
	}
	if err := checkShape(op, "slot_mapping", sm, []int{t}, kernels.I32); err != nil {
		return err
	}
	for i, slot := range sm.i32 {
		if slot < -1 || int(slot) >= numSlots {
			return fmt.Errorf("cpu: %s: slot_mapping[%d] = %d, cache has %d slots: %w", op, i, slot, numSlots, kernels.ErrOutOfRange)
		}
	}
	b.forRows(t, w, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if slot := int(sm.i32[i]); slot >= 0 {
				copy(c.f32[slot*width+col:slot*width+col+w], s.f32[i*w:(i+1)*w])
			}
		}
	})
	return nil
}

// attnPlan is the host view of AttentionMetadata, validated against a cache.
type attnPlan struct {
	blockSize int
	qStart    []int // per sequence
	qLen      []int // per sequence
	kLen      []int // per sequence
	blocks    [][]int32
	tokSeq    []int32 // sequence of each query row
	maxK      int
}

// plan validates m against numTokens query rows and a cache of numBlocks
// blocks; every block a sequence reads must be a valid block index.
func plan(op string, m *kernels.AttentionMetadata, numTokens, numBlocks, blockSize int) (*attnPlan, error) {
	if m == nil {
		return nil, fmt.Errorf("cpu: %s: nil metadata: %w", op, kernels.ErrShape)
	}
	if m.BlockSize != blockSize || blockSize <= 0 {
		return nil, fmt.Errorf("cpu: %s: metadata block size %d, cache block size %d: %w", op, m.BlockSize, blockSize, kernels.ErrShape)
	}
	cu, err := asCPU(op, "cu_seqlens_q", m.CuSeqlensQ)
	if err != nil {
		return nil, err
	}
	sk, err := asCPU(op, "seqlens_k", m.SeqlensK)
	if err != nil {
		return nil, err
	}
	bt, err := asCPU(op, "block_tables", m.BlockTables)
	if err != nil {
		return nil, err
	}
	n := m.NumSeqs
	if err := checkShape(op, "cu_seqlens_q", cu, []int{n + 1}, kernels.I32); err != nil {
		return nil, err
	}
	if err := checkShape(op, "seqlens_k", sk, []int{n}, kernels.I32); err != nil {
		return nil, err
	}
	if err := checkShape(op, "block_tables", bt, []int{n, -1}, kernels.I32); err != nil {
		return nil, err
	}
	if cu.i32[0] != 0 || int(cu.i32[n]) != numTokens {
		return nil, fmt.Errorf("cpu: %s: cu_seqlens_q spans [%d, %d), q has %d rows: %w", op, cu.i32[0], cu.i32[n], numTokens, kernels.ErrShape)
	}
	maxBlocks := bt.shape[1]
	p := &attnPlan{
		blockSize: blockSize,
		qStart:    make([]int, n),
		qLen:      make([]int, n),
		kLen:      make([]int, n),
		blocks:    make([][]int32, n),
		tokSeq:    make([]int32, numTokens),
	}
	for s := range n {
		lo, hi, k := int(cu.i32[s]), int(cu.i32[s+1]), int(sk.i32[s])
		if hi < lo {
			return nil, fmt.Errorf("cpu: %s: cu_seqlens_q decreases at sequence %d: %w", op, s, kernels.ErrShape)
		}
		if k < hi-lo {
			return nil, fmt.Errorf("cpu: %s: sequence %d has %d queries but %d keys: %w", op, s, hi-lo, k, kernels.ErrShape)
		}
		need := (k + blockSize - 1) / blockSize
		if need > maxBlocks {
			return nil, fmt.Errorf("cpu: %s: sequence %d needs %d blocks, block table has %d: %w", op, s, need, maxBlocks, kernels.ErrOutOfRange)
		}
		row := bt.i32[s*maxBlocks : s*maxBlocks+need]
		for j, blk := range row {
			if blk < 0 || int(blk) >= numBlocks {
				return nil, fmt.Errorf("cpu: %s: block_tables[%d][%d] = %d, cache has %d blocks: %w", op, s, j, blk, numBlocks, kernels.ErrOutOfRange)
			}
		}
		p.qStart[s], p.qLen[s], p.kLen[s], p.blocks[s] = lo, hi-lo, k, row
		p.maxK = max(p.maxK, k)
		for i := lo; i < hi; i++ {
			p.tokSeq[i] = int32(s)
		}
	}
	return p, nil
}

// visible returns the sequence of query row i and how many keys it sees.
func (p *attnPlan) visible(i int) (seq, numKeys int) {
	s := int(p.tokSeq[i])
	j := i - p.qStart[s]
	return s, p.kLen[s] - p.qLen[s] + j + 1
}

// slot is the cache slot of key t of sequence s.
func (p *attnPlan) slot(s, t int) int {
	return int(p.blocks[s][t/p.blockSize])*p.blockSize + t%p.blockSize
}

// softmaxInPlace turns scores into exp(score - max) and returns their sum.
func softmaxInPlace(scores []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range scores {
		m = max(m, v)
	}
	var sum float32
	for i, v := range scores {
		e := float32(math.Exp(float64(v - m)))
		scores[i] = e
		sum += e
	}
	return sum
}

// Attention is paged causal GQA attention; see kernels.Ops.
func (b *Backend) Attention(out, q, kCache, vCache kernels.Tensor, m *kernels.AttentionMetadata, p kernels.AttentionParams) error {
	const op = "attention"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	qs, err := asCPU(op, "q", q)
	if err != nil {
		return err
	}
	kc, err := asCPU(op, "k_cache", kCache)
	if err != nil {
		return err
	}
	vc, err := asCPU(op, "v_cache", vCache)
	if err != nil {
		return err
	}
	if p.NumHeads <= 0 || p.NumKVHeads <= 0 || p.NumHeads%p.NumKVHeads != 0 || p.HeadDim <= 0 {
		return fmt.Errorf("cpu: %s: params %+v: %w", op, p, kernels.ErrShape)
	}
	d, kvWidth := p.HeadDim, p.NumKVHeads*p.HeadDim
	if err := checkShape(op, "q", qs, []int{-1, p.NumHeads * d}, kernels.F32); err != nil {
		return err
	}
	t := qs.shape[0]
	if err := checkShape(op, "out", o, []int{t, p.NumHeads * d}, kernels.F32); err != nil {
		return err
	}
	if err := checkShape(op, "k_cache", kc, []int{-1, -1, kvWidth}, kernels.F32); err != nil {
		return err
	}
	if err := checkShape(op, "v_cache", vc, kc.shape, kernels.F32); err != nil {
		return err
	}
	pl, err := plan(op, m, t, kc.shape[0], kc.shape[1])
	if err != nil {
		return err
	}
	group := p.NumHeads / p.NumKVHeads
	nh := p.NumHeads
	b.forRows(t*nh, pl.maxK*d, func(lo, hi int) {
		scores := make([]float32, pl.maxK)
		for item := lo; item < hi; item++ {
			i, h := item/nh, item%nh
			s, nk := pl.visible(i)
			first := 0
			if p.SlidingWindow > 0 {
				first = max(0, nk-p.SlidingWindow)
			}
			kvOff := (h / group) * d
			qv := qs.f32[i*nh*d+h*d : i*nh*d+(h+1)*d]
			sc := scores[:nk-first]
			for j := range sc {
				base := pl.slot(s, first+j)*kvWidth + kvOff
				sc[j] = b.k.dot(qv, kc.f32[base:base+d]) * p.Scale
			}
			sum := softmaxInPlace(sc)
			ov := o.f32[i*nh*d+h*d : i*nh*d+(h+1)*d]
			clear(ov)
			for j := range sc {
				base := pl.slot(s, first+j)*kvWidth + kvOff
				b.k.axpy(sc[j], vc.f32[base:base+d], ov)
			}
			inv := 1 / sum
			for j := range ov {
				ov[j] *= inv
			}
		}
	})
	return nil
}

// MLAAttention is latent attention with weight absorption; see kernels.Ops.
func (b *Backend) MLAAttention(out, q, cache, wkvb kernels.Tensor, m *kernels.AttentionMetadata, p kernels.MLAParams) error {
	const op = "mla_attention"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	qs, err := asCPU(op, "q", q)
	if err != nil {
		return err
	}
	c, err := asCPU(op, "cache", cache)
	if err != nil {
		return err
	}
	w, err := asCPU(op, "wkvb", wkvb)
	if err != nil {
		return err
	}
	if p.NumHeads <= 0 || p.NopeDim <= 0 || p.RopeDim <= 0 || p.KVLoraRank <= 0 || p.VHeadDim <= 0 {
		return fmt.Errorf("cpu: %s: params %+v: %w", op, p, kernels.ErrShape)
	}
	nh, nope, rope, kvl, vd := p.NumHeads, p.NopeDim, p.RopeDim, p.KVLoraRank, p.VHeadDim
	qd := nope + rope
	if err := checkShape(op, "q", qs, []int{-1, nh * qd}, kernels.F32); err != nil {
		return err
	}
	t := qs.shape[0]
	if err := checkShape(op, "out", o, []int{t, nh * vd}, kernels.F32); err != nil {
		return err
	}
	width := kvl + rope
	if err := checkShape(op, "cache", c, []int{-1, -1, width}, kernels.F32); err != nil {
		return err
	}
	if err := checkShape(op, "wkvb", w, []int{nh * (nope + vd), kvl}, floatTypes...); err != nil {
		return err
	}
	pl, err := plan(op, m, t, c.shape[0], c.shape[1])
	if err != nil {
		return err
	}
	b.forRows(t*nh, pl.maxK*width+(nope+vd)*kvl, func(lo, hi int) {
		scores := make([]float32, pl.maxK)
		qLat := make([]float32, kvl)
		oLat := make([]float32, kvl)
		buf := make([]float32, kvl)
		for item := lo; item < hi; item++ {
			i, h := item/nh, item%nh
			s, nk := pl.visible(i)
			qh := qs.f32[i*nh*qd+h*qd : i*nh*qd+(h+1)*qd]
			qNope, qPe := qh[:nope], qh[nope:]
			wBase := h * (nope + vd)
			// Absorb W_UK: q_lat = sum_d q_nope[d] * W_UK[h][d, :].
			clear(qLat)
			for dd := range nope {
				b.k.axpy(qNope[dd], b.rowF32(w, wBase+dd, kvl, buf), qLat)
			}
			sc := scores[:nk]
			for key := range sc {
				row := c.f32[pl.slot(s, key)*width : (pl.slot(s, key)+1)*width]
				sc[key] = (b.k.dot(qLat, row[:kvl]) + b.k.dot(qPe, row[kvl:])) * p.Scale
			}
			sum := softmaxInPlace(sc)
			clear(oLat)
			for key := range sc {
				row := c.f32[pl.slot(s, key)*width : pl.slot(s, key)*width+kvl]
				b.k.axpy(sc[key], row, oLat)
			}
			inv := 1 / sum
			for j := range oLat {
				oLat[j] *= inv
			}
			// Project by W_UV: out[e] = o_lat · W_UV[h][e, :].
			ov := o.f32[i*nh*vd+h*vd : i*nh*vd+(h+1)*vd]
			for e := range vd {
				ov[e] = b.k.dot(oLat, b.rowF32(w, wBase+nope+e, kvl, buf))
			}
		}
	})
	return nil
}
