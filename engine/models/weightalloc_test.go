package models

import (
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// weightAllocOps is plainOps with the kernels.WeightAllocator of the CPU
// backend it wraps, counting the bytes asked of it.
type weightAllocOps struct {
	kernels.Ops
	w     kernels.WeightAllocator
	bytes int
}

func (o *weightAllocOps) AllocWeight(dt kernels.DType, shape ...int) (kernels.Tensor, error) {
	o.bytes += numel(shape) * dt.Size()
	return o.w.AllocWeight(dt, shape...)
}

// Models load every stored matrix into memory from the backend's
// AllocWeight, and nothing a forward pass allocates comes from it; the
// logits are those of a backend without it, to the bit.
func TestWeightsFromAllocWeight(t *testing.T) {
	cpuOps := newBackend(t, 2)
	for _, name := range tinyNames {
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F32} {
			ops := &weightAllocOps{Ops: cpuOps, w: cpuOps}
			m, w := tinyModel(t, ops, name, dt)
			matrices := 0
			for _, wt := range w {
				if len(wt.Shape) >= 2 {
					matrices += len(wt.Data)
				}
			}
			if ops.bytes < matrices {
				t.Errorf("%s %v: %d bytes from AllocWeight, want at least the %d of the stored matrices", name, dt, ops.bytes, matrices)
			}
			loaded := ops.bytes
			ids := randomIDs(rand.New(rand.NewPCG(5, 6)), 7, 97)
			got, _ := step(t, m, mustCache(t, m), seqStep{ids, 0, []int32{2, 0}})
			if ops.bytes != loaded {
				t.Errorf("%s %v: a forward pass took %d bytes from AllocWeight", name, dt, ops.bytes-loaded)
			}
			plain, _ := tinyModel(t, plainOps{cpuOps}, name, dt)
			want, _ := step(t, plain, mustCache(t, plain), seqStep{ids, 0, []int32{2, 0}})
			for p := range want {
				if !sameBits(got[p], want[p]) {
					t.Errorf("%s %v: position %d: logits differ with weights from AllocWeight", name, dt, p)
					break
				}
			}
		}
	}
}
