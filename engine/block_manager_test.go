package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var zeroTime time.Time

// newTestSeq returns a sequence with an id, outside any Scheduler.
func newTestSeq(id SeqID, tokens ...int) *Sequence {
	s := NewSequence(fmt.Sprint(id), tokens, DefaultSamplingParams(), zeroTime)
	s.id = id
	return s
}

func seqRange(id SeqID, n int) *Sequence {
	t := make([]int, n)
	for i := range t {
		t[i] = 1 + i
	}
	return newTestSeq(id, t...)
}

func TestBlockManagerAllocateAppendFree(t *testing.T) {
	m, err := NewBlockManager(8, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		numTokens  int
		wantBlocks int
	}{
		{"one token", 1, 1},
		{"one full block", 4, 1},
		{"a block and one", 5, 2},
		{"three full blocks", 12, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seq := seqRange(1, c.numTokens)
			if !m.CanAllocate(seq) {
				t.Fatal("cannot allocate into an empty cache")
			}
			if err := m.Allocate(seq); err != nil {
				t.Fatal(err)
			}
			if len(seq.BlockTable()) != c.wantBlocks || m.NumUsedBlocks() != c.wantBlocks || seq.NumComputedTokens() != 0 {
				t.Fatalf("%d blocks in table, %d used, %d computed; want %d", len(seq.BlockTable()), m.NumUsedBlocks(), seq.NumComputedTokens(), c.wantBlocks)
			}
			if err := m.Allocate(seq); err == nil {
				t.Fatal("second Allocate succeeded")
			}
			// Compute everything, then append one decode slot.
			seq.numComputed = c.numTokens
			copies, err := m.AppendSlots(seq, 1)
			if err != nil || copies != nil {
				t.Fatalf("append: %v, copies %v", err, copies)
			}
			want := m.NumBlocksFor(c.numTokens + 1)
			if len(seq.BlockTable()) != want {
				t.Fatalf("after append: %d blocks, want %d", len(seq.BlockTable()), want)
			}
			if err := m.checkInvariants([]*Sequence{seq}); err != nil {
				t.Fatal(err)
			}
			m.Free(seq)
			if m.NumFreeBlocks() != 8 || seq.BlockTable() != nil && len(seq.BlockTable()) != 0 {
				t.Fatalf("after free: %d free, table %v", m.NumFreeBlocks(), seq.BlockTable())
			}
			if err := m.checkInvariants(nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBlockManagerOutOfBlocks(t *testing.T) {
	m, _ := NewBlockManager(3, 4, true)
	a := seqRange(1, 9) // 3 blocks
	if err := m.Allocate(a); err != nil {
		t.Fatal(err)
	}
	b := seqRange(2, 1)
	if m.CanAllocate(b) {
		t.Fatal("CanAllocate with no free block")
	}
	if err := m.Allocate(b); !errors.Is(err, ErrNoFreeBlocks) || len(b.blockTable) != 0 {
		t.Fatalf("allocate: %v, table %v", err, b.blockTable)
	}
	a.numComputed = 12
	if m.CanAppendSlots(a, 1) {
		t.Fatal("CanAppendSlots with no free block")
	}
	before := slices.Clone(a.blockTable)
	if _, err := m.AppendSlots(a, 1); !errors.Is(err, ErrNoFreeBlocks) || !slices.Equal(a.blockTable, before) {
		t.Fatalf("append: %v, table %v (was %v)", err, a.blockTable, before)
	}
	if err := m.checkInvariants([]*Sequence{a}); err != nil {
		t.Fatal(err)
	}
}

// TestBlockManagerEviction: freed cached blocks stay findable; empty blocks
// are handed out before cached ones, and cached ones least recently freed
// first.
func TestBlockManagerEviction(t *testing.T) {
	m, _ := NewBlockManager(6, 2, true)
	a := newTestSeq(1, 1, 2, 3, 4, 5) // blocks [1 2] [3 4] [5]
	if err := m.Allocate(a); err != nil {
		t.Fatal(err)
	}
	a.numComputed = 5
	m.commit(a, 5)
	tableA := slices.Clone(a.blockTable)
	m.Free(a)
	if m.NumFreeBlocks() != 6 {
		t.Fatalf("%d free", m.NumFreeBlocks())
	}
	// Same prefix: both full blocks hit, though A is gone.
	b := newTestSeq(2, 1, 2, 3, 4, 9)
	if err := m.Allocate(b); err != nil {
		t.Fatal(err)
	}
	if b.NumCachedTokens() != 4 || !slices.Equal(b.blockTable[:2], tableA[:2]) {
		t.Fatalf("cached %d, table %v, A had %v", b.NumCachedTokens(), b.blockTable, tableA)
	}
	if b.blockTable[2] == tableA[0] || b.blockTable[2] == tableA[1] {
		t.Fatalf("fresh block %d evicted a hit", b.blockTable[2])
	}
	m.Free(b)
	// Fill the cache with unrelated sequences: the empty blocks go first,
	// then the cached ones, oldest freed first (A's prefix was freed first
	// block last, so its first block is evicted last).
	c := newTestSeq(3, 7, 7, 7, 7, 7, 7, 7, 7) // 4 blocks
	if err := m.Allocate(c); err != nil {
		t.Fatal(err)
	}
	d := newTestSeq(4, 1, 2, 3) // prefix [1 2] should still be cached
	if err := m.Allocate(d); err != nil {
		t.Fatal(err)
	}
	if d.NumCachedTokens() != 2 || d.blockTable[0] != tableA[0] {
		t.Fatalf("first block of the old prefix evicted too early: cached %d, table %v, A %v, C %v", d.NumCachedTokens(), d.blockTable, tableA, c.blockTable)
	}
	st := m.PrefixCacheStats()
	if st.NumQueryTokens != 5+5+8+3 || st.NumHitTokens != 4+2 {
		t.Fatalf("stats %+v", st)
	}
	if err := m.checkInvariants([]*Sequence{c, d}); err != nil {
		t.Fatal(err)
	}
}

func TestBlockManagerForkCopyOnWrite(t *testing.T) {
	m, _ := NewBlockManager(8, 4, false)
	p := seqRange(1, 6)
	if err := m.Allocate(p); err != nil {
		t.Fatal(err)
	}
	p.numComputed = 6
	c := p.fork(2, 1)
	m.Fork(p, c)
	if !slices.Equal(p.blockTable, c.blockTable) || m.refCount[p.blockTable[0]] != 2 {
		t.Fatalf("fork: %v vs %v", p.blockTable, c.blockTable)
	}
	published := p.BlockTable() // a snapshot handed out before the copy
	want := slices.Clone(published)
	copies, err := m.AppendSlots(p, 1)
	if err != nil || len(copies) != 1 || copies[0].Src != want[1] {
		t.Fatalf("copies %v, %v", copies, err)
	}
	if p.blockTable[1] != copies[0].Dst || p.blockTable[0] != want[0] || !slices.Equal(published, want) {
		t.Fatalf("table %v after copy %v; snapshot %v, want %v", p.blockTable, copies, published, want)
	}
	// The child now owns the old block alone: no copy.
	if copies, err := m.AppendSlots(c, 1); err != nil || copies != nil {
		t.Fatalf("child copies %v, %v", copies, err)
	}
	// Writing a fresh block needs no copy either.
	p.numComputed = 8
	if copies, err := m.AppendSlots(p, 1); err != nil || copies != nil || len(p.blockTable) != 3 {
		t.Fatalf("fresh block: %v, %v, %v", copies, err, p.blockTable)
	}
	if err := m.checkInvariants([]*Sequence{p, c}); err != nil {
		t.Fatal(err)
	}
	m.Free(p)
	m.Free(c)
	if m.NumFreeBlocks() != 8 {
		t.Fatalf("%d free after freeing both", m.NumFreeBlocks())
	}
}

// A sequence decoding to its max_tokens appends blocks into the table it
// got at admission: the table is never reallocated (nor its published
// snapshots touched), so a decode step allocates nothing per sequence.
func TestBlockTableHeadroom(t *testing.T) {
	const bs, prompt, maxTokens = 4, 6, 40
	m, _ := NewBlockManager(64, bs, true)
	params := DefaultSamplingParams()
	params.MaxTokens = maxTokens
	tokens := make([]int, prompt)
	for i := range tokens {
		tokens[i] = 1 + i
	}
	seq := NewSequence("r", tokens, params, zeroTime)
	seq.id = 1
	if err := m.Allocate(seq); err != nil {
		t.Fatal(err)
	}
	first := &seq.blockTable[0]
	published := seq.BlockTable()
	want := slices.Clone(published)
	seq.numComputed = prompt
	for range maxTokens - 1 {
		if _, err := m.AppendSlots(seq, 1); err != nil {
			t.Fatal(err)
		}
		seq.numComputed++
		seq.tokens = append(seq.tokens, 7)
		seq.lastToken = 7
		m.commit(seq, seq.numComputed)
	}
	if got := len(seq.blockTable); got != m.NumBlocksFor(prompt+maxTokens-1) {
		t.Fatalf("%d blocks, want %d", got, m.NumBlocksFor(prompt+maxTokens-1))
	}
	if &seq.blockTable[0] != first {
		t.Fatal("the block table was reallocated while decoding")
	}
	if !slices.Equal(published, want) {
		t.Fatalf("snapshot %v changed, want %v", published, want)
	}
	if err := m.checkInvariants([]*Sequence{seq}); err != nil {
		t.Fatal(err)
	}
}

func TestPrefixTableRandomOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const capacity = 500
	tab := newPrefixTable(capacity)
	ref := map[uint64]int32{}
	for i := range 200000 {
		// Few distinct hashes, some sharing home slots, to stress probing.
		h := uint64(rng.IntN(2*capacity)) * 0x9e3779b97f4a7c15
		if rng.IntN(8) == 0 {
			h = uint64(rng.IntN(16)) << 40 // identical low bits: one long run
		}
		switch op := rng.IntN(3); {
		case op == 0 && len(ref) < capacity:
			b := int32(rng.IntN(capacity))
			_, had := ref[h]
			if got := tab.insert(h, b); got == had {
				t.Fatalf("op %d: insert %x reported %v, present %v", i, h, got, had)
			}
			if !had {
				ref[h] = b
			}
		case op == 1:
			if b, ok := ref[h]; ok {
				tab.remove(h, b+1) // wrong block: no-op
				tab.remove(h, b)
				delete(ref, h)
			}
		default:
			want, ok := ref[h]
			if !ok {
				want = -1
			}
			if got := tab.get(h); got != want {
				t.Fatalf("op %d: get %x = %d, want %d", i, h, got, want)
			}
		}
		if tab.n != len(ref) {
			t.Fatalf("op %d: %d entries, want %d", i, tab.n, len(ref))
		}
	}
	for h, b := range ref {
		if got := tab.get(h); got != b {
			t.Fatalf("final get %x = %d, want %d", h, got, b)
		}
	}
}

func TestSlotMapping(t *testing.T) {
	table := []int{7, 2, 5}
	cases := []struct {
		start, n int
		want     []int
	}{
		{0, 1, []int{28}},
		{0, 4, []int{28, 29, 30, 31}},
		{3, 3, []int{31, 8, 9}},
		{11, 1, []int{23}},
		{5, 0, nil},
	}
	for _, c := range cases {
		got := AppendSlotMapping(nil, table, 4, c.start, c.n)
		if !slices.Equal(got, c.want) {
			t.Errorf("slots [%d, %d): %v, want %v", c.start, c.start+c.n, got, c.want)
		}
		for i, s := range got {
			if Slot(table, 4, c.start+i) != s {
				t.Errorf("Slot(%d) = %d, want %d", c.start+i, Slot(table, 4, c.start+i), s)
			}
		}
	}
}

func ExampleAppendSlotMapping() {
	blockTable := []int{7, 2} // positions 0-3 in block 7, 4-7 in block 2
	fmt.Println(AppendSlotMapping(nil, blockTable, 4, 2, 4))
	// Output: [30 31 8 9]
}

func TestStateManager(t *testing.T) {
	m, err := NewStateManager(2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewStateManager(0); err == nil {
		t.Fatal("zero slots accepted")
	}
	a, b, c := newTestSeq(1), newTestSeq(2), newTestSeq(3)
	if err := m.Allocate(a); err != nil || a.StateSlot() != 0 {
		t.Fatalf("allocate a: %v, slot %d", err, a.StateSlot())
	}
	if err := m.Allocate(a); err == nil {
		t.Fatal("double allocate")
	}
	cp, err := m.Fork(a, b)
	if err != nil || cp != (StateCopy{Src: 0, Dst: 1}) || b.StateSlot() != 1 {
		t.Fatalf("fork: %+v, %v, slot %d", cp, err, b.StateSlot())
	}
	if m.CanAllocate(1) || !errors.Is(m.Allocate(c), ErrNoFreeStateSlots) {
		t.Fatal("allocated beyond capacity")
	}
	if _, err := m.Fork(c, newTestSeq(4)); err == nil {
		t.Fatal("fork from a sequence without a slot")
	}
	m.Free(a)
	m.Free(a) // no-op
	if m.NumFree() != 1 || m.NumUsed() != 1 || a.StateSlot() != -1 {
		t.Fatalf("after free: %d free, %d used, slot %d", m.NumFree(), m.NumUsed(), a.StateSlot())
	}
	if err := m.Allocate(c); err != nil || c.StateSlot() != 0 || !m.owns(0, 3) || m.owns(0, 1) {
		t.Fatalf("reuse: %v, slot %d", err, c.StateSlot())
	}
}
