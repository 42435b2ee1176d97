package models

import (
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// Sparse MoE layers without shared experts or grouped routing, on the
// Llama skeleton: Qwen3-MoE (Qwen3MoeForCausalLM: q/k norms, experts on
// the layers of decoder_sparse_step not in mlp_only_layers, top-k of a
// softmax over all experts, renormalized when norm_topk_prob) and Mixtral
// (MixtralForCausalLM: every layer sparse, the top-k softmax weights always
// renormalized). Both run on MoERoute (softmax scoring, greedy top-k) and
// MoE.

// moeRoute returns the routing of a Qwen3-MoE or Mixtral config.
func moeRoute(cfg *weights.Config) kernels.RouteParams {
	return kernels.RouteParams{TopK: cfg.NumExpertsPerTok, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy,
		NumGroups: 1, TopKGroups: 1, NormTopKProb: cfg.NormTopKProb, ScalingFactor: 1}
}

// loadSparseMoE reads the router and experts of layer prefix p (with its
// trailing dot) in either naming: Mixtral's hub checkpoints
// (block_sparse_moe.gate, experts.<e>.w1/w3/w2 for gate/up/down) or
// transformers' (mlp.gate, mlp.experts.<e>.gate_proj/up_proj/down_proj, or
// the stacked mlp.experts.gate_up_proj and down_proj).
func loadSparseMoE(l *loader, p string, e, h, inter int) *moeWeights {
	mw := &moeWeights{}
	prefix := p + "mlp."
	if l.src.Has(p + "block_sparse_moe.gate.weight") {
		prefix = p + "block_sparse_moe."
	}
	mw.router = l.matrix(prefix+"gate.weight", e, h)
	experts := prefix + "experts."
	switch {
	case l.src.Has(experts + "gate_up_proj"):
		mw.gateUp, mw.down = l.linear(experts+"gate_up_proj", e, 2*inter, h), l.linear(experts+"down_proj", e, h, inter)
	case l.src.Has(experts + "0.w1.weight"):
		mw.gateUp, mw.down = loadExpertParts(l, experts, e, h, inter, "w1", "w3", "w2")
	default:
		mw.gateUp, mw.down = loadExpertParts(l, experts, e, h, inter, "gate_proj", "up_proj", "down_proj")
	}
	return mw
}

// inputs are the linears that read a MoE layer's input x besides the
// routed experts: the router and the shared experts' gate/up.
func (w *moeWeights) inputs() []kernels.Tensor {
	ws := []kernels.Tensor{w.router}
	if w.shared != nil {
		ws = append(ws, w.shared.gateUp)
	}
	return ws
}

// moeForward writes the routed experts (plus the shared ones, when w has
// them) of x into out.
func moeForward(ops kernels.Ops, w *moeWeights, route kernels.RouteParams, numExperts int, s *scratch, out, x kernels.Tensor) error {
	t := x.Shape()[0]
	logits, wts := s.get("moe.logits", t, numExperts), s.get("moe.weights", t, route.TopK)
	if s.err != nil {
		return s.err
	}
	ids, err := kernels.AllocEmpty(ops, kernels.I32, t, route.TopK) // the routing writes every id
	if err != nil {
		return err
	}
	if err := ops.Linear(logits, x, w.router, nil); err != nil {
		return err
	}
	// The routing runs with the routed experts (kernels.RoutedMoE: in their
	// grouping launch where the backend fuses it).
	if w.shared == nil {
		return kernels.RoutedMoE(ops, out, nil, x, logits, w.bias, route, ids, wts, w.gateUp, w.down, nil)
	}
	routed, shared := s.get("moe.routed", t, x.Shape()[1]), s.get("moe.shared", t, x.Shape()[1])
	if s.err != nil {
		return s.err
	}
	// The shared experts first, so that the routed experts' pass can add
	// their output (kernels.MoEAdd: one pass fewer where the backend fuses it).
	if err := w.shared.forward(ops, s, shared, x); err != nil {
		return err
	}
	return kernels.RoutedMoE(ops, out, routed, x, logits, w.bias, route, ids, wts, w.gateUp, w.down, shared)
}
