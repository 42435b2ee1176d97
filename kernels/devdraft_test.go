package kernels_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/opstest"
)

// AcceptDrafts is the longest matching prefix plus the token after it, the
// host verify stage's rule, for every entry of a batch; bad indexes are
// ErrOutOfRange.
func TestAcceptDrafts(t *testing.T) {
	//             entry 0: 3 drafts      entry 1: none   entry 2: 2 drafts
	tokens := []int32{10, 11, 99, 12, 20, 30, 31, 32}
	drafts := []int32{0, 10, 11, 12, 7, 30, 31}
	for _, tc := range []struct {
		name   string
		layout []int32
		want   []int32 // accepted..., last..., base+accepted...
		err    bool
	}{
		{"mixed", []int32{0, 3, 1, 100, 4, 0, 0, 200, 5, 2, 5, 300}, []int32{2, 0, 2, 99, 20, 32, 102, 200, 302}, false},
		{"all accepted", []int32{5, 2, 5, 0}, []int32{2, 32, 2}, false},
		{"first rejected", []int32{0, 2, 4, 7}, []int32{0, 10, 7}, false},
		{"token past the end", []int32{6, 2, 5, 0}, nil, true},
		{"draft past the end", []int32{0, 3, 5, 0}, nil, true},
		{"negative count", []int32{0, -1, 0, 0}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := kernels.AcceptHost(tokens, drafts, tc.layout)
			if tc.err {
				if !errors.Is(err, kernels.ErrOutOfRange) {
					t.Fatalf("err = %v, want ErrOutOfRange", err)
				}
			} else if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("AcceptHost = %v, %v; want %v", got, err, tc.want)
			}
			// The CPU backend's op and the host fallback agree with it.
			ops := cpu.New(cpu.Options{Threads: 1})
			defer ops.Close()
			r := len(tc.layout) / 4
			tt, _ := kernels.FromI32(ops, tokens, len(tokens))
			dt, _ := kernels.FromI32(ops, drafts, len(drafts))
			lt, _ := kernels.FromI32(ops, tc.layout, r, 4)
			out, _ := ops.Alloc(kernels.I32, 3, r)
			for name, run := range map[string]func() error{
				"backend":  func() error { return ops.AcceptDrafts(out, tt, dt, lt) },
				"fallback": func() error { return kernels.AcceptDraftsInto(hostOnly{ops}, out, tt, dt, lt) },
			} {
				err := run()
				if tc.err {
					if !errors.Is(err, kernels.ErrOutOfRange) {
						t.Errorf("%s: err = %v, want ErrOutOfRange", name, err)
					}
					continue
				}
				got, _ := kernels.ToI32(ops, out)
				if err != nil || !slices.Equal(got, tc.want) {
					t.Errorf("%s = %v, %v; want %v", name, got, err, tc.want)
				}
			}
		})
	}
}

// hostOnly hides the backend's optional capabilities.
type hostOnly struct{ kernels.Ops }

// UploadI32Held uploads only values that differ from the buffer's last
// ones; a longer array takes a new buffer.
func TestUploadI32Held(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 1})
	defer c.Close()
	ops := &opstest.Counting{Ops: c}
	var h kernels.HeldI32
	for i, tc := range []struct {
		xs      []int32
		uploads int
	}{
		{[]int32{1, 2, 3}, 1},
		{[]int32{1, 2, 3}, 0},
		{[]int32{1, 2, 4}, 1},
		{[]int32{1, 2}, 1},
		{[]int32{1, 2}, 0},
		{[]int32{1, 2, 3, 4, 5, 6, 7}, 1},
		{[]int32{1, 2, 3, 4, 5, 6, 7}, 0},
	} {
		before := ops.Uploads
		v, err := kernels.UploadI32Held(ops, &h, tc.xs)
		if err != nil {
			t.Fatal(err)
		}
		got, err := kernels.ToI32(ops, v)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.xs) || ops.Uploads-before != tc.uploads {
			t.Errorf("call %d: view %v after %d uploads, want %v after %d", i, got, ops.Uploads-before, tc.xs, tc.uploads)
		}
	}
}
