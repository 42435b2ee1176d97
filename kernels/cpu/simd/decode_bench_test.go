package simd

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/pool"
)

// decodeLayer153M are the matrices one decoder layer of the 153M Llama of
// tools/cpu/peer-bench multiplies at decode (hidden 768, MLP 3072, 12 query
// and 4 key/value heads of 64): fused QKV, O, fused gate/up, down. The
// engine runs each as one Linear over the pool, 16 columns a grain.
var decodeLayer153M = []struct {
	name string
	n, k int
}{
	{"qkv", 1280, 768},
	{"o", 768, 768},
	{"gate_up", 6144, 768},
	{"down", 768, 3072},
}

// decodeColdBytes is the working set BenchmarkDecodeLayer rotates over:
// more than the 480 MiB L3 of the Xeon it was measured on, so that every
// layer's weights come from DRAM as in a decode step.
const decodeColdBytes = 1 << 30

// decodeFormat is one weight format and activation mode of
// BenchmarkDecodeLayer: mk builds a layer's weights for a shape, prep the
// product of one matrix for one activation row (the activation rounding of
// the llama_cpp mode, once per matrix as the CPU backend does, included).
type decodeFormat struct {
	name string
	mk   func(r *rand.Rand, n, k int) any
	// prep returns the product for columns [lo, hi) of one matrix with
	// weights w; it runs once per matrix (the activations' rounding) and
	// the returned function once per chunk of the pool.
	prep func(impl *Impl, x []float32, w any, n, k int) func(out []float32, lo, hi int)
	size func(w any) int
}

// decodeFormats are BenchmarkDecodeLayer's cases on the path impl.
func decodeFormats(impl *Impl) []decodeFormat {
	quant := func(t QuantType, llama bool) decodeFormat {
		name := t.String()
		if llama {
			name += "_llama"
		}
		return decodeFormat{
			name: name,
			mk: func(r *rand.Rand, n, k int) any {
				w, _ := quantRows(t, r, n, k)
				return w
			},
			prep: func(impl *Impl, x []float32, w any, n, k int) func(out []float32, lo, hi int) {
				wb := w.([]byte)
				if !llama {
					return func(out []float32, lo, hi int) { impl.LinearQuant(out, x, wb, t, 1, n, k, lo, hi) }
				}
				ab, _ := ActRowBytes(t, k)
				a := make([]byte, ab)
				QuantizeActs(a, x, t, 1, k)
				return func(out []float32, lo, hi int) { impl.LinearQuantLlama(out, a, wb, t, 1, n, k, lo, hi) }
			},
			size: func(w any) int { return len(w.([]byte)) },
		}
	}
	bf16 := func(llama bool) decodeFormat {
		name := "bf16"
		if llama {
			name += "_llama"
		}
		return decodeFormat{
			name: name,
			mk: func(r *rand.Rand, n, k int) any {
				w := make([]uint16, n*k)
				for i := range w {
					w[i] = f32ToBF16(float32(r.NormFloat64()))
				}
				return w
			},
			prep: func(impl *Impl, x []float32, w any, n, k int) func(out []float32, lo, hi int) {
				wh := w.([]uint16)
				if !llama {
					return func(out []float32, lo, hi int) { impl.LinearBF16(out, x, wh, 1, n, k, lo, hi) }
				}
				xh := make([]uint16, k)
				RoundBF16(xh, x)
				return func(out []float32, lo, hi int) { impl.Linear16Llama(out, xh, wh, true, 1, n, k, lo, hi) }
			},
			size: func(w any) int { return 2 * len(w.([]uint16)) },
		}
	}
	bf16Pairs := bf16(false)
	bf16Pairs.name = "bf16_pairs"
	bf16Pairs.prep = func(impl *Impl, x []float32, w any, n, k int) func(out []float32, lo, hi int) {
		wh := w.([]uint16)
		xh := make([]uint16, k)
		RoundBF16(xh, x)
		return func(out []float32, lo, hi int) { impl.LinearBF16Pairs(out, xh, wh, 1, n, k, lo, hi) }
	}
	f32 := decodeFormat{
		name: "f32",
		mk:   func(r *rand.Rand, n, k int) any { return randVec(r, n*k) },
		prep: func(impl *Impl, x []float32, w any, n, k int) func(out []float32, lo, hi int) {
			wf := w.([]float32)
			return func(out []float32, lo, hi int) { impl.LinearF32(out, x, wf, 1, n, k, lo, hi) }
		},
		size: func(w any) int { return 4 * len(w.([]float32)) },
	}
	f8 := func(name string, pick func(*Impl) *Impl) decodeFormat {
		return decodeFormat{
			name: name,
			mk: func(r *rand.Rand, n, k int) any {
				w, _ := randF8Weights(r, n, k, 128)
				for j := range w.ScaleRow { // 128x128 blocks, as checkpoints have them
					w.ScaleRow[j] = int32(j / 128)
				}
				return w
			},
			prep: func(impl *Impl, x []float32, w any, n, k int) func(out []float32, lo, hi int) {
				wf, p := w.(F8Weights), pick(impl)
				return func(out []float32, lo, hi int) { p.LinearF8(out, x, wf, 1, n, k, lo, hi) }
			},
			size: func(w any) int { wf := w.(F8Weights); return len(wf.Data) + 4*len(wf.Scales) },
		}
	}
	// f8_novbmi: the AVX-512 path without its VBMI widening, where the CPU
	// has VBMI and impl is that path.
	f8s := []decodeFormat{f8("f8", func(p *Impl) *Impl { return p })}
	for _, v := range f8Variants() {
		if v.Name() == impl.Name()+"-novbmi" {
			f8s = append(f8s, f8("f8_novbmi", func(*Impl) *Impl { return v }))
		}
	}
	return append(f8s,
		f32,
		quant(QuantQ8_0, false), quant(QuantQ8_0, true),
		bf16(false), bf16(true), bf16Pairs,
		quant(QuantQ4_K, false), quant(QuantQ4_K, true),
		quant(QuantQ6_K, true),
	)
}

// BenchmarkDecodeLayer runs the GEMVs of one decoder layer of the 153M
// Llama (decodeLayer153M, one activation row) over the pool, rotating over
// copies of the layer that do not fit in the caches, for F32, Q8_0, BF16 and
// K-quant weights in both activation modes (LinearF32 / LinearQuant /
// LinearBF16, and the llama_cpp mode's LinearQuantLlama / Linear16Llama with
// the activations rounded once per matrix) and FP8 E4M3 weights in 128 x 128
// blocks (LinearF8). It reports the weight bytes read
// per second (mean GB/s and best window of 4 layers) and their ratios to the
// parallel read bandwidth measured right before and right after each case
// (read_GB/s is their mean; x_read and best_x_read the ratios):
//
//	go test -c -o simd.test ./kernels/cpu/simd
//	./simd.test -test.run XXX -test.bench DecodeLayer -test.benchtime 100x
//
// Measured on 2 vCPUs of an Intel Xeon (AVX-512 VNNI/BF16, AMX; KVM,
// shared with other jobs), AVX-512 path; best window / read bandwidth,
// before -> after, alternating runs of the two builds, one worker (two
// rounds, read 12-13 GB/s) and two workers (three rounds, read 21-27 GB/s):
//
//	case              one worker                 two workers
//	Q8_0              0.37-0.54 -> 0.73-0.79     0.39-0.45 -> 0.58-0.69
//	Q8_0 llama_cpp    0.61-0.69 -> 0.92-0.97     0.47-0.56 -> 0.64-0.79
//	bf16              0.83-0.95 -> 1.00-1.07     0.71-0.81 -> 0.72-0.90
//	bf16 llama_cpp    0.39-0.40 -> 0.62-0.67     0.35-0.37 -> 0.41-0.54
//	Q4_K              0.24-0.26 -> 0.52-0.53     0.16-0.19 -> 0.36-0.43
//	Q4_K llama_cpp    0.57-0.59 -> 0.65-0.67     0.35-0.46 -> 0.42-0.47
//	Q6_K llama_cpp    0.61-0.64 -> 0.71          0.48-0.52 -> 0.53-0.57
//
// The changes, each with its prediction and what it gave:
//
//   - Q8_0/Q4_0 llama_cpp decode tile (quant_llama.h). Found: it read its
//     eight f16 block scales with 2-byte loads stored to the stack and
//     reloaded as one vector, a store-forwarding stall per block, and its
//     prefetch never ran (ql_linear handed ql_cols one 8-row tile at a
//     time, and ql_cols only prefetched within its range). Prediction from
//     a stand-alone C loop (2048 x 768 and 768 x 3072, two threads, 512 MiB
//     of weights): gather alone 0.49 -> 0.55 of the read bandwidth, an L2
//     prefetch two tiles ahead alone 0.72, both 0.90-0.97. Outcome: one
//     worker 0.92-0.97 (the row above).
//   - Linear16Llama below 4 rows (llama16_avx512.c): the 16-row tile was
//     widened and transposed into a float32 scratch tile (twice the bytes
//     of the weights, allocated per call) and read back. Prediction: transposing
//     in registers per step bounds it by its own instructions (a float32
//     multiply, two widenings to float64 and two float64 adds per 16
//     products, the sums staying in order), about 1.4x the 5.5 GMAC/s of
//     one core with weights in L2. Outcome: 7.5 GMAC/s in L2, 0.62-0.67 of
//     the read bandwidth on one core: now compute bound.
//   - LinearQuant decode tiles (quant_avx512.c, quant_avx2.c): an L2
//     prefetch about 12 KiB ahead (prediction from the C loop on one core:
//     Q8_0 7.4 -> 10.3 GB/s of a 15 GB/s read) and unroll pragmas on the
//     tile loops, without which GCC -O2 kept the accumulators of multi-
//     column tiles (K-quants, m > 1) on the stack. Outcome: Q8_0 as
//     predicted, Q4_K twice as fast. Q8_0's tile is bound by converting
//     int8 to float32 (two of its four vector instructions per 16 weights)
//     and, with one column, by its chain of fused multiply-adds: two
//     columns for one row of x gave about 10% more on one core (six
//     alternating runs; the table above has one column), the same on two.
//   - Linear16Llama on AVX2 (llama16_avx2.c, new; it ran the Go loop):
//     prediction about 0.4 of the read bandwidth on one core, from the
//     AVX-512 kernel's instruction count on half-width vectors. Outcome on
//     the AVX2 path (DEEPINFER_SIMD=avx2, one worker): bf16 llama_cpp 0.07
//     -> 0.45; Q8_0 0.40 -> 0.82 and Q8_0 llama_cpp 0.56 -> 0.91 there from
//     the changes above.
//   - LinearBF16 (kernels_avx512.c): prefetching 16-bit weights into L2
//     instead of L1: a few percent, within the spread.
//   - K-quant llama_cpp decode tiles: prefetch into L2 two tiles ahead and
//     also from the last tile of each group of four: 10-15 %.
//
// Two workers read less than one (with the same read bandwidth per core):
// each matrix is one parallel loop of 8 chunks, so each product paid the
// wake-up of the other worker, a cold start per chunk and the wait for the
// last chunk; the machine was shared during the runs, so the ratios of two
// workers spread widely. The pool's workers now poll for the next job
// instead of blocking (package pool). Prediction: most of the wake-up cost
// goes, decode +10-15%. On the 2-vCPU Zen 5 VM of BENCH.md, two workers,
// three alternating runs of 300 layers, mean x_read before -> after: F32
// 0.57-0.71 -> 0.70-0.86, Q8_0 0.48-0.49 -> 0.56-0.82, BF16 0.48-0.74 ->
// 0.54-0.71 (absolute GB/s within the spread), Q4_K 0.27-0.37 -> 0.31-0.43;
// the whole decode of the peer benchmark gained 10-35% (BENCH.md).
func BenchmarkDecodeLayer(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	roof := newRoofline(p)
	impl := benchImpl(b)
	r := rand.New(rand.NewPCG(11, 12))
	x := randVec(r, 3072)
	for _, f := range decodeFormats(impl) {
		b.Run(fmt.Sprintf("%s/%s", impl, f.name), func(b *testing.B) {
			layer := make([]any, len(decodeLayer153M))
			layerBytes := 0
			for i, sh := range decodeLayer153M {
				layer[i] = f.mk(r, sh.n, sh.k)
				layerBytes += f.size(layer[i])
			}
			copies := make([][]any, max(1, decodeColdBytes/layerBytes))
			for c := range copies {
				copies[c] = make([]any, len(layer))
				for i, w := range layer {
					switch w := w.(type) {
					case []byte:
						copies[c][i] = append([]byte(nil), w...)
					case []uint16:
						copies[c][i] = append([]uint16(nil), w...)
					case []float32:
						copies[c][i] = append([]float32(nil), w...)
					case F8Weights:
						w.Data = append([]uint8(nil), w.Data...)
						copies[c][i] = w
					}
				}
			}
			out := make([]float32, 6144)
			read0 := roof.readGBps()
			win := newBestWindow(4)
			c := 0
			for b.Loop() {
				for i, sh := range decodeLayer153M {
					run := f.prep(impl, x[:sh.k], copies[c][i], sh.n, sh.k)
					p.ForGrain(sh.n, 16, func(lo, hi int) { run(out, lo, hi) })
				}
				c = (c + 1) % len(copies)
				win.done()
			}
			read := (read0 + roof.readGBps()) / 2
			best := float64(layerBytes) / win.bestSec / 1e9
			mean := float64(layerBytes) * float64(b.N) / b.Elapsed().Seconds() / 1e9
			b.ReportMetric(mean, "GB/s")
			b.ReportMetric(mean/read, "x_read")
			b.ReportMetric(best, "best_GB/s")
			b.ReportMetric(read, "read_GB/s")
			b.ReportMetric(best/read, "best_x_read")
		})
	}
}
