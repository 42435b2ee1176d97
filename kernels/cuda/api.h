// api.h: C helpers for the Go side of the CUDA backend (included by the
// cgo preamble of each Go file): dlopen of the library and trampolines that
// call the ABI's function pointers, which cgo cannot call directly.
#ifndef DEEPINFER_CUDA_GO_API_H
#define DEEPINFER_CUDA_GO_API_H
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "deepinfer_cuda.h"

typedef int (*di_get_api_fn)(uint32_t, di_api *);

static inline void *di_dlopen(const char *path, char *err, int errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, (size_t)errlen, "%s", e ? e : "dlopen failed");
	}
	return h;
}

// di_load returns -1 when the symbol is missing, else di_get_api's status.
static inline int di_load(void *h, di_api *api, char *err, int errlen) {
	dlerror();
	di_get_api_fn f = (di_get_api_fn)dlsym(h, "di_get_api");
	if (!f) {
		const char *e = dlerror();
		snprintf(err, (size_t)errlen, "%s", e ? e : "di_get_api not found");
		return -1;
	}
	return f(DI_ABI_VERSION, api);
}

// Trampolines: cgo cannot call C function pointers directly.
static inline int c_device_count(di_api *a, int *n, char *err, int errlen) { return a->device_count(n, err, errlen); }
static inline int c_create(di_api *a, int dev, di_ctx **out, char *err, int errlen) { return a->create(dev, out, err, errlen); }
static inline void c_destroy(di_api *a, di_ctx *c) { a->destroy(c); }
static inline const char *c_last_error(di_api *a, di_ctx *c) { return a->last_error(c); }
static inline int c_device_info(di_api *a, di_ctx *c, di_device_info *o) { return a->device_info(c, o); }
static inline int c_mem_stats(di_api *a, di_ctx *c, di_mem_stats *o) { return a->mem_stats(c, o); }
static inline int c_gemm_stats(di_api *a, di_ctx *c, di_gemm_stats *o) { return a->gemm_stats(c, o); }
static inline int c_set_options(di_api *a, di_ctx *c, const di_options *o) { return a->set_options(c, o); }
static inline int c_alloc(di_api *a, di_ctx *c, uint64_t n, di_dptr *o) { return a->alloc(c, n, o); }
static inline int c_free(di_api *a, di_ctx *c, di_dptr p) { return a->free(c, p); }
static inline int c_empty_cache(di_api *a, di_ctx *c) { return a->empty_cache(c); }
static inline int c_memset_zero(di_api *a, di_ctx *c, di_dptr p, uint64_t n) { return a->memset_zero(c, p, n); }
static inline int c_upload(di_api *a, di_ctx *c, di_dptr d, const void *s, uint64_t n) { return a->upload(c, d, s, n); }
static inline int c_upload_widen(di_api *a, di_ctx *c, di_dptr d, const void *s, int dt, uint64_t n) { return a->upload_widen(c, d, s, dt, n); }
static inline int c_download(di_api *a, di_ctx *c, void *d, di_dptr s, uint64_t n) { return a->download(c, d, s, n); }
static inline int c_download_async(di_api *a, di_ctx *c, void *d, di_dptr s, uint64_t n) { return a->download_async(c, d, s, n); }
static inline int c_host_alloc(di_api *a, di_ctx *c, uint64_t n, void **p) { return a->host_alloc(c, n, p); }
static inline int c_host_free(di_api *a, di_ctx *c, void *p) { return a->host_free(c, p); }
static inline int c_copy(di_api *a, di_ctx *c, di_dptr d, di_dptr s, uint64_t n) { return a->copy(c, d, s, n); }
static inline int c_copy_2d(di_api *a, di_ctx *c, di_dptr d, uint64_t dp, di_dptr s, uint64_t sp, uint64_t w, uint64_t rows) {
	return a->copy_2d(c, d, dp, s, sp, w, rows);
}
static inline int c_copy_rects(di_api *a, di_ctx *c, const di_rect *r, int n) { return a->copy_rects(c, r, n); }
static inline int c_sync(di_api *a, di_ctx *c) { return a->sync(c); }
static inline int c_event_create(di_api *a, di_ctx *c, void **e) { return a->event_create(c, e); }
static inline int c_event_record(di_api *a, di_ctx *c, void *e) { return a->event_record(c, e); }
static inline int c_event_synchronize(di_api *a, di_ctx *c, void *e) { return a->event_synchronize(c, e); }
static inline int c_event_elapsed_ms(di_api *a, di_ctx *c, void *s, void *e, float *ms) { return a->event_elapsed_ms(c, s, e, ms); }
static inline int c_event_destroy(di_api *a, di_ctx *c, void *e) { return a->event_destroy(c, e); }
static inline int c_graph_begin(di_api *a, di_ctx *c) { return a->graph_begin(c); }
static inline int c_graph_end(di_api *a, di_ctx *c, void **x, size_t *n) { return a->graph_end(c, x, n); }
static inline int c_graph_replay(di_api *a, di_ctx *c, void *x) { return a->graph_replay(c, x); }
static inline int c_graph_destroy(di_api *a, di_ctx *c, void *x) { return a->graph_destroy(c, x); }
static inline int c_embedding(di_api *a, di_ctx *c, di_dptr out, di_dptr table, int dt, di_dptr ids, int t, int hidden, int vocab) {
	return a->embedding(c, out, table, dt, ids, t, hidden, vocab);
}
static inline int c_rms_norm(di_api *a, di_ctx *c, di_dptr out, int odt, di_dptr res, di_dptr x, di_dptr w, int rows, int n, float eps) {
	return a->rms_norm(c, out, odt, res, x, w, rows, n, eps);
}
static inline int c_linear(di_api *a, di_ctx *c, di_dptr out, di_dptr x, int xdt, di_dptr w, int dt, di_dptr bias, int m, int n, int k) {
	return a->linear(c, out, x, xdt, w, dt, bias, m, n, k);
}
static inline int c_linear_input_dtype(di_api *a, di_ctx *c, int dt, int m) {
	return a->linear_input_dtype(c, dt, m);
}
static inline int c_gated_linear(di_api *a, di_ctx *c, di_dptr act, di_dptr gu, di_dptr x, di_dptr w, int dt, int m, int n, int k) {
	return a->gated_linear(c, act, gu, x, w, dt, m, n, k);
}
static inline int c_silu_mul(di_api *a, di_ctx *c, di_dptr out, di_dptr gu, int rows, int n) { return a->silu_mul(c, out, gu, rows, n); }
static inline int c_gated_mlp(di_api *a, di_ctx *c, di_dptr out, di_dptr x, int xdt, di_dptr gu, di_dptr down, int dt, int m, int n, int hidden) {
	return a->gated_mlp(c, out, x, xdt, gu, down, dt, m, n, hidden);
}
static inline int c_add(di_api *a, di_ctx *c, di_dptr out, di_dptr x, di_dptr y, uint64_t n) { return a->add(c, out, x, y, n); }
static inline int c_split_columns(di_api *a, di_ctx *c, di_dptr x, int rows, int pitch, int n, const di_dptr *parts, const int *widths) {
	return a->split_columns(c, x, rows, pitch, n, parts, widths);
}
static inline int c_concat(di_api *a, di_ctx *c, di_dptr out, di_dptr x, di_dptr y, int rows, int m, int n) {
	return a->concat(c, out, x, y, rows, m, n);
}
static inline int c_rope(di_api *a, di_ctx *c, di_dptr x, di_dptr pos, di_dptr cs, di_dptr sn, int t, int maxPos, int nh, int hs,
                  int off, int rd, int il) {
	return a->rope(c, x, pos, cs, sn, t, maxPos, nh, hs, off, rd, il);
}
static inline int c_qkv_prepare(di_api *a, di_ctx *c, const di_qkv *q) { return a->qkv_prepare(c, q); }
static inline int c_write_cache(di_api *a, di_ctx *c, di_dptr cache, di_dptr src, di_dptr sm, int t, int w, int width, int col, int slots,
                                int cache_dtype) {
	return a->write_cache(c, cache, src, sm, t, w, width, col, slots, cache_dtype);
}
static inline int c_attention(di_api *a, di_ctx *c, di_dptr out, int odt, di_dptr q, di_dptr k, di_dptr v, di_attn_meta *m, int nh, int nkv,
                       int hd, float scale, int window, int input_dtype, int cache_dtype) {
	return a->attention(c, out, odt, q, k, v, m, nh, nkv, hd, scale, window, input_dtype, cache_dtype);
}
static inline int c_mla_attention(di_api *a, di_ctx *c, di_dptr out, di_dptr q, di_dptr cache, di_dptr w, int dt, di_attn_meta *m,
                           int nh, int nope, int rope, int kvl, int vd, float scale) {
	return a->mla_attention(c, out, q, cache, w, dt, m, nh, nope, rope, kvl, vd, scale);
}
static inline int c_moe_route(di_api *a, di_ctx *c, di_dptr ids, di_dptr w, di_dptr lg, di_dptr bias, int t, int e, int k, int sc,
                       int method, int ng, int tg, int norm, float scaling) {
	return a->moe_route(c, ids, w, lg, bias, t, e, k, sc, method, ng, tg, norm, scaling);
}
static inline int c_moe(di_api *a, di_ctx *c, di_dptr out, di_dptr x, int xdt, di_dptr ids, di_dptr w, di_dptr gu, di_dptr dn,
                 int dt, int t, int k, int hidden, int inter, int e) {
	return a->moe(c, out, x, xdt, ids, w, gu, dn, dt, t, k, hidden, inter, e);
}
static inline int c_moe_set_add(di_api *a, di_ctx *c, di_dptr out, di_dptr add) { return a->moe_set_add(c, out, add); }
static inline int c_embed_norm_concat(di_api *a, di_ctx *c, di_dptr out, di_dptr table, int dt, di_dptr ids, di_dptr en, di_dptr x,
                                      di_dptr xn, int rows, int h, int vocab, float eps) {
	return a->embed_norm_concat(c, out, table, dt, ids, en, x, xn, rows, h, vocab, eps);
}
static inline int c_moe_set_route(di_api *a, di_ctx *c, di_dptr ids, di_dptr w, di_dptr lg, di_dptr bias, int t, int e, int k,
                                  int sc, int method, int ng, int tg, int norm, float scaling) {
	return a->moe_set_route(c, ids, w, lg, bias, t, e, k, sc, method, ng, tg, norm, scaling);
}
static inline int c_resolve(di_api *a, di_ctx *c, di_dptr ids, di_dptr from, di_dptr sampled, int t, int r) {
	return a->resolve_placeholders(c, ids, from, sampled, t, r);
}
static inline int c_shift_accepted(di_api *a, di_ctx *c, di_dptr pos, di_dptr slots, di_dptr seqk, di_dptr cu, di_dptr tables,
                                   di_dptr from, di_dptr acc, int n, int t, int width, int bs, int r) {
	return a->shift_accepted(c, pos, slots, seqk, cu, tables, from, acc, n, t, width, bs, r);
}
static inline int c_logits(di_api *a, di_ctx *c, di_dptr out, di_dptr hidden, di_dptr rows, int r, int t, di_dptr norm, di_dptr head,
                    int dt, int dim, int vocab, float eps) {
	return a->logits(c, out, hidden, rows, r, t, norm, head, dt, dim, vocab, eps);
}
static inline int c_token_mask(di_api *a, di_ctx *c, di_dptr logits, int r, int vocab, di_dptr mask_rows, di_dptr masks,
                               int num_masks) {
	return a->token_mask(c, logits, r, vocab, mask_rows, masks, num_masks);
}
static inline int c_argmax(di_api *a, di_ctx *c, di_dptr out, di_dptr logits, int r, int vocab) {
	return a->argmax(c, out, logits, r, vocab);
}
static inline int c_accept_drafts(di_api *a, di_ctx *c, di_dptr out, di_dptr tokens, int nt, di_dptr drafts, int nd,
                                  di_dptr layout, int ne) {
	return a->accept_drafts(c, out, tokens, nt, drafts, nd, layout, ne);
}
static inline int c_sample(di_api *a, di_ctx *c, di_dptr out, di_dptr logits, int r, int vocab, di_dptr rows, di_dptr edits,
                           int max_candidates, int all_greedy) {
	return a->sample(c, out, logits, r, vocab, rows, edits, max_candidates, all_greedy);
}

// Sliding-window rings, attention sinks, Gemma and gpt-oss operations.
static inline int c_attention_sinks(di_api *a, di_ctx *c, di_dptr out, int odt, di_dptr q, di_dptr k, di_dptr v, di_attn_meta *m,
                                    int nh, int nkv, int hd, float scale, int window, int input_dtype, int cache_dtype,
                                    di_dptr sinks) {
	return a->attention_sinks(c, out, odt, q, k, v, m, nh, nkv, hd, scale, window, input_dtype, cache_dtype, sinks);
}
static inline int c_ring_attention(di_api *a, di_ctx *c, di_dptr out, int odt, di_dptr q, di_dptr k, di_dptr v, di_dptr kr,
                                   di_dptr vr, di_dptr slots, int num_slots, di_attn_meta *m, int max_k, int nh, int nkv,
                                   int hd, float scale, int window, int input_dtype, int cache_dtype, di_dptr sinks) {
	return a->ring_attention(c, out, odt, q, k, v, kr, vr, slots, num_slots, m, max_k, nh, nkv, hd, scale, window,
	                         input_dtype, cache_dtype, sinks);
}
static inline int c_scale(di_api *a, di_ctx *c, di_dptr out, di_dptr x, uint64_t n, float s) { return a->scale(c, out, x, n, s); }
static inline int c_gelu_tanh_mul(di_api *a, di_ctx *c, di_dptr out, di_dptr gu, int rows, int n) {
	return a->gelu_tanh_mul(c, out, gu, rows, n);
}
static inline int c_softcap(di_api *a, di_ctx *c, di_dptr x, uint64_t n, float cap) { return a->softcap(c, x, n, cap); }
static inline int c_moe_clamped_swiglu(di_api *a, di_ctx *c, di_dptr out, di_dptr x, di_dptr ids, di_dptr w, di_dptr gu,
                                       di_dptr gub, di_dptr dn, di_dptr dnb, int dt, int t, int k, int hidden, int inter,
                                       int e, float limit, float alpha) {
	return a->moe_clamped_swiglu(c, out, x, ids, w, gu, gub, dn, dnb, dt, t, k, hidden, inter, e, limit, alpha);
}

// FP8 block-scaled weights (fp8.go).
static inline int c_fp8_linear(di_api *a, di_ctx *c, di_dptr out, di_dptr x, const di_fp8_weight *w, di_dptr bias, int m, int n,
                               int k, int path) {
	return a->fp8_linear(c, out, x, w, bias, m, n, k, path);
}
static inline int c_fp8_moe(di_api *a, di_ctx *c, di_dptr out, di_dptr x, di_dptr ids, di_dptr w, const di_fp8_weight *gu,
                            const di_fp8_weight *dn, int t, int k, int hidden, int inter, int e, int path) {
	return a->fp8_moe(c, out, x, ids, w, gu, dn, t, k, hidden, inter, e, path);
}
static inline int c_fp8_dequant(di_api *a, di_ctx *c, di_dptr out, int odt, const di_fp8_weight *w, int rows, int k) {
	return a->fp8_dequant(c, out, odt, w, rows, k);
}
static inline int c_fp8_lt_peak(di_api *a, di_ctx *c, int m, int n, int k, int iters, float *ms) {
	return a->fp8_lt_peak(c, m, n, k, iters, ms);
}

// MLA over 16- and 8-bit latent caches (attention_mla_tc.go).
static inline int c_mla_write_cache(di_api *a, di_ctx *c, di_dptr cache, int cdt, di_dptr ckv, di_dptr kpe, di_dptr sm, int t,
                                    int kvl, int rope, int slots) {
	return a->mla_write_cache(c, cache, cdt, ckv, kpe, sm, t, kvl, rope, slots);
}
static inline int c_mla_prepare(di_api *a, di_ctx *c, di_dptr q, di_dptr cache, int cdt, di_dptr q_in, int q_stride,
                                di_dptr kva, int kva_stride, di_dptr normw, di_dptr sm, di_dptr pos, di_dptr cs, di_dptr sn,
                                int t, int max_pos, int heads, int nope, int rope, int kvl, int interleaved, float eps,
                                int slots) {
	return a->mla_prepare(c, q, cache, cdt, q_in, q_stride, kva, kva_stride, normw, sm, pos, cs, sn, t, max_pos, heads, nope,
	                      rope, kvl, interleaved, eps, slots);
}
static inline int c_mla_attention_tc(di_api *a, di_ctx *c, di_dptr out, di_dptr q, di_dptr cache, int cdt, di_dptr w, int wdt,
                                     di_attn_meta *m, int nh, int nope, int rope, int kvl, int vd, float scale) {
	return a->mla_attention_tc(c, out, q, cache, cdt, w, wdt, m, nh, nope, rope, kvl, vd, scale);
}
static inline int c_mla_latent_attention(di_api *a, di_ctx *c, di_dptr olat, di_dptr ql, di_dptr cache, int cdt, di_attn_meta *m,
                                         int nh, int kvl, int rope) {
	return a->mla_latent_attention(c, olat, ql, cache, cdt, m, nh, kvl, rope);
}

// MXFP4 expert weights (mxfp4.go).
static inline int c_moe_clamped_swiglu_mxfp4(di_api *a, di_ctx *c, di_dptr out, di_dptr x, di_dptr ids, di_dptr w, di_dptr gub,
                                             di_dptr gus, di_dptr gubias, di_dptr dnb, di_dptr dns, di_dptr dnbias, int t, int k,
                                             int hidden, int inter, int e, float limit, float alpha) {
	return a->moe_clamped_swiglu_mxfp4(c, out, x, ids, w, gub, gus, gubias, dnb, dns, dnbias, t, k, hidden, inter, e, limit, alpha);
}

// Block-quantized weights (quant.go).
static inline int c_quant_linear(di_api *a, di_ctx *c, di_dptr out, di_dptr x, const di_quant_weight *w, di_dptr bias, int m, int n,
                                 int k, int path) {
	return a->quant_linear(c, out, x, w, bias, m, n, k, path);
}
static inline int c_quant_logits(di_api *a, di_ctx *c, di_dptr out, di_dptr hidden, di_dptr rows, int r, int t, di_dptr norm,
                                 const di_quant_weight *head, int dim, int vocab, float eps) {
	return a->quant_logits(c, out, hidden, rows, r, t, norm, head, dim, vocab, eps);
}
static inline int c_quant_embedding(di_api *a, di_ctx *c, di_dptr out, const di_quant_weight *table, di_dptr ids, int t, int hidden,
                                    int vocab) {
	return a->quant_embedding(c, out, table, ids, t, hidden, vocab);
}
static inline int c_quant_moe(di_api *a, di_ctx *c, di_dptr out, di_dptr x, di_dptr ids, di_dptr w, const di_quant_weight *gu,
                              const di_quant_weight *dn, int t, int k, int hidden, int inter, int e) {
	return a->quant_moe(c, out, x, ids, w, gu, dn, t, k, hidden, inter, e);
}
static inline int c_quant_dequant(di_api *a, di_ctx *c, di_dptr out, int odt, const di_quant_weight *w, int rows, int k) {
	return a->quant_dequant(c, out, odt, w, rows, k);
}

// MLA prefill rows in the non-absorbed form (attention_mla_prefill.go).
static inline int c_mla_attention_pf(di_api *a, di_ctx *c, di_dptr out, di_dptr q, di_dptr cache, int cdt, di_dptr w, int wdt,
                                     di_attn_meta *m, int nh, int nope, int rope, int kvl, int vd, float scale,
                                     di_mla_pf_hint *hint) {
	return a->mla_attention_pf(c, out, q, cache, cdt, w, wdt, m, nh, nope, rope, kvl, vd, scale, hint);
}

#endif
