// Package llm builds and runs the engine's step loop: the LLMEngine that
// owns the loop and the offline LLM API on top of it.
package llm

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// The slots of the step loop, in order. Speculative decoding adds "verify"
// and "draft" between sample and postprocess.
const (
	SlotRequests    = "requests"
	SlotTokenize    = "tokenize"
	SlotSchedule    = "schedule"
	SlotPrepare     = "prepare"
	SlotForward     = "forward"
	SlotSample      = "sample"
	SlotVerify      = "verify"
	SlotDraft       = "draft"
	SlotPostprocess = "postprocess"
)

// Layout returns the step loop's shape for cfg: requests -> tokenize ->
// schedule -> prepare -> forward -> sample [-> verify -> draft] ->
// postprocess, with a feedback edge from postprocess to schedule whose
// in-flight bound is the ZOS depth (1, or 2 with zos.enabled), and the two
// lagged edges that order the steps in flight: forward of step N+1 waits
// for the last stage before postprocess of step N (sample, or draft with
// speculative decoding: N+1's placeholder inputs, and with speculation its
// shift, are N's tokens, drafts and accepted counts), and sample of N+1
// waits for postprocess of N (penalties, masks and stop state include N's
// tokens). With one step in flight both are met before they are waited
// on; with ZOS they are what lets forward N+1 overlap post-processing of N
// and nothing else.
//
// The drafter runs after verification, not after schedule: it then sees
// the tokens the step emitted (and, for MTP, the target's hidden states of
// the step), so its drafts follow the sequence's true last token and the
// next step verifies them in the same forward pass that computes that
// token's KV. Drafting before the forward pass would need the step's
// outcome before the step runs, or a step more of latency per draft.
func Layout(cfg *config.Config) pipeline.Layout {
	slots := []string{SlotRequests, SlotTokenize, SlotSchedule, SlotPrepare, SlotForward, SlotSample}
	tokens := SlotSample
	if cfg.Speculative.Enabled() {
		slots = append(slots, SlotVerify, SlotDraft)
		tokens = SlotDraft
	}
	slots = append(slots, SlotPostprocess)
	return pipeline.Layout{
		Slots:    slots,
		Capacity: cfg.Pipeline.EdgeCapacity,
		Loop:     &pipeline.Loop{Head: SlotSchedule, Tail: SlotPostprocess, MaxInFlight: cfg.InFlight()},
		Lagged: []pipeline.Edge{
			{From: tokens, To: SlotForward, Lag: 1},
			{From: SlotPostprocess, To: SlotSample, Lag: 1},
		},
	}
}

// Spec resolves cfg's stage choices against its layout: the graph the
// engine will build, before any stage is constructed.
func Spec(cfg *config.Config) (pipeline.Spec, error) {
	choices := cfg.Pipeline.Choices()
	if cfg.Speculative.Enabled() {
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

// CheckedSpec is Spec with every node's implementation looked up in reg
// (nil: the default registry) and its options decoded and checked, without
// building anything: a bad stage name or option fails here, before any
// model loads.
func CheckedSpec(cfg *config.Config, reg *pipeline.Registry) (pipeline.Spec, error) {
	if reg == nil {
		reg = pipeline.DefaultRegistry()
	}
	spec, err := Spec(cfg)
	if err != nil {
		return spec, err
	}
	if err := spec.Check(reg); err != nil {
		return spec, fmt.Errorf("%w: %w", config.ErrInvalid, err)
	}
	return spec, nil
}

// DryGraph builds cfg's step loop from reg (nil: the default registry)
// without loading anything: every factory runs against an empty
// stages.Env (constructors do no device work; Start is not called), so
// every implementation, option and edge type is checked and the graph can
// be drawn on any machine.
func DryGraph(cfg *config.Config, reg *pipeline.Registry) (*pipeline.Graph, error) {
	if reg == nil {
		reg = pipeline.DefaultRegistry()
	}
	spec, err := CheckedSpec(cfg, reg)
	if err != nil {
		return nil, err
	}
	return spec.Build(reg, &stages.Env{})
}
