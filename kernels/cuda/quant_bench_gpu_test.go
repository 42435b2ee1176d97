package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// randomBlocks returns rows rows of k weights of format typ with random
// quantized values and small finite f16 scales (the values do not change
// the time; quantizing 16M weights with ggml's K-quant search would take
// minutes on the host).
func randomBlocks(r *rand.Rand, typ kernels.QuantType, rows, k int) []byte {
	f := quantFormats[typ]
	data := make([]byte, rows*k/f.block*f.bytes)
	for i := 0; i+8 <= len(data); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	scale := []byte{0x00, 0x20} // f16 0x2000 = 2^-7
	for b := 0; b < len(data); b += f.bytes {
		blk := data[b : b+f.bytes]
		switch typ {
		case kernels.QuantQ6_K:
			copy(blk[208:], scale)
		case kernels.QuantQ4_K, kernels.QuantQ5_K:
			copy(blk, scale)
			copy(blk[2:], scale)
		default:
			copy(blk, scale)
		}
	}
	return data
}

// BenchmarkQuantKernels times Linear over block-quantized weights at
// Llama-3.2-1B's MLP shapes (up: 8192 x 2048, down: 2048 x 8192), every
// format, against BF16 weights of the same shape in the same run (device
// events, back-to-back calls). Each call takes the next of several device
// copies of the weight (together over 256 MiB, more than the H200's 50 MB
// L2), so that every call reads its weight from memory, as a decode step
// does. It prints "quant |" lines:
//   - the GEMV at 1, 4 and 8 rows: time, GB/s of the blocks' bytes as
//     stored, and that as a share of the copy bandwidth (benchCopyBandwidth
//     in this run: a 1 GiB device copy, bytes read plus written; and of the
//     4.2 TB/s cudaMemcpy figure, deviceCopyBandwidth);
//   - at 16 and 64 rows, the GEMV and the GEMM path (the weight dequantized
//     into BF16 scratch, then cuBLAS) side by side: where the automatic
//     path's switch (DI_QUANT_GEMV_ROWS, 2) belongs;
//   - the GEMM at 512 rows in TFLOP/s against BF16 cuBLAS.
//
// Its name keeps it out of the bench phase's default pattern (GPU). About
// 2.5 GB of uploads and a few seconds of device time.
func BenchmarkQuantKernels(b *testing.B) {
	g := newGPU(b, GEMMRound)
	r := rand.New(rand.NewPCG(12, 5))
	copyGBs := benchCopyBandwidth(b, g)
	b.Logf("quant | copy bandwidth in this run: %.0f GB/s (1 GiB device copy, read + written); cudaMemcpy figure %.0f GB/s", copyGBs, deviceCopyBandwidth/1e9)
	const rotateBytes = 256 << 20
	for _, sh := range []struct {
		name string
		n, k int
	}{{"up", 8192, 2048}, {"down", 2048, 8192}} {
		// BF16 reference copies.
		bfBytes := 2 * sh.n * sh.k
		bfPat := hostBytes(kernels.BF16, randVals(r, sh.n*sh.k, 0.03))
		var bfs []kernels.Tensor
		for range max(2, rotateBytes/bfBytes+1) {
			bfs = append(bfs, upload(b, g, kernels.BF16, bfPat, kernels.BF16, sh.n, sh.k))
		}
		for _, typ := range quantTypeList {
			qw := kernels.QuantWeight{Shape: []int{sh.n, sh.k}, Parts: []kernels.QuantPart{{Type: typ, Rows: sh.n, Data: randomBlocks(r, typ, sh.n, sh.k)}}}
			qBytes := len(qw.Parts[0].Data)
			var qs []kernels.Tensor
			for range max(2, rotateBytes/qBytes+1) {
				qs = append(qs, newQuantWeight(b, g, qw))
			}
			for _, m := range []int{1, 4, 8, 16, 64, 512} {
				b.Run(fmt.Sprintf("%s/%s/m=%d", sh.name, typ, m), func(b *testing.B) {
					x := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, m*sh.k, 1)), kernels.F32, m, sh.k)
					out, _ := g.Alloc(kernels.F32, m, sh.n)
					reps := 100
					if m >= 64 {
						reps = 20
					}
					rot := func(ws []kernels.Tensor, path quantPath) float64 {
						i := 0
						return timeIt(b, g, reps, func() error {
							w := ws[i%len(ws)]
							i++
							if path == quantAuto {
								return g.Linear(out, x, w, nil)
							}
							return g.linearQuantPath(out, x, w, nil, path)
						})
					}
					msB := rot(bfs, quantAuto)
					gbB := float64(bfBytes) / (msB / 1e3) / 1e9
					switch {
					case m <= 8:
						ms := rot(qs, quantGEMV)
						gb := float64(qBytes) / (ms / 1e3) / 1e9
						b.ReportMetric(ms*1e3, "us/op")
						b.ReportMetric(gb, "GB/s")
						b.Logf("quant | gemv %-4s %5dx%-5d %-4s m=%-2d | %7.1f us %6.0f GB/s %3.0f%% of copy in run, %3.0f%% of 4.2 TB/s | bf16 %7.1f us %6.0f GB/s | %s/bf16 time %.2fx",
							sh.name, sh.n, sh.k, typ, m, ms*1e3, gb, 100*gb/copyGBs, 100*gb*1e9/deviceCopyBandwidth, msB*1e3, gbB, typ, ms/msB)
					case m <= 64:
						msV := rot(qs, quantGEMV)
						msM := rot(qs, quantGEMM)
						b.ReportMetric(msV*1e3, "gemv-us/op")
						b.ReportMetric(msM*1e3, "gemm-us/op")
						b.Logf("quant | rows %-4s %5dx%-5d %-4s m=%-2d | gemv %7.1f us | gemm (dequantize + cuBLAS) %7.1f us | bf16 %7.1f us",
							sh.name, sh.n, sh.k, typ, m, msV*1e3, msM*1e3, msB*1e3)
					default:
						ms := rot(qs, quantGEMM)
						flops := 2 * float64(m) * float64(sh.n) * float64(sh.k)
						b.ReportMetric(flops/(ms/1e3)/1e12, "TFLOP/s")
						b.Logf("quant | gemm %-4s %5dx%-5d %-4s m=%d | %7.3f ms %6.1f TFLOP/s | bf16 cuBLAS %7.3f ms %6.1f TFLOP/s | %s/bf16 time %.2fx",
							sh.name, sh.n, sh.k, typ, m, ms, flops/(ms/1e3)/1e12, msB, flops/(msB/1e3)/1e12, typ, ms/msB)
					}
				})
			}
		}
	}
}
