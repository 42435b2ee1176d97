package typical_test

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/examples/internal/exampletest"
	"github.com/deepinfer/deepinfer-go/examples/typical"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// registry returns a clone of the default registry (the built-in stages)
// with the sampler added: each test gets its own, and the process-wide
// registry is never changed.
func registry() *pipeline.Registry {
	reg := pipeline.DefaultRegistry().Clone()
	typical.Register(reg)
	return reg
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		o       typical.Options
		wantErr string
	}{
		{typical.DefaultOptions(), ""},
		{typical.Options{TypicalP: 1, MinTokensToKeep: 1}, ""},
		{typical.Options{TypicalP: 0, MinTokensToKeep: 1}, "typical_p must be in (0, 1]"},
		{typical.Options{TypicalP: 1.5, MinTokensToKeep: 1}, "typical_p must be in (0, 1]"},
		{typical.Options{TypicalP: math.NaN(), MinTokensToKeep: 1}, "typical_p must be in (0, 1]"},
		{typical.Options{TypicalP: 0.5, MinTokensToKeep: 0}, "min_tokens_to_keep must be >= 1"},
	}
	for _, tc := range tests {
		err := tc.o.Validate()
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%+v: Validate() = %v, want %q", tc.o, err, tc.wantErr)
		}
	}
}

// TestFilter checks typical sets worked out by hand. For p = (0.5, 0.3,
// 0.15, 0.05) the entropy is 1.1421 nats and the surprisals 0.693, 1.204,
// 1.897 and 2.996, so by closeness to the entropy the order is 1, 0, 2, 3
// with masses 0.3, 0.5, 0.15, 0.05.
func TestFilter(t *testing.T) {
	probs := []float64{0.5, 0.3, 0.15, 0.05}
	logits := make([]float32, len(probs))
	for i, p := range probs {
		logits[i] = float32(math.Log(p))
	}
	negInf := float32(math.Inf(-1))
	tests := []struct {
		name     string
		logits   []float32
		temp     float32
		p        float64
		minKeep  int
		wantMask []int32
	}{
		{"one token reaches the mass", logits, 1, 0.2, 1, []int32{0, 2, 3}},
		{"two tokens", logits, 1, 0.5, 1, []int32{2, 3}},
		{"three tokens", logits, 1, 0.9, 1, []int32{3}},
		{"min keep", logits, 1, 0.2, 3, []int32{3}},
		{"everything", logits, 1, 1, 1, nil},
		{"-Inf tokens are not listed", []float32{logits[0], negInf, logits[1], logits[2], logits[3]}, 1, 0.2, 1, []int32{0, 3, 4}},
		// At temperature 1/2 the distribution is p^2 normalized: (0.685,
		// 0.247, 0.062, 0.007), entropy 0.810, surprisals 0.379, 1.400,
		// 2.787, 4.983: order 0, 1, 2, 3, and token 0 alone has 0.685.
		{"temperature", logits, 0.5, 0.6, 1, []int32{1, 2, 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := typical.Filter{TypicalP: tc.p, MinKeep: tc.minKeep}
			got := f.Outside(nil, tc.logits, tc.temp)
			slices.Sort(got)
			if !slices.Equal(got, tc.wantMask) {
				t.Errorf("Outside = %v, want %v", got, tc.wantMask)
			}
		})
	}
}

// pipelineYAML selects the sampler with the given options.
func pipelineYAML(typicalP float64, minKeep int) string {
	return fmt.Sprintf("{sample: typical, options: {sample: {typical_p: %g, min_tokens_to_keep: %d}}}", typicalP, minKeep)
}

// TestSameAsBuiltin runs requests through the built-in sample stage and
// through the typical sampler where the two are the same function, with
// zero-overhead scheduling off and on, and wants identical tokens,
// logprobs and prompt logprobs. Why each case is an equivalence:
//   - typical_p = 1 turns the filter off, and the stage then calls
//     sampling.Sample with the row the built-in stage builds (sampleRow is
//     the built-in's conversion),
//     on the same rows: the built-in samples on the host on the CPU
//     backend (it has no device sampler, checked below), so the draws are
//     the same bits, whatever the temperature, filters and penalties;
//   - greedy requests never go through the filter (their typical set at
//     temperature -> 0 is the argmax), so any typical_p gives the argmax;
//   - a set of at least the whole vocabulary (min_tokens_to_keep >= V)
//     masks nothing, so the filter runs and changes no draw.
func TestSameAsBuiltin(t *testing.T) {
	if _, ok := any(&cpu.Backend{}).(kernels.DeviceSampler); ok {
		t.Fatal("the CPU backend samples on the device: the built-in sampler's host path is no longer the reference")
	}
	reg := registry()
	dir := exampletest.Model(t)
	full := exampletest.Params(10, 0.9, 7)
	full.N, full.TopK, full.TopP, full.MinP = 2, 40, 0.95, 0.02
	full.RepetitionPenalty, full.PresencePenalty, full.FrequencyPenalty = 1.3, 0.2, 0.1
	full.MinTokens, full.IgnoreEOS = 4, false
	full.LogitBias = map[int]float32{50: 2, 51: -3}
	three, two := 3, 2
	full.Logprobs, full.PromptLogprobs = &three, &two
	tests := []struct {
		name     string
		pipeline string
		params   engine.SamplingParams
	}{
		{"typical_p 1, greedy", pipelineYAML(1, 1), exampletest.Params(12, 0, 1)},
		{"typical_p 1, every setting", pipelineYAML(1, 1), full},
		{"typical_p 0.2, greedy", pipelineYAML(0.2, 1), exampletest.Params(12, 0, 1)},
		{"whole vocabulary kept", pipelineYAML(0.01, 1000), full},
	}
	for _, zos := range []bool{false, true} {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("zos=%v/%s", zos, tc.name), func(t *testing.T) {
				want := exampletest.Generate(t, exampletest.Config(t, dir, "", zos), reg, exampletest.Prompts(), tc.params)
				got := exampletest.Generate(t, exampletest.Config(t, dir, tc.pipeline, zos), reg, exampletest.Prompts(), tc.params)
				compare(t, got, want)
			})
		}
	}
}

// compare wants the same tokens, logprobs and prompt logprobs.
func compare(t *testing.T, got, want []llm.Completion) {
	t.Helper()
	for i := range want {
		if !reflect.DeepEqual(got[i].PromptLogprobs, want[i].PromptLogprobs) {
			t.Errorf("prompt %d: prompt logprobs differ:\n got %v\nwant %v", i, got[i].PromptLogprobs, want[i].PromptLogprobs)
		}
		for j := range want[i].Outputs {
			g, w := got[i].Outputs[j], want[i].Outputs[j]
			if !slices.Equal(g.TokenIDs, w.TokenIDs) || g.FinishReason != w.FinishReason {
				t.Errorf("prompt %d output %d: tokens %v (%s), built-in %v (%s)", i, j, g.TokenIDs, g.FinishReason, w.TokenIDs, w.FinishReason)
			}
			if !reflect.DeepEqual(g.Logprobs, w.Logprobs) {
				t.Errorf("prompt %d output %d: logprobs differ", i, j)
			}
		}
	}
}

// TestFilterActs shows the filter at work at temperature 1: with a tiny
// typical_p the set is the single most typical token, so the draw no
// longer depends on the seed (the built-in sampler's does), and that token
// is not the argmax (greedy's). Its tokens are also the same with
// zero-overhead scheduling off and on: a draw depends on (seed, position)
// and the penalty history, which the stage completes with the pending
// tokens of the step before.
func TestFilterActs(t *testing.T) {
	reg := registry()
	dir := exampletest.Model(t)
	onlyOne := pipelineYAML(1e-6, 1)
	run := func(pipeline string, zos bool, temp float32, seed int64) [][]int {
		p := exampletest.Params(12, temp, seed)
		p.RepetitionPenalty = 1.1
		return exampletest.Tokens(exampletest.Generate(t, exampletest.Config(t, dir, pipeline, zos), reg, exampletest.Prompts(), p))
	}
	var byZOS [][][]int
	for _, zos := range []bool{false, true} {
		t.Run(fmt.Sprintf("zos=%v", zos), func(t *testing.T) {
			seed1, seed2 := run(onlyOne, zos, 1, 1), run(onlyOne, zos, 1, 2)
			if !reflect.DeepEqual(seed1, seed2) {
				t.Errorf("a one-token typical set still depends on the seed:\n%v\n%v", seed1, seed2)
			}
			if b1, b2 := run("", zos, 1, 1), run("", zos, 1, 2); reflect.DeepEqual(b1, b2) {
				t.Errorf("the built-in sampler's draws do not depend on the seed here, the check above shows nothing: %v", b1)
			}
			if greedy := run("", zos, 0, 1); reflect.DeepEqual(seed1, greedy) {
				t.Errorf("typical tokens are the greedy ones: %v", greedy)
			}
			wide := run(pipelineYAML(0.5, 1), zos, 1, 3)
			if reflect.DeepEqual(wide, run("", zos, 1, 3)) {
				t.Errorf("typical_p 0.5 draws as the built-in sampler: %v", wide)
			}
			byZOS = append(byZOS, seed1, wide)
		})
	}
	if len(byZOS) == 4 && (!reflect.DeepEqual(byZOS[0], byZOS[2]) || !reflect.DeepEqual(byZOS[1], byZOS[3])) {
		t.Errorf("tokens differ with ZOS off and on:\noff %v\non  %v", byZOS[:2], byZOS[2:])
	}
}

// TestCommandLine runs the command line of cmd/typical (cli with the
// sampler registered) on the example's config: the graph names the
// sampler and generate runs it.
func TestCommandLine(t *testing.T) {
	reg := registry()
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"graph", "--config", "config.yaml"}, []string{"sample=typical"}},
		{[]string{"generate", "--config", "config.yaml", "-n", "4", "-t", "0.8", "--seed", "1", "-p", "func main() {"}, []string{"func main() {", "stats: "}},
	}
	for _, tc := range tests {
		t.Run(tc.args[0], func(t *testing.T) {
			out := exampletest.Command(t, reg, tc.args...)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
