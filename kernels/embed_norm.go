package kernels

// EmbedNormConcater is implemented by backends that run a
// multi-token-prediction layer's input in one operation:
// EmbedNormConcat(out, table, ids, embNorm, x, xNorm, eps) writes out (F32
// [T, 2h]) = [RMSNorm(table[ids]; embNorm), RMSNorm(x; xNorm)] for ids I32
// [T], table [vocab, h], x F32 [T, h], with the bits of Embedding, two
// RMSNorms and Concat (an id outside the table is the embedding's error).
type EmbedNormConcater interface {
	EmbedNormConcat(out, table, ids, embNorm, x, xNorm Tensor, eps float32) error
}

// EmbedNormConcat writes out = [RMSNorm(table[ids]; embNorm), RMSNorm(x;
// xNorm)] on ops: in one operation where ops implements EmbedNormConcater,
// else as Embedding into e and RMSNorm in place, RMSNorm of x into xn
// (both F32 [T, h]) and Concat.
func EmbedNormConcat(ops Ops, out, e, xn, table, ids, embNorm, x, xNorm Tensor, eps float32) error {
	if f, ok := ops.(EmbedNormConcater); ok {
		return f.EmbedNormConcat(out, table, ids, embNorm, x, xNorm, eps)
	}
	return EmbedNormConcatSteps(ops, out, e, xn, table, ids, embNorm, x, xNorm, eps)
}

// EmbedNormConcatSteps is EmbedNormConcat as its four operations on ops:
// Embedding into e and RMSNorm in place, RMSNorm of x into xn, Concat.
func EmbedNormConcatSteps(ops Ops, out, e, xn, table, ids, embNorm, x, xNorm Tensor, eps float32) error {
	if err := ops.Embedding(e, table, ids); err != nil {
		return err
	}
	if err := ops.RMSNorm(e, e, embNorm, eps); err != nil {
		return err
	}
	if err := ops.RMSNorm(xn, x, xNorm, eps); err != nil {
		return err
	}
	return ops.Concat(out, e, xn)
}
