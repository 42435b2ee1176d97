package kernels

// SiLULinearer is implemented by backends that can run the end of a gated
// MLP, out = (silu(gate) * up) W^T (+ bias), as one operation when that is
// cheaper (a one-row GEMV that computes the activation as it reads it).
// gateUp is F32 [T, 2n] (gate then up, as SiLUMul takes it), w [m, n], out
// F32 [T, m]. It must give the bits of SiLUMul followed by Linear.
type SiLULinearer interface {
	SiLULinear(out, gateUp, w, bias Tensor) error
}

// SiLUMulLinear computes out = (silu(gate) * up) W^T (+ bias): fused when
// ops implements SiLULinearer, else SiLUMul into act (F32 [T, n] scratch,
// unused by a fusing backend) and Linear.
func SiLUMulLinear(ops Ops, out, act, gateUp, w, bias Tensor) error {
	if f, ok := ops.(SiLULinearer); ok {
		return f.SiLULinear(out, gateUp, w, bias)
	}
	if err := ops.SiLUMul(act, gateUp); err != nil {
		return err
	}
	return ops.Linear(out, act, w, bias)
}
