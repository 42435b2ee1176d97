package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// piece is one pre-token. first is set on the piece that starts at offset 0
// of the original text (Metaspace's prepend_scheme "first" reads it).
type piece struct {
	s     string
	first bool
}

// preTokenizer splits one piece into smaller ones, appending them to dst.
// Empty pieces are never appended.
type preTokenizer interface {
	split(dst []piece, p piece, sc *scratch) []piece
}

// Split behaviours, as in HF's SplitDelimiterBehavior.
type behavior uint8

const (
	behaviorRemoved behavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

func parseBehavior(s string) (behavior, error) {
	switch s {
	case "Removed":
		return behaviorRemoved, nil
	case "Isolated":
		return behaviorIsolated, nil
	case "MergedWithPrevious":
		return behaviorMergedWithPrevious, nil
	case "MergedWithNext":
		return behaviorMergedWithNext, nil
	case "Contiguous":
		return behaviorContiguous, nil
	}
	return 0, fmt.Errorf("%w: split behavior %q", ErrUnsupported, s)
}

// splitByMatches cuts p at the matches (pairs of byte offsets, sorted,
// non-overlapping) following HF's NormalizedString::split.
func splitByMatches(dst []piece, p piece, matches []int, b behavior, invert bool) []piece {
	s := p.s
	emit := func(start, end int) {
		if start < end {
			dst = append(dst, piece{s: s[start:end], first: p.first && start == 0})
		}
	}
	// spans: every part of s in order, each a match or not.
	type span struct {
		start, end int
		match      bool
	}
	var local [64]span
	spans := local[:0]
	prev := 0
	for i := 0; i < len(matches); i += 2 {
		if prev != matches[i] {
			spans = append(spans, span{prev, matches[i], invert})
		}
		spans = append(spans, span{matches[i], matches[i+1], !invert})
		prev = matches[i+1]
	}
	if prev != len(s) {
		spans = append(spans, span{prev, len(s), invert})
	}
	switch b {
	case behaviorIsolated:
		for _, sp := range spans {
			emit(sp.start, sp.end)
		}
	case behaviorRemoved:
		for _, sp := range spans {
			if !sp.match {
				emit(sp.start, sp.end)
			}
		}
	case behaviorContiguous:
		out := spans[:0:0]
		prevMatch := false
		for _, sp := range spans {
			if sp.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, sp)
			}
			prevMatch = sp.match
		}
		for _, sp := range out {
			emit(sp.start, sp.end)
		}
	case behaviorMergedWithPrevious:
		out := spans[:0:0]
		prevMatch := false
		for _, sp := range spans {
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, sp)
			}
			prevMatch = sp.match
		}
		for _, sp := range out {
			emit(sp.start, sp.end)
		}
	case behaviorMergedWithNext:
		// Fold from the right: a match joins the part after it.
		out := spans[:0:0]
		prevMatch := false
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = sp.start
			} else {
				out = append(out, sp)
			}
			prevMatch = sp.match
		}
		for i := len(out) - 1; i >= 0; i-- {
			emit(out[i].start, out[i].end)
		}
	}
	return dst
}

// splitPreTokenizer is HF's Split: a pattern, a behaviour and invert.
type splitPreTokenizer struct {
	m        matcher
	behavior behavior
	invert   bool
}

func (t *splitPreTokenizer) split(dst []piece, p piece, sc *scratch) []piece {
	sc.ranges = t.m.findAll(sc.ranges[:0], p.s)
	if t.behavior == behaviorIsolated && !t.invert {
		// Fast path for the byte-level patterns, whose matches cover the text.
		prev := 0
		for i := 0; i < len(sc.ranges); i += 2 {
			a, b := sc.ranges[i], sc.ranges[i+1]
			if prev < a {
				dst = append(dst, piece{s: p.s[prev:a], first: p.first && prev == 0})
			}
			if a < b {
				dst = append(dst, piece{s: p.s[a:b], first: p.first && a == 0})
			}
			prev = b
		}
		if prev < len(p.s) {
			dst = append(dst, piece{s: p.s[prev:], first: p.first && prev == 0})
		}
		return dst
	}
	return splitByMatches(dst, p, sc.ranges, t.behavior, t.invert)
}

// literalMatcher finds non-overlapping occurrences of a literal string.
type literalMatcher struct{ lit string }

func (m literalMatcher) findAll(dst []int, s string) []int {
	if m.lit == "" {
		return dst
	}
	for i := 0; ; {
		k := strings.Index(s[i:], m.lit)
		if k < 0 {
			return dst
		}
		dst = append(dst, i+k, i+k+len(m.lit))
		i += k + len(m.lit)
	}
}

// runeMatcher matches single runes (or runs of them) satisfying a predicate.
type runeMatcher struct {
	pred func(rune) bool
	runs bool
}

func (m runeMatcher) findAll(dst []int, s string) []int {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !m.pred(r) {
			i += n
			continue
		}
		j := i + n
		for m.runs && j < len(s) {
			r2, n2 := utf8.DecodeRuneInString(s[j:])
			if !m.pred(r2) {
				break
			}
			j += n2
		}
		dst = append(dst, i, j)
		i = j
	}
	return dst
}

// byteLevelPreTokenizer is HF's ByteLevel pre-tokenizer. The byte-to-rune
// mapping itself is done by the model (see bpe.setByteLevel), so this only
// adds the prefix space and applies the GPT-2 split when use_regex is set.
type byteLevelPreTokenizer struct {
	addPrefixSpace bool
	re             *splitPreTokenizer // nil unless use_regex
}

func (t *byteLevelPreTokenizer) split(dst []piece, p piece, sc *scratch) []piece {
	if t.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
	}
	if t.re == nil {
		if p.s != "" {
			dst = append(dst, p)
		}
		return dst
	}
	return t.re.split(dst, p, sc)
}

// Metaspace prepend schemes.
const (
	prependAlways = "always"
	prependFirst  = "first"
	prependNever  = "never"
)

// metaspacePreTokenizer is HF's Metaspace pre-tokenizer.
type metaspacePreTokenizer struct {
	replacement string
	scheme      string
	splitWords  bool
}

func (t *metaspacePreTokenizer) split(dst []piece, p piece, sc *scratch) []piece {
	s := t.prepare(p)
	q := piece{s: s, first: p.first}
	if !t.splitWords {
		if s != "" {
			dst = append(dst, q)
		}
		return dst
	}
	sc.ranges = literalMatcher{t.replacement}.findAll(sc.ranges[:0], s)
	return splitByMatches(dst, q, sc.ranges, behaviorMergedWithNext, false)
}

// prepare returns p's text with spaces replaced and the replacement prepended
// as the scheme says: what split then cuts before each replacement.
func (t *metaspacePreTokenizer) prepare(p piece) string {
	s := strings.ReplaceAll(p.s, " ", t.replacement)
	if !strings.HasPrefix(s, t.replacement) {
		if t.scheme == prependAlways || (t.scheme == prependFirst && p.first) {
			s = t.replacement + s
		}
	}
	return s
}

// metaspaceSteps finds split's pieces one at a time: each replacement starts
// a piece that runs to the next one (behaviour MergedWithNext).
type metaspaceSteps struct{ replacement string }

func (m metaspaceSteps) nextEnd(s string, i int) int {
	from := i
	if strings.HasPrefix(s[i:], m.replacement) {
		from += len(m.replacement)
	}
	if k := strings.Index(s[from:], m.replacement); k >= 0 {
		return from + k
	}
	return len(s)
}

// preTokenizeAll runs the pre-tokenizer stages over p and returns the final
// pieces, which live in sc.pieces until the next call.
func preTokenizeAll(stages []preTokenizer, p piece, sc *scratch) []piece {
	cur := append(sc.pieces[:0], p)
	next := sc.next[:0]
	for _, t := range stages {
		next = next[:0]
		for _, c := range cur {
			next = t.split(next, c, sc)
		}
		cur, next = next, cur
	}
	sc.pieces, sc.next = cur, next
	if len(stages) == 0 && p.s == "" {
		return cur[:0]
	}
	return cur
}

// buildPreTokenizer turns the pre_tokenizer object into a list of stages
// (Sequence flattened) and reports whether it ends with ByteLevel (the model
// then works on raw bytes).
func buildPreTokenizer(c componentSpec) ([]preTokenizer, bool, error) {
	if c.Type != "Sequence" {
		t, bl, err := buildOnePreTokenizer(c)
		if err != nil {
			return nil, false, err
		}
		return []preTokenizer{t}, bl, nil
	}
	var q []preTokenizer
	byteLevel := false
	for i, raw := range c.PreTokenizers {
		sub, ok, err := parseComponent(raw)
		if err != nil {
			return nil, false, fmt.Errorf("Sequence[%d]: %w", i, err)
		}
		if !ok {
			continue
		}
		if byteLevel {
			return nil, false, fmt.Errorf("%w: pre-tokenizer %q after ByteLevel", ErrUnsupported, sub.Type)
		}
		ts, bl, err := buildPreTokenizer(sub)
		if err != nil {
			return nil, false, fmt.Errorf("Sequence[%d]: %w", i, err)
		}
		byteLevel = bl
		q = append(q, ts...)
	}
	return q, byteLevel, nil
}

func buildOnePreTokenizer(c componentSpec) (preTokenizer, bool, error) {
	switch c.Type {
	case "Split":
		if c.Pattern == nil {
			return nil, false, fmt.Errorf("Split: missing pattern")
		}
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, false, err
		}
		var m matcher
		switch {
		case c.Pattern.Regex != nil:
			m, err = newMatcher(*c.Pattern.Regex)
			if err != nil {
				return nil, false, fmt.Errorf("Split: %w", err)
			}
		case c.Pattern.String != nil:
			m = literalMatcher{*c.Pattern.String}
		default:
			return nil, false, fmt.Errorf("Split: pattern has neither String nor Regex")
		}
		return &splitPreTokenizer{m: m, behavior: b, invert: c.Invert}, false, nil
	case "ByteLevel":
		t := &byteLevelPreTokenizer{addPrefixSpace: c.AddPrefixSpace != nil && *c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			t.re = &splitPreTokenizer{m: gpt2Matcher{}, behavior: behaviorIsolated}
		}
		return t, true, nil
	case "Metaspace":
		t := &metaspacePreTokenizer{replacement: c.Replacement, scheme: c.PrependScheme, splitWords: c.Split == nil || *c.Split}
		if t.replacement == "" {
			t.replacement = "▁"
		}
		if t.scheme == "" {
			t.scheme = prependAlways
			if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
				t.scheme = prependNever
			}
		}
		if t.scheme != prependAlways && t.scheme != prependFirst && t.scheme != prependNever {
			return nil, false, fmt.Errorf("%w: Metaspace prepend_scheme %q", ErrUnsupported, t.scheme)
		}
		return t, false, nil
	case "Digits":
		m := runeMatcher{pred: unicode.IsNumber, runs: !c.IndividualDigits}
		return &splitPreTokenizer{m: m, behavior: behaviorIsolated}, false, nil
	case "WhitespaceSplit":
		m := runeMatcher{pred: unicode.IsSpace, runs: true}
		return &splitPreTokenizer{m: m, behavior: behaviorRemoved}, false, nil
	}
	return nil, false, fmt.Errorf("%w: pre-tokenizer %q", ErrUnsupported, c.Type)
}
