//go:build !race

package server

// raceDetector reports whether the test binary runs under the race
// detector, which slows encoding/json and copying some tenfold.
const raceDetector = false
