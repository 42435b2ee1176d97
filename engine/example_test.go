package engine_test

import (
	"fmt"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
)

// A step loop: Schedule plans a step, a model (here a stand-in that
// returns 100 + the position) computes it, ProcessOutputs appends the
// sampled tokens.
func ExampleScheduler() {
	s, err := engine.NewScheduler(engine.SchedulerConfig{
		MaxNumSeqs:           4,
		MaxNumBatchedTokens:  8,
		MaxModelLen:          64,
		EnableChunkedPrefill: true,
		ChunkSize:            4, // a 6-token prompt takes two steps
		BlockSize:            4,
		NumBlocks:            16,
		EOSTokenIDs:          []int{0},
	})
	if err != nil {
		panic(err)
	}
	params := engine.DefaultSamplingParams()
	params.MaxTokens = 3
	if _, err := s.Add(engine.NewSequence("req-1", []int{5, 6, 7, 8, 9, 10}, params, time.Now())); err != nil {
		panic(err)
	}
	for s.HasUnfinished() {
		out, metas := s.Schedule()
		var sampled []engine.SampledTokens
		for _, m := range metas {
			fmt.Printf("step %d %-7v q=%d k=%d slots=%v sample=%v\n", out.StepID, out.Kind, m.SeqlenQ, m.SeqlenK, m.SlotMapping, m.Sample)
			if m.Sample {
				sampled = append(sampled, engine.SampledTokens{SeqID: m.SeqID, TokenIDs: []int{100 + m.SeqlenK}})
			}
		}
		finished, err := s.ProcessOutputs(out.StepID, sampled)
		if err != nil {
			panic(err)
		}
		for _, f := range finished {
			fmt.Println(f.RequestID, f.Reason, f.OutputTokenIDs)
		}
	}
	// Output:
	// step 1 prefill q=4 k=4 slots=[0 1 2 3] sample=false
	// step 2 prefill q=2 k=6 slots=[4 5] sample=true
	// step 3 decode  q=1 k=7 slots=[6] sample=true
	// step 4 decode  q=1 k=8 slots=[7] sample=true
	// req-1 length [106 107 108]
}
