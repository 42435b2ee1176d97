package sampling_test

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels/sampling"
)

func ExampleSample() {
	logits := []float32{1.0, 3.5, 2.0, 0.5, 3.5}
	p := sampling.DefaultParams()
	p.Temperature = 0 // greedy: argmax, the lower id on ties
	res, err := sampling.Sample(logits, &p, sampling.History{}, 0, nil)
	fmt.Println(res.Token, err)
	// Output: 1 <nil>
}

// A seeded request draws the same tokens whatever batch its rows are in:
// each draw is keyed by (seed, step).
func ExampleSample_seeded() {
	row := []float32{2.0, 1.5, 1.0, 0.5, 0.0, -1.0}
	p := sampling.DefaultParams()
	p.Temperature, p.TopK, p.TopP = 0.8, 4, 0.95
	p.Seed, p.Seeded = 7, true
	s := new(sampling.Scratch)
	for step := range uint64(8) {
		logits := append([]float32(nil), row...)
		res, err := sampling.Sample(logits, &p, sampling.History{}, step, s)
		if err != nil {
			panic(err)
		}
		fmt.Print(res.Token, " ")
	}
	fmt.Println()
	// Output: 3 0 0 0 0 0 2 0
}

// Penalties read the request's history; a PenaltyState keeps its counts so
// that long histories are not rescanned at every step.
func ExamplePenaltyState() {
	st := sampling.NewPenaltyState([]int32{0, 1}) // prompt
	st.AppendOutput(2, 2)                         // output so far
	p := sampling.DefaultParams()
	p.Temperature = 0
	p.RepetitionPenalty, p.FrequencyPenalty = 2, 0.5
	logits := []float32{4, -1, 3, 2.5}
	res, err := sampling.Sample(logits, &p, sampling.History{Penalty: st}, 2, nil)
	fmt.Println(logits, res.Token, err)
	// Output: [2 -2 0.5 2.5] 3 <nil>
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
