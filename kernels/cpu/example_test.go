package cpu_test

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// Linear with BF16 weights kept in their stored dtype: y = x W^T + b.
func ExampleBackend_Linear() {
	ops := cpu.New(cpu.Options{Threads: 2})
	defer ops.Close()
	x, _ := kernels.FromF32(ops, []float32{1, 2, 3}, 1, 3)
	w, _ := ops.Alloc(kernels.BF16, 2, 3)
	bits := make([]uint16, 6)
	for i, v := range []float32{1, 0, 0, 0.5, 0.5, 0.5} {
		bits[i] = kernels.F32ToBF16(v)
	}
	if err := ops.Upload(w, kernels.U16Bytes(bits), kernels.BF16); err != nil {
		panic(err)
	}
	bias, _ := kernels.FromF32(ops, []float32{10, 20}, 2)
	y, _ := ops.Alloc(kernels.F32, 1, 2)
	if err := ops.Linear(y, x, w, bias); err != nil {
		panic(err)
	}
	v, _ := kernels.ToF32(ops, y)
	fmt.Println(v)
	// Output: [11 23]
}
