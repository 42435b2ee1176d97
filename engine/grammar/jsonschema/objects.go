package jsonschema

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

type prop struct {
	name     string
	schema   any
	required bool
}

func (c *converter) genObject(o *object, path string) (string, error) {
	for _, k := range []string{"patternProperties", "propertyNames"} {
		if _, ok := o.get(k); ok {
			return "", unsupported(k, path)
		}
	}
	required := map[string]bool{}
	var reqOrder []string
	if rv, ok := o.get("required"); ok {
		list, ok := rv.([]any)
		if !ok {
			return "", errorf("required", path, "must be an array")
		}
		for _, x := range list {
			s, ok := x.(string)
			if !ok {
				return "", errorf("required", path, "entries must be strings")
			}
			if !required[s] {
				required[s] = true
				reqOrder = append(reqOrder, s)
			}
		}
	}
	var ap any = true
	if v, ok := o.get("additionalProperties"); ok {
		ap = v
	}
	apFalse := false
	if b, ok := ap.(bool); ok && !b {
		apFalse = true
	}
	var props []prop
	declared := map[string]bool{}
	if pv, ok := o.get("properties"); ok {
		po, ok := pv.(*object)
		if !ok {
			return "", errorf("properties", path, "must be an object")
		}
		for _, k := range po.keys {
			declared[k] = true
			s := po.m[k]
			if b, ok := s.(bool); ok && !b {
				if required[k] {
					return "", &Error{Keyword: "required", Path: path, Msg: fmt.Sprintf("property %q is required but its schema is false; schema accepts no value", k)}
				}
				continue
			}
			props = append(props, prop{k, s, required[k]})
		}
	}
	for _, k := range reqOrder {
		if declared[k] {
			continue
		}
		if apFalse {
			return "", &Error{Keyword: "required", Path: path, Msg: fmt.Sprintf("property %q is required but additionalProperties is false; schema accepts no value", k)}
		}
		declared[k] = true
		props = append(props, prop{k, ap, true})
	}
	nReq := 0
	for _, p := range props {
		if p.required {
			nReq++
		}
	}
	if n, ok, err := intKW(o, "minProperties", path); err != nil {
		return "", err
	} else if ok && n > nReq {
		return "", unsupported("minProperties", path)
	}
	if n, ok, err := intKW(o, "maxProperties", path); err != nil {
		return "", err
	} else if ok && (!apFalse || n < len(props)) {
		if n < nReq {
			return "", &Error{Keyword: "maxProperties", Path: path, Msg: "schema accepts no value"}
		}
		return "", unsupported("maxProperties", path)
	}

	// key-value expressions
	kv := make([]string, len(props))
	for i, p := range props {
		vp := child(path, "properties", p.name)
		v, err := c.gen(p.schema, vp)
		if err != nil {
			if isUnsat(err) && !p.required {
				kv[i] = ""
				continue
			}
			return "", err
		}
		kv[i] = seq(gbnfLiteral(`"`+encodeString(p.name)+`"`), c.colon, v)
	}
	extra := ""
	if !apFalse {
		v, err := c.gen(ap, child(path, "additionalProperties"))
		if err != nil && !isUnsat(err) {
			return "", err
		}
		if err == nil {
			names := make([]string, 0, len(declared))
			for k := range declared {
				names = append(names, k)
			}
			key, err := c.keyNotIn(names, path)
			if err != nil {
				return "", err
			}
			extra = c.define("kv", seq(key, c.colon, v))
		}
	}

	// rest(i, first): the properties from index i on.
	base := c.reserve(hintOf(path) + "-obj")
	c.names[base] = true
	memo := map[string]string{}
	var rest func(i int, first bool) string
	rest = func(i int, first bool) string {
		key := fmt.Sprintf("%d/%v", i, first)
		if e, ok := memo[key]; ok {
			return e
		}
		var e string
		if i == len(props) {
			switch {
			case extra == "":
				e = ""
			case first:
				e = "(" + seq(extra, "("+seq(c.comma, extra)+")*") + ")?"
			default:
				e = "(" + seq(c.comma, extra) + ")*"
			}
		} else {
			sep := c.comma
			if first {
				sep = ""
			}
			next := rest(i+1, false)
			if kv[i] == "" {
				e = rest(i+1, first)
			} else {
				with := seq(sep, kv[i], next)
				if next == "" {
					with = seq(sep, kv[i])
				}
				if props[i].required {
					e = with
				} else {
					skip := rest(i+1, first)
					if skip == "" {
						e = "(" + with + ")?"
					} else {
						e = alt("("+with+")", skip)
						e = strings.TrimSuffix(strings.TrimPrefix(e, "("), ")")
					}
				}
			}
		}
		if e != "" && !isAtom(e) {
			e = c.define(fmt.Sprintf("%s-%d", base, i), e)
		}
		memo[key] = e
		return e
	}
	body := rest(0, true)
	return c.define(hintOf(path), seq(`"{"`, c.ws, body, c.ws, `"}"`)), nil
}

// keyNotIn matches a JSON string (with quotes) whose value is none of names.
// Characters are restricted to their canonical (json.dumps) encoding so that
// no other spelling of a declared name slips through.
func (c *converter) keyNotIn(names []string, path string) (string, error) {
	if len(names) == 0 {
		return c.stringRule(), nil
	}
	sort.Strings(names)
	type node struct {
		children map[string]*node
		order    []string
		terminal bool
	}
	newNode := func() *node { return &node{children: map[string]*node{}} }
	root := newNode()
	for _, n := range names {
		cur := root
		for _, u := range units(n) {
			nx, ok := cur.children[u]
			if !ok {
				nx = newNode()
				cur.children[u] = nx
				cur.order = append(cur.order, u)
			}
			cur = nx
		}
		cur.terminal = true
	}
	char := c.stringChar()
	tail := c.define("str-tail", seq(char+"*", `"\""`))
	id := 0
	var gen func(n *node) string
	gen = func(n *node) string {
		var alts []string
		if !n.terminal {
			alts = append(alts, `"\""`)
		}
		if len(n.order) == 0 {
			alts = append(alts, seq(char, tail))
			id++
			return c.define(fmt.Sprintf("key-%d", id), strings.Join(alts, " | "))
		}
		excludedRaw := map[rune]bool{}
		excludedEsc := map[string]bool{}
		for _, u := range n.order {
			alts = append(alts, seq(gbnfLiteral(u), gen(n.children[u])))
			if strings.HasPrefix(u, `\`) {
				excludedEsc[u] = true
			} else {
				r, _ := utf8.DecodeRuneInString(u)
				excludedRaw[r] = true
			}
		}
		// one canonical character that differs from every child
		var cls strings.Builder
		cls.WriteString(`[^"\\\u0000-\u001F`)
		raws := make([]rune, 0, len(excludedRaw))
		for r := range excludedRaw {
			raws = append(raws, r)
		}
		sort.Slice(raws, func(i, j int) bool { return raws[i] < raws[j] })
		for _, r := range raws {
			cls.WriteString(gbnfClassChar(r))
		}
		cls.WriteString("]")
		// The escapes are a rule of their own, the same in every node
		// whose children start with no escape (defined once).
		var escs []string
		for _, e := range []string{`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`} {
			if !excludedEsc[e] {
				escs = append(escs, gbnfLiteral(e))
			}
		}
		for r := rune(0); r < 0x20; r++ {
			switch r {
			case '\b', '\f', '\n', '\r', '\t':
				continue
			}
			e := fmt.Sprintf(`\u%04x`, r)
			if !excludedEsc[e] {
				escs = append(escs, seq(gbnfLiteral(`\u00`+e[4:5]), "["+strings.ToLower(e[5:6])+strings.ToUpper(e[5:6])+"]"))
			}
		}
		escRule := `"\\" (["\\bfnrt] | "u00" ("0" [0-7bBeEfF] | "1" [0-9a-fA-F]))` // every canonical escape
		if len(excludedEsc) > 0 {
			escRule = strings.Join(escs, " | ")
		}
		alts = append(alts, seq(cls.String(), tail))
		if escRule != "" {
			alts = append(alts, seq(c.define("key-esc", escRule), tail))
		}
		id++
		return c.define(fmt.Sprintf("key-%d", id), strings.Join(alts, " | "))
	}
	return c.define("key", seq(`"\""`, gen(root))), nil
}

// units splits s into the canonical JSON encodings of its characters.
func units(s string) []string {
	var out []string
	for _, r := range s {
		out = append(out, encodeString(string(r)))
	}
	return out
}

func (c *converter) genArray(o *object, path string) (string, error) {
	for _, k := range []string{"contains", "minContains", "maxContains"} {
		if _, ok := o.get(k); ok {
			return "", unsupported(k, path)
		}
	}
	minI, _, err := intKW(o, "minItems", path)
	if err != nil {
		return "", err
	}
	maxI, hasMax, err := intKW(o, "maxItems", path)
	if err != nil {
		return "", err
	}
	if !hasMax {
		maxI = -1
	}
	if hasMax && maxI < minI {
		return "", &Error{Keyword: "maxItems", Path: path, Msg: "schema accepts no value"}
	}
	if u, ok := o.get("uniqueItems"); ok {
		if b, _ := u.(bool); b && !(hasMax && maxI <= 1) {
			return "", unsupported("uniqueItems", path)
		}
	}
	var prefix []any
	var restSchema any = true
	restKW := "items"
	itemsV, hasItems := o.get("items")
	if pv, ok := o.get("prefixItems"); ok {
		list, ok := pv.([]any)
		if !ok {
			return "", errorf("prefixItems", path, "must be an array")
		}
		prefix = list
		if hasItems {
			restSchema = itemsV
		}
	} else if list, ok := itemsV.([]any); ok {
		prefix = list
		restKW = "additionalItems"
		if v, ok := o.get("additionalItems"); ok {
			restSchema = v
		}
	} else if hasItems {
		restSchema = itemsV
	}
	prefixKW := "prefixItems"
	if restKW == "additionalItems" {
		prefixKW = "items"
	}
	// prefix items beyond maxItems are irrelevant
	if hasMax && len(prefix) > maxI {
		prefix = prefix[:maxI]
	}
	pe := make([]string, len(prefix))
	limit := len(prefix) // items at index >= limit cannot be present
	for i, s := range prefix {
		e, err := c.gen(s, child(path, prefixKW, strconv.Itoa(i)))
		if err != nil {
			if isUnsat(err) && i >= minI {
				limit = i
				break
			}
			return "", err
		}
		pe[i] = e
	}
	re := ""
	if limit == len(prefix) && (!hasMax || maxI > len(prefix)) {
		e, err := c.gen(restSchema, child(path, restKW))
		if err != nil && !isUnsat(err) {
			return "", err
		}
		re = e
	}
	if limit < len(prefix) {
		prefix = prefix[:limit]
		pe = pe[:limit]
	}
	if minI > len(prefix) && re == "" {
		return "", &Error{Keyword: "minItems", Path: path, Msg: "schema accepts no value"}
	}
	var body string
	if len(prefix) == 0 {
		if re != "" {
			if minI == 0 {
				mx := -1
				if hasMax {
					mx = maxI - 1
				}
				body = "(" + seq(re, rep("("+seq(c.comma, re)+")", 0, mx)) + ")?"
			} else {
				mx := -1
				if hasMax {
					mx = maxI - 1
				}
				body = seq(re, rep("("+seq(c.comma, re)+")", minI-1, mx))
			}
		}
	} else {
		tail := ""
		if re != "" {
			a := minI - len(prefix)
			if a < 0 {
				a = 0
			}
			mx := -1
			if hasMax {
				mx = maxI - len(prefix)
			}
			tail = rep("("+seq(c.comma, re)+")", a, mx)
		}
		body = tail
		for i := len(prefix) - 1; i >= 0; i-- {
			sep := c.comma
			if i == 0 {
				sep = ""
			}
			s := seq(sep, pe[i], body)
			if body == "" {
				s = seq(sep, pe[i])
			}
			if i >= minI {
				s = "(" + s + ")?"
			}
			body = s
		}
	}
	return c.define(hintOf(path), seq(`"["`, c.ws, body, c.ws, `"]"`)), nil
}
