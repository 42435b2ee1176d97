package kernels

import (
	"fmt"
	"math"
	"reflect"
)

// The argument contracts of the Ops methods (and of the optional
// interfaces GatedMLPer and QKVPreparer), checked here once so that every
// backend refuses the same arguments with the same error. Each function
// returns the sizes the kernel needs, or the first error (wrapping ErrShape
// or ErrDType) naming the backend, the operation and the argument.
// Backends convert the tensors to their own type first (As), so a foreign
// tensor is reported as such before any shape. Where backends' kernels
// take different dtypes (a 16-bit norm output, an F16 cache), the accepted
// dtypes are a parameter; the rest of the contract is common.
//
// These checks read shapes, dtypes and host-side parameters only: the
// values inside index tensors (token ids, positions, slots, block tables)
// are checked by the backend, on the host or on its device. Cost: O(number
// of arguments).

// present reports whether an optional argument is given: neither a nil
// interface nor a typed nil pointer.
func present(t Tensor) bool {
	if t == nil {
		return false
	}
	v := reflect.ValueOf(t)
	return v.Kind() != reflect.Pointer || !v.IsNil()
}

// NormShapes checks RMSNorm-style arguments: x F32 [rows, n], out [rows, n]
// of one of outTypes (F32 when none are given), weight F32 [n].
func NormShapes(backend, op string, out, x, weight Tensor, outTypes ...DType) (rows, n int, err error) {
	if err = CheckShape(backend, op, "x", x, []int{-1, -1}, F32); err != nil {
		return
	}
	rows, n = x.Shape()[0], x.Shape()[1]
	if len(outTypes) == 0 {
		outTypes = []DType{F32}
	}
	if err = CheckShape(backend, op, "out", out, []int{rows, n}, outTypes...); err != nil {
		return
	}
	err = CheckShape(backend, op, "weight", weight, []int{n}, F32)
	return
}

// LinearShapes checks Linear's arguments: w [n, k] in a float dtype, x
// [m, k] of one of xTypes (F32 when none are given) and, when not F32, of
// w's 16-bit dtype (see LinearInputer), out F32 [m, n], bias F32 [n] when
// given.
func LinearShapes(backend string, out, x, w, bias Tensor, xTypes ...DType) (m, n, k int, err error) {
	const op = "linear"
	if err = CheckShape(backend, op, "w", w, []int{-1, -1}, weightTypes(w)...); err != nil {
		return
	}
	n, k = w.Shape()[0], w.Shape()[1]
	if len(xTypes) == 0 {
		xTypes = []DType{F32}
	}
	if err = CheckShape(backend, op, "x", x, []int{-1, k}, xTypes...); err != nil {
		return
	}
	if err = inputDType(backend, op, x, w); err != nil {
		return
	}
	m = x.Shape()[0]
	if err = CheckShape(backend, op, "out", out, []int{m, n}, F32); err != nil {
		return
	}
	if present(bias) {
		err = CheckShape(backend, op, "bias", bias, []int{n}, F32)
	}
	return
}

// RouteShapes checks MoERoute's arguments: logits F32 [t, e], p valid for
// e experts, ids I32 and weights F32 [t, TopK], bias F32 [e] when given.
func RouteShapes(backend string, ids, weights, logits, bias Tensor, p RouteParams) (t, e int, err error) {
	const op = "moe_route"
	if err = CheckShape(backend, op, "logits", logits, []int{-1, -1}, F32); err != nil {
		return
	}
	t, e = logits.Shape()[0], logits.Shape()[1]
	if err = p.Validate(e); err != nil {
		err = fmt.Errorf("%s: %s: %w", backend, op, err)
		return
	}
	if err = CheckShape(backend, op, "ids", ids, []int{t, p.TopK}, I32); err != nil {
		return
	}
	if err = CheckShape(backend, op, "weights", weights, []int{t, p.TopK}, F32); err != nil {
		return
	}
	if present(bias) {
		err = CheckShape(backend, op, "bias", bias, []int{e}, F32)
	}
	return
}

// MLAShapes checks MLAAttention's arguments against p: q F32 [t,
// heads*(nope+rope)], out F32 [t, heads*v], cache [blocks, block_size,
// kv_lora+rope] of F32 or one of cacheTypes (an F8E4M3 cache's rows are
// MLAF8RowBytes(kv_lora, rope) wide), wkvb [heads*(nope+v), kv_lora] in a
// float dtype.
func MLAShapes(backend string, out, q, cache, wkvb Tensor, p MLAParams, cacheTypes ...DType) (t int, err error) {
	const op = "mla_attention"
	if p.NumHeads <= 0 || p.NopeDim <= 0 || p.RopeDim <= 0 || p.KVLoraRank <= 0 || p.VHeadDim <= 0 {
		return 0, fmt.Errorf("%s: %s: params %+v: %w", backend, op, p, ErrShape)
	}
	nh, nope, rope, kvl, vd := p.NumHeads, p.NopeDim, p.RopeDim, p.KVLoraRank, p.VHeadDim
	if err = CheckShape(backend, op, "q", q, []int{-1, nh * (nope + rope)}, F32); err != nil {
		return
	}
	t = q.Shape()[0]
	if err = CheckShape(backend, op, "out", out, []int{t, nh * vd}, F32); err != nil {
		return
	}
	width := kvl + rope
	if present(cache) && cache.DType() == F8E4M3 {
		width = MLAF8RowBytes(kvl, rope)
	}
	if err = CheckShape(backend, op, "cache", cache, []int{-1, -1, width}, append([]DType{F32}, cacheTypes...)...); err != nil {
		return
	}
	err = CheckShape(backend, op, "wkvb", wkvb, []int{nh * (nope + vd), kvl}, weightTypes(wkvb)...)
	return
}

// EmbeddingShapes checks Embedding's arguments: table [vocab, hidden] in a
// float dtype, ids I32 [t], out F32 [t, hidden].
func EmbeddingShapes(backend string, out, table, ids Tensor) (vocab, hidden, t int, err error) {
	const op = "embedding"
	if err = CheckShape(backend, op, "table", table, []int{-1, -1}, weightTypes(table)...); err != nil {
		return
	}
	vocab, hidden = table.Shape()[0], table.Shape()[1]
	if err = CheckShape(backend, op, "ids", ids, []int{-1}, I32); err != nil {
		return
	}
	t = ids.Shape()[0]
	err = CheckShape(backend, op, "out", out, []int{t, hidden}, F32)
	return
}

// MoEDims are the sizes of one MoE call.
type MoEDims struct {
	T, Hidden, NumExperts, Inter, TopK int
}

// MoEShapes checks MoE's arguments: x and out F32 [t, hidden], gateUp
// [experts, 2*inter, hidden] in a float dtype and down [experts, hidden,
// inter] in gateUp's, ids I32 and weights F32 [t, top_k].
func MoEShapes(backend string, out, x, ids, weights, gateUp, down Tensor) (MoEDims, error) {
	return moeShapes(backend, out, x, ids, weights, gateUp, down, F32)
}

// MoERoundedShapes is MoEShapes for a backend whose MoE also takes x
// rounded already to its 16-bit experts' dtype (see LinearInputer): x F32,
// or BF16 or F16 where gateUp is of that dtype.
func MoERoundedShapes(backend string, out, x, ids, weights, gateUp, down Tensor) (MoEDims, error) {
	if dt := x.DType(); (dt == BF16 || dt == F16) && gateUp.DType() == dt {
		return moeShapes(backend, out, x, ids, weights, gateUp, down, dt)
	}
	return MoEShapes(backend, out, x, ids, weights, gateUp, down)
}

func moeShapes(backend string, out, x, ids, weights, gateUp, down Tensor, xType DType) (d MoEDims, err error) {
	const op = "moe"
	if err = CheckShape(backend, op, "x", x, []int{-1, -1}, xType); err != nil {
		return
	}
	d.T, d.Hidden = x.Shape()[0], x.Shape()[1]
	if err = CheckShape(backend, op, "gate_up", gateUp, []int{-1, -1, d.Hidden}, weightTypes(gateUp)...); err != nil {
		return
	}
	d.NumExperts, d.Inter = gateUp.Shape()[0], gateUp.Shape()[1]/2
	if gateUp.Shape()[1]%2 != 0 {
		err = fmt.Errorf("%s: %s: gate_up %v has an odd row count: %w", backend, op, gateUp, ErrShape)
		return
	}
	if err = CheckShape(backend, op, "down", down, []int{d.NumExperts, d.Hidden, d.Inter}, gateUp.DType()); err != nil {
		return
	}
	if err = CheckShape(backend, op, "ids", ids, []int{d.T, -1}, I32); err != nil {
		return
	}
	d.TopK = ids.Shape()[1]
	if err = CheckShape(backend, op, "weights", weights, []int{d.T, d.TopK}, F32); err != nil {
		return
	}
	err = CheckShape(backend, op, "out", out, []int{d.T, d.Hidden}, F32)
	return
}

// ClampedSwiGLUShapes checks the arguments that BiasedMoEer's
// MoEClampedSwiGLU adds to MoE's, given d, the sizes of its MoE arguments
// (MoEShapes or MXFP4MoEShapes): gateUpBias F32 [experts, 2*inter],
// downBias F32 [experts, hidden], p.Limit finite and > 0, p.Alpha not NaN.
func ClampedSwiGLUShapes(backend string, d MoEDims, gateUpBias, downBias Tensor, p ClampedSwiGLU) error {
	const op = "moe_clamped_swiglu"
	if err := CheckShape(backend, op, "gate_up_bias", gateUpBias, []int{d.NumExperts, 2 * d.Inter}, F32); err != nil {
		return err
	}
	if err := CheckShape(backend, op, "down_bias", downBias, []int{d.NumExperts, d.Hidden}, F32); err != nil {
		return err
	}
	if !(p.Limit > 0) || math.IsInf(float64(p.Limit), 0) || math.IsNaN(float64(p.Alpha)) {
		return fmt.Errorf("%s: %s: limit %g, alpha %g: %w", backend, op, p.Limit, p.Alpha, ErrShape)
	}
	return nil
}

// SplitShapes checks SplitColumns' arguments: x F32 [rows, width], at
// least one part, each F32 [rows, w_i] with the w_i summing to width.
func SplitShapes(backend string, x Tensor, parts []Tensor) (rows, width int, err error) {
	const op = "split_columns"
	if err = CheckShape(backend, op, "x", x, []int{-1, -1}, F32); err != nil {
		return 0, 0, err
	}
	rows, width = x.Shape()[0], x.Shape()[1]
	if len(parts) == 0 {
		return 0, 0, fmt.Errorf("%s: %s: no parts: %w", backend, op, ErrShape)
	}
	sum := 0
	for i, p := range parts {
		if err = CheckShape(backend, op, fmt.Sprintf("parts[%d]", i), p, []int{rows, -1}, F32); err != nil {
			return 0, 0, err
		}
		sum += p.Shape()[1]
	}
	if sum != width {
		return 0, 0, fmt.Errorf("%s: %s: parts of %d columns in all from x of %d: %w", backend, op, sum, width, ErrShape)
	}
	return rows, width, nil
}

// inputDType checks the rule LinearInputer sets for a matrix product's x:
// F32, or the 16-bit dtype of its weights w (x already rounded to it).
// Anything else wraps ErrShape.
func inputDType(backend, op string, x, w Tensor) error {
	xd, wd := x.DType(), w.DType()
	if xd == F32 || (xd == wd && (wd == BF16 || wd == F16)) {
		return nil
	}
	return fmt.Errorf("%s: %s: x of dtype %s with weights of dtype %s: want F32 or the weights' 16-bit dtype: %w",
		backend, op, xd, wd, ErrShape)
}

// orF32 is dtypes, or F32 alone when none are given.
func orF32(dtypes []DType) []DType {
	if len(dtypes) == 0 {
		return []DType{F32}
	}
	return dtypes
}

// AddNormShapes checks AddRMSNorm's arguments: those of NormShapes (op
// add_rms_norm, out of one of outTypes) and residual F32 [rows, n].
func AddNormShapes(backend string, out, residual, x, weight Tensor, outTypes ...DType) (rows, n int, err error) {
	const op = "add_rms_norm"
	if rows, n, err = NormShapes(backend, op, out, x, weight, outTypes...); err != nil {
		return
	}
	err = CheckShape(backend, op, "residual", residual, []int{rows, n}, F32)
	return
}

// GatedMLPShapes checks GatedMLPer.GatedMLP's arguments: x [rows, hidden]
// of one of xTypes (F32 when none are given; a 16-bit x must be of
// gate_up's dtype, as for Linear), gate_up [2n, hidden] in a float dtype
// (an even row count), down [hidden, n] in gate_up's dtype, out F32 [rows,
// hidden]. The scratch tensors are the unfused Linear's and SiLUMul's to
// check.
func GatedMLPShapes(backend string, out, x, gateUp, down Tensor, xTypes ...DType) (rows, hidden, n int, err error) {
	const op = "gated_mlp"
	if err = CheckShape(backend, op, "x", x, []int{-1, -1}, orF32(xTypes)...); err != nil {
		return
	}
	rows, hidden = x.Shape()[0], x.Shape()[1]
	if err = CheckShape(backend, op, "gate_up", gateUp, []int{-1, hidden}, FloatTypes...); err != nil {
		return
	}
	if err = inputDType(backend, op, x, gateUp); err != nil {
		return
	}
	if gateUp.Shape()[0]%2 != 0 {
		err = fmt.Errorf("%s: %s: gate_up %v has an odd row count: %w", backend, op, gateUp, ErrShape)
		return
	}
	n = gateUp.Shape()[0] / 2
	if err = CheckShape(backend, op, "down", down, []int{hidden, n}, gateUp.DType()); err != nil {
		return
	}
	err = CheckShape(backend, op, "out", out, []int{rows, hidden}, F32)
	return
}

// SiLUMulShapes checks SiLUMul's arguments: gate_up F32 [rows, 2n] (an
// even width), out F32 [rows, n].
func SiLUMulShapes(backend string, out, gateUp Tensor) (rows, n int, err error) {
	const op = "silu_mul"
	if err = CheckShape(backend, op, "gate_up", gateUp, []int{-1, -1}, F32); err != nil {
		return
	}
	rows, n = gateUp.Shape()[0], gateUp.Shape()[1]/2
	if gateUp.Shape()[1]%2 != 0 {
		err = fmt.Errorf("%s: %s: gate_up %v has an odd width: %w", backend, op, gateUp, ErrShape)
		return
	}
	err = CheckShape(backend, op, "out", out, []int{rows, n}, F32)
	return
}

// AddShapes checks Add's arguments: a, b and out F32, all of out's shape
// (any rank). It returns the number of elements.
func AddShapes(backend string, out, a, b Tensor) (n int, err error) {
	const op = "add"
	shape := out.Shape()
	if err = CheckShape(backend, op, "a", a, shape, F32); err != nil {
		return 0, err
	}
	if err = CheckShape(backend, op, "b", b, shape, F32); err != nil {
		return 0, err
	}
	if err = CheckShape(backend, op, "out", out, shape, F32); err != nil {
		return 0, err
	}
	return NumElements(out), nil
}

// ConcatShapes checks Concat's arguments: a F32 [rows, m], b F32 [rows,
// n], out F32 [rows, m+n].
func ConcatShapes(backend string, out, a, b Tensor) (rows, m, n int, err error) {
	const op = "concat"
	if err = CheckShape(backend, op, "a", a, []int{-1, -1}, F32); err != nil {
		return
	}
	rows, m = a.Shape()[0], a.Shape()[1]
	if err = CheckShape(backend, op, "b", b, []int{rows, -1}, F32); err != nil {
		return
	}
	n = b.Shape()[1]
	err = CheckShape(backend, op, "out", out, []int{rows, m + n}, F32)
	return
}

// ropeParams checks that RoPE's rotation fits in a head of headSize
// elements: numHeads > 0, an even RotaryDim > 0 starting at Offset >= 0
// and ending within the head.
func ropeParams(p RoPEParams, numHeads, headSize int) bool {
	return numHeads > 0 && p.RotaryDim > 0 && p.RotaryDim%2 == 0 && p.Offset >= 0 && p.Offset+p.RotaryDim <= headSize
}

// RoPEShapes checks RoPE's arguments: p with NumHeads > 0 and an even
// RotaryDim > 0 that fits in a head of HeadSize from Offset >= 0; x F32
// [t, NumHeads*HeadSize]; positions I32 [t]; cos F32 [max_pos,
// RotaryDim/2] and sin F32 of cos's shape. It returns t and max_pos.
func RoPEShapes(backend string, x, positions, cos, sin Tensor, p RoPEParams) (t, maxPos int, err error) {
	const op = "rope"
	if !ropeParams(p, p.NumHeads, p.HeadSize) {
		err = fmt.Errorf("%s: %s: params %+v: %w", backend, op, p, ErrShape)
		return
	}
	if err = CheckShape(backend, op, "x", x, []int{-1, p.NumHeads * p.HeadSize}, F32); err != nil {
		return
	}
	t = x.Shape()[0]
	if err = CheckShape(backend, op, "positions", positions, []int{t}, I32); err != nil {
		return
	}
	half := p.RotaryDim / 2
	if err = CheckShape(backend, op, "cos", cos, []int{-1, half}, F32); err != nil {
		return
	}
	maxPos = cos.Shape()[0]
	err = CheckShape(backend, op, "sin", sin, []int{maxPos, half}, F32)
	return
}

// CacheWrite are the sizes of one WriteCache call: T rows of W elements
// into columns [Col, Col+W) of a cache of Slots rows of Width elements.
type CacheWrite struct {
	T, W, Col, Slots, Width int
}

// WriteCacheShapes checks WriteCache's arguments: cache [blocks,
// block_size, width] of one of cacheTypes (F32 when none are given), src
// F32 [t, w] with columns [col, col+w) inside the width, slot_mapping I32
// [t].
func WriteCacheShapes(backend string, cache, src, slotMapping Tensor, col int, cacheTypes ...DType) (c CacheWrite, err error) {
	const op = "write_cache"
	if err = CheckShape(backend, op, "cache", cache, []int{-1, -1, -1}, orF32(cacheTypes)...); err != nil {
		return
	}
	cs := cache.Shape()
	c.Slots, c.Width, c.Col = cs[0]*cs[1], cs[2], col
	if err = CheckShape(backend, op, "src", src, []int{-1, -1}, F32); err != nil {
		return
	}
	c.T, c.W = src.Shape()[0], src.Shape()[1]
	if col < 0 || col+c.W > c.Width {
		err = fmt.Errorf("%s: %s: columns [%d, %d) of cache %v: %w", backend, op, col, col+c.W, cache, ErrShape)
		return
	}
	err = CheckShape(backend, op, "slot_mapping", slotMapping, []int{c.T}, I32)
	return
}

// AttentionShapes checks Attention's arguments other than its metadata
// (MetadataShapes): p with NumHeads, NumKVHeads and HeadDim > 0,
// NumKVHeads dividing NumHeads, SlidingWindow >= 0 and an InputDType of 0,
// F32, BF16 or F16; q F32 [t, NumHeads*HeadDim]; out [t,
// NumHeads*HeadDim] of one of outTypes; k_cache [blocks, block_size,
// NumKVHeads*HeadDim] of one of cacheTypes; v_cache of k_cache's shape and
// dtype. Empty type lists mean F32 alone. It returns t.
func AttentionShapes(backend string, out, q, kCache, vCache Tensor, p AttentionParams, outTypes, cacheTypes []DType) (t int, err error) {
	const op = "attention"
	if p.NumHeads <= 0 || p.NumKVHeads <= 0 || p.NumHeads%p.NumKVHeads != 0 || p.HeadDim <= 0 || p.SlidingWindow < 0 {
		return 0, fmt.Errorf("%s: %s: params %+v: %w", backend, op, p, ErrShape)
	}
	switch p.InputDType {
	case 0, F32, BF16, F16:
	default:
		return 0, fmt.Errorf("%s: %s: input dtype %v: want F32, BF16 or F16: %w", backend, op, p.InputDType, ErrDType)
	}
	width := p.NumHeads * p.HeadDim
	if err = CheckShape(backend, op, "q", q, []int{-1, width}, F32); err != nil {
		return 0, err
	}
	t = q.Shape()[0]
	if err = CheckShape(backend, op, "out", out, []int{t, width}, orF32(outTypes)...); err != nil {
		return 0, err
	}
	if err = CheckShape(backend, op, "k_cache", kCache, []int{-1, -1, p.NumKVHeads * p.HeadDim}, orF32(cacheTypes)...); err != nil {
		return 0, err
	}
	if err = CheckShape(backend, op, "v_cache", vCache, kCache.Shape(), kCache.DType()); err != nil {
		return 0, err
	}
	return t, nil
}

// MetadataShapes checks the attention metadata m of op (attention or
// mla_attention) for numTokens query rows over a cache of block_size
// blockSize, and converts its tensors to the backend's type T (As): m
// non-nil; m.BlockSize = blockSize > 0; NumSeqs >= 0, and > 0 when there
// are tokens; NumTokens = numTokens; cu_seqlens_q I32 [NumSeqs+1],
// seqlens_k I32 [NumSeqs], block_tables I32 [NumSeqs, max_blocks]. The
// values inside the tensors are the backend's to check.
func MetadataShapes[T interface {
	comparable
	Tensor
}](backend, op string, m *AttentionMetadata, numTokens, blockSize int) (cu, seqlensK, blockTables T, err error) {
	if m == nil {
		err = fmt.Errorf("%s: %s: nil metadata: %w", backend, op, ErrShape)
		return
	}
	if m.BlockSize != blockSize || blockSize <= 0 {
		err = fmt.Errorf("%s: %s: metadata block size %d, cache block size %d: %w", backend, op, m.BlockSize, blockSize, ErrShape)
		return
	}
	if cu, err = As[T](backend, op, "cu_seqlens_q", m.CuSeqlensQ); err != nil {
		return
	}
	if seqlensK, err = As[T](backend, op, "seqlens_k", m.SeqlensK); err != nil {
		return
	}
	if blockTables, err = As[T](backend, op, "block_tables", m.BlockTables); err != nil {
		return
	}
	n := m.NumSeqs
	if n < 0 || (n == 0 && numTokens > 0) {
		err = fmt.Errorf("%s: %s: %d sequences for %d tokens: %w", backend, op, n, numTokens, ErrShape)
		return
	}
	if m.NumTokens != numTokens {
		err = fmt.Errorf("%s: %s: metadata has %d tokens, q has %d rows: %w", backend, op, m.NumTokens, numTokens, ErrShape)
		return
	}
	if err = CheckShape(backend, op, "cu_seqlens_q", cu, []int{n + 1}, I32); err != nil {
		return
	}
	if err = CheckShape(backend, op, "seqlens_k", seqlensK, []int{n}, I32); err != nil {
		return
	}
	err = CheckShape(backend, op, "block_tables", blockTables, []int{n, -1}, I32)
	return
}

// LogitsShapes checks Logits' arguments: hidden F32 [t, dim]; head
// [vocab, dim] in a float dtype; rows I32 [r] when given (r = t when
// nil); out F32 [r, vocab]; norm F32 [dim] when given.
func LogitsShapes(backend string, out, hidden, rows, norm, head Tensor) (t, r, dim, vocab int, err error) {
	const op = "logits"
	if err = CheckShape(backend, op, "hidden", hidden, []int{-1, -1}, F32); err != nil {
		return
	}
	t, dim = hidden.Shape()[0], hidden.Shape()[1]
	if err = CheckShape(backend, op, "head", head, []int{-1, dim}, weightTypes(head)...); err != nil {
		return
	}
	vocab, r = head.Shape()[0], t
	if present(rows) {
		if err = CheckShape(backend, op, "rows", rows, []int{-1}, I32); err != nil {
			return
		}
		r = rows.Shape()[0]
	}
	if err = CheckShape(backend, op, "out", out, []int{r, vocab}, F32); err != nil {
		return
	}
	if present(norm) {
		err = CheckShape(backend, op, "norm", norm, []int{dim}, F32)
	}
	return
}

// ResolveShapes checks ResolvePlaceholders' arguments: ids I32 [t],
// from_row I32 [t], sampled I32 [r].
func ResolveShapes(backend string, ids, fromRow, sampled Tensor) (t, r int, err error) {
	const op = "resolve_placeholders"
	if err = CheckShape(backend, op, "ids", ids, []int{-1}, I32); err != nil {
		return
	}
	t = ids.Shape()[0]
	if err = CheckShape(backend, op, "from_row", fromRow, []int{t}, I32); err != nil {
		return
	}
	if err = CheckShape(backend, op, "sampled", sampled, []int{-1}, I32); err != nil {
		return
	}
	r = sampled.Shape()[0]
	return
}

// ShiftShapes checks ShiftAccepted's arguments: m's CuSeqlensQ I32
// [NumSeqs+1], SeqlensK I32 [NumSeqs], BlockTables I32 [NumSeqs, blocks],
// SlotMapping I32 [NumTokens], BlockSize > 0; positions I32 [NumTokens],
// shiftFrom I32 [NumSeqs], accepted I32 [r]. It returns r and the block
// table's width.
func ShiftShapes(backend string, m *AttentionMetadata, positions, shiftFrom, accepted Tensor) (r, width int, err error) {
	const op = "shift_accepted"
	if m == nil || m.NumSeqs <= 0 || m.NumTokens <= 0 || m.BlockSize <= 0 {
		err = fmt.Errorf("%s: %s: metadata %+v: %w", backend, op, m, ErrShape)
		return
	}
	n, t := m.NumSeqs, m.NumTokens
	checks := []struct {
		name  string
		x     Tensor
		shape []int
	}{
		{"cu_seqlens_q", m.CuSeqlensQ, []int{n + 1}},
		{"seqlens_k", m.SeqlensK, []int{n}},
		{"block_tables", m.BlockTables, []int{n, -1}},
		{"slot_mapping", m.SlotMapping, []int{t}},
		{"positions", positions, []int{t}},
		{"shift_from", shiftFrom, []int{n}},
		{"accepted", accepted, []int{-1}},
	}
	for _, c := range checks {
		if err = CheckShape(backend, op, c.name, c.x, c.shape, I32); err != nil {
			return
		}
	}
	return accepted.Shape()[0], m.BlockTables.Shape()[1], nil
}

// QKVShapes checks the arguments of a fused QKVPreparer.PrepareQKV:
// NumHeads, NumKVHeads and HeadDim > 0; a RoPE rotation that fits in a
// head (as RoPEShapes); QNorm and KNorm both given or both nil; QKV F32
// [t, (NumHeads+2*NumKVHeads)*HeadDim]; Q F32 [t, NumHeads*HeadDim];
// KCache [blocks, block_size, NumKVHeads*HeadDim] of one of cacheTypes
// (F32 when none are given) and VCache of its shape and dtype;
// SlotMapping and Positions I32 [t]; Cos F32 [max_pos, RotaryDim/2] and
// Sin of its shape; QNorm and KNorm F32 [HeadDim]. K and V, scratch of the
// unfused steps, are not checked. It returns t and max_pos.
func QKVShapes(backend string, a QKV, cacheTypes ...DType) (t, maxPos int, err error) {
	const op = "qkv_prepare"
	h, hkv, d, rp := a.NumHeads, a.NumKVHeads, a.HeadDim, a.RoPE
	if h <= 0 || hkv <= 0 || d <= 0 || !ropeParams(rp, h, d) {
		err = fmt.Errorf("%s: %s: %d heads, %d kv heads, head dim %d, rope %+v: %w", backend, op, h, hkv, d, rp, ErrShape)
		return
	}
	if present(a.QNorm) != present(a.KNorm) {
		err = fmt.Errorf("%s: %s: q_norm and k_norm are both set or both nil: %w", backend, op, ErrShape)
		return
	}
	if err = CheckShape(backend, op, "qkv", a.QKV, []int{-1, (h + 2*hkv) * d}, F32); err != nil {
		return
	}
	t = a.QKV.Shape()[0]
	check := func(name string, x Tensor, want []int, dtypes ...DType) bool {
		err = CheckShape(backend, op, name, x, want, dtypes...)
		return err == nil
	}
	// Each check runs only when those before it passed, so k_cache and cos
	// are known to be present when v_cache and sin are compared with them.
	ok := check("q", a.Q, []int{t, h * d}, F32) &&
		check("k_cache", a.KCache, []int{-1, -1, hkv * d}, orF32(cacheTypes)...) &&
		check("v_cache", a.VCache, a.KCache.Shape(), a.KCache.DType()) &&
		check("slot_mapping", a.SlotMapping, []int{t}, I32) &&
		check("positions", a.Positions, []int{t}, I32) &&
		check("cos", a.Cos, []int{-1, rp.RotaryDim / 2}, F32) &&
		check("sin", a.Sin, a.Cos.Shape(), F32) &&
		(!present(a.QNorm) || (check("q_norm", a.QNorm, []int{d}, F32) && check("k_norm", a.KNorm, []int{d}, F32)))
	if !ok {
		return 0, 0, err
	}
	return t, a.Cos.Shape()[0], nil
}

// AllocShapes checks Alloc's arguments: no negative dimension and a dtype
// of nonzero Size. It returns the number of elements.
func AllocShapes(backend string, dtype DType, shape []int) (n int, err error) {
	n = 1
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("%s: alloc %v%v: negative dimension: %w", backend, dtype, shape, ErrShape)
		}
		n *= d
	}
	if dtype.Size() == 0 {
		return 0, fmt.Errorf("%s: alloc %v%v: %w", backend, dtype, shape, ErrDType)
	}
	return n, nil
}

// UploadShapes checks Upload's arguments: srcBytes bytes of a known
// srcDType, NumElements(dst)*srcDType.Size() of them; srcDType dst's dtype
// or, into an F32 dst, BF16 or F16 (widen reports that case). It returns
// the number of elements.
func UploadShapes(backend string, dst Tensor, srcBytes int, srcDType DType) (n int, widen bool, err error) {
	if !present(dst) {
		return 0, false, fmt.Errorf("%s: upload: dst is %T: %w", backend, dst, ErrForeignTensor)
	}
	n = NumElements(dst)
	if srcDType.Size() == 0 || srcBytes != n*srcDType.Size() {
		return 0, false, fmt.Errorf("%s: upload %v bytes of %v into %v: want %d bytes: %w",
			backend, srcBytes, srcDType, dst, n*srcDType.Size(), ErrShape)
	}
	widen = dst.DType() == F32 && (srcDType == BF16 || srcDType == F16)
	if srcDType != dst.DType() && !widen {
		return 0, false, fmt.Errorf("%s: upload %v into %v: %w", backend, srcDType, dst, ErrDType)
	}
	return n, widen, nil
}

// DownloadShapes checks Download's arguments: dstBytes =
// NumElements(src) * the size of src's dtype. It returns that size.
func DownloadShapes(backend string, dstBytes int, src Tensor) (bytes int, err error) {
	if !present(src) {
		return 0, fmt.Errorf("%s: download: src is %T: %w", backend, src, ErrForeignTensor)
	}
	bytes = NumElements(src) * src.DType().Size()
	if dstBytes != bytes {
		return 0, fmt.Errorf("%s: download %v into %d bytes: want %d: %w", backend, src, dstBytes, bytes, ErrShape)
	}
	return bytes, nil
}

// RowsShapes checks Rows' arguments: t has a dimension 0, and 0 <= lo <=
// hi <= its size.
func RowsShapes(backend string, t Tensor, lo, hi int) error {
	if !present(t) {
		return fmt.Errorf("%s: rows: t is %T: %w", backend, t, ErrForeignTensor)
	}
	if s := t.Shape(); len(s) == 0 || lo < 0 || hi < lo || hi > s[0] {
		return fmt.Errorf("%s: rows [%d, %d) of %v: %w", backend, lo, hi, t, ErrShape)
	}
	return nil
}

// ReshapeShapes checks Reshape's arguments: no negative dimension, and as
// many elements as t.
func ReshapeShapes(backend string, t Tensor, shape []int) error {
	if !present(t) {
		return fmt.Errorf("%s: reshape: t is %T: %w", backend, t, ErrForeignTensor)
	}
	n := 1
	for _, d := range shape {
		if d < 0 {
			n = -1
			break
		}
		n *= d
	}
	if n != NumElements(t) {
		return fmt.Errorf("%s: reshape %v to %v: %w", backend, t, shape, ErrShape)
	}
	return nil
}

// RingAttentionShapes checks RingAttentioner.RingAttention's arguments
// other than its metadata: p as AttentionShapes with SlidingWindow > 0; q
// F32 [t, NumHeads*HeadDim]; out of one of outTypes; k and v F32 [t,
// NumKVHeads*HeadDim]; k_ring [slots, SlidingWindow, NumKVHeads*HeadDim]
// of one of cacheTypes and v_ring of its shape and dtype; slots I32
// [num_seqs]. It returns t and the number of slots.
func RingAttentionShapes(backend string, out, q, k, v, kRing, vRing, slots Tensor, p AttentionParams, outTypes, cacheTypes []DType) (t, numSlots int, err error) {
	const op = "ring_attention"
	if p.SlidingWindow <= 0 {
		return 0, 0, fmt.Errorf("%s: %s: sliding window %d, want > 0: %w", backend, op, p.SlidingWindow, ErrShape)
	}
	if t, err = AttentionShapes(backend, out, q, kRing, vRing, p, outTypes, cacheTypes); err != nil {
		return 0, 0, err
	}
	kvw := p.NumKVHeads * p.HeadDim
	if err = CheckShape(backend, op, "k_ring", kRing, []int{-1, p.SlidingWindow, kvw}, orF32(cacheTypes)...); err != nil {
		return 0, 0, err
	}
	if err = CheckShape(backend, op, "k", k, []int{t, kvw}, F32); err != nil {
		return 0, 0, err
	}
	if err = CheckShape(backend, op, "v", v, []int{t, kvw}, F32); err != nil {
		return 0, 0, err
	}
	if err = CheckShape(backend, op, "slots", slots, []int{-1}, I32); err != nil {
		return 0, 0, err
	}
	return t, kRing.Shape()[0], nil
}
