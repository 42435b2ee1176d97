package jsonschema

import (
	"sync"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/grammar"
)

var (
	byteVocabOnce sync.Once
	byteVocab     *grammar.Vocab
)

// bytesVocab has one token per byte value: token b is the byte b.
func bytesVocab() *grammar.Vocab {
	byteVocabOnce.Do(func() {
		v := &grammar.Vocab{Tokens: make([][]byte, 256)}
		for b := range 256 {
			v.Tokens[b] = []byte{byte(b)}
		}
		byteVocab = v
	})
	return byteVocab
}

// compileSchema converts schema and compiles the grammar over the byte
// vocabulary.
func compileSchema(t testing.TB, schema string, opts Options) *grammar.Compiled {
	t.Helper()
	src, err := ToGBNF([]byte(schema), opts)
	if err != nil {
		t.Fatalf("ToGBNF(%s): %v", schema, err)
	}
	g, err := grammar.ParseGBNF(src)
	if err != nil {
		t.Fatalf("ParseGBNF: %v\n%s", err, src)
	}
	c, err := grammar.Compile(g, bytesVocab())
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return c
}

// accepts commits text byte by byte and reports whether the whole text is a
// complete match.
func accepts(c *grammar.Compiled, text string) bool {
	m := c.NewMatcher()
	for i := 0; i < len(text); i++ {
		if err := m.Commit(int(text[i])); err != nil {
			return false
		}
	}
	return m.IsAccepting()
}
