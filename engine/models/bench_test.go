package models

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// benchConfig is a ~100M-parameter Llama shape (GQA, tied embeddings, so a
// decode step reads every weight exactly once: 12 layers of 6.3M plus the
// 24.6M embedding used as LM head).
const benchConfig = `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
	"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
	"num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
	"rope_theta": 500000.0, "tie_word_embeddings": true}`

const benchContext = 128 // cached tokens before the measured decode step

// tinyLlamaConfig is TinyLlama-1.1B's shape (1.1B parameters, untied
// embeddings): a model whose LM head is 6% of its weights, where
// benchConfig's tied head is a quarter of them.
const tinyLlamaConfig = `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
	"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
	"num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
	"rope_theta": 10000.0, "tie_word_embeddings": false}`

type benchModel struct {
	ops         *cpu.Backend
	m           Model
	weightBytes int64
	numParams   int64
}

func newBenchModel(b *testing.B) *benchModel { return newBenchModelQuant(b, benchConfig, "") }

// newBenchModelQuant builds a BF16 model of config with
// Options.Quantization quant, on the CPU path DEEPINFER_BENCH_SIMD names
// (empty: the best the CPU has).
func newBenchModelQuant(b *testing.B, config, quant string) *benchModel {
	b.Helper()
	cfg := parseConfig(b, config)
	w, err := RandomWeights(cfg, kernels.BF16, 1)
	if err != nil {
		b.Fatal(err)
	}
	bm := &benchModel{ops: cpu.New(cpu.Options{SIMD: os.Getenv("DEEPINFER_BENCH_SIMD")})}
	b.Cleanup(func() { bm.ops.Close() })
	for name, t := range w {
		n := int64(t.NumElements())
		bm.numParams += n
		if quant == "fp8" && IsFP8Linear(name) {
			bm.weightBytes += n + 4*n/(128*128) // a byte a weight, a float32 scale a block
		} else {
			bm.weightBytes += int64(len(t.Data))
		}
	}
	if bm.m, err = Builtin().New(bm.ops, cfg, w, Options{MaxModelLen: 1024, Quantization: quant}); err != nil {
		b.Fatal(err)
	}
	return bm
}

// copyBandwidth measures the machine's memory bandwidth with a parallel copy
// of two 256 MiB buffers over all cores, counting bytes read plus written.
func copyBandwidth() float64 {
	const n = 64 << 20 // float32s: 256 MiB
	src, dst := make([]float32, n), make([]float32, n)
	for i := range src {
		src[i] = float32(i)
	}
	workers := runtime.NumCPU()
	best := 0.0
	for range 5 {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			lo, hi := n*w/workers, n*(w+1)/workers
			wg.Go(func() { copy(dst[lo:hi], src[lo:hi]) })
		}
		wg.Wait()
		best = max(best, 2*4*float64(n)/time.Since(start).Seconds())
	}
	return best
}

// BenchmarkDecodeStep: one decode step (forward of one token after 128
// cached, plus its logits) of a ~100M-parameter Llama with BF16 weights.
// Reports tokens/s, the weight-read bandwidth achieved and its ratio to the
// copy bandwidth measured in the same run.
func BenchmarkDecodeStep(b *testing.B) { benchDecodeStep(b, newBenchModel(b)) }

// BenchmarkDecodeStepWeights runs BenchmarkDecodeStep's step with the
// BF16 weights as stored and with the linear layers quantized to FP8 at
// load (the LM head stays BF16, as in DeepSeek's and Qwen's FP8
// checkpoints), the two models' steps alternating in one loop so that the
// machine's drift reaches both alike; it reports each one's tok/s and
// their ratio (fp8/bf16). Two shapes: the ~100M Llama (llama100m: its tied
// embedding, also the LM head, is 49 of its 200 MB, so FP8 cannot pass
// 200 / 125 = 1.6x its BF16 tok/s) and TinyLlama-1.1B's (tinyllama: 2,200
// MB of BF16 against 1,231 MB, a ceiling of 1.8x; about 6 GB of memory and
// half a minute to build). DEEPINFER_BENCH_SIMD picks the CPU path.
func BenchmarkDecodeStepWeights(b *testing.B) {
	for _, shape := range []struct{ name, config string }{{"llama100m", benchConfig}, {"tinyllama", tinyLlamaConfig}} {
		b.Run(shape.name, func(b *testing.B) {
			bf16, fp8 := newBenchModelQuant(b, shape.config, ""), newBenchModelQuant(b, shape.config, "fp8")
			steps := []func(){newDecodeStep(b, bf16), newDecodeStep(b, fp8)}
			var took [2]time.Duration
			b.ResetTimer()
			for b.Loop() {
				for i, step := range steps {
					start := time.Now()
					step()
					took[i] += time.Since(start)
				}
			}
			n := float64(b.N)
			b.ReportMetric(n/took[0].Seconds(), "bf16_tok/s")
			b.ReportMetric(n/took[1].Seconds(), "fp8_tok/s")
			b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "fp8/bf16")
			b.ReportMetric(float64(fp8.weightBytes)*n/took[1].Seconds()/1e9, "fp8_weightGB/s")
			b.ReportMetric(float64(bf16.weightBytes)*n/took[0].Seconds()/1e9, "bf16_weightGB/s")
			b.Logf("%s: %.1f M params, %.0f MB of BF16 and %.0f MB of %s weights a step",
				fp8.ops.Name(), float64(fp8.numParams)/1e6, float64(bf16.weightBytes)/1e6, float64(fp8.weightBytes)/1e6, WeightFormat(fp8.m))
		})
	}
}

func benchDecodeStep(b *testing.B, bm *benchModel) {
	step := newDecodeStep(b, bm)
	bw := copyBandwidth()
	b.ResetTimer()
	for b.Loop() {
		step()
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	achieved := float64(bm.weightBytes) / sec
	b.ReportMetric(1/sec, "tok/s")
	b.ReportMetric(achieved/1e9, "weightGB/s")
	b.ReportMetric(bw/1e9, "copyGB/s")
	b.ReportMetric(achieved/bw, "bw_ratio")
	b.ReportMetric(float64(bm.numParams)/1e6, "Mparams")
	b.Logf("%s: %.1f M params, %.0f MB of %s weights per step; copy bandwidth %.1f GB/s (read+write)",
		bm.ops.Name(), float64(bm.numParams)/1e6, float64(bm.weightBytes)/1e6, WeightFormat(bm.m), bw/1e9)
}

// newDecodeStep prepares bm for the measured step (benchContext tokens
// cached) and returns the step: the forward of one token and its logits.
func newDecodeStep(b *testing.B, bm *benchModel) func() {
	r := rand.New(rand.NewPCG(1, 1))
	const blockSize = 16
	cache, err := bm.m.NewKVCache(16, blockSize)
	if err != nil {
		b.Fatal(err)
	}
	table := newBlockPool(r, 16).table(blockSize, benchContext+1)
	step(b, bm.m, cache, seqStep{randomIDs(r, benchContext, 32000), 0, table})
	h := HostBatch{BlockSize: blockSize}
	h.AddSequence([]int32{42}, benchContext, table)
	batch, err := h.Upload(bm.ops, 16)
	if err != nil {
		b.Fatal(err)
	}
	rows, _ := kernels.FromI32(bm.ops, []int32{0}, 1)
	ctx := context.Background()
	return func() {
		hidden, err := bm.m.Forward(ctx, cache, batch)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := bm.m.ComputeLogits(hidden, rows); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrefill512: one 512-token prefill of the same model (forward over
// all tokens, logits of the last). Reports tokens/s and GFLOP/s, counting 2
// flops per layer parameter per token, the LM head for one row, and
// attention's 4*heads*head_dim flops per (query, visible key) pair.
func BenchmarkPrefill512(b *testing.B) {
	const n, blockSize = 512, 16
	bm := newBenchModel(b)
	r := rand.New(rand.NewPCG(2, 2))
	cache, err := bm.m.NewKVCache(n/blockSize, blockSize)
	if err != nil {
		b.Fatal(err)
	}
	h := HostBatch{BlockSize: blockSize}
	h.AddSequence(randomIDs(r, n, 32000), 0, newBlockPool(r, n/blockSize).table(blockSize, n))
	batch, err := h.Upload(bm.ops, n/blockSize)
	if err != nil {
		b.Fatal(err)
	}
	rows, _ := kernels.FromI32(bm.ops, []int32{n - 1}, 1)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		hidden, err := bm.m.Forward(ctx, cache, batch)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := bm.m.ComputeLogits(hidden, rows); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	cfg := bm.m.Config()
	embed := float64(cfg.VocabSize * cfg.HiddenSize)
	flops := 2*(float64(bm.numParams)-embed)*n + 2*embed +
		float64(4*cfg.NumAttentionHeads*cfg.HeadDim*cfg.NumHiddenLayers)*n*(n+1)/2
	b.ReportMetric(n/sec, "tok/s")
	b.ReportMetric(flops/sec/1e9, "GFLOP/s")
	b.Logf("%s: %.1f M params", bm.ops.Name(), float64(bm.numParams)/1e6)
}

// BenchmarkDecodeBatch64Default: one decode step of 64 sequences (each
// with benchContext tokens cached) through the shipped default model's
// shapes (assets/deepseek-tiny's config, random BF16 weights: MLA, 8
// experts, vocabulary 8192), forward plus the 64 rows of logits: the work
// of one step of `deepinfer generate --file` with 64 prompts. Reports
// tokens/s and GFLOP/s counting 2 flops a multiply-add of the linears, the
// LM head and the absorbed MLA attention as the CPU backend runs it
// (scores over kv_lora_rank + rope, outputs over kv_lora_rank, per head
// and visible key). DEEPINFER_BENCH_THREADS sets the backend's threads,
// DEEPINFER_BENCH_ACTS=bf16 its cpu.activation_rounding (bfloat16 pairs),
// DEEPINFER_BENCH_SIMD its cpu.simd (avx2, avx512; empty: the best the CPU
// has).
//
// Measured on a 2-vCPU AVX-512 Xeon VM (no AMX), cpu(avx512): 2 threads
// 16-21 ms a step (50-64 GFLOP/s), 1 thread 25-28 ms (37-42 GFLOP/s,
// 0.21-0.26 of the one-core FMA probe). A one-thread profile of the step
// (26.3 ms): linears 13 ms (LM head 4.0 at 67 GFLOP/s, routed experts 4.7
// at 40), MLA 10.7 ms (gathered scores 5.0, P.V 1.5, absorption 1.4: the
// attention runs at about 25 GFLOP/s, reading 74 KB of latent rows a
// sequence and layer from L3), the rest 2.6 ms. One expert a worker in the
// MoE and the gathered GEMM's prefetch of the next tile's rows: median of
// six interleaved 2-thread runs 19.07 -> 17.76 ms; GEMMs widening 16-bit
// weights once a column block: 19.14 -> 19.07 ms (within the spread).
func BenchmarkDecodeBatch64Default(b *testing.B) { benchDecodeDefault(b, 64) }

// BenchmarkDecodeBatch1Default is BenchmarkDecodeBatch64Default with one
// sequence: the step of `deepinfer generate` with one prompt, a chain of
// small products (a 256-wide model) whose hand-offs between the workers
// weigh as much as their arithmetic.
func BenchmarkDecodeBatch1Default(b *testing.B) { benchDecodeDefault(b, 1) }

func benchDecodeDefault(b *testing.B, batch int) {
	js, err := os.ReadFile(filepath.Join("..", "..", "assets", "deepseek-tiny", "config.json"))
	if err != nil {
		b.Skip("no default model config:", err)
	}
	cfg := parseConfig(b, string(js))
	w, err := RandomWeights(cfg, kernels.BF16, 1)
	if err != nil {
		b.Fatal(err)
	}
	threads, _ := strconv.Atoi(os.Getenv("DEEPINFER_BENCH_THREADS")) // 0: all cores
	opts := cpu.Options{Threads: threads, SIMD: os.Getenv("DEEPINFER_BENCH_SIMD")}
	if os.Getenv("DEEPINFER_BENCH_ACTS") == "bf16" {
		opts.Activations = cpu.ActBF16
	}
	ops := cpu.New(opts)
	b.Cleanup(func() { ops.Close() })
	m, err := Builtin().New(ops, cfg, w, Options{MaxModelLen: 1024})
	if err != nil {
		b.Fatal(err)
	}
	const blockSize = 16
	r := rand.New(rand.NewPCG(4, 4))
	blocksPerSeq := (benchContext + 1 + blockSize - 1) / blockSize
	cache, err := m.NewKVCache(batch*blocksPerSeq, blockSize)
	if err != nil {
		b.Fatal(err)
	}
	pool := newBlockPool(r, batch*blocksPerSeq)
	h := HostBatch{BlockSize: blockSize}
	for range batch {
		table := pool.table(blockSize, benchContext+1)
		step(b, m, cache, seqStep{randomIDs(r, benchContext, cfg.VocabSize), 0, table})
		h.AddSequence([]int32{int32(r.IntN(cfg.VocabSize))}, benchContext, table)
	}
	fb, err := h.Upload(ops, cache.NumBlocks)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]int32, batch)
	for i := range ids {
		ids[i] = int32(i)
	}
	rows, _ := kernels.FromI32(ops, ids, batch)
	// Linear parameters a token multiplies: the decoder layers' matrices
	// (not the MTP layers past num_hidden_layers), the LM head, and of the
	// routed experts the num_experts_per_tok a token runs.
	var linParams float64
	for name, t := range w {
		var layer int
		inLayers := false
		if _, err := fmt.Sscanf(name, "model.layers.%d.", &layer); err == nil {
			inLayers = layer < cfg.NumHiddenLayers
		}
		if (inLayers || strings.HasPrefix(name, "lm_head")) && len(t.Shape) == 2 && !strings.Contains(name, "mlp.experts.") {
			linParams += float64(t.NumElements())
		}
	}
	moeLayers := cfg.NumHiddenLayers - cfg.FirstKDenseReplace
	linParams += float64(moeLayers * cfg.NumExpertsPerTok * 3 * cfg.HiddenSize * cfg.MoEIntermediateSize)
	attn := float64(cfg.NumHiddenLayers*cfg.NumAttentionHeads) * float64(2*cfg.KVLoraRank+cfg.QKRopeHeadDim) * (benchContext + 1)
	flops := 2 * float64(batch) * (linParams + attn)
	ctx := context.Background()
	peak := ops.PeakFLOPS()
	for b.Loop() {
		hidden, err := m.Forward(ctx, cache, fb)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.ComputeLogits(hidden, rows); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(batch)/sec, "tok/s")
	b.ReportMetric(flops/sec/1e9, "GFLOP/s")
	if peak > 0 {
		b.ReportMetric(flops/sec/peak, "x_peak")
	}
}
