package kernels

import (
	"fmt"
	"slices"
)

// FromF32 allocates a tensor of the given dtype and shape and uploads xs into
// it (F32 only: host float32 data for an activation-typed or F32 tensor).
func FromF32(ops Ops, xs []float32, shape ...int) (Tensor, error) {
	t, err := AllocEmpty(ops, F32, shape...)
	if err != nil {
		return nil, err
	}
	if err := ops.Upload(t, F32Bytes(xs), F32); err != nil {
		return nil, err
	}
	return t, nil
}

// FromI32 allocates an I32 tensor of the given shape and uploads xs into it.
func FromI32(ops Ops, xs []int32, shape ...int) (Tensor, error) {
	t, err := AllocEmpty(ops, I32, shape...)
	if err != nil {
		return nil, err
	}
	if err := ops.Upload(t, uploadI32Bytes(xs), I32); err != nil {
		return nil, err
	}
	return t, nil
}

// ToF32 downloads an F32 tensor to host float32 values.
func ToF32(ops Ops, t Tensor) ([]float32, error) {
	if t.DType() != F32 {
		return nil, fmt.Errorf("kernels: download %v tensor as F32: %w", t.DType(), ErrDType)
	}
	b := make([]byte, 4*NumElements(t))
	if err := ops.Download(b, t); err != nil {
		return nil, err
	}
	return BytesF32(b), nil
}

// ToF32Into is ToF32 reusing dst's storage when it is large enough (on
// little-endian hosts the download lands in it directly, with no other
// copy); it returns the filled slice.
func ToF32Into(ops Ops, t Tensor, dst []float32) ([]float32, error) {
	if t.DType() != F32 {
		return nil, fmt.Errorf("kernels: download %v tensor as F32: %w", t.DType(), ErrDType)
	}
	if !hostLittleEndian {
		return ToF32(ops, t)
	}
	n := NumElements(t)
	if cap(dst) < n {
		dst = make([]float32, n)
	}
	dst = dst[:n]
	if err := ops.Download(rawBytes(dst), t); err != nil {
		return nil, err
	}
	return dst, nil
}

// ToI32 downloads an I32 tensor to host int32 values.
func ToI32(ops Ops, t Tensor) ([]int32, error) {
	if t.DType() != I32 {
		return nil, fmt.Errorf("kernels: download %v tensor as I32: %w", t.DType(), ErrDType)
	}
	b := make([]byte, 4*NumElements(t))
	if err := ops.Download(b, t); err != nil {
		return nil, err
	}
	return BytesI32(b), nil
}

// EmptyAllocator is a backend that allocates without the zero fill, for
// outputs whose every element is written before it is read.
type EmptyAllocator interface {
	// AllocEmpty is Alloc without the fill: the contents are undefined
	// until written. Cost: one allocation, no pass over the memory.
	AllocEmpty(dtype DType, shape ...int) (Tensor, error)
}

// AllocEmpty allocates with ops's AllocEmpty where it has one, else with
// Alloc (zero-filled). The caller writes every element before any read.
func AllocEmpty(ops Ops, dtype DType, shape ...int) (Tensor, error) {
	if e, ok := ops.(EmptyAllocator); ok {
		return e.AllocEmpty(dtype, shape...)
	}
	return ops.Alloc(dtype, shape...)
}

// WeightAllocator is a backend that keeps the tensors a model loads apart
// from activations and scratch: in memory laid out for streaming (on the
// CPU, chunks mapped outside Go's heap and backed by huge pages) that is
// handed back once nothing viewing it is reachable.
type WeightAllocator interface {
	// AllocWeight is Alloc for a tensor that lives as long as the backend,
	// a loaded weight: zeroed, the same dtypes and shapes, views alike.
	// Cost: Alloc's, with none of the memory reused while the backend lives.
	AllocWeight(dtype DType, shape ...int) (Tensor, error)
}

// AllocWeight allocates a loaded weight with ops's AllocWeight where it has
// one, else with Alloc. Only for tensors that live as long as the model:
// what it allocates may never be freed.
func AllocWeight(ops Ops, dtype DType, shape ...int) (Tensor, error) {
	if w, ok := ops.(WeightAllocator); ok {
		return w.AllocWeight(dtype, shape...)
	}
	return ops.Alloc(dtype, shape...)
}

// CacheAllocator is a backend that keeps KV caches and state slots apart
// from activations (on the CPU, memory mapped outside Go's heap, which the
// collector neither scans nor paces itself by).
type CacheAllocator interface {
	// AllocCache is Alloc for a KV cache or state slots: zeroed, the same
	// dtypes and shapes, views alike. Freed once no view of it is
	// reachable.
	AllocCache(dtype DType, shape ...int) (Tensor, error)
}

// AllocCache allocates a KV cache or state-slot tensor with ops's
// AllocCache where it has one, else with Alloc.
func AllocCache(ops Ops, dtype DType, shape ...int) (Tensor, error) {
	if c, ok := ops.(CacheAllocator); ok {
		return c.AllocCache(dtype, shape...)
	}
	return ops.Alloc(dtype, shape...)
}

// UploadI32Into uploads xs into the first len(xs) elements of *buf when it
// holds that many, else into a new buffer of twice that, left in *buf, and
// returns the view of xs; buf nil is FromI32. The caller hands over a
// buffer that nothing reads any more, in the backend's stream order.
// Cost: one upload, and an allocation only when *buf grows.
func UploadI32Into(ops Ops, buf *Tensor, xs []int32) (Tensor, error) {
	if buf == nil || len(xs) == 0 {
		return FromI32(ops, xs, len(xs))
	}
	if *buf == nil || NumElements(*buf) < len(xs) {
		t, err := AllocEmpty(ops, I32, 2*len(xs))
		if err != nil {
			return nil, err
		}
		*buf = t
	}
	view, err := ops.Rows(*buf, 0, len(xs))
	if err == nil {
		err = ops.Upload(view, uploadI32Bytes(xs), I32)
	}
	return view, err
}

// HeldI32 is an UploadI32Held buffer: backend memory and the values its
// start got from the last upload.
type HeldI32 struct {
	Buf  Tensor
	host []int32
}

// UploadI32Held is UploadI32Into(ops, &h.Buf, xs) without the upload when
// xs are the values the last call put there: every decode step of a
// steady batch, for tables that depend only on the batch's shape. The
// caller promises that no kernel wrote those elements since, or that
// every one a kernel wrote is written again before it is read. Cost: a
// comparison of len(xs) values; an upload only on a change.
func UploadI32Held(ops Ops, h *HeldI32, xs []int32) (Tensor, error) {
	if h.Buf != nil && len(xs) > 0 && slices.Equal(h.host, xs) {
		return ops.Rows(h.Buf, 0, len(xs))
	}
	h.host = h.host[:0]
	view, err := UploadI32Into(ops, &h.Buf, xs)
	if err == nil && len(xs) > 0 {
		h.host = append(h.host, xs...)
	}
	return view, err
}
