package cpu

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapOffHeap returns n zeroed bytes of anonymous memory mapped outside Go's
// heap, aligned to huge pages and advised for them, and the mapping that
// owns them: a cleanup unmaps the bytes once the *mapping is unreachable,
// so whatever views them must hold it (Tensor.keep). (nil, nil) when the
// kernel refuses the mapping; callers then fall back to Go memory.
//
// Why outside the heap: the collector paces itself by the live heap, so
// weights and KV caches held there let a process grow garbage up to their
// size between collections, every byte of it on fresh pages that fault in
// as activations first touch them (on a 2-vCPU Zen 5 VM, the default
// model's `deepinfer generate -f` with 64 prompts took 222k page faults
// and 1.7 s of system time in a 2.8 s run). Cost: one mmap and one madvise.
func mapOffHeap(n int) ([]byte, *mapping) {
	if n <= 0 {
		return nil, nil
	}
	size := (n + hugePage - 1) / hugePage * hugePage
	raw, err := unix.Mmap(-1, 0, size+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil
	}
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(raw))) & (hugePage - 1))
	b := raw[off : off+n : off+n]
	adviseHugePages(raw[off : off+size])
	m := &mapping{size: len(raw)}
	runtime.AddCleanup(m, func(raw []byte) { _ = unix.Munmap(raw) }, raw)
	return b, m
}
