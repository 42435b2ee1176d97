package cuda

/*
#include "api.h"
*/
import "C"

import (
	"bytes"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// maxSampleCandidates is how many survivors of a random row's filters
// (min-p, top-k) the sample kernel keeps in shared memory (16 bytes each);
// rows with more are walked in global memory. The tokens do not depend on it.
const maxSampleCandidates = 4096

// sampleGreedyWhole is DI_SAMPLE_GREEDY_WHOLE: the longest vocabulary that
// a call of greedy rows alone samples one block a row, in one launch.
const sampleGreedyWhole = C.DI_SAMPLE_GREEDY_WHOLE

// topPMargin is kernels/sampling's relative margin around the top-p limit;
// the kernel receives 1 ± topPMargin as Go rounds them.
const topPMargin = 1e-9

var _ kernels.AsyncDeviceSampler = (*Backend)(nil)

// SampleTokens samples one token per logits row on the device (see
// kernels.DeviceSampler and sample.cu): one block per row; greedy rows are
// exact, random rows agree with kernels/sampling except where the draw or
// the top-p limit falls within about 1e-12 of the total mass of the
// boundary between two tokens (the device sums weights rounded to 2^-43,
// the host float64 weights in walk order; CUDA's exp and Go's math.Exp
// may differ in the last bit). The float64 constants of each row (1/T,
// T ln(min_p), top_p and its margins) are computed here with the host
// sampler's expressions, so the device repeats them bit for bit where Go
// does not fuse multiply-adds (amd64).
//
// Cost: one upload of the rows and edits (96 bytes a row, 16 an edit;
// none when they are the last call's: sampleParams), one kernel (for a few
// rows, two chunk kernels before it; one when every row is greedy, none
// when every row is greedy and the vocabulary has at most
// DI_SAMPLE_GREEDY_WHOLE tokens), one download of 12 bytes a row, which
// waits for the queued work. The kernel
// reads each row a few times: once to apply the edits and find
// the maximum (all a greedy row needs); a random row adds three passes for
// top-k's K-th largest logit, one to count the survivors, and either one to
// compact them into shared memory (up to 4096) or, for more survivors,
// about two to six more passes over the row (an exp per survivor in each).
func (b *Backend) SampleTokens(logits kernels.Tensor, rows []kernels.SampleRow) (kernels.Tensor, []int32, error) {
	return b.sampleTokens(logits, rows, maxSampleCandidates)
}

// SampleTokensAsync is SampleTokens that returns before the tokens are
// computed (kernels.AsyncDeviceSampler): the host copy is queued behind the
// sampling into pinned memory and fetch waits for it alone.
func (b *Backend) SampleTokensAsync(logits kernels.Tensor, rows []kernels.SampleRow) (kernels.Tensor, func() ([]int32, error), error) {
	return b.sample(logits, rows, maxSampleCandidates, true)
}

// sampleTokens is SampleTokens with a bound on the survivors held in shared
// memory (0: every random row walks global memory), for tests.
func (b *Backend) sampleTokens(logits kernels.Tensor, rows []kernels.SampleRow, maxCandidates int) (kernels.Tensor, []int32, error) {
	tokens, fetch, err := b.sample(logits, rows, maxCandidates, false)
	if err != nil {
		return nil, nil, err
	}
	host, err := fetch()
	if err != nil {
		return nil, nil, err
	}
	return tokens, host, nil
}

// sample queues the sample kernel; fetch returns the host tokens (already
// downloaded unless async).
func (b *Backend) sample(logits kernels.Tensor, rows []kernels.SampleRow, maxCandidates int, async bool) (kernels.Tensor, func() ([]int32, error), error) {
	const op = "sample"
	l, err := asCUDA(op, "logits", logits)
	if err != nil {
		return nil, nil, err
	}
	vocab, err := kernels.SampleArgs("cuda", l, rows, nil)
	if err != nil {
		return nil, nil, err
	}
	if vocab > C.DI_SAMPLE_MAX_VOCAB {
		return nil, nil, fmt.Errorf("cuda: sample: logits is %v: at most %d tokens: %w", l, C.DI_SAMPLE_MAX_VOCAB, ErrUnsupported)
	}
	n := len(rows)
	if n == 0 {
		return &Tensor{shape: []int{0}, dtype: kernels.I32, buf: &buffer{}}, func() ([]int32, error) { return []int32{}, nil }, nil
	}

	// The kernel's output [3, n] (tokens, statuses, ids; every row's token
	// and status written, an id only with a bad status), and the
	// parameters: the rows, the edits at a 16-byte boundary, then, when a
	// row has an allowed-token mask, each row's mask index and the masks.
	numEdits, numMasks, allGreedy := 0, 0, C.int(1)
	for i := range rows {
		if !rows[i].Greedy {
			allGreedy = 0
		}
		numEdits += len(rows[i].Edits)
		if rows[i].Allowed != nil {
			numMasks++
		}
	}
	words := (vocab + 31) / 32
	rowBytes, editBytes := n*C.sizeof_di_sample_row, numEdits*C.sizeof_di_sample_edit
	maskBytes := 0
	if numMasks > 0 {
		maskBytes = 4 * (n + numMasks*words)
	}
	buf, err := b.AllocEmpty(kernels.I32, 3*n)
	if err != nil {
		return nil, nil, fmt.Errorf("cuda: sample: %w", err)
	}
	blob := make([]uint64, (rowBytes+editBytes+maskBytes+7)/8) // 8-byte aligned for the C structs
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&blob[0])), rowBytes+editBytes+maskBytes)
	packSampleRows(raw[:rowBytes+editBytes], rows, vocab)
	if numMasks > 0 {
		packMasks(raw[rowBytes+editBytes:], rows, words)
	}
	params, err := b.lastSample.get(b, raw)
	if err != nil {
		return nil, nil, fmt.Errorf("cuda: sample: %w", err)
	}
	out := buf.(*Tensor)
	rowsPtr := params.ptr()
	var editsPtr C.di_dptr
	if numEdits > 0 {
		editsPtr = rowsPtr + C.di_dptr(rowBytes)
	}
	if numMasks > 0 {
		maskRows := editsPtr + C.di_dptr(editBytes)
		if numEdits == 0 {
			maskRows = rowsPtr + C.di_dptr(rowBytes)
		}
		if err := b.launch("token_mask", func() C.int {
			return C.c_token_mask(b.lib.api, b.ctx, l.ptr(), C.int(n), C.int(vocab), maskRows, maskRows+C.di_dptr(4*n), C.int(numMasks))
		}, params, l); err != nil {
			return nil, nil, err
		}
	}
	if err := b.launch(op, func() C.int {
		return C.c_sample(b.lib.api, b.ctx, out.ptr(), l.ptr(), C.int(n), C.int(vocab), rowsPtr, editsPtr, C.int(maxCandidates), allGreedy)
	}, out, l, params); err != nil {
		return nil, nil, err
	}
	res, err := b.Rows(buf, 0, 3*n)
	if err != nil {
		return nil, nil, err
	}
	tokens, err := b.Rows(buf, 0, n)
	if err != nil {
		return nil, nil, err
	}
	runtime.KeepAlive(blob)
	if !async {
		hostRaw := make([]byte, 4*3*n)
		dlErr := b.Download(hostRaw, res)
		got, err := sampleResult(kernels.BytesI32(hostRaw), n, dlErr)
		return tokens, func() ([]int32, error) { return got, err }, nil
	}
	slot, err := b.fetches.start(b, res.(*Tensor), 4*3*n)
	if err != nil {
		return nil, nil, fmt.Errorf("cuda: sample: %w", err)
	}
	return tokens, func() ([]int32, error) {
		raw, err := b.fetches.wait(b, slot)
		if err != nil {
			return nil, fmt.Errorf("cuda: sample: %w", err)
		}
		return sampleResult(raw, n, nil)
	}, nil
}

// sampleParams holds the last sample call's parameters in device memory:
// a call whose packed rows, edits and masks are the same bytes (every
// decode step of a steady greedy batch) reads them without an upload.
// The kernels only read them, and a call with other bytes uploads into a
// new buffer, so reuse needs no ordering beyond the stream's.
type sampleParams struct {
	mu    sync.Mutex
	bytes []byte
	t     *Tensor
}

// get returns raw's bytes in device memory (I32), uploading them unless
// they are the last call's. Cost: a comparison of len(raw) bytes, and on
// a change one allocation and one upload.
func (p *sampleParams) get(b *Backend, raw []byte) (*Tensor, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.t != nil && bytes.Equal(p.bytes, raw) {
		return p.t, nil
	}
	t, err := b.AllocEmpty(kernels.I32, len(raw)/4)
	if err != nil {
		return nil, err
	}
	if err := b.Upload(t, raw, kernels.I32); err != nil {
		return nil, err
	}
	p.t, p.bytes = t.(*Tensor), append(p.bytes[:0], raw...)
	return p.t, nil
}

// sampleResult turns the kernel's output [tokens, statuses, ids] into the
// tokens or the first row's error (with dlErr, the download's, attached).
func sampleResult(got []int32, n int, dlErr error) ([]int32, error) {
	for r := range n {
		if st := got[n+r]; st != C.DI_SAMPLE_OK {
			rowErr := &kernels.SampleRowError{Row: r, Reason: sampleStatus(st), Index: int(got[2*n+r])}
			if dlErr != nil {
				return nil, fmt.Errorf("cuda: sample: %w (%v)", rowErr, dlErr)
			}
			return nil, fmt.Errorf("cuda: sample: %w", rowErr)
		}
	}
	if dlErr != nil {
		return nil, dlErr
	}
	return got[:n:n], nil
}

// sampleFetches are two pinned host buffers, each with an event, that take
// the output of a sample launch by an asynchronous copy queued right behind
// it: the host then waits for that event, not for the stream, so work
// queued after the launch (the next forward pass) does not delay it.
type sampleFetches struct {
	slots [2]fetchSlot
	next  int
}

type fetchSlot struct {
	host  unsafe.Pointer // pinned, cap bytes
	cap   int
	ev    unsafe.Pointer
	bytes int
	busy  bool
}

// start queues the copy of src (bytes) into the next free slot and records
// its event. Called under no lock; takes the backend's.
func (f *sampleFetches) start(b *Backend, src *Tensor, bytes int) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("sample_fetch"); err != nil {
		return 0, err
	}
	i := f.next
	sl := &f.slots[i]
	if sl.busy {
		return 0, fmt.Errorf("sample_fetch: more than %d fetches outstanding: %w", len(f.slots), ErrUnsupported)
	}
	if sl.ev == nil {
		if err := b.status("event_create", C.c_event_create(b.lib.api, b.ctx, &sl.ev)); err != nil {
			return 0, err
		}
	}
	if sl.cap < bytes+4 { // the tokens, then the device check word
		if sl.host != nil {
			C.c_host_free(b.lib.api, b.ctx, sl.host)
			sl.host, sl.cap = nil, 0
		}
		size := max(bytes+4, 4096)
		if err := b.status("host_alloc", C.c_host_alloc(b.lib.api, b.ctx, C.uint64_t(size), &sl.host)); err != nil {
			return 0, err
		}
		sl.cap = size
	}
	if err := b.status("download_async", C.c_download_async(b.lib.api, b.ctx, sl.host, src.ptr(), C.uint64_t(bytes))); err != nil {
		return 0, err
	}
	if err := b.status("event_record", C.c_event_record(b.lib.api, b.ctx, sl.ev)); err != nil {
		return 0, err
	}
	runtime.KeepAlive(src)
	sl.bytes, sl.busy = bytes, true
	f.next = (i + 1) % len(f.slots)
	return i, nil
}

// wait blocks until slot i's copy has landed (without the backend's lock,
// so other work can be queued meanwhile) and returns a Go copy of it.
func (f *sampleFetches) wait(b *Backend, i int) ([]int32, error) {
	sl := &f.slots[i]
	if rc := C.c_event_synchronize(b.lib.api, b.ctx, sl.ev); rc != C.DI_OK {
		b.mu.Lock()
		err := b.status("event_synchronize", rc)
		sl.busy = false
		b.mu.Unlock()
		return nil, err
	}
	raw := unsafe.Slice((*byte)(sl.host), sl.bytes+4)
	out := kernels.BytesI32(raw[:sl.bytes])
	check := kernels.BytesI32(raw[sl.bytes:])[0]
	b.mu.Lock()
	sl.busy = false
	b.mu.Unlock()
	if check != 0 {
		// A kernel queued before the copy met a bad index: the sync reports
		// which (and clears the word).
		if err := b.Sync(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// free releases the slots; the backend's lock is held.
func (f *sampleFetches) free(b *Backend) {
	for i := range f.slots {
		sl := &f.slots[i]
		if sl.host != nil {
			C.c_host_free(b.lib.api, b.ctx, sl.host)
		}
		if sl.ev != nil {
			C.c_event_destroy(b.lib.api, b.ctx, sl.ev)
		}
		*sl = fetchSlot{}
	}
}

// sampleStatus names a di_sample_status.
func sampleStatus(st int32) string {
	switch st {
	case C.DI_SAMPLE_NAN:
		return "NaN"
	case C.DI_SAMPLE_POSINF:
		return "+Inf"
	case C.DI_SAMPLE_ALL_NEGINF:
		return "all -Inf"
	}
	return fmt.Sprintf("status %d", st)
}

// packSampleRows writes the di_sample_row array and then the edits of every
// row into raw (8-byte aligned, sized for both).
func packSampleRows(raw []byte, rows []kernels.SampleRow, vocab int) {
	n := len(rows)
	cr := unsafe.Slice((*C.di_sample_row)(unsafe.Pointer(&raw[0])), n)
	var ce []C.di_sample_edit
	if rest := raw[n*C.sizeof_di_sample_row:]; len(rest) > 0 {
		ce = unsafe.Slice((*C.di_sample_edit)(unsafe.Pointer(&rest[0])), len(rest)/C.sizeof_di_sample_edit)
	}
	b2i := func(x bool) C.int32_t {
		if x {
			return 1
		}
		return 0
	}
	e := 0
	for i := range rows {
		r := &rows[i]
		c := &cr[i]
		*c = C.di_sample_row{}
		if !r.Greedy {
			// A greedy row draws nothing: its bytes stay the same from step
			// to step, so that sampleParams can reuse them.
			c.seed, c.step = C.uint64_t(r.Seed), C.uint64_t(r.Step)
			// kernels/sampling's filter: temp := float64(T); 1/temp and
			// temp*math.Log(float64(min_p)).
			temp := float64(r.Temperature)
			c.inv_temp = C.double(1 / temp)
			if r.MinP > 0 {
				c.t_log_min_p = C.double(temp * math.Log(float64(r.MinP)))
			}
		}
		c.top_p = C.double(float64(r.TopP))
		c.top_p_hi, c.top_p_lo = C.double(1+topPMargin), C.double(1-topPMargin)
		c.repetition_penalty = C.float(r.RepetitionPenalty)
		c.presence_penalty = C.float(r.PresencePenalty)
		c.frequency_penalty = C.float(r.FrequencyPenalty)
		if r.TopK > 0 && r.TopK < vocab {
			c.top_k = C.int32_t(r.TopK)
		}
		c.greedy = b2i(r.Greedy)
		c.use_min_p = b2i(r.MinP > 0)
		c.penalized = b2i(r.Penalized())
		c.edit_begin, c.num_edits = C.int32_t(e), C.int32_t(len(r.Edits))
		for _, ed := range r.Edits {
			ce[e] = C.di_sample_edit{token: C.int32_t(ed.Token), count: C.int32_t(ed.Count), bias: C.float(ed.Bias), flags: C.uint32_t(ed.Flags)}
			e++
		}
	}
}

// packMasks writes each row's mask index (I32 [len(rows)], -1: none) and
// then the masks of the rows that have one (U32 [masks, words]) into raw.
func packMasks(raw []byte, rows []kernels.SampleRow, words int) {
	n := len(rows)
	idx := unsafe.Slice((*int32)(unsafe.Pointer(&raw[0])), n)
	masks := unsafe.Slice((*uint32)(unsafe.Pointer(&raw[4*n])), (len(raw)-4*n)/4)
	m := 0
	for i := range rows {
		idx[i] = -1
		if rows[i].Allowed == nil {
			continue
		}
		idx[i] = int32(m)
		copy(masks[m*words:(m+1)*words], rows[i].Allowed[:words])
		m++
	}
}

// Argmax implements kernels.Argmaxer on the device (one block a row).
func (b *Backend) Argmax(out, logits kernels.Tensor) error {
	const op = "argmax"
	o, err := asCUDA(op, "out", out)
	if err != nil {
		return err
	}
	l, err := asCUDA(op, "logits", logits)
	if err != nil {
		return err
	}
	rows, vocab, err := kernels.CheckArgmax("cuda", o, l)
	if err != nil {
		return err
	}
	return b.launch(op, func() C.int {
		return C.c_argmax(b.lib.api, b.ctx, o.ptr(), l.ptr(), C.int(rows), C.int(vocab))
	}, o, l)
}

// FetchI32Async implements kernels.AsyncFetcher with pinned buffers and
// events of its own (the sampler's two are not shared).
func (b *Backend) FetchI32Async(t kernels.Tensor) (func() ([]int32, error), error) {
	const op = "fetch"
	src, err := asCUDA(op, "t", t)
	if err != nil {
		return nil, err
	}
	if src.DType() != kernels.I32 {
		return nil, fmt.Errorf("cuda: fetch: %v is not I32: %w", src, kernels.ErrDType)
	}
	n := kernels.NumElements(src)
	if n == 0 {
		return func() ([]int32, error) { return []int32{}, nil }, nil
	}
	slot, err := b.i32Fetches.start(b, src, 4*n)
	if err != nil {
		return nil, fmt.Errorf("cuda: fetch: %w", err)
	}
	return func() ([]int32, error) {
		got, err := b.i32Fetches.wait(b, slot)
		if err != nil {
			return nil, fmt.Errorf("cuda: fetch: %w", err)
		}
		return got, nil
	}, nil
}

// AcceptDrafts implements kernels.DraftAccepter on the device (a thread an
// entry); a bad index is reported by the next Sync or Download.
func (b *Backend) AcceptDrafts(out, tokens, drafts, layout kernels.Tensor) error {
	const op = "accept_drafts"
	var ts [4]*Tensor
	for i, x := range []kernels.Tensor{out, tokens, drafts, layout} {
		t, err := asCUDA(op, "arg", x)
		if err != nil {
			return err
		}
		ts[i] = t
	}
	r, err := kernels.CheckAcceptDrafts("cuda", out, tokens, drafts, layout)
	if err != nil {
		return err
	}
	nt, nd := kernels.NumElements(tokens), kernels.NumElements(drafts)
	return b.launch(op, func() C.int {
		return C.c_accept_drafts(b.lib.api, b.ctx, ts[0].ptr(), ts[1].ptr(), C.int(nt), ts[2].ptr(), C.int(nd), ts[3].ptr(), C.int(r))
	}, ts[0], ts[1], ts[2], ts[3])
}
