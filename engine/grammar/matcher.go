package grammar

import (
	"fmt"
)

// maxForced bounds ForcedBytes.
const maxForced = 4096

// Matcher is one sequence's position in the grammar: the parser state after
// each committed byte, kept as a stack of states so Rollback is truncation.
// Not safe for concurrent use. Memory grows with the committed text (the
// states of every byte are kept for rollback).
type Matcher struct {
	c     *Compiled
	w     *walker
	steps []level   // state after each committed byte; steps[0] is the start
	hist  []histRec // one per committed token
	term  bool      // EOS committed
	lv    []level   // scratch for mask checks
}

type histRec struct {
	steps int32 // len(steps) before the token
	eos   bool
}

// NewMatcher returns a matcher at the start of the grammar. Cost: one closure
// of the start rule.
func (c *Compiled) NewMatcher() *Matcher {
	m := &Matcher{c: c, w: newWalker(c.g)}
	m.steps = append(m.steps, m.w.initial(c.g.start))
	return m
}

func (m *Matcher) cur() level { return m.steps[len(m.steps)-1] }

// IsAccepting reports whether the text so far is a complete match (true after
// EOS too).
func (m *Matcher) IsAccepting() bool { return m.term || m.cur().accept }

// IsTerminated reports whether EOS was committed.
func (m *Matcher) IsTerminated() bool { return m.term }

// ComputeMask sets bit t of mask (mask[t/32] >> (t%32) & 1) for every token t
// that may come next, exactly the tokens Commit would take, and clears the
// others: EOS tokens are set when the matcher is accepting; once terminated
// the mask is empty.
// len(mask) must be at least (len(Vocab.Tokens)+31)/32.
//
// Cost: for each stack of the current state (one for a deterministic
// grammar, a handful at alternations), one cache lookup and an OR of its
// cached accepted tokens (len(mask) words at most), plus a byte-by-byte parse
// of the context's uncertain tokens (those that leave the cached context of
// four frames: for JSON, tokens that close a string or number and go on,
// such as `",`), sharing their common prefixes. The first time a context is
// met its entry costs one trie walk (see Compile).
func (m *Matcher) ComputeMask(mask []uint32) {
	c := m.c
	if len(mask) < c.words {
		panic(fmt.Sprintf("grammar: mask of %d words for a vocabulary of %d tokens", len(mask), len(c.v.Tokens)))
	}
	clear(mask)
	if !m.term {
		cur := m.cur()
		for i := cur.s; i < cur.e; i++ {
			t := m.w.tops[i]
			e := c.entry(keyOf(m.w, t))
			if e.bits != nil {
				for j, x := range e.bits {
					mask[j] |= x
				}
			} else {
				for _, id := range e.ids {
					mask[id>>5] |= 1 << (id & 31)
				}
			}
			if len(e.uncertain) > 0 {
				m.checkTokens(t, e.uncertain, mask)
			}
		}
	}
	if !m.term && m.cur().accept {
		for _, id := range c.v.EOS {
			mask[id>>5] |= 1 << (id & 31)
		}
	}
}

// checkTokens sets the bits of the ids (sorted by bytes) that stack t
// accepts, parsing shared prefixes once.
func (m *Matcher) checkTokens(t top, ids []int32, mask []uint32) {
	w := m.w
	baseTops, baseArena := len(w.tops), len(w.arena)
	defer func() { w.tops, w.arena = w.tops[:baseTops], w.arena[:baseArena] }()
	w.tops = append(w.tops, t)
	lv := append(m.lv[:0], level{int32(baseTops), int32(baseTops + 1), int32(baseArena), false})
	valid := 0
	var prev []byte
	for _, id := range ids {
		b := m.c.v.Tokens[id]
		d := min(lcp(prev, b), valid)
		prev = b
		ok := true
		for k := d; k < len(b); k++ {
			p := lv[k]
			if p.e == p.s {
				ok, valid = false, k
				break
			}
			w.tops, w.arena = w.tops[:p.e], w.arena[:p.arena]
			lv = append(lv[:k+1], w.advance(p, b[k]))
			valid = k + 1
		}
		if ok {
			if l := lv[len(b)]; l.e > l.s || l.accept {
				mask[id>>5] |= 1 << (id & 31)
			}
		}
	}
	m.lv = lv
}

// Commit advances by one token. An EOS token is legal only when the matcher
// is accepting and terminates it. An illegal token (or any token after EOS)
// returns an error and changes nothing. Cost: linear in the token's bytes
// times the closure work per byte.
func (m *Matcher) Commit(token int) error {
	c := m.c
	if m.term {
		return fmt.Errorf("grammar: token %d after EOS", token)
	}
	if token < 0 || token >= len(c.v.Tokens) {
		return fmt.Errorf("grammar: token %d outside the vocabulary of %d", token, len(c.v.Tokens))
	}
	if c.isEOS[token] {
		if !m.cur().accept {
			return fmt.Errorf("grammar: EOS token %d before the grammar accepts", token)
		}
		m.hist = append(m.hist, histRec{int32(len(m.steps)), true})
		m.term = true
		return nil
	}
	b := c.v.Tokens[token]
	if len(b) == 0 {
		return fmt.Errorf("grammar: token %d has no text and cannot be generated under a grammar", token)
	}
	n := len(m.steps)
	for i, x := range b {
		p := m.cur()
		l := m.w.advance(p, x)
		m.steps = append(m.steps, l)
		if l.e == l.s && (i < len(b)-1 || !l.accept) {
			m.truncate(n)
			return fmt.Errorf("grammar: token %d (%q) not allowed: byte %d does not fit the grammar", token, b, i)
		}
	}
	m.hist = append(m.hist, histRec{int32(n), false})
	return nil
}

// truncate drops the states after the first n.
func (m *Matcher) truncate(n int) {
	m.steps = m.steps[:n]
	l := m.steps[n-1]
	m.w.tops, m.w.arena = m.w.tops[:l.e], m.w.arena[:l.arena]
}

// Rollback undoes the last n committed tokens (EOS included), as for
// rejected speculative tokens. Cost: O(n).
func (m *Matcher) Rollback(n int) error {
	if n < 0 || n > len(m.hist) {
		return fmt.Errorf("grammar: rollback of %d tokens with %d committed", n, len(m.hist))
	}
	if n == 0 {
		return nil
	}
	h := m.hist[len(m.hist)-n]
	m.hist = m.hist[:len(m.hist)-n]
	m.term = false
	m.truncate(int(h.steps))
	return nil
}

// NumCommitted reports how many tokens are committed (EOS included).
func (m *Matcher) NumCommitted() int { return len(m.hist) }

// ForcedBytes returns the bytes every continuation must start with: the
// longest string such that every stack expects exactly its next byte and the
// grammar does not accept before it (capped at 4096 bytes); empty when the
// next byte is open or after EOS. Useful for fast-forward (jump-ahead)
// decoding. Cost: one parser step per returned byte.
func (m *Matcher) ForcedBytes() []byte {
	if m.term {
		return nil
	}
	n := len(m.steps)
	defer m.truncate(n)
	var out []byte
	for len(out) < maxForced {
		p := m.cur()
		if p.accept || p.e == p.s {
			break
		}
		b := int16(-1)
		for i := p.s; i < p.e; i++ {
			sb := m.c.g.single[m.w.elems[m.w.tops[i].pos].arg]
			if sb < 0 || (b >= 0 && sb != b) {
				b = -2
				break
			}
			b = sb
		}
		if b < 0 {
			break
		}
		out = append(out, byte(b))
		m.steps = append(m.steps, m.w.advance(p, byte(b)))
	}
	return out
}

// AcceptsString reports whether s, as bytes, is a complete match of the
// grammar from the start. For tests and tools; cost linear in len(s).
func (g *Grammar) AcceptsString(s string) bool {
	w := newWalker(g)
	l := w.initial(g.start)
	for i := 0; i < len(s); i++ {
		if l.e == l.s {
			return false
		}
		l = w.advance(l, s[i])
	}
	return l.accept
}
