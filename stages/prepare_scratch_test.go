package stages

import (
	"context"
	"reflect"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// decodeStep is a step of n decodes of 1+k tokens each, sequence i at
// position pos+i over its own blocks (blocks of size bs): known tokens, or
// with shifted set placeholders of the step before's row i, laid out
// before its drafts existed.
func decodeStep(id engine.StepID, n, k, pos, bs int, first int, shifted bool) *ScheduledStep {
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
		if shifted {
			for j := range ids {
				ids[j] = engine.PlaceholderToken
			}
			seqs[i].Shifted, seqs[i].InputFromRow = true, i
		}
	}
	out := &engine.SchedulerOutputs{StepID: id, NumSeqs: n, NumDecodeSeqs: n, NumSampleRows: n,
		NumBatchedTokens: n * (1 + k), NumDecodeTokens: n * (1 + k), NumDraftTokens: n * k, DraftLimit: k}
	return &ScheduledStep{Outputs: out, Seqs: seqs}
}

// batchArrays reads a prepared step's batch back to the host.
func batchArrays(t *testing.T, ops kernels.Ops, p *PreparedStep) map[string][]int32 {
	t.Helper()
	got := map[string][]int32{}
	if p.FromRow != nil {
		v, err := kernels.ToI32(ops, p.FromRow)
		if err != nil {
			t.Fatal(err)
		}
		got["from_row"] = v
	}
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

// The prepare stage reuses its host arrays from layout to layout, and the
// metadata of a step laid out again in a ring: a step laid out after a
// larger one, and a step laid out before others, hold the same batch (and
// the relaid-out steps the same metadata) as each laid out by a fresh
// stage, nothing left over from the other layouts.
func TestPrepareReusesHostArrays(t *testing.T) {
	const k, bs = 2, 4
	ops := cpu.New(cpu.Options{Threads: 1})
	deps := PrepareDeps{Ops: ops, BlockSize: bs, NumBlocks: 4096, NumSpeculativeTokens: k, InFlight: 2}
	steps := []*ScheduledStep{
		decodeStep(5, 6, k, 30, bs, 0, true), // large first: the arrays grow
		decodeStep(6, 2, k, 3, bs, 1000, false),
		decodeStep(7, 4, k, 90, bs, 2000, true),
	}
	drafts := [][]int{{1, 0, 2, 2, 0, 1}, nil, {0, 2, 1, 0}}
	type laidOut struct {
		batch, relaid map[string][]int32
		seqs          []engine.SequenceMetadata
	}
	lay := func(p *prepare, i int) (laidOut, *PreparedStep, *PreparedStep) {
		prep, err := p.Process(context.Background(), steps[i])
		if err != nil {
			t.Fatal(err)
		}
		l := laidOut{batch: batchArrays(t, ops, prep)}
		if drafts[i] == nil {
			return l, prep, nil
		}
		re, err := prep.Relayout(drafts[i])
		if err != nil {
			t.Fatal(err)
		}
		l.relaid, l.seqs = batchArrays(t, ops, re), append([]engine.SequenceMetadata(nil), re.Seqs...)
		return l, prep, re
	}
	want := make([]laidOut, len(steps))
	for i := range steps {
		want[i], _, _ = lay(newPrepare(deps), i)
	}
	if got, full := len(want[0].relaid["ids"]), len(want[0].batch["ids"]); got != 6+6 || full != 6*(1+k) {
		t.Fatalf("step 5 has %d rows, %d after the relayout; want %d and %d", full, got, 6*(1+k), 12)
	}
	p := newPrepare(deps)
	var preps, relaid []*PreparedStep
	for i, s := range steps {
		got, prep, re := lay(p, i)
		preps, relaid = append(preps, prep), append(relaid, re)
		if !reflect.DeepEqual(got, want[i]) {
			t.Errorf("step %d laid out after %d others: %+v, want %+v", s.Outputs.StepID, i, got, want[i])
		}
	}
	// The three steps are in flight at once (three ring slots): laying out
	// the later ones left the first ones' batches and metadata as they were.
	for i := range steps {
		got := laidOut{batch: batchArrays(t, ops, preps[i])}
		if relaid[i] != nil {
			got.relaid, got.seqs = batchArrays(t, ops, relaid[i]), relaid[i].Seqs
		}
		if !reflect.DeepEqual(got, want[i]) {
			t.Errorf("step %d after the later layouts: %+v, want %+v", steps[i].Outputs.StepID, got, want[i])
		}
	}
}
