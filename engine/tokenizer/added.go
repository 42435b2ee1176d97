package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	id         int32
	content    string
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
	special    bool
}

// addedMatcher finds added tokens in text with leftmost-longest semantics (as
// HF's Aho-Corasick automaton does) and applies their single_word, lstrip and
// rstrip rules. Cost: one table lookup per byte of text plus a comparison per
// candidate token at bytes that can start one.
type addedMatcher struct {
	byFirst [256][]int // indices into pats, longest first
	pats    []string
	toks    []*addedToken
}

func newAddedMatcher(toks []*addedToken, patterns []string) *addedMatcher {
	m := &addedMatcher{pats: patterns, toks: toks}
	for i, p := range patterns {
		if p == "" {
			continue
		}
		m.byFirst[p[0]] = append(m.byFirst[p[0]], i)
	}
	for b := range m.byFirst {
		l := m.byFirst[b]
		sort.SliceStable(l, func(i, j int) bool { return len(m.pats[l[i]]) > len(m.pats[l[j]]) })
	}
	return m
}

// segment is a part of the text: an added token (id >= 0) or plain text.
type segment struct {
	start, end int
	id         int32
}

// split appends the segments of s (covering it in order) to dst.
func (m *addedMatcher) split(dst []segment, s string) []segment {
	startOffset := 0
	for i := 0; i < len(s); {
		cands := m.byFirst[s[i]]
		hit := -1
		for _, k := range cands {
			if strings.HasPrefix(s[i:], m.pats[k]) {
				hit = k
				break
			}
		}
		if hit < 0 {
			i++
			continue
		}
		start, stop := i, i+len(m.pats[hit])
		i = stop // the automaton resumes after the match, used or not
		tok := m.toks[hit]
		if tok.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), startOffset)
		}
		if tok.rstrip {
			stop += len(s[stop:]) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if startOffset < start {
			dst = append(dst, segment{startOffset, start, -1})
		}
		dst = append(dst, segment{start, stop, tok.id})
		startOffset = stop
		if i < stop {
			i = stop
		}
	}
	if startOffset < len(s) {
		dst = append(dst, segment{startOffset, len(s), -1})
	}
	return dst
}

// isWordRune is Rust regex's Unicode \w: alphabetic, marks, decimal digits,
// connector punctuation and the joiners.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}
