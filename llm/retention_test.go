package llm

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"weak"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// stepRecorder keeps a weak pointer to every step's forward result.
type stepRecorder struct {
	mu    sync.Mutex
	steps []weak.Pointer[stages.ForwardResult]
}

func (r *stepRecorder) Process(_ context.Context, res *stages.ForwardResult) (*stages.ForwardResult, error) {
	r.mu.Lock()
	r.steps = append(r.steps, weak.Make(res))
	r.mu.Unlock()
	return res, nil
}

// A finished step is garbage once the loop is past it: the lagged edges
// hand each step its predecessor for one call only, so steps do not chain
// (a chain would keep every step's logits alive for the engine's life).
func TestStepsAreNotRetained(t *testing.T) {
	for _, zos := range []bool{false, true} {
		t.Run(fmt.Sprint("zos=", zos), func(t *testing.T) {
			rec := &stepRecorder{}
			reg := pipeline.DefaultRegistry().Clone()
			stages.RegisterInsert(reg, "record", "default", stages.NoOptions{},
				func(stages.InsertDeps, stages.NoOptions) (pipeline.Stage[*stages.ForwardResult, *stages.ForwardResult], error) {
					return rec, nil
				})
			cfg := tinyConfig(t, tinyLlama(t), func(c *config.Config) {
				c.ZOS.Enabled = zos
				c.Pipeline.Insert = append(c.Pipeline.Insert, pipeline.Insertion{After: SlotForward, Stage: "record"})
			})
			l, err := NewLLM(cfg, Options{Stages: reg})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			generate(t, l, prompts(4), greedy(24))
			runtime.GC()
			rec.mu.Lock()
			defer rec.mu.Unlock()
			live := 0
			for _, w := range rec.steps {
				if w.Value() != nil {
					live++
				}
			}
			if len(rec.steps) < 20 {
				t.Fatalf("only %d steps recorded", len(rec.steps))
			}
			// The stages may hold the last step or two (their scratch).
			if live > 3 {
				t.Errorf("%d of %d steps still reachable after the run: steps chain to their predecessors", live, len(rec.steps))
			}
		})
	}
}
