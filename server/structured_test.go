package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
)

// fieldsOf decodes body as a completion request the way the handler does
// and returns its sampling fields.
func fieldsOf(t *testing.T, body string) *SamplingFields {
	t.Helper()
	var req CompletionRequest
	if e := decodeBody(strings.NewReader(body), &req); e != nil {
		t.Fatalf("decode %s: %s", body, e.msg)
	}
	return &req.SamplingFields
}

// Each structured-output field maps to the engine constraint it names,
// schemas passed on as written (compacted, property order kept), and the
// field that set it is reported.
func TestStructuredOutputMapping(t *testing.T) {
	const schema = `{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}},"required":["zeta"]}`
	spaced := strings.NewReplacer(`":`, `": `, `,`, `, `).Replace(schema)
	tests := []struct {
		body  string
		want  *engine.StructuredOutput
		field string
	}{
		{`{}`, nil, ""},
		{`{"response_format": null}`, nil, ""},
		{`{"response_format": {"type": "text"}}`, nil, ""},
		{`{"response_format": {"type": "json_object"}}`, &engine.StructuredOutput{JSONObject: true}, "response_format"},
		{`{"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": ` + spaced + `}}}`,
			&engine.StructuredOutput{JSONSchema: schema}, "response_format"},
		{`{"response_format": {"type": "json_schema", "json_schema": {"name": "p", "description": "d", "strict": true, "schema": ` + schema + `}}}`,
			&engine.StructuredOutput{JSONSchema: schema}, "response_format"},
		{`{"guided_json": ` + spaced + `}`, &engine.StructuredOutput{JSONSchema: schema}, "guided_json"},
		{`{"guided_json": ` + jsonQuote(spaced) + `}`, &engine.StructuredOutput{JSONSchema: schema}, "guided_json"},
		{`{"guided_regex": "[a-z]+@[a-z]+\\.com"}`, &engine.StructuredOutput{Regex: `[a-z]+@[a-z]+\.com`}, "guided_regex"},
		{`{"guided_choice": ["yes", "no"]}`, &engine.StructuredOutput{Choice: []string{"yes", "no"}}, "guided_choice"},
		{`{"guided_grammar": "root ::= \"a\"+"}`, &engine.StructuredOutput{Grammar: `root ::= "a"+`}, "guided_grammar"},
		{`{"guided_json": null, "guided_regex": "a+"}`, &engine.StructuredOutput{Regex: "a+"}, "guided_regex"},
		{`{"response_format": {"type": "text"}, "guided_choice": ["x"]}`, &engine.StructuredOutput{Choice: []string{"x"}}, "guided_choice"},
		{`{"structured_outputs": {"json": ` + schema + `}}`, &engine.StructuredOutput{JSONSchema: schema}, "structured_outputs.json"},
		{`{"structured_outputs": {"json": ` + jsonQuote(schema) + `, "disable_any_whitespace": true}}`,
			&engine.StructuredOutput{JSONSchema: schema, Whitespace: "compact"}, "structured_outputs.json"},
		{`{"structured_outputs": {"regex": "\\d{3}"}}`, &engine.StructuredOutput{Regex: `\d{3}`}, "structured_outputs.regex"},
		{`{"structured_outputs": {"choice": ["a", "b"]}}`, &engine.StructuredOutput{Choice: []string{"a", "b"}}, "structured_outputs.choice"},
		{`{"structured_outputs": {"grammar": "root ::= \"x\""}}`, &engine.StructuredOutput{Grammar: `root ::= "x"`}, "structured_outputs.grammar"},
		{`{"structured_outputs": {"json_object": true}}`, &engine.StructuredOutput{JSONObject: true}, "structured_outputs.json_object"},
		{`{"structured_outputs": {"json_object": false, "disable_fallback": true}}`, nil, ""},
		{`{"structured_outputs": {"regex": null, "choice": ["a"]}}`, &engine.StructuredOutput{Choice: []string{"a"}}, "structured_outputs.choice"},
		{`{"response_format": {"type": "json_object"}, "structured_outputs": {"disable_any_whitespace": true}}`,
			&engine.StructuredOutput{JSONObject: true, Whitespace: "compact"}, "response_format"},
	}
	for _, tc := range tests {
		t.Run(tc.body, func(t *testing.T) {
			c, e := structuredOutput(fieldsOf(t, tc.body))
			if e != nil {
				t.Fatalf("error %d %q (param %q)", e.status, e.msg, e.param)
			}
			if tc.want == nil {
				if c != nil {
					t.Fatalf("got %+v from %s, want no constraint", *c.so, c.field)
				}
				return
			}
			if c == nil {
				t.Fatalf("no constraint, want %+v", *tc.want)
			}
			if !reflect.DeepEqual(c.so, tc.want) || c.field != tc.field {
				t.Fatalf("got %+v from %q, want %+v from %q", *c.so, c.field, *tc.want, tc.field)
			}
			if err := c.so.Validate(); err != nil {
				t.Fatalf("the constraint does not validate: %v", err)
			}
		})
	}
}

// jsonQuote is s as a JSON string literal.
func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Every malformed or unsupported structured-output field, and two
// constraints at once, is a 400 naming the field.
func TestStructuredOutputErrors(t *testing.T) {
	tests := []struct {
		body, param, msg string
	}{
		{`{"response_format": "json"}`, "response_format", "must be an object"},
		{`{"response_format": {}}`, "response_format.type", `must be "text", "json_object" or "json_schema"`},
		{`{"response_format": {"type": "xml"}}`, "response_format.type", `got "xml"`},
		{`{"response_format": {"type": 3}}`, "response_format.type", "response_format.type must be"},
		{`{"response_format": {"type": "structural_tag"}}`, "response_format.type", "not supported"},
		{`{"response_format": {"type": "json_object", "schema": {}}}`, "response_format.schema", `unknown field "schema"`},
		{`{"response_format": {"type": "json_schema"}}`, "response_format.json_schema", "needs a json_schema object"},
		{`{"response_format": {"type": "json_schema", "json_schema": []}}`, "response_format.json_schema", "must be an object, got an array"},
		{`{"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}`, "response_format.json_schema.name", "non-empty string"},
		{`{"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}`, "response_format.json_schema.schema", "schema is required"},
		{`{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}}`, "response_format.json_schema.schema", "must be a JSON Schema object, got a string"},
		{`{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}}`, "response_format.json_schema.strict", "must be a boolean"},
		{`{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "format": 1}}}`, "response_format.json_schema.format", "unknown field"},
		{`{"guided_json": 5}`, "guided_json", "must be a JSON Schema object"},
		{`{"guided_json": "not json"}`, "guided_json", "not a JSON document"},
		{`{"guided_json": "[1]"}`, "guided_json", "got an array"},
		{`{"guided_regex": ""}`, "guided_regex", "must not be empty"},
		{`{"guided_regex": ["a"]}`, "guided_regex", "must be a string, got an array"},
		{`{"guided_choice": []}`, "guided_choice", "non-empty array of strings"},
		{`{"guided_choice": "yes"}`, "guided_choice", "non-empty array of strings"},
		{`{"guided_choice": ["a", ""]}`, "guided_choice", "guided_choice[1] must not be empty"},
		{`{"guided_grammar": 1}`, "guided_grammar", "must be a string"},
		{`{"guided_whitespace_pattern": "[ ]?"}`, "guided_whitespace_pattern", "not supported"},
		{`{"structured_outputs": "json"}`, "structured_outputs", "must be an object"},
		{`{"structured_outputs": {"jsn": {}}}`, "structured_outputs.jsn", `unknown field "jsn"`},
		{`{"structured_outputs": {"whitespace_pattern": " "}}`, "structured_outputs.whitespace_pattern", "not supported"},
		{`{"structured_outputs": {"structural_tag": "{}"}}`, "structured_outputs.structural_tag", "not supported"},
		{`{"structured_outputs": {"json_object": "yes"}}`, "structured_outputs.json_object", "must be a boolean"},
		{`{"structured_outputs": {"choice": [1]}}`, "structured_outputs.choice", "non-empty array of strings"},
		{`{"guided_json": {}, "guided_regex": "a"}`, "guided_regex", "only one structured-output constraint may be set, got guided_json and guided_regex"},
		{`{"response_format": {"type": "json_object"}, "guided_choice": ["a"]}`, "guided_choice", "got response_format and guided_choice"},
		{`{"structured_outputs": {"regex": "a", "grammar": "root ::= \"a\""}}`, "structured_outputs.grammar", "got structured_outputs.regex and structured_outputs.grammar"},
		{`{"guided_regex": "a", "structured_outputs": {"json_object": true}}`, "structured_outputs.json_object", "only one"},
	}
	for _, tc := range tests {
		t.Run(tc.body, func(t *testing.T) {
			c, e := structuredOutput(fieldsOf(t, tc.body))
			if e == nil {
				t.Fatalf("accepted: %+v", c)
			}
			if e.status != http.StatusBadRequest || e.param != tc.param || !strings.Contains(e.msg, tc.msg) {
				t.Fatalf("error %d %q (param %q), want 400 with %q (param %q)", e.status, e.msg, e.param, tc.msg, tc.param)
			}
		})
	}
}

// The engine's refusal of a constraint that does not compile is a 400
// naming the field that set it; other generation failures stay 500.
func TestConstraintErrorStatus(t *testing.T) {
	tests := []struct {
		err    error
		field  string
		status int
		param  string
	}{
		{errors.New(`grammar: 1:9: undefined rule "x"`), "guided_grammar", 400, "guided_grammar"},
		{fmt.Errorf("engine: request r-0: %w", errors.New(`grammar: jsonschema: unsupported keyword "not" at #`)), "response_format", 400, "response_format"},
		{errors.New("grammar: no \"root\" rule"), "", 400, ""},
		{fmt.Errorf("%w: sampling params: n must be >= 1", engine.ErrInvalidRequest), "", 400, ""},
		{errors.New("device lost"), "guided_json", 500, ""},
	}
	for _, tc := range tests {
		e := errorOf(tc.err, tc.field)
		if e.status != tc.status || e.param != tc.param {
			t.Errorf("%v: status %d param %q, want %d %q", tc.err, e.status, e.param, tc.status, tc.param)
		}
		if tc.status == 400 && tc.field != "" && !strings.Contains(e.msg, tc.field) {
			t.Errorf("%v: message %q does not name %s", tc.err, e.msg, tc.field)
		}
		if got := isRequestError(tc.err); got != (tc.status == 400) {
			t.Errorf("%v: isRequestError %v", tc.err, got)
		}
	}
}

// The constraint reaches the engine request of both endpoints, with the
// field that set it; one the sampling fields set and one tool_choice sets
// cannot be combined.
func TestStructuredOutputReachesRequests(t *testing.T) {
	ts := startServer(t, nil, Options{})
	var creq CompletionRequest
	if e := decodeBody(strings.NewReader(`{"prompt": ["a", "b"], "guided_choice": ["yes", "no"]}`), &creq); e != nil {
		t.Fatal(e.msg)
	}
	reqs, e := ts.completionRequests(&creq, "cmpl-x", time.Now())
	if e != nil {
		t.Fatal(e.msg)
	}
	for _, r := range reqs {
		if so := r.params.StructuredOutput; so == nil || !reflect.DeepEqual(so.Choice, []string{"yes", "no"}) || r.constraintField != "guided_choice" {
			t.Fatalf("request %s: constraint %+v from %q", r.id, so, r.constraintField)
		}
	}
	chat := func(body string) ([]*request, *apiError) {
		var req ChatCompletionRequest
		if e := decodeBody(strings.NewReader(body), &req); e != nil {
			t.Fatal(e.msg)
		}
		return ts.chatRequests(&req, "chatcmpl-x", time.Now())
	}
	reqs, e = chat(`{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}`)
	if e != nil {
		t.Fatal(e.msg)
	}
	if so := reqs[0].params.StructuredOutput; so == nil || !so.JSONObject || reqs[0].constraintField != "response_format" {
		t.Fatalf("chat constraint %+v from %q", so, reqs[0].constraintField)
	}
	_, e = chat(`{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"},
		"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}`)
	if e == nil || e.param != "tool_choice" || !strings.Contains(e.msg, "response_format cannot be set with it") {
		t.Fatalf("response_format with tool_choice required: %+v", e)
	}
}
