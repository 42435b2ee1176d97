package llm_test

import (
	"context"
	"fmt"
	"os"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/llm"
)

// Generate greedy continuations of two token-id prompts with a small
// random-weight Llama written to a temporary directory.
func ExampleLLM_Generate() {
	dir, _ := os.MkdirTemp("", "tiny-llama")
	defer os.RemoveAll(dir)
	if err := random.WriteLlama(dir, random.TinyLlama, 7); err != nil {
		fmt.Println(err)
		return
	}
	cfg := config.Default()
	cfg.Model = dir
	cfg.Cache.NumBlocks = 64
	l, err := llm.NewLLM(&cfg, llm.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()

	params := engine.DefaultSamplingParams()
	params.Temperature, params.MaxTokens, params.IgnoreEOS = 0, 5, true
	res, err := l.Generate(context.Background(), []llm.Prompt{{IDs: []int{3, 4, 5}}, {IDs: []int{9, 9}}}, params, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range res {
		fmt.Println(len(c.Outputs[0].TokenIDs), c.Outputs[0].FinishReason)
	}
	// Output:
	// 5 length
	// 5 length
}
