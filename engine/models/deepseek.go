package models

import (
	"context"
	"fmt"
	"log/slog"
	"math"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// deepseek implements DeepSeek V2 and V3: multi-head latent attention with
// optional q compression and decoupled RoPE, a latent KV cache with weight
// absorption, and MoE layers with shared experts and grouped routing.
type deepseek struct {
	base
	v3         bool
	dims       kernels.MLAParams
	qLoraRank  int
	interleave bool
	route      kernels.RouteParams
	layers     []dsLayer
	mtp        *MTP
	fusedRows  int // mlaFusedRows; tests set 0 to run the row views
}

type dsLayer struct {
	inputNorm, postNorm kernels.Tensor
	attn                mlaWeights
	dense               *mlp // dense layers
	moe                 *moeWeights
}

// mlaFusedRows is the most rows for which the fused q / kv_a projection
// (mlaWeights.qKVA) runs as one product and a column split: it saves two
// launches (and, on the GPU, two roundings of x) a layer where a step's
// time is launches, and costs the split's copy where it is bytes (a 4096-
// row prefill: 120 MB a layer), so larger batches run its two row views
// (q_proj, and kv_a, whose split kernels.PrepareMLA does).
const mlaFusedRows = 256

type mlaWeights struct {
	// qKVA is q_proj and kv_a_proj_with_mqa fused, [qd + kv_lora_rank +
	// rope, hidden], where q is not compressed and kv_a has no bias: one
	// product for all three up to mlaFusedRows rows, whose columns
	// kernels.PrepareMLA deals out (qProj and kvA are its row views, two
	// products for more rows). nil otherwise.
	qKVA                   kernels.Tensor
	qProj                  kernels.Tensor // without q compression
	qA, qABias, qANorm, qB kernels.Tensor // with q compression
	// qAKVA is q_a_proj and kv_a_proj_with_mqa fused, [q_lora_rank +
	// kv_lora_rank + rope, hidden], with q compression and neither with a
	// bias: one product for both at one row, whose two column blocks are
	// then contiguous views (qA and kvA are its row views, for more rows).
	// nil otherwise.
	qAKVA kernels.Tensor
	// kvA is kv_a_proj_with_mqa whole, [kv_lora_rank + rope, hidden] (a
	// row view of qKVA or qAKVA where those fuse it): one product, whose
	// row kernels.PrepareMLA splits (MLAPrep.KVA).
	kvA, kvABias kernels.Tensor
	kvANorm      kernels.Tensor
	kvB          kernels.Tensor // [heads*(nope+v), kv_lora_rank]
	o, oBias     kernels.Tensor
}

type moeWeights struct {
	router       kernels.Tensor // [experts, hidden]
	bias         kernels.Tensor // e_score_correction_bias or nil
	gateUp, down kernels.Tensor // [experts, 2*inter, hidden], [experts, hidden, inter]
	shared       *mlp
}

func routeParams(cfg *weights.Config, v3 bool) (kernels.RouteParams, error) {
	p := kernels.RouteParams{TopK: cfg.NumExpertsPerTok, NumGroups: cfg.NGroup, TopKGroups: cfg.TopKGroup,
		ScalingFactor: float32(cfg.RoutedScalingFactor),
		// The reference DeepSeek V2 never renormalizes the top-k weights.
		NormTopKProb: v3 && cfg.NormTopKProb}
	switch cfg.ScoringFunc {
	case "softmax":
		p.Scoring = kernels.ScoringSoftmax
	case "sigmoid":
		p.Scoring = kernels.ScoringSigmoid
	default:
		return p, fmt.Errorf("models: scoring_func %q, want softmax or sigmoid: %w", cfg.ScoringFunc, ErrConfig)
	}
	switch cfg.TopKMethod {
	case "greedy":
		p.Method = kernels.TopKGreedy
	case "group_limited_greedy":
		p.Method = kernels.TopKGroupLimited
	case "noaux_tc":
		p.Method = kernels.TopKNoAuxTC
	default:
		return p, fmt.Errorf("models: topk_method %q, want greedy, group_limited_greedy or noaux_tc: %w", cfg.TopKMethod, ErrConfig)
	}
	if p.TopK <= 0 || p.TopK > cfg.NRoutedExperts {
		return p, fmt.Errorf("models: num_experts_per_tok %d with %d experts: %w", p.TopK, cfg.NRoutedExperts, ErrConfig)
	}
	return p, nil
}

func newDeepseek(arch string, ops kernels.Ops, cfg *weights.Config, src Weights, opts Options) (Model, error) {
	v3 := arch == "DeepseekV3ForCausalLM"
	m := &deepseek{base: base{arch: arch, cfg: cfg, ops: ops, spare: newSpareScratch(ops)}, v3: v3, qLoraRank: cfg.QLoraRank, fusedRows: mlaFusedRows,
		interleave: cfg.RopeInterleave || !v3, // V2 always rotates interleaved pairs
		dims: kernels.MLAParams{NumHeads: cfg.NumAttentionHeads, NopeDim: cfg.QKNopeHeadDim, RopeDim: cfg.QKRopeHeadDim,
			KVLoraRank: cfg.KVLoraRank, VHeadDim: cfg.VHeadDim}}
	if cfg.HiddenAct != "silu" {
		return nil, fmt.Errorf("models: %s: hidden_act %q, only silu: %w", arch, cfg.HiddenAct, ErrConfig)
	}
	d := m.dims
	if d.NumHeads <= 0 || d.NopeDim <= 0 || d.RopeDim <= 0 || d.KVLoraRank <= 0 || d.VHeadDim <= 0 {
		return nil, fmt.Errorf("models: %s: MLA dims %+v: %w", arch, d, ErrConfig)
	}
	// Softmax scale: qk_head_dim^-0.5, times yarn's mscale(factor, mscale_all_dim)^2.
	scale := 1 / math.Sqrt(float64(d.NopeDim+d.RopeDim))
	if r := cfg.Rope; r.Type != "default" && r.MscaleAllDim != 0 {
		ms := yarnMscale(r.Factor, r.MscaleAllDim)
		scale *= ms * ms
	}
	m.dims.Scale = float32(scale)
	if cfg.NRoutedExperts > 0 {
		var err error
		if m.route, err = routeParams(cfg, v3); err != nil {
			return nil, fmt.Errorf("models: %s: %w", arch, err)
		}
	}
	rotary := int(float64(d.RopeDim) * cfg.Rope.PartialRotaryFactor)
	if rotary != d.RopeDim {
		return nil, fmt.Errorf("models: %s: partial rotary over %d of %d rope dims: %w", arch, rotary, d.RopeDim, ErrConfig)
	}
	l := newLoader(ops, cfg, src, opts)
	if err := m.loadCommon(l, opts, rotary); err != nil {
		return nil, err
	}
	for i := range cfg.NumHiddenLayers {
		m.layers = append(m.layers, m.loadLayer(l, i))
	}
	if v3 && cfg.NumNextNPredictLayers > 0 {
		// transformers saves no MTP layers (its modeling ignores them): a
		// checkpoint it wrote announces them in config.json and holds none.
		// It serves without MTP; one that holds some must hold them whole.
		if first := fmt.Sprintf("model.layers.%d.enorm.weight", cfg.NumHiddenLayers); l.src.Has(first) {
			m.mtp = m.loadMTP(l)
		} else {
			logger := opts.Logger
			if logger == nil {
				logger = slog.Default()
			}
			logger.Warn("the checkpoint holds no MTP layers: serving without them",
				"architecture", arch, "num_nextn_predict_layers", cfg.NumNextNPredictLayers, "missing", first)
		}
	}
	if l.err != nil {
		return nil, fmt.Errorf("models: %s: %w", arch, l.err)
	}
	m.format = l.weightFormat()
	return m, nil
}

func (m *deepseek) loadLayer(l *loader, i int) dsLayer {
	cfg, d, h := m.cfg, m.dims, m.cfg.HiddenSize
	p := fmt.Sprintf("model.layers.%d.", i)
	a := p + "self_attn."
	qd := d.NumHeads * (d.NopeDim + d.RopeDim)
	ly := dsLayer{
		inputNorm: l.vector(p+"input_layernorm.weight", h),
		postNorm:  l.vector(p+"post_attention_layernorm.weight", h),
	}
	w := &ly.attn
	if m.qLoraRank > 0 {
		if !l.src.Has(a+"q_a_proj.bias") && !l.src.Has(a+"kv_a_proj_with_mqa.bias") {
			w.qAKVA = l.fused(h, []string{a + "q_a_proj.weight", a + "kv_a_proj_with_mqa.weight"}, []int{m.qLoraRank, d.KVLoraRank + d.RopeDim})
			w.qA, w.kvA = m.splitRows(l, w.qAKVA, m.qLoraRank)
		} else {
			w.qA = l.linear(a+"q_a_proj.weight", m.qLoraRank, h)
			w.qABias = l.optVector(a+"q_a_proj.bias", m.qLoraRank)
		}
		w.qANorm = l.vector(a+"q_a_layernorm.weight", m.qLoraRank)
		w.qB = l.linear(a+"q_b_proj.weight", qd, m.qLoraRank)
	} else if !l.src.Has(a + "kv_a_proj_with_mqa.bias") {
		w.qKVA = l.fused(h, []string{a + "q_proj.weight", a + "kv_a_proj_with_mqa.weight"}, []int{qd, d.KVLoraRank + d.RopeDim})
		w.qProj, w.kvA = m.splitRows(l, w.qKVA, qd)
	} else {
		w.qProj = l.linear(a+"q_proj.weight", qd, h)
	}
	if w.qKVA == nil && w.qAKVA == nil {
		w.kvA = l.linear(a+"kv_a_proj_with_mqa.weight", d.KVLoraRank+d.RopeDim, h)
		w.kvABias = l.optVector(a+"kv_a_proj_with_mqa.bias", d.KVLoraRank+d.RopeDim)
	}
	w.kvANorm = l.vector(a+"kv_a_layernorm.weight", d.KVLoraRank)
	w.kvB = l.linear(a+"kv_b_proj.weight", d.NumHeads*(d.NopeDim+d.VHeadDim), d.KVLoraRank)
	w.o = l.linear(a+"o_proj.weight", h, d.NumHeads*d.VHeadDim)
	w.oBias = l.optVector(a+"o_proj.bias", h)
	if !cfg.IsMoELayer(i) {
		dense := loadMLP(l, p+"mlp.", h, cfg.IntermediateSize)
		ly.dense = &dense
		return ly
	}
	e, inter := cfg.NRoutedExperts, cfg.MoEIntermediateSize
	mw := &moeWeights{
		router: l.matrix(p+"mlp.gate.weight", e, h),
		bias:   l.optVector(p+"mlp.gate.e_score_correction_bias", e),
	}
	mw.gateUp, mw.down = m.loadExperts(l, p+"mlp.experts.", e, h, inter)
	if cfg.NSharedExperts > 0 {
		sh := loadMLP(l, p+"mlp.shared_experts.", h, inter*cfg.NSharedExperts)
		mw.shared = &sh
	}
	ly.moe = mw
	return ly
}

// splitRows returns views of rows [0, n) and [n, end) of t (nil stays nil).
func (m *deepseek) splitRows(l *loader, t kernels.Tensor, n int) (kernels.Tensor, kernels.Tensor) {
	if t == nil || l.err != nil {
		return nil, nil
	}
	a, err := m.ops.Rows(t, 0, n)
	if err != nil {
		l.fail(err)
		return nil, nil
	}
	b, err := m.ops.Rows(t, n, t.Shape()[0])
	if err != nil {
		l.fail(err)
		return nil, nil
	}
	return a, b
}

// loadExperts reads the routed experts, either stored fused as transformers 5
// keeps them (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]) or
// one module per expert (experts.<e>.{gate,up,down}_proj.weight), into the
// fused layout the MoE kernel takes.
func (m *deepseek) loadExperts(l *loader, prefix string, e, h, inter int) (kernels.Tensor, kernels.Tensor) {
	if l.src.Has(prefix + "gate_up_proj") {
		return l.linear(prefix+"gate_up_proj", e, 2*inter, h), l.linear(prefix+"down_proj", e, h, inter)
	}
	return loadExpertParts(l, prefix, e, h, inter, "gate_proj", "up_proj", "down_proj")
}

// KVCacheSpec: the latent cache is in the activations' type, or where the
// backend narrows latent caches (kernels.MLACacher) in the type and row
// width it picks for the weights' type (16-bit, or 8-bit rows under
// cache.kv_cache_dtype fp8).
func (m *deepseek) KVCacheSpec() KVCacheSpec {
	dt, width := m.ops.ActivationDType(), m.dims.KVLoraRank+m.dims.RopeDim
	if mc, ok := m.ops.(kernels.MLACacher); ok && len(m.layers) > 0 {
		dt, width = mc.MLACacheLayout(computeDType(m.layers[0].attn.o.DType()), m.dims)
	}
	return KVCacheSpec{Layout: KVLayoutMLA, NumLayers: len(m.layers), Width: width, DType: dt}
}

func (m *deepseek) NewKVCache(numBlocks, blockSize int) (*KVCache, error) {
	return NewKVCache(m.ops, m.KVCacheSpec(), numBlocks, blockSize)
}

func (m *deepseek) MTP() *MTP { return m.mtp }

// Forward runs the decoder stack; see Model.
func (m *deepseek) Forward(ctx context.Context, cache *KVCache, b *ForwardBatch) (kernels.Tensor, error) {
	if err := cache.check(m.KVCacheSpec()); err != nil {
		return nil, err
	}
	ops, t, h := m.ops, b.NumTokens, m.cfg.HiddenSize
	s := m.spare.take(ops, t)
	defer m.spare.put(s)
	resid, delta := s.get("resid", t, h), s.get("delta", t, h)
	if s.err != nil {
		return nil, s.err
	}
	if err := ops.Embedding(resid, m.embed, b.InputIDs); err != nil {
		return nil, fmt.Errorf("models: %s: %w", m.arch, err)
	}
	for i := range m.layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := m.layer(&m.layers[i], i == 0, cache.K[i], s, b, resid, delta); err != nil {
			return nil, fmt.Errorf("models: %s: layer %d: %w", m.arch, i, err)
		}
	}
	out, err := kernels.AllocEmpty(ops, ops.ActivationDType(), t, h) // Add writes every element
	if err != nil {
		return nil, err
	}
	if err := ops.Add(out, resid, delta); err != nil {
		return nil, fmt.Errorf("models: %s: %w", m.arch, err)
	}
	return out, nil
}

// layer runs one decoder layer over its latent cache; see llama.layer for the
// resid/delta protocol (first: delta holds nothing to add yet).
func (m *deepseek) layer(ly *dsLayer, first bool, cache kernels.Tensor, s *scratch, b *ForwardBatch, resid, delta kernels.Tensor) error {
	ops, t, d, w := m.ops, b.NumTokens, m.dims, &ly.attn
	// The attention's input norm writes xa, read only by the q and kv_a
	// projections: rounded by the norm where those would round it.
	fused := w.qKVA != nil && t <= m.fusedRows
	var xw []kernels.Tensor
	switch {
	case fused:
		xw = []kernels.Tensor{w.qKVA}
	case w.qProj != nil:
		xw = []kernels.Tensor{w.qProj, w.kvA}
	default:
		xw = []kernels.Tensor{w.qA, w.kvA}
	}
	xa := s.getTyped("x_attn", s.linearInputDType(t, xw...), t, m.cfg.HiddenSize)
	// The MLP's input norm writes x, read only by the MLP's (or MoE's)
	// input projections: rounded by the norm where those would round it.
	var mw []kernels.Tensor
	if ly.dense != nil {
		mw = []kernels.Tensor{ly.dense.gateUp}
	}
	x := s.getTyped("x", s.inputDType(t, ly.moe, mw...), t, m.cfg.HiddenSize)
	q := s.get("q", t, d.NumHeads*(d.NopeDim+d.RopeDim))
	ckv, kpe := s.get("c_kv", t, d.KVLoraRank), s.get("k_pe", t, d.RopeDim)
	attn := s.get("attn", t, d.NumHeads*d.VHeadDim)
	if s.err != nil {
		return s.err
	}
	// What follows the projections (QKVA set where they are fused).
	prep := kernels.MLAPrep{Q: q, Cache: cache, SlotMapping: b.Attn.SlotMapping, Positions: b.Positions,
		Cos: m.rope.cos, Sin: m.rope.sin, KVNorm: w.kvANorm, Eps: m.eps, MLA: d, Interleaved: m.interleave,
		CKV: ckv, KPE: kpe}
	var err error
	if first {
		err = ops.RMSNorm(xa, resid, ly.inputNorm, m.eps)
	} else {
		err = ops.AddRMSNorm(xa, resid, delta, ly.inputNorm, m.eps)
	}
	if err != nil {
		return err
	}
	switch {
	case fused:
		qkv := s.get("q_kv_a", t, w.qKVA.Shape()[0])
		if s.err != nil {
			return s.err
		}
		if err := ops.Linear(qkv, xa, w.qKVA, nil); err != nil {
			return err
		}
		// Split, norm, ropes and cache write: one operation where the
		// backend fuses them (kernels.MLAPreparer).
		prep.QKVA = qkv
		if err := kernels.PrepareMLA(ops, prep); err != nil {
			return err
		}
	case w.qProj != nil:
		if err := ops.Linear(q, xa, w.qProj, nil); err != nil {
			return err
		}
	default:
		var qa kernels.Tensor
		if w.qAKVA != nil && t == 1 {
			// One product for q_a and kv_a; at one row each column block
			// is a contiguous view.
			var err error
			if qa, prep.KVA, err = m.qAKVAOneRow(s, xa, w.qAKVA); err != nil {
				return err
			}
		} else {
			qa = s.get("q_a", t, m.qLoraRank)
			if s.err != nil {
				return s.err
			}
			if err := ops.Linear(qa, xa, w.qA, w.qABias); err != nil {
				return err
			}
		}
		if err := ops.RMSNorm(qa, qa, w.qANorm, m.eps); err != nil {
			return err
		}
		if err := ops.Linear(q, qa, w.qB, nil); err != nil {
			return err
		}
	}
	if !fused {
		// kv_a in one product (or q_a's, above); the split, norm, ropes
		// (q's in place) and cache write one operation where the backend
		// fuses them.
		if prep.KVA == nil {
			kva := s.get("kv_a", t, d.KVLoraRank+d.RopeDim)
			if s.err != nil {
				return s.err
			}
			if err := ops.Linear(kva, xa, w.kvA, w.kvABias); err != nil {
				return err
			}
			prep.KVA = kva
		}
		if err := kernels.PrepareMLA(ops, prep); err != nil {
			return err
		}
	}
	if err := ops.MLAAttention(attn, q, cache, w.kvB, &b.Attn, d); err != nil {
		return err
	}
	if err := ops.Linear(delta, attn, w.o, w.oBias); err != nil {
		return err
	}
	if err := ops.AddRMSNorm(x, resid, delta, ly.postNorm, m.eps); err != nil {
		return err
	}
	if ly.dense != nil {
		return ly.dense.forward(ops, s, delta, x)
	}
	return m.moeForward(ly.moe, s, delta, x)
}

// qAKVAOneRow runs the fused q_a / kv_a product of one row (x [1,
// hidden]) and returns its two column blocks as contiguous views: q_a [1,
// q_lora_rank] and kv_a [1, kv_lora_rank + rope]. The linears' columns are
// computed alike in any product, so the bits are those of the two
// products apart.
func (m *deepseek) qAKVAOneRow(s *scratch, x, w kernels.Tensor) (qa, kva kernels.Tensor, err error) {
	n := w.Shape()[0]
	out := s.get("q_a_kv_a", 1, n)
	if s.err != nil {
		return nil, nil, s.err
	}
	if err := m.ops.Linear(out, x, w, nil); err != nil {
		return nil, nil, err
	}
	view := func(lo, hi int) (kernels.Tensor, error) {
		flat, err := m.ops.Reshape(out, n)
		if err != nil {
			return nil, err
		}
		part, err := m.ops.Rows(flat, lo, hi)
		if err != nil {
			return nil, err
		}
		return m.ops.Reshape(part, 1, hi-lo)
	}
	if qa, err = view(0, m.qLoraRank); err != nil {
		return nil, nil, err
	}
	kva, err = view(m.qLoraRank, n)
	return qa, kva, err
}

// moeForward writes routed experts plus shared experts of x into out.
func (m *deepseek) moeForward(w *moeWeights, s *scratch, out, x kernels.Tensor) error {
	return moeForward(m.ops, w, m.route, m.cfg.NRoutedExperts, s, out, x)
}
