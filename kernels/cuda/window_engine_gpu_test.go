package cuda_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/llm"
)

// ringWorkload is llm's long-context workload for a model of sliding
// window w: n prompts of 6 to 12 windows (every third starting with a
// shared prefix of two windows and three tokens), greedy and seeded
// sampling at temperature 0.8, n = 2 for some, 6 to 23 new tokens each,
// EOS ignored.
func ringWorkload(seed uint64, n, w int) (prompts [][]int, params []engine.SamplingParams) {
	rng := rand.New(rand.NewPCG(seed, 30))
	shared := make([]int, 2*w+3)
	for i := range shared {
		shared[i] = 3 + rng.IntN(60)
	}
	for i := range n {
		var ids []int
		if i%3 == 0 {
			ids = append(ids, shared...)
		}
		for len(ids) < 6*w+rng.IntN(6*w) {
			ids = append(ids, 3+rng.IntN(60))
		}
		p := engine.DefaultSamplingParams()
		p.MaxTokens = 6 + rng.IntN(18)
		p.IgnoreEOS = true
		if rng.IntN(2) == 0 {
			p.Temperature = 0.8
			s := rng.Int64N(1000)
			p.Seed = &s
		} else {
			p.Temperature = 0
		}
		if i%4 == 1 {
			p.N = 2
		}
		prompts = append(prompts, ids)
		params = append(params, p)
	}
	return prompts, params
}

// runRequests adds every request to l at once and returns each output's
// tokens by "request/index" once all have finished.
func runRequests(t *testing.T, l *llm.LLM, prompts [][]int, params []engine.SamplingParams) map[string]string {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	got := map[string]string{}
	for i := range prompts {
		res := make([][]int, max(1, params[i].N))
		wg.Add(len(res))
		req := &engine.Request{
			ID: fmt.Sprintf("w%d", i), PromptTokenIDs: prompts[i], Params: params[i],
			OnOutput: func(o engine.RequestOutput) {
				mu.Lock()
				res[o.Index] = append(res[o.Index], o.TokenIDs...)
				if o.Finished {
					if o.Err != nil {
						t.Errorf("request %d/%d: %v", i, o.Index, o.Err)
					}
					got[fmt.Sprintf("%d/%d", i, o.Index)] = fmt.Sprintf("%v %s", res[o.Index], o.FinishReason)
				}
				mu.Unlock()
				if o.Finished {
					wg.Done()
				}
			},
		}
		if err := l.AddRequestWait(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if err := l.FlushInflight(context.Background()); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestGPUWindowModelsRingSameAsPaged is llm's TestGptOssRingSameAsPaged and
// TestGemma3RingSameAsPaged on the CUDA backend, over the tiny parity
// fixtures (window 4): prompts of 6 to 12 windows in prefill chunks of 13
// tokens (longer than the window, not a multiple of it), preemption by
// recompute in the middle (a cache of 24 blocks of 4 tokens), ZOS on and
// off, n = 2 (state copies): with the window layers in ring buffers the
// engine gives the tokens of the same run with them in paged blocks
// (cache.sliding_window_paged), the small cache preempts in ring mode, and
// no block or state slot leaks.
//
// Each ring run is compared with the paged run of the same settings, with
// prefix caching off in both (the scheduler keeps it off for models with
// rings; a paged run with it on would serve prefix hits and so schedule
// other batches, and on CUDA a row's bits may depend on its batch through
// cuBLAS): the two runs then schedule the same batches, and ring attention
// gives the bits of paged attention, so the tokens must be equal. The
// runs compute in float32 (Gemma's weights are float32; gpt-oss's MXFP4
// experts run in GEMM mode split). Whether every run of a model agrees is
// logged.
func TestGPUWindowModelsRingSameAsPaged(t *testing.T) {
	skipWithoutGPU(t)
	const window = 4
	for _, fx := range []struct {
		name, dir, gemm      string
		ringLayers, paged    int // cache layers in rings and paged, rings on
		numPrompts, workSeed int
	}{
		{"gemma3", "gemma3/f32", "round", 2, 1, 12, 1},
		{"gpt-oss", "gpt-oss/mxfp4", "split", 1, 1, 10, 3},
	} {
		t.Run(fx.name, func(t *testing.T) {
			dir, err := filepath.Abs(filepath.Join("../../testdata/models", fx.dir))
			if err != nil {
				t.Fatal(err)
			}
			prompts, params := ringWorkload(uint64(fx.workSeed), fx.numPrompts, window)
			outputs := 0
			for _, p := range params {
				outputs += max(1, p.N)
			}
			preempted := false
			var first map[string]string
			agreeAll := true
			for _, small := range []bool{false, true} {
				for _, zos := range []bool{false, true} {
					var want map[string]string
					for _, paged := range []bool{true, false} {
						name := fmt.Sprintf("small=%v zos=%v paged=%v", small, zos, paged)
						blocks := 160
						if small {
							blocks = 24 // forces preemption
						}
						yaml := fmt.Sprintf(`model: %s
device: cuda
cache: {num_blocks: %d, block_size: 4, prefix_caching: false, sliding_window_paged: %v}
engine: {max_num_seqs: 8, max_num_batched_tokens: 40, prefill_chunk_size: 13}
zos: {enabled: %v}
cuda: {gemm: %s}
speculative: {adaptive: false}
`, dir, blocks, paged, zos, fx.gemm)
						l := newLLM(t, yaml)
						got := runRequests(t, l, prompts, params)
						st := l.SchedulerStats()
						spec := l.Model().KVCacheSpec()
						if err := l.Close(); err != nil {
							t.Fatal(err)
						}
						if paged != (spec.RingLayers == 0) || (!paged && (spec.RingLayers != fx.ringLayers || spec.NumLayers != fx.paged || spec.RingWindow != window)) {
							t.Errorf("%s: cache spec %+v", name, spec)
						}
						if st.NumFreeBlocks != st.NumBlocks || st.NumFreeStateSlots != st.NumStateSlots {
							t.Errorf("%s: leaked: %d/%d blocks, %d/%d state slots free", name, st.NumFreeBlocks, st.NumBlocks, st.NumFreeStateSlots, st.NumStateSlots)
						}
						if small && !paged && st.NumPreemptions > 0 {
							preempted = true
						}
						if len(got) != outputs {
							t.Errorf("%s: %d outputs, want %d", name, len(got), outputs)
						}
						if paged {
							want = got
						} else {
							for k, v := range want {
								if got[k] != v {
									t.Errorf("%s: output %s: %s, with paged window layers %s", name, k, got[k], v)
								}
							}
							t.Logf("%s: %d preemptions, %d prefix-cache hit tokens; %d outputs", name, st.NumPreemptions, st.PrefixCache.NumHitTokens, len(got))
						}
						if first == nil {
							first = got
						} else {
							for k, v := range first {
								if got[k] != v {
									agreeAll = false
								}
							}
						}
					}
				}
			}
			if !preempted {
				t.Error("the small cache never preempted a sequence in ring mode")
			}
			t.Logf("%s: all 8 runs (cache small or not, ZOS on or off, rings or paged) give the same tokens: %v", fx.name, agreeAll)
		})
	}
}

// TestGPURingPrefixCheckpoints: prefix caching with the window layers in
// ring buffers on the CUDA backend. Each prompt (6 to 12 windows, prefill
// chunks of 13 tokens) runs alone, then again alone: the repeat resumes
// from the checkpoint of the rings taken at the prompt's last block
// boundary before its final token (a state-slot copy on the device) and
// shares the cached blocks below it, and computes the same last chunk and
// decode steps, alone, as the first run did after its own chunk ended
// there, so its tokens (greedy and seeded sampling) must be the first
// run's bit for bit. ZOS on and off; every repeat must hit a checkpoint.
func TestGPURingPrefixCheckpoints(t *testing.T) {
	skipWithoutGPU(t)
	const window, blockSize = 4, 4
	for _, fx := range []struct{ name, dir, gemm string }{
		{"gemma3", "gemma3/f32", "round"},
		{"gpt-oss", "gpt-oss/mxfp4", "split"},
	} {
		t.Run(fx.name, func(t *testing.T) {
			dir, err := filepath.Abs(filepath.Join("../../testdata/models", fx.dir))
			if err != nil {
				t.Fatal(err)
			}
			prompts, params := ringWorkload(7, 4, window)
			for _, zos := range []bool{false, true} {
				name := fmt.Sprintf("zos=%v", zos)
				l := newLLM(t, fmt.Sprintf(`model: %s
device: cuda
cache: {num_blocks: 160, block_size: %d, prefix_caching: true, state_checkpoints: 4}
engine: {max_num_seqs: 8, max_num_batched_tokens: 40, prefill_chunk_size: 13}
zos: {enabled: %v}
cuda: {gemm: %s}
speculative: {adaptive: false}
`, dir, blockSize, zos, fx.gemm))
				wantHit := int64(0)
				for i := range prompts {
					p := params[i]
					p.N = 1
					one := [][]int{prompts[i]}
					first := runRequests(t, l, one, []engine.SamplingParams{p})
					again := runRequests(t, l, one, []engine.SamplingParams{p})
					if first["0/0"] == "" || first["0/0"] != again["0/0"] {
						t.Errorf("%s: prompt %d: %s, then from its checkpoint %s", name, i, first["0/0"], again["0/0"])
					}
					wantHit += int64((len(prompts[i]) - 1) / blockSize * blockSize)
				}
				st := l.SchedulerStats()
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if st.Checkpoints.NumHits != int64(len(prompts)) || st.PrefixCache.NumHitTokens != wantHit {
					t.Errorf("%s: %d checkpoint hits and %d hit tokens, want %d and %d (%+v)", name,
						st.Checkpoints.NumHits, st.PrefixCache.NumHitTokens, len(prompts), wantHit, st.Checkpoints)
				}
				if st.NumFreeBlocks != st.NumBlocks || st.NumFreeStateSlots != st.NumStateSlots {
					t.Errorf("%s: leaked: %d/%d blocks, %d/%d state slots free", name, st.NumFreeBlocks, st.NumBlocks, st.NumFreeStateSlots, st.NumStateSlots)
				}
				t.Logf("%s: %d repeats from checkpoints, %d hit tokens, %+v", name, len(prompts), st.PrefixCache.NumHitTokens, st.Checkpoints)
			}
		})
	}
}
