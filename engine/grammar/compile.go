package grammar

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
)

// ctxDepth is how many return frames below a stack's top key the mask
// cache: deeper keys leave fewer tokens to check at mask time but share
// entries between fewer contexts.
const ctxDepth = 4

// ctxKey identifies a cached mask entry: [0] is the top position, [1..ctxDepth]
// the return positions below it (-1 past the bottom), and [ctxDepth+1] is 1
// when the real stack has more frames (the context is truncated).
type ctxKey [ctxDepth + 2]int32

// maskEntry is what the cache knows about the tokens from one context:
// accepted tokens (dense bits or a sparse id list) and the tokens whose
// fate depends on frames below the key, checked against the real stack.
type maskEntry struct {
	bits      []uint32
	ids       []int32
	uncertain []int32 // in byte order, so checks share prefixes
}

type trieNode struct {
	b      byte
	depth  uint16
	t0, t1 int32 // tokens ending here: trieToks[t0:t1]; t0 < 0: none
	end    int32 // index after this node's subtree (preorder)
}

// Compiled is a Grammar bound to a Vocab: the vocabulary's byte trie
// (shared by every grammar compiled against the Vocab) and a cache of
// per-context token masks. It is safe for concurrent use and shared by
// matchers; the cache fills lazily (under a lock) as contexts are met.
type Compiled struct {
	g *Grammar
	v *Vocab
	*vocabIndex

	mu    sync.RWMutex
	cache map[ctxKey]*maskEntry
}

// vocabIndex is what a grammar's compilation needs of the vocabulary
// alone: its byte trie (tokens sorted by bytes; identical byte strings
// share a node) and its eos ids. Built once per Vocab.
type vocabIndex struct {
	words    int // len of a mask
	trie     []trieNode
	trieToks []int32
	isEOS    []bool
}

// Compile binds g to v and computes the mask entries of the start state.
// The vocabulary's byte trie is built by the first Compile against v and
// shared by the later ones (O(V log V) once, about 60 ms for a 128k
// vocabulary). Cost: one trie walk per start context; later contexts are
// computed on first use (one trie walk each, milliseconds to tens of
// milliseconds for a 128k vocabulary when the context allows most tokens,
// as inside a JSON string).
func Compile(g *Grammar, v *Vocab) (*Compiled, error) {
	if g == nil || v == nil {
		return nil, errors.New("grammar: Compile needs a grammar and a vocabulary")
	}
	idx, err := v.index()
	if err != nil {
		return nil, err
	}
	c := &Compiled{g: g, v: v, vocabIndex: idx, cache: make(map[ctxKey]*maskEntry)}
	// Warm the cache for the start state.
	w := newWalker(g)
	l := w.initial(g.start)
	for i := l.s; i < l.e; i++ {
		c.entry(keyOf(w, w.tops[i]))
	}
	return c, nil
}

// index returns v's vocabIndex, building it on the first call.
func (v *Vocab) index() (*vocabIndex, error) {
	v.once.Do(func() { v.idx, v.idxErr = buildIndex(v) })
	return v.idx, v.idxErr
}

// buildIndex builds the byte trie of v's tokens.
func buildIndex(v *Vocab) (*vocabIndex, error) {
	n := len(v.Tokens)
	c := &vocabIndex{words: (n + 31) / 32, isEOS: make([]bool, n)}
	for _, e := range v.EOS {
		if e < 0 || e >= n {
			return nil, fmt.Errorf("grammar: eos id %d outside the vocabulary of %d", e, n)
		}
		c.isEOS[e] = true
	}
	ids := make([]int32, 0, n)
	for id, b := range v.Tokens {
		if len(b) == 0 || c.isEOS[id] {
			continue
		}
		if len(b) > 1<<16-1 {
			return nil, fmt.Errorf("grammar: token %d is %d bytes long", id, len(b))
		}
		ids = append(ids, int32(id))
	}
	slices.SortFunc(ids, func(a, b int32) int {
		if r := bytes.Compare(v.Tokens[a], v.Tokens[b]); r != 0 {
			return r
		}
		return int(a - b)
	})
	c.trie = append(c.trie, trieNode{t0: -1})
	open := []int32{0}
	var prev []byte
	for _, id := range ids {
		b := v.Tokens[id]
		l := lcp(prev, b)
		for len(open)-1 > l {
			c.trie[open[len(open)-1]].end = int32(len(c.trie))
			open = open[:len(open)-1]
		}
		for d := l; d < len(b); d++ {
			open = append(open, int32(len(c.trie)))
			c.trie = append(c.trie, trieNode{b: b[d], depth: uint16(d + 1), t0: -1})
		}
		nd := &c.trie[open[len(b)]]
		if nd.t0 < 0 {
			nd.t0 = int32(len(c.trieToks))
		}
		c.trieToks = append(c.trieToks, id)
		nd.t1 = int32(len(c.trieToks))
		prev = b
	}
	for _, o := range open {
		c.trie[o].end = int32(len(c.trie))
	}
	return c, nil
}

func lcp(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// keyOf is the cache key of stack t.
func keyOf(w *walker, t top) ctxKey {
	var k ctxKey
	k[0] = t.pos
	r := t.rest
	for i := 1; i <= ctxDepth; i++ {
		if r < 0 {
			k[i] = -1
			continue
		}
		f := w.arena[r]
		k[i], r = f.pos, f.parent
	}
	if r >= 0 {
		k[ctxDepth+1] = 1
	}
	return k
}

// NumContexts reports how many contexts the mask cache holds.
func (c *Compiled) NumContexts() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.cache)
}

func (c *Compiled) entry(k ctxKey) *maskEntry {
	c.mu.RLock()
	e := c.cache[k]
	c.mu.RUnlock()
	if e != nil {
		return e
	}
	e = c.computeEntry(k)
	c.mu.Lock()
	if old := c.cache[k]; old != nil {
		e = old
	} else {
		c.cache[k] = e
	}
	c.mu.Unlock()
	return e
}

// computeEntry walks the trie depth-first from context k, advancing a copy
// of the parser state per byte and skipping a subtree as soon as the state
// dies, so shared prefixes are parsed once. A token is accepted when some
// stack consumes it whole (or pops out of the context exactly at its end:
// every deeper continuation is productive); it is uncertain when the only
// stacks that got past a byte popped out of the context before its end.
func (c *Compiled) computeEntry(k ctxKey) *maskEntry {
	w := newWalker(c.g)
	bottom := restEmpty
	if k[ctxDepth+1] == 1 {
		bottom = restSentinel
	}
	for i := ctxDepth; i >= 1; i-- {
		if k[i] < 0 {
			continue
		}
		w.arena = append(w.arena, frame{k[i], bottom})
		bottom = int32(len(w.arena) - 1)
	}
	w.tops = append(w.tops, top{k[0], bottom})
	lv := []level{{0, 1, int32(len(w.arena)), false}}
	unc := []bool{false}
	acc := make([]uint32, c.words)
	nacc := 0
	e := &maskEntry{}
	trie := c.trie
	for i := int32(1); i < int32(len(trie)); {
		nd := &trie[i]
		d := int(nd.depth)
		p := lv[d-1]
		w.tops, w.arena = w.tops[:p.e], w.arena[:p.arena]
		l := w.advance(p, nd.b)
		alive := l.e > l.s
		uncBelow := unc[d-1] || w.boundary
		if nd.t0 >= 0 {
			if alive || w.accept || w.boundary {
				for _, t := range c.trieToks[nd.t0:nd.t1] {
					acc[t>>5] |= 1 << (t & 31)
					nacc++
				}
			} else if unc[d-1] {
				e.uncertain = append(e.uncertain, c.trieToks[nd.t0:nd.t1]...)
			}
		}
		if alive {
			lv = append(lv[:d], l)
			unc = append(unc[:d], uncBelow)
			i++
			continue
		}
		if uncBelow {
			for j := i + 1; j < nd.end; j++ {
				if trie[j].t0 >= 0 {
					e.uncertain = append(e.uncertain, c.trieToks[trie[j].t0:trie[j].t1]...)
				}
			}
		}
		i = nd.end
	}
	if nacc <= c.words/2 {
		for wi, x := range acc {
			for x != 0 {
				b := bits.TrailingZeros32(x)
				e.ids = append(e.ids, int32(wi*32+b))
				x &= x - 1
			}
		}
	} else {
		e.bits = acc
	}
	return e
}
