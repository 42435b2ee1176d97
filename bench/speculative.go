package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
)

// SpecNone is the method that turns speculation off: the baseline every
// other method is compared with.
const SpecNone = "none"

// SpecDSparkFixed is the dspark drafter with confidence gating off: a
// method label of RunSpeculative, not a speculative.method value.
const SpecDSparkFixed = "dspark-fixed"

// SpecDSparkAuto is the dspark drafter with the step budget "auto"
// (speculative.max_verify_tokens_per_step: auto, the config's threshold
// kept): a method label of RunSpeculative.
const SpecDSparkAuto = "dspark-auto"

// SpeculativeOptions shape a comparison of speculative-decoding methods
// (RunSpeculative).
type SpeculativeOptions struct {
	// Offline is the workload every run generates (its Progress is not
	// used: see Progress).
	Offline OfflineOptions
	// Methods are speculative.method values ("none", "ngram", "mtp",
	// "draft_model", "dspark", ...), each once; "none", the baseline,
	// always comes first (added when missing). "dspark-fixed" is the
	// dspark drafter with gating off (confidence_threshold 0, no step
	// budget): every sequence verifies k drafts, the comparison point of
	// confidence gating; "dspark-auto" is the dspark drafter with the
	// step budget derived from the measured cost of a row. dspark needs
	// speculative.draft_model in the config (configs/dspark.yaml sets it).
	Methods []string
	// NumSpeculativeTokens is speculative.num_speculative_tokens (k) of
	// every method; 0 keeps the config's.
	NumSpeculativeTokens int
	// Batches are the runs' engine.max_num_seqs, the most sequences in
	// one step: every method runs at each; empty keeps the config's.
	Batches []int
	// Rounds repeats every run (0: once), in alternating order; a method's
	// row is its run of median output throughput.
	Rounds int
	// WarmupRuns are untimed runs before the first measured one, each on
	// a fresh engine of the baseline at the first batch size, of a
	// workload like o.Offline drawn with another seed (0: none). A
	// process pays some costs once, in whichever run comes first: on CUDA
	// the first use of each kernel (loaded lazily) and the device
	// allocations of each new activation shape; an H100 measured a first
	// run 10-17% slower than a second one of the same method at batch 8
	// to 64, and alternating the order only halves that bias over two
	// rounds. The warm-up's prompts differ from the measured ones because
	// a step's shape is its token count: the same prompts would replay
	// the baseline's exact steps, whose cuBLAS shapes the warm-up had
	// then all met, while another method's steps (drafts verified) meet
	// shapes of their own, at up to hundreds of microseconds of host time
	// a call on an H100.
	WarmupRuns int
	// Engine is the options of every engine built.
	Engine llm.Options
	// Progress receives each run's progress bar; Log a line as each run
	// ends. nil: none.
	Progress, Log io.Writer
}

// SpeculativeRun is one method at one batch size.
type SpeculativeRun struct {
	Method string `json:"method"`
	Batch  int    `json:"batch"`
	// Order holds the positions of the method's runs (one per round) in
	// the sequence of runs, from 0.
	Order []int `json:"order"`
	// Result is the round of median output throughput; RoundThroughputs
	// are every round's output throughputs, in round order.
	Result           *OfflineResult `json:"result"`
	RoundThroughputs []float64      `json:"round_output_throughputs"`
	// Speedup is the output throughput over the baseline's (method none
	// at the same batch size), of the median rounds.
	Speedup float64 `json:"speedup"`
	// SameOutputs reports whether every request's output tokens equal
	// the baseline's (its first round's) in every round; NumDiffer counts
	// the requests whose differ in the round with the most, FirstDiff says
	// where the first of them does.
	SameOutputs bool   `json:"same_outputs"`
	NumDiffer   int    `json:"num_differ"`
	FirstDiff   string `json:"first_diff,omitempty"`
	// DifferRounds lists the rounds (from 1) whose outputs differ from
	// the baseline's first round: a method that differs only from the
	// first round of its own (none's rounds 2..N, say) points at state a
	// fresh engine inherits from the one before it in the process.
	DifferRounds []int `json:"differ_rounds,omitempty"`
}

// SpeculativeResult is the report of RunSpeculative.
type SpeculativeResult struct {
	Mode                 string  `json:"mode"` // "speculative"
	Workload             string  `json:"workload"`
	NumRequests          int     `json:"num_requests"`
	NumSpeculativeTokens int     `json:"num_speculative_tokens"`
	Temperature          float32 `json:"temperature"`
	Rounds               int     `json:"rounds"`
	WarmupRuns           int     `json:"warmup_runs"`
	// Runs are batch-major; within a batch size, in the order of the
	// methods (the baseline first), whatever order they ran in.
	Runs []SpeculativeRun `json:"runs"`
	// OutputsIdentical reports whether every run's outputs equal its
	// baseline's.
	OutputsIdentical bool `json:"outputs_identical"`
}

// RunSpeculative generates one workload (o.Offline, drawn once) with each
// method of o.Methods at each batch size of o.Batches, o.Rounds times, every
// run on a fresh engine built from cfg (not modified) with
// speculative.method, num_speculative_tokens and engine.max_num_seqs set.
// A batch size's rounds run one after the other, before the next batch
// size's; the methods run in the given order in the first round of the
// first batch size, then in reverse, and so on, alternating from round to
// round and from batch size to batch size, so that no method always runs
// first, after o.WarmupRuns untimed runs. Each run is RunOffline's: a
// short warm-up, then all requests at once. A
// run at a temperature above 0 gives each request a seed of its own, so
// that speculation keeps the outputs there too. Cost: methods x batches x
// rounds engine loads and runs.
func RunSpeculative(ctx context.Context, cfg *config.Config, o SpeculativeOptions) (*SpeculativeResult, error) {
	methods := []string{SpecNone}
	for _, m := range o.Methods {
		if m == "" {
			m = SpecNone
		}
		if !slices.Contains(methods, m) {
			methods = append(methods, m)
		}
	}
	batches := o.Batches
	if len(batches) == 0 {
		batches = []int{cfg.Engine.MaxNumSeqs}
	}
	for _, b := range batches {
		if b < 1 {
			return nil, fmt.Errorf("bench: speculative: batch sizes must be >= 1, got %d", b)
		}
	}
	k := o.NumSpeculativeTokens
	if k == 0 {
		k = cfg.Speculative.NumSpeculativeTokens
	}
	workload := o.Offline.Workload
	if workload == "" {
		workload = WorkloadRandom
	}
	res := &SpeculativeResult{Mode: "speculative", Workload: workload, NumRequests: o.Offline.NumSeqs,
		NumSpeculativeTokens: k, Temperature: o.Offline.Temperature, OutputsIdentical: true}

	// Every run's config, checked before any engine loads.
	cfgs := make([][]config.Config, len(batches))
	for bi, batch := range batches {
		for _, m := range methods {
			c := *cfg
			c.Speculative.Method = m
			if m == SpecDSparkFixed {
				c.Speculative.Method = "dspark"
				c.Speculative.ConfidenceThreshold = 0
				c.Speculative.MaxVerifyTokensPerStep = config.VerifyBudget{}
			}
			if m == SpecDSparkAuto {
				c.Speculative.Method = "dspark"
				c.Speculative.MaxVerifyTokensPerStep = config.VerifyBudget{Auto: true}
			}
			c.Speculative.NumSpeculativeTokens = k
			c.Engine.MaxNumSeqs = batch
			// Every running sequence can verify a whole draft in one step.
			c.Engine.MaxNumBatchedTokens = max(c.Engine.StepTokens(c.Device), batch*(k+1))
			if err := c.Validate(); err != nil {
				return nil, fmt.Errorf("bench: speculative: %s at batch %d: %w", m, batch, err)
			}
			cfgs[bi] = append(cfgs[bi], c)
		}
	}

	rounds := max(1, o.Rounds)
	res.Rounds, res.WarmupRuns = rounds, max(0, o.WarmupRuns)
	var w *offlineWorkload
	// load builds the engine of method i at batch bi, drawing the
	// workload with the first one.
	load := func(bi, i int) (*llm.LLM, error) {
		l, err := llm.NewLLM(&cfgs[bi][i], o.Engine)
		if err != nil {
			return nil, fmt.Errorf("bench: speculative: %s at batch %d: %w", methods[i], batches[bi], err)
		}
		if w == nil {
			if w, err = buildOffline(l, o.Offline); err != nil {
				l.Close()
				return nil, err
			}
			if o.Offline.Temperature > 0 {
				for j := range w.params {
					seed := int64(o.Offline.Seed) + int64(j)
					w.params[j].Seed = &seed
				}
			}
		}
		return l, nil
	}
	for run := range res.WarmupRuns {
		l, err := load(0, 0)
		if err != nil {
			return nil, err
		}
		warm, err := buildOffline(l, warmupOffline(o.Offline, run))
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("bench: speculative: warm-up: %w", err)
		}
		r, err := runOffline(ctx, l, warm, o.Progress, fmt.Sprintf("warm-up %d", run+1))
		if err = errors.Join(err, l.Close()); err != nil {
			return nil, fmt.Errorf("bench: speculative: warm-up: %w", err)
		}
		if o.Log != nil {
			fmt.Fprintf(o.Log, "bench: warm-up run %d (%s at batch %d, untimed): %.1f output tok/s over %.2f s\n",
				run+1, methods[0], batches[0], r.OutputThroughput, r.DurationSeconds)
		}
	}
	order := 0
	for bi, batch := range batches {
		all := make([][]*OfflineResult, len(methods)) // [method][round]
		orders := make([][]int, len(methods))
		for round := range rounds {
			idx := make([]int, len(methods))
			for i := range idx {
				idx[i] = i
			}
			if (bi+round)%2 == 1 {
				slices.Reverse(idx)
			}
			for _, i := range idx {
				l, err := load(bi, i)
				if err != nil {
					return nil, err
				}
				label := fmt.Sprintf("%s b%d", methods[i], batch)
				if rounds > 1 {
					label += fmt.Sprintf(" r%d", round+1)
				}
				r, err := runOffline(ctx, l, w, o.Progress, label)
				err = errors.Join(err, l.Close())
				if err != nil {
					return nil, fmt.Errorf("bench: speculative: %s at batch %d: %w", methods[i], batch, err)
				}
				all[i] = append(all[i], r)
				orders[i] = append(orders[i], order)
				order++
				if o.Log != nil {
					line := fmt.Sprintf("bench: %s at batch %d", methods[i], batch)
					if rounds > 1 {
						line += fmt.Sprintf(", round %d", round+1)
					}
					line += fmt.Sprintf(": %.1f output tok/s over %.2f s", r.OutputThroughput, r.DurationSeconds)
					if sp := r.Speculative; sp != nil {
						line += fmt.Sprintf(", mean accepted length %.2f", sp.MeanAcceptedLength)
						if l := sp.LimitsString(); l != "" {
							line += ", steps at draft limits " + l
						}
					}
					if st := r.StepTimes.String(); st != "" {
						line += ", steps " + st
					}
					fmt.Fprintln(o.Log, line)
				}
			}
		}
		runs := make([]SpeculativeRun, len(methods))
		for i := range runs {
			r := &runs[i]
			*r = SpeculativeRun{Method: methods[i], Batch: batch, Order: orders[i], Result: medianRun(all[i])}
			for round, x := range all[i] {
				r.RoundThroughputs = append(r.RoundThroughputs, x.OutputThroughput)
				n, first := compareOutputs(all[0][0].outputs, x.outputs)
				if n > r.NumDiffer {
					r.NumDiffer, r.FirstDiff = n, first
				}
				if n > 0 {
					r.DifferRounds = append(r.DifferRounds, round+1)
				}
			}
			r.SameOutputs = r.NumDiffer == 0
			res.OutputsIdentical = res.OutputsIdentical && r.SameOutputs
		}
		if base := runs[0].Result; base.OutputThroughput > 0 {
			for i := range runs {
				runs[i].Speedup = runs[i].Result.OutputThroughput / base.OutputThroughput
			}
		}
		res.Runs = append(res.Runs, runs...)
	}
	return res, nil
}

// warmupOffline is the workload of warm-up run i: o's, drawn with another
// seed for each run.
func warmupOffline(o OfflineOptions, i int) OfflineOptions {
	o.Seed += 0x9e3779b97f4a7c15 * uint64(i+1)
	return o
}

// medianRun is the run of median output throughput (the lower of the two
// middle ones for an even count).
func medianRun(rs []*OfflineResult) *OfflineResult {
	sorted := slices.Clone(rs)
	slices.SortStableFunc(sorted, func(a, b *OfflineResult) int { return cmp.Compare(a.OutputThroughput, b.OutputThroughput) })
	return sorted[(len(sorted)-1)/2]
}

// compareOutputs counts the requests whose output tokens in got differ
// from want's and says where the first differs ("" when none does).
func compareOutputs(want, got [][]int) (n int, first string) {
	for i := range max(len(want), len(got)) {
		var a, b []int
		if i < len(want) {
			a = want[i]
		}
		if i < len(got) {
			b = got[i]
		}
		if slices.Equal(a, b) {
			continue
		}
		n++
		if first == "" {
			j := 0
			for j < min(len(a), len(b)) && a[j] == b[j] {
				j++
			}
			first = fmt.Sprintf("request %d from output token %d (%d vs %d tokens)", i, j, len(b), len(a))
		}
	}
	return n, first
}
