package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// The sliding-window and sink capabilities of the backend: ring-buffer
// attention (kernels.RingAttentioner) and learned sink logits in every
// attention kernel (kernels.AttentionSinker).

// AttentionSinks reports that Attention and RingAttention honour
// kernels.AttentionParams.Sinks (decode and prefill kernels, paged and
// ring, every cache type).
func (b *Backend) AttentionSinks() bool { return true }

// sinkTensor checks AttentionParams.Sinks (F32 [NumHeads]) and returns it,
// or nil when the layer has none.
func sinkTensor(op string, p kernels.AttentionParams) (*Tensor, error) {
	s, err := optCUDA(op, "sinks", p.Sinks)
	if err != nil || s == nil {
		return nil, err
	}
	if err := kernels.CheckShape("cuda", op, "sinks", s, []int{p.NumHeads}, kernels.F32); err != nil {
		return nil, err
	}
	return s, nil
}

// RingAttention is attention for a sliding-window layer whose keys live in
// per-sequence ring buffers; see kernels.RingAttentioner. It runs the paged
// attention kernels over block tables built on the device, so a row gets
// the bits Attention gives it over the same keys in paged blocks with
// SlidingWindow = window: decode rows read the ring in place (their own key
// and value are first written into the ring rows that the caller's
// WriteCache then writes again with the same values); sequences with
// several query rows this step have their visible keys gathered into
// scratch paged blocks first (one copy of a window of keys and values per
// such sequence). m.MaxSeqlenK must bound m.SeqlensK; m.BlockTables and
// m.SlotMapping are not read. Nothing waits for the host, so decode steps
// can be captured in graphs. Slots outside the ring and inconsistent
// lengths are reported by the next Download or Sync.
func (b *Backend) RingAttention(out, q, k, v, kRing, vRing, slots kernels.Tensor, m *kernels.AttentionMetadata, p kernels.AttentionParams) error {
	const op = "ring_attention"
	var ts [7]*Tensor
	if err := asCUDAs(op, ts[:], tensorArg{"out", out}, tensorArg{"q", q}, tensorArg{"k", k}, tensorArg{"v", v},
		tensorArg{"k_ring", kRing}, tensorArg{"v_ring", vRing}, tensorArg{"slots", slots}); err != nil {
		return err
	}
	o, qs, ks, vs, kr, vr, sl := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6]
	t, numSlots, err := kernels.RingAttentionShapes("cuda", o, qs, ks, vs, kr, vr, sl, p, normOutTypes, cacheDTypes)
	if err != nil {
		return err
	}
	if err := kernels.CheckShape("cuda", op, "v_ring", vr, kr.shape, kr.dtype); err != nil {
		return err
	}
	if m == nil {
		return fmt.Errorf("cuda: %s: nil metadata: %w", op, kernels.ErrShape)
	}
	n := m.NumSeqs
	if n < 0 || (n == 0 && t > 0) || m.NumTokens != t {
		return fmt.Errorf("cuda: %s: %d sequences, metadata of %d tokens for %d query rows: %w", op, n, m.NumTokens, t, kernels.ErrShape)
	}
	if m.MaxSeqlenK <= 0 && t > 0 {
		return fmt.Errorf("cuda: %s: MaxSeqlenK %d: the ring's block tables are sized from it: %w", op, m.MaxSeqlenK, kernels.ErrShape)
	}
	cu, err := asCUDA(op, "cu_seqlens_q", m.CuSeqlensQ)
	if err != nil {
		return err
	}
	sk, err := asCUDA(op, "seqlens_k", m.SeqlensK)
	if err != nil {
		return err
	}
	if err := kernels.CheckShape("cuda", op, "cu_seqlens_q", cu, []int{n + 1}, kernels.I32); err != nil {
		return err
	}
	if err := kernels.CheckShape("cuda", op, "seqlens_k", sk, []int{n}, kernels.I32); err != nil {
		return err
	}
	if err := kernels.CheckShape("cuda", op, "slots", sl, []int{n}, kernels.I32); err != nil {
		return err
	}
	sinks, err := sinkTensor(op, p)
	if err != nil {
		return err
	}
	var cm C.di_attn_meta
	cm.num_seqs = C.int(n)
	cm.num_tokens = C.int(t)
	cm.max_seqlen_q = C.int(max(m.MaxSeqlenQ, 0))
	cm.cu_seqlens_q = cu.ptr()
	cm.seqlens_k = sk.ptr()
	name := op
	if b.prof != nil && m.MaxSeqlenQ == 1 {
		name = "ring_attention decode"
	}
	return b.launch(name, func() C.int {
		return C.c_ring_attention(b.lib.api, b.ctx, o.ptr(), C.int(o.dtype), qs.ptr(), ks.ptr(), vs.ptr(), kr.ptr(), vr.ptr(), sl.ptr(),
			C.int(numSlots), &cm, C.int(m.MaxSeqlenK), C.int(p.NumHeads), C.int(p.NumKVHeads), C.int(p.HeadDim), C.float(p.Scale),
			C.int(p.SlidingWindow), C.int(p.InputDType), C.int(kr.dtype), optPtr(sinks))
	}, o, qs, ks, vs, kr, vr, sl, cu, sk, sinks)
}

var (
	_ kernels.RingAttentioner = (*Backend)(nil)
	_ kernels.AttentionSinker = (*Backend)(nil)
)
