package cuda

/*
#include "api.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// Graph is an instantiated CUDA graph: a captured sequence of the backend's
// operations that Replay launches again as one unit, on the same device
// addresses. Inputs must live in tensors allocated before capture; write them
// (Upload, or operations queued before Replay) and read the outputs after.
type Graph struct {
	b     *Backend
	exec  unsafe.Pointer
	nodes int
}

// Nodes is the number of nodes the graph captured: its kernel launches,
// copies and memsets (a census of a step's launches without a profiler).
func (g *Graph) Nodes() int { return g.nodes }

// BeginCapture starts recording the backend's stream: operations called
// until EndCapture are recorded, not run. Upload, Download, Sync and MoE
// fail while capturing (they need the host). Tensors allocated while
// capturing (scratch and outputs alike) are zeroed again at every replay,
// and their memory forms the graphs' shared pool: while any graph exists it
// is reused only by allocations made during capture, never by eager work.
func (b *Backend) BeginCapture() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("graph_begin"); err != nil {
		return err
	}
	if err := b.status("graph_begin", C.c_graph_begin(b.lib.api, b.ctx)); err != nil {
		return err
	}
	if b.prof != nil {
		b.prof.capturing = true
	}
	return nil
}

// EndCapture stops recording and instantiates the graph. While any graph
// exists the allocator keeps its cached blocks (the graph may point into
// them).
func (b *Backend) EndCapture() (*Graph, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("graph_end"); err != nil {
		return nil, err
	}
	if b.prof != nil {
		b.prof.capturing = false
	}
	var x unsafe.Pointer
	var n C.size_t
	if err := b.status("graph_end", C.c_graph_end(b.lib.api, b.ctx, &x, &n)); err != nil {
		return nil, err
	}
	return &Graph{b: b, exec: x, nodes: int(n)}, nil
}

// Replayer is a captured graph as CaptureGraph returns it: an alias of an
// interface literal, so that a caller can name the capability (a method
// CaptureGraph(func() error) (interface{ Replay() error; Close() error }, error))
// without importing this package.
type Replayer = interface {
	Replay() error
	Close() error
}

// CaptureGraph records the operations fn queues (BeginCapture, fn,
// EndCapture) and returns the instantiated graph. When fn fails, the capture
// is ended, the partial graph destroyed and fn's error returned. Cost: fn's
// host time plus one graph instantiation; nothing runs on the device.
func (b *Backend) CaptureGraph(fn func() error) (Replayer, error) {
	if err := b.BeginCapture(); err != nil {
		return nil, err
	}
	ferr := fn()
	g, err := b.EndCapture()
	if ferr != nil {
		if g != nil {
			g.Close()
		}
		return nil, ferr
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

// CopyRect copies src [r, c] into the first r rows and c columns of dst
// [R, C] (R >= r, C >= c, the same dtype), on the device: one strided copy,
// allowed while capturing. Cost: r*c elements read and written.
func (b *Backend) CopyRect(dst, src kernels.Tensor) error {
	const op = "copy_rect"
	d, err := asCUDA(op, "dst", dst)
	if err != nil {
		return err
	}
	s, err := asCUDA(op, "src", src)
	if err != nil {
		return err
	}
	if len(d.shape) != 2 || len(s.shape) != 2 || s.shape[0] > d.shape[0] || s.shape[1] > d.shape[1] || s.dtype != d.dtype {
		return fmt.Errorf("cuda: %s: %v into %v: %w", op, s, d, kernels.ErrShape)
	}
	if d.dtype.Size() == 0 { // MXFP4 weights (mxfp4.go): no per-element size
		return fmt.Errorf("cuda: %s: %v into %v: not a dense dtype: %w", op, s, d, kernels.ErrDType)
	}
	es := uint64(d.dtype.Size())
	return b.launch(op, func() C.int {
		return C.c_copy_2d(b.lib.api, b.ctx, d.ptr(), C.uint64_t(uint64(d.shape[1])*es), s.ptr(), C.uint64_t(uint64(s.shape[1])*es),
			C.uint64_t(uint64(s.shape[1])*es), C.uint64_t(s.shape[0]))
	}, d, s)
}

// MaxRects is how many copies one CopyRects call takes.
const MaxRects = int(C.DI_MAX_RECTS)

// CopyRects is CopyRect for each pair dsts[i], srcs[i], in one kernel
// launch (at most MaxRects pairs; allowed while capturing). The
// destinations must not overlap: the copies run concurrently. Cost: the
// elements of every pair read and written, one launch.
func (b *Backend) CopyRects(dsts, srcs []kernels.Tensor) error {
	const op = "copy_rects"
	if len(dsts) != len(srcs) || len(dsts) > MaxRects {
		return fmt.Errorf("cuda: %s: %d destinations and %d sources (at most %d): %w", op, len(dsts), len(srcs), MaxRects, kernels.ErrShape)
	}
	var rects [C.DI_MAX_RECTS]C.di_rect
	keep := make([]*Tensor, 0, 2*len(dsts))
	for i := range dsts {
		d, err := asCUDA(op, "dst", dsts[i])
		if err != nil {
			return err
		}
		s, err := asCUDA(op, "src", srcs[i])
		if err != nil {
			return err
		}
		if len(d.shape) != 2 || len(s.shape) != 2 || s.shape[0] > d.shape[0] || s.shape[1] > d.shape[1] || s.dtype != d.dtype || d.dtype.Size() == 0 {
			return fmt.Errorf("cuda: %s: pair %d: %v into %v: %w", op, i, s, d, kernels.ErrShape)
		}
		es := uint64(d.dtype.Size())
		rects[i] = C.di_rect{dst: d.ptr(), src: s.ptr(), dst_pitch: C.uint64_t(uint64(d.shape[1]) * es),
			src_pitch: C.uint64_t(uint64(s.shape[1]) * es), width_bytes: C.uint64_t(uint64(s.shape[1]) * es), rows: C.uint64_t(s.shape[0])}
		keep = append(keep, d, s)
	}
	return b.launch(op, func() C.int {
		return C.c_copy_rects(b.lib.api, b.ctx, &rects[0], C.int(len(dsts)))
	}, keep...)
}

// Replay queues the graph on the backend's stream. Cost: one launch.
func (g *Graph) Replay() error {
	b := g.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("graph_replay"); err != nil {
		return err
	}
	if g.exec == nil {
		return fmt.Errorf("cuda: graph_replay: graph closed: %w", ErrCUDA)
	}
	return b.status("graph_replay", C.c_graph_replay(b.lib.api, b.ctx, g.exec))
}

// Close waits for queued work and destroys the graph.
func (g *Graph) Close() error {
	b := g.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if g.exec == nil || b.closed.Load() {
		g.exec = nil
		return nil
	}
	err := b.status("graph_destroy", C.c_graph_destroy(b.lib.api, b.ctx, g.exec))
	g.exec = nil
	return err
}

// Event is a CUDA event on the backend's stream, for timing device work.
type Event struct {
	b  *Backend
	ev unsafe.Pointer
}

// NewEvent creates a timing event.
func (b *Backend) NewEvent() (*Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("event_create"); err != nil {
		return nil, err
	}
	var ev unsafe.Pointer
	if err := b.status("event_create", C.c_event_create(b.lib.api, b.ctx, &ev)); err != nil {
		return nil, err
	}
	return &Event{b: b, ev: ev}, nil
}

// Record queues the event on the stream.
func (e *Event) Record() error {
	e.b.mu.Lock()
	defer e.b.mu.Unlock()
	if err := e.b.checkOpen("event_record"); err != nil {
		return err
	}
	return e.b.status("event_record", C.c_event_record(e.b.lib.api, e.b.ctx, e.ev))
}

// Elapsed waits for end and returns the device time from e to end. The
// wait does not hold the backend's lock: other goroutines queue work
// meanwhile.
func (e *Event) Elapsed(end *Event) (float64, error) {
	if err := e.b.checkOpen("event_elapsed"); err != nil {
		return 0, err
	}
	if rc := C.c_event_synchronize(e.b.lib.api, e.b.ctx, end.ev); rc != C.DI_OK {
		e.b.mu.Lock()
		defer e.b.mu.Unlock()
		return 0, e.b.status("event_synchronize", rc)
	}
	e.b.mu.Lock()
	defer e.b.mu.Unlock()
	if err := e.b.checkOpen("event_elapsed"); err != nil {
		return 0, err
	}
	var ms C.float
	if err := e.b.status("event_elapsed", C.c_event_elapsed_ms(e.b.lib.api, e.b.ctx, e.ev, end.ev, &ms)); err != nil {
		return 0, err
	}
	return float64(ms), nil
}

// Close destroys the event.
func (e *Event) Close() error {
	e.b.mu.Lock()
	defer e.b.mu.Unlock()
	if e.ev == nil || e.b.closed.Load() {
		e.ev = nil
		return nil
	}
	err := e.b.status("event_destroy", C.c_event_destroy(e.b.lib.api, e.b.ctx, e.ev))
	e.ev = nil
	return err
}
