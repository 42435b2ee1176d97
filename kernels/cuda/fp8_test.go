package cuda

import (
	"errors"
	"math"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// TestCheckFP8Weight covers FP8Weight's argument checks, which run before
// any device work.
func TestCheckFP8Weight(t *testing.T) {
	good := func() kernels.FP8Weight {
		return kernels.FP8Weight{Shape: []int{2, 32}, Data: make([]byte, 64), Scales: []float32{1, 2, 3, 4},
			ScaleRow: []int32{0, 1}, BlockK: 16}
	}
	for _, tc := range []struct {
		name string
		edit func(*kernels.FP8Weight)
		want error // nil: accepted
		cols int
	}{
		{"ok", func(*kernels.FP8Weight) {}, nil, 2},
		{"experts", func(w *kernels.FP8Weight) {
			w.Shape, w.Data, w.ScaleRow = []int{2, 1, 32}, make([]byte, 64), []int32{1, 0}
		}, nil, 2},
		{"one dimension", func(w *kernels.FP8Weight) { w.Shape = []int{64} }, kernels.ErrShape, 0},
		{"short data", func(w *kernels.FP8Weight) { w.Data = w.Data[:63] }, kernels.ErrShape, 0},
		{"scale rows", func(w *kernels.FP8Weight) { w.ScaleRow = w.ScaleRow[:1] }, kernels.ErrShape, 0},
		{"block not a power of two", func(w *kernels.FP8Weight) { w.BlockK = 24 }, kernels.ErrShape, 0},
		{"block below 16", func(w *kernels.FP8Weight) { w.BlockK = 8 }, kernels.ErrShape, 0},
		{"k not a multiple of 16", func(w *kernels.FP8Weight) {
			w.Shape, w.Data, w.BlockK = []int{2, 24}, make([]byte, 48), 16
		}, ErrUnsupported, 0},
		{"ragged scales", func(w *kernels.FP8Weight) { w.Scales = w.Scales[:3] }, kernels.ErrShape, 0},
		{"scale row out of range", func(w *kernels.FP8Weight) { w.ScaleRow[1] = 2 }, kernels.ErrShape, 0},
		{"negative scale row", func(w *kernels.FP8Weight) { w.ScaleRow[0] = -1 }, kernels.ErrShape, 0},
		{"infinite scale", func(w *kernels.FP8Weight) { w.Scales[2] = float32(math.Inf(1)) }, kernels.ErrShape, 0},
		{"NaN scale", func(w *kernels.FP8Weight) { w.Scales[0] = float32(math.NaN()) }, kernels.ErrShape, 0},
		{"NaN byte", func(w *kernels.FP8Weight) { w.Data[5] = 0xff }, kernels.ErrDType, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := good()
			tc.edit(&w)
			cols, err := checkFP8Weight(w)
			if tc.want == nil {
				if err != nil || cols != tc.cols {
					t.Fatalf("got %d, %v; want %d scale columns and no error", cols, err, tc.cols)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want an error wrapping %v", err, tc.want)
			}
		})
	}
}

// TestFP8ScalesView: views of FP8 weights start at their own scale row and
// share the weight's cache of float32 copies (fp8Dequantized).
func TestFP8ScalesView(t *testing.T) {
	var none *fp8Scales
	if none.view(3) != nil {
		t.Fatal("view of no scales is not nil")
	}
	f := &fp8Scales{rowOff: 2, scaleCols: 4, blockK: 128, deq: &fp8DeqCache{}}
	v := f.view(5)
	if v.rowOff != 7 || f.rowOff != 2 || v.scaleCols != 4 || v.blockK != 128 {
		t.Fatalf("view(5) of rowOff 2: %+v (original %+v)", v, f)
	}
	if v.deq != f.deq { // MLAAttention's float32 copies live with the weight, keyed per view
		t.Fatal("a view does not share its weight's dequantized-copy cache")
	}
}

// TestFP8NaN: the word-at-a-time scan finds the first NaN byte (0x7f or
// 0xff) at every offset of lengths around the word size, and only those:
// every other byte value, at every position of a word, passes.
func TestFP8NaN(t *testing.T) {
	for n := range 20 {
		for pos := range n {
			for _, nan := range []byte{0x7f, 0xff} {
				data := make([]byte, n)
				for i := range data {
					data[i] = 0x7e // the largest finite magnitude
				}
				data[pos] = nan
				if n > pos+1 {
					data[n-1] = 0xff // a later NaN is not the first
				}
				if got := fp8NaN(data); got != pos {
					t.Fatalf("%d bytes, NaN %#02x at %d: got %d", n, nan, pos, got)
				}
			}
		}
	}
	for v := range 256 {
		data := make([]byte, 16)
		for pos := range data {
			data[pos] = byte(v)
		}
		want := -1
		if v&0x7f == 0x7f {
			want = 0
		}
		if got := fp8NaN(data); got != want {
			t.Fatalf("16 bytes of %#02x: got %d, want %d", v, got, want)
		}
	}
	if got := fp8NaN(nil); got != -1 {
		t.Fatalf("no bytes: got %d", got)
	}
}

// TestLTScales checks the cuBLASLt layout of block scales: block (rb, kb)
// at rb * ld + kb, ld the scale columns rounded up to 4, the padding zero;
// and the weights that have no such layout.
func TestLTScales(t *testing.T) {
	// 300 rows (3 row blocks, the last partial), k 1344 (11 column blocks,
	// the last partial): ld 12. Row block rb takes scale row 2 - rb, so the
	// copy must follow ScaleRow, not the row block's index.
	const rows, k, cols = 300, 1344, 11
	w := kernels.FP8Weight{Shape: []int{rows, k}, Data: make([]byte, rows*k), BlockK: 128}
	for i := range 3 * cols {
		w.Scales = append(w.Scales, float32(i+1))
	}
	for r := range rows {
		w.ScaleRow = append(w.ScaleRow, int32(2-r/128))
	}
	lt, ld, ok := ltScales(w, cols)
	if !ok || ld != 12 || len(lt) != 3*12 {
		t.Fatalf("ltScales: ok %v, ld %d, %d scales; want true, 12, 36", ok, ld, len(lt))
	}
	for rb := range 3 {
		for kb := range ld {
			want := float32(0)
			if kb < cols {
				want = w.Scales[(2-rb)*cols+kb]
			}
			if got := lt[rb*ld+kb]; got != want {
				t.Fatalf("block (%d, %d) = %v, want %v", rb, kb, got, want)
			}
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*kernels.FP8Weight)
	}{
		{"block 64", func(w *kernels.FP8Weight) { w.BlockK = 64 }},
		{"stacked experts", func(w *kernels.FP8Weight) { w.Shape = []int{1, rows, k} }},
		{"a row block on two scale rows", func(w *kernels.FP8Weight) { w.ScaleRow[200] = 0 }},
	} {
		v := w
		v.ScaleRow = append([]int32(nil), w.ScaleRow...)
		tc.edit(&v)
		if _, _, ok := ltScales(v, cols); ok {
			t.Errorf("%s: ltScales accepted it", tc.name)
		}
	}
}
