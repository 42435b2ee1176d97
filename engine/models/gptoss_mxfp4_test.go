package models

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// widenedOps is the CPU backend without kernels.MXFP4Weighter (the two
// embedded MXFP4Weight methods hide each other), as a backend without
// MXFP4 kernels looks to the loader: it widens the experts to BF16.
type widenedOps struct {
	*cpu.Backend
	noMXFP4
}

type noMXFP4 struct{}

func (noMXFP4) MXFP4Weight(kernels.MXFP4Weight) (kernels.Tensor, error) {
	panic("hidden: never called")
}

// TestGptOssMXFP4MatchesWidened: the MXFP4 fixture with its experts kept
// as MXFP4 blocks (widened inside the expert loops) gives the bits of the
// same model with the experts widened to BF16 at load, in prefill and
// decode, with the window layer in a ring; and keeps them in 4.25 bits a
// weight.
func TestGptOssMXFP4MatchesWidened(t *testing.T) {
	dir := fixtureDir + "/gpt-oss/mxfp4"
	const blockSize, numBlocks = 4, 64
	b := newBackend(t, 2)
	var _ kernels.MXFP4Weighter = b
	if _, ok := any(widenedOps{Backend: b}).(kernels.MXFP4Weighter); ok {
		t.Fatal("widenedOps still has MXFP4Weight")
	}
	native, err := Builtin().Load(b, dir, Options{MaxModelLen: 128})
	if err != nil {
		t.Skipf("no gpt-oss fixture: %v", err)
	}
	widened, err := Builtin().Load(widenedOps{Backend: b}, dir, Options{MaxModelLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	if f := native.(*gptOss).WeightFormat(); !strings.Contains(f, "MXFP4") {
		t.Errorf("native weight format %q, want MXFP4 in it", f)
	}
	if f := widened.(*gptOss).WeightFormat(); strings.Contains(f, "MXFP4") {
		t.Errorf("widened weight format %q has MXFP4", f)
	}
	gn, gw := native.(*gptOss), widened.(*gptOss)
	if gn.layers[0].gateUp.DType() != kernels.MXFP4 || gw.layers[0].gateUp.DType() != kernels.BF16 {
		t.Fatalf("experts %v and %v, want MXFP4 and BF16", gn.layers[0].gateUp.DType(), gw.layers[0].gateUp.DType())
	}
	r := rand.New(rand.NewPCG(3, 4))
	pool := newBlockPool(r, numBlocks)
	a, c := randomIDs(r, 19, 256), randomIDs(r, 13, 256)
	ta, tc := pool.table(blockSize, 24), pool.table(blockSize, 16)
	nc, wc := ringCache(t, native, numBlocks, blockSize, 2), ringCache(t, widened, numBlocks, blockSize, 2)
	check := func(what string, seqs ...ringSeq) {
		t.Helper()
		x, y := ringStep(t, native, nc, seqs...), ringStep(t, widened, wc, seqs...)
		for i := range x {
			if !sameBits(x[i], y[i]) {
				t.Fatalf("%s: row %d: MXFP4 and widened logits differ (max relative %.3g)", what, i, relErr(x[i], f64(y[i])))
			}
		}
	}
	check("prefill", ringSeq{a[:15], 0, ta, 0}, ringSeq{c[:9], 0, tc, 1})
	for p := 15; p < 19; p++ {
		check("decode", ringSeq{a[p : p+1], p, ta, 0}, ringSeq{c[p-6 : p-5], p - 6, tc, 1})
	}
}
