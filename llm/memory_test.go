package llm

import (
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
)

// On the CPU the KV cache takes cache.num_blocks, or what cache.cpu_memory_gib
// holds (capped at what max_num_seqs full-length sequences need); there is
// no profiling pass.
func TestMemoryPlanCPU(t *testing.T) {
	dir := tinyLlama(t)
	for _, c := range []struct {
		name string
		edit func(*config.Config)
		want int
	}{
		{"num_blocks", nil, 64},
		// max_model_len 256 (random.TinyLlama's positions) / block 4 = 64
		// blocks a sequence, 8 sequences, plus one.
		{"cpu_memory_gib", func(c *config.Config) { c.Cache.NumBlocks, c.Cache.CPUMemoryGiB = 0, 1 }, 8*64 + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := New(tinyConfig(t, dir, c.edit), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			p := e.MemoryPlan()
			if p.KVBlocks != c.want || p.ActivationPeak != 0 || p.Available != 0 {
				t.Errorf("plan %+v, want %d blocks and no device figures", p, c.want)
			}
		})
	}
}
