package stages

import (
	"context"
	"fmt"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// BenchmarkPrepareRelayout measures the host's share of a ZOS verify step
// of `seqs` shifted decodes with k = 6 placeholder drafts each over
// `blocks` KV blocks: the prepare stage's layout and upload (layout), and
// the same step laid out again with 3 drafts a sequence (relayout: the
// work TrimDrafts adds between the draft stage's publish and the forward
// pass). CPU backend, so the upload is a copy.
//
// Layouts reuse their host arrays (layoutScratch, HostBatch.Packed)
// instead of allocating them per step: predicted about half the time at
// 64 sequences, from the profile's share of allocation and GC. Measured on
// a 2-vCPU Zen 4 VM, old and new test binaries alternating, ns/op
// (allocations): 64 x 32 layout 62-70k (140) -> 35-38k (56), relayout
// 46-50k (142) -> 30-35k (58); 64 x 256 layout 252-294k -> 80-86k,
// relayout 211-218k -> 77-86k. The relaid-out steps' metadata in a ring
// of its own (trimSeqs) then took the 64 x 32 relayout from 21-22k to
// 18-19k ns (45 -> 24 KB a call).
func BenchmarkPrepareRelayout(b *testing.B) {
	const k, bs = 6, 16
	for _, c := range []struct{ seqs, blocks int }{{8, 32}, {64, 32}, {64, 256}} {
		numBlocks := c.seqs * c.blocks
		ops := cpu.New(cpu.Options{Threads: 1})
		p := newPrepare(PrepareDeps{Ops: ops, BlockSize: bs, NumBlocks: numBlocks, NumSpeculativeTokens: k, InFlight: 2})
		seqs := make([]engine.SequenceMetadata, c.seqs)
		for i := range seqs {
			pos := c.blocks*bs - 2*(k+1) // near the table's end
			ids, slots := make([]int, 1+k), make([]int, 1+k)
			table := make([]int, c.blocks)
			for j := range table {
				table[j] = i*c.blocks + j
			}
			for j := range ids {
				ids[j] = engine.PlaceholderToken
				slots[j] = table[(pos+j)/bs]*bs + (pos+j)%bs
			}
			seqs[i] = engine.SequenceMetadata{SeqID: engine.SeqID(i + 1), Shifted: true, InputFromRow: i, NumDrafts: k, SeqlenQ: 1 + k,
				SeqlenK: pos + 1 + k, PosStart: pos, InputTokenIDs: ids, SlotMapping: slots, BlockTable: table, Sample: true, SampleRow: i,
				PromptLogprobsFrom: -1, PromptLogprobsTo: -1}
		}
		out := &engine.SchedulerOutputs{StepID: 5, NumSeqs: c.seqs, NumDecodeSeqs: c.seqs, NumSampleRows: c.seqs,
			NumBatchedTokens: c.seqs * (1 + k), NumDecodeTokens: c.seqs * (1 + k), NumDraftTokens: c.seqs * k, DraftLimit: k}
		step := &ScheduledStep{Outputs: out, Seqs: seqs}
		drafts := make([]int, c.seqs)
		for i := range drafts {
			drafts[i] = 3
		}
		name := fmt.Sprintf("seqs%d/blocks%d", c.seqs, c.blocks)
		b.Run(name+"/layout", func(b *testing.B) {
			for b.Loop() {
				if _, err := p.Process(context.Background(), step); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/relayout", func(b *testing.B) {
			prep, err := p.Process(context.Background(), step)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				t, err := prep.Relayout(drafts)
				if err != nil {
					b.Fatal(err)
				}
				if t.Batch.NumTokens != c.seqs*4 {
					b.Fatalf("%d rows after the relayout, want %d", t.Batch.NumTokens, c.seqs*4)
				}
			}
		})
	}
}
