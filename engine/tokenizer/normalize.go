package tokenizer

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites text before pre-tokenization. Offsets are not tracked:
// this package returns ids, not alignments.
type normalizer interface {
	normalize(s string) string
}

type unicodeNormalizer struct{ form norm.Form }

func (n unicodeNormalizer) normalize(s string) string {
	if n.form.IsNormalString(s) {
		return s
	}
	return n.form.String(s)
}

type lowercaseNormalizer struct{}

func (lowercaseNormalizer) normalize(s string) string { return strings.ToLower(s) }

type prependNormalizer struct{ prepend string }

func (n prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prepend + s
}

type stripNormalizer struct{ left, right bool }

func (n stripNormalizer) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// replacer replaces every non-overlapping occurrence of a literal or a regex;
// it serves the Replace normalizer and the Replace decoder.
type replacer struct {
	literal string
	re      *regexp2.Regexp
	content string
}

func newReplacer(p *patternSpec, content string) (*replacer, error) {
	switch {
	case p == nil:
		return nil, fmt.Errorf("Replace: missing pattern")
	case p.String != nil:
		return &replacer{literal: *p.String, content: content}, nil
	case p.Regex != nil:
		re, err := regexp2.Compile(*p.Regex, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("Replace: regex %q: %w", *p.Regex, err)
		}
		return &replacer{re: re, content: content}, nil
	}
	return nil, fmt.Errorf("Replace: pattern has neither String nor Regex")
}

func (r *replacer) replace(s string) string {
	if r.re == nil {
		if r.literal == "" {
			return s
		}
		return strings.ReplaceAll(s, r.literal, r.content)
	}
	var sb strings.Builder
	prev := 0
	m := (&regexpMatcher{re: r.re}).findAll(nil, s)
	for i := 0; i < len(m); i += 2 {
		if m[i] == m[i+1] {
			continue
		}
		sb.WriteString(s[prev:m[i]])
		sb.WriteString(r.content)
		prev = m[i+1]
	}
	if prev == 0 {
		return s
	}
	sb.WriteString(s[prev:])
	return sb.String()
}

func (r *replacer) normalize(s string) string { return r.replace(s) }

type sequenceNormalizer []normalizer

func (q sequenceNormalizer) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

func buildNormalizer(c componentSpec) (normalizer, error) {
	switch c.Type {
	case "NFC":
		return unicodeNormalizer{norm.NFC}, nil
	case "NFD":
		return unicodeNormalizer{norm.NFD}, nil
	case "NFKC":
		return unicodeNormalizer{norm.NFKC}, nil
	case "NFKD":
		return unicodeNormalizer{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "Prepend":
		return prependNormalizer{prepend: c.Prepend}, nil
	case "Strip":
		return stripNormalizer{left: c.StripLeft == nil || *c.StripLeft, right: c.StripRight == nil || *c.StripRight}, nil
	case "Replace":
		return newReplacer(c.Pattern, c.Content)
	case "Sequence":
		var q sequenceNormalizer
		for i, raw := range c.Normalizers {
			sub, ok, err := parseComponent(raw)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if !ok {
				continue
			}
			n, err := buildNormalizer(sub)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			q = append(q, n)
		}
		return q, nil
	}
	return nil, fmt.Errorf("%w: normalizer %q", ErrUnsupported, c.Type)
}
