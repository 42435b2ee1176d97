package grammar

import (
	"fmt"
	"regexp/syntax"
	"unicode"
	"unicode/utf8"
)

// ParseRegex compiles a regular expression (Go's regexp/syntax with Perl
// flags: RE2 syntax, so no backreferences) into a Grammar that matches
// exactly the strings the expression matches in full, as vLLM's
// guided_regex: the whole output must match. ^ and \A at the start and $ and
// \z at the end are accepted and mean nothing more; anywhere else they, and
// the word-boundary assertions \b and \B, are errors naming them. Non-greedy
// quantifiers are the same as greedy ones (only the set of strings matters).
// Cost: linear in the size of the expression after repetition expansion
// ({m,n} makes n copies, capped at 10000).
func ParseRegex(expr string) (*Grammar, error) {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return nil, fmt.Errorf("grammar: regex: %w", err)
	}
	n, err := regexNode(re, true, true)
	if err != nil {
		return nil, err
	}
	return newBuilder(map[string]*node{"root": n}, []string{"root"}).build("root")
}

// regexNode converts re; atStart and atEnd say whether re begins (ends) the
// whole text, where anchors are allowed.
func regexNode(re *syntax.Regexp, atStart, atEnd bool) (*node, error) {
	switch re.Op {
	case syntax.OpNoMatch:
		return &node{kind: nClass}, nil
	case syntax.OpEmptyMatch:
		return &node{kind: nSeq}, nil
	case syntax.OpLiteral:
		if re.Flags&syntax.FoldCase == 0 {
			var lit []byte
			for _, r := range re.Rune {
				lit = utf8.AppendRune(lit, r)
			}
			return &node{kind: nLit, lit: lit}, nil
		}
		seq := &node{kind: nSeq}
		for _, r := range re.Rune {
			rs := []rune{r, r}
			for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
				rs = append(rs, f, f)
			}
			seq.kids = append(seq.kids, &node{kind: nClass, ranges: normRanges(rs)})
		}
		return seq, nil
	case syntax.OpCharClass:
		return &node{kind: nClass, ranges: normRanges(append([]rune(nil), re.Rune...))}, nil
	case syntax.OpAnyCharNotNL:
		return &node{kind: nClass, ranges: normRanges([]rune{0, '\n' - 1, '\n' + 1, utf8.MaxRune})}, nil
	case syntax.OpAnyChar:
		return &node{kind: nClass, ranges: normRanges([]rune{0, utf8.MaxRune})}, nil
	case syntax.OpBeginLine, syntax.OpBeginText:
		if !atStart {
			return nil, fmt.Errorf("grammar: regex: %s anchor not at the start of the expression is not supported", anchorName(re.Op))
		}
		return &node{kind: nSeq}, nil
	case syntax.OpEndLine, syntax.OpEndText:
		if !atEnd {
			return nil, fmt.Errorf("grammar: regex: %s anchor not at the end of the expression is not supported", anchorName(re.Op))
		}
		return &node{kind: nSeq}, nil
	case syntax.OpWordBoundary:
		return nil, fmt.Errorf(`grammar: regex: word boundary \b is not supported`)
	case syntax.OpNoWordBoundary:
		return nil, fmt.Errorf(`grammar: regex: non-word boundary \B is not supported`)
	case syntax.OpCapture:
		return regexNode(re.Sub[0], atStart, atEnd)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		k, err := regexNode(re.Sub[0], false, false)
		if err != nil {
			return nil, err
		}
		n := &node{kind: nRepeat, kids: []*node{k}}
		switch re.Op {
		case syntax.OpStar:
			n.min, n.max = 0, -1
		case syntax.OpPlus:
			n.min, n.max = 1, -1
		case syntax.OpQuest:
			n.min, n.max = 0, 1
		default:
			n.min, n.max = re.Min, re.Max
		}
		return n, nil
	case syntax.OpConcat:
		n := &node{kind: nSeq}
		// An anchor may follow (precede) other empty-width anchors at the edge.
		first, last := 0, len(re.Sub)-1
		for first < len(re.Sub) && isBeginAnchor(re.Sub[first].Op) {
			first++
		}
		for last >= 0 && isEndAnchor(re.Sub[last].Op) {
			last--
		}
		for i, s := range re.Sub {
			k, err := regexNode(s, atStart && i <= first, atEnd && i >= last)
			if err != nil {
				return nil, err
			}
			n.kids = append(n.kids, k)
		}
		return n, nil
	case syntax.OpAlternate:
		n := &node{kind: nAlt}
		for _, s := range re.Sub {
			k, err := regexNode(s, atStart, atEnd)
			if err != nil {
				return nil, err
			}
			n.kids = append(n.kids, k)
		}
		return n, nil
	}
	return nil, fmt.Errorf("grammar: regex: unsupported construct %v", re.Op)
}

func isBeginAnchor(op syntax.Op) bool { return op == syntax.OpBeginLine || op == syntax.OpBeginText }
func isEndAnchor(op syntax.Op) bool   { return op == syntax.OpEndLine || op == syntax.OpEndText }

func anchorName(op syntax.Op) string {
	switch op {
	case syntax.OpBeginLine:
		return "^ (multi-line)"
	case syntax.OpBeginText:
		return `^ or \A`
	case syntax.OpEndLine:
		return "$ (multi-line)"
	}
	return `$ or \z`
}
