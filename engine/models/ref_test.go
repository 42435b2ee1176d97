package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// A dense float64 reference of both architectures, written from the
// reference formulas without kernels, paging, fusion or absorption: it reads
// the same MemWeights and runs one sequence from position 0.

type ref struct {
	cfg *weights.Config
	w   MemWeights
	t   *testing.T
}

// mat is a row-major matrix.
type mat struct {
	rows, cols int
	v          []float64
}

func (m mat) row(i int) []float64 { return m.v[i*m.cols : (i+1)*m.cols] }

func (r *ref) param(name string) []float64 {
	t, ok := r.w[name]
	if !ok {
		r.t.Fatalf("reference: no tensor %q", name)
	}
	return f64(t.Float32s())
}

func (r *ref) has(name string) bool { _, ok := r.w[name]; return ok }

// linear is x W^T + b for the named weight (and bias, if present).
func (r *ref) linear(x mat, name string) mat {
	w := r.w[name+".weight"]
	wv := r.param(name + ".weight")
	n, k := w.Shape[0], w.Shape[1]
	if k != x.cols {
		r.t.Fatalf("reference: %s is %v, input has %d columns", name, w.Shape, x.cols)
	}
	var b []float64
	if r.has(name + ".bias") {
		b = r.param(name + ".bias")
	}
	out := mat{x.rows, n, make([]float64, x.rows*n)}
	for i := range x.rows {
		for j := range n {
			var s float64
			for kk := range k {
				s += x.v[i*k+kk] * wv[j*k+kk]
			}
			if b != nil {
				s += b[j]
			}
			out.v[i*n+j] = s
		}
	}
	return out
}

func (r *ref) norm(x mat, name string) mat {
	w := r.param(name)
	eps := r.cfg.RMSNormEps
	out := mat{x.rows, x.cols, make([]float64, len(x.v))}
	for i := range x.rows {
		row := x.row(i)
		var s float64
		for _, v := range row {
			s += v * v
		}
		scale := 1 / math.Sqrt(s/float64(len(row))+eps)
		for j, v := range row {
			out.v[i*x.cols+j] = v * scale * w[j]
		}
	}
	return out
}

func add(a, b mat) mat {
	out := mat{a.rows, a.cols, slices.Clone(a.v)}
	for i := range out.v {
		out.v[i] += b.v[i]
	}
	return out
}

func cols(x mat, lo, hi int) mat {
	out := mat{x.rows, hi - lo, nil}
	for i := range x.rows {
		out.v = append(out.v, x.row(i)[lo:hi]...)
	}
	return out
}

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

func (r *ref) mlp(x mat, p string) mat {
	g, u := r.linear(x, p+"gate_proj"), r.linear(x, p+"up_proj")
	for i := range g.v {
		g.v[i] = silu(g.v[i]) * u.v[i]
	}
	return r.linear(g, p+"down_proj")
}

// invFreq computes the rope frequencies and cos/sin scale from the reference
// formulas (default, linear, llama3, yarn; dynamic equals default below
// max_position_embeddings).
func (r *ref) invFreq(dim int) ([]float64, float64) {
	rp := r.cfg.Rope
	inv := make([]float64, dim/2)
	for i := range inv {
		inv[i] = math.Pow(rp.Theta, -float64(2*i)/float64(dim))
	}
	mscale := func(s, m float64) float64 {
		if s <= 1 {
			return 1
		}
		return 0.1*m*math.Log(s) + 1
	}
	switch rp.Type {
	case "linear":
		for i := range inv {
			inv[i] /= rp.Factor
		}
	case "llama3":
		old := float64(rp.OriginalMaxPositionEmbeddings)
		for i, f := range inv {
			wl := 2 * math.Pi / f
			if wl > old/rp.LowFreqFactor {
				inv[i] = f / rp.Factor
			} else if wl >= old/rp.HighFreqFactor {
				s := (old/wl - rp.LowFreqFactor) / (rp.HighFreqFactor - rp.LowFreqFactor)
				inv[i] = (1-s)*f/rp.Factor + s*f
			}
		}
	case "yarn":
		orig := float64(rp.OriginalMaxPositionEmbeddings)
		d := func(rot float64) float64 {
			return float64(dim) * math.Log(orig/(rot*2*math.Pi)) / (2 * math.Log(rp.Theta))
		}
		lo, hi := math.Max(math.Floor(d(rp.BetaFast)), 0), math.Min(math.Ceil(d(rp.BetaSlow)), float64(dim-1))
		for i, f := range inv {
			ramp := math.Min(math.Max((float64(i)-lo)/(hi-lo), 0), 1)
			inv[i] = f/rp.Factor*ramp + f*(1-ramp)
		}
		return inv, mscale(rp.Factor, rp.Mscale) / mscale(rp.Factor, rp.MscaleAllDim)
	}
	return inv, 1
}

// rope rotates, in every row, numHeads heads of size headSize at offset
// within each head; pairs are (i, i+dim/2) or, interleaved, (2i, 2i+1).
func (r *ref) rope(x mat, numHeads, headSize, offset, dim int, interleaved bool) {
	inv, att := r.invFreq(dim)
	for p := range x.rows {
		for h := range numHeads {
			v := x.row(p)[h*headSize+offset : h*headSize+offset+dim]
			for i, f := range inv {
				a, b := i, i+dim/2
				if interleaved {
					a, b = 2*i, 2*i+1
				}
				c, s := math.Cos(float64(p)*f)*att, math.Sin(float64(p)*f)*att
				v[a], v[b] = v[a]*c-v[b]*s, v[b]*c+v[a]*s
			}
		}
	}
}

// attend is causal attention: q [T, nh*dq], k [T, nkv*dq], v [T, nkv*dv].
func attend(q, k, v mat, nh, nkv, dq, dv int, scale float64, window int) mat {
	out := mat{q.rows, nh * dv, make([]float64, q.rows*nh*dv)}
	for i := range q.rows {
		first := 0
		if window > 0 {
			first = max(0, i+1-window)
		}
		for h := range nh {
			kh := h / (nh / nkv)
			sc := make([]float64, i+1-first)
			mx := math.Inf(-1)
			for j := range sc {
				var s float64
				for x := range dq {
					s += q.row(i)[h*dq+x] * k.row(first + j)[kh*dq+x]
				}
				sc[j] = s * scale
				mx = math.Max(mx, sc[j])
			}
			var sum float64
			for j := range sc {
				sc[j] = math.Exp(sc[j] - mx)
				sum += sc[j]
			}
			for x := range dv {
				var o float64
				for j := range sc {
					o += sc[j] / sum * v.row(first + j)[kh*dv+x]
				}
				out.v[i*nh*dv+h*dv+x] = o
			}
		}
	}
	return out
}

func (r *ref) embed(ids []int32, name string) mat {
	e := r.param(name)
	h := r.cfg.HiddenSize
	x := mat{len(ids), h, nil}
	for _, id := range ids {
		x.v = append(x.v, e[int(id)*h:(int(id)+1)*h]...)
	}
	return x
}

// forward returns the last hidden state (before the final norm) and the
// logits of every position.
func (r *ref) forward(ids []int32) (mat, mat) {
	c := r.cfg
	x := r.embed(ids, "model.embed_tokens.weight")
	for i := range c.NumHiddenLayers {
		x = r.layer(x, i)
	}
	return x, r.logits(x, "model.norm.weight", "lm_head.weight")
}

func (r *ref) logits(x mat, norm, head string) mat {
	if !r.has(head) {
		head = "model.embed_tokens.weight"
	}
	return r.linear(r.norm(x, norm), head[:len(head)-len(".weight")])
}

func (r *ref) layer(x mat, i int) mat {
	p := fmt.Sprintf("model.layers.%d.", i)
	a := r.attention(r.norm(x, p+"input_layernorm.weight"), p+"self_attn.", i)
	x = add(x, a)
	y := r.norm(x, p+"post_attention_layernorm.weight")
	if r.cfg.NRoutedExperts > 0 && r.cfg.IsMoELayer(i) {
		if r.cfg.ModelType == "mixtral" {
			return add(x, r.moe(y, p+"block_sparse_moe."))
		}
		return add(x, r.moe(y, p+"mlp."))
	}
	return add(x, r.mlp(y, p+"mlp."))
}

func (r *ref) attention(x mat, p string, layer int) mat {
	c := r.cfg
	if c.KVLoraRank > 0 && c.QKNopeHeadDim > 0 {
		return r.mla(x, p)
	}
	nh, nkv, d := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	q, k, v := r.linear(x, p+"q_proj"), r.linear(x, p+"k_proj"), r.linear(x, p+"v_proj")
	if r.has(p + "q_norm.weight") {
		q = r.headNorm(q, nh, d, p+"q_norm.weight")
		k = r.headNorm(k, nkv, d, p+"k_norm.weight")
	}
	rot := int(float64(d) * c.Rope.PartialRotaryFactor)
	r.rope(q, nh, d, 0, rot, false)
	r.rope(k, nkv, d, 0, rot, false)
	o := attend(q, k, v, nh, nkv, d, d, 1/math.Sqrt(float64(d)), slidingWindow(c, layer))
	return r.linear(o, p+"o_proj")
}

func (r *ref) headNorm(x mat, heads, d int, name string) mat {
	y := r.norm(mat{x.rows * heads, d, x.v}, name)
	return mat{x.rows, heads * d, y.v}
}

// mla is DeepSeek attention in its explicit form: keys and values expanded
// per head from the latent.
func (r *ref) mla(x mat, p string) mat {
	c := r.cfg
	nh, nope, rope, kvl, vd := c.NumAttentionHeads, c.QKNopeHeadDim, c.QKRopeHeadDim, c.KVLoraRank, c.VHeadDim
	var q mat
	if c.QLoraRank > 0 {
		q = r.linear(r.norm(r.linear(x, p+"q_a_proj"), p+"q_a_layernorm.weight"), p+"q_b_proj")
	} else {
		q = r.linear(x, p+"q_proj")
	}
	kva := r.linear(x, p+"kv_a_proj_with_mqa")
	kpe := cols(kva, kvl, kvl+rope)
	kv := r.linear(r.norm(cols(kva, 0, kvl), p+"kv_a_layernorm.weight"), p+"kv_b_proj")
	interleaved := c.RopeInterleave || c.ModelType == "deepseek_v2"
	r.rope(q, nh, nope+rope, nope, rope, interleaved)
	r.rope(kpe, 1, rope, 0, rope, interleaved)
	k := mat{x.rows, nh * (nope + rope), nil}
	v := mat{x.rows, nh * vd, nil}
	for t := range x.rows {
		for h := range nh {
			k.v = append(k.v, kv.row(t)[h*(nope+vd):h*(nope+vd)+nope]...)
			k.v = append(k.v, kpe.row(t)...)
			v.v = append(v.v, kv.row(t)[h*(nope+vd)+nope:(h+1)*(nope+vd)]...)
		}
	}
	scale := 1 / math.Sqrt(float64(nope+rope))
	if c.Rope.Type != "default" && c.Rope.MscaleAllDim != 0 {
		m := 0.1*c.Rope.MscaleAllDim*math.Log(c.Rope.Factor) + 1
		scale *= m * m
	}
	return r.linear(attend(q, k, v, nh, nh, nope+rope, vd, scale, 0), p+"o_proj")
}

// moe routes each token by sorting, runs its experts and the shared experts.
func (r *ref) moe(x mat, p string) mat {
	c := r.cfg
	e, topK := c.NRoutedExperts, c.NumExpertsPerTok
	logits := r.linear(x, p+"gate")
	var bias []float64
	if r.has(p + "gate.e_score_correction_bias") {
		bias = r.param(p + "gate.e_score_correction_bias")
	}
	out := mat{x.rows, x.cols, make([]float64, len(x.v))}
	for t := range x.rows {
		l := logits.row(t)
		sc := make([]float64, e)
		if c.ScoringFunc == "sigmoid" {
			for i := range sc {
				sc[i] = 1 / (1 + math.Exp(-l[i]))
			}
		} else {
			mx := slices.Max(l)
			var s float64
			for i := range sc {
				sc[i] = math.Exp(l[i] - mx)
				s += sc[i]
			}
			for i := range sc {
				sc[i] /= s
			}
		}
		choice := slices.Clone(sc)
		for i := range choice {
			if bias != nil {
				choice[i] += bias[i]
			}
		}
		if c.TopKMethod != "greedy" {
			size := e / c.NGroup
			gs := make([]float64, c.NGroup)
			for g := range gs {
				part := slices.Clone(choice[g*size : (g+1)*size])
				slices.Sort(part)
				gs[g] = part[size-1]
				if c.TopKMethod == "noaux_tc" {
					gs[g] += part[size-2]
				}
			}
			order := sortedDesc(gs)
			for _, g := range order[c.TopKGroup:] {
				for i := g * size; i < (g+1)*size; i++ {
					choice[i] = 0
				}
			}
		}
		chosen := sortedDesc(choice)[:topK]
		var sum float64
		for _, i := range chosen {
			sum += sc[i]
		}
		row := mat{1, x.cols, x.row(t)}
		for _, i := range chosen {
			w := sc[i]
			if c.ModelType != "deepseek_v2" && c.NormTopKProb {
				w /= sum + 1e-20
			}
			w *= c.RoutedScalingFactor
			var y mat
			if c.ModelType == "mixtral" {
				y = r.mixtralExpert(row, fmt.Sprintf("%sexperts.%d.", p, i))
			} else {
				y = r.mlp(row, fmt.Sprintf("%sexperts.%d.", p, i))
			}
			for j := range x.cols {
				out.v[t*x.cols+j] += w * y.v[j]
			}
		}
	}
	if c.NSharedExperts > 0 {
		out = add(out, r.mlp(x, p+"shared_experts."))
	}
	return out
}

// mixtralExpert is mlp under Mixtral's names: w2(silu(w1 x) * w3 x).
func (r *ref) mixtralExpert(x mat, p string) mat {
	g, u := r.linear(x, p+"w1"), r.linear(x, p+"w3")
	for i := range g.v {
		g.v[i] = silu(g.v[i]) * u.v[i]
	}
	return r.linear(g, p+"w2")
}

func sortedDesc(v []float64) []int {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case v[a] > v[b]:
			return -1
		case v[a] < v[b]:
			return 1
		}
		return 0
	})
	return idx
}

// mtp is the DeepSeek MTP depth 0 over a prompt, as the fixtures define it:
// x_t = eh_proj([enorm(embed(next_t)), hnorm(h_t))]) with h the main model's
// last hidden state before the final norm, then the decoder layer, then the
// shared head.
func (r *ref) mtp(next []int32, h mat) mat {
	i := r.cfg.NumHiddenLayers
	p := fmt.Sprintf("model.layers.%d.", i)
	embed := p + "embed_tokens.weight"
	if !r.has(embed) {
		embed = "model.embed_tokens.weight"
	}
	e := r.norm(r.embed(next, embed), p+"enorm.weight")
	hn := r.norm(h, p+"hnorm.weight")
	x := mat{len(next), 2 * r.cfg.HiddenSize, nil}
	for t := range x.rows {
		x.v = append(append(x.v, e.row(t)...), hn.row(t)...)
	}
	y := r.layer(r.linear(x, p+"eh_proj"), i)
	head := p + "shared_head.head.weight"
	if !r.has(head) {
		head = "lm_head.weight"
	}
	return r.logits(y, p+"shared_head.norm.weight", head)
}

// TestAgainstReference compares every architecture's paged forward with the
// dense float64 reference on F32 random weights (and DeepSeek-V2's with
// attention biases).
func TestAgainstReference(t *testing.T) {
	const blockSize, numBlocks, n = 4, 16, 13
	ops := newBackend(t, 2)
	for _, name := range append(slices.Clone(tinyNames), "deepseek-v2-bias") {
		t.Run(name, func(t *testing.T) {
			m, w := tinyModel(t, ops, name, kernels.F32)
			rf := &ref{cfg: m.Config(), w: w, t: t}
			r := rand.New(rand.NewPCG(8, 9))
			ids := randomIDs(r, n, m.Config().VocabSize)
			cache, err := m.NewKVCache(numBlocks, blockSize)
			if err != nil {
				t.Fatal(err)
			}
			got, hidden := step(t, m, cache, seqStep{ids, 0, newBlockPool(r, numBlocks).table(blockSize, n)})
			wantH, want := rf.forward(ids)
			worst := 0.0
			for i := range n {
				worst = math.Max(worst, relErr(got[i], want.row(i)))
			}
			if worst > 1e-5 {
				t.Errorf("max relative logit error %.3g > 1e-5", worst)
			}
			t.Logf("max relative logit error %.2g", worst)
			mtp := m.MTP()
			if mtp == nil {
				return
			}
			// MTP depth 0 over the prompt: next tokens are ids[1:] + one more.
			next := append(slices.Clone(ids[1:]), 5)
			mcache, err := mtp.NewKVCache(numBlocks, blockSize)
			if err != nil {
				t.Fatal(err)
			}
			hb := HostBatch{BlockSize: blockSize}
			hb.AddSequence(next, 0, newBlockPool(r, numBlocks).table(blockSize, n))
			b, err := hb.Upload(ops, numBlocks)
			if err != nil {
				t.Fatal(err)
			}
			out, err := mtp.Forward(t.Context(), 0, mcache, b, hidden)
			if err != nil {
				t.Fatal(err)
			}
			lg, err := mtp.ComputeLogits(0, out, nil)
			if err != nil {
				t.Fatal(err)
			}
			gotM := rowsOf(t, ops, lg)
			wantM := rf.mtp(next, wantH)
			worst = 0
			for i := range n {
				worst = math.Max(worst, relErr(gotM[i], wantM.row(i)))
			}
			if worst > 1e-5 {
				t.Errorf("mtp: max relative logit error %.3g > 1e-5", worst)
			}
			t.Logf("mtp: max relative logit error %.2g", worst)
		})
	}
}
