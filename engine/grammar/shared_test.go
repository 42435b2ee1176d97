package grammar

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// Two object grammars with different keys share the string rule: the
// second one's string contexts come from the Vocab's shared entries (no new
// walk), and its masks still match brute force.
func TestSharedEntriesAcrossGrammars(t *testing.T) {
	v := synthVocab()
	n := len(v.Tokens)
	const str = `string ::= "\"" ([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""`
	g1 := mustGBNF(t, `root ::= "{\"k\": " string ", \"a\": " ("1" | "12") "}"`+"\n"+str)
	g2 := mustGBNF(t, `root ::= "[" string ("," string)* "]"`+"\n"+str)
	c1 := mustCompile(t, g1, v)
	m1 := c1.NewMatcher()
	mask := make([]uint32, (n+31)/32)
	commitText(t, v, m1, `{"k": "ak`)
	m1.ComputeMask(mask)
	if want := bruteMask(t, m1, n); !slices.Equal(mask, want) {
		t.Fatalf("grammar 1 in a string: mask %v, brute force %v", tokStrs(v, maskIDs(mask, n)), tokStrs(v, maskIDs(want, n)))
	}
	shared := v.NumSharedContexts()

	c2 := mustCompile(t, g2, v)
	m2 := c2.NewMatcher()
	commitText(t, v, m2, `["ak`)
	before := v.NumSharedContexts()
	m2.ComputeMask(mask)
	if got := v.NumSharedContexts(); got != before {
		t.Errorf("grammar 2's string context made %d new shared entries, want 0 (reused)", got-before)
	}
	if want := bruteMask(t, m2, n); !slices.Equal(mask, want) {
		t.Fatalf("grammar 2 in a string: mask %v, brute force %v", tokStrs(v, maskIDs(mask, n)), tokStrs(v, maskIDs(want, n)))
	}
	// The continuations differ: after the string, grammar 1 wants `, "a": `
	// and grammar 2 a comma or "]".
	if id := tokenID(t, v, `"]`); mask[id/32]>>(id%32)&1 == 0 {
		t.Errorf(`grammar 2 refuses "] after a string`)
	}
	m1.ComputeMask(mask)
	if id := tokenID(t, v, `"]`); mask[id/32]>>(id%32)&1 != 0 {
		t.Errorf(`grammar 1 allows "] after a string`)
	}
	if id := tokenID(t, v, `",`); mask[id/32]>>(id%32)&1 == 0 {
		t.Errorf(`grammar 1 refuses ", after a string`)
	}
	if shared == 0 {
		t.Error("no shared entries after grammar 1")
	}
}

// Random walks through several grammars compiled against one Vocab (so
// later grammars reuse earlier ones' shared entries) agree with brute force
// at every step.
func TestSharedMasksMatchBruteForce(t *testing.T) {
	v := synthVocab()
	n := len(v.Tokens)
	srcs := []string{
		jsonGBNF,
		`root ::= "{" ws ("\"k\"" ws ":" ws string ("," ws "\"a\"" ws ":" ws number)?)? ws "}"` + "\n" + jsonGBNF[strings.Index(jsonGBNF, "string ::="):],
		`root ::= "[" (string ("," " "? string)*)? "]"` + "\nstring ::= \"\\\"\" [a-z\\u00e9]{0,3} \"\\\"\"",
		"root ::= item+\nitem ::= \"[\" [a-c]* \"]\" | \"\\\"\" ([^\"] | \"\\\\\\\"\")* \"\\\"\" \",\"?",
	}
	for gi, src := range srcs {
		c := mustCompile(t, mustGBNF(t, src), v)
		for seed := range uint64(15) {
			rng := rand.New(rand.NewPCG(seed, uint64(gi)))
			m := c.NewMatcher()
			var text []string
			got := make([]uint32, (n+31)/32)
			for step := 0; step < 40; step++ {
				m.ComputeMask(got)
				if want := bruteMask(t, m, n); !slices.Equal(got, want) {
					t.Fatalf("grammar %d seed %d after %q: mask %v, brute force %v", gi, seed, strings.Join(text, ""),
						tokStrs(v, maskIDs(got, n)), tokStrs(v, maskIDs(want, n)))
				}
				ids := maskIDs(got, n)
				if len(ids) == 0 || m.IsTerminated() {
					break
				}
				id := ids[rng.IntN(len(ids))]
				if err := m.Commit(id); err != nil {
					t.Fatalf("commit of allowed token %q: %v", v.Tokens[id], err)
				}
				text = append(text, string(v.Tokens[id]))
			}
		}
	}
}

func TestCompileContextCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := CompileContext(ctx, mustGBNF(t, jsonGBNF), synthVocab())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("CompileContext with a cancelled context: %v, want context.Canceled", err)
	}
}

// A start state of many stacks (a large alternation) runs past a small
// step budget inside its trie walk; a large budget is enough.
func TestCompileBudget(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("root ::= ")
	for i := range 500 {
		if i > 0 {
			sb.WriteString(" | ")
		}
		sb.WriteString(`"\"` + strings.Repeat("a", i%7) + `"`)
	}
	g := mustGBNF(t, sb.String())
	v := synthVocab()
	_, err := CompileWith(g, v, CompileOptions{MaxSteps: 100})
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("CompileWith(MaxSteps: 100): %v, want ErrBudget", err)
	}
	c, err := CompileWith(g, v, CompileOptions{MaxSteps: 1 << 30, Context: context.Background()})
	if err != nil {
		t.Fatal(err)
	}
	m := c.NewMatcher()
	mask := make([]uint32, (len(v.Tokens)+31)/32)
	m.ComputeMask(mask)
	if want := bruteMask(t, m, len(v.Tokens)); !slices.Equal(mask, want) {
		t.Fatalf("mask %v, brute force %v", tokStrs(v, maskIDs(mask, len(v.Tokens))), tokStrs(v, maskIDs(want, len(v.Tokens))))
	}
}

func tokenID(t *testing.T, v *Vocab, s string) int {
	t.Helper()
	for id, b := range v.Tokens {
		if string(b) == s {
			return id
		}
	}
	t.Fatalf("no token %q", s)
	return -1
}

// commitText commits text one single-byte token at a time.
func commitText(t *testing.T, v *Vocab, m *Matcher, text string) {
	t.Helper()
	for i := 0; i < len(text); i++ {
		if err := m.Commit(tokenID(t, v, text[i:i+1])); err != nil {
			t.Fatalf("commit %q at %d: %v", text[i], i, err)
		}
	}
}

// Grammars compiled concurrently against one Vocab fill its shared entries
// from many goroutines; every matcher's masks still match brute force.
func TestConcurrentCompilesShareEntries(t *testing.T) {
	v := synthVocab()
	n := len(v.Tokens)
	srcs := []string{
		jsonGBNF,
		`root ::= "[" (string ("," string)*)? "]"` + "\n" + jsonGBNF[strings.Index(jsonGBNF, "string ::="):],
		`root ::= "{\"k\": " string "}"` + "\n" + jsonGBNF[strings.Index(jsonGBNF, "string ::="):],
	}
	texts := []string{`{"k": [1, "ak`, `["a","k`, `{"k": "ak`}
	errs := make(chan error, 3*4)
	for w := range 4 {
		for i, src := range srcs {
			go func() {
				g, err := ParseGBNF(src)
				if err != nil {
					errs <- err
					return
				}
				c, err := CompileContext(context.Background(), g, v)
				if err != nil {
					errs <- err
					return
				}
				m := c.NewMatcher()
				mask := make([]uint32, (n+31)/32)
				for j := 0; j < len(texts[i]); j++ {
					m.ComputeMask(mask)
					id := -1
					for tid, b := range v.Tokens {
						if string(b) == texts[i][j:j+1] {
							id = tid
							break
						}
					}
					if err := m.Commit(id); err != nil {
						errs <- err
						return
					}
				}
				m.ComputeMask(mask)
				var want []uint32
				want = make([]uint32, len(mask))
				for id := range n {
					if m.Commit(id) == nil {
						want[id/32] |= 1 << (id % 32)
						if err := m.Rollback(1); err != nil {
							errs <- err
							return
						}
					}
				}
				if !slices.Equal(mask, want) {
					errs <- errors.New("grammar " + string(rune('0'+i)) + " worker " + string(rune('0'+w)) + ": mask differs from brute force")
					return
				}
				errs <- nil
			}()
		}
	}
	for range 3 * 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
