//go:build race

package stages_test

// dsparkRace reports whether the test binary runs under the race
// detector, which slows the engine's host work some tenfold: the DSpark
// engine tests then run fewer variants.
const dsparkRace = true
