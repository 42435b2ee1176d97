package stages

import (
	"context"
)

// StepGate lets a caller drive the step loop one step at a time, as vLLM's
// LLMEngine.step does: the schedule stage plans a step only when Step asks
// for one, and Step returns what that step produced. Without a gate the
// loop plans steps on its own as fast as its in-flight bound allows.
type StepGate struct {
	asks chan *stepAsk
	wake chan struct{}
}

type stepAsk struct {
	done chan *StepOutputs
}

// NewStepGate returns a gate; give it to the schedule stage through
// Runtime.Gate.
func NewStepGate() *StepGate {
	return &StepGate{asks: make(chan *stepAsk, 1024), wake: make(chan struct{}, 1)}
}

// Step asks for one step and waits for its outputs. A step with nothing to
// schedule returns at once with no outputs (StepID 0).
func (g *StepGate) Step(ctx context.Context) (*StepOutputs, error) {
	a := &stepAsk{done: make(chan *StepOutputs, 1)}
	select {
	case g.asks <- a:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case g.wake <- struct{}{}:
	default:
	}
	select {
	case out := <-a.done:
		return out, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// next returns a pending ask, or nil.
func (g *StepGate) next() *stepAsk {
	select {
	case a := <-g.asks:
		return a
	default:
		return nil
	}
}

var emptyStep = &StepOutputs{}
