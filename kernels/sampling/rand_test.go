package sampling

import (
	"math"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

// TestPhiloxKnownAnswers checks the block function against the Random123
// known-answer vectors for philox4x32-10 (counter, key, output).
func TestPhiloxKnownAnswers(t *testing.T) {
	tests := []struct {
		ctr  [4]uint32
		key  [2]uint32
		want [4]uint32
	}{
		{[4]uint32{0, 0, 0, 0}, [2]uint32{0, 0},
			[4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
		{[4]uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, [2]uint32{0xffffffff, 0xffffffff},
			[4]uint32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
		{[4]uint32{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, [2]uint32{0xa4093822, 0x299f31d0},
			[4]uint32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
	}
	for _, tt := range tests {
		if got := philox4x32(tt.ctr, tt.key); got != tt.want {
			t.Errorf("philox4x32(%08x, %08x) = %08x, want %08x", tt.ctr, tt.key, got, tt.want)
		}
	}
	// Uniform's word layout: counter (step, draw) and key (seed), low word first.
	want := float64((uint64(0x6627e8d5)<<32|uint64(0xe169c58d))>>11) * 0x1p-53
	if got := Uniform(0, 0, 0); got != want {
		t.Fatalf("Uniform(0, 0, 0) = %v, want %v", got, want)
	}
}

// TestUniform checks range, key sensitivity and a chi-square fit to the
// uniform distribution over 20 bins, along steps and along draws.
func TestUniform(t *testing.T) {
	const n, numBins = 20000, 20
	crit := distuv.ChiSquared{K: numBins - 1}.Quantile(1 - 1e-4)
	for _, along := range []string{"step", "draw", "seed"} {
		var counts [numBins]float64
		for i := range uint64(n) {
			var u float64
			switch along {
			case "step":
				u = Uniform(7, i, DrawSample)
			case "draw":
				u = Uniform(7, 3, i)
			case "seed":
				u = Uniform(i, 3, DrawSample)
			}
			if u < 0 || u >= 1 {
				t.Fatalf("%s %d: %v outside [0, 1)", along, i, u)
			}
			counts[int(u*numBins)]++
		}
		stat := 0.0
		for _, c := range counts {
			e := float64(n) / numBins
			stat += (c - e) * (c - e) / e
		}
		if stat > crit {
			t.Errorf("along %s: chi-square %.1f > critical %.1f", along, stat, crit)
		}
	}
	if Uniform(1, 2, 3) != Uniform(1, 2, 3) {
		t.Fatal("Uniform is not a function of its key")
	}
	for _, k := range [][3]uint64{{2, 2, 3}, {1, 3, 3}, {1, 2, 4}, {1 << 32, 2, 3}, {1, 2 << 32, 3}, {1, 2, 3 << 32}} {
		if Uniform(k[0], k[1], k[2]) == Uniform(1, 2, 3) {
			t.Errorf("Uniform%v equals Uniform(1, 2, 3)", k)
		}
	}
	if math.IsNaN(Uniform(math.MaxUint64, math.MaxUint64, math.MaxUint64)) {
		t.Fatal("NaN")
	}
}
