package llm

import (
	"strings"
	"testing"
)

// TestWindowKVFigures: with rings the sliding layers hold window tokens a
// sequence, so a sequence's KV memory grows only with the full layers; the
// plan for the sequences that fit holds them all, and rings fit more 8k
// sequences on the device than full paged KV, by the ratio of the
// per-sequence bytes.
func TestWindowKVFigures(t *testing.T) {
	const blockSize = 16
	figs := WindowKVFigures(WindowModelShapes, H200Bytes, blockSize)
	if len(figs) != 2*len(WindowModelShapes) {
		t.Fatalf("%d figures", len(figs))
	}
	for i := 0; i < len(figs); i += 2 {
		ring, paged, s := figs[i], figs[i+1], WindowModelShapes[i/2]
		perTok := 2 * s.KVWidth * 2 // K and V in BF16
		full := s.Layers - s.SlidingLayers
		if want := full*8192*perTok + s.SlidingLayers*s.Window*perTok; ring.Bytes8K != want {
			t.Errorf("%s rings at 8k: %d bytes, want %d", s.Name, ring.Bytes8K, want)
		}
		if want := s.Layers * 32768 * perTok; paged.Bytes32K != want {
			t.Errorf("%s paged at 32k: %d bytes, want %d", s.Name, paged.Bytes32K, want)
		}
		// 8k -> 32k: paged grows 4x, rings only in their full layers.
		if got, want := ring.Bytes32K-ring.Bytes8K, full*(32768-8192)*perTok; got != want {
			t.Errorf("%s rings: 8k -> 32k adds %d bytes, want %d", s.Name, got, want)
		}
		for _, f := range []KVFigure{ring, paged} {
			if f.PlanAdmits8 != f.Fit8K || f.Fit8K < 1 {
				t.Errorf("%s rings=%v: plan %+v admits %d 8k sequences, %d fit", f.Model, f.Rings, f.Plan, f.PlanAdmits8, f.Fit8K)
			}
			if used := float64(f.Plan.KVBlocks)*float64(f.Plan.BlockBytes) + float64(f.Plan.StateSlots)*float64(f.Plan.StateSlotBytes); used > f.Budget {
				t.Errorf("%s rings=%v: plan uses %.0f of %.0f bytes", f.Model, f.Rings, used, f.Budget)
			}
		}
		ratio := float64(paged.Bytes8K) / float64(ring.Bytes8K)
		if got := float64(ring.Fit8K) / float64(paged.Fit8K); got < 0.99*ratio || ring.Fit8K <= paged.Fit8K {
			t.Errorf("%s: rings fit %d, paged %d (%.2fx), bytes ratio %.2fx", s.Name, ring.Fit8K, paged.Fit8K, got, ratio)
		}
	}
	var b strings.Builder
	PrintWindowKVFigures(&b, figs)
	t.Log("\n" + b.String())
	if !strings.Contains(b.String(), "gpt-oss-20B") {
		t.Error("table lacks gpt-oss-20B")
	}
}
