package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// weatherTools are two functions, the first with a $defs reference.
const weatherTools = `[
	{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
		"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
			"required": ["city"], "$defs": {"unit": {"enum": ["c", "f"]}}}}},
	{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
]`

// chatRequestOf decodes body as a chat request the way the handler does.
func chatRequestOf(t *testing.T, body string) *ChatCompletionRequest {
	t.Helper()
	var req ChatCompletionRequest
	if e := decodeBody(strings.NewReader(body), &req); e != nil {
		t.Fatalf("decode %s: %s", body, e.msg)
	}
	return &req
}

// tools, tool_choice and parallel_tool_calls map to a mode; every bad
// shape is a 400 naming the field.
func TestParseTools(t *testing.T) {
	const one = `[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]`
	tests := []struct {
		fields   string
		mode     string
		named    string
		parallel bool
		param    string // the error's field; "" when accepted
		msg      string
	}{
		{fields: ``, mode: toolsNone, parallel: true},
		{fields: `"tools": []`, mode: toolsNone, parallel: true},
		{fields: `"tools": ` + one, mode: toolsAuto, parallel: true},
		{fields: `"tools": ` + weatherTools + `, "tool_choice": "auto"`, mode: toolsAuto, parallel: true},
		{fields: `"tools": ` + one + `, "tool_choice": "none"`, mode: toolsNone, parallel: true},
		{fields: `"tools": ` + one + `, "tool_choice": "required", "parallel_tool_calls": false`, mode: toolsRequired},
		{fields: `"tools": ` + weatherTools + `, "tool_choice": {"type": "function", "function": {"name": "get_time"}}`, mode: toolsNamed, named: "get_time", parallel: true},
		{fields: `"tool_choice": "auto"`, mode: toolsNone, parallel: true},
		{fields: `"tool_choice": "none"`, mode: toolsNone, parallel: true},
		{fields: `"tools": {}`, param: "tools", msg: "must be an array of tool objects, got an object"},
		{fields: `"tools": [5]`, param: "tools[0]", msg: "must be an object"},
		{fields: `"tools": [{"type": "retrieval", "function": {"name": "f"}}]`, param: "tools[0].type", msg: `must be "function"`},
		{fields: `"tools": [{"type": "function"}]`, param: "tools[0].function", msg: "is required"},
		{fields: `"tools": [{"type": "function", "function": {"name": ""}}]`, param: "tools[0].function.name", msg: "non-empty string"},
		{fields: `"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]`, param: "tools[0].function.parameters", msg: "got an array"},
		{fields: `"tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]`, param: "tools[0].function.strict", msg: "boolean"},
		{fields: `"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]`, param: "tools[0].function.description", msg: "string"},
		{fields: `"tools": [{"type": "function", "function": {"name": "f", "params": {}}}]`, param: "tools[0].function.params", msg: "unknown field"},
		{fields: `"tools": [{"type": "function", "function": {"name": "f"}, "extra": 1}]`, param: "tools[0].extra", msg: "unknown field"},
		{fields: `"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]`, param: "tools[1].function.name", msg: "defined twice"},
		{fields: `"tool_choice": "required"`, param: "tool_choice", msg: "needs tools"},
		{fields: `"tool_choice": {"type": "function", "function": {"name": "f"}}`, param: "tool_choice", msg: "needs tools"},
		{fields: `"tools": ` + one + `, "tool_choice": "any"`, param: "tool_choice", msg: `got "any"`},
		{fields: `"tools": ` + one + `, "tool_choice": 1`, param: "tool_choice", msg: "got a number"},
		{fields: `"tools": ` + one + `, "tool_choice": {"type": "tool", "function": {"name": "f"}}`, param: "tool_choice.type", msg: `must be "function"`},
		{fields: `"tools": ` + one + `, "tool_choice": {"type": "function"}`, param: "tool_choice.function", msg: "must be an object"},
		{fields: `"tools": ` + one + `, "tool_choice": {"type": "function", "function": {}}`, param: "tool_choice.function.name", msg: "non-empty string"},
		{fields: `"tools": ` + one + `, "tool_choice": {"type": "function", "function": {"name": "g"}}`, param: "tool_choice.function.name", msg: `"g", which is not one of the tools`},
	}
	for _, tc := range tests {
		t.Run(tc.fields, func(t *testing.T) {
			body := `{"messages": [{"role": "user", "content": "hi"}]`
			if tc.fields != "" {
				body += ", " + tc.fields
			}
			cfg, e := parseTools(chatRequestOf(t, body+"}"))
			if tc.param != "" {
				if e == nil || e.status != http.StatusBadRequest || e.param != tc.param || !strings.Contains(e.msg, tc.msg) {
					t.Fatalf("got %+v (error %+v), want 400 with %q (param %q)", cfg, e, tc.msg, tc.param)
				}
				return
			}
			if e != nil {
				t.Fatalf("error %q (param %q)", e.msg, e.param)
			}
			if cfg.mode != tc.mode || cfg.named != tc.named || cfg.parallel != tc.parallel {
				t.Fatalf("mode %q named %q parallel %v, want %q %q %v", cfg.mode, cfg.named, cfg.parallel, tc.mode, tc.named, tc.parallel)
			}
		})
	}
}

// compileSchema compiles a JSON Schema document with the reference
// validator.
func compileSchema(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	return s
}

// validates reports whether the JSON text instance is valid under s.
func validates(t *testing.T, s *jsonschema.Schema, instance string) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(instance))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(v)
}

// tool_choice "required" constrains the output to an array of calls of
// the tools with their parameters (their $defs moved to the root, where
// the references point); a named function to its parameters schema, as
// written; "auto" and "none" to nothing.
func TestToolConstraint(t *testing.T) {
	cfgOf := func(fields string) *toolConfig {
		cfg, e := parseTools(chatRequestOf(t, `{"messages": [{"role": "user", "content": "hi"}], "tools": `+weatherTools+`, `+fields+`}`))
		if e != nil {
			t.Fatal(e.msg)
		}
		return cfg
	}
	named, e := cfgOf(`"tool_choice": {"type": "function", "function": {"name": "get_weather"}}`).constraint()
	if e != nil {
		t.Fatal(e.msg)
	}
	const weatherParams = `{"type":"object","properties":{"city":{"type":"string"},"unit":{"$ref":"#/$defs/unit"}},"required":["city"],"$defs":{"unit":{"enum":["c","f"]}}}`
	if named.so.JSONSchema != weatherParams || named.field != "tool_choice" {
		t.Fatalf("named: %q from %q", named.so.JSONSchema, named.field)
	}
	for _, mode := range []string{`"auto"`, `"none"`} {
		if c, e := cfgOf(`"tool_choice": ` + mode).constraint(); c != nil || e != nil {
			t.Fatalf("%s: constraint %+v, error %v", mode, c, e)
		}
	}
	req, e := cfgOf(`"tool_choice": "required"`).constraint()
	if e != nil {
		t.Fatal(e.msg)
	}
	want := `{"type":"array","minItems":1,"items":{"type":"object","anyOf":[` +
		`{"properties":{"name":{"type":"string","enum":["get_weather"]},"parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"$ref":"#/$defs/unit"}},"required":["city"]}},"required":["name","parameters"],"additionalProperties":false},` +
		`{"properties":{"name":{"type":"string","enum":["get_time"]},"parameters":{"type":"object","properties":{"zone":{"type":"string"}},"required":["zone"]}},"required":["name","parameters"],"additionalProperties":false}]},` +
		`"$defs":{"unit":{"enum":["c","f"]}}}`
	if req.so.JSONSchema != want {
		t.Fatalf("required schema\n%s\nwant\n%s", req.so.JSONSchema, want)
	}
	s := compileSchema(t, req.so.JSONSchema)
	for instance, ok := range map[string]bool{
		`[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}]`:                                         true,
		`[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {"zone": "UTC"}}]`: true,
		`[]`: false,
		`[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "k"}}]`: false,
		`[{"name": "get_time", "parameters": {"city": "Paris"}}]`:                 false,
		`[{"name": "launch", "parameters": {}}]`:                                  false,
		`[{"name": "get_time", "parameters": {"zone": "UTC"}, "why": 1}]`:         false,
	} {
		if err := validates(t, s, instance); (err == nil) != ok {
			t.Errorf("%s: valid %v, want %v (%v)", instance, err == nil, ok, err)
		}
	}
	single, e := cfgOf(`"tool_choice": "required", "parallel_tool_calls": false`).constraint()
	if e != nil {
		t.Fatal(e.msg)
	}
	if err := validates(t, compileSchema(t, single.so.JSONSchema), `[{"name": "get_time", "parameters": {"zone": "a"}}, {"name": "get_time", "parameters": {"zone": "b"}}]`); err == nil {
		t.Error("parallel_tool_calls false: two calls validate")
	}
	// Two tools defining one name differently cannot share the root.
	clash := `[{"type": "function", "function": {"name": "a", "parameters": {"$defs": {"x": {"type": "string"}}}}},
		{"type": "function", "function": {"name": "b", "parameters": {"$defs": {"x": {"type": "integer"}}}}}]`
	cfg, e := parseTools(chatRequestOf(t, `{"messages": [], "tools": `+clash+`, "tool_choice": "required"}`))
	if e != nil {
		t.Fatal(e.msg)
	}
	if _, e := cfg.constraint(); e == nil || e.param != "tools[1].function.parameters.$defs" || !strings.Contains(e.msg, `"x" is defined differently`) {
		t.Fatalf("clashing $defs: %+v", e)
	}
	// A function without parameters takes an empty object.
	cfg, _ = parseTools(chatRequestOf(t, `{"messages": [], "tools": [{"type": "function", "function": {"name": "now"}}], "tool_choice": {"type": "function", "function": {"name": "now"}}}`))
	if c, _ := cfg.constraint(); c == nil || c.so.JSONSchema != string(emptyParameters) {
		t.Fatalf("no parameters: %+v", c)
	}
}

// wantCall is a tool call as a test expects it.
type wantCall struct{ name, args string }

// checkAnswer checks parseToolAnswer's content and calls, and that
// feeding the text one byte at a time gives the same.
func checkAnswer(t *testing.T, cfg *toolConfig, text string, content *string, calls []wantCall) {
	t.Helper()
	n := 0
	ids := func() string { n++; return fmt.Sprintf("call-%d", n) }
	gotContent, gotCalls := parseToolAnswer(cfg, text, ids)
	if (gotContent == nil) != (content == nil) || gotContent != nil && *gotContent != *content {
		t.Fatalf("content %s, want %s", show(gotContent), show(content))
	}
	if len(gotCalls) != len(calls) {
		t.Fatalf("calls %+v, want %+v", gotCalls, calls)
	}
	for i, c := range gotCalls {
		if c.Index != nil || c.Type != "function" || c.ID != fmt.Sprintf("call-%d", i+1) || c.Function.Name != calls[i].name || c.Function.Arguments != calls[i].args {
			t.Fatalf("call %d: %+v, want %+v", i, c, calls[i])
		}
	}
	// Streamed one byte at a time.
	p := newToolParser(cfg, func() string { return "id" })
	if p == nil {
		return // tool_choice "none": the text is the content
	}
	var b strings.Builder
	var streamed []ToolCall
	for i := 0; i < len(text); i++ {
		d := p.feed(text[i : i+1])
		b.WriteString(d.content)
		streamed = mergeDeltas(streamed, d.calls)
	}
	d := p.finish()
	b.WriteString(d.content)
	streamed = mergeDeltas(streamed, d.calls)
	want := ""
	if gotContent != nil {
		want = *gotContent
	}
	if b.String() != want || len(streamed) != len(gotCalls) {
		t.Fatalf("streamed: content %q and %d calls, whole: %q and %d", b.String(), len(streamed), want, len(gotCalls))
	}
	for i := range streamed {
		if streamed[i].Function != gotCalls[i].Function {
			t.Fatalf("streamed call %d: %+v, whole %+v", i, streamed[i].Function, gotCalls[i].Function)
		}
	}
}

func show(s *string) string {
	if s == nil {
		return "null"
	}
	return fmt.Sprintf("%q", *s)
}

func ptr(s string) *string { return &s }

// The Hermes parser of tool_choice "auto": blocks are calls, the text
// around them content; blocks that do not parse stay content.
func TestHermesToolParser(t *testing.T) {
	auto := &toolConfig{mode: toolsAuto, parallel: true}
	single := &toolConfig{mode: toolsAuto}
	tests := []struct {
		name    string
		cfg     *toolConfig
		text    string
		content *string
		calls   []wantCall
	}{
		{"plain text", auto, "Hello there.", ptr("Hello there."), nil},
		{"empty", auto, "", ptr(""), nil},
		{"one call", auto, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", nil,
			[]wantCall{{"get_weather", `{"city":"Paris"}`}}},
		{"text and two calls", auto, "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n",
			ptr("Let me check."), []wantCall{{"a", `{"x":1}`}, {"b", `{}`}}},
		{"text after", auto, "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": [1, 2]}}</tool_call> done", ptr("done"), []wantCall{{"a", `{"k":[1,2]}`}}},
		{"key order kept", auto, "<tool_call>{\"name\": \"a\", \"arguments\": {\"z\": 1, \"a\": 2}}</tool_call>", nil, []wantCall{{"a", `{"z":1,"a":2}`}}},
		{"string arguments", auto, "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>", nil, []wantCall{{"a", `{"x": 1}`}}},
		{"parameters key", auto, "<tool_call>{\"name\": \"a\", \"parameters\": {\"x\": 1}}</tool_call>", nil, []wantCall{{"a", `{"x":1}`}}},
		{"no arguments", auto, "<tool_call>{\"name\": \"a\"}</tool_call>", nil, []wantCall{{"a", `{}`}}},
		{"unclosed last block", auto, "ok <tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n", ptr("ok"), []wantCall{{"a", `{}`}}},
		{"bad block stays content", auto, "<tool_call>{not json}</tool_call>", ptr("<tool_call>{not json}</tool_call>"), nil},
		{"nameless block stays content", auto, "<tool_call>{\"arguments\": {}}</tool_call>", ptr("<tool_call>{\"arguments\": {}}</tool_call>"), nil},
		{"unclosed bad block", auto, "x <tool_call>{\"name\": ", ptr("x <tool_call>{\"name\": "), nil},
		{"verbatim without calls", auto, "  text \n", ptr("  text \n"), nil},
		{"whitespace before a first block", auto, " \n<tool_call>{\"name\": \"a\"}</tool_call> \n", nil, []wantCall{{"a", `{}`}}},
		{"partial tag at the end", auto, "a <tool_ca", ptr("a <tool_ca"), nil},
		{"tag-like text", auto, "use <tool> and <tool_cal>", ptr("use <tool> and <tool_cal>"), nil},
		{"whitespace between pieces kept once", auto, "A\n<tool_call>{\"name\": \"a\"}</tool_call>\nB", ptr("A\nB"), []wantCall{{"a", `{}`}}},
		{"one call when not parallel", single, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>", nil, []wantCall{{"a", `{}`}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkAnswer(t, tc.cfg, tc.text, tc.content, tc.calls) })
	}
}

// The parsers of tool_choice "required" (an array of calls) and of a
// named function (the text is the arguments).
func TestConstrainedToolParsers(t *testing.T) {
	required := &toolConfig{mode: toolsRequired, parallel: true}
	single := &toolConfig{mode: toolsRequired}
	named := &toolConfig{mode: toolsNamed, named: "get_weather", parallel: true}
	tests := []struct {
		name    string
		cfg     *toolConfig
		text    string
		content *string
		calls   []wantCall
	}{
		{"one call", required, `[{"name": "get_weather", "parameters": {"city": "Paris"}}]`, nil, []wantCall{{"get_weather", `{"city":"Paris"}`}}},
		{"two calls", required, ` [ {"name": "a", "parameters": {"s": "}]\"["}} , {"name": "b", "parameters": {}} ] `, nil,
			[]wantCall{{"a", `{"s":"}]\"["}`}, {"b", `{}`}}},
		{"nested values", required, `[{"name": "a", "parameters": {"l": [{"x": [1]}], "o": {"p": {}}}}]`, nil, []wantCall{{"a", `{"l":[{"x":[1]}],"o":{"p":{}}}`}}},
		{"cut before the first call ends", required, `[{"name": "a", "parameters": {"x": `, ptr(`[{"name": "a", "parameters": {"x":`), nil},
		{"cut after a call", required, `[{"name": "a", "parameters": {}}, {"name": "b", "para`, nil, []wantCall{{"a", `{}`}}},
		{"not calls", required, `[1, 2]`, ptr(`[1, 2]`), nil},
		{"one call when not parallel", single, `[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {}}]`, nil, []wantCall{{"a", `{}`}}},
		{"named", named, ` {"city": "Paris"} `, nil, []wantCall{{"get_weather", `{"city": "Paris"}`}}},
		{"named, empty output", named, ``, nil, []wantCall{{"get_weather", ``}}},
		{"named, cut", named, `{"city": "Par`, nil, []wantCall{{"get_weather", `{"city": "Par`}}},
		{"none", &toolConfig{mode: toolsNone}, " text ", ptr(" text "), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkAnswer(t, tc.cfg, tc.text, tc.content, tc.calls) })
	}
}

// A named function's arguments stream as they come: the first delta has
// the index, id, type and name, later ones only arguments.
func TestNamedToolDeltas(t *testing.T) {
	p := newToolParser(&toolConfig{mode: toolsNamed, named: "f"}, func() string { return "chatcmpl-tool-1" })
	var got []ToolCall
	for _, piece := range []string{" ", `{"a"`, `: 1`, "}", "\n"} {
		got = append(got, p.feed(piece).calls...)
	}
	got = append(got, p.finish().calls...)
	data, _ := json.Marshal(got)
	want := `[{"index":0,"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":"{\"a\""}},` +
		`{"index":0,"function":{"arguments":": 1"}},{"index":0,"function":{"arguments":"}"}}]`
	if string(data) != want {
		t.Fatalf("deltas\n%s\nwant\n%s", data, want)
	}
}

// Conversations with tool calls and tool results are accepted: a
// template that renders tool_calls gets them (arguments as objects), one
// that does not gets Hermes blocks in the content, tool results wrapped,
// and the tools in the system prompt. Malformed tool parts are refused.
func TestPrepareChatHistory(t *testing.T) {
	history := `[{"role": "user", "content": "weather in Paris?"},
		{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},
		{"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]`
	msgsOf := func(body string) ([]tokenizer.Message, *toolConfig) {
		req := chatRequestOf(t, body)
		msgs, e := parseMessages(req.Messages)
		if e != nil {
			t.Fatal(e.msg)
		}
		cfg, e := parseTools(req)
		if e != nil {
			t.Fatal(e.msg)
		}
		return msgs, cfg
	}
	msgs, cfg := msgsOf(`{"messages": ` + history + `, "tools": ` + weatherTools + `}`)

	aware := "{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{{ m.content }}{% endfor %}{{ tools | tojson }}"
	out, e := prepareChat(msgs, aware, cfg)
	if e != nil {
		t.Fatal(e.msg)
	}
	if len(out) != 3 || out[2].Content != "21 C" || out[1].Content != "" {
		t.Fatalf("tool-aware template: %+v", out)
	}
	if want := `{"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}}]}`; string(out[1].Fields) != want {
		t.Fatalf("assistant fields %s, want %s", out[1].Fields, want)
	}
	if string(msgs[1].Fields) == string(out[1].Fields) {
		t.Fatal("prepareChat changed its input")
	}

	plain := "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
	out, e = prepareChat(msgs, plain, cfg)
	if e != nil {
		t.Fatal(e.msg)
	}
	if len(out) != 4 || out[0].Role != "system" || !strings.Contains(out[0].Content, "<tools>\n"+`{"type":"function","function":{"name":"get_weather"`) ||
		!strings.Contains(out[0].Content, `{"name": <function-name>, "arguments": <args-json-object>}`) {
		t.Fatalf("system prompt: %+v", out)
	}
	if want := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"c\"}}\n</tool_call>"; out[2].Content != want {
		t.Fatalf("assistant content %q, want %q", out[2].Content, want)
	}
	if out[3].Content != "<tool_response>\n21 C\n</tool_response>" {
		t.Fatalf("tool content %q", out[3].Content)
	}
	// A system message of the request gets the tools appended; tool_choice
	// "none" lists none.
	msgs2, cfg2 := msgsOf(`{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], "tools": ` + weatherTools + `}`)
	out, _ = prepareChat(msgs2, plain, cfg2)
	if len(out) != 2 || !strings.HasPrefix(out[0].Content, "Be brief.\n\n# Tools\n") {
		t.Fatalf("system message: %+v", out)
	}
	cfg2.mode = toolsNone
	if out, _ = prepareChat(msgs2, plain, cfg2); out[0].Content != "Be brief." {
		t.Fatalf("tool_choice none: %+v", out)
	}

	for _, tc := range []struct{ messages, param, msg string }{
		{`[{"role": "user", "content": "x", "tool_calls": []}]`, "messages[0].tool_calls", "only assistant messages"},
		{`[{"role": "assistant", "tool_calls": {}}]`, "messages[0].tool_calls", "must be an array"},
		{`[{"role": "assistant", "tool_calls": [1]}]`, "messages[0].tool_calls[0]", "must be an object"},
		{`[{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}]`, "messages[0].tool_calls[0].type", `must be "function"`},
		{`[{"role": "assistant", "tool_calls": [{"id": 1, "function": {"name": "f"}}]}]`, "messages[0].tool_calls[0].id", "must be a string"},
		{`[{"role": "assistant", "tool_calls": [{"id": "c"}]}]`, "messages[0].tool_calls[0].function", "must be an object"},
		{`[{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]`, "messages[0].tool_calls[0].function.name", "non-empty string"},
		{`[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]`, "messages[0].tool_calls[0].function.arguments", "must be a string"},
		{`[{"role": "tool", "tool_call_id": 7, "content": "x"}]`, "messages[0].tool_call_id", "must be a string"},
	} {
		msgs, cfg := msgsOf(`{"messages": ` + tc.messages + `}`)
		if _, e := prepareChat(msgs, plain, cfg); e == nil || e.param != tc.param || !strings.Contains(e.msg, tc.msg) {
			t.Errorf("%s: error %+v, want %q (param %q)", tc.messages, e, tc.msg, tc.param)
		}
	}
}

// A conversation with tool calls and results goes through the server:
// the tool list, the calls and the results are in the prompt the model
// gets, and a template that renders tools gets them as its variable.
func TestChatHistoryWithTools(t *testing.T) {
	body := func(extra string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal([]byte(`{"max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "weather in Paris?"},
			{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
			{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]`+extra+`}`), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	ts := startServer(t, nil, Options{})
	prompt := ts.tok.Decode(promptIDs(t, ts, body(`, "tools": `+weatherTools)), false)
	for _, want := range []string{"system: # Tools", `"name":"get_time"`, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>", "tool: <tool_response>\nsunny\n</tool_response>"} {
		if !strings.Contains(prompt, want) {
			t.Fatalf("prompt %q lacks %q", prompt, want)
		}
	}
	aware := "{% if tools %}[{% for t in tools %}{{ t.function.name }};{% endfor %}]{% endif %}" +
		"{% for m in messages %}{{ m.role }}: {% if m.tool_calls %}{% for c in m.tool_calls %}call {{ c.function.name }} {{ c.function.arguments.city }}{% endfor %}{% endif %}{{ m.content }}|{% endfor %}assistant:"
	dir := chatModel(t, aware)
	ta := startServer(t, func(c *config.Config) { c.Model = dir }, Options{})
	prompt = ta.tok.Decode(promptIDs(t, ta, body(`, "tools": `+weatherTools)), false)
	if want := "[get_weather;get_time;]user: weather in Paris?|assistant: call get_weather Paris|tool: sunny|assistant:"; prompt != want {
		t.Fatalf("tool-aware template: prompt %q, want %q", prompt, want)
	}
}
