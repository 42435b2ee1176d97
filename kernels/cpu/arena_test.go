package cpu

import (
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels"
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

// tensorBytes is t's backing memory: its address and length in bytes.
func tensorBytes(t *Tensor) (uintptr, int) {
	switch {
	case t.f32 != nil:
		return uintptr(unsafe.Pointer(unsafe.SliceData(t.f32))), 4 * len(t.f32)
	case t.u16 != nil:
		return uintptr(unsafe.Pointer(unsafe.SliceData(t.u16))), 2 * len(t.u16)
	case t.i32 != nil:
		return uintptr(unsafe.Pointer(unsafe.SliceData(t.i32))), 4 * len(t.i32)
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(t.u8))), len(t.u8)
}

// AllocWeight's tensors: zeroed, of the asked dtype and shape, holding what
// is uploaded into them; from 64 KiB on carved one after the other from a
// huge-page-aligned chunk (each 64-byte aligned, none overlapping another).
func TestAllocWeight(t *testing.T) {
	b := New(Options{Threads: 1})
	defer b.Close()
	tests := []struct {
		dtype kernels.DType
		shape []int
	}{
		{kernels.BF16, []int{256, 512}}, // 256 KiB: the chunk's first piece
		{kernels.F32, []int{7}},         // below arenaMinPiece: ordinary memory
		{kernels.F32, []int{129, 129}},  // 66564 bytes, not a multiple of 64
		{kernels.F16, []int{3, 100, 200}},
		{kernels.I32, []int{1 << 14}},
		{kernels.F8E4M3, []int{300, 300}},
		{kernels.BF16, []int{5}},
	}
	r := rand.New(rand.NewPCG(1, 2))
	var tensors []*Tensor
	var want [][]byte
	var next uintptr // where the next piece of the chunk starts
	for i, tt := range tests {
		got, err := b.AllocWeight(tt.dtype, tt.shape...)
		if err != nil {
			t.Fatalf("AllocWeight(%v, %v): %v", tt.dtype, tt.shape, err)
		}
		ten := got.(*Tensor)
		if ten.DType() != tt.dtype || !slices.Equal(ten.Shape(), tt.shape) {
			t.Fatalf("AllocWeight(%v, %v) = %v", tt.dtype, tt.shape, ten)
		}
		addr, size := tensorBytes(ten)
		if size != kernels.NumElements(ten)*tt.dtype.Size() {
			t.Fatalf("%v: %d bytes behind it, want %d", ten, size, kernels.NumElements(ten)*tt.dtype.Size())
		}
		if size >= arenaMinPiece {
			switch {
			case i == 0 && addr%hugePage != 0:
				t.Errorf("%v at %#x: the first piece of a chunk is not aligned to %d bytes", ten, addr, hugePage)
			case i > 0 && addr != next:
				t.Errorf("%v at %#x, want the next piece of the chunk at %#x", ten, addr, next)
			}
			next = addr + uintptr((size+63)/64*64)
		}
		host := make([]byte, size)
		if err := b.Download(host, ten); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(host, func(v byte) bool { return v != 0 }) {
			t.Fatalf("%v: not zeroed", ten)
		}
		for j := range host {
			host[j] = byte(r.IntN(0x70)) // no E4M3 NaN
		}
		if err := b.Upload(ten, host, tt.dtype); err != nil {
			t.Fatal(err)
		}
		tensors, want = append(tensors, ten), append(want, host)
	}
	for i, ten := range tensors {
		host := make([]byte, len(want[i]))
		if err := b.Download(host, ten); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(host, want[i]) {
			t.Errorf("%v: contents changed by the tensors allocated and written after it", ten)
		}
	}
}
