package cuda

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// Benchmarks on the Llama-3.2-1B shape with untied embeddings (1.50B
// parameters, 3.0 GB of BF16 weights), random weights. The floor of a decode
// step is the weight bytes over the copy bandwidth (4.2 TB/s measured on an
// H200: 0.71 ms).

const llama1BConfig = `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
	"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
	"num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
	"rope_theta": 500000.0, "tie_word_embeddings": false, "hidden_act": "silu",
	"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
		"original_max_position_embeddings": 8192}}`

// fastLlamaWeights serves every tensor of a Llama (or Qwen3) config from one shared
// buffer of random BF16 values (uniform, scale 0.03; norm weights near 1), so
// that a 1.5B-parameter model is ready in well under a second. Values repeat
// across tensors, which changes nothing for timing.
func fastLlamaWeights(cfg *weights.Config) models.MemWeights {
	h, inter, v := cfg.HiddenSize, cfg.IntermediateSize, cfg.VocabSize
	qd, kvd := cfg.NumAttentionHeads*cfg.HeadDim, cfg.NumKeyValueHeads*cfg.HeadDim
	largest := max(v*h, inter*h, qd*h)
	buf := randomBF16(largest, 3)
	ones := make([]byte, 2*h)
	for i := range h {
		bits := kernels.F32ToBF16(1 + float32(i%7)*0.01)
		ones[2*i], ones[2*i+1] = byte(bits), byte(bits>>8)
	}
	w := models.MemWeights{}
	mat := func(name string, shape ...int) {
		n := shape[0] * shape[1]
		w[name] = weights.Tensor{Name: name, DType: weights.BF16, Shape: shape, Data: buf[:2*n], File: "random"}
	}
	vec := func(name string, n int) {
		w[name] = weights.Tensor{Name: name, DType: weights.BF16, Shape: []int{n}, Data: ones[:2*n], File: "random"}
	}
	mat("model.embed_tokens.weight", v, h)
	if !cfg.TieWordEmbeddings {
		mat("lm_head.weight", v, h)
	}
	vec("model.norm.weight", h)
	for i := range cfg.NumHiddenLayers {
		p := fmt.Sprintf("model.layers.%d.", i)
		vec(p+"input_layernorm.weight", h)
		vec(p+"post_attention_layernorm.weight", h)
		if cfg.ModelType == "qwen3" {
			vec(p+"self_attn.q_norm.weight", cfg.HeadDim)
			vec(p+"self_attn.k_norm.weight", cfg.HeadDim)
		}
		mat(p+"self_attn.q_proj.weight", qd, h)
		mat(p+"self_attn.k_proj.weight", kvd, h)
		mat(p+"self_attn.v_proj.weight", kvd, h)
		mat(p+"self_attn.o_proj.weight", h, qd)
		mat(p+"mlp.gate_proj.weight", inter, h)
		mat(p+"mlp.up_proj.weight", inter, h)
		mat(p+"mlp.down_proj.weight", h, inter)
	}
	return w
}

type benchModel struct {
	ops   *Backend
	m     models.Model
	cache *models.KVCache
	cfg   *weights.Config
	// interleave lays decodeSteps' cache blocks out round-robin over the
	// sequences (block j of each, then block j+1), as an engine hands them
	// to sequences growing together, instead of each sequence's blocks in
	// one run.
	interleave bool
	// tableKeys, when set, pads every block table to this many keys (the
	// engine's tables are max_model_len wide): more key chunks a row in the
	// decode grid, the ones past a row's keys empty.
	tableKeys int
}

func loadLlama1B(b *testing.B, mode GEMMMode, numBlocks, blockSize int) *benchModel {
	b.Helper()
	cfg, err := weights.ParseConfig([]byte(llama1BConfig))
	if err != nil {
		b.Fatal(err)
	}
	return loadModel(b, Options{GEMM: mode}, "llama-1B", cfg, fastLlamaWeights(cfg), numBlocks, blockSize)
}

// loadShape loads the real-shape config tools/configs/real/<name>.json (a
// Llama or Qwen3) with fastLlamaWeights.
func loadShape(b *testing.B, name string, opts Options, numBlocks, blockSize int) *benchModel {
	b.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "tools", "configs", "real", name+".json"))
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := weights.ParseConfig(raw)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return loadModel(b, opts, name, cfg, fastLlamaWeights(cfg), numBlocks, blockSize)
}

func loadModel(b *testing.B, opts Options, name string, cfg *weights.Config, w models.MemWeights, numBlocks, blockSize int) *benchModel {
	b.Helper()
	g := newGPUOpts(b, opts)
	start := time.Now()
	m, err := models.Builtin().New(g, cfg, w, models.Options{MaxModelLen: 8192})
	if err != nil {
		b.Fatal(err)
	}
	cache, err := m.NewKVCache(numBlocks, blockSize)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	b.Logf("%s shape loaded on %s in %v", name, g.Name(), time.Since(start).Round(time.Millisecond))
	return &benchModel{ops: g, m: m, cache: cache, cfg: cfg}
}

// step runs one forward over seqs (ids after numCached tokens each) and the
// LM head on every row, then waits.
func (bm *benchModel) step(b *testing.B, ids [][]int32, numCached []int, tables [][]int32) kernels.Tensor {
	h := models.HostBatch{BlockSize: bm.cache.BlockSize}
	for s := range ids {
		h.AddSequence(ids[s], numCached[s], tables[s])
	}
	fb, err := h.Upload(bm.ops, bm.cache.NumBlocks)
	if err != nil {
		b.Fatal(err)
	}
	lg := bm.forward(b, fb)
	if err := bm.ops.Sync(); err != nil {
		b.Fatal(err)
	}
	return lg
}

// forward queues the model's forward pass over fb and the LM head on every
// row, and returns the logits (nothing waits).
func (bm *benchModel) forward(b *testing.B, fb *models.ForwardBatch) kernels.Tensor {
	hidden, err := bm.m.Forward(context.Background(), bm.cache, fb)
	if err != nil {
		b.Fatal(err)
	}
	lg, err := bm.m.ComputeLogits(hidden, nil)
	if err != nil {
		b.Fatal(err)
	}
	return lg
}

// logProfile logs g's per-operation device times (profileEnv=1; nothing
// otherwise), largest first, and resets them.
func logProfile(b *testing.B, g *Backend) {
	b.Helper()
	logProfileLess(b, g, nil)
}

// logProfileLess is logProfile less a baseline profile (a run of the same
// prompts that stops after their prefill), so that what is logged is the
// decode steps' share alone; it resets the profile.
func logProfileLess(b *testing.B, g *Backend, base []OpTime) {
	b.Helper()
	prof, err := g.OpProfile(true)
	if err != nil {
		b.Errorf("op profile: %v", err)
	}
	if base != nil {
		prof = subtractProfile(prof, base)
	}
	for _, line := range FormatOpProfile(prof, 25) {
		b.Logf("profile | %s", line)
	}
}

// subtractProfile is prof less base, operation by operation (entries with
// no calls left dropped), largest first.
func subtractProfile(prof, base []OpTime) []OpTime {
	less := make(map[string]OpTime, len(base))
	for _, t := range base {
		less[t.Op] = t
	}
	var out []OpTime
	for _, t := range prof {
		t.Calls -= less[t.Op].Calls
		t.Millis -= less[t.Op].Millis
		if t.Calls > 0 && t.Millis > 0 {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(x, y OpTime) int { return cmp.Compare(y.Millis, x.Millis) })
	return out
}

// BenchmarkGPUDecodeLlama1B times decode steps at batch 1 and 32 with 256
// tokens of context per sequence: eager, and one captured CUDA graph
// replayed. Two more single rows, of 2048 and 8000 keys (the model's
// positions stop at 8192), show what the
// decode attention's chunk length (Options.DecodeChunk) costs a lone
// long row: its blocks are its chunks times the KV heads.
func BenchmarkGPUDecodeLlama1B(b *testing.B) {
	const blockSize, ctxLen, maxBatch = 16, 256, 32
	perSeq := (ctxLen + blockSize) / blockSize
	bm := loadLlama1B(b, GEMMRound, maxBatch*perSeq, blockSize) // once: sub-benchmarks run more than once
	for _, c := range []struct{ batch, ctx int }{{1, ctxLen}, {maxBatch, ctxLen}, {1, 2048}, {1, 8000}} {
		name := fmt.Sprintf("batch=%d", c.batch)
		if c.ctx != ctxLen {
			name += fmt.Sprintf(",context=%d", c.ctx)
		}
		b.Run(name, func(b *testing.B) {
			ctx := make([]int, c.batch)
			for s := range ctx {
				ctx[s] = c.ctx
			}
			gms := bm.decodeSteps(b, ctx, true)
			b.Logf("decode batch %d, context %d: graph replay %.3f ms/step (%.0f tok/s); floor 0.71 ms", c.batch, c.ctx, gms, float64(c.batch)/(gms/1e3))
		})
	}
}

// BenchmarkGPUDecodeQwen3Offline times the decode step that dominates the
// offline benchmark on the Qwen3-0.6B shape (BenchmarkGPUEngineOfflineQwen3):
// 256 sequences whose contexts are uniform in 300..1500 tokens (mean 900,
// about the mean context a decoded token of nano-vllm's workload attends
// to), with half and with 8-bit KV caches. The caches stay as allocated
// (zero): attention's time does not depend on the values. Eager and graph
// replay, as BenchmarkGPUDecodeLlama1B; DEEPINFER_CUDA_SKIP (skipEnv) splits a
// replayed step by operation. Variants toward the engine's conditions:
// blocks handed out round-robin (blocks=interleaved), block tables 2048
// keys wide (table=2048), and the workload's late steps (64 rows of
// 1200-2000 keys).
func BenchmarkGPUDecodeQwen3Offline(b *testing.B) {
	const blockSize = 16
	// contexts returns batch contexts uniform in lo..hi and their blocks.
	contexts := func(batch, lo, hi int) ([]int, int) {
		r := rand.New(rand.NewPCG(7, 8))
		ctx, blocks := make([]int, batch), 0
		for s := range ctx {
			ctx[s] = lo + r.IntN(hi-lo+1)
			blocks += (ctx[s] + blockSize) / blockSize
		}
		return ctx, blocks
	}
	run := func(name string, kv kernels.DType, batch, lo, hi int, interleaved bool, tableKeys int) {
		b.Run(name, func(b *testing.B) {
			ctx, blocks := contexts(batch, lo, hi)
			opts := Options{}
			if kv == kernels.F8E4M3 {
				opts.KVCacheDType = kv
			}
			bm := loadShape(b, "qwen3-0.6b", opts, blocks, blockSize)
			bm.interleave, bm.tableKeys = interleaved, tableKeys
			gms := bm.decodeSteps(b, ctx, false)
			b.Logf("qwen3-0.6b decode batch %d, contexts %d..%d, %s KV cache, blocks %s, tables of %d keys: graph replay %.3f ms/step (%.0f tok/s)",
				batch, lo, hi, bm.cache.Spec.DType, map[bool]string{false: "contiguous", true: "interleaved"}[interleaved], max(tableKeys, hi+1), gms, float64(batch)/(gms/1e3))
		})
	}
	for _, kv := range []kernels.DType{kernels.F16, kernels.F8E4M3} {
		run("kv="+kv.String(), kv, 256, 300, 1500, false, 0)
		run("kv="+kv.String()+"/blocks=interleaved", kv, 256, 300, 1500, true, 0)
	}
	// The engine's tables (2048 keys) and the workload's late steps: fewer,
	// longer rows.
	run("kv=F8_E4M3/table=2048", kernels.F8E4M3, 256, 300, 1500, false, 2048)
	run("kv=F8_E4M3/rows=64,ctx=1200-2000", kernels.F8E4M3, 64, 1200, 2000, false, 0)
}

// decodeSteps times one decode step of len(ctx) sequences, sequence s with
// ctx[s] tokens of context (prefilled first when prefill is set, else the
// cache keeps its contents), each sequence's blocks after the previous
// one's: b.N eager steps (forward and LM head on every row, then a wait),
// then the same step captured once and replayed 50 times. It reports both
// and returns the replay's ms per step.
func (bm *benchModel) decodeSteps(b *testing.B, ctx []int, prefill bool) float64 {
	batch, blockSize := len(ctx), bm.cache.BlockSize
	r := rand.New(rand.NewPCG(1, 2))
	ids, prompt, cached, tables := make([][]int32, batch), make([][]int32, batch), make([]int, batch), make([][]int32, batch)
	next := int32(0)
	for s := range batch {
		tables[s] = make([]int32, (ctx[s]+blockSize)/blockSize)
		for j := range tables[s] {
			tables[s][j] = next
			next++
		}
	}
	if bm.interleave { // block j of every sequence, then block j+1: the order in which growing sequences take them
		next = 0
		for j := 0; ; j++ {
			more := false
			for s := range batch {
				if j < len(tables[s]) {
					tables[s][j], more = next, true
					next++
				}
			}
			if !more {
				break
			}
		}
	}
	if w := bm.tableKeys / blockSize; w > 0 {
		for s := range tables {
			for len(tables[s]) < w {
				tables[s] = append(tables[s], 0)
			}
		}
	}
	for s := range batch {
		prompt[s] = make([]int32, ctx[s])
		for j := range prompt[s] {
			prompt[s][j] = int32(r.IntN(bm.cfg.VocabSize))
		}
		ids[s] = []int32{int32(r.IntN(bm.cfg.VocabSize))}
		cached[s] = ctx[s]
	}
	if prefill {
		bm.step(b, prompt, make([]int, batch), tables)
	}
	for range 3 { // warm-up: allocator, cuBLAS heuristics
		bm.step(b, ids, cached, tables)
	}
	bm.ops.OpProfile(true) // the eager steps below only (profileEnv)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		bm.step(b, ids, cached, tables)
	}
	el := time.Since(start)
	b.StopTimer()
	logProfile(b, bm.ops)
	ms := el.Seconds() * 1e3 / float64(b.N)
	b.ReportMetric(ms, "ms/step")
	b.ReportMetric(float64(batch)/(ms/1e3), "tok/s")

	// The same step captured once and replayed: launch overhead gone.
	h := models.HostBatch{BlockSize: blockSize}
	for s := range batch {
		h.AddSequence(ids[s], cached[s], tables[s])
	}
	fb, err := h.Upload(bm.ops, bm.cache.NumBlocks)
	if err != nil {
		b.Fatal(err)
	}
	if err := bm.ops.BeginCapture(); err != nil {
		b.Fatal(err)
	}
	lg := bm.forward(b, fb)
	graph, err := bm.ops.EndCapture()
	if err != nil {
		b.Fatal(err)
	}
	defer graph.Close()
	const reps = 50
	e0, _ := bm.ops.NewEvent()
	e1, _ := bm.ops.NewEvent()
	for range 3 {
		graph.Replay()
	}
	e0.Record()
	for range reps {
		if err := graph.Replay(); err != nil {
			b.Fatal(err)
		}
	}
	e1.Record()
	gms, err := e0.Elapsed(e1)
	if err != nil {
		b.Fatal(err)
	}
	gms /= reps
	v, err := kernels.ToF32(bm.ops, lg)
	if err != nil {
		b.Fatal(err)
	}
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			b.Error("graph replay produced non-finite logits")
			break
		}
	}
	b.ReportMetric(gms, "graph-ms/step")
	b.ReportMetric(float64(batch)/(gms/1e3), "graph-tok/s")
	b.Logf("eager %.3f ms/step (%.0f tok/s), graph replay %.3f ms/step", ms, float64(batch)/(ms/1e3), gms)
	return gms
}

// BenchmarkGPUPrefillLlama1B times one 4096-token prompt and reports the
// achieved rate over the model's FLOPs (2 per parameter per token, plus
// causal attention 2*2*layers*heads*head_dim*T^2/2).
func BenchmarkGPUPrefillLlama1B(b *testing.B) {
	const blockSize, n = 16, 4096
	bm := loadLlama1B(b, GEMMRound, n/blockSize+1, blockSize) // once: the sub-benchmark runs more than once
	b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) { bm.prefill(b, n) })
}

func (bm *benchModel) prefill(b *testing.B, n int) {
	blockSize := bm.cache.BlockSize
	r := rand.New(rand.NewPCG(3, 4))
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = int32(r.IntN(bm.cfg.VocabSize))
	}
	table := make([]int32, n/blockSize+1)
	for i := range table {
		table[i] = int32(i)
	}
	step := func() {
		h := models.HostBatch{BlockSize: blockSize}
		h.AddSequence(prompt, 0, table)
		fb, err := h.Upload(bm.ops, bm.cache.NumBlocks)
		if err != nil {
			b.Fatal(err)
		}
		hidden, err := bm.m.Forward(context.Background(), bm.cache, fb)
		if err != nil {
			b.Fatal(err)
		}
		last, err := kernels.FromI32(bm.ops, []int32{int32(n - 1)}, 1)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := bm.m.ComputeLogits(hidden, last); err != nil {
			b.Fatal(err)
		}
		if err := bm.ops.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	step()
	bm.ops.OpProfile(true) // the timed steps below only (profileEnv)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		step()
	}
	sec := time.Since(start).Seconds() / float64(b.N)
	logProfile(b, bm.ops)
	c, nf := bm.cfg, float64(n)
	params := float64(c.NumHiddenLayers)*float64(c.HiddenSize)*float64(2*c.NumAttentionHeads*c.HeadDim+2*c.NumKeyValueHeads*c.HeadDim+3*c.IntermediateSize) +
		float64(c.VocabSize*c.HiddenSize)/nf // the LM head runs on one row
	flops := 2*params*nf + 2*float64(c.NumHiddenLayers*c.NumAttentionHeads*c.HeadDim)*nf*nf
	b.ReportMetric(sec*1e3, "ms/prefill")
	b.ReportMetric(flops/sec/1e12, "TFLOP/s")
	b.Logf("prefill %d tokens: %.1f ms, %.1f TFLOP/s (goal: 390, half of 780)", n, sec*1e3, flops/sec/1e12)
}

// BenchmarkGPUOps times single operations at the Llama-1B decode shapes with
// device events (100 launches back to back): Linear with BF16 weights at 1
// and 32 rows against the copy bandwidth (weight bytes / time), and decode
// attention over 256 and 4096 keys.
func BenchmarkGPUOps(b *testing.B) {
	g := newGPU(b, GEMMRound)                    // the default paths (BenchmarkGPUSkinnyGEMM compares them)
	gOff := newGPUOpts(b, Options{GEMVRows: -1}) // linears on cuBLAS at every size
	r := rand.New(rand.NewPCG(5, 6))
	for _, sh := range []struct {
		name string
		n, k int
	}{{"q_proj", 2048, 2048}, {"kv_proj", 512, 2048}, {"gate_up", 16384, 2048}, {"down", 2048, 8192}, {"lm_head", 128256, 2048}} {
		for _, m := range []int{1, 4, 32} {
			b.Run(fmt.Sprintf("linear/%s/m=%d", sh.name, m), func(b *testing.B) {
				for _, be := range []struct {
					name string
					g    *Backend
				}{{" (default)", g}, {" (cuBLAS)", gOff}} {
					if be.name != " (default)" && m > 8 {
						continue // cuBLAS either way
					}
					w := upload(b, be.g, kernels.BF16, hostBytes(kernels.BF16, randVals(r, sh.n*sh.k, 0.03)), kernels.BF16, sh.n, sh.k)
					x := upload(b, be.g, kernels.F32, kernels.F32Bytes(randVals(r, m*sh.k, 1)), kernels.F32, m, sh.k)
					out, _ := be.g.Alloc(kernels.F32, m, sh.n)
					ms := timeIt(b, be.g, 100, func() error { return be.g.Linear(out, x, w, nil) })
					gbs := float64(2*sh.n*sh.k) / (ms / 1e3) / 1e9
					if be.g == g {
						b.ReportMetric(ms*1e3, "us/op")
						b.ReportMetric(gbs, "GB/s")
					}
					b.Logf("linear %s m=%d n=%d k=%d%s: %.1f us, %.0f GB/s of weights", sh.name, m, sh.n, sh.k, be.name, ms*1e3, gbs)
				}
			})
		}
	}
	for _, ctx := range []int{256, 4096} {
		for _, cdt := range []kernels.DType{kernels.F32, kernels.F16} {
			for _, batch := range []int{1, 32} {
				b.Run(fmt.Sprintf("attention/ctx=%d/batch=%d/cache=%s", ctx, batch, cdt), func(b *testing.B) {
					ap := kernels.AttentionParams{NumHeads: 32, NumKVHeads: 8, HeadDim: 64, Scale: 0.125}
					if cdt == kernels.F16 {
						ap.InputDType = kernels.BF16 // a 16-bit model: tensor cores
					}
					us, gbs := benchDecodeAttention(b, g, r, batch, ctx, ap, cdt)
					b.Logf("attention decode ctx=%d batch=%d (32 q / 8 kv heads, d 64, %s cache): %.1f us, %.0f GB/s of KV", ctx, batch, cdt, us, gbs)
				})
			}
		}
	}
	// Decode attention of 16-bit models against the shortest key chunk
	// (Options.DecodeChunk): Qwen3-0.6B's heads in the offline workload
	// (16 q / 8 kv heads of 128, 256 sequences of about 800 keys) and one
	// long Llama-3.2-1B row (32 q / 8 kv heads of 64, 4096 keys).
	for _, chunk := range []int{128, 256, 512} {
		for _, c := range []struct {
			name                   string
			batch, ctx, heads, kvh int
			d                      int
		}{{"qwen3", 256, 800, 16, 8, 128}, {"llama", 1, 4096, 32, 8, 64}, {"llama", 32, 4096, 32, 8, 64}} {
			b.Run(fmt.Sprintf("attention/%s/ctx=%d/batch=%d/chunk=%d", c.name, c.ctx, c.batch, chunk), func(b *testing.B) {
				ap := kernels.AttentionParams{NumHeads: c.heads, NumKVHeads: c.kvh, HeadDim: c.d,
					Scale: float32(1 / math.Sqrt(float64(c.d))), InputDType: kernels.BF16}
				us, gbs := benchDecodeAttention(b, newGPUOpts(b, Options{DecodeChunk: chunk}), r, c.batch, c.ctx, ap, kernels.F16)
				b.Logf("attention decode %s ctx=%d batch=%d (%d q / %d kv heads, d %d, F16 cache), chunk >= %d: %.1f us, %.0f GB/s of KV",
					c.name, c.ctx, c.batch, c.heads, c.kvh, c.d, chunk, us, gbs)
			})
		}
	}
	for _, hd := range []int{64, 128} {
		for _, in := range []kernels.DType{kernels.F32, kernels.BF16} {
			b.Run(fmt.Sprintf("attention/prefill=4096/d=%d/inputs=%s", hd, in), func(b *testing.B) {
				const blockSize, n = 16, 4096
				ap := kernels.AttentionParams{NumHeads: 32, NumKVHeads: 8, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd))), InputDType: in}
				width := ap.NumKVHeads * ap.HeadDim
				// A 16-bit model's cache is half (Backend.KVCacheDType).
				cache := func() kernels.Tensor {
					vals := randVals(r, n*width, 1)
					if in == kernels.F32 {
						return upload(b, g, kernels.F32, kernels.F32Bytes(vals), kernels.F32, n/blockSize, blockSize, width)
					}
					half := make([]uint16, len(vals))
					for i, v := range vals {
						half[i] = kernels.F32ToF16(v)
					}
					return upload(b, g, kernels.F16, kernels.U16Bytes(half), kernels.F16, n/blockSize, blockSize, width)
				}
				kc, vc := cache(), cache()
				q := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, n*ap.NumHeads*hd, 1)), kernels.F32, n, ap.NumHeads*hd)
				out, _ := g.Alloc(kernels.F32, n, ap.NumHeads*hd)
				bt := make([]int32, n/blockSize)
				for i := range bt {
					bt[i] = int32(i)
				}
				m := kernels.AttentionMetadata{NumSeqs: 1, NumTokens: n, MaxSeqlenQ: n, BlockSize: blockSize,
					CuSeqlensQ:  upload(b, g, kernels.I32, kernels.I32Bytes([]int32{0, n}), kernels.I32, 2),
					SeqlensK:    upload(b, g, kernels.I32, kernels.I32Bytes([]int32{n}), kernels.I32, 1),
					BlockTables: upload(b, g, kernels.I32, kernels.I32Bytes(bt), kernels.I32, 1, n/blockSize)}
				ms := timeIt(b, g, 5, func() error { return g.Attention(out, q, kc, vc, &m, ap) })
				flops := 2 * float64(ap.NumHeads*hd) * n * n // QK^T and PV over the causal half
				b.ReportMetric(ms*1e3, "us/op")
				b.ReportMetric(flops/(ms/1e3)/1e12, "TFLOP/s")
				b.Logf("attention prefill 4096 tokens (32 q / 8 kv heads, d %d, inputs %s, cache %s): %.2f ms, %.1f TFLOP/s (causal FLOPs)", hd, in, kc.DType(), ms, flops/(ms/1e3)/1e12)
			})
		}
	}
}

// benchDecodeAttention times one decode step of attention for batch rows of
// ctx keys each (caches of dtype cdt, every sequence on its own blocks) and
// returns microseconds per call and GB/s of keys and values read.
func benchDecodeAttention(b *testing.B, g *Backend, r *rand.Rand, batch, ctx int, ap kernels.AttentionParams, cdt kernels.DType) (us, gbs float64) {
	const blockSize = 16
	per := ctx / blockSize
	width := ap.NumKVHeads * ap.HeadDim
	kc, _ := g.Alloc(cdt, batch*per, blockSize, width)
	vc, _ := g.Alloc(cdt, batch*per, blockSize, width)
	q := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, batch*ap.NumHeads*ap.HeadDim, 1)), kernels.F32, batch, ap.NumHeads*ap.HeadDim)
	out, _ := g.Alloc(kernels.F32, batch, ap.NumHeads*ap.HeadDim)
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
	ms := timeIt(b, g, 100, func() error { return g.Attention(out, q, kc, vc, &m, ap) })
	b.ReportMetric(ms*1e3, "us/op")
	return ms * 1e3, float64(2*batch*ctx*width*cdt.Size()) / (ms / 1e3) / 1e9
}

// timeIt runs fn 3 times to warm up, then reps times between two device
// events, and returns the device milliseconds per call.
func timeIt(b *testing.B, g *Backend, reps int, fn func() error) float64 {
	for range 3 {
		if err := fn(); err != nil {
			b.Fatal(err)
		}
	}
	e0, _ := g.NewEvent()
	e1, _ := g.NewEvent()
	defer e0.Close()
	defer e1.Close()
	e0.Record()
	for range reps {
		if err := fn(); err != nil {
			b.Fatal(err)
		}
	}
	e1.Record()
	ms, err := e0.Elapsed(e1)
	if err != nil {
		b.Fatal(err)
	}
	return ms / float64(reps)
}
