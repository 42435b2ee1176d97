package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// BenchmarkFP8Kernels times FP8 against BF16 weights in one run (device
// events, back-to-back launches), printing "fp8 |" lines that
// tools/gpu/check.sh's fp8 phase tabulates:
//   - decode linears at Qwen3-0.6B and DeepSeek-V2-Lite shapes, 1, 8 and 64
//     rows: weight bytes over time (GB/s) and its share of the copy
//     bandwidth (deviceCopyBandwidth, 4.2 TB/s measured on the H200); the FP8
//     floor is half the BF16 one;
//   - prefill GEMMs of 4096 rows: FP8 as Linear runs it (cuBLASLt's
//     block-scaled GEMM, activation quantization included) and on the
//     library's own mma.sync GEMM, against the FP8 peak that cuBLASLt
//     reaches with one scale a tensor at the same shape (fp8LTPeak: no
//     quantization, no block scales) and BF16 on cuBLAS (x already BF16:
//     the GEMM alone), TFLOP/s;
//   - DeepSeek-V2-Lite's MoE (64 experts, top 6) at 1 and 64 tokens, FP8
//     and BF16 experts, each against its floor (the used experts' weight
//     bytes over the copy bandwidth: 12.4 and 24.7 us at one token), with
//     routings taken in turn so that every call reads its weights from
//     memory.
//
// Its name keeps it out of the bench phase's default pattern (GPU).
const deviceCopyBandwidth = 4.2e12 // bytes/s: bench_engine_gpu_test.go's copyBandwidth

func BenchmarkFP8Kernels(b *testing.B) {
	g := newGPU(b, GEMMRound)
	r := rand.New(rand.NewPCG(8, 27))
	bf16 := func(n, k int) kernels.Tensor {
		return upload(b, g, kernels.BF16, hostBytes(kernels.BF16, randVals(r, n*k, 0.03)), kernels.BF16, n, k)
	}
	for _, sh := range []struct {
		name string
		n, k int
	}{
		{"qwen3/qkv", 4096, 1024}, {"qwen3/o", 1024, 2048}, {"qwen3/gate_up", 6144, 1024}, {"qwen3/down", 1024, 3072},
		{"v2lite/q", 3072, 2048}, {"v2lite/kv_a", 576, 2048}, {"v2lite/o", 2048, 2048},
		{"v2lite/dense_gate_up", 21888, 2048}, {"v2lite/dense_down", 2048, 10944},
	} {
		wf := newFP8Weight(b, g, makeFP8(r, 1, sh.n, sh.k, 128))
		wb := bf16(sh.n, sh.k)
		for _, m := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("gemv/%s/m=%d", sh.name, m), func(b *testing.B) {
				x := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, m*sh.k, 1)), kernels.F32, m, sh.k)
				out, _ := g.Alloc(kernels.F32, m, sh.n)
				msF := timeIt(b, g, 100, func() error { return g.Linear(out, x, wf, nil) })
				msB := timeIt(b, g, 100, func() error { return g.Linear(out, x, wb, nil) })
				gbF := float64(sh.n*sh.k) / (msF / 1e3) / 1e9
				gbB := float64(2*sh.n*sh.k) / (msB / 1e3) / 1e9
				b.ReportMetric(msF*1e3, "fp8-us/op")
				b.ReportMetric(msB*1e3, "bf16-us/op")
				b.Logf("fp8 | linear %-22s m=%-3d n=%-5d k=%-5d | fp8 %7.1f us %5.0f GB/s %3.0f%% of copy | bf16 %7.1f us %5.0f GB/s %3.0f%% | fp8 speedup %.2fx",
					sh.name, m, sh.n, sh.k, msF*1e3, gbF, 100*gbF*1e9/deviceCopyBandwidth, msB*1e3, gbB, 100*gbB*1e9/deviceCopyBandwidth, msB/msF)
			})
		}
	}
	for _, sh := range []struct {
		name string
		n, k int
	}{{"qwen3/gate_up", 6144, 1024}, {"v2lite/dense_gate_up", 21888, 2048}, {"v2lite/dense_down", 2048, 10944}, {"square", 8192, 8192}} {
		b.Run(fmt.Sprintf("gemm/%s/m=4096", sh.name), func(b *testing.B) {
			const m = 4096
			wf := newFP8Weight(b, g, makeFP8(r, 1, sh.n, sh.k, 128))
			wb := bf16(sh.n, sh.k)
			x := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, m*sh.k, 1)), kernels.F32, m, sh.k)
			xb := upload(b, g, kernels.BF16, hostBytes(kernels.BF16, randVals(r, m*sh.k, 1)), kernels.BF16, m, sh.k)
			out, _ := g.Alloc(kernels.F32, m, sh.n)
			flops := 2 * float64(m) * float64(sh.n) * float64(sh.k)
			msF := timeIt(b, g, 10, func() error { return g.Linear(out, x, wf, nil) })
			msG := timeIt(b, g, 10, func() error { return g.linearFP8Path(out, x, wf, nil, fp8GEMM) })
			msB := timeIt(b, g, 10, func() error { return g.Linear(out, xb, wb, nil) })
			msP, err := g.fp8LTPeak(m, sh.n, sh.k, 10)
			if err != nil {
				b.Fatal(err)
			}
			tf := func(ms float64) float64 { return flops / (ms / 1e3) / 1e12 }
			b.ReportMetric(tf(msF), "fp8-TFLOP/s")
			b.ReportMetric(tf(msG), "fp8-mma-TFLOP/s")
			b.ReportMetric(tf(msP), "fp8-peak-TFLOP/s")
			b.ReportMetric(tf(msB), "bf16-TFLOP/s")
			b.Logf("fp8 | gemm   %-22s m=%d n=%-5d k=%-5d | fp8 %7.3f ms %6.1f TFLOP/s %3.0f%% of peak | mma.sync %6.1f TFLOP/s | cuBLASLt fp8 peak %6.1f | bf16 cuBLAS %6.1f TFLOP/s | fp8/bf16 %.2fx",
				sh.name, m, sh.n, sh.k, msF, tf(msF), 100*msP/msF, tf(msG), tf(msP), tf(msB), msB/msF)
		})
	}
	// DeepSeek-V2-Lite's routed experts: 64 of hidden 2048, intermediate 1408, top 6.
	const experts, topK, hidden, inter = 64, 6, 2048, 1408
	guF := newFP8Weight(b, g, makeFP8(r, experts, 2*inter, hidden, 128))
	dnF := newFP8Weight(b, g, makeFP8(r, experts, hidden, inter, 128))
	guB := upload(b, g, kernels.BF16, hostBytes(kernels.BF16, randVals(r, experts*2*inter*hidden, 0.03)), kernels.BF16, experts, 2*inter, hidden)
	dnB := upload(b, g, kernels.BF16, hostBytes(kernels.BF16, randVals(r, experts*hidden*inter, 0.03)), kernels.BF16, experts, hidden, inter)
	for _, tokens := range []int{1, 64} {
		b.Run(fmt.Sprintf("moe/v2lite/tokens=%d", tokens), func(b *testing.B) {
			// Several routings, taken in turn: at one token each takes 6
			// experts none of the previous call's took (52 MB of FP8 weights,
			// about the H200's L2), so that every call reads its weights from
			// memory, as a decode step does; at 64 tokens a call takes nearly
			// every expert (553 MB).
			const routings = 8 // routings * topK <= experts
			base := r.Perm(experts)
			ids := make([]kernels.Tensor, routings)
			used := make([]int, routings)
			for i := range ids {
				id := make([]int32, tokens*topK)
				seen := map[int32]bool{}
				for t := range tokens {
					pick := base[i*topK : (i+1)*topK] // one token: routing i's own experts
					if tokens > 1 {
						pick = r.Perm(experts)[:topK]
					}
					for k, e := range pick {
						id[t*topK+k] = int32(e)
						seen[int32(e)] = true
					}
				}
				used[i] = len(seen)
				ids[i] = upload(b, g, kernels.I32, kernels.I32Bytes(id), kernels.I32, tokens, topK)
			}
			x := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, tokens*hidden, 1)), kernels.F32, tokens, hidden)
			w := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, tokens*topK, 0.3)), kernels.F32, tokens, topK)
			out, _ := g.Alloc(kernels.F32, tokens, hidden)
			i := 0
			msF := timeIt(b, g, 48, func() error { i++; return g.MoE(out, x, ids[i%routings], w, guF, dnF) })
			msB := timeIt(b, g, 48, func() error { i++; return g.MoE(out, x, ids[i%routings], w, guB, dnB) })
			var avg float64
			for _, u := range used {
				avg += float64(u) / routings
			}
			bytes := avg * 3 * hidden * inter // FP8: one byte a weight of the experts used
			floorF, floorB := bytes/deviceCopyBandwidth*1e6, 2*bytes/deviceCopyBandwidth*1e6
			b.ReportMetric(msF*1e3, "fp8-us/op")
			b.ReportMetric(msB*1e3, "bf16-us/op")
			b.Logf("fp8 | moe    v2lite tokens=%-3d (%.1f experts used) | fp8 %7.1f us %5.0f GB/s %3.0f%% of copy, %.2fx its floor %.1f us | bf16 %7.1f us %5.0f GB/s, %.2fx its floor %.1f us | fp8 speedup %.2fx",
				tokens, avg, msF*1e3, bytes/(msF/1e3)/1e9, 100*bytes/(msF/1e3)/deviceCopyBandwidth, msF*1e3/floorF, floorF,
				msB*1e3, 2*bytes/(msB/1e3)/1e9, msB*1e3/floorB, floorB, msB/msF)
		})
	}
}

// BenchmarkFP8GEMVReal times the FP8 decode linears at sizes where reading
// the weights, not launching the kernel, sets the time: DeepSeek-V3's dense
// MLP (gate and up fused, 36864 x 7168; down 7168 x 18432) and one routed
// expert (4096 x 7168, 7168 x 2048), and DeepSeek-V2-Lite's expert (2816 x
// 2048, 2048 x 1408), at 1 and 8 rows (the GEMV) and 64 (the GEMM), against
// BF16 weights of the same shape in the same run. Each call takes the next
// of several device copies of the weight (together over 128 MiB, more than
// the H200's 50 MB L2), so that every call reads its weight from memory, as
// a decode step does. It prints "fp8 | gemv-real" lines: time, GB/s of
// weight bytes (the FP8 ones include the scales) and the ratio to the FP8
// floor, the weight bytes over the copy bandwidth (4.2 TB/s).
//
// Its name keeps it out of the bench phase's default pattern (GPU);
// tools/gpu/check.sh's fp8 phase runs it with BenchmarkFP8Kernels. About 3
// GB of uploads and a few seconds of device time.
func BenchmarkFP8GEMVReal(b *testing.B) {
	g := newGPU(b, GEMMRound)
	r := rand.New(rand.NewPCG(8, 28))
	// Weights are tiled from one random pattern of 1 MiB + 48 bytes (the
	// values do not change the time; generating 400M of them would).
	const patLen = 1<<20 + 48
	f8pat := make([]byte, patLen)
	for i := range f8pat {
		v := byte(r.IntN(256))
		if v&0x7f == 0x7f { // an E4M3 NaN: its neighbour (448 in magnitude)
			v--
		}
		f8pat[i] = v
	}
	bfpat := hostBytes(kernels.BF16, randVals(r, patLen/2, 0.03))
	tiled := func(pat []byte, n int) []byte {
		out := make([]byte, n)
		for i := 0; i < n; i += len(pat) {
			copy(out[i:], pat)
		}
		return out
	}
	const copyBytes = 128 << 20 // the copies of a weight together exceed this
	for _, sh := range []struct {
		name string
		n, k int
	}{
		{"v3/dense_gate_up", 36864, 7168}, {"v3/dense_down", 7168, 18432},
		{"v3/expert_gate_up", 4096, 7168}, {"v3/expert_down", 7168, 2048},
		{"v2lite/expert_gate_up", 2816, 2048}, {"v2lite/expert_down", 2048, 1408},
	} {
		b.Run(sh.name, func(b *testing.B) {
			blocks := ((sh.n + 127) / 128) * ((sh.k + 127) / 128)
			fw := kernels.FP8Weight{Shape: []int{sh.n, sh.k}, Data: tiled(f8pat, sh.n*sh.k), BlockK: 128,
				Scales: make([]float32, blocks), ScaleRow: make([]int32, sh.n)}
			for i := range fw.Scales {
				fw.Scales[i] = 0.03 / 448
			}
			for i := range fw.ScaleRow {
				fw.ScaleRow[i] = int32(i / 128)
			}
			bfBytes := tiled(bfpat, 2*sh.n*sh.k)
			fp8Bytes := float64(sh.n*sh.k + 4*blocks)
			copies := max(1, (copyBytes+sh.n*sh.k-1)/(sh.n*sh.k))
			wf, wb := make([]kernels.Tensor, copies), make([]kernels.Tensor, copies)
			for c := range copies {
				wf[c] = newFP8Weight(b, g, fw)
				wb[c] = upload(b, g, kernels.BF16, bfBytes, kernels.BF16, sh.n, sh.k)
			}
			floorUS := fp8Bytes / deviceCopyBandwidth * 1e6
			for _, m := range []int{1, 8, 64} {
				x := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, m*sh.k, 1)), kernels.F32, m, sh.k)
				out, err := g.Alloc(kernels.F32, m, sh.n)
				if err != nil {
					b.Fatal(err)
				}
				i := 0
				msF := timeIt(b, g, 50, func() error { i++; return g.Linear(out, x, wf[i%copies], nil) })
				msB := timeIt(b, g, 50, func() error { i++; return g.Linear(out, x, wb[i%copies], nil) })
				gbF := fp8Bytes / (msF / 1e3) / 1e9
				gbB := float64(2*sh.n*sh.k) / (msB / 1e3) / 1e9
				path := "gemv"
				if m > 8 {
					path = "gemm"
				}
				b.ReportMetric(msF*1e3, fmt.Sprintf("fp8-us/m=%d", m))
				b.ReportMetric(msB*1e3, fmt.Sprintf("bf16-us/m=%d", m))
				b.Logf("fp8 | gemv-real %-22s m=%-2d (%s) n=%-5d k=%-5d x%-2d copies | fp8 %7.1f us %5.0f GB/s %3.0f%% of copy, %.2fx its floor %.1f us | bf16 %7.1f us %5.0f GB/s %3.0f%% | fp8 speedup %.2fx",
					sh.name, m, path, sh.n, sh.k, copies, msF*1e3, gbF, 100*gbF*1e9/deviceCopyBandwidth, msF*1e3/floorUS, floorUS,
					msB*1e3, gbB, 100*gbB*1e9/deviceCopyBandwidth, msB/msF)
			}
		})
	}
}
