package grammar

import (
	"fmt"
	"sort"
	"unicode/utf8"
)

// node is the syntax tree both front ends (GBNF and regex) produce; build
// lowers it to the flat form a Grammar holds.
type node struct {
	kind     nodeKind
	kids     []*node
	lit      []byte // nLit: the bytes to match
	ranges   []rune // nClass: sorted, non-overlapping [lo, hi] pairs of code points
	name     string // nRef
	min, max int    // nRepeat; max < 0: unbounded
	line     int    // nRef: where it appears, for errors
	col      int
}

type nodeKind uint8

const (
	nSeq    nodeKind = iota // kids in order (no kids: the empty string)
	nAlt                    // one of kids
	nLit                    // lit
	nClass                  // one code point in ranges, UTF-8 encoded
	nRef                    // the rule name
	nRepeat                 // kids[0] repeated min..max times
)

// maxRepeat bounds {m,n} counts; each copy becomes grammar positions.
const maxRepeat = 10000

// normRanges sorts and merges [lo, hi] pairs, dropping surrogates, which
// UTF-8 cannot encode.
func normRanges(in []rune) []rune {
	type rr struct{ lo, hi rune }
	var rs []rr
	for i := 0; i+1 < len(in); i += 2 {
		lo, hi := in[i], in[i+1]
		if lo < 0 {
			lo = 0
		}
		if hi > utf8.MaxRune {
			hi = utf8.MaxRune
		}
		if lo > hi {
			continue
		}
		// Cut out the surrogate block.
		if lo < 0xD800 && hi > 0xDFFF {
			rs = append(rs, rr{lo, 0xD7FF}, rr{0xE000, hi})
			continue
		}
		if lo >= 0xD800 && lo <= 0xDFFF {
			lo = 0xE000
		}
		if hi >= 0xD800 && hi <= 0xDFFF {
			hi = 0xD7FF
		}
		if lo <= hi {
			rs = append(rs, rr{lo, hi})
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	var out []rune
	for _, r := range rs {
		n := len(out)
		if n > 0 && r.lo <= out[n-1]+1 {
			if r.hi > out[n-1] {
				out[n-1] = r.hi
			}
			continue
		}
		out = append(out, r.lo, r.hi)
	}
	return out
}

// negateRanges returns the code points (surrogates excluded) not in rs,
// which must be normalized.
func negateRanges(rs []rune) []rune {
	var out []rune
	next := rune(0)
	for i := 0; i < len(rs); i += 2 {
		if rs[i] > next {
			out = append(out, next, rs[i]-1)
		}
		next = rs[i+1] + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, next, utf8.MaxRune)
	}
	return normRanges(out)
}

// byteRange is an inclusive range of byte values.
type byteRange struct{ lo, hi byte }

// utf8Sequences appends to dst the byte-range sequences whose concatenations
// are exactly the UTF-8 encodings of the code points in [lo, hi] (no
// surrogates inside), as in RE2's and Rust regex's UTF-8 compilers: the range
// is split until every piece has the same encoded length and each byte
// position spans a full or single sub-range.
func utf8Sequences(dst [][]byteRange, lo, hi rune) [][]byteRange {
	type rr struct{ lo, hi rune }
	stack := []rr{{lo, hi}}
	var a, b [utf8.UTFMax]byte
outer:
	for len(stack) > 0 {
		r := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if r.lo > r.hi {
			continue
		}
		for _, max := range []rune{0x7F, 0x7FF, 0xFFFF} {
			if r.lo <= max && max < r.hi {
				stack = append(stack, rr{max + 1, r.hi}, rr{r.lo, max})
				continue outer
			}
		}
		if r.hi <= 0x7F {
			dst = append(dst, []byteRange{{byte(r.lo), byte(r.hi)}})
			continue
		}
		for i := 1; i < utf8.UTFMax; i++ {
			m := rune(1)<<(6*i) - 1
			if r.lo&^m != r.hi&^m {
				if r.lo&m != 0 {
					stack = append(stack, rr{(r.lo | m) + 1, r.hi}, rr{r.lo, r.lo | m})
					continue outer
				}
				if r.hi&m != m {
					stack = append(stack, rr{r.hi &^ m, r.hi}, rr{r.lo, (r.hi &^ m) - 1})
					continue outer
				}
			}
		}
		n := utf8.EncodeRune(a[:], r.lo)
		utf8.EncodeRune(b[:], r.hi)
		seq := make([]byteRange, n)
		for i := range n {
			seq[i] = byteRange{a[i], b[i]}
		}
		dst = append(dst, seq)
	}
	return dst
}

func (n *node) String() string {
	switch n.kind {
	case nLit:
		return fmt.Sprintf("%q", n.lit)
	case nRef:
		return n.name
	}
	return fmt.Sprintf("node(%d)", n.kind)
}
