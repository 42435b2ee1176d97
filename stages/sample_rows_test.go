package stages

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/sampling"
)

// rowCase is one sequence of a request as the sample stage sees it: its
// params, its prompt and output so far, the tokens pending from the step
// before (zero-overhead scheduling) and its index among the request's n.
type rowCase struct {
	name           string
	p              engine.SamplingParams
	prompt, output []int
	pending        []int
	index          int
}

// refProcessed applies a request's min_tokens mask, logit bias and
// penalties to a copy of raw the plain way, straight from vLLM's
// definitions and the engine's params: all masks, then all biases, then
// each token's penalties from a scan of the whole history.
func refProcessed(raw []float32, c rowCase, eos []int) []float32 {
	z := slices.Clone(raw)
	output := append(slices.Clone(c.output), c.pending...)
	if len(output) < c.p.MinTokens {
		masked := slices.Clone(c.p.StopTokenIDs)
		if !c.p.IgnoreEOS {
			masked = append(masked, eos...)
		}
		for _, t := range masked {
			z[t] = float32(math.Inf(-1))
		}
	}
	for t, b := range c.p.LogitBias {
		z[t] += b
	}
	if c.p.RepetitionPenalty == 1 && c.p.PresencePenalty == 0 && c.p.FrequencyPenalty == 0 {
		return z
	}
	for t := range z {
		seen := slices.Contains(c.prompt, t)
		count := 0
		for _, x := range output {
			if x == t {
				count++
			}
		}
		if !seen && count == 0 {
			continue
		}
		if z[t] > 0 {
			z[t] /= c.p.RepetitionPenalty
		} else {
			z[t] *= c.p.RepetitionPenalty
		}
		if count > 0 {
			z[t] -= c.p.FrequencyPenalty * float32(count)
			z[t] -= c.p.PresencePenalty
		}
	}
	return z
}

// refSettings is the row a request's settings give, without edits.
func refSettings(c rowCase) kernels.SampleRow {
	r := kernels.SampleRow{
		Greedy: c.p.Temperature < 1e-5, Temperature: c.p.Temperature,
		TopK: c.p.TopK, TopP: c.p.TopP, MinP: c.p.MinP,
		RepetitionPenalty: c.p.RepetitionPenalty, PresencePenalty: c.p.PresencePenalty, FrequencyPenalty: c.p.FrequencyPenalty,
		Step: uint64(len(c.output) + len(c.pending)),
	}
	if c.p.Seed != nil {
		r.Seed = uint64(*c.p.Seed) + uint64(c.index)
	}
	if c.p.Logprobs != nil {
		r.Logprobs, r.NumLogprobs = true, *c.p.Logprobs
	}
	return r
}

// TestEditBuilderMatchesHost checks that the row the sample stage builds
// from a request (editBuilder) makes the host sampler do what the request
// says: its settings are the request's, its edits leave the logits equal,
// bit for bit, to the plain reference's masks, bias and penalties, the
// token is the one drawn from the reference's logits with the same
// settings, and the logprobs are the raw row's. The rows of all cases are
// built between two resets of one builder, as a worker does in a step.
func TestEditBuilderMatchesHost(t *testing.T) {
	const vocab = 64
	eos := []int{2, 5}
	seed := func(s int64) *int64 { return &s }
	num := func(n int) *int { return &n }
	with := func(f func(*engine.SamplingParams)) engine.SamplingParams {
		p := engine.DefaultSamplingParams()
		p.Seed = seed(11)
		f(&p)
		return p
	}
	prompt := []int{1, 7, 7, 9, 30, 2}
	output := []int{9, 12, 12, 40, 7}
	cases := []rowCase{
		{name: "defaults", p: with(func(*engine.SamplingParams) {}), prompt: prompt, output: output},
		{name: "greedy", p: with(func(p *engine.SamplingParams) { p.Temperature = 0 }), prompt: prompt},
		{name: "temperature below the greedy threshold", p: with(func(p *engine.SamplingParams) { p.Temperature = 9e-6 }), prompt: prompt, output: output},
		{name: "temperature at the greedy threshold", p: with(func(p *engine.SamplingParams) { p.Temperature = 1e-5 }), prompt: prompt, output: output},
		{name: "no seed", p: with(func(p *engine.SamplingParams) { p.Seed = nil }), prompt: prompt, output: output},
		{name: "filters", p: with(func(p *engine.SamplingParams) { p.Temperature, p.TopK, p.TopP, p.MinP = 0.7, 10, 0.8, 0.02 }), prompt: prompt, output: output},
		{name: "penalties over prompt, output and pending, second sequence", p: with(func(p *engine.SamplingParams) {
			p.Temperature, p.RepetitionPenalty, p.PresencePenalty, p.FrequencyPenalty = 0.9, 1.4, 0.6, -0.3
		}), prompt: prompt, output: output, pending: []int{12}, index: 1},
		{name: "greedy penalties", p: with(func(p *engine.SamplingParams) {
			p.Temperature, p.RepetitionPenalty, p.FrequencyPenalty = 0, 0.8, 2
		}), prompt: prompt, output: output},
		{name: "bias on seen and unseen tokens", p: with(func(p *engine.SamplingParams) {
			p.LogitBias = map[int]float32{7: -4, 12: 3.5, 50: 8, 0: -100}
			p.RepetitionPenalty = 1.2
		}), prompt: prompt, output: output},
		{name: "min_tokens: stop and eos masked, one id both", p: with(func(p *engine.SamplingParams) {
			p.MinTokens, p.StopTokenIDs = 8, []int{5, 44}
			p.LogitBias = map[int]float32{44: 20}
			p.PresencePenalty = 1
		}), prompt: prompt, output: output, pending: []int{44}},
		{name: "min_tokens with ignore_eos", p: with(func(p *engine.SamplingParams) {
			p.MinTokens, p.StopTokenIDs, p.IgnoreEOS = 8, []int{44}, true
		}), prompt: prompt, output: output},
		{name: "min_tokens reached with the pending token", p: with(func(p *engine.SamplingParams) {
			p.MinTokens, p.StopTokenIDs = 6, []int{44}
		}), prompt: prompt, output: output, pending: []int{3}},
		{name: "logprobs with top entries", p: with(func(p *engine.SamplingParams) {
			p.Logprobs = num(5)
			p.RepetitionPenalty = 1.3
			p.LogitBias = map[int]float32{3: 2}
		}), prompt: prompt, output: output},
		{name: "logprobs of the sampled token only", p: with(func(p *engine.SamplingParams) { p.Logprobs, p.Temperature = num(0), 0 }), prompt: prompt, output: output},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var b editBuilder
	b.reset(vocab)
	rows := make([]kernels.SampleRow, len(cases))
	for i, c := range cases {
		if err := c.p.Validate(vocab); err != nil {
			t.Fatalf("%s: the test case is invalid: %v", c.name, err)
		}
		m := &engine.SequenceMetadata{RequestID: c.name, Params: &c.p,
			TokenIDs: append(slices.Clone(c.prompt), c.output...), NumPromptTokens: len(c.prompt)}
		var err error
		if rows[i], err = b.row(m, c.index, eos, c.pending); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			row := rows[i]
			settings := row
			settings.Edits = nil
			if want := refSettings(c); !equalRows(settings, want) {
				t.Fatalf("settings %+v, want %+v", settings, want)
			}
			for range 20 {
				raw := make([]float32, vocab)
				for j := range raw {
					raw[j] = float32(rng.NormFloat64() * 2)
				}
				row.Step = rng.Uint64N(1 << 20)
				settings.Step = row.Step
				got := slices.Clone(raw)
				res, err := sampling.Sample(got, &row, nil)
				if err != nil {
					t.Fatal(err)
				}
				want := refProcessed(raw, c, eos)
				if !slices.Equal(got, want) {
					t.Fatalf("logits after the row's edits\n got %v\nwant %v", got, want)
				}
				plain := settings
				plain.Logprobs, plain.NumLogprobs = false, 0
				ref, err := sampling.Sample(slices.Clone(want), &plain, nil)
				if err != nil {
					t.Fatal(err)
				}
				if res.Token != ref.Token {
					t.Fatalf("step %d: token %d, reference %d", row.Step, res.Token, ref.Token)
				}
				if c.p.Logprobs == nil {
					if res.Logprob != 0 || res.Rank != 0 || res.Top != nil {
						t.Fatalf("logprobs reported unasked: %+v", res)
					}
					continue
				}
				lp, err := sampling.PromptLogprobs(raw, res.Token, *c.p.Logprobs)
				if err != nil {
					t.Fatal(err)
				}
				if res.Logprob != lp.Logprob || res.Rank != lp.Rank || !slices.Equal(res.Top, lp.Top) {
					t.Fatalf("logprobs %+v, raw row's %+v", res, lp)
				}
			}
			if c.p.Logprobs == nil {
				// The same row is a valid device row.
				if _, err := kernels.SampleArgs("test", fakeLogits{1, vocab}, rows[i:i+1], nil); err != nil {
					t.Fatalf("the device check refuses the row: %v", err)
				}
			}
		})
	}
}

// equalRows compares two rows' settings (not their edits).
func equalRows(a, b kernels.SampleRow) bool {
	a.Edits, b.Edits = nil, nil
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

// fakeLogits is an F32 logits tensor's shape, for the argument checks.
type fakeLogits [2]int

func (f fakeLogits) Shape() []int       { return f[:] }
func (fakeLogits) DType() kernels.DType { return kernels.F32 }

// TestEditBuilderErrors checks that a token id outside the vocabulary is
// refused with its field named, and that the builder is left clean: the
// next row of the step builds as if the failed one had not been tried.
func TestEditBuilderErrors(t *testing.T) {
	const vocab = 16
	tests := []struct {
		name string
		p    func(*engine.SamplingParams)
		eos  []int
		want string
	}{
		{"logit_bias", func(p *engine.SamplingParams) { p.LogitBias = map[int]float32{16: 1} }, nil, "logit_bias token id 16"},
		{"stop", func(p *engine.SamplingParams) { p.MinTokens, p.StopTokenIDs = 2, []int{3, -1} }, nil, "stop token id -1"},
		{"eos", func(p *engine.SamplingParams) { p.MinTokens = 2 }, []int{99}, "eos token id 99"},
		{"prompt", func(p *engine.SamplingParams) { p.RepetitionPenalty = 2 }, nil, "prompt token id 20"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b editBuilder
			b.reset(vocab)
			p := engine.DefaultSamplingParams()
			tc.p(&p)
			bad := &engine.SequenceMetadata{Params: &p, TokenIDs: []int{1, 3, 20, 4}, NumPromptTokens: 3}
			if _, err := b.row(bad, 0, tc.eos, nil); !errors.Is(err, kernels.ErrOutOfRange) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q and wrapping %v", err, tc.want, kernels.ErrOutOfRange)
			}
			q := engine.DefaultSamplingParams()
			q.RepetitionPenalty = 2
			q.LogitBias = map[int]float32{3: 1}
			good := &engine.SequenceMetadata{Params: &q, TokenIDs: []int{1, 3, 4}, NumPromptTokens: 2}
			row, err := b.row(good, 0, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := []kernels.LogitEdit{
				{Token: 3, Bias: 1, Flags: kernels.EditBias | kernels.EditSeen},
				{Token: 1, Flags: kernels.EditSeen},
				{Token: 4, Count: 1, Flags: kernels.EditSeen},
			}
			if !slices.Equal(row.Edits, want) {
				t.Fatalf("edits after a failed row %+v, want %+v", row.Edits, want)
			}
		})
	}
}
