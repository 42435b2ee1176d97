package kernels

import (
	"fmt"
	"math"
)

// Greedy drafts chained on the device: a drafter that feeds each draft
// position's argmax into the next position's pass keeps the tokens in
// backend memory (Argmaxer) and brings them to the host once, behind the
// queued work (AsyncFetcher), instead of one host round trip a position.

// Argmaxer is implemented by backends that take row argmaxes into backend
// memory.
type Argmaxer interface {
	// Argmax sets out[r] to the id of the largest entry of logits row r:
	// the lowest id on ties; NaN entries never win; a row with nothing
	// above -Inf gives 0. logits F32 [R, vocab], out I32 [R]. It queues the
	// work: no host round trip. Cost: one pass over logits.
	Argmax(out, logits Tensor) error
}

// AsyncFetcher is implemented by backends that can copy a small I32 tensor
// to the host behind the work queued so far without waiting for work
// queued after it.
type AsyncFetcher interface {
	// FetchI32Async queues a copy of t (I32, any shape) and returns at once;
	// fetch waits for that copy only and returns it (with the errors a
	// Download would report). Call fetch exactly once; at most two fetches
	// may be outstanding.
	FetchI32Async(t Tensor) (fetch func() ([]int32, error), err error)
}

// ArgmaxRow is the argmax of row with Argmaxer's rules (lowest id on ties,
// NaN never wins, 0 when nothing is above -Inf): the host reference.
func ArgmaxRow(row []float32) int {
	best, bv := 0, float32(math.Inf(-1))
	for t, x := range row {
		if x > bv {
			best, bv = t, x
		}
	}
	return best
}

// CheckArgmax checks Argmax's arguments and returns (rows, vocab).
func CheckArgmax(backend string, out, logits Tensor) (int, int, error) {
	ls, os := logits.Shape(), out.Shape()
	if logits.DType() != F32 || out.DType() != I32 {
		return 0, 0, fmt.Errorf("%s: argmax: logits %v and out %v: want F32 and I32: %w", backend, logits.DType(), out.DType(), ErrDType)
	}
	if len(ls) != 2 || ls[1] == 0 || NumElements(out) != ls[0] {
		return 0, 0, fmt.Errorf("%s: argmax: logits %v, out %v: want [R, vocab] and R ids: %w", backend, ls, os, ErrShape)
	}
	return ls[0], ls[1], nil
}

// ArgmaxInto writes the argmax of each row of logits (F32 [R, vocab]) into
// out (I32 [R]) in backend memory: queued on the backend when it is an
// Argmaxer, else through a host copy of the rows and an upload.
func ArgmaxInto(ops Ops, out, logits Tensor) error {
	if a, ok := ops.(Argmaxer); ok {
		return a.Argmax(out, logits)
	}
	rows, vocab, err := CheckArgmax(ops.Name(), out, logits)
	if err != nil {
		return err
	}
	flat, err := ToF32(ops, logits)
	if err != nil {
		return err
	}
	ids := make([]int32, rows)
	for r := range ids {
		ids[r] = int32(ArgmaxRow(flat[r*vocab : (r+1)*vocab]))
	}
	return ops.Upload(out, I32Bytes(ids), I32)
}

// FetchI32Async starts bringing t (I32) to the host: behind the queued
// work on an AsyncFetcher, else by a Download now. fetch returns the
// values; call it exactly once.
func FetchI32Async(ops Ops, t Tensor) (func() ([]int32, error), error) {
	if f, ok := ops.(AsyncFetcher); ok {
		return f.FetchI32Async(t)
	}
	if t.DType() != I32 {
		return nil, fmt.Errorf("%s: fetch: %v is not I32: %w", ops.Name(), t, ErrDType)
	}
	raw := make([]byte, 4*NumElements(t))
	err := ops.Download(raw, t)
	return func() ([]int32, error) {
		if err != nil {
			return nil, err
		}
		return BytesI32(raw), nil
	}, nil
}
