package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// GatedMLP's paired GEMV (gated_linear: the gate/up linear and SiLU-mul
// in one kernel where the GEMV serves the linear) gives the bits of the
// linear followed by SiLUMul: act and out equal to the backend with
// Options.DisableGatedGEMV, for F32, BF16 and F16 weights, both GEMM
// modes, 1 to 4 rows (the GEMV's) and 6 (cuBLAS: the fallback inside
// gated_linear), k within one pass of the GEMV's block (its wide one-row
// form) and beyond it, and an intermediate size whose last block has fewer
// columns than it takes.
func TestGPUGatedGEMV(t *testing.T) {
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		fused := newGPUOpts(t, Options{GEMM: mode})
		plain := newGPUOpts(t, Options{GEMM: mode, DisableGatedGEMV: true})
		r := rand.New(rand.NewPCG(5, uint64(mode)))
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
			for _, sh := range []struct{ rows, hidden, n int }{{1, 2048, 1408}, {1, 3072, 1410}, {2, 256, 384}, {3, 2048, 1410}, {4, 512, 96}, {6, 512, 96}} {
				t.Run(fmt.Sprintf("%s/%s/rows=%d_k%d_n%d", mode, dt, sh.rows, sh.hidden, sh.n), func(t *testing.T) {
					xs := kernels.F32Bytes(randVals(r, sh.rows*sh.hidden, 1))
					wgu, wd := hostBytes(dt, randVals(r, 2*sh.n*sh.hidden, 0.05)), hostBytes(dt, randVals(r, sh.hidden*sh.n, 0.05))
					run := func(g *Backend) (out, act []float32) {
						x := upload(t, g, kernels.F32, xs, kernels.F32, sh.rows, sh.hidden)
						gw := upload(t, g, dt, wgu, dt, 2*sh.n, sh.hidden)
						dw := upload(t, g, dt, wd, dt, sh.hidden, sh.n)
						o, gu, a := allocF32(t, g, sh.rows, sh.hidden), allocF32(t, g, sh.rows, 2*sh.n), allocF32(t, g, sh.rows, sh.n)
						if err := g.GatedMLP(o, x, gw, dw, gu, a); err != nil {
							t.Fatal(err)
						}
						return moeDownload(t, g, o), moeDownload(t, g, a)
					}
					gotOut, gotAct := run(fused)
					wantOut, wantAct := run(plain)
					if i, ok := moeEqual(gotAct, wantAct); !ok {
						t.Fatalf("act[%d] = %v, the linear and SiLUMul's %v", i, gotAct[i], wantAct[i])
					}
					if i, ok := moeEqual(gotOut, wantOut); !ok {
						t.Fatalf("out[%d] = %v, %v without the paired GEMV", i, gotOut[i], wantOut[i])
					}
					for i, v := range gotAct {
						if math.IsNaN(float64(v)) {
							t.Fatalf("act[%d] is NaN", i)
						}
					}
				})
			}
		}
	}
}

func allocF32(t *testing.T, g *Backend, shape ...int) kernels.Tensor {
	t.Helper()
	ten, err := g.Alloc(kernels.F32, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}
