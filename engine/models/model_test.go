package models

import (
	"context"
	"errors"

	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/opstest"
)

func TestUnknownArchitecture(t *testing.T) {
	ops := newBackend(t, 1)
	cfg := parseConfig(t, strings.Replace(tinyConfigs["llama"], "LlamaForCausalLM", "GPT2LMHeadModel", 1))
	_, err := Builtin().New(ops, cfg, MemWeights{}, Options{})
	if !errors.Is(err, ErrUnknownArchitecture) {
		t.Fatalf("err = %v, want ErrUnknownArchitecture", err)
	}
	for _, want := range []string{"GPT2LMHeadModel", "LlamaForCausalLM", "DeepseekV3ForCausalLM", "Qwen3ForCausalLM"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestMissingAndMisshapedWeights(t *testing.T) {
	ops := newBackend(t, 1)
	cfg, w := tinyWeights(t, "qwen3", kernels.BF16, 1)
	name := "model.layers.1.self_attn.k_norm.weight"
	missing := MemWeights{}
	for k, v := range w {
		if k != name {
			missing[k] = v
		}
	}
	_, err := Builtin().New(ops, cfg, missing, Options{MaxModelLen: 8})
	if !errors.Is(err, ErrWeights) || !strings.Contains(err.Error(), name) {
		t.Errorf("missing tensor: err = %v, want ErrWeights naming %s", err, name)
	}
	bad := w["model.layers.0.mlp.up_proj.weight"]
	bad.Shape = []int{bad.Shape[1], bad.Shape[0]}
	w["model.layers.0.mlp.up_proj.weight"] = bad
	_, err = Builtin().New(ops, cfg, w, Options{MaxModelLen: 8})
	if !errors.Is(err, ErrWeights) || !strings.Contains(err.Error(), "up_proj") {
		t.Errorf("misshaped tensor: err = %v, want ErrWeights naming up_proj", err)
	}
}

func TestBadBatch(t *testing.T) {
	h := HostBatch{BlockSize: 4}
	h.AddSequence([]int32{1, 2, 3}, 2, []int32{0})
	if err := h.Validate(0); !errors.Is(err, ErrBatch) {
		t.Errorf("5 keys in one block of 4: err = %v, want ErrBatch", err)
	}
	h = HostBatch{BlockSize: 4}
	h.AddSequence([]int32{1, 2}, 0, []int32{3})
	if err := h.Validate(2); !errors.Is(err, ErrBatch) {
		t.Errorf("block 3 of a 2-block cache: err = %v, want ErrBatch", err)
	}
	h.SlotMapping[1] = 0
	if err := h.Validate(0); !errors.Is(err, ErrBatch) {
		t.Errorf("slot not matching the table: err = %v, want ErrBatch", err)
	}
}

// TestDecodeMatchesPrefill: for every architecture, the logits of a prompt
// computed in one prefill, in two chunks, and token by token over the paged
// cache are bit-identical (each row is computed by the same kernels in the
// same order whatever else is in the step).
func TestDecodeMatchesPrefill(t *testing.T) {
	const blockSize, numBlocks, promptLen = 4, 32, 11
	ops := newBackend(t, 2)
	for _, name := range tinyNames {
		t.Run(name, func(t *testing.T) {
			m, _ := tinyModel(t, ops, name, kernels.BF16)
			r := rand.New(rand.NewPCG(1, 2))
			prompt := randomIDs(r, promptLen, m.Config().VocabSize)
			run := func(chunks ...int) [][]float32 {
				cache, err := m.NewKVCache(numBlocks, blockSize)
				if err != nil {
					t.Fatal(err)
				}
				table := newBlockPool(r, numBlocks).table(blockSize, promptLen)
				var all [][]float32
				done := 0
				for _, n := range chunks {
					lg, _ := step(t, m, cache, seqStep{prompt[done : done+n], done, table})
					all = append(all, lg...)
					done += n
				}
				return all
			}
			whole := run(promptLen)
			ones := make([]int, promptLen)
			for i := range ones {
				ones[i] = 1
			}
			for what, got := range map[string][][]float32{"two chunks": run(7, 4), "token by token": run(ones...)} {
				for i := range whole {
					if !sameBits(got[i], whole[i]) {
						t.Errorf("%s: position %d differs from the whole prefill (rel err %.2g)", what, i, relErr(got[i], f64(whole[i])))
					}
				}
			}
		})
	}
}

func f64(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// TestBatchInvariance: seven sequences in one step (prefills, a chunk over a
// cached prefix, decodes) give the same bits per row as each sequence alone,
// on backends with different thread counts.
func TestBatchInvariance(t *testing.T) {
	const blockSize, numBlocks = 4, 64
	for _, name := range tinyNames {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			type seq struct{ cached, fresh []int32 }
			var seqs []seq
			for _, n := range [][2]int{{0, 6}, {5, 3}, {9, 1}, {0, 1}, {3, 1}, {12, 1}, {2, 9}} {
				seqs = append(seqs, seq{randomIDs(r, n[0], 97), randomIDs(r, n[1], 97)})
			}
			var outs [2][][]float32
			for run, threads := range []int{3, 1} {
				ops := newBackend(t, threads)
				m, _ := tinyModel(t, ops, name, kernels.F32)
				cache, err := m.NewKVCache(numBlocks, blockSize)
				if err != nil {
					t.Fatal(err)
				}
				pool := newBlockPool(rand.New(rand.NewPCG(5, 6)), numBlocks)
				var steps []seqStep
				for _, s := range seqs {
					table := pool.table(blockSize, len(s.cached)+len(s.fresh))
					if len(s.cached) > 0 {
						step(t, m, cache, seqStep{s.cached, 0, table})
					}
					steps = append(steps, seqStep{s.fresh, len(s.cached), table})
				}
				if run == 0 {
					outs[0], _ = step(t, m, cache, steps...)
					continue
				}
				for _, st := range steps {
					lg, _ := step(t, m, cache, st)
					outs[1] = append(outs[1], lg...)
				}
			}
			for i := range outs[0] {
				if !sameBits(outs[0][i], outs[1][i]) {
					t.Errorf("row %d: batch of 7 on 3 threads differs from the sequence alone on 1 thread", i)
				}
			}
		})
	}
}

func TestKVCacheSpec(t *testing.T) {
	ops := newBackend(t, 1)
	for _, tc := range []struct {
		name   string
		layout KVLayout
		width  int
		bytes  int
	}{
		{"llama", KVLayoutGQA, 16, 2 * 16 * 4},
		{"deepseek-v3", KVLayoutMLA, 16 + 4, 20 * 4},
	} {
		m, _ := tinyModel(t, ops, tc.name, kernels.BF16)
		s := m.KVCacheSpec()
		if s.Layout != tc.layout || s.Width != tc.width || s.BytesPerTokenPerLayer() != tc.bytes || s.NumLayers != 2 {
			t.Errorf("%s: spec %+v (%d bytes/token/layer), want %v width %d, %d bytes", tc.name, s, s.BytesPerTokenPerLayer(), tc.layout, tc.width, tc.bytes)
		}
		if got := s.BytesPerBlock(16); got != tc.bytes*2*16 {
			t.Errorf("%s: BytesPerBlock(16) = %d", tc.name, got)
		}
	}
}

func TestForwardCancelled(t *testing.T) {
	ops := newBackend(t, 1)
	m, _ := tinyModel(t, ops, "llama", kernels.F32)
	cache, _ := m.NewKVCache(4, 4)
	h := HostBatch{BlockSize: 4}
	h.AddSequence([]int32{1, 2}, 0, []int32{0})
	b, err := h.Upload(ops, 4)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Forward(ctx, cache, b); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	other, _ := tinyModel(t, ops, "deepseek-v2", kernels.F32)
	if _, err := m.Forward(context.Background(), mustCache(t, other), b); !errors.Is(err, ErrBatch) {
		t.Errorf("foreign cache: err = %v, want ErrBatch", err)
	}
}

func mustCache(t *testing.T, m Model) *KVCache {
	c, err := m.NewKVCache(4, 4)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPureGoPath: the portable Go kernels and the vectorized ones give the
// same logits bit for bit on every architecture.
func TestPureGoPath(t *testing.T) {
	fast := newBackend(t, 2)
	slow := cpu.New(cpu.Options{Threads: 2, PureGo: true})
	t.Cleanup(func() { slow.Close() })
	for _, name := range tinyNames {
		r := rand.New(rand.NewPCG(9, 9))
		ids := randomIDs(r, 9, 97)
		var outs [2][][]float32
		for i, ops := range []*cpu.Backend{fast, slow} {
			m, _ := tinyModel(t, ops, name, kernels.BF16)
			cache := mustCache(t, m)
			outs[i], _ = step(t, m, cache, seqStep{ids, 0, []int32{3, 1, 0}})
		}
		for p := range outs[0] {
			if !sameBits(outs[0][p], outs[1][p]) {
				t.Errorf("%s: position %d: %s and %s differ", name, p, fast.Name(), slow.Name())
				break
			}
		}
	}
}

// HostBatch.UploadWith sends a step's metadata and the caller's arrays in
// one copy and hands out each array, with its shape, as a view of it (block
// tables padded with -1); the metadata keeps its own host copy of the query
// offsets when a sequence has several rows.
func TestHostBatchUploadOneCopy(t *testing.T) {
	ops := &opstest.Counting{Ops: cpu.New(cpu.Options{Threads: 1})}
	h := HostBatch{BlockSize: 4}
	h.AddSequence([]int32{5, 6, 7}, 0, []int32{2})               // a 3-token prompt
	h.AddSequence([]int32{9}, 6, []int32{0, 1})                  // a decode row after 6 cached tokens
	h.AddSequence([]int32{11, 12, 13, 14, 15}, 0, []int32{3, 4}) // 5 tokens over two blocks
	b, extra, err := h.UploadWith(ops, 8, []int32{4, 5, 6, 7, 8}, []int32{-1})
	if err != nil {
		t.Fatal(err)
	}
	if ops.Uploads != 1 {
		t.Errorf("%d uploads, want 1", ops.Uploads)
	}
	if len(extra) != 2 {
		t.Fatalf("%d extra tensors, want 2", len(extra))
	}
	for _, c := range []struct {
		name  string
		got   kernels.Tensor
		want  []int32
		shape []int
	}{
		{"input ids", b.InputIDs, h.InputIDs, []int{9}},
		{"positions", b.Positions, h.Positions, []int{9}},
		{"cu_seqlens_q", b.Attn.CuSeqlensQ, []int32{0, 3, 4, 9}, []int{4}},
		{"seqlens_k", b.Attn.SeqlensK, []int32{3, 7, 5}, []int{3}},
		{"block tables", b.Attn.BlockTables, []int32{2, -1, 0, 1, 3, 4}, []int{3, 2}},
		{"slot mapping", b.Attn.SlotMapping, h.SlotMapping, []int{9}},
		{"extra 0", extra[0], []int32{4, 5, 6, 7, 8}, []int{5}},
		{"extra 1", extra[1], []int32{-1}, []int{1}},
	} {
		if !slices.Equal(c.got.Shape(), c.shape) {
			t.Errorf("%s: shape %v, want %v", c.name, c.got.Shape(), c.shape)
		}
		v, err := kernels.ToI32(ops, c.got)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(v, c.want) {
			t.Errorf("%s: %v, want %v", c.name, v, c.want)
		}
	}
	// A batch with a sequence of several rows carries a host copy of its
	// query offsets, its own (h's arrays may be reused for the next step);
	// a decode-only batch none.
	if want := []int32{0, 3, 4, 9}; !slices.Equal(b.Attn.HostCuSeqlensQ, want) {
		t.Errorf("HostCuSeqlensQ %v, want %v", b.Attn.HostCuSeqlensQ, want)
	}
	h.CuSeqlensQ[1] = 99
	if b.Attn.HostCuSeqlensQ[1] != 3 {
		t.Errorf("HostCuSeqlensQ shares the host batch's array")
	}
	d := HostBatch{BlockSize: 4}
	d.AddSequence([]int32{9}, 6, []int32{0, 1})
	d.AddSequence([]int32{10}, 2, []int32{2})
	db, err := d.Upload(ops, 8)
	if err != nil {
		t.Fatal(err)
	}
	if db.Attn.HostCuSeqlensQ != nil {
		t.Errorf("decode-only batch: HostCuSeqlensQ %v, want nil", db.Attn.HostCuSeqlensQ)
	}
}

// plainOps hides every optional interface of the backend it wraps.
type plainOps struct{ kernels.Ops }

// gatedMLPOps is plainOps with kernels.GatedMLPer, run as Linear, SiLUMul,
// Linear through the caller's scratch, counting its calls.
type gatedMLPOps struct {
	kernels.Ops
	calls int
}

func (g *gatedMLPOps) GatedMLP(out, x, gateUp, down, gu, act kernels.Tensor) error {
	g.calls++
	if err := g.Linear(gu, x, gateUp, nil); err != nil {
		return err
	}
	if err := g.SiLUMul(act, gu); err != nil {
		return err
	}
	return g.Linear(out, act, down, nil)
}

// Models hand their bias-free gated MLPs to a backend's GatedMLP (once a
// layer for the Llama family) with the right tensors: the logits are those
// of the separate ops to the bit.
func TestGatedMLPer(t *testing.T) {
	cpuOps := newBackend(t, 2)
	for _, name := range tinyNames {
		r := rand.New(rand.NewPCG(5, 6))
		ids := randomIDs(r, 7, 97)
		var outs [2][][]float32
		gated := &gatedMLPOps{Ops: cpuOps}
		for i, ops := range []kernels.Ops{plainOps{cpuOps}, gated} {
			m, _ := tinyModel(t, ops, name, kernels.BF16)
			outs[i], _ = step(t, m, mustCache(t, m), seqStep{ids, 0, []int32{2, 0}})
		}
		cfg := parseConfig(t, tinyConfigs[name])
		dense := 0 // layers with a dense MLP (the sparse ones run MoE)
		for i := range cfg.NumHiddenLayers {
			if !cfg.IsMoELayer(i) {
				dense++
			}
		}
		if gated.calls == 0 && dense > 0 {
			t.Errorf("%s: GatedMLP was never called", name)
		}
		if !strings.HasPrefix(name, "deepseek") && gated.calls != dense {
			t.Errorf("%s: GatedMLP called %d times in one forward pass, want one a dense layer (%d)", name, gated.calls, dense)
		}
		for p := range outs[0] {
			if !sameBits(outs[0][p], outs[1][p]) {
				t.Errorf("%s: position %d: logits differ through GatedMLP", name, p)
				break
			}
		}
	}
}

// TestDeepSeekFusedQKVA: without q compression the q and kv_a projections
// load as one weight (mlaWeights.qKVA); up to mlaFusedRows rows a step runs
// it as one product and a column split, above that its two row views.
// Both give the same logits bit for bit on the CPU (each output column is
// its own dot product), in F32 and BF16 and with the weights quantized to
// FP8 at load (the views cut the fused weight's blocks at row 48, not a
// block boundary), alone and after a cached prefix.
func TestDeepSeekFusedQKVA(t *testing.T) {
	ops := newBackend(t, 2)
	for _, c := range []struct {
		dt    kernels.DType
		quant string
	}{{kernels.F32, ""}, {kernels.BF16, ""}, {kernels.BF16, "fp8"}} {
		cfg, w := tinyWeights(t, "deepseek-v2", c.dt, 7)
		m, err := Builtin().New(ops, cfg, w, Options{MaxModelLen: testMaxLen, Quantization: c.quant})
		if err != nil {
			t.Fatal(err)
		}
		ds := m.(*deepseek)
		if ds.layers[0].attn.qKVA == nil {
			t.Fatal("deepseek-v2 (no q_lora_rank, no kv_a bias) loaded without the fused q / kv_a weight")
		}
		if c.quant == "fp8" && ds.layers[0].attn.qKVA.DType() != kernels.F8E4M3 {
			t.Fatalf("fp8: the fused weight is %v", ds.layers[0].attn.qKVA.DType())
		}
		r := rand.New(rand.NewPCG(5, 5))
		prompt, next := randomIDs(r, 11, 97), randomIDs(r, 3, 97)
		var outs [2][][]float32
		for i, rows := range []int{mlaFusedRows, 0} {
			ds.fusedRows = rows
			cache := mustCache(t, m)
			step(t, m, cache, seqStep{prompt, 0, []int32{2, 0, 3}})
			outs[i], _ = step(t, m, cache, seqStep{next, len(prompt), []int32{2, 0, 3, 1}})
		}
		for p := range outs[0] {
			if !sameBits(outs[0][p], outs[1][p]) {
				t.Errorf("%v %s: position %d: fused and row-view projections differ", c.dt, c.quant, p)
			}
		}
	}
}

// TestDeepSeekFusedQAKVA: with q compression (q_lora_rank 12) and no
// biases, q_a_proj and kv_a_proj_with_mqa load as one weight
// (mlaWeights.qAKVA); a one-row step runs it as one product whose column
// blocks are views, more rows the row views qA and kvA. Decode steps of one
// row give the same logits bit for bit as with the fused weight left out
// (qAKVA nil: two products), in F32, BF16 and quantized to FP8 at load
// (the parts' blocks start at rows 0 and 12), after a prefill and a
// second decode row.
func TestDeepSeekFusedQAKVA(t *testing.T) {
	ops := newBackend(t, 2)
	for _, c := range []struct {
		dt    kernels.DType
		quant string
	}{{kernels.F32, ""}, {kernels.BF16, ""}, {kernels.BF16, "fp8"}} {
		cfg, w := tinyWeights(t, "deepseek-v3", c.dt, 9)
		r := rand.New(rand.NewPCG(6, 6))
		prompt, next := randomIDs(r, 9, 97), randomIDs(r, 2, 97)
		var outs [2][][]float32
		for i, fused := range []bool{true, false} {
			m, err := Builtin().New(ops, cfg, w, Options{MaxModelLen: testMaxLen, Quantization: c.quant})
			if err != nil {
				t.Fatal(err)
			}
			ds := m.(*deepseek)
			if ds.layers[0].attn.qAKVA == nil {
				t.Fatal("deepseek-v3 (q_lora_rank, no biases) loaded without the fused q_a / kv_a weight")
			}
			if !fused {
				for l := range ds.layers {
					ds.layers[l].attn.qAKVA = nil
				}
			}
			cache := mustCache(t, m)
			step(t, m, cache, seqStep{prompt, 0, []int32{2, 0, 3}})
			a, _ := step(t, m, cache, seqStep{next[:1], len(prompt), []int32{2, 0, 3}})
			b, _ := step(t, m, cache, seqStep{next[1:], len(prompt) + 1, []int32{2, 0, 3}})
			outs[i] = append(a, b...)
		}
		for p := range outs[0] {
			if !sameBits(outs[0][p], outs[1][p]) {
				t.Errorf("%v %s: decode row %d: the fused product's views and the two products differ", c.dt, c.quant, p)
			}
		}
	}
}

// A block table shared by consecutive sequences (a decode's rows) is
// checked as far as the longest of them needs: a bad block that only a
// later row reaches is still found, and one past every row's need is not
// an error.
func TestHostBatchValidateSharedTable(t *testing.T) {
	const bs = 4
	for _, tc := range []struct {
		name  string
		table []int32
		want  string
	}{
		{"good", []int32{3, 5, 7}, ""},
		{"bad block reached by the last row", []int32{3, 5, -1}, "sequence 2: block_tables[2] = -1"},
		{"bad block past every row", []int32{3, 5, 7, -1}, ""},
		{"block out of the cache", []int32{3, 9, 7}, "sequence 1: block_tables[1] = 9"},
	} {
		h := &HostBatch{BlockSize: bs}
		// Rows at positions 3, 7 and 11: 1, 2 and 3 blocks.
		for _, pos := range []int{3, 7, 11} {
			h.AddSequence([]int32{1}, pos, tc.table)
		}
		err := h.Validate(8)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
}
