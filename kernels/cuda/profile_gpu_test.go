package cuda

import (
	"math"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// With the profile on every eager operation is timed under its name
// (linears by shape and row class); operations recorded into a graph are
// not; the reset empties the totals. Without it there is no profile.
func TestGPUOpProfile(t *testing.T) {
	t.Setenv(profileEnv, "")
	if prof, err := newGPU(t, GEMMRound).OpProfile(false); prof != nil || err != nil {
		t.Fatalf("profile while off: %v, %v", prof, err)
	}
	g := newGPUOpts(t, Options{profile: true})
	x, err := kernels.FromF32(g, make([]float32, 3*64), 3, 64)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kernels.FromF32(g, make([]float32, 32*64), 32, 64)
	if err != nil {
		t.Fatal(err)
	}
	norm, err := kernels.FromF32(g, make([]float32, 64), 64)
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.Alloc(kernels.F32, 3, 32)
	if err != nil {
		t.Fatal(err)
	}
	const calls = 700 // more than one batch of events
	for range calls {
		if err := g.RMSNorm(x, x, norm, 1e-6); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Linear(out, x, w, nil); err != nil {
		t.Fatal(err)
	}
	graph, err := g.CaptureGraph(func() error { return g.RMSNorm(x, x, norm, 1e-6) })
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	if err := graph.Replay(); err != nil {
		t.Fatal(err)
	}
	prof, err := g.OpProfile(true)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]OpTime{}
	for _, p := range prof {
		got[p.Op] = p
	}
	if n := got["rms_norm"].Calls; n != calls {
		t.Errorf("rms_norm: %d calls, want %d (the captured one not counted)", n, calls)
	}
	if got["rms_norm"].Millis <= 0 {
		t.Errorf("rms_norm: %v ms", got["rms_norm"].Millis)
	}
	if n := got["linear 32x64 m<=4"].Calls; n != 1 {
		t.Errorf("linear: %d calls, want 1; profile %v", n, prof)
	}
	lines := FormatOpProfile(prof, 1)
	if len(lines) != 1 || !strings.HasPrefix(lines[0], prof[0].Op) {
		t.Errorf("FormatOpProfile(top 1) = %q", lines)
	}
	if prof, err := g.OpProfile(false); len(prof) != 0 || err != nil {
		t.Errorf("after reset: %v, %v", prof, err)
	}
}

// TestGPUSkip checks the timing ablation: a skipped operation queues
// nothing (its output keeps its poison), the others still run.
func TestGPUSkip(t *testing.T) {
	p := newPairOpts(t, Options{skip: []string{"silu_mul"}})
	gateUp := p.rand(kernels.F32, 1, 3, 16)
	act := p.zeros(kernels.F32, 3, 8)
	p.poison(act)
	if err := p.g.SiLUMul(act.g, gateUp.g); err != nil {
		t.Fatal(err)
	}
	for i, v := range p.f32(p.g, act.g) {
		if !math.IsNaN(float64(v)) {
			t.Fatalf("silu_mul skipped: element %d = %v, want the NaN poison", i, v)
		}
	}
	a, b, sum := p.rand(kernels.F32, 1, 3, 8), p.rand(kernels.F32, 1, 3, 8), p.zeros(kernels.F32, 3, 8)
	if err := p.c.Add(sum.c, a.c, b.c); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Add(sum.g, a.g, b.g); err != nil {
		t.Fatal(err)
	}
	p.check("add (not skipped)", sum, 1e-6)
}
