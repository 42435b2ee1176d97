package main

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

func TestDecodeBytesPerToken(t *testing.T) {
	// Untied: one row of the 1000-row embedding, everything else whole.
	untied := []gguf.TensorInfo{
		{Name: "token_embd.weight", Dims: []int64{64, 1000}, Size: 64000},
		{Name: "blk.0.attn_q.weight", Dims: []int64{64, 64}, Size: 4096},
		{Name: "output_norm.weight", Dims: []int64{64}, Size: 256},
		{Name: "output.weight", Dims: []int64{64, 1000}, Size: 64000},
	}
	if got, want := decodeBytesPerToken(untied), int64(64+4096+256+64000); got != want {
		t.Errorf("untied: %d bytes, want %d", got, want)
	}
	// Tied: the embedding is the LM head, read whole.
	if got, want := decodeBytesPerToken(untied[:3]), int64(64000+4096+256); got != want {
		t.Errorf("tied: %d bytes, want %d", got, want)
	}
}

func TestRooflineShare(t *testing.T) {
	// 100 MB a token at 10 GB/s: 100 tok/s is the roof, 80 tok/s is 80%.
	if got := rooflineShare(80, 100e6, 10e9); math.Abs(got-0.8) > 1e-12 {
		t.Errorf("share = %v, want 0.8", got)
	}
	if got := rooflineShare(80, 0, 10e9); got != 0 {
		t.Errorf("share without bytes = %v, want 0", got)
	}
}

func TestWriteTable(t *testing.T) {
	fs := []formatRuns{{
		typ: "q8_0", bytesPerToken: 100e6,
		peer: side{name: "llama.cpp", kvBytes: 100e6, runs: []runResult{
			{IDs: []int32{1, 2, 3}, PrefillTokS: 100, DecodeTokS: 40, ReadBps: 10e9},
			{PrefillTokS: 300, DecodeTokS: 60, ReadBps: 10e9},
			{PrefillTokS: 200, DecodeTokS: 50, ReadBps: 5e9},
		}},
		engines: []side{{name: "engine", runs: []runResult{
			{IDs: []int32{1, 2, 4}, PrefillTokS: 240, DecodeTokS: 75, Format: "Q8_0", ReadBps: 15e9},
		}}},
	}}
	var buf bytes.Buffer
	writeTable(&buf, fs, 10e9, 20e9, 3)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("table:\n%s", buf.String())
	}
	// llama.cpp: medians 200 and 50; 50 tok/s of a 100 tok/s copy roof, of
	// a 200 tok/s read roof, of a 100 tok/s read roof with its 100 MB of
	// K/V a token; its runs' own probes put them at 40%, 60% and 100% of
	// their read roofs (100, 100 and 50 tok/s): median 60%.
	if f := strings.Fields(lines[1]); strings.Join(f, " ") != "q8_0 llama.cpp 200.0 50.00 50% 25% 50% 60%" {
		t.Errorf("llama.cpp row %q", lines[1])
	}
	// The engine: 1.2x the prefill, 1.5x the decode, half of its own read
	// roof (150 tok/s at 15 GB/s), 2 of 3 tokens agreed.
	if f := strings.Fields(lines[2]); strings.Join(f, " ") != "q8_0 engine 240.0 1.20 75.00 1.50 75% 38% 38% 50% 2/3 Q8_0" {
		t.Errorf("engine row %q", lines[2])
	}
}

func TestKVBytesPerToken(t *testing.T) {
	// 2 layers, 2 K/V heads of 8: 2*2*2*8 = 64 values a key; after a
	// 10-token prompt, 4 decode tokens attend 10+2 keys on average.
	m := kvShape{Layers: 2, KVHeads: 2, HeadDim: 8}
	if got, want := kvBytesPerToken(m, 10, 4, 4), int64(64*4*12); got != want {
		t.Errorf("f32: %d bytes, want %d", got, want)
	}
	// head_dim and num_key_value_heads absent: hidden/heads, and heads.
	m = kvShape{Layers: 1, Heads: 4, Hidden: 64}
	if got, want := kvBytesPerToken(m, 3, 2, 2), int64(2*4*16*2*4); got != want {
		t.Errorf("defaults: %d bytes, want %d", got, want)
	}
	for _, c := range []struct {
		kv   string
		def  int
		want int
	}{{"auto", 4, 4}, {"", 2, 2}, {"f32", 2, 4}, {"f16", 4, 2}, {"fp8", 4, 1}} {
		if got := kvElemBytes(c.kv, c.def); got != c.want {
			t.Errorf("kvElemBytes(%q, %d) = %d, want %d", c.kv, c.def, got, c.want)
		}
	}
}
