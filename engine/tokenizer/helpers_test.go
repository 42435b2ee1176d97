package tokenizer

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Test data locations. The real tokenizer files are fetched, not committed:
// scripts/fetch-tokenizers.sh puts them in <module root>/.cache/tokenizers
// (override with DEEPINFER_TOKENIZERS). Committed fixtures live in
// <module root>/testdata/tokenizer (override with DEEPINFER_TOKENIZER_TESTDATA).
const fetchHint = "run scripts/fetch-tokenizers.sh from the repository root first"

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

func tokenizersDir(t testing.TB) string {
	if d := os.Getenv("DEEPINFER_TOKENIZERS"); d != "" {
		return d
	}
	return filepath.Join(moduleRoot(t), ".cache", "tokenizers")
}

func testdataDir(t testing.TB) string {
	if d := os.Getenv("DEEPINFER_TOKENIZER_TESTDATA"); d != "" {
		return d
	}
	return filepath.Join(moduleRoot(t), "testdata", "tokenizer")
}

// The names of the tokenizers under test: three fetched, two committed.
var parityNames = []string{"qwen3", "llama3", "gpt2", "sp_llama2", "sp_meta"}

var loaded struct {
	sync.Mutex
	m map[string]*Tokenizer
}

// loadNamed loads one of parityNames once per test binary. A missing fetched
// file fails the test with the set-up command to run.
func loadNamed(t testing.TB, name string) *Tokenizer {
	t.Helper()
	loaded.Lock()
	defer loaded.Unlock()
	if tk, ok := loaded.m[name]; ok {
		return tk
	}
	var tk *Tokenizer
	var err error
	switch name {
	case "gpt2":
		dir := filepath.Join(tokenizersDir(t), "gpt2")
		requireFiles(t, filepath.Join(dir, "encoder.json"), filepath.Join(dir, "vocab.bpe"))
		tk, err = LoadGPT2(filepath.Join(dir, "encoder.json"), filepath.Join(dir, "vocab.bpe"))
	case "qwen3", "llama3", "gemma3", "gptoss":
		dir := filepath.Join(tokenizersDir(t), name)
		requireFiles(t, filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json"))
		tk, err = Load(dir)
	default:
		dir := filepath.Join(testdataDir(t), name)
		requireFiles(t, filepath.Join(dir, "tokenizer.json"))
		tk, err = Load(dir)
	}
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	if loaded.m == nil {
		loaded.m = make(map[string]*Tokenizer)
	}
	loaded.m[name] = tk
	return tk
}

func requireFiles(t testing.TB, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("tokenizer file missing: %v; %s", err, fetchHint)
		}
	}
}

// readJSONLines decodes each line of a (gzip-compressed if .gz) JSON-lines
// file into a new T.
func readJSONLines[T any](t testing.TB, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r *bufio.Reader
	if filepath.Ext(path) == ".gz" {
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer zr.Close()
		r = bufio.NewReaderSize(zr, 1<<20)
	} else {
		r = bufio.NewReaderSize(f, 1<<20)
	}
	var out []T
	dec := json.NewDecoder(r)
	for dec.More() {
		var v T
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%s: record %d: %v", path, len(out), err)
		}
		out = append(out, v)
	}
	return out
}

func loadCorpus(t testing.TB) []string {
	return readJSONLines[string](t, filepath.Join(testdataDir(t), "corpus.jsonl.gz"))
}
