package sampling

import (
	"math"
	"slices"
)

// heapMaxK is the largest k for which kthLargest keeps a heap; above it the
// radix select's three linear passes are cheaper than O(n log k).
const heapMaxK = 256

// kthLargest returns the k-th largest value of x counting repeats
// (1 <= k <= len(x)); x holds no NaN. Cost: one pass and O(k) memory when k is
// small (a min-heap of the k largest values, most elements rejected by one
// comparison), otherwise a radix select: a pass that computes sortable keys,
// then passes over the shrinking set of keys that share the chosen digits. x is not modified.
func (s *Scratch) kthLargest(x []float32, k int) float32 {
	if k <= heapMaxK {
		return s.kthLargestHeap(x, k)
	}
	return s.kthLargestRadix(x, k)
}

func (s *Scratch) kthLargestHeap(x []float32, k int) float32 {
	h := append(s.heap[:0], x[:k]...)
	s.heap = h
	for i := k/2 - 1; i >= 0; i-- {
		siftDownF32(h, i)
	}
	for _, v := range x[k:] {
		if v > h[0] {
			h[0] = v
			siftDownF32(h, 0)
		}
	}
	return h[0]
}

// siftDownF32 restores the min-heap property of h below i.
func siftDownF32(h []float32, i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h[r] < h[l] {
			m = r
		}
		if h[i] <= h[m] {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// sortKey maps a float32 to a uint32 with the same order (-Inf lowest, -0
// just below +0).
func sortKey(v float32) uint32 {
	b := math.Float32bits(v)
	if b&0x80000000 != 0 {
		return ^b
	}
	return b | 0x80000000
}

func fromSortKey(k uint32) float32 {
	if k&0x80000000 != 0 {
		return math.Float32frombits(k &^ 0x80000000)
	}
	return math.Float32frombits(^k)
}

// kthLargestRadix selects the k-th largest key digit by digit, most
// significant first (11, 11 and 10 bits). The first pass computes the keys
// into the scratch; each later pass runs only over the keys that share the
// digits chosen so far, compacted in place (about n/2048 after the first).
func (s *Scratch) kthLargestRadix(x []float32, k int) float32 {
	if cap(s.keys) < len(x) {
		s.keys = make([]uint32, len(x))
	}
	keys := s.keys[:len(x)]
	for i, v := range x {
		keys[i] = sortKey(v)
	}
	var prefix uint32
	for pass, d := range [3]struct{ shift, bits uint }{{21, 11}, {10, 11}, {0, 10}} {
		if pass > 0 {
			// Keep the keys whose digits above d.shift+d.bits are prefix's.
			high := d.shift + d.bits
			n := 0
			for _, key := range keys {
				if key>>high == prefix>>high {
					keys[n] = key
					n++
				}
			}
			keys = keys[:n]
		}
		hist := &s.radix
		clear(hist[:])
		digitMask := uint32(1)<<d.bits - 1
		for _, key := range keys {
			hist[(key>>d.shift)&digitMask]++
		}
		digit := int(digitMask)
		for ; digit > 0; digit-- {
			n := int(hist[digit])
			if n >= k {
				break
			}
			k -= n
		}
		prefix |= uint32(digit) << d.shift
	}
	return fromSortKey(prefix)
}

// better reports whether a ranks before b in a logprobs list: higher logprob,
// then lower id.
func better(a, b TokenLogprob) bool {
	return a.Logprob > b.Logprob || (a.Logprob == b.Logprob && a.Token < b.Token)
}

// topLogprobs writes into dst[:0] the n entries with the highest
// logprob(x[i]) = float32(float64(x[i]) - lse), highest first, ties by lower
// id; n <= len(x). Cost: one pass with a heap of n entries, then a sort of n.
func topLogprobs(dst []TokenLogprob, x []float32, lse float64, n int) []TokenLogprob {
	h := dst[:0]
	if n == 0 {
		return h
	}
	for i, v := range x {
		e := TokenLogprob{Token: int32(i), Logprob: float32(float64(v) - lse)}
		if len(h) < n {
			h = append(h, e)
			if len(h) == n {
				for j := n/2 - 1; j >= 0; j-- {
					siftDownWorst(h, j)
				}
			}
			continue
		}
		if better(e, h[0]) {
			h[0] = e
			siftDownWorst(h, 0)
		}
	}
	slices.SortFunc(h, func(a, b TokenLogprob) int {
		if better(a, b) {
			return -1
		}
		if better(b, a) {
			return 1
		}
		return 0
	})
	return h
}

// siftDownWorst restores the heap property (the worst entry at the root).
func siftDownWorst(h []TokenLogprob, i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && better(h[l], h[r]) {
			m = r
		}
		if !better(h[i], h[m]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
