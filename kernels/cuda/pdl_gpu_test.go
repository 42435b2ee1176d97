package cuda

import (
	"context"
	"math"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// pdlTestConfig is a small BF16 Llama whose decode step takes the GEMV, the
// fused q/k/v preparation and the tensor-core decode attention.
const pdlTestConfig = `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 3000,
	"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 3, "num_attention_heads": 8,
	"num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
	"rope_theta": 10000.0, "tie_word_embeddings": false, "hidden_act": "silu"}`

// decodeLogits loads pdlTestConfig on a backend opened with opts,
// prefills a 300-token prompt, and returns the logits of one batch-1
// decode step run eagerly and replayed twice from a captured graph.
func decodeLogits(t *testing.T, opts Options) (eager []float32, replays [][]float32) {
	t.Helper()
	g := newGPUOpts(t, opts)
	cfg, err := weights.ParseConfig([]byte(pdlTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.Builtin().New(g, cfg, fastLlamaWeights(cfg), models.Options{MaxModelLen: 4096})
	if err != nil {
		t.Fatal(err)
	}
	const blockSize, prompt = 16, 300
	cache, err := m.NewKVCache(64, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	table := make([]int32, 32) // a table wider than the context: several key chunks, some empty
	for i := range table {
		table[i] = int32(i)
	}
	ids := make([]int32, prompt)
	for i := range ids {
		ids[i] = int32(3 + (i*37)%2900)
	}
	upload := func(ids []int32, cached int) *models.ForwardBatch {
		h := models.HostBatch{BlockSize: blockSize}
		h.AddSequence(ids, cached, table)
		fb, err := h.Upload(g, cache.NumBlocks)
		if err != nil {
			t.Fatal(err)
		}
		return fb
	}
	forward := func(fb *models.ForwardBatch) (kernels.Tensor, error) {
		hidden, err := m.Forward(context.Background(), cache, fb)
		if err != nil {
			return nil, err
		}
		return m.ComputeLogits(hidden, nil)
	}
	if _, err := forward(upload(ids, 0)); err != nil {
		t.Fatal(err)
	}
	step := upload([]int32{42}, prompt) // uploaded once: a capture cannot upload
	lg, err := forward(step)
	if err != nil {
		t.Fatal(err)
	}
	if eager, err = kernels.ToF32(g, lg); err != nil {
		t.Fatal(err)
	}
	var captured kernels.Tensor
	graph, err := g.CaptureGraph(func() error {
		var err error
		captured, err = forward(step)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	for range 2 {
		if err := graph.Replay(); err != nil {
			t.Fatal(err)
		}
		v, err := kernels.ToF32(g, captured)
		if err != nil {
			t.Fatal(err)
		}
		replays = append(replays, v)
	}
	return eager, replays
}

// Programmatic dependent launch (on unless Options.DisablePDL) changes
// when kernels are scheduled, not what they compute: a BF16 decode step gives
// the same logits with it on and off, eagerly and replayed from a graph.
func TestGPUPDL(t *testing.T) {
	want, _ := decodeLogits(t, Options{DisablePDL: true})
	eager, replays := decodeLogits(t, Options{})
	for name, got := range map[string][]float32{"eager": eager, "replay 1": replays[0], "replay 2": replays[1]} {
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s with PDL: logit %d = %v, without %v", name, i, got[i], want[i])
			}
		}
	}
	t.Logf("PDL on and off: %d logits bit-identical (eager and two graph replays)", len(want))
}
