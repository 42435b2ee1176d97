package cpu

import (
	"testing"
	"unsafe"
)

func TestWeightArena(t *testing.T) {
	tests := []struct {
		name  string
		sizes []int
	}{
		{"small pieces stay ordinary", []int{1, 100, arenaMinPiece - 1}},
		{"pieces share a chunk", []int{arenaMinPiece, 3 * arenaMinPiece, arenaMinPiece + 1, 5<<20 + 7}},
		{"a piece larger than a chunk", []int{arenaMinPiece, arenaChunk + 1, arenaMinPiece}},
		{"pieces spill into a new chunk", []int{arenaChunk - arenaMinPiece, 2 * arenaMinPiece, arenaMinPiece}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a weightArena
			var got [][]byte
			for _, n := range tt.sizes {
				p := a.bytes(n)
				if len(p) != n || cap(p) != n {
					t.Fatalf("bytes(%d): len %d cap %d", n, len(p), cap(p))
				}
				for i, v := range p {
					if v != 0 {
						t.Fatalf("bytes(%d)[%d] = %d, want zeroed memory", n, i, v)
					}
				}
				addr := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
				if n >= arenaMinPiece && addr%64 != 0 {
					t.Errorf("bytes(%d) at %#x, not 64-byte aligned", n, addr)
				}
				for i := range p {
					p[i] = byte(len(got) + 1)
				}
				got = append(got, p)
			}
			// Each piece still holds its own mark: no two overlap.
			for j, p := range got {
				for i, v := range p {
					if v != byte(j+1) {
						t.Fatalf("piece %d (%d bytes) byte %d = %d: overwritten by piece %d", j, len(p), i, v, v-1)
					}
				}
			}
		})
	}
}

func TestWeightArenaChunkAlignment(t *testing.T) {
	var a weightArena
	p := a.bytes(arenaMinPiece)
	if addr := uintptr(unsafe.Pointer(unsafe.SliceData(p))); addr%hugePage != 0 {
		t.Errorf("a chunk's first piece at %#x, not aligned to %d bytes", addr, hugePage)
	}
}
