package grammar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// exitRec is a token that left a walked context before its end, after off
// bytes: whether it is allowed depends on the frames below the context.
type exitRec struct {
	tok int32
	off uint16
}

type trieNode struct {
	b      byte
	depth  uint16
	t0, t1 int32 // tokens ending here: trieToks[t0:t1]; t0 < 0: none
	end    int32 // index after this node's subtree (preorder)
}

// Compiled is a Grammar bound to a Vocab: the vocabulary's byte trie and
// shared mask entries (both held by the Vocab, for every grammar compiled
// against it) and a cache of per-context token masks. It is safe for
// concurrent use and shared by matchers; the caches fill lazily (under
// locks) as contexts are met.
type Compiled struct {
	g *Grammar
	v *Vocab
	*vocabIndex

	mu    sync.RWMutex
	cache map[ctxKey]*maskEntry

	classID  []uint32  // per class of g: its Vocab-wide number (see classIDs)
	sigPool  sync.Pool // *sigScratch
	walkPool sync.Pool // *walkScratch
}

// vocabIndex is what a grammar's compilation needs of the vocabulary
// alone: its byte trie (tokens sorted by bytes; identical byte strings
// share a node) and its eos ids. Built once per Vocab.
type vocabIndex struct {
	words    int // len of a mask
	trie     []trieNode
	trieToks []int32
	isEOS    []bool
	rank     []int32 // per token: its index in trieToks (byte order); -1: none
	maxTok   int     // the longest token, in bytes
	// Per trie node: the bytes of its subtree (its own included), and
	// where its subtree's tokens start in trieToks (tokStart[len(trie)] is
	// len(trieToks)): the tokens below node i are
	// trieToks[tokStart[i]:tokStart[trie[i].end]].
	subBytes []byteSet
	tokStart []int32
	shared   *sharedCache

	classMu  sync.Mutex
	classNum map[byteSet]uint32 // every byte class met, numbered
}

// classIDs numbers g's byte classes Vocab-wide (equal sets, equal
// numbers), so that signatures name a class in a few bytes.
func (x *vocabIndex) classIDs(g *Grammar) []uint32 {
	ids := make([]uint32, len(g.classes))
	x.classMu.Lock()
	defer x.classMu.Unlock()
	for i, cl := range g.classes {
		id, ok := x.classNum[cl]
		if !ok {
			id = uint32(len(x.classNum))
			x.classNum[cl] = id
		}
		ids[i] = id
	}
	return ids
}

// Compile binds g to v and computes the mask entries of the start state.
// The vocabulary's byte trie is built by the first Compile against v and
// shared by the later ones (O(V log V) once, about 60 ms for a 128k
// vocabulary). Cost: one trie walk per start context, or none when an
// earlier grammar compiled against v met the same context (see
// Vocab.NumSharedContexts); later contexts are computed on first use (a
// trie walk of up to a few milliseconds for a 128k vocabulary when the
// context allows most tokens, as inside a JSON string, unless shared).
func Compile(g *Grammar, v *Vocab) (*Compiled, error) {
	return CompileWith(g, v, CompileOptions{})
}

// CompileOptions bound the work of CompileWith.
type CompileOptions struct {
	// Context stops the compilation when it ends (checked every few
	// thousand parser steps inside the trie walks); nil: never.
	Context context.Context
	// MaxSteps bounds the parser steps (one per parser stack advanced by
	// one byte) spent on the start state's trie walks; 0: no bound.
	MaxSteps int64
}

// ErrBudget is wrapped by the error of a compilation that ran past
// CompileOptions.MaxSteps.
var ErrBudget = errors.New("grammar: work budget exceeded")

// CompileContext is Compile that fails with an error wrapping ctx.Err()
// when ctx ends before the start state's masks are computed; a
// pathological grammar (a huge alternation, a heavily ambiguous one) then
// fails within the caller's deadline.
func CompileContext(ctx context.Context, g *Grammar, v *Vocab) (*Compiled, error) {
	return CompileWith(g, v, CompileOptions{Context: ctx})
}

// CompileWith is Compile with a deadline and a work budget (see
// CompileOptions).
func CompileWith(g *Grammar, v *Vocab, o CompileOptions) (*Compiled, error) {
	if g == nil || v == nil {
		return nil, errors.New("grammar: Compile needs a grammar and a vocabulary")
	}
	b := &budget{ctx: o.Context, max: o.MaxSteps}
	if err := b.check(); err != nil {
		return nil, err
	}
	idx, err := v.index()
	if err != nil {
		return nil, err
	}
	c := &Compiled{g: g, v: v, vocabIndex: idx, cache: make(map[ctxKey]*maskEntry), classID: idx.classIDs(g)}
	// Warm the cache for the start state.
	w := newWalker(g)
	l := w.initial(g.start)
	for i := l.s; i < l.e; i++ {
		if _, err := c.entryB(keyOf(w, w.tops[i]), b); err != nil {
			return nil, err
		}
		if err := b.check(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// budget bounds a compilation's trie walks; a nil *budget is unbounded.
type budget struct {
	ctx   context.Context
	max   int64
	steps int64
	tick  int64
}

// add counts n parser steps; it reports an error once the budget is spent
// or the context has ended (checked every 4096 steps).
func (b *budget) add(n int64) error {
	if b == nil {
		return nil
	}
	b.steps += n
	b.tick += n
	if b.max > 0 && b.steps > b.max {
		return fmt.Errorf("%w (%d parser steps)", ErrBudget, b.max)
	}
	if b.tick >= 4096 {
		b.tick = 0
		return b.check()
	}
	return nil
}

func (b *budget) check() error {
	if b == nil || b.ctx == nil {
		return nil
	}
	if err := b.ctx.Err(); err != nil {
		return fmt.Errorf("grammar: compile: %w", err)
	}
	return nil
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
		c.maxTok = max(c.maxTok, len(b))
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
	c.subBytes = make([]byteSet, len(c.trie))
	c.tokStart = make([]int32, len(c.trie)+1)
	cnt := int32(0)
	for i := range c.trie {
		c.tokStart[i] = cnt
		if nd := c.trie[i]; nd.t0 >= 0 {
			cnt += nd.t1 - nd.t0
		}
	}
	c.tokStart[len(c.trie)] = cnt
	parent := make([]int32, len(c.trie))
	stack := []int32{0}
	for i := 1; i < len(c.trie); i++ {
		for c.trie[stack[len(stack)-1]].end <= int32(i) {
			stack = stack[:len(stack)-1]
		}
		parent[i] = stack[len(stack)-1]
		stack = append(stack, int32(i))
	}
	for i := len(c.trie) - 1; i >= 1; i-- {
		s := &c.subBytes[i]
		s.add(c.trie[i].b, c.trie[i].b)
		p := &c.subBytes[parent[i]]
		for w := range s {
			p[w] |= s[w]
		}
	}
	c.rank = make([]int32, n)
	for i := range c.rank {
		c.rank[i] = -1
	}
	for i, t := range c.trieToks {
		c.rank[t] = int32(i)
	}
	c.shared = newSharedCache(defaultSharedCacheBytes)
	c.classNum = make(map[byteSet]uint32)
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
	e, _ := c.entryB(k, nil) // unbounded: cannot fail
	return e
}

// entryB returns the cache entry of k, computing it within b on a miss.
func (c *Compiled) entryB(k ctxKey, b *budget) (*maskEntry, error) {
	c.mu.RLock()
	e := c.cache[k]
	c.mu.RUnlock()
	if e != nil {
		return e, nil
	}
	e, err := c.computeEntry(k, b)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if old := c.cache[k]; old != nil {
		e = old
	} else {
		c.cache[k] = e
	}
	c.mu.Unlock()
	return e, nil
}
