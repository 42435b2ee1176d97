package engine

import (
	"errors"
	"fmt"
)

// ErrNoFreeBlocks is returned when the KV cache has too few free blocks.
var ErrNoFreeBlocks = errors.New("no free KV blocks")

// BlockCopy asks the forward pass to copy KV block Src into block Dst (in
// every layer) before it writes this step's slots: the copy-on-write of a
// block shared by forked sequences.
type BlockCopy struct{ Src, Dst int }

// PrefixCacheStats counts prefix-cache lookups in tokens.
type PrefixCacheStats struct {
	NumQueryTokens int64 // tokens looked up at admission
	NumHitTokens   int64 // tokens served from the cache
}

// HitRate returns hits / queries (0 with no queries).
func (s PrefixCacheStats) HitRate() float64 {
	if s.NumQueryTokens == 0 {
		return 0
	}
	return float64(s.NumHitTokens) / float64(s.NumQueryTokens)
}

// rootHash is the parent hash of a sequence's first block.
const rootHash uint64 = 0xcbf29ce484222325

// hashBlock chains a block's token ids onto its parent's hash. Collisions
// are harmless: a hit is confirmed by comparing the parent hash and the
// token ids stored with the block.
func hashBlock(parent uint64, tokenIDs []int) uint64 {
	h, _ := hashBlockFits(parent, tokenIDs)
	return h
}

// hashBlockFits is hashBlock that also reports whether every token id
// fits the cache's int32 copy (a block that does not is hashed, not
// cached), in the same pass over the tokens: a separate pass cost a
// commit about a sixth of its instructions.
func hashBlockFits(parent uint64, tokenIDs []int) (uint64, bool) {
	h := parent ^ 0x9e3779b97f4a7c15
	var wide uint64 // not 0 once a token id does not fit int32
	for _, t := range tokenIDs {
		wide |= uint64(t) ^ uint64(int64(int32(t)))
		h ^= uint64(t)
		h *= 0xbf58476d1ce4e5b9
		h ^= h >> 31
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h, wide == 0
}

// BlockManager hands out fixed-size KV blocks, ref-counted so that forked
// sequences and prefix-cache hits share them.
//
// Prefix caching: a full block whose KV is computed gets a hash chained from
// its parent's (hash of (parent hash, token ids)); a later sequence whose
// leading full blocks have the same hashes reuses those blocks instead of
// recomputing them. A freed block keeps its hash and stays in the cache
// until it is reused (a hit) or evicted: free blocks form one list, empty
// ones at the head (handed out first), cached ones after them in the order
// they were freed (least recently used first), so eviction is LRU.
//
// All operations are O(blocks touched) (lookup and allocation O(tokens)
// for hashing). A BlockManager is not safe for concurrent use; the
// Scheduler serializes access.
type BlockManager struct {
	blockSize     int
	numBlocks     int
	prefixCaching bool

	refCount []int32

	// Free list: doubly linked through prev/next, -1 terminated.
	prev, next []int32
	head, tail int32
	numFree    int

	// Prefix cache (allocated only when enabled).
	hashed      []bool
	hash        []uint64
	parentHash  []uint64
	tokenIDs    []int32 // numBlocks * blockSize: the tokens of each hashed block
	hashToBlock prefixTable
	stats       PrefixCacheStats

	hits []int32 // scratch for lookup
	// commitLater's queue and flushCommits' scratch; touch keeps the
	// values of flushCommits' cache-warming loads.
	queued   []queuedCommit
	toInsert []hashedBlock
	touch    int
}

// NewBlockManager returns a manager of numBlocks blocks of blockSize tokens.
func NewBlockManager(numBlocks, blockSize int, enablePrefixCaching bool) (*BlockManager, error) {
	if numBlocks < 1 || blockSize < 1 {
		return nil, fmt.Errorf("block manager: num_blocks (%d) and block_size (%d) must be >= 1", numBlocks, blockSize)
	}
	m := &BlockManager{
		blockSize:     blockSize,
		numBlocks:     numBlocks,
		prefixCaching: enablePrefixCaching,
		refCount:      make([]int32, numBlocks),
		prev:          make([]int32, numBlocks),
		next:          make([]int32, numBlocks),
		head:          -1,
		tail:          -1,
	}
	for b := range numBlocks {
		m.pushBack(int32(b))
	}
	if enablePrefixCaching {
		m.hashed = make([]bool, numBlocks)
		m.hash = make([]uint64, numBlocks)
		m.parentHash = make([]uint64, numBlocks)
		m.tokenIDs = make([]int32, numBlocks*blockSize)
		m.hashToBlock = newPrefixTable(numBlocks)
	}
	return m, nil
}

// BlockSize returns the tokens per block.
func (m *BlockManager) BlockSize() int { return m.blockSize }

// NumBlocks returns the total number of blocks.
func (m *BlockManager) NumBlocks() int { return m.numBlocks }

// NumFreeBlocks returns the blocks not referenced by any sequence (empty or
// cached-and-evictable).
func (m *BlockManager) NumFreeBlocks() int { return m.numFree }

// NumUsedBlocks returns the blocks referenced by at least one sequence.
func (m *BlockManager) NumUsedBlocks() int { return m.numBlocks - m.numFree }

// Usage returns the fraction of blocks in use.
func (m *BlockManager) Usage() float64 { return float64(m.NumUsedBlocks()) / float64(m.numBlocks) }

// PrefixCacheStats returns the lookup counters.
func (m *BlockManager) PrefixCacheStats() PrefixCacheStats { return m.stats }

// NumBlocksFor returns the blocks needed to hold numTokens tokens.
func (m *BlockManager) NumBlocksFor(numTokens int) int {
	return (numTokens + m.blockSize - 1) / m.blockSize
}

// --- free list ---

func (m *BlockManager) pushBack(b int32) {
	m.prev[b], m.next[b] = m.tail, -1
	if m.tail >= 0 {
		m.next[m.tail] = b
	} else {
		m.head = b
	}
	m.tail = b
	m.numFree++
}

func (m *BlockManager) pushFront(b int32) {
	m.prev[b], m.next[b] = -1, m.head
	if m.head >= 0 {
		m.prev[m.head] = b
	} else {
		m.tail = b
	}
	m.head = b
	m.numFree++
}

func (m *BlockManager) unlink(b int32) {
	p, n := m.prev[b], m.next[b]
	if p >= 0 {
		m.next[p] = n
	} else {
		m.head = n
	}
	if n >= 0 {
		m.prev[n] = p
	} else {
		m.tail = p
	}
	m.prev[b], m.next[b] = -1, -1
	m.numFree--
}

// takeFree pops the head of the free list (evicting its cached content)
// and gives it one reference. The caller checked numFree.
func (m *BlockManager) takeFree() int {
	b := m.head
	m.unlink(b)
	if m.prefixCaching && m.hashed[b] {
		m.hashToBlock.remove(m.hash[b], b)
		m.hashed[b] = false
	}
	m.refCount[b] = 1
	return int(b)
}

// release drops one reference; an unreferenced block joins the free list,
// at the tail when it holds cached content, at the head otherwise.
func (m *BlockManager) release(b int) {
	m.refCount[b]--
	if m.refCount[b] > 0 {
		return
	}
	if m.prefixCaching && m.hashed[b] {
		m.pushBack(int32(b))
	} else {
		m.pushFront(int32(b))
	}
}

// --- allocation ---

// lookup returns the cached blocks that can serve the sequence's leading
// full blocks, in m.hits. At least the last known token is always left to
// compute (its logits are needed), so only blocks wholly before it count.
func (m *BlockManager) lookup(seq *Sequence) []int32 {
	m.hits = m.hits[:0]
	if !m.prefixCaching || seq.params.PromptLogprobs != nil {
		return m.hits
	}
	bs := m.blockSize
	maxHit := (len(seq.tokens) - 1) / bs
	h := rootHash
	for i := range maxHit {
		ids := seq.tokens[i*bs : (i+1)*bs]
		nh := hashBlock(h, ids)
		b := m.hashToBlock.get(nh)
		if b < 0 || m.parentHash[b] != h || !equalTokens(m.tokenIDs[int(b)*bs:(int(b)+1)*bs], ids) {
			break
		}
		m.hits = append(m.hits, b)
		h = nh
	}
	return m.hits
}

// canAllocateWith reports whether the blocks for all known tokens fit,
// given the prefix-cache hits from lookup.
func (m *BlockManager) canAllocateWith(seq *Sequence, hits []int32) bool {
	need := m.NumBlocksFor(len(seq.tokens)) - len(hits)
	free := m.numFree
	for _, b := range hits {
		if m.refCount[b] == 0 {
			free-- // a cached free block leaves the free list when hit
		}
	}
	return free >= need
}

// CanAllocate reports whether Allocate(seq) would succeed now.
// Cost: O(tokens) for the prefix lookup.
func (m *BlockManager) CanAllocate(seq *Sequence) bool {
	return m.canAllocateWith(seq, m.lookup(seq))
}

// Allocate gives a sequence that holds no blocks the blocks for all its
// known tokens (prompt, plus output when recomputing after preemption):
// leading full blocks found in the prefix cache are shared, the rest are
// fresh. It sets the sequence's NumCachedTokens and NumComputedTokens to the
// tokens served from the cache. It fails with ErrNoFreeBlocks, changing
// nothing, when the blocks do not fit. Cost: O(tokens).
func (m *BlockManager) Allocate(seq *Sequence) error {
	return m.allocateWith(seq, m.lookup(seq))
}

func (m *BlockManager) allocateWith(seq *Sequence, hits []int32) error {
	if len(seq.blockTable) != 0 {
		return fmt.Errorf("block manager: allocate seq %d: already holds %d blocks", seq.id, len(seq.blockTable))
	}
	if !m.canAllocateWith(seq, hits) {
		return fmt.Errorf("block manager: allocate seq %d (%d tokens, %d cached blocks, %d free): %w",
			seq.id, len(seq.tokens), len(hits), m.numFree, ErrNoFreeBlocks)
	}
	n := m.NumBlocksFor(len(seq.tokens))
	table := make([]int, 0, n+m.tableHeadroom(seq))
	h := rootHash
	for _, b := range hits {
		if m.refCount[b] == 0 {
			m.unlink(b)
		}
		m.refCount[b]++
		table = append(table, int(b))
		h = m.hash[b]
	}
	for len(table) < n {
		table = append(table, m.takeFree())
	}
	seq.setBlockTable(table)
	seq.numHashedBlocks = int32(len(hits))
	seq.lastHash = h
	seq.numCached = len(hits) * m.blockSize
	seq.numComputed = seq.numCached
	if m.prefixCaching && seq.params.PromptLogprobs == nil {
		m.stats.NumQueryTokens += int64(len(seq.tokens))
		m.stats.NumHitTokens += int64(seq.numCached)
	}
	return nil
}

// tableHeadroom is the block-table capacity reserved past the blocks a
// sequence holds: those of the output it may still produce (as much of it
// as NewSequence reserves token room for), plus a few for draft and
// lookahead slots. Decoding then appends blocks without reallocating the
// table: otherwise every sequence reallocates it every few blocks, dozens
// of allocations per step at thousands of running sequences. Cost: O(1).
func (m *BlockManager) tableHeadroom(seq *Sequence) int {
	out := min(max(int(seq.maxTokens)-seq.NumOutputTokens(), 0), maxTokenReserve)
	return min(m.NumBlocksFor(out)+4, m.numBlocks)
}

// appendNeeds returns the new blocks and the copy-on-write copies needed to
// write positions [NumComputedTokens, NumComputedTokens+n).
func (m *BlockManager) appendNeeds(seq *Sequence, n int) (numNew, numCopies int) {
	end := seq.numComputed + n
	numNew = max(m.NumBlocksFor(end)-len(seq.blockTable), 0)
	if !seq.mayShare {
		return numNew, 0 // only a fork shares blocks that are still written
	}
	for i := seq.numComputed / m.blockSize; i < len(seq.blockTable) && i*m.blockSize < end; i++ {
		if m.mustCopy(seq.blockTable[i]) {
			numCopies++
		}
	}
	return numNew, numCopies
}

// mustCopy reports whether a block about to be written must be copied
// first: it is shared, or its content is in the prefix cache.
func (m *BlockManager) mustCopy(b int) bool {
	return m.refCount[b] > 1 || (m.prefixCaching && m.hashed[b])
}

// CanAppendSlots reports whether AppendSlots(seq, n) would succeed now.
// Cost: O(blocks written), O(1) for a decode step.
func (m *BlockManager) CanAppendSlots(seq *Sequence, n int) bool {
	numNew, numCopies := m.appendNeeds(seq, n)
	return m.numFree >= numNew+numCopies
}

// AppendSlots reserves the KV slots of the sequence's next n positions
// ([NumComputedTokens, NumComputedTokens+n): one for a decode step, k+1 for
// a speculative step), adding blocks as needed. A block in that range that
// is shared (after a fork) is copied first: the sequence gets a fresh block
// and the returned BlockCopy must run before the step's forward pass writes
// it. It fails with ErrNoFreeBlocks, changing nothing, when blocks run out.
// Cost: O(blocks written); no allocation unless a block is copied.
func (m *BlockManager) AppendSlots(seq *Sequence, n int) ([]BlockCopy, error) {
	if len(seq.blockTable) == 0 && seq.numComputed > 0 {
		return nil, fmt.Errorf("block manager: append slots to seq %d: holds no blocks", seq.id)
	}
	numNew, numCopies := m.appendNeeds(seq, n)
	if m.numFree < numNew+numCopies {
		return nil, fmt.Errorf("block manager: append %d slots to seq %d (%d new blocks, %d copies, %d free): %w",
			n, seq.id, numNew, numCopies, m.numFree, ErrNoFreeBlocks)
	}
	var copies []BlockCopy
	if numCopies > 0 {
		// Replace the table instead of editing it: published snapshots of
		// the old table must stay valid.
		table := append(make([]int, 0, len(seq.blockTable)+numNew+m.tableHeadroom(seq)), seq.blockTable...)
		end := seq.numComputed + n
		for i := seq.numComputed / m.blockSize; i < len(table) && i*m.blockSize < end; i++ {
			src := table[i]
			if !m.mustCopy(src) {
				continue
			}
			dst := m.takeFree()
			copies = append(copies, BlockCopy{Src: src, Dst: dst})
			table[i] = dst
			m.release(src)
		}
		seq.setBlockTable(table)
	}
	for range numNew {
		seq.setBlockTable(append(seq.blockTable, m.takeFree()))
	}
	// Every block written from here on is private: the shared ones are
	// behind the fork point, and the one at it was just copied.
	seq.mayShare = false
	return copies, nil
}

// Trim drops the sequence's blocks past the first numTokens positions
// (those a speculative step reserved for drafts that were rejected): they
// were never committed to the prefix cache, and the table is replaced, not
// edited, so snapshots of the old one stay valid. Cost: O(blocks).
func (m *BlockManager) Trim(seq *Sequence, numTokens int) {
	keep := max(m.NumBlocksFor(numTokens), 1)
	if keep >= len(seq.blockTable) {
		return
	}
	table := seq.blockTable
	for i := len(table) - 1; i >= keep; i-- {
		m.release(table[i])
	}
	seq.setBlockTable(append(make([]int, 0, keep+m.tableHeadroom(seq)), table[:keep]...))
}

// Free drops the sequence's references to its blocks, last block first (so
// that a prefix's first blocks are evicted last), and empties its table.
// Cached full blocks stay in the prefix cache. Cost: O(blocks).
func (m *BlockManager) Free(seq *Sequence) {
	for i := len(seq.blockTable) - 1; i >= 0; i-- {
		m.release(seq.blockTable[i])
	}
	seq.setBlockTable(nil)
	seq.numHashedBlocks = 0
	seq.lastHash = 0
	seq.mayShare = false
}

// Fork makes child share every block of parent (one more reference each).
// A shared block is copied when either sequence next writes it (see
// AppendSlots). Cost: O(blocks).
func (m *BlockManager) Fork(parent, child *Sequence) {
	child.setBlockTable(append(make([]int, 0, len(parent.blockTable)+m.tableHeadroom(child)), parent.blockTable...))
	for _, b := range child.blockTable {
		m.refCount[b]++
	}
	child.numHashedBlocks = parent.numHashedBlocks
	child.lastHash = parent.lastHash
	parent.mayShare, child.mayShare = true, true
}

// commit enters the sequence's full blocks that lie wholly before position
// upTo into the prefix cache. It is called once the step that computed them
// has finished, so that a hit never reads KV not yet written. A block whose
// content is already cached under another block id stays private.
// Cost: O(tokens newly covered).
func (m *BlockManager) commit(seq *Sequence, upTo int) {
	m.commitLater(seq, upTo)
	m.flushCommits()
}

// commitLater is commit queued: the caller must call flushCommits before
// any other use of the BlockManager or of the sequence's blocks (the
// queue also flushes itself when full). The common decode step, which
// fills no block, is an inlined comparison.
//
// Why queue: at thousands of running sequences a decode step commits one
// block for every block_size sequences, and each commit misses the cache
// three times, one after the other: the block's tokens (written a step
// or more ago, one page per sequence), then, once they are hashed, the
// prefix table's slot (a random one among thousands of blocks), then the
// block's cached copy. Queued, each kind of miss is taken for the whole
// queue in one tight pass, where they overlap.
func (m *BlockManager) commitLater(seq *Sequence, upTo int) {
	upTo = min(upTo, len(seq.tokens))
	if (int(seq.numHashedBlocks)+1)*m.blockSize <= upTo {
		m.queue(seq, upTo)
	}
}

// queue adds commit(seq, upTo) to commitLater's queue. It stays out of
// line so that commitLater, called for every decoded token, inlines.
//
//go:noinline
func (m *BlockManager) queue(seq *Sequence, upTo int) {
	if !m.prefixCaching || seq.params.PromptLogprobs != nil {
		return // nothing to commit
	}
	if len(m.queued) == maxQueuedCommits {
		m.flushCommits()
	}
	m.queued = append(m.queued, queuedCommit{seq: seq, upTo: upTo})
}

// maxQueuedCommits bounds the commits commitLater queues.
const maxQueuedCommits = 64

// queuedCommit is a commitLater call: commit(seq, upTo).
type queuedCommit struct {
	seq  *Sequence
	upTo int
}

// hashedBlock is a block hashed by flushCommits, before its insert.
type hashedBlock struct {
	hash, parent uint64
	block        int32
	ids          []int // the block's tokens
}

// flushCommits runs the queued commits, in order, as commit would have one
// by one. Cost: O(tokens newly covered).
func (m *BlockManager) flushCommits() {
	if len(m.queued) == 0 {
		return
	}
	bs := m.blockSize
	// Loads whose values only feed touch: they bring each commit's first
	// block into the cache, all of them in flight at once.
	touch := 0
	for _, c := range m.queued {
		if i := int(c.seq.numHashedBlocks); i < len(c.seq.blockTable) {
			touch += c.seq.tokens[i*bs] + c.seq.tokens[i*bs+bs-1] + c.seq.blockTable[i]
		}
	}
	for _, c := range m.queued {
		m.hashBlocks(c.seq, c.upTo)
	}
	clear(m.queued) // drop the sequences
	m.queued = m.queued[:0]
	for k := range m.toInsert {
		touch += int(m.hashToBlock.slots[m.hashToBlock.home(m.toInsert[k].hash)].block)
	}
	for k := range m.toInsert {
		h := &m.toInsert[k]
		b := h.block
		if !m.hashed[b] && m.hashToBlock.insert(h.hash, b) {
			m.hashed[b] = true
			m.hash[b] = h.hash
			m.parentHash[b] = h.parent
			dst := m.tokenIDs[int(b)*bs:][:len(h.ids)] // one bounds check, not one per token
			for j, t := range h.ids {
				dst[j] = int32(t)
			}
		}
	}
	clear(m.toInsert) // drop the token views
	m.toInsert = m.toInsert[:0]
	m.touch = touch
}

// hashBlocks hashes the sequence's full blocks before upTo (<= len(tokens))
// that have none yet, for flushCommits to insert (blocks whose tokens do
// not fit the cache's int32 copy are hashed, not cached). queue checked
// that the sequence's blocks may be cached.
func (m *BlockManager) hashBlocks(seq *Sequence, upTo int) {
	bs := m.blockSize
	for i := int(seq.numHashedBlocks); (i+1)*bs <= upTo && i < len(seq.blockTable); i++ {
		ids := seq.tokens[i*bs : (i+1)*bs : (i+1)*bs]
		h, fits := hashBlockFits(seq.lastHash, ids)
		if fits {
			m.toInsert = append(m.toInsert, hashedBlock{hash: h, parent: seq.lastHash, block: int32(seq.blockTable[i]), ids: ids})
		}
		seq.lastHash = h
		seq.numHashedBlocks = int32(i + 1)
	}
}

// checkInvariants verifies the free list, the reference counts against the
// block tables of the live sequences, and the prefix-cache index. It is
// O(blocks + total table length) and meant for tests.
func (m *BlockManager) checkInvariants(live []*Sequence) error {
	refs := make([]int32, m.numBlocks)
	for _, s := range live {
		if len(s.blockTable) < m.NumBlocksFor(s.numComputed) {
			return fmt.Errorf("seq %d: %d blocks for %d computed tokens", s.id, len(s.blockTable), s.numComputed)
		}
		if len(s.blockTable) > 0 && int(s.lastBlock) != s.blockTable[len(s.blockTable)-1] {
			return fmt.Errorf("seq %d: last block %d, table ends with %d", s.id, s.lastBlock, s.blockTable[len(s.blockTable)-1])
		}
		for _, b := range s.blockTable {
			if b < 0 || b >= m.numBlocks {
				return fmt.Errorf("seq %d: block id %d out of range", s.id, b)
			}
			refs[b]++
		}
	}
	inFree := make([]bool, m.numBlocks)
	n := 0
	last := int32(-1)
	for b := m.head; b >= 0; b = m.next[b] {
		if inFree[b] {
			return fmt.Errorf("free list: block %d twice", b)
		}
		if m.prev[b] != last {
			return fmt.Errorf("free list: block %d prev %d, want %d", b, m.prev[b], last)
		}
		inFree[b] = true
		last = b
		n++
	}
	if last != m.tail {
		return fmt.Errorf("free list: tail %d, walked to %d", m.tail, last)
	}
	if n != m.numFree {
		return fmt.Errorf("free list: %d blocks, numFree %d", n, m.numFree)
	}
	used := 0
	for b := range m.numBlocks {
		if refs[b] != m.refCount[b] {
			return fmt.Errorf("block %d: ref count %d, referenced by %d live tables", b, m.refCount[b], refs[b])
		}
		if (refs[b] == 0) != inFree[b] {
			return fmt.Errorf("block %d: ref count %d, in free list %v", b, refs[b], inFree[b])
		}
		if refs[b] > 0 {
			used++
		}
	}
	if used+m.numFree != m.numBlocks {
		return fmt.Errorf("blocks: %d used + %d free != %d", used, m.numFree, m.numBlocks)
	}
	if m.prefixCaching {
		var err error
		n := 0
		m.hashToBlock.each(func(h uint64, b int32) {
			n++
			if err == nil && (!m.hashed[b] || m.hash[b] != h) {
				err = fmt.Errorf("prefix cache: hash %x maps to block %d holding %x (hashed %v)", h, b, m.hash[b], m.hashed[b])
			}
			if err == nil && m.hashToBlock.get(h) != b {
				err = fmt.Errorf("prefix cache: hash %x of block %d not found by lookup", h, b)
			}
		})
		if err != nil {
			return err
		}
		numHashed := 0
		for b := range m.numBlocks {
			if m.hashed[b] {
				numHashed++
			}
		}
		if n != numHashed || n != m.hashToBlock.n {
			return fmt.Errorf("prefix cache: %d entries (counter %d), %d hashed blocks", n, m.hashToBlock.n, numHashed)
		}
	}
	return nil
}

func equalTokens(a []int32, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if int(a[i]) != b[i] {
			return false
		}
	}
	return true
}

// Slot returns the KV slot of position pos: block_table[pos/block_size] *
// block_size + pos%block_size. The position must be covered by the table.
func Slot(blockTable []int, blockSize, pos int) int {
	return blockTable[pos/blockSize]*blockSize + pos%blockSize
}

// AppendSlotMapping appends the slots of positions [start, start+n) to dst
// and returns it. Cost: O(n).
func AppendSlotMapping(dst, blockTable []int, blockSize, start, n int) []int {
	for pos := start; pos < start+n; pos++ {
		dst = append(dst, blockTable[pos/blockSize]*blockSize+pos%blockSize)
	}
	return dst
}
