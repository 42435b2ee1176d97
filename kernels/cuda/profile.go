package cuda

/*
#include "api.h"
*/
import "C"

import (
	"cmp"
	"fmt"
	"slices"
	"unsafe"
)

// The per-operation device profile (Options.profile, which only this
// package's tests set): every operation queued outside graph capture is
// bracketed by two CUDA events and its device time is added to its name's
// total (OpProfile). It costs two event records per operation and a host
// wait every profileBatch operations: for finding where the time goes, not
// for timing runs.

// profileBatch is how many bracketed operations wait for their times.
const profileBatch = 512

// OpTime is the device time spent in one named operation.
type OpTime struct {
	Op     string
	Calls  int
	Millis float64
}

// profiler holds the events of the operations not yet read and the totals.
// Guarded by the backend's lock.
type profiler struct {
	pending   []profileMark
	free      []unsafe.Pointer
	totals    map[string]*OpTime
	capturing bool
	err       error // the first event failure; the profile stops there
}

type profileMark struct {
	op         string
	start, end unsafe.Pointer
}

func newProfiler() *profiler {
	return &profiler{totals: map[string]*OpTime{}}
}

// event returns a free event or creates one. The caller holds b.mu.
func (p *profiler) event(b *Backend) unsafe.Pointer {
	if n := len(p.free); n > 0 {
		ev := p.free[n-1]
		p.free = p.free[:n-1]
		return ev
	}
	var ev unsafe.Pointer
	if err := b.status("event_create", C.c_event_create(b.lib.api, b.ctx, &ev)); err != nil {
		p.err = err
		return nil
	}
	return ev
}

// around runs fn bracketed by events when profiling is on and the stream is
// not being captured. The caller holds b.mu.
func (p *profiler) around(b *Backend, op string, fn func() C.int) C.int {
	if p == nil || p.capturing || p.err != nil {
		return fn()
	}
	start, end := p.event(b), p.event(b)
	if start == nil || end == nil {
		return fn()
	}
	C.c_event_record(b.lib.api, b.ctx, start)
	rc := fn()
	C.c_event_record(b.lib.api, b.ctx, end)
	p.pending = append(p.pending, profileMark{op, start, end})
	if len(p.pending) >= profileBatch {
		p.drain(b)
	}
	return rc
}

// drain waits for the pending operations and adds their times. The caller
// holds b.mu.
func (p *profiler) drain(b *Backend) {
	if len(p.pending) == 0 {
		return
	}
	last := p.pending[len(p.pending)-1].end
	if err := b.status("event_synchronize", C.c_event_synchronize(b.lib.api, b.ctx, last)); err != nil {
		p.err = err
	}
	for _, m := range p.pending {
		var ms C.float
		if p.err == nil {
			if err := b.status("event_elapsed", C.c_event_elapsed_ms(b.lib.api, b.ctx, m.start, m.end, &ms)); err != nil {
				p.err = err
			}
		}
		t := p.totals[m.op]
		if t == nil {
			t = &OpTime{Op: m.op}
			p.totals[m.op] = t
		}
		t.Calls++
		t.Millis += float64(ms)
		p.free = append(p.free, m.start, m.end)
	}
	p.pending = p.pending[:0]
}

// close destroys the events. The caller holds b.mu, before the context goes.
func (p *profiler) close(b *Backend) {
	if p == nil {
		return
	}
	for _, m := range p.pending {
		p.free = append(p.free, m.start, m.end)
	}
	for _, ev := range p.free {
		C.c_event_destroy(b.lib.api, b.ctx, ev)
	}
	p.pending, p.free = nil, nil
}

// OpProfile returns the device time per operation name since the backend
// was opened (or the last reset), largest first, after waiting for the
// operations still queued. It is nil unless the backend profiles (a
// switch only this package's tests and benchmarks turn on).
func (b *Backend) OpProfile(reset bool) ([]OpTime, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.prof
	if p == nil {
		return nil, nil
	}
	if err := b.checkOpen("profile"); err != nil {
		return nil, err
	}
	p.drain(b)
	out := make([]OpTime, 0, len(p.totals))
	for _, t := range p.totals {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(x, y OpTime) int { return cmp.Compare(y.Millis, x.Millis) })
	if reset {
		p.totals = map[string]*OpTime{}
	}
	return out, p.err
}

// sizeClass names a row count by its power-of-two bucket, for profile keys.
func sizeClass(m int) string {
	c := 1
	for c < m {
		c *= 2
	}
	return fmt.Sprintf("m<=%d", c)
}

// FormatOpProfile renders the first top entries of a profile as aligned
// lines: name, calls, total milliseconds, share of all entries and
// microseconds a call.
func FormatOpProfile(prof []OpTime, top int) []string {
	total := 0.0
	for _, t := range prof {
		total += t.Millis
	}
	var lines []string
	for i, t := range prof {
		if i == top {
			break
		}
		lines = append(lines, fmt.Sprintf("%-40s %7d calls %10.3f ms %5.1f%% %9.2f us/call",
			t.Op, t.Calls, t.Millis, 100*t.Millis/total, 1e3*t.Millis/float64(t.Calls)))
	}
	return lines
}

// skippable are the operation names Options.skip accepts: the backend then
// does not queue them at all, a timing ablation for finding what an
// operation costs inside a captured graph, where the profile cannot bracket
// it (a step's time with and without it). Results are wrong while any is
// skipped, so only this package's tests and benchmarks set it.
var skippable = []string{"add", "add_rms_norm", "attention", "concat", "embedding", "gated_mlp", "linear", "logits",
	"mla_attention", "moe", "moe_route", "qkv_prepare", "resolve_placeholders", "rms_norm", "rope", "sample",
	"shift_accepted", "silu_mul", "split_columns", "write_cache"}
