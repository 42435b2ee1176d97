package grammar

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// Tokenizers as engine/tokenizer's tests find them: fetched ones under
// <module root>/.cache/tokenizers (DEEPINFER_TOKENIZERS; run
// scripts/fetch-tokenizers.sh), committed ones under
// <module root>/testdata/tokenizer (DEEPINFER_TOKENIZER_TESTDATA).
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

var tokCache sync.Map // name -> *tokenizer.Tokenizer

// loadTokenizer loads a fetched (llama3, qwen3) or committed (sp_llama2)
// tokenizer, skipping the test when it is absent.
func loadTokenizer(t testing.TB, name string) *tokenizer.Tokenizer {
	t.Helper()
	if tk, ok := tokCache.Load(name); ok {
		return tk.(*tokenizer.Tokenizer)
	}
	var dir string
	switch name {
	case "sp_llama2":
		dir = os.Getenv("DEEPINFER_TOKENIZER_TESTDATA")
		if dir == "" {
			dir = filepath.Join(moduleRoot(t), "testdata", "tokenizer")
		}
	default:
		dir = os.Getenv("DEEPINFER_TOKENIZERS")
		if dir == "" {
			dir = filepath.Join(moduleRoot(t), ".cache", "tokenizers")
		}
	}
	dir = filepath.Join(dir, name)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("%s tokenizer absent (%v); run scripts/fetch-tokenizers.sh", name, err)
	}
	tk, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tokCache.Store(name, tk)
	return tk
}

// TestNewVocabBytes checks the derived bytes against the tokenizer's own
// Decode wherever Decode is lossless (valid UTF-8), after an anchor token
// so SentencePiece's leading-space strip does not apply.
func TestNewVocabBytes(t *testing.T) {
	for _, name := range []string{"sp_llama2", "llama3"} {
		t.Run(name, func(t *testing.T) {
			if (testing.Short() || raceEnabled) && name != "sp_llama2" {
				t.Skip("short or race: loading a 128k tokenizer takes seconds under the race detector")
			}
			tk := loadTokenizer(t, name)
			eos, _ := tk.TokenToID(tk.Config().EOSToken)
			v, err := NewVocab(tk, []int{eos})
			if err != nil {
				t.Fatal(err)
			}
			if len(v.Tokens) != tk.VocabSize() || v.Tokens[eos] != nil {
				t.Fatalf("%d tokens (want %d), eos bytes %q", len(v.Tokens), tk.VocabSize(), v.Tokens[eos])
			}
			anchor, ok := tk.TokenToID("a")
			if !ok {
				t.Fatal("no token \"a\"")
			}
			checked, partial := 0, 0
			step := 1
			if len(v.Tokens) > 10000 {
				step = 7 // a sample keeps the race-enabled run fast
			}
			for id := 0; id < len(v.Tokens); id += step {
				b := v.Tokens[id]
				if tk.IsSpecial(id) {
					if b != nil {
						t.Fatalf("special token %d has bytes %q", id, b)
					}
					continue
				}
				if b == nil || id == eos {
					continue
				}
				if !utf8.Valid(b) {
					partial++
					continue
				}
				if got := tk.Decode([]int{anchor, id}, false); got != "a"+string(b) {
					t.Fatalf("token %d: bytes %q, Decode gives %q", id, b, got[1:])
				}
				checked++
			}
			if checked == 0 || partial == 0 {
				t.Fatalf("checked %d tokens, %d partial UTF-8", checked, partial)
			}
		})
	}
}
