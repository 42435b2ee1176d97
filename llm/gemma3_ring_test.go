package llm

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// tinyGemma3Window is the sliding window of tinyGemma3.
const tinyGemma3Window = 8

// tinyGemma3 writes a random-weight Gemma3ForCausalLM (vocab 64, 4 layers:
// sliding, full, sliding, sliding; window 8) to a temp directory.
func tinyGemma3(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	cfg := map[string]any{
		"architectures": []string{"Gemma3ForCausalLM"}, "model_type": "gemma3_text",
		"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 512,
		"sliding_window": tinyGemma3Window, "query_pre_attn_scalar": 8, "final_logit_softcapping": 30.0,
		"layer_types":          []string{"sliding_attention", "full_attention", "sliding_attention", "sliding_attention"},
		"rope_local_base_freq": 100.0, "rope_theta": 10000.0, "tie_word_embeddings": false,
		"bos_token_id": 1, "eos_token_id": 2, "dtype": "float32",
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	wc, err := weights.ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	w, err := models.RandomWeights(wc, kernels.F32, 3)
	if err != nil {
		t.Fatal(err)
	}
	var ts []weights.Tensor
	for _, name := range w.Names() {
		ts = append(ts, w[name])
	}
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// longWorkload: prompts three to six windows long, some sharing a prefix
// of two windows, greedy and seeded sampling, n = 2 for some.
func longWorkload(seed uint64, n int) workload {
	rng := rand.New(rand.NewPCG(seed, 30))
	shared := make([]int, 2*tinyGemma3Window+3)
	for i := range shared {
		shared[i] = 3 + rng.IntN(60)
	}
	var w workload
	for i := range n {
		var ids []int
		if i%3 == 0 {
			ids = append(ids, shared...)
		}
		for len(ids) < 3*tinyGemma3Window+rng.IntN(3*tinyGemma3Window) {
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
		w.prompts = append(w.prompts, Prompt{IDs: ids})
		w.params = append(w.params, p)
		w.abortAt = append(w.abortAt, 0)
	}
	return w
}

// TestGemma3RingSameAsPaged: sliding-window layers in ring buffers give the
// tokens of the same model with every layer paged (the debug switch
// cache.sliding_window_paged), with prompts several windows long in chunks
// longer than the window, preemption by recompute (a small cache), ZOS on
// and off, n = 2 (state copies) and prefix caching (in ring mode through
// state checkpoints), and leak no block or slot.
func TestGemma3RingSameAsPaged(t *testing.T) {
	dir := tinyGemma3(t)
	w := longWorkload(1, 12)
	preempted := false
	var want map[string]string
	for _, small := range []bool{false, true} {
		for _, zos := range []bool{false, true} {
			for _, paged := range []bool{true, false} {
				name := fmt.Sprintf("small=%v zos=%v paged=%v", small, zos, paged)
				l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
					c.Pipeline.Impl = nil
					c.ZOS.Enabled = zos
					c.Cache.SlidingWindowPaged = paged
					c.Cache.PrefixCaching = true
					c.Cache.NumBlocks = 160
					c.Engine.MaxNumBatchedTokens = 40
					c.Engine.PrefillChunkSize = 13 // longer than the window, not a multiple of it
					if small {
						c.Cache.NumBlocks = 24 // forces preemption
					}
				}), Options{})
				if err != nil {
					t.Fatal(err)
				}
				got := runWorkload(t, l, w)
				st := l.SchedulerStats()
				spec := l.model.KVCacheSpec()
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if paged != (spec.RingLayers == 0) || (!paged && (spec.RingLayers != 3 || spec.NumLayers != 1)) {
					t.Errorf("%s: cache spec %+v", name, spec)
				}
				checkNoLeak(t, name, st)
				if small && !paged && st.NumPreemptions > 0 {
					preempted = true
				}
				if len(got) != 12+3 {
					t.Errorf("%s: %d outputs, want 15", name, len(got))
				}
				sameOutputs(t, name, &want, got)
			}
		}
	}
	if !preempted {
		t.Error("the small cache never preempted a sequence in ring mode")
	}
}

// TestGemma3RingRefusesSpeculation: rejected drafts would overwrite ring
// entries, so speculative decoding needs the paged debug switch.
func TestGemma3RingRefusesSpeculation(t *testing.T) {
	dir := tinyGemma3(t)
	for _, paged := range []bool{false, true} {
		l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
			c.Speculative.Method = "ngram"
			c.Speculative.NumSpeculativeTokens = 2
			c.Cache.SlidingWindowPaged = paged
		}), Options{})
		if paged {
			if err != nil {
				t.Fatalf("paged: %v", err)
			}
			l.Close()
		} else if err == nil {
			l.Close()
			t.Fatal("ring buffers with speculative decoding: no error")
		}
	}
}

// gemma3OneB is the KV cache of a Gemma-3-1B-shaped model (26 layers, one
// global layer in six, 1 KV head of head_dim 256, window 512) in BF16,
// with ring buffers or every layer paged.
func gemma3OneB(rings bool) models.KVCacheSpec {
	if !rings {
		return models.KVCacheSpec{Layout: models.KVLayoutGQA, NumLayers: 26, Width: 256, DType: kernels.BF16}
	}
	return models.KVCacheSpec{Layout: models.KVLayoutGQA, NumLayers: 4, Width: 256, DType: kernels.BF16, RingLayers: 22, RingWindow: 512}
}

// TestRingMemoryPlan: ring layers hold window tokens a sequence, not the
// context, in the memory plan; the budget then holds more blocks and the
// scheduler admits correspondingly more sequences.
func TestRingMemoryPlan(t *testing.T) {
	const blockSize = 16
	for _, ctx := range []int{8192, 32768} {
		paged := KVBytesPerSequence(gemma3OneB(false), ctx, blockSize)
		ring := KVBytesPerSequence(gemma3OneB(true), ctx, blockSize)
		perTok := 2 * 256 * 2 // K and V, one head of 256, BF16
		if paged != 26*ctx*perTok {
			t.Errorf("%d tokens, paged: %d bytes, want %d", ctx, paged, 26*ctx*perTok)
		}
		if want := 4*ctx*perTok + 22*512*perTok; ring != want {
			t.Errorf("%d tokens, rings: %d bytes, want %d (4 paged layers + 22 rings of 512 tokens)", ctx, ring, want)
		}
		t.Logf("Gemma-3-1B-shaped, BF16, %d tokens: KV %.1f MiB a sequence with rings, %.1f MiB all paged (%.2fx)",
			ctx, float64(ring)/(1<<20), float64(paged)/(1<<20), float64(paged)/float64(ring))
	}
	// The plans of one budget, and what a scheduler with each admits: 8k
	// prompts under a budget of 1 GiB.
	const budget, ctx, maxSeqs = float64(1 << 30), 8192, 64
	admitted := map[bool]int{}
	for _, rings := range []bool{false, true} {
		spec := gemma3OneB(rings)
		p := planKV(spec, budget, spec.BytesPerBlock(blockSize), blockSize, 0, 0, 0, maxSeqs, ctx+16)
		if used := float64(p.KVBlocks)*float64(p.BlockBytes) + float64(p.StateSlots)*float64(p.StateSlotBytes); used > budget {
			t.Errorf("rings %v: plan %+v uses %.0f bytes of %.0f", rings, p, used, budget)
		}
		if rings && p.StateSlotBytes != 22*512*1024 {
			t.Errorf("state slot of %d bytes, want 22 ring layers of 512 tokens", p.StateSlotBytes)
		}
		s, err := engine.NewScheduler(engine.SchedulerConfig{MaxNumSeqs: maxSeqs, MaxNumBatchedTokens: 1 << 20,
			MaxModelLen: ctx + 16, BlockSize: blockSize, NumBlocks: p.KVBlocks, NumStateSlots: p.StateSlots, VocabSize: 64})
		if err != nil {
			t.Fatal(err)
		}
		params := engine.DefaultSamplingParams()
		params.MaxTokens = 16
		for i := range maxSeqs {
			if _, err := s.Add(engine.NewSequence(fmt.Sprint(i), slices.Repeat([]int{5}, ctx), params, time.Time{})); err != nil {
				t.Fatal(err)
			}
		}
		_, metas := s.Schedule()
		admitted[rings] = len(metas)
		t.Logf("rings %v: %d blocks, %d state slots: %d prompts of %d tokens admitted at once", rings, p.KVBlocks, p.StateSlots, len(metas), ctx)
	}
	// Paged: 26 layers of 8k tokens each; rings: 4 layers plus 11 MiB.
	if admitted[false] < 1 || admitted[true] < 4*admitted[false] {
		t.Errorf("admitted %d sequences with rings, %d all paged: want at least 4x", admitted[true], admitted[false])
	}
}
