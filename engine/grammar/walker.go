package grammar

// The matcher's parser state is a set of stacks of a pushdown automaton
// derived from the grammar, as in llama.cpp's grammar sampler: each stack's
// top is a position in some alternative whose next element is a byte class,
// and the frames below are return positions. Stacks are persistent: frames
// live in an append-only arena and point to their parent, so states share
// frames and undoing steps is truncating the arena and the list of tops.

const (
	restEmpty    int32 = -1 // bottom of a real stack: the root rule
	restSentinel int32 = -2 // bottom of a truncated context (mask cache)
)

type frame struct{ pos, parent int32 }

// top is one stack: pos is a kTerm element, rest the arena index of the
// frames below (or restEmpty/restSentinel).
type top struct{ pos, rest int32 }

// level is a parser state: its tops are w.tops[s:e]; arena is the arena
// length that holds its frames; accept says the grammar is complete there.
type level struct {
	s, e   int32
	arena  int32
	accept bool
}

type walker struct {
	elems   []elem
	rules   []rule
	classes []byteSet

	arena []frame
	tops  []top
	// frameAt hash-conses the arena: the index where each (pos, parent)
	// frame was made, valid while it is below len(arena) and holds that
	// frame (truncation leaves stale entries, which the check skips).
	// Equal stacks therefore have equal indices, so the dedup of tops by
	// (pos, rest) merges them: without it, a frame popped and pushed again
	// in a later step got a new index, and ambiguous nested repetitions
	// such as (a+)+ kept a stack per way of splitting the input.
	frameAt map[frame]int32

	// per step
	visited   []top // (rule, rest) pairs expanded in this step
	nodeStart int   // first arena frame made in this step
	topStart  int   // first top made in this step
	accept    bool  // some stack completed the root
	boundary  bool  // some stack popped into restSentinel
}

func newWalker(g *Grammar) *walker {
	return &walker{elems: g.elems, rules: g.rules, classes: g.classes, frameAt: make(map[frame]int32)}
}

func (w *walker) beginStep() {
	w.nodeStart = len(w.arena)
	w.topStart = len(w.tops)
	w.visited = w.visited[:0]
	w.accept, w.boundary = false, false
}

// initial computes the start state (one step with no byte).
func (w *walker) initial(start int32) level {
	w.beginStep()
	w.closure(start, restEmpty)
	return level{int32(w.topStart), int32(len(w.tops)), int32(len(w.arena)), w.accept}
}

// advance appends the state reached from the tops of l by byte b. The caller
// must have truncated tops and arena to l's end. Cost: linear in the number
// of stacks and the closure's size (rule expansions without input).
func (w *walker) advance(l level, b byte) level {
	w.beginStep()
	for i := l.s; i < l.e; i++ {
		t := w.tops[i]
		if w.classes[w.elems[t.pos].arg].has(b) {
			w.closure(t.pos+1, t.rest)
		}
	}
	return level{int32(w.topStart), int32(len(w.tops)), int32(len(w.arena)), w.accept}
}

// intern returns the arena index of frame (pos, parent), making it once:
// a frame made in this step is found by a scan of the step's frames (few),
// an older one through frameAt. Cost: O(frames made this step) plus one
// map lookup.
func (w *walker) intern(pos, parent int32) int32 {
	f := frame{pos, parent}
	for i := w.nodeStart; i < len(w.arena); i++ {
		if w.arena[i] == f {
			return int32(i)
		}
	}
	if i, ok := w.frameAt[f]; ok && int(i) < len(w.arena) && w.arena[i] == f {
		return i
	}
	w.arena = append(w.arena, f)
	i := int32(len(w.arena) - 1)
	w.frameAt[f] = i
	return i
}

// closure adds the stacks reachable from position pos with frames rest
// without consuming input.
func (w *walker) closure(pos, rest int32) {
	for {
		e := w.elems[pos]
		switch e.kind {
		case kEnd:
			switch rest {
			case restEmpty:
				w.accept = true
				return
			case restSentinel:
				w.boundary = true
				return
			}
			f := w.arena[rest]
			pos, rest = f.pos, f.parent
		case kTerm:
			t := top{pos, rest}
			for i := w.topStart; i < len(w.tops); i++ {
				if w.tops[i] == t {
					return
				}
			}
			w.tops = append(w.tops, t)
			return
		default: // kRule
			r2 := rest
			if w.elems[pos+1].kind != kEnd { // not a tail call: keep a return frame
				r2 = w.intern(pos+1, rest)
			}
			v := top{e.arg, r2}
			for _, x := range w.visited {
				if x == v {
					return
				}
			}
			w.visited = append(w.visited, v)
			alts := w.rules[e.arg].alts
			for _, a := range alts[:len(alts)-1] {
				w.closure(a, r2)
			}
			pos, rest = alts[len(alts)-1], r2
		}
	}
}
