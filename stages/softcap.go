package stages

import (
	"context"
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// logit-softcap is a stage to insert after forward (*ForwardResult ->
// *ForwardResult), registered as the slot "logit-softcap": an example of a
// logits processor, and Gemma 2's final soft cap.

func init() {
	RegisterInsert(nil, "logit-softcap", "default", SoftcapOptions{Cap: 30}, func(d InsertDeps, o SoftcapOptions) (pipeline.Stage[*ForwardResult, *ForwardResult], error) {
		return &softcap{ops: d.Ops, cap: float32(o.Cap)}, nil
	})
}

// SoftcapOptions are logit-softcap's options.
type SoftcapOptions struct {
	Cap float64 `yaml:"cap"` // logits become cap*tanh(logit/cap); positive
}

// Validate checks the cap.
func (o *SoftcapOptions) Validate() error {
	if !(o.Cap > 0) {
		return fmt.Errorf("logit-softcap: cap must be positive, got %g", o.Cap)
	}
	return nil
}

// softcap bounds logits smoothly: cap * tanh(logit / cap), as Gemma 2 does.
type softcap struct {
	ops kernels.Ops
	cap float32
}

func (s *softcap) Process(_ context.Context, res *ForwardResult) (*ForwardResult, error) {
	if res.Logits == nil {
		return res, nil
	}
	flat, err := kernels.ToF32(s.ops, res.Logits)
	if err != nil {
		return nil, fmt.Errorf("logit-softcap: %w", err)
	}
	for i, x := range flat {
		flat[i] = s.cap * float32(math.Tanh(float64(x/s.cap)))
	}
	capped, err := kernels.FromF32(s.ops, flat, res.Logits.Shape()...)
	if err != nil {
		return nil, fmt.Errorf("logit-softcap: %w", err)
	}
	out := *res
	out.Logits = capped
	return &out, nil
}
