package cuda_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models/ggufwrite"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
)

// A GGUF file (a random Llama written as Q8_0 and as Q4_K_M: Q4_K with
// Q6_K for the LM head and some layers' v and down projections) runs on
// the CUDA backend from its blocks and gives the CPU backend's greedy
// tokens for each of a few prompts (prefill and the four-row decode steps
// on the dequantizing GEMM, in GEMM mode split: float32, as the CPU with
// cpu.activation_rounding none; the CPU's default rounds the activations
// of quantized weights to 8-bit blocks, which CUDA does not).
func TestGPUQuantEngine(t *testing.T) {
	skipWithoutGPU(t)
	dir := t.TempDir()
	spec := random.Llama{Vocab: 512, Hidden: 256, Intermediate: 512, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 64,
		MaxPositions: 512, BOS: 1, EOS: 2}
	if err := random.WriteLlama(dir, spec, 21); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(8, 1))
	prompts := randomPrompts(r, 4, 5, 60, spec.Vocab)
	params := engine.DefaultSamplingParams()
	params.Temperature = 0
	params.MaxTokens = 16
	params.IgnoreEOS = true
	for _, preset := range []string{"q8_0", "q4_k_m"} {
		var buf bytes.Buffer
		if err := ggufwrite.Write(&buf, dir, "", preset); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "model-"+preset+".gguf")
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		run := func(device string) [][]int {
			extra := ""
			if device == "cuda" {
				extra = "cuda: {gemm: split}\n"
			}
			l := newLLM(t, fmt.Sprintf("model: %s\ndevice: %s\ncpu: {threads: 4, activation_rounding: none}\n%scache: {num_blocks: 256, block_size: 16}\npipeline:\n  sample: greedy\n", path, device, extra))
			defer l.Close()
			out, _ := generateTimed(t, l, prompts, params)
			return out
		}
		cpu, gpu := run("cpu"), run("cuda")
		for i := range prompts {
			if !slices.Equal(cpu[i], gpu[i]) {
				t.Errorf("%s: prompt %d (%d tokens): cuda %v, cpu %v", preset, i, len(prompts[i].IDs), gpu[i], cpu[i])
			}
		}
		t.Logf("%s: %d prompts x %d greedy tokens from the blocks on cuda: the cpu's tokens", preset, len(prompts), params.MaxTokens)
	}
}
