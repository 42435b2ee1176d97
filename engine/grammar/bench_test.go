package grammar

import (
	"sort"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine/grammar/jsonschema"
)

// jsonPrefix is the text a benchmark matcher commits, byte token by byte
// token, before measuring; the positions sampled are inside it.
const jsonPrefix = `{"name": "Ada Lovelace", "born": 1815, "tags": ["math", "poetry"], "nested": {"deep": [[{"x": true}]], "s": "caf`

// benchMatchers returns Llama 3's vocabulary compiled with the JSON grammar
// and matchers at several positions of jsonPrefix (after each of a set of
// byte offsets), with the cache warmed.
func benchMatchers(b *testing.B) (*Compiled, []*Matcher) {
	tk := loadTokenizer(b, "llama3")
	eos, _ := tk.TokenToID(tk.Config().EOSToken)
	v, err := NewVocab(tk, []int{eos})
	if err != nil {
		b.Fatal(err)
	}
	c := mustCompile(b, mustGBNF(b, jsonGBNF), v)
	byteTok := make(map[byte]int)
	for id, t := range v.Tokens {
		if len(t) == 1 {
			if _, ok := byteTok[t[0]]; !ok {
				byteTok[t[0]] = id
			}
		}
	}
	var ms []*Matcher
	mask := make([]uint32, (len(v.Tokens)+31)/32)
	for cut := 0; cut <= len(jsonPrefix); cut += 3 {
		m := c.NewMatcher()
		for i := 0; i < cut; i++ {
			if err := m.Commit(byteTok[jsonPrefix[i]]); err != nil {
				b.Fatalf("commit %q at %d: %v", jsonPrefix[i], i, err)
			}
		}
		m.ComputeMask(mask) // warm the cache
		ms = append(ms, m)
	}
	return c, ms
}

// BenchmarkComputeMask measures one mask over Llama 3's 128k vocabulary with
// a JSON grammar, cycling over positions inside an object (keys, strings,
// numbers, nested arrays), with the context cache warm. It reports p50 and
// p99 over the positions' individual timings.
func BenchmarkComputeMask(b *testing.B) {
	c, ms := benchMatchers(b)
	mask := make([]uint32, c.words)
	var lat []time.Duration
	b.ResetTimer()
	for i := range b.N {
		m := ms[i%len(ms)]
		t0 := time.Now()
		m.ComputeMask(mask)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkCompile measures building the trie for Llama 3 plus the JSON
// grammar's start contexts, and the cold cost of filling the contexts met
// along jsonPrefix.
func BenchmarkCompile(b *testing.B) {
	for range b.N {
		benchMatchers(b)
	}
}

// TestLlama3JSONMaskBruteForce checks masks on the real vocabulary against
// Commit at a few positions, on every 11th id (a sample keeps the
// race-enabled run fast; the synthetic tests check every id). Skipped when
// the tokenizer is absent, with -short, or with -race (cold contexts are
// whole-vocabulary trie walks, ten times slower under the race detector).
func TestLlama3JSONMaskBruteForce(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("short or race")
	}
	tk := loadTokenizer(t, "llama3")
	eos, _ := tk.TokenToID(tk.Config().EOSToken)
	v, err := NewVocab(tk, []int{eos})
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, mustGBNF(t, jsonGBNF), v)
	n := len(v.Tokens)
	for _, prefix := range []string{"", `{"a`, `{"a": [1`, `[[[[[{"k": "v`, `[[[[[{"k": 12`} {
		m := c.NewMatcher()
		for _, id := range tk.Encode(prefix, false) {
			if err := m.Commit(id); err != nil {
				t.Fatalf("%q: %v", prefix, err)
			}
		}
		got := make([]uint32, (n+31)/32)
		m.ComputeMask(got)
		for id := 0; id < n; id += 11 {
			err := m.Commit(id)
			if err == nil {
				if rerr := m.Rollback(1); rerr != nil {
					t.Fatal(rerr)
				}
			}
			if inMask := got[id/32]>>(id%32)&1 != 0; inMask != (err == nil) {
				t.Fatalf("%q: token %d %q: in mask %v, Commit error %v", prefix, id, v.Tokens[id], inMask, err)
			}
		}
		t.Logf("%q: %d tokens allowed", prefix, len(maskIDs(got, n)))
	}
}

// On Llama 3's vocabulary, an object schema with additionalProperties (its
// extra keys' first characters exclude the declared names', a wide class
// walked through the shared wild walk): wild walks narrowed equal walks,
// and masks agree with Commit. Skipped as TestLlama3JSONMaskBruteForce is.
func TestLlama3ExtraKeysMaskBruteForce(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("short or race")
	}
	tk := loadTokenizer(t, "llama3")
	eos, _ := tk.TokenToID(tk.Config().EOSToken)
	v, err := NewVocab(tk, []int{eos})
	if err != nil {
		t.Fatal(err)
	}
	src, err := jsonschema.ToGBNF([]byte(`{"type":"object","properties":{"name":{"type":"string"},"nick":{"type":"string"},"id":{"type":"integer"}},"additionalProperties":{"type":"integer"}}`),
		jsonschema.Options{Whitespace: "python"})
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, mustGBNF(t, src), v)
	prefixes := []string{`{"`, `{"n`, `{"ni`, `{"nam`, `{"name": "x", "`, `{"id": 1, "q`, `{"nice`, `{"x\u00`}
	checkWildWalks(t, c, prefixes)
	n := len(v.Tokens)
	for _, prefix := range prefixes {
		m := c.NewMatcher()
		for _, id := range tk.Encode(prefix, false) {
			if err := m.Commit(id); err != nil {
				t.Fatalf("%q: %v", prefix, err)
			}
		}
		got := make([]uint32, (n+31)/32)
		m.ComputeMask(got)
		for id := 0; id < n; id += 7 {
			err := m.Commit(id)
			if err == nil {
				if rerr := m.Rollback(1); rerr != nil {
					t.Fatal(rerr)
				}
			}
			if inMask := got[id/32]>>(id%32)&1 != 0; inMask != (err == nil) {
				t.Fatalf("%q: token %d %q: in mask %v, Commit error %v", prefix, id, v.Tokens[id], inMask, err)
			}
		}
	}
}
