package grammar

import (
	"strings"
	"testing"
)

// Ambiguous nested repetitions, the regexes that backtracking engines
// take exponential time on, keep a bounded set of stacks: equal stacks
// share frames (hash-consed) and merge, so the state after n bytes does
// not grow with n, and a matcher's steps cost the same at any length.
func TestAmbiguousRepetitionStaysBounded(t *testing.T) {
	for _, expr := range []string{`(a+)+(b|a+)*c`, `(a+)+c`, `(a*)*c`, `((a|aa)+)+c`, `(a|a?)+c`} {
		g, err := ParseRegex(expr)
		if err != nil {
			t.Fatal(err)
		}
		stacksAfter := func(n int) int {
			w := newWalker(g)
			l := w.initial(g.start)
			most := 0
			for range n {
				l = w.advance(l, 'a')
				most = max(most, int(l.e-l.s))
			}
			if l = w.advance(l, 'c'); !l.accept {
				t.Fatalf("%s: a^%d c refused", expr, n)
			}
			return most
		}
		short, long := stacksAfter(16), stacksAfter(400)
		if long != short || long > 16 {
			t.Errorf("%s: at most %d stacks over 16 bytes, %d over 400", expr, short, long)
		}
		if !g.AcceptsString(strings.Repeat("a", 1000)+"c") || g.AcceptsString(strings.Repeat("a", 1000)+"b") {
			t.Errorf("%s: wrong language", expr)
		}
	}
}
