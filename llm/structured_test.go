package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	jsonschemav "github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
)

// structuredSchemas are the JSON schemas generation is checked against:
// bounded (maxLength, enums, integer bounds, maxItems) so that a finished
// instance fits the token budget.
var structuredSchemas = []string{
	`{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":150},"ok":{"type":"boolean"}},"required":["name","age","ok"],"additionalProperties":false}`,
	`{"type":"object","properties":{"kind":{"enum":["func","type","var"]},"args":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":3}},"required":["kind","args"],"additionalProperties":false}`,
	`{"type":"array","items":{"type":"object","properties":{"x":{"type":"integer","minimum":-9,"maximum":9},"tag":{"const":"go"}},"required":["x","tag"],"additionalProperties":false},"minItems":1,"maxItems":2}`,
}

// structuredPrompts are the prompts each schema is tried with.
var structuredPrompts = []string{"func main() {", "The answer, as JSON:", "Pierre said"}

// validator compiles a JSON schema for checking outputs.
func validator(t *testing.T, schema string) *jsonschemav.Schema {
	t.Helper()
	doc, err := jsonschemav.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschemav.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkInstance reports why text is not a finished instance of schema.
func checkInstance(s *jsonschemav.Schema, out CompletionOutput) error {
	if out.Err != nil {
		return out.Err
	}
	if out.FinishReason != engine.FinishStop {
		return fmt.Errorf("finished by %v, not the grammar's end", out.FinishReason)
	}
	v, err := jsonschemav.UnmarshalJSON(strings.NewReader(out.Text))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(v)
}

// The shipped model under each schema always yields an instance that the
// schema validates (checked by an independent JSON Schema validator),
// greedy and sampled, with ZOS off and on and with speculative decoding
// (MTP and n-gram drafts are verified under the grammar's masks).
func TestStructuredOutputSchemas(t *testing.T) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	setups := []struct {
		name   string
		zos    bool
		method string
	}{{"plain", false, ""}, {"zos", true, ""}, {"zos+mtp", true, "mtp"}, {"ngram", false, "ngram"}}
	var want []string // the plain setup's texts: every setup gives the same
	for _, su := range setups {
		t.Run(su.name, func(t *testing.T) {
			l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
				c.Pipeline.Impl = nil
				c.ZOS.Enabled = su.zos
				c.Cache.NumBlocks = 256
				c.Speculative.Method = su.method
				if su.method != "" {
					c.Speculative.NumSpeculativeTokens = 3
					c.Speculative.PromptLookupMin = 1
				}
			}), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			var texts []string
			var prompts []Prompt
			for _, p := range structuredPrompts {
				prompts = append(prompts, Prompt{Text: p})
			}
			for i, schema := range structuredSchemas {
				v := validator(t, schema)
				for _, temp := range []float32{0, 1} {
					p := engine.DefaultSamplingParams()
					p.MaxTokens, p.Temperature, p.N = 200, temp, 2
					p.StructuredOutput = &engine.StructuredOutput{JSONSchema: schema, Whitespace: "compact"}
					seed := int64(i)
					p.Seed = &seed
					res, err := l.Generate(context.Background(), prompts, p, nil)
					if err != nil {
						t.Fatal(err)
					}
					for _, c := range res {
						for _, out := range c.Outputs {
							if err := checkInstance(v, out); err != nil {
								t.Errorf("schema %d temperature %v output %d: %q: %v", i, temp, out.Index, out.Text, err)
							}
							texts = append(texts, out.Text)
						}
					}
					t.Logf("schema %d temperature %v: %q", i, temp, res[0].Outputs[0].Text)
				}
			}
			if want == nil {
				want = texts
			} else if !slices.Equal(want, texts) {
				t.Errorf("%s: outputs differ from the plain setup's", su.name)
			}
			if su.method != "" {
				if s := l.StepStats().Spec(); s.NumDraftTokens == 0 {
					t.Errorf("%s: no drafts were verified", su.method)
				}
			}
		})
	}
}

// Every constraint kind: the output is in the language, greedy and sampled.
func TestStructuredOutputKinds(t *testing.T) {
	l, err := NewLLM(tinyConfig(t, filepath.Join("..", "assets", "deepseek-tiny"), func(c *config.Config) {
		c.Pipeline.Impl = nil
		c.ZOS.Enabled = true
	}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tests := []struct {
		name  string
		spec  engine.StructuredOutput
		check func(string) bool
	}{
		{"regex", engine.StructuredOutput{Regex: `[a-z]{2,8}-[0-9]{3}`}, regexp.MustCompile(`^[a-z]{2,8}-[0-9]{3}$`).MatchString},
		{"choice", engine.StructuredOutput{Choice: []string{"alpha", "beta", "gamma delta"}}, func(s string) bool {
			return slices.Contains([]string{"alpha", "beta", "gamma delta"}, s)
		}},
		{"grammar", engine.StructuredOutput{Grammar: "root ::= \"func \" name \"(\" name? \") {}\"\nname ::= [a-z] [a-z0-9]{0,7}"},
			regexp.MustCompile(`^func [a-z][a-z0-9]{0,7}\(([a-z][a-z0-9]{0,7})?\) \{\}$`).MatchString},
	}
	for _, tc := range tests {
		for _, temp := range []float32{0, 0.8} {
			p := engine.DefaultSamplingParams()
			p.MaxTokens, p.Temperature, p.N = 400, temp, 3
			p.StructuredOutput = &tc.spec
			res, err := l.Generate(context.Background(), []Prompt{{Text: "func main() {"}, {Text: "Natasha"}}, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range res {
				for _, out := range c.Outputs {
					if out.Err != nil || out.FinishReason != engine.FinishStop || !tc.check(out.Text) {
						t.Errorf("%s temperature %v: %q (%v, %v)", tc.name, temp, out.Text, out.FinishReason, out.Err)
					}
				}
			}
			t.Logf("%s temperature %v: %q", tc.name, temp, res[0].Outputs[0].Text)
		}
	}
	// Any JSON object: the model writes long strings into it, so some
	// outputs run out of tokens; those that end are objects, and most end.
	p := engine.DefaultSamplingParams()
	p.MaxTokens, p.Temperature, p.N = 160, 0.8, 4
	p.StructuredOutput = &engine.StructuredOutput{JSONObject: true, Whitespace: "compact"}
	res, err := l.Generate(context.Background(), []Prompt{{Text: "func main() {"}, {Text: "Natasha"}, {Text: "{"}}, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	ended := 0
	for _, c := range res {
		for _, out := range c.Outputs {
			if out.Err != nil || out.FinishReason == engine.FinishLength {
				continue
			}
			ended++
			var m map[string]any
			if err := json.Unmarshal([]byte(out.Text), &m); err != nil || out.FinishReason != engine.FinishStop {
				t.Errorf("json_object: %q (%v): %v", out.Text, out.FinishReason, err)
			}
		}
	}
	t.Logf("json_object: %d of 12 outputs ended, e.g. %q", ended, res[0].Outputs[0].Text)
	if ended < 6 {
		t.Errorf("json_object: only %d of 12 outputs ended within %d tokens", ended, p.MaxTokens)
	}
}

// A constraint that does not compile fails its own request with the
// compiler's message (the keyword named); the others in the same batch
// are served.
func TestStructuredOutputCompileError(t *testing.T) {
	l, err := NewLLM(tinyConfig(t, filepath.Join("..", "assets", "deepseek-tiny"), func(c *config.Config) { c.Pipeline.Impl = nil }), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	bad := engine.DefaultSamplingParams()
	bad.StructuredOutput = &engine.StructuredOutput{JSONSchema: `{"type":"object","properties":{"x":{"not":{"minimum":1}}}}`}
	good := engine.DefaultSamplingParams()
	good.Temperature = 0
	done := make(chan []Completion, 1)
	go func() {
		res, err := l.Generate(context.Background(), []Prompt{{Text: "func"}}, good, nil)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	res, err := l.Generate(context.Background(), []Prompt{{Text: "func"}}, bad, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := res[0].Outputs[0]
	if out.FinishReason != engine.FinishError || out.Err == nil || !strings.Contains(out.Err.Error(), `unsupported keyword "not" at #/properties/x`) {
		t.Fatalf("bad schema: %v, %v", out.FinishReason, out.Err)
	}
	if g := <-done; g[0].Outputs[0].Err != nil || len(g[0].Outputs[0].TokenIDs) != good.MaxTokens {
		t.Fatalf("the other request: %+v", g[0].Outputs[0])
	}
}

// heldCompiler holds every compile until released, then fails it.
type heldCompiler struct {
	started chan struct{}
	release chan struct{}
}

func (h *heldCompiler) CompileAsync(_ context.Context, _ *engine.StructuredOutput, done func(engine.Grammar, error)) {
	go func() {
		h.started <- struct{}{}
		<-h.release
		done(nil, errors.New("grammar compile timed out after 10s (structured_output.compile_timeout_s)"))
	}()
}

// A constraint whose compile takes long (a pathological schema) holds only
// its own request: while it compiles, another request runs every one of
// its steps to the end (counted, not timed: the compile cannot end before
// it is released, after the other request finished), and the slow
// request then fails alone with the compiler's message.
func TestStructuredOutputSlowCompileBlocksNoSteps(t *testing.T) {
	held := &heldCompiler{started: make(chan struct{}, 1), release: make(chan struct{})}
	l, err := NewLLM(tinyConfig(t, filepath.Join("..", "assets", "deepseek-tiny"), func(c *config.Config) {
		c.Pipeline.Impl = nil
		c.ZOS.Enabled = true
	}), Options{Grammars: held})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	slow := engine.DefaultSamplingParams()
	slow.StructuredOutput = &engine.StructuredOutput{JSONSchema: `{"type":"object"}`}
	slowDone := make(chan CompletionOutput, 1)
	go func() {
		res, err := l.Generate(context.Background(), []Prompt{{Text: "func"}}, slow, nil)
		if err != nil {
			t.Error(err)
		}
		slowDone <- res[0].Outputs[0]
	}()
	<-held.started
	// The other request goes in through the engine API: Generate would
	// also wait for the engine to drain, slow request included.
	fast := engine.DefaultSamplingParams()
	fast.Temperature, fast.MaxTokens, fast.IgnoreEOS = 0, 48, true
	var tokens []int
	fastDone := make(chan engine.RequestOutput, 1)
	req := &engine.Request{ID: "fast", Prompt: "func main() {", Params: fast, OnOutput: func(o engine.RequestOutput) {
		tokens = append(tokens, o.TokenIDs...)
		if o.Finished {
			fastDone <- o
		}
	}}
	if err := l.AddRequestWait(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if out := <-fastDone; out.Err != nil || len(tokens) != fast.MaxTokens {
		t.Fatalf("the other request: %d tokens, %v", len(tokens), out.Err)
	}
	if st := l.SchedulerStats(); st.NumWaitingForGrammar != 1 {
		t.Fatalf("%d sequences wait for a grammar, want the slow one", st.NumWaitingForGrammar)
	}
	select {
	case out := <-slowDone:
		t.Fatalf("the slow request ended before its compile: %+v", out)
	default:
	}
	close(held.release)
	out := <-slowDone
	if out.FinishReason != engine.FinishError || out.Err == nil || !strings.Contains(out.Err.Error(), "grammar: grammar compile timed out") {
		t.Fatalf("slow request: %v, %v", out.FinishReason, out.Err)
	}
}
