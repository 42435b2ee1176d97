package grammar

import (
	"bytes"
	"encoding/binary"
	"math/bits"
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

// signature serializes the grammar fragment of positions k[0..d] over
// bottom; "" when it exceeds sigCap elements. Only what a token can reach
// is written: an element that at least maxTok bytes must precede (by the
// rules' minimum lengths) is cut (a bounded repetition's copies past a
// token's length all look alike), so fragments that differ only past that
// share their walk, which cannot tell them apart.
func (c *Compiled) signature(k ctxKey, d int, bottom int32) string {
	g := c.g
	lim := int32(c.maxTok)
	// Shortest distances (bytes before) of the rules the fragment reaches.
	dist := make(map[int32]int32)
	var queue []int32
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
			if old, ok := dist[e.arg]; !ok || at < old {
				dist[e.arg] = at
				queue = append(queue, e.arg)
			}
			at = min(at+g.minLen[e.arg], infLen)
		}
		return true
	}
	seedAt := make([]int32, d+1)
	at := int32(0)
	for i := 0; i <= d; i++ {
		seedAt[i] = at
		if !relax(k[i], at) {
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
			if !relax(a, dist[r]) {
				return ""
			}
		}
	}
	// Serialize, numbering rules in order of appearance.
	buf := make([]byte, 0, 512)
	buf = append(buf, byte(d), byte(-bottom))
	ids := make(map[int32]uint64)
	queue = queue[:0]
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
				if sb := g.single[e.arg]; sb >= 0 {
					buf = append(buf, 'b', byte(sb))
				} else {
					buf = append(buf, 'c')
					for _, x := range g.classes[e.arg] {
						buf = binary.LittleEndian.AppendUint64(buf, x)
					}
				}
				continue
			}
			id, ok := ids[e.arg]
			if !ok {
				id = uint64(len(ids))
				ids[e.arg] = id
				queue = append(queue, e.arg)
			}
			buf = append(buf, 'r')
			buf = binary.AppendUvarint(buf, id)
			at = min(at+g.minLen[e.arg], infLen)
		}
	}
	for i := 0; i <= d; i++ {
		buf = append(buf, '|')
		if !emit(k[i], seedAt[i]) {
			return ""
		}
	}
	for qi := 0; qi < len(queue); qi++ {
		r := queue[qi]
		alts := g.rules[r].alts
		buf = append(buf, 'R')
		buf = binary.AppendUvarint(buf, uint64(len(alts)))
		for _, a := range alts {
			if !emit(a, dist[r]) {
				return ""
			}
		}
	}
	return string(buf)
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
	sig := c.signature(k, d, bottom)
	if sig == "" {
		r, err := c.walk(k[:last+1], keyBottom, b)
		if err != nil {
			return nil, err
		}
		return &maskEntry{bits: r.bits, ids: r.ids, uncertain: r.unc}, nil
	}
	r, err := c.shared.get(sig, func() (*walkResult, error) { return c.walk(k[:d+1], bottom, b) })
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
func (c *Compiled) walk(pos []int32, bottom int32, b *budget) (*walkResult, error) {
	dw := newDFA(c.g)
	lv := []int32{dw.start(pos, bottom)}
	unc := []bool{false}
	var path []uint16 // depths on the current path where a stack popped past the bottom
	acc := make([]uint32, c.words)
	nacc := 0
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
		if ps := lv[d-1]; dw.loopsOver(ps, &c.subBytes[i]) {
			// Every byte below leads back to the (live) parent state: the
			// whole subtree is accepted.
			for _, t := range c.trieToks[c.tokStart[i]:c.tokStart[nd.end]] {
				acc[t>>5] |= 1 << (t & 31)
				nacc++
			}
			if err := b.add(1); err != nil {
				return nil, err
			}
			i = nd.end
			continue
		}
		ns, work := dw.step(lv[d-1], nd.b)
		if err := b.add(int64(work) + 1); err != nil {
			return nil, err
		}
		for len(path) > 0 && int(path[len(path)-1]) >= d {
			path = path[:len(path)-1]
		}
		st := &dw.states[ns]
		alive := len(st.tops) > 0
		uncBelow := unc[d-1] || st.boundary
		if nd.t0 >= 0 {
			if alive || st.accept || st.boundary {
				for _, t := range c.trieToks[nd.t0:nd.t1] {
					acc[t>>5] |= 1 << (t & 31)
					nacc++
				}
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
	if nacc <= c.words/2 {
		for wi, x := range acc {
			for x != 0 {
				bt := bits.TrailingZeros32(x)
				r.ids = append(r.ids, int32(wi*32+bt))
				x &= x - 1
			}
		}
	} else {
		r.bits = acc
	}
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
