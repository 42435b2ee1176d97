package stages

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// MetadataZOS is what step N+1 takes from step N without a host round trip,
// for zero-overhead scheduling. The scheduler plans N+1 before N's tokens
// are known; its inputs then carry placeholders naming a sample row of N
// (SequenceMetadata.InputFromRow, the mapping from N's rows to N+1's). The
// sample stage of N publishes its tokens here in backend memory, with one
// accepted count per row (1 without speculation; speculative decoding will
// publish how many draft tokens each row accepted), and prepare N+1 resolves
// the placeholders on the backend (kernels.Ops.ResolvePlaceholders).
//
// It also orders the steps as DeepInfer's worker does: forward N+1 is
// launched before post-processing of N, and sampling of N+1 waits for that
// post-processing (WaitPostprocessed), so that penalties, masks and stop
// state used at N+1 include step N's tokens. With one step in flight every
// wait returns at once.
type MetadataZOS struct {
	mu       sync.Mutex
	steps    map[engine.StepID]*zosStep
	postDone engine.StepID
	postCh   chan struct{} // closed (and replaced) when postDone advances
}

type zosStep struct {
	ready    chan struct{}
	tokens   kernels.Tensor // I32 [R]: the step's sampled tokens, in backend memory
	accepted kernels.Tensor // I32 [R]: tokens accepted per row (1 without speculation)
	host     []int          // the same tokens on the host, for penalty histories
}

// NewMetadataZOS returns an empty record.
func NewMetadataZOS() *MetadataZOS {
	return &MetadataZOS{steps: map[engine.StepID]*zosStep{}, postCh: make(chan struct{})}
}

func (z *MetadataZOS) entry(id engine.StepID) *zosStep {
	e := z.steps[id]
	if e == nil {
		e = &zosStep{ready: make(chan struct{})}
		z.steps[id] = e
	}
	return e
}

// publish records step id's sampled tokens. Called once per step (or
// publishTokens then publishHost).
func (z *MetadataZOS) publish(id engine.StepID, tokens, accepted kernels.Tensor, host []int) {
	z.publishHost(id, host)
	z.publishTokens(id, tokens, accepted)
}

// publishTokens records step id's tokens in backend memory, which is all
// that the next step's placeholders need; the host copy may follow
// (publishHost) before the step is post-processed.
func (z *MetadataZOS) publishTokens(id engine.StepID, tokens, accepted kernels.Tensor) {
	z.mu.Lock()
	e := z.entry(id)
	e.tokens, e.accepted = tokens, accepted
	z.mu.Unlock()
	close(e.ready)
}

// publishHost records the host copy of step id's tokens (penalty histories
// of the step after it read them once the step is post-processed).
func (z *MetadataZOS) publishHost(id engine.StepID, host []int) {
	z.mu.Lock()
	z.entry(id).host = host
	z.mu.Unlock()
}

// sampled waits until step id has published its tokens.
func (z *MetadataZOS) sampled(ctx context.Context, id engine.StepID) (*zosStep, error) {
	z.mu.Lock()
	e := z.entry(id)
	z.mu.Unlock()
	// The tokens are usually a few microseconds away (the sample stage is
	// finishing the step): yield a few times before parking, which saves
	// the wake-up latency on the path between two forward passes.
	for range spinYields {
		select {
		case <-e.ready:
			return e, nil
		default:
			runtime.Gosched()
		}
	}
	select {
	case <-e.ready:
		return e, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// spinYields bounds the yields before a wait parks its goroutine.
const spinYields = 64

// postprocessed marks step id post-processed and forgets the steps before
// it (the one in flight after it may still read id's tokens).
func (z *MetadataZOS) postprocessed(id engine.StepID) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if id <= z.postDone {
		return
	}
	z.postDone = id
	for k := range z.steps {
		if k < id {
			delete(z.steps, k)
		}
	}
	close(z.postCh)
	z.postCh = make(chan struct{})
}

// waitPostprocessed returns once every step up to id is post-processed.
func (z *MetadataZOS) waitPostprocessed(ctx context.Context, id engine.StepID) error {
	for {
		z.mu.Lock()
		done, ch := z.postDone, z.postCh
		z.mu.Unlock()
		if done >= id {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// resolvePlaceholders fills the placeholder inputs of a step from the
// previous step's sampled tokens, on the backend.
func (z *MetadataZOS) resolvePlaceholders(ctx context.Context, ops kernels.Ops, step *ScheduledStep, ids, fromRow kernels.Tensor) error {
	prev, err := z.sampled(ctx, step.Outputs.StepID-1)
	if err != nil {
		return err
	}
	if err := ops.ResolvePlaceholders(ids, fromRow, prev.tokens); err != nil {
		return fmt.Errorf("step %d: %w", step.Outputs.StepID, err)
	}
	return nil
}

// pendingTokens returns, for a sequence whose input is a placeholder, the
// token of the previous step it stands for (nil otherwise). The previous
// step has published: sampling of this step waits for its post-processing.
func (z *MetadataZOS) pendingTokens(step engine.StepID, m *engine.SequenceMetadata) []int {
	if m.InputFromRow < 0 {
		return nil
	}
	z.mu.Lock()
	e := z.steps[step-1]
	z.mu.Unlock()
	if e == nil || e.host == nil || m.InputFromRow >= len(e.host) {
		return nil
	}
	return []int{e.host[m.InputFromRow]}
}
