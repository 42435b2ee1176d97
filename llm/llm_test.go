package llm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

func greedy(maxTokens int) engine.SamplingParams {
	p := engine.DefaultSamplingParams()
	p.Temperature = 0
	p.MaxTokens = maxTokens
	p.IgnoreEOS = true
	return p
}

func prompts(n int) []Prompt {
	out := make([]Prompt, n)
	for i := range out {
		ids := make([]int, 3+i*5)
		for j := range ids {
			ids[j] = 3 + (i*7+j*13)%60
		}
		out[i] = Prompt{IDs: ids}
	}
	return out
}

func generate(t *testing.T, l *LLM, ps []Prompt, params engine.SamplingParams) [][]int {
	t.Helper()
	res, err := l.Generate(context.Background(), ps, params, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]int
	for _, c := range res {
		for _, o := range c.Outputs {
			if o.Err != nil {
				t.Fatalf("%s/%d: %v", c.RequestID, o.Index, o.Err)
			}
			out = append(out, o.TokenIDs)
		}
	}
	return out
}

// The same prompt gives the same greedy tokens alone and in a crowded
// batch, with chunked prefill on or off and with a KV cache small enough
// to force preemption; with float32, 16-bit (f16) and 8-bit (fp8) KV
// caches of a GQA model, and float32 and 16-bit latent caches of the
// shipped MLA model.
func TestGreedyInvariance(t *testing.T) {
	for _, kv := range []string{"auto", "f16", "fp8"} {
		t.Run("kv="+kv, func(t *testing.T) { greedyInvariance(t, tinyLlama(t), kv) })
	}
	mla := filepath.Join("..", "assets", "deepseek-tiny")
	for _, kv := range []string{"auto", "f16"} {
		t.Run("mla/kv="+kv, func(t *testing.T) { greedyInvariance(t, mla, kv) })
	}
}

func greedyInvariance(t *testing.T, dir, kv string) {
	base := func(edit func(*config.Config)) *LLM {
		l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
			c.Cache.KVCacheDType = kv
			if edit != nil {
				edit(c)
			}
		}), Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := l.Close(); err != nil {
				t.Error(err)
			}
		})
		return l
	}
	ps := prompts(6)
	want := make([][]int, len(ps))
	alone := base(nil)
	for i, p := range ps {
		want[i] = generate(t, alone, []Prompt{p}, greedy(12))[0]
		if len(want[i]) != 12 {
			t.Fatalf("prompt %d: %d tokens, want 12", i, len(want[i]))
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*config.Config)
	}{
		{"crowded batch", nil},
		{"no chunked prefill", func(c *config.Config) { c.Engine.ChunkedPrefill = false; c.Engine.MaxNumBatchedTokens = 256 }},
		{"tiny chunks", func(c *config.Config) { c.Engine.PrefillChunkSize = 3 }},
		{"preemption", func(c *config.Config) { c.Cache.NumBlocks = 12 }},
		{"no prefix cache", func(c *config.Config) { c.Cache.PrefixCaching = false }},
		// Three sequences at most, prompts joining two at a time.
		{"admission batches", func(c *config.Config) { c.Engine.MaxNumSeqs = 3; c.Engine.AdmissionFraction = 0.5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := base(tc.edit)
			got := generate(t, l, ps, greedy(12))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("tokens differ from the alone run:\n got %v\nwant %v", got, want)
			}
			s := l.SchedulerStats()
			if tc.name == "preemption" && s.NumPreemptions == 0 {
				t.Error("no preemption happened with a 12-block cache")
			}
			if s.NumRunning+s.NumWaiting+s.NumPrompted != 0 {
				t.Errorf("sequences left: %+v", s)
			}
		})
	}
}

func TestBadRequestsFailAlone(t *testing.T) {
	l, err := NewLLM(tinyConfig(t, tinyLlama(t), nil), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	good := prompts(1)[0]
	long := make([]int, 300)
	for i := range long {
		long[i] = 5
	}
	ps := []Prompt{good, {IDs: []int{1, 99}}, {}, {IDs: long}, {Text: "hi"}, good}
	res, err := l.Generate(context.Background(), ps, greedy(4), nil)
	if err != nil {
		t.Fatal(err)
	}
	wantErr := []string{"", "outside the vocabulary", "the prompt is empty", "max_model_len", "no tokenizer", ""}
	for i, c := range res {
		o := c.Outputs[0]
		if wantErr[i] == "" {
			if o.Err != nil || len(o.TokenIDs) != 4 {
				t.Errorf("prompt %d: err %v, %d tokens", i, o.Err, len(o.TokenIDs))
			}
			continue
		}
		if o.Err == nil || !strings.Contains(o.Err.Error(), wantErr[i]) || o.FinishReason != engine.FinishError {
			t.Errorf("prompt %d: err %v (%s), want one containing %q", i, o.Err, o.FinishReason, wantErr[i])
		}
	}
	if !reflect.DeepEqual(res[0].Outputs[0].TokenIDs, res[5].Outputs[0].TokenIDs) {
		t.Errorf("the good requests differ: %v vs %v", res[0].Outputs[0].TokenIDs, res[5].Outputs[0].TokenIDs)
	}
	// The same checks refuse a request at the door, before it is queued.
	for i, p := range ps[1:5] {
		err := l.AddRequest(&engine.Request{ID: fmt.Sprint("direct", i), Prompt: p.Text, PromptTokenIDs: p.IDs, Params: greedy(4)})
		if !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), wantErr[i+1]) {
			t.Errorf("AddRequest(prompt %d) = %v, want ErrInvalidRequest with %q", i+1, err, wantErr[i+1])
		}
	}
	bad := greedy(4)
	bad.TopP = 0
	if err := l.AddRequest(&engine.Request{ID: "bad-params", PromptTokenIDs: good.IDs, Params: bad}); !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), "top_p") {
		t.Errorf("AddRequest(top_p 0) = %v", err)
	}
	if l.NumLive() != 0 {
		t.Errorf("%d requests still live", l.NumLive())
	}
	_ = fmt.Sprint()
}

// Seeded sampling gives the same tokens alone and in a crowded batch, and
// n > 1 gives distinct sequences that are each reproducible.
func TestSeededSamplingInvariance(t *testing.T) {
	dir := tinyLlama(t)
	useDefault := func(c *config.Config) { c.Pipeline.Impl = nil }
	params := engine.DefaultSamplingParams()
	params.Temperature, params.TopP, params.TopK, params.MaxTokens, params.IgnoreEOS = 0.9, 0.95, 20, 10, true
	params.N = 2
	seed := int64(42)
	params.Seed = &seed
	ps := prompts(5)

	l, err := NewLLM(tinyConfig(t, dir, useDefault), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var alone [][]int
	for _, p := range ps {
		alone = append(alone, generate(t, l, []Prompt{p}, params)...)
	}
	crowded := generate(t, l, ps, params)
	if !reflect.DeepEqual(alone, crowded) {
		t.Errorf("seeded tokens differ:\nalone   %v\ncrowded %v", alone, crowded)
	}
	if reflect.DeepEqual(alone[0], alone[1]) {
		t.Errorf("the two samples of a request are identical: %v", alone[0])
	}
}

// A sampler named in YAML replaces the default, and an inserted stage runs
// between forward and sample.
func TestStageSwapAndInsertFromYAML(t *testing.T) {
	dir := tinyLlama(t)
	hot := engine.DefaultSamplingParams()
	hot.Temperature, hot.MaxTokens, hot.IgnoreEOS = 1.5, 12, true
	ps := prompts(3)

	run := func(edit func(*config.Config), params engine.SamplingParams) ([][]int, *LLM) {
		l, err := NewLLM(tinyConfig(t, dir, edit), Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return generate(t, l, ps, params), l
	}
	argmaxTokens, _ := run(nil, greedy(12)) // the tiny config picks sample: greedy
	swapped, _ := run(nil, hot)             // greedy sampler ignores the temperature
	if !reflect.DeepEqual(swapped, argmaxTokens) {
		t.Errorf("sample: greedy did not ignore the temperature:\n%v\n%v", swapped, argmaxTokens)
	}
	sampled, _ := run(func(c *config.Config) { c.Pipeline.Impl = map[string]string{"sample": "default"} }, hot)
	if reflect.DeepEqual(sampled, argmaxTokens) {
		t.Errorf("sample: default at temperature 1.5 gave the argmax tokens: %v", sampled)
	}

	// A softcap of 0.05 squashes the logits to [-0.05, 0.05]: sampling becomes
	// near uniform, unlike the uncapped run with the same seed.
	withCap := func(c *config.Config) {
		c.Pipeline.Impl = map[string]string{"sample": "default"}
		c.Pipeline.Insert = []pipeline.Insertion{{After: "forward", Stage: "logit-softcap", Options: map[string]any{"cap": 0.05}}}
	}
	capped, l := run(withCap, hot)
	if reflect.DeepEqual(capped, sampled) {
		t.Errorf("logit-softcap changed nothing: %v", capped)
	}
	found := false
	for _, s := range l.Graph().Stats() {
		if s.Name == "logit-softcap" {
			found = s.Items > 0
		}
	}
	if !found {
		t.Errorf("logit-softcap did not process any step: %+v", l.Graph().Stats())
	}
}

// Logprobs and prompt logprobs are reported, consistent with each other:
// the prompt logprob of token i+1 equals the logprob a greedy step assigns
// when the same context is extended by it, and top lists are ordered.
func TestLogprobs(t *testing.T) {
	l, err := NewLLM(tinyConfig(t, tinyLlama(t), func(c *config.Config) {
		c.Pipeline.Impl = nil
		c.Engine.PrefillChunkSize = 4 // prompt logprobs over several chunks
	}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	params := greedy(3)
	five, three := 5, 3
	params.Logprobs, params.PromptLogprobs = &five, &three
	prompt := prompts(3)[2] // 13 tokens
	res, err := l.Generate(context.Background(), []Prompt{prompt}, params, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := res[0]
	if len(c.PromptLogprobs) != len(prompt.IDs)-1 {
		t.Fatalf("%d prompt logprobs for %d prompt tokens", len(c.PromptLogprobs), len(prompt.IDs))
	}
	for i, lp := range c.PromptLogprobs {
		if lp.TokenID != prompt.IDs[i+1] || lp.Logprob > 0 || len(lp.Top) != 3 {
			t.Errorf("prompt logprob %d: %+v", i, lp)
		}
	}
	o := c.Outputs[0]
	if len(o.Logprobs) != 3 {
		t.Fatalf("%d logprobs for 3 tokens", len(o.Logprobs))
	}
	for i, lp := range o.Logprobs {
		if lp.TokenID != o.TokenIDs[i] || len(lp.Top) != 5 || lp.Top[0].TokenID != lp.TokenID || lp.Top[0].Logprob != lp.Logprob {
			t.Errorf("greedy logprob %d: %+v (token %d)", i, lp, o.TokenIDs[i])
		}
		for j := 1; j < len(lp.Top); j++ {
			if lp.Top[j].Logprob > lp.Top[j-1].Logprob {
				t.Errorf("top list not sorted: %+v", lp.Top)
			}
		}
	}
	// Scoring prompt+output as a prompt gives the generated tokens' logprobs.
	ext := Prompt{IDs: append(append([]int{}, prompt.IDs...), o.TokenIDs[:2]...)}
	res2, err := l.Generate(context.Background(), []Prompt{ext}, params, nil)
	if err != nil {
		t.Fatal(err)
	}
	pl := res2[0].PromptLogprobs
	for i := range 2 {
		got, want := pl[len(prompt.IDs)-1+i].Logprob, o.Logprobs[i].Logprob
		if d := got - want; d > 1e-4 || d < -1e-4 {
			t.Errorf("token %d: prompt logprob %g, sampled logprob %g", i, got, want)
		}
	}
}

// Stop strings end a sequence and trim its text, across token boundaries.
func TestStopStrings(t *testing.T) {
	dir := tinyLlama(t)
	writeCharTokenizer(t, dir)
	l, err := NewLLM(tinyConfig(t, dir, nil), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Tokenizer() == nil {
		t.Fatal("the tokenizer was not loaded")
	}
	prompt := []Prompt{{Text: "hello world"}}
	full, err := l.Generate(context.Background(), prompt, greedy(16), nil)
	if err != nil {
		t.Fatal(err)
	}
	text := full[0].Outputs[0].Text
	if len(text) < 8 {
		t.Fatalf("greedy text too short to cut: %q", text)
	}
	for _, cut := range []int{0, 3, 6} {
		stop := text[cut+1 : cut+3] // two characters: a stop string spanning two tokens
		params := greedy(16)
		params.Stop = []string{stop, "never-there"}
		res, err := l.Generate(context.Background(), prompt, params, nil)
		if err != nil {
			t.Fatal(err)
		}
		o := res[0].Outputs[0]
		want := text[:strings.Index(text, stop)]
		if o.Text != want || o.FinishReason != engine.FinishStop || o.StopReason != stop {
			t.Errorf("stop %q: text %q (%s, %q), want %q", stop, o.Text, o.FinishReason, o.StopReason, want)
		}
	}
}

// An engine driven by Step gives the same tokens as one that runs on its
// own, one step per call.
func TestManualSteps(t *testing.T) {
	dir := tinyLlama(t)
	ps := prompts(4)
	params := greedy(6)
	auto, err := NewLLM(tinyConfig(t, dir, nil), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := generate(t, auto, ps, params)
	auto.Close()

	e, err := New(tinyConfig(t, dir, nil), Options{ManualSteps: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if out, err := e.Step(context.Background()); err != nil || len(out) != 0 {
		t.Fatalf("Step with nothing to do = %v, %v", out, err)
	}
	got := make([][]int, len(ps))
	for i, p := range ps {
		if err := e.AddRequest(&engine.Request{ID: fmt.Sprint(i), PromptTokenIDs: p.IDs, Params: params}); err != nil {
			t.Fatal(err)
		}
	}
	steps := 0
	for e.HasUnfinished() {
		out, err := e.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(out) == 0 {
			t.Fatalf("step %d produced nothing with requests unfinished", steps)
		}
		for _, o := range out {
			var i int
			fmt.Sscan(o.RequestID, &i)
			got[i] = append(got[i], o.TokenIDs...)
		}
		steps++
		if steps > 100 {
			t.Fatal("too many steps")
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("manual steps gave %v, want %v", got, want)
	}
	if steps < params.MaxTokens {
		t.Errorf("%d steps for %d tokens each", steps, params.MaxTokens)
	}
	if _, err := auto.Step(context.Background()); !errors.Is(err, ErrNotManual) {
		t.Errorf("Step on an automatic engine = %v", err)
	}
}

// A prompt whose prefix is cached computes fewer prefill tokens and gives
// the same tokens as a miss.
func TestPrefixCacheHit(t *testing.T) {
	l, err := NewLLM(tinyConfig(t, tinyLlama(t), nil), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ids := make([]int, 40) // 10 full blocks of 4
	for i := range ids {
		ids[i] = 3 + (i*11)%60
	}
	p := []Prompt{{IDs: ids}}
	first := generate(t, l, p, greedy(8))
	before := l.StepStats().PrefillTokens.Load()
	second := generate(t, l, p, greedy(8))
	computed := l.StepStats().PrefillTokens.Load() - before
	if !reflect.DeepEqual(first, second) {
		t.Errorf("hit %v, miss %v", second, first)
	}
	if computed >= int64(len(ids)) {
		t.Errorf("the cached prompt computed %d prefill tokens of %d", computed, len(ids))
	}
	if hits := l.SchedulerStats().PrefixCache.NumHitTokens; hits == 0 {
		t.Error("no prefix-cache hit recorded")
	}
	t.Logf("second run computed %d of %d prompt tokens", computed, len(ids))
}

// GenerateEach gives prompt i its own sampling parameters and submits the
// prompts in order, one sequence running at a time here: of two prompts
// with a common prefix, the later one finds it cached, every run. A count
// of parameters other than the prompts' is an error naming both.
func TestGenerateEach(t *testing.T) {
	l, err := NewLLM(tinyConfig(t, tinyLlama(t), func(c *config.Config) { c.Engine.MaxNumSeqs = 1 }), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	shared := make([]int, 16) // 4 full blocks of 4
	for i := range shared {
		shared[i] = 3 + (i*11)%60
	}
	ps := []Prompt{{IDs: append(append([]int(nil), shared...), 5, 6)}, {IDs: []int{7, 8, 9}}, {IDs: append(append([]int(nil), shared...), 9)}}
	params := []engine.SamplingParams{greedy(3), greedy(5), greedy(2)}
	for run := range 3 {
		res, err := l.GenerateEach(context.Background(), ps, params, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range res {
			if got := len(c.Outputs[0].TokenIDs); got != params[i].MaxTokens {
				t.Errorf("run %d: prompt %d: %d tokens, want its max_tokens %d", run, i, got, params[i].MaxTokens)
			}
		}
		// The first run: prompt 0 misses and prompt 2 hits its 16 tokens;
		// later runs hit both.
		want0 := 0
		if run > 0 {
			want0 = len(shared)
		}
		if res[0].NumCachedTokens != want0 || res[2].NumCachedTokens != len(shared) {
			t.Errorf("run %d: cached tokens %d and %d, want %d and %d", run, res[0].NumCachedTokens, res[2].NumCachedTokens, want0, len(shared))
		}
	}
	if _, err := l.GenerateEach(context.Background(), ps, params[:2], nil); err == nil || !strings.Contains(err.Error(), "3 prompts but 2 sampling parameters") {
		t.Errorf("2 parameters for 3 prompts: err %v", err)
	}
}

// Options.Backend: two engines in turn on one caller-owned backend give
// the tokens of an engine on its own, and closing an engine leaves the
// backend open; a backend of another device than the config's is an error
// naming both.
func TestSharedBackend(t *testing.T) {
	dir := tinyLlama(t)
	own, err := NewLLM(tinyConfig(t, dir, nil), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := generate(t, own, prompts(3), greedy(6))
	own.Close()
	b := cpu.New(cpu.Options{Threads: 2})
	defer b.Close()
	for i := range 2 {
		l, err := NewLLM(tinyConfig(t, dir, nil), Options{Backend: b})
		if err != nil {
			t.Fatal(err)
		}
		got := generate(t, l, prompts(3), greedy(6))
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("engine %d on the shared backend: %v, want %v", i, got, want)
		}
	}
	cfg := tinyConfig(t, dir, func(c *config.Config) { c.Device = "cuda" })
	if _, err := NewLLM(cfg, Options{Backend: b}); err == nil || !strings.Contains(err.Error(), `but the config's device is "cuda"`) {
		t.Errorf("a CPU backend for device cuda: err %v", err)
	}
}
