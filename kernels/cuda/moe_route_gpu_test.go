package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// RoutedMoE (the routing handed to the MoE launch, moe_set_route) gives the
// ids, weights and output bits of MoERoute followed by MoE (MoEAdd with an
// addend), eager and replayed from a graph, in both GEMM modes, for the
// routings of TestGPUMoERoute (routeCases: 8, 64 and 256 experts): from 1 to 8
// tokens the decode path's grouping launch routes them (its graph has one
// node fewer than the two operations'), from 9 tokens, float32 experts and
// with Options.DisableFusedRoute the routing's own kernel runs first (the
// same nodes).
func TestGPURoutedMoE(t *testing.T) {
	const hidden, inter = 256, 128
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		backends := []struct {
			name  string
			g     *Backend
			fuses bool
		}{
			{"fused", newGPUOpts(t, Options{GEMM: mode}), true},
			{"apart", newGPUOpts(t, Options{GEMM: mode, DisableFusedRoute: true}), false},
		}
		r := rand.New(rand.NewPCG(91, uint64(mode)))
		for _, be := range backends {
			for _, rt := range routeCases {
				for _, tc := range []struct {
					tokens int
					dt     kernels.DType
					add    bool
				}{{1, kernels.BF16, false}, {1, kernels.BF16, true}, {3, kernels.BF16, true}, {8, kernels.BF16, false},
					{9, kernels.BF16, true}, {40, kernels.BF16, false}, {2, kernels.F32, true}} {
					name := fmt.Sprintf("%s/%s/e%d/tokens=%d/%s/add=%v", mode, be.name, rt.e, tc.tokens, tc.dt, tc.add)
					t.Run(name, func(t *testing.T) {
						fused := be.fuses && tc.tokens <= 8 && tc.dt != kernels.F32
						checkRoutedMoE(t, be.g, r, hidden, inter, rt.e, tc.tokens, tc.dt, rt.rp, rt.bias, tc.add, fused)
					})
				}
			}
		}
	}
}

// checkRoutedMoE runs one RoutedMoE case against MoERoute and MoE (and
// Add) on g, eagerly and as captured graphs, and checks the graph nodes:
// one fewer where fused.
func checkRoutedMoE(t *testing.T, g *Backend, r *rand.Rand, hidden, inter, e, tokens int, dt kernels.DType, rp kernels.RouteParams, withBias, withAdd, fused bool) {
	t.Helper()
	f32 := func(scale float32, shape ...int) kernels.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		return upload(t, g, kernels.F32, kernels.F32Bytes(randVals(r, n, scale)), kernels.F32, shape...)
	}
	zeros := func(dt kernels.DType, shape ...int) kernels.Tensor {
		ten, err := g.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return ten
	}
	x, logits := f32(1, tokens, hidden), f32(3, tokens, e)
	var bias, add kernels.Tensor
	if withBias {
		bias = f32(0.1, e)
	}
	if withAdd {
		add = f32(2, tokens, hidden)
	}
	gu := upload(t, g, dt, hostBytes(dt, randVals(r, e*2*inter*hidden, 0.2)), dt, e, 2*inter, hidden)
	dn := upload(t, g, dt, hostBytes(dt, randVals(r, e*hidden*inter, 0.2)), dt, e, hidden, inter)
	type outs struct{ ids, w, out kernels.Tensor }
	newOuts := func() outs {
		return outs{zeros(kernels.I32, tokens, rp.TopK), zeros(kernels.F32, tokens, rp.TopK), zeros(kernels.F32, tokens, hidden)}
	}
	routed := func(o outs) func() error {
		return func() error { return g.RoutedMoE(o.out, x, logits, bias, rp, o.ids, o.w, gu, dn, add) }
	}
	apart := func(o outs) func() error {
		return func() error {
			if err := g.MoERoute(o.ids, o.w, logits, bias, rp); err != nil {
				return err
			}
			if err := g.MoE(o.out, x, o.ids, o.w, gu, dn); err != nil {
				return err
			}
			if add != nil {
				return g.Add(o.out, o.out, add)
			}
			return nil
		}
	}
	same := func(what string, got, want outs) {
		t.Helper()
		if gi, wi := moeI32(t, g, got.ids), moeI32(t, g, want.ids); fmt.Sprint(gi) != fmt.Sprint(wi) {
			t.Fatalf("%s: ids %v, want %v", what, gi, wi)
		}
		if i, ok := moeEqual(moeDownload(t, g, got.w), moeDownload(t, g, want.w)); !ok {
			t.Fatalf("%s: weights[%d] differ", what, i)
		}
		if i, ok := moeEqual(moeDownload(t, g, got.out), moeDownload(t, g, want.out)); !ok {
			t.Fatalf("%s: out[%d] differs", what, i)
		}
	}
	want, got := newOuts(), newOuts()
	if err := apart(want)(); err != nil {
		t.Fatal(err)
	}
	if err := routed(got)(); err != nil {
		t.Fatal(err)
	}
	same("eager", got, want)
	if out := moeDownload(t, g, got.out); math.IsNaN(float64(out[0])) {
		t.Fatal("out is NaN")
	}
	// Captured: the same bits, and the node counts.
	gw, gg := newOuts(), newOuts()
	capture := func(fn func() error) *Graph {
		t.Helper()
		rep, err := g.CaptureGraph(fn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rep.Close() })
		if err := rep.Replay(); err != nil {
			t.Fatal(err)
		}
		return rep.(*Graph)
	}
	nw, ng := capture(apart(gw)).Nodes(), capture(routed(gg)).Nodes()
	same("replayed", gg, gw)
	same("replayed against eager", gg, want)
	wantNodes := nw
	if fused {
		wantNodes = nw - 1
	}
	if withAdd && !g.opts.DisableMoEAdd {
		wantNodes-- // MoEAdd's addend in the combine pass: Add's node gone too
	}
	if ng != wantNodes {
		t.Errorf("graph nodes: %d routed, %d apart; want %d (fused %v)", ng, nw, wantNodes, fused)
	}
	t.Logf("graph nodes: %d routed, %d apart", ng, nw)
}

// moeI32 returns ten's int32 values.
func moeI32(t testing.TB, g *Backend, ten kernels.Tensor) []int32 {
	t.Helper()
	v, err := kernels.ToI32(g, ten)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
