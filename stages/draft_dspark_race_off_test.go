//go:build !race

package stages_test

// dsparkRace reports whether the test binary runs under the race
// detector (see draft_dspark_race_on_test.go).
const dsparkRace = false
