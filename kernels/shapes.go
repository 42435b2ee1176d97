package kernels

import (
	"fmt"
	"reflect"
)

// The argument contracts of the Ops methods that both backends check the
// same way. Each returns the sizes the kernel needs, or the first error
// (wrapping ErrShape or ErrDType) naming the backend, the operation and the
// argument. Backends convert the tensors to their own type first (As), so
// a foreign tensor is reported as such before any shape.

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
// [m, k] of one of xTypes (F32 when none are given), out F32 [m, n], bias
// F32 [n] when given.
func LinearShapes(backend string, out, x, w, bias Tensor, xTypes ...DType) (m, n, k int, err error) {
	const op = "linear"
	if err = CheckShape(backend, op, "w", w, []int{-1, -1}, FloatTypes...); err != nil {
		return
	}
	n, k = w.Shape()[0], w.Shape()[1]
	if len(xTypes) == 0 {
		xTypes = []DType{F32}
	}
	if err = CheckShape(backend, op, "x", x, []int{-1, k}, xTypes...); err != nil {
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
// heads*(nope+rope)], out F32 [t, heads*v], cache F32 [blocks, block_size,
// kv_lora+rope], wkvb [heads*(nope+v), kv_lora] in a float dtype.
func MLAShapes(backend string, out, q, cache, wkvb Tensor, p MLAParams) (t int, err error) {
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
	if err = CheckShape(backend, op, "cache", cache, []int{-1, -1, kvl + rope}, F32); err != nil {
		return
	}
	err = CheckShape(backend, op, "wkvb", wkvb, []int{nh * (nope + vd), kvl}, FloatTypes...)
	return
}

// EmbeddingShapes checks Embedding's arguments: table [vocab, hidden] in a
// float dtype, ids I32 [t], out F32 [t, hidden].
func EmbeddingShapes(backend string, out, table, ids Tensor) (vocab, hidden, t int, err error) {
	const op = "embedding"
	if err = CheckShape(backend, op, "table", table, []int{-1, -1}, FloatTypes...); err != nil {
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
// [experts, 2*inter, hidden] and down [experts, hidden, inter] in float
// dtypes, ids I32 and weights F32 [t, top_k].
func MoEShapes(backend string, out, x, ids, weights, gateUp, down Tensor) (d MoEDims, err error) {
	const op = "moe"
	if err = CheckShape(backend, op, "x", x, []int{-1, -1}, F32); err != nil {
		return
	}
	d.T, d.Hidden = x.Shape()[0], x.Shape()[1]
	if err = CheckShape(backend, op, "gate_up", gateUp, []int{-1, -1, d.Hidden}, FloatTypes...); err != nil {
		return
	}
	d.NumExperts, d.Inter = gateUp.Shape()[0], gateUp.Shape()[1]/2
	if gateUp.Shape()[1]%2 != 0 {
		err = fmt.Errorf("%s: %s: gate_up %v has an odd row count: %w", backend, op, gateUp, ErrShape)
		return
	}
	if err = CheckShape(backend, op, "down", down, []int{d.NumExperts, d.Hidden, d.Inter}, FloatTypes...); err != nil {
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
