package spec

import (
	"errors"
	"fmt"
	"slices"
)

// ErrInvalidNgram wraps every ValidateNgram error.
var ErrInvalidNgram = errors.New("invalid n-gram config")

// ValidateNgram checks prompt lookup's n-gram bounds (vLLM's
// prompt_lookup_min and prompt_lookup_max): 1 <= minN <= maxN. Errors wrap
// ErrInvalidNgram.
func ValidateNgram(minN, maxN int) error {
	switch {
	case minN < 1:
		return fmt.Errorf("%w: prompt_lookup_min must be >= 1, got %d", ErrInvalidNgram, minN)
	case maxN < minN:
		return fmt.Errorf("%w: prompt_lookup_max (%d) must be >= prompt_lookup_min (%d)", ErrInvalidNgram, maxN, minN)
	}
	return nil
}

// PromptLookup proposes up to k draft tokens by prompt lookup decoding
// (vLLM's "ngram" speculative method): it finds the longest n in
// [minN, maxN] such that the last n tokens of tokens (prompt and output so
// far) also occur earlier in tokens, in an occurrence that ends before the
// final position (it may overlap the suffix itself), and returns the tokens
// that followed that occurrence: k of them, or fewer when the history ends
// first. Of several occurrences of that longest n-gram it takes the
// earliest, as vLLM V1's NgramProposer does. A suffix longer than maxN that
// recurs counts as an n-gram of length maxN.
//
// It returns nil when k == 0, when len(tokens) <= minN, or when no suffix of
// length >= minN recurs. The result is a new slice; tokens is only read.
// The caller caps k (vLLM caps it at max_model_len - len(tokens)).
// PromptLookup panics when ValidateNgram(minN, maxN) fails or k < 0: the
// bounds are configuration, validated once with ValidateNgram.
//
// Cost: O(len(tokens)) time whatever maxN, allocating min(maxN,
// len(tokens)-1) ints plus the result. It is one Knuth-Morris-Pratt scan over the
// reversed tokens, with the reversed suffix of at most maxN tokens as the
// pattern: at every earlier position it yields the longest suffix (capped
// at maxN) that ends there.
func PromptLookup(tokens []int, minN, maxN, k int) []int {
	if err := ValidateNgram(minN, maxN); err != nil {
		panic("spec.PromptLookup: " + err.Error())
	}
	if k < 0 {
		panic(fmt.Sprintf("spec.PromptLookup: k must be >= 0, got %d", k))
	}
	n := len(tokens)
	// An occurrence ending before the final position needs at least one
	// token after it besides the suffix: n >= minN+1.
	if k == 0 || n <= minN {
		return nil
	}
	// rev(i) is tokens read backwards; the pattern is rev(0..m-1), the
	// reversed suffix, and the text is rev(1..n-1), everything but the last
	// token. A match of length l ending at text position i is the original
	// occurrence tokens[n-1-i : n-1-i+l] of the suffix of length l.
	rev := func(i int) int { return tokens[n-1-i] }
	m := min(maxN, n-1)

	// fail[i]: the length of the longest proper prefix of rev(0..i) that is
	// also a suffix of it (the KMP failure function).
	fail := make([]int, m)
	for i, l := 1, 0; i < m; i++ {
		for l > 0 && rev(i) != rev(l) {
			l = fail[l-1]
		}
		if rev(i) == rev(l) {
			l++
		}
		fail[i] = l
	}

	best, at := 0, 0
	for i, l := 1, 0; i < n; i++ {
		for l > 0 && rev(i) != rev(l) {
			l = fail[l-1]
		}
		if rev(i) == rev(l) {
			l++
		}
		// >=: among equally long matches the last in reversed order, i.e.
		// the earliest occurrence in tokens.
		if l > 0 && l >= best {
			best, at = l, i
		}
		if l == m {
			l = fail[m-1]
		}
	}
	if best < minN {
		return nil
	}
	// l <= i at every text position, so next <= n-1: at least one token
	// follows the occurrence.
	next := n - 1 - at + best
	return slices.Clone(tokens[next:min(next+k, n)])
}
