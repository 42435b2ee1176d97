package stages

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// The MTP drafter's passes replayed from captured graphs (padded to 4
// rows) give the output and greedy tokens of the eager passes bit for bit,
// for a pass over a step's rows and for a chained pass fed gathered rows.
func TestMTPGraphsMatchEager(t *testing.T) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	type side struct {
		p      *mtpDrafter
		fake   *fakeGraphOps
		hidden kernels.Tensor
	}
	prompt := []int32{5, 17, 300, 42, 7, 99, 1000, 23}
	build := func(graphs bool) side {
		c := cpu.New(cpu.Options{Threads: 1})
		t.Cleanup(func() { c.Close() })
		var ops kernels.Ops = c
		var fake *fakeGraphOps
		if graphs {
			fake = &fakeGraphOps{Ops: c}
			ops = fake
		}
		m, err := models.Builtin().Load(ops, dir, models.Options{MaxModelLen: 64})
		if err != nil {
			t.Fatal(err)
		}
		cache, err := m.NewKVCache(32, 4)
		if err != nil {
			t.Fatal(err)
		}
		mcache, err := m.MTP().NewKVCache(32, 4)
		if err != nil {
			t.Fatal(err)
		}
		d := DraftDeps{Ops: ops, Model: m, BlockSize: 4, NumBlocks: 32, MaxModelLen: 64,
			Speculative: Speculative{NumSpeculativeTokens: 2, DraftCache: mcache},
			CUDAGraph:   CUDAGraph{Enabled: graphs, BatchSizes: []int{4}}}
		p, err := newMTPDrafter(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		// The prompt through the target, then the MTP layer over it
		// (eager: 8 tokens of one sequence).
		h := &models.HostBatch{BlockSize: 4}
		h.AddSequence(prompt, 0, []int32{3, 9, 4, 11})
		b, err := h.Upload(ops, 32)
		if err != nil {
			t.Fatal(err)
		}
		hidden, err := m.Forward(context.Background(), cache, b)
		if err != nil {
			t.Fatal(err)
		}
		next := append(slices.Clone(prompt[1:]), 77)
		if b.InputIDs, err = kernels.FromI32(ops, next, len(next)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := runMTP(p, b, hidden, nil, []int32{7}); err != nil {
			t.Fatal(err)
		}
		return side{p: p, fake: fake, hidden: hidden}
	}
	eager, graphed := build(false), build(true)
	// Three one-token rows of the sequence (positions 8, 9, 10, as a
	// verify step lays them out), then a chained pass of two rows fed
	// rows 2 and 0 of the first pass's output.
	pass := func(s side, ids []int32, pos int, hidden kernels.Tensor, rows []int32) (kernels.Tensor, []int) {
		t.Helper()
		h := &models.HostBatch{BlockSize: 4}
		for i, id := range ids {
			h.AddSequence([]int32{id}, pos+i, []int32{3, 9, 4, 11})
		}
		b, err := h.Upload(s.p.d.Ops, 32)
		if err != nil {
			t.Fatal(err)
		}
		at := make([]int32, len(ids))
		for i := range at {
			at[i] = int32(i)
		}
		out, tokens, err := runMTP(s.p, b, hidden, rows, at)
		if err != nil {
			t.Fatal(err)
		}
		return out, tokens
	}
	var outs [2][]float32
	var toks [2][]int
	for i, s := range []side{eager, graphed} {
		out, tokens := pass(s, []int32{77, 12, 13}, 8, s.hidden, []int32{7, 6, 5})
		out2, tokens2 := pass(s, []int32{31, 32}, 11, out, []int32{2, 0})
		a, err := kernels.ToF32(s.p.d.Ops, out2)
		if err != nil {
			t.Fatal(err)
		}
		outs[i] = a[:2*s.p.d.Model.Config().HiddenSize]
		toks[i] = append(tokens, tokens2...)
	}
	if !slices.Equal(toks[0], toks[1]) {
		t.Errorf("tokens eager %v, graphs %v", toks[0], toks[1])
	}
	for i := range outs[0] {
		if math.Float32bits(outs[0][i]) != math.Float32bits(outs[1][i]) {
			t.Fatalf("output[%d] = %v with graphs, %v eager", i, outs[1][i], outs[0][i])
		}
	}
	if graphed.fake.replays != 2 {
		t.Errorf("%d replays, want 2", graphed.fake.replays)
	}
}

// The device sampler takes the drafters' greedy row as it is.
func TestGreedyRowIsValid(t *testing.T) {
	row := greedyRow()
	if err := row.Check(8192, nil); err != nil {
		t.Fatal(err)
	}
}

// runMTP runs one MTP pass and brings its greedy tokens at rows at to the
// host.
func runMTP(p *mtpDrafter, b *models.ForwardBatch, hidden kernels.Tensor, hiddenRows, at []int32) (kernels.Tensor, []int, error) {
	ops := p.d.Ops
	atT, err := kernels.FromI32(ops, at, len(at))
	if err != nil {
		return nil, nil, err
	}
	dst, err := ops.Alloc(kernels.I32, len(at))
	if err != nil {
		return nil, nil, err
	}
	out, err := p.run(context.Background(), b, hidden, hiddenRows, atT, dst)
	if err != nil {
		return nil, nil, err
	}
	got, err := kernels.ToI32(ops, dst)
	if err != nil {
		return nil, nil, err
	}
	tokens := make([]int, len(got))
	for i, x := range got {
		tokens[i] = int(x)
	}
	return out, tokens, nil
}
