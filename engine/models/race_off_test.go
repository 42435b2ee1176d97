//go:build !race

package models

// raceEnabled reports whether the test binary runs under the race
// detector (see race_on_test.go).
const raceEnabled = false
