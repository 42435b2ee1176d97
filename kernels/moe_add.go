package kernels

// MoEAdder is implemented by backends that add a tensor to MoE's output in
// the pass that writes it: MoEAdd(out, x, ids, weights, gateUp, down, add)
// writes out = MoE(x, ...) + add (add F32, out's shape), with the bits of
// MoE into a scratch tensor followed by Add(out, scratch, add). It saves
// the separate Add's launch and its pass over three tensors (DeepSeek's
// shared experts' output added to the routed experts').
type MoEAdder interface {
	MoEAdd(out, x, ids, weights, gateUp, down, add Tensor) error
}

// MoEAdd writes out = MoE(x, ids, weights, gateUp, down) + add on ops: in
// one operation where ops implements MoEAdder, else as MoE into routed (a
// scratch tensor of out's shape) followed by Add(out, routed, add).
func MoEAdd(ops Ops, out, routed, x, ids, weights, gateUp, down, add Tensor) error {
	if a, ok := ops.(MoEAdder); ok {
		return a.MoEAdd(out, x, ids, weights, gateUp, down, add)
	}
	if err := ops.MoE(routed, x, ids, weights, gateUp, down); err != nil {
		return err
	}
	return ops.Add(out, routed, add)
}
