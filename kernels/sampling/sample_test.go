package sampling

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

var negInf = float32(math.Inf(-1))

func TestGreedy(t *testing.T) {
	tests := []struct {
		name   string
		logits []float32
		r      func(*kernels.SampleRow)
		want   int32
	}{
		{"single max", []float32{0, 2, 1}, nil, 1},
		{"tie lowest id wins", []float32{1, 3, 3, 2}, nil, 1},
		{"all equal", []float32{5, 5, 5, 5}, nil, 0},
		{"negative row", []float32{-3, -1, -2, -1}, nil, 1},
		{"-inf ignored", []float32{negInf, -100, negInf}, nil, 1},
		{"temperature ignored", []float32{0, 1, 4, 2}, func(r *kernels.SampleRow) { r.Temperature = 9e-6 }, 2},
		{"bias makes a tie", []float32{0, 1, 3}, func(r *kernels.SampleRow) { *r = withEdits(*r, inputs{bias: map[int32]float32{1: 2}}) }, 1},
		{"masked max", []float32{0, 1, 3}, func(r *kernels.SampleRow) { *r = withEdits(*r, inputs{masked: []int32{2}}) }, 1},
		{"top-k, top-p, min-p ignored", []float32{0, 1, 3}, func(r *kernels.SampleRow) { r.TopK, r.TopP, r.MinP = 1, 0.1, 0.9 }, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1}
			if tt.r != nil {
				tt.r(&r)
			}
			for step := range uint64(3) {
				r.Step = step
				res, err := Sample(slices.Clone(tt.logits), &r, nil)
				if err != nil {
					t.Fatal(err)
				}
				if res.Token != tt.want {
					t.Fatalf("step %d: token %d, want %d", step, res.Token, tt.want)
				}
			}
		})
	}
}

// TestKnobs checks that masks, bias and each penalty change exactly the
// logits they should, by the formula, and nothing else, whatever the order
// of the edits.
func TestKnobs(t *testing.T) {
	raw := []float32{2, -2, 3, -1, 0.5, 4, -0.5, 1}
	hist := inputs{prompt: []int32{0, 1, 2}, output: []int32{2, 3, 3, 4}}
	tests := []struct {
		name string
		r    func(*kernels.SampleRow, *inputs)
		want []float32
	}{
		{"defaults change nothing", nil, raw},
		{"bias", func(_ *kernels.SampleRow, in *inputs) { in.bias = map[int32]float32{1: 1.5, 7: -3} },
			[]float32{2, -0.5, 3, -1, 0.5, 4, -0.5, -2}},
		{"masked", func(_ *kernels.SampleRow, in *inputs) { in.masked = []int32{5, 0} },
			[]float32{negInf, -2, 3, -1, 0.5, negInf, -0.5, 1}},
		{"repetition: prompt and output, divide positive, multiply negative",
			func(r *kernels.SampleRow, _ *inputs) { r.RepetitionPenalty = 2 },
			[]float32{1, -4, 1.5, -2, 0.25, 4, -0.5, 1}},
		{"repetition below 1 rewards",
			func(r *kernels.SampleRow, _ *inputs) { r.RepetitionPenalty = 0.5 },
			[]float32{4, -1, 6, -0.5, 1, 4, -0.5, 1}},
		{"frequency: output count times penalty",
			func(r *kernels.SampleRow, _ *inputs) { r.FrequencyPenalty = 0.5 },
			[]float32{2, -2, 2.5, -2, 0, 4, -0.5, 1}},
		{"presence: once per output token",
			func(r *kernels.SampleRow, _ *inputs) { r.PresencePenalty = 0.25 },
			[]float32{2, -2, 2.75, -1.25, 0.25, 4, -0.5, 1}},
		{"all penalties: repetition, then frequency, then presence",
			func(r *kernels.SampleRow, _ *inputs) {
				r.RepetitionPenalty, r.FrequencyPenalty, r.PresencePenalty = 2, 1, 0.5
			},
			[]float32{1, -4, 0, -4.5, -1.25, 4, -0.5, 1}},
		{"bias before penalties",
			func(r *kernels.SampleRow, in *inputs) { in.bias = map[int32]float32{1: 4}; r.RepetitionPenalty = 2 },
			[]float32{1, 1, 1.5, -2, 0.25, 4, -0.5, 1}},
		{"masked stays -inf through bias and penalties",
			func(r *kernels.SampleRow, in *inputs) {
				in.masked = []int32{3}
				in.bias = map[int32]float32{3: 50}
				r.RepetitionPenalty, r.FrequencyPenalty = 2, 1
			},
			[]float32{1, -4, 0.5, negInf, -0.75, 4, -0.5, 1}},
	}
	for _, tt := range tests {
		for _, reversed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/reversed=%v", tt.name, reversed), func(t *testing.T) {
				r := kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1}
				in := hist
				if tt.r != nil {
					tt.r(&r, &in)
				}
				r = withEdits(r, in)
				if reversed {
					slices.Reverse(r.Edits)
				}
				z := slices.Clone(raw)
				if _, err := Sample(z, &r, new(Scratch)); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(z, tt.want) {
					t.Fatalf("logits after Sample\n got %v\nwant %v", z, tt.want)
				}
				if ref := refProcess(raw, &r, in); !slices.Equal(z, ref) {
					t.Fatalf("logits after Sample %v, reference %v", z, ref)
				}
			})
		}
	}
}

// TestPenaltyEditsMatchHistory compares the edits of long random histories
// (one per distinct token, in two orders), bit for bit, with the plain
// reference that rescans the whole history for each token.
func TestPenaltyEditsMatchHistory(t *testing.T) {
	const vocabSize = 500
	raw := randomRow(vocabSize, 3, 1)
	r := defaultRow()
	r.Greedy = true
	r.RepetitionPenalty, r.FrequencyPenalty, r.PresencePenalty = 1.3, 0.4, -0.7
	in := inputs{prompt: make([]int32, 300), output: make([]int32, 700)}
	for i := range in.prompt {
		in.prompt[i] = int32((i * 37) % 211)
	}
	for i := range in.output {
		in.output[i] = int32((i*i + 11) % vocabSize)
	}
	want := refProcess(raw, &r, in)
	r = withEdits(r, in)
	reversed := r
	reversed.Edits = slices.Clone(r.Edits)
	slices.Reverse(reversed.Edits)
	s := new(Scratch)
	for round, row := range []kernels.SampleRow{r, r, reversed} { // the second round checks that the check's marks were cleared
		z := slices.Clone(raw)
		if _, err := Sample(z, &row, s); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(z, want) {
			t.Fatalf("round %d: edits differ from the reference", round)
		}
	}
	// The row is only read.
	if !slices.Equal(withEdits(r, in).Edits, r.Edits) {
		t.Fatal("Sample changed the row's edits")
	}
}

// TestRowCheck checks that Sample refuses an invalid row with the shared
// row check's error, naming the field, before it touches the logits.
func TestRowCheck(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name  string
		r     func(*kernels.SampleRow)
		field string
		is    error
	}{
		{"zero temperature of a random row", func(r *kernels.SampleRow) { r.Temperature = 0 }, "temperature", kernels.ErrSampleParams},
		{"negative temperature", func(r *kernels.SampleRow) { r.Temperature = -1 }, "temperature", kernels.ErrSampleParams},
		{"NaN temperature", func(r *kernels.SampleRow) { r.Temperature = nan }, "temperature", kernels.ErrSampleParams},
		{"infinite temperature", func(r *kernels.SampleRow) { r.Temperature = float32(math.Inf(1)) }, "temperature", kernels.ErrSampleParams},
		{"top_k -2", func(r *kernels.SampleRow) { r.TopK = -2 }, "top_k", kernels.ErrSampleParams},
		{"top_p 0", func(r *kernels.SampleRow) { r.TopP = 0 }, "top_p", kernels.ErrSampleParams},
		{"top_p above 1", func(r *kernels.SampleRow) { r.TopP = 1.01 }, "top_p", kernels.ErrSampleParams},
		{"top_p NaN", func(r *kernels.SampleRow) { r.TopP = nan }, "top_p", kernels.ErrSampleParams},
		{"min_p negative", func(r *kernels.SampleRow) { r.MinP = -0.1 }, "min_p", kernels.ErrSampleParams},
		{"min_p above 1", func(r *kernels.SampleRow) { r.MinP = 1.5 }, "min_p", kernels.ErrSampleParams},
		{"repetition 0", func(r *kernels.SampleRow) { r.RepetitionPenalty = 0 }, "repetition_penalty", kernels.ErrSampleParams},
		{"repetition NaN", func(r *kernels.SampleRow) { r.RepetitionPenalty = nan }, "repetition_penalty", kernels.ErrSampleParams},
		{"presence NaN", func(r *kernels.SampleRow) { r.PresencePenalty = nan }, "presence_penalty", kernels.ErrSampleParams},
		{"frequency Inf", func(r *kernels.SampleRow) { r.FrequencyPenalty = float32(math.Inf(-1)) }, "frequency_penalty", kernels.ErrSampleParams},
		{"num_logprobs negative", func(r *kernels.SampleRow) { r.Logprobs, r.NumLogprobs = true, -1 }, "num_logprobs", kernels.ErrSampleParams},
		{"num_logprobs without logprobs", func(r *kernels.SampleRow) { r.NumLogprobs = 2 }, "num_logprobs", kernels.ErrSampleParams},
		{"bias NaN", func(r *kernels.SampleRow) { *r = withEdits(*r, inputs{bias: map[int32]float32{1: nan}}) }, "bias", kernels.ErrSampleParams},
		{"bias id too large", func(r *kernels.SampleRow) { *r = withEdits(*r, inputs{bias: map[int32]float32{8: 1}}) }, "token id 8", kernels.ErrOutOfRange},
		{"bias id negative", func(r *kernels.SampleRow) { *r = withEdits(*r, inputs{bias: map[int32]float32{-1: 1}}) }, "token id -1", kernels.ErrOutOfRange},
		{"masked id too large", func(r *kernels.SampleRow) { *r = withEdits(*r, inputs{masked: []int32{0, 8}}) }, "edits[1]", kernels.ErrOutOfRange},
		{"two edits of one token", func(r *kernels.SampleRow) {
			r.Edits = []kernels.LogitEdit{{Token: 3, Flags: kernels.EditMask}, {Token: 3, Flags: kernels.EditSeen}}
		}, "appears twice", kernels.ErrSampleParams},
		{"negative count", func(r *kernels.SampleRow) {
			r.Edits = []kernels.LogitEdit{{Token: 3, Count: -1, Flags: kernels.EditSeen}}
		}, "count", kernels.ErrSampleParams},
		{"unknown flag", func(r *kernels.SampleRow) { r.Edits = []kernels.LogitEdit{{Token: 3, Flags: 1 << 5}} }, "flags", kernels.ErrSampleParams},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := defaultRow()
			tt.r(&r)
			logits := []float32{1, 2, 3, 4, 5, 6, 7, 8}
			_, err := Sample(logits, &r, nil)
			if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %v, want one naming %q and wrapping %v", err, tt.field, tt.is)
			}
			if !strings.HasPrefix(err.Error(), "sampling: row: ") {
				t.Fatalf("error %q does not name the sampler's row", err)
			}
			if !slices.Equal(logits, []float32{1, 2, 3, 4, 5, 6, 7, 8}) {
				t.Fatal("an invalid row modified the logits")
			}
		})
	}
	r := defaultRow()
	if _, err := Sample(make([]float32, 8), &r, nil); err != nil {
		t.Fatalf("the default row is invalid: %v", err)
	}
	var zero kernels.SampleRow
	if _, err := Sample(make([]float32, 8), &zero, nil); !errors.Is(err, kernels.ErrSampleParams) {
		t.Fatalf("the zero row: %v, want %v", err, kernels.ErrSampleParams)
	}
}

func TestRowErrors(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	random := defaultRow()
	greedy := kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1}
	logprobs := func(r kernels.SampleRow) kernels.SampleRow { r.Logprobs = true; return r }
	penalized := func(r kernels.SampleRow) kernels.SampleRow { r.RepetitionPenalty = 2; return r }
	tests := []struct {
		name   string
		logits []float32
		r      kernels.SampleRow
		is     error
	}{
		{"empty row", nil, random, ErrInvalidLogits},
		{"NaN", []float32{0, nan, 1}, random, ErrInvalidLogits},
		{"NaN greedy", []float32{0, 1, nan}, greedy, ErrInvalidLogits},
		{"+Inf", []float32{0, inf, 1}, random, ErrInvalidLogits},
		{"masked NaN with logprobs", []float32{0, nan, 1}, logprobs(withEdits(random, inputs{masked: []int32{1}})), ErrInvalidLogits},
		{"masked +Inf with logprobs", []float32{0, inf, 1}, logprobs(withEdits(random, inputs{masked: []int32{1}})), ErrInvalidLogits},
		{"all -Inf", []float32{negInf, negInf}, random, ErrNoCandidates},
		{"all masked", []float32{1, 2}, withEdits(random, inputs{masked: []int32{0, 1}}), ErrNoCandidates},
		{"prompt id out of range", []float32{1, 2}, withEdits(penalized(random), inputs{prompt: []int32{0, 2}}), kernels.ErrOutOfRange},
		{"output id out of range", []float32{1, 2}, withEdits(penalized(random), inputs{output: []int32{-1}}), kernels.ErrOutOfRange},
		{"seen id out of range without penalties", []float32{1, 2}, withEdits(random, inputs{prompt: []int32{5}}), kernels.ErrOutOfRange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Sample(tt.logits, &tt.r, nil)
			if !errors.Is(err, tt.is) {
				t.Fatalf("error %v, want %v", err, tt.is)
			}
		})
	}
	// A masked NaN is not an error when logprobs are off: it is never read.
	r := withEdits(defaultRow(), inputs{masked: []int32{1}})
	if _, err := Sample([]float32{0, nan, 1}, &r, nil); err != nil {
		t.Fatalf("masked NaN without logprobs: %v", err)
	}
	// A failed check leaves the scratch clean for the next call.
	s := new(Scratch)
	r = withEdits(penalized(greedy), inputs{prompt: []int32{0, 2, 7}})
	if _, err := Sample([]float32{1, 2, 3}, &r, s); err == nil {
		t.Fatal("want an error")
	}
	r = withEdits(penalized(greedy), inputs{prompt: []int32{2, 0}})
	r.Edits = append(r.Edits, kernels.LogitEdit{Token: 2})
	if _, err := Sample([]float32{1, 2, 3}, &r, s); !errors.Is(err, kernels.ErrSampleParams) {
		t.Fatalf("duplicate edit: %v", err)
	}
	z := []float32{1, 2, 3}
	r = withEdits(penalized(greedy), inputs{prompt: []int32{0, 2}})
	if _, err := Sample(z, &r, s); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(z, []float32{0.5, 2, 1.5}) {
		t.Fatalf("stale marks in the scratch: %v", z)
	}
}

// TestFilterMatchesReference compares the survivors and their probabilities
// with the plain reference, on rows large enough for the radix top-k and the
// binned top-p, with ties and -Inf entries.
func TestFilterMatchesReference(t *testing.T) {
	rowTies := randomRow(3000, 2, 7)
	for i := range rowTies {
		rowTies[i] = float32(math.Round(float64(rowTies[i])*4) / 4) // many ties
	}
	rowInf := randomRow(3000, 4, 8)
	for i := 0; i < len(rowInf); i += 3 {
		rowInf[i] = negInf
	}
	rows := map[string][]float32{
		"normal": randomRow(3000, 3, 6),
		"ties":   rowTies,
		"-inf":   rowInf,
		"flat":   randomRow(3000, 0.01, 9),
	}
	params := []kernels.SampleRow{
		{Temperature: 1, TopP: 1, RepetitionPenalty: 1},
		{Temperature: 0.7, TopP: 1, RepetitionPenalty: 1, TopK: 1},
		{Temperature: 0.7, TopP: 1, RepetitionPenalty: 1, TopK: 40},
		{Temperature: 1.3, TopP: 1, RepetitionPenalty: 1, TopK: 700},    // radix select
		{Temperature: 1, TopP: 1, RepetitionPenalty: 1, TopK: 2999},     // radix, keeps nearly all
		{Temperature: 1, TopP: 1, RepetitionPenalty: 1, TopK: heapMaxK}, // largest heap
		{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1},               // binned top-p
		{Temperature: 0.5, TopP: 0.3, RepetitionPenalty: 1},             // few survivors
		{Temperature: 1, TopP: 0.999, RepetitionPenalty: 1},             // nearly all survive
		{Temperature: 2, TopP: 1, RepetitionPenalty: 1, MinP: 0.2},      // min-p
		{Temperature: 1, TopP: 1, RepetitionPenalty: 1, MinP: 1},        // only the max (and ties)
		{Temperature: 0.8, TopP: 0.8, RepetitionPenalty: 1, TopK: 50, MinP: 0.01},
		{Temperature: 0.8, TopP: 0.95, RepetitionPenalty: 1, TopK: 1000, MinP: 0.001},
		{Temperature: 1e-5, TopP: 0.5, RepetitionPenalty: 1}, // smallest random temperature
	}
	s := new(Scratch)
	for name, row := range rows {
		for _, p := range params {
			t.Run(fmt.Sprintf("%s/T=%v,k=%d,p=%v,minp=%v", name, p.Temperature, p.TopK, p.TopP, p.MinP), func(t *testing.T) {
				want := refDist(row, &p)
				best, err := argmax(row)
				if err != nil {
					t.Fatal(err)
				}
				c := s.filter(row, float64(row[best]), &p)
				got := make([]float64, len(row))
				total := 0.0
				for _, e := range c {
					total += e.w
				}
				for _, e := range c {
					if got[e.id] != 0 {
						t.Fatalf("token %d survives twice", e.id)
					}
					got[e.id] = e.w / total
				}
				for i := range want {
					if (want[i] > 0) != (got[i] > 0) {
						t.Fatalf("token %d (logit %v): probability %g, reference %g", i, row[i], got[i], want[i])
					}
					if math.Abs(got[i]-want[i]) > 1e-9 {
						t.Fatalf("token %d: probability %g, reference %g", i, got[i], want[i])
					}
				}
			})
		}
	}
}

func TestKthLargest(t *testing.T) {
	rows := [][]float32{
		randomRow(1000, 1, 3),
		{3, 1, 2, 3, 3, negInf, float32(math.Copysign(0, -1)), 0, 5, negInf},
		{negInf, negInf, negInf},
		{float32(math.Copysign(0, -1)), 0, -1e-30, 1e-30, math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32},
	}
	for ri, row := range rows {
		sorted := slices.Clone(row)
		slices.Sort(sorted)
		slices.Reverse(sorted)
		for k := 1; k <= len(row); k++ {
			s := new(Scratch)
			want := sorted[k-1]
			if got := s.kthLargestHeap(row, k); got != want {
				t.Fatalf("row %d k=%d: heap %v, want %v", ri, k, got, want)
			}
			if got := s.kthLargestRadix(row, k); got != want {
				t.Fatalf("row %d k=%d: radix %v, want %v", ri, k, got, want)
			}
		}
	}
}

func TestDeterminism(t *testing.T) {
	row := randomRow(1000, 0.5, 11) // nearly flat: draws spread widely
	p := defaultRow()
	p.Seed = 42
	sample := func(p *kernels.SampleRow, step uint64) int32 {
		r := *p
		r.Step = step
		res, err := Sample(slices.Clone(row), &r, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Token
	}
	var tokens []int32
	for step := range uint64(50) {
		a, b := sample(&p, step), sample(&p, step)
		if a != b {
			t.Fatalf("step %d: %d then %d", step, a, b)
		}
		tokens = append(tokens, a)
	}
	slices.Sort(tokens)
	if n := len(slices.Compact(tokens)); n < 40 {
		t.Fatalf("50 steps gave only %d distinct tokens over a near-uniform row of 1000", n)
	}
	q := p
	q.Seed = 43
	same := 0
	for step := range uint64(50) {
		if sample(&p, step) == sample(&q, step) {
			same++
		}
	}
	if same > 5 {
		t.Fatalf("seeds 42 and 43 agree on %d of 50 steps", same)
	}
}

// TestBatchInvariance samples a row alone and inside batches of 7 other rows
// (other params, penalties, logprobs) sharing one scratch, in several orders
// and from several goroutines: the result must be identical.
func TestBatchInvariance(t *testing.T) {
	const vocabSize = 4000
	type row struct {
		logits []float32
		r      kernels.SampleRow
	}
	mk := func(i int) row {
		r := defaultRow()
		r.Seed = uint64(1000 + i)
		r.Temperature = 0.6 + 0.1*float32(i)
		r.TopK = []int{0, 50, 400, -1}[i%4]
		r.TopP = []float32{1, 0.9, 0.7}[i%3]
		r.MinP = []float32{0, 0.05}[i%2]
		r.RepetitionPenalty = 1.1
		r.FrequencyPenalty = 0.2
		r.Logprobs, r.NumLogprobs = true, i%5
		if i == 3 {
			r.Greedy = true
		}
		r.Step = uint64(i * 17)
		return row{
			logits: randomRow(vocabSize, 2.5, uint64(100+i)),
			r:      withEdits(r, inputs{prompt: []int32{int32(i), 7, 9}, output: []int32{int32(i * 3), 11}}),
		}
	}
	rows := make([]row, 8)
	for i := range rows {
		rows[i] = mk(i)
	}
	run := func(r row, s *Scratch) Result {
		res, err := Sample(slices.Clone(r.logits), &r.r, s)
		if err != nil {
			t.Error(err)
		}
		res.Top = slices.Clone(res.Top) // Top aliases the scratch
		return res
	}
	alone := make([]Result, len(rows))
	for i, r := range rows {
		alone[i] = run(r, nil)
	}
	orders := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {7, 6, 5, 4, 3, 2, 1, 0}, {3, 0, 7, 1, 6, 2, 5, 4}}
	for _, order := range orders {
		s := new(Scratch)
		for _, i := range order {
			if got := run(rows[i], s); !equalResult(got, alone[i]) {
				t.Fatalf("row %d in batch order %v: %+v, alone %+v", i, order, got, alone[i])
			}
		}
	}
	var wg sync.WaitGroup
	got := make([]Result, len(rows))
	for i := range rows {
		wg.Go(func() { got[i] = run(rows[i], new(Scratch)) })
	}
	wg.Wait()
	for i := range rows {
		if !equalResult(got[i], alone[i]) {
			t.Fatalf("row %d concurrently: %+v, alone %+v", i, got[i], alone[i])
		}
	}
}

func equalResult(a, b Result) bool {
	return a.Token == b.Token && a.Logprob == b.Logprob && a.Rank == b.Rank && slices.Equal(a.Top, b.Top)
}

func TestLogprobs(t *testing.T) {
	const vocabSize = 2000
	raw := randomRow(vocabSize, 3, 21)
	raw[5], raw[6] = raw[7], raw[7] // ties
	p := defaultRow()
	p.Temperature, p.TopK, p.Seed, p.Step = 0.8, 20, 5, 3
	p.RepetitionPenalty = 1.5
	p.Logprobs, p.NumLogprobs = true, vocabSize
	p = withEdits(p, inputs{
		bias:   map[int32]float32{10: 3},
		masked: []int32{int32(slices.Index(raw, slices.Max(raw)))},
		prompt: []int32{1, 2, 3},
	})
	res, err := Sample(slices.Clone(raw), &p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Top) != vocabSize {
		t.Fatalf("%d top entries, want %d", len(res.Top), vocabSize)
	}
	// Raw logprobs: the distribution of the unprocessed row sums to one.
	sum := 0.0
	seen := make(map[int32]bool)
	for i, e := range res.Top {
		sum += math.Exp(float64(e.Logprob))
		seen[e.Token] = true
		if i > 0 && !better(res.Top[i-1], e) {
			t.Fatalf("entries %d and %d out of order: %+v %+v", i-1, i, res.Top[i-1], e)
		}
	}
	if math.Abs(sum-1) > 1e-5 || len(seen) != vocabSize {
		t.Fatalf("sum of probabilities %v over %d distinct tokens", sum, len(seen))
	}
	// They are the raw row's, unaffected by mask, bias, penalties, temperature.
	ref, err := PromptLogprobs(raw, res.Token, vocabSize)
	if err != nil {
		t.Fatal(err)
	}
	if !equalResult(res, ref) {
		t.Fatalf("Sample logprobs differ from PromptLogprobs of the raw row")
	}
	lse := 0.0
	for _, v := range raw {
		lse += math.Exp(float64(v))
	}
	lse = math.Log(lse)
	if want := float64(raw[res.Token]) - lse; math.Abs(float64(res.Logprob)-want) > 1e-5 {
		t.Fatalf("logprob %v, want %v", res.Logprob, want)
	}
	if res.Top[res.Rank-1].Logprob != res.Logprob {
		t.Fatalf("rank %d does not point at the token's logprob", res.Rank)
	}
	// Top-N is the prefix of the full list, and ties go to the lower id.
	for _, n := range []int{0, 1, 3, 50} {
		q := p
		q.NumLogprobs = n
		got, err := Sample(slices.Clone(raw), &q, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.Token != res.Token || !slices.Equal(got.Top, res.Top[:n]) {
			t.Fatalf("n=%d: top %v, want %v", n, got.Top, res.Top[:n])
		}
	}
	tie, err := PromptLogprobs([]float32{1, 3, 3, 2}, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	if ids := []int32{tie.Top[0].Token, tie.Top[1].Token, tie.Top[2].Token, tie.Top[3].Token}; !slices.Equal(ids, []int32{1, 2, 3, 0}) || tie.Rank != 2 {
		t.Fatalf("tie order %v rank %d, want [1 2 3 0] rank 2", ids, tie.Rank)
	}
	// Without Logprobs nothing is reported.
	q := p
	q.Logprobs, q.NumLogprobs = false, 0
	if got, err := Sample(slices.Clone(raw), &q, nil); err != nil || !equalResult(got, Result{Token: res.Token}) {
		t.Fatalf("no logprobs: %+v, %v", got, err)
	}
	for _, bad := range []struct {
		next int32
		n    int
		is   error
	}{{-1, 1, kernels.ErrOutOfRange}, {vocabSize, 1, kernels.ErrOutOfRange}, {0, -1, kernels.ErrSampleParams}} {
		if _, err := PromptLogprobs(raw, bad.next, bad.n); !errors.Is(err, bad.is) {
			t.Fatalf("PromptLogprobs(%d, %d): %v, want %v", bad.next, bad.n, err, bad.is)
		}
	}
	if _, err := PromptLogprobs(nil, 0, 1); !errors.Is(err, ErrInvalidLogits) {
		t.Fatalf("PromptLogprobs of an empty row: %v", err)
	}
	if _, err := PromptLogprobs([]float32{negInf, negInf}, 0, 1); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("PromptLogprobs of an all -Inf row: %v", err)
	}
}

func TestNoAllocations(t *testing.T) {
	row := randomRow(5000, 3, 31)
	cases := map[string]kernels.SampleRow{
		"greedy":               {Greedy: true, TopP: 1, RepetitionPenalty: 1},
		"top-k top-p logprobs": {Temperature: 0.7, TopK: 50, TopP: 0.9, RepetitionPenalty: 1, Logprobs: true, NumLogprobs: 5},
		"top-p radix min-p":    {Temperature: 1, TopK: 1000, TopP: 0.95, MinP: 0.01, RepetitionPenalty: 1},
		"penalties": withEdits(kernels.SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1.2, FrequencyPenalty: 0.5},
			inputs{prompt: []int32{1, 2}, output: []int32{3, 3}}),
		"penalties, bias, mask": withEdits(kernels.SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1.2},
			inputs{masked: []int32{9}, bias: map[int32]float32{7: 1}, prompt: []int32{1, 2, 3}, output: []int32{4, 4, 5}}),
	}
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			s := new(Scratch)
			z := slices.Clone(row)
			call := func() {
				copy(z, row)
				if _, err := Sample(z, &r, s); err != nil {
					t.Fatal(err)
				}
				r.Step++
			}
			call() // grow the scratch
			if n := testing.AllocsPerRun(20, call); n != 0 {
				t.Fatalf("%v allocations per call", n)
			}
		})
	}
	if n := testing.AllocsPerRun(100, func() { Uniform(1, 2, 3) }); n != 0 {
		t.Fatalf("Uniform: %v allocations per call", n)
	}
}

func TestTinyRows(t *testing.T) {
	tests := []struct {
		name   string
		logits []float32
		r      kernels.SampleRow
		want   int32
		top    int
	}{
		{"one token, random", []float32{0.3}, kernels.SampleRow{Temperature: 1, TopP: 0.5, TopK: 1, MinP: 1, RepetitionPenalty: 1}, 0, 0},
		{"one token, greedy, logprobs clamped", []float32{-7}, kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1, Logprobs: true, NumLogprobs: 20}, 0, 1},
		{"only one finite", []float32{negInf, negInf, 2, negInf}, kernels.SampleRow{Temperature: 5, TopP: 1, RepetitionPenalty: 1}, 2, 0},
		{"top_k above the vocabulary", []float32{negInf, 1}, kernels.SampleRow{Temperature: 1, TopK: 10, TopP: 1, RepetitionPenalty: 1}, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for step := range uint64(20) {
				tt.r.Step = step
				res, err := Sample(slices.Clone(tt.logits), &tt.r, nil)
				if err != nil {
					t.Fatal(err)
				}
				if res.Token != tt.want || len(res.Top) != tt.top {
					t.Fatalf("step %d: token %d with %d top entries, want %d with %d", step, res.Token, len(res.Top), tt.want, tt.top)
				}
				if tt.r.Logprobs && (res.Logprob != 0 || res.Rank != 1) {
					t.Fatalf("single token: logprob %v rank %d, want 0 and 1", res.Logprob, res.Rank)
				}
			}
		})
	}
}

// TestTopPBoundary drives topP directly with hand-made masses at the limit,
// where the bin shortcut must fall back to sorting, and compares with the
// definition: a token is kept when the mass before it is below the limit.
func TestTopPBoundary(t *testing.T) {
	definition := func(c []cand, total, topP float64) []int32 {
		c = slices.Clone(c)
		slices.SortFunc(c, func(a, b cand) int {
			if a.z != b.z {
				if a.z > b.z {
					return -1
				}
				return 1
			}
			return int(a.id - b.id)
		})
		var kept []int32
		before := 0.0
		for _, e := range c {
			if before < topP*total {
				kept = append(kept, e.id)
			}
			before += e.w
		}
		return kept
	}
	tests := []struct {
		name string
		c    []cand
		topP float64
		want []int32
	}{
		{"mass before equals the limit", []cand{{0, 0, 1}, {-1, 1, 1}}, 0.5, []int32{0}},
		{"mass before just below the limit", []cand{{0, 0, 1 - 1e-12}, {-1, 1, 1 + 1e-12}}, 0.5, []int32{0, 1}},
		{"earlier bins just above the limit", []cand{{0, 0, 1 + 1e-12}, {-1, 1, 1 - 1e-12}}, 0.5, []int32{0}},
		{"ties across ids", []cand{{-1, 3, 1}, {0, 5, 1}, {-1, 1, 1}, {-1, 2, 1}}, 0.6, []int32{1, 2, 5}},
		{"last bin kept", []cand{{0, 0, 1}, {-100, 1, 1e-9}, {-200, 2, 1e-9}}, 1 - 1e-10, []int32{0, 1, 2}},
		{"last bin cut inside", []cand{{0, 0, 1}, {-100, 1, 1e-9}, {-200, 2, 1e-9}}, 1 - 1.5e-9, []int32{0, 1}},
		{"many bins kept surely", []cand{{0, 4, 0.3}, {-0.5, 3, 0.2}, {-1, 2, 0.2}, {-2, 1, 0.2}, {-3, 0, 0.1}}, 0.75, []int32{4, 3, 2, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			total := 0.0
			for _, e := range tt.c {
				total += e.w
			}
			if def := definition(tt.c, total, tt.topP); !slices.Equal(slices.Sorted(slices.Values(def)), slices.Sorted(slices.Values(tt.want))) {
				t.Fatalf("test table: definition gives %v, table says %v", def, tt.want)
			}
			got := topP(slices.Clone(tt.c), total, 0, 1, tt.topP)
			var ids []int32
			for _, e := range got {
				ids = append(ids, e.id)
			}
			slices.Sort(ids)
			want := slices.Sorted(slices.Values(tt.want))
			if !slices.Equal(ids, want) {
				t.Fatalf("kept %v, want %v", ids, want)
			}
		})
	}
}
