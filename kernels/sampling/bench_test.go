package sampling

import (
	"fmt"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// BenchmarkSample reports ns per row for Qwen-like (152064) and Llama-2-like
// (32000) vocabularies; logits are N(0, 2.5^2). The first case is the common
// top_k=50, top_p=0.9 setting; the others show what each path costs. The
// penalties case has a 1000-token prompt and a 200-token output (one edit
// per distinct token) and restores the row before each call, a copy that is
// included in its time.
func BenchmarkSample(b *testing.B) {
	cases := []struct {
		name string
		r    func(vocabSize int) kernels.SampleRow
	}{
		{"top_k=50,top_p=0.9", settings(kernels.SampleRow{Temperature: 0.7, TopK: 50, TopP: 0.9, RepetitionPenalty: 1})},
		{"greedy", settings(kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1})},
		{"temperature", settings(kernels.SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1})},
		{"top_p=0.9", settings(kernels.SampleRow{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1})},
		{"top_k=1000", settings(kernels.SampleRow{Temperature: 1, TopK: 1000, TopP: 1, RepetitionPenalty: 1})},
		{"top_k=50,top_p=0.9,logprobs=5", settings(kernels.SampleRow{Temperature: 0.7, TopK: 50, TopP: 0.9, RepetitionPenalty: 1, Logprobs: true, NumLogprobs: 5})},
		{"penalties,prompt=1000,output=200", func(vocabSize int) kernels.SampleRow {
			in := inputs{prompt: make([]int32, 1000), output: make([]int32, 200)}
			for i := range in.prompt {
				in.prompt[i] = int32((i * 7919) % vocabSize)
			}
			for i := range in.output {
				in.output[i] = int32((i * 104729) % 3000)
			}
			return withEdits(kernels.SampleRow{Temperature: 0.7, TopK: 50, TopP: 0.9, RepetitionPenalty: 1.1, FrequencyPenalty: 0.2, PresencePenalty: 0.1}, in)
		}},
	}
	for _, vocabSize := range []int{32000, 152064} {
		row := randomRow(vocabSize, 2.5, 1)
		for _, c := range cases {
			b.Run(fmt.Sprintf("vocab=%d/%s", vocabSize, c.name), func(b *testing.B) {
				r := c.r(vocabSize)
				s := new(Scratch)
				z := row
				if len(r.Edits) > 0 {
					z = make([]float32, vocabSize)
				}
				for b.Loop() {
					if len(r.Edits) > 0 {
						copy(z, row)
					} // else: no edit, the row is not modified
					if _, err := Sample(z, &r, s); err != nil {
						b.Fatal(err)
					}
					r.Step++
				}
			})
		}
	}
}

// settings returns a benchmark row without edits.
func settings(r kernels.SampleRow) func(int) kernels.SampleRow {
	return func(int) kernels.SampleRow { return r }
}
