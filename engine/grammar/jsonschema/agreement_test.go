package jsonschema

import (
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// refValidator is a small JSON Schema validator for the keywords this package
// supports, used as the reference in TestAgreement (no validator library is a
// dependency of this module).
type refValidator struct{ root any }

func (rv *refValidator) valid(v, s any) bool {
	switch t := s.(type) {
	case bool:
		return t
	case *object:
		return rv.validObj(v, t)
	}
	panic("bad schema")
}

func (rv *refValidator) validObj(v any, s *object) bool {
	if r, ok := s.get("$ref"); ok {
		c := &converter{root: rv.root}
		target, err := c.resolve(r.(string), "#")
		if err != nil || !rv.valid(v, target) {
			return false
		}
	}
	if tv, ok := s.get("type"); ok {
		types, _ := typeList(tv, "#")
		jt, ok := jsonType(v), false
		for _, x := range types {
			ok = ok || x == jt || (x == "number" && jt == "integer")
		}
		if !ok {
			return false
		}
	}
	if ev, ok := s.get("enum"); ok {
		found := false
		for _, x := range ev.([]any) {
			found = found || canonical(x) == canonical(v)
		}
		if !found {
			return false
		}
	}
	if cv, ok := s.get("const"); ok && canonical(cv) != canonical(v) {
		return false
	}
	for _, k := range []string{"allOf", "anyOf"} {
		if lv, ok := s.get(k); ok {
			n := 0
			for _, sub := range lv.([]any) {
				if rv.valid(v, sub) {
					n++
				}
			}
			if (k == "allOf" && n != len(lv.([]any))) || (k == "anyOf" && n == 0) {
				return false
			}
		}
	}
	if nv, ok := s.get("not"); ok && rv.valid(v, nv) {
		return false
	}
	switch x := v.(type) {
	case string:
		n := utf8.RuneCountInString(x)
		if m, ok := s.get("minLength"); ok && n < atoi(m) {
			return false
		}
		if m, ok := s.get("maxLength"); ok && n > atoi(m) {
			return false
		}
		if p, ok := s.get("pattern"); ok && !regexp.MustCompile(p.(string)).MatchString(x) {
			return false
		}
		if f, ok := s.get("format"); ok && f == "date" {
			if _, err := time.Parse("2006-01-02", x); err != nil {
				return false
			}
		}
	case json.Number:
		r, _ := ratOf(x)
		for k, want := range map[string]func(int) bool{
			"minimum": func(c int) bool { return c >= 0 }, "maximum": func(c int) bool { return c <= 0 },
			"exclusiveMinimum": func(c int) bool { return c > 0 }, "exclusiveMaximum": func(c int) bool { return c < 0 },
		} {
			if b, ok := s.get(k); ok {
				br, _ := ratOf(b.(json.Number))
				if !want(r.Cmp(br)) {
					return false
				}
			}
		}
	case *object:
		props, _ := s.get("properties")
		po, _ := props.(*object)
		if req, ok := s.get("required"); ok {
			for _, k := range req.([]any) {
				if _, ok := x.get(k.(string)); !ok {
					return false
				}
			}
		}
		for _, k := range x.keys {
			if po != nil {
				if ps, ok := po.get(k); ok {
					if !rv.valid(x.m[k], ps) {
						return false
					}
					continue
				}
			}
			if ap, ok := s.get("additionalProperties"); ok && !rv.valid(x.m[k], ap) {
				return false
			}
		}
	case []any:
		if m, ok := s.get("minItems"); ok && len(x) < atoi(m) {
			return false
		}
		if m, ok := s.get("maxItems"); ok && len(x) > atoi(m) {
			return false
		}
		var prefix []any
		rest, hasRest := s.get("items")
		if p, ok := s.get("prefixItems"); ok {
			prefix = p.([]any)
		} else if p, ok := rest.([]any); ok {
			prefix = p
			rest, hasRest = s.get("additionalItems")
		}
		for i, e := range x {
			if i < len(prefix) {
				if !rv.valid(e, prefix[i]) {
					return false
				}
			} else if hasRest && !rv.valid(e, rest) {
				return false
			}
		}
	}
	return true
}

func atoi(v any) int {
	n, _ := v.(json.Number).Int64()
	return int(n)
}

// instance generator: mostly follows the schema, sometimes breaks it.
type instGen struct {
	r    *rand.Rand
	root any
}

var junk = []any{nil, true, false, json.Number("0"), json.Number("-7"), json.Number("2.5"), "", "x", "hello", []any{}, newObject()}

func (g *instGen) gen(s any, depth int) any {
	o, ok := s.(*object)
	if !ok || depth > 5 || g.r.Intn(12) == 0 {
		return junk[g.r.Intn(len(junk))]
	}
	if r, ok := o.get("$ref"); ok {
		c := &converter{root: g.root}
		t, _ := c.resolve(r.(string), "#")
		return g.gen(t, depth+1)
	}
	for _, k := range []string{"anyOf", "allOf"} {
		if lv, ok := o.get(k); ok {
			l := lv.([]any)
			return g.gen(l[g.r.Intn(len(l))], depth+1)
		}
	}
	if ex, ok := o.get("examples"); ok && g.r.Intn(4) != 0 {
		l := ex.([]any)
		return l[g.r.Intn(len(l))]
	}
	if ev, ok := o.get("enum"); ok {
		l := ev.([]any)
		return l[g.r.Intn(len(l))]
	}
	if cv, ok := o.get("const"); ok {
		return cv
	}
	types := []string{"object"}
	if tv, ok := o.get("type"); ok {
		types, _ = typeList(tv, "#")
	}
	switch types[g.r.Intn(len(types))] {
	case "null":
		return nil
	case "boolean":
		return g.r.Intn(2) == 0
	case "integer", "number":
		lo, hi := int64(-30), int64(130)
		if m, ok := o.get("minimum"); ok {
			lo = int64(atoi(m)) - 2
		}
		if m, ok := o.get("maximum"); ok {
			hi = int64(atoi(m)) + 2
		}
		n := lo + g.r.Int63n(hi-lo+1)
		if types[0] == "number" && g.r.Intn(2) == 0 {
			return json.Number(new(big.Rat).SetFrac64(n*4+int64(g.r.Intn(4)), 4).FloatString(2))
		}
		return json.Number(fmt.Sprint(n))
	case "string":
		n := g.r.Intn(6)
		alpha := []string{"a", "b", "Z", "0", "9", "-", " ", "é", "\"", "\n", "漢"}
		var b strings.Builder
		for range n {
			b.WriteString(alpha[g.r.Intn(len(alpha))])
		}
		return b.String()
	case "array":
		var out []any
		prefix, _ := o.get("prefixItems")
		pl, _ := prefix.([]any)
		items, _ := o.get("items")
		n := g.r.Intn(5)
		for i := range n {
			if i < len(pl) {
				out = append(out, g.gen(pl[i], depth+1))
			} else {
				out = append(out, g.gen(items, depth+1))
			}
		}
		return append([]any{}, out...)
	}
	obj := newObject()
	props, _ := o.get("properties")
	po, _ := props.(*object)
	req := map[string]bool{}
	if rv, ok := o.get("required"); ok {
		for _, k := range rv.([]any) {
			req[k.(string)] = true
		}
	}
	if po != nil {
		for _, k := range po.keys {
			if (req[k] && g.r.Intn(10) != 0) || g.r.Intn(2) == 0 {
				obj.set(k, g.gen(po.m[k], depth+1))
			}
		}
	}
	if g.r.Intn(4) == 0 {
		ap, _ := o.get("additionalProperties")
		obj.set([]string{"extra", "a", "zz"}[g.r.Intn(3)], g.gen(ap, depth+1))
	}
	return obj
}

func pyDumps(v any) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case bool:
		return fmt.Sprint(t)
	case json.Number:
		return string(t)
	case string:
		return `"` + encodeString(t) + `"`
	case []any:
		parts := make([]string, len(t))
		for i, e := range t {
			parts[i] = pyDumps(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case *object:
		parts := make([]string, len(t.keys))
		for i, k := range t.keys {
			parts[i] = `"` + encodeString(k) + `": ` + pyDumps(t.m[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	panic("bad value")
}

// Schemas avoid the documented relaxations (oneOf, property order is kept by
// the generator) so grammar and validator must agree exactly.
var agreementSchemas = []string{
	`{"type":"object","properties":{"id":{"type":"integer","minimum":1,"maximum":100},"name":{"type":"string","minLength":1,"maxLength":4},"tags":{"type":"array","items":{"enum":["a","b",3]},"maxItems":3},"ok":{"type":["boolean","null"]}},"required":["id","name"],"additionalProperties":false}`,
	`{"type":"object","properties":{"a":{"type":"number","minimum":-2,"exclusiveMaximum":100},"b":{"type":"string","pattern":"^[a-b]+[0-9]?$","examples":["ab","a9","b","abc","a99"]}},"additionalProperties":{"type":"integer"}}`,
	`{"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/t"}}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/t"}`,
	`{"type":"array","prefixItems":[{"type":"string","format":"date","examples":["2024-02-29","2023-02-29","2023-11-31","2023-11-30"]},{"const":{"k":[1,null]}}],"items":{"type":"integer","exclusiveMinimum":0},"minItems":1,"maxItems":4}`,
	`{"anyOf":[{"type":"string","maxLength":2},{"type":"integer","maximum":-5},{"type":"object","properties":{"x":{"type":"null"}},"required":["x"]}]}`,
	`{"allOf":[{"type":"object","properties":{"p":{"type":"integer"}},"required":["p"]},{"properties":{"p":{"minimum":10},"q":{"not":{"type":"string"}}}}]}`,
	`{}`,
}

func TestAgreement(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i, schema := range agreementSchemas {
		root, err := parseJSON([]byte(schema))
		if err != nil {
			t.Fatal(err)
		}
		c := compileSchema(t, schema, Options{})
		cp := compileSchema(t, schema, Options{Whitespace: "python"})
		rv := &refValidator{root: root}
		g := &instGen{r: r, root: root}
		nValid := 0
		for range 300 {
			text := pyDumps(g.gen(root, 0))
			v, err := parseJSON([]byte(text))
			if err != nil {
				t.Fatalf("generated bad JSON %s", text)
			}
			want := rv.valid(v, root)
			if want {
				nValid++
			}
			if got := accepts(c, text); got != want {
				t.Errorf("schema %d: %s: grammar %v, validator %v", i, text, got, want)
			}
			if got := accepts(cp, text); got != want {
				t.Errorf("schema %d (python): %s: grammar %v, validator %v", i, text, got, want)
			}
		}
		if schema != `{}` && (nValid < 20 || nValid > 290) {
			t.Errorf("schema %d: %d of 300 instances valid; generator is not mixing", i, nValid)
		}
	}
}
