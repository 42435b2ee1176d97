package sampling

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// maskOf packs the allowed ids of a vocabulary of n tokens.
func maskOf(n int, ids ...int) []uint32 {
	m := make([]uint32, (n+31)/32)
	for _, t := range ids {
		m[t/32] |= 1 << (t % 32)
	}
	return m
}

// TestAllowedMask: a row with an allowed-token mask only ever yields an
// allowed token, greedy or random, whatever the logits and the edits of
// the disallowed tokens (a bias cannot lift a masked token); the logits of
// masked tokens become -Inf and the others keep their values.
func TestAllowedMask(t *testing.T) {
	const vocab = 70 // three mask words, the last partial
	rng := rand.New(rand.NewPCG(1, 2))
	allowed := []int{3, 31, 32, 64, 69}
	isAllowed := map[int32]bool{}
	for _, a := range allowed {
		isAllowed[int32(a)] = true
	}
	for trial := range 200 {
		logits := make([]float32, vocab)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 3)
		}
		logits[5] = 50 // the unconstrained argmax, masked out
		r := kernels.SampleRow{Greedy: trial%2 == 0, Temperature: 1, TopP: 1, RepetitionPenalty: 1, Step: uint64(trial),
			Allowed: maskOf(vocab, allowed...),
			Edits:   []kernels.LogitEdit{{Token: 6, Flags: kernels.EditBias, Bias: 100}}}
		raw := append([]float32(nil), logits...)
		res, err := Sample(logits, &r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !isAllowed[res.Token] {
			t.Fatalf("trial %d: token %d is not allowed", trial, res.Token)
		}
		if r.Greedy {
			best := int32(allowed[0])
			for _, a := range allowed {
				if raw[a] > raw[best] {
					best = int32(a)
				}
			}
			if res.Token != best {
				t.Fatalf("trial %d: greedy token %d, want %d (argmax over the allowed)", trial, res.Token, best)
			}
		}
		for i := range logits {
			if isAllowed[int32(i)] != (logits[i] == raw[i]) && !(isAllowed[int32(i)] && i == 6) {
				t.Fatalf("trial %d: logit %d is %v after, %v before (allowed %v)", trial, i, logits[i], raw[i], isAllowed[int32(i)])
			}
		}
	}
}

func TestAllowedMaskErrors(t *testing.T) {
	logits := []float32{1, 2, 3, 4}
	r := kernels.SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1, Allowed: []uint32{}}
	if _, err := Sample(append([]float32(nil), logits...), &r, nil); !errors.Is(err, kernels.ErrSampleParams) {
		t.Errorf("mask too short: %v", err)
	}
	r.Allowed = []uint32{0}
	if _, err := Sample(append([]float32(nil), logits...), &r, nil); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("nothing allowed: %v", err)
	}
	r.Allowed = []uint32{1 << 2}
	if res, err := Sample(append([]float32(nil), logits...), &r, nil); err != nil || res.Token != 2 {
		t.Errorf("one allowed: %v, %v", res, err)
	}
}
