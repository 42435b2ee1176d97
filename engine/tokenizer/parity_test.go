package tokenizer

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
)

type encodeFixture struct {
	IDs     []int   `json:"ids"`
	Dec     *string `json:"dec"`      // absent: equal to the text
	DecSkip *string `json:"dec_skip"` // absent: equal to dec
}

type decodeFixture struct {
	IDs     []int  `json:"ids"`
	Dec     string `json:"dec"`
	DecSkip string `json:"dec_skip"`
}

// TestParity checks every corpus case against HF tokenizers' output for every
// tokenizer: encode ids, decode text with and without special tokens, and the
// decode of random id sequences. The acceptance is 100% equality.
func TestParity(t *testing.T) {
	corpus := loadCorpus(t)
	if len(corpus) < 10000 {
		t.Fatalf("corpus has %d cases, want at least 10000", len(corpus))
	}
	for _, name := range parityNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tk := loadNamed(t, name)
			checkCorpusParity(t, tk, name, corpus)
		})
	}
}

// checkCorpusParity checks tk against the fixtures of name: every corpus
// case encoded and decoded (with and without special tokens) and the random
// id sequences decoded, all equal to the reference; it reports the first ten
// mismatches.
func checkCorpusParity(t *testing.T, tk *Tokenizer, name string, corpus []string) {
	t.Helper()
	fx := readJSONLines[encodeFixture](t, filepath.Join(testdataDir(t), "fixtures", name+".jsonl.gz"))
	if len(fx) != len(corpus) {
		t.Fatalf("%d fixtures for %d corpus cases", len(fx), len(corpus))
	}
	var bad []string
	numEnc, numDec := 0, 0
	for i, text := range corpus {
		want := fx[i]
		got := tk.Encode(text, true)
		if !slices.Equal(got, want.IDs) {
			numEnc++
			bad = append(bad, fmt.Sprintf("case %d %q: encode\n got %v\nwant %v", i, text, got, want.IDs))
		}
		wantDec := text
		if want.Dec != nil {
			wantDec = *want.Dec
		}
		wantSkip := wantDec
		if want.DecSkip != nil {
			wantSkip = *want.DecSkip
		}
		if d := tk.Decode(want.IDs, false); d != wantDec {
			numDec++
			bad = append(bad, fmt.Sprintf("case %d: decode %v\n got %q\nwant %q", i, want.IDs, d, wantDec))
		}
		if d := tk.Decode(want.IDs, true); d != wantSkip {
			numDec++
			bad = append(bad, fmt.Sprintf("case %d: decode skip special %v\n got %q\nwant %q", i, want.IDs, d, wantSkip))
		}
	}
	rnd := readJSONLines[decodeFixture](t, filepath.Join(testdataDir(t), "fixtures", name+"_random.jsonl.gz"))
	for i, r := range rnd {
		if d := tk.Decode(r.IDs, false); d != r.Dec {
			numDec++
			bad = append(bad, fmt.Sprintf("random %d: decode %v\n got %q\nwant %q", i, r.IDs, d, r.Dec))
		}
		if d := tk.Decode(r.IDs, true); d != r.DecSkip {
			numDec++
			bad = append(bad, fmt.Sprintf("random %d: decode skip special %v\n got %q\nwant %q", i, r.IDs, d, r.DecSkip))
		}
	}
	t.Logf("%s: %d corpus cases, %d random decodes: %d encode and %d decode mismatches",
		name, len(corpus), len(rnd), numEnc, numDec)
	for i, b := range bad {
		if i == 10 {
			t.Errorf("... and %d more", len(bad)-10)
			break
		}
		t.Error(b)
	}
}
