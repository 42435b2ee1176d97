package models

import (
	"fmt"
	"slices"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// Weights is where a model reads its tensors; *weights.Checkpoint implements
// it, and MemWeights holds tensors built in memory.
type Weights interface {
	Tensor(name string) (weights.Tensor, error)
	Has(name string) bool
}

// MemWeights is an in-memory Weights, for models built without files.
type MemWeights map[string]weights.Tensor

// Tensor returns the named tensor or an error wrapping weights.ErrNotFound.
func (m MemWeights) Tensor(name string) (weights.Tensor, error) {
	t, ok := m[name]
	if !ok {
		return weights.Tensor{}, fmt.Errorf("memory weights: tensor %q: %w", name, weights.ErrNotFound)
	}
	return t, nil
}

// Has reports whether the named tensor exists.
func (m MemWeights) Has(name string) bool { _, ok := m[name]; return ok }

func toKernelDType(d weights.DType) (kernels.DType, bool) {
	switch d {
	case weights.F32:
		return kernels.F32, true
	case weights.BF16:
		return kernels.BF16, true
	case weights.F16:
		return kernels.F16, true
	}
	return 0, false
}

// loader copies tensors from a Weights into backend memory, remembering the
// first error so that a constructor can read many tensors and check once.
type loader struct {
	ops kernels.Ops
	src Weights
	err error
}

func (l *loader) fail(err error) {
	if l.err == nil {
		l.err = err
	}
}

// get returns the named tensor after checking its shape and float dtype.
func (l *loader) get(name string, shape ...int) (weights.Tensor, kernels.DType, bool) {
	if l.err != nil {
		return weights.Tensor{}, 0, false
	}
	t, err := l.src.Tensor(name)
	if err != nil {
		l.fail(fmt.Errorf("models: %w: %w", ErrWeights, err))
		return t, 0, false
	}
	if !slices.Equal(t.Shape, shape) {
		l.fail(fmt.Errorf("models: %s: tensor %q has shape %v, want %v: %w", t.File, name, t.Shape, shape, ErrWeights))
		return t, 0, false
	}
	dt, ok := toKernelDType(t.DType)
	if !ok {
		l.fail(fmt.Errorf("models: %s: tensor %q has dtype %v, want F32, BF16 or F16: %w", t.File, name, t.DType, ErrWeights))
		return t, 0, false
	}
	return t, dt, true
}

// matrix uploads a weight in its stored dtype.
func (l *loader) matrix(name string, shape ...int) kernels.Tensor {
	t, dt, ok := l.get(name, shape...)
	if !ok {
		return nil
	}
	dst, err := l.ops.Alloc(dt, shape...)
	if err == nil {
		err = l.ops.Upload(dst, t.Data, dt)
	}
	if err != nil {
		l.fail(fmt.Errorf("models: tensor %q: %w", name, err))
		return nil
	}
	return dst
}

// into uploads a weight into dst (a view of a fused tensor); its dtype must
// match dst's.
func (l *loader) into(dst kernels.Tensor, name string, shape ...int) {
	t, dt, ok := l.get(name, shape...)
	if !ok {
		return
	}
	if dt != dst.DType() {
		l.fail(fmt.Errorf("models: %s: tensor %q has dtype %v, fused with %v tensors: %w", t.File, name, dt, dst.DType(), ErrWeights))
		return
	}
	if err := l.ops.Upload(dst, t.Data, dt); err != nil {
		l.fail(fmt.Errorf("models: tensor %q: %w", name, err))
	}
}

// dtypeOf returns the stored dtype of the named tensor (F32 if unreadable;
// the error surfaces when the tensor is loaded).
func (l *loader) dtypeOf(name string) kernels.DType {
	if t, err := l.src.Tensor(name); err == nil {
		if dt, ok := toKernelDType(t.DType); ok {
			return dt
		}
	}
	return kernels.F32
}

// fused stacks several weights along dimension 0 into one tensor of their
// stored dtype: parts[i] has rows[i] rows of cols columns.
func (l *loader) fused(cols int, names []string, rows []int) kernels.Tensor {
	if l.err != nil {
		return nil
	}
	total := 0
	for _, r := range rows {
		total += r
	}
	dst, err := l.ops.Alloc(l.dtypeOf(names[0]), total, cols)
	if err != nil {
		l.fail(fmt.Errorf("models: tensor %q: %w", names[0], err))
		return nil
	}
	lo := 0
	for i, name := range names {
		view, err := l.ops.Rows(dst, lo, lo+rows[i])
		if err != nil {
			l.fail(err)
			return nil
		}
		l.into(view, name, rows[i], cols)
		lo += rows[i]
	}
	return dst
}

// vector uploads a 1-D parameter (norm weight, bias) converted to the
// activation dtype.
func (l *loader) vector(name string, n int) kernels.Tensor {
	t, dt, ok := l.get(name, n)
	if !ok {
		return nil
	}
	act := l.ops.ActivationDType()
	dst, err := l.ops.Alloc(act, n)
	if err == nil {
		err = l.ops.Upload(dst, t.Data, dt)
	}
	if err != nil {
		l.fail(fmt.Errorf("models: tensor %q: %w", name, err))
		return nil
	}
	return dst
}

// optVector is vector for a parameter that may be absent (nil then).
func (l *loader) optVector(name string, n int) kernels.Tensor {
	if l.err != nil || !l.src.Has(name) {
		return nil
	}
	return l.vector(name, n)
}

// fusedVector concatenates 1-D parameters (e.g. gate and up biases) in the
// activation dtype; nil when the first is absent.
func (l *loader) fusedVector(names []string, sizes []int) kernels.Tensor {
	if l.err != nil || !l.src.Has(names[0]) {
		return nil
	}
	total := 0
	for _, s := range sizes {
		total += s
	}
	dst, err := l.ops.Alloc(l.ops.ActivationDType(), total)
	if err != nil {
		l.fail(err)
		return nil
	}
	lo := 0
	for i, name := range names {
		t, dt, ok := l.get(name, sizes[i])
		if !ok {
			return nil
		}
		view, err := l.ops.Rows(dst, lo, lo+sizes[i])
		if err == nil {
			err = l.ops.Upload(view, t.Data, dt)
		}
		if err != nil {
			l.fail(fmt.Errorf("models: tensor %q: %w", name, err))
			return nil
		}
		lo += sizes[i]
	}
	return dst
}
