package grammar

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// synthVocab is a small vocabulary with tokens that span grammar boundaries
// (`":`, `"},`, `[[`), split multi-byte UTF-8 ("é" = C3 A9, "😀" = F0 9F 98 80)
// across tokens, duplicates, a nil (special) token and an EOS.
func synthVocab() *Vocab {
	toks := []string{
		"{", "}", "[", "]", "[[", "]]", "[{", "}]", "},", "],", ",", ", ", ":", ": ",
		`"`, `":`, `": `, `",`, `"}`, `"]`, `"},`, `""`, `"a`, `"k":`, `"k": "`, `{"`, `["`,
		"a", "ab", "abc", "k", "x", " ", "  ", "\n", "\n ", " \"",
		"é", "\xc3", "\xa9", "a\xc3", "\xa9b", "\xf0", "\x9f", "\x98\x80", "\xf0\x9f", "😀", "😀\"",
		`\`, `\"`, `\n`, `\u`, `00`, `e9`, `\u00e9`,
		"0", "1", "12", "-", "-1", ".", ".5", "e", "e+", "E-", "1,", "1]", "0}",
		"t", "tr", "true", "ue", "f", "false", "n", "null", "null}", "null]",
		`"]]`, `"}]`, `"}}`, "1]]", "0}]", `"]}]`, // leave a 4-frame context
		"abc", // duplicate bytes
		"\x01", "\x7f", "\xff",
	}
	v := &Vocab{}
	for _, s := range toks {
		v.Tokens = append(v.Tokens, []byte(s))
	}
	v.Tokens = append(v.Tokens, nil) // a special token
	v.EOS = []int{len(v.Tokens)}
	v.Tokens = append(v.Tokens, nil)
	return v
}

func mustCompile(t testing.TB, g *Grammar, v *Vocab) *Compiled {
	t.Helper()
	c, err := Compile(g, v)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// bruteMask is the reference: token t is allowed iff committing it succeeds.
func bruteMask(t *testing.T, m *Matcher, n int) []uint32 {
	mask := make([]uint32, (n+31)/32)
	for id := range n {
		if m.Commit(id) == nil {
			mask[id/32] |= 1 << (id % 32)
			if err := m.Rollback(1); err != nil {
				t.Fatal(err)
			}
		}
	}
	return mask
}

func maskIDs(mask []uint32, n int) []int {
	var ids []int
	for id := range n {
		if mask[id/32]>>(id%32)&1 != 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

func TestComputeMaskMatchesBruteForce(t *testing.T) {
	v := synthVocab()
	n := len(v.Tokens)
	grammars := map[string]string{
		"json":   jsonGBNF,
		"parens": "root ::= p*\np ::= \"[\" p* \"]\" | \"{\" p* \"}\"",
		"mixed":  `root ::= ("a" | "ab" [^"]* "\"" | "é"+ | "😀" "\"") ("," ws root)? ws` + "\nws ::= \" \"*",
	}
	for name, src := range grammars {
		t.Run(name, func(t *testing.T) {
			c := mustCompile(t, mustGBNF(t, src), v)
			for seed := range uint64(20) {
				rng := rand.New(rand.NewPCG(seed, 7))
				m := c.NewMatcher()
				var text []string
				got := make([]uint32, (n+31)/32)
				for step := 0; step < 60; step++ {
					m.ComputeMask(got)
					want := bruteMask(t, m, n)
					if !slices.Equal(got, want) {
						t.Fatalf("seed %d after %q: mask %v, brute force %v", seed, strings.Join(text, ""),
							tokStrs(v, maskIDs(got, n)), tokStrs(v, maskIDs(want, n)))
					}
					ids := maskIDs(got, n)
					if len(ids) == 0 || m.IsTerminated() {
						break
					}
					if len(text) > 2 && rng.IntN(8) == 0 {
						k := 1 + rng.IntN(2)
						if err := m.Rollback(k); err != nil {
							t.Fatal(err)
						}
						text = text[:len(text)-k]
						continue
					}
					// Prefer opening tokens early to reach depth past the cached context.
					id := ids[rng.IntN(len(ids))]
					if err := m.Commit(id); err != nil {
						t.Fatalf("commit of allowed token %q: %v", v.Tokens[id], err)
					}
					text = append(text, string(v.Tokens[id]))
				}
			}
		})
	}
}

func tokStrs(v *Vocab, ids []int) []string {
	var out []string
	for _, id := range ids {
		out = append(out, string(v.Tokens[id]))
	}
	return out
}

// TestDeepNesting drives a JSON matcher deeper than the cached context and
// checks masks against brute force on the way back out.
func TestDeepNesting(t *testing.T) {
	v := synthVocab()
	n := len(v.Tokens)
	c := mustCompile(t, mustGBNF(t, jsonGBNF), v)
	m := c.NewMatcher()
	id := func(s string) int {
		for i, b := range v.Tokens {
			if string(b) == s {
				return i
			}
		}
		t.Fatalf("no token %q", s)
		return -1
	}
	seq := []string{"[[", "[{", `"k":`, "[", `"a`, "\xc3", "\xa9b", `"]}]`, "]]"}
	got := make([]uint32, (n+31)/32)
	for _, s := range seq {
		m.ComputeMask(got)
		if want := bruteMask(t, m, n); !slices.Equal(got, want) {
			t.Fatalf("before %q: mask %v, brute force %v", s, tokStrs(v, maskIDs(got, n)), tokStrs(v, maskIDs(want, n)))
		}
		if err := m.Commit(id(s)); err != nil {
			t.Fatalf("commit %q: %v", s, err)
		}
	}
	if !m.IsAccepting() {
		t.Fatal("complete value not accepting")
	}
	unc := 0
	for _, e := range c.cache {
		unc += len(e.uncertain)
	}
	if unc == 0 {
		t.Fatal("no context had uncertain tokens: the test no longer covers checkTokens")
	}
}

func TestCommitRollback(t *testing.T) {
	v := synthVocab()
	c := mustCompile(t, mustGBNF(t, jsonGBNF), v)
	byStr := map[string]int{}
	for i, b := range v.Tokens {
		if _, ok := byStr[string(b)]; !ok && b != nil {
			byStr[string(b)] = i
		}
	}
	m := c.NewMatcher()
	n := len(v.Tokens)
	masks := [][]uint32{}
	snap := func() {
		mk := make([]uint32, (n+31)/32)
		m.ComputeMask(mk)
		masks = append(masks, mk)
	}
	snap()
	for _, s := range []string{"{", `"k": "`, "\xc3", "\xa9b", `"}`} {
		if err := m.Commit(byStr[s]); err != nil {
			t.Fatalf("commit %q: %v", s, err)
		}
		snap()
	}
	if !m.IsAccepting() {
		t.Fatal("not accepting after a complete object")
	}
	// An illegal token changes nothing.
	if err := m.Commit(byStr["}"]); err == nil {
		t.Fatal("illegal token committed")
	}
	if err := m.Commit(n + 5); err == nil {
		t.Fatal("out-of-range token committed")
	}
	if err := m.Commit(n - 2); err == nil {
		t.Fatal("nil-bytes token committed")
	}
	if err := m.Rollback(7); err == nil {
		t.Fatal("rollback past the start succeeded")
	}
	if err := m.Commit(v.EOS[0]); err != nil {
		t.Fatal(err)
	}
	if !m.IsTerminated() {
		t.Fatal("not terminated after EOS")
	}
	if err := m.Commit(byStr[" "]); err == nil {
		t.Fatal("token after EOS committed")
	}
	if err := m.Rollback(1); err != nil || m.IsTerminated() {
		t.Fatalf("rollback of EOS: %v, terminated %v", err, m.IsTerminated())
	}
	for k := len(masks) - 1; k >= 0; k-- {
		mk := make([]uint32, (n+31)/32)
		m.ComputeMask(mk)
		if !slices.Equal(mk, masks[k]) {
			t.Fatalf("after rollback to %d tokens: mask %v, want %v", k, tokStrs(v, maskIDs(mk, n)), tokStrs(v, maskIDs(masks[k], n)))
		}
		if k > 0 {
			if err := m.Rollback(1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if m.NumCommitted() != 0 {
		t.Fatalf("%d committed after rolling everything back", m.NumCommitted())
	}
}

func TestEOSOnlyWhenAccepting(t *testing.T) {
	v := synthVocab()
	eos := v.EOS[0]
	c := mustCompile(t, mustGBNF(t, `root ::= "ab" "c"?`), v)
	m := c.NewMatcher()
	mask := make([]uint32, (len(v.Tokens)+31)/32)
	has := func(id int) bool { m.ComputeMask(mask); return mask[id/32]>>(id%32)&1 != 0 }
	if has(eos) || m.Commit(eos) == nil {
		t.Fatal("EOS allowed at the start")
	}
	ab := slices.IndexFunc(v.Tokens, func(b []byte) bool { return string(b) == "ab" })
	if err := m.Commit(ab); err != nil {
		t.Fatal(err)
	}
	if !has(eos) || !m.IsAccepting() {
		t.Fatal("EOS not allowed after a complete match")
	}
	if err := m.Commit(eos); err != nil {
		t.Fatal(err)
	}
	m.ComputeMask(mask)
	if got := maskIDs(mask, len(v.Tokens)); len(got) != 0 {
		t.Fatalf("mask after EOS: %v, want empty", got)
	}
}

func TestForcedBytes(t *testing.T) {
	tests := []struct {
		src, prefix, want string
	}{
		{`root ::= "hello" [a-z]`, "", "hello"},
		{`root ::= "{\"name\": \"" [a-z]+ "\"}"`, "", `{"name": "`},
		{`root ::= "{\"name\": \"" [a-z]+ "\"}"`, `{"name": "x`, ""},
		{`root ::= "ab" ("cd" | "ce")`, "", "abc"},
		{`root ::= "ab" "cd"?`, "", "ab"},
		{`root ::= "ab" "cd"?`, "ab", ""},
		{`root ::= ("x" | "y") "z"`, "", ""},
		{`root ::= [é] "!"`, "", "é!"},
	}
	for _, tc := range tests {
		t.Run(tc.src+"/"+tc.prefix, func(t *testing.T) {
			v := &Vocab{}
			for b := range 256 {
				v.Tokens = append(v.Tokens, []byte{byte(b)})
			}
			c := mustCompile(t, mustGBNF(t, tc.src), v)
			m := c.NewMatcher()
			for _, b := range []byte(tc.prefix) {
				if err := m.Commit(int(b)); err != nil {
					t.Fatal(err)
				}
			}
			if got := string(m.ForcedBytes()); got != tc.want {
				t.Fatalf("ForcedBytes = %q, want %q", got, tc.want)
			}
			if m.NumCommitted() != len(tc.prefix) {
				t.Fatal("ForcedBytes changed the state")
			}
		})
	}
}

func TestConcurrentMatchers(t *testing.T) {
	v := synthVocab()
	c := mustCompile(t, mustGBNF(t, jsonGBNF), v)
	done := make(chan []uint32)
	for range 4 {
		go func() {
			m := c.NewMatcher()
			mask := make([]uint32, (len(v.Tokens)+31)/32)
			for _, s := range []string{"[", `"a`, `",`, "{"} {
				m.ComputeMask(mask)
				i := slices.IndexFunc(v.Tokens, func(b []byte) bool { return string(b) == s })
				if m.Commit(i) != nil {
					break
				}
			}
			m.ComputeMask(mask)
			done <- mask
		}()
	}
	first := <-done
	for range 3 {
		if got := <-done; !slices.Equal(got, first) {
			t.Fatal("concurrent matchers disagree")
		}
	}
}
