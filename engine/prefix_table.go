package engine

// prefixTable maps block hashes to block ids: open addressing with linear
// probing over a power-of-two array kept at most half full, and
// backward-shift deletion (no tombstones). A lookup or insert touches
// usually one cache line, where a Go map touches several; the prefix cache
// does one per block filled, so this is on the decode path.
type prefixTable struct {
	slots []prefixSlot
	mask  uint64
	n     int
}

type prefixSlot struct {
	hash  uint64
	block int32 // -1: empty
}

// newPrefixTable returns a table for up to capacity entries.
func newPrefixTable(capacity int) prefixTable {
	size := 8
	for size < 2*capacity {
		size *= 2
	}
	t := prefixTable{slots: make([]prefixSlot, size), mask: uint64(size - 1)}
	for i := range t.slots {
		t.slots[i].block = -1
	}
	return t
}

// home returns h's first probe index (the chained block hash is already
// mixed; folding high bits in guards against weak low bits).
func (t *prefixTable) home(h uint64) uint64 { return (h ^ h>>29) & t.mask }

// get returns the block stored under h, or -1.
func (t *prefixTable) get(h uint64) int32 {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.block < 0 {
			return -1
		}
		if s.hash == h {
			return s.block
		}
	}
}

// insert stores block under h unless h is present; it reports whether it
// stored. The table never fills: it holds at most one entry per block.
func (t *prefixTable) insert(h uint64, block int32) bool {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.block < 0 {
			s.hash, s.block = h, block
			t.n++
			return true
		}
		if s.hash == h {
			return false
		}
	}
}

// remove deletes h if it maps to block, shifting later entries of the
// probe run back so that lookups need no tombstones.
func (t *prefixTable) remove(h uint64, block int32) {
	i := t.home(h)
	for {
		s := &t.slots[i]
		if s.block < 0 {
			return
		}
		if s.hash == h {
			if s.block != block {
				return
			}
			break
		}
		i = (i + 1) & t.mask
	}
	t.n--
	for j := (i + 1) & t.mask; ; j = (j + 1) & t.mask {
		s := &t.slots[j]
		if s.block < 0 {
			break
		}
		// An entry may move back to i when its home is not within (i, j].
		k := t.home(s.hash)
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.slots[i] = *s
			i = j
		}
	}
	t.slots[i] = prefixSlot{block: -1}
}

// each calls f for every entry (tests).
func (t *prefixTable) each(f func(h uint64, block int32)) {
	for _, s := range t.slots {
		if s.block >= 0 {
			f(s.hash, s.block)
		}
	}
}
