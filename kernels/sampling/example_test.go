package sampling_test

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/sampling"
)

func ExampleSample() {
	logits := []float32{1.0, 3.5, 2.0, 0.5, 3.5}
	// Greedy: argmax, the lower id on ties.
	r := kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1}
	res, err := sampling.Sample(logits, &r, nil)
	fmt.Println(res.Token, err)
	// Output: 1 <nil>
}

// A seeded request draws the same tokens whatever batch its rows are in:
// each draw is keyed by (Seed, Step).
func ExampleSample_seeded() {
	row := []float32{2.0, 1.5, 1.0, 0.5, 0.0, -1.0}
	r := kernels.SampleRow{Temperature: 0.8, TopK: 4, TopP: 0.95, RepetitionPenalty: 1, Seed: 7}
	s := new(sampling.Scratch)
	for step := range uint64(8) {
		logits := append([]float32(nil), row...)
		r.Step = step
		res, err := sampling.Sample(logits, &r, s)
		if err != nil {
			panic(err)
		}
		fmt.Print(res.Token, " ")
	}
	fmt.Println()
	// Output: 3 0 0 0 0 0 2 0
}

// Masks, bias and penalties are edits of single logits: one per token,
// flagged with what applies to it. Here the prompt was [0 1] and the
// output so far [2 2]; token 3 is masked (min_tokens).
func ExampleSample_edits() {
	r := kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 2, FrequencyPenalty: 0.5,
		Edits: []kernels.LogitEdit{
			{Token: 0, Flags: kernels.EditSeen},
			{Token: 1, Flags: kernels.EditSeen | kernels.EditBias, Bias: 1},
			{Token: 2, Flags: kernels.EditSeen, Count: 2},
			{Token: 3, Flags: kernels.EditMask},
		}}
	logits := []float32{4, -1, 3, 2.5}
	res, err := sampling.Sample(logits, &r, nil)
	fmt.Println(logits, res.Token, err)
	// Output: [2 0 0.5 -Inf] 0 <nil>
}

func ExamplePromptLogprobs() {
	logits := []float32{0, 2, 1, 2}
	res, err := sampling.PromptLogprobs(logits, 2, 2)
	if err != nil {
		panic(err)
	}
	fmt.Printf("token %d: logprob %.3f, rank %d\n", res.Token, res.Logprob, res.Rank)
	for _, e := range res.Top {
		fmt.Printf("  %d %.3f\n", e.Token, e.Logprob)
	}
	// Output:
	// token 2: logprob -1.918, rank 3
	//   1 -0.918
	//   3 -0.918
}
