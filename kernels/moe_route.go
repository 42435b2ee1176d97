package kernels

// MoERouteFuser is implemented by backends that can run MoE's routing
// inside the MoE operation that follows it: RoutedMoE(out, x, logits,
// bias, p, ids, weights, gateUp, down, add) writes ids and weights as
// MoERoute(ids, weights, logits, bias, p) would and out as MoE(out, x, ids,
// weights, gateUp, down) would, plus add where add is not nil (MoEAdder's
// contract), with the bits of those operations run apart. It saves the
// routing's own launch where the backend's grouping of small batches takes
// it in.
type MoERouteFuser interface {
	RoutedMoE(out, x, logits, bias Tensor, p RouteParams, ids, weights, gateUp, down, add Tensor) error
}

// RoutedMoE routes the tokens of x by their router logits (MoERoute into
// ids and weights) and runs the experts (MoE into out, plus add where add
// is not nil: MoEAdd, routed its scratch tensor): in one operation where
// ops implements MoERouteFuser, else as those operations in turn.
func RoutedMoE(ops Ops, out, routed, x, logits, bias Tensor, p RouteParams, ids, weights, gateUp, down, add Tensor) error {
	if f, ok := ops.(MoERouteFuser); ok {
		return f.RoutedMoE(out, x, logits, bias, p, ids, weights, gateUp, down, add)
	}
	if err := ops.MoERoute(ids, weights, logits, bias, p); err != nil {
		return err
	}
	if add == nil {
		return ops.MoE(out, x, ids, weights, gateUp, down)
	}
	return MoEAdd(ops, out, routed, x, ids, weights, gateUp, down, add)
}
