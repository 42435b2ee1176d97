package spec

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// bruteLookup is PromptLookup by definition: for n from maxN down to minN,
// the earliest occurrence of the last n tokens that ends before the final
// position. O(len(tokens)^2 * maxN).
func bruteLookup(tokens []int, minN, maxN, k int) []int {
	l := len(tokens)
	if k == 0 {
		return nil
	}
	for n := maxN; n >= minN; n-- {
		if n > l-1 {
			continue
		}
		suffix := tokens[l-n:]
		for s := 0; s+n <= l-1; s++ {
			if slices.Equal(tokens[s:s+n], suffix) {
				return slices.Clone(tokens[s+n : min(s+n+k, l)])
			}
		}
	}
	return nil
}

// paragraph returns n distinct tokens from first on: a stand-in for text
// without internal repetition.
func paragraph(first, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = first + i
	}
	return p
}

func concat(parts ...[]int) []int { return slices.Concat(parts...) }

func TestPromptLookup(t *testing.T) {
	par := paragraph(100, 40)
	edited := slices.Clone(par)
	edited[20] = 999 // one word changed in the second copy
	cases := []struct {
		name       string
		tokens     []int
		minN, maxN int
		k          int
		want       []int
	}{
		{"empty", nil, 1, 3, 4, nil},
		{"single token", []int{7}, 1, 3, 4, nil},
		{"no match", []int{1, 2, 3, 4, 5}, 1, 3, 3, nil},
		{"k zero", []int{1, 2, 1, 2}, 1, 2, 0, nil},
		{"shorter than minN+1", []int{1, 2, 1}, 3, 3, 2, nil},
		{"unigram", []int{4, 5, 6, 4}, 1, 3, 2, []int{5, 6}},
		// [2 3] first occurs at 0 (then 8), but [1 2 3] occurs at 3
		// (then 9): the longest n wins over the earliest occurrence.
		{"longest n preferred", []int{2, 3, 8, 1, 2, 3, 9, 1, 2, 3}, 1, 3, 2, []int{9, 1}},
		{"longest capped at maxN", []int{2, 3, 8, 1, 2, 3, 9, 1, 2, 3}, 1, 2, 2, []int{8, 1}},
		{"earliest of equal matches", []int{1, 2, 7, 1, 2, 8, 1, 2}, 2, 2, 2, []int{7, 1}},
		{"only shorter than minN", []int{1, 2, 3, 9, 3}, 2, 3, 3, nil},
		{"minN equals maxN", []int{1, 2, 3, 4, 9, 2, 3, 4}, 2, 2, 3, []int{9, 2, 3}},
		{"k beyond the history", []int{1, 2, 3, 1, 2}, 2, 2, 10, []int{3, 1, 2}},
		{"continuation reaches the suffix", []int{5, 6, 5, 6}, 1, 2, 8, []int{5, 6}},
		// The suffix [7 7 7] recurs at 0, overlapping itself; one token
		// follows.
		{"run of one token", []int{7, 7, 7, 7}, 1, 3, 2, []int{7}},
		{"periodic", []int{1, 2, 1, 2, 1, 2}, 1, 4, 4, []int{1, 2}},
		{"maxN beyond the length", []int{3, 1, 3}, 1, 10, 5, []int{1, 3}},
		// A paragraph repeated with one word changed: before the change
		// and after it the proposal is the unchanged continuation.
		{"edit before the change", concat(par, edited[:10]), 2, 4, 5, par[10:15]},
		{"edit after the change", concat(par, edited[:30]), 2, 4, 5, par[30:35]},
		{"edit at the changed word", concat(par, edited[:21]), 2, 4, 5, nil},
		{"edit near the end", concat(par, edited[:38]), 2, 4, 5, concat(par[38:], edited[:3])},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := slices.Clone(c.tokens)
			got := PromptLookup(c.tokens, c.minN, c.maxN, c.k)
			if !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
				t.Fatalf("PromptLookup(%v, %d, %d, %d) = %v, want %v", c.tokens, c.minN, c.maxN, c.k, got, c.want)
			}
			if !slices.Equal(c.tokens, before) {
				t.Fatalf("tokens modified: %v, was %v", c.tokens, before)
			}
			if len(got) > 0 {
				got[0] = -12345 // the result must not alias tokens
				if slices.Contains(c.tokens, -12345) {
					t.Fatal("result aliases tokens")
				}
			}
		})
	}
}

func TestPromptLookupMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		tokens := make([]int, r.IntN(61))
		alphabet := 2 + r.IntN(4)
		for i := range tokens {
			tokens[i] = r.IntN(alphabet)
		}
		minN := 1 + r.IntN(4)
		maxN := minN + r.IntN(5)
		k := r.IntN(7)
		got := PromptLookup(tokens, minN, maxN, k)
		want := bruteLookup(tokens, minN, maxN, k)
		if !slices.Equal(got, want) || (got == nil) != (want == nil) {
			t.Fatalf("trial %d: PromptLookup(%v, %d, %d, %d) = %v, brute force %v", trial, tokens, minN, maxN, k, got, want)
		}
	}
}

func TestValidateNgram(t *testing.T) {
	cases := []struct {
		minN, maxN int
		want       string // "" means valid
	}{
		{1, 1, ""},
		{2, 5, ""},
		{0, 3, "prompt_lookup_min must be >= 1, got 0"},
		{-1, 3, "prompt_lookup_min must be >= 1, got -1"},
		{4, 3, "prompt_lookup_max (3) must be >= prompt_lookup_min (4)"},
	}
	for _, c := range cases {
		err := ValidateNgram(c.minN, c.maxN)
		if c.want == "" {
			if err != nil {
				t.Errorf("ValidateNgram(%d, %d) = %v, want nil", c.minN, c.maxN, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, ErrInvalidNgram) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ValidateNgram(%d, %d) = %v, want an ErrInvalidNgram containing %q", c.minN, c.maxN, err, c.want)
		}
	}
}

func TestPromptLookupPanics(t *testing.T) {
	cases := []struct {
		name          string
		minN, maxN, k int
		want          string
	}{
		{"minN", 0, 2, 1, "prompt_lookup_min"},
		{"maxN", 3, 2, 1, "prompt_lookup_max"},
		{"k", 1, 2, -1, "k must be >= 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if s, ok := r.(string); !ok || !strings.Contains(s, c.want) {
					t.Fatalf("panic %v, want one containing %q", r, c.want)
				}
			}()
			PromptLookup([]int{1, 2, 1, 2}, c.minN, c.maxN, c.k)
		})
	}
}

func BenchmarkPromptLookup(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	tokens := make([]int, 8192)
	for i := range tokens {
		tokens[i] = r.IntN(32000)
	}
	copy(tokens[len(tokens)-4:], tokens[1000:1004])
	for b.Loop() {
		PromptLookup(tokens, 1, 4, 5)
	}
}
