package grammar

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// Grammar is a compiled grammar over bytes: immutable after construction and
// safe for concurrent use. Code points in literals and classes are matched as
// their UTF-8 encodings.
type Grammar struct {
	elems   []elem    // every alternative's elements, each run ended by kEnd
	rules   []rule    // by index; kRule elements refer to these
	classes []byteSet // kTerm elements refer to these
	single  []int16   // per class: its only byte, or -1
	start   int32     // position of the start element: kRule(root), kEnd
}

type elemKind uint8

const (
	kEnd  elemKind = iota // end of an alternative
	kTerm                 // one byte from classes[arg]
	kRule                 // rules[arg]
)

type elem struct {
	kind elemKind
	arg  int32
}

type rule struct {
	name string
	alts []int32 // start positions in elems
}

// byteSet is a set of byte values.
type byteSet [4]uint64

func (s *byteSet) has(b byte) bool { return s[b>>6]>>(b&63)&1 != 0 }
func (s *byteSet) add(lo, hi byte) {
	for c := int(lo); c <= int(hi); c++ {
		s[c>>6] |= 1 << (c & 63)
	}
}
func (s *byteSet) count() int {
	return bits.OnesCount64(s[0]) + bits.OnesCount64(s[1]) + bits.OnesCount64(s[2]) + bits.OnesCount64(s[3])
}

// NumRules reports the number of rules, generated ones (for repetitions,
// groups and multi-byte classes) included.
func (g *Grammar) NumRules() int { return len(g.rules) }

// String renders the lowered grammar in a GBNF-like form (byte classes as
// [\xNN-\xNN]); for debugging.
func (g *Grammar) String() string {
	var sb strings.Builder
	for _, r := range g.rules {
		fmt.Fprintf(&sb, "%s ::=", r.name)
		for i, a := range r.alts {
			if i > 0 {
				sb.WriteString(" |")
			}
			for p := a; g.elems[p].kind != kEnd; p++ {
				e := g.elems[p]
				if e.kind == kRule {
					sb.WriteString(" " + g.rules[e.arg].name)
				} else {
					sb.WriteString(" " + g.classString(e.arg))
				}
			}
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

func (g *Grammar) classString(ci int32) string {
	if b := g.single[ci]; b >= 0 {
		return strconv.QuoteToASCII(string(rune(b)))
	}
	s := &g.classes[ci]
	var sb strings.Builder
	sb.WriteByte('[')
	for c := 0; c < 256; c++ {
		if !s.has(byte(c)) {
			continue
		}
		e := c
		for e+1 < 256 && s.has(byte(e+1)) {
			e++
		}
		fmt.Fprintf(&sb, "\\x%02X", c)
		if e > c {
			fmt.Fprintf(&sb, "-\\x%02X", e)
		}
		c = e
	}
	sb.WriteByte(']')
	return sb.String()
}

// builder lowers syntax trees to a Grammar.
type builder struct {
	g        *Grammar
	defs     map[string]*node
	order    []string // definition order
	ruleIdx  map[string]int32
	classIdx map[byteSet]int32
	classRul map[string]int32 // multi-byte class rules by their ranges
	cur      string           // rule being lowered, for generated names
	gen      map[string]int
}

func newBuilder(defs map[string]*node, order []string) *builder {
	return &builder{
		g:        &Grammar{},
		defs:     defs,
		order:    order,
		ruleIdx:  make(map[string]int32),
		classIdx: make(map[byteSet]int32),
		classRul: make(map[string]int32),
		gen:      make(map[string]int),
	}
}

// build lowers every definition; root names the start rule.
func (b *builder) build(root string) (*Grammar, error) {
	if _, ok := b.defs[root]; !ok {
		return nil, fmt.Errorf("grammar: no %q rule", root)
	}
	b.ref(root)
	for _, name := range b.order {
		r := b.ref(name)
		b.cur = name
		def := b.defs[name]
		var alts [][]elem
		if def.kind == nAlt {
			for _, k := range def.kids {
				s, err := b.lower(k, nil)
				if err != nil {
					return nil, err
				}
				alts = append(alts, s)
			}
		} else {
			s, err := b.lower(def, nil)
			if err != nil {
				return nil, err
			}
			alts = [][]elem{s}
		}
		b.setAlts(r, alts)
	}
	g := b.g
	g.start = int32(len(g.elems))
	g.elems = append(g.elems, elem{kRule, b.ruleIdx[root]}, elem{kEnd, 0})
	for i := range g.rules {
		if g.rules[i].alts == nil && len(g.rules[i].name) > 0 {
			// Referenced but never defined: lower reports these first, so
			// this is unreachable; keep the invariant explicit.
			return nil, fmt.Errorf("grammar: rule %q is not defined", g.rules[i].name)
		}
	}
	g.single = make([]int16, len(g.classes))
	for i := range g.classes {
		g.single[i] = -1
		if g.classes[i].count() == 1 {
			for c := 0; c < 256; c++ {
				if g.classes[i].has(byte(c)) {
					g.single[i] = int16(c)
				}
			}
		}
	}
	if err := g.validate(); err != nil {
		return nil, err
	}
	return g, nil
}

func (b *builder) ref(name string) int32 {
	if r, ok := b.ruleIdx[name]; ok {
		return r
	}
	r := int32(len(b.g.rules))
	b.g.rules = append(b.g.rules, rule{name: name})
	b.ruleIdx[name] = r
	return r
}

func (b *builder) newRule() int32 {
	b.gen[b.cur]++
	r := int32(len(b.g.rules))
	b.g.rules = append(b.g.rules, rule{name: fmt.Sprintf("%s-%d", b.cur, b.gen[b.cur])})
	return r
}

func (b *builder) setAlts(r int32, alts [][]elem) {
	starts := make([]int32, len(alts))
	for i, a := range alts {
		starts[i] = int32(len(b.g.elems))
		b.g.elems = append(b.g.elems, a...)
		b.g.elems = append(b.g.elems, elem{kEnd, 0})
	}
	b.g.rules[r].alts = starts
}

func (b *builder) class(s byteSet) elem {
	ci, ok := b.classIdx[s]
	if !ok {
		ci = int32(len(b.g.classes))
		b.g.classes = append(b.g.classes, s)
		b.classIdx[s] = ci
	}
	return elem{kTerm, ci}
}

// lower appends the elements matching n to out.
func (b *builder) lower(n *node, out []elem) ([]elem, error) {
	switch n.kind {
	case nLit:
		for _, c := range n.lit {
			var s byteSet
			s.add(c, c)
			out = append(out, b.class(s))
		}
	case nClass:
		return append(out, b.classElem(n.ranges)), nil
	case nRef:
		if _, ok := b.defs[n.name]; !ok {
			return nil, fmt.Errorf("grammar: %d:%d: undefined rule %q", n.line, n.col, n.name)
		}
		out = append(out, elem{kRule, b.ref(n.name)})
	case nSeq:
		for _, k := range n.kids {
			var err error
			if out, err = b.lower(k, out); err != nil {
				return nil, err
			}
		}
	case nAlt:
		if len(n.kids) == 1 {
			return b.lower(n.kids[0], out)
		}
		var alts [][]elem
		for _, k := range n.kids {
			s, err := b.lower(k, nil)
			if err != nil {
				return nil, err
			}
			alts = append(alts, s)
		}
		r := b.newRule()
		b.setAlts(r, alts)
		out = append(out, elem{kRule, r})
	case nRepeat:
		if n.max >= 0 && n.min > n.max {
			return nil, fmt.Errorf("grammar: repetition {%d,%d}: minimum exceeds maximum", n.min, n.max)
		}
		if n.min > maxRepeat || n.max > maxRepeat {
			return nil, fmt.Errorf("grammar: repetition count over %d", maxRepeat)
		}
		body, err := b.lower(n.kids[0], nil)
		if err != nil {
			return nil, err
		}
		var x elem
		switch {
		case len(body) == 1:
			x = body[0]
		case len(body) == 0:
			return out, nil // repeating the empty string
		default:
			r := b.newRule()
			b.setAlts(r, [][]elem{body})
			x = elem{kRule, r}
		}
		for range n.min {
			out = append(out, x)
		}
		if n.max < 0 {
			// x* as R ::= x R | ε: right recursion, which the matcher runs as a
			// tail call, so the stack does not grow with the count.
			r := b.newRule()
			b.setAlts(r, [][]elem{{x, {kRule, r}}, nil})
			out = append(out, elem{kRule, r})
		} else if n.max > n.min {
			// x{0,k} as O_k ::= x O_{k-1} | ε, O_1 ::= x | ε.
			var prev elem
			for k := 1; k <= n.max-n.min; k++ {
				r := b.newRule()
				if k == 1 {
					b.setAlts(r, [][]elem{{x}, nil})
				} else {
					b.setAlts(r, [][]elem{{x, prev}, nil})
				}
				prev = elem{kRule, r}
			}
			out = append(out, prev)
		}
	}
	return out, nil
}

// classElem returns an element matching one code point of the normalized
// ranges rs: a byte class when all are ASCII, else a rule with one
// alternative per UTF-8 byte-range sequence (the ASCII ones merged).
func (b *builder) classElem(rs []rune) elem {
	if len(rs) == 0 {
		return b.class(byteSet{}) // matches nothing; pruned by validate
	}
	var seqs [][]byteRange
	for i := 0; i < len(rs); i += 2 {
		seqs = utf8Sequences(seqs, rs[i], rs[i+1])
	}
	var ascii byteSet
	var multi [][]byteRange
	for _, s := range seqs {
		if len(s) == 1 {
			ascii.add(s[0].lo, s[0].hi)
		} else {
			multi = append(multi, s)
		}
	}
	if len(multi) == 0 {
		return b.class(ascii)
	}
	key := fmt.Sprint(rs)
	if r, ok := b.classRul[key]; ok {
		return elem{kRule, r}
	}
	var alts [][]elem
	if ascii != (byteSet{}) {
		alts = append(alts, []elem{b.class(ascii)})
	}
	for _, s := range multi {
		var a []elem
		for _, br := range s {
			var bs byteSet
			bs.add(br.lo, br.hi)
			a = append(a, b.class(bs))
		}
		alts = append(alts, a)
	}
	saved := b.cur
	b.cur = "class"
	r := b.newRule()
	b.cur = saved
	b.setAlts(r, alts)
	b.classRul[key] = r
	return elem{kRule, r}
}

// validate drops alternatives that can never complete (they would let the
// matcher accept bytes no completion follows), then rejects grammars whose
// root matches nothing and left recursion that would grow the stack without
// consuming input.
func (g *Grammar) validate() error {
	productive := make([]bool, len(g.rules))
	altOK := func(a int32) bool {
		for p := a; g.elems[p].kind != kEnd; p++ {
			e := g.elems[p]
			if e.kind == kTerm && g.classes[e.arg] == (byteSet{}) {
				return false
			}
			if e.kind == kRule && !productive[e.arg] {
				return false
			}
		}
		return true
	}
	for changed := true; changed; {
		changed = false
		for r := range g.rules {
			if productive[r] {
				continue
			}
			for _, a := range g.rules[r].alts {
				if altOK(a) {
					productive[r], changed = true, true
					break
				}
			}
		}
	}
	root := g.elems[g.start].arg
	if !productive[root] {
		return fmt.Errorf("grammar: rule %q matches no finite string", g.rules[root].name)
	}
	for r := range g.rules {
		var keep []int32
		for _, a := range g.rules[r].alts {
			if altOK(a) {
				keep = append(keep, a)
			}
		}
		g.rules[r].alts = keep
	}
	nullable := make([]bool, len(g.rules))
	for changed := true; changed; {
		changed = false
		for r := range g.rules {
			if nullable[r] {
				continue
			}
		alts:
			for _, a := range g.rules[r].alts {
				for p := a; g.elems[p].kind != kEnd; p++ {
					e := g.elems[p]
					if e.kind == kTerm || !nullable[e.arg] {
						continue alts
					}
				}
				nullable[r], changed = true, true
				break
			}
		}
	}
	// Left calls: A -> B when B can be reached in A without consuming input.
	// A cycle through a call that pushes a return frame (B not last) would
	// grow the stack forever; cycles of tail calls only are harmless (the
	// matcher's closure skips repeated expansions).
	type edge struct {
		to   int32
		push bool
	}
	adj := make([][]edge, len(g.rules))
	for r := range g.rules {
		for _, a := range g.rules[r].alts {
			for p := a; g.elems[p].kind == kRule; p++ {
				e := g.elems[p]
				adj[r] = append(adj[r], edge{e.arg, g.elems[p+1].kind != kEnd})
				if !nullable[e.arg] {
					break
				}
			}
		}
	}
	seen := make([]int32, len(g.rules))
	stamp := int32(0)
	for from := range g.rules {
		for _, e := range adj[from] {
			if !e.push {
				continue
			}
			// Is from reachable from e.to?
			stamp++
			stack := []int32{e.to}
			seen[e.to] = stamp
			for len(stack) > 0 {
				x := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				if x == int32(from) {
					return fmt.Errorf("grammar: left recursion through rule %q (calls %q before consuming input)",
						g.rules[from].name, g.rules[e.to].name)
				}
				for _, y := range adj[x] {
					if seen[y.to] != stamp {
						seen[y.to] = stamp
						stack = append(stack, y.to)
					}
				}
			}
		}
	}
	return nil
}
