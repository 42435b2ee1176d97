package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// MoERoute turns router logits into top-k expert ids and weights.
func (b *Backend) MoERoute(ids, weights, logits, bias kernels.Tensor, p kernels.RouteParams) error {
	const op = "moe_route"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	is, err := asCPU(op, "ids", ids)
	if err != nil {
		return err
	}
	ws, err := asCPU(op, "weights", weights)
	if err != nil {
		return err
	}
	ls, err := asCPU(op, "logits", logits)
	if err != nil {
		return err
	}
	bs, err := optCPU(op, "bias", bias)
	if err != nil {
		return err
	}
	t, e, err := kernels.RouteShapes("cpu", is, ws, ls, bs, p)
	if err != nil {
		return err
	}
	var bv []float32
	if bs != nil {
		bv = bs.f32
	}
	b.forRows(t, e*p.TopK, func(lo, hi int) {
		r := newRouter(e, p)
		for i := lo; i < hi; i++ {
			r.route(is.i32[i*p.TopK:(i+1)*p.TopK], ws.f32[i*p.TopK:(i+1)*p.TopK], ls.f32[i*e:(i+1)*e], bv)
		}
	})
	return nil
}

// router holds per-worker scratch for routing one token at a time.
type router struct {
	p      kernels.RouteParams
	scores []float32
	choice []float32
	group  []float32
	taken  []bool
}

func newRouter(e int, p kernels.RouteParams) *router {
	return &router{p: p, scores: make([]float32, e), choice: make([]float32, e),
		group: make([]float32, max(p.NumGroups, 1)), taken: make([]bool, max(e, p.NumGroups))}
}

// argmaxFree returns the index of the largest v[i] not yet taken; ties go to
// the lower index.
func argmaxFree(v []float32, taken []bool) int {
	best := -1
	for i, x := range v {
		if !taken[i] && (best < 0 || x > v[best]) {
			best = i
		}
	}
	return best
}

func (r *router) route(ids []int32, weights, logits, bias []float32) {
	p := r.p
	e := len(logits)
	sc := r.scores
	switch p.Scoring {
	case kernels.ScoringSoftmax:
		m := float32(math.Inf(-1))
		for _, l := range logits {
			m = max(m, l)
		}
		var sum float64
		for i, l := range logits {
			x := math.Exp(float64(l - m))
			sc[i] = float32(x)
			sum += x
		}
		for i := range sc {
			sc[i] = float32(float64(sc[i]) / sum)
		}
	case kernels.ScoringSigmoid:
		for i, l := range logits {
			sc[i] = float32(1 / (1 + math.Exp(-float64(l))))
		}
	}
	ch := r.choice
	copy(ch, sc)
	if bias != nil {
		for i := range ch {
			ch[i] += bias[i]
		}
	}
	if p.Method != kernels.TopKGreedy {
		size := e / p.NumGroups
		g := r.group[:p.NumGroups]
		for gi := range g {
			part := ch[gi*size : (gi+1)*size]
			if p.Method == kernels.TopKGroupLimited {
				best := part[0]
				for _, x := range part[1:] {
					best = max(best, x)
				}
				g[gi] = best
			} else { // sum of the two best
				a, b := float32(math.Inf(-1)), float32(math.Inf(-1))
				for _, x := range part {
					if x > a {
						a, b = x, a
					} else if x > b {
						b = x
					}
				}
				g[gi] = a + b
			}
		}
		taken := r.taken[:p.NumGroups]
		clear(taken)
		for range p.TopKGroups {
			taken[argmaxFree(g, taken)] = true
		}
		for gi, keep := range taken {
			if !keep {
				clear(ch[gi*size : (gi+1)*size]) // masked experts score 0, as the reference does
			}
		}
	}
	taken := r.taken[:e]
	clear(taken)
	var sum float32
	for k := range ids {
		i := argmaxFree(ch, taken)
		taken[i] = true
		ids[k] = int32(i)
		weights[k] = sc[i]
		sum += sc[i]
	}
	if p.NormTopKProb {
		d := sum + 1e-20
		for k := range weights {
			weights[k] /= d
		}
	}
	for k := range weights {
		weights[k] *= p.ScalingFactor
	}
}

// expert returns the view of index e of a 3-D weight tensor as a matrix.
func expert(t *Tensor, e int) *Tensor {
	r := t.rowLen()
	if t.q != nil {
		n := t.shape[1]
		return t.qRows(e*n, (e+1)*n, t.shape[1:])
	}
	if t.fp8 != nil {
		n, k := t.shape[1], t.shape[2]
		return t.f8Rows(e*n, (e+1)*n, k, t.shape[1:])
	}
	v := &Tensor{shape: t.shape[1:], dtype: t.dtype, keep: t.keep}
	if t.dtype == kernels.F32 {
		v.f32 = t.f32[e*r : (e+1)*r]
	} else {
		v.u16 = t.u16[e*r : (e+1)*r]
	}
	return v
}

// MoE runs the selected experts on their tokens and mixes the results.
func (b *Backend) MoE(out, x, ids, weights, gateUp, down kernels.Tensor) error {
	const op = "moe"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	xs, err := asCPU(op, "x", x)
	if err != nil {
		return err
	}
	is, err := asCPU(op, "ids", ids)
	if err != nil {
		return err
	}
	ws, err := asCPU(op, "weights", weights)
	if err != nil {
		return err
	}
	gu, err := asCPU(op, "gate_up", gateUp)
	if err != nil {
		return err
	}
	dn, err := asCPU(op, "down", down)
	if err != nil {
		return err
	}
	d, err := kernels.MoEShapes("cpu", o, xs, is, ws, gu, dn)
	if err != nil {
		return err
	}
	t, hidden, numExperts, inter, topK := d.T, d.Hidden, d.NumExperts, d.Inter, d.TopK
	// Group (token, k) pairs by expert, in token order.
	byExpert, err := groupByExpert(op, is.i32, numExperts, topK)
	if err != nil {
		return err
	}
	// Expert output per (token, k): every row is written by the expert
	// of its pair before the sum below reads it.
	ys, pooled := poolFloats(&b.moe, t*topK*hidden)
	defer pooled.done()
	// run computes expert e's rows of ys; parallel splits its products
	// over the pool. Experts write disjoint rows of ys.
	run := func(e int, parallel bool) {
		pairs := byExpert[e]
		n := len(pairs)
		xe, g, a, rows := b.expertRows(xs.f32, pairs, topK, hidden, inter)
		defer rows.done()
		b.linearOn(g, xe, expert(gu, e), n, 2*inter, hidden, nil, parallel)
		for r := range n {
			b.k.siluMulRow(a[r*inter:(r+1)*inter], g[r*2*inter:(r+1)*2*inter])
		}
		ye := xe // reuse: n*hidden
		b.linearOn(ye, a, expert(dn, e), n, hidden, inter, nil, parallel)
		for r, pair := range pairs {
			copy(ys[int(pair)*hidden:(int(pair)+1)*hidden], ye[r*hidden:(r+1)*hidden])
		}
	}
	if order := expertsByLoad(byExpert, b.threads, splittable(2*inter, hidden)); order != nil {
		// Many small experts: one worker an expert, busiest first, so that
		// the gathers, activations and scatters run in parallel too and
		// each expert costs one hand-off instead of two parallel loops.
		b.run.For(len(order), func(lo, hi int) {
			for _, e := range order[lo:hi] {
				run(e, false)
			}
		})
	} else {
		for e, pairs := range byExpert {
			if len(pairs) > 0 {
				run(e, true)
			}
		}
	}
	b.forRows(t, topK*hidden, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst := o.f32[i*hidden : (i+1)*hidden]
			clear(dst)
			for k := range topK {
				b.k.axpy(ws.f32[i*topK+k], ys[(i*topK+k)*hidden:(i*topK+k+1)*hidden], dst)
			}
		}
	})
	return nil
}

// expertsByLoad returns the experts that have pairs, busiest first, when
// running one expert a worker pays: at least two such experts a worker, and
// none with more than a worker's fair share of the pairs (the busiest
// expert bounds the time of the parallel loop). Otherwise nil: each
// expert's products are split over the workers instead.
//
// minRows is the fewest rows at which an expert's product is split over
// the workers at all (splittable). When no expert reaches it, splitting
// its products would run every product on the caller, one after another,
// with the other workers idle; so then any two or more experts run one a
// worker, the fair-share bound kept (a decode row of the default model:
// its two routed experts, one row each, on two workers at once).
func expertsByLoad(byExpert [][]int32, workers, minRows int) []int {
	if workers < 2 {
		return nil
	}
	var order []int
	total, busiest := 0, 0
	for e, pairs := range byExpert {
		if n := len(pairs); n > 0 {
			order = append(order, e)
			total += n
			busiest = max(busiest, n)
		}
	}
	least := 2 * workers
	if busiest < minRows {
		least = 2
	}
	if len(order) < least || busiest*min(workers, len(order)) > total {
		return nil
	}
	slices.SortStableFunc(order, func(a, b int) int { return len(byExpert[b]) - len(byExpert[a]) })
	return order
}

// splittable returns the fewest rows m at which linearOn splits an m x n
// by n x k product over the workers (m*n*k reaching its threshold; ignoring
// its other condition, at least two tiles of columns, which the experts'
// products meet).
func splittable(n, k int) int {
	return (parallelLinearWork + n*k - 1) / max(n*k, 1)
}

// groupByExpert groups the (token, k) pairs of ids ([T, topK], flattened)
// by expert, in token order; an id outside [0, numExperts) is an error
// naming op and its place.
func groupByExpert(op string, ids []int32, numExperts, topK int) ([][]int32, error) {
	byExpert := make([][]int32, numExperts)
	for i, e := range ids {
		if e < 0 || int(e) >= numExperts {
			return nil, fmt.Errorf("cpu: %s: ids[%d][%d] = %d, %d experts: %w", op, i/topK, i%topK, e, numExperts, kernels.ErrOutOfRange)
		}
		byExpert[e] = append(byExpert[e], int32(i))
	}
	return byExpert, nil
}

// gatherTokens copies the hidden rows of the tokens of pairs ((token, k)
// indices) out of xs, in order.
func gatherTokens(xe, xs []float32, pairs []int32, topK, hidden int) {
	for r, pair := range pairs {
		tok := int(pair) / topK
		copy(xe[r*hidden:(r+1)*hidden], xs[tok*hidden:(tok+1)*hidden])
	}
}

// expertRows returns one expert's working rows from the backend's MoE
// pool, for its n = len(pairs) pairs: xe [n, hidden] holding the pairs'
// tokens (gatherTokens), g [n, 2*inter] and a [n, inter] unset; the
// handle's done gives them back.
func (b *Backend) expertRows(xs []float32, pairs []int32, topK, hidden, inter int) (xe, g, a []float32, h pooledFloats) {
	n := len(pairs)
	buf, h := poolFloats(&b.moe, n*(hidden+3*inter))
	xe, g, a = buf[:n*hidden], buf[n*hidden:n*(hidden+2*inter)], buf[n*(hidden+2*inter):]
	gatherTokens(xe, xs, pairs, topK, hidden)
	return xe, g, a, h
}
