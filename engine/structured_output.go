package engine

import (
	"fmt"
	"strings"
)

// StructuredOutput constrains a request's output to a formal language:
// exactly one of JSONSchema, JSONObject, Regex, Choice or Grammar is set
// (vLLM's structured-output fields; OpenAI's response_format maps to
// JSONSchema or JSONObject). The constraint is compiled off the scheduling
// path: the request waits in StatusWaitingForGrammar until its matcher is
// ready, and a constraint that does not compile fails that request alone.
type StructuredOutput struct {
	// JSONSchema is a JSON Schema document (draft 2020-12 or draft-07
	// keywords); the output is one JSON instance of it.
	JSONSchema string
	// JSONObject asks for any JSON object (response_format json_object).
	JSONObject bool
	// Regex is a regular expression the whole output must match.
	Regex string
	// Choice lists the exact strings the output may be (one of them).
	Choice []string
	// Grammar is a grammar in llama.cpp's GBNF, start rule "root".
	Grammar string
	// Whitespace is the JSON whitespace the schema forms allow between
	// tokens: "" or "flexible" (any JSON whitespace, bounded), "compact"
	// (none) or "python" (json.dumps' ", " and ": "). Ignored by Regex,
	// Choice and Grammar.
	Whitespace string
}

// Kind names the constraint that is set ("json_schema", "json_object",
// "regex", "choice", "grammar"), or "" when none is.
func (s *StructuredOutput) Kind() string {
	switch {
	case s == nil:
		return ""
	case s.JSONSchema != "":
		return "json_schema"
	case s.JSONObject:
		return "json_object"
	case s.Regex != "":
		return "regex"
	case len(s.Choice) > 0:
		return "choice"
	case s.Grammar != "":
		return "grammar"
	}
	return ""
}

// Validate checks that exactly one constraint is set and the whitespace
// mode is known; errors wrap ErrInvalidRequest and name the fields. The
// constraint itself is checked when it compiles.
func (s *StructuredOutput) Validate() error {
	if s == nil {
		return nil
	}
	var set []string
	if s.JSONSchema != "" {
		set = append(set, "json_schema")
	}
	if s.JSONObject {
		set = append(set, "json_object")
	}
	if s.Regex != "" {
		set = append(set, "regex")
	}
	if len(s.Choice) > 0 {
		set = append(set, "choice")
	}
	if s.Grammar != "" {
		set = append(set, "grammar")
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: structured output: "+format, append([]any{ErrInvalidRequest}, args...)...)
	}
	switch len(set) {
	case 0:
		return bad("set one of json_schema, json_object, regex, choice or grammar")
	case 1:
	default:
		return bad("set only one of %s", strings.Join(set, ", "))
	}
	for i, c := range s.Choice {
		if c == "" {
			return bad("choice[%d] is empty", i)
		}
	}
	switch s.Whitespace {
	case "", "flexible", "compact", "python":
	default:
		return bad("whitespace must be flexible, compact or python, got %q", s.Whitespace)
	}
	return nil
}

// clone returns a deep copy.
func (s *StructuredOutput) clone() *StructuredOutput {
	if s == nil {
		return nil
	}
	c := *s
	c.Choice = append([]string(nil), s.Choice...)
	return &c
}

// Grammar is a compiled structured-output constraint, shared by the
// sequences of every request that asks for it: each sequence gets its own
// GrammarMatcher. Safe for concurrent use.
type Grammar interface {
	NewMatcher() GrammarMatcher
}

// GrammarMatcher is one sequence's position in its Grammar (one
// implementation: engine/grammar's Matcher). The sample stage reads
// ComputeMask before each step of the sequence; post-processing Commits
// the tokens the step emitted. Not safe for concurrent use: the step loop
// orders those calls (sample N+1 runs after post-process N).
type GrammarMatcher interface {
	// ComputeMask sets bit t of mask (mask[t/32] >> (t%32) & 1) for every
	// token t that may come next (EOS ids where the text so far is
	// complete) and clears the others.
	ComputeMask(mask []uint32)
	// Commit advances by one token; an illegal token is an error and
	// changes nothing.
	Commit(token int) error
	// Rollback undoes the last n committed tokens.
	Rollback(n int) error
	// IsAccepting reports whether the text so far is a complete match.
	IsAccepting() bool
	// IsTerminated reports whether an EOS token was committed.
	IsTerminated() bool
}
