package cpu

import (
	"math/rand/v2"
	"runtime"
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
				p, _ := a.bytes(n)
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
	p, _ := a.bytes(arenaMinPiece)
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

// Every view of a tensor in off-heap memory holds its mapping, so that the
// memory stays mapped while a view is reachable: the views below outlive
// the tensors they were taken from, through collections that run the
// cleanups of unreachable mappings, and still read what was written (a
// mapping dropped too early would fault here).
func TestOffHeapViewsKeepTheirMapping(t *testing.T) {
	if _, m := mapOffHeap(arenaMinPiece); m == nil {
		t.Skip("no off-heap mappings on this system")
	}
	b := New(Options{Threads: 1})
	defer b.Close()
	const e, n, k = 4, 64, 256 // 4 experts of 64 x 256: 256 KiB of float32
	r := rand.New(rand.NewPCG(3, 4))
	vals := make([]float32, e*n*k)
	for i := range vals {
		vals[i] = r.Float32()
	}
	views := []struct {
		name string
		view func(t *testing.T, w *Tensor) (*Tensor, []float32)
	}{
		{"Rows", func(t *testing.T, w *Tensor) (*Tensor, []float32) {
			v, err := b.Rows(w, 1, 3)
			if err != nil {
				t.Fatal(err)
			}
			return v.(*Tensor), vals[n*k : 3*n*k]
		}},
		{"Reshape", func(t *testing.T, w *Tensor) (*Tensor, []float32) {
			v, err := b.Reshape(w, e*n, k)
			if err != nil {
				t.Fatal(err)
			}
			return v.(*Tensor), vals
		}},
		{"expert", func(t *testing.T, w *Tensor) (*Tensor, []float32) { return expert(w, 2), vals[2*n*k : 3*n*k] }},
		{"rowsView", func(t *testing.T, w *Tensor) (*Tensor, []float32) {
			m, err := b.Reshape(w, e*n, k)
			if err != nil {
				t.Fatal(err)
			}
			return rowsView(m.(*Tensor), 5, 9, k), vals[5*k : 9*k]
		}},
	}
	allocs := []struct {
		name  string
		alloc func(kernels.DType, ...int) (kernels.Tensor, error)
	}{{"AllocWeight", b.AllocWeight}, {"AllocCache", b.AllocCache}}
	for _, a := range allocs {
		for _, tt := range views {
			t.Run(a.name+"/"+tt.name, func(t *testing.T) {
				var v *Tensor
				var want []float32
				func() {
					w, err := a.alloc(kernels.F32, e, n, k)
					if err != nil {
						t.Fatal(err)
					}
					if w.(*Tensor).keep == nil {
						t.Fatalf("%s of %d bytes is not off-heap", a.name, 4*e*n*k)
					}
					if err := b.Upload(w, kernels.F32Bytes(vals), kernels.F32); err != nil {
						t.Fatal(err)
					}
					v, want = tt.view(t, w.(*Tensor))
				}()
				if v.keep == nil {
					t.Fatalf("the view holds no mapping")
				}
				for range 3 {
					runtime.GC()
				}
				_ = make([]byte, 64<<20) // a fresh mapping may take a freed one's place
				if !slices.Equal(v.f32, want) {
					t.Errorf("the view reads other values after collections")
				}
				for i := range v.f32 {
					v.f32[i] = 1
				}
			})
		}
	}
}

// AllocCache: zeroed tensors of the asked dtype and shape, off-heap from
// arenaMinPiece bytes on (where the system maps), each on its own mapping.
func TestAllocCache(t *testing.T) {
	b := New(Options{Threads: 1})
	defer b.Close()
	_, m := mapOffHeap(arenaMinPiece)
	offHeap := m != nil
	for _, tt := range []struct {
		dtype kernels.DType
		shape []int
	}{
		{kernels.F32, []int{2, 16, 7}},      // small: Go memory
		{kernels.F32, []int{64, 16, 144}},   // 576 KiB
		{kernels.BF16, []int{100, 16, 576}}, // 1.8 MiB
		{kernels.F16, []int{9, 32, 128}},
	} {
		c, err := b.AllocCache(tt.dtype, tt.shape...)
		if err != nil {
			t.Fatalf("AllocCache(%v, %v): %v", tt.dtype, tt.shape, err)
		}
		ten := c.(*Tensor)
		if ten.DType() != tt.dtype || !slices.Equal(ten.Shape(), tt.shape) {
			t.Fatalf("AllocCache(%v, %v) = %v", tt.dtype, tt.shape, ten)
		}
		_, size := tensorBytes(ten)
		if want := size >= arenaMinPiece && offHeap; (ten.keep != nil) != want {
			t.Errorf("AllocCache(%v, %v): off-heap %v, want %v", tt.dtype, tt.shape, ten.keep != nil, want)
		}
		host := make([]byte, size)
		if err := b.Download(host, ten); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(host, func(v byte) bool { return v != 0 }) {
			t.Fatalf("%v: not zeroed", ten)
		}
	}
}
