package tokenizer

import (
	"fmt"
	"sync"
	"unicode/utf8"
)

// bpe is the BPE model: a vocabulary, ranked merges and the rules for
// characters missing from the vocabulary (byte_fallback, unk_token).
//
// In byte-level mode the pre-tokenizer's byte-to-rune mapping is folded into
// the model: pieces arrive as raw bytes and the vocabulary is also keyed by
// raw bytes, so no mapped copy of the text is ever built.
type bpe struct {
	vocab  map[string]int32 // token (as in tokenizer.json) -> id
	tokens []string         // id -> token; "" where the id is unused
	merges map[uint64]uint64

	byteLevel  bool
	fastBytes  bool             // byte-level, no affixes, every byte has a token
	rawVocab   map[string]int32 // byte-level mode: raw bytes -> id
	singleByte [256]int32       // byte-level mode: id of each single byte, -1 if none

	byteFallback   bool
	fallbackIDs    [256]int32 // <0xXX> ids, -1 if absent
	unkID          int32      // -1 when there is no unk token
	fuseUnk        bool
	ignoreMerges   bool
	subwordPrefix  string
	wordSuffix     string
	hasAffixes     bool
	maxCachedPiece int
	// maxPieceBytes bounds the bytes of a pre-token piece one token can
	// cover, so a piece of n bytes needs at least ceil(n/maxPieceBytes) ids;
	// 0 when there is none (unknown characters dropped or fused into one unk).
	maxPieceBytes int

	cache pieceCache
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// symbol is one live or dead part of a word being merged; the parts form a
// doubly linked list over a slice so that a merge is O(1).
type symbol struct {
	id         int32
	prev, next int32
	dead       bool
}

// mergeCand is a candidate merge of the symbol at pos with its successor.
type mergeCand struct {
	rank  uint32
	pos   int32
	newID int32
}

// scratch holds the buffers of one encode call so that the merge loop does not
// allocate; scratches are pooled.
type scratch struct {
	syms   []symbol
	heap   []mergeCand
	ranges []int
	pieces []piece
	next   []piece
	ids    []int32
	segs   []segment
	segs2  []segment
}

func (m *bpe) tokenSize() int { return len(m.tokens) }

// tokenize appends the ids of one pre-token piece to dst.
func (m *bpe) tokenize(dst []int32, s string, sc *scratch) []int32 {
	if s == "" {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.lookupWhole(s); ok {
			return append(dst, id)
		}
	}
	cacheable := len(s) <= m.maxCachedPiece
	if cacheable {
		if ids, ok := m.cache.get(s); ok {
			return append(dst, ids...)
		}
	}
	start := len(dst)
	if m.fastBytes {
		dst = m.mergeBytes(dst, s, sc)
	} else {
		dst = m.mergeChars(dst, s, sc)
	}
	if cacheable {
		m.cache.put(s, dst[start:])
	}
	return dst
}

func (m *bpe) lookupWhole(s string) (int32, bool) {
	if m.byteLevel {
		id, ok := m.rawVocab[s]
		return id, ok
	}
	id, ok := m.vocab[s]
	return id, ok
}

// mergeBytes is the byte-level path: one initial symbol per byte.
func (m *bpe) mergeBytes(dst []int32, s string, sc *scratch) []int32 {
	syms := sc.syms[:0]
	for i := 0; i < len(s); i++ {
		syms = append(syms, symbol{id: m.singleByte[s[i]]})
	}
	sc.syms = syms
	return m.mergeAll(dst, sc)
}

// mergeChars is the general path: one initial symbol per character, with the
// continuing-subword prefix and end-of-word suffix, byte fallback and unk.
func (m *bpe) mergeChars(dst []int32, s string, sc *scratch) []int32 {
	syms := sc.syms[:0]
	unk := false // a pending unk symbol is the last of syms
	var buf []byte
	for i := 0; i < len(s); {
		var ch string
		var n int
		if m.byteLevel {
			// Each raw byte is one character of the byte-level string.
			ch, n = byteLevelRunes.str[s[i]], 1
		} else {
			_, n = utf8.DecodeRuneInString(s[i:])
			ch = s[i : i+n]
		}
		key := ch
		if m.hasAffixes {
			buf = buf[:0]
			if i > 0 {
				buf = append(buf, m.subwordPrefix...)
			}
			buf = append(buf, ch...)
			if i+n == len(s) {
				buf = append(buf, m.wordSuffix...)
			}
			key = string(buf)
		}
		i += n
		if id, ok := m.vocab[key]; ok {
			syms = append(syms, symbol{id: id})
			unk = false
			continue
		}
		if m.byteFallback {
			ok := true
			for k := 0; k < len(key); k++ {
				if m.fallbackIDs[key[k]] < 0 {
					ok = false
					break
				}
			}
			if ok {
				for k := 0; k < len(key); k++ {
					syms = append(syms, symbol{id: m.fallbackIDs[key[k]]})
				}
				unk = false
				continue
			}
		}
		if m.unkID >= 0 {
			if unk && m.fuseUnk {
				continue
			}
			syms = append(syms, symbol{id: m.unkID})
			unk = true
		}
	}
	sc.syms = syms
	return m.mergeAll(dst, sc)
}

// mergeAll applies the merges to sc.syms, lowest rank first and leftmost first
// among equal ranks (the order of HF's binary heap), and appends the result.
// Cost: O(n log n) for n initial symbols; no allocation once the scratch
// buffers have grown.
func (m *bpe) mergeAll(dst []int32, sc *scratch) []int32 {
	syms := sc.syms
	n := len(syms)
	if n == 0 {
		return dst
	}
	for i := range syms {
		syms[i].prev = int32(i - 1)
		syms[i].next = int32(i + 1)
		syms[i].dead = false
	}
	syms[n-1].next = -1
	h := sc.heap[:0]
	for i := 0; i+1 < n; i++ {
		if v, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = heapPush(h, mergeCand{rank: uint32(v >> 32), pos: int32(i), newID: int32(uint32(v))})
		}
	}
	for len(h) > 0 {
		var top mergeCand
		h, top = heapPop(h)
		cur := &syms[top.pos]
		if cur.dead || cur.next < 0 {
			continue
		}
		right := syms[cur.next]
		v, ok := m.merges[pairKey(cur.id, right.id)]
		if !ok || int32(uint32(v)) != top.newID {
			continue // stale candidate
		}
		cur.id = top.newID
		syms[cur.next].dead = true
		cur.next = right.next
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if v, ok := m.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
				h = heapPush(h, mergeCand{rank: uint32(v >> 32), pos: cur.prev, newID: int32(uint32(v))})
			}
		}
		if cur.next >= 0 {
			if v, ok := m.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				h = heapPush(h, mergeCand{rank: uint32(v >> 32), pos: top.pos, newID: int32(uint32(v))})
			}
		}
	}
	sc.heap = h
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

func candLess(a, b mergeCand) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

func heapPush(h []mergeCand, c mergeCand) []mergeCand {
	h = append(h, c)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !candLess(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeCand) ([]mergeCand, mergeCand) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		s := l
		if r := l + 1; r < len(h) && candLess(h[r], h[l]) {
			s = r
		}
		if !candLess(h[s], h[i]) {
			break
		}
		h[i], h[s] = h[s], h[i]
		i = s
	}
	return h, top
}

// pieceCache maps a pre-token piece to its ids. It is sharded to keep lock
// contention low under concurrent encodes and stops growing at its capacity
// (as HF's cache does) rather than evicting.
type pieceCache struct {
	shards [cacheShards]cacheShard
}

const (
	cacheShards        = 16
	cacheEntriesPerShd = 1 << 13 // 131072 pieces in all
)

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]int32
}

func cacheHash(s string) uint32 {
	// FNV-1a over at most 32 bytes: cheap and spreads short pieces well.
	h := uint32(2166136261)
	n := len(s)
	if n > 32 {
		n = 32
	}
	for i := 0; i < n; i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

func (c *pieceCache) get(s string) ([]int32, bool) {
	sh := &c.shards[cacheHash(s)%cacheShards]
	sh.mu.RLock()
	ids, ok := sh.m[s]
	sh.mu.RUnlock()
	return ids, ok
}

func (c *pieceCache) put(s string, ids []int32) {
	sh := &c.shards[cacheHash(s)%cacheShards]
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[string][]int32)
	}
	if len(sh.m) < cacheEntriesPerShd {
		if _, ok := sh.m[s]; !ok {
			sh.m[s] = append([]int32(nil), ids...)
		}
	}
	sh.mu.Unlock()
}

// newBPE builds the model from tokenizer.json's "model" object.
func newBPE(spec *modelSpec) (*bpe, error) {
	m := &bpe{
		vocab:          spec.Vocab,
		merges:         make(map[uint64]uint64, len(spec.Merges)),
		unkID:          -1,
		fuseUnk:        spec.FuseUnk,
		byteFallback:   spec.ByteFallback,
		ignoreMerges:   spec.IgnoreMerges,
		maxCachedPiece: 256,
	}
	if spec.Dropout != nil && *spec.Dropout != 0 {
		return nil, fmt.Errorf("%w: BPE dropout %v", ErrUnsupported, *spec.Dropout)
	}
	if spec.ContinuingSubwordPrefix != nil {
		m.subwordPrefix = *spec.ContinuingSubwordPrefix
	}
	if spec.EndOfWordSuffix != nil {
		m.wordSuffix = *spec.EndOfWordSuffix
	}
	m.hasAffixes = m.subwordPrefix != "" || m.wordSuffix != ""
	maxID := int32(-1)
	if m.vocab == nil {
		m.vocab = map[string]int32{}
	}
	for tok, id := range m.vocab {
		if id < 0 {
			return nil, fmt.Errorf("vocab: token %q: negative id %d", tok, id)
		}
		if id > maxID {
			maxID = id
		}
	}
	m.tokens = make([]string, maxID+1)
	for tok, id := range m.vocab {
		m.tokens[id] = tok
	}
	for i, mg := range spec.Merges {
		a, ok := m.vocab[mg[0]]
		if !ok {
			return nil, fmt.Errorf("merge %d: token %q not in vocab", i, mg[0])
		}
		b, ok := m.vocab[mg[1]]
		if !ok {
			return nil, fmt.Errorf("merge %d: token %q not in vocab", i, mg[1])
		}
		right := mg[1]
		if m.subwordPrefix != "" && len(right) >= len(m.subwordPrefix) && right[:len(m.subwordPrefix)] == m.subwordPrefix {
			right = right[len(m.subwordPrefix):]
		}
		merged, ok := m.vocab[mg[0]+right]
		if !ok {
			return nil, fmt.Errorf("merge %d: merged token %q not in vocab", i, mg[0]+right)
		}
		// A repeated pair keeps its last rank, as HF's map insertion does.
		m.merges[pairKey(a, b)] = uint64(uint32(i))<<32 | uint64(uint32(merged))
	}
	if spec.UnkToken != nil {
		id, ok := m.vocab[*spec.UnkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q not in vocab", *spec.UnkToken)
		}
		m.unkID = id
	}
	for b := 0; b < 256; b++ {
		m.fallbackIDs[b] = -1
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.fallbackIDs[b] = id
		}
	}
	return m, nil
}

// setByteLevel switches the model to raw-byte input (the pre-tokenizer ends
// with ByteLevel): tokens are re-keyed by the bytes they stand for.
func (m *bpe) setByteLevel() {
	m.byteLevel = true
	m.rawVocab = make(map[string]int32, len(m.vocab))
	for tok, id := range m.vocab {
		if b, ok := byteLevelRunes.bytesOf(tok); ok {
			m.rawVocab[string(b)] = id
		}
	}
	m.fastBytes = !m.hasAffixes
	for b := 0; b < 256; b++ {
		m.singleByte[b] = -1
		if id, ok := m.vocab[byteLevelRunes.str[b]]; ok {
			m.singleByte[b] = id
		} else {
			m.fastBytes = false
		}
	}
}
