package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// The split patterns of the byte-level tokenizers this package has
// hand-written matchers for. Any other pattern runs on regexp2.
const (
	patternGPT2   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// matcher finds the non-overlapping matches of a pattern, leftmost first, as
// the regex engine behind Hugging Face tokenizers (Oniguruma) would.
type matcher interface {
	// findAll appends the [start, end) byte offsets of every match in s to dst
	// as consecutive pairs and returns the extended slice.
	findAll(dst []int, s string) []int
}

// newMatcher returns the fastest exact matcher for a regex pattern: a
// hand-written one for the GPT-2, Llama 3 and Qwen2 patterns, regexp2
// otherwise.
func newMatcher(pattern string) (matcher, error) {
	switch pattern {
	case patternGPT2:
		return gpt2Matcher{}, nil
	case patternLlama3:
		return llama3Matcher{maxDigits: 3}, nil
	case patternQwen2:
		return llama3Matcher{maxDigits: 1}, nil
	}
	return newRegexpMatcher(pattern)
}

// regexpMatcher runs a pattern on regexp2, which has the lookarounds that Go's
// regexp lacks. It is the test oracle of the hand-written matchers.
type regexpMatcher struct {
	re *regexp2.Regexp
}

func newRegexpMatcher(pattern string) (*regexpMatcher, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", pattern, err)
	}
	return &regexpMatcher{re: re}, nil
}

func (m *regexpMatcher) findAll(dst []int, s string) []int {
	if s == "" {
		return dst
	}
	// regexp2 works on runes; map rune indices back to byte offsets. Invalid
	// UTF-8 bytes become one U+FFFD rune each, as in a []rune conversion.
	runes := make([]rune, 0, len(s))
	offsets := make([]int, 0, len(s)+1)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		runes = append(runes, r)
		offsets = append(offsets, i)
		i += n
	}
	offsets = append(offsets, len(s))
	match, err := m.re.FindRunesMatch(runes)
	for err == nil && match != nil {
		dst = append(dst, offsets[match.Index], offsets[match.Index+match.Length])
		match, err = m.re.FindNextMatch(match)
	}
	return dst
}

// Rune classes of the split patterns.
const (
	classOther   uint8 = iota // [^\s\p{L}\p{N}]
	classLetter               // \p{L}
	classNumber               // \p{N}
	classSpace                // \s other than \r and \n
	classNewline              // \r or \n
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := 0; c < utf8.RuneSelf; c++ {
		r := rune(c)
		switch {
		case r == '\r' || r == '\n':
			t[c] = classNewline
		case unicode.IsSpace(r):
			t[c] = classSpace
		case unicode.IsLetter(r):
			t[c] = classLetter
		case unicode.IsNumber(r):
			t[c] = classNumber
		default:
			t[c] = classOther
		}
	}
	return t
}()

// classAt returns the class of the rune at s[i] and its byte length. An
// invalid byte counts as one rune of class other (it decodes as U+FFFD).
func classAt(s string, i int) (uint8, int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r):
		return classLetter, n
	case unicode.IsNumber(r):
		return classNumber, n
	case unicode.IsSpace(r):
		return classSpace, n
	}
	return classOther, n
}

// runEnd returns the end of the run of runes of class want starting at i.
func runEnd(s string, i int, want uint8) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c != want {
			break
		}
		i += n
	}
	return i
}

// spaceRunEnd returns the end of the run of whitespace (including newlines)
// starting at i.
func spaceRunEnd(s string, i int) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c != classSpace && c != classNewline {
			break
		}
		i += n
	}
	return i
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d at s[i] == '\” and returns the
// match end, or -1. With fold set it matches case-insensitively, with the
// Unicode simple case folding Oniguruma applies (ſ U+017F folds to s).
func contraction(s string, i int, fold bool) int {
	j := i + 1
	if j >= len(s) {
		return -1
	}
	lower := func(k int) (byte, int) {
		if k >= len(s) {
			return 0, 0
		}
		c := s[k]
		if c < utf8.RuneSelf {
			if fold && c >= 'A' && c <= 'Z' {
				c += 'a' - 'A'
			}
			return c, 1
		}
		if fold {
			r, n := utf8.DecodeRuneInString(s[k:])
			if r == 'ſ' {
				return 's', n
			}
		}
		return 0, 0
	}
	c1, n1 := lower(j)
	switch c1 {
	case 's', 't', 'm', 'd':
		return j + n1
	case 'r', 'v', 'l':
		want := byte('e')
		if c1 == 'l' {
			want = 'l'
		}
		if c2, n2 := lower(j + n1); c2 == want {
			return j + n1 + n2
		}
	}
	return -1
}

// gpt2Matcher is patternGPT2 by hand.
type gpt2Matcher struct{}

func (gpt2Matcher) findAll(dst []int, s string) []int {
	for i := 0; i < len(s); {
		j := gpt2Next(s, i)
		dst = append(dst, i, j)
		i = j
	}
	return dst
}

// nextEnd returns the end of the match that starts at s[i] (i < len(s)); the
// matches tile s, so the next one starts there.
func (gpt2Matcher) nextEnd(s string, i int) int { return gpt2Next(s, i) }

func gpt2Next(s string, i int) int {
	if s[i] == '\'' {
		if e := contraction(s, i, false); e > 0 {
			return e
		}
	}
	c0, n0 := classAt(s, i)
	if s[i] == ' ' && i+1 < len(s) {
		if c1, n1 := classAt(s, i+1); c1 == classLetter || c1 == classNumber || c1 == classOther {
			return runEnd(s, i+1+n1, c1)
		}
	}
	if c0 == classLetter || c0 == classNumber || c0 == classOther {
		return runEnd(s, i+n0, c0)
	}
	// \s+(?!\S)|\s+
	j := spaceRunEnd(s, i)
	if j == len(s) {
		return j
	}
	_, last := utf8.DecodeLastRuneInString(s[i:j])
	if j-last > i {
		return j - last
	}
	return j
}

// llama3Matcher is patternLlama3 (maxDigits 3) and patternQwen2 (maxDigits 1)
// by hand.
type llama3Matcher struct {
	maxDigits int
}

func (m llama3Matcher) findAll(dst []int, s string) []int {
	for i := 0; i < len(s); {
		j := m.next(s, i)
		dst = append(dst, i, j)
		i = j
	}
	return dst
}

// nextEnd returns the end of the match that starts at s[i] (i < len(s)); the
// matches tile s, so the next one starts there.
func (m llama3Matcher) nextEnd(s string, i int) int { return m.next(s, i) }

func (m llama3Matcher) next(s string, i int) int {
	if s[i] == '\'' {
		if e := contraction(s, i, true); e > 0 {
			return e
		}
	}
	c0, n0 := classAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c0 == classLetter {
		return runEnd(s, i+n0, classLetter)
	}
	if (c0 == classSpace || c0 == classOther) && i+n0 < len(s) {
		if c1, n1 := classAt(s, i+n0); c1 == classLetter {
			return runEnd(s, i+n0+n1, classLetter)
		}
	}
	// \p{N}{1,maxDigits}
	if c0 == classNumber {
		j := i + n0
		for k := 1; k < m.maxDigits && j < len(s); k++ {
			c, n := classAt(s, j)
			if c != classNumber {
				break
			}
			j += n
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	start := -1
	if c0 == classOther {
		start = i + n0
	} else if s[i] == ' ' && i+1 < len(s) {
		if c1, n1 := classAt(s, i+1); c1 == classOther {
			start = i + 1 + n1
		}
	}
	if start >= 0 {
		j := runEnd(s, start, classOther)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// Whitespace from here on. \s*[\r\n]+ ends at the run's last newline.
	j := spaceRunEnd(s, i)
	for k := j - 1; k >= i; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k + 1
		}
	}
	// \s+(?!\S)|\s+
	if j == len(s) {
		return j
	}
	_, last := utf8.DecodeLastRuneInString(s[i:j])
	if j-last > i {
		return j - last
	}
	return j
}
