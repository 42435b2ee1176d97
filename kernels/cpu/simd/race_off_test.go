//go:build !race

package simd

// raceEnabled is true when tests run with the race detector.
const raceEnabled = false
