package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// Tool calling, as vLLM's OpenAI server does it.
//
// The request's tools reach the chat template as its tools variable (as
// transformers' apply_chat_template passes them). A template that never
// names tools (the shipped default model's) gets them in the system
// prompt instead, in the Hermes format: the function signatures inside
// <tools></tools> and the instruction to answer with
// <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks; such a
// template also gets earlier assistant tool calls written into their
// message as those blocks, and tool results wrapped in
// <tool_response></tool_response>.
//
// tool_choice decides the answer:
//
//   - "none": plain text, as without tools.
//   - "auto" (the default with tools): the text is parsed as the Hermes
//     format (Hermes, Qwen 2.5 and 3): each <tool_call> block holding
//     {"name", "arguments"} becomes a tool call; the text outside the
//     blocks is the content. Blocks that do not parse stay in the content.
//   - "required": the output is constrained to a JSON array of calls,
//     [{"name": <one of the tools>, "parameters": <its parameters schema>}, ...].
//   - a named function: the output is constrained to that function's
//     parameters schema and is its arguments.
//
// With tool calls, the message's content is null when there is no other
// text, tool_calls lists them ({"id": "chatcmpl-tool-...", "type":
// "function", "function": {"name", "arguments"}}, arguments a JSON
// string) and finish_reason is "tool_calls" when generation stopped by
// itself. parallel_tool_calls false allows one call. Streamed, each call's
// first delta carries its index, id, type and name; a named function's
// arguments stream as they are generated, the other modes send each call
// whole once it is complete.

// Tool choice modes.
const (
	toolsNone     = "none"
	toolsAuto     = "auto"
	toolsRequired = "required"
	toolsNamed    = "named"
)

// toolSpec is one function of a request's tools.
type toolSpec struct {
	name       string
	parameters json.RawMessage // a JSON Schema object; nil when not given
}

// toolConfig is what a chat request asks of tools: mode is toolsNone when
// it has none.
type toolConfig struct {
	tools    []toolSpec
	raw      json.RawMessage // the tools as given: the chat template's tools
	mode     string
	named    string // the function of toolsNamed
	parallel bool   // more than one call allowed
}

// parseTools reads a chat request's tools, tool_choice and
// parallel_tool_calls. tool_choice defaults to "auto" with tools and
// "none" without; "auto" without tools is no tools; "required" or a named
// function without tools, an unknown name, or a malformed tool answer
// 400 naming the field.
func parseTools(req *ChatCompletionRequest) (*toolConfig, *apiError) {
	cfg := &toolConfig{mode: toolsNone, parallel: req.ParallelToolCalls == nil || *req.ParallelToolCalls}
	if present(req.Tools) {
		tools, e := readTools(req.Tools)
		if e != nil {
			return nil, e
		}
		cfg.tools = tools
		if len(tools) > 0 {
			cfg.raw = req.Tools
			cfg.mode = toolsAuto
		}
	}
	if !present(req.ToolChoice) {
		return cfg, nil
	}
	mode, name, e := readToolChoice(req.ToolChoice)
	if e != nil {
		return nil, e
	}
	switch {
	case mode == toolsNone:
		cfg.mode = toolsNone
	case len(cfg.tools) == 0 && mode == toolsAuto:
	case len(cfg.tools) == 0:
		return nil, badRequest("tool_choice", "tool_choice %s needs tools: set tools", compact(req.ToolChoice))
	case mode == toolsNamed && !slices.ContainsFunc(cfg.tools, func(t toolSpec) bool { return t.name == name }):
		return nil, badRequest("tool_choice.function.name", "tool_choice names the function %q, which is not one of the tools", name)
	default:
		cfg.mode, cfg.named = mode, name
	}
	return cfg, nil
}

// readTools reads the tools array: each {"type": "function", "function":
// {"name", "description", "parameters", "strict"}}, names unique.
func readTools(raw json.RawMessage) ([]toolSpec, *apiError) {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, badRequest("tools", "tools must be an array of tool objects, got %s", jsonKindOf(raw))
	}
	tools := make([]toolSpec, len(items))
	for i, item := range items {
		field := fmt.Sprintf("tools[%d]", i)
		obj, err := parseObject(item)
		if err != nil {
			return nil, badRequest(field, `%s must be an object {"type": "function", "function": {...}}, got %s`, field, jsonKindOf(item))
		}
		if e := checkKeys(obj, field, "type", "function"); e != nil {
			return nil, e
		}
		var typ string
		if json.Unmarshal(obj.get("type"), &typ) != nil || typ != "function" {
			return nil, badRequest(field+".type", `%s.type must be "function"`, field)
		}
		t, e := readFunction(obj.get("function"), field+".function")
		if e != nil {
			return nil, e
		}
		for j := range i {
			if tools[j].name == t.name {
				return nil, badRequest(field+".function.name", "%s.function.name: the function %q is defined twice", field, t.name)
			}
		}
		tools[i] = t
	}
	return tools, nil
}

// readFunction reads a tool's function definition.
func readFunction(raw json.RawMessage, field string) (toolSpec, *apiError) {
	if !present(raw) {
		return toolSpec{}, badRequest(field, `%s is required: {"name": ..., "parameters": {...}}`, field)
	}
	obj, err := parseObject(raw)
	if err != nil {
		return toolSpec{}, badRequest(field, "%s must be an object with a name, got %s", field, jsonKindOf(raw))
	}
	if e := checkKeys(obj, field, "name", "description", "parameters", "strict"); e != nil {
		return toolSpec{}, e
	}
	var t toolSpec
	if json.Unmarshal(obj.get("name"), &t.name) != nil || t.name == "" {
		return toolSpec{}, badRequest(field+".name", "%s.name must be a non-empty string", field)
	}
	var desc string
	if v := obj.get("description"); present(v) && json.Unmarshal(v, &desc) != nil {
		return toolSpec{}, badRequest(field+".description", "%s.description must be a string", field)
	}
	var strict bool
	if v := obj.get("strict"); present(v) && json.Unmarshal(v, &strict) != nil {
		return toolSpec{}, badRequest(field+".strict", "%s.strict must be a boolean", field)
	}
	if v := obj.get("parameters"); present(v) {
		if bytes.TrimSpace(v)[0] != '{' {
			return toolSpec{}, badRequest(field+".parameters", "%s.parameters must be a JSON Schema object, got %s", field, jsonKindOf(v))
		}
		t.parameters = v
	}
	return t, nil
}

// readToolChoice reads tool_choice: a mode, and the function's name for
// toolsNamed.
func readToolChoice(raw json.RawMessage) (mode, name string, e *apiError) {
	const field = "tool_choice"
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case toolsNone, toolsAuto, toolsRequired:
			return s, "", nil
		}
		return "", "", badRequest(field, `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}, got %q`, s)
	}
	obj, err := parseObject(raw)
	if err != nil {
		return "", "", badRequest(field, `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}, got %s`, jsonKindOf(raw))
	}
	if e := checkKeys(obj, field, "type", "function"); e != nil {
		return "", "", e
	}
	var typ string
	if json.Unmarshal(obj.get("type"), &typ) != nil || typ != "function" {
		return "", "", badRequest(field+".type", `tool_choice.type must be "function"`)
	}
	fn, err := parseObject(obj.get("function"))
	if err != nil {
		return "", "", badRequest(field+".function", `tool_choice.function must be an object {"name": ...}`)
	}
	if e := checkKeys(fn, field+".function", "name"); e != nil {
		return "", "", e
	}
	if json.Unmarshal(fn.get("name"), &name) != nil || name == "" {
		return "", "", badRequest(field+".function.name", "tool_choice.function.name must be a non-empty string")
	}
	return toolsNamed, name, nil
}

// emptyParameters is the schema of a function that declares no parameters.
var emptyParameters = json.RawMessage(`{"type":"object","properties":{}}`)

// schemaOf is t's parameters schema, or emptyParameters.
func (t toolSpec) schemaOf() json.RawMessage {
	if t.parameters == nil {
		return emptyParameters
	}
	return t.parameters
}

// constraint is the structured-output constraint of cfg's mode: the named
// function's parameters schema, or for "required" a JSON array of calls
// (see requiredSchema); nil for "none" and "auto".
func (cfg *toolConfig) constraint() (*constraint, *apiError) {
	var schema json.RawMessage
	switch cfg.mode {
	case toolsNamed:
		i := slices.IndexFunc(cfg.tools, func(t toolSpec) bool { return t.name == cfg.named })
		schema = cfg.tools[i].schemaOf()
	case toolsRequired:
		var e *apiError
		if schema, e = requiredSchema(cfg.tools, cfg.parallel); e != nil {
			return nil, e
		}
	default:
		return nil, nil
	}
	text, err := compactJSON(schema)
	if err != nil {
		return nil, badRequest("tools", "tools: %v", err)
	}
	return &constraint{so: &engine.StructuredOutput{JSONSchema: text}, field: "tool_choice"}, nil
}

// requiredSchema is vLLM's schema for tool_choice "required": an array of
// at least one call (at most one unless parallel), each an object
// {"name": <a tool's name>, "parameters": <that tool's schema>} (anyOf
// over the tools). The tools' $defs and definitions move to the root,
// where their "#/$defs/..." references point; a name two tools define
// differently answers 400.
func requiredSchema(tools []toolSpec, parallel bool) (json.RawMessage, *apiError) {
	defs := map[string]jsonObject{}
	branches := make([]json.RawMessage, len(tools))
	for i, t := range tools {
		params, err := parseObject(t.schemaOf())
		if err != nil {
			return nil, badRequest(fmt.Sprintf("tools[%d].function.parameters", i), "tools[%d].function.parameters: %v", i, err)
		}
		for _, key := range []string{"$defs", "definitions"} {
			v := params.get(key)
			if v == nil {
				continue
			}
			field := fmt.Sprintf("tools[%d].function.parameters.%s", i, key)
			d, err := parseObject(v)
			if err != nil {
				return nil, badRequest(field, "%s must be an object", field)
			}
			for _, m := range d {
				have, ok := memberOf(defs[key], m.Key)
				if ok && !sameJSON(have, m.Value) {
					return nil, badRequest(field, "%s: %q is defined differently by another tool; tool_choice \"required\" needs one definition per name", field, m.Key)
				}
				if !ok {
					defs[key] = append(defs[key], m)
				}
			}
			params = params.without(key)
		}
		name, _ := json.Marshal(t.name)
		branch, err := json.Marshal(jsonObject{
			{"properties", mustJSON(jsonObject{
				{"name", mustJSON(jsonObject{{"type", json.RawMessage(`"string"`)}, {"enum", json.RawMessage("[" + string(name) + "]")}})},
				{"parameters", mustJSON(params)},
			})},
			{"required", json.RawMessage(`["name","parameters"]`)},
			{"additionalProperties", json.RawMessage("false")},
		})
		if err != nil {
			return nil, badRequest("tools", "tools: %v", err)
		}
		branches[i] = branch
	}
	anyOf, _ := json.Marshal(branches)
	root := jsonObject{
		{"type", json.RawMessage(`"array"`)},
		{"minItems", json.RawMessage("1")},
	}
	if !parallel {
		root = append(root, jsonMember{"maxItems", json.RawMessage("1")})
	}
	root = append(root, jsonMember{"items", mustJSON(jsonObject{{"type", json.RawMessage(`"object"`)}, {"anyOf", anyOf}})})
	for _, key := range []string{"$defs", "definitions"} {
		if len(defs[key]) > 0 {
			root = append(root, jsonMember{key, mustJSON(defs[key])})
		}
	}
	out, err := json.Marshal(root)
	if err != nil {
		return nil, badRequest("tools", "tools: %v", err)
	}
	return out, nil
}

// mustJSON marshals an object built from valid JSON values.
func mustJSON(o jsonObject) json.RawMessage {
	b, err := o.MarshalJSON()
	if err != nil {
		panic(err) // every value comes from a decoder or a literal
	}
	return b
}

// memberOf is the value of key in o.
func memberOf(o jsonObject, key string) (json.RawMessage, bool) {
	v := o.get(key)
	return v, v != nil
}

// sameJSON reports whether a and b are the same JSON text but for
// whitespace.
func sameJSON(a, b json.RawMessage) bool {
	ca, errA := compactJSON(a)
	cb, errB := compactJSON(b)
	return errA == nil && errB == nil && ca == cb
}

// templateNameRes find the identifiers templateNames looks for.
var templateNameRes = map[string]*regexp.Regexp{
	"tools":      regexp.MustCompile(`\btools\b`),
	"tool_calls": regexp.MustCompile(`\btool_calls\b`),
}

// templateNames reports whether the template src names ident, "tools" or
// "tool_calls" (as a variable, attribute or key).
func templateNames(src, ident string) bool {
	return templateNameRes[ident].MatchString(src)
}

// Hermes tool-call format.
const (
	toolCallOpen      = "<tool_call>"
	toolCallClose     = "</tool_call>"
	toolResponseOpen  = "<tool_response>"
	toolResponseClose = "</tool_response>"
)

// hermesToolsPrompt is the system prompt that lists tools for a template
// that does not render them (Qwen 2.5's wording).
func hermesToolsPrompt(raw json.RawMessage) string {
	var items []json.RawMessage
	json.Unmarshal(raw, &items) // validated by readTools
	var b strings.Builder
	b.WriteString("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n")
	b.WriteString("You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
	for _, it := range items {
		c, _ := compactJSON(it)
		b.WriteString("\n" + c)
	}
	b.WriteString("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n")
	b.WriteString(toolCallOpen + "\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n" + toolCallClose)
	return b.String()
}

// historyCall is a tool call of an earlier assistant message.
type historyCall struct {
	name      string
	arguments json.RawMessage // a JSON value: the arguments object, or the string as sent
}

// prepareChat checks the tool parts of a conversation and fits them to
// the chat template src: assistant tool_calls must be [{"id", "type":
// "function", "function": {"name", "arguments"}}] and a tool_call_id (of
// a tool message) a string (400 naming the field otherwise). A template that names
// tool_calls gets each call's arguments as an object when the string holds
// one (as vLLM passes them; templates render them with tojson); one that
// does not gets the calls written into the message's content as Hermes
// blocks and tool results wrapped in <tool_response>. A template that does
// not name tools gets cfg's tools listed in the system prompt (unless
// tool_choice is "none"). msgs is not modified.
func prepareChat(msgs []tokenizer.Message, src string, cfg *toolConfig) ([]tokenizer.Message, *apiError) {
	out := slices.Clone(msgs)
	rendersCalls := templateNames(src, "tool_calls")
	for i := range out {
		if e := prepareMessage(&out[i], i, rendersCalls); e != nil {
			return nil, e
		}
	}
	if cfg.mode == toolsNone || templateNames(src, "tools") {
		return out, nil
	}
	prompt := hermesToolsPrompt(cfg.raw)
	if len(out) > 0 && out[0].Role == "system" {
		out[0].Content = strings.TrimRight(out[0].Content, "\n") + "\n\n" + prompt
		return out, nil
	}
	return append([]tokenizer.Message{{Role: "system", Content: prompt}}, out...), nil
}

// prepareMessage checks and adapts message i (see prepareChat).
func prepareMessage(m *tokenizer.Message, i int, rendersCalls bool) *apiError {
	field := fmt.Sprintf("messages[%d]", i)
	var fields jsonObject
	if m.Fields != nil {
		var err error
		if fields, err = parseObject(m.Fields); err != nil {
			return badRequest(field, "%s: %v", field, err)
		}
	}
	var id string
	if v := fields.get("tool_call_id"); present(v) && json.Unmarshal(v, &id) != nil {
		return badRequest(field+".tool_call_id", "%s.tool_call_id must be a string", field)
	}
	if m.Role == "tool" {
		if !rendersCalls {
			m.Content = toolResponseOpen + "\n" + m.Content + "\n" + toolResponseClose
		}
	}
	raw := fields.get("tool_calls")
	if !present(raw) {
		return nil
	}
	if m.Role != "assistant" {
		return badRequest(field+".tool_calls", "%s.tool_calls: only assistant messages carry tool calls", field)
	}
	calls, rewritten, e := readHistoryCalls(raw, field+".tool_calls")
	if e != nil {
		return e
	}
	if rendersCalls {
		m.Fields = mustJSON(fields.with("tool_calls", rewritten))
		return nil
	}
	blocks := make([]string, len(calls))
	for j, c := range calls {
		name, _ := json.Marshal(c.name)
		args, _ := compactJSON(c.arguments)
		blocks[j] = toolCallOpen + "\n{\"name\": " + string(name) + ", \"arguments\": " + args + "}\n" + toolCallClose
	}
	if m.Content != "" {
		blocks = append([]string{m.Content}, blocks...)
	}
	m.Content = strings.Join(blocks, "\n")
	return nil
}

// readHistoryCalls reads an assistant message's tool_calls; rewritten is
// the same array with each arguments string that holds a JSON object
// replaced by the object.
func readHistoryCalls(raw json.RawMessage, field string) (calls []historyCall, rewritten json.RawMessage, e *apiError) {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, nil, badRequest(field, "%s must be an array of tool calls", field)
	}
	out := make([]json.RawMessage, len(items))
	for j, item := range items {
		f := fmt.Sprintf("%s[%d]", field, j)
		obj, err := parseObject(item)
		if err != nil {
			return nil, nil, badRequest(f, `%s must be an object {"id", "type": "function", "function": {"name", "arguments"}}`, f)
		}
		var typ string
		if v := obj.get("type"); present(v) && (json.Unmarshal(v, &typ) != nil || typ != "function") {
			return nil, nil, badRequest(f+".type", `%s.type must be "function"`, f)
		}
		var id string
		if v := obj.get("id"); present(v) && json.Unmarshal(v, &id) != nil {
			return nil, nil, badRequest(f+".id", "%s.id must be a string", f)
		}
		fn, err := parseObject(obj.get("function"))
		if err != nil {
			return nil, nil, badRequest(f+".function", `%s.function must be an object {"name", "arguments"}`, f)
		}
		var c historyCall
		if json.Unmarshal(fn.get("name"), &c.name) != nil || c.name == "" {
			return nil, nil, badRequest(f+".function.name", "%s.function.name must be a non-empty string", f)
		}
		args := fn.get("arguments")
		switch kind := jsonKindOf(args); {
		case !present(args):
			args = json.RawMessage("{}")
		case kind == "a string":
			var s string
			json.Unmarshal(args, &s)
			if obj, err := parseObject(json.RawMessage(s)); err == nil {
				args = mustJSON(obj)
			}
		case kind != "an object":
			return nil, nil, badRequest(f+".function.arguments", "%s.function.arguments must be a string (or an object), got %s", f, kind)
		}
		c.arguments = args
		calls = append(calls, c)
		out[j] = mustJSON(obj.with("function", mustJSON(fn.with("arguments", args))))
	}
	rewritten, _ = json.Marshal(out)
	return calls, rewritten, nil
}
