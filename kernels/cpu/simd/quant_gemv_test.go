package simd

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// randBlocks fills n rows of k weights of type t with random bytes (every
// scale, min, nibble and high bit pattern), with the f16 scales set to
// finite values of either sign, and returns them with their dequantization.
func randBlocks(t QuantType, r *rand.Rand, n, k int) ([]byte, []float32) {
	rb, _ := t.RowBytes(k)
	w := make([]byte, n*rb)
	for i := range w {
		w[i] = byte(r.Uint32())
	}
	h := func(p []byte) {
		f := float32(r.NormFloat64() * 0.01)
		binary.LittleEndian.PutUint16(p, F32ToF16(f))
	}
	bb := t.BlockBytes()
	for b := 0; b < len(w); b += bb {
		switch t {
		case QuantQ8_0, QuantQ4_0:
			h(w[b:])
		case QuantQ4_K, QuantQ5_K:
			h(w[b:])
			h(w[b+2:])
		case QuantQ6_K:
			h(w[b+208:])
		}
	}
	deq := make([]float32, n*k)
	t.Dequantize(deq, w)
	return w, deq
}

// TestLinearQuantGEMV checks the register path (m = 1..4) bit for bit
// against LinearF32 over the dequantized rows, on random blocks, for column
// counts that are not multiples of the kernels' column tiles and uneven
// column ranges.
func TestLinearQuantGEMV(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	for _, typ := range QuantTypes {
		for _, n := range []int{1, 2, 3, 5, 7, 9, 13} {
			for _, nblk := range []int{1, 3} {
				k := nblk * typ.BlockSize()
				w, deq := randBlocks(typ, r, n, k)
				const maxM = 4
				x := randVec(r, maxM*k)
				ref := make([]float32, maxM*n)
				goImpl.LinearF32(ref, x, deq, maxM, n, k, 0, n)
				for _, impl := range Impls() {
					for m := 1; m <= maxM; m++ {
						for _, split := range [][]int{{0, n}, {0, n / 2, n}, {0, 1, n / 3 * 2, n}} {
							out := sentinelVec(m * n)
							for s := 0; s+1 < len(split); s++ {
								if split[s] < split[s+1] {
									impl.LinearQuant(out, x, w, typ, m, n, k, split[s], split[s+1])
								}
							}
							for idx, v := range out {
								if math.Float32bits(v) != math.Float32bits(ref[idx]) {
									t.Fatalf("%s %s n=%d k=%d m=%d split %v: out[%d] = %g, want %g (bits)",
										impl, typ, n, k, m, split, idx, v, ref[idx])
								}
							}
						}
					}
				}
			}
		}
	}
}
