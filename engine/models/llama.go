package models

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// base holds what every architecture shares: embeddings, final norm, LM head,
// RoPE tables.
type base struct {
	arch      string
	format    string // WeightFormat
	cfg       *weights.Config
	ops       kernels.Ops
	eps       float32
	embed     kernels.Tensor // [vocab, hidden], stored dtype
	finalNorm kernels.Tensor
	lmHead    kernels.Tensor // [vocab, hidden]; the embedding when tied
	rope      *ropeTables
	spare     *spareScratch // one pass's scratch kept for the next
}

func (m *base) Architecture() string { return m.arch }

// WeightFormat names the dtypes the weights are kept in, the most bytes
// first, e.g. "F8_E4M3+BF16".
func (m *base) WeightFormat() string    { return m.format }
func (m *base) Config() *weights.Config { return m.cfg }

func (m *base) loadCommon(l *loader, opts Options, rotaryDim int) error {
	c := m.cfg
	m.eps = float32(c.RMSNormEps)
	m.embed = l.matrix("model.embed_tokens.weight", c.VocabSize, c.HiddenSize)
	m.finalNorm = l.vector("model.norm.weight", c.HiddenSize)
	if c.TieWordEmbeddings {
		m.lmHead = m.embed
	} else {
		m.lmHead = l.matrix("lm_head.weight", c.VocabSize, c.HiddenSize)
	}
	if l.err != nil {
		return l.err
	}
	maxPos := opts.MaxModelLen
	if maxPos <= 0 {
		maxPos = c.MaxPositionEmbeddings
	}
	var err error
	m.rope, err = newRopeTables(m.ops, c.Rope, rotaryDim, c.MaxPositionEmbeddings, maxPos)
	return err
}

// ComputeLogits gathers rows of the hidden states, applies the final norm and
// the LM head.
func (m *base) ComputeLogits(hidden, rows kernels.Tensor) (kernels.Tensor, error) {
	return logits(m.ops, hidden, rows, m.finalNorm, m.lmHead, m.eps)
}

func logits(ops kernels.Ops, hidden, rows, norm, head kernels.Tensor, eps float32) (kernels.Tensor, error) {
	r := hidden.Shape()[0]
	if rows != nil {
		r = rows.Shape()[0]
	}
	out, err := kernels.AllocEmpty(ops, kernels.F32, r, head.Shape()[0]) // every element written
	if err != nil {
		return nil, err
	}
	if err := ops.Logits(out, hidden, rows, norm, head, eps); err != nil {
		return nil, fmt.Errorf("models: logits: %w", err)
	}
	return out, nil
}

// mlp is a SwiGLU MLP with gate and up fused: down(silu(x G^T) * (x U^T)).
type mlp struct {
	gateUp, gateUpBias kernels.Tensor // [2*inter, hidden]
	down, downBias     kernels.Tensor // [hidden, inter]
	inter              int
}

func loadMLP(l *loader, prefix string, hidden, inter int) mlp {
	return mlp{
		inter: inter,
		gateUp: l.fused(hidden, []string{prefix + "gate_proj.weight", prefix + "up_proj.weight"},
			[]int{inter, inter}),
		gateUpBias: l.fusedVector([]string{prefix + "gate_proj.bias", prefix + "up_proj.bias"}, []int{inter, inter}),
		down:       l.linear(prefix+"down_proj.weight", hidden, inter),
		downBias:   l.optVector(prefix+"down_proj.bias", hidden),
	}
}

// forward writes the MLP of x into out, using s for scratch.
func (p *mlp) forward(ops kernels.Ops, s *scratch, out, x kernels.Tensor) error {
	t := x.Shape()[0]
	gu, act := s.get("mlp.gate_up", t, 2*p.inter), s.get("mlp.act", t, p.inter)
	if s.err != nil {
		return s.err
	}
	if f, ok := ops.(kernels.GatedMLPer); ok && p.gateUpBias == nil && p.downBias == nil {
		return f.GatedMLP(out, x, p.gateUp, p.down, gu, act)
	}
	if err := ops.Linear(gu, x, p.gateUp, p.gateUpBias); err != nil {
		return err
	}
	if err := ops.SiLUMul(act, gu); err != nil {
		return err
	}
	return ops.Linear(out, act, p.down, p.downBias)
}

// scratch hands out the activation buffers of one forward pass by name: every
// layer reuses the same buffers.
type scratch struct {
	ops    kernels.Ops
	bufs   map[scratchKey]kernels.Tensor
	inputs map[[2]int]kernels.DType // LinearInputDType's answers by (weights' dtype, rows)
	err    error
	tokens int // the pass's tokens when a spareScratch may keep it, else 0
}

func newScratch(ops kernels.Ops) *scratch {
	return &scratch{ops: ops, bufs: map[scratchKey]kernels.Tensor{}, inputs: map[[2]int]kernels.DType{}}
}

// spareScratch keeps one forward pass's scratch for the next pass over as
// many tokens, on backends whose every allocation is zeroed (no
// kernels.EmptyAllocator): there a decode step would otherwise ask the Go
// heap for all of its activations afresh, and the fresh pages fault in as
// they are first written. Reuse keeps AllocEmpty's contract (every
// operation writes all of its output before anything reads it,
// TestScratchWrittenBeforeRead); nothing Forward returns is scratch.
// A pass that finds the spare taken (concurrent forwards) or kept for
// another token count gets a fresh one. A nil *spareScratch keeps nothing.
// Safe for concurrent use.
type spareScratch struct{ kept atomic.Pointer[scratch] }

// newSpareScratch returns a spareScratch for a model on ops, or nil where
// ops has an EmptyAllocator (CUDA: a caching allocator, buffers captured
// in graphs), whose passes each get a fresh scratch.
func newSpareScratch(ops kernels.Ops) *spareScratch {
	if _, ok := ops.(kernels.EmptyAllocator); ok {
		return nil
	}
	return &spareScratch{}
}

// take returns the kept scratch when it was kept for a pass of tokens
// tokens, else a fresh one.
func (c *spareScratch) take(ops kernels.Ops, tokens int) *scratch {
	if c == nil {
		return newScratch(ops)
	}
	if s := c.kept.Swap(nil); s != nil && s.tokens == tokens && s.err == nil {
		return s
	}
	s := newScratch(ops)
	s.tokens = tokens
	return s
}

// put keeps s for the next pass when take made it to be kept.
func (c *spareScratch) put(s *scratch) {
	if c != nil && s.tokens > 0 && s.err == nil {
		c.kept.Store(s)
	}
}

// scratchKey names a scratch buffer: a layer asks for each of its buffers
// by name every forward pass, so the lookup builds no string.
type scratchKey struct {
	name       string
	dt         kernels.DType
	rows, cols int
}

// linearInputDType is the dtype in which x may be handed to linears over
// weights ws at rows rows: the backend's (kernels.LinearInputer) when it is
// the same for every one of them, else the activation dtype. The backend is
// asked once a forward pass per weights' dtype, not once a layer.
func (s *scratch) linearInputDType(rows int, ws ...kernels.Tensor) kernels.DType {
	act := s.ops.ActivationDType()
	li, ok := s.ops.(kernels.LinearInputer)
	if !ok || len(ws) == 0 {
		return act
	}
	ask := func(w kernels.DType) kernels.DType {
		key := [2]int{int(w), rows}
		dt, ok := s.inputs[key]
		if !ok {
			dt = li.LinearInputDType(w, rows)
			s.inputs[key] = dt
		}
		return dt
	}
	dt := ask(ws[0].DType())
	for _, w := range ws[1:] {
		if ask(w.DType()) != dt {
			return act
		}
	}
	return dt
}

// inputDType is linearInputDType for an x read by the linears over ws and,
// with moe set, by that MoE layer (its router, shared experts and routed
// experts), whose backend MoE must then take x in the same type
// (kernels.MoEInputer), else the activation dtype.
func (s *scratch) inputDType(rows int, moe *moeWeights, ws ...kernels.Tensor) kernels.DType {
	if moe == nil {
		return s.linearInputDType(rows, ws...)
	}
	act := s.ops.ActivationDType()
	mi, ok := s.ops.(kernels.MoEInputer)
	if !ok {
		return act
	}
	dt := s.linearInputDType(rows, append(slices.Clone(ws), moe.inputs()...)...)
	if dt == act || mi.MoEInputDType(moe.gateUp.DType(), rows) != dt {
		return act
	}
	return dt
}

// get returns the buffer called name, shaped [rows, cols] in the activation
// dtype, allocating it on first use, without a zero fill where the backend
// allows (kernels.AllocEmpty): every operation writes all of its output
// before anything reads it (TestScratchWrittenBeforeRead). An allocation
// error is kept in s.err and the result is then nil.
func (s *scratch) get(name string, rows, cols int) kernels.Tensor {
	return s.getTyped(name, s.ops.ActivationDType(), rows, cols)
}

// getTyped is get for a buffer of dtype dt.
func (s *scratch) getTyped(name string, dt kernels.DType, rows, cols int) kernels.Tensor {
	key := scratchKey{name, dt, rows, cols}
	if t, ok := s.bufs[key]; ok {
		return t
	}
	t, err := kernels.AllocEmpty(s.ops, dt, rows, cols)
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return nil
	}
	s.bufs[key] = t
	return t
}

// llama implements the Llama family: Llama 2/3, Mistral, Qwen2 (q/k/v
// biases), Qwen3 (per-head q/k RMSNorm).
type llama struct {
	base
	numHeads, numKVHeads, headDim int
	layers                        []llamaLayer
	route                         kernels.RouteParams // sparse layers (Qwen3-MoE, Mixtral)
}

type llamaLayer struct {
	inputNorm, postNorm kernels.Tensor
	qkv, o              kernels.Tensor // q, k and v projections fused: [qd + 2*kvd, hidden]
	qkvBias, oBias      kernels.Tensor
	qNorm, kNorm        kernels.Tensor // Qwen3, else nil
	mlp                 mlp
	moe                 *moeWeights // sparse layers (Qwen3-MoE, Mixtral): replaces mlp
	slidingWindow       int
}

func newLlama(arch string, ops kernels.Ops, cfg *weights.Config, src Weights, opts Options) (Model, error) {
	m := &llama{base: base{arch: arch, cfg: cfg, ops: ops, spare: newSpareScratch(ops)},
		numHeads: cfg.NumAttentionHeads, numKVHeads: cfg.NumKeyValueHeads, headDim: cfg.HeadDim}
	if cfg.HiddenAct != "silu" {
		return nil, fmt.Errorf("models: %s: hidden_act %q, only silu: %w", arch, cfg.HiddenAct, ErrConfig)
	}
	l := newLoader(ops, cfg, src, opts)
	rotary := int(float64(cfg.HeadDim) * cfg.Rope.PartialRotaryFactor)
	if err := m.loadCommon(l, opts, rotary); err != nil {
		return nil, err
	}
	h, qd, kvd := cfg.HiddenSize, m.numHeads*m.headDim, m.numKVHeads*m.headDim
	qkNorm := cfg.ModelType == "qwen3" || cfg.ModelType == "qwen3_moe" || arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM"
	sparse := arch == "Qwen3MoeForCausalLM" || arch == "MixtralForCausalLM"
	if sparse {
		m.route = moeRoute(cfg)
		if err := m.route.Validate(cfg.NRoutedExperts); err != nil {
			return nil, fmt.Errorf("models: %s: %d experts, %d per token: %w", arch, cfg.NRoutedExperts, cfg.NumExpertsPerTok, ErrConfig)
		}
	}
	for i := range cfg.NumHiddenLayers {
		p := fmt.Sprintf("model.layers.%d.", i)
		a := p + "self_attn."
		ly := llamaLayer{
			inputNorm: l.vector(p+"input_layernorm.weight", h),
			postNorm:  l.vector(p+"post_attention_layernorm.weight", h),
			qkv: l.fused(h, []string{a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
				[]int{qd, kvd, kvd}),
			o: l.linear(a+"o_proj.weight", h, qd),
			qkvBias: l.fusedVector([]string{a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"},
				[]int{qd, kvd, kvd}),
			oBias: l.optVector(a+"o_proj.bias", h),
		}
		if sparse && cfg.IsMoELayer(i) {
			ly.moe = loadSparseMoE(l, p, cfg.NRoutedExperts, h, cfg.MoEIntermediateSize)
		} else {
			ly.mlp = loadMLP(l, p+"mlp.", h, cfg.IntermediateSize)
		}
		if cfg.AttentionBias && ly.qkvBias == nil && l.err == nil {
			l.matrix(a+"q_proj.bias", qd) // reports the missing bias
		}
		if qkNorm {
			ly.qNorm = l.vector(a+"q_norm.weight", m.headDim)
			ly.kNorm = l.vector(a+"k_norm.weight", m.headDim)
		}
		ly.slidingWindow = slidingWindow(cfg, i)
		m.layers = append(m.layers, ly)
	}
	if l.err != nil {
		return nil, fmt.Errorf("models: %s: %w", arch, l.err)
	}
	m.format = l.weightFormat()
	return m, nil
}

// computeDType is the type a backend may compute attention in for a model
// whose weights are of type w: BF16 for FP8 weights (their scales come from
// BF16 checkpoints), F32 for block-quantized ones (the backends that keep
// them compute in F32), w otherwise.
func computeDType(w kernels.DType) kernels.DType {
	switch w {
	case kernels.F8E4M3:
		return kernels.BF16
	case kernels.Quant:
		return kernels.F32
	}
	return w
}

// slidingWindow is the attention window of layer i (0: full attention):
// layer_types when the config lists them, else the Qwen2 rule (layers at or
// above max_window_layers) or every layer (Mistral).
func slidingWindow(cfg *weights.Config, i int) int {
	if cfg.SlidingWindow <= 0 {
		return 0
	}
	if i < len(cfg.LayerTypes) {
		if cfg.LayerTypes[i] == "sliding_attention" {
			return cfg.SlidingWindow
		}
		return 0
	}
	if cfg.UseSlidingWindow && i < cfg.MaxWindowLayers {
		return 0
	}
	return cfg.SlidingWindow
}

func (m *llama) KVCacheSpec() KVCacheSpec {
	dt := m.ops.ActivationDType()
	if k, ok := m.ops.(kernels.KVCacheDTyper); ok && len(m.layers) > 0 {
		dt = k.KVCacheDType(computeDType(m.layers[0].o.DType()))
	}
	return KVCacheSpec{Layout: KVLayoutGQA, NumLayers: len(m.layers), Width: m.numKVHeads * m.headDim, DType: dt}
}

func (m *llama) NewKVCache(numBlocks, blockSize int) (*KVCache, error) {
	return NewKVCache(m.ops, m.KVCacheSpec(), numBlocks, blockSize)
}

func (m *llama) MTP() *MTP { return nil }

// Forward runs the decoder stack; see Model.
func (m *llama) Forward(ctx context.Context, cache *KVCache, b *ForwardBatch) (kernels.Tensor, error) {
	if err := cache.check(m.KVCacheSpec()); err != nil {
		return nil, err
	}
	return runDecoder(ctx, m.ops, m.arch, cache, b, m.cfg.HiddenSize, len(m.layers), m.embed, nil, m.layer, m.spare)
}

// layerFunc runs decoder layer i over the batch: on entry resid holds the
// residual stream and, for i > 0, delta the previous layer's output still
// to be added; on exit delta holds this layer's output.
type layerFunc func(i int, s *scratch, cache *KVCache, b *ForwardBatch, resid, delta kernels.Tensor) error

// runDecoder runs a decoder stack: the embedding of the batch's ids (then
// embedded, when not nil, edits it in place, e.g. Gemma's scaling), each of
// the n layers (checking ctx between them), and the last layer's output
// added to the residual stream. Errors name arch and the layer.
func runDecoder(ctx context.Context, ops kernels.Ops, arch string, cache *KVCache, b *ForwardBatch, hidden, n int, embed kernels.Tensor,
	embedded func(resid kernels.Tensor) error, layer layerFunc, spare *spareScratch) (kernels.Tensor, error) {
	t := b.NumTokens
	s := spare.take(ops, t)
	defer spare.put(s)
	resid, delta := s.get("resid", t, hidden), s.get("delta", t, hidden)
	if s.err != nil {
		return nil, s.err
	}
	if err := ops.Embedding(resid, embed, b.InputIDs); err != nil {
		return nil, fmt.Errorf("models: %s: %w", arch, err)
	}
	if embedded != nil {
		if err := embedded(resid); err != nil {
			return nil, fmt.Errorf("models: %s: %w", arch, err)
		}
	}
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := layer(i, s, cache, b, resid, delta); err != nil {
			return nil, fmt.Errorf("models: %s: layer %d: %w", arch, i, err)
		}
	}
	out, err := kernels.AllocEmpty(ops, ops.ActivationDType(), t, hidden) // Add writes every element
	if err != nil {
		return nil, err
	}
	if err := ops.Add(out, resid, delta); err != nil {
		return nil, fmt.Errorf("models: %s: %w", arch, err)
	}
	return out, nil
}

// layer runs decoder layer i. On entry resid holds the residual stream and,
// for i > 0, delta the previous layer's MLP output still to be added; on exit
// delta holds this layer's MLP output.
func (m *llama) layer(i int, s *scratch, cache *KVCache, b *ForwardBatch, resid, delta kernels.Tensor) error {
	ops, ly, t := m.ops, &m.layers[i], b.NumTokens
	qd, kvd := m.numHeads*m.headDim, m.numKVHeads*m.headDim
	// x is the norms' output, read only by the q/k/v and MLP projections:
	// rounded by the norms where those projections would round it.
	xw := []kernels.Tensor{ly.qkv}
	if ly.moe == nil {
		xw = append(xw, ly.mlp.gateUp)
	}
	x := s.getTyped("x", s.inputDType(t, ly.moe, xw...), t, m.cfg.HiddenSize)
	qkv := s.get("qkv", t, qd+2*kvd)
	q, k, v := s.get("q", t, qd), s.get("k", t, kvd), s.get("v", t, kvd)
	attn := s.getTyped("attn", s.linearInputDType(t, ly.o), t, qd) // read only by the o projection
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
	if err := ops.Linear(qkv, x, ly.qkv, ly.qkvBias); err != nil {
		return err
	}
	// Split, per-head norms (Qwen3), RoPE and the cache writes: fused where
	// the backend can.
	if err := kernels.PrepareQKV(ops, kernels.QKV{QKV: qkv, Q: q, K: k, V: v,
		KCache: cache.K[i], VCache: cache.V[i], SlotMapping: b.Attn.SlotMapping, Positions: b.Positions,
		Cos: m.rope.cos, Sin: m.rope.sin, QNorm: ly.qNorm, KNorm: ly.kNorm, Eps: m.eps,
		NumHeads: m.numHeads, NumKVHeads: m.numKVHeads, HeadDim: m.headDim,
		RoPE: kernels.RoPEParams{RotaryDim: m.rope.rotaryDim}}); err != nil {
		return err
	}
	ap := kernels.AttentionParams{NumHeads: m.numHeads, NumKVHeads: m.numKVHeads, HeadDim: m.headDim,
		Scale: float32(1 / math.Sqrt(float64(m.headDim))), SlidingWindow: ly.slidingWindow, InputDType: computeDType(ly.o.DType())}
	if err := ops.Attention(attn, q, cache.K[i], cache.V[i], &b.Attn, ap); err != nil {
		return err
	}
	if err := ops.Linear(delta, attn, ly.o, ly.oBias); err != nil {
		return err
	}
	if err := ops.AddRMSNorm(x, resid, delta, ly.postNorm, m.eps); err != nil {
		return err
	}
	if ly.moe != nil {
		return moeForward(ops, ly.moe, m.route, m.cfg.NRoutedExperts, s, delta, x)
	}
	return ly.mlp.forward(ops, s, delta, x)
}
