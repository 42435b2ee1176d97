package sampling

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// defaultRow returns vLLM's defaults as a row: temperature 1, no top-k,
// top-p or min-p filtering, no penalties, no edits, seed and step 0.
func defaultRow() kernels.SampleRow {
	return kernels.SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1}
}

// inputs are what a caller resolves into a row's edits, in the plain form
// the references read: the masked ids, the bias map and the token history
// of the prompt and the output.
type inputs struct {
	masked         []int32
	bias           map[int32]float32
	prompt, output []int32
}

// withEdits returns r with the edits of in, as a caller builds them: one
// edit per distinct token id, in order of first appearance among the
// masked ids, the bias ids (ascending), the prompt and the output; every
// token of the history is flagged seen (the sampler ignores the flag when
// the row has no active penalty), with its count in the output.
func withEdits(r kernels.SampleRow, in inputs) kernels.SampleRow {
	r.Edits = nil
	at := map[int32]int{}
	edit := func(t int32) *kernels.LogitEdit {
		k, ok := at[t]
		if !ok {
			k = len(r.Edits)
			at[t] = k
			r.Edits = append(r.Edits, kernels.LogitEdit{Token: t})
		}
		return &r.Edits[k]
	}
	for _, t := range in.masked {
		edit(t).Flags |= kernels.EditMask
	}
	for _, t := range slices.Sorted(maps.Keys(in.bias)) {
		e := edit(t)
		e.Flags |= kernels.EditBias
		e.Bias = in.bias[t]
	}
	for _, t := range in.prompt {
		edit(t).Flags |= kernels.EditSeen
	}
	for _, t := range in.output {
		e := edit(t)
		e.Flags |= kernels.EditSeen
		e.Count++
	}
	return r
}

// refDist is a deliberately plain reference of the filtered distribution that
// a non-greedy row samples from, written straight from vLLM's definitions
// (full softmax, full sorts, masks as -Inf). z is the row after masks, bias
// and penalties; p gives the temperature and the filters. It returns one
// probability per token.
func refDist(z []float32, p *kernels.SampleRow) []float64 {
	n := len(z)
	y := make([]float64, n)
	for i, v := range z {
		y[i] = float64(v) / float64(p.Temperature)
	}
	softmax := func() []float64 {
		m := math.Inf(-1)
		for _, v := range y {
			m = math.Max(m, v)
		}
		pr := make([]float64, n)
		sum := 0.0
		for i, v := range y {
			pr[i] = math.Exp(v - m)
			sum += pr[i]
		}
		for i := range pr {
			pr[i] /= sum
		}
		return pr
	}
	if p.MinP > 0 {
		pr := softmax()
		pmax := 0.0
		for _, v := range pr {
			pmax = math.Max(pmax, v)
		}
		for i, v := range pr {
			if v < float64(p.MinP)*pmax {
				y[i] = math.Inf(-1)
			}
		}
	}
	// Descending by value, ties by lower id.
	order := func() []int {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return y[idx[a]] > y[idx[b]] })
		return idx
	}
	if p.TopK > 0 && p.TopK < n {
		kth := y[order()[p.TopK-1]]
		for i := range y {
			if y[i] < kth {
				y[i] = math.Inf(-1)
			}
		}
	}
	if p.TopP < 1 {
		pr := softmax()
		before := 0.0
		for _, i := range order() {
			if before >= float64(p.TopP) {
				y[i] = math.Inf(-1)
			}
			before += pr[i]
		}
	}
	return softmax()
}

// refProcess applies masks, bias and penalties (p's) to a copy of raw the
// plain way: all masks, then all biases, then the penalties one token at a
// time from the full history, as vLLM's processors do.
func refProcess(raw []float32, p *kernels.SampleRow, in inputs) []float32 {
	z := append([]float32(nil), raw...)
	for _, id := range in.masked {
		z[id] = float32(math.Inf(-1))
	}
	for id, b := range in.bias {
		z[id] += b
	}
	if !p.Penalized() {
		return z
	}
	prompt, output := in.prompt, in.output
	for t := range z {
		inPrompt, count := false, int32(0)
		for _, x := range prompt {
			inPrompt = inPrompt || x == int32(t)
		}
		for _, x := range output {
			if x == int32(t) {
				count++
			}
		}
		if inPrompt || count > 0 {
			if z[t] > 0 {
				z[t] /= p.RepetitionPenalty
			} else {
				z[t] *= p.RepetitionPenalty
			}
		}
		if count > 0 {
			z[t] -= p.FrequencyPenalty * float32(count)
			z[t] -= p.PresencePenalty
		}
	}
	return z
}

// randomRow returns n logits drawn from N(0, scale^2) with a fixed stream.
func randomRow(n int, scale float64, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	z := make([]float32, n)
	for i := range z {
		z[i] = float32(r.NormFloat64() * scale)
	}
	return z
}
