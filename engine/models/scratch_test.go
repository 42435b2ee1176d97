package models

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/opstest"
)

// TestScratchWrittenBeforeRead: the models' scratch buffers come without a
// zero fill (kernels.AllocEmpty), so each must be written before it is
// read. With the empty ones filled with NaN, every architecture's logits
// over a prefill, a decode step and a batch of both equal those with
// zero-filled scratch, bit for bit (the Llama and DeepSeek families,
// Gemma 3, gpt-oss, and DeepSeek-V3's MTP layer).
func TestScratchWrittenBeforeRead(t *testing.T) {
	base := newBackend(t, 2)
	fixture := func(dir string) func(*testing.T, kernels.Ops) Model {
		return func(t *testing.T, ops kernels.Ops) Model {
			m, err := Builtin().Load(ops, dir, Options{MaxModelLen: 64})
			if err != nil {
				t.Skipf("no fixture: %v", err)
			}
			return m
		}
	}
	t.Run("gpt-oss", func(t *testing.T) { checkEmptyScratch(t, base, fixture(fixtureDir+"/gpt-oss/f32"), gptOssSteps) })
	t.Run("deepseek-v3-mtp", func(t *testing.T) { checkEmptyScratch(t, base, fixture(fixtureDir+"/deepseek-v3/f32"), mtpSteps) })
	for _, name := range append(append([]string{}, tinyNames...), "gemma3") {
		t.Run(name, func(t *testing.T) {
			load := func(t *testing.T, ops kernels.Ops) Model {
				if name == "gemma3" { // its sliding-window layers paged
					m, _ := gemma3Model(t, ops, "pattern", true)
					return m
				}
				m, _ := tinyModel(t, ops, name, kernels.BF16)
				return m
			}
			checkEmptyScratch(t, base, load, pagedSteps)
		})
	}
}

// checkEmptyScratch loads a model on base and on base with NaN-filled empty
// allocations, runs steps on each, and wants the same bits.
func checkEmptyScratch(t *testing.T, base *cpu.Backend, load func(*testing.T, kernels.Ops) Model, steps func(*testing.T, Model) [][]float32) {
	var outs [2][][]float32
	empty := &opstest.NaNEmpty{Backend: base}
	for i, ops := range []kernels.Ops{base, empty} {
		outs[i] = steps(t, load(t, ops))
	}
	if empty.EmptyAllocs() == 0 {
		t.Fatal("no buffer came from AllocEmpty")
	}
	for p := range outs[0] {
		for j, v := range outs[1][p] {
			if math.IsNaN(float64(v)) || math.Float32bits(v) != math.Float32bits(outs[0][p][j]) {
				t.Fatalf("row %d, logit %d: %v with NaN-filled scratch, %v with zeroed", p, j, v, outs[0][p][j])
			}
		}
	}
}

// pagedSteps: a prefill, then a decode row beside another prompt.
func pagedSteps(t *testing.T, m Model) [][]float32 {
	r := rand.New(rand.NewPCG(31, 7))
	prompt, next, other := randomIDs(r, 7, 97), randomIDs(r, 1, 97), randomIDs(r, 5, 97)
	cache := mustCache(t, m)
	a, _ := step(t, m, cache, seqStep{prompt, 0, []int32{3, 1}})
	b, _ := step(t, m, cache, seqStep{next, len(prompt), []int32{3, 1}}, seqStep{other, 0, []int32{0, 2}})
	return append(a, b...)
}

// gptOssSteps: a prefill and a decode row, its window layer in a ring.
func gptOssSteps(t *testing.T, m Model) [][]float32 {
	r := rand.New(rand.NewPCG(5, 9))
	prompt := randomIDs(r, 9, 64)
	table := newBlockPool(r, 16).table(4, len(prompt)+1)
	cache := ringCache(t, m, 16, 4, 2)
	a := ringStep(t, m, cache, ringSeq{prompt, 0, table, 1})
	return append(a, ringStep(t, m, cache, ringSeq{randomIDs(r, 1, 64), len(prompt), table, 1})...)
}

// mtpSteps: the main model's prefill and a decode row, each followed by the
// MTP layer's pass over the same positions fed their hidden states.
func mtpSteps(t *testing.T, m Model) [][]float32 {
	r := rand.New(rand.NewPCG(6, 2))
	prompt, next := randomIDs(r, 7, 64), randomIDs(r, 1, 64)
	table := newBlockPool(r, 16).table(4, len(prompt)+1)
	cache, mcache := mustCacheOf(t, m.NewKVCache), mustCacheOf(t, mtpOf(t, m).NewKVCache)
	var out [][]float32
	for _, s := range []seqStep{{prompt, 0, table}, {next, len(prompt), table}} {
		lg, hidden := step(t, m, cache, s)
		h := HostBatch{BlockSize: 4}
		h.AddSequence(s.ids, s.numCached, s.table)
		b, err := h.Upload(opsOf(m), 16)
		if err != nil {
			t.Fatal(err)
		}
		mo, err := m.MTP().Forward(context.Background(), 0, mcache, b, hidden)
		if err != nil {
			t.Fatal(err)
		}
		ml, err := m.MTP().ComputeLogits(0, mo, nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(out, lg...), rowsOf(t, opsOf(m), ml)...)
	}
	return out
}

func mtpOf(t *testing.T, m Model) *MTP {
	if m.MTP() == nil {
		t.Fatal("the checkpoint has no MTP layer")
	}
	return m.MTP()
}

// mustCacheOf returns newCache's cache of 16 blocks of 4.
func mustCacheOf(t *testing.T, newCache func(numBlocks, blockSize int) (*KVCache, error)) *KVCache {
	c, err := newCache(16, 4)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// inputOps answers LinearInputDType and MoEInputDType as set, around a
// CPU backend (whose own answer is float32 for both).
type inputOps struct {
	kernels.Ops
	linear, moe kernels.DType
}

func (o inputOps) LinearInputDType(w kernels.DType, rows int) kernels.DType { return o.linear }
func (o inputOps) MoEInputDType(w kernels.DType, rows int) kernels.DType    { return o.moe }

// TestScratchInputDType: a MoE layer's x comes rounded (the linears'
// 16-bit type) only where the backend's MoE takes that type too
// (kernels.MoEInputer); a backend without MoEInputer, or one whose MoE
// answers otherwise, gets x in the activation dtype. Layers without a MoE
// follow the linears alone.
func TestScratchInputDType(t *testing.T) {
	base := newBackend(t, 1)
	w := func(dt kernels.DType, shape ...int) kernels.Tensor {
		x, err := base.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	moe := &moeWeights{router: w(kernels.BF16, 4, 8), gateUp: w(kernels.BF16, 4, 6, 8), down: w(kernels.BF16, 4, 8, 3)}
	dense := w(kernels.BF16, 6, 8)
	onlyLinear := struct {
		kernels.Ops
		kernels.LinearInputer
	}{base, inputOps{base, kernels.BF16, kernels.BF16}}
	for _, c := range []struct {
		name string
		ops  kernels.Ops
		moe  *moeWeights
		want kernels.DType
	}{
		{"both_bf16", inputOps{base, kernels.BF16, kernels.BF16}, moe, kernels.BF16},
		{"moe_f32", inputOps{base, kernels.BF16, kernels.F32}, moe, kernels.F32},
		{"linears_f32", inputOps{base, kernels.F32, kernels.BF16}, moe, kernels.F32},
		{"no_moe_inputer", onlyLinear, moe, kernels.F32},
		{"dense", inputOps{base, kernels.BF16, kernels.F32}, nil, kernels.BF16},
		{"cpu", base, moe, kernels.F32},
	} {
		var ws []kernels.Tensor
		if c.moe == nil {
			ws = []kernels.Tensor{dense}
		}
		if got := newScratch(c.ops).inputDType(64, c.moe, ws...); got != c.want {
			t.Errorf("%s: inputDType = %v, want %v", c.name, got, c.want)
		}
	}
}

// allocCountOps is plainOps counting Alloc calls and the KV cache tensors
// asked of AllocCache (which it serves from the wrapped backend's).
type allocCountOps struct {
	kernels.Ops
	allocs, caches int
}

func (o *allocCountOps) Alloc(dt kernels.DType, shape ...int) (kernels.Tensor, error) {
	o.allocs++
	return o.Ops.Alloc(dt, shape...)
}

func (o *allocCountOps) AllocCache(dt kernels.DType, shape ...int) (kernels.Tensor, error) {
	o.caches++
	return kernels.AllocCache(o.Ops, dt, shape...)
}

// A model on a backend without an EmptyAllocator keeps one pass's scratch
// for the next pass over as many tokens: the second of two decode steps of
// 3 sequences allocates only what it returns (fewer than a third of the
// first's allocations), a step of another token count allocates afresh,
// and every step's logits are those of a model that ran no step before
// (a fresh scratch), to the bit. The KV cache comes from AllocCache.
func TestSpareScratch(t *testing.T) {
	cpuOps := newBackend(t, 2)
	for _, name := range []string{"llama", "deepseek-v3"} {
		t.Run(name, func(t *testing.T) {
			ops := &allocCountOps{Ops: cpuOps}
			m, _ := tinyModel(t, ops, name, kernels.BF16)
			cache, err := m.NewKVCache(12, 4)
			if err != nil {
				t.Fatal(err)
			}
			if want := len(cache.K) + len(cache.V); ops.caches != want {
				t.Errorf("NewKVCache took %d tensors from AllocCache, want %d", ops.caches, want)
			}
			r := rand.New(rand.NewPCG(7, 8))
			pool := newBlockPool(r, cache.NumBlocks)
			tables := [][]int32{pool.table(cache.BlockSize, 12), pool.table(cache.BlockSize, 12), pool.table(cache.BlockSize, 12)}
			prompts := [][]int32{randomIDs(r, 5, 97), randomIDs(r, 7, 97), randomIDs(r, 4, 97)}
			var steps [][]seqStep
			var prefill []seqStep
			for i, p := range prompts {
				prefill = append(prefill, seqStep{p, 0, tables[i]})
			}
			steps = append(steps, prefill)
			for d := range 2 {
				var dec []seqStep
				for i, p := range prompts {
					dec = append(dec, seqStep{randomIDs(r, 1, 97), len(p) + d, tables[i]})
				}
				steps = append(steps, dec)
			}
			var allocs []int
			var got [][][]float32
			for _, st := range steps {
				before := ops.allocs
				lg, _ := step(t, m, cache, st...)
				allocs = append(allocs, ops.allocs-before)
				got = append(got, lg)
			}
			if allocs[2]*3 >= allocs[1] {
				t.Errorf("allocations per step %v: the second decode step did not reuse the first's scratch", allocs)
			}
			if allocs[1]*3 < allocs[0] {
				t.Errorf("allocations per step %v: the first decode step (3 tokens) allocated far less than the prefill (16): a scratch kept for another token count was reused", allocs)
			}
			// The same steps on a fresh model each: fresh scratch every pass.
			fresh, _ := tinyModel(t, plainOps{cpuOps}, name, kernels.BF16)
			fcache, err := fresh.NewKVCache(12, 4)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range steps {
				want, _ := step(t, fresh, fcache, st...)
				fresh, _ = tinyModel(t, plainOps{cpuOps}, name, kernels.BF16)
				for row := range want {
					if !sameBits(got[i][row], want[row]) {
						t.Fatalf("step %d row %d: logits differ from a fresh scratch's", i, row)
					}
				}
			}
		})
	}
}

// Forward passes running at once on one model never share a kept scratch:
// two goroutines decoding their own sequences into their own caches get
// the logits of the same steps run one after the other (run with -race).
func TestSpareScratchConcurrent(t *testing.T) {
	ops := plainOps{newBackend(t, 2)}
	m, _ := tinyModel(t, ops, "deepseek-v3", kernels.F32)
	run := func(seed uint64) [][]float32 {
		cache, err := m.NewKVCache(8, 4)
		if err != nil {
			t.Error(err)
			return nil
		}
		r := rand.New(rand.NewPCG(seed, 1))
		table := newBlockPool(r, 8).table(4, 32)
		ids := randomIDs(r, 6, 97)
		var out [][]float32
		cached := 0
		for range 8 {
			h := HostBatch{BlockSize: 4}
			h.AddSequence(ids, cached, table)
			lg, err := forwardLogits(ops, m, cache, &h)
			if err != nil {
				t.Error(err) // not Fatal: this may run off the test's goroutine
				return nil
			}
			out = append(out, lg)
			cached += len(ids)
			ids = randomIDs(r, 1, 97)
		}
		return out
	}
	want := [][][]float32{run(1), run(2)}
	got := make([][][]float32, 2)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i] = run(uint64(i + 1)) })
	}
	wg.Wait()
	for i := range got {
		for s := range want[i] {
			if s >= len(got[i]) || !sameBits(got[i][s], want[i][s]) {
				t.Fatalf("goroutine %d step %d: logits differ from the sequential run's", i, s)
			}
		}
	}
}

// forwardLogits runs one forward pass of h and returns the last row's
// logits (an error where step would fail the test).
func forwardLogits(ops kernels.Ops, m Model, cache *KVCache, h *HostBatch) ([]float32, error) {
	b, err := h.Upload(ops, cache.NumBlocks)
	if err != nil {
		return nil, err
	}
	hidden, err := m.Forward(context.Background(), cache, b)
	if err != nil {
		return nil, err
	}
	lg, err := m.ComputeLogits(hidden, nil)
	if err != nil {
		return nil, err
	}
	v, err := kernels.ToF32(ops, lg)
	if err != nil {
		return nil, err
	}
	return v[len(v)-lg.Shape()[1]:], nil
}
