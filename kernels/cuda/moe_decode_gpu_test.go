package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// randomFP8 returns a stacked FP8 weight [experts, n, k] with random E4M3
// codes (no NaN code) and one scale of 0.001 per block of 128 rows by 128
// columns: timing data, generated in parallel from seed, with no
// quantization pass.
func randomFP8(experts, n, k int, seed uint64) kernels.FP8Weight {
	data := make([]byte, experts*n*k)
	fillParallel(len(data), seed, func(r *rand.Rand, i int) {
		v := byte(r.Uint32())
		if v&0x7f == 0x7f { // E4M3's NaN codes
			v ^= 1
		}
		data[i] = v
	})
	cols, blockRows := (k+127)/128, (n+127)/128
	w := kernels.FP8Weight{Shape: []int{experts, n, k}, Data: data, BlockK: 128,
		Scales: make([]float32, experts*blockRows*cols), ScaleRow: make([]int32, experts*n)}
	for i := range w.Scales {
		w.Scales[i] = 0.001
	}
	for e := range experts {
		for row := range n {
			w.ScaleRow[e*n+row] = int32(e*blockRows + row/128)
		}
	}
	return w
}

// BenchmarkMoEDecode times DeepSeek-V2-Lite's routed experts (64 of hidden
// 2048, intermediate 1408, top 6; random weights, GEMM mode round) at the
// decode batches 1 and 64, with BF16 and with FP8 experts (128 x 128 block
// scales), as a decode step runs them: eight MoE calls captured in one CUDA
// graph, each over routing ids of its own (at one token disjoint experts,
// so that no call finds its weights in the L2), the graph replayed; and the
// same eight calls eager. It logs "moe decode" lines: microseconds a call
// under the graph and eager, and the graph's time against the floor (the
// weight bytes of the experts a call uses, read once at
// deviceCopyBandwidth); the graph's output must have the eager call's bits.
// DEEPINFER_MOE_BENCH_REPS sets the graph replays (default 50) and runs
// the eager calls once, untimed (for a profiler: DEEPINFER_MOE_BENCH_REPS=1
// shows it the eager calls, timeIt's three warm-up replays and one timed
// replay). Its name
// keeps it out of the bench phase's default pattern (GPU): run it with
// -test.bench MoEDecode. Weights: 1.1 GB BF16, 0.55 GB FP8.
func BenchmarkMoEDecode(b *testing.B) {
	const experts, topK, hidden, inter, calls = 64, 6, 2048, 1408, 8
	reps, eagerReps := 50, 5
	if v := os.Getenv("DEEPINFER_MOE_BENCH_REPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("DEEPINFER_MOE_BENCH_REPS=%q: want a positive count", v)
		}
		reps, eagerReps = n, 0
	}
	g := newGPU(b, GEMMRound)
	weights := map[string][2]kernels.Tensor{
		"bf16": {upload(b, g, kernels.BF16, randomBF16(experts*2*inter*hidden, 1), kernels.BF16, experts, 2*inter, hidden),
			upload(b, g, kernels.BF16, randomBF16(experts*hidden*inter, 2), kernels.BF16, experts, hidden, inter)},
		"fp8": {newFP8Weight(b, g, randomFP8(experts, 2*inter, hidden, 3)), newFP8Weight(b, g, randomFP8(experts, hidden, inter, 4))},
	}
	r := rand.New(rand.NewPCG(2048, 1408))
	for _, format := range []string{"bf16", "fp8"} {
		for _, tokens := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/tokens=%d", format, tokens), func(b *testing.B) {
				gu, dn := weights[format][0], weights[format][1]
				base := r.Perm(experts)
				ids := make([]kernels.Tensor, calls)
				var used float64 // experts a call uses, on average
				for i := range ids {
					id := make([]int32, tokens*topK)
					seen := map[int32]bool{}
					for t := range tokens {
						pick := base[i*topK : (i+1)*topK] // one token: call i's own experts
						if tokens > 1 {
							pick = r.Perm(experts)[:topK]
						}
						for k, e := range pick {
							id[t*topK+k] = int32(e)
							seen[int32(e)] = true
						}
					}
					used += float64(len(seen)) / calls
					ids[i] = upload(b, g, kernels.I32, kernels.I32Bytes(id), kernels.I32, tokens, topK)
				}
				x := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, tokens*hidden, 1)), kernels.F32, tokens, hidden)
				w := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, tokens*topK, 0.3)), kernels.F32, tokens, topK)
				out, err := g.Alloc(kernels.F32, tokens, hidden)
				if err != nil {
					b.Fatal(err)
				}
				all := func() error {
					for i := range calls {
						if err := g.MoE(out, x, ids[i], w, gu, dn); err != nil {
							return err
						}
					}
					return nil
				}
				msEager := 0.0
				if eagerReps > 0 {
					msEager = timeIt(b, g, eagerReps, all) / calls
				} else if err := all(); err != nil { // the bits to compare only (a profiler's run)
					b.Fatal(err)
				}
				eager := moeDownload(b, g, out)
				graph, err := g.CaptureGraph(all)
				if err != nil {
					b.Fatal(err)
				}
				defer graph.Close()
				msGraph := timeIt(b, g, reps, graph.Replay) / calls
				same := "graph = eager bits"
				if i, ok := moeEqual(moeDownload(b, g, out), eager); !ok {
					b.Fatalf("%s tokens=%d: graph replay out[%d] differs from the eager call's bits", format, tokens, i)
				}
				perWeight := 2.0
				if format == "fp8" {
					perWeight = 1 + 4.0/(128*128) // a byte a weight and its block's scale
				}
				floorUS := used * 3 * hidden * inter * perWeight / deviceCopyBandwidth * 1e6
				b.ReportMetric(msGraph*1e3, "graph-us/call")
				b.ReportMetric(msEager*1e3, "eager-us/call")
				b.ReportMetric(msGraph*1e3/floorUS, "x-floor")
				b.Logf("moe decode | v2lite %s tokens=%-2d (%.1f experts a call) | graph %7.1f us a call = %.2fx its floor %.1f us | eager %7.1f us | %s",
					format, tokens, used, msGraph*1e3, msGraph*1e3/floorUS, floorUS, msEager*1e3, same)
			})
		}
	}
}
