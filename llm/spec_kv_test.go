package llm

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// oracleDrafter proposes, from a reference run's outputs, k drafts per
// sequence that the target accepts wholly, rejects wholly, or accepts in
// part, by request: "all" drafts the true continuation, "none" a wrong
// token at every position, "mixed" the true first token then wrong ones.
type oracleDrafter struct {
	k     int
	vocab int
	ref   map[string][]int // request id -> its reference output tokens
}

func (o *oracleDrafter) Propose(_ context.Context, step *stages.SampledStep) ([][]int, error) {
	out := make([][]int, len(step.Verified))
	for r, v := range step.Verified {
		hist := stages.SequenceHistory(step, v)
		ref := o.ref[v.Ref.RequestID]
		n := len(hist) - v.Ref.Meta.NumPromptTokens
		for j := range o.k {
			if n+j >= len(ref) {
				break
			}
			tok := ref[n+j]
			if v.Ref.RequestID == "none" || (v.Ref.RequestID == "mixed" && j > 0) {
				tok = (tok + 1) % o.vocab
			}
			out[r] = append(out[r], tok)
		}
	}
	return out, nil
}

// kvRows returns the keys and values of every layer at positions [0, n)
// of a sequence with block table table.
func kvRows(t *testing.T, e *Engine, table []int, n int) []byte {
	t.Helper()
	cache := e.env.Cache
	bs := cache.BlockSize
	var all []byte
	for _, layer := range [][]kernels.Tensor{cache.K, cache.V} {
		for _, x := range layer {
			flat, err := kernels.ToF32(e.ops, x)
			if err != nil {
				t.Fatal(err)
			}
			width := x.Shape()[2]
			for p := range n {
				slot := table[p/bs]*bs + p%bs
				for _, f := range flat[slot*width : (slot+1)*width] {
					all = fmt.Appendf(all, "%08x", f)
				}
			}
		}
	}
	return all
}

// A speculative step that accepts every draft, one that rejects them all
// and one that accepts some, in one batch: after every step each
// sequence's KV at its computed positions is bit for bit the KV of the
// run without speculation at the same length, it holds exactly the blocks
// its computed tokens need (the rejected drafts' blocks went back), the
// outputs are the same, and no block leaks.
func TestSpeculativeRejectionRollsBackKV(t *testing.T) {
	dir := tinyLlama(t)
	reqs := []string{"all", "none", "mixed"}
	params := greedy(22)
	params.IgnoreEOS = true
	prompt := func(i int) []int {
		ids := make([]int, 6+3*i)
		for j := range ids {
			ids[j] = 3 + (j*7+i*13)%60
		}
		return ids
	}
	// run steps an engine through the three requests and calls check after
	// every step, with the scheduler idle.
	run := func(e *Engine, check func(seq *engine.Sequence)) map[string][]int {
		got := map[string][]int{}
		for i, id := range reqs {
			if err := e.AddRequest(&engine.Request{ID: id, PromptTokenIDs: prompt(i), Params: params}); err != nil {
				t.Fatal(err)
			}
		}
		for steps := 0; e.HasUnfinished(); steps++ {
			out, err := e.Step(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range out {
				got[o.RequestID] = append(got[o.RequestID], o.TokenIDs...)
			}
			// Step answers once the scheduler has applied the step: with
			// manual steps nothing else is planned, so it is idle here.
			for id := engine.SeqID(1); id <= 3; id++ {
				if seq := e.sched.Sequence(id); seq != nil && seq.NumComputedTokens() > 0 {
					check(seq)
				}
			}
			if steps > 60 {
				t.Fatal("too many steps")
			}
		}
		return got
	}
	base, err := New(tinyConfig(t, dir, nil), Options{ManualSteps: true})
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string][]byte{} // "request/computed" -> KV rows
	want := run(base, func(seq *engine.Sequence) {
		n := seq.NumComputedTokens()
		kv[fmt.Sprintf("%s/%d", seq.RequestID(), n)] = kvRows(t, base, seq.BlockTable(), n)
	})
	base.Close()

	const k = 3
	reg := pipeline.DefaultRegistry().Clone()
	oracle := &oracleDrafter{k: k, vocab: 64, ref: want}
	stages.RegisterDraft(reg, "oracle", stages.NoOptions{}, func(stages.DraftDeps, stages.NoOptions) (stages.Drafter, error) {
		return oracle, nil
	})
	e, err := New(tinyConfig(t, dir, func(c *config.Config) {
		c.Speculative.Method = "ngram"
		c.Speculative.NumSpeculativeTokens = k
		c.Pipeline.Impl = map[string]string{"sample": "greedy", "draft": "oracle"}
	}), Options{ManualSteps: true, Stages: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	bs := e.env.Cache.BlockSize
	compared := 0
	got := run(e, func(seq *engine.Sequence) {
		n := seq.NumComputedTokens()
		if ref, ok := kv[fmt.Sprintf("%s/%d", seq.RequestID(), n)]; !ok {
			t.Errorf("%s: no reference state with %d computed tokens", seq.RequestID(), n)
		} else if !bytes.Equal(ref, kvRows(t, e, seq.BlockTable(), n)) {
			t.Errorf("%s: KV of the %d computed positions differs from the run without speculation", seq.RequestID(), n)
		}
		compared++
		if blocks, need := len(seq.BlockTable()), (n+bs-1)/bs; blocks != need {
			t.Errorf("%s: holds %d blocks for %d computed tokens (needs %d)", seq.RequestID(), blocks, n, need)
		}
	})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("outputs with speculation %v, without %v", got, want)
	}
	sp := e.StepStats().Spec()
	st := e.SchedulerStats()
	if st.NumFreeBlocks != st.NumBlocks {
		t.Errorf("%d of %d blocks free at the end", st.NumFreeBlocks, st.NumBlocks)
	}
	// "all" accepts k per step, "none" none, "mixed" one.
	if sp.NumAcceptedTokens == 0 || sp.NumAcceptedTokens == sp.NumDraftTokens {
		t.Errorf("accepted %d of %d draft tokens: not a mix", sp.NumAcceptedTokens, sp.NumDraftTokens)
	}
	t.Logf("%d states compared; %d drafts, %d draft tokens, %d accepted", compared, sp.NumDrafts, sp.NumDraftTokens, sp.NumAcceptedTokens)
}
