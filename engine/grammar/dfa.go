package grammar

import (
	"encoding/binary"
	"slices"
)

// dfa runs the parser over canonical states for one trie walk, memoizing
// its steps: frames are interned once per walk (equal frame chains get
// equal ids) and a state (its sorted stacks and flags) is interned too, so
// a state that recurs (the loop of a string's characters after every byte,
// the same partial matches of a pattern) steps each byte once, and a trie
// node costs a table lookup. A lazily determinized parser: the number of
// states is bounded by the trie nodes walked.
type dfa struct {
	elems   []elem
	rules   []rule
	classes []byteSet

	frames  []frame
	frameID map[frame]int32
	states  []dstate
	stateID map[string]int32

	// scratch of one step
	tops     []top
	visited  []top
	accept   bool
	boundary bool
	key      []byte
}

// dstate is a canonical parser state: its stacks (tops with interned
// frames) and whether the step into it completed the root (accept) or
// popped past the walk's bottom (boundary).
type dstate struct {
	tops     []top
	accept   bool
	boundary bool
	live     byteSet // the bytes some stack takes (the others kill the state)
	visits   int32
	few      []dedge     // transitions while visits are few
	next     *[256]int32 // then a table (-1: not computed yet)
	full     bool        // every byte's transition is in next
	self     byteSet     // when full: the bytes that lead back here
}

type dedge struct {
	b  byte
	to int32
}

// tableAfter is the number of distinct transitions from a state after
// which they move to a 256-entry table; fullAfter the number of steps from
// a state after which every byte's transition is computed (so that whole
// trie subtrees that loop on the state can be skipped).
const (
	tableAfter = 8
	fullAfter  = 512
)

func newDFA(g *Grammar) *dfa {
	return &dfa{elems: g.elems, rules: g.rules, classes: g.classes,
		frameID: make(map[frame]int32), stateID: make(map[string]int32)}
}

// start returns the state of the context made of positions pos (the top,
// then return frames) over bottom.
func (d *dfa) start(pos []int32, bottom int32) int32 {
	rest := bottom
	for i := len(pos) - 1; i >= 1; i-- {
		rest = d.intern(pos[i], rest)
	}
	d.tops = append(d.tops[:0], top{pos[0], rest})
	d.accept, d.boundary = false, false
	return d.state()
}

// after returns the state of the context made of positions pos over
// bottom once its top has taken a byte (any byte of its class: the state
// is the same).
func (d *dfa) after(pos []int32, bottom int32) int32 {
	rest := bottom
	for i := len(pos) - 1; i >= 1; i-- {
		rest = d.intern(pos[i], rest)
	}
	d.tops, d.visited = d.tops[:0], d.visited[:0]
	d.accept, d.boundary = false, false
	d.closure(pos[0]+1, rest)
	return d.state()
}

func (d *dfa) intern(pos, parent int32) int32 {
	f := frame{pos, parent}
	if id, ok := d.frameID[f]; ok {
		return id
	}
	id := int32(len(d.frames))
	d.frames = append(d.frames, f)
	d.frameID[f] = id
	return id
}

// state interns the scratch tops and flags.
func (d *dfa) state() int32 {
	slices.SortFunc(d.tops, func(a, b top) int {
		if a.pos != b.pos {
			return int(a.pos - b.pos)
		}
		return int(a.rest - b.rest)
	})
	k := d.key[:0]
	var fl byte
	if d.accept {
		fl |= 1
	}
	if d.boundary {
		fl |= 2
	}
	k = append(k, fl)
	for _, t := range d.tops {
		k = binary.LittleEndian.AppendUint32(k, uint32(t.pos))
		k = binary.LittleEndian.AppendUint32(k, uint32(t.rest))
	}
	d.key = k
	if id, ok := d.stateID[string(k)]; ok {
		return id
	}
	id := int32(len(d.states))
	st := dstate{tops: slices.Clone(d.tops), accept: d.accept, boundary: d.boundary}
	for _, t := range d.tops {
		cl := &d.classes[d.elems[t.pos].arg]
		for w := range cl {
			st.live[w] |= cl[w]
		}
	}
	d.states = append(d.states, st)
	d.stateID[string(k)] = id
	return id
}

// step returns the state after byte b from state s, and the parser work it
// cost (stacks advanced; 0 when memoized).
func (d *dfa) step(s int32, b byte) (int32, int) {
	st := &d.states[s]
	st.visits++
	if st.next != nil {
		if n := st.next[b]; n >= 0 {
			return n, 0
		}
	} else {
		for _, e := range st.few {
			if e.b == b {
				return e.to, 0
			}
		}
	}
	n, work := d.advance(s, b)
	st = &d.states[s] // d.advance may have grown the slice
	if st.next == nil && len(st.few) >= tableAfter {
		st.next = new([256]int32)
		for i := range st.next {
			st.next[i] = -1
		}
		for _, e := range st.few {
			st.next[e.b] = e.to
		}
		st.few = nil
	}
	if st.next != nil {
		st.next[b] = n
	} else {
		st.few = append(st.few, dedge{b, n})
	}
	if !st.full && st.visits > fullAfter {
		work += d.fill(s)
	}
	return n, work
}

// advance computes the state after byte b from state s.
func (d *dfa) advance(s int32, b byte) (int32, int) {
	d.tops, d.visited = d.tops[:0], d.visited[:0]
	d.accept, d.boundary = false, false
	for _, t := range d.states[s].tops {
		if d.classes[d.elems[t.pos].arg].has(b) {
			d.closure(t.pos+1, t.rest)
		}
	}
	return d.state(), len(d.states[s].tops)
}

// fill computes state s's transitions for every byte and its self set; it
// returns the parser work spent.
func (d *dfa) fill(s int32) int {
	st := &d.states[s]
	if st.next == nil {
		st.next = new([256]int32)
		for i := range st.next {
			st.next[i] = -1
		}
		for _, e := range st.few {
			st.next[e.b] = e.to
		}
		st.few = nil
	}
	work := 0
	for b := range 256 {
		if d.states[s].next[b] >= 0 {
			continue
		}
		n, w := d.advance(s, byte(b))
		d.states[s].next[b] = n
		work += w
	}
	st = &d.states[s]
	st.full = true
	for b := range 256 {
		if st.next[b] == s {
			st.self.add(byte(b), byte(b))
		}
	}
	return work
}

// loopsOver reports whether every byte of set leads from state s back to
// s (known once s is full).
func (d *dfa) loopsOver(s int32, set *byteSet) bool {
	st := &d.states[s]
	if !st.full {
		return false
	}
	for w := range set {
		if set[w]&^st.self[w] != 0 {
			return false
		}
	}
	return true
}

// closure is walker.closure over interned frames.
func (d *dfa) closure(pos, rest int32) {
	for {
		e := d.elems[pos]
		switch e.kind {
		case kEnd:
			switch rest {
			case restEmpty:
				d.accept = true
				return
			case restSentinel:
				d.boundary = true
				return
			}
			f := d.frames[rest]
			pos, rest = f.pos, f.parent
		case kTerm:
			t := top{pos, rest}
			for _, x := range d.tops {
				if x == t {
					return
				}
			}
			d.tops = append(d.tops, t)
			return
		default: // kRule
			r2 := rest
			if d.elems[pos+1].kind != kEnd {
				r2 = d.intern(pos+1, rest)
			}
			v := top{e.arg, r2}
			for _, x := range d.visited {
				if x == v {
					return
				}
			}
			d.visited = append(d.visited, v)
			alts := d.rules[e.arg].alts
			for _, a := range alts[:len(alts)-1] {
				d.closure(a, r2)
			}
			pos, rest = alts[len(alts)-1], r2
		}
	}
}
