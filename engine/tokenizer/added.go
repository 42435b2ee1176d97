package tokenizer

import (
	"slices"
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
// rstrip rules. The patterns form a byte trie, so finding the longest one at a
// position costs one step per byte matched, however many patterns share a
// prefix (Llama 3 has 250 "<|reserved_special_token_N|>"). Cost: one table
// lookup per byte of text plus a trie walk at bytes that can start a pattern.
type addedMatcher struct {
	root  [256]int32 // node after the first byte; -1 when no pattern starts with it
	nodes []trieNode
	pats  []string
	toks  []*addedToken
}

// trieNode is a node of addedMatcher's trie: the pattern ending at it (an
// index into pats, -1 for none) and its out-edges, sorted by byte.
type trieNode struct {
	pat   int32
	edges []trieEdge
}

type trieEdge struct {
	b    byte
	next int32
}

func newAddedMatcher(toks []*addedToken, patterns []string) *addedMatcher {
	m := &addedMatcher{pats: patterns, toks: toks}
	for b := range m.root {
		m.root[b] = -1
	}
	for i, p := range patterns {
		if p == "" {
			continue
		}
		n := m.root[p[0]]
		if n < 0 {
			n = m.newNode()
			m.root[p[0]] = n
		}
		for k := 1; k < len(p); k++ {
			n = m.child(n, p[k])
		}
		if m.nodes[n].pat < 0 { // the first of equal patterns wins
			m.nodes[n].pat = int32(i)
		}
	}
	return m
}

func (m *addedMatcher) newNode() int32 {
	m.nodes = append(m.nodes, trieNode{pat: -1})
	return int32(len(m.nodes) - 1)
}

// child returns the node after byte b from node n, adding it if missing.
func (m *addedMatcher) child(n int32, b byte) int32 {
	edges := m.nodes[n].edges
	k := sort.Search(len(edges), func(i int) bool { return edges[i].b >= b })
	if k < len(edges) && edges[k].b == b {
		return edges[k].next
	}
	c := m.newNode()
	edges = slices.Insert(m.nodes[n].edges, k, trieEdge{b, c})
	m.nodes[n].edges = edges
	return c
}

// longest returns the index of the longest pattern that s[i:] starts with,
// -1 if none.
func (m *addedMatcher) longest(s string, i int) int {
	n := m.root[s[i]]
	if n < 0 {
		return -1
	}
	best := -1
	for j := i + 1; ; j++ {
		node := &m.nodes[n]
		if node.pat >= 0 {
			best = int(node.pat)
		}
		if j == len(s) || len(node.edges) == 0 {
			return best
		}
		c := s[j]
		n = -1
		for _, e := range node.edges {
			if e.b >= c {
				if e.b == c {
					n = e.next
				}
				break
			}
		}
		if n < 0 {
			return best
		}
	}
}

// segment is a part of the text: an added token (id >= 0) or plain text.
type segment struct {
	start, end int
	id         int32
}

// split appends the segments of s (covering it in order) to dst. With
// skipSpecial a match of a special token is dropped (its text stays plain
// text), as HF's encode_special_tokens does: the scan still resumes after it.
// With maxIDs >= 0 it stops after maxIDs+1 token segments, leaving the rest
// of s uncovered: a caller with a budget of maxIDs ids is over it by then.
func (m *addedMatcher) split(dst []segment, s string, skipSpecial bool, maxIDs int) []segment {
	startOffset := 0
	numIDs := 0
	for i := 0; i < len(s); {
		if m.root[s[i]] < 0 {
			i++
			continue
		}
		hit := m.longest(s, i)
		if hit < 0 {
			i++
			continue
		}
		start, stop := i, i+len(m.pats[hit])
		i = stop // the automaton resumes after the match, used or not
		tok := m.toks[hit]
		if skipSpecial && tok.special {
			continue
		}
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
		if numIDs++; maxIDs >= 0 && numIDs > maxIDs {
			return dst
		}
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
