package engine

import (
	"errors"
	"fmt"
)

// ErrNoFreeStateSlots is returned when every state slot is taken.
var ErrNoFreeStateSlots = errors.New("no free state slots")

// StateCopy asks the forward pass to copy state slot Src into slot Dst
// before the step runs (a fork's child starts from its parent's state).
type StateCopy struct{ Src, Dst int }

// StateManager hands out fixed-size per-sequence state slots, separate from
// the paged KV cache: one slot per live sequence, for sliding-window KV,
// draft/MTP state and other compressed state. The slot count is the cap on
// live sequences. Every operation is O(1). Not safe for concurrent use; the
// Scheduler serializes access.
type StateManager struct {
	free  []int   // stack of free slots
	owner []SeqID // 0 when free
}

// NewStateManager returns a manager of numSlots slots.
func NewStateManager(numSlots int) (*StateManager, error) {
	if numSlots < 1 {
		return nil, fmt.Errorf("state manager: num_slots must be >= 1, got %d", numSlots)
	}
	m := &StateManager{free: make([]int, numSlots), owner: make([]SeqID, numSlots)}
	for i := range numSlots {
		m.free[i] = numSlots - 1 - i // hand out slot 0 first
	}
	return m, nil
}

// NumSlots returns the total number of slots.
func (m *StateManager) NumSlots() int { return len(m.owner) }

// NumFree returns the free slots.
func (m *StateManager) NumFree() int { return len(m.free) }

// NumUsed returns the slots held by sequences.
func (m *StateManager) NumUsed() int { return len(m.owner) - len(m.free) }

// CanAllocate reports whether n more slots are free.
func (m *StateManager) CanAllocate(n int) bool { return len(m.free) >= n }

// Allocate gives the sequence a slot. Its content is undefined: the first
// step of the sequence (position 0, or its first computed position after a
// prefix-cache hit) initializes it.
func (m *StateManager) Allocate(seq *Sequence) error {
	if seq.stateSlot >= 0 {
		return fmt.Errorf("state manager: seq %d already holds slot %d", seq.id, seq.stateSlot)
	}
	if len(m.free) == 0 {
		return fmt.Errorf("state manager: seq %d: %w (%d slots)", seq.id, ErrNoFreeStateSlots, len(m.owner))
	}
	slot := m.free[len(m.free)-1]
	m.free = m.free[:len(m.free)-1]
	m.owner[slot] = seq.id
	seq.stateSlot = int32(slot)
	seq.metaGen++
	return nil
}

// Free returns the sequence's slot, if it holds one.
func (m *StateManager) Free(seq *Sequence) {
	if seq.stateSlot < 0 {
		return
	}
	m.owner[seq.stateSlot] = 0
	m.free = append(m.free, int(seq.stateSlot))
	seq.stateSlot = -1
	seq.metaGen++
}

// Fork gives child a slot and returns the copy of parent's state into it,
// to run before the child's first step.
func (m *StateManager) Fork(parent, child *Sequence) (StateCopy, error) {
	if parent.stateSlot < 0 {
		return StateCopy{}, fmt.Errorf("state manager: fork seq %d: parent %d holds no slot", child.id, parent.id)
	}
	if err := m.Allocate(child); err != nil {
		return StateCopy{}, fmt.Errorf("state manager: fork seq %d from %d: %w", child.id, parent.id, err)
	}
	return StateCopy{Src: int(parent.stateSlot), Dst: int(child.stateSlot)}, nil
}

// owns reports whether slot is held by seq (tests and stale-copy checks).
func (m *StateManager) owns(slot int, id SeqID) bool {
	return slot >= 0 && slot < len(m.owner) && m.owner[slot] == id
}
