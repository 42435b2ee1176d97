package llm

import (
	"path/filepath"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
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

// The profiling pass that sizes a device's KV cache runs on models with
// ring layers too (it gives their scratch cache a state slot): several
// sequences, each longer than the window. It runs on the CPU here, as it
// does on CUDA.
func TestProfileForwardRingLayers(t *testing.T) {
	ops := cpu.New(cpu.Options{Threads: 1})
	defer ops.Close()
	for _, dir := range []string{"gemma3/f32", "gpt-oss/mxfp4"} {
		m, err := models.Builtin().Load(ops, filepath.Join("..", "testdata", "models", dir), models.Options{MaxModelLen: 64})
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		if err := profileForward(ops, m, 100, 40, 8, 16, func() { ran = true }); err != nil || !ran {
			t.Errorf("%s: profileForward = %v (ready called: %v)", dir, err, ran)
		}
	}
}
