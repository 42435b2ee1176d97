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
// rows with ties (far apart, and inside one 4-value load of the vector
// path), NaN and all -Inf, at vocabularies the vector path takes (a
// multiple of 4: Qwen3's, the default model's) and ones it does not (odd,
// GPT-2's), and FetchI32Async brings the ids back behind queued work.
func TestGPUArgmax(t *testing.T) {
	g := newGPU(t, GEMMRound)
	for _, vocab := range []int{151936, 8192, 8191, 50257, 3} {
		r := rand.New(rand.NewPCG(3, uint64(vocab)))
		const rows = 37
		logits := make([]float32, rows*vocab)
		for i := range logits {
			logits[i] = float32(r.NormFloat64())
		}
		for row := range rows {
			z := logits[row*vocab : (row+1)*vocab]
			switch row % 5 {
			case 1: // a tie far apart: the lower id wins
				z[vocab-1], z[0] = 50, 50
			case 2: // NaN never wins
				z[min(5, vocab-1)], z[vocab/2] = float32(math.NaN()), 40
			case 3:
				if row == 3 {
					for i := range z {
						z[i] = float32(math.Inf(-1))
					}
				}
			case 4: // a tie inside one float4 and one in the next: the lowest id wins
				if vocab >= 12 {
					z[9], z[10], z[11] = 60, 60, 60
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
			t.Errorf("vocab %d: argmax = %v, want %v", vocab, got, want)
		}
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
