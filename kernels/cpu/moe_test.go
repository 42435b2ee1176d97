package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// refRoute follows the reference routing step by step with sorting, in
// float64: scores, biased choice, group mask (masked experts score 0), top-k,
// unbiased weights, optional renormalization, scaling. It returns weight by id.
func refRoute(logits, bias []float32, p kernels.RouteParams) map[int32]float64 {
	e := len(logits)
	sc := make([]float64, e)
	switch p.Scoring {
	case kernels.ScoringSoftmax:
		mx := math.Inf(-1)
		for _, l := range logits {
			mx = math.Max(mx, float64(l))
		}
		var sum float64
		for i, l := range logits {
			sc[i] = math.Exp(float64(l) - mx)
			sum += sc[i]
		}
		for i := range sc {
			sc[i] /= sum
		}
	case kernels.ScoringSigmoid:
		for i, l := range logits {
			sc[i] = 1 / (1 + math.Exp(-float64(l)))
		}
	}
	choice := slices.Clone(sc)
	for i := range choice {
		if bias != nil {
			choice[i] += float64(bias[i])
		}
	}
	if p.Method != kernels.TopKGreedy {
		size := e / p.NumGroups
		type grp struct {
			i int
			s float64
		}
		var gs []grp
		for g := range p.NumGroups {
			part := slices.Clone(choice[g*size : (g+1)*size])
			slices.Sort(part)
			slices.Reverse(part)
			s := part[0]
			if p.Method == kernels.TopKNoAuxTC {
				s = part[0] + part[1]
			}
			gs = append(gs, grp{g, s})
		}
		slices.SortStableFunc(gs, func(a, b grp) int {
			switch {
			case a.s > b.s:
				return -1
			case a.s < b.s:
				return 1
			}
			return 0
		})
		for _, g := range gs[p.TopKGroups:] {
			for i := g.i * size; i < (g.i+1)*size; i++ {
				choice[i] = 0
			}
		}
	}
	order := make([]int, e)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case choice[a] > choice[b]:
			return -1
		case choice[a] < choice[b]:
			return 1
		}
		return 0
	})
	var sum float64
	for _, i := range order[:p.TopK] {
		sum += sc[i]
	}
	w := map[int32]float64{}
	for _, i := range order[:p.TopK] {
		x := sc[i]
		if p.NormTopKProb {
			x /= sum + 1e-20
		}
		w[int32(i)] = x * float64(p.ScalingFactor)
	}
	return w
}

func TestMoERoute(t *testing.T) {
	b := newTestBackend(t, 2)
	r := rand.New(rand.NewPCG(9, 9))
	const tokens, e = 9, 16
	logits := randVals(r, tokens*e, 3)
	bias := randVals(r, e, 0.5)
	for _, tc := range []struct {
		name string
		p    kernels.RouteParams
		bias bool
	}{
		{"greedy-softmax", kernels.RouteParams{TopK: 3, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy, ScalingFactor: 1}, false},
		{"greedy-softmax-norm", kernels.RouteParams{TopK: 4, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGreedy, NormTopKProb: true, ScalingFactor: 2.5}, false},
		{"group-limited", kernels.RouteParams{TopK: 3, Scoring: kernels.ScoringSoftmax, Method: kernels.TopKGroupLimited, NumGroups: 4, TopKGroups: 2, ScalingFactor: 16}, false},
		{"noaux-tc", kernels.RouteParams{TopK: 4, Scoring: kernels.ScoringSigmoid, Method: kernels.TopKNoAuxTC, NumGroups: 4, TopKGroups: 2, NormTopKProb: true, ScalingFactor: 2.5}, true},
		{"noaux-tc-one-group", kernels.RouteParams{TopK: 2, Scoring: kernels.ScoringSigmoid, Method: kernels.TopKNoAuxTC, NumGroups: 1, TopKGroups: 1, ScalingFactor: 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bt kernels.Tensor
			var bv []float32
			if tc.bias {
				bv = bias
				bt = put(t, b, kernels.F32, bias, e)
			}
			ids, _ := b.Alloc(kernels.I32, tokens, tc.p.TopK)
			w := alloc(t, b, tokens, tc.p.TopK)
			if err := b.MoERoute(ids, w, put(t, b, kernels.F32, logits, tokens, e), bt, tc.p); err != nil {
				t.Fatal(err)
			}
			for i := range tokens {
				want := refRoute(logits[i*e:(i+1)*e], bv, tc.p)
				for k := range tc.p.TopK {
					id := ids.(*Tensor).i32[i*tc.p.TopK+k]
					ww, ok := want[id]
					if !ok {
						t.Fatalf("token %d: chose expert %d, want experts %v", i, id, want)
					}
					if got := float64(vals(w)[i*tc.p.TopK+k]); math.Abs(got-ww) > 1e-6*math.Max(1, math.Abs(ww)) {
						t.Errorf("token %d expert %d: weight %v, want %v", i, id, got, ww)
					}
				}
			}
		})
	}
}

// TestMoERouteGroupMask: a hand-made case where the two grouped methods keep
// different groups, and the experts of the dropped group are never chosen.
func TestMoERouteGroupMask(t *testing.T) {
	b := newTestBackend(t, 1)
	// Group 0 = experts 0,1; group 1 = experts 2,3. Group 1 has the single best
	// expert (3) but group 0 has the best pair sum, so noaux_tc keeps group 0
	// while group_limited_greedy keeps group 1.
	logits := []float32{1.0, 0.9, -2, 1.2}
	for _, tc := range []struct {
		method kernels.TopKMethod
		want   []int32
	}{{kernels.TopKNoAuxTC, []int32{0, 1}}, {kernels.TopKGroupLimited, []int32{3, 2}}} {
		p := kernels.RouteParams{TopK: 2, Scoring: kernels.ScoringSigmoid, Method: tc.method, NumGroups: 2, TopKGroups: 1, ScalingFactor: 1}
		ids, _ := b.Alloc(kernels.I32, 1, 2)
		if err := b.MoERoute(ids, alloc(t, b, 1, 2), put(t, b, kernels.F32, logits, 1, 4), nil, p); err != nil {
			t.Fatal(err)
		}
		if got := ids.(*Tensor).i32; !slices.Equal(got, tc.want) {
			t.Errorf("method %d: ids %v, want %v", tc.method, got, tc.want)
		}
	}
}

func refExpert(x, gateUp, down []float32, hidden, inter int) []float64 {
	a := make([]float64, inter)
	for j := range inter {
		var g, u float64
		for k := range hidden {
			g += float64(gateUp[j*hidden+k]) * float64(x[k])
			u += float64(gateUp[(inter+j)*hidden+k]) * float64(x[k])
		}
		a[j] = g / (1 + math.Exp(-g)) * u
	}
	y := make([]float64, hidden)
	for i := range hidden {
		for j := range inter {
			y[i] += float64(down[i*inter+j]) * a[j]
		}
	}
	return y
}

func TestMoE(t *testing.T) {
	// The first shape splits each expert's products over the workers
	// (enough rows an expert for linearOn to split them); the second runs
	// one expert a worker (expertsByLoad), as a batched decode step of the
	// default model does, and the third too, as its one-row decode step
	// does (two experts, each too small to split).
	for _, sh := range []struct {
		e, tokens, threads int
		perExpert          bool
	}{{5, 1000, 3, false}, {8, 40, 2, true}, {8, 1, 2, true}} {
		t.Run(fmt.Sprintf("e%d_t%d_threads%d", sh.e, sh.tokens, sh.threads), func(t *testing.T) {
			testMoE(t, sh.e, sh.tokens, sh.threads, sh.perExpert)
		})
	}
}

func testMoE(t *testing.T, e, tokens, threads int, perExpert bool) {
	const hidden, inter, topK = 16, 12, 2
	r := rand.New(rand.NewPCG(10, 10))
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			b := newTestBackend(t, threads)
			gu := roundTo(dt, randVals(r, e*2*inter*hidden, 0.5))
			dn := roundTo(dt, randVals(r, e*hidden*inter, 0.5))
			x := randVals(r, tokens*hidden, 1)
			ids := make([]int32, tokens*topK)
			for i := range tokens {
				p := r.Perm(e)
				ids[i*topK], ids[i*topK+1] = int32(p[0]), int32(p[1])
			}
			by, err := groupByExpert("moe", ids, e, topK)
			if err != nil {
				t.Fatal(err)
			}
			if got := expertsByLoad(by, threads, splittable(2*inter, hidden)) != nil; got != perExpert {
				t.Fatalf("one expert a worker: %v, want %v", got, perExpert)
			}
			w := randVals(r, tokens*topK, 1)
			gut, dnt := put(t, b, dt, gu, e, 2*inter, hidden), put(t, b, dt, dn, e, hidden, inter)
			out := alloc(t, b, tokens, hidden)
			if err := b.MoE(out, put(t, b, kernels.F32, x, tokens, hidden), putI32(t, b, ids, tokens, topK), put(t, b, kernels.F32, w, tokens, topK), gut, dnt); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, tokens*hidden)
			for i := range tokens {
				acc := make([]float64, hidden)
				for k := range topK {
					ex := int(ids[i*topK+k])
					y := refExpert(x[i*hidden:(i+1)*hidden], gu[ex*2*inter*hidden:(ex+1)*2*inter*hidden], dn[ex*hidden*inter:(ex+1)*hidden*inter], hidden, inter)
					for j := range hidden {
						acc[j] += float64(w[i*topK+k]) * y[j]
					}
				}
				for j := range hidden {
					want[i*hidden+j] = float32(acc[j])
				}
			}
			checkClose(t, "moe", vals(out), want, 1e-5)

			// Batch invariance: each token alone, on a backend with another
			// thread count, is bit-identical to its row of the batch.
			b1 := newTestBackend(t, 1)
			gut1, dnt1 := put(t, b1, dt, gu, e, 2*inter, hidden), put(t, b1, dt, dn, e, hidden, inter)
			for i := range tokens {
				o1 := alloc(t, b1, 1, hidden)
				err := b1.MoE(o1, put(t, b1, kernels.F32, x[i*hidden:(i+1)*hidden], 1, hidden), putI32(t, b1, ids[i*topK:(i+1)*topK], 1, topK),
					put(t, b1, kernels.F32, w[i*topK:(i+1)*topK], 1, topK), gut1, dnt1)
				if err != nil {
					t.Fatal(err)
				}
				checkIdentical(t, fmt.Sprintf("token %d alone vs batch", i), vals(o1), vals(out)[i*hidden:(i+1)*hidden])
			}
		})
	}
}

func TestExpertsByLoad(t *testing.T) {
	pairs := func(n int) []int32 { return make([]int32, n) }
	for _, tc := range []struct {
		name     string
		loads    []int
		workers  int
		minRows  int // splittable: the rows from which an expert's products split
		want     []int
		parallel bool
	}{
		{"one worker", []int{3, 3, 3, 3}, 1, 1, nil, false},
		{"too few experts", []int{5, 0, 5, 5}, 2, 1, nil, false},
		{"busiest past a fair share", []int{20, 1, 1, 1, 1}, 2, 1, nil, false},
		{"busiest first", []int{2, 0, 5, 3, 5, 1}, 2, 1, []int{2, 4, 3, 0, 5}, true},
		{"too few experts, all too small to split", []int{0, 1, 0, 1}, 2, 2, []int{1, 3}, true},
		{"three experts on two workers, too small to split", []int{1, 2, 1}, 2, 3, []int{1, 0, 2}, true},
		{"one expert too small to split", []int{0, 3, 0}, 2, 4, nil, false},
		{"too few experts, one splittable", []int{5, 0, 1}, 2, 5, nil, false},
		{"too small to split, busiest past a fair share", []int{1, 6, 1}, 2, 7, nil, false},
		{"too small to split, one worker", []int{1, 1}, 1, 2, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			by := make([][]int32, len(tc.loads))
			for i, n := range tc.loads {
				by[i] = pairs(n)
			}
			got := expertsByLoad(by, tc.workers, tc.minRows)
			if (got != nil) != tc.parallel || !slices.Equal(got, tc.want) {
				t.Fatalf("expertsByLoad(%v, %d, %d) = %v, want %v", tc.loads, tc.workers, tc.minRows, got, tc.want)
			}
		})
	}
}

// The MoE op takes its expert outputs and each expert's rows from the
// backend's pool: after a first call, a call of the same shape allocates
// less than one expert-output buffer (tokens x top-k x hidden floats), on
// both ways through (products split over the workers, one expert a
// worker), where every call used to allocate that buffer and three
// buffers an expert. The outputs stay those of the first call.
func TestMoEReusesScratch(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops a share of what is put back")
	}
	const hidden, inter, topK = 256, 192, 2 // the default model's expert shapes
	for _, sh := range []struct{ e, tokens, threads int }{{5, 7, 3}, {8, 40, 2}} {
		t.Run(fmt.Sprintf("e%d_t%d", sh.e, sh.tokens), func(t *testing.T) {
			r := rand.New(rand.NewPCG(11, 11))
			b := newTestBackend(t, sh.threads)
			gu := put(t, b, kernels.BF16, roundTo(kernels.BF16, randVals(r, sh.e*2*inter*hidden, 0.5)), sh.e, 2*inter, hidden)
			dn := put(t, b, kernels.BF16, roundTo(kernels.BF16, randVals(r, sh.e*hidden*inter, 0.5)), sh.e, hidden, inter)
			x := put(t, b, kernels.F32, randVals(r, sh.tokens*hidden, 1), sh.tokens, hidden)
			ids := make([]int32, sh.tokens*topK)
			for i := range sh.tokens {
				p := r.Perm(sh.e)
				ids[i*topK], ids[i*topK+1] = int32(p[0]), int32(p[1])
			}
			idt, w := putI32(t, b, ids, sh.tokens, topK), put(t, b, kernels.F32, randVals(r, sh.tokens*topK, 1), sh.tokens, topK)
			out := alloc(t, b, sh.tokens, hidden)
			call := func() {
				if err := b.MoE(out, x, idt, w, gu, dn); err != nil {
					t.Fatal(err)
				}
			}
			call()
			first := append([]float32(nil), vals(out)...)
			const calls = 20
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range calls {
				call()
			}
			runtime.ReadMemStats(&after)
			perCall := (after.TotalAlloc - before.TotalAlloc) / calls
			t.Logf("%d bytes allocated a call", perCall)
			if ys := uint64(sh.tokens * topK * hidden * 4); perCall >= ys {
				t.Errorf("%d bytes allocated a call, want fewer than the %d of one expert-output buffer", perCall, ys)
			}
			checkIdentical(t, "after reuse", vals(out), first)
		})
	}
}
