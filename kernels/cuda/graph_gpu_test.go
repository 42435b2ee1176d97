package cuda

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// graphTestLlama is a small random-weight Llama (float32 weights) for the
// graph tests.
var graphTestLlama = random.Llama{Vocab: 512, Hidden: 256, Intermediate: 512, Layers: 3, Heads: 8, KVHeads: 2,
	HeadDim: 32, MaxPositions: 1024, BOS: 1, EOS: 2}

// A captured decode step over a padded batch (three sequences and one
// padding row: slot -1, one key in block 0) replays to the logits of the
// same batch run eagerly, bit for bit.
func TestGPUGraphDecodeStep(t *testing.T) {
	g := newGPU(t, GEMMRound)
	dir := t.TempDir()
	if err := random.WriteLlama(dir, graphTestLlama, 5); err != nil {
		t.Fatal(err)
	}
	m, err := models.Builtin().Load(g, dir, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const blockSize = 16
	cache, err := m.NewKVCache(64, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(8, 9))
	tables := [][]int32{{10, 11, 12, 13}, {20, 21, 22, 23}, {30, 31, 32, 33}}
	lens := []int{20, 33, 7}
	h := models.HostBatch{BlockSize: blockSize}
	for s, n := range lens {
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32(3 + r.IntN(graphTestLlama.Vocab-3))
		}
		h.AddSequence(ids, 0, tables[s])
	}
	fb, err := h.Upload(g, cache.NumBlocks)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Forward(context.Background(), cache, fb); err != nil {
		t.Fatal(err)
	}
	// The padded decode batch, laid out as the forward stage does.
	const size, width = 4, 8
	ids := []int32{17, 18, 19, 0}
	pos := []int32{int32(lens[0]), int32(lens[1]), int32(lens[2]), 0}
	seqlensK := []int32{pos[0] + 1, pos[1] + 1, pos[2] + 1, 1}
	slots := make([]int32, size)
	bt := make([]int32, size*width)
	for i := range bt {
		bt[i] = -1
	}
	for s := range 3 {
		copy(bt[s*width:], tables[s])
		slots[s] = tables[s][pos[s]/blockSize]*blockSize + pos[s]%blockSize
	}
	bt[3*width] = 0
	slots[3] = -1
	up := func(xs []int32, shape ...int) kernels.Tensor {
		return upload(t, g, kernels.I32, kernels.I32Bytes(xs), kernels.I32, shape...)
	}
	batch := &models.ForwardBatch{NumTokens: size, InputIDs: up(ids, size), Positions: up(pos, size),
		Attn: kernels.AttentionMetadata{NumSeqs: size, NumTokens: size, MaxSeqlenQ: 1, BlockSize: blockSize,
			CuSeqlensQ: up([]int32{0, 1, 2, 3, 4}, size+1), SeqlensK: up(seqlensK, size),
			BlockTables: up(bt, size, width), SlotMapping: up(slots, size)}}
	step := func() (kernels.Tensor, error) {
		hidden, err := m.Forward(context.Background(), cache, batch)
		if err != nil {
			return nil, err
		}
		return m.ComputeLogits(hidden, nil)
	}
	lg, err := step()
	if err != nil {
		t.Fatal(err)
	}
	eager, err := kernels.ToF32(g, lg)
	if err != nil {
		t.Fatal(err)
	}
	var captured kernels.Tensor
	graph, err := g.CaptureGraph(func() error {
		var err error
		captured, err = step()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	for round := range 2 {
		if err := graph.Replay(); err != nil {
			t.Fatal(err)
		}
		replayed, err := kernels.ToF32(g, captured)
		if err != nil {
			t.Fatal(err)
		}
		for i := range eager {
			if math.Float32bits(eager[i]) != math.Float32bits(replayed[i]) {
				t.Fatalf("round %d: logit %d replayed %v, eager %v", round, i, replayed[i], eager[i])
			}
		}
	}
	t.Logf("graph replay of a padded decode batch: %d logits bit-identical to eager", len(eager))
}
