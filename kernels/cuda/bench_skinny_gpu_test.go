package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// skinnyBenchShapes are the BF16 weights of a Llama-3.2-1B decode step.
var skinnyBenchShapes = []struct {
	name string
	n, k int
}{
	{"q/o_proj", 2048, 2048}, {"k/v_proj", 512, 2048}, {"gate_up", 16384, 2048}, {"down", 2048, 8192},
	{"lm_head", 128256, 2048},
}

// randomBF16 returns n random BF16 values (uniform in [-0.03, 0.03)) as
// bytes, generated in parallel from seed.
func randomBF16(n int, seed uint64) []byte {
	buf := make([]byte, 2*n)
	fillParallel(n, seed, func(r *rand.Rand, i int) {
		bits := kernels.F32ToBF16(float32(r.Float64()*2-1) * 0.03)
		buf[2*i], buf[2*i+1] = byte(bits), byte(bits>>8)
	})
	return buf
}

// fillParallel calls fill(r, i) for every i < n over 16 goroutines, each
// with a random source of its own seeded from its part and seed: the same
// values for the same n and seed, in a fraction of one core's time.
func fillParallel(n int, seed uint64, fill func(r *rand.Rand, i int)) {
	var wg sync.WaitGroup
	const parts = 16
	for p := range parts {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(p), seed))
			for i := p * n / parts; i < (p+1)*n/parts; i++ {
				fill(r, i)
			}
		})
	}
	wg.Wait()
}

// skinnyBenchPath is one Linear path, selected by the environment at New.
type skinnyBenchPath struct {
	name string
	g    *Backend
}

// timeLinearGraph captures reps Linear calls, the i-th on weight copy
// i % len(ws) (so that, with enough copies, no weight is in L2 when it is
// read again, as in a decode step that streams 3 GB), replays the graph once
// to warm up and three times under device events, and returns microseconds
// a call and the output of the last call. Graph replay leaves out the host's
// launch cost, as decode steps do when they run in CUDA graphs.
func timeLinearGraph(b *testing.B, g *Backend, x kernels.Tensor, ws []kernels.Tensor, n, reps int) (float64, []float32) {
	b.Helper()
	m := x.Shape()[0]
	out, err := g.Alloc(kernels.F32, m, n)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Linear(out, x, ws[0], nil); err != nil { // eager first: cuBLAS sets up outside the capture
		b.Fatal(err)
	}
	graph, err := g.CaptureGraph(func() error {
		for i := range reps {
			if err := g.Linear(out, x, ws[i%len(ws)], nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer graph.Close()
	if err := graph.Replay(); err != nil {
		b.Fatal(err)
	}
	e0, err := g.NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	defer e0.Close()
	e1, err := g.NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	defer e1.Close()
	const replays = 3
	if err := e0.Record(); err != nil {
		b.Fatal(err)
	}
	for range replays {
		if err := graph.Replay(); err != nil {
			b.Fatal(err)
		}
	}
	if err := e1.Record(); err != nil {
		b.Fatal(err)
	}
	ms, err := e0.Elapsed(e1)
	if err != nil {
		b.Fatal(err)
	}
	v, err := kernels.ToF32(g, out)
	if err != nil {
		b.Fatal(err)
	}
	return ms * 1e3 / float64(replays*reps), v
}

// BenchmarkGPUSkinnyGEMM times Linear with BF16 weights on the five
// Llama-3.2-1B decode shapes at 1, 4, 8, 16, 32 and 64 rows on every path in
// the same run: the skinny GEMM (round mode, the default; and split mode),
// cuBLAS (Options.GEMVRows < 0) and the GEMV kernel (Options.GEMVRows 8,
// GEMVMaxElems above every weight; at most 8 rows), which picks the default
// of Options.GEMVMaxElems. Each weight is replicated into enough
// copies (about 256 MB in all) that it is read from DRAM, not L2. One line a
// case: "skinny <N>x<K> rows <M>: new X us (Y TB/s), cublas Z us, gemv W us,
// split V us", TB/s counting the weight bytes (the floor is bytes / 4.2 TB/s).
// The sub-benchmarks report the new path's us/op and TB/s.
func BenchmarkGPUSkinnyGEMM(b *testing.B) {
	paths := []skinnyBenchPath{
		{"new", newGPUPath(b, GEMMRound, 64, 0, 0)},
		{"cublas", newGPUPath(b, GEMMRound, 0, 0, 0)},
		{"gemv", newGPUPath(b, GEMMRound, 0, 8, everyWeight)},
		{"split", newGPUPath(b, GEMMSplit, 64, 0, 0)},
	}
	largest := 0
	for _, sh := range skinnyBenchShapes {
		largest = max(largest, sh.n*sh.k)
	}
	host := randomBF16(largest, 11)
	r := rand.New(rand.NewPCG(5, 7))
	type result struct{ us, tbs float64 }
	done := map[string]result{} // sub-benchmarks run more than once: measure once
	for _, sh := range skinnyBenchShapes {
		bytes := 2 * sh.n * sh.k
		copies := min(max(1, (256<<20)/bytes), 128)
		weights := make([][]kernels.Tensor, len(paths)) // per path: the copies
		for pi, p := range paths {
			first := upload(b, p.g, kernels.BF16, host[:bytes], kernels.BF16, sh.n, sh.k)
			weights[pi] = []kernels.Tensor{first}
			for range copies - 1 {
				c, err := p.g.Alloc(kernels.BF16, sh.n, sh.k)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.g.CopyRect(c, first); err != nil {
					b.Fatal(err)
				}
				weights[pi] = append(weights[pi], c)
			}
		}
		for _, m := range []int{1, 4, 8, 16, 32, 64} {
			name := fmt.Sprintf("%s/%dx%d/rows=%d", sh.name, sh.n, sh.k, m)
			xs := kernels.F32Bytes(randVals(r, m*sh.k, 1))
			b.Run(name, func(b *testing.B) {
				if res, ok := done[name]; ok {
					b.ReportMetric(res.us, "us/op")
					b.ReportMetric(res.tbs, "TB/s")
					return
				}
				reps := min(max(2*copies, 20), 256)
				us := make([]float64, len(paths))
				outs := make([][]float32, len(paths))
				for pi, p := range paths {
					if strings.HasPrefix(p.name, "gemv") && m > 8 {
						us[pi] = math.NaN()
						continue
					}
					x := upload(b, p.g, kernels.F32, xs, kernels.F32, m, sh.k)
					us[pi], outs[pi] = timeLinearGraph(b, p.g, x, weights[pi], sh.n, reps)
				}
				// The paths round x the same way and differ in summation order only.
				for pi := 1; pi < len(paths); pi++ {
					if outs[pi] == nil || paths[pi].name == "split" {
						continue
					}
					if e := maxRelErr(outs[0], outs[pi]); e > 1e-5 || math.IsNaN(e) {
						b.Errorf("%s: new vs %s: max relative difference %.3g", name, paths[pi].name, e)
					}
				}
				tbs := func(u float64) float64 { return float64(bytes) / (u * 1e-6) / 1e12 }
				gemv := "n/a"
				if !math.IsNaN(us[2]) {
					gemv = fmt.Sprintf("%.1f us (%.2f TB/s)", us[2], tbs(us[2]))
				}
				b.Logf("skinny %dx%d rows %d: new %.1f us (%.2f TB/s), cublas %.1f us, gemv %s, split %.1f us (%.2f TB/s); floor %.1f us",
					sh.n, sh.k, m, us[0], tbs(us[0]), us[1], gemv, us[3], tbs(us[3]), float64(bytes)/4.2e12*1e6)
				done[name] = result{us[0], tbs(us[0])}
				b.ReportMetric(us[0], "us/op")
				b.ReportMetric(tbs(us[0]), "TB/s")
			})
		}
	}
}
