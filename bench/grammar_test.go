package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// writeASCIITokenizer writes into dir a tokenizer.json whose vocabulary is
// "<unk>" and one token per printable ASCII character (no merges, no
// pre-tokenizer), so a text encodes to one token per character.
func writeASCIITokenizer(t testing.TB, dir string) {
	t.Helper()
	vocab := map[string]int{"<unk>": 0}
	for c := ' '; c <= '~'; c++ {
		vocab[string(c)] = len(vocab)
	}
	spec := map[string]any{
		"version": "1.0",
		"added_tokens": []map[string]any{
			{"id": 0, "content": "<unk>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false},
		},
		"normalizer": nil, "pre_tokenizer": nil, "post_processor": nil,
		"decoder": map[string]any{"type": "Fuse"},
		"model":   map[string]any{"type": "BPE", "unk_token": "<unk>", "vocab": vocab, "merges": []string{}},
	}
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

type maskTest struct {
	valid bool
	text  string
}

// writeMaskBenchFile writes a MaskBench file: schema and tests.
func writeMaskBenchFile(t testing.TB, dir, name, schema string, tests ...maskTest) {
	t.Helper()
	var ts []map[string]any
	for i, x := range tests {
		var data any
		if err := json.Unmarshal([]byte(x.text), &data); err != nil {
			t.Fatalf("%s test %d: %v", name, i, err)
		}
		ts = append(ts, map[string]any{"description": "t", "valid": x.valid, "data": data, "text": x.text})
	}
	f := map[string]any{"description": name, "schema": json.RawMessage(schema), "tests": ts}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Texts of the test data and where the grammar refuses them (the index of
// the first refused character; -1: accepted to the end).
const (
	personValid   = `{"name": "bo", "age": 3}`
	personInvalid = `{"name": "bo", "age": "x"}`
)

// writeGrammarData writes four files, one per outcome: a.json passes (a
// valid and an invalid instance), b.json uses patternProperties (a compile
// error), c.json has a format outside JSON Schema's vocabulary (an
// annotation the grammar ignores) that its invalid instance 1 violates
// (accepted: an invalidation error) and d.json is an integer written 1.0 (valid in JSON Schema,
// refused by the grammar: a validation error).
func writeGrammarData(t testing.TB, dir string) {
	t.Helper()
	writeMaskBenchFile(t, dir, "a.json",
		`{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false}`,
		maskTest{true, personValid}, maskTest{false, personInvalid})
	writeMaskBenchFile(t, dir, "b.json", `{"type": "object", "patternProperties": {"^x": {"type": "string"}}}`,
		maskTest{true, `{"xa": "1"}`})
	writeMaskBenchFile(t, dir, "c.json", `{"type": "string", "format": "hex-color"}`,
		maskTest{true, `"#a0b1c2"`}, maskTest{false, `"blue"`})
	writeMaskBenchFile(t, dir, "d.json", `{"type": "integer"}`,
		maskTest{true, `1.0`}, maskTest{false, `"x"`})
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("not a data file"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func loadASCIITokenizer(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	dir := t.TempDir()
	writeASCIITokenizer(t, dir)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// RunGrammar's counts on the four files, exactly: one file per outcome,
// the per-instance counts of the files that compiled, and one timed mask
// per token up to the first refused one.
func TestRunGrammar(t *testing.T) {
	tok := loadASCIITokenizer(t)
	data := t.TempDir()
	writeGrammarData(t, data)
	for _, ws := range []string{"", "python"} {
		t.Run("whitespace="+ws, func(t *testing.T) {
			r, err := RunGrammar(context.Background(), GrammarOptions{DataDir: data, Tokenizer: tok, TokenizerName: "ascii", Whitespace: ws})
			if err != nil {
				t.Fatal(err)
			}
			wantWS := ws
			if ws == "" {
				wantWS = "flexible"
			}
			if r.Mode != "grammar" || r.Whitespace != wantWS || r.TimeoutSeconds != 10 || r.VocabSize != 96 || r.CPU == "" {
				t.Errorf("header: %+v", r)
			}
			if r.Files != 4 || r.Passing != 1 || r.CompileErrors != 1 || r.Timeouts != 0 || r.ValidationErrors != 1 || r.InvalidationErrors != 1 {
				t.Errorf("files %d passing %d compile %d timeouts %d validation %d invalidation %d, want 4 1 1 0 1 1",
					r.Files, r.Passing, r.CompileErrors, r.Timeouts, r.ValidationErrors, r.InvalidationErrors)
			}
			if len(r.CompileErrorKeywords) != 1 || r.CompileErrorKeywords[0] != (KeywordCount{"patternProperties", 1}) {
				t.Errorf("compile error keywords %+v", r.CompileErrorKeywords)
			}
			if r.Tests != 6 || r.ValidTests != 3 || r.InvalidTests != 3 || r.TestValidationErrors != 1 || r.TestInvalidationErrors != 1 || r.MaskCommitMismatches != 0 {
				t.Errorf("tests %d valid %d invalid %d refused valid %d accepted invalid %d mismatches %d, want 6 3 3 1 1 0",
					r.Tests, r.ValidTests, r.InvalidTests, r.TestValidationErrors, r.TestInvalidationErrors, r.MaskCommitMismatches)
			}
			// Masks per file: every character of an accepted text, up to and
			// including the refused one otherwise.
			wantMasks := map[string]int{
				"a.json": len(personValid) + strings.Index(personInvalid, `"x"`) + 1,
				"b.json": 0,
				"c.json": len(`"#a0b1c2"`) + len(`"blue"`),
				"d.json": len("1.") + len(`"`),
			}
			wantStatus := map[string]string{"a.json": GrammarPass, "b.json": GrammarCompileError, "c.json": GrammarInvalidationError, "d.json": GrammarValidationError}
			total := 0
			for _, f := range r.Results {
				if f.Status != wantStatus[f.Name] || f.Masks != wantMasks[f.Name] {
					t.Errorf("%s: status %s, %d masks; want %s, %d", f.Name, f.Status, f.Masks, wantStatus[f.Name], wantMasks[f.Name])
				}
				if (f.TTFMMicros > 0) != (f.Status != GrammarCompileError) {
					t.Errorf("%s: TTFM %v µs with status %s", f.Name, f.TTFMMicros, f.Status)
				}
				total += f.Masks
			}
			if r.TTFM.Count != 3 || r.Mask.Count != total || r.Mask.P25 > r.Mask.P50 || r.Mask.P50 > r.Mask.P999 || r.Mask.P999 > r.Mask.Max || r.Mask.Max <= 0 {
				t.Errorf("percentiles: TTFM %+v, mask %+v (want %d masks)", r.TTFM, r.Mask, total)
			}
			if b := r.Results[1]; b.Keyword != "patternProperties" || !strings.Contains(b.Error, "patternProperties") {
				t.Errorf("b.json: %+v", b)
			}
		})
	}
}

// --limit, a timeout every file runs into, an interrupted run, and data
// files that cannot be run.
func TestRunGrammarLimits(t *testing.T) {
	tok := loadASCIITokenizer(t)
	data := t.TempDir()
	writeGrammarData(t, data)
	r, err := RunGrammar(context.Background(), GrammarOptions{DataDir: data, Tokenizer: tok, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.Files != 2 || r.Passing != 1 || r.CompileErrors != 1 || r.Results[1].Name != "b.json" {
		t.Errorf("limit 2: %+v", r)
	}

	r, err = RunGrammar(context.Background(), GrammarOptions{DataDir: data, Tokenizer: tok, Timeout: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	// The deadline stops the conversion too: even the compile error is a
	// timeout.
	if r.Files != 4 || r.Timeouts != 4 || r.CompileErrors != 0 || r.Passing != 0 || r.Tests != 0 || r.TimeoutSeconds != 1e-9 {
		t.Errorf("1ns timeout: %+v", r)
	}
	for _, f := range r.Results {
		if f.Status != GrammarTimeout || !strings.Contains(f.Error, "deadline") {
			t.Errorf("1ns timeout: %+v", f)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, err = RunGrammar(ctx, GrammarOptions{DataDir: data, Tokenizer: tok})
	if err != nil || !r.Interrupted || r.Files != 0 {
		t.Errorf("cancelled: %+v, %v", r, err)
	}

	if _, err := RunGrammar(context.Background(), GrammarOptions{DataDir: t.TempDir(), Tokenizer: tok}); err == nil || !strings.Contains(err.Error(), "no .json files") {
		t.Errorf("empty folder: %v", err)
	}
	if _, err := RunGrammar(context.Background(), GrammarOptions{DataDir: data}); err == nil {
		t.Error("no tokenizer: no error")
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "x.json"), []byte(`{"schema": {}, "tests": [{"valid": true, "data": 1}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := RunGrammar(context.Background(), GrammarOptions{DataDir: bad, Tokenizer: tok}); err == nil || !strings.Contains(err.Error(), `no "text"`) {
		t.Errorf("test without text: %v", err)
	}
}

func TestGrammarPercentiles(t *testing.T) {
	xs := make([]float64, 1000)
	for i := range xs {
		xs[i] = float64(1000 - i) // 1..1000, reversed
	}
	p := grammarPercentiles(xs)
	want := GrammarPercentiles{Count: 1000, Mean: 500.5, P25: 250, P50: 500, P75: 750, P90: 900, P95: 950, P99: 990, P999: 999, Max: 1000}
	if p != want {
		t.Errorf("got %+v\nwant %+v", p, want)
	}
	if xs[0] != 1000 {
		t.Error("input sorted in place")
	}
	if (grammarPercentiles(nil) != GrammarPercentiles{}) {
		t.Error("empty sample")
	}
}
