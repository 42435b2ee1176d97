package ggufwrite

import (
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
)

// TestPick: each preset's type for a tensor, as llama.cpp's quantizer
// picks it (the cases the presets differ in), with the fallbacks for rows
// that are not whole blocks.
func TestPick(t *testing.T) {
	const layers = 4 // UseMoreBits(i, 4): layer 3 only
	sq := []int64{256, 256}
	for _, tc := range []struct {
		preset, name string
		dims         []int64
		experts      int
		want         gguf.GGMLType
	}{
		{"f32", "blk.0.attn_q.weight", sq, 0, gguf.TypeF32},
		{"f16", "blk.0.attn_q.weight", sq, 0, gguf.TypeF16},
		{"f16", "blk.0.attn_norm.weight", []int64{256}, 0, gguf.TypeF32},
		{"bf16", "output.weight", sq, 0, gguf.TypeBF16},
		{"q8_0", "output.weight", sq, 0, gguf.TypeQ8_0},
		{"q4_0", "blk.0.ffn_down.weight", sq, 0, gguf.TypeQ4_0},
		{"q4_0", "token_embd.weight", sq, 0, gguf.TypeQ4_0},
		{"q4_0", "output.weight", sq, 0, gguf.TypeQ6_K},
		{"q4_0", "output.weight", []int64{96, 256}, 0, gguf.TypeQ8_0}, // rows no whole 256-blocks
		{"q4_0", "blk.0.attn_v.weight", sq, 8, gguf.TypeQ8_0},
		{"q4_0", "blk.0.attn_k.weight", sq, 8, gguf.TypeQ8_0},
		{"q4_0", "blk.0.attn_k.weight", sq, 0, gguf.TypeQ4_0},
		{"q4_0", "blk.0.ffn_gate_inp.weight", []int64{256, 8}, 8, gguf.TypeF32},
		{"q4_k_m", "blk.0.ffn_down.weight", sq, 0, gguf.TypeQ4_K},
		{"q4_k_m", "blk.3.ffn_down.weight", sq, 0, gguf.TypeQ6_K},
		{"q4_k_m", "blk.0.attn_output.weight", sq, 8, gguf.TypeQ5_K},
		{"q5_k_m", "blk.0.attn_q.weight", sq, 0, gguf.TypeQ5_K},
		{"q5_k_m", "blk.0.ffn_down.weight", sq, 0, gguf.TypeQ5_K},
		{"q5_k_m", "blk.3.ffn_down.weight", sq, 0, gguf.TypeQ6_K},
		{"q5_k_m", "blk.3.attn_v.weight", sq, 0, gguf.TypeQ6_K},
		{"q5_k_m", "blk.0.attn_v.weight", sq, 8, gguf.TypeQ8_0},
		{"q5_k_m", "blk.0.attn_output.weight", sq, 8, gguf.TypeQ5_K},
		{"q5_k_m", "output.weight", sq, 0, gguf.TypeQ6_K},
		{"q5_k_m", "blk.0.attn_q.weight", []int64{96, 256}, 0, gguf.TypeQ8_0},
		{"q5_k_m", "blk.0.attn_q.weight", []int64{40, 256}, 0, gguf.TypeF32}, // rows no whole 32-blocks
	} {
		if got := Pick(tc.preset, tc.name, tc.dims, layers, tc.experts); got != tc.want {
			t.Errorf("Pick(%s, %s, %v, %d experts) = %v, want %v", tc.preset, tc.name, tc.dims, tc.experts, got, tc.want)
		}
	}
}
