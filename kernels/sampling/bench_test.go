package sampling

import (
	"fmt"
	"testing"
)

// BenchmarkSample reports ns per row for Qwen-like (152064) and Llama-2-like
// (32000) vocabularies; logits are N(0, 2.5^2). The first case is the common
// top_k=50, top_p=0.9 setting; the others show what each path costs.
func BenchmarkSample(b *testing.B) {
	cases := []struct {
		name string
		p    Params
	}{
		{"top_k=50,top_p=0.9", Params{Temperature: 0.7, TopK: 50, TopP: 0.9, RepetitionPenalty: 1}},
		{"greedy", Params{TopP: 1, RepetitionPenalty: 1}},
		{"temperature", Params{Temperature: 1, TopP: 1, RepetitionPenalty: 1}},
		{"top_p=0.9", Params{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1}},
		{"top_k=1000", Params{Temperature: 1, TopK: 1000, TopP: 1, RepetitionPenalty: 1}},
		{"top_k=50,top_p=0.9,logprobs=5", Params{Temperature: 0.7, TopK: 50, TopP: 0.9, RepetitionPenalty: 1, Logprobs: true, NumLogprobs: 5}},
	}
	for _, vocabSize := range []int{32000, 152064} {
		row := randomRow(vocabSize, 2.5, 1)
		for _, c := range cases {
			b.Run(fmt.Sprintf("vocab=%d/%s", vocabSize, c.name), func(b *testing.B) {
				s := new(Scratch)
				step := uint64(0)
				for b.Loop() {
					// No mask, bias or penalty: the row is not modified.
					if _, err := Sample(row, &c.p, History{}, step, s); err != nil {
						b.Fatal(err)
					}
					step++
				}
			})
		}
	}
}
