package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// mlaPrefillMinRows is the least number of query rows of a sequence in one
// MLAAttention call for its rows to take the non-absorbed prefill kernels
// (attention_mla_prefill.cu); the other rows
// take the absorbed ones (attention_mla_tc.cu). See mlaTC.
const mlaPrefillMinRows = 16

// The bound is the library's: a mismatch does not compile.
var (
	_ [mlaPrefillMinRows - C.DI_MLA_PREFILL_MIN_ROWS]struct{}
	_ [C.DI_MLA_PREFILL_MIN_ROWS - mlaPrefillMinRows]struct{}
)

// mlaPrefillShape reports whether the prefill kernels take a layer of p's
// sizes over a cache of dtype dt: DeepSeek-V2/V3's heads (qk_nope 128,
// qk_rope 64, v head 128, kv_lora_rank 128 or 512) over an F16, BF16 or
// 8-bit (F8E4M3) latent cache.
func mlaPrefillShape(p kernels.MLAParams, dt kernels.DType) bool {
	return (dt == kernels.F16 || dt == kernels.BF16 || dt == kernels.F8E4M3) && p.NopeDim == 128 && p.RopeDim == 64 && p.VHeadDim == 128 &&
		(p.KVLoraRank == 128 || p.KVLoraRank == 512)
}

// mlaTC queues MLAAttention over a 16- or 8-bit latent cache c (arguments
// checked by MLAAttention, metadata cm; keep: the tensors the launch
// reads). Which rows take which kernels:
//   - a sequence with at least mlaPrefillMinRows query rows in the call,
//     where mlaPrefillShape holds: the non-absorbed form (its visible keys'
//     latents expanded to per-head K_nope and V with wkvb, then causal
//     FlashAttention on tensor cores in key tiles aligned to absolute
//     positions; q, the expanded keys and values and the probabilities
//     rounded to the cache's 16-bit type, or to half for the 8-bit cache,
//     whose rows are widened as the absorbed kernels widen them; float32
//     accumulation). A row's
//     bits depend on its own sequence's keys only, so a prompt prefilled in
//     chunks of at least mlaPrefillMinRows rows gives the whole prompt's
//     bits.
//   - every other row (decode rows, speculative verification rows, short
//     chunks), every row of other sizes, every row of
//     a call of several sequences made while a graph is captured, and
//     every row with Options.DisableMLAPrefill: the absorbed form
//     (attention_mla_tc.cu), whose bits do not depend on the call's other
//     rows either.
//
// A row computed both ways (as a decode row and inside a prefill chunk)
// agrees to rounding only, as the GQA decode and prefill kernels do. With
// prefill rows and more than one sequence the library sizes its launches
// by the plan's totals that hostCu (the metadata's HostCuSeqlensQ) gives
// (mlaPrefillHint), or, without it or where that bound would cost more
// passes over the heads, waits for three counts of the call's plan (one
// small copy to the host).
func (b *Backend) mlaTC(op string, o, qs, c, w *Tensor, cm *C.di_attn_meta, hostCu []int32, keep []*Tensor, p kernels.MLAParams) error {
	nh, nope, rope, kvl, vd := p.NumHeads, p.NopeDim, p.RopeDim, p.KVLoraRank, p.VHeadDim
	if b.opts.DisableMLAPrefill || !mlaPrefillShape(p, c.dtype) {
		return b.launch(op, func() C.int {
			return C.c_mla_attention_tc(b.lib.api, b.ctx, o.ptr(), qs.ptr(), c.ptr(), C.int(c.dtype), w.ptr(), C.int(w.dtype), cm,
				C.int(nh), C.int(nope), C.int(rope), C.int(kvl), C.int(vd), C.float(p.Scale))
		}, append(keep, o, qs, c, w)...)
	}
	if b.opts.DisableMLAPrefillHint {
		hostCu = nil
	}
	hint, ok, err := mlaPrefillHint(hostCu, int(cm.num_seqs), int(cm.num_tokens), int(cm.max_blocks_per_seq*cm.block_size))
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	return b.launch(op, func() C.int {
		h := &hint
		if !ok {
			h = nil
		}
		return C.c_mla_attention_pf(b.lib.api, b.ctx, o.ptr(), qs.ptr(), c.ptr(), C.int(c.dtype), w.ptr(), C.int(w.dtype), cm,
			C.int(nh), C.int(nope), C.int(rope), C.int(kvl), C.int(vd), C.float(p.Scale), h)
	}, append(keep, o, qs, c, w)...)
}

// mlaPrefillHint is the totals of a call's prefill plan (C.di_mla_pf_hint)
// as the host copy cu of its cu_seqlens_q gives them: the query tiles of
// the sequences of at least mlaPrefillMinRows rows and the other
// sequences' rows, exact, and those prefill sequences' expanded key rows
// bounded by maxKeys (the block table's reach) each, rounded up to the
// tile. ok is false without cu, or where the bound does not fit an int32
// (the library then reads the plan's counts). A cu that is not numSeqs+1
// offsets from 0 to numTokens, never decreasing, is an error. Cost:
// O(numSeqs).
func mlaPrefillHint(cu []int32, numSeqs, numTokens, maxKeys int) (h C.di_mla_pf_hint, ok bool, err error) {
	if cu == nil {
		return h, false, nil
	}
	if len(cu) != numSeqs+1 || cu[0] != 0 || int(cu[numSeqs]) != numTokens {
		return h, false, fmt.Errorf("HostCuSeqlensQ: %d offsets from %v, want %d from 0 to %d tokens", len(cu), cu[:min(len(cu), 1)], numSeqs+1, numTokens)
	}
	const tile = C.DI_MLA_PREFILL_TILE
	var prefill, tiles, absorbed int64
	for s := range numSeqs {
		ql := int64(cu[s+1] - cu[s])
		switch {
		case ql < 0:
			return h, false, fmt.Errorf("HostCuSeqlensQ: offset %d (%d) below offset %d (%d)", s+1, cu[s+1], s, cu[s])
		case ql >= mlaPrefillMinRows:
			prefill++
			tiles += (ql + tile - 1) / tile
		default:
			absorbed += ql
		}
	}
	rows := prefill * ((int64(maxKeys) + tile - 1) / tile * tile)
	if rows > 1<<30 || tiles > 1<<30 {
		return h, false, nil
	}
	h.rows, h.tiles, h.absorbed = C.int(rows), C.int(tiles), C.int(absorbed)
	return h, true, nil
}
