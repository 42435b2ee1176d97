package llm

import (
	"fmt"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
)

// prefixWaves is a workload in two waves for prefix caching: the first
// wave's long prompts, then (once the first wave has finished) exact
// repeats of some, continuations of others (the prompt and a few more
// tokens, a conversation's next turn) and prompts that share only their
// first few windows with one of the first wave.
func prefixWaves(seed uint64) (first, second workload) {
	first = longWorkload(seed, 6)
	for i, p := range first.prompts {
		params := first.params[i]
		params.N = 1
		var ids []int
		switch i % 3 {
		case 0: // the same prompt
			ids = slices.Clone(p.IDs)
		case 1: // a continuation
			ids = append(slices.Clone(p.IDs), 7, 11, 13, 17, 19)
		default: // a shared beginning, then something else
			ids = append(slices.Clone(p.IDs[:2*tinyGemma3Window+1]), 23, 29, 31, 37, 41, 43, 47)
		}
		second.prompts = append(second.prompts, Prompt{IDs: ids})
		second.params = append(second.params, params)
		second.abortAt = append(second.abortAt, 0)
	}
	return first, second
}

// TestRingPrefixCheckpoints: with sliding-window layers in ring buffers,
// prefix caching hits through state checkpoints (copies of a sequence's
// rings at block boundaries, cache.state_checkpoints) and the tokens stay
// those of the engine without prefix caching and of the engine with every
// layer paged; ZOS on and off, a small cache that preempts (recompute
// restarts from a checkpoint), one checkpoint slot (the least recently
// used overwritten), and no block or slot leaks.
func TestRingPrefixCheckpoints(t *testing.T) {
	models := append([]struct{ name, dir string }{{"gemma3-window8", tinyGemma3(t)}}, windowFixtures...)
	first, second := prefixWaves(5)
	type mode struct {
		paged, prefix, zos, small bool
		checkpoints               int
	}
	modes := []mode{
		{paged: true, prefix: false},
		{paged: false, prefix: false},
		{paged: true, prefix: true},
		{paged: false, prefix: true, checkpoints: 16},
		{paged: false, prefix: true, zos: true, checkpoints: 16},
		{paged: false, prefix: true}, // auto: 2 slots
		{paged: false, prefix: true, checkpoints: 1},
		{paged: false, prefix: true, zos: true, small: true, checkpoints: 16},
		{paged: false, prefix: true, checkpoints: -1},
	}
	if raceEnabled {
		modes = []mode{modes[1], modes[4], modes[7]}
	}
	for _, m := range models {
		t.Run(m.name, func(t *testing.T) {
			var want map[string]string
			for _, md := range modes {
				name := fmt.Sprintf("%+v", md)
				l, err := NewLLM(tinyConfig(t, m.dir, func(c *config.Config) {
					c.Pipeline.Impl = nil
					c.Cache.NumBlocks = 160
					c.Engine.MaxNumBatchedTokens = 40
					c.Engine.PrefillChunkSize = 13 // longer than the windows, not a multiple of the block
					c.ZOS.Enabled = md.zos
					c.Cache.SlidingWindowPaged = md.paged
					c.Cache.PrefixCaching = md.prefix
					c.Cache.StateCheckpoints = md.checkpoints
					if md.small {
						c.Cache.NumBlocks = 26 // forces preemption
					}
				}), Options{})
				if err != nil {
					t.Fatal(err)
				}
				got := runWorkload(t, l, first)
				for k, v := range runWorkload(t, l, second) {
					got["second "+k] = v
				}
				st := l.SchedulerStats()
				plan := l.MemoryPlan()
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				checkNoLeak(t, name, st)
				rings := !md.paged
				wantCkpts := 0
				if rings && md.prefix && md.checkpoints >= 0 {
					wantCkpts = max(md.checkpoints, 1)
					if md.checkpoints == 0 {
						wantCkpts = max(1, 8/4) // a quarter of tinyConfig's max_num_seqs
					}
				}
				if plan.StateCheckpoints != wantCkpts || st.Checkpoints.NumCheckpoints != wantCkpts {
					t.Errorf("%s: %d checkpoint slots planned, %d in use, want %d", name, plan.StateCheckpoints, st.Checkpoints.NumCheckpoints, wantCkpts)
				}
				hits, ckptHits := st.PrefixCache.NumHitTokens, st.Checkpoints.NumHits
				switch {
				case md.prefix && (!rings || wantCkpts > 0) && hits == 0:
					t.Errorf("%s: no prefix-cache hit", name)
				case rings && wantCkpts > 0 && ckptHits == 0:
					t.Errorf("%s: no sequence started from a checkpoint", name)
				case (!md.prefix || (rings && wantCkpts == 0)) && hits != 0:
					t.Errorf("%s: %d prefix-cache hit tokens", name, hits)
				case md.checkpoints == 1 && st.Checkpoints.NumEvicted == 0:
					t.Errorf("%s: one checkpoint slot and none overwritten: %+v", name, st.Checkpoints)
				}
				if md.small && st.NumPreemptions == 0 {
					t.Errorf("%s: the small cache preempted nothing", name)
				}
				t.Logf("%s: hits %d tokens, checkpoints %+v, preemptions %d", name, hits, st.Checkpoints, st.NumPreemptions)
				if n := len(first.prompts) + numN2(first) + len(second.prompts); len(got) != n {
					t.Errorf("%s: %d outputs, want %d", name, len(got), n)
				}
				sameOutputs(t, name, &want, got)
			}
		})
	}
}
