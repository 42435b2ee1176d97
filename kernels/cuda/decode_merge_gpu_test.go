package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// The tensor-core decode kernel merges a row's chunks in its last block
// (DEEPINFER_CUDA_DEC_FUSE, default on) with the bits of the separate merge
// kernel (DEEPINFER_CUDA_DEC_FUSE=0): rows of one to many chunks, a chunk
// left empty by a sliding window, a mixed batch, both head sizes and cache
// types; called again and replayed from a graph, the counters rearm and give
// the same bits.
func TestGPUDecodeMergeFused(t *testing.T) {
	cases := []struct {
		name   string
		ap     kernels.AttentionParams
		cache  kernels.DType
		seqs   [][2]int
		window int
	}{
		{"d64-f16-decode", kernels.AttentionParams{NumHeads: 32, NumKVHeads: 8, HeadDim: 64}, kernels.F16,
			[][2]int{{1, 1}, {1, 17}, {1, 256}, {1, 700}, {1, 3000}}, 0},
		{"d128-f16-window", kernels.AttentionParams{NumHeads: 16, NumKVHeads: 8, HeadDim: 128}, kernels.F16,
			[][2]int{{1, 300}, {1, 1500}, {1, 2600}}, 600},
		{"d64-f32-mixed", kernels.AttentionParams{NumHeads: 8, NumKVHeads: 2, HeadDim: 64}, kernels.F32,
			[][2]int{{1, 900}, {40, 300}, {1, 5}}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, GEMMRound)
			t.Setenv("DEEPINFER_CUDA_DEC_FUSE", "0")
			sep := newGPU(t, GEMMRound)
			const blockSize, numBlocks = 16, 600
			ap := c.ap
			ap.Scale, ap.SlidingWindow, ap.InputDType = float32(1/math.Sqrt(float64(ap.HeadDim))), c.window, kernels.BF16
			w, kvw := ap.NumHeads*ap.HeadDim, ap.NumKVHeads*ap.HeadDim
			b := p.pagedBatch(blockSize, numBlocks, c.seqs)
			meta := b.gpuMeta
			meta.MaxSeqlenQ = 1
			for _, s := range c.seqs {
				meta.MaxSeqlenQ = max(meta.MaxSeqlenQ, s[0])
			}
			qv := randVals(p.r, b.numTokens*w, 1)
			kv, vv := hostBytes(c.cache, randVals(p.r, numBlocks*blockSize*kvw, 1)), hostBytes(c.cache, randVals(p.r, numBlocks*blockSize*kvw, 1))
			run := func(g *Backend, m kernels.AttentionMetadata, graph bool) [][]float32 {
				t.Helper()
				ints := func(d kernels.Tensor) kernels.Tensor {
					return upload(t, g, kernels.I32, kernels.I32Bytes(p.i32(p.g, d)), kernels.I32, d.Shape()...)
				}
				m.CuSeqlensQ, m.SeqlensK, m.BlockTables, m.SlotMapping = ints(m.CuSeqlensQ), ints(m.SeqlensK), ints(m.BlockTables), ints(m.SlotMapping)
				q := upload(t, g, kernels.F32, kernels.F32Bytes(qv), kernels.F32, b.numTokens, w)
				kc := upload(t, g, c.cache, kv, c.cache, numBlocks, blockSize, kvw)
				vc := upload(t, g, c.cache, vv, c.cache, numBlocks, blockSize, kvw)
				o, err := g.Alloc(kernels.F32, b.numTokens, w)
				if err != nil {
					t.Fatal(err)
				}
				call := func() error { return g.Attention(o, q, kc, vc, &m, ap) }
				var outs [][]float32
				for range 2 {
					if graph {
						gr, err := g.CaptureGraph(call)
						if err != nil {
							t.Fatal(err)
						}
						for range 2 {
							if err := gr.Replay(); err != nil {
								t.Fatal(err)
							}
							outs = append(outs, p.f32(g, o))
						}
						gr.Close()
					} else {
						if err := call(); err != nil {
							t.Fatal(err)
						}
						outs = append(outs, p.f32(g, o))
					}
				}
				return outs
			}
			want := run(sep, meta, false)[0]
			for _, graph := range []bool{false, true} {
				for i, got := range run(p.g, meta, graph) {
					for j := range got {
						if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
							t.Fatalf("graph %v, call %d: element %d (row %d): fused %v, separate merge %v",
								graph, i, j, j/w, got[j], want[j])
						}
					}
				}
			}
			nonzero := 0
			for _, v := range want {
				if v != 0 {
					nonzero++
				}
			}
			if nonzero < len(want)/2 {
				t.Errorf("%s: only %d of %d outputs are nonzero", fmt.Sprint(c.seqs), nonzero, len(want))
			}
		})
	}
}
