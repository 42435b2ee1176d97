package cuda

/*
#include "api.h"
*/
import "C"

import "github.com/deepinfer/deepinfer-go/kernels"

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
// prefill rows and more than one sequence the library waits for three
// counts of the call's plan (one small copy to the host).
func (b *Backend) mlaTC(op string, o, qs, c, w *Tensor, cm *C.di_attn_meta, keep []*Tensor, p kernels.MLAParams) error {
	nh, nope, rope, kvl, vd := p.NumHeads, p.NopeDim, p.RopeDim, p.KVLoraRank, p.VHeadDim
	if b.opts.DisableMLAPrefill || !mlaPrefillShape(p, c.dtype) {
		return b.launch(op, func() C.int {
			return C.c_mla_attention_tc(b.lib.api, b.ctx, o.ptr(), qs.ptr(), c.ptr(), C.int(c.dtype), w.ptr(), C.int(w.dtype), cm,
				C.int(nh), C.int(nope), C.int(rope), C.int(kvl), C.int(vd), C.float(p.Scale))
		}, append(keep, o, qs, c, w)...)
	}
	return b.launch(op, func() C.int {
		return C.c_mla_attention_pf(b.lib.api, b.ctx, o.ptr(), qs.ptr(), c.ptr(), C.int(c.dtype), w.ptr(), C.int(w.dtype), cm,
			C.int(nh), C.int(nope), C.int(rope), C.int(kvl), C.int(vd), C.float(p.Scale))
	}, append(keep, o, qs, c, w)...)
}
