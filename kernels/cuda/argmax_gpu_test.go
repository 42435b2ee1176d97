package cuda

import (
	"errors"
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

// AcceptDrafts on the device equals the host reference on a batch with
// every kind of outcome, and a bad entry is reported by the next download.
func TestGPUAcceptDrafts(t *testing.T) {
	g := newGPU(t, GEMMRound)
	r := rand.New(rand.NewPCG(5, 6))
	const entries = 300
	var tokens, drafts, layout []int32
	for e := range entries {
		n := r.IntN(5)
		s0, d0 := len(tokens), len(drafts)
		for j := range n + 1 {
			tok := int32(r.IntN(50))
			tokens = append(tokens, tok)
			if j < n {
				if r.IntN(3) > 0 {
					drafts = append(drafts, tok) // accepted unless an earlier one was not
				} else {
					drafts = append(drafts, tok+1)
				}
			}
		}
		layout = append(layout, int32(s0), int32(n), int32(d0), int32(1000*e))
	}
	want, err := kernels.AcceptHost(tokens, drafts, layout)
	if err != nil {
		t.Fatal(err)
	}
	tt, _ := kernels.FromI32(g, tokens, len(tokens))
	dt, _ := kernels.FromI32(g, drafts, len(drafts))
	lt, _ := kernels.FromI32(g, layout, entries, 4)
	out, err := g.Alloc(kernels.I32, 3, entries)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.AcceptDrafts(out, tt, dt, lt); err != nil {
		t.Fatal(err)
	}
	got, err := kernels.ToI32(g, out)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("accept_drafts differs from the host reference")
	}
	bad, _ := kernels.FromI32(g, []int32{int32(len(tokens)), 1, 0, 0}, 1, 4)
	one, _ := g.Alloc(kernels.I32, 3, 1)
	if err := g.AcceptDrafts(one, tt, dt, bad); err != nil {
		t.Fatal(err)
	}
	if _, err := kernels.ToI32(g, one); !errors.Is(err, kernels.ErrOutOfRange) {
		t.Errorf("an entry past the tokens: %v, want ErrOutOfRange", err)
	}
}
