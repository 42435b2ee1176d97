package jsonschema

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/grammar"
)

type schemaCase struct {
	name   string
	schema string
	accept []string
	reject []string
}

var keywordCases = []schemaCase{
	{"type-string", `{"type":"string"}`,
		[]string{`"abc"`, `""`, `"a\"b\\c\n\u00e9\ud83d\ude00"`, `"é漢"`, ` "x" `},
		[]string{`abc`, `1`, `"a`, `"\x"`, `"\ud83d"`, "\"a\nb\"", `null`}},
	{"type-integer", `{"type":"integer"}`,
		[]string{`0`, `-12`, `1234567890123`},
		[]string{`01`, `1.5`, `-`, `"1"`, `1e3`}},
	{"type-number", `{"type":"number"}`,
		[]string{`0`, `-1.5`, `1e-05`, `2.5E+10`, `0.001`},
		[]string{`.5`, `1.`, `01`, `+1`, `NaN`}},
	{"type-boolean-null", `{"type":["boolean","null"]}`,
		[]string{`true`, `false`, `null`},
		[]string{`0`, `"true"`, `nul`}},
	{"type-array-of-types", `{"type":["string","integer"]}`,
		[]string{`"a"`, `5`},
		[]string{`5.5`, `[]`}},
	{"any", `{}`,
		[]string{`1`, `"s"`, `{"a": [1, {"b": null}]}`, `[]`, `{}`, `true`},
		[]string{`{`, `[1,]`, `{"a"}`}},
	{"true-schema", `true`, []string{`[1, 2]`}, []string{`x`}},
	{"properties-order-optional", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"additionalProperties":false}`,
		[]string{`{}`, `{"a": 1}`, `{"b": "x"}`, `{"a": 1, "b": "x"}`, `{"a":1,"b":"x"}`, "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"},
		[]string{`{"b": "x", "a": 1}`, `{"a": "1"}`, `{"c": 1}`, `{"a": 1,}`, `{, "a": 1}`, `{"a": 1 "b": "x"}`}},
	{"required", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"required":["b"],"additionalProperties":false}`,
		[]string{`{"b": 1}`, `{"a": 1, "b": 2}`, `{"b": 2, "c": 3}`, `{"a": 1, "b": 2, "c": 3}`},
		[]string{`{}`, `{"a": 1}`, `{"a": 1, "c": 3}`}},
	{"required-not-declared", `{"type":"object","properties":{"a":{"type":"integer"}},"required":["z"],"additionalProperties":{"type":"boolean"}}`,
		[]string{`{"z": true}`, `{"a": 1, "z": false}`, `{"a": 1, "z": false, "q": true}`},
		[]string{`{"a": 1}`, `{"z": 1}`}},
	{"additionalProperties-true", `{"type":"object","properties":{"a":{"type":"integer"}}}`,
		[]string{`{"a": 1, "b": "x"}`, `{"b": [1]}`, `{"ab": 1, "": 2}`, `{}`},
		[]string{`{"a": "x"}`, `{"b": 1, "a": "x"}`, `{"a": 1, "a": "x"}`}},
	{"additionalProperties-schema", `{"type":"object","additionalProperties":{"type":"integer"}}`,
		[]string{`{}`, `{"x": 1, "y": 2}`},
		[]string{`{"x": "1"}`, `[]`}},
	{"additionalProperties-excludes-declared", `{"type":"object","properties":{"ab":{"type":"integer"},"a\"c":{"type":"integer"}},"additionalProperties":{"type":"string"}}`,
		[]string{`{"ab": 1}`, `{"a": "s"}`, `{"abc": "s"}`, `{"b": "s"}`, `{"a\"": "s"}`, `{"a\"c": 1}`},
		[]string{`{"ab": "s"}`, `{"x": "s", "ab": "s"}`, `{"a\"c": "s"}`, `{"a\u0062": "s"}`}},
	{"nested-object", `{"type":"object","properties":{"p":{"type":"object","properties":{"q":{"type":"null"}},"required":["q"],"additionalProperties":false}},"required":["p"],"additionalProperties":false}`,
		[]string{`{"p": {"q": null}}`},
		[]string{`{"p": {}}`, `{"p": {"q": 1}}`}},
	{"items", `{"type":"array","items":{"type":"integer"}}`,
		[]string{`[]`, `[1]`, `[1, 2, 3]`, `[1,2]`, `[ 1 , 2 ]`},
		[]string{`[1, "a"]`, `[1,]`, `[,]`, `{}`}},
	{"minItems-maxItems", `{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3}`,
		[]string{`[1, 2]`, `[1, 2, 3]`},
		[]string{`[]`, `[1]`, `[1, 2, 3, 4]`}},
	{"prefixItems", `{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false}`,
		[]string{`[]`, `[1]`, `[1, "a"]`},
		[]string{`["a"]`, `[1, "a", 2]`, `[1, 2]`}},
	{"prefixItems-rest", `{"type":"array","prefixItems":[{"type":"integer"}],"items":{"type":"boolean"},"minItems":2}`,
		[]string{`[1, true]`, `[1, true, false]`},
		[]string{`[1]`, `[1, 2]`, `[true, true]`}},
	{"draft07-items-array", `{"type":"array","items":[{"type":"string"},{"type":"null"}],"additionalItems":false}`,
		[]string{`["a", null]`, `["a"]`, `[]`},
		[]string{`["a", null, 1]`, `[null]`}},
	{"draft07-additionalItems-schema", `{"type":"array","items":[{"type":"string"}],"additionalItems":{"type":"integer"}}`,
		[]string{`["a", 1, 2]`},
		[]string{`["a", "b"]`}},
	{"enum", `{"enum":["red","green",null,1,[1,"a"],{"k":true}]}`,
		[]string{`"red"`, `null`, `1`, `[1, "a"]`, `{"k": true}`, `{"k":true}`},
		[]string{`"blue"`, `2`, `[1]`, `{"k": false}`, `"Red"`}},
	{"enum-typed", `{"type":"string","enum":["a","b",1]}`,
		[]string{`"a"`, `"b"`},
		[]string{`1`, `"c"`}},
	{"enum-escapes", `{"enum":["a\"b","x\ny","é"]}`,
		[]string{`"a\"b"`, `"x\ny"`, `"é"`},
		[]string{`"a"`, `"x`}},
	{"const", `{"const":"fixed"}`, []string{`"fixed"`}, []string{`"other"`, `"fixed2"`}},
	{"const-object", `{"const":{"a":[1,2]}}`, []string{`{"a": [1, 2]}`}, []string{`{"a": [1]}`}},
	{"anyOf", `{"anyOf":[{"type":"string","maxLength":2},{"type":"integer","minimum":10}]}`,
		[]string{`"ab"`, `10`, `999`},
		[]string{`"abc"`, `9`, `null`}},
	{"oneOf", `{"oneOf":[{"type":"boolean"},{"type":"null"}]}`,
		[]string{`true`, `null`}, []string{`0`}},
	// oneOf of required lists: each branch forbids what the others require.
	{"oneOf-required", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"additionalProperties":false,"oneOf":[{"required":["a"]},{"required":["b"]}]}`,
		[]string{`{"a": 1}`, `{"b": 1}`, `{"a": 1, "c": 3}`, `{"b": 2, "c": 3}`},
		[]string{`{"a": 1, "b": 2}`, `{}`, `{"c": 3}`, `{"a": 1, "b": 2, "c": 3}`}},
	// two required out of several: "not both of b's" is an anyOf.
	{"oneOf-required-pairs", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"additionalProperties":false,"oneOf":[{"required":["a"]},{"required":["b","c"]}]}`,
		[]string{`{"a": 1}`, `{"b": 1, "c": 2}`, `{"a": 1, "b": 2}`, `{"a": 1, "c": 2}`},
		[]string{`{"a": 1, "b": 1, "c": 2}`, `{"b": 1}`, `{}`}},
	// discriminated by a required property's const: disjoint as written.
	{"oneOf-discriminator", `{"oneOf":[{"type":"object","properties":{"k":{"const":"x"},"v":{"type":"integer"}},"required":["k"]},{"type":"object","properties":{"k":{"const":"y"}},"required":["k"],"additionalProperties":false}]}`,
		[]string{`{"k": "x", "v": 1}`, `{"k": "y"}`, `{"k": "x"}`},
		[]string{`{"k": "z"}`, `{"k": "y", "v": 1}`, `{}`}},
	// object-only branches: the other types match both, so none is valid.
	{"oneOf-objects-only", `{"oneOf":[{"properties":{"p":{"enum":["m"]}},"required":["p"],"additionalProperties":false},{"properties":{"p":{"enum":["v"]}},"required":["p"],"additionalProperties":false}]}`,
		[]string{`{"p": "m"}`, `{"p": "v"}`},
		[]string{`1`, `"s"`, `null`, `{"p": "x"}`, `[]`}},
	{"oneOf-nested-enums", `{"oneOf":[{"oneOf":[{"enum":["a","b"]},{"enum":["c"]}]},{"enum":["d"]}]}`,
		[]string{`"a"`, `"c"`, `"d"`},
		[]string{`"e"`, `1`}},
	{"format-json-pointer", `{"type":"string","format":"json-pointer"}`,
		[]string{`""`, `"/a/b~0c~1"`, `"/"`, `"//x"`},
		[]string{`"a"`, `"/a~2"`, `"/~"`}},
	{"format-relative-json-pointer", `{"type":"string","format":"relative-json-pointer"}`,
		[]string{`"0"`, `"1/a"`, `"12#"`},
		[]string{`""`, `"/a"`, `"01"`, `"1#/a"`}},
	{"anyOf-with-siblings", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"additionalProperties":false,"anyOf":[{"required":["a"]},{"required":["b"]}]}`,
		[]string{`{"a": 1}`, `{"b": 1}`, `{"a": 1, "b": 2}`},
		[]string{`{}`}},
	{"allOf-merge", `{"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"string"}},"required":["b"]}],"properties":{"a":true,"b":true},"additionalProperties":false}`,
		[]string{`{"a": 1, "b": "x"}`},
		[]string{`{"a": 1}`, `{"b": "x"}`, `{"a": 1, "b": "x", "c": 1}`, `{"a": "1", "b": "x"}`}},
	{"allOf-additionalProperties", `{"allOf":[{"properties":{"a":{"type":"integer"}},"additionalProperties":false},{"properties":{"a":{"minimum":0},"b":{"type":"string"}}}]}`,
		[]string{`{"a": 1}`, `{}`},
		[]string{`{"a": -1}`, `{"a": 1, "b": "x"}`}},
	{"allOf-bounds", `{"allOf":[{"type":"integer","minimum":0},{"maximum":5},{"minimum":2}]}`,
		[]string{`2`, `5`}, []string{`1`, `6`, `-1`}},
	{"ref-defs", `{"$defs":{"pos":{"type":"integer","minimum":1}},"type":"array","items":{"$ref":"#/$defs/pos"}}`,
		[]string{`[1, 2]`}, []string{`[0]`}},
	{"ref-definitions-siblings", `{"definitions":{"s":{"type":"string"}},"type":"object","properties":{"x":{"$ref":"#/definitions/s","maxLength":1}},"additionalProperties":false}`,
		[]string{`{"x": "a"}`}, []string{`{"x": "ab"}`, `{"x": 1}`}},
	{"ref-recursive", `{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"}`,
		[]string{`{"v": 1}`, `{"v": 1, "next": null}`, `{"v": 1, "next": {"v": 2, "next": {"v": 3}}}`},
		[]string{`{"v": 1, "next": {}}`, `{"next": null}`}},
	{"ref-root-recursive", `{"type":"array","items":{"anyOf":[{"type":"integer"},{"$ref":"#"}]}}`,
		[]string{`[1, [2, [3]], []]`}, []string{`[1, ["a"]]`}},
	{"minLength-maxLength", `{"type":"string","minLength":2,"maxLength":3}`,
		[]string{`"ab"`, `"abc"`, `"a\n"`, `"é漢"`, `"\ud83d\ude00a"`},
		[]string{`"a"`, `"abcd"`, `""`}},
	{"minLength-only", `{"type":"string","minLength":1}`, []string{`"a"`, `"abcdefgh"`}, []string{`""`}},
	{"pattern-anchored", `{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"}`,
		[]string{`"AB-123"`}, []string{`"AB-12"`, `"ab-123"`, `"xAB-123"`}},
	{"pattern-unanchored", `{"type":"string","pattern":"ab+c"}`,
		[]string{`"abc"`, `"xxabbbcyy"`}, []string{`"ac"`, `"ab"`}},
	{"pattern-alternation", `{"type":"string","pattern":"^(foo|bar)(?:-[a-z]+)*$|^x$"}`,
		[]string{`"foo"`, `"bar-a-bc"`, `"x"`}, []string{`"baz"`, `"foo-"`, `"xx"`}},
	{"pattern-escapes-json", `{"type":"string","pattern":"^[^a]\\.\\s?\"$"}`,
		[]string{`"b.\""`, `"\\. \""`, `"\n.\t\""`}, []string{`"a.\""`, `"bx\""`}},
	{"pattern-dot", `{"type":"string","pattern":"^a.c$"}`,
		[]string{`"abc"`, `"a\"c"`, `"a漢c"`}, []string{`"a\nc"`, `"ac"`}},
	{"format-date", `{"type":"string","format":"date"}`,
		[]string{`"2024-02-29"`, `"2023-12-31"`, `"2000-02-29"`},
		[]string{`"2023-02-29"`, `"1900-02-29"`, `"2023-04-31"`, `"2023-13-01"`, `"23-01-01"`}},
	{"format-date-time", `{"type":"string","format":"date-time"}`,
		[]string{`"2024-01-02T03:04:05Z"`, `"2024-01-02T23:59:59.123+05:30"`},
		[]string{`"2024-01-02 03:04:05Z"`, `"2024-01-02T24:00:00Z"`, `"2024-01-02T03:04:05"`}},
	{"format-time", `{"type":"string","format":"time"}`, []string{`"12:00:00Z"`}, []string{`"12:00"`}},
	{"format-uuid", `{"type":"string","format":"uuid"}`,
		[]string{`"123e4567-e89b-12d3-a456-426614174000"`}, []string{`"123e4567e89b12d3a456426614174000"`}},
	{"format-email", `{"type":"string","format":"email"}`,
		[]string{`"john.doe@example.com"`}, []string{`"john"`, `"a@b"`, `"@x.com"`}},
	{"format-uri", `{"type":"string","format":"uri"}`,
		[]string{`"https://example.com/a?b=c#d"`}, []string{`"example"`, `"http://a b"`}},
	{"format-unknown-ignored", `{"type":"string","format":"color"}`, []string{`"anything"`}, nil},
	{"integer-range-small", `{"type":"integer","minimum":-15,"maximum":237}`,
		[]string{`-15`, `-1`, `0`, `9`, `10`, `99`, `100`, `199`, `230`, `237`},
		[]string{`-16`, `238`, `240`, `300`, `1000`, `-0`}},
	{"integer-nonneg", `{"type":"integer","minimum":0}`,
		[]string{`0`, `7`, `123456789`}, []string{`-1`}},
	{"integer-exclusive", `{"type":"integer","exclusiveMinimum":3,"exclusiveMaximum":105}`,
		[]string{`4`, `104`}, []string{`3`, `105`}},
	{"integer-draft04-exclusive", `{"type":"integer","minimum":3,"exclusiveMinimum":true}`,
		[]string{`4`, `1000`}, []string{`3`, `0`}},
	{"integer-min-only-large", `{"type":"integer","minimum":250}`,
		[]string{`250`, `299`, `999`, `1000`, `123456`}, []string{`249`, `25`, `-250`}},
	{"integer-max-only-negative", `{"type":"integer","maximum":-20}`,
		[]string{`-20`, `-21`, `-1000`}, []string{`-19`, `0`, `5`}},
	{"integer-fractional-bounds", `{"type":"integer","minimum":1.5,"maximum":3.5}`,
		[]string{`2`, `3`}, []string{`1`, `4`}},
	{"number-nonneg", `{"type":"number","minimum":0}`,
		[]string{`0`, `0.5`, `3e5`, `12.25`}, []string{`-0.5`, `-1`}},
	{"number-positive", `{"type":"number","exclusiveMinimum":0}`,
		[]string{`0.001`, `5`, `1e-3`}, []string{`0`, `0.0`, `-1`, `0e5`}},
	{"number-range", `{"type":"number","minimum":-2,"maximum":10}`,
		[]string{`-2`, `-2.0`, `-1.99`, `0`, `9.999`, `10`, `10.00`, `3`},
		[]string{`-2.01`, `10.01`, `11`, `-3`}},
	{"number-range-exclusive", `{"type":"number","exclusiveMinimum":1,"exclusiveMaximum":3}`,
		[]string{`1.01`, `2`, `2.999`}, []string{`1`, `1.0`, `3`, `3.0`, `0.5`}},
	{"number-negative-range", `{"type":"number","minimum":-10,"exclusiveMaximum":-2}`,
		[]string{`-10`, `-2.5`, `-3`}, []string{`-2`, `-2.0`, `-10.5`, `0`}},
	{"multipleOf-1", `{"type":"number","multipleOf":1}`, []string{`3`}, []string{`3.5`}},
	{"boolean-subschemas", `{"type":"object","properties":{"a":true,"b":false}}`,
		[]string{`{"a": [1]}`, `{}`}, []string{`{"b": 1}`}},
	{"uniqueItems-trivial", `{"type":"array","uniqueItems":true,"maxItems":1}`, []string{`[]`, `[1]`}, []string{`[1, 1]`}},
	{"not-type", `{"type":["string","integer","null"],"not":{"type":["null","string"]}}`, []string{`1`}, []string{`null`, `"a"`}},
	{"not-enum", `{"enum":["a","b",1,null],"not":{"enum":["b",null]}}`, []string{`"a"`, `1`}, []string{`"b"`, `null`}},
	{"not-false", `{"type":"integer","not":false}`, []string{`1`}, []string{`null`}},
	{"not-number", `{"not":{"type":"number","description":"d"}}`, []string{`null`, `"a"`, `[1]`}, []string{`1`, `1.5`}},
	{"annotations-and-extensions", `{"$schema":"https://json-schema.org/draft/2020-12/schema","title":"t","description":"d","default":1,"examples":[1],"x-vendor":{"not":1},"type":"integer"}`,
		[]string{`1`}, []string{`"1"`}},
	{"keywords-for-other-types", `{"type":"string","minimum":5,"items":{"type":"integer"}}`, []string{`"a"`}, []string{`6`}},
}

func TestKeywords(t *testing.T) {
	for _, tc := range keywordCases {
		t.Run(tc.name, func(t *testing.T) {
			c := compileSchema(t, tc.schema, Options{})
			for _, s := range tc.accept {
				if !accepts(c, s) {
					t.Errorf("rejected valid %s", s)
				}
			}
			for _, s := range tc.reject {
				if accepts(c, s) {
					t.Errorf("accepted invalid %s", s)
				}
			}
		})
	}
}

func TestWhitespaceModes(t *testing.T) {
	schema := `{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},"b":{"type":"string"}},"additionalProperties":false}`
	cases := []struct {
		opts   Options
		accept []string
		reject []string
	}{
		{Options{}, []string{`{"a": [1, 2], "b": "x"}`, `{"a":[1,2],"b":"x"}`, " {\n\t\"a\" : [ 1 ,2 ] } "},
			[]string{`{"a": [1,          2]}`}},
		{Options{MaxWhitespace: 1}, []string{`{"a": [1, 2]}`}, []string{`{"a":  [1]}`}},
		{Options{Whitespace: "python"}, []string{`{"a": [1, 2], "b": "x"}`, `{}`, `{"a": []}`},
			[]string{`{"a":[1,2]}`, `{"a": [1,2]}`, ` {"a": [1]}`, "{\"a\":\n[1]}"}},
		{Options{Whitespace: "compact"}, []string{`{"a":[1,2],"b":"x"}`},
			[]string{`{"a": [1, 2]}`, `{"a":[1, 2]}`}},
	}
	for _, tc := range cases {
		c := compileSchema(t, schema, tc.opts)
		for _, s := range tc.accept {
			if !accepts(c, s) {
				t.Errorf("%+v: rejected %q", tc.opts, s)
			}
		}
		for _, s := range tc.reject {
			if accepts(c, s) {
				t.Errorf("%+v: accepted %q", tc.opts, s)
			}
		}
	}
	if _, err := ToGBNF([]byte(`{}`), Options{Whitespace: "pretty"}); err == nil {
		t.Error("unknown whitespace mode accepted")
	}
}

func TestUnsupportedKeywords(t *testing.T) {
	cases := []struct {
		schema string
		kw     string
		path   string
	}{
		{`{"type":"object","properties":{"x":{"not":{"required":["a"]}}}}`, "not", "#/properties/x"},
		{`{"type":"number","not":{"type":"integer"}}`, "not", "#"},
		{`{"not":{}}`, "not", "#"},
		{`{"type":"object","patternProperties":{"^a":{}}}`, "patternProperties", "#"},
		{`{"type":"object","propertyNames":{"maxLength":3}}`, "propertyNames", "#"},
		{`{"if":{"type":"string"},"then":{"minLength":1}}`, "if", "#"},
		{`{"type":"array","contains":{"type":"integer"}}`, "contains", "#"},
		{`{"type":"array","uniqueItems":true}`, "uniqueItems", "#"},
		{`{"type":"number","multipleOf":0.5}`, "multipleOf", "#"},
		{`{"type":"integer","multipleOf":3}`, "multipleOf", "#"},
		{`{"type":"number","minimum":0.5}`, "minimum", "#"},
		{`{"type":"number","exclusiveMaximum":2.5}`, "exclusiveMaximum", "#"},
		{`{"type":"object","dependentRequired":{"a":["b"]}}`, "dependentRequired", "#"},
		{`{"type":"object","unevaluatedProperties":false}`, "unevaluatedProperties", "#"},
		{`{"type":"object","minProperties":2}`, "minProperties", "#"},
		{`{"type":"string","pattern":"^a$","maxLength":3}`, "maxLength", "#"},
		{`{"type":"string","pattern":"(?=a)b"}`, "pattern", "#/pattern"},
		{`{"type":"string","pattern":"(a)\\1"}`, "pattern", "#/pattern"},
		{`{"type":"string","pattern":"\\bword"}`, "pattern", "#/pattern"},
		{`{"type":"string","pattern":"\\p{L}+"}`, "pattern", "#/pattern"},
		{`{"type":"string","enum":["a","bb"],"maxLength":1}`, "maxLength", "#"},
		{`{"allOf":[{"pattern":"^a"},{"pattern":"b$"}]}`, "allOf", "#"},
		{`{"$ref":"other.json#/x"}`, "$ref", "#"},
		// unsatisfiable: the outer additionalProperties sees no properties
		{`{"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}],"additionalProperties":false}`, "required", "#"},
		{`{"type":"integer","minimum":5,"maximum":4}`, "maximum", "#"},
		{`{"$ref":"#/$defs/missing"}`, "$ref", "#"},
		// oneOf whose branches may both match, which a grammar cannot
		// exclude
		{`{"oneOf":[{"type":"integer"},{"type":"number"}]}`, "oneOf", "#"},
		{`{"type":"string","oneOf":[{"pattern":"a"},{"pattern":"b"}]}`, "oneOf", "#"},
		{`{"type":"object","oneOf":[{"properties":{"a":{"type":"string"}}},{"properties":{"b":{"type":"string"}}}]}`, "oneOf", "#"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"oneOf":[{"required":["a"]},{"required":["a"]}]}`, "oneOf", "#"},
		// formats of JSON Schema's vocabulary that are not enforced
		{`{"type":"string","format":"regex"}`, "format", "#"},
		{`{"type":"object","properties":{"u":{"type":"string","format":"iri"}}}`, "format", "#/properties/u"},
	}
	for _, tc := range cases {
		_, err := ToGBNF([]byte(tc.schema), Options{})
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: got %v, want *Error", tc.schema, err)
			continue
		}
		if e.Keyword != tc.kw || e.Path != tc.path || !strings.Contains(err.Error(), `"`+tc.kw+`"`) {
			t.Errorf("%s: got %v (keyword %q path %q), want keyword %q at %s", tc.schema, err, e.Keyword, e.Path, tc.kw, tc.path)
		}
	}
	_, err := ToGBNF([]byte(`{"type":"object","properties":{"x":{"not":{"minimum":1}}}}`), Options{})
	if err == nil || err.Error() != `jsonschema: unsupported keyword "not" at #/properties/x` {
		t.Errorf("message: %v", err)
	}
	if _, err := ToGBNF([]byte(`{"type":`), Options{}); err == nil {
		t.Error("bad JSON accepted")
	}
}

// TestGrammarsParse checks that every keyword case's grammar also parses in
// the other whitespace modes.
func TestGrammarsParse(t *testing.T) {
	for _, mode := range []string{"python", "compact"} {
		for _, tc := range keywordCases {
			src, err := ToGBNF([]byte(tc.schema), Options{Whitespace: mode})
			if err != nil {
				t.Fatalf("%s/%s: %v", tc.name, mode, err)
			}
			if _, err := grammar.ParseGBNF(src); err != nil {
				t.Fatalf("%s/%s: %v\n%s", tc.name, mode, err, src)
			}
		}
	}
}

func TestLargeRepetition(t *testing.T) {
	c := compileSchema(t, `{"type":"string","minLength":1001,"maxLength":65535}`, Options{})
	short := `"` + strings.Repeat("a", 1000) + `"`
	ok := `"` + strings.Repeat("a", 2500) + `"`
	if accepts(c, short) || !accepts(c, ok) {
		t.Errorf("length bounds: short %v ok %v", accepts(c, short), accepts(c, ok))
	}
	c = compileSchema(t, `{"type":"string","maxLength":2003}`, Options{})
	for n, want := range map[int]bool{0: true, 999: true, 1000: true, 2003: true, 2004: false, 2999: false} {
		if got := accepts(c, `"`+strings.Repeat("é", n)+`"`); got != want {
			t.Errorf("maxLength 2003, length %d: got %v", n, got)
		}
	}
}

func TestContextAndBudget(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ToGBNFContext(ctx, []byte(`{"type":"string"}`), Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v, want context.Canceled", err)
	}
	// Nested properties: one step per subschema, so 3 steps do not reach
	// the leaves.
	schema := []byte(`{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"object","properties":{"c":{"type":"integer"}}}}}}}`)
	if _, err := ToGBNF(schema, Options{MaxSteps: 3}); !errors.Is(err, ErrBudget) {
		t.Errorf("MaxSteps 3: %v, want ErrBudget", err)
	}
	if _, err := ToGBNF(schema, Options{MaxSteps: 1000}); err != nil {
		t.Errorf("MaxSteps 1000: %v", err)
	}
}

// Extra property names: any canonical (json.dumps) spelling other than the
// declared names', escapes included (one shared escape rule); a declared
// name is refused as an extra key, in any spelling.
func TestAdditionalPropertyNames(t *testing.T) {
	c := compileSchema(t, `{"type":"object","properties":{"name":{"type":"string"},"nick":{"type":"string"}},"additionalProperties":{"type":"integer"}}`,
		Options{Whitespace: "python"})
	for _, s := range []string{
		`{"name": "x", "nice": 1}`, `{"n": 1}`, `{"": 1}`, `{"nickname": 1}`, `{"nam": 1}`, `{"é": 1}`,
		`{"\n": 1}`, `{"a\"b": 1}`, `{"\\": 1}`, `{"\u0001": 1}`, `{"\u001f": 1}`, `{"\u001F": 1}`, `{"n\t": 1}`, `{"nick\b": 1}`,
	} {
		if !accepts(c, s) {
			t.Errorf("%s refused", s)
		}
	}
	for _, s := range []string{
		`{"nick": 1}`, `{"name": 1}`, `{"\u006eick": 1}`, `{"nick": "a", "nick": 1}`,
		`{"\/": 1}`, `{"\u000a": 1}`, `{"\u0020": 1}`, `{"\ud83d\ude00": 1}`, `{"\t": "x"}`,
	} {
		if accepts(c, s) {
			t.Errorf("%s accepted", s)
		}
	}
}
