package cpu

import (
	"sync"
	"unsafe"
)

// hugePage is the size of a transparent huge page on x86-64 and arm64
// Linux, the alignment of weightArena's chunks.
const hugePage = 2 << 20

// arenaChunk is the size of weightArena's chunks (a larger piece gets a
// chunk of its own size, rounded up to huge pages).
const arenaChunk = 64 << 20

// arenaMinPiece is the smallest piece weightArena carves from a chunk: a
// smaller one (a norm, a tiny model's matrix) is an ordinary allocation,
// so that a backend holding only small weights never maps a chunk.
const arenaMinPiece = 64 << 10

// mapping owns memory mapped outside Go's heap (mapOffHeap): the memory
// stays mapped while the *mapping is reachable. Tensors viewing such memory
// hold it in Tensor.keep, and views of them copy it.
type mapping struct {
	size int // bytes mapped, alignment slack included
}

// weightArena hands out the long-lived byte ranges that weights are copied
// into (QuantWeight, FP8Weight, MXFP4Weight, AllocWeight), carved one after
// the other from chunks mapped outside Go's heap (mapOffHeap), aligned to
// huge pages and advised for them before anything touches them (KV caches
// take a mapping each: AllocCache). A decode step streams every weight once: on 4 KiB
// pages the hardware prefetchers stop at each page boundary and every page
// costs a TLB miss. On a 2-vCPU AMD EPYC VM (Linux's THP setting "madvise",
// under which Go's heap gets no huge pages) a Q8_0 153M Llama's decode
// steps at 512 cached tokens took 5.2-5.5 ms instead of 6.1-6.7 (three
// alternating runs), its gate/up GEMVs reading 1.2-1.45x faster.
//
// A chunk stays mapped while its *mapping is reachable: from the arena
// while it carves from it, and from every tensor holding a range of it
// (Tensor.keep). What a chunk holds past its last range stays unused (at
// most the largest piece asked for, up to arenaChunk). Where the kernel
// refuses a mapping (or off Linux), chunks are Go memory. Safe for
// concurrent use.
type weightArena struct {
	mu   sync.Mutex
	free []byte   // the unused rest of the current chunk
	cur  *mapping // the current chunk's mapping (nil: Go memory)
}

// bytes returns n zeroed bytes for a weight that lives as long as the
// backend's model, and the mapping the caller must keep with them (nil
// for Go memory): 64-byte aligned from a chunk from arenaMinPiece bytes on,
// an ordinary allocation below. Cost: a chunk's mapping every arenaChunk
// bytes (its pages faulted in as they are first written).
func (a *weightArena) bytes(n int) ([]byte, *mapping) {
	if n <= 0 {
		return nil, nil
	}
	if n < arenaMinPiece {
		return make([]byte, n), nil
	}
	const align = 64
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.free) < n {
		size := max(arenaChunk, (n+hugePage-1)/hugePage*hugePage)
		a.free, a.cur = mapOffHeap(size)
		if a.cur == nil {
			raw := make([]byte, size+hugePage)
			off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(raw))) & (hugePage - 1))
			a.free = raw[off : off+size : off+size]
			adviseHugePages(a.free)
		}
	}
	p := a.free[:n:n]
	skip := min((n+align-1)/align*align, len(a.free))
	a.free = a.free[skip:]
	return p, a.cur
}

// arenaSlice returns n zeroed elements and the mapping to keep with them:
// from a (a weightArena: 64-byte aligned, see bytes) when a is not nil and
// they fill at least arenaMinPiece bytes, else an ordinary allocation (nil
// mapping).
func arenaSlice[T uint8 | uint16 | int32 | float32](a byteSource, n int) ([]T, *mapping) {
	size := n * int(unsafe.Sizeof(T(0)))
	if a == nil || size < arenaMinPiece {
		return make([]T, n), nil
	}
	b, m := a.bytes(size)
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n), m
}
