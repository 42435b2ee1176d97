package models

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// A checkpoint whose config.json announces MTP layers that it does not
// hold (what transformers writes) loads without MTP, with one warning, and
// its main model computes what the full checkpoint's does; a checkpoint
// holding part of an MTP layer is still an error.
func TestCheckpointWithoutMTPLayers(t *testing.T) {
	ops := newBackend(t, 1)
	cfg := parseConfig(t, tinyConfigs["deepseek-v3"])
	full, err := RandomWeights(cfg, kernels.F32, 7)
	if err != nil {
		t.Fatal(err)
	}
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
