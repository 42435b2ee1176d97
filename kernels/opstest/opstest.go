// Package opstest has kernels.Ops wrappers for tests of the code above the
// backends: they count what a caller asks of a backend.
package opstest

import "github.com/deepinfer/deepinfer-go/kernels"

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
