package jsonschema

import (
	"fmt"
	"strconv"
)

// oneOf: a value is valid when exactly one branch accepts it. A grammar
// cannot count matching branches, so each branch is made to exclude the
// others before the branches become alternatives (anyOf):
//
//   - a pair of branches that provably share no value (different types,
//     disjoint const/enum values, an object property one requires and the
//     other forbids, a required property whose schemas are disjoint) needs
//     nothing;
//   - otherwise, for objects, branch i excludes branch j by forbidding one
//     of the properties j requires and i does not (a value without it cannot
//     match j): the common "oneOf": [{"required": ["a"]}, {"required":
//     ["b"]}] becomes "a without b" or "b without a". This may reject a
//     value that matches j's required properties but fails j otherwise (the
//     strict side), never accept one matching both;
//   - any other overlap is a compile error naming oneOf.

// maxDisjointDepth bounds the recursion into property schemas.
const maxDisjointDepth = 3

// exclusive returns the oneOf branches of list, each constrained (as an
// allOf) so that no value matches two of them, given the sibling keywords
// base; or an error naming oneOf when that cannot be enforced.
func (c *converter) exclusive(base *object, list []any, path string) ([]any, error) {
	if len(list) == 1 {
		return list, nil
	}
	shapes := make([]*object, len(list))
	for i, br := range list {
		if b, ok := br.(bool); ok && !b {
			continue // matches nothing
		}
		if err := c.step(); err != nil {
			return nil, err
		}
		m := newObject()
		m.set("allOf", []any{base, br})
		s, err := c.normalize(m, child(path, "oneOf", strconv.Itoa(i)))
		if err != nil {
			if isUnsat(err) {
				continue
			}
			return nil, err
		}
		shapes[i] = s
	}
	// A type that two branches accept whole (no keyword of theirs applies
	// to it) has no valid value: every branch excludes it.
	full := map[string]int{}
	for _, s := range shapes {
		if s == nil {
			continue
		}
		ts, err := c.typesOf(s, path, 0)
		if err != nil {
			return nil, err
		}
		for t := range ts {
			if fullOn(s, t) {
				full[t]++
			}
		}
	}
	excluded := map[string]bool{}
	for t, n := range full {
		if n >= 2 {
			excluded[t] = true
		}
	}
	if excluded["integer"] && !excluded["number"] {
		delete(excluded, "integer") // "non-integral numbers" has no keyword
	}
	var typeCond any
	if len(excluded) > 0 {
		var remaining []any
		for _, t := range []string{"null", "boolean", "object", "array", "string"} {
			if !excluded[t] {
				remaining = append(remaining, t)
			}
		}
		switch {
		case !excluded["number"]:
			remaining = append(remaining, "number")
		case !excluded["integer"]:
			remaining = append(remaining, "integer")
		}
		if len(remaining) == 0 {
			return nil, &Error{Keyword: "oneOf", Path: path, Msg: "every value matches two branches; schema accepts no value"}
		}
		tc := newObject()
		tc.set("type", remaining)
		typeCond = tc
	}
	out := make([]any, 0, len(list))
	for i, br := range list {
		if shapes[i] == nil {
			out = append(out, br)
			continue
		}
		var conds []any
		if typeCond != nil {
			conds = append(conds, typeCond)
		}
		for j := range list {
			if j == i || shapes[j] == nil {
				continue
			}
			over, err := c.overlap(shapes[i], shapes[j], path, 0)
			if err != nil {
				return nil, err
			}
			for t := range excluded {
				delete(over, t)
			}
			if len(over) == 0 {
				continue
			}
			if len(over) > 1 || !over["object"] {
				return nil, errorf("oneOf", path, "branches %d and %d may both match (as %s); exclusivity cannot be enforced", i, j, typeNames(over))
			}
			diff := missingRequired(shapes[i], shapes[j])
			if len(diff) == 0 {
				return nil, errorf("oneOf", path, "branches %d and %d may both match an object; exclusivity cannot be enforced", i, j)
			}
			var forbids []any
			for _, p := range diff {
				props := newObject()
				props.set(p, false)
				f := newObject()
				f.set("properties", props)
				forbids = append(forbids, f)
			}
			if len(forbids) == 1 {
				conds = append(conds, forbids[0])
			} else {
				a := newObject()
				a.set("anyOf", forbids)
				conds = append(conds, a)
			}
		}
		if len(conds) > 0 {
			a := newObject()
			a.set("allOf", append([]any{br}, conds...))
			br = a
		}
		out = append(out, br)
	}
	return out, nil
}

func typeNames(set map[string]bool) string {
	var out []string
	for _, t := range []string{"null", "boolean", "object", "array", "string", "number", "integer"} {
		if set[t] {
			out = append(out, t)
		}
	}
	return fmt.Sprint(out)
}

// missingRequired lists the properties b requires that a does not.
func missingRequired(a, b *object) []string {
	ra := map[string]bool{}
	for _, p := range requiredOf(a) {
		ra[p] = true
	}
	var out []string
	for _, p := range requiredOf(b) {
		if !ra[p] {
			out = append(out, p)
		}
	}
	return out
}

func requiredOf(o *object) []string {
	v, _ := o.get("required")
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// valueTypes are the disjoint JSON value types; "number" is a non-integral
// number.
var valueTypes = []string{"null", "boolean", "object", "array", "string", "number", "integer"}

// typesOf is the set of value types o (normalized) may accept, from type,
// enum, const and anyOf branches; conservative otherwise.
func (c *converter) typesOf(o *object, path string, depth int) (map[string]bool, error) {
	out := map[string]bool{}
	tv, ok := o.get("type")
	if !ok {
		for _, t := range valueTypes {
			out[t] = true
		}
	} else {
		list, err := typeList(tv, path)
		if err != nil {
			return nil, err
		}
		for _, t := range list {
			out[t] = true
			if t == "number" {
				out["integer"] = true
			}
		}
	}
	if vals, ok := c.valuesOf(o, depth); ok {
		in := map[string]bool{}
		for _, v := range vals {
			t := jsonType(v)
			if out[t] {
				in[t] = true
			}
		}
		return in, nil
	}
	if bs := c.branchShapes(o, path, depth); bs != nil {
		union := map[string]bool{}
		for _, b := range bs {
			ts, err := c.typesOf(b, path, depth+1)
			if err != nil {
				return nil, err
			}
			for t := range ts {
				if out[t] {
					union[t] = true
				}
			}
		}
		out = union
	}
	return out, nil
}

// branchShapes returns o's anyOf branches normalized, or nil when o has
// none, they cannot be normalized, or depth is too large.
func (c *converter) branchShapes(o *object, path string, depth int) []*object {
	av, ok := o.get("anyOf")
	list, _ := av.([]any)
	if !ok || len(list) == 0 || depth >= maxDisjointDepth {
		return nil
	}
	var out []*object
	for _, br := range list {
		if b, ok := br.(bool); ok && !b {
			continue
		}
		bo, err := asObject(br, path)
		if err != nil {
			return nil
		}
		n, err := c.normalize(bo, path)
		if err != nil {
			return nil
		}
		out = append(out, n)
	}
	return out
}

// valuesOf returns the values o is restricted to by const, enum, or anyOf
// branches that all are.
func (c *converter) valuesOf(o *object, depth int) ([]any, bool) {
	if cv, ok := o.get("const"); ok {
		return []any{cv}, true
	}
	if ev, ok := o.get("enum"); ok {
		if list, ok := ev.([]any); ok {
			return list, true
		}
	}
	bs := c.branchShapes(o, "", depth)
	if bs == nil {
		return nil, false
	}
	var out []any
	for _, b := range bs {
		vs, ok := c.valuesOf(b, depth+1)
		if !ok {
			return nil, false
		}
		out = append(out, vs...)
	}
	return out, true
}

// fullOn reports whether o (normalized) accepts every value of type t: it
// allows t and none of its keywords constrains t.
func fullOn(o *object, t string) bool {
	if tv, ok := o.get("type"); ok {
		list, err := typeList(tv, "")
		if err != nil {
			return false
		}
		in := false
		for _, x := range list {
			in = in || x == t || (x == "number" && t == "integer")
		}
		if !in {
			return false
		}
	}
	for _, k := range o.keys {
		if k == "type" || annotations[k] || !(handled[k] || unsupportedKW[k]) {
			continue
		}
		kt, ok := kwTypes[k]
		if !ok {
			return false // enum, const, anyOf, not, ...
		}
		if kt == t || (kt == "number" && t == "integer") {
			return false
		}
	}
	return true
}

// overlap returns the value types on which a and b (normalized) may both
// accept a value: empty when they are provably disjoint.
func (c *converter) overlap(a, b *object, path string, depth int) (map[string]bool, error) {
	ta, err := c.typesOf(a, path, depth)
	if err != nil {
		return nil, err
	}
	tb, err := c.typesOf(b, path, depth)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for t := range ta {
		if !tb[t] {
			continue
		}
		dis, err := c.disjointOn(t, a, b, path, depth)
		if err != nil {
			return nil, err
		}
		if !dis {
			out[t] = true
		}
	}
	return out, nil
}

// disjointOn reports whether no value of type t is accepted by both a and b
// (false when it cannot tell).
func (c *converter) disjointOn(t string, a, b *object, path string, depth int) (bool, error) {
	va, okA := c.valuesOf(a, depth)
	vb, okB := c.valuesOf(b, depth)
	if okA && okB {
		in := map[string]bool{}
		for _, v := range vb {
			if jsonType(v) == t {
				in[canonical(v)] = true
			}
		}
		for _, v := range va {
			if jsonType(v) == t && in[canonical(v)] {
				return false, nil
			}
		}
		return true, nil
	}
	if t != "object" {
		return false, nil
	}
	if okA || okB {
		// One side is a list of objects: each must miss a property the
		// other requires.
		vals, other := va, b
		if okB {
			vals, other = vb, a
		}
		req := requiredOf(other)
		for _, v := range vals {
			ov, ok := v.(*object)
			if !ok {
				continue
			}
			missing := false
			for _, p := range req {
				if _, has := ov.get(p); !has {
					missing = true
					break
				}
			}
			if !missing {
				return false, nil
			}
		}
		return true, nil
	}
	if forbidsRequired(a, b) || forbidsRequired(b, a) {
		return true, nil
	}
	if depth >= maxDisjointDepth {
		return false, nil
	}
	rb := map[string]bool{}
	for _, p := range requiredOf(b) {
		rb[p] = true
	}
	for _, p := range requiredOf(a) {
		if !rb[p] {
			continue
		}
		sa, err := c.propShape(a, p, path)
		if err != nil || sa == nil {
			return false, err
		}
		sb, err := c.propShape(b, p, path)
		if err != nil || sb == nil {
			return false, err
		}
		over, err := c.overlap(sa, sb, path, depth+1)
		if err != nil {
			return false, err
		}
		if len(over) == 0 {
			return true, nil
		}
	}
	return false, nil
}

// forbidsRequired reports whether b forbids a property a requires.
func forbidsRequired(a, b *object) bool {
	pv, _ := b.get("properties")
	props, _ := pv.(*object)
	apv, hasAP := b.get("additionalProperties")
	apFalse := false
	if f, ok := apv.(bool); hasAP && ok && !f {
		apFalse = true
	}
	for _, p := range requiredOf(a) {
		var s any
		ok := false
		if props != nil {
			s, ok = props.get(p)
		}
		if ok {
			if f, isBool := s.(bool); isBool && !f {
				return true
			}
			continue
		}
		if apFalse {
			return true
		}
	}
	return false
}

// propShape returns the normalized schema o applies to property p, or nil
// when it cannot tell (errors other than unsatisfiability are returned).
func (c *converter) propShape(o *object, p, path string) (*object, error) {
	var s any = true
	pv, _ := o.get("properties")
	if props, ok := pv.(*object); ok {
		if v, ok := props.get(p); ok {
			s = v
		} else if ap, ok := o.get("additionalProperties"); ok {
			s = ap
		}
	} else if ap, ok := o.get("additionalProperties"); ok {
		s = ap
	}
	so, err := asObject(s, path)
	if err != nil {
		return nil, nil
	}
	n, err := c.normalize(so, path)
	if err != nil {
		if isUnsat(err) {
			return nil, nil
		}
		return nil, err
	}
	return n, nil
}
