//go:build !race

package grammar

// raceEnabled is true when tests run with the race detector.
const raceEnabled = false
