// Package llm builds and runs the engine's step loop: the LLMEngine that
// owns the loop and the offline LLM API on top of it.
package llm

import (
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// The slots of the step loop, in order. Speculative decoding adds "draft"
// and "verify" between forward and sample.
const (
	SlotRequests    = "requests"
	SlotTokenize    = "tokenize"
	SlotSchedule    = "schedule"
	SlotPrepare     = "prepare"
	SlotForward     = "forward"
	SlotDraft       = "draft"
	SlotVerify      = "verify"
	SlotSample      = "sample"
	SlotPostprocess = "postprocess"
)

// Layout returns the step loop's shape for cfg: requests -> tokenize ->
// schedule -> prepare -> forward [-> draft -> verify] -> sample ->
// postprocess, with a feedback edge from postprocess to schedule whose
// in-flight bound is the ZOS depth (1, or 2 with zos.enabled).
func Layout(cfg *config.Config) pipeline.Layout {
	slots := []string{SlotRequests, SlotTokenize, SlotSchedule, SlotPrepare, SlotForward}
	if cfg.Speculative.Method != "" {
		slots = append(slots, SlotDraft, SlotVerify)
	}
	slots = append(slots, SlotSample, SlotPostprocess)
	return pipeline.Layout{
		Slots:    slots,
		Capacity: cfg.Pipeline.EdgeCapacity,
		Loop:     &pipeline.Loop{Head: SlotSchedule, Tail: SlotPostprocess, MaxInFlight: cfg.InFlight()},
	}
}

// Spec resolves cfg's stage choices against its layout: the graph the
// engine will build, before any stage is constructed.
func Spec(cfg *config.Config) (pipeline.Spec, error) {
	choices := cfg.Pipeline.Choices()
	if g := cfg.CUDAGraph; g.Enabled {
		// The forward stage replays captured decode graphs (stages.ForwardOptions).
		opts := map[string]map[string]any{}
		for slot, o := range choices.Options {
			opts[slot] = o
		}
		fwd := map[string]any{}
		for k, v := range opts[SlotForward] {
			fwd[k] = v
		}
		fwd["cuda_graph"] = map[string]any{"enabled": true, "batch_sizes": g.BatchSizes}
		opts[SlotForward] = fwd
		choices.Options = opts
	}
	if cfg.Speculative.Method != "" {
		// The drafter named by the config fills the draft slot unless the
		// user picked another implementation.
		impl := map[string]string{SlotDraft: cfg.Speculative.Method}
		for k, v := range choices.Impl {
			impl[k] = v
		}
		choices.Impl = impl
	}
	return Layout(cfg).Resolve(choices)
}
