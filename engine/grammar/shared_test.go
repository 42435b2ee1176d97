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

// wideContexts returns the contexts of c's start state after text (one
// byte token at a time) whose top class is wide enough for a wild walk.
func wideContexts(t *testing.T, c *Compiled, text string) []ctxKey {
	t.Helper()
	w := newWalker(c.g)
	l := w.initial(c.g.start)
	for i := 0; i < len(text); i++ {
		l = w.advance(l, text[i])
		if l.e == l.s {
			t.Fatalf("%q refused at %d", text, i)
		}
	}
	var ks []ctxKey
	for i := l.s; i < l.e; i++ {
		k := keyOf(w, w.tops[i])
		if c.g.classes[c.g.elems[k[0]].arg].count() >= wideClass {
			ks = append(ks, k)
		}
	}
	return ks
}

// checkWildWalks compares, for every wide-class context after each text,
// the walk of the context with the wild walk narrowed by firstIn: the same
// accepted tokens, uncertain tokens and exits.
func checkWildWalks(t *testing.T, c *Compiled, texts []string) {
	t.Helper()
	n := len(c.v.Tokens)
	checked := 0
	for _, text := range texts {
		for _, k := range wideContexts(t, c, text) {
			last := ctxDepth
			for last > 0 && k[last] < 0 {
				last--
			}
			bottom := restEmpty
			if k[ctxDepth+1] == 1 {
				bottom = restSentinel
			}
			want, err := c.walk(k[:last+1], bottom, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			w, err := c.walk(k[:last+1], bottom, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := c.firstIn(w, &c.g.classes[c.g.elems[k[0]].arg])
			accepted := func(r *walkResult) []int {
				if r.bits != nil {
					return maskIDs(r.bits, n)
				}
				var ids []int
				for _, id := range r.ids {
					ids = append(ids, int(id))
				}
				slices.Sort(ids)
				return ids
			}
			if a, b := accepted(got), accepted(want); !slices.Equal(a, b) {
				t.Fatalf("after %q, context %v: wild walk accepts %d tokens, walk %d", text, k, len(a), len(b))
			}
			if !slices.Equal(got.unc, want.unc) || !slices.Equal(got.exits, want.exits) {
				t.Fatalf("after %q, context %v: wild walk has %d uncertain and %d exits, walk %d and %d",
					text, k, len(got.unc), len(got.exits), len(want.unc), len(want.exits))
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no wide-class context met")
	}
}

// keyGBNF is an object whose extra keys exclude the declared key "ak" (as
// the JSON Schema converter writes additionalProperties): the first
// character's class leaves out the declared first character.
const keyGBNF = `root ::= "{" (kv ("," kv)*)? "}"
kv ::= key ":" ("1" | "12")
key ::= "\"" ("\"" | "a" key-a | [^"\\\x00-\x1Fa] tail | esc tail)
key-a ::= "\"" | "k" key-ak | [^"\\\x00-\x1Fk] tail | esc tail
key-ak ::= char tail
tail ::= char* "\""
char ::= [^"\\\x00-\x1F] | esc
esc ::= "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})`

// The walk of a wide-class context (a key's first character, any but the
// declared names') narrowed from the wild walk (its class taken as every
// byte) equals its own walk, and masks match brute force.
func TestWildWalkMatchesWalk(t *testing.T) {
	v := synthVocab()
	n := len(v.Tokens)
	c := mustCompile(t, mustGBNF(t, keyGBNF), v)
	texts := []string{`{"`, `{"a`, `{"ak`, `{"k":1,"`, `{"x`}
	checkWildWalks(t, c, texts)
	// A second grammar whose class excludes another character shares the
	// wild walk; its masks match brute force.
	c2 := mustCompile(t, mustGBNF(t, strings.NewReplacer(`"a" key-a`, `"x" key-a`, `a] tail`, `x] tail`).Replace(keyGBNF)), v)
	for _, cc := range []*Compiled{c, c2} {
		for _, text := range append(texts, `{"akk`, `{"a\`, `{"xk`, `{"k`) {
			m := cc.NewMatcher()
			commitText(t, v, m, text)
			got := make([]uint32, (n+31)/32)
			m.ComputeMask(got)
			if want := bruteMask(t, m, n); !slices.Equal(got, want) {
				t.Fatalf("after %q: mask %v, brute force %v", text, tokStrs(v, maskIDs(got, n)), tokStrs(v, maskIDs(want, n)))
			}
		}
	}
}
