package jsonschema

import (
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
)

// annotation keywords: ignored.
var annotations = map[string]bool{
	"$schema": true, "$id": true, "id": true, "$comment": true, "$vocabulary": true,
	"$anchor": true, "$dynamicAnchor": true, "title": true, "description": true,
	"default": true, "examples": true, "deprecated": true, "readOnly": true,
	"writeOnly": true, "contentMediaType": true, "contentEncoding": true,
	"contentSchema": true, "$defs": true, "definitions": true,
}

// keywords handled somewhere by the converter.
var handled = map[string]bool{
	"type": true, "enum": true, "const": true, "properties": true, "required": true,
	"additionalProperties": true, "items": true, "prefixItems": true, "additionalItems": true,
	"minItems": true, "maxItems": true, "uniqueItems": true, "minLength": true, "maxLength": true,
	"pattern": true, "format": true, "minimum": true, "maximum": true,
	"exclusiveMinimum": true, "exclusiveMaximum": true, "multipleOf": true,
	"anyOf": true, "oneOf": true, "allOf": true, "$ref": true, "not": true,
	"minProperties": true, "maxProperties": true,
}

// JSON Schema keywords (any draft) the converter does not implement.
var unsupportedKW = map[string]bool{
	"if": true, "then": true, "else": true, "patternProperties": true,
	"propertyNames": true, "contains": true, "minContains": true, "maxContains": true,
	"dependentRequired": true, "dependentSchemas": true, "dependencies": true,
	"unevaluatedProperties": true, "unevaluatedItems": true, "$dynamicRef": true,
	"$recursiveRef": true, "$recursiveAnchor": true, "disallow": true, "extends": true,
	"divisibleBy": true,
}

func child(path string, parts ...string) string {
	for _, p := range parts {
		p = strings.ReplaceAll(p, "~", "~0")
		p = strings.ReplaceAll(p, "/", "~1")
		path += "/" + p
	}
	return path
}

// gen returns a GBNF expression for the JSON texts valid under schema s.
func (c *converter) gen(s any, path string) (string, error) {
	if err := c.step(); err != nil {
		return "", err
	}
	c.depth++
	defer func() { c.depth-- }()
	if c.depth > 200 {
		return "", &Error{Path: path, Msg: "schema nesting too deep"}
	}
	switch t := s.(type) {
	case bool:
		if t {
			return c.anyValue(), nil
		}
		return "", &Error{Path: path, Msg: "schema false accepts no value"}
	case *object:
		if ref, ok := t.get("$ref"); ok && onlyRef(t) {
			r, ok := ref.(string)
			if !ok {
				return "", errorf("$ref", path, "not a string")
			}
			return c.refRule(r, path)
		}
		o, err := c.normalize(t, path)
		if err != nil {
			return "", err
		}
		return c.genNormalized(o, path)
	}
	return "", &Error{Path: path, Msg: "schema is neither an object nor a boolean"}
}

func onlyRef(o *object) bool {
	for _, k := range o.keys {
		if k != "$ref" && (annotations[k] || !(handled[k] || unsupportedKW[k])) {
			continue
		}
		if k != "$ref" {
			return false
		}
	}
	return true
}

// refRule returns the rule for a $ref target, generating it once (recursion
// becomes a recursive rule).
func (c *converter) refRule(ref, path string) (string, error) {
	if name, ok := c.refs[ref]; ok {
		return name, nil
	}
	target, err := c.resolve(ref, path)
	if err != nil {
		return "", err
	}
	hint := "ref"
	if i := strings.LastIndex(ref, "/"); i >= 0 {
		hint = ref[i+1:]
	}
	name := c.reserve(hint)
	c.refs[ref] = name
	body, err := c.gen(target, ref)
	if err != nil {
		return "", err
	}
	c.setRule(name, body)
	return name, nil
}

func (c *converter) resolve(ref, path string) (any, error) {
	if !strings.HasPrefix(ref, "#") {
		return nil, errorf("$ref", path, "only same-document JSON pointer references are supported, got %q", ref)
	}
	frag, err := url.PathUnescape(ref[1:])
	if err != nil {
		return nil, errorf("$ref", path, "bad reference %q", ref)
	}
	if frag != "" && !strings.HasPrefix(frag, "/") {
		return nil, errorf("$ref", path, "anchor references are not supported: %q", ref)
	}
	cur := c.root
	if frag == "" {
		return cur, nil
	}
	for _, p := range strings.Split(frag[1:], "/") {
		p = strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~")
		switch t := cur.(type) {
		case *object:
			v, ok := t.get(p)
			if !ok {
				return nil, errorf("$ref", path, "unresolvable reference %q", ref)
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(t) {
				return nil, errorf("$ref", path, "unresolvable reference %q", ref)
			}
			cur = t[i]
		default:
			return nil, errorf("$ref", path, "unresolvable reference %q", ref)
		}
	}
	return cur, nil
}

// normalize inlines $ref (when it has sibling keywords) and allOf, and turns
// oneOf into anyOf over branches made mutually exclusive (see exclusive), so
// the result has neither $ref, allOf nor oneOf at its top.
func (c *converter) normalize(o *object, path string) (*object, error) {
	for iter := 0; ; iter++ {
		if err := c.step(); err != nil {
			return nil, err
		}
		if iter > 50 {
			return nil, errorf("$ref", path, "reference cycle without structure")
		}
		if ref, ok := o.get("$ref"); ok {
			r, ok := ref.(string)
			if !ok {
				return nil, errorf("$ref", path, "not a string")
			}
			target, err := c.resolve(r, path)
			if err != nil {
				return nil, err
			}
			rest := o.clone()
			rest.del("$ref")
			tobj, err := asObject(target, path)
			if err != nil {
				return nil, err
			}
			o, err = c.merge(tobj, rest, path)
			if err != nil {
				return nil, err
			}
			continue
		}
		if all, ok := o.get("allOf"); ok {
			list, ok := all.([]any)
			if !ok || len(list) == 0 {
				return nil, errorf("allOf", path, "must be a non-empty array")
			}
			acc := o.clone()
			acc.del("allOf")
			for i, sub := range list {
				so, err := asObject(sub, child(path, "allOf", strconv.Itoa(i)))
				if err != nil {
					return nil, err
				}
				acc, err = c.merge(acc, so, path)
				if err != nil {
					return nil, err
				}
			}
			o = acc
			continue
		}
		if one, ok := o.get("oneOf"); ok {
			list, ok := one.([]any)
			if !ok || len(list) == 0 {
				return nil, errorf("oneOf", path, "must be a non-empty array")
			}
			o = o.clone()
			o.del("oneOf")
			base := o.clone()
			base.del("anyOf")
			excl, err := c.exclusive(base, list, path)
			if err != nil {
				return nil, err
			}
			if anyV, ok := o.get("anyOf"); ok {
				prod, err := crossProduct(anyV, excl, path)
				if err != nil {
					return nil, err
				}
				o.set("anyOf", prod)
			} else {
				o.set("anyOf", excl)
			}
			continue
		}
		return o, nil
	}
}

func asObject(s any, path string) (*object, error) {
	switch t := s.(type) {
	case *object:
		return t, nil
	case bool:
		if t {
			return newObject(), nil
		}
		return nil, &Error{Path: path, Msg: "schema false accepts no value"}
	}
	return nil, &Error{Path: path, Msg: "schema is neither an object nor a boolean"}
}

func allOf(a, b any) any {
	if t, ok := a.(bool); ok && t {
		return b
	}
	if t, ok := b.(bool); ok && t {
		return a
	}
	if t, ok := a.(bool); ok && !t {
		return false
	}
	if t, ok := b.(bool); ok && !t {
		return false
	}
	if canonical(a) == canonical(b) {
		return a
	}
	o := newObject()
	o.set("allOf", []any{a, b})
	return o
}

func crossProduct(a, b any, path string) ([]any, error) {
	la, ok1 := a.([]any)
	lb, ok2 := b.([]any)
	if !ok1 || !ok2 {
		return nil, errorf("anyOf", path, "must be an array")
	}
	if len(la)*len(lb) > 64 {
		return nil, errorf("allOf", path, "combining anyOf/oneOf lists gives too many branches")
	}
	var out []any
	for _, x := range la {
		for _, y := range lb {
			out = append(out, allOf(x, y))
		}
	}
	return out, nil
}

// merge computes a schema equivalent to allOf [a, b] for the common cases.
func (c *converter) merge(a, b *object, path string) (*object, error) {
	var err error
	a, err = c.normalize(a, path)
	if err != nil {
		return nil, err
	}
	b, err = c.normalize(b, path)
	if err != nil {
		return nil, err
	}
	r := a.clone()
	apA, hasApA := a.get("additionalProperties")
	apB, hasApB := b.get("additionalProperties")
	propsA, _ := a.get("properties")
	propsB, _ := b.get("properties")
	pa, _ := propsA.(*object)
	pb, _ := propsB.(*object)
	for _, k := range b.keys {
		bv := b.m[k]
		av, inA := a.get(k)
		if !inA {
			r.set(k, bv)
			continue
		}
		switch k {
		case "title", "description", "default", "examples", "$comment", "$schema", "$id",
			"$defs", "definitions", "deprecated", "readOnly", "writeOnly":
			// keep a's
		case "type":
			t, err := intersectTypes(av, bv, path)
			if err != nil {
				return nil, err
			}
			r.set(k, t)
		case "properties":
			// handled below
		case "required":
			la, _ := av.([]any)
			lb, _ := bv.([]any)
			seen := map[string]bool{}
			var out []any
			for _, x := range append(append([]any{}, la...), lb...) {
				if s, ok := x.(string); ok && !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
			}
			r.set(k, out)
		case "additionalProperties", "items", "additionalItems":
			if _, isArr := av.([]any); isArr {
				if canonical(av) != canonical(bv) {
					return nil, errorf("allOf", path, "cannot merge differing %q", k)
				}
				continue
			}
			if _, isArr := bv.([]any); isArr {
				return nil, errorf("allOf", path, "cannot merge differing %q", k)
			}
			r.set(k, allOf(av, bv))
		case "minLength", "minItems", "minProperties":
			if numLess(av, bv) {
				r.set(k, bv)
			}
		case "maxLength", "maxItems", "maxProperties":
			if numLess(bv, av) {
				r.set(k, bv)
			}
		case "minimum", "exclusiveMinimum":
			if _, ok := av.(bool); ok {
				if canonical(av) != canonical(bv) {
					return nil, errorf("allOf", path, "cannot merge differing %q", k)
				}
			} else if numLess(av, bv) {
				r.set(k, bv)
			}
		case "maximum", "exclusiveMaximum":
			if _, ok := av.(bool); ok {
				if canonical(av) != canonical(bv) {
					return nil, errorf("allOf", path, "cannot merge differing %q", k)
				}
			} else if numLess(bv, av) {
				r.set(k, bv)
			}
		case "enum":
			la, _ := av.([]any)
			lb, _ := bv.([]any)
			in := map[string]bool{}
			for _, x := range lb {
				in[canonical(x)] = true
			}
			var out []any
			for _, x := range la {
				if in[canonical(x)] {
					out = append(out, x)
				}
			}
			r.set(k, out)
		case "anyOf":
			prod, err := crossProduct(av, bv, path)
			if err != nil {
				return nil, err
			}
			r.set(k, prod)
		case "uniqueItems":
			if t, _ := bv.(bool); t {
				r.set(k, true)
			}
		default:
			if canonical(av) != canonical(bv) {
				return nil, errorf("allOf", path, "cannot merge differing %q", k)
			}
		}
	}
	// properties: union; a property known to one side only is also
	// constrained by the other side's additionalProperties.
	if pa != nil || pb != nil {
		np := newObject()
		if pa != nil {
			for _, k := range pa.keys {
				v := pa.m[k]
				if pb != nil {
					if w, ok := pb.get(k); ok {
						v = allOf(v, w)
					} else if hasApB {
						v = allOf(v, apB)
					}
				} else if hasApB {
					v = allOf(v, apB)
				}
				np.set(k, v)
			}
		}
		if pb != nil {
			for _, k := range pb.keys {
				if _, ok := np.get(k); ok {
					continue
				}
				v := pb.m[k]
				if hasApA {
					v = allOf(v, apA)
				}
				np.set(k, v)
			}
		}
		r.set("properties", np)
	}
	return r, nil
}

func numLess(a, b any) bool {
	x, ok1 := a.(json.Number)
	y, ok2 := b.(json.Number)
	if !ok1 || !ok2 {
		return false
	}
	rx, ok1 := ratOf(x)
	ry, ok2 := ratOf(y)
	return ok1 && ok2 && rx.Cmp(ry) < 0
}

var allTypes = []string{"null", "boolean", "object", "array", "number", "string", "integer"}

func typeList(v any, path string) ([]string, error) {
	switch t := v.(type) {
	case nil:
		return append([]string(nil), allTypes...), nil
	case string:
		return []string{t}, nil
	case []any:
		var out []string
		for _, x := range t {
			s, ok := x.(string)
			if !ok {
				return nil, errorf("type", path, "entries must be strings")
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, errorf("type", path, "must be a string or an array")
}

func intersectTypes(a, b any, path string) (any, error) {
	la, err := typeList(a, path)
	if err != nil {
		return nil, err
	}
	lb, err := typeList(b, path)
	if err != nil {
		return nil, err
	}
	has := func(l []string, t string) bool {
		for _, x := range l {
			if x == t {
				return true
			}
		}
		return false
	}
	var out []any
	for _, t := range la {
		if has(lb, t) || (t == "integer" && has(lb, "number")) {
			out = append(out, t)
		} else if t == "number" && has(lb, "integer") {
			out = append(out, "integer")
		}
	}
	if len(out) == 0 {
		return nil, errorf("allOf", path, "type intersection is empty")
	}
	return out, nil
}

// genNormalized generates a schema without $ref/allOf/oneOf at its top.
func (c *converter) genNormalized(o *object, path string) (string, error) {
	for _, k := range o.keys {
		if unsupportedKW[k] {
			return "", unsupported(k, path)
		}
	}
	if anyV, ok := o.get("anyOf"); ok {
		list, ok := anyV.([]any)
		if !ok || len(list) == 0 {
			return "", errorf("anyOf", path, "must be a non-empty array")
		}
		rest := o.clone()
		rest.del("anyOf")
		plain := true
		for _, k := range rest.keys {
			if !annotations[k] && (handled[k] || unsupportedKW[k]) {
				plain = false
			}
		}
		var alts []string
		var firstErr error
		for i, br := range list {
			bp := child(path, "anyOf", strconv.Itoa(i))
			if b, ok := br.(bool); ok && !b {
				continue
			}
			var e string
			var err error
			if plain {
				e, err = c.gen(br, bp)
			} else {
				e, err = c.gen(allOf(rest, br), bp)
			}
			if err != nil {
				if isUnsat(err) {
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				return "", err
			}
			alts = append(alts, e)
		}
		if len(alts) == 0 {
			if firstErr != nil {
				return "", firstErr
			}
			return "", &Error{Keyword: "anyOf", Path: path, Msg: "no branch accepts any value"}
		}
		return c.define(hintOf(path), alt(alts...)), nil
	}
	return c.genTyped(o, path)
}

func isUnsat(err error) bool {
	e, ok := err.(*Error)
	return ok && strings.Contains(e.Msg, "accepts no value")
}

func hintOf(path string) string {
	if i := strings.LastIndex(path, "/"); i >= 0 && i+1 < len(path) {
		return path[i+1:]
	}
	return "schema"
}

// genTyped generates a schema whose only combinators are gone.
func (c *converter) genTyped(o *object, path string) (string, error) {
	tv, _ := o.get("type")
	types, err := typeList(tv, path)
	if err != nil {
		return "", err
	}
	has := map[string]bool{}
	for _, t := range types {
		switch t {
		case "null", "boolean", "object", "array", "number", "string", "integer":
			has[t] = true
		default:
			return "", errorf("type", path, "unknown type %q", t)
		}
	}
	_, hasEnum0 := o.get("enum")
	_, hasConst0 := o.get("const")
	if nv, ok := o.get("not"); ok && !hasEnum0 && !hasConst0 {
		if err := applyNot(nv, has, path); err != nil {
			return "", err
		}
	}
	if has["number"] {
		if mo, ok := o.get("multipleOf"); ok && isOne(mo) {
			delete(has, "number")
			has["integer"] = true
		} else {
			delete(has, "integer")
		}
	}
	_, hasEnum := o.get("enum")
	_, hasConst := o.get("const")
	if hasEnum || hasConst {
		return c.genEnum(o, has, path)
	}
	var alts []string
	for _, t := range allTypes {
		if !has[t] {
			continue
		}
		var e string
		var err error
		switch t {
		case "null":
			e = `"null"`
		case "boolean":
			e = `("true" | "false")`
		case "string":
			e, err = c.genString(o, path)
		case "integer":
			e, err = c.genInteger(o, path)
		case "number":
			e, err = c.genNumber(o, path)
		case "object":
			e, err = c.genObject(o, path)
		case "array":
			e, err = c.genArray(o, path)
		}
		if err != nil {
			if isUnsat(err) && len(has) > 1 {
				continue
			}
			return "", err
		}
		alts = append(alts, e)
	}
	if len(alts) == 0 {
		return "", &Error{Path: path, Msg: "schema accepts no value"}
	}
	if len(alts) == 6 && tv == nil && isPlainAny(o) {
		return c.anyValue(), nil
	}
	e := alt(alts...)
	if len(alts) == 1 && isAtom(e) {
		return e, nil
	}
	return c.define(hintOf(path), e), nil
}

func isPlainAny(o *object) bool {
	for _, k := range o.keys {
		if !annotations[k] && (handled[k] || unsupportedKW[k]) {
			return false
		}
	}
	return true
}

func isOne(v any) bool {
	n, ok := v.(json.Number)
	if !ok {
		return false
	}
	r, ok := ratOf(n)
	return ok && r.IsInt() && r.Num().IsInt64() && r.Num().Int64() == 1
}

func jsonType(v any) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case *object:
		return "object"
	case json.Number:
		if r, ok := ratOf(t); ok && r.IsInt() {
			return "integer"
		}
		return "number"
	}
	return ""
}

// genEnum handles enum and const; other assertions next to them are not
// intersected (the keyword is reported instead).
func (c *converter) genEnum(o *object, has map[string]bool, path string) (string, error) {
	var values []any
	if cv, ok := o.get("const"); ok {
		values = []any{cv}
		if ev, ok := o.get("enum"); ok {
			list, _ := ev.([]any)
			found := false
			for _, x := range list {
				if canonical(x) == canonical(cv) {
					found = true
				}
			}
			if !found {
				values = nil
			}
		}
	} else {
		ev, _ := o.get("enum")
		list, ok := ev.([]any)
		if !ok {
			return "", errorf("enum", path, "must be an array")
		}
		values = list
	}
	if nv, ok := o.get("not"); ok {
		kept, err := filterNot(values, nv, path)
		if err != nil {
			return "", err
		}
		values = kept
	}
	for _, k := range o.keys {
		if k == "type" || k == "enum" || k == "const" || k == "not" || annotations[k] || !handled[k] {
			continue
		}
		// A keyword that only constrains other types is harmless.
		if kwAppliesTo(k, values) {
			return "", errorf(k, path, "cannot be combined with enum/const")
		}
	}
	var alts []string
	seen := map[string]bool{}
	for _, v := range values {
		t := jsonType(v)
		ok := has[t] || (t == "integer" && has["number"]) || (t == "number" && has["integer"] && false)
		if !ok || seen[canonical(v)] {
			continue
		}
		seen[canonical(v)] = true
		alts = append(alts, c.literalValue(v))
	}
	if len(alts) == 0 {
		return "", &Error{Keyword: "enum", Path: path, Msg: "schema accepts no value"}
	}
	return c.define(hintOf(path), alt(alts...)), nil
}

var kwTypes = map[string]string{
	"properties": "object", "required": "object", "additionalProperties": "object",
	"minProperties": "object", "maxProperties": "object",
	"items": "array", "prefixItems": "array", "additionalItems": "array", "minItems": "array",
	"maxItems": "array", "uniqueItems": "array",
	"minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
	"minimum": "number", "maximum": "number", "exclusiveMinimum": "number",
	"exclusiveMaximum": "number", "multipleOf": "number",
}

func kwAppliesTo(k string, values []any) bool {
	t, ok := kwTypes[k]
	if !ok {
		return true
	}
	if k == "format" {
		return false // annotation by default; unknown formats are ignored too
	}
	for _, v := range values {
		vt := jsonType(v)
		if vt == "integer" {
			vt = "number"
		}
		if vt == t {
			return true
		}
	}
	return false
}

// literalValue renders a JSON value in json.dumps form (with the configured
// separators).
func (c *converter) literalValue(v any) string {
	switch t := v.(type) {
	case nil:
		return `"null"`
	case bool:
		if t {
			return `"true"`
		}
		return `"false"`
	case json.Number:
		return gbnfLiteral(string(t))
	case string:
		return gbnfLiteral(`"` + encodeString(t) + `"`)
	case []any:
		if len(t) == 0 {
			return seq(`"["`, c.ws, `"]"`)
		}
		parts := []string{`"["`, c.ws}
		for i, e := range t {
			if i > 0 {
				parts = append(parts, c.comma)
			}
			parts = append(parts, c.literalValue(e))
		}
		parts = append(parts, c.ws, `"]"`)
		return "(" + seq(parts...) + ")"
	case *object:
		if len(t.keys) == 0 {
			return seq(`"{"`, c.ws, `"}"`)
		}
		parts := []string{`"{"`, c.ws}
		for i, k := range t.keys {
			if i > 0 {
				parts = append(parts, c.comma)
			}
			parts = append(parts, gbnfLiteral(`"`+encodeString(k)+`"`), c.colon, c.literalValue(t.m[k]))
		}
		parts = append(parts, c.ws, `"}"`)
		return "(" + seq(parts...) + ")"
	}
	return `""`
}

// applyNot supports "not" only where it removes whole types: not false, not
// {"type": ...}; anything else is reported.
func applyNot(nv any, has map[string]bool, path string) error {
	switch t := nv.(type) {
	case bool:
		if !t {
			return nil
		}
		return &Error{Keyword: "not", Path: path, Msg: "schema accepts no value"}
	case *object:
		tv, hasType := t.get("type")
		for _, k := range t.keys {
			if k != "type" && !annotations[k] && (handled[k] || unsupportedKW[k]) {
				return unsupported("not", path)
			}
		}
		if !hasType {
			return &Error{Keyword: "not", Path: path, Msg: "schema accepts no value"}
		}
		types, err := typeList(tv, path)
		if err != nil {
			return err
		}
		for _, x := range types {
			switch x {
			case "number":
				delete(has, "number")
				delete(has, "integer")
			case "integer":
				if has["number"] {
					return unsupported("not", path) // non-integral numbers only
				}
				delete(has, "integer")
			default:
				delete(has, x)
			}
		}
		return nil
	}
	return unsupported("not", path)
}

// filterNot drops enum values that a "not" schema made of type, enum and
// const rejects.
func filterNot(values []any, nv any, path string) ([]any, error) {
	if b, ok := nv.(bool); ok {
		if b {
			return nil, nil
		}
		return values, nil
	}
	no, ok := nv.(*object)
	if !ok {
		return nil, unsupported("not", path)
	}
	for _, k := range no.keys {
		if k != "type" && k != "enum" && k != "const" && !annotations[k] && (handled[k] || unsupportedKW[k]) {
			return nil, unsupported("not", path)
		}
	}
	var kept []any
	for _, v := range values {
		matches := true
		if tv, ok := no.get("type"); ok {
			types, err := typeList(tv, path)
			if err != nil {
				return nil, err
			}
			jt, in := jsonType(v), false
			for _, t := range types {
				in = in || t == jt || (t == "number" && jt == "integer")
			}
			matches = matches && in
		}
		if ev, ok := no.get("enum"); ok {
			list, _ := ev.([]any)
			in := false
			for _, x := range list {
				in = in || canonical(x) == canonical(v)
			}
			matches = matches && in
		}
		if cv, ok := no.get("const"); ok {
			matches = matches && canonical(cv) == canonical(v)
		}
		if !matches {
			kept = append(kept, v)
		}
	}
	return kept, nil
}
