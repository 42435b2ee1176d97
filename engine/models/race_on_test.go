//go:build race

package models

// raceEnabled reports whether the test binary runs under the race
// detector, which slows the quantizers and the pure-Go kernels some
// tenfold; heavy tests run fewer cases then.
const raceEnabled = true
