package sampling

import "math/bits"

// Draw indices within one (seed, step). Sample uses DrawSample; other
// consumers of the same request's randomness at the same step (speculative
// acceptance tests, residual resampling) take indices from DrawUser on, so
// that their streams never overlap with the sampler's.
const (
	DrawSample uint64 = 0
	DrawUser   uint64 = 1
)

// Uniform returns a uniform float64 in [0, 1) that is a pure function of
// (seed, step, draw): the generator is counter-based, so a request's draw at
// output position step is the same in every batch, on every thread, and after
// preemption and recompute. It is Philox4x32-10 (Salmon et al., SC'11, the
// generator of cuRAND and Random123) with key (seed low 32 bits, seed high 32
// bits) and counter (step low, step high, draw low, draw high); the first two
// output words, high word first, give 53 random bits. A device sampler
// reproduces it bit for bit. Cost: 10 rounds of two 32x32-bit multiplies; no
// allocation.
func Uniform(seed, step, draw uint64) float64 {
	out := philox4x32(
		[4]uint32{uint32(step), uint32(step >> 32), uint32(draw), uint32(draw >> 32)},
		[2]uint32{uint32(seed), uint32(seed >> 32)},
	)
	return float64((uint64(out[0])<<32|uint64(out[1]))>>11) * 0x1p-53
}

// Philox4x32 constants: round multipliers and Weyl key increments.
const (
	philoxM0 = 0xD2511F53
	philoxM1 = 0xCD9E8D57
	philoxW0 = 0x9E3779B9
	philoxW1 = 0xBB67AE85
)

// philox4x32 is the Philox4x32-10 block function.
func philox4x32(ctr [4]uint32, key [2]uint32) [4]uint32 {
	for round := range 10 {
		if round > 0 {
			key[0] += philoxW0
			key[1] += philoxW1
		}
		hi0, lo0 := bits.Mul32(philoxM0, ctr[0])
		hi1, lo1 := bits.Mul32(philoxM1, ctr[2])
		ctr = [4]uint32{hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0}
	}
	return ctr
}
