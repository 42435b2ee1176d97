package models

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
)

// TestGptOssFixtureParity runs the tiny gpt-oss fixture (sliding window 4,
// sinks, YaRN, 4 experts top-2 with the clamped SwiGLU) with its experts as
// float32 and as MXFP4, its window layer in a ring and in paged blocks,
// against HF transformers' logits and greedy tokens.
func TestGptOssFixtureParity(t *testing.T) {
	dir := fixtureDir + "/gpt-oss"
	rf, err := weights.OpenFile(dir + "/reference.safetensors")
	if err != nil {
		t.Skipf("no gpt-oss fixture: %v", err)
	}
	defer rf.Close()
	ref := fixtureRef{rf, t}
	const blockSize, numBlocks, tol = 4, 64, 1e-4
	ops := newBackend(t, 2)
	for _, variant := range []string{"f32", "mxfp4"} {
		for _, paged := range []bool{false, true} {
			m, err := Builtin().Load(ops, dir+"/"+variant, Options{MaxModelLen: 128, SlidingWindowPaged: paged})
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%s paged=%v", variant, paged)
			if g := m.(*gptOss); g.rings == paged || len(g.layers) != 2 || !g.layers[0].sliding || g.layers[1].sliding {
				t.Fatalf("%s: rings %v, layers %d", name, g.rings, len(g.layers))
			}
			for i := 0; ref.has(fmt.Sprintf("f32.prompt.%d.ids", i)); i++ {
				key := fmt.Sprintf("f32.prompt.%d", i)
				ids, want := ref.ints(key+".ids"), ref.rows(key+".logits")
				greedyWant := ref.ints(fmt.Sprintf("f32.greedy.%d.ids", i))
				margins := ref.rows(fmt.Sprintf("f32.greedy.%d.margin", i))
				r := rand.New(rand.NewPCG(uint64(i), 1))
				table := newBlockPool(r, numBlocks).table(blockSize, len(ids)+len(greedyWant))
				cache := ringCache(t, m, numBlocks, blockSize, 2)
				got := ringStep(t, m, cache, ringSeq{ids, 0, table, 1})
				for p := range ids {
					if e := relErr(got[p], want[p]); e > tol {
						t.Errorf("%s prompt %d position %d: error %.3g > %g", name, i, p, e, tol)
					}
				}
				// Greedy tokens: HF's own margin between its two best
				// logits says where float32 noise may pick the other one.
				next := int32(argmax(got[len(ids)-1]))
				greedy := []int32{next}
				for len(greedy) < len(greedyWant) {
					lg := ringStep(t, m, cache, ringSeq{[]int32{next}, len(ids) + len(greedy) - 1, table, 1})
					next = int32(argmax(lg[0]))
					greedy = append(greedy, next)
				}
				for j := range greedyWant {
					if greedy[j] == greedyWant[j] {
						continue
					}
					if margin := marginAt(margins, j); margin < 1e-3 {
						t.Logf("%s prompt %d: greedy token %d differs where HF's margin is %.3g", name, i, j, margin)
					} else {
						t.Errorf("%s prompt %d: greedy %v, HF %v (first difference at %d, margin %.3g)", name, i, greedy, greedyWant, j, margin)
					}
					break
				}
				dcache := ringCache(t, m, numBlocks, blockSize, 2)
				for p := range ids {
					lg := ringStep(t, m, dcache, ringSeq{ids[p : p+1], p, table, 0})
					if e := relErr(lg[0], want[p]); e > tol {
						t.Errorf("%s prompt %d: decode position %d: error %.3g > %g", name, i, p, e, tol)
					}
				}
			}
		}
	}
}

// marginAt reads entry j of a 1-D reference tensor read as rows.
func marginAt(rows [][]float64, j int) float64 {
	if len(rows) == 1 {
		return rows[0][j]
	}
	return rows[j][0]
}

// TestGptOssRingMatchesPaged checks that the window layer in per-sequence
// ring buffers gives the bits of the same layer in paged blocks (the
// cache.sliding_window_paged switch), sinks included: chunked prefill with
// chunks longer than the window, two sequences in a batch, then decode.
func TestGptOssRingMatchesPaged(t *testing.T) {
	dir := fixtureDir + "/gpt-oss/f32"
	const blockSize, numBlocks = 4, 64
	ops := newBackend(t, 2)
	ring, err := Builtin().Load(ops, dir, Options{MaxModelLen: 128})
	if err != nil {
		t.Skipf("no gpt-oss fixture: %v", err)
	}
	paged, err := Builtin().Load(ops, dir, Options{MaxModelLen: 128, SlidingWindowPaged: true})
	if err != nil {
		t.Fatal(err)
	}
	if s := ring.KVCacheSpec(); s.RingLayers != 1 || s.RingWindow != 4 || s.NumLayers != 1 {
		t.Fatalf("ring spec %+v, want 1 ring layer of window 4 and 1 paged layer", s)
	}
	if s := paged.KVCacheSpec(); s.RingLayers != 0 || s.NumLayers != 2 {
		t.Fatalf("paged spec %+v, want 2 paged layers", s)
	}
	rc := ringCache(t, ring, numBlocks, blockSize, 4)
	pc := ringCache(t, paged, numBlocks, blockSize, 4)
	r := rand.New(rand.NewPCG(7, 8))
	pool := newBlockPool(r, numBlocks)
	a, b, c := randomIDs(r, 40, 256), randomIDs(r, 30, 256), randomIDs(r, 17, 256)
	ta, tb := pool.table(blockSize, 48), pool.table(blockSize, 48)
	check := func(what string, seqs ...ringSeq) [][]float32 {
		t.Helper()
		x, y := ringStep(t, ring, rc, seqs...), ringStep(t, paged, pc, seqs...)
		for i := range x {
			if !sameBits(x[i], y[i]) {
				t.Fatalf("%s: row %d: ring and paged logits differ (max relative %.3g)", what, i, relErr(x[i], f64(y[i])))
			}
		}
		return x
	}
	check("chunks 1", ringSeq{a[:13], 0, ta, 3}, ringSeq{b[:3], 0, tb, 0})
	check("chunks 2", ringSeq{a[13:14], 13, ta, 3}, ringSeq{b[3:5], 3, tb, 0})
	lg := check("chunks 3", ringSeq{a[14:23], 14, ta, 3}, ringSeq{b[5:30], 5, tb, 0})
	whole := ringStep(t, ring, ringCache(t, ring, numBlocks, blockSize, 4), ringSeq{a[:23], 0, pool.table(blockSize, 23), 1})
	if !sameBits(whole[22], lg[8]) {
		t.Errorf("chunked prefill and one pass give different logits for the last prompt token")
	}
	for p := 23; p < 40; p++ {
		check(fmt.Sprintf("decode %d", p), ringSeq{a[p : p+1], p, ta, 3}, ringSeq{c[p-23 : p-22], 30 + p - 23, tb, 0})
	}
}
