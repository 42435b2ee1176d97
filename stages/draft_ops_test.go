package stages_test

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// mtpRun is one engine run of the shipped model with the MTP drafter
// under an operation counter.
type mtpRun struct {
	outputs map[string][]int
	spec    stages.SpecStats
	steps   []stages.DraftOpStep
}

// runCountedMTP serves batch greedy requests (ignoring EOS, the same
// length) on the shipped DeepSeek-V3-architecture model with MTP drafts of
// k tokens, stepping the engine by hand so that every run plans the same
// steps, and returns the outputs, the acceptance counts and each drafting
// step's operations. graphs: the drafter replays graphs of these sizes
// (emulated on the CPU backend), else it runs eagerly.
func runCountedMTP(t *testing.T, batch, k int, zos bool, graphs []int) mtpRun {
	t.Helper()
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	yaml := fmt.Sprintf(`model: %s
cpu: {threads: 2}
cache: {num_blocks: 160, block_size: 4}
engine: {max_num_seqs: 8, max_num_batched_tokens: 128, prefill_chunk_size: 64}
pipeline: {draft: counted_mtp}
zos: {enabled: %v}
speculative: {method: mtp, num_speculative_tokens: %d, adaptive: false}
`, dir, zos, k)
	cfg, err := config.Parse("counted-mtp.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	rec := &stages.DraftOpRecord{}
	reg := pipeline.DefaultRegistry().Clone()
	stages.RegisterCountingMTP(reg, "counted_mtp", stages.CUDAGraph{Enabled: graphs != nil, BatchSizes: graphs}, rec)
	e, err := llm.New(cfg, llm.Options{Stages: reg, ManualSteps: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	params := engine.DefaultSamplingParams()
	params.Temperature = 0
	params.MaxTokens = 12
	params.IgnoreEOS = true
	for i := range batch {
		prompt := make([]int, 5+i%3)
		for j := range prompt {
			prompt[j] = 3 + (j*37+i*101)%4000
		}
		if err := e.AddRequest(&engine.Request{ID: fmt.Sprintf("r%d", i), PromptTokenIDs: prompt, Params: params}); err != nil {
			t.Fatal(err)
		}
	}
	got := stepUntilDone(t, e)
	return mtpRun{outputs: got, spec: e.StepStats().Spec(), steps: rec.Steps}
}

// The backend operations the MTP drafter queues in one drafting step, at
// batch 1 and 8 with k = 2 and 3, counted through a counting kernels.Ops
// (views apart, and, on the eager path, apart from the MTP layer's and
// head's own kernels, which the model queues on its own backend): in the
// steady state (every sequence verifying k drafts) they stay within
// bounds that do not grow with the rows, and on the graphs not with the
// depth either. Before the one-upload layout and the chain graphs a step
// from the device took 41 (k = 2) and 61 (k = 3) operations on the
// graphs, 17 and 25 eagerly; from the host 33 and 50, 13 and 18. The
// drafts of every step are the same with and without graphs, so are the
// outputs and the acceptance counts.
func TestMTPDraftStepOps(t *testing.T) {
	for _, k := range []int{2, 3} {
		for _, batch := range []int{1, 8} {
			for _, zos := range []bool{true, false} {
				t.Run(fmt.Sprintf("k=%d/batch=%d/zos=%v", k, batch, zos), func(t *testing.T) {
					t.Parallel()
					eager := runCountedMTP(t, batch, k, zos, nil)
					graphed := runCountedMTP(t, batch, k, zos, []int{1, 4, 8, 32})
					sameEagerAndGraphs(t, eager.outputs, graphed.outputs, eager.spec, graphed.spec, len(eager.steps), len(graphed.steps))
					for i := range eager.steps {
						if !reflect.DeepEqual(eager.steps[i].Drafts, graphed.steps[i].Drafts) {
							t.Errorf("step %d: drafts eager %v, graphs %v", eager.steps[i].StepID, eager.steps[i].Drafts, graphed.steps[i].Drafts)
						}
					}
					// Eagerly: one upload (an allocation and a copy), the
					// placeholders (from the device), the drafts'
					// allocation, the hidden rows' gather (an allocation and
					// a kernel), depth 0's argmax, depth 1's input (an
					// allocation and a gather); then per further depth its
					// shift (from the device) and its argmax. On the
					// graphs: one upload, the placeholders (from the
					// device), three copies of the step's batch and one of
					// its tables, the gather of its hidden states, the
					// copy of the device's verification (from the device),
					// two replays.
					eagerBound, graphBound := 7+k, 8
					if zos {
						eagerBound, graphBound = 7+2*k, 10
					}
					for _, r := range []struct {
						name   string
						run    mtpRun
						bound  int
						graphs bool
					}{{"eager", eager, eagerBound, false}, {"graphs", graphed, graphBound, true}} {
						steady := 0
						for _, s := range r.run.steps {
							if s.FromDevice != zos {
								t.Fatalf("%s: step %d drafted from the device %v with ZOS %v", r.name, s.StepID, s.FromDevice, zos)
							}
							if s.Prefill || s.SampleRows != batch || s.NumTokens != batch*(k+1) {
								continue
							}
							steady++
							if steady == 1 {
								t.Logf("%s: step %d: %d operations (%d views): %v", r.name, s.StepID, s.Total, s.Views, s.Ops)
							}
							if s.Total > r.bound {
								t.Errorf("%s: step %d: %d operations, want at most %d: %v", r.name, s.StepID, s.Total, r.bound, s.Ops)
							}
							if s.GraphsTaken != r.graphs || s.Ops["graph_replay"] > 2 {
								t.Errorf("%s: step %d: %d graph replays", r.name, s.StepID, s.Ops["graph_replay"])
							}
						}
						if steady == 0 {
							t.Errorf("%s: no steady-state drafting step", r.name)
						}
					}
					t.Logf("accepted %d of %d draft tokens", graphed.spec.NumAcceptedTokens, graphed.spec.NumDraftTokens)
				})
			}
		}
	}
}

// stepUntilDone steps a manual-steps engine until every request has
// finished (at most 100 steps) and returns each request's tokens.
func stepUntilDone(t *testing.T, e *llm.Engine) map[string][]int {
	t.Helper()
	got := map[string][]int{}
	for steps := 0; e.HasUnfinished(); steps++ {
		out, err := e.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range out {
			got[o.RequestID] = append(got[o.RequestID], o.TokenIDs...)
		}
		if steps > 100 {
			t.Fatal("too many steps")
		}
	}
	return got
}

// sameEagerAndGraphs checks a drafter's eager run against its run on
// graphs: the same outputs, draft and acceptance counts (some accepted)
// and number of drafting steps (fatal otherwise, before the caller
// compares them step by step).
func sameEagerAndGraphs(t *testing.T, eagerOut, graphOut map[string][]int, eager, graphed stages.SpecStats, eagerSteps, graphSteps int) {
	t.Helper()
	if !reflect.DeepEqual(eagerOut, graphOut) {
		t.Errorf("outputs eager %v, graphs %v", eagerOut, graphOut)
	}
	if eager.NumDraftTokens != graphed.NumDraftTokens || eager.NumAcceptedTokens != graphed.NumAcceptedTokens {
		t.Errorf("eager drafted %d and accepted %d, graphs %d and %d", eager.NumDraftTokens, eager.NumAcceptedTokens,
			graphed.NumDraftTokens, graphed.NumAcceptedTokens)
	}
	if eager.NumAcceptedTokens == 0 {
		t.Error("no draft accepted")
	}
	if eagerSteps != graphSteps {
		t.Fatalf("%d drafting steps eager, %d with graphs", eagerSteps, graphSteps)
	}
}
