package models

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// nanEmpty hands out AllocEmpty tensors filled with NaN, where a backend
// without the zero fill would hand out whatever its cache held: a read of
// an element nobody wrote shows in the results.
type nanEmpty struct {
	*cpu.Backend // every operation of the CPU backend, its optional ones included
	calls        int
}

func (n *nanEmpty) AllocEmpty(dt kernels.DType, shape ...int) (kernels.Tensor, error) {
	n.calls++
	t, err := n.Backend.Alloc(dt, shape...)
	if err != nil || dt.Size() == 0 {
		return t, err
	}
	raw := make([]byte, kernels.NumElements(t)*dt.Size())
	for i := range raw {
		raw[i] = 0xFF // NaN in F32, BF16 and F16; -1 in I32
	}
	return t, n.Backend.Upload(t, raw, dt)
}

// TestScratchWrittenBeforeRead: the models' scratch buffers come without a
// zero fill (kernels.AllocEmpty), so each must be written before it is
// read. With the empty ones filled with NaN, every architecture's logits
// over a prefill, a decode step and a batch of both equal those with
// zero-filled scratch, bit for bit (the Llama and DeepSeek families and
// Gemma 3).
func TestScratchWrittenBeforeRead(t *testing.T) {
	base := newBackend(t, 2)
	for _, name := range append(append([]string{}, tinyNames...), "gemma3") {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(31, 7))
			prompt, next, other := randomIDs(r, 7, 97), randomIDs(r, 1, 97), randomIDs(r, 5, 97)
			var outs [2][][]float32
			empty := &nanEmpty{Backend: base}
			for i, ops := range []kernels.Ops{base, empty} {
				var m Model
				if name == "gemma3" { // its sliding-window layers paged
					m, _ = gemma3Model(t, ops, "pattern", true)
				} else {
					m, _ = tinyModel(t, ops, name, kernels.BF16)
				}
				cache := mustCache(t, m)
				a, _ := step(t, m, cache, seqStep{prompt, 0, []int32{3, 1}})
				b, _ := step(t, m, cache, seqStep{next, len(prompt), []int32{3, 1}}, seqStep{other, 0, []int32{0, 2}})
				outs[i] = append(a, b...)
			}
			if empty.calls == 0 {
				t.Fatal("no scratch buffer came from AllocEmpty")
			}
			for p := range outs[0] {
				for j, v := range outs[1][p] {
					if math.IsNaN(float64(v)) || math.Float32bits(v) != math.Float32bits(outs[0][p][j]) {
						t.Fatalf("row %d, logit %d: %v with NaN-filled scratch, %v with zeroed", p, j, v, outs[0][p][j])
					}
				}
			}
		})
	}
}
