package server

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
)

// startDefaultModel serves the shipped default model (deepseek-tiny, a
// byte-level BPE tokenizer) under the name "deepseek-tiny".
func startDefaultModel(t *testing.T, opts Options) *testServer {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "assets", "deepseek-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	opts.ModelName = "deepseek-tiny"
	return startServer(t, func(c *config.Config) { c.Model = dir }, opts)
}

// personSchema bounds every value, so that any output it allows fits in
// the tests' max_tokens.
const personSchema = `{"type": "object", "properties": {
	"name": {"type": "string", "maxLength": 12},
	"age": {"type": "integer", "minimum": 0, "maximum": 150},
	"role": {"enum": ["admin", "user", "guest"]},
	"tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
	"required": ["name", "age", "role"], "additionalProperties": false}`

// weatherParams and timeParams are the parameters of the tools of the
// end-to-end tests, bounded like personSchema.
const (
	weatherParams = `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}`
	timeParams    = `{"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["zone"], "additionalProperties": false}`
)

// e2eTools are the tools of the end-to-end tests.
func e2eTools() []any {
	tool := func(name, params string) any {
		return map[string]any{"type": "function", "function": map[string]any{"name": name, "description": "look up " + name, "parameters": json.RawMessage(params)}}
	}
	return []any{tool("get_weather", weatherParams), tool("get_time", timeParams)}
}

// chatBody is a chat request to the default model with extra fields.
func chatBody(extra map[string]any) map[string]any {
	body := map[string]any{
		"model":      "deepseek-tiny",
		"messages":   []map[string]string{{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Describe a user of the system."}},
		"max_tokens": 512, "temperature": 0.8, "seed": 7,
	}
	for k, v := range extra {
		body[k] = v
	}
	return body
}

// streamChat posts body with stream set and returns its chunks.
func streamChat(t *testing.T, url string, body map[string]any) []ChatCompletionChunk {
	t.Helper()
	body["stream"] = true
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	events, done, err := sseEvents(resp.Body)
	if err != nil || !done {
		t.Fatalf("stream: done %v, err %v", done, err)
	}
	chunks := make([]ChatCompletionChunk, 0, len(events))
	for _, ev := range events {
		chunks = append(chunks, decode[ChatCompletionChunk](t, []byte(ev)))
	}
	return chunks
}

// assembled is a streamed choice put together from its chunks.
type assembled struct {
	content string
	calls   []ToolCall
	finish  string
}

// assemble puts choice 0 of chunks together as an OpenAI client does: the
// first delta of a tool call (with an id) must carry its index, type and
// name; later deltas of its index add arguments.
func assemble(t *testing.T, chunks []ChatCompletionChunk) assembled {
	t.Helper()
	var a assembled
	for _, ch := range chunks {
		for _, c := range ch.Choices {
			if c.Delta.Content != nil {
				a.content += *c.Delta.Content
			}
			for _, tc := range c.Delta.ToolCalls {
				if tc.Index == nil {
					t.Fatalf("tool call delta without index: %+v", tc)
				}
				switch {
				case tc.ID != "":
					if *tc.Index != len(a.calls) || tc.Type != "function" || tc.Function.Name == "" || !strings.HasPrefix(tc.ID, "chatcmpl-tool-") {
						t.Fatalf("first delta of call %d: %+v", len(a.calls), tc)
					}
					a.calls = append(a.calls, tc)
				case *tc.Index < len(a.calls) && tc.Function.Name == "":
					a.calls[*tc.Index].Function.Arguments += tc.Function.Arguments
				default:
					t.Fatalf("tool call delta %+v after %d calls", tc, len(a.calls))
				}
			}
			if c.FinishReason != nil {
				a.finish = *c.FinishReason
			}
		}
	}
	return a
}

// checkInstance fails unless text is JSON valid under schema.
func checkInstance(t *testing.T, schema, text string) {
	t.Helper()
	if err := validates(t, compileSchema(t, schema), text); err != nil {
		t.Fatalf("output %q: %v", text, err)
	}
}

// response_format json_schema on the shipped model: the message content
// parses as JSON and validates against the schema, whole and streamed; so
// does json_object (an object) and the guided fields of /v1/completions.
// (Needs the engine's structured-output integration.)
func TestStructuredOutputE2E(t *testing.T) {
	ts := startDefaultModel(t, Options{})
	format := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "person", "strict": true, "schema": json.RawMessage(personSchema)}}
	for _, seed := range []int{1, 2, 3} {
		status, out := post(t, ts.url+"/v1/chat/completions", chatBody(map[string]any{"response_format": format, "seed": seed}))
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, out)
		}
		resp := decode[ChatCompletionResponse](t, out)
		c := resp.Choices[0]
		if c.Message.Content == nil || c.FinishReason == nil || *c.FinishReason != "stop" {
			t.Fatalf("seed %d: choice %s", seed, out)
		}
		checkInstance(t, personSchema, *c.Message.Content)
	}
	a := assemble(t, streamChat(t, ts.url, chatBody(map[string]any{"response_format": format})))
	if a.finish != "stop" || len(a.calls) != 0 {
		t.Fatalf("streamed: %+v", a)
	}
	checkInstance(t, personSchema, a.content)

	status, out := post(t, ts.url+"/v1/chat/completions", chatBody(map[string]any{"response_format": map[string]string{"type": "json_object"}}))
	if status != http.StatusOK {
		t.Fatalf("json_object: status %d: %s", status, out)
	}
	// Any object is allowed, so the output may run to max_tokens: then it
	// is an object's beginning.
	c := decode[ChatCompletionResponse](t, out).Choices[0]
	switch {
	case c.Message.Content == nil:
		t.Fatalf("json_object: %s", out)
	case *c.FinishReason == "stop" && !isJSONObject(*c.Message.Content), *c.FinishReason == "length" && !strings.HasPrefix(strings.TrimSpace(*c.Message.Content), "{"):
		t.Fatalf("json_object: %s", out)
	}

	completion := func(extra map[string]any) string {
		body := map[string]any{"prompt": "func main() {", "max_tokens": 40, "temperature": 0.8, "seed": 5}
		for k, v := range extra {
			body[k] = v
		}
		status, out := post(t, ts.url+"/v1/completions", body)
		if status != http.StatusOK {
			t.Fatalf("%v: status %d: %s", extra, status, out)
		}
		c := decode[CompletionResponse](t, out).Choices[0]
		if *c.FinishReason != "stop" {
			t.Fatalf("%v: %s", extra, out)
		}
		return c.Text
	}
	checkInstance(t, personSchema, completion(map[string]any{"guided_json": json.RawMessage(personSchema), "max_tokens": 512}))
	checkInstance(t, personSchema, completion(map[string]any{"structured_outputs": map[string]any{"json": personSchema, "disable_any_whitespace": true}, "max_tokens": 512}))
	if got := completion(map[string]any{"guided_choice": []string{"red", "green", "blue"}}); !slices.Contains([]string{"red", "green", "blue"}, got) {
		t.Fatalf("guided_choice: %q", got)
	}
	if got := completion(map[string]any{"guided_regex": `[a-z]{3,8}-[0-9]{2}`}); !regexp.MustCompile(`^[a-z]{3,8}-[0-9]{2}$`).MatchString(got) {
		t.Fatalf("guided_regex: %q", got)
	}
	if got := completion(map[string]any{"guided_grammar": `root ::= "yes" | "no" | "maybe " [0-9]`}); !regexp.MustCompile(`^(yes|no|maybe [0-9])$`).MatchString(got) {
		t.Fatalf("guided_grammar: %q", got)
	}
}

func isJSONObject(s string) bool {
	var m map[string]any
	return json.Unmarshal([]byte(s), &m) == nil
}

// A constraint the engine cannot compile is a 400 naming its field,
// streamed or not. (Needs the engine's structured-output integration.)
func TestConstraintCompileErrorE2E(t *testing.T) {
	ts := startDefaultModel(t, Options{})
	for _, stream := range []bool{false, true} {
		for _, tc := range []struct {
			field string
			body  map[string]any
		}{
			{"guided_grammar", map[string]any{"guided_grammar": `root ::= missing`}},
			{"response_format", map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": map[string]any{"type": "object", "patternProperties": map[string]any{"^a": map[string]any{}}}}}}},
		} {
			body := chatBody(tc.body)
			body["stream"] = stream
			status, out := post(t, ts.url+"/v1/chat/completions", body)
			if status != http.StatusBadRequest {
				t.Fatalf("%s (stream %v): status %d: %s", tc.field, stream, status, out)
			}
			e := decode[ErrorResponse](t, out)
			if e.Error.Param == nil || *e.Error.Param != tc.field || !strings.Contains(e.Error.Message, "grammar:") {
				t.Fatalf("%s (stream %v): %s", tc.field, stream, out)
			}
		}
	}
}

// tool_choice "required" and a named function on the shipped model: the
// answer is tool calls of the request's tools whose arguments validate
// against the function's parameters, with content null and finish_reason
// "tool_calls", whole and streamed. (Needs the engine's structured-output
// integration.)
func TestToolChoiceE2E(t *testing.T) {
	ts := startDefaultModel(t, Options{})
	paramsOf := map[string]string{"get_weather": weatherParams, "get_time": timeParams}
	checkCalls := func(what string, calls []ToolCall, only string, single bool) {
		t.Helper()
		if len(calls) == 0 || single && len(calls) != 1 {
			t.Fatalf("%s: %d calls", what, len(calls))
		}
		for _, c := range calls {
			schema, ok := paramsOf[c.Function.Name]
			if !ok || only != "" && c.Function.Name != only || c.Type != "function" || !strings.HasPrefix(c.ID, "chatcmpl-tool-") {
				t.Fatalf("%s: call %+v", what, c)
			}
			checkInstance(t, schema, c.Function.Arguments)
		}
	}
	for _, tc := range []struct {
		name   string
		choice any
		only   string
		extra  map[string]any
	}{
		{"required", "required", "", nil},
		{"required, not parallel", "required", "", map[string]any{"parallel_tool_calls": false}},
		{"named", map[string]any{"type": "function", "function": map[string]any{"name": "get_time"}}, "get_time", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			extra := map[string]any{"tools": e2eTools(), "tool_choice": tc.choice, "max_tokens": 512}
			for k, v := range tc.extra {
				extra[k] = v
			}
			single := tc.only != "" || tc.extra != nil
			status, out := post(t, ts.url+"/v1/chat/completions", chatBody(extra))
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, out)
			}
			// An array of calls may go on until max_tokens: the complete
			// calls are answered with finish_reason "length".
			finished := func(reason string) bool { return reason == "tool_calls" || !single && reason == "length" }
			c := decode[ChatCompletionResponse](t, out).Choices[0]
			if c.Message.Content != nil || c.FinishReason == nil || !finished(*c.FinishReason) {
				t.Fatalf("choice %s", out)
			}
			checkCalls("whole", c.Message.ToolCalls, tc.only, single)
			a := assemble(t, streamChat(t, ts.url, chatBody(extra)))
			if a.content != "" || !finished(a.finish) {
				t.Fatalf("streamed: %+v", a)
			}
			checkCalls("streamed", a.calls, tc.only, single)
		})
	}
}

// tool_choice "auto" on the shipped model, made to answer in the Hermes
// format by a guided_regex: the block becomes a tool call, the text before
// it the content, whole and streamed. (Needs the engine's
// structured-output integration.)
func TestToolChoiceAutoE2E(t *testing.T) {
	ts := startDefaultModel(t, Options{})
	const regex = "Sure[.] <tool_call>\n[{]\"name\": \"get_time\", \"arguments\": [{]\"zone\": \"(UTC|CET|PST)\"[}][}]\n</tool_call>"
	extra := map[string]any{"tools": e2eTools(), "guided_regex": regex}
	status, out := post(t, ts.url+"/v1/chat/completions", chatBody(extra))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, out)
	}
	c := decode[ChatCompletionResponse](t, out).Choices[0]
	if c.Message.Content == nil || *c.Message.Content != "Sure." || *c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 {
		t.Fatalf("choice %s", out)
	}
	call := c.Message.ToolCalls[0]
	if call.Function.Name != "get_time" || !strings.HasPrefix(call.ID, "chatcmpl-tool-") {
		t.Fatalf("call %+v", call)
	}
	checkInstance(t, timeParams, call.Function.Arguments)
	a := assemble(t, streamChat(t, ts.url, chatBody(extra)))
	if a.content != "Sure." || a.finish != "tool_calls" || len(a.calls) != 1 || a.calls[0].Function != call.Function {
		t.Fatalf("streamed %+v, whole %+v", a, call)
	}
}
