package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// graphTestLlama is a small random-weight Llama (float32 weights) for the
// graph tests.
var graphTestLlama = random.Llama{Vocab: 512, Hidden: 256, Intermediate: 512, Layers: 3, Heads: 8, KVHeads: 2,
	HeadDim: 32, MaxPositions: 1024, BOS: 1, EOS: 2}

// A captured decode step over a padded batch (three sequences and padding
// rows: slot -1, one key in block 0; 4 and 96 rows) replays to the logits
// of the same batch run eagerly, bit for bit.
func TestGPUGraphDecodeStep(t *testing.T) {
	g := newGPU(t, GEMMRound)
	dir := t.TempDir()
	if err := random.WriteLlama(dir, graphTestLlama, 5); err != nil {
		t.Fatal(err)
	}
	f32, err := models.Builtin().Load(g, dir, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The same shape with BF16 weights: half caches, tensor-core attention,
	// and from 64 rows the MLP's 16-bit intermediates.
	cfg, err := weights.ParseConfig([]byte(`{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
		"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
		"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 1024,
		"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false, "hidden_act": "silu"}`))
	if err != nil {
		t.Fatal(err)
	}
	bf16, err := models.Builtin().New(g, cfg, fastLlamaWeights(cfg), models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]models.Model{"float32 weights": f32, "bf16 weights": bf16} {
		t.Run(name, func(t *testing.T) { checkGraphReplay(t, g, m) })
	}
}

// checkGraphReplay prefills three sequences on m, then captures decode
// steps over padded batches and compares each replay with the eager step.
func checkGraphReplay(t *testing.T, g *Backend, m models.Model) {
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
	// Padded decode batches, laid out as the forward stage does: the three
	// sequences, then padding rows (slot -1, one key in block 0). At 96 rows
	// the linears run on cuBLAS and the MLP keeps 16-bit intermediates.
	for _, size := range []int{4, 96} {
		const width = 8
		ids, pos, seqlensK, slots := make([]int32, size), make([]int32, size), make([]int32, size), make([]int32, size)
		cuQ := make([]int32, size+1)
		bt := make([]int32, size*width)
		for i := range bt {
			bt[i] = -1
		}
		for row := range size {
			cuQ[row+1] = int32(row + 1)
			seqlensK[row], slots[row], bt[row*width] = 1, -1, 0
			if row < len(lens) {
				ids[row], pos[row], seqlensK[row] = int32(17+row), int32(lens[row]), int32(lens[row]+1)
				copy(bt[row*width:], tables[row])
				slots[row] = tables[row][lens[row]/blockSize]*blockSize + int32(lens[row]%blockSize)
			}
		}
		up := func(xs []int32, shape ...int) kernels.Tensor {
			return upload(t, g, kernels.I32, kernels.I32Bytes(xs), kernels.I32, shape...)
		}
		batch := &models.ForwardBatch{NumTokens: size, InputIDs: up(ids, size), Positions: up(pos, size),
			Attn: kernels.AttentionMetadata{NumSeqs: size, NumTokens: size, MaxSeqlenQ: 1, BlockSize: blockSize,
				CuSeqlensQ: up(cuQ, size+1), SeqlensK: up(seqlensK, size),
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
					t.Fatalf("%d rows, round %d: logit %d replayed %v, eager %v", size, round, i, replayed[i], eager[i])
				}
			}
		}
		graph.Close()
		t.Logf("graph replay of a padded decode batch of %d rows: %d logits bit-identical to eager", size, len(eager))
	}
}

// CopyRects copies each pair as CopyRect does, in one launch: 4-byte
// words (I32 rectangles into wider ones, a flat range into the middle of
// an array, as the decode graphs' padding) and bytes (a BF16 rectangle of
// odd width), eagerly and captured; it checks the pair count, shapes and
// dtypes.
func TestGPUCopyRects(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(3, 4))
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	// build uploads the pairs and returns them with, per pair, the array to
	// read back and the bytes it must hold.
	build := func() (dsts, srcs, reads []kernels.Tensor, want [][]byte) {
		for _, c := range []struct {
			dt         kernels.DType
			dr, dc     int
			sr, sc, es int
		}{{kernels.I32, 4, 9, 3, 5, 4}, {kernels.I32, 1, 64, 1, 17, 4}, {kernels.I32, 7, 33, 7, 33, 4}, {kernels.BF16, 5, 11, 3, 7, 2}} {
			dh, sh := randBytes(c.dr*c.dc*c.es), randBytes(c.sr*c.sc*c.es)
			d := upload(t, g, c.dt, dh, c.dt, c.dr, c.dc)
			dsts, srcs, reads = append(dsts, d), append(srcs, upload(t, g, c.dt, sh, c.dt, c.sr, c.sc)), append(reads, d)
			w := append([]byte(nil), dh...)
			for i := range c.sr {
				copy(w[i*c.dc*c.es:], sh[i*c.sc*c.es:(i+1)*c.sc*c.es])
			}
			want = append(want, w)
		}
		flatHost, srcHost := randBytes(40*4), randBytes(16*4)
		flat := upload(t, g, kernels.I32, flatHost, kernels.I32, 40)
		mid, err := g.Rows(flat, 13, 29)
		if err == nil {
			mid, err = g.Reshape(mid, 1, 16)
		}
		if err != nil {
			t.Fatal(err)
		}
		dsts, srcs, reads = append(dsts, mid), append(srcs, upload(t, g, kernels.I32, srcHost, kernels.I32, 1, 16)), append(reads, flat)
		w := append([]byte(nil), flatHost...)
		copy(w[13*4:], srcHost)
		return dsts, srcs, reads, append(want, w)
	}
	check := func(name string, reads []kernels.Tensor, want [][]byte) {
		t.Helper()
		for i, d := range reads {
			got := make([]byte, len(want[i]))
			if err := g.Download(got, d); err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want[i]) {
				t.Errorf("%s: pair %d: the destination differs from CopyRect's", name, i)
			}
		}
	}
	dsts, srcs, reads, want := build()
	if err := g.CopyRects(dsts, srcs); err != nil {
		t.Fatal(err)
	}
	check("eager", reads, want)

	dsts, srcs, reads, want = build()
	graph, err := g.CaptureGraph(func() error { return g.CopyRects(dsts, srcs) })
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	if err := graph.Replay(); err != nil {
		t.Fatal(err)
	}
	check("captured", reads, want)

	a := upload(t, g, kernels.I32, randBytes(32), kernels.I32, 2, 4)
	wide := upload(t, g, kernels.I32, randBytes(40), kernels.I32, 2, 5)
	f := upload(t, g, kernels.F32, randBytes(32), kernels.F32, 2, 4)
	many := make([]kernels.Tensor, MaxRects+1)
	for i := range many {
		many[i] = a
	}
	for name, c := range map[string][2][]kernels.Tensor{
		"more pairs than MaxRects": {many, many},
		"fewer sources":            {{a, a}, {a}},
		"source wider":             {{a}, {wide}},
		"dtypes differ":            {{a}, {f}},
	} {
		if err := g.CopyRects(c[0], c[1]); !errors.Is(err, kernels.ErrShape) {
			t.Errorf("%s: %v, want ErrShape", name, err)
		}
	}
}

// Options.FillUninitialized: an allocation without a memset (AllocEmpty,
// a fresh block or one back from the cache) holds 0xFF bytes, NaN as
// float32; Alloc still zeroes. Without the option a cached block keeps
// what its last owner wrote, which is what the option is there to expose.
func TestGPUFillUninitialized(t *testing.T) {
	g := newGPUOpts(t, Options{FillUninitialized: true})
	const n = 3000
	ones := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(ones[4*i:], math.Float32bits(1))
	}
	check := func(what string, x kernels.Tensor, want byte) {
		t.Helper()
		got := make([]byte, 4*n)
		if err := g.Download(got, x); err != nil {
			t.Fatal(err)
		}
		for i, b := range got {
			if b != want {
				t.Fatalf("%s: byte %d is %#x, want %#x", what, i, b, want)
			}
		}
	}
	for round := range 3 {
		// The previous round's blocks are back in the cache by now (the
		// cleanups ran after the collection), written with ones.
		x, err := g.AllocEmpty(kernels.F32, n)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("round %d: AllocEmpty", round), x, 0xFF)
		z, err := g.Alloc(kernels.F32, n)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("round %d: Alloc", round), z, 0)
		for _, y := range []kernels.Tensor{x, z} {
			if err := g.Upload(y, ones, kernels.F32); err != nil {
				t.Fatal(err)
			}
		}
		x, z = nil, nil
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
}
