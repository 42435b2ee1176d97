package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
)

// LongJSONSchema is the default schema of the structured-output benchmark:
// an array of at least 64 small records, so that no instance can end
// within a benchmark's output length and every row stays constrained (and
// running) to the end, as the unconstrained rows (ignore_eos) do.
const LongJSONSchema = `{"type":"array","items":{"type":"object","properties":{"name":{"type":"string","maxLength":16},"id":{"type":"integer"},"ok":{"type":"boolean"}},"required":["name","id","ok"],"additionalProperties":false},"minItems":64}`

// StructuredOptions configure RunStructured.
type StructuredOptions struct {
	Offline OfflineOptions
	// Constraint is applied to every request of the constrained runs.
	Constraint engine.StructuredOutput
	// Rounds runs both modes this many times, in alternating order; each
	// mode reports its median run.
	Rounds int
	Engine llm.Options
	// Log receives one line per run (nil: none).
	Log io.Writer
}

// StructuredResult compares the same requests without and with a
// structured-output constraint on one engine.
type StructuredResult struct {
	Mode          string         `json:"mode"`
	Backend       string         `json:"backend"`
	Batch         int            `json:"batch"`
	NumRequests   int            `json:"num_requests"`
	Kind          string         `json:"constraint"`
	Rounds        int            `json:"rounds"`
	Unconstrained *OfflineResult `json:"unconstrained"`
	Constrained   *OfflineResult `json:"constrained"`
	// StepRateRatio is the constrained runs' decode step rate over the
	// unconstrained ones' (median TPOT, unconstrained over constrained): 1
	// means the masks cost nothing.
	StepRateRatio float64 `json:"step_rate_ratio"`
	// ThroughputRatio is the same for output tokens per second.
	ThroughputRatio float64 `json:"throughput_ratio"`
	// EndedEarly counts constrained outputs that ended before their
	// max_tokens (the grammar completed): fewer running rows, so the ratio
	// flatters the constrained side; a good benchmark schema gives 0.
	EndedEarly int `json:"ended_early"`
}

// RunStructured runs the offline workload of o without and with the
// constraint on one engine of cfg (the prefix cache is off, so neither
// mode reuses the other's prompts), after one unmeasured pass of each,
// alternating the order each round.
func RunStructured(ctx context.Context, cfg *config.Config, o StructuredOptions) (*StructuredResult, error) {
	if err := o.Constraint.Validate(); err != nil {
		return nil, fmt.Errorf("bench: structured: %w", err)
	}
	c := *cfg
	c.Cache.PrefixCaching = false
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("bench: structured: %w", err)
	}
	l, err := llm.NewLLM(&c, o.Engine)
	if err != nil {
		return nil, fmt.Errorf("bench: structured: %w", err)
	}
	defer l.Close()
	w, err := buildOffline(l, o.Offline)
	if err != nil {
		return nil, err
	}
	cw := &offlineWorkload{name: w.name, prompts: w.prompts, params: slices.Clone(w.params)}
	for i := range cw.params {
		cw.params[i].IgnoreEOS = false
		cw.params[i].StructuredOutput = &o.Constraint
	}
	// One unmeasured pass of each mode first: on a GPU the first passes of
	// a fresh engine run several percent slower (measured on an H200: round
	// 1 at 0.73x the later rounds' throughput), which would otherwise land
	// on whichever mode a round runs first.
	for _, wl := range []*offlineWorkload{w, cw} {
		if _, err := runOffline(ctx, l, wl, nil, "warm-up"); err != nil {
			return nil, err
		}
	}
	rounds := max(1, o.Rounds)
	var plain, constrained []*OfflineResult
	for round := range rounds {
		for k := range 2 {
			withGrammar := (k+round)%2 == 1
			wl, label := w, "unconstrained"
			if withGrammar {
				wl, label = cw, "constrained"
			}
			r, err := runOffline(ctx, l, wl, o.Offline.Progress, label)
			if err != nil {
				return nil, err
			}
			if withGrammar {
				constrained = append(constrained, r)
			} else {
				plain = append(plain, r)
			}
			if o.Log != nil {
				fmt.Fprintf(o.Log, "bench: %s, round %d: %.1f output tok/s, median TPOT %.3f ms\n", label, round+1, r.OutputThroughput, r.TPOTMillis.Median)
			}
		}
	}
	res := &StructuredResult{Mode: "structured", Backend: l.Backend().Name(), Batch: c.Engine.MaxNumSeqs, NumRequests: len(w.prompts),
		Kind: o.Constraint.Kind(), Rounds: rounds, Unconstrained: medianRun(plain), Constrained: medianRun(constrained)}
	if res.Constrained.Failed > 0 {
		return res, fmt.Errorf("bench: structured: %d constrained requests failed", res.Constrained.Failed)
	}
	for i, out := range res.Constrained.outputs {
		if len(out) < cw.params[i].MaxTokens {
			res.EndedEarly++
		}
	}
	u, k := res.Unconstrained, res.Constrained
	if k.TPOTMillis.Median > 0 && k.OutputThroughput > 0 {
		res.StepRateRatio = u.TPOTMillis.Median / k.TPOTMillis.Median
		res.ThroughputRatio = k.OutputThroughput / u.OutputThroughput
	} else {
		return res, errors.New("bench: structured: the constrained runs produced no timing")
	}
	return res, nil
}
