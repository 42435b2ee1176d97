package stages_test

import (
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

// dsparkMode is how the counted DSpark drafter runs its pass.
type dsparkMode int

const (
	dsparkOff    dsparkMode = iota // no speculation
	dsparkEager                    // eagerly, reading each position back (the CPU's path)
	dsparkAsync                    // eagerly on a backend that computes asynchronously (a GPU's path without graphs)
	dsparkGraphs                   // on graphs (emulated on the CPU backend)
)

func (m dsparkMode) String() string {
	return [...]string{"off", "eager", "async", "graphs"}[m]
}

// dsparkVariant is one engine run of the shipped model with the shipped
// DSpark drafter.
type dsparkVariant struct {
	batch, k  int
	threshold float64
	budget    int
	auto      bool // max_verify_tokens_per_step: auto (budget unused)
	zos       bool
	mode      dsparkMode
}

type dsparkRun struct {
	outputs map[string][]int
	spec    stages.SpecStats
	steps   []stages.DSparkOpStep
}

// dsparkPrompts are prose and code of the kind the shipped model was
// trained on, so that its drafter's drafts are often accepted.
var dsparkPrompts = []string{"func main() {", "The old house", "\tif err != nil {", "It was a dark and stormy night",
	"package main\n\nimport (", "ORLANDO\t", "The old house at the end of the road", "for i := range n {"}

// runCountedDSpark serves v.batch greedy requests (ignoring EOS, the same
// length) on the shipped DeepSeek-V3-architecture model with DSpark drafts
// of up to v.k tokens under an operation counter, stepping the engine by
// hand so that every run plans the same steps, and returns the outputs,
// the acceptance counts and each drafting step's operations and drafts,
// with the host path's drafts for the same step.
func runCountedDSpark(t *testing.T, v dsparkVariant) dsparkRun {
	t.Helper()
	spec := ""
	if v.mode != dsparkOff {
		budget := fmt.Sprint(v.budget)
		if v.auto {
			budget = "auto"
		}
		spec = fmt.Sprintf("pipeline: {draft: counted_dspark}\nspeculative: {method: dspark, draft_model: %s, num_speculative_tokens: %d, confidence_threshold: %g, max_verify_tokens_per_step: %s, adaptive: false}\n",
			filepath.Join("..", "assets", "dspark-tiny"), v.k, v.threshold, budget)
	}
	yaml := fmt.Sprintf(`model: %s
cpu: {threads: 2}
cache: {num_blocks: 200, block_size: 4}
engine: {max_num_seqs: 8, max_num_batched_tokens: 128, prefill_chunk_size: 64}
zos: {enabled: %v}
%s`, filepath.Join("..", "assets", "deepseek-tiny"), v.zos, spec)
	cfg, err := config.Parse("counted-dspark.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	rec := &stages.DSparkOpRecord{}
	reg := pipeline.DefaultRegistry().Clone()
	var graphs stages.CUDAGraph
	if v.mode == dsparkGraphs {
		graphs = stages.CUDAGraph{Enabled: true, BatchSizes: []int{1, 4, 8}}
	}
	stages.RegisterCountingDSpark(reg, "counted_dspark", graphs, v.mode == dsparkAsync, rec)
	e, err := llm.New(cfg, llm.Options{Stages: reg, ManualSteps: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	params := engine.DefaultSamplingParams()
	params.Temperature = 0
	params.MaxTokens = 24
	params.IgnoreEOS = true
	for i := range v.batch {
		if err := e.AddRequest(&engine.Request{ID: fmt.Sprintf("r%d", i), Prompt: dsparkPrompts[i%len(dsparkPrompts)], Params: params}); err != nil {
			t.Fatal(err)
		}
	}
	got := stepUntilDone(t, e)
	return dsparkRun{outputs: got, spec: e.StepStats().Spec(), steps: rec.Steps}
}

// checkDSparkRun checks a run against the run without speculation and its
// own host path: the same outputs; drafting from the device exactly with
// ZOS; and on every drafting step the drafts the host path (the DSpark
// pass read back on the host, then the gate) proposes for the same step.
func checkDSparkRun(t *testing.T, name string, run, off dsparkRun, zos bool) {
	t.Helper()
	if !reflect.DeepEqual(run.outputs, off.outputs) {
		t.Errorf("%s: outputs %v, without speculation %v", name, run.outputs, off.outputs)
	}
	if len(run.steps) == 0 {
		t.Errorf("%s: no drafting step", name)
	}
	for _, s := range run.steps {
		if s.FromDevice != zos {
			t.Errorf("%s: step %d drafted from the device %v with ZOS %v", name, s.StepID, s.FromDevice, zos)
		}
		if !reflect.DeepEqual(s.Drafts, s.Reference) {
			t.Errorf("%s: step %d: drafts %v, the host path's %v", name, s.StepID, s.Drafts, s.Reference)
		}
	}
}

// The DSpark drafter drafts on the device what its host path drafts: at
// confidence thresholds 0 (every draft), 0.3, 0.6 and 0.9, and with a
// budget of verified draft tokens per step, ZOS on (drafting from the
// verify stage's device half) and off, eagerly and on graphs, every
// drafting step's gated drafts equal those of models.DSpark.Draft read
// back and gated on the host for the same step, and the outputs equal the
// outputs without speculation. Gating is seen to work: the threshold
// thins the drafts. Under the race detector, thresholds 0 and 0.6 and the
// budget only, ZOS on graphs and off eagerly.
func TestDSparkDeviceDraftsMatchHost(t *testing.T) {
	const batch, k = 8, 6
	for _, zos := range []bool{true, false} {
		t.Run(fmt.Sprintf("zos=%v", zos), func(t *testing.T) {
			t.Parallel()
			off := runCountedDSpark(t, dsparkVariant{batch: batch, zos: zos, mode: dsparkOff})
			modes := []dsparkMode{dsparkEager, dsparkGraphs}
			if dsparkRace { // ZOS on graphs, off eagerly
				modes = modes[:1]
				if zos {
					modes = []dsparkMode{dsparkGraphs}
				}
			}
			for _, mode := range modes {
				var perDraft []float64
				gates := []struct {
					threshold float64
					budget    int
				}{{0, 0}, {0.3, 0}, {0.6, 0}, {0.9, 0}, {0.3, 10}}
				if dsparkRace {
					gates = []struct {
						threshold float64
						budget    int
					}{{0, 0}, {0.6, 0}, {0.3, 10}}
				}
				for _, c := range gates {
					v := dsparkVariant{batch: batch, k: k, threshold: c.threshold, budget: c.budget, zos: zos, mode: mode}
					name := fmt.Sprintf("%v threshold %g budget %d", mode, c.threshold, c.budget)
					run := runCountedDSpark(t, v)
					checkDSparkRun(t, name, run, off, zos)
					sp := run.spec
					if sp.NumDrafts == 0 {
						t.Errorf("%s: no draft verified", name)
						continue
					}
					t.Logf("%s: %d drafts, %d draft tokens, %d accepted", name, sp.NumDrafts, sp.NumDraftTokens, sp.NumAcceptedTokens)
					if c.budget == 0 {
						perDraft = append(perDraft, float64(sp.NumDraftTokens)/float64(sp.NumDrafts))
					}
					if c.threshold == 0 && sp.NumAcceptedTokens == 0 {
						t.Errorf("%s: no draft accepted", name)
					}
					if c.budget > 0 {
						for _, s := range run.steps {
							n := 0
							for _, d := range s.Drafts {
								n += len(d)
							}
							if n > c.budget {
								t.Errorf("%s: step %d: %d draft tokens over a budget of %d", name, s.StepID, n, c.budget)
							}
						}
					}
				}
				for i := 1; i < len(perDraft); i++ {
					if perDraft[i] > perDraft[i-1] {
						t.Errorf("%v: draft tokens per draft %v rise with the threshold", mode, perDraft)
					}
				}
				if perDraft[0] <= perDraft[len(perDraft)-1] {
					t.Errorf("%v: draft tokens per draft %v: gating keeps every draft", mode, perDraft)
				}
			}
		})
	}
}

// With the step budget "auto" (which measures whether gating pays for its
// read) the drafter serves from the device's verification as a GPU
// backend runs it, eagerly and on graphs, ZOS on and off: the outputs are
// those without speculation, and drafts are verified. (The recorded host
// path is not compared here: it runs the measured choice a second time.)
func TestDSparkAutoBudgetServes(t *testing.T) {
	const batch, k = 8, 6
	off := runCountedDSpark(t, dsparkVariant{batch: batch, zos: true, mode: dsparkOff})
	for _, zos := range []bool{true, false} {
		for _, mode := range []dsparkMode{dsparkAsync, dsparkGraphs} {
			if dsparkRace && mode == dsparkGraphs {
				continue
			}
			name := fmt.Sprintf("%v zos=%v", mode, zos)
			run := runCountedDSpark(t, dsparkVariant{batch: batch, k: k, threshold: 0.3, auto: true, zos: zos, mode: mode})
			if !reflect.DeepEqual(run.outputs, off.outputs) {
				t.Errorf("%s: outputs %v, without speculation %v", name, run.outputs, off.outputs)
			}
			fromDevice := 0
			for _, s := range run.steps {
				if s.FromDevice {
					fromDevice++
				}
			}
			if zos && fromDevice == 0 {
				t.Errorf("%s: no step drafted from the device's verification", name)
			}
			if run.spec.NumDraftTokens == 0 {
				t.Errorf("%s: no draft verified", name)
			}
			t.Logf("%s: %d of %d drafting steps from the device, %d draft tokens, %d accepted", name, fromDevice, len(run.steps), run.spec.NumDraftTokens, run.spec.NumAcceptedTokens)
		}
	}
}

// The backend operations the DSpark drafter queues in one drafting step
// (views apart; the DSpark pass's own kernels included), at batch 1 and 8
// with k = 3 and 6 (6 only under the race detector), counted through a counting kernels.Ops that computes
// asynchronously as a GPU backend does: on graphs a constant, whatever
// the rows and the depth: from the device's verification (ZOS) 6 (the
// upload of the step's rows, the gathers of their hidden rows and tokens
// from the device's verification, the gather of their hidden states, one
// replay, the read of the confidences), from the host's 4 (no gathers
// from the device); eagerly 62 + 4k (64 + 4k from the device), every
// kernel of the pass a host operation. The host path that the device
// paths replace (models.DSpark.Draft, run beside them on every step) costs
// what the eager path costs, plus a host wait for the step's tokens
// before it starts. The drafts of every step (and the host path's), the
// outputs and the acceptance counts are the same eagerly and on graphs.
func TestDSparkDraftStepOps(t *testing.T) {
	ks := []int{3, 6}
	if dsparkRace {
		ks = ks[1:]
	}
	for _, k := range ks {
		for _, batch := range []int{1, 8} {
			for _, zos := range []bool{true, false} {
				t.Run(fmt.Sprintf("k=%d/batch=%d/zos=%v", k, batch, zos), func(t *testing.T) {
					t.Parallel()
					v := dsparkVariant{batch: batch, k: k, threshold: 0.3, zos: zos, mode: dsparkAsync}
					eager := runCountedDSpark(t, v)
					v.mode = dsparkGraphs
					graphed := runCountedDSpark(t, v)
					sameEagerAndGraphs(t, eager.outputs, graphed.outputs, eager.spec, graphed.spec, len(eager.steps), len(graphed.steps))
					for i := range eager.steps {
						e, g := eager.steps[i], graphed.steps[i]
						if !reflect.DeepEqual(e.Drafts, g.Drafts) || !reflect.DeepEqual(e.Drafts, e.Reference) {
							t.Errorf("step %d: drafts eager %v, graphs %v, host path %v", e.StepID, e.Drafts, g.Drafts, e.Reference)
						}
					}
					graphOps := 4
					if zos {
						graphOps = 6
					}
					// Eagerly: the step's upload (an allocation and a
					// copy), the gathers of its rows and tokens (from the
					// device), the features' allocation and gather, the
					// drafts' and confidences' allocations, the read; the
					// block (13 allocations, 6 kernels, 13 kernels a layer
					// of the 2: this backend has no fused gated MLP), the positions (6 allocations, 4 kernels
					// each: the Markov table's row, the add fused with the
					// final norm, the LM head and the argmax) and the confidence head once over
					// them (4 kernels).
					eagerOps := 2 + 2 + 2 + 1 + (13 + 6 + 2*13) + 6 + 4*k + 4
					if zos {
						eagerOps += 2
					}
					for _, r := range []struct {
						name   string
						run    dsparkRun
						want   int
						graphs bool
					}{{"eager", eager, eagerOps, false}, {"graphs", graphed, graphOps, true}} {
						steady := 0
						for _, s := range r.run.steps {
							if s.FromDevice != zos {
								t.Fatalf("%s: step %d drafted from the device %v with ZOS %v", r.name, s.StepID, s.FromDevice, zos)
							}
							if s.Prefill || s.SampleRows != batch {
								continue
							}
							steady++
							if steady == 1 {
								t.Logf("%s: step %d: %d operations (%d views), the host path %d: %v", r.name, s.StepID, s.Total, s.Views, s.ReferenceOps, s.Ops)
							}
							if s.Total != r.want {
								t.Errorf("%s: step %d: %d operations, want %d: %v", r.name, s.StepID, s.Total, r.want, s.Ops)
							}
							if s.GraphsTaken != r.graphs || s.Ops["graph_replay"] > 1 {
								t.Errorf("%s: step %d: %d graph replays", r.name, s.StepID, s.Ops["graph_replay"])
							}
						}
						if steady == 0 {
							t.Errorf("%s: no steady-state drafting step", r.name)
						}
					}
					t.Logf("accepted %d of %d draft tokens", graphed.spec.NumAcceptedTokens, graphed.spec.NumDraftTokens)

					// Gating off (threshold 0, no budget): every row
					// verifies its k drafts, the pass leaves the
					// confidence head out, and the step does not read the
					// confidences back (a wait for the device that would
					// hold the step on a GPU).
					v.threshold = 0
					v.mode = dsparkAsync
					ungatedEager := runCountedDSpark(t, v)
					for _, s := range ungatedEager.steps {
						// No confidences' allocation, no read, and no
						// confidence head (3 allocations, 4 kernels).
						if want := eagerOps - 2 - 3 - 4; !s.Prefill && s.SampleRows == batch && s.Total != want {
							t.Errorf("gating off, eagerly: step %d: %d operations, want %d: %v", s.StepID, s.Total, want, s.Ops)
						}
					}
					v.mode = dsparkGraphs
					ungated := runCountedDSpark(t, v)
					steady := 0
					for _, s := range ungated.steps {
						if s.Prefill || s.SampleRows != batch {
							continue
						}
						steady++
						if s.Total != graphOps-1 || s.Ops["download"] != 0 {
							t.Errorf("gating off: step %d: %d operations, want %d without the read: %v", s.StepID, s.Total, graphOps-1, s.Ops)
						}
						if !reflect.DeepEqual(s.Drafts, s.Reference) {
							t.Errorf("gating off: step %d: drafts %v, the host path's %v", s.StepID, s.Drafts, s.Reference)
						}
					}
					if steady == 0 {
						t.Error("gating off: no steady-state drafting step")
					}
					if !reflect.DeepEqual(ungated.outputs, eager.outputs) || !reflect.DeepEqual(ungatedEager.outputs, eager.outputs) {
						t.Errorf("gating off: outputs %v (graphs), %v (eager), gated %v", ungated.outputs, ungatedEager.outputs, eager.outputs)
					}
				})
			}
		}
	}
}
