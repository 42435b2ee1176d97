package llm

import (
	"fmt"
	"io"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// WindowModelShape is the cache-relevant shape of a model with
// sliding-window layers: what models.KVCacheSpec is built from.
type WindowModelShape struct {
	Name          string
	Layers        int // all attention layers
	SlidingLayers int // of which sliding-window layers
	Window        int
	KVWidth       int // num_key_value_heads * head_dim
	WeightBytes   float64
}

// WindowModelShapes are the published shapes of Gemma 3 and gpt-oss (BF16
// weights; gpt-oss's experts in MXFP4 as shipped).
var WindowModelShapes = []WindowModelShape{
	{Name: "Gemma-3-1B", Layers: 26, SlidingLayers: 22, Window: 512, KVWidth: 1 * 256, WeightBytes: 2.0e9},
	{Name: "Gemma-3-27B", Layers: 62, SlidingLayers: 52, Window: 1024, KVWidth: 16 * 128, WeightBytes: 54.9e9},
	{Name: "gpt-oss-20B", Layers: 24, SlidingLayers: 12, Window: 128, KVWidth: 8 * 64, WeightBytes: 13.8e9},
	{Name: "gpt-oss-120B", Layers: 36, SlidingLayers: 18, Window: 128, KVWidth: 8 * 64, WeightBytes: 65.3e9},
}

// Spec is the model's cache spec with its sliding layers in ring buffers
// (rings) or all layers in paged blocks, of element type dt.
func (s WindowModelShape) Spec(rings bool, dt kernels.DType) models.KVCacheSpec {
	if !rings {
		return models.KVCacheSpec{Layout: models.KVLayoutGQA, NumLayers: s.Layers, Width: s.KVWidth, DType: dt}
	}
	return models.KVCacheSpec{Layout: models.KVLayoutGQA, NumLayers: s.Layers - s.SlidingLayers, Width: s.KVWidth, DType: dt,
		RingLayers: s.SlidingLayers, RingWindow: s.Window}
}

// KVFigure is one row of WindowKVFigures.
type KVFigure struct {
	Model       string
	Rings       bool
	Bytes8K     int // KV bytes of one sequence of 8192 tokens (KVBytesPerSequence)
	Bytes32K    int // of 32768 tokens
	Budget      float64
	Fit8K       int // concurrent 8k sequences in Budget
	Plan        MemoryPlan
	PlanAdmits8 int // 8k sequences the plan of Budget for Fit8K sequences holds at once
}

// WindowKVFigures computes, for each shape, the KV memory a sequence takes
// at 8k and 32k tokens with the sliding layers in rings and all paged
// (BF16 caches, blocks of blockSize), and how many 8k sequences fit at
// once in deviceBytes less the weights: the engine's own arithmetic
// (KVBytesPerSequence, and planKV for that many sequences of 8k tokens,
// whose blocks and state slots must hold them all).
func WindowKVFigures(shapes []WindowModelShape, deviceBytes float64, blockSize int) []KVFigure {
	const ctx8, ctx32 = 8192, 32768
	var out []KVFigure
	for _, s := range shapes {
		for _, rings := range []bool{true, false} {
			spec := s.Spec(rings, kernels.BF16)
			f := KVFigure{Model: s.Name, Rings: rings, Budget: deviceBytes - s.WeightBytes,
				Bytes8K: KVBytesPerSequence(spec, ctx8, blockSize), Bytes32K: KVBytesPerSequence(spec, ctx32, blockSize)}
			f.Fit8K = int(f.Budget / float64(f.Bytes8K))
			slots := 0
			if rings {
				slots = f.Fit8K
			}
			f.Plan = planKV(spec, f.Budget, spec.BytesPerBlock(blockSize), blockSize, 0, slots, 0, f.Fit8K, ctx8)
			f.PlanAdmits8 = f.Plan.KVBlocks / ((ctx8 + blockSize - 1) / blockSize)
			if rings {
				f.PlanAdmits8 = min(f.PlanAdmits8, f.Plan.StateSlots)
			}
			out = append(out, f)
		}
	}
	return out
}

// H200Bytes is the device memory the figures assume: an H200's 139 GiB.
const H200Bytes = 139 << 30

// PrintWindowKVFigures writes WindowKVFigures as a table.
func PrintWindowKVFigures(w io.Writer, figs []KVFigure) {
	fmt.Fprintf(w, "%-13s %-6s %12s %12s %14s %12s\n", "model", "cache", "KV@8k MiB", "KV@32k MiB", "budget GiB", "8k seqs fit")
	for _, f := range figs {
		c := "paged"
		if f.Rings {
			c = "rings"
		}
		fmt.Fprintf(w, "%-13s %-6s %12.1f %12.1f %14.1f %12d\n", f.Model, c, float64(f.Bytes8K)/(1<<20), float64(f.Bytes32K)/(1<<20),
			f.Budget/(1<<30), f.PlanAdmits8)
	}
}
