package stages

import (
	"context"
	"reflect"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// decodeStep is a step of n decodes of 1+k known tokens each, sequence i
// at position pos+i over its own blocks (blocks of size bs).
func decodeStep(id engine.StepID, n, k, pos, bs int, first int) *ScheduledStep {
	seqs := make([]engine.SequenceMetadata, n)
	for i := range seqs {
		p := pos + i
		table := make([]int, (p+1+k+bs-1)/bs)
		for j := range table {
			table[j] = first + i*len(table) + j
		}
		ids, slots := make([]int, 1+k), make([]int, 1+k)
		for j := range ids {
			ids[j] = 100*int(id) + 10*i + j
			slots[j] = table[(p+j)/bs]*bs + (p+j)%bs
		}
		seqs[i] = engine.SequenceMetadata{SeqID: engine.SeqID(i + 1), NumDrafts: k, SeqlenQ: 1 + k, SeqlenK: p + 1 + k, PosStart: p,
			InputTokenIDs: ids, SlotMapping: slots, BlockTable: table, InputFromRow: -1, Sample: true, SampleRow: i,
			PromptLogprobsFrom: -1, PromptLogprobsTo: -1}
	}
	out := &engine.SchedulerOutputs{StepID: id, NumSeqs: n, NumDecodeSeqs: n, NumSampleRows: n,
		NumBatchedTokens: n * (1 + k), NumDecodeTokens: n * (1 + k), NumDraftTokens: n * k, DraftLimit: k}
	return &ScheduledStep{Outputs: out, Seqs: seqs}
}

// batchArrays reads a prepared step's batch back to the host.
func batchArrays(t *testing.T, ops kernels.Ops, p *PreparedStep) map[string][]int32 {
	t.Helper()
	got := map[string][]int32{}
	for name, x := range map[string]kernels.Tensor{"ids": p.Batch.InputIDs, "positions": p.Batch.Positions, "slots": p.Batch.Attn.SlotMapping,
		"cu_seqlens_q": p.Batch.Attn.CuSeqlensQ, "seqlens_k": p.Batch.Attn.SeqlensK, "block_tables": p.Batch.Attn.BlockTables, "sample_rows": p.SampleRows} {
		v, err := kernels.ToI32(ops, x)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got[name] = v
	}
	return got
}

// The prepare stage reuses its host arrays from layout to layout: a step
// laid out after a larger one, and a step laid out before others, hold
// the same batch as each laid out by a fresh stage, nothing left over from
// the other layouts.
func TestPrepareReusesHostArrays(t *testing.T) {
	const k, bs = 2, 4
	ops := cpu.New(cpu.Options{Threads: 1})
	deps := PrepareDeps{Ops: ops, BlockSize: bs, NumBlocks: 4096, NumSpeculativeTokens: k, InFlight: 2}
	steps := []*ScheduledStep{
		decodeStep(5, 6, k, 30, bs, 0),   // large first: the arrays grow
		decodeStep(6, 2, k, 3, bs, 1000), // smaller, shorter tables
		decodeStep(7, 4, k, 90, bs, 2000),
	}
	want := make([]map[string][]int32, len(steps))
	for i, s := range steps {
		prep, err := newPrepare(deps).Process(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = batchArrays(t, ops, prep)
	}
	p := newPrepare(deps)
	var preps []*PreparedStep
	for i, s := range steps {
		prep, err := p.Process(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		preps = append(preps, prep)
		if got := batchArrays(t, ops, prep); !reflect.DeepEqual(got, want[i]) {
			t.Errorf("step %d laid out after %d others: %v, want %v", s.Outputs.StepID, i, got, want[i])
		}
	}
	// The three steps are in flight at once (three ring slots): laying out
	// the later ones left the first ones' batches as they were.
	for i, prep := range preps {
		if got := batchArrays(t, ops, prep); !reflect.DeepEqual(got, want[i]) {
			t.Errorf("step %d after the later layouts: %v, want %v", steps[i].Outputs.StepID, got, want[i])
		}
	}
}
