// Package opstest has kernels.Ops wrappers for tests of the code above the
// backends: they count what a caller asks of a backend, or fill what it
// leaves unwritten with NaN.
package opstest

import (
	"sync/atomic"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// Counting counts the host-to-device copies (Upload) and the allocations
// (Alloc) asked of the backend it wraps. It hides the backend's optional
// interfaces, so kernels.AllocEmpty falls back to a counted Alloc. Not
// safe for concurrent use.
type Counting struct {
	kernels.Ops
	Uploads, Allocs int
}

// Alloc counts, then allocates on the wrapped backend.
func (c *Counting) Alloc(dt kernels.DType, shape ...int) (kernels.Tensor, error) {
	c.Allocs++
	return c.Ops.Alloc(dt, shape...)
}

// Upload counts, then uploads on the wrapped backend.
func (c *Counting) Upload(t kernels.Tensor, src []byte, dt kernels.DType) error {
	c.Uploads++
	return c.Ops.Upload(t, src, dt)
}

// NaNEmpty is the CPU backend with every AllocEmpty tensor filled with NaN
// bytes (0xFF: NaN in F32, BF16 and F16, -1 in I32), where a backend
// without the zero fill hands out whatever its cache held: a read of an
// element nobody wrote shows in the results. It keeps the backend's
// optional interfaces. Safe for concurrent use as the backend is.
type NaNEmpty struct {
	*cpu.Backend
	calls atomic.Int64
}

// AllocEmpty allocates on the backend, then fills with NaN bytes.
func (n *NaNEmpty) AllocEmpty(dt kernels.DType, shape ...int) (kernels.Tensor, error) {
	n.calls.Add(1)
	t, err := n.Backend.Alloc(dt, shape...)
	if err != nil || dt.Size() == 0 {
		return t, err
	}
	raw := make([]byte, kernels.NumElements(t)*dt.Size())
	for i := range raw {
		raw[i] = 0xFF
	}
	return t, n.Backend.Upload(t, raw, dt)
}

// EmptyAllocs is how many AllocEmpty calls n has served.
func (n *NaNEmpty) EmptyAllocs() int64 { return n.calls.Load() }
