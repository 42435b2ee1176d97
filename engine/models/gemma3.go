package models

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// gemma3 is Gemma3ForCausalLM, the text model of Gemma 3: local
// (sliding-window) and global layers with their own RoPE bases, q/k
// RMSNorm, a GeGLU MLP with the tanh GELU, the embedding scaled by
// sqrt(hidden_size), four norms a layer (before and after attention and
// MLP), every RMSNorm scaling by (1 + weight), attention scaled by
// query_pre_attn_scalar^-0.5 and an optional final logit soft cap.
//
// The sliding-window layers keep their keys and values in per-sequence
// ring buffers of sliding_window tokens (KVCacheSpec.RingLayers, one per
// state slot) unless Options.SlidingWindowPaged puts them in paged blocks
// with the global layers'.
type gemma3 struct {
	base
	localRope                     *ropeTables
	numHeads, numKVHeads, headDim int
	layers                        []gemma3Layer
	embedScale                    float32
	attnScale                     float32
	finalSoftcap                  float32 // 0: none
	windowLayers
	gemmaOps kernels.GemmaOpser
}

type gemma3Layer struct {
	inputNorm, postAttnNorm, preFFNorm, postFFNorm kernels.Tensor // (1 + weight)
	qkv, o                                         kernels.Tensor
	qNorm, kNorm                                   kernels.Tensor // (1 + weight)
	gateUp, down                                   kernels.Tensor
	inter                                          int
	sliding                                        bool
	cacheIdx                                       int // index into KVCache.K/V, or RingK/RingV for a ring layer
}

// rawValue returns config key's value, and whether it is present and not null.
func rawValue(cfg *weights.Config, key string) (any, bool) {
	v, ok := cfg.Raw[key]
	return v, ok && v != nil
}

// rawFloat returns config key as a number, def when absent or null.
func rawFloat(cfg *weights.Config, key string, def float64) (float64, error) {
	v, ok := rawValue(cfg, key)
	if !ok {
		return def, nil
	}
	n, isNum := v.(json.Number)
	if !isNum {
		return 0, fmt.Errorf("models: config %s = %v, want a number: %w", key, v, ErrConfig)
	}
	f, err := n.Float64()
	if err != nil {
		return 0, fmt.Errorf("models: config %s = %v: %w", key, v, ErrConfig)
	}
	return f, nil
}

// gemma3LayerSliding is whether layer i of cfg uses the sliding window:
// layer_types when the config lists them, else transformers'
// sliding_window_pattern rule (every pattern-th layer is global).
func gemma3LayerSliding(cfg *weights.Config, i int) (bool, error) {
	if len(cfg.LayerTypes) > 0 {
		if len(cfg.LayerTypes) != cfg.NumHiddenLayers {
			return false, fmt.Errorf("models: gemma3: %d layer_types for %d layers: %w", len(cfg.LayerTypes), cfg.NumHiddenLayers, ErrConfig)
		}
		switch cfg.LayerTypes[i] {
		case "sliding_attention":
			return true, nil
		case "full_attention":
			return false, nil
		}
		return false, fmt.Errorf("models: gemma3: layer_types[%d] = %q: %w", i, cfg.LayerTypes[i], ErrConfig)
	}
	pattern, err := rawFloat(cfg, "sliding_window_pattern", 6)
	if err != nil {
		return false, err
	}
	if pattern < 1 {
		return false, fmt.Errorf("models: gemma3: sliding_window_pattern %g: %w", pattern, ErrConfig)
	}
	return (i+1)%int(pattern) != 0, nil
}

// gemma3Ropes returns the RoPE settings of the global and the local
// layers: transformers 5's rope_parameters per layer type when the config
// has them, else rope_theta/rope_scaling for the global layers and
// rope_local_base_freq (unscaled) for the local ones.
func gemma3Ropes(cfg *weights.Config) (global, local weights.Rope, err error) {
	global = cfg.Rope
	localBase, err := rawFloat(cfg, "rope_local_base_freq", 10000)
	if err != nil {
		return global, local, err
	}
	local = weights.Rope{Type: "default", Theta: localBase, Factor: 1, BetaFast: 32, BetaSlow: 1, Truncate: true, PartialRotaryFactor: 1}
	params, ok := cfg.Raw["rope_parameters"].(map[string]any)
	if !ok {
		return global, local, nil
	}
	parse := func(key string, dst *weights.Rope) error {
		sub, ok := params[key]
		if !ok {
			return nil
		}
		data, err := json.Marshal(map[string]any{"rope_parameters": sub})
		if err != nil {
			return fmt.Errorf("models: gemma3: rope_parameters.%s: %v: %w", key, err, ErrConfig)
		}
		c, err := weights.ParseConfig(data)
		if err != nil {
			return fmt.Errorf("models: gemma3: rope_parameters.%s: %w", key, err)
		}
		*dst = c.Rope
		return nil
	}
	if err := parse("full_attention", &global); err != nil {
		return global, local, err
	}
	err = parse("sliding_attention", &local)
	return global, local, err
}

// plusOne returns a new vector holding 1 + t: Gemma's RMSNorm scales by
// (1 + weight), computed in float32 as transformers does.
func plusOne(ops kernels.Ops, t kernels.Tensor) (kernels.Tensor, error) {
	v, err := kernels.ToF32(ops, t)
	if err != nil {
		return nil, err
	}
	for i := range v {
		v[i] = 1 + v[i]
	}
	return kernels.FromF32(ops, v, len(v))
}

// roundTo rounds x to dtype dt's precision (transformers casts the
// embedding scale to the embedding's dtype).
func roundTo(x float32, dt kernels.DType) float32 {
	switch dt {
	case kernels.BF16:
		return kernels.BF16ToF32(kernels.F32ToBF16(x))
	case kernels.F16:
		return kernels.F16ToF32(kernels.F32ToF16(x))
	}
	return x
}

func newGemma3(arch string, ops kernels.Ops, cfg *weights.Config, src Weights, opts Options) (Model, error) {
	gops, ok := ops.(kernels.GemmaOpser)
	if !ok {
		return nil, fmt.Errorf("models: %s: backend %s lacks the Gemma kernels (GELU-tanh, scale, soft cap: kernels.GemmaOpser): %w", arch, ops.Name(), ErrConfig)
	}
	c := *cfg
	if _, ok := cfg.Raw["tie_word_embeddings"]; !ok {
		c.TieWordEmbeddings = true // Gemma3TextConfig's default
	}
	if _, ok := cfg.Raw["head_dim"]; !ok {
		c.HeadDim = 256
	}
	if _, ok := cfg.Raw["sliding_window"]; !ok {
		c.SlidingWindow = 4096
	}
	cfg = &c
	act := "gelu_pytorch_tanh"
	if v, ok := rawValue(cfg, "hidden_activation"); ok {
		act, _ = v.(string)
	} else if v, ok := rawValue(cfg, "hidden_act"); ok {
		act, _ = v.(string)
	}
	if act != "gelu_pytorch_tanh" {
		return nil, fmt.Errorf("models: %s: hidden_activation %q, only gelu_pytorch_tanh: %w", arch, act, ErrConfig)
	}
	if _, ok := rawValue(cfg, "attn_logit_softcapping"); ok {
		return nil, fmt.Errorf("models: %s: attn_logit_softcapping is not supported: %w", arch, ErrConfig)
	}
	if v, ok := rawValue(cfg, "use_bidirectional_attention"); ok && v == true {
		return nil, fmt.Errorf("models: %s: use_bidirectional_attention is not supported: %w", arch, ErrConfig)
	}
	qpas, err := rawFloat(cfg, "query_pre_attn_scalar", 256)
	if err != nil {
		return nil, err
	}
	softcap, err := rawFloat(cfg, "final_logit_softcapping", 0)
	if err != nil {
		return nil, err
	}
	if qpas <= 0 || softcap < 0 {
		return nil, fmt.Errorf("models: %s: query_pre_attn_scalar %g, final_logit_softcapping %g: %w", arch, qpas, softcap, ErrConfig)
	}
	globalRope, localRope, err := gemma3Ropes(cfg)
	if err != nil {
		return nil, err
	}
	cfg.Rope = globalRope
	m := &gemma3{base: base{arch: arch, cfg: cfg, ops: ops, spare: newSpareScratch(ops)}, gemmaOps: gops,
		numHeads: cfg.NumAttentionHeads, numKVHeads: cfg.NumKeyValueHeads, headDim: cfg.HeadDim,
		attnScale: float32(math.Pow(qpas, -0.5)), finalSoftcap: float32(softcap), windowLayers: windowLayers{window: cfg.SlidingWindow}}
	l := newLoader(ops, cfg, src, opts)
	if err := m.loadCommon(l, opts, cfg.HeadDim); err != nil {
		return nil, err
	}
	maxPos := opts.MaxModelLen
	if maxPos <= 0 {
		maxPos = cfg.MaxPositionEmbeddings
	}
	if m.localRope, err = newRopeTables(ops, localRope, cfg.HeadDim, cfg.MaxPositionEmbeddings, maxPos); err != nil {
		return nil, err
	}
	m.embedScale = roundTo(float32(math.Sqrt(float64(cfg.HiddenSize))), m.embed.DType())
	h, qd, kvd := cfg.HiddenSize, m.numHeads*m.headDim, m.numKVHeads*m.headDim
	for i := range cfg.NumHiddenLayers {
		sliding, err := gemma3LayerSliding(cfg, i)
		if err != nil {
			return nil, err
		}
		p := fmt.Sprintf("model.layers.%d.", i)
		a := p + "self_attn."
		ly := gemma3Layer{
			inputNorm:    l.vector(p+"input_layernorm.weight", h),
			postAttnNorm: l.vector(p+"post_attention_layernorm.weight", h),
			preFFNorm:    l.vector(p+"pre_feedforward_layernorm.weight", h),
			postFFNorm:   l.vector(p+"post_feedforward_layernorm.weight", h),
			qkv: l.fused(h, []string{a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
				[]int{qd, kvd, kvd}),
			o:       l.linear(a+"o_proj.weight", h, qd),
			qNorm:   l.vector(a+"q_norm.weight", m.headDim),
			kNorm:   l.vector(a+"k_norm.weight", m.headDim),
			gateUp:  l.fused(h, []string{p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, []int{cfg.IntermediateSize, cfg.IntermediateSize}),
			down:    l.linear(p+"mlp.down_proj.weight", h, cfg.IntermediateSize),
			inter:   cfg.IntermediateSize,
			sliding: sliding,
		}
		if l.err != nil {
			break
		}
		for _, w := range []*kernels.Tensor{&ly.inputNorm, &ly.postAttnNorm, &ly.preFFNorm, &ly.postFFNorm, &ly.qNorm, &ly.kNorm} {
			if *w, err = plusOne(ops, *w); err != nil {
				return nil, fmt.Errorf("models: %s: %w", arch, err)
			}
		}
		m.layers = append(m.layers, ly)
	}
	if l.err != nil {
		return nil, fmt.Errorf("models: %s: %w", arch, l.err)
	}
	if m.finalNorm, err = plusOne(ops, m.finalNorm); err != nil {
		return nil, fmt.Errorf("models: %s: %w", arch, err)
	}
	sliding := make([]bool, len(m.layers))
	for i := range m.layers {
		sliding[i] = m.layers[i].sliding
	}
	idx, err := m.place(ops, arch, sliding, opts.SlidingWindowPaged)
	if err != nil {
		return nil, err
	}
	for i := range m.layers {
		m.layers[i].cacheIdx = idx[i]
	}
	m.format = l.weightFormat()
	return m, nil
}

func (m *gemma3) MTP() *MTP { return nil }

func (m *gemma3) KVCacheSpec() KVCacheSpec {
	var o kernels.Tensor
	if len(m.layers) > 0 {
		o = m.layers[0].o
	}
	return m.kvCacheSpec(m.ops, m.numKVHeads*m.headDim, o)
}

func (m *gemma3) NewKVCache(numBlocks, blockSize int) (*KVCache, error) {
	return NewKVCache(m.ops, m.KVCacheSpec(), numBlocks, blockSize)
}

// ComputeLogits applies the final norm, the LM head and the soft cap.
func (m *gemma3) ComputeLogits(hidden, rows kernels.Tensor) (kernels.Tensor, error) {
	out, err := logits(m.ops, hidden, rows, m.finalNorm, m.lmHead, m.eps)
	if err != nil || m.finalSoftcap == 0 {
		return out, err
	}
	if err := m.gemmaOps.Softcap(out, m.finalSoftcap); err != nil {
		return nil, fmt.Errorf("models: %s: %w", m.arch, err)
	}
	return out, nil
}

// Forward runs the decoder stack; see Model.
func (m *gemma3) Forward(ctx context.Context, cache *KVCache, b *ForwardBatch) (kernels.Tensor, error) {
	if err := cache.check(m.KVCacheSpec()); err != nil {
		return nil, err
	}
	if err := m.checkBatch(m.arch, b); err != nil {
		return nil, err
	}
	return runDecoder(ctx, m.ops, m.arch, cache, b, m.cfg.HiddenSize, len(m.layers), m.embed,
		func(resid kernels.Tensor) error { return m.gemmaOps.Scale(resid, resid, m.embedScale) }, m.layer, m.spare)
}

// layer runs decoder layer i; resid and delta as in llama.layer (delta
// holds the previous layer's MLP output, already post-normalized).
func (m *gemma3) layer(i int, s *scratch, cache *KVCache, b *ForwardBatch, resid, delta kernels.Tensor) error {
	ops, ly, t := m.ops, &m.layers[i], b.NumTokens
	qd, kvd := m.numHeads*m.headDim, m.numKVHeads*m.headDim
	x := s.get("x", t, m.cfg.HiddenSize)
	qkv := s.get("qkv", t, qd+2*kvd)
	q, k, v := s.get("q", t, qd), s.get("k", t, kvd), s.get("v", t, kvd)
	attn := s.get("attn", t, qd)
	gu, act := s.get("mlp.gate_up", t, 2*ly.inter), s.get("mlp.act", t, ly.inter)
	if s.err != nil {
		return s.err
	}
	var err error
	if i == 0 {
		err = ops.RMSNorm(x, resid, ly.inputNorm, m.eps)
	} else {
		err = ops.AddRMSNorm(x, resid, delta, ly.inputNorm, m.eps)
	}
	if err != nil {
		return err
	}
	if err := ops.Linear(qkv, x, ly.qkv, nil); err != nil {
		return err
	}
	rope := m.rope
	ap := kernels.AttentionParams{NumHeads: m.numHeads, NumKVHeads: m.numKVHeads, HeadDim: m.headDim,
		Scale: m.attnScale, InputDType: computeDType(ly.o.DType())}
	if ly.sliding {
		rope, ap.SlidingWindow = m.localRope, m.window
	}
	a := kernels.QKV{QKV: qkv, Q: q, K: k, V: v, SlotMapping: b.Attn.SlotMapping, Positions: b.Positions,
		Cos: rope.cos, Sin: rope.sin, QNorm: ly.qNorm, KNorm: ly.kNorm, Eps: m.eps,
		NumHeads: m.numHeads, NumKVHeads: m.numKVHeads, HeadDim: m.headDim,
		RoPE: kernels.RoPEParams{RotaryDim: rope.rotaryDim}}
	if err := attendLayer(ops, cache, b, a, attn, ap, ly.cacheIdx, ly.sliding && m.rings); err != nil {
		return err
	}
	if err := ops.Linear(delta, attn, ly.o, nil); err != nil {
		return err
	}
	if err := ops.RMSNorm(delta, delta, ly.postAttnNorm, m.eps); err != nil {
		return err
	}
	if err := ops.AddRMSNorm(x, resid, delta, ly.preFFNorm, m.eps); err != nil {
		return err
	}
	if err := ops.Linear(gu, x, ly.gateUp, nil); err != nil {
		return err
	}
	if err := m.gemmaOps.GELUTanhMul(act, gu); err != nil {
		return err
	}
	if err := ops.Linear(delta, act, ly.down, nil); err != nil {
		return err
	}
	return ops.RMSNorm(delta, delta, ly.postFFNorm, m.eps)
}

// attendLayer runs one layer's attention into attn: over the paged cache (q,
// k, v prepared and the keys written by kernels.PrepareQKV), or, for a
// sliding-window layer kept in a ring (ring), over the ring and the step's
// own keys, which go into the ring only after attention has read the
// window before them.
func attendLayer(ops kernels.Ops, cache *KVCache, b *ForwardBatch, a kernels.QKV, attn kernels.Tensor, ap kernels.AttentionParams, idx int, ring bool) error {
	if !ring {
		a.KCache, a.VCache = cache.K[idx], cache.V[idx]
		if err := kernels.PrepareQKV(ops, a); err != nil {
			return err
		}
		return ops.Attention(attn, a.Q, a.KCache, a.VCache, &b.Attn, ap)
	}
	kr, vr := cache.RingK[idx], cache.RingV[idx]
	if err := prepareQK(ops, a); err != nil {
		return err
	}
	if err := ops.(kernels.RingAttentioner).RingAttention(attn, a.Q, a.K, a.V, kr, vr, b.StateSlots, &b.Attn, ap); err != nil {
		return err
	}
	if err := ops.WriteCache(kr, a.K, b.RingSlotMapping, 0); err != nil {
		return err
	}
	return ops.WriteCache(vr, a.V, b.RingSlotMapping, 0)
}

// prepareQK is PrepareQKV without the cache writes: a.Q, a.K and a.V split
// from a.QKV, q and k normalized per head (when a.QNorm is set) and
// rotated.
func prepareQK(ops kernels.Ops, a kernels.QKV) error {
	if err := ops.SplitColumns(a.QKV, a.Q, a.K, a.V); err != nil {
		return err
	}
	if a.QNorm == nil {
		return rotateQK(ops, a)
	}
	t := a.QKV.Shape()[0]
	qh, err := ops.Reshape(a.Q, t*a.NumHeads, a.HeadDim)
	if err != nil {
		return err
	}
	kh, err := ops.Reshape(a.K, t*a.NumKVHeads, a.HeadDim)
	if err != nil {
		return err
	}
	if err := ops.RMSNorm(qh, qh, a.QNorm, a.Eps); err != nil {
		return err
	}
	if err := ops.RMSNorm(kh, kh, a.KNorm, a.Eps); err != nil {
		return err
	}
	return rotateQK(ops, a)
}

// rotateQK applies RoPE to a.Q and a.K.
func rotateQK(ops kernels.Ops, a kernels.QKV) error {
	rp := a.RoPE
	rp.NumHeads, rp.HeadSize = a.NumHeads, a.HeadDim
	if err := ops.RoPE(a.Q, a.Positions, a.Cos, a.Sin, rp); err != nil {
		return err
	}
	rp.NumHeads = a.NumKVHeads
	return ops.RoPE(a.K, a.Positions, a.Cos, a.Sin, rp)
}
