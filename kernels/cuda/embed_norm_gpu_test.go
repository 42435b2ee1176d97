package cuda

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// EmbedNormConcat (one launch) gives the bits of Embedding, two RMSNorms
// and Concat (Options.DisableEmbedNorm) for tables of float32, BF16 and F16,
// rows 1 to 8 and widths on both of rms_norm's paths (256 and 2048 held,
// 7168 past 4 values a thread: its loop); an id outside the table gives
// the same row (zeros, normalized) and the same error at the next Sync.
func TestGPUEmbedNormConcat(t *testing.T) {
	fused := newGPUOpts(t, Options{})
	apart := newGPUOpts(t, Options{DisableEmbedNorm: true})
	r := rand.New(rand.NewPCG(21, 4))
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		for _, h := range []int{256, 2048, 7168} {
			for _, rows := range []int{1, 3, 8} {
				for _, bad := range []bool{false, true} {
					if bad && rows != 3 {
						continue
					}
					t.Run(fmt.Sprintf("%s/h=%d/rows=%d/bad_id=%v", dt, h, rows, bad), func(t *testing.T) {
						const vocab, eps = 50, 1e-6
						table, en, xn := randVals(r, vocab*h, 1), randVals(r, h, 2), randVals(r, h, 2)
						x := randVals(r, rows*h, 3)
						ids := make([]int32, rows)
						for i := range ids {
							ids[i] = int32(r.IntN(vocab))
						}
						if bad {
							ids[1] = vocab + 3
						}
						var outs [2][]float32
						for i, g := range []*Backend{fused, apart} {
							out, err := g.Alloc(kernels.F32, rows, 2*h)
							if err != nil {
								t.Fatal(err)
							}
							err = g.EmbedNormConcat(out,
								upload(t, g, dt, hostBytes(dt, table), dt, vocab, h),
								upload(t, g, kernels.I32, kernels.I32Bytes(ids), kernels.I32, rows),
								upload(t, g, kernels.F32, kernels.F32Bytes(en), kernels.F32, h),
								upload(t, g, kernels.F32, kernels.F32Bytes(x), kernels.F32, rows, h),
								upload(t, g, kernels.F32, kernels.F32Bytes(xn), kernels.F32, h), eps)
							if err != nil {
								t.Fatal(err)
							}
							serr := g.Sync()
							if bad != errors.Is(serr, kernels.ErrOutOfRange) {
								t.Fatalf("backend %d: Sync error %v with an id outside the table: %v", i, serr, bad)
							}
							outs[i] = moeDownload(t, g, out)
						}
						if i, ok := moeEqual(outs[0], outs[1]); !ok {
							t.Fatalf("out[%d] = %v, the four operations give %v", i, outs[0][i], outs[1][i])
						}
					})
				}
			}
		}
	}
}
