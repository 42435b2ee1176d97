package server

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine"
)

// Structured output: the request fields that constrain the output to a
// formal language, as vLLM's OpenAI server reads them.
//
//	response_format      {"type": "text"} (none), {"type": "json_object"},
//	                     {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
//	guided_json          a JSON schema (an object, or a string holding one)
//	guided_regex         a regular expression the whole output matches
//	guided_choice        an array of strings, the output is one of them
//	guided_grammar       a GBNF grammar (llama.cpp's syntax, start rule root)
//	structured_outputs   {json, regex, choice, grammar, json_object, disable_any_whitespace, disable_fallback}
//
// At most one constraint may be set across all of them. The chat
// endpoint's tool_choice "required" and named functions set one too
// (see tools.go).

// constraint is a request's structured-output constraint and the request
// field that set it (named in errors, including the engine's compile
// errors).
type constraint struct {
	so    *engine.StructuredOutput
	field string
}

// structuredOutput reads the structured-output fields of f into one
// constraint; nil, nil when none asks for one. A malformed field, an
// unsupported one, or two constraints at once answer 400 naming the field.
// Schemas are passed on as written (compacted, key order kept).
func structuredOutput(f *SamplingFields) (*constraint, *apiError) {
	if present(f.GuidedWhitespacePattern) {
		return nil, badRequest("guided_whitespace_pattern", "guided_whitespace_pattern is not supported; use structured_outputs.disable_any_whitespace for JSON without whitespace")
	}
	var found []constraint
	add := func(so *engine.StructuredOutput, field string) {
		if so != nil {
			found = append(found, constraint{so, field})
		}
	}
	if present(f.ResponseFormat) {
		so, e := responseFormat(f.ResponseFormat)
		if e != nil {
			return nil, e
		}
		add(so, "response_format")
	}
	for _, g := range []struct {
		field string
		raw   json.RawMessage
		read  func(json.RawMessage, string) (*engine.StructuredOutput, *apiError)
	}{
		{"guided_json", f.GuidedJSON, readJSONSchema},
		{"guided_regex", f.GuidedRegex, readRegex},
		{"guided_choice", f.GuidedChoice, readChoice},
		{"guided_grammar", f.GuidedGrammar, readGrammar},
	} {
		if !present(g.raw) {
			continue
		}
		so, e := g.read(g.raw, g.field)
		if e != nil {
			return nil, e
		}
		add(so, g.field)
	}
	whitespace := ""
	if present(f.StructuredOutputs) {
		so, ws, e := structuredOutputs(f.StructuredOutputs)
		if e != nil {
			return nil, e
		}
		whitespace = ws
		for _, c := range so {
			add(c.so, c.field)
		}
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
	default:
		names := make([]string, len(found))
		for i, c := range found {
			names[i] = c.field
		}
		return nil, badRequest(found[1].field, "only one structured-output constraint may be set, got %s", strings.Join(names, " and "))
	}
	c := found[0]
	c.so.Whitespace = whitespace
	return &c, nil
}

// responseFormat reads OpenAI's response_format: nil for "text".
func responseFormat(raw json.RawMessage) (*engine.StructuredOutput, *apiError) {
	const field = "response_format"
	obj, err := parseObject(raw)
	if err != nil {
		return nil, badRequest(field, `response_format must be an object such as {"type": "json_object"}, got %s`, jsonKindOf(raw))
	}
	var typ string
	if json.Unmarshal(obj.get("type"), &typ) != nil {
		return nil, badRequest(field+".type", `response_format.type must be "text", "json_object" or "json_schema"`)
	}
	switch typ {
	case "text", "json_object":
		if e := checkKeys(obj, field, "type"); e != nil {
			return nil, e
		}
		if typ == "text" {
			return nil, nil
		}
		return &engine.StructuredOutput{JSONObject: true}, nil
	case "json_schema":
		if e := checkKeys(obj, field, "type", "json_schema"); e != nil {
			return nil, e
		}
		return jsonSchemaFormat(obj.get("json_schema"))
	case "structural_tag":
		return nil, badRequest(field+".type", `response_format.type "structural_tag" is not supported`)
	}
	return nil, badRequest(field+".type", `response_format.type must be "text", "json_object" or "json_schema", got %q`, typ)
}

// jsonSchemaFormat reads response_format.json_schema: {"name", "schema",
// "strict", "description"}; name and schema are required.
func jsonSchemaFormat(raw json.RawMessage) (*engine.StructuredOutput, *apiError) {
	const field = "response_format.json_schema"
	if !present(raw) {
		return nil, badRequest(field, `response_format of type "json_schema" needs a json_schema object: {"name": ..., "schema": {...}}`)
	}
	obj, err := parseObject(raw)
	if err != nil {
		return nil, badRequest(field, "%s must be an object, got %s", field, jsonKindOf(raw))
	}
	if e := checkKeys(obj, field, "name", "schema", "strict", "description"); e != nil {
		return nil, e
	}
	var name string
	if json.Unmarshal(obj.get("name"), &name) != nil || name == "" {
		return nil, badRequest(field+".name", "%s.name must be a non-empty string", field)
	}
	var strict *bool
	if v := obj.get("strict"); present(v) && json.Unmarshal(v, &strict) != nil {
		return nil, badRequest(field+".strict", "%s.strict must be a boolean", field)
	}
	var desc *string
	if v := obj.get("description"); present(v) && json.Unmarshal(v, &desc) != nil {
		return nil, badRequest(field+".description", "%s.description must be a string", field)
	}
	schema := obj.get("schema")
	if !present(schema) {
		return nil, badRequest(field+".schema", "%s.schema is required", field)
	}
	if bytes.TrimSpace(schema)[0] != '{' {
		return nil, badRequest(field+".schema", "%s.schema must be a JSON Schema object, got %s", field, jsonKindOf(schema))
	}
	text, err := compactJSON(schema)
	if err != nil {
		return nil, badRequest(field+".schema", "%s.schema: %v", field, err)
	}
	return &engine.StructuredOutput{JSONSchema: text}, nil
}

// readJSONSchema reads a JSON schema given as an object or as a string
// holding one (vLLM's guided_json and structured_outputs.json).
func readJSONSchema(raw json.RawMessage, field string) (*engine.StructuredOutput, *apiError) {
	doc := []byte(bytes.TrimSpace(raw))
	if doc[0] == '"' {
		var s string
		if json.Unmarshal(doc, &s) != nil {
			return nil, badRequest(field, "%s is not a valid string", field)
		}
		doc = bytes.TrimSpace([]byte(s))
		if !json.Valid(doc) {
			return nil, badRequest(field, "%s: the string is not a JSON document", field)
		}
	}
	if len(doc) == 0 || doc[0] != '{' {
		return nil, badRequest(field, "%s must be a JSON Schema object (or a string holding one), got %s", field, jsonKindOf(doc))
	}
	text, err := compactJSON(doc)
	if err != nil {
		return nil, badRequest(field, "%s: %v", field, err)
	}
	return &engine.StructuredOutput{JSONSchema: text}, nil
}

// readRegex reads a regular expression (a non-empty string).
func readRegex(raw json.RawMessage, field string) (*engine.StructuredOutput, *apiError) {
	s, e := nonEmptyString(raw, field)
	if e != nil {
		return nil, e
	}
	return &engine.StructuredOutput{Regex: s}, nil
}

// readGrammar reads a GBNF grammar (a non-empty string).
func readGrammar(raw json.RawMessage, field string) (*engine.StructuredOutput, *apiError) {
	s, e := nonEmptyString(raw, field)
	if e != nil {
		return nil, e
	}
	return &engine.StructuredOutput{Grammar: s}, nil
}

// readChoice reads a non-empty array of non-empty strings.
func readChoice(raw json.RawMessage, field string) (*engine.StructuredOutput, *apiError) {
	var choice []string
	if json.Unmarshal(raw, &choice) != nil || len(choice) == 0 {
		return nil, badRequest(field, "%s must be a non-empty array of strings", field)
	}
	for i, c := range choice {
		if c == "" {
			return nil, badRequest(field, "%s[%d] must not be empty", field, i)
		}
	}
	return &engine.StructuredOutput{Choice: choice}, nil
}

// nonEmptyString reads raw as a non-empty string.
func nonEmptyString(raw json.RawMessage, field string) (string, *apiError) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", badRequest(field, "%s must be a string, got %s", field, jsonKindOf(raw))
	}
	if s == "" {
		return "", badRequest(field, "%s must not be empty", field)
	}
	return s, nil
}

// structuredOutputs reads vLLM's structured_outputs object: the
// constraints it sets (each named structured_outputs.<key>) and the JSON
// whitespace mode ("compact" with disable_any_whitespace).
func structuredOutputs(raw json.RawMessage) ([]constraint, string, *apiError) {
	const field = "structured_outputs"
	obj, err := parseObject(raw)
	if err != nil {
		return nil, "", badRequest(field, "%s must be an object, got %s", field, jsonKindOf(raw))
	}
	var out []constraint
	whitespace := ""
	for _, m := range obj {
		name := field + "." + m.Key
		if !present(m.Value) {
			continue
		}
		var so *engine.StructuredOutput
		var e *apiError
		switch m.Key {
		case "json":
			so, e = readJSONSchema(m.Value, name)
		case "regex":
			so, e = readRegex(m.Value, name)
		case "choice":
			so, e = readChoice(m.Value, name)
		case "grammar":
			so, e = readGrammar(m.Value, name)
		case "json_object", "disable_any_whitespace", "disable_fallback":
			var b bool
			if json.Unmarshal(m.Value, &b) != nil {
				return nil, "", badRequest(name, "%s must be a boolean", name)
			}
			switch {
			case m.Key == "json_object" && b:
				so = &engine.StructuredOutput{JSONObject: true}
			case m.Key == "disable_any_whitespace" && b:
				whitespace = "compact"
			}
		case "whitespace_pattern", "structural_tag":
			return nil, "", badRequest(name, "%s is not supported", name)
		default:
			return nil, "", badRequest(name, "unknown field %q in %s", m.Key, field)
		}
		if e != nil {
			return nil, "", e
		}
		if so != nil {
			out = append(out, constraint{so, name})
		}
	}
	return out, whitespace, nil
}

// isConstraintError reports whether err is the engine's refusal of a
// constraint that does not compile (an error whose text starts with
// "grammar:"), which is the client's fault.
func isConstraintError(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "grammar:") || strings.Contains(msg, ": grammar:")
}

// constraintError is the 400 answer to a constraint the engine could not
// compile, naming the field that set it.
func constraintError(err error, field string) *apiError {
	msg := err.Error()
	if i := strings.Index(msg, "grammar:"); i > 0 {
		msg = msg[i:]
	}
	if field == "" {
		return badRequest("", "invalid structured-output constraint: %s", msg)
	}
	return badRequest(field, "%s: invalid structured-output constraint: %s", field, msg)
}
