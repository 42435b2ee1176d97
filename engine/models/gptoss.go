package models

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// gptOss is GptOssForCausalLM (OpenAI's gpt-oss): sliding-window and full
// attention layers (layer_types; by default they alternate, sliding
// first), q/k/v/o biases, a learned sink logit per head that joins every
// attention softmax's denominator, YaRN RoPE (rope_parameters), and on
// every layer a MoE block: a biased router whose top-k logits are
// softmaxed, experts with biased projections and the clamped SwiGLU
// (gate clamped above at swiglu_limit, up clamped to ±limit, (up + 1) *
// gate * sigmoid(1.702 * gate)).
//
// Expert weights are read in transformers' layout (mlp.experts.gate_up_proj
// [E, hidden, 2*inter] with gate and up columns interleaved, down_proj [E,
// inter, hidden], their biases) or as the official checkpoints ship them,
// MXFP4 (*_blocks uint8 [E, rows, cols/32, 16] of 4-bit codes, *_scales
// uint8 [E, rows, cols/32] E8M0 exponents): those stay MXFP4 on backends
// that compute with it (kernels.MXFP4Weighter; the CPU widens them in the
// expert loops) and are widened at load into BF16, which holds every
// MXFP4 value exactly, for the others. Either way they are stored in the
// MoE kernels' layout (gate rows first, then up).
//
// The sliding-window layers keep their keys and values in per-sequence
// ring buffers (KVCacheSpec.RingLayers) unless Options.SlidingWindowPaged
// puts them in paged blocks with the full layers'.
type gptOss struct {
	base
	numHeads, numKVHeads, headDim int
	numExperts                    int
	route                         kernels.RouteParams
	act                           kernels.ClampedSwiGLU
	layers                        []gptOssLayer
	windowLayers
	moeOps kernels.BiasedMoEer
}

type gptOssLayer struct {
	inputNorm, postNorm    kernels.Tensor
	qkv, qkvBias, o, oBias kernels.Tensor
	sinks                  kernels.Tensor // F32 [num_heads]
	router, routerBias     kernels.Tensor
	gateUp, gateUpBias     kernels.Tensor // [E, 2*inter, hidden] (gate rows first), F32 [E, 2*inter]
	down, downBias         kernels.Tensor // [E, hidden, inter], F32 [E, hidden]
	sliding                bool
	cacheIdx               int // index into KVCache.K/V, or RingK/RingV for a ring layer
}

// gptOssSliding is whether layer i uses the sliding window: layer_types
// when the config lists them, else GptOssConfig's default (even layers).
func gptOssSliding(cfg *weights.Config, i int) (bool, error) {
	if len(cfg.LayerTypes) == 0 {
		return i%2 == 0, nil
	}
	return gemma3LayerSliding(cfg, i)
}

func newGptOss(arch string, ops kernels.Ops, cfg *weights.Config, src Weights, opts Options) (Model, error) {
	if s, ok := ops.(kernels.AttentionSinker); !ok || !s.AttentionSinks() {
		return nil, fmt.Errorf("models: %s: backend %s lacks attention sinks: %w", arch, ops.Name(), ErrConfig)
	}
	moeOps, ok := ops.(kernels.BiasedMoEer)
	if !ok {
		return nil, fmt.Errorf("models: %s: backend %s lacks the biased clamped-SwiGLU MoE kernel: %w", arch, ops.Name(), ErrConfig)
	}
	c := *cfg
	if _, ok := cfg.Raw["head_dim"]; !ok {
		c.HeadDim = 64 // GptOssConfig's default
	}
	if _, ok := cfg.Raw["sliding_window"]; !ok {
		c.SlidingWindow = 128
	}
	cfg = &c
	limit, err := rawFloat(cfg, "swiglu_limit", 7)
	if err != nil {
		return nil, err
	}
	e, topK := cfg.NRoutedExperts, cfg.NumExpertsPerTok
	if e < 1 || topK < 1 || topK > e || !(limit > 0) {
		return nil, fmt.Errorf("models: %s: %d experts, top-%d, swiglu_limit %g: %w", arch, e, topK, limit, ErrConfig)
	}
	m := &gptOss{base: base{arch: arch, cfg: cfg, ops: ops, spare: newSpareScratch(ops)}, moeOps: moeOps,
		numHeads: cfg.NumAttentionHeads, numKVHeads: cfg.NumKeyValueHeads, headDim: cfg.HeadDim,
		numExperts: e, windowLayers: windowLayers{window: cfg.SlidingWindow},
		route: kernels.RouteParams{TopK: topK, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy,
			NumGroups: 1, TopKGroups: 1, NormTopKProb: true, ScalingFactor: 1},
		act: kernels.ClampedSwiGLU{Limit: float32(limit), Alpha: 1.702}}
	l := newLoader(ops, cfg, src, opts)
	if err := m.loadCommon(l, opts, cfg.HeadDim); err != nil {
		return nil, err
	}
	h, qd, kvd, inter := cfg.HiddenSize, m.numHeads*m.headDim, m.numKVHeads*m.headDim, cfg.IntermediateSize
	for i := range cfg.NumHiddenLayers {
		sliding, err := gptOssSliding(cfg, i)
		if err != nil {
			return nil, err
		}
		p := fmt.Sprintf("model.layers.%d.", i)
		a := p + "self_attn."
		ly := gptOssLayer{
			inputNorm: l.vector(p+"input_layernorm.weight", h),
			postNorm:  l.vector(p+"post_attention_layernorm.weight", h),
			qkv: l.fused(h, []string{a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
				[]int{qd, kvd, kvd}),
			qkvBias:    l.fusedVector([]string{a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}, []int{qd, kvd, kvd}),
			o:          l.linear(a+"o_proj.weight", h, qd),
			oBias:      l.optVector(a+"o_proj.bias", h),
			sinks:      loadF32(l, a+"sinks", m.numHeads),
			router:     l.matrix(p+"mlp.router.weight", e, h),
			routerBias: l.optVector(p+"mlp.router.bias", e),
			sliding:    sliding,
		}
		ly.gateUp, ly.gateUpBias, ly.down, ly.downBias = loadGptOssExperts(l, p+"mlp.experts.", e, h, inter)
		if l.err != nil {
			break
		}
		if cfg.AttentionBias && ly.qkvBias == nil {
			l.matrix(a+"q_proj.bias", qd) // reports the missing bias
			break
		}
		m.layers = append(m.layers, ly)
	}
	if l.err != nil {
		return nil, fmt.Errorf("models: %s: %w", arch, l.err)
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

// loadF32 uploads a float tensor of the given shape as F32.
func loadF32(l *loader, name string, shape ...int) kernels.Tensor {
	t, ok := l.get(name, shape...)
	if !ok {
		return nil
	}
	dt, _ := toKernelDType(t.DType)
	return uploadAs(l, name, kernels.F32, t.Data, dt, shape...)
}

// uploadAs allocates a dst-typed weight of shape (kernels.AllocWeight)
// and uploads data (of dtype src) into it.
func uploadAs(l *loader, name string, dst kernels.DType, data []byte, src kernels.DType, shape ...int) kernels.Tensor {
	out, err := kernels.AllocWeight(l.ops, dst, shape...)
	if err == nil {
		err = l.ops.Upload(out, data, src)
	}
	if err != nil {
		l.fail(fmt.Errorf("models: tensor %q: %w", name, err))
		return nil
	}
	return out
}

// gateUpRow is the MoE kernel's row of transformers' interleaved gate/up
// feature j: gates (even j) first, then ups (odd j).
func gateUpRow(j, inter int) int {
	if j%2 == 0 {
		return j / 2
	}
	return inter + j/2
}

// loadGptOssExperts reads the experts of prefix (".../mlp.experts.") into
// the MoE kernels' layout; see gptOss.
func loadGptOssExperts(l *loader, prefix string, e, h, inter int) (gateUp, gateUpBias, down, downBias kernels.Tensor) {
	if l.err != nil {
		return
	}
	// Biases: [E, 2*inter] interleaved, [E, hidden].
	if t, ok := l.get(prefix+"gate_up_proj_bias", e, 2*inter); ok {
		dt, _ := toKernelDType(t.DType)
		es := len(t.Data) / (e * 2 * inter)
		buf := make([]byte, len(t.Data))
		for x := range e {
			for j := range 2 * inter {
				src, dst := (x*2*inter+j)*es, (x*2*inter+gateUpRow(j, inter))*es
				copy(buf[dst:dst+es], t.Data[src:src+es])
			}
		}
		gateUpBias = uploadAs(l, prefix+"gate_up_proj_bias", kernels.F32, buf, dt, e, 2*inter)
	}
	downBias = loadF32(l, prefix+"down_proj_bias", e, h)
	if l.err != nil {
		return
	}
	if l.src.Has(prefix + "gate_up_proj_blocks") {
		gateUp = loadMXFP4(l, prefix+"gate_up_proj", e, 2*inter, h, func(j int) int { return gateUpRow(j, inter) })
		down = loadMXFP4(l, prefix+"down_proj", e, h, inter, func(j int) int { return j })
		return
	}
	// Dense: gate_up [E, hidden, 2*inter] -> [E, 2*inter, hidden] with the
	// rows regrouped; down [E, inter, hidden] -> [E, hidden, inter].
	if t, ok := l.get(prefix+"gate_up_proj", e, h, 2*inter); ok {
		dt, _ := toKernelDType(t.DType)
		es := len(t.Data) / (e * h * 2 * inter)
		buf := make([]byte, len(t.Data))
		for x := range e {
			for c := range h {
				for j := range 2 * inter {
					src := ((x*h+c)*2*inter + j) * es
					dst := ((x*2*inter+gateUpRow(j, inter))*h + c) * es
					copy(buf[dst:dst+es], t.Data[src:src+es])
				}
			}
		}
		gateUp = uploadAs(l, prefix+"gate_up_proj", dt, buf, dt, e, 2*inter, h)
		l.count(dt, int64(len(buf)))
	}
	if t, ok := l.get(prefix+"down_proj", e, inter, h); ok {
		dt, _ := toKernelDType(t.DType)
		es := len(t.Data) / (e * h * inter)
		buf := make([]byte, len(t.Data))
		for x := range e {
			for i := range inter {
				for c := range h {
					src := ((x*inter+i)*h + c) * es
					dst := ((x*h+c)*inter + i) * es
					copy(buf[dst:dst+es], t.Data[src:src+es])
				}
			}
		}
		down = uploadAs(l, prefix+"down_proj", dt, buf, dt, e, h, inter)
		l.count(dt, int64(len(buf)))
	}
	return
}

// loadMXFP4 reads name_blocks [E, rows, cols/32, 16] (4-bit codes, two a
// byte, the low nibble first) and name_scales [E, rows, cols/32] (E8M0
// exponents) into an [E, rows, cols] expert weight, stored row j at row
// rowOf(j): kept as MXFP4 on backends that compute with it
// (kernels.MXFP4Weighter), else widened to BF16, which holds each value
// (kernels.MXFP4ToF32) exactly. A scale of 255 (NaN) is refused.
func loadMXFP4(l *loader, name string, e, rows, cols int, rowOf func(int) int) kernels.Tensor {
	if cols%kernels.MXFP4BlockSize != 0 {
		l.fail(fmt.Errorf("models: %s: %d columns, MXFP4 needs a multiple of %d: %w", name, cols, kernels.MXFP4BlockSize, ErrWeights))
		return nil
	}
	g := cols / kernels.MXFP4BlockSize
	blocks, err := l.src.Tensor(name + "_blocks")
	if err != nil {
		l.fail(fmt.Errorf("models: %w: %w", ErrWeights, err))
		return nil
	}
	scales, err := l.src.Tensor(name + "_scales")
	if err != nil {
		l.fail(fmt.Errorf("models: %w: %w", ErrWeights, err))
		return nil
	}
	want := []int{e, rows, g, 16}
	if blocks.DType != weights.U8 || fmt.Sprint(blocks.Shape) != fmt.Sprint(want) {
		l.fail(fmt.Errorf("models: %s: %s_blocks is %v %v, want U8 %v: %w", blocks.File, name, blocks.DType, blocks.Shape, want, ErrWeights))
		return nil
	}
	if scales.DType != weights.U8 || fmt.Sprint(scales.Shape) != fmt.Sprint(want[:3]) {
		l.fail(fmt.Errorf("models: %s: %s_scales is %v %v, want U8 %v: %w", scales.File, name, scales.DType, scales.Shape, want[:3], ErrWeights))
		return nil
	}
	for i, sc := range scales.Data {
		if sc == 0xff {
			l.fail(fmt.Errorf("models: %s: %s_scales[%d] is the E8M0 NaN (255): %w", scales.File, name, i, ErrWeights))
			return nil
		}
	}
	rb := g * 16 // block bytes a row
	if mx, ok := l.ops.(kernels.MXFP4Weighter); ok {
		w := kernels.MXFP4Weight{Shape: []int{e, rows, cols}, Blocks: make([]byte, e*rows*rb), Scales: make([]byte, e*rows*g)}
		for x := range e {
			for j := range rows {
				src, dst := x*rows+j, x*rows+rowOf(j)
				copy(w.Blocks[dst*rb:(dst+1)*rb], blocks.Data[src*rb:(src+1)*rb])
				copy(w.Scales[dst*g:(dst+1)*g], scales.Data[src*g:(src+1)*g])
			}
		}
		t, err := mx.MXFP4Weight(w)
		if err != nil {
			l.fail(fmt.Errorf("models: tensor %q: %w", name, err))
			return nil
		}
		l.count(kernels.MXFP4, int64(len(w.Blocks)+len(w.Scales)))
		return t
	}
	buf := make([]byte, 2*e*rows*cols)
	for x := range e {
		for j := range rows {
			dst := (x*rows + rowOf(j)) * cols
			for b := range g {
				sc := scales.Data[(x*rows+j)*g+b]
				codes := blocks.Data[((x*rows+j)*g+b)*16 : ((x*rows+j)*g+b+1)*16]
				for k, c := range codes {
					for n, code := range [2]byte{c & 0x0f, c >> 4} {
						v := kernels.MXFP4ToF32(code, sc)
						binary.LittleEndian.PutUint16(buf[2*(dst+b*32+2*k+n):], kernels.F32ToBF16(v))
					}
				}
			}
		}
	}
	l.count(kernels.BF16, int64(len(buf)))
	return uploadAs(l, name, kernels.BF16, buf, kernels.BF16, e, rows, cols)
}

func (m *gptOss) MTP() *MTP { return nil }

func (m *gptOss) KVCacheSpec() KVCacheSpec {
	var o kernels.Tensor
	if len(m.layers) > 0 {
		o = m.layers[0].o
	}
	return m.kvCacheSpec(m.ops, m.numKVHeads*m.headDim, o)
}

func (m *gptOss) NewKVCache(numBlocks, blockSize int) (*KVCache, error) {
	return NewKVCache(m.ops, m.KVCacheSpec(), numBlocks, blockSize)
}

// Forward runs the decoder stack; see Model.
func (m *gptOss) Forward(ctx context.Context, cache *KVCache, b *ForwardBatch) (kernels.Tensor, error) {
	if err := cache.check(m.KVCacheSpec()); err != nil {
		return nil, err
	}
	if err := m.checkBatch(m.arch, b); err != nil {
		return nil, err
	}
	return runDecoder(ctx, m.ops, m.arch, cache, b, m.cfg.HiddenSize, len(m.layers), m.embed, nil, m.layer, m.spare)
}

// layer runs decoder layer i; resid and delta as in llama.layer.
func (m *gptOss) layer(i int, s *scratch, cache *KVCache, b *ForwardBatch, resid, delta kernels.Tensor) error {
	ops, ly, t := m.ops, &m.layers[i], b.NumTokens
	qd, kvd := m.numHeads*m.headDim, m.numKVHeads*m.headDim
	x := s.get("x", t, m.cfg.HiddenSize)
	qkv := s.get("qkv", t, qd+2*kvd)
	q, k, v := s.get("q", t, qd), s.get("k", t, kvd), s.get("v", t, kvd)
	attn := s.get("attn", t, qd)
	logits, wts := s.get("moe.logits", t, m.numExperts), s.get("moe.weights", t, m.route.TopK)
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
	ap := kernels.AttentionParams{NumHeads: m.numHeads, NumKVHeads: m.numKVHeads, HeadDim: m.headDim,
		Scale: float32(1 / math.Sqrt(float64(m.headDim))), InputDType: computeDType(ly.o.DType()), Sinks: ly.sinks}
	if ly.sliding {
		ap.SlidingWindow = m.window
	}
	a := kernels.QKV{QKV: qkv, Q: q, K: k, V: v, SlotMapping: b.Attn.SlotMapping, Positions: b.Positions,
		Cos: m.rope.cos, Sin: m.rope.sin, Eps: m.eps,
		NumHeads: m.numHeads, NumKVHeads: m.numKVHeads, HeadDim: m.headDim,
		RoPE: kernels.RoPEParams{RotaryDim: m.rope.rotaryDim}}
	if err := attendLayer(ops, cache, b, a, attn, ap, ly.cacheIdx, ly.sliding && m.rings); err != nil {
		return err
	}
	if err := ops.Linear(delta, attn, ly.o, ly.oBias); err != nil {
		return err
	}
	if err := ops.AddRMSNorm(x, resid, delta, ly.postNorm, m.eps); err != nil {
		return err
	}
	ids, err := kernels.AllocEmpty(ops, kernels.I32, t, m.route.TopK) // the routing writes every id
	if err != nil {
		return err
	}
	if err := ops.Linear(logits, x, ly.router, ly.routerBias); err != nil {
		return err
	}
	if err := ops.MoERoute(ids, wts, logits, nil, m.route); err != nil {
		return err
	}
	return m.moeOps.MoEClampedSwiGLU(delta, x, ids, wts, ly.gateUp, ly.gateUpBias, ly.down, ly.downBias, m.act)
}
