package structured

import (
	"context"
	"fmt"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/grammar"
	"github.com/deepinfer/deepinfer-go/engine/grammar/jsonschema"
)

// anyObject is the schema of response_format json_object: any JSON object.
const anyObject = `{"type": "object"}`

// Source returns the GBNF grammar (start rule root) of a JSON-schema,
// JSON-object or choice constraint, and the regular expression of a regex
// one (exactly one of the two is set). Errors name what was wrong (for a
// schema, the keyword and where it is); a schema's conversion stops when
// ctx ends.
func Source(ctx context.Context, spec *engine.StructuredOutput) (gbnf, regex string, err error) {
	opts := jsonschema.Options{Whitespace: spec.Whitespace}
	switch spec.Kind() {
	case "json_schema":
		gbnf, err = jsonschema.ToGBNFContext(ctx, []byte(spec.JSONSchema), opts)
	case "json_object":
		gbnf, err = jsonschema.ToGBNFContext(ctx, []byte(anyObject), opts)
	case "regex":
		regex = spec.Regex
	case "choice":
		alts := make([]string, len(spec.Choice))
		for i, c := range spec.Choice {
			alts[i] = quoteGBNF(c)
		}
		gbnf = "root ::= " + strings.Join(alts, " | ") + "\n"
	case "grammar":
		gbnf = spec.Grammar
	default:
		err = fmt.Errorf("structured output: no constraint is set")
	}
	return gbnf, regex, err
}

// Build parses and compiles a constraint against v. ctx bounds the work:
// the schema conversion and the compile's vocabulary walks stop when it
// ends (the error then wraps ctx's).
func Build(ctx context.Context, spec *engine.StructuredOutput, v *grammar.Vocab) (engine.Grammar, error) {
	gbnf, regex, err := Source(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Kind(), err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var g *grammar.Grammar
	if spec.Kind() == "regex" {
		g, err = grammar.ParseRegex(regex)
	} else {
		g, err = grammar.ParseGBNF(gbnf)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Kind(), err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := grammar.CompileContext(ctx, g, v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Kind(), err)
	}
	return compiled{c}, nil
}

// compiled adapts a *grammar.Compiled to engine.Grammar.
type compiled struct{ c *grammar.Compiled }

func (c compiled) NewMatcher() engine.GrammarMatcher { return c.c.NewMatcher() }

// quoteGBNF writes s as a GBNF string literal.
func quoteGBNF(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
