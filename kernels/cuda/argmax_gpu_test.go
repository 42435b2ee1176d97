package cuda

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// Argmax on the device equals the host reference (kernels.ArgmaxRow) on
// rows with ties, NaN and all -Inf, and FetchI32Async brings the ids back
// behind queued work.
func TestGPUArgmax(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(3, 4))
	const rows, vocab = 37, 151936
	logits := make([]float32, rows*vocab)
	for i := range logits {
		logits[i] = float32(r.NormFloat64())
	}
	for row := range rows {
		z := logits[row*vocab : (row+1)*vocab]
		switch row % 4 {
		case 1: // a tie far apart: the lower id wins
			z[vocab-3], z[17] = 50, 50
		case 2: // NaN never wins
			z[5], z[6] = float32(math.NaN()), 40
		case 3:
			if row == 3 {
				for i := range z {
					z[i] = float32(math.Inf(-1))
				}
			}
		}
	}
	l, err := kernels.FromF32(g, logits, rows, vocab)
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.Alloc(kernels.I32, rows)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Argmax(out, l); err != nil {
		t.Fatal(err)
	}
	fetch, err := g.FetchI32Async(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fetch()
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int32, rows)
	for row := range rows {
		want[row] = int32(kernels.ArgmaxRow(logits[row*vocab : (row+1)*vocab]))
	}
	if !slices.Equal(got, want) {
		t.Errorf("argmax = %v, want %v", got, want)
	}
}
