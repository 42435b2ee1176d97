package llm

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cuda"
)

// MemoryPlan is how the engine sized its KV cache.
type MemoryPlan struct {
	KVBlocks int // blocks of the KV cache
	// ActivationPeak is the device memory one forward pass of the largest
	// step needed beyond the weights (the profiling pass); 0 on the CPU.
	ActivationPeak uint64
	// Available is the device memory free after the weights and the
	// profiling pass (the driver's free memory plus the allocator's cached
	// blocks); 0 on the CPU.
	Available uint64
	// StateSlots is the number of per-sequence state slots; with ring
	// layers (models.KVCacheSpec.RingLayers) each holds StateSlotBytes of
	// ring buffers, window tokens a layer, out of the same budget as the
	// blocks.
	StateSlots     int
	StateSlotBytes int
	// StateCheckpoints are state slots beyond StateSlots that prefix
	// caching keeps as checkpoints of ring buffers (engine's
	// SchedulerConfig.NumStateCheckpoints), StateSlotBytes each.
	StateCheckpoints int
	// BlockBytes is the footprint of one KV block across the paged layers
	// (and a drafter's cache sharing the blocks).
	BlockBytes int
}

// KVBytesPerSequence is the KV memory a sequence of numTokens tokens
// takes under spec: whole blocks of the paged layers plus, with ring
// layers, one state slot (window tokens a ring layer, whatever the
// context).
func KVBytesPerSequence(spec models.KVCacheSpec, numTokens, blockSize int) int {
	return spec.BytesPerSequence(numTokens, blockSize)
}

// planKV sizes the paged blocks and the state slots. numBlocks > 0
// (cache.num_blocks) and numSlots > 0 (cache.num_state_slots) are taken as
// given; otherwise blocks fill budget bytes, less the state slots' ring
// buffers, up to what maxNumSeqs sequences of maxModelLen tokens can use,
// and slots default to maxNumSeqs, their ring buffers taking at most half
// the budget (at least one slot). checkpoints more slots are asked for
// prefix caching's state checkpoints: as many as the half of the budget
// left to slots holds when the plan derives the slots, else as asked.
// blockBytes is a block's footprint.
func planKV(spec models.KVCacheSpec, budget float64, blockBytes, blockSize, numBlocks, numSlots, checkpoints, maxNumSeqs, maxModelLen int) MemoryPlan {
	p := MemoryPlan{StateSlots: numSlots, StateSlotBytes: spec.BytesPerStateSlot(), BlockBytes: blockBytes,
		StateCheckpoints: checkpoints}
	if p.StateSlots <= 0 {
		p.StateSlots = maxNumSeqs
		if p.StateSlotBytes > 0 && numBlocks <= 0 {
			fit := int(max(budget, 0) / 2 / float64(p.StateSlotBytes))
			p.StateSlots = max(1, min(p.StateSlots, fit))
			p.StateCheckpoints = min(checkpoints, max(fit-p.StateSlots, 0))
		}
	}
	if numBlocks > 0 {
		p.KVBlocks = numBlocks
		return p
	}
	left := max(budget-float64(p.StateSlots+p.StateCheckpoints)*float64(p.StateSlotBytes), 0)
	p.KVBlocks = int(left / float64(blockBytes))
	p.KVBlocks = min(p.KVBlocks, maxNumSeqs*((maxModelLen+blockSize-1)/blockSize)+1)
	return p
}

// stateCheckpoints is how many state checkpoints to ask of the memory
// plan (cache.state_checkpoints): none without prefix caching or ring
// layers, or when set to -1; a quarter of max_num_seqs (at least one) when
// 0.
func stateCheckpoints(cfg *config.Config, spec models.KVCacheSpec) int {
	switch {
	case !cfg.Cache.PrefixCaching || spec.RingLayers == 0 || cfg.Cache.StateCheckpoints < 0:
		return 0
	case cfg.Cache.StateCheckpoints > 0:
		return cfg.Cache.StateCheckpoints
	}
	return max(1, cfg.Engine.MaxNumSeqs/4)
}

// deviceKVBudget returns the bytes the KV cache of a device backend may
// take: cache.memory_fraction of the memory available after the weights,
// less the activation peak of a profiling forward pass over maxTokens
// prompt tokens (the largest step the scheduler builds) and the LM head on
// maxRows rows (the most sampled rows of a step).
func deviceKVBudget(dev *cuda.Backend, model models.Model, fraction float64, maxTokens, maxModelLen, maxRows, blockSize int) (float64, MemoryPlan, error) {
	var plan MemoryPlan
	peak, err := activationPeak(dev, model, maxTokens, maxModelLen, maxRows, blockSize)
	if err != nil {
		return 0, plan, fmt.Errorf("profiling a forward pass of %d tokens: %w (lower engine.max_num_batched_tokens)", maxTokens, err)
	}
	free, _, err := dev.MemoryInfo()
	if err != nil {
		return 0, plan, err
	}
	st := dev.MemStats()
	plan.ActivationPeak, plan.Available = peak, free+(st.Reserved-st.InUse)
	return fraction*float64(plan.Available) - float64(peak), plan, nil
}

// activationPeak runs profileForward and returns the allocator's
// high-water mark above the memory in use before it (the scratch cache
// and its one state slot excepted).
func activationPeak(dev *cuda.Backend, model models.Model, maxTokens, maxModelLen, maxRows, blockSize int) (uint64, error) {
	var before cuda.MemStats
	if err := profileForward(dev, model, maxTokens, maxModelLen, maxRows, blockSize, func() { before = dev.MemStats() }); err != nil {
		return 0, err
	}
	if err := dev.Sync(); err != nil {
		return 0, err
	}
	after := dev.MemStats()
	if after.Peak < before.InUse {
		return 0, nil
	}
	return after.Peak - before.InUse, nil
}

// profileForward runs one prefill forward pass of maxTokens tokens (in
// sequences of at most maxModelLen tokens, every key in the one block of a
// scratch cache and, for a model with ring layers, in its one state slot:
// the values are garbage, the work and the buffers are those of a real
// step) and the LM head on min(maxRows, maxTokens) rows. ready is called
// once the scratch cache exists, right before the pass.
func profileForward(ops kernels.Ops, model models.Model, maxTokens, maxModelLen, maxRows, blockSize int, ready func()) error {
	cache, err := model.NewKVCache(1, blockSize)
	if err != nil {
		return err
	}
	h := models.HostBatch{BlockSize: blockSize}
	if cache.Spec.RingLayers > 0 {
		if err := cache.AllocStateSlots(ops, 1); err != nil {
			return err
		}
		h.RingWindow = cache.Spec.RingWindow
	}
	for left := maxTokens; left > 0; {
		n := min(left, max(maxModelLen, 1))
		h.AddSequence(make([]int32, n), 0, make([]int32, (n+blockSize-1)/blockSize))
		if h.RingWindow > 0 {
			h.StateSlots = append(h.StateSlots, 0)
		}
		left -= n
	}
	fb, err := h.Upload(ops, 1)
	if err != nil {
		return err
	}
	ready()
	hidden, err := model.Forward(context.Background(), cache, fb)
	if err != nil {
		return err
	}
	rows := make([]int32, min(maxRows, maxTokens))
	for i := range rows {
		rows[i] = int32(i)
	}
	rt, err := kernels.FromI32(ops, rows, len(rows))
	if err != nil {
		return err
	}
	_, err = model.ComputeLogits(hidden, rt)
	return err
}
