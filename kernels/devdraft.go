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

// DraftAccepter is implemented by backends that verify drafts in backend
// memory, so that a speculative step's accepted counts reach the next
// step's inputs without a host round trip.
type DraftAccepter interface {
	// AcceptDrafts verifies drafts by sample-and-compare, as the verify
	// stage does on the host. For each entry r of layout (I32 [R, 4]: s0,
	// n, d0, base), a is the largest a <= n such that tokens[s0+j] ==
	// drafts[d0+j] for every j < a; out[0][r] = a, out[1][r] =
	// tokens[s0+a] (the entry's last emitted token) and out[2][r] = base +
	// a. out I32 [3, R], tokens I32 [S] (sampled tokens), drafts I32 [D]
	// (the drafts, e.g. the step's input ids). An entry whose indexes fall
	// outside tokens or drafts, or whose n is negative, is ErrOutOfRange
	// (reported by the next Sync or Download on backends that check on
	// the device) and gets zeros. Cost: sum of n reads; no host round trip.
	AcceptDrafts(out, tokens, drafts, layout Tensor) error
}

// AcceptRow is AcceptDrafts for one entry on the host: the accepted count
// and the last emitted token, or ok false when an index is out of range.
func AcceptRow(tokens, drafts []int32, s0, n, d0 int) (a int, last int32, ok bool) {
	if n < 0 || s0 < 0 || d0 < 0 || s0+n >= len(tokens) || (n > 0 && d0+n > len(drafts)) {
		return 0, 0, false
	}
	for a < n && tokens[s0+a] == drafts[d0+a] {
		a++
	}
	return a, tokens[s0+a], true
}

// CheckAcceptDrafts checks AcceptDrafts' arguments and returns R.
func CheckAcceptDrafts(backend string, out, tokens, drafts, layout Tensor) (int, error) {
	for _, t := range []Tensor{out, tokens, drafts, layout} {
		if t.DType() != I32 {
			return 0, fmt.Errorf("%s: accept_drafts: %v is not I32: %w", backend, t, ErrDType)
		}
	}
	ls, os := layout.Shape(), out.Shape()
	if len(ls) != 2 || ls[1] != 4 || len(os) != 2 || os[0] != 3 || os[1] != ls[0] {
		return 0, fmt.Errorf("%s: accept_drafts: layout %v and out %v: want [R, 4] and [3, R]: %w", backend, ls, os, ErrShape)
	}
	return ls[0], nil
}

// AcceptDraftsInto runs AcceptDrafts on the backend when it is a
// DraftAccepter, else on host copies (three downloads and an upload).
func AcceptDraftsInto(ops Ops, out, tokens, drafts, layout Tensor) error {
	if a, ok := ops.(DraftAccepter); ok {
		return a.AcceptDrafts(out, tokens, drafts, layout)
	}
	if _, err := CheckAcceptDrafts(ops.Name(), out, tokens, drafts, layout); err != nil {
		return err
	}
	var host [3][]int32
	for i, t := range []Tensor{tokens, drafts, layout} {
		var err error
		if host[i], err = ToI32(ops, t); err != nil {
			return err
		}
	}
	res, err := AcceptHost(host[0], host[1], host[2])
	if err != nil {
		return fmt.Errorf("%s: accept_drafts: %w", ops.Name(), err)
	}
	return ops.Upload(out, I32Bytes(res), I32)
}

// AcceptHost is AcceptDrafts over host arrays: it returns out ([3, R]
// flattened) or ErrOutOfRange naming the first bad entry.
func AcceptHost(tokens, drafts, layout []int32) ([]int32, error) {
	r := len(layout) / 4
	out := make([]int32, 3*r)
	for i := range r {
		e := layout[4*i : 4*i+4]
		a, last, ok := AcceptRow(tokens, drafts, int(e[0]), int(e[1]), int(e[2]))
		if !ok {
			return nil, fmt.Errorf("entry %d (s0 %d, n %d, d0 %d) outside %d tokens and %d drafts: %w", i, e[0], e[1], e[2], len(tokens), len(drafts), ErrOutOfRange)
		}
		out[i], out[r+i], out[2*r+i] = int32(a), last, e[3]+int32(a)
	}
	return out, nil
}
