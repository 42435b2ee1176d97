package models

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// Tiny Gemma 3 configs: window 5, a linearly scaled global RoPE and a
// local base of its own, query_pre_attn_scalar != head_dim, a final soft
// cap; one lists layer_types, the other uses sliding_window_pattern, one
// in transformers 5's per-layer-type rope_parameters.
var gemma3Configs = map[string]string{
	"layer-types": `{"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
		"sliding_window": 5, "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
		"query_pre_attn_scalar": 12, "final_logit_softcapping": 3.0, "hidden_activation": "gelu_pytorch_tanh",
		"rope_theta": 1000000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_local_base_freq": 100.0,
		"tie_word_embeddings": true}`,
	"pattern": `{"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 97,
		"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 5, "num_attention_heads": 2,
		"num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 4096,
		"sliding_window": 3, "sliding_window_pattern": 3, "query_pre_attn_scalar": 16,
		"final_logit_softcapping": null, "attn_logit_softcapping": null,
		"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
			"sliding_attention": {"rope_type": "default", "rope_theta": 500.0}},
		"tie_word_embeddings": false}`,
}

func gemma3Model(t testing.TB, ops kernels.Ops, name string, paged bool) (*gemma3, MemWeights) {
	t.Helper()
	cfg := parseConfig(t, gemma3Configs[name])
	w, err := RandomWeights(cfg, kernels.F32, 11)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Builtin().New(ops, cfg, w, Options{MaxModelLen: testMaxLen, SlidingWindowPaged: paged})
	if err != nil {
		t.Fatal(err)
	}
	return m.(*gemma3), w
}

// gemmaRef is the float64 reference of Gemma 3 (transformers'
// Gemma3ForCausalLM, eager attention), over one sequence from position 0.
type gemmaRef struct {
	*ref
	sliding    []bool
	window     int
	qpas       float64
	softcap    float64
	global     weights.Rope
	localTheta float64
}

func (g *gemmaRef) norm(x mat, name string) mat {
	w := g.param(name)
	out := mat{x.rows, x.cols, make([]float64, len(x.v))}
	for i := range x.rows {
		row := x.row(i)
		var s float64
		for _, v := range row {
			s += v * v
		}
		scale := 1 / math.Sqrt(s/float64(len(row))+g.cfg.RMSNormEps)
		for j, v := range row {
			out.v[i*x.cols+j] = v * scale * (1 + w[j])
		}
	}
	return out
}

func (g *gemmaRef) headNorm(x mat, heads, d int, name string) mat {
	y := g.norm(mat{x.rows * heads, d, x.v}, name)
	return mat{x.rows, heads * d, y.v}
}

func (g *gemmaRef) rope(x mat, heads, d int, sliding bool) {
	saved := g.cfg.Rope
	if sliding {
		g.cfg.Rope = weights.Rope{Type: "default", Theta: g.localTheta}
	} else {
		g.cfg.Rope = g.global
	}
	g.ref.rope(x, heads, d, 0, d, false)
	g.cfg.Rope = saved
}

func geluTanh64(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func (g *gemmaRef) forward(ids []int32) mat {
	c := g.cfg
	x := g.embed(ids, "model.embed_tokens.weight")
	scale := float64(float32(math.Sqrt(float64(c.HiddenSize))))
	for i := range x.v {
		x.v[i] *= scale
	}
	nh, nkv, d := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	for i := range c.NumHiddenLayers {
		p := fmt.Sprintf("model.layers.%d.", i)
		a := p + "self_attn."
		h := g.norm(x, p+"input_layernorm.weight")
		q := g.headNorm(g.linear(h, a+"q_proj"), nh, d, a+"q_norm.weight")
		k := g.headNorm(g.linear(h, a+"k_proj"), nkv, d, a+"k_norm.weight")
		v := g.linear(h, a+"v_proj")
		g.rope(q, nh, d, g.sliding[i])
		g.rope(k, nkv, d, g.sliding[i])
		window := 0
		if g.sliding[i] {
			window = g.window
		}
		o := g.linear(attend(q, k, v, nh, nkv, d, d, math.Pow(g.qpas, -0.5), window), a+"o_proj")
		x = add(x, g.norm(o, p+"post_attention_layernorm.weight"))
		y := g.norm(x, p+"pre_feedforward_layernorm.weight")
		gt, up := g.linear(y, p+"mlp.gate_proj"), g.linear(y, p+"mlp.up_proj")
		for j := range gt.v {
			gt.v[j] = geluTanh64(gt.v[j]) * up.v[j]
		}
		x = add(x, g.norm(g.linear(gt, p+"mlp.down_proj"), p+"post_feedforward_layernorm.weight"))
	}
	head := "lm_head"
	if !g.has("lm_head.weight") {
		head = "model.embed_tokens"
	}
	lg := g.linear(g.norm(x, "model.norm.weight"), head)
	if g.softcap > 0 {
		for i, v := range lg.v {
			lg.v[i] = g.softcap * math.Tanh(v/g.softcap)
		}
	}
	return lg
}

func newGemmaRef(t *testing.T, m *gemma3, w MemWeights, sliding []bool, global weights.Rope, localTheta float64) *gemmaRef {
	return &gemmaRef{ref: &ref{cfg: m.Config(), w: w, t: t}, sliding: sliding, window: m.window,
		qpas: math.Pow(float64(m.attnScale), -2), softcap: float64(m.finalSoftcap), global: global, localTheta: localTheta}
}

// ringSeq is one sequence's share of a step over a cache with state slots.
type ringSeq struct {
	ids       []int32
	numCached int
	table     []int32
	slot      int32
}

// ringStep runs one forward pass and returns the logits of every new token.
func ringStep(t testing.TB, m Model, cache *KVCache, seqs ...ringSeq) [][]float32 {
	t.Helper()
	h := HostBatch{BlockSize: cache.BlockSize, RingWindow: cache.Spec.RingWindow}
	for _, s := range seqs {
		h.AddSequence(s.ids, s.numCached, s.table)
		if h.RingWindow > 0 {
			h.StateSlots = append(h.StateSlots, s.slot)
		}
	}
	b, err := h.Upload(opsOf(m), cache.NumBlocks)
	if err != nil {
		t.Fatal(err)
	}
	hidden, err := m.Forward(context.Background(), cache, b)
	if err != nil {
		t.Fatal(err)
	}
	lg, err := m.ComputeLogits(hidden, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rowsOf(t, opsOf(m), lg)
}

func ringCache(t testing.TB, m Model, numBlocks, blockSize, numSlots int) *KVCache {
	t.Helper()
	c, err := m.NewKVCache(numBlocks, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AllocStateSlots(opsOf(m), numSlots); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestGemma3Config(t *testing.T) {
	ops := newBackend(t, 1)
	m, _ := gemma3Model(t, ops, "layer-types", false)
	var sliding []bool
	for _, ly := range m.layers {
		sliding = append(sliding, ly.sliding)
	}
	if fmt.Sprint(sliding) != "[true false true true]" {
		t.Errorf("layer_types: sliding %v", sliding)
	}
	if s := m.KVCacheSpec(); s.NumLayers != 1 || s.RingLayers != 3 || s.RingWindow != 5 || s.Width != 16 {
		t.Errorf("spec %+v: want 1 paged layer, 3 ring layers of window 5, width 16", s)
	}
	if got, want := m.embedScale, float32(math.Sqrt(32)); got != want {
		t.Errorf("embedding scale %g, want %g", got, want)
	}
	if got, want := m.attnScale, float32(math.Pow(12, -0.5)); got != want {
		t.Errorf("attention scale %g, want %g", got, want)
	}
	p, _ := gemma3Model(t, ops, "pattern", false)
	sliding = sliding[:0]
	for _, ly := range p.layers {
		sliding = append(sliding, ly.sliding)
	}
	if fmt.Sprint(sliding) != "[true true false true true]" || p.finalSoftcap != 0 {
		t.Errorf("sliding_window_pattern 3: sliding %v, soft cap %g", sliding, p.finalSoftcap)
	}
	paged, _ := gemma3Model(t, ops, "pattern", true)
	if s := paged.KVCacheSpec(); s.NumLayers != 5 || s.RingLayers != 0 {
		t.Errorf("sliding_window_paged: spec %+v, want 5 paged layers and no rings", s)
	}
	for name, edit := range map[string]string{
		"activation":  `"hidden_activation": "gelu"`,
		"attn cap":    `"attn_logit_softcapping": 50.0`,
		"layer types": `"layer_types": ["sliding_attention"]`,
	} {
		js := gemma3Configs["pattern"][:len(gemma3Configs["pattern"])-1] + ", " + edit + "}"
		cfg := parseConfig(t, js)
		w, err := RandomWeights(cfg, kernels.F32, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Builtin().New(ops, cfg, w, Options{MaxModelLen: 64}); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: error %v, want ErrConfig", name, err)
		}
	}
}

// TestGemma3AgainstReference compares prefill logits with the float64
// reference, in ring mode and with every layer paged, for prompts several
// windows long.
func TestGemma3AgainstReference(t *testing.T) {
	const blockSize, numBlocks, n = 4, 32, 23
	ops := newBackend(t, 2)
	cases := []struct {
		name       string
		sliding    []bool
		global     weights.Rope
		localTheta float64
	}{
		{"layer-types", []bool{true, false, true, true}, weights.Rope{Type: "linear", Theta: 1e6, Factor: 2}, 100},
		{"pattern", []bool{true, true, false, true, true}, weights.Rope{Type: "default", Theta: 10000}, 500},
	}
	for _, c := range cases {
		for _, paged := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/paged=%v", c.name, paged), func(t *testing.T) {
				m, w := gemma3Model(t, ops, c.name, paged)
				rf := newGemmaRef(t, m, w, c.sliding, c.global, c.localTheta)
				r := rand.New(rand.NewPCG(3, 4))
				ids := randomIDs(r, n, m.Config().VocabSize)
				cache := ringCache(t, m, numBlocks, blockSize, 3)
				got := ringStep(t, m, cache, ringSeq{ids, 0, newBlockPool(r, numBlocks).table(blockSize, n), 2})
				want := rf.forward(ids)
				worst := 0.0
				for i := range n {
					worst = math.Max(worst, relErr(got[i], want.row(i)))
				}
				if worst > 1e-5 {
					t.Errorf("max relative logit error %.3g > 1e-5", worst)
				}
				t.Logf("max relative logit error %.2g", worst)
			})
		}
	}
}

// TestGemma3RingMatchesPaged runs the same steps (chunks shorter and
// longer than the window, decodes, two sequences in other slots, a fork
// by state copy) with ring buffers and with every layer paged: the logits
// are the same bits.
func TestGemma3RingMatchesPaged(t *testing.T) {
	const blockSize, numBlocks = 4, 64
	ops := newBackend(t, 2)
	ring, _ := gemma3Model(t, ops, "layer-types", false)
	paged, _ := gemma3Model(t, ops, "layer-types", true)
	rc := ringCache(t, ring, numBlocks, blockSize, 4)
	pc := ringCache(t, paged, numBlocks, blockSize, 4)
	r := rand.New(rand.NewPCG(5, 6))
	pool := newBlockPool(r, numBlocks)
	a, b := randomIDs(r, 40, 97), randomIDs(r, 30, 97)
	ta, tb := pool.table(blockSize, 48), pool.table(blockSize, 48)
	tc := pool.table(blockSize, 48)
	check := func(what string, seqs ...ringSeq) [][]float32 {
		t.Helper()
		x, y := ringStep(t, ring, rc, seqs...), ringStep(t, paged, pc, seqs...)
		for i := range x {
			if !sameBits(x[i], y[i]) {
				t.Fatalf("%s: row %d: ring and paged logits differ (max relative %.3g)", what, i, relErr(x[i], f64(y[i])))
			}
		}
		return x
	}
	// a: a chunk of 13 (longer than the window), then 1, then 9; b: 3, 2, 25.
	check("chunks 1", ringSeq{a[:13], 0, ta, 3}, ringSeq{b[:3], 0, tb, 0})
	check("chunks 2", ringSeq{a[13:14], 13, ta, 3}, ringSeq{b[3:5], 3, tb, 0})
	lg := check("chunks 3", ringSeq{a[14:23], 14, ta, 3}, ringSeq{b[5:30], 5, tb, 0})
	// The same rows as one whole-prompt pass in a fresh cache and slot.
	whole := ringStep(t, ring, ringCache(t, ring, numBlocks, blockSize, 4), ringSeq{a[:23], 0, pool.table(blockSize, 23), 1})
	if !sameBits(whole[22], lg[8]) {
		t.Errorf("chunked prefill and one pass give different logits for the last prompt token")
	}
	// Fork a: the child shares a's blocks up to 23 tokens (copied here: the
	// paged cache needs its own blocks for what it writes) and a's state slot
	// is copied into slot 2.
	for _, c := range []*KVCache{rc, pc} {
		if err := c.CopyStateSlots(ops, []int{3}, []int{2}); err != nil {
			t.Fatal(err)
		}
		for l := range c.K {
			for blk := range 6 {
				copyBlock(t, ops, c.K[l], int(ta[blk]), int(tc[blk]))
				copyBlock(t, ops, c.V[l], int(ta[blk]), int(tc[blk]))
			}
		}
	}
	for p := 23; p < 40; p++ {
		child := b[p-23 : p-22] // the child's own tokens, after its parent's first
		if p == 23 {
			child = a[23:24]
		}
		x := check(fmt.Sprintf("decode %d", p), ringSeq{a[p : p+1], p, ta, 3}, ringSeq{child, p, tc, 2})
		if p == 23 && !sameBits(x[0], x[1]) {
			t.Errorf("the fork's first decode differs from its parent's on the same token")
		}
	}
}

func copyBlock(t *testing.T, ops kernels.Ops, c kernels.Tensor, src, dst int) {
	t.Helper()
	s, err := ops.Rows(c, src, src+1)
	if err != nil {
		t.Fatal(err)
	}
	d, err := ops.Rows(c, dst, dst+1)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, kernels.NumElements(s)*s.DType().Size())
	if err := ops.Download(buf, s); err != nil {
		t.Fatal(err)
	}
	if err := ops.Upload(d, buf, s.DType()); err != nil {
		t.Fatal(err)
	}
}

// TestGemma3RingNeedsSlots: a ring model refuses a cache without state
// slots and a batch laid out without them.
func TestGemma3RingNeedsSlots(t *testing.T) {
	ops := newBackend(t, 1)
	m, _ := gemma3Model(t, ops, "pattern", false)
	c, err := m.NewKVCache(8, 4)
	if err != nil {
		t.Fatal(err)
	}
	h := HostBatch{BlockSize: 4}
	h.AddSequence([]int32{1, 2}, 0, []int32{0})
	b, err := h.Upload(ops, 8)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Forward(t.Context(), c, b); !errors.Is(err, ErrBatch) {
		t.Errorf("cache without state slots: %v, want ErrBatch", err)
	}
	if err := c.AllocStateSlots(ops, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Forward(t.Context(), c, b); !errors.Is(err, ErrBatch) {
		t.Errorf("batch without state slots: %v, want ErrBatch", err)
	}
	if s := m.KVCacheSpec(); s.BytesPerStateSlot() != s.RingLayers*s.RingWindow*2*s.Width*4 {
		t.Errorf("bytes per state slot %d", s.BytesPerStateSlot())
	}
}

// TestGemma3FixtureParity checks the HF transformers fixture of
// tools/make_gemma3_fixture.py (testdata/models/gemma3, f32) with ring
// buffers and with every layer paged: prompt logits, token-by-token
// decode and 32 greedy tokens. It is skipped until the fixture is there.
func TestGemma3FixtureParity(t *testing.T) {
	dir := fixtureDir + "/gemma3"
	rf, err := weights.OpenFile(dir + "/reference.safetensors")
	if err != nil {
		t.Skipf("no Gemma 3 fixture: %v", err)
	}
	defer rf.Close()
	ref := fixtureRef{rf, t}
	const blockSize, numBlocks, tol = 4, 64, 1e-4
	ops := newBackend(t, 2)
	for _, paged := range []bool{false, true} {
		m, err := Builtin().Load(ops, dir+"/f32", Options{MaxModelLen: 128, SlidingWindowPaged: paged})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; ref.has(fmt.Sprintf("f32.prompt.%d.ids", i)); i++ {
			key := fmt.Sprintf("f32.prompt.%d", i)
			ids, want := ref.ints(key+".ids"), ref.rows(key+".logits")
			greedyWant := ref.ints(fmt.Sprintf("f32.greedy.%d.ids", i))
			r := rand.New(rand.NewPCG(uint64(i), 1))
			table := newBlockPool(r, numBlocks).table(blockSize, len(ids)+len(greedyWant))
			cache := ringCache(t, m, numBlocks, blockSize, 2)
			got := ringStep(t, m, cache, ringSeq{ids, 0, table, 1})
			for p := range ids {
				if e := relErr(got[p], want[p]); e > tol {
					t.Errorf("paged=%v prompt %d position %d: error %.3g > %g", paged, i, p, e, tol)
				}
			}
			next := int32(argmax(got[len(ids)-1]))
			greedy := []int32{next}
			for len(greedy) < len(greedyWant) {
				lg := ringStep(t, m, cache, ringSeq{[]int32{next}, len(ids) + len(greedy) - 1, table, 1})
				next = int32(argmax(lg[0]))
				greedy = append(greedy, next)
			}
			if fmt.Sprint(greedy) != fmt.Sprint(greedyWant) {
				t.Errorf("paged=%v prompt %d: greedy %v, HF %v", paged, i, greedy, greedyWant)
			}
			dcache := ringCache(t, m, numBlocks, blockSize, 2)
			for p := range ids {
				lg := ringStep(t, m, dcache, ringSeq{ids[p : p+1], p, table, 0})
				if e := relErr(lg[0], want[p]); e > tol {
					t.Errorf("paged=%v prompt %d: decode position %d: error %.3g > %g", paged, i, p, e, tol)
				}
			}
		}
	}
}
