package spec

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// fixedUniforms returns vals[position][purpose].
func fixedUniforms(vals ...[2]float64) Uniforms {
	return func(position int, purpose uint64) float64 { return vals[position][purpose] }
}

func TestVerifyGreedy(t *testing.T) {
	cases := []struct {
		name          string
		draft, target []int
		want          int
	}{
		{"no draft", nil, []int{4}, 0},
		{"first mismatch", []int{1, 2, 3}, []int{9, 2, 3, 4}, 0},
		{"middle mismatch", []int{1, 2, 3}, []int{1, 2, 9, 4}, 2},
		{"later match after mismatch ignored", []int{1, 2, 3}, []int{1, 9, 3, 4}, 1},
		{"all match", []int{1, 2, 3}, []int{1, 2, 3, 4}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := VerifyGreedy(c.draft, c.target); got != c.want {
				t.Fatalf("VerifyGreedy(%v, %v) = %d, want %d", c.draft, c.target, got, c.want)
			}
		})
	}
}

func TestVerifyGreedyPanicsOnLength(t *testing.T) {
	defer func() {
		if r, _ := recover().(string); !strings.Contains(r, "2 target tokens for 2 draft tokens, want 3") {
			t.Fatalf("panic %q", r)
		}
	}()
	VerifyGreedy([]int{1, 2}, []int{1, 2})
}

func TestRejectionSampleErrors(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	ok := []float32{0.5, 0.5}
	cases := []struct {
		name  string
		p, q  [][]float32
		draft []int
		is    error
		want  string
	}{
		{"too few target rows", [][]float32{ok}, [][]float32{ok}, []int{0}, ErrShape, "1 target rows for 1 draft tokens, want 2"},
		{"too many draft rows", [][]float32{ok, ok}, [][]float32{ok, ok}, []int{0}, ErrShape, "2 draft rows for 1 draft tokens"},
		{"empty rows", [][]float32{{}}, nil, nil, ErrShape, "empty target row 0"},
		{"ragged target", [][]float32{ok, {1, 0, 0}}, [][]float32{ok}, []int{0}, ErrShape, "target row 1: 3 entries, want 2"},
		{"ragged draft", [][]float32{ok, ok}, [][]float32{{1}}, []int{0}, ErrShape, "draft row 0: 1 entries, want 2"},
		{"NaN", [][]float32{ok, {nan, 1}}, [][]float32{ok}, []int{0}, ErrInvalidDistribution, "target row 1: entry 0 is NaN"},
		{"negative", [][]float32{ok, ok}, [][]float32{{1.5, -0.5}}, []int{0}, ErrInvalidDistribution, "draft row 0: entry 1 is -0.5"},
		{"+Inf", [][]float32{{inf, 0}}, nil, nil, ErrInvalidDistribution, "entry 0 is +Inf"},
		{"zero row", [][]float32{ok, {0, 0}}, [][]float32{ok}, []int{0}, ErrInvalidDistribution, "target row 1: sums to 0"},
		{"token out of range", [][]float32{ok, ok}, [][]float32{ok}, []int{2}, ErrInvalidDraft, "draft token 2 at position 0 outside the vocabulary [0, 2)"},
		{"negative token", [][]float32{ok, ok}, [][]float32{ok}, []int{-1}, ErrInvalidDraft, "outside the vocabulary"},
		{"draft not drawable", [][]float32{ok, ok, ok}, [][]float32{ok, {1, 0}}, []int{0, 1}, ErrInvalidDraft, "draft token 1 at position 1 has draft probability 0"},
	}
	u := fixedUniforms([2]float64{0.5, 0.5}, [2]float64{0.5, 0.5}, [2]float64{0.5, 0.5})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tokens, a, err := RejectionSample(c.p, c.q, c.draft, u)
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %v containing %q", err, c.is, c.want)
			}
			if tokens != nil || a != 0 {
				t.Fatalf("got tokens %v, accepted %d with an error", tokens, a)
			}
		})
	}
}

func TestRejectionSample(t *testing.T) {
	cases := []struct {
		name       string
		p, q       [][]float32
		draft      []int
		u          Uniforms
		wantTokens []int
		wantA      int
	}{
		{"no draft: bonus only", [][]float32{{0.2, 0.3, 0.5}}, nil, nil,
			fixedUniforms([2]float64{0.9, 0.1}), []int{0}, 0},
		{"bonus by inverse CDF", [][]float32{{0.2, 0.3, 0.5}}, nil, nil,
			fixedUniforms([2]float64{0, 0.25}), []int{1}, 0},
		// p/q = 0.5 at token 0: accepted for u < 0.5 (up to float32
		// rounding of the rows, hence the margins).
		{"accept below p/q", [][]float32{{0.3, 0.7}, {0, 1}}, [][]float32{{0.6, 0.4}}, []int{0},
			fixedUniforms([2]float64{0.49, 0.99}, [2]float64{0.3, 0}), []int{0, 1}, 1},
		// Residual max(0, p-q) = (0, 0.3): the rejected token is replaced
		// by token 1 whatever the uniform.
		{"reject at p/q", [][]float32{{0.3, 0.7}, {0, 1}}, [][]float32{{0.6, 0.4}}, []int{0},
			fixedUniforms([2]float64{0.51, 0.01}, [2]float64{0.3, 0}), []int{1}, 0},
		{"p above q always accepted", [][]float32{{0.5, 0.5}, {1, 0}}, [][]float32{{0.2, 0.8}}, []int{0},
			fixedUniforms([2]float64{0.9999999, 0.5}, [2]float64{0, 0.5}), []int{0, 0}, 1},
		{"p zero always rejected", [][]float32{{0, 0.5, 0.5}, {1, 0, 0}}, [][]float32{{0.5, 0.5, 0}}, []int{0},
			fixedUniforms([2]float64{0, 0.6}, [2]float64{0, 0}), []int{2}, 0},
		{"rejection stops later positions", [][]float32{{1, 0}, {1, 0}, {1, 0}}, [][]float32{{0.5, 0.5}, {0.5, 0.5}}, []int{0, 1},
			fixedUniforms([2]float64{0.3, 0.3}, [2]float64{0.3, 0.3}), []int{0, 0}, 1},
		// Rows that do not sum to 1 are normalized: (3, 7) is (0.3, 0.7).
		{"unnormalized rows", [][]float32{{3, 7}, {0, 2}}, [][]float32{{12, 8}}, []int{0},
			fixedUniforms([2]float64{0.49, 0.99}, [2]float64{0.3, 0}), []int{0, 1}, 1},
		{"p equals q: all accepted", [][]float32{{0.25, 0.75}, {0.5, 0.5}, {0.5, 0.5}}, [][]float32{{0.25, 0.75}, {0.5, 0.5}}, []int{1, 0},
			fixedUniforms([2]float64{0.99, 0}, [2]float64{0.99, 0}, [2]float64{0, 0.6}), []int{1, 0, 1}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tokens, a, err := RejectionSample(c.p, c.q, c.draft, c.u)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(tokens, c.wantTokens) || a != c.wantA {
				t.Fatalf("got %v, accepted %d; want %v, %d", tokens, a, c.wantTokens, c.wantA)
			}
		})
	}
}

// TestRejectionSampleNormalizes: scaling rows changes no token, for random
// rows, drafts and uniforms.
func TestRejectionSampleNormalizes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	randRow := func(v int) []float32 {
		row := make([]float32, v)
		for i := range row {
			if r.IntN(4) > 0 {
				row[i] = r.Float32()
			}
		}
		row[r.IntN(v)] = 0.5 // a positive sum
		return row
	}
	scale := func(rows [][]float32, s float32) [][]float32 {
		out := make([][]float32, len(rows))
		for j, row := range rows {
			out[j] = make([]float32, len(row))
			for i, v := range row {
				out[j][i] = v * s
			}
		}
		return out
	}
	for trial := range 500 {
		v, k := 2+r.IntN(6), r.IntN(4)
		p, q := make([][]float32, k+1), make([][]float32, k)
		draft := make([]int, k)
		for j := range p {
			p[j] = randRow(v)
		}
		for j := range q {
			q[j] = randRow(v)
			draft[j] = drawFrom(q[j], r.Float64())
		}
		u := SeededUniforms(uint64(trial), 0)
		want, wantA, err := RejectionSample(p, q, draft, u)
		if err != nil {
			t.Fatal(err)
		}
		got, gotA, err := RejectionSample(scale(p, 4), scale(q, 0.25), draft, u)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) || gotA != wantA {
			t.Fatalf("trial %d: scaled rows give %v (%d), normalized %v (%d)", trial, got, gotA, want, wantA)
		}
	}
}

// TestResidualOfOneHot: with q one-hot at x the residual max(0, p - q) is p
// without x, renormalized: the law of a draw from p given it is not x. This
// is the step that makes RejectionSample with a deterministic drafter equal
// in law to sample-and-compare (see VerifyGreedy).
func TestResidualOfOneHot(t *testing.T) {
	p := []float32{0.1, 0.4, 0, 0.2, 0.3}
	cases := []struct {
		x    int
		r    float64
		want int
	}{
		// Without token 1 the weights are (0.1, 0, 0.2, 0.3)/0.6.
		{1, 0, 0},
		{1, 0.16, 0},
		{1, 0.17, 3},
		{1, 0.49, 3},
		{1, 0.51, 4},
		{1, 0.999, 4},
		// Without token 4: (0.1, 0.4, 0, 0.2)/0.7.
		{4, 0.14, 0},
		{4, 0.15, 1},
		{4, 0.71, 1},
		{4, 0.72, 3},
		// x of probability 0 under p: the residual is p itself.
		{2, 0.09, 0},
		{2, 0.45, 1},
		{2, 0.75, 4},
	}
	for _, c := range cases {
		q := make([]float32, len(p))
		q[c.x] = 1
		if got := drawResidual(p, q, 1, 1, c.r); got != c.want {
			t.Errorf("x=%d r=%v: residual draw %d, want %d", c.x, c.r, got, c.want)
		}
	}
}

// TestResidualWithoutMass: when p == q the residual has no mass and the
// draw falls back to p.
func TestResidualWithoutMass(t *testing.T) {
	p := []float32{0.25, 0, 0.5, 0.25}
	for _, r := range []float64{0, 0.2, 0.3, 0.74, 0.76, 0.9999} {
		if got, want := drawResidual(p, p, 1, 1, r), drawRow(p, 1, r); got != want {
			t.Errorf("r=%v: residual draw %d, want p's %d", r, got, want)
		}
	}
}

func TestDrawRowEdges(t *testing.T) {
	row := []float32{0, 0.5, 0, 0.5, 0}
	cases := []struct {
		r    float64
		want int
	}{
		{0, 1}, {0.4999, 1}, {0.5, 3}, {0.9999999999999999, 3},
		{1, 3}, // out of range: the last token of positive weight
	}
	for _, c := range cases {
		if got := drawRow(row, 1, c.r); got != c.want {
			t.Errorf("drawRow(%v, r=%v) = %d, want %d", row, c.r, got, c.want)
		}
	}
}

func TestSeededUniforms(t *testing.T) {
	u := SeededUniforms(7, 100)
	seen := map[float64]bool{}
	for pos := range 4 {
		for _, purpose := range []uint64{PurposeAccept, PurposeResample} {
			v := u(pos, purpose)
			if v < 0 || v >= 1 || seen[v] {
				t.Fatalf("u(%d, %d) = %v: out of [0, 1) or repeated", pos, purpose, v)
			}
			seen[v] = true
			if v2 := SeededUniforms(7, 100+uint64(pos))(0, purpose); v2 != v {
				t.Fatalf("u(%d, %d) = %v depends on the step split (%v)", pos, purpose, v, v2)
			}
		}
	}
}
