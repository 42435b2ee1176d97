package grammar

import (
	"bytes"
	"encoding/binary"
	"slices"
	"sync"
)

// Shared mask entries. A context's first use costs a trie walk, tens of
// milliseconds for a 128k vocabulary inside a JSON string, and JSON
// grammars compiled from different schemas meet the same lexical contexts
// (string contents, numbers, keys) over and over. So the walk covers only
// the innermost frames of the context, up to the first named rule that
// loops (for a JSON string: the character class, the repetition helper and
// the string rule's closing quote), and its result is cached in the Vocab,
// keyed by the structure of that grammar fragment (the rest of each frame's
// alternative and every rule reachable from them, rules renumbered in order
// of appearance), so every grammar compiled against the Vocab shares it.
// The walk over a truncated context records the tokens that leave it
// before their end and where (the exits: for a string, tokens such as
// `abc",`); the Compiled's own entry for the full context (ctxDepth frames)
// is derived by parsing those exits' remaining bytes from the frames below,
// once per distinct remainder (a few hundred, most dead after one byte).

// sigCap bounds a signature, in grammar elements; a context whose fragment
// is larger is walked by its Compiled alone (such contexts are mostly
// schema-specific, and cheap: few tokens fit).
const sigCap = 1024

// defaultSharedCacheBytes bounds a Vocab's shared entries; past it, entries
// are dropped (arbitrary ones) down to three quarters.
const defaultSharedCacheBytes = 256 << 20

// walkResult is a trie walk from a (possibly truncated) context.
type walkResult struct {
	bits  []uint32  // accepted tokens, dense
	ids   []int32   // or sparse
	unc   []int32   // tokens that left the context before their end, in byte order
	exits []exitRec // the same with where they left, sorted by remaining bytes
	size  int64     // bytes held, for the cache bound
}

type sharedEntry struct {
	done chan struct{}
	res  *walkResult
	err  error
}

type sharedCache struct {
	mu    sync.Mutex
	m     map[string]*sharedEntry
	bytes int64
	limit int64
}

func newSharedCache(limit int64) *sharedCache {
	return &sharedCache{m: make(map[string]*sharedEntry), limit: limit}
}

// get returns the entry for key, computing it once (concurrent callers
// wait for the first); a failed computation (budget, context) is not
// cached.
func (s *sharedCache) get(key string, compute func() (*walkResult, error)) (*walkResult, error) {
	for {
		s.mu.Lock()
		e := s.m[key]
		if e == nil {
			e = &sharedEntry{done: make(chan struct{})}
			s.m[key] = e
			s.mu.Unlock()
			e.res, e.err = compute()
			s.mu.Lock()
			if e.err != nil {
				if s.m[key] == e {
					delete(s.m, key)
				}
			} else if s.m[key] == e {
				s.bytes += e.res.size + int64(len(key))
				if s.bytes > s.limit {
					s.evict(key)
				}
			}
			close(e.done)
			s.mu.Unlock()
			return e.res, e.err
		}
		s.mu.Unlock()
		<-e.done
		if e.err == nil {
			return e.res, nil
		}
		// The computing caller ran out of its own budget: try ourselves.
	}
}

// evict drops finished entries other than keep until the cache is under
// three quarters of its limit. s.mu must be held.
func (s *sharedCache) evict(keep string) {
	for k, e := range s.m {
		if s.bytes <= s.limit/4*3 {
			return
		}
		if k == keep || e.res == nil {
			continue
		}
		select {
		case <-e.done:
		default:
			continue
		}
		s.bytes -= e.res.size + int64(len(k))
		delete(s.m, k)
	}
}

// len reports the number of entries.
func (s *sharedCache) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// NumSharedContexts reports how many context entries v's shared mask cache
// holds (filled by every grammar compiled against v).
func (v *Vocab) NumSharedContexts() int {
	if idx, err := v.index(); err == nil {
		return idx.shared.len()
	}
	return 0
}

// sharedDepth returns the index in k of the last position the shared walk
// covers: frames of generated rules and of small named rules without loops
// are included, up to the first named rule that loops or is big (or the
// key's end).
func (c *Compiled) sharedDepth(k ctxKey) int {
	g := c.g
	for i := 0; i < ctxDepth; i++ {
		if k[i+1] < 0 {
			return i
		}
		r := g.ruleOf[k[i]]
		if !g.helper[r] && (g.loopy[r] || g.big[r]) {
			return i
		}
	}
	return ctxDepth
}

// sigScratch is signature's working memory, pooled per Compiled: per rule
// its shortest distance and its number in the serialization, valid where
// the rule's stamp is the current generation.
type sigScratch struct {
	gen     uint32
	dStamp  []uint32
	dist    []int32
	idStamp []uint32
	id      []uint32
	queue   []int32
	buf     []byte
}

// signature serializes the grammar fragment of positions k[0..d] over
// bottom; "" when it exceeds sigCap elements. Only what a token can reach
// is written: an element that at least maxTok bytes must precede (by the
// rules' minimum lengths) is cut (a bounded repetition's copies past a
// token's length all look alike), so fragments that differ only past that
// share their walk, which cannot tell them apart. Byte classes are written
// as their Vocab-wide numbers (see classIDs).
func (c *Compiled) signature(k ctxKey, d int, bottom int32, wild bool) string {
	g := c.g
	lim := int32(c.maxTok)
	sc, _ := c.sigPool.Get().(*sigScratch)
	if sc == nil || len(sc.dist) != len(g.rules) {
		n := len(g.rules)
		sc = &sigScratch{dStamp: make([]uint32, n), dist: make([]int32, n), idStamp: make([]uint32, n), id: make([]uint32, n)}
	}
	defer c.sigPool.Put(sc)
	sc.gen++
	if sc.gen == 0 { // wrapped: reset the stamps
		clear(sc.dStamp)
		clear(sc.idStamp)
		sc.gen = 1
	}
	gen := sc.gen
	// Shortest distances (bytes before) of the rules the fragment reaches.
	queue := sc.queue[:0]
	work := 0
	relax := func(p, at int32) bool {
		for ; g.elems[p].kind != kEnd && at <= lim; p++ {
			if work++; work > 4*sigCap {
				return false
			}
			e := g.elems[p]
			if e.kind == kTerm {
				at++
				continue
			}
			if sc.dStamp[e.arg] != gen || at < sc.dist[e.arg] {
				sc.dStamp[e.arg] = gen
				sc.dist[e.arg] = at
				queue = append(queue, e.arg)
			}
			at = min(at+g.minLen[e.arg], infLen)
		}
		return true
	}
	var seedAt [ctxDepth + 1]int32
	at := int32(0)
	for i := 0; i <= d; i++ {
		seedAt[i] = at
		if !relax(k[i], at) {
			sc.queue = queue
			return ""
		}
		for p := k[i]; g.elems[p].kind != kEnd && at <= lim; p++ {
			if e := g.elems[p]; e.kind == kTerm {
				at++
			} else {
				at = min(at+g.minLen[e.arg], infLen)
			}
		}
	}
	for qi := 0; qi < len(queue); qi++ {
		r := queue[qi]
		for _, a := range g.rules[r].alts {
			if !relax(a, sc.dist[r]) {
				sc.queue = queue
				return ""
			}
		}
	}
	// Serialize, numbering rules in order of appearance.
	buf := append(sc.buf[:0], byte(d), byte(-bottom))
	if wild {
		buf = append(buf, 'W')
	}
	queue = queue[:0]
	nids := uint32(0)
	n := 0
	emit := func(p, at int32) bool {
		for ; ; p++ {
			e := g.elems[p]
			if n++; n > sigCap {
				return false
			}
			if e.kind == kEnd {
				buf = append(buf, 'E')
				return true
			}
			if at > lim {
				buf = append(buf, 'T') // never reached within a token
				return true
			}
			if e.kind == kTerm {
				at++
				if wild {
					wild = false // the top's class: any byte
					buf = append(buf, 'w')
					continue
				}
				buf = append(buf, 'c')
				buf = binary.AppendUvarint(buf, uint64(c.classID[e.arg]))
				continue
			}
			if sc.idStamp[e.arg] != gen {
				sc.idStamp[e.arg] = gen
				sc.id[e.arg] = nids
				nids++
				queue = append(queue, e.arg)
			}
			buf = append(buf, 'r')
			buf = binary.AppendUvarint(buf, uint64(sc.id[e.arg]))
			at = min(at+g.minLen[e.arg], infLen)
		}
	}
	out := ""
	ok := true
	for i := 0; i <= d && ok; i++ {
		buf = append(buf, '|')
		ok = emit(k[i], seedAt[i])
	}
	for qi := 0; qi < len(queue) && ok; qi++ {
		r := queue[qi]
		alts := g.rules[r].alts
		buf = append(buf, 'R')
		buf = binary.AppendUvarint(buf, uint64(len(alts)))
		for _, a := range alts {
			if ok = emit(a, sc.dist[r]); !ok {
				break
			}
		}
	}
	if ok {
		out = string(buf)
	}
	sc.queue, sc.buf = queue, buf
	return out
}

// computeEntry computes the cache entry of context k: from the shared walk
// of its innermost frames when their fragment is small enough (derived for
// the frames below), else from a walk of the whole key.
func (c *Compiled) computeEntry(k ctxKey, b *budget) (*maskEntry, error) {
	last := ctxDepth // index of the key's last position
	for last > 0 && k[last] < 0 {
		last--
	}
	keyBottom := restEmpty
	if k[ctxDepth+1] == 1 {
		keyBottom = restSentinel
	}
	d := c.sharedDepth(k)
	bottom := keyBottom
	if d < last {
		bottom = restSentinel
	}
	sig := c.signature(k, d, bottom, false)
	if sig == "" {
		r, err := c.walk(k[:last+1], keyBottom, false, b)
		if err != nil {
			return nil, err
		}
		return &maskEntry{bits: r.bits, ids: r.ids, uncertain: r.unc}, nil
	}
	r, err := c.shared.get(sig, func() (*walkResult, error) {
		// A wide top class: narrow the walk of any first byte (shared by
		// every class followed by the same fragment).
		cl := &c.g.classes[c.g.elems[k[0]].arg]
		if cl.count() < wideClass {
			return c.walk(k[:d+1], bottom, false, b)
		}
		wsig := c.signature(k, d, bottom, true)
		if wsig == "" {
			return c.walk(k[:d+1], bottom, false, b)
		}
		w, err := c.shared.get(wsig, func() (*walkResult, error) { return c.walk(k[:d+1], bottom, true, b) })
		if err != nil {
			return nil, err
		}
		return c.firstIn(w, cl), nil
	})
	if err != nil {
		return nil, err
	}
	if d == last {
		return &maskEntry{bits: r.bits, ids: r.ids, uncertain: r.unc}, nil
	}
	return c.derive(k, d, last, keyBottom, r, b)
}

// walk walks the trie depth-first from the context made of positions pos
// (the top, then return frames) over bottom, advancing a copy of the parser
// state per byte and skipping a subtree as soon as the state dies, so
// shared prefixes are parsed once. A token is accepted when some stack
// consumes it whole (or pops past the bottom exactly at its end: every
// deeper continuation is productive); it exits when the only stacks that
// got past some byte popped past the bottom before its end (recorded with
// each such offset).
//
// With wild, the top's class is taken as every byte (the walk of a wide
// class's context is shared by every class followed by the same fragment;
// firstIn narrows it).
func (c *Compiled) walk(pos []int32, bottom int32, wild bool, b *budget) (*walkResult, error) {
	dw := newDFA(c.g)
	lv := []int32{dw.start(pos, bottom)}
	after := int32(-1) // with wild: the state after the top's byte, whatever it is
	if wild {
		after = dw.after(pos, bottom)
	}
	unc := []bool{false}
	var path []uint16 // depths on the current path where a stack popped past the bottom
	sc, _ := c.walkPool.Get().(*walkScratch)
	if sc == nil {
		sc = &walkScratch{}
	}
	defer c.walkPool.Put(sc)
	acc := sc.acc[:0] // accepted tokens (each once: trie nodes are disjoint)
	r := &walkResult{}
	exit := func(toks []int32, maxOff int) {
		for _, t := range toks {
			for _, o := range path {
				if int(o) <= maxOff {
					r.exits = append(r.exits, exitRec{t, o})
				}
			}
			r.unc = append(r.unc, t)
		}
	}
	trie := c.trie
	for i := int32(1); i < int32(len(trie)); {
		nd := &trie[i]
		d := int(nd.depth)
		ps := lv[d-1]
		if d == 1 && wild {
			ps = -1
		} else if dw.loopsOver(ps, &c.subBytes[i]) {
			// Every byte below leads back to the (live) parent state: the
			// whole subtree is accepted.
			acc = append(acc, c.trieToks[c.tokStart[i]:c.tokStart[nd.end]]...)
			if err := b.add(1); err != nil {
				sc.acc = acc
				return nil, err
			}
			i = nd.end
			continue
		}
		for len(path) > 0 && int(path[len(path)-1]) >= d {
			path = path[:len(path)-1]
		}
		if ps >= 0 && !dw.states[ps].live.has(nd.b) {
			// No stack takes the byte: the state dies here.
			if err := b.add(1); err != nil {
				sc.acc = acc
				return nil, err
			}
			if unc[d-1] {
				if nd.t0 >= 0 {
					exit(c.trieToks[nd.t0:nd.t1], d-1)
				}
				for j := i + 1; j < nd.end; j++ {
					if trie[j].t0 >= 0 {
						exit(c.trieToks[trie[j].t0:trie[j].t1], d)
					}
				}
			}
			i = nd.end
			continue
		}
		ns, work := after, 0
		if ps >= 0 {
			ns, work = dw.step(ps, nd.b)
		}
		if err := b.add(int64(work) + 1); err != nil {
			sc.acc = acc
			return nil, err
		}
		st := &dw.states[ns]
		alive := len(st.tops) > 0
		uncBelow := unc[d-1] || st.boundary
		if nd.t0 >= 0 {
			if alive || st.accept || st.boundary {
				acc = append(acc, c.trieToks[nd.t0:nd.t1]...)
			} else if unc[d-1] {
				exit(c.trieToks[nd.t0:nd.t1], d-1)
			}
		}
		if st.boundary {
			path = append(path, uint16(d))
		}
		if alive {
			lv = append(lv[:d], ns)
			unc = append(unc[:d], uncBelow)
			i++
			continue
		}
		if uncBelow {
			for j := i + 1; j < nd.end; j++ {
				if trie[j].t0 >= 0 {
					exit(c.trieToks[trie[j].t0:trie[j].t1], d)
				}
			}
		}
		i = nd.end
	}
	if len(acc) <= c.words/2 {
		r.ids = slices.Clone(acc)
		slices.Sort(r.ids)
	} else {
		r.bits = make([]uint32, c.words)
		for _, t := range acc {
			r.bits[t>>5] |= 1 << (t & 31)
		}
	}
	sc.acc = acc
	toks := c.v.Tokens
	slices.SortFunc(r.exits, func(a, b exitRec) int {
		if x := bytes.Compare(toks[a.tok][a.off:], toks[b.tok][b.off:]); x != 0 {
			return x
		}
		return int(a.tok - b.tok)
	})
	r.size = int64(4*len(r.bits)+4*len(r.ids)+4*len(r.unc)+8*len(r.exits)) + 128
	return r, nil
}

// wideClass is the size (in bytes) from which a context's top class gets
// its walk from the shared walk over any first byte (see firstIn): the
// classes that exclude a few characters from a JSON string's (additional
// property names, whose first character differs from the declared names')
// are each met by one grammar only, but the fragment after them is common.
const wideClass = 64

// firstIn narrows w, a wild walk (the top's class taken as every byte), to
// the tokens whose first byte is in cl: the walk of the same context with
// class cl, since after its first byte a token meets the same state
// whatever the byte. Cost: linear in the tokens whose first byte is in cl
// or in those whose first byte is not, whichever are fewer (for the bits),
// plus w's uncertain tokens and exits.
func (c *Compiled) firstIn(w *walkResult, cl *byteSet) *walkResult {
	toks := c.v.Tokens
	in := func(t int32) bool { return cl.has(toks[t][0]) }
	r := &walkResult{}
	for _, t := range w.unc {
		if in(t) {
			r.unc = append(r.unc, t)
		}
	}
	for _, x := range w.exits {
		if in(x.tok) {
			r.exits = append(r.exits, x)
		}
	}
	if w.bits == nil {
		for _, t := range w.ids {
			if in(t) {
				r.ids = append(r.ids, t)
			}
		}
	} else {
		// The tokens below each first byte are a range of trieToks.
		trie := c.trie
		var inToks, outToks int32
		for j := int32(1); j < int32(len(trie)); j = trie[j].end {
			n := c.tokStart[trie[j].end] - c.tokStart[j]
			if cl.has(trie[j].b) {
				inToks += n
			} else {
				outToks += n
			}
		}
		bits := make([]uint32, c.words)
		if inToks <= outToks {
			for j := int32(1); j < int32(len(trie)); j = trie[j].end {
				if cl.has(trie[j].b) {
					for _, t := range c.trieToks[c.tokStart[j]:c.tokStart[trie[j].end]] {
						bits[t>>5] |= w.bits[t>>5] & (1 << (t & 31))
					}
				}
			}
		} else {
			copy(bits, w.bits)
			for j := int32(1); j < int32(len(trie)); j = trie[j].end {
				if !cl.has(trie[j].b) {
					for _, t := range c.trieToks[c.tokStart[j]:c.tokStart[trie[j].end]] {
						bits[t>>5] &^= 1 << (t & 31)
					}
				}
			}
		}
		r.bits = bits
	}
	r.size = int64(4*len(r.bits)+4*len(r.ids)+4*len(r.unc)+8*len(r.exits)) + 128
	return r
}

// walkScratch is a walk's working memory, pooled per Compiled.
type walkScratch struct {
	acc []int32
}

// derive completes shared walk r of k's positions 0..d with the frames
// d+1..last below them (over keyBottom): an exit is accepted when its
// remaining bytes are accepted from the state that pops into frame d+1,
// and stays uncertain (checked against the real stack at mask time) when
// they pop past keyBottom before their end. Each distinct remainder is
// parsed once, sharing prefixes.
func (c *Compiled) derive(k ctxKey, d, last int, keyBottom int32, r *walkResult, b *budget) (*maskEntry, error) {
	e := &maskEntry{bits: r.bits, ids: r.ids}
	if len(r.exits) == 0 {
		return e, nil
	}
	w := newWalker(c.g)
	rest := keyBottom
	for i := last; i >= d+2; i-- {
		w.arena = append(w.arena, frame{k[i], rest})
		rest = int32(len(w.arena) - 1)
	}
	w.beginStep()
	w.closure(k[d+1], rest)
	lv := []level{{int32(w.topStart), int32(len(w.tops)), int32(len(w.arena)), w.accept}}
	bnd := []bool{w.boundary}
	unc := []bool{w.boundary}
	valid := 0
	var prev []byte
	toks := c.v.Tokens
	var accepted, cand []int32
	for gi := 0; gi < len(r.exits); {
		x := r.exits[gi]
		s := toks[x.tok][x.off:]
		gj := gi + 1
		for gj < len(r.exits) && bytes.Equal(toks[r.exits[gj].tok][r.exits[gj].off:], s) {
			gj++
		}
		dd := min(lcp(prev, s), valid)
		prev = s
		verdict := 0 // 0 rejected, 1 accepted, 2 uncertain
		dead := false
		for i := dd; i < len(s); i++ {
			p := lv[i]
			if p.e == p.s {
				dead, valid = true, i
				if unc[i] {
					verdict = 2
				}
				break
			}
			if err := b.add(int64(p.e - p.s)); err != nil {
				return nil, err
			}
			w.tops, w.arena = w.tops[:p.e], w.arena[:p.arena]
			l := w.advance(p, s[i])
			lv = append(lv[:i+1], l)
			bnd = append(bnd[:i+1], w.boundary)
			unc = append(unc[:i+1], unc[i] || w.boundary)
			valid = i + 1
		}
		if !dead {
			n := len(s)
			switch l := lv[n]; {
			case l.e > l.s || l.accept || bnd[n]:
				verdict = 1
			case unc[n]:
				verdict = 2
			}
		}
		for _, y := range r.exits[gi:gj] {
			switch verdict {
			case 1:
				accepted = append(accepted, y.tok)
			case 2:
				cand = append(cand, y.tok)
			}
		}
		gi = gj
	}
	if len(accepted) > 0 {
		if e.bits != nil {
			e.bits = slices.Clone(e.bits)
			for _, t := range accepted {
				e.bits[t>>5] |= 1 << (t & 31)
			}
		} else {
			e.ids = append(slices.Clip(slices.Clone(e.ids)), accepted...)
		}
	}
	if len(cand) > 0 {
		isAcc := make(map[int32]bool, len(accepted))
		for _, t := range accepted {
			isAcc[t] = true
		}
		rank := c.rank
		slices.SortFunc(cand, func(a, b int32) int { return int(rank[a] - rank[b]) })
		for i, t := range cand {
			if !isAcc[t] && (i == 0 || cand[i-1] != t) {
				e.uncertain = append(e.uncertain, t)
			}
		}
	}
	return e, nil
}
