package grammar

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// ParseGBNF compiles a grammar in llama.cpp's GBNF syntax: rules
// `name ::= ...` (names of letters, digits, '-' and '_'; the start rule is
// "root"), string literals "..." and character classes [a-z], [^...], with the
// escapes \n \r \t \\ \" \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH (each naming a
// code point, matched as UTF-8), '.' (any code point), grouping ( ),
// alternation |, repetition * + ? {m} {m,} {m,n}, and # comments to the end
// of a line. A rule's body may span lines; it ends where the next
// `name ::=` begins (a superset of llama.cpp's newline rules).
//
// Errors name the line and column and what is wrong: a bad escape, an
// unterminated literal or class, an undefined or twice-defined rule, a
// missing root, left recursion, or a rule that matches nothing.
//
// Repetitions expand to right-recursive helper rules (x* is R ::= x R | ε),
// which the matcher runs as tail calls; {m,n} makes m + (n-m) copies of a
// reference to x, so counts are capped at 10000. Cost: linear in the size of
// the source and of the expansion.
func ParseGBNF(src string) (*Grammar, error) {
	p := &gbnfParser{src: src}
	defs := make(map[string]*node)
	var order []string
	for {
		p.space()
		if p.pos >= len(p.src) {
			break
		}
		start := p.pos
		name := p.name()
		if name == "" {
			return nil, p.errf(p.pos, "expected a rule name, found %s", p.peekDesc())
		}
		p.space()
		if !strings.HasPrefix(p.src[p.pos:], "::=") {
			return nil, p.errf(p.pos, "expected ::= after rule name %q, found %s", name, p.peekDesc())
		}
		p.pos += 3
		body, err := p.alts(false)
		if err != nil {
			return nil, err
		}
		if p.pos < len(p.src) && p.src[p.pos] == ')' {
			return nil, p.errf(p.pos, "unbalanced ')'")
		}
		if _, dup := defs[name]; dup {
			return nil, p.errf(start, "rule %q defined twice", name)
		}
		defs[name] = body
		order = append(order, name)
	}
	return newBuilder(defs, order).build("root")
}

type gbnfParser struct {
	src string
	pos int
}

func (p *gbnfParser) errf(pos int, format string, args ...any) error {
	line, col := 1, 1
	for i := 0; i < pos && i < len(p.src); i++ {
		if p.src[i] == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return fmt.Errorf("grammar: %d:%d: %s", line, col, fmt.Sprintf(format, args...))
}

func (p *gbnfParser) peekDesc() string {
	if p.pos >= len(p.src) {
		return "end of input"
	}
	r, _ := utf8.DecodeRuneInString(p.src[p.pos:])
	return fmt.Sprintf("%q", r)
}

// space skips blanks, newlines and comments.
func (p *gbnfParser) space() {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; c {
		case ' ', '\t', '\r', '\n':
			p.pos++
		case '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

func isNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func (p *gbnfParser) name() string {
	s := p.pos
	for p.pos < len(p.src) && isNameChar(p.src[p.pos]) {
		p.pos++
	}
	return p.src[s:p.pos]
}

// atRuleStart reports whether `name ::=` follows.
func (p *gbnfParser) atRuleStart() bool {
	save := p.pos
	defer func() { p.pos = save }()
	if p.name() == "" {
		return false
	}
	p.space()
	return strings.HasPrefix(p.src[p.pos:], "::=")
}

func (p *gbnfParser) alts(nested bool) (*node, error) {
	var kids []*node
	for {
		s, err := p.seq(nested)
		if err != nil {
			return nil, err
		}
		kids = append(kids, s)
		p.space()
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			continue
		}
		break
	}
	if len(kids) == 1 {
		return kids[0], nil
	}
	return &node{kind: nAlt, kids: kids}, nil
}

func (p *gbnfParser) seq(nested bool) (*node, error) {
	n := &node{kind: nSeq}
	for {
		p.space()
		if p.pos >= len(p.src) {
			if nested {
				return nil, p.errf(p.pos, "missing ')'")
			}
			break
		}
		c := p.src[p.pos]
		if c == '|' || c == ')' {
			break
		}
		if isNameChar(c) && p.atRuleStart() {
			if nested {
				return nil, p.errf(p.pos, "missing ')' before the next rule")
			}
			break
		}
		el, err := p.element()
		if err != nil {
			return nil, err
		}
		if el, err = p.postfix(el); err != nil {
			return nil, err
		}
		n.kids = append(n.kids, el)
	}
	if len(n.kids) == 1 {
		return n.kids[0], nil
	}
	return n, nil
}

func (p *gbnfParser) element() (*node, error) {
	start := p.pos
	switch c := p.src[p.pos]; {
	case c == '"':
		p.pos++
		var lit []byte
		for {
			if p.pos >= len(p.src) || p.src[p.pos] == '\n' {
				return nil, p.errf(start, "unterminated string literal")
			}
			if p.src[p.pos] == '"' {
				p.pos++
				break
			}
			r, err := p.char()
			if err != nil {
				return nil, err
			}
			lit = utf8.AppendRune(lit, r)
		}
		return &node{kind: nLit, lit: lit}, nil
	case c == '[':
		p.pos++
		neg := false
		if p.pos < len(p.src) && p.src[p.pos] == '^' {
			neg = true
			p.pos++
		}
		var rs []rune
		for {
			if p.pos >= len(p.src) || p.src[p.pos] == '\n' {
				return nil, p.errf(start, "unterminated character class")
			}
			if p.src[p.pos] == ']' {
				p.pos++
				break
			}
			lo, err := p.char()
			if err != nil {
				return nil, err
			}
			hi := lo
			if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
				p.pos++
				at := p.pos
				if hi, err = p.char(); err != nil {
					return nil, err
				}
				if hi < lo {
					return nil, p.errf(at, "bad range %q-%q in character class", lo, hi)
				}
			}
			rs = append(rs, lo, hi)
		}
		rs = normRanges(rs)
		if neg {
			rs = negateRanges(rs)
		}
		return &node{kind: nClass, ranges: rs}, nil
	case c == '(':
		p.pos++
		n, err := p.alts(true)
		if err != nil {
			return nil, err
		}
		p.space()
		if p.pos >= len(p.src) || p.src[p.pos] != ')' {
			return nil, p.errf(start, "missing ')' for this '('")
		}
		p.pos++
		return n, nil
	case c == '.':
		p.pos++
		return &node{kind: nClass, ranges: normRanges([]rune{0, utf8.MaxRune})}, nil
	case isNameChar(c):
		line, col := p.lineCol(start)
		return &node{kind: nRef, name: p.name(), line: line, col: col}, nil
	}
	return nil, p.errf(start, "unexpected %s", p.peekDesc())
}

func (p *gbnfParser) lineCol(pos int) (int, int) {
	line, col := 1, 1
	for i := 0; i < pos; i++ {
		if p.src[i] == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return line, col
}

// char reads one code point, decoding an escape.
func (p *gbnfParser) char() (rune, error) {
	start := p.pos
	if p.src[p.pos] != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		if r == utf8.RuneError && n <= 1 {
			return 0, p.errf(start, "invalid UTF-8 in grammar source")
		}
		p.pos += n
		return r, nil
	}
	p.pos++
	if p.pos >= len(p.src) {
		return 0, p.errf(start, "bad escape at end of input")
	}
	c := p.src[p.pos]
	p.pos++
	digits := 0
	switch c {
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case '\\', '"', '[', ']', '-', '^', '/':
		return rune(c), nil
	case 'x':
		digits = 2
	case 'u':
		digits = 4
	case 'U':
		digits = 8
	default:
		r, _ := utf8.DecodeRuneInString(p.src[p.pos-1:])
		return 0, p.errf(start, "bad escape \\%c", r)
	}
	var v rune
	for range digits {
		if p.pos >= len(p.src) {
			return 0, p.errf(start, "bad escape: \\%c needs %d hex digits", c, digits)
		}
		h := p.src[p.pos]
		var d byte
		switch {
		case h >= '0' && h <= '9':
			d = h - '0'
		case h >= 'a' && h <= 'f':
			d = h - 'a' + 10
		case h >= 'A' && h <= 'F':
			d = h - 'A' + 10
		default:
			return 0, p.errf(start, "bad escape: \\%c needs %d hex digits", c, digits)
		}
		v = v<<4 | rune(d)
		p.pos++
	}
	if v > utf8.MaxRune || (v >= 0xD800 && v <= 0xDFFF) {
		return 0, p.errf(start, "bad escape: U+%04X is not a Unicode scalar value", v)
	}
	return v, nil
}

func (p *gbnfParser) postfix(el *node) (*node, error) {
	for {
		save := p.pos
		p.space()
		if p.pos >= len(p.src) {
			p.pos = save
			return el, nil
		}
		switch p.src[p.pos] {
		case '*':
			el = &node{kind: nRepeat, kids: []*node{el}, min: 0, max: -1}
		case '+':
			el = &node{kind: nRepeat, kids: []*node{el}, min: 1, max: -1}
		case '?':
			el = &node{kind: nRepeat, kids: []*node{el}, min: 0, max: 1}
		case '{':
			start := p.pos
			p.pos++
			p.space()
			m, ok := p.int()
			if !ok {
				return nil, p.errf(start, "expected a count after '{'")
			}
			n := m
			p.space()
			if p.pos < len(p.src) && p.src[p.pos] == ',' {
				p.pos++
				p.space()
				if n, ok = p.int(); !ok {
					n = -1
				}
				p.space()
			}
			if p.pos >= len(p.src) || p.src[p.pos] != '}' {
				return nil, p.errf(start, "missing '}' in repetition")
			}
			if n >= 0 && n < m {
				return nil, p.errf(start, "repetition {%d,%d}: minimum exceeds maximum", m, n)
			}
			if m > maxRepeat || n > maxRepeat {
				return nil, p.errf(start, "repetition count over %d", maxRepeat)
			}
			el = &node{kind: nRepeat, kids: []*node{el}, min: m, max: n}
		default:
			p.pos = save
			return el, nil
		}
		p.pos++
	}
}

func (p *gbnfParser) int() (int, bool) {
	s := p.pos
	v := 0
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		if v <= maxRepeat {
			v = v*10 + int(p.src[p.pos]-'0')
		}
		p.pos++
	}
	return v, p.pos > s
}
