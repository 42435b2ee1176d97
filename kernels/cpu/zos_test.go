package cpu

import (
	"errors"
	"reflect"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

func TestResolvePlaceholders(t *testing.T) {
	b := New(Options{Threads: 2})
	defer b.Close()
	up := func(xs ...int32) kernels.Tensor {
		t.Helper()
		ten, err := kernels.FromI32(b, xs, len(xs))
		if err != nil {
			t.Fatal(err)
		}
		return ten
	}
	ids := up(5, -1, 7, -1)
	if err := b.ResolvePlaceholders(ids, up(-1, 2, -1, 0), up(40, 41, 42)); err != nil {
		t.Fatal(err)
	}
	got, err := kernels.ToI32(b, ids)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []int32{5, 42, 7, 40}) {
		t.Errorf("ids = %v", got)
	}
	err = b.ResolvePlaceholders(up(-1), up(3), up(1, 2))
	if !errors.Is(err, kernels.ErrOutOfRange) {
		t.Errorf("row outside the step: %v", err)
	}
	err = b.ResolvePlaceholders(up(-1, -1), up(0), up(1))
	if !errors.Is(err, kernels.ErrShape) {
		t.Errorf("length mismatch: %v", err)
	}
}

// ShiftAccepted moves each shifted sequence's positions and key count by
// its row's accepted count and recomputes its slots from the block table;
// an unshifted sequence is untouched, and a bad row or a position past the
// table changes nothing.
func TestShiftAccepted(t *testing.T) {
	b := New(Options{Threads: 2})
	defer b.Close()
	up := func(shape []int, xs ...int32) kernels.Tensor {
		t.Helper()
		ten, err := kernels.FromI32(b, xs, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return ten
	}
	get := func(x kernels.Tensor) []int32 {
		t.Helper()
		v, err := kernels.ToI32(b, x)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// Block size 4. Sequence 0: 3 tokens at positions 5..7 (blocks 9, 2, 6),
	// shifted by row 1's count (2). Sequence 1: 1 token at position 2
	// (block 4), not shifted.
	build := func(shiftFrom ...int32) (*kernels.AttentionMetadata, kernels.Tensor, kernels.Tensor) {
		m := &kernels.AttentionMetadata{NumSeqs: 2, NumTokens: 4, MaxSeqlenQ: 3, MaxSeqlenK: 10, BlockSize: 4,
			CuSeqlensQ:  up([]int{3}, 0, 3, 4),
			SeqlensK:    up([]int{2}, 8, 3),
			BlockTables: up([]int{2, 3}, 9, 2, 6, 4, -1, -1),
			SlotMapping: up([]int{4}, 2*4+1, 2*4+2, 2*4+3, 4*4+2),
		}
		return m, up([]int{4}, 5, 6, 7, 2), up([]int{2}, shiftFrom...)
	}
	m, pos, shift := build(1, -1)
	if err := b.ShiftAccepted(m, pos, shift, up([]int{3}, 0, 2, 1)); err != nil {
		t.Fatal(err)
	}
	if got, want := get(pos), []int32{7, 8, 9, 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("positions %v, want %v", got, want)
	}
	if got, want := get(m.SlotMapping), []int32{2*4 + 3, 6*4 + 0, 6*4 + 1, 4*4 + 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("slots %v, want %v", got, want)
	}
	if got, want := get(m.SeqlensK), []int32{10, 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("seqlens_k %v, want %v", got, want)
	}
	for _, c := range []struct {
		name     string
		shift    []int32
		accepted []int32
	}{
		{"row outside the step", []int32{3, -1}, []int32{0, 2, 1}},
		{"negative count", []int32{0, -1}, []int32{-1, 2, 1}},
		{"past the block table", []int32{0, 0}, []int32{5, 2, 1}},
	} {
		m, pos, shift := build(c.shift...)
		err := b.ShiftAccepted(m, pos, shift, up([]int{3}, c.accepted...))
		if !errors.Is(err, kernels.ErrOutOfRange) {
			t.Errorf("%s: %v", c.name, err)
		}
		if got := get(pos); !reflect.DeepEqual(got, []int32{5, 6, 7, 2}) {
			t.Errorf("%s: positions changed to %v", c.name, got)
		}
	}
	if err := b.ShiftAccepted(nil, pos, shift, pos); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("nil metadata: %v", err)
	}
}
