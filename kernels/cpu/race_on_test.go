//go:build race

package cpu

// raceEnabled reports whether the test binary runs under the race
// detector, whose sync.Pool drops a share of what is put back (so tests of
// buffer reuse cannot count allocations).
const raceEnabled = true
