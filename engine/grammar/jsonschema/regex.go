package jsonschema

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// runeSet is a sorted list of disjoint inclusive code point ranges.
type runeSet [][2]rune

func (s runeSet) norm() runeSet {
	sort.Slice(s, func(i, j int) bool { return s[i][0] < s[j][0] })
	var out runeSet
	for _, r := range s {
		if len(out) > 0 && r[0] <= out[len(out)-1][1]+1 {
			if r[1] > out[len(out)-1][1] {
				out[len(out)-1][1] = r[1]
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

func (s runeSet) negate() runeSet {
	var out runeSet
	next := rune(0)
	for _, r := range s.norm() {
		if r[0] > next {
			out = append(out, [2]rune{next, r[0] - 1})
		}
		next = r[1] + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, [2]rune{next, utf8.MaxRune})
	}
	return out
}

func (s runeSet) has(r rune) bool {
	for _, x := range s {
		if r >= x[0] && r <= x[1] {
			return true
		}
	}
	return false
}

// minus removes the ranges of t.
func (s runeSet) minus(t runeSet) runeSet {
	return append(s.negate(), t...).norm().negate()
}

var (
	digitSet = runeSet{{'0', '9'}}
	wordSet  = runeSet{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}
	spaceSet = runeSet{{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
		{0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}}
	dotSet        = runeSet{{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}.negate()
	surrogates    = runeSet{{0xD800, 0xDFFF}}
	jsonEscaped   = runeSet{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}
	shortEscapes  = map[rune]string{'\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`, '"': `\"`, '\\': `\\`}
	errNothingRep = "nothing to repeat"
)

// regex AST
type reNode struct {
	kind     int // reSet, reSeq, reAlt, reRep, reStart, reEnd
	set      runeSet
	subs     []*reNode
	min, max int
}

const (
	reSet = iota
	reSeq
	reAlt
	reRep
	reStart
	reEnd
)

type reParser struct {
	src  []rune
	pos  int
	path string
}

func (p *reParser) errf(format string, args ...any) error {
	return errorf("pattern", p.path, "%s in %q", fmt.Sprintf(format, args...), string(p.src))
}

func (p *reParser) more() bool { return p.pos < len(p.src) }
func (p *reParser) peek() rune { return p.src[p.pos] }

func (p *reParser) parseAlt() (*reNode, error) {
	var alts []*reNode
	for {
		s, err := p.parseSeq()
		if err != nil {
			return nil, err
		}
		alts = append(alts, s)
		if p.more() && p.peek() == '|' {
			p.pos++
			continue
		}
		break
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return &reNode{kind: reAlt, subs: alts}, nil
}

func (p *reParser) parseSeq() (*reNode, error) {
	n := &reNode{kind: reSeq}
	for p.more() && p.peek() != '|' && p.peek() != ')' {
		a, err := p.parseAtom()
		if err != nil {
			return nil, err
		}
		for p.more() {
			min, max, ok, err := p.parseQuant()
			if err != nil {
				return nil, err
			}
			if !ok {
				break
			}
			if a.kind == reStart || a.kind == reEnd {
				return nil, p.errf("quantified anchor")
			}
			a = &reNode{kind: reRep, subs: []*reNode{a}, min: min, max: max}
		}
		n.subs = append(n.subs, a)
	}
	return n, nil
}

func (p *reParser) parseQuant() (min, max int, ok bool, err error) {
	switch p.peek() {
	case '*':
		min, max, ok = 0, -1, true
		p.pos++
	case '+':
		min, max, ok = 1, -1, true
		p.pos++
	case '?':
		min, max, ok = 0, 1, true
		p.pos++
	case '{':
		end := p.pos + 1
		for end < len(p.src) && p.src[end] != '}' {
			end++
		}
		if end == len(p.src) {
			return 0, 0, false, nil
		}
		body := string(p.src[p.pos+1 : end])
		lo, hi, found := strings.Cut(body, ",")
		a, e1 := strconv.Atoi(lo)
		if e1 != nil || a < 0 {
			return 0, 0, false, nil
		}
		b := a
		if found {
			if hi == "" {
				b = -1
			} else if b, e1 = strconv.Atoi(hi); e1 != nil || b < a {
				return 0, 0, false, p.errf("bad quantifier {%s}", body)
			}
		}
		if a > 10000 || b > 10000 {
			return 0, 0, false, p.errf("quantifier {%s} too large", body)
		}
		min, max, ok = a, b, true
		p.pos = end + 1
	default:
		return 0, 0, false, nil
	}
	if p.more() && p.peek() == '?' { // lazy: same language
		p.pos++
	}
	return
}

func single(r rune) *reNode { return &reNode{kind: reSet, set: runeSet{{r, r}}} }

func (p *reParser) parseAtom() (*reNode, error) {
	r := p.peek()
	p.pos++
	switch r {
	case '^':
		return &reNode{kind: reStart}, nil
	case '$':
		return &reNode{kind: reEnd}, nil
	case '.':
		return &reNode{kind: reSet, set: dotSet}, nil
	case '*', '+', '?':
		return nil, p.errf("%s", errNothingRep)
	case '(':
		if p.more() && p.peek() == '?' {
			rest := string(p.src[p.pos:])
			switch {
			case strings.HasPrefix(rest, "?:"):
				p.pos += 2
			case strings.HasPrefix(rest, "?<") && !strings.HasPrefix(rest, "?<=") && !strings.HasPrefix(rest, "?<!"):
				end := strings.IndexRune(rest, '>')
				if end < 0 {
					return nil, p.errf("bad group name")
				}
				p.pos += utf8.RuneCountInString(rest[:end+1])
			default:
				return nil, p.errf("unsupported group syntax (lookaround or flags) at offset %d", p.pos-1)
			}
		}
		n, err := p.parseAlt()
		if err != nil {
			return nil, err
		}
		if !p.more() || p.peek() != ')' {
			return nil, p.errf("missing )")
		}
		p.pos++
		return n, nil
	case ')':
		return nil, p.errf("unmatched )")
	case '[':
		return p.parseClass()
	case '\\':
		set, err := p.parseEscape(false)
		if err != nil {
			return nil, err
		}
		return &reNode{kind: reSet, set: set}, nil
	}
	return single(r), nil
}

func (p *reParser) parseEscape(inClass bool) (runeSet, error) {
	if !p.more() {
		return nil, p.errf("trailing backslash")
	}
	r := p.peek()
	p.pos++
	one := func(r rune) (runeSet, error) { return runeSet{{r, r}}, nil }
	switch r {
	case 'd':
		return digitSet, nil
	case 'D':
		return digitSet.negate(), nil
	case 'w':
		return wordSet, nil
	case 'W':
		return wordSet.negate(), nil
	case 's':
		return spaceSet, nil
	case 'S':
		return spaceSet.negate(), nil
	case 't':
		return one('\t')
	case 'n':
		return one('\n')
	case 'r':
		return one('\r')
	case 'v':
		return one('\v')
	case 'f':
		return one('\f')
	case '0':
		if p.more() && p.peek() >= '0' && p.peek() <= '9' {
			return nil, p.errf("octal escape")
		}
		return one(0)
	case 'b':
		if inClass {
			return one('\b')
		}
		return nil, p.errf(`unsupported word boundary \b`)
	case 'B':
		return nil, p.errf(`unsupported \B`)
	case 'c':
		if p.more() && ((p.peek() >= 'a' && p.peek() <= 'z') || (p.peek() >= 'A' && p.peek() <= 'Z')) {
			c := p.peek()
			p.pos++
			return one(c % 32)
		}
		return nil, p.errf(`bad \c escape`)
	case 'x', 'u':
		n := 2
		if r == 'u' {
			n = 4
		}
		if p.pos+n > len(p.src) {
			return nil, p.errf(`bad \%c escape`, r)
		}
		v, err := strconv.ParseUint(string(p.src[p.pos:p.pos+n]), 16, 32)
		if err != nil {
			return nil, p.errf(`bad \%c escape`, r)
		}
		p.pos += n
		if v >= 0xD800 && v <= 0xDFFF {
			return nil, p.errf("surrogate escape")
		}
		return one(rune(v))
	case 'p', 'P':
		return nil, p.errf(`unsupported Unicode property escape \%c`, r)
	case 'k':
		return nil, p.errf(`unsupported backreference \k`)
	}
	if r >= '1' && r <= '9' {
		return nil, p.errf(`unsupported backreference \%c`, r)
	}
	if (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
		return nil, p.errf(`unknown escape \%c`, r)
	}
	return one(r)
}

func (p *reParser) parseClass() (*reNode, error) {
	neg := false
	if p.more() && p.peek() == '^' {
		neg = true
		p.pos++
	}
	var set runeSet
	first := true
	for {
		if !p.more() {
			return nil, p.errf("missing ]")
		}
		if p.peek() == ']' {
			p.pos++
			break
		}
		_ = first
		first = false
		lo, loSet, err := p.classAtom()
		if err != nil {
			return nil, err
		}
		if loSet == nil && p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			hi, hiSet, err := p.classAtom()
			if err != nil {
				return nil, err
			}
			if hiSet != nil {
				return nil, p.errf("class range with a set escape")
			}
			if hi < lo {
				return nil, p.errf("bad class range")
			}
			set = append(set, [2]rune{lo, hi})
			continue
		}
		if loSet != nil {
			set = append(set, loSet...)
		} else {
			set = append(set, [2]rune{lo, lo})
		}
	}
	set = set.norm()
	if neg {
		set = set.negate()
	}
	return &reNode{kind: reSet, set: set}, nil
}

// classAtom returns a single rune, or a set for \d-style escapes.
func (p *reParser) classAtom() (rune, runeSet, error) {
	r := p.peek()
	p.pos++
	if r != '\\' {
		return r, nil, nil
	}
	if p.more() && p.peek() == '-' {
		p.pos++
		return '-', nil, nil
	}
	s, err := p.parseEscape(true)
	if err != nil {
		return 0, nil, err
	}
	if len(s) == 1 && s[0][0] == s[0][1] {
		return s[0][0], nil, nil
	}
	return 0, s, nil
}

// regexToGBNF converts an ECMAScript pattern (search semantics) to a GBNF
// expression over the JSON-encoded string content.
func (c *converter) regexToGBNF(pattern, path string) (string, error) {
	p := &reParser{src: []rune(pattern), path: path}
	n, err := p.parseAlt()
	if err != nil {
		return "", err
	}
	if p.more() {
		return "", p.errf("unmatched )")
	}
	branches := []*reNode{n}
	if n.kind == reAlt {
		branches = n.subs
	}
	anyChar := c.stringChar() + "*"
	var alts []string
	for _, b := range branches {
		items := []*reNode{b}
		if b.kind == reSeq {
			items = b.subs
		}
		pre, post := anyChar, anyChar
		if len(items) > 0 && items[0].kind == reStart {
			pre = ""
			items = items[1:]
		}
		if len(items) > 0 && items[len(items)-1].kind == reEnd {
			post = ""
			items = items[:len(items)-1]
		}
		// ^ or $ repeated at the edges is harmless (e.g. "^^a")
		for len(items) > 0 && items[0].kind == reStart && pre == "" {
			items = items[1:]
		}
		for len(items) > 0 && items[len(items)-1].kind == reEnd && post == "" {
			items = items[:len(items)-1]
		}
		body, err := c.reExpr(&reNode{kind: reSeq, subs: items}, p)
		if err != nil {
			return "", err
		}
		alts = append(alts, seq(pre, body, post))
	}
	if len(alts) == 1 {
		return group(alts[0]), nil
	}
	return "(" + strings.Join(alts, " | ") + ")", nil
}

func (c *converter) reExpr(n *reNode, p *reParser) (string, error) {
	switch n.kind {
	case reStart, reEnd:
		return "", p.errf("anchor in the middle of the pattern")
	case reSet:
		e := c.jsonCharSet(n.set)
		if e == "" {
			return "", &Error{Keyword: "pattern", Path: p.path, Msg: "schema accepts no value (empty character class)"}
		}
		return e, nil
	case reSeq:
		var parts []string
		for _, s := range n.subs {
			e, err := c.reExpr(s, p)
			if err != nil {
				return "", err
			}
			parts = append(parts, e)
		}
		return seq(parts...), nil
	case reAlt:
		var parts []string
		for _, s := range n.subs {
			e, err := c.reExpr(s, p)
			if err != nil {
				return "", err
			}
			parts = append(parts, e)
		}
		return "(" + strings.Join(parts, " | ") + ")", nil
	case reRep:
		e, err := c.reExpr(n.subs[0], p)
		if err != nil {
			return "", err
		}
		if n.max == 0 {
			return `""`, nil
		}
		return rep(group(e), n.min, n.max), nil
	}
	return "", p.errf("internal error")
}

// jsonCharSet matches one string character from set in its canonical JSON
// encoding (json.dumps, ensure_ascii=False); "\/" is also accepted for "/".
func (c *converter) jsonCharSet(set runeSet) string {
	set = set.norm().minus(surrogates)
	raw := set.minus(jsonEscaped)
	var alts []string
	if len(raw) > 0 {
		var b strings.Builder
		b.WriteByte('[')
		for _, r := range raw {
			b.WriteString(gbnfClassChar(r[0]))
			if r[1] > r[0] {
				b.WriteString("-" + gbnfClassChar(r[1]))
			}
		}
		b.WriteByte(']')
		alts = append(alts, b.String())
	}
	for r := rune(0); r <= '\\'; r++ {
		if !set.has(r) || (r >= 0x20 && r != '"' && r != '\\') {
			continue
		}
		if e, ok := shortEscapes[r]; ok {
			alts = append(alts, gbnfLiteral(e))
			continue
		}
		h := fmt.Sprintf("%x", r&0xF)
		alts = append(alts, seq(gbnfLiteral(fmt.Sprintf(`\u00%x`, r>>4)), "["+strings.ToLower(h)+strings.ToUpper(h)+"]"))
	}
	if set.has('/') {
		alts = append(alts, gbnfLiteral(`\/`))
	}
	if len(alts) == 0 {
		return ""
	}
	if len(alts) == 1 {
		return alts[0]
	}
	return c.define("re-char", strings.Join(alts, " | "))
}
