// Package jsonschema converts JSON Schema documents into GBNF grammars (the
// llama.cpp grammar syntax read by grammar.ParseGBNF) whose language is the
// set of JSON texts valid under the schema.
//
// # Serialization
//
// Output follows Python's json.dumps: properties in schema order, strings in
// ensure_ascii=False form. Options.Whitespace picks the token separators:
//
//   - "flexible" (default): any JSON whitespace (space, tab, CR, LF) in every
//     gap between tokens, at most Options.MaxWhitespace (default 8) characters
//     per gap. This covers json.dumps' ", " and ": " and the compact form.
//   - "python": exactly json.dumps' default separators ", " and ": ", no other
//     whitespace.
//   - "compact": no whitespace at all ("," and ":").
//
// # Supported keywords
//
// type (string or array), enum, const, properties, required,
// additionalProperties (false, true, schema), items, prefixItems,
// items-as-array + additionalItems (draft-07), minItems, maxItems, minLength,
// maxLength, pattern, format, minimum, maximum, exclusiveMinimum,
// exclusiveMaximum (numeric and draft-04 boolean forms), multipleOf (only the
// value 1), anyOf, oneOf, allOf, $ref (JSON pointers into the same document,
// recursion allowed), $defs, definitions, uniqueItems (false, or maxItems <= 1),
// minProperties / maxProperties (only when implied by the rest of the schema),
// not (only false, {"type": ...} removing whole types, and next to enum/const
// a not made of type/enum/const, which filters the values).
// ToGBNFContext stops at a context's end and Options.MaxSteps bounds the
// work (schema nodes visited), for pathological schemas.
// Annotation keywords (title, description, default, examples, $schema, $id,
// $comment, deprecated, readOnly, writeOnly, contentMediaType, ...) and keywords
// that are not JSON Schema keywords at all (vendor extensions) are ignored.
// Other JSON Schema keywords (other uses of not, if/then/else, patternProperties,
// propertyNames, contains, dependentRequired, dependentSchemas, dependencies,
// unevaluatedProperties, unevaluatedItems, $dynamicRef, ...) make ToGBNF fail
// with an error naming the keyword and its location, e.g.
//
//	jsonschema: unsupported keyword "not" at #/properties/x
//
// # Choices and relaxations
//
// The grammar never accepts a text the schema rejects; where that cannot be
// enforced, ToGBNF fails naming the keyword. Everything errs on the strict
// side:
//
//   - oneOf branches are made mutually exclusive: branches that provably
//     share no value (types, const/enum values, a property one requires and
//     the other forbids, a required property with disjoint schemas) stay as
//     they are; a type that two branches accept whole is removed from all;
//     an object branch excludes another by forbidding a property the other
//     requires and it does not ("oneOf": [{"required": ["a"]}, {"required":
//     ["b"]}] is a without b, or b without a; this can refuse an object that
//     has b but fails the other branch otherwise). Any other overlap (two
//     patterns, number ranges, objects told apart by nothing required) is
//     an error naming oneOf.
//   - Properties must appear in schema order (as llguidance does by default);
//     optional properties may be omitted; properties listed in required but not
//     in properties follow the declared ones. Additional properties (allowed
//     unless additionalProperties is false) come after the declared ones, must
//     have names that differ from every declared property and must be written
//     without \u escapes or "\/".
//   - Strings, enum and const values are accepted in json.dumps
//     (ensure_ascii=False) form: enum/const strings and pattern-constrained
//     strings only in their canonical escaping; other strings accept any valid
//     JSON escape.
//   - integer accepts only integer literals (no fraction or exponent, although
//     JSON Schema treats 1.0 as an integer). enum/const numbers must be written
//     as in the schema.
//   - Numbers with bounds are accepted in plain decimal form only (no
//     exponent), except the common "minimum": 0 / "exclusiveMinimum": 0 cases.
//     Number bounds must be integers; otherwise the keyword is reported as
//     unsupported. multipleOf other than 1 is unsupported.
//   - Known formats (date-time, date, time, email, uuid, uri, ipv4, hostname,
//     json-pointer, relative-json-pointer) are enforced with practical,
//     conservative patterns; the other formats of JSON Schema's vocabulary
//     (regex, iri, ipv6, duration, uri-reference, ...) are errors naming
//     format, since validators check them; formats outside the vocabulary
//     are annotations and ignored.
//   - pattern uses ECMAScript syntax: literals, ., classes, \d \w \s (and
//     negations), groups (capturing, (?:...), named), alternation, greedy and
//     lazy quantifiers; ^ and $ only at the start/end of a top-level branch
//     (unanchored branches match anywhere, as JSON Schema requires).
//     Lookaround, backreferences, \b, \p{...} fail with an error.
//   - $ref siblings are merged with the target (draft 2020-12 semantics, also
//     for draft-07 documents).
//   - allOf is merged keyword by keyword (properties, required, bounds, types,
//     enums, nested schemas); a combination that cannot be merged is an error
//     naming allOf. anyOf alongside other keywords is distributed over the
//     branches.
//   - A keyword that combines constraints a context-free grammar cannot
//     intersect cheaply (pattern with minLength, enum with minLength, ...) is
//     reported as unsupported.
package jsonschema

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Options controls the generated grammar.
type Options struct {
	// Whitespace is "flexible" (default when empty), "python" or "compact";
	// see the package documentation.
	Whitespace string
	// MaxWhitespace bounds the whitespace characters per gap in flexible mode;
	// 0 means 8.
	MaxWhitespace int
	// MaxSteps bounds the conversion's work, counted in schema nodes
	// visited (each subschema generated, merged or compared counts one):
	// past it ToGBNF fails with an error wrapping ErrBudget. 0: no bound.
	MaxSteps int
}

// ErrBudget is wrapped by the error of a conversion that ran past
// Options.MaxSteps.
var ErrBudget = errors.New("jsonschema: work budget exceeded")

// Error is returned for schemas that cannot be converted.
type Error struct {
	Keyword string // the offending keyword, when there is one
	Path    string // JSON pointer of the schema location, e.g. "#/properties/x"
	Msg     string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("jsonschema: unsupported keyword %q at %s", e.Keyword, e.Path)
	}
	if e.Keyword == "" {
		return fmt.Sprintf("jsonschema: %s at %s", e.Msg, e.Path)
	}
	return fmt.Sprintf("jsonschema: keyword %q at %s: %s", e.Keyword, e.Path, e.Msg)
}

func unsupported(kw, path string) error { return &Error{Keyword: kw, Path: path} }

func errorf(kw, path, format string, args ...any) error {
	return &Error{Keyword: kw, Path: path, Msg: fmt.Sprintf(format, args...)}
}

// ToGBNF converts a JSON Schema document to a GBNF grammar with root rule
// "root".
func ToGBNF(schema []byte, opts Options) (string, error) {
	return ToGBNFContext(context.Background(), schema, opts)
}

// ToGBNFContext is ToGBNF that stops when ctx ends (checked every few
// hundred schema nodes), failing with an error that wraps ctx.Err(), so a
// pathological schema (deep nesting, combinatorial allOf/anyOf) fails within
// the caller's deadline.
func ToGBNFContext(ctx context.Context, schema []byte, opts Options) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("jsonschema: %w", err)
	}
	doc, err := parseJSON(schema)
	if err != nil {
		return "", fmt.Errorf("jsonschema: invalid schema JSON: %w", err)
	}
	c, err := newConverter(doc, opts)
	if err != nil {
		return "", err
	}
	c.ctx = ctx
	expr, err := c.gen(doc, "#")
	if err != nil {
		return "", err
	}
	if c.ws != "" {
		expr = c.ws + " " + expr + " " + c.ws
	}
	return c.render(expr), nil
}

type converter struct {
	root   any
	opts   Options
	ws     string // whitespace expression ("" when none allowed)
	comma  string
	colon  string
	names  map[string]bool
	rules  []gbnfRule
	byBody map[string]string
	refs   map[string]string // JSON pointer -> rule name
	depth  int
	ctx    context.Context
	steps  int
}

// step counts one unit of work and checks the budget and the context.
func (c *converter) step() error {
	c.steps++
	if c.opts.MaxSteps > 0 && c.steps > c.opts.MaxSteps {
		return fmt.Errorf("%w (%d steps)", ErrBudget, c.opts.MaxSteps)
	}
	if c.steps&255 == 0 && c.ctx != nil {
		if err := c.ctx.Err(); err != nil {
			return fmt.Errorf("jsonschema: %w", err)
		}
	}
	return nil
}

type gbnfRule struct{ name, body string }

func newConverter(doc any, opts Options) (*converter, error) {
	c := &converter{root: doc, opts: opts, names: map[string]bool{"root": true},
		byBody: map[string]string{}, refs: map[string]string{}}
	switch opts.Whitespace {
	case "", "flexible":
		n := opts.MaxWhitespace
		if n <= 0 {
			n = 8
		}
		c.ws = c.define("ws", fmt.Sprintf(`[ \t\n\u000D]{0,%d}`, n))
		c.comma = c.ws + ` "," ` + c.ws
		c.colon = c.ws + ` ":" ` + c.ws
	case "python":
		c.comma = `", "`
		c.colon = `": "`
	case "compact":
		c.comma = `","`
		c.colon = `":"`
	default:
		return nil, fmt.Errorf("jsonschema: unknown Options.Whitespace %q", opts.Whitespace)
	}
	return c, nil
}

func (c *converter) render(rootExpr string) string {
	var b strings.Builder
	b.WriteString("root ::= " + rootExpr + "\n")
	for _, r := range c.rules {
		b.WriteString(r.name + " ::= " + r.body + "\n")
	}
	return b.String()
}

func sanitize(hint string) string {
	var b strings.Builder
	for _, r := range hint {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	s := strings.Trim(b.String(), "-")
	for strings.Contains(s, "--") {
		s = strings.ReplaceAll(s, "--", "-")
	}
	if len(s) > 40 {
		s = s[:40]
	}
	if s == "" {
		s = "r"
	}
	return s
}

// reserve allocates a fresh rule name.
func (c *converter) reserve(hint string) string {
	base := sanitize(hint)
	name := base
	for i := 2; c.names[name]; i++ {
		name = fmt.Sprintf("%s-%d", base, i)
	}
	c.names[name] = true
	return name
}

// setRule gives a reserved name its body.
func (c *converter) setRule(name, body string) {
	c.rules = append(c.rules, gbnfRule{name, body})
}

// define returns a rule with the given body, reusing an identical one.
func (c *converter) define(hint, body string) string {
	if n, ok := c.byBody[body]; ok {
		return n
	}
	n := c.reserve(hint)
	c.setRule(n, body)
	c.byBody[body] = n
	return n
}

// seq joins non-empty expressions.
func seq(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return `""`
	}
	return strings.Join(out, " ")
}

// alt joins alternatives into a group.
func alt(parts ...string) string {
	seen := map[string]bool{}
	var out []string
	for _, p := range parts {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	if len(out) == 1 {
		return out[0]
	}
	return "(" + strings.Join(out, " | ") + ")"
}

// repLimit is the largest count written as one {m,n} (the GBNF parser caps
// counts at 10000); larger counts are decomposed into blocks.
const repLimit = 1000

// rep applies a repetition to expr; max < 0 means unbounded.
func rep(expr string, min, max int) string {
	if min > repLimit || max > repLimit {
		g := group(expr)
		block := g + fmt.Sprintf("{%d}", repLimit)
		// exactly min copies, then up to max-min more
		exact := ""
		if min > 0 {
			exact = seq(rep(block, min/repLimit, min/repLimit), rep(g, min%repLimit, min%repLimit))
		}
		if max < 0 {
			return seq(exact, g+"*")
		}
		n := max - min
		var upTo string
		if n <= repLimit {
			upTo = rep(g, 0, n)
		} else {
			q, r := n/repLimit, n%repLimit
			upTo = "(" + seq(rep(block, 0, q-1), rep(g, 0, repLimit-1)) + " | " + seq(rep(block, q, q), rep(g, 0, r)) + ")"
		}
		return seq(exact, upTo)
	}
	if max == 0 {
		return ""
	}
	if min == 1 && max == 1 {
		return expr
	}
	g := expr
	if !isAtom(expr) {
		g = "(" + expr + ")"
	}
	switch {
	case min == 0 && max < 0:
		return g + "*"
	case min == 1 && max < 0:
		return g + "+"
	case min == 0 && max == 1:
		return g + "?"
	case max < 0:
		return fmt.Sprintf("%s{%d,}", g, min)
	case min == max:
		return fmt.Sprintf("%s{%d}", g, min)
	default:
		return fmt.Sprintf("%s{%d,%d}", g, min, max)
	}
}

// isAtom reports whether expr is a single rule name, literal, class or group.
func isAtom(expr string) bool {
	if expr == "" {
		return false
	}
	if !strings.ContainsAny(expr, " |*+?{") {
		return true
	}
	switch expr[0] {
	case '"', '[', '(':
		return closesAt(expr) == len(expr)-1
	}
	return false
}

// closesAt returns the index where the literal, class or group starting at
// expr[0] ends.
func closesAt(expr string) int {
	switch expr[0] {
	case '"', '[':
		end := expr[0]
		if end == '[' {
			end = ']'
		}
		for i := 1; i < len(expr); i++ {
			if expr[i] == '\\' {
				i++
				continue
			}
			if expr[i] == end {
				return i
			}
		}
	case '(':
		depth := 0
		for i := 0; i < len(expr); i++ {
			switch expr[i] {
			case '\\':
				i++
			case '"', '[':
				i += closesAt(expr[i:])
			case '(':
				depth++
			case ')':
				depth--
				if depth == 0 {
					return i
				}
			}
		}
	}
	return -1
}
