package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// BenchmarkGPUMLADecode times MLA decode over a DeepSeek-V2-Lite layer's
// shapes (16 heads, kv_lora_rank 512, rope 64, nope 128, v 128) at 4096
// keys a row and batch 1, 8 and 64, over half and 8-bit latent caches:
// the latent attention alone (MLALatentAttention: the kernel FlashMLA
// measures, the split over keys and the combine) and the whole
// MLAAttention (with the absorptions). Each figure is in GB/s of latent
// cache bytes read, against the H200's copy bandwidth (deviceCopyBandwidth, the
// floor the engine benchmarks use: a device-to-device cudaMemcpy, bytes
// read plus written per second); the goal at batch 64 is 80% of it. The
// run also prints what the backend's own CopyRect kernel reaches on 1 GiB,
// which is slower than cudaMemcpy and so no ceiling. tools/gpu/check.sh's mla phase
// prints the lines.
func BenchmarkGPUMLADecode(b *testing.B) {
	g := newGPUOpts(b, Options{GEMM: GEMMRound})
	r := rand.New(rand.NewPCG(3, 3))
	copyGBs := deviceCopyBandwidth / 1e9
	b.Logf("mla decode | copy bandwidth %.0f GB/s (cudaMemcpy device to device, read + written); CopyRect on 1 GiB in this run: %.0f GB/s", copyGBs, benchCopyBandwidth(b, g))
	mp := kernels.MLAParams{NumHeads: 16, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128}
	mp.Scale = float32(1 / math.Sqrt(float64(mp.NopeDim+mp.RopeDim)))
	const blockSize = 64
	for _, cdt := range []kernels.DType{kernels.F16, kernels.F8E4M3} {
		for _, bc := range []struct{ batch, ctx int }{{1, 4096}, {8, 4096}, {64, 4096}, {1, 320}, {64, 320}} {
			batch, ctx := bc.batch, bc.ctx
			b.Run(fmt.Sprintf("cache=%s/batch=%d/ctx=%d", cdt, batch, ctx), func(b *testing.B) {
				width := mlaCacheWidth(cdt, mp)
				rowBytes := width * cdt.Size()
				per := ctx / blockSize
				cache, err := g.Alloc(cdt, batch*per, blockSize, width)
				if err != nil {
					b.Fatal(err)
				}
				// Fill the cache through the writer (8-bit rows need their
				// scales): one sequence's random rows into every sequence's blocks.
				ckv := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, ctx*mp.KVLoraRank, 1)), kernels.F32, ctx, mp.KVLoraRank)
				kpe := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, ctx*mp.RopeDim, 1)), kernels.F32, ctx, mp.RopeDim)
				sm := make([]int32, ctx)
				for s := range batch {
					for i := range sm {
						sm[i] = int32(s*ctx + i)
					}
					smt := upload(b, g, kernels.I32, kernels.I32Bytes(sm), kernels.I32, ctx)
					if err := g.WriteMLACache(cache, ckv, kpe, smt, mp); err != nil {
						b.Fatal(err)
					}
				}
				cu, sk, bt := make([]int32, batch+1), make([]int32, batch), make([]int32, batch*per)
				for s := range batch {
					cu[s+1] = int32(s + 1)
					sk[s] = int32(ctx)
					for j := range per {
						bt[s*per+j] = int32(s*per + j)
					}
				}
				m := kernels.AttentionMetadata{NumSeqs: batch, NumTokens: batch, MaxSeqlenQ: 1, BlockSize: blockSize,
					CuSeqlensQ:  upload(b, g, kernels.I32, kernels.I32Bytes(cu), kernels.I32, batch+1),
					SeqlensK:    upload(b, g, kernels.I32, kernels.I32Bytes(sk), kernels.I32, batch),
					BlockTables: upload(b, g, kernels.I32, kernels.I32Bytes(bt), kernels.I32, batch, per)}
				qw := mp.KVLoraRank + mp.RopeDim
				ql := upload(b, g, kernels.F16, hostBytes(kernels.F16, randVals(r, batch*mp.NumHeads*qw, 0.1)), kernels.F16, batch, mp.NumHeads, qw)
				olat, _ := g.Alloc(kernels.F32, batch, mp.NumHeads, mp.KVLoraRank)
				w := upload(b, g, kernels.BF16, hostBytes(kernels.BF16, randVals(r, mp.NumHeads*(mp.NopeDim+mp.VHeadDim)*mp.KVLoraRank, 0.05)),
					kernels.BF16, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
				q := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, batch*mp.NumHeads*(mp.NopeDim+mp.RopeDim), 1)), kernels.F32,
					batch, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
				out, _ := g.Alloc(kernels.F32, batch, mp.NumHeads*mp.VHeadDim)
				latent := float64(batch) * float64(ctx) * float64(rowBytes)
				msL := timeIt(b, g, 50, func() error { return g.MLALatentAttention(olat, ql, cache, &m, mp) })
				msW := timeIt(b, g, 50, func() error { return g.MLAAttention(out, q, cache, w, &m, mp) })
				gbL, gbW := latent/(msL/1e3)/1e9, latent/(msW/1e3)/1e9
				b.ReportMetric(msL*1e3, "us/op")
				b.ReportMetric(gbL, "GB/s")
				b.Logf("mla decode | cache %-7s batch %2d ctx %d | latent kernel %7.1f us %6.0f GB/s (%4.1f%% of copy) | whole op %7.1f us %6.0f GB/s (%4.1f%%) | latent bytes %.1f MB",
					cdt, batch, ctx, msL*1e3, gbL, 100*gbL/copyGBs, msW*1e3, gbW, 100*gbW/copyGBs, latent/1e6)
			})
		}
	}
}

// benchCopyBandwidth measures a device-to-device copy of 1 GiB and returns
// GB/s of bytes read plus written.
func benchCopyBandwidth(b *testing.B, g *Backend) float64 {
	const rows, cols = 1 << 14, 1 << 14 // F32: 1 GiB
	src, err := g.Alloc(kernels.F32, rows, cols)
	if err != nil {
		b.Fatal(err)
	}
	dst, err := g.Alloc(kernels.F32, rows, cols)
	if err != nil {
		b.Fatal(err)
	}
	ms := timeIt(b, g, 10, func() error { return g.CopyRect(dst, src) })
	return 2 * float64(rows*cols*4) / (ms / 1e3) / 1e9
}
