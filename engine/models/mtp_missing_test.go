package models

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// A checkpoint whose config.json announces MTP layers that it does not
// hold (what transformers writes) loads without MTP, with one warning, and
// its main model computes what the full checkpoint's does; a checkpoint
// holding part of an MTP layer is still an error.
func TestCheckpointWithoutMTPLayers(t *testing.T) {
	ops := newBackend(t, 1)
	cfg, full := tinyWeights(t, "deepseek-v3", kernels.F32, 7)
	mtpPrefix := "model.layers.2." // num_hidden_layers is 2: the MTP layer comes next
	stripped := MemWeights{}
	for name, w := range full {
		if !strings.HasPrefix(name, mtpPrefix) {
			stripped[name] = w
		}
	}
	if len(stripped) == len(full) {
		t.Fatal("the fixture has no MTP tensors to strip")
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	m, err := Builtin().New(ops, cfg, stripped, Options{MaxModelLen: testMaxLen, Logger: logger})
	if err != nil {
		t.Fatalf("loading a checkpoint without MTP tensors: %v", err)
	}
	if m.MTP() != nil {
		t.Error("MTP layers made up for a checkpoint that holds none")
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "no MTP layers") {
		t.Errorf("warnings %q: want exactly one about the missing MTP layers", logs.String())
	}
	withMTP, err := Builtin().New(ops, cfg, full, Options{MaxModelLen: testMaxLen, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if withMTP.MTP() == nil {
		t.Fatal("the full checkpoint lost its MTP layers")
	}
	ids := []int32{1, 5, 9, 3, 7}
	logits := func(m Model) []float32 {
		table := newBlockPool(rand.New(rand.NewPCG(1, 2)), 4).table(4, len(ids))
		rows, _ := step(t, m, mustCache(t, m), seqStep{ids: ids, table: table})
		return rows[len(rows)-1]
	}
	if a, b := logits(m), logits(withMTP); !sameBits(a, b) {
		t.Fatal("the main model's logits differ without the MTP tensors")
	}

	partial := MemWeights{}
	for name, w := range full {
		if name != mtpPrefix+"eh_proj.weight" {
			partial[name] = w
		}
	}
	if _, err := Builtin().New(ops, cfg, partial, Options{MaxModelLen: testMaxLen, Logger: logger}); err == nil || !strings.Contains(err.Error(), "eh_proj") {
		t.Errorf("a checkpoint missing one MTP tensor: %v, want an error naming it", err)
	}
}

// DeepSeek's checkpoints store the MTP layer's embed_tokens and
// shared_head.head as copies of the model's: a copy with the same bytes is
// served by the model's loaded tensor, one that differs by a byte is loaded
// as its own.
func TestMTPSharesStoredCopies(t *testing.T) {
	ops := newBackend(t, 1)
	cfg, w := tinyWeights(t, "deepseek-v3", kernels.F32, 7)
	copyOf := func(name string) weights.Tensor {
		c := w[name]
		c.Data = bytes.Clone(c.Data)
		return c
	}
	const mtpPrefix = "model.layers.2."
	w[mtpPrefix+"embed_tokens.weight"] = copyOf("model.embed_tokens.weight")
	w[mtpPrefix+"shared_head.head.weight"] = copyOf("lm_head.weight")
	load := func() (*deepseek, *mtpLayer) {
		m, err := Builtin().New(ops, cfg, w, Options{MaxModelLen: testMaxLen})
		if err != nil {
			t.Fatal(err)
		}
		ds := m.(*deepseek)
		if ds.MTP() == nil || len(ds.MTP().layers) != 1 {
			t.Fatal("no MTP layer loaded")
		}
		return ds, &ds.MTP().layers[0]
	}
	ds, ly := load()
	if ly.embed != ds.embed || ly.head != ds.lmHead {
		t.Error("the MTP layer loaded its own copies of the model's embedding and head")
	}
	head := copyOf("lm_head.weight")
	head.Data[len(head.Data)-1] ^= 1
	w[mtpPrefix+"shared_head.head.weight"] = head
	ds, ly = load()
	if ly.head == ds.lmHead || ly.embed != ds.embed {
		t.Error("a head differing by one byte is served by the model's, or the equal embedding is not shared")
	}
}
