package engine

// Prefix caching for models with per-sequence state (ring buffers of
// sliding-window layers, KVCacheSpec.RingLayers in engine/models).
//
// A prefix-cache hit skips computing a prompt's leading blocks, but a
// sequence's ring buffers hold only the last window of what that sequence
// itself computed, and a ring layer's keys at a position depend, through
// the layers below, on every earlier position (the receptive field grows
// by a window a layer), so the missing ring entries cannot be recomputed
// from a few tokens before the hit. The prefix cache therefore keeps
// checkpoints: copies of a sequence's whole state slot taken when the
// sequence had computed exactly P tokens, P a multiple of the block size,
// keyed by the prefix hash of its first P/BlockSize blocks (the chain
// BlockManager uses). A later sequence whose cached blocks reach P starts
// from a copy of the checkpoint, as a fork starts from its parent's state.
//
// Where checkpoints are taken: at the end of every prefill chunk that ends
// on a block boundary, and with chunked prefill the scheduler ends a
// prompt's second-to-last chunk at its last block boundary before the
// final token (the most a hit can cover: one token is always computed), so
// that a repeated prompt, a conversation's next turn or a preempted
// sequence's recompute finds one. Decode steps take none (a copy every
// block of every sequence would turn the few checkpoint slots over before
// any could be reused).
//
// A checkpoint is a state slot numbered past the sequences' slots; the
// copy into it runs before the first step planned after the chunk's step
// (the slot then holds the state the chunk left, whatever became of the
// sequence since), ahead of every other state copy of that step, and the
// checkpoint is visible to lookups from then on, so a hit's copy out of it
// always runs after the copy in. When every checkpoint slot is taken the
// least recently used one is overwritten. Costs: a state slot of memory
// each, a slot copy a checkpoint taken and a hit, O(checkpoints) to find
// a victim, O(prefix tokens) hashing a key.
type stateCheckpoints struct {
	firstSlot int // slot id of checkpoint 0
	blockSize int
	key       []uint64 // per checkpoint: prefix hash of its blocks
	valid     []bool
	lastUse   []uint64 // LRU clock
	clock     uint64
	byKey     map[uint64]int
	pending   []pendingCheckpoint
	stats     CheckpointStats
}

// CheckpointStats counts the state checkpoints of prefix caching with ring
// layers.
type CheckpointStats struct {
	NumCheckpoints int   // slots for checkpoints
	NumTaken       int64 // checkpoints copied in
	NumHits        int64 // sequences started from a checkpoint
	NumEvicted     int64 // checkpoints overwritten while valid
}

// pendingCheckpoint is a checkpoint due before the first step planned
// after step.
type pendingCheckpoint struct {
	key  uint64
	slot int // the sequence's state slot
	step StepID
}

func newStateCheckpoints(n, firstSlot, blockSize int) *stateCheckpoints {
	return &stateCheckpoints{
		firstSlot: firstSlot, blockSize: blockSize,
		key: make([]uint64, n), valid: make([]bool, n), lastUse: make([]uint64, n),
		byKey: make(map[uint64]int, n), stats: CheckpointStats{NumCheckpoints: n},
	}
}

// prefixKey is the prefix hash of tokens[:numBlocks*blockSize], chained as
// BlockManager chains block hashes. Cost: O(tokens hashed).
func prefixKey(tokens []int, numBlocks, blockSize int) uint64 {
	h := rootHash
	for i := range numBlocks {
		h = hashBlock(h, tokens[i*blockSize:(i+1)*blockSize])
	}
	return h
}

// schedule records that the sequence's chunk in step ends at position end
// (its state slot holds the state after end tokens once the step ran);
// only block-aligned ends not already checkpointed are kept.
func (c *stateCheckpoints) schedule(seq *Sequence, end int, step StepID) {
	if end <= 0 || end%c.blockSize != 0 || end > len(seq.tokens) || seq.params.PromptLogprobs != nil || seq.stateSlot < 0 {
		return
	}
	key := prefixKey(seq.tokens, end/c.blockSize, c.blockSize)
	if i, ok := c.byKey[key]; ok {
		c.touch(i)
		return
	}
	for _, p := range c.pending {
		if p.key == key {
			return
		}
	}
	c.pending = append(c.pending, pendingCheckpoint{key: key, slot: int(seq.stateSlot), step: step})
}

// takeDue assigns a checkpoint slot to every pending checkpoint of a step
// before id, makes it visible to lookups and appends its copy to copies.
func (c *stateCheckpoints) takeDue(id StepID, copies []StateCopy) []StateCopy {
	keep := 0
	for _, p := range c.pending {
		if p.step >= id {
			c.pending[keep] = p
			keep++
			continue
		}
		if _, ok := c.byKey[p.key]; ok {
			continue // taken meanwhile by another sequence with the same prefix
		}
		i := c.victim()
		if c.valid[i] {
			delete(c.byKey, c.key[i])
			c.stats.NumEvicted++
		}
		c.key[i], c.valid[i] = p.key, true
		c.byKey[p.key] = i
		c.touch(i)
		c.stats.NumTaken++
		copies = append(copies, StateCopy{Src: p.slot, Dst: c.firstSlot + i})
	}
	clear(c.pending[keep:])
	c.pending = c.pending[:keep]
	return copies
}

// victim is a free checkpoint slot, else the least recently used.
func (c *stateCheckpoints) victim() int {
	best := 0
	for i := range c.valid {
		if !c.valid[i] {
			return i
		}
		if c.lastUse[i] < c.lastUse[best] {
			best = i
		}
	}
	return best
}

func (c *stateCheckpoints) touch(i int) {
	c.clock++
	c.lastUse[i] = c.clock
}

// deepest returns how many of the leading blocks hits (BlockManager.lookup's
// result, whose hashes are hash) a checkpoint covers, and its slot; 0 and
// -1 when none does. Cost: O(len(hits)).
func (c *stateCheckpoints) deepest(hits []int32, hash []uint64) (int, int) {
	for j := len(hits) - 1; j >= 0; j-- {
		if i, ok := c.byKey[hash[hits[j]]]; ok {
			c.touch(i)
			return j + 1, c.firstSlot + i
		}
	}
	return 0, -1
}
