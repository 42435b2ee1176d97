//go:build race

package llm

// raceEnabled is true when tests run with the race detector.
const raceEnabled = true
