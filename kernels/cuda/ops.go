package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// launch runs fn under the backend's lock after checking it is open, turns
// its status into an error and keeps the tensors alive until the call has
// returned (the kernels it queued hold their device memory through the
// stream order of the allocator).
func (b *Backend) launch(op string, fn func() C.int, keep ...*Tensor) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen(op); err != nil {
		return err
	}
	if base, _, _ := strings.Cut(op, " "); b.skip[base] { // op may carry the profile's suffix
		return nil
	}
	err := b.status(op, b.prof.around(b, op, fn))
	runtime.KeepAlive(keep)
	return err
}

// Embedding gathers rows of table by ids; an id outside the table is
// reported by the next Download or Sync.
func (b *Backend) Embedding(out, table, ids kernels.Tensor) error {
	const op = "embedding"
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	tb, err := asCUDA(op, "table", table)
	if err != nil {
		return err
	}
	id, err := asCUDA(op, "ids", ids)
	if err != nil {
		return err
	}
	vocab, hidden, t, err := kernels.EmbeddingShapes("cuda", o, tb, id)
	if err != nil {
		return err
	}
	if err := fp8Refuse(op, "table", tb); err != nil {
		return err
	}
	if tb.q != nil { // a block-quantized table (quant.go)
		return b.quantEmbedding(o, tb, id, t, hidden, vocab)
	}
	return b.launch(op, func() C.int {
		return C.c_embedding(b.lib.api, b.ctx, o.ptr(), tb.ptr(), C.int(tb.dtype), id.ptr(), C.int(t), C.int(hidden), C.int(vocab))
	}, o, tb, id)
}

// normTensors converts the tensors of RMSNorm and AddRMSNorm.
func normTensors(op string, out, x, weight kernels.Tensor) (o, xs, w *Tensor, err error) {
	if o, err = asCUDA(op, "out", out); err != nil {
		return
	}
	if xs, err = asCUDA(op, "x", x); err != nil {
		return
	}
	w, err = asCUDA(op, "weight", weight)
	return
}

// normOutTypes are the dtypes RMSNorm and AddRMSNorm write: F32, or a
// 16-bit type for the linear after them (LinearInputDType).
var normOutTypes = []kernels.DType{kernels.F32, kernels.BF16, kernels.F16}

// LinearInputDType implements kernels.LinearInputer: BF16 or F16 where
// Linear and GatedMLP would round a float32 x to the weights' type for
// cuBLAS (GEMM mode round, rows past the GEMV and skinny-GEMM paths), F32
// elsewhere (and everywhere with Options.DisableNormNarrow).
func (b *Backend) LinearInputDType(w kernels.DType, rows int) kernels.DType {
	if !b.normNarrow {
		return kernels.F32
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.checkOpen("linear_input_dtype") != nil {
		return kernels.F32
	}
	return kernels.DType(C.c_linear_input_dtype(b.lib.api, b.ctx, C.int(w), C.int(rows)))
}

var _ kernels.MoEInputer = (*Backend)(nil)

// MoEInputDType implements kernels.MoEInputer: the experts' 16-bit type in
// GEMM mode round (where every MoE path rounds x to it, at any row count)
// unless Options.DisableMoERoundedInput, else F32.
func (b *Backend) MoEInputDType(w kernels.DType, rows int) kernels.DType {
	if !b.opts.DisableMoERoundedInput && b.gemm == GEMMRound && (w == kernels.BF16 || w == kernels.F16) {
		return w
	}
	return kernels.F32
}

// RMSNorm normalizes each row of x into out (out may alias x). out is F32,
// or BF16 or F16 (each value rounded to nearest; see LinearInputDType).
func (b *Backend) RMSNorm(out, x, weight kernels.Tensor, eps float32) error {
	const op = "rms_norm"
	o, xs, w, err := normTensors(op, out, x, weight)
	if err != nil {
		return err
	}
	rows, n, err := kernels.NormShapes("cuda", op, o, xs, w, normOutTypes...)
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_rms_norm(b.lib.api, b.ctx, o.ptr(), C.int(o.dtype), 0, xs.ptr(), w.ptr(), C.int(rows), C.int(n), C.float(eps))
	}, o, xs, w)
}

// AddRMSNorm adds x into residual and normalizes the sum into out (of a
// dtype as RMSNorm's).
func (b *Backend) AddRMSNorm(out, residual, x, weight kernels.Tensor, eps float32) error {
	const op = "add_rms_norm"
	o, xs, w, err := normTensors(op, out, x, weight)
	if err != nil {
		return err
	}
	r, err := asCUDA(op, "residual", residual)
	if err != nil {
		return err
	}
	rows, n, err := kernels.AddNormShapes("cuda", o, r, xs, w, normOutTypes...)
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_rms_norm(b.lib.api, b.ctx, o.ptr(), C.int(o.dtype), r.ptr(), xs.ptr(), w.ptr(), C.int(rows), C.int(n), C.float(eps))
	}, o, r, xs, w)
}

// Linear computes out = x W^T (+ bias). x is F32, or of w's 16-bit dtype
// (already rounded, see LinearInputDType: cuBLAS without a narrowing pass).
// FP8 and block-quantized weights take F32 x (fp8.go, quant.go).
func (b *Backend) Linear(out, x, w, bias kernels.Tensor) error {
	const op = "linear"
	if wq, ok := w.(*Tensor); ok && wq.q != nil && x != nil && x.DType() != kernels.F32 {
		// The CPU backend's refusal: block-quantized weights take F32 x.
		return kernels.CheckShape("cuda", op, "x", x, x.Shape(), kernels.F32)
	}
	o, xs, ws, bs, m, n, k, err := linearArgs(out, x, w, bias, kernels.F32, kernels.BF16, kernels.F16)
	if err != nil {
		return err
	}
	name := op
	if b.prof != nil {
		name = fmt.Sprintf("linear %dx%d %s", n, k, sizeClass(m))
	}
	if ws.fp8 != nil { // FP8 block-scaled weights (fp8.go)
		return b.fp8Linear(name, o, xs, ws, bs, m, n, k, fp8Auto)
	}
	if ws.q != nil { // block-quantized weights (quant.go)
		return b.quantLinear(name, o, xs, ws, bs, m, n, k, quantAuto)
	}
	return b.launch(name, func() C.int {
		return C.c_linear(b.lib.api, b.ctx, o.ptr(), xs.ptr(), C.int(xs.dtype), ws.ptr(), C.int(ws.dtype), optPtr(bs), C.int(m), C.int(n), C.int(k))
	}, o, xs, ws, bs)
}

var _ kernels.EmbedNormConcater = (*Backend)(nil)

// EmbedNormConcat implements kernels.EmbedNormConcater: one launch whose
// two norms run side by side, with the bits of Embedding, two RMSNorms and
// Concat; an id outside the table is reported by the next Download or
// Sync (naming embedding), as Embedding reports it. Options.DisableEmbedNorm:
// the four operations.
func (b *Backend) EmbedNormConcat(out, table, ids, embNorm, x, xNorm kernels.Tensor, eps float32) error {
	const op = "embed_norm_concat"
	if b.opts.DisableEmbedNorm {
		return b.embedNormApart(out, table, ids, embNorm, x, xNorm, eps)
	}
	var ts [6]*Tensor
	if err := asCUDAs(op, ts[:], tensorArg{"out", out}, tensorArg{"table", table}, tensorArg{"ids", ids},
		tensorArg{"emb_norm", embNorm}, tensorArg{"x", x}, tensorArg{"x_norm", xNorm}); err != nil {
		return err
	}
	o, tb, id, en, xs, xn := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5]
	if tb.fp8 != nil || tb.q != nil {
		return b.embedNormApart(out, table, ids, embNorm, x, xNorm, eps)
	}
	if err := kernels.CheckShape("cuda", op, "table", tb, []int{-1, -1}, kernels.F32, kernels.BF16, kernels.F16); err != nil {
		return err
	}
	vocab, h := tb.shape[0], tb.shape[1]
	if err := kernels.CheckShape("cuda", op, "ids", id, []int{-1}, kernels.I32); err != nil {
		return err
	}
	t := id.shape[0]
	for _, c := range []struct {
		name  string
		ten   *Tensor
		shape []int
	}{{"out", o, []int{t, 2 * h}}, {"emb_norm", en, []int{h}}, {"x", xs, []int{t, h}}, {"x_norm", xn, []int{h}}} {
		if err := kernels.CheckShape("cuda", op, c.name, c.ten, c.shape, kernels.F32); err != nil {
			return err
		}
	}
	return b.launch(op, func() C.int {
		return C.c_embed_norm_concat(b.lib.api, b.ctx, o.ptr(), tb.ptr(), C.int(tb.dtype), id.ptr(), en.ptr(), xs.ptr(), xn.ptr(),
			C.int(t), C.int(h), C.int(vocab), C.float(eps))
	}, o, tb, id, en, xs, xn)
}

// embedNormApart is EmbedNormConcat as its four operations, over scratch
// rows.
func (b *Backend) embedNormApart(out, table, ids, embNorm, x, xNorm kernels.Tensor, eps float32) error {
	e, err := b.Alloc(kernels.F32, x.Shape()...)
	if err != nil {
		return err
	}
	xn, err := b.Alloc(kernels.F32, x.Shape()...)
	if err != nil {
		return err
	}
	return kernels.EmbedNormConcatSteps(b, out, e, xn, table, ids, embNorm, x, xNorm, eps)
}

// linearArgs converts Linear's arguments (bias optional) and checks them
// with kernels.LinearShapes, x of one of xTypes.
func linearArgs(out, x, w, bias kernels.Tensor, xTypes ...kernels.DType) (o, xs, ws, bs *Tensor, m, n, k int, err error) {
	const op = "linear"
	if o, err = asCUDA(op, "out", out); err != nil {
		return
	}
	if xs, err = asCUDA(op, "x", x); err != nil {
		return
	}
	if ws, err = asCUDA(op, "w", w); err != nil {
		return
	}
	if bs, err = optCUDA(op, "bias", bias); err != nil {
		return
	}
	m, n, k, err = kernels.LinearShapes("cuda", o, xs, ws, bs, xTypes...)
	return
}

// SiLUMul computes silu(gate) * up from the fused [T, 2n] projection.
func (b *Backend) SiLUMul(out, gateUp kernels.Tensor) error {
	return b.gatedActivation("silu_mul", out, gateUp, func(o, g *Tensor, rows, n int) C.int {
		return C.c_silu_mul(b.lib.api, b.ctx, o.ptr(), g.ptr(), C.int(rows), C.int(n))
	})
}

// gatedActivation checks and launches a gated activation op: out [rows, n]
// from the fused gate_up [rows, 2n] (kernels.SiLUMulShapes), run launching
// its kernel.
func (b *Backend) gatedActivation(op string, out, gateUp kernels.Tensor, run func(o, g *Tensor, rows, n int) C.int) error {
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	g, err := asCUDA(op, "gate_up", gateUp)
	if err != nil {
		return err
	}
	rows, n, err := kernels.SiLUMulShapes("cuda", o, g)
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int { return run(o, g, rows, n) }, o, g)
}

// GatedMLP implements kernels.GatedMLPer. In GEMM mode round with BF16 or
// F16 weights and at least Options.MLPNarrowRows rows, one library call keeps g,
// u and silu(g)*u in the weights' type (rounded to nearest; gu and act are
// not used); otherwise it runs Linear, SiLUMul, Linear through gu and act,
// with their bits. Cost: the two projections (weights read once, 2 x rows x
// 3n x hidden FLOPs); the 16-bit path holds rows x (hidden + 3n) 16-bit
// elements of scratch for the call.
func (b *Backend) GatedMLP(out, x, gateUp, down, gu, act kernels.Tensor) error {
	const op = "gated_mlp"
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	xs, err := asCUDA(op, "x", x)
	if err != nil {
		return err
	}
	gw, err := asCUDA(op, "gate_up", gateUp)
	if err != nil {
		return err
	}
	dw, err := asCUDA(op, "down", down)
	if err != nil {
		return err
	}
	if gw.dtype == kernels.F8E4M3 || dw.dtype == kernels.F8E4M3 || gw.q != nil || dw.q != nil {
		// FP8 weights (FP8Weight) and block-quantized ones (QuantWeight):
		// each linear takes its own path, which checks its arguments.
		return b.unfusedMLP(out, x, gateUp, down, gu, act)
	}
	rows, hidden, n, err := kernels.GatedMLPShapes("cuda", o, xs, gw, dw, kernels.F32, kernels.BF16, kernels.F16)
	if err != nil {
		return err
	}
	narrow := b.mlpNarrow > 0 && rows >= b.mlpNarrow && b.gemm == GEMMRound && (gw.dtype == kernels.BF16 || gw.dtype == kernels.F16)
	if !narrow {
		return b.gatedMLP(out, xs, gw, down, gu, act, rows, n, hidden)
	}
	return b.launch(op, func() C.int {
		return C.c_gated_mlp(b.lib.api, b.ctx, o.ptr(), xs.ptr(), C.int(xs.dtype), gw.ptr(), dw.ptr(), C.int(gw.dtype), C.int(rows), C.int(n), C.int(hidden))
	}, o, xs, gw, dw)
}

// gatedMLP is GatedMLP without the 16-bit intermediates: gated_linear
// (the gate/up linear and SiLU-mul, one paired GEMV where the GEMV serves
// the linear) into act, then Linear into out. The bits of unfusedMLP.
// Over float32 x into float32 gu and act; otherwise unfusedMLP.
func (b *Backend) gatedMLP(out kernels.Tensor, xs, gw *Tensor, down, gu, act kernels.Tensor, rows, n, hidden int) error {
	const op = "gated_mlp"
	g, gerr := asCUDA(op, "gu", gu)
	a, aerr := asCUDA(op, "act", act)
	if b.opts.DisableGatedGEMV || gerr != nil || aerr != nil || xs.dtype != kernels.F32 || g.dtype != kernels.F32 || a.dtype != kernels.F32 ||
		kernels.CheckShape("cuda", op, "gu", g, []int{rows, 2 * n}, kernels.F32) != nil || kernels.CheckShape("cuda", op, "act", a, []int{rows, n}, kernels.F32) != nil {
		return b.unfusedMLP(out, xs, gw, down, gu, act)
	}
	if err := b.launch(op, func() C.int {
		return C.c_gated_linear(b.lib.api, b.ctx, a.ptr(), g.ptr(), xs.ptr(), gw.ptr(), C.int(gw.dtype), C.int(rows), C.int(n), C.int(hidden))
	}, a, g, xs, gw); err != nil {
		return err
	}
	return b.Linear(out, act, down, nil)
}

// unfusedMLP is GatedMLP as its three operations: Linear into gu, SiLUMul
// into act, Linear into out.
func (b *Backend) unfusedMLP(out, x, gateUp, down, gu, act kernels.Tensor) error {
	if err := b.Linear(gu, x, gateUp, nil); err != nil {
		return err
	}
	if err := b.SiLUMul(act, gu); err != nil {
		return err
	}
	return b.Linear(out, act, down, nil)
}

// Add computes out = a + b elementwise (out may alias a or b).
func (b *Backend) Add(out, x, y kernels.Tensor) error {
	const op = "add"
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	a, err := asCUDA(op, "a", x)
	if err != nil {
		return err
	}
	c, err := asCUDA(op, "b", y)
	if err != nil {
		return err
	}
	n, err := kernels.AddShapes("cuda", o, a, c)
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_add(b.lib.api, b.ctx, o.ptr(), a.ptr(), c.ptr(), C.uint64_t(n))
	}, o, a, c)
}

// Concat joins the rows of a and b.
func (b *Backend) Concat(out, x, y kernels.Tensor) error {
	const op = "concat"
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	a, err := asCUDA(op, "a", x)
	if err != nil {
		return err
	}
	c, err := asCUDA(op, "b", y)
	if err != nil {
		return err
	}
	rows, m, n, err := kernels.ConcatShapes("cuda", o, a, c)
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_concat(b.lib.api, b.ctx, o.ptr(), a.ptr(), c.ptr(), C.int(rows), C.int(m), C.int(n))
	}, o, a, c)
}

// SplitColumns copies the column blocks of x into parts (see kernels.Ops):
// one kernel per DI_MAX_SPLIT parts.
func (b *Backend) SplitColumns(x kernels.Tensor, parts ...kernels.Tensor) error {
	const op = "split_columns"
	xs, err := asCUDA(op, "x", x)
	if err != nil {
		return err
	}
	ps := make([]*Tensor, len(parts))
	for i, p := range parts {
		if ps[i], err = asCUDA(op, fmt.Sprintf("parts[%d]", i), p); err != nil {
			return err
		}
	}
	rows, width, err := kernels.SplitShapes("cuda", xs, parts)
	if err != nil {
		return err
	}
	for lo, col := 0, 0; lo < len(ps); lo += C.DI_MAX_SPLIT {
		group := ps[lo:min(lo+C.DI_MAX_SPLIT, len(ps))]
		var ptrs [C.DI_MAX_SPLIT]C.di_dptr
		var widths [C.DI_MAX_SPLIT]C.int
		for i, p := range group {
			ptrs[i], widths[i] = p.ptr(), C.int(p.shape[1])
		}
		start := xs.ptr() + C.di_dptr(col*4)
		if err := b.launch(op, func() C.int {
			return C.c_split_columns(b.lib.api, b.ctx, start, C.int(rows), C.int(width), C.int(len(group)), &ptrs[0], &widths[0])
		}, append([]*Tensor{xs}, group...)...); err != nil {
			return err
		}
		for _, p := range group {
			col += p.shape[1]
		}
	}
	return nil
}

// RoPE rotates the rotary part of every head of x in place; a position
// outside the table is reported by the next Download or Sync.
func (b *Backend) RoPE(x, positions, cos, sin kernels.Tensor, p kernels.RoPEParams) error {
	const op = "rope"
	xs, err := asCUDA(op, "x", x)
	if err != nil {
		return err
	}
	ps, err := asCUDA(op, "positions", positions)
	if err != nil {
		return err
	}
	cs, err := asCUDA(op, "cos", cos)
	if err != nil {
		return err
	}
	ss, err := asCUDA(op, "sin", sin)
	if err != nil {
		return err
	}
	t, maxPos, err := kernels.RoPEShapes("cuda", xs, ps, cs, ss, p)
	if err != nil {
		return err
	}
	il := 0
	if p.Interleaved {
		il = 1
	}
	return b.launch(op, func() C.int {
		return C.c_rope(b.lib.api, b.ctx, xs.ptr(), ps.ptr(), cs.ptr(), ss.ptr(), C.int(t), C.int(maxPos), C.int(p.NumHeads),
			C.int(p.HeadSize), C.int(p.Offset), C.int(p.RotaryDim), C.int(il))
	}, xs, ps, cs, ss)
}

// WriteCache scatters rows of src into cache slots; a slot outside the
// cache is reported by the next Download or Sync.
func (b *Backend) WriteCache(cache, src, slotMapping kernels.Tensor, col int) error {
	const op = "write_cache"
	c, err := asCUDA(op, "cache", cache)
	if err != nil {
		return err
	}
	s, err := asCUDA(op, "src", src)
	if err != nil {
		return err
	}
	sm, err := asCUDA(op, "slot_mapping", slotMapping)
	if err != nil {
		return err
	}
	cw, err := kernels.WriteCacheShapes("cuda", c, s, sm, col, cacheDTypes...)
	if err != nil {
		return err
	}
	t, w, numSlots, width := cw.T, cw.W, cw.Slots, cw.Width
	return b.launch(op, func() C.int {
		return C.c_write_cache(b.lib.api, b.ctx, c.ptr(), s.ptr(), sm.ptr(), C.int(t), C.int(w), C.int(width), C.int(col), C.int(numSlots),
			C.int(c.dtype))
	}, c, s, sm)
}

// attnMeta validates m against numTokens query rows and a cache of
// [numBlocks, blockSize, ...] (kernels.MetadataShapes) and returns the
// ABI's description of it. The values inside the tensors are checked on
// the device.
func attnMeta(op string, m *kernels.AttentionMetadata, numTokens, numBlocks, blockSize int) (C.di_attn_meta, []*Tensor, error) {
	var cm C.di_attn_meta
	cu, sk, bt, err := kernels.MetadataShapes[*Tensor]("cuda", op, m, numTokens, blockSize)
	if err != nil {
		return cm, nil, err
	}
	n := m.NumSeqs
	cm.num_seqs = C.int(n)
	cm.num_tokens = C.int(numTokens)
	cm.block_size = C.int(blockSize)
	cm.max_blocks_per_seq = C.int(bt.shape[1])
	cm.num_blocks = C.int(numBlocks)
	cm.max_seqlen_q = C.int(max(m.MaxSeqlenQ, 0))
	cm.cu_seqlens_q = cu.ptr()
	cm.seqlens_k = sk.ptr()
	cm.block_tables = bt.ptr()
	return cm, []*Tensor{cu, sk, bt}, nil
}

// Attention is paged causal GQA attention; see kernels.Ops. Metadata that
// does not fit the cache is reported by the next Download or Sync.
func (b *Backend) Attention(out, q, kCache, vCache kernels.Tensor, m *kernels.AttentionMetadata, p kernels.AttentionParams) error {
	const op = "attention"
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	qs, err := asCUDA(op, "q", q)
	if err != nil {
		return err
	}
	kc, err := asCUDA(op, "k_cache", kCache)
	if err != nil {
		return err
	}
	vc, err := asCUDA(op, "v_cache", vCache)
	if err != nil {
		return err
	}
	// A 16-bit out holds the float32 results rounded to nearest, for a
	// 16-bit linear after it (LinearInputDType).
	t, err := kernels.AttentionShapes("cuda", o, qs, kc, vc, p, normOutTypes, cacheDTypes)
	if err != nil {
		return err
	}
	d, nh := p.HeadDim, p.NumHeads
	cm, keep, err := attnMeta(op, m, t, kc.shape[0], kc.shape[1])
	if err != nil {
		return err
	}
	sinks, err := sinkTensor(op, p)
	if err != nil {
		return err
	}
	name := op
	if b.prof != nil {
		name = "attention prefill/mixed"
		if m.MaxSeqlenQ == 1 {
			name = "attention decode"
		}
	}
	if sinks != nil { // gpt-oss's sink logits (AttentionSinks)
		return b.launch(name, func() C.int {
			return C.c_attention_sinks(b.lib.api, b.ctx, o.ptr(), C.int(o.dtype), qs.ptr(), kc.ptr(), vc.ptr(), &cm, C.int(nh),
				C.int(p.NumKVHeads), C.int(d), C.float(p.Scale), C.int(p.SlidingWindow), C.int(p.InputDType), C.int(kc.dtype),
				sinks.ptr())
		}, append(keep, o, qs, kc, vc, sinks)...)
	}
	return b.launch(name, func() C.int {
		return C.c_attention(b.lib.api, b.ctx, o.ptr(), C.int(o.dtype), qs.ptr(), kc.ptr(), vc.ptr(), &cm, C.int(nh), C.int(p.NumKVHeads),
			C.int(d), C.float(p.Scale), C.int(p.SlidingWindow), C.int(p.InputDType), C.int(kc.dtype))
	}, append(keep, o, qs, kc, vc)...)
}

// MLAAttention is latent attention with weight absorption; see kernels.Ops.
// A float32 cache runs the CUDA-core kernel (attention_mla.cu); a 16- or
// 8-bit one (kernels.MLACacher) the tensor-core path (attention_mla_tc.cu),
// whose absorbed queries and probabilities are rounded to 16 bits. An FP8
// wkvb is dequantized at its first eager call and kept with the weight
// (fp8Dequantized): to float32 for a float32 cache (4 bytes a weight, the
// CUDA-core kernel's exact values), to BF16 for the tensor-core path (2
// bytes a weight; each value rounded once, relative error at most 2^-9,
// as the path's own rounding of queries and probabilities), which takes
// 16-bit weights on tensor cores and float32 ones on CUDA cores (several
// times slower a layer).
func (b *Backend) MLAAttention(out, q, cache, wkvb kernels.Tensor, m *kernels.AttentionMetadata, p kernels.MLAParams) error {
	const op = "mla_attention"
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	qs, err := asCUDA(op, "q", q)
	if err != nil {
		return err
	}
	c, err := asCUDA(op, "cache", cache)
	if err != nil {
		return err
	}
	w, err := asCUDA(op, "wkvb", wkvb)
	if err != nil {
		return err
	}
	t, err := kernels.MLAShapes("cuda", o, qs, c, w, p, mlaCacheDTypes...)
	if err != nil {
		return err
	}
	if _, err := mlaCache(op, c, p); err != nil {
		return err
	}
	nh, nope, rope, kvl, vd := p.NumHeads, p.NopeDim, p.RopeDim, p.KVLoraRank, p.VHeadDim
	cm, keep, err := attnMeta(op, m, t, c.shape[0], c.shape[1])
	if err != nil {
		return err
	}
	if w.fp8 != nil { // an FP8 wkvb: dequantized once per weight and dtype (fp8.go)
		dt := kernels.F32
		if c.dtype != kernels.F32 {
			dt = kernels.BF16
		}
		if w, err = b.fp8Dequantized(w, dt); err != nil {
			return err
		}
	}
	if w.q != nil { // a block-quantized wkvb: dequantized to float32 (quant.go)
		if w, err = b.quantDequant(w); err != nil {
			return err
		}
	}
	if c.dtype != kernels.F32 { // 16- and 8-bit latent caches: tensor cores (attention_mla_tc.cu; prefill rows: mlaTC)
		return b.mlaTC(op, o, qs, c, w, &cm, m.HostCuSeqlensQ, keep, p)
	}
	return b.launch(op, func() C.int {
		return C.c_mla_attention(b.lib.api, b.ctx, o.ptr(), qs.ptr(), c.ptr(), w.ptr(), C.int(w.dtype), &cm, C.int(nh),
			C.int(nope), C.int(rope), C.int(kvl), C.int(vd), C.float(p.Scale))
	}, append(keep, o, qs, c, w)...)
}

// MoERoute turns router logits into top-k expert ids and weights.
func (b *Backend) MoERoute(ids, weights, logits, bias kernels.Tensor, p kernels.RouteParams) error {
	r, err := newRouteCall("moe_route", ids, weights, logits, bias, p)
	if err != nil {
		return err
	}
	return b.launch("moe_route", func() C.int {
		return C.c_moe_route(b.lib.api, b.ctx, r.ids.ptr(), r.weights.ptr(), r.logits.ptr(), optPtr(r.bias), C.int(r.t), C.int(r.e),
			C.int(r.p.TopK), C.int(r.p.Scoring), C.int(r.p.Method), C.int(r.groups), C.int(r.p.TopKGroups), C.int(r.norm),
			C.float(r.p.ScalingFactor))
	}, r.ids, r.weights, r.logits, r.bias)
}

// routeCall is a checked MoERoute call: its tensors, t tokens over e
// experts, and p's groups (at least 1) and norm flag as the C call takes
// them.
type routeCall struct {
	ids, weights, logits, bias *Tensor
	t, e, groups, norm         int
	p                          kernels.RouteParams
}

func newRouteCall(op string, ids, weights, logits, bias kernels.Tensor, p kernels.RouteParams) (routeCall, error) {
	r := routeCall{p: p, groups: max(p.NumGroups, 1)}
	var err error
	if r.ids, err = asCUDA(op, "ids", ids); err != nil {
		return r, err
	}
	if r.weights, err = asCUDA(op, "weights", weights); err != nil {
		return r, err
	}
	if r.logits, err = asCUDA(op, "logits", logits); err != nil {
		return r, err
	}
	if r.bias, err = optCUDA(op, "bias", bias); err != nil {
		return r, err
	}
	if r.t, r.e, err = kernels.RouteShapes("cuda", r.ids, r.weights, r.logits, r.bias, p); err != nil {
		return r, err
	}
	if p.NormTopKProb {
		r.norm = 1
	}
	return r, nil
}

var _ kernels.MoERouteFuser = (*Backend)(nil)

// RoutedMoE implements kernels.MoERouteFuser: MoERoute, then MoE (MoEAdd
// where add is set), with the routing handed to the MoE launch
// (moe_set_route) for 16-bit experts: the decode path's grouping launch
// routes batches of up to 8 tokens itself, one launch fewer; other paths
// run the routing's kernel first. The bits of the two operations apart
// (the same routing arithmetic). Options.DisableFusedRoute, FP8 and
// block-quantized experts: the two operations apart.
func (b *Backend) RoutedMoE(out, x, logits, bias kernels.Tensor, p kernels.RouteParams, ids, weights, gateUp, down, add kernels.Tensor) error {
	gu, gok := gateUp.(*Tensor)
	dn, dok := down.(*Tensor)
	if b.opts.DisableFusedRoute || !gok || !dok || gu.fp8 != nil || dn.fp8 != nil || gu.q != nil || dn.q != nil {
		if err := b.MoERoute(ids, weights, logits, bias, p); err != nil {
			return err
		}
		if add == nil {
			return b.MoE(out, x, ids, weights, gateUp, down)
		}
		return b.MoEAdd(out, x, ids, weights, gateUp, down, add)
	}
	r, err := newRouteCall("moe", ids, weights, logits, bias, p)
	if err != nil {
		return err
	}
	if add == nil {
		return b.moe(out, x, ids, weights, gateUp, down, nil, &r)
	}
	return b.moeAdd(out, x, ids, weights, gateUp, down, add, &r)
}

// moeRouting wraps a MoE launch so that it runs r's routing
// (di_api.moe_set_route before it, cleared after; the clear reports a
// routing no MoE ran). nil r: fn itself. Runs under b.mu, inside launch.
func (b *Backend) moeRouting(r *routeCall, fn func() C.int) func() C.int {
	if r == nil {
		return fn
	}
	return func() C.int {
		if rc := C.c_moe_set_route(b.lib.api, b.ctx, r.ids.ptr(), r.weights.ptr(), r.logits.ptr(), optPtr(r.bias), C.int(r.t),
			C.int(r.e), C.int(r.p.TopK), C.int(r.p.Scoring), C.int(r.p.Method), C.int(r.groups), C.int(r.p.TopKGroups),
			C.int(r.norm), C.float(r.p.ScalingFactor)); rc != 0 {
			return rc
		}
		rc := fn()
		cleared := C.c_moe_set_route(b.lib.api, b.ctx, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
		if rc != 0 {
			return rc
		}
		return cleared
	}
}

// MoE runs the selected experts on their tokens and mixes the results.
// Up to 1024 (token, k) pairs (decode batches), and always while a graph is
// captured, it never waits for the host: the pairs are grouped by expert on
// the device and two grouped launches (tensor cores for 16-bit weights,
// else GEMVs) read each expert's weights once per 32 (or 8) of its rows;
// every output is batch-invariant. 16-bit experts with hidden and
// intermediate sizes multiples of 32 stay on the device at every batch
// size: from 2048 pairs (Options.MoEGEMMPairs) a grouped tensor-core GEMM
// over the rows sorted by expert, whose every output element is summed in
// the order of the smaller batches' kernel (which runs below it), so a
// token's bits do not depend on its batch. An id outside the experts there is reported by the next
// Sync (kernels.ErrOutOfRange, naming moe). Other large batches (float32
// experts, other sizes) copy the routing ids to the host (one small copy
// and a wait) and run cuBLAS GEMMs per selected expert; a bad id is then
// an error from MoE itself. Hidden and intermediate sizes that are not
// multiples of 8 always take the host path and cannot be captured.
// FP8 experts (FP8Weight) whose hidden and intermediate sizes are
// multiples of 128 with blocks of at least 128 columns (every published FP8
// checkpoint) stay on the device at every batch size too, unless
// Options.MoEGEMMPairs is negative: from Options.MoEGEMMPairs pairs a
// grouped tensor-core GEMM (fp8_moe.cu's f8m_gemm_k) that gives the bits of
// the smaller batches' kernel, so a token's result does not depend on its
// batch; other FP8 shapes above 1024 pairs group on the host.
// Block-quantized experts (QuantWeight) always take the device path, in
// token chunks of at most 1024 pairs (quant_moe.cu).
func (b *Backend) MoE(out, x, ids, weights, gateUp, down kernels.Tensor) error {
	return b.moe(out, x, ids, weights, gateUp, down, nil, nil)
}

var _ kernels.MoEAdder = (*Backend)(nil)

// MoEAdd implements kernels.MoEAdder: MoE with add (F32, out's shape)
// added in the combine pass that writes out, with the bits of MoE followed
// by Add, one pass over out fewer (DeepSeek's shared experts' output).
func (b *Backend) MoEAdd(out, x, ids, weights, gateUp, down, add kernels.Tensor) error {
	return b.moeAdd(out, x, ids, weights, gateUp, down, add, nil)
}

// moeAdd is MoEAdd, with route (nil: none) run as moe runs it.
func (b *Backend) moeAdd(out, x, ids, weights, gateUp, down, add kernels.Tensor, route *routeCall) error {
	a, err := asCUDA("moe", "add", add)
	if err != nil {
		return err
	}
	if err := kernels.CheckShape("cuda", "moe", "add", a, out.Shape(), kernels.F32); err != nil {
		return err
	}
	if b.opts.DisableMoEAdd {
		if err := b.moe(out, x, ids, weights, gateUp, down, nil, route); err != nil {
			return err
		}
		return b.Add(out, out, add)
	}
	return b.moe(out, x, ids, weights, gateUp, down, a, route)
}

// moe is MoE, with add (nil: none) added to its output by the combine
// pass, and route (nil: none; 16-bit experts only) run first, in the same
// launch where the path fuses it (RoutedMoE).
func (b *Backend) moe(out, x, ids, weights, gateUp, down kernels.Tensor, add *Tensor, route *routeCall) error {
	const op = "moe"
	var ts [6]*Tensor
	if err := asCUDAs(op, ts[:], tensorArg{"out", out}, tensorArg{"x", x}, tensorArg{"ids", ids}, tensorArg{"weights", weights},
		tensorArg{"gate_up", gateUp}, tensorArg{"down", down}); err != nil {
		return err
	}
	o, xs, is, ws, gu, dn := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5]
	// x rounded already (16-bit, LinearInputDType's answer for the
	// experts): GEMM mode round only, where every path rounds x so.
	d, err := kernels.MoERoundedShapes("cuda", o, xs, is, ws, gu, dn)
	if err != nil {
		return err
	}
	if xs.dtype != kernels.F32 && b.gemm != GEMMRound {
		return fmt.Errorf("cuda: moe: x %v rounded already: GEMM mode %s rounds no x (want F32): %w", xs, b.gemm, kernels.ErrDType)
	}
	if route != nil && (gu.fp8 != nil || dn.fp8 != nil || gu.q != nil || dn.q != nil) {
		return fmt.Errorf("cuda: moe: a fused routing takes 16-bit or float32 experts: %w", kernels.ErrDType)
	}
	if gu.fp8 != nil || dn.fp8 != nil { // FP8 experts (fp8.go)
		return b.fp8MoE(o, xs, is, ws, gu, dn, add, d, fp8Auto)
	}
	if gu.q != nil || dn.q != nil { // block-quantized experts (quant.go)
		return b.quantMoE(o, xs, is, ws, gu, dn, add, d)
	}
	t, hidden, numExperts, inter, topK := d.T, d.Hidden, d.NumExperts, d.Inter, d.TopK
	var rt [4]*Tensor
	if route != nil {
		rt = [4]*Tensor{route.logits, route.bias, route.ids, route.weights}
	}
	return b.launch(op, b.moeAdding(o, add, b.moeRouting(route, func() C.int {
		return C.c_moe(b.lib.api, b.ctx, o.ptr(), xs.ptr(), C.int(xs.dtype), is.ptr(), ws.ptr(), gu.ptr(), dn.ptr(), C.int(gu.dtype), C.int(t),
			C.int(topK), C.int(hidden), C.int(inter), C.int(numExperts))
	})), o, xs, is, ws, gu, dn, add, rt[0], rt[1], rt[2], rt[3])
}

// queueNothing is a launch that queues no work and succeeds, as the launch
// of an operation whose path has no combine pass would (the test of an
// addend that moeAdding finds unapplied).
func queueNothing() C.int { return stOK }

// moeAdding wraps a MoE operation's launch so that its combine pass adds
// add to out (di_api.moe_set_add before it, cleared after; the clear
// reports an operation that took a path without a combine pass). nil add:
// fn itself. Runs under b.mu, inside launch.
func (b *Backend) moeAdding(o, add *Tensor, fn func() C.int) func() C.int {
	if add == nil {
		return fn
	}
	return func() C.int {
		if rc := C.c_moe_set_add(b.lib.api, b.ctx, o.ptr(), add.ptr()); rc != 0 {
			return rc
		}
		rc := fn()
		cleared := C.c_moe_set_add(b.lib.api, b.ctx, o.ptr(), 0)
		if rc != 0 {
			return rc
		}
		return cleared
	}
}

// ResolvePlaceholders sets ids[i] = sampled[fromRow[i]] where fromRow[i] >= 0,
// on the device; a row outside sampled is reported by the next Download or Sync.
func (b *Backend) ResolvePlaceholders(ids, fromRow, sampled kernels.Tensor) error {
	const op = "resolve_placeholders"
	id, err := asCUDA(op, "ids", ids)
	if err != nil {
		return err
	}
	from, err := asCUDA(op, "from_row", fromRow)
	if err != nil {
		return err
	}
	smp, err := asCUDA(op, "sampled", sampled)
	if err != nil {
		return err
	}
	t, r, err := kernels.ResolveShapes("cuda", id, from, smp)
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_resolve(b.lib.api, b.ctx, id.ptr(), from.ptr(), smp.ptr(), C.int(t), C.int(r))
	}, id, from, smp)
}

// ShiftAccepted shifts the positions, slots and key counts of the
// sequences with shiftFrom[s] >= 0 by accepted[shiftFrom[s]], on the device
// (see kernels.Ops); a row outside accepted, a negative count or a new
// position without a block is reported by the next Download or Sync, and
// leaves that sequence unchanged.
func (b *Backend) ShiftAccepted(m *kernels.AttentionMetadata, positions, shiftFrom, accepted kernels.Tensor) error {
	const op = "shift_accepted"
	r, width, err := kernels.ShiftShapes("cuda", m, positions, shiftFrom, accepted)
	if err != nil {
		return err
	}
	var ts [7]*Tensor
	if err := asCUDAs(op, ts[:], tensorArg{"positions", positions}, tensorArg{"slot_mapping", m.SlotMapping},
		tensorArg{"seqlens_k", m.SeqlensK}, tensorArg{"cu_seqlens_q", m.CuSeqlensQ}, tensorArg{"block_tables", m.BlockTables},
		tensorArg{"shift_from", shiftFrom}, tensorArg{"accepted", accepted}); err != nil {
		return err
	}
	pos, slots, seqK, cu, tables, from, acc := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6]
	return b.launch(op, func() C.int {
		return C.c_shift_accepted(b.lib.api, b.ctx, pos.ptr(), slots.ptr(), seqK.ptr(), cu.ptr(), tables.ptr(), from.ptr(), acc.ptr(),
			C.int(m.NumSeqs), C.int(m.NumTokens), C.int(width), C.int(m.BlockSize), C.int(r))
	}, ts[:]...)
}

// Logits gathers rows of hidden, normalizes them and applies the LM head.
func (b *Backend) Logits(out, hidden, rows, norm, head kernels.Tensor, eps float32) error {
	const op = "logits"
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	h, err := asCUDA(op, "hidden", hidden)
	if err != nil {
		return err
	}
	rs, err := optCUDA(op, "rows", rows)
	if err != nil {
		return err
	}
	nw, err := optCUDA(op, "norm", norm)
	if err != nil {
		return err
	}
	hw, err := asCUDA(op, "head", head)
	if err != nil {
		return err
	}
	t, r, dim, vocab, err := kernels.LogitsShapes("cuda", o, h, rs, nw, hw)
	if err != nil {
		return err
	}
	if err := fp8Refuse(op, "head", hw); err != nil {
		return err
	}
	if hw.q != nil { // a block-quantized head (quant.go)
		return b.quantLogits(o, h, rs, nw, hw, t, r, dim, vocab, eps)
	}
	return b.launch(op, func() C.int {
		return C.c_logits(b.lib.api, b.ctx, o.ptr(), h.ptr(), optPtr(rs), C.int(r), C.int(t), optPtr(nw), hw.ptr(),
			C.int(hw.dtype), C.int(dim), C.int(vocab), C.float(eps))
	}, o, h, rs, nw, hw)
}

// PrepareQKV is kernels.QKVPreparer: one kernel for the split, the per-head
// norms, RoPE and both cache writes, with the bits of the separate ops.
// Positions and slots outside their tables are reported by the next
// Download or Sync.
func (b *Backend) PrepareQKV(a kernels.QKV) error {
	const op = "qkv_prepare"
	var ts [10]*Tensor
	for i, arg := range []struct {
		name string
		t    kernels.Tensor
		opt  bool
	}{{"qkv", a.QKV, false}, {"q", a.Q, false}, {"k_cache", a.KCache, false}, {"v_cache", a.VCache, false},
		{"slot_mapping", a.SlotMapping, false}, {"positions", a.Positions, false}, {"cos", a.Cos, false}, {"sin", a.Sin, false},
		{"q_norm", a.QNorm, true}, {"k_norm", a.KNorm, true}} {
		var err error
		if arg.opt {
			ts[i], err = optCUDA(op, arg.name, arg.t)
		} else {
			ts[i], err = asCUDA(op, arg.name, arg.t)
		}
		if err != nil {
			return err
		}
	}
	qkv, q, kc, vc, sm, pos, cs, sn, qn, kn := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6], ts[7], ts[8], ts[9]
	t, maxPos, err := kernels.QKVShapes("cuda", a, cacheDTypes...)
	if err != nil {
		return err
	}
	h, hkv, d, rp := a.NumHeads, a.NumKVHeads, a.HeadDim, a.RoPE
	il := 0
	if rp.Interleaved {
		il = 1
	}
	args := C.di_qkv{
		qkv: qkv.ptr(), q: q.ptr(), k_cache: kc.ptr(), v_cache: vc.ptr(), slot_mapping: sm.ptr(), positions: pos.ptr(),
		cos: cs.ptr(), sin: sn.ptr(), q_norm: optPtr(qn), k_norm: optPtr(kn),
		num_tokens: C.int(t), num_heads: C.int(h), num_kv_heads: C.int(hkv), head_dim: C.int(d),
		rot_offset: C.int(rp.Offset), rotary_dim: C.int(rp.RotaryDim), interleaved: C.int(il), max_pos: C.int(maxPos),
		num_slots: C.int(kc.shape[0] * kc.shape[1]), cache_dtype: C.int(kc.dtype), eps: C.float(a.Eps),
	}
	return b.launch(op, func() C.int {
		return C.c_qkv_prepare(b.lib.api, b.ctx, &args)
	}, qkv, q, kc, vc, sm, pos, cs, sn, qn, kn)
}
