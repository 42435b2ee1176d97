package llm

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
)

// windowFixtures are the HF-parity fixtures with sliding-window layers
// (window 4): gpt-oss with MXFP4 experts and sinks, and Gemma 3.
var windowFixtures = []struct{ name, dir string }{
	{"gpt-oss", "../testdata/models/gpt-oss/mxfp4"},
	{"gemma3", "../testdata/models/gemma3/f32"},
}

// windowRun runs w on the model in dir with the switches given and
// returns the outputs and scheduler statistics.
func windowRun(t *testing.T, dir string, w workload, edit func(*config.Config)) (map[string]string, *LLM, error) {
	t.Helper()
	l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
		c.Pipeline.Impl = nil
		c.Cache.NumBlocks = 160
		c.Engine.MaxNumBatchedTokens = 40
		c.Engine.PrefillChunkSize = 13 // longer than the window, not a multiple of it
		edit(c)
	}), Options{})
	if err != nil {
		return nil, nil, err
	}
	got := runWorkload(t, l, w)
	return got, l, nil
}

// TestWindowModelsPrefixSpecZOS: on the fixtures with sliding-window
// layers, in ring buffers and all paged, the same requests give the same
// tokens with prefix caching on and off and ZOS on and off; greedy
// requests give the same tokens with ngram speculation too, which runs
// with paged sliding layers and is refused, by name, with rings.
//
// A ring holds only what its own sequence computed and cannot be rebuilt
// from shared blocks: with ring layers a hit needs a checkpoint of the
// rings (TestRingPrefixCheckpoints tests those hits), while paged sliding
// layers share prefix blocks as full layers do.
func TestWindowModelsPrefixSpecZOS(t *testing.T) {
	w := longWorkload(2, 9)
	for _, fx := range windowFixtures {
		t.Run(fx.name, func(t *testing.T) {
			var want map[string]string
			for _, paged := range []bool{true, false} {
				for _, prefix := range []bool{true, false} {
					for _, zos := range []bool{false, true} {
						name := fmt.Sprintf("paged=%v prefix=%v zos=%v", paged, prefix, zos)
						got, l, err := windowRun(t, fx.dir, w, func(c *config.Config) {
							c.ZOS.Enabled = zos
							c.Cache.SlidingWindowPaged = paged
							c.Cache.PrefixCaching = prefix
						})
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						st := l.SchedulerStats()
						if err := l.Close(); err != nil {
							t.Fatal(err)
						}
						hits := st.PrefixCache.NumHitTokens
						switch {
						case prefix && paged && hits == 0:
							t.Errorf("%s: no prefix-cache hit with paged sliding layers", name)
						case !prefix && hits != 0:
							t.Errorf("%s: %d prefix-cache hit tokens", name, hits)
						}
						checkNoLeak(t, name, st)
						if len(got) != len(w.prompts)+numN2(w) {
							t.Errorf("%s: %d outputs", name, len(got))
						}
						sameOutputs(t, name, &want, got)
					}
				}
			}
			for _, zos := range []bool{false, true} {
				spec := func(paged bool) func(*config.Config) {
					return func(c *config.Config) {
						c.ZOS.Enabled = zos
						c.Cache.SlidingWindowPaged = paged
						c.Speculative.Method = "ngram"
						c.Speculative.NumSpeculativeTokens = 3
					}
				}
				if _, _, err := windowRun(t, fx.dir, w, spec(false)); !errors.Is(err, config.ErrInvalid) ||
					!strings.Contains(err.Error(), "sliding_window_paged") {
					t.Errorf("zos=%v: speculation with rings: %v, want an error naming cache.sliding_window_paged", zos, err)
				}
				got, l, err := windowRun(t, fx.dir, w, spec(true))
				if err != nil {
					t.Fatalf("zos=%v: speculation with paged sliding layers: %v", zos, err)
				}
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				for i, p := range w.params {
					if p.Temperature != 0 {
						continue // sampled tokens follow the distribution, not the bits
					}
					for n := range max(1, p.N) {
						k := fmt.Sprintf("%d/%d", i, n)
						if got[k] != want[k] {
							t.Errorf("zos=%v speculation: output %s: %s, want %s", zos, k, got[k], want[k])
						}
					}
				}
			}
		})
	}
}

// checkNoLeak reports the blocks and state slots that st, the statistics
// of a closed engine's scheduler, does not count as free.
func checkNoLeak(t *testing.T, name string, st engine.SchedulerStats) {
	t.Helper()
	if st.NumFreeBlocks != st.NumBlocks || st.NumFreeStateSlots != st.NumStateSlots {
		t.Errorf("%s: leaked: %d/%d blocks, %d/%d state slots free", name, st.NumFreeBlocks, st.NumBlocks, st.NumFreeStateSlots, st.NumStateSlots)
	}
}

// sameOutputs sets *want to got on the first run of a comparison and on
// later runs reports every output of *want that got differs in.
func sameOutputs(t *testing.T, name string, want *map[string]string, got map[string]string) {
	t.Helper()
	if *want == nil {
		*want = got
		return
	}
	for k, v := range *want {
		if got[k] != v {
			t.Errorf("%s: output %s: %s, want %s", name, k, got[k], v)
		}
	}
}

// numN2 is the number of extra outputs of w's n = 2 requests.
func numN2(w workload) int {
	n := 0
	for _, p := range w.params {
		n += max(1, p.N) - 1
	}
	return n
}

// TestGptOssRingSameAsPaged is the long-context check on gpt-oss (window
// 4, sinks, MXFP4 experts): prompts of 6 to 12 windows, chunked prefill in
// chunks longer than the window, preemption by recompute in the middle (a
// small cache), ZOS on and off, n = 2: the sliding layer in ring buffers
// gives the tokens of the engine with it in paged blocks
// (cache.sliding_window_paged), and no block or slot leaks.
func TestGptOssRingSameAsPaged(t *testing.T) {
	dir := windowFixtures[0].dir
	w := longWorkload(3, 10)
	preempted := false
	var want map[string]string
	for _, small := range []bool{false, true} {
		for _, zos := range []bool{false, true} {
			for _, paged := range []bool{true, false} {
				name := fmt.Sprintf("small=%v zos=%v paged=%v", small, zos, paged)
				got, l, err := windowRun(t, dir, w, func(c *config.Config) {
					c.ZOS.Enabled = zos
					c.Cache.SlidingWindowPaged = paged
					if small {
						c.Cache.NumBlocks = 24 // forces preemption
					}
				})
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				st := l.SchedulerStats()
				spec := l.model.KVCacheSpec()
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if paged != (spec.RingLayers == 0) || (!paged && (spec.RingLayers != 1 || spec.NumLayers != 1 || spec.RingWindow != 4)) {
					t.Errorf("%s: cache spec %+v", name, spec)
				}
				checkNoLeak(t, name, st)
				if small && !paged && st.NumPreemptions > 0 {
					preempted = true
				}
				if len(got) != len(w.prompts)+numN2(w) {
					t.Errorf("%s: %d outputs", name, len(got))
				}
				sameOutputs(t, name, &want, got)
			}
		}
	}
	if !preempted {
		t.Error("the small cache never preempted a sequence in ring mode")
	}
}
