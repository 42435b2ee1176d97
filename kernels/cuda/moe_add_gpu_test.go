package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// MoEAdd (the addend added in MoE's combine pass) gives the bits of MoE
// followed by Add, on every path that ends in the combine pass: the small
// batches' kernels (1 and 64 tokens), the grouped GEMM (600 tokens x 6,
// 3600 pairs), the host path (MoEGEMMPairs negative, 2000 pairs), FP8
// experts, eager and in a captured graph, in both GEMM modes; an addend
// set and never applied is an error.
func TestGPUMoEAdd(t *testing.T) {
	const hidden, inter, experts, topK = 288, 160, 16, 6
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		def := newGPUOpts(t, Options{GEMM: mode})
		host := newGPUOpts(t, Options{GEMM: mode, MoEGEMMPairs: -1})
		r := rand.New(rand.NewPCG(77, uint64(mode)))
		for _, c := range []struct {
			name   string
			g      *Backend
			tokens int
			graph  bool
		}{
			{"one_token", def, 1, false}, {"one_token_graph", def, 1, true}, {"tokens=64", def, 64, false},
			{"tokens=64_graph", def, 64, true}, {"gemm_3600_pairs", def, 600, false}, {"gemm_3600_pairs_graph", def, 600, true},
			{"host_2000_pairs", host, 2000 / topK, false},
		} {
			t.Run(fmt.Sprintf("%s/%s", mode, c.name), func(t *testing.T) {
				d := newMoEData(r, kernels.BF16, c.tokens, topK, experts, hidden, inter, randExpertIDs(r, c.tokens, topK, experts))
				m := d.upload(t, c.g)
				add := upload(t, c.g, kernels.F32, kernels.F32Bytes(randVals(r, c.tokens*hidden, 3)), kernels.F32, c.tokens, hidden)
				want := moeThenAdd(t, c.g, m, add)
				run := func() error { return c.g.MoEAdd(m.out, m.x, m.ids, m.w, m.gu, m.dn, add) }
				if c.graph {
					graph, err := c.g.CaptureGraph(run)
					if err != nil {
						t.Fatal(err)
					}
					defer graph.Close()
					run = graph.Replay
				}
				if err := run(); err != nil {
					t.Fatal(err)
				}
				if i, ok := moeEqual(moeDownload(t, c.g, m.out), want); !ok {
					t.Fatalf("MoEAdd out[%d] differs from MoE followed by Add", i)
				}
			})
		}
	}
	t.Run("fp8", func(t *testing.T) {
		p := newPair(t, GEMMRound)
		for _, tokens := range []int{1, 64, 600} {
			guW, dnW := makeFP8Varied(p.r, experts, 2*256, 256, 128), makeFP8Varied(p.r, experts, 256, 256, 128)
			gu, dn := newFP8Weight(t, p.g, guW), newFP8Weight(t, p.g, dnW)
			c := newMoECase(p, tokens, experts, topK, 256)
			m := moeTensors{out: c.out.g, x: c.x.g, gu: gu, dn: dn, ids: c.ids.g, w: c.w.g}
			add := upload(t, p.g, kernels.F32, kernels.F32Bytes(randVals(p.r, tokens*256, 3)), kernels.F32, tokens, 256)
			want := moeThenAdd(t, p.g, m, add)
			if err := p.g.MoEAdd(m.out, m.x, m.ids, m.w, m.gu, m.dn, add); err != nil {
				t.Fatal(err)
			}
			if i, ok := moeEqual(moeDownload(t, p.g, m.out), want); !ok {
				t.Fatalf("%d tokens: FP8 MoEAdd out[%d] differs from MoE followed by Add", tokens, i)
			}
		}
	})
	t.Run("unapplied", func(t *testing.T) {
		g := newGPUOpts(t, Options{})
		out, err := g.Alloc(kernels.F32, 2, 8)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := asCUDA("moe", "out", out)
		err = g.launch("moe", g.moeAdding(o, o, queueNothing), o)
		if err == nil {
			t.Fatal("an addend that no combine pass applied was not reported")
		}
		t.Log(err)
	})
}

// moeThenAdd runs m as MoE followed by Add(m.out, m.out, add) and returns
// the result.
func moeThenAdd(t *testing.T, g *Backend, m moeTensors, add kernels.Tensor) []float32 {
	t.Helper()
	if err := m.run(g); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(m.out, m.out, add); err != nil {
		t.Fatal(err)
	}
	want := moeDownload(t, g, m.out)
	if err := g.Upload(m.out, make([]byte, 4*len(want)), kernels.F32); err != nil {
		t.Fatal(err)
	}
	return want
}
