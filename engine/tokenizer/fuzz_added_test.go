package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// addedFuzzJSON is a small byte-level BPE tokenizer.json with an NFC
// normalizer and added tokens exercising every matching rule: a special
// token, a longer special token it is a prefix of, lstrip and rstrip, a
// single_word token, and a normalized non-special token.
var addedFuzzJSON = func() string {
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[byteLevelRunes.str[b]] = b
	}
	merges := [][2]string{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}}
	for _, m := range merges {
		vocab[m[0]+m[1]] = len(vocab)
	}
	tok := func(content string, special, lstrip, rstrip, single, normalized bool) map[string]any {
		return map[string]any{"id": 0, "content": content, "special": special, "lstrip": lstrip,
			"rstrip": rstrip, "single_word": single, "normalized": normalized}
	}
	spec := map[string]any{
		"added_tokens": []map[string]any{
			tok("<|eot|>", true, false, false, false, false),
			tok("<|eot|><|x|>", true, false, false, false, false),
			tok("<|pad|>", true, true, true, false, false),
			tok("<sw>", false, false, false, true, false),
			tok("abc", false, false, false, false, true),
			tok("hello", false, false, false, false, true), // also in the model vocabulary
		},
		"normalizer":    map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		panic(err)
	}
	return string(b)
}()

// optionalNamed loads a fetched tokenizer when its files are present, nil
// otherwise.
func optionalNamed(t testing.TB, name string) *Tokenizer {
	dir := filepath.Join(tokenizersDir(t), name)
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Logf("%s tokenizer absent (%v): fuzzing without it; %s", name, err, fetchHint)
			return nil
		}
	}
	return loadNamed(t, name)
}

// addedContents returns the tokenizer's added-token strings, sorted.
func addedContents(tk *Tokenizer) []string {
	out := make([]string, 0, len(tk.added))
	for _, a := range tk.added {
		out = append(out, a.content)
	}
	slices.Sort(out)
	return out
}

func removeSpace(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return -1
		}
		return r
	}, s)
}

// FuzzAddedTokens interleaves arbitrary text with added-token strings and
// checks Encode and Decode on them.
//
// With the fetched Qwen3 and Llama 3 tokenizers (used when present), the text
// between tokens has no '<' (every added token of theirs starts with one), so
// the added-token ids of the encoding must be exactly the inserted tokens, in
// order; Decode must give the text back (its plain parts NFC-normalized for
// Qwen3), and with skip_special_tokens the text without its special tokens.
//
// With a small tokenizer written here (lstrip, rstrip, single_word,
// normalized and overlapping added tokens) the text is arbitrary: every id
// is in the vocabulary, each added token alone encodes to its id, and Decode
// gives the NFC text back up to the white space that lstrip and rstrip
// absorb.
func FuzzAddedTokens(f *testing.F) {
	f.Add("hello world", []byte{0, 1, 2}, "a\x00b\x00c")
	f.Add("", []byte{5}, "")
	f.Add("x", []byte{}, "e\u0301 \u00e9")
	f.Add("<|im_start|>user\nhi<|im_end|>", []byte{3, 3}, " \n ")
	f.Add("<|eot|><|x|>", []byte{200, 201}, "<|eot|>\x00<|eot|><|x")
	f.Add("a <|pad|> b", []byte{2}, "  \x00\t\n")
	f.Add("x<sw>y <sw> z<sw>", []byte{4}, "word\x00 \x00")
	f.Add("ABC abc a\u0062c ab\u0301c", []byte{}, "abc\x00abc")
	f.Add("hello<|eot|>hello", []byte{0, 0, 0, 0}, "\xff\xfe\x00\xc3")
	f.Add("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", []byte{1, 9, 255}, "<\x00<|\x00|>")
	f.Add("<think>\n\n</think>\n\n<tool_call>{}</tool_call>", []byte{17, 18, 19}, "\u4f60\u597d\x00\U0001F600")

	small, err := FromJSON([]byte(addedFuzzJSON), nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, a := range small.added {
		if got := small.Encode(a.content, false); !slices.Equal(got, []int{int(a.id)}) {
			f.Fatalf("small tokenizer: %q encodes to %v, want [%d]", a.content, got, a.id)
		}
	}
	type real struct {
		name   string
		tk     *Tokenizer
		tokens []string
	}
	var reals []real
	for _, name := range []string{"qwen3", "llama3"} {
		if tk := optionalNamed(f, name); tk != nil {
			toks := addedContents(tk)
			for _, c := range toks {
				if !strings.HasPrefix(c, "<") {
					f.Fatalf("%s: added token %q does not start with '<'; the check below relies on it", name, c)
				}
			}
			reals = append(reals, real{name, tk, toks})
		}
	}
	smallTokens := addedContents(small)

	f.Fuzz(func(t *testing.T, s string, picks []byte, parts string) {
		// The small tokenizer: arbitrary text with tokens spliced in.
		{
			var b strings.Builder
			b.WriteString(s)
			frags := strings.Split(parts, "\x00")
			for i, p := range picks {
				b.WriteString(smallTokens[int(p)%len(smallTokens)])
				if i < len(frags) {
					b.WriteString(frags[i])
				}
			}
			text := strings.ToValidUTF8(b.String(), "\uFFFD")
			ids := small.Encode(text, false)
			for _, id := range ids {
				if id < 0 || id >= small.VocabSize() {
					t.Fatalf("small: %q: id %d outside [0, %d)", text, id, small.VocabSize())
				}
			}
			got := small.Decode(ids, false)
			if want := small.normalizer.normalize(text); removeSpace(got) != removeSpace(want) {
				t.Fatalf("small: %q encodes to %v, which decodes to %q", text, ids, got)
			}
			_ = small.Decode(ids, true)
			_ = small.Encode(text, true)
		}

		// The fetched tokenizers: text free of '<' between known tokens.
		for _, r := range reals {
			var text, plain, noSpecial, seg strings.Builder
			var want []int
			frags := strings.Split(strings.ReplaceAll(strings.ToValidUTF8(s+"\x00"+parts, "\uFFFD"), "<", ""), "\x00")
			// flush ends a run of plain text: the normalizer sees each run
			// between two added tokens as a whole.
			flush := func() {
				x := seg.String()
				if r.tk.normalizer != nil {
					x = r.tk.normalizer.normalize(x)
				}
				plain.WriteString(x)
				noSpecial.WriteString(x)
				seg.Reset()
			}
			for i := 0; i < max(len(frags), len(picks)); i++ {
				if i < len(frags) {
					text.WriteString(frags[i])
					seg.WriteString(frags[i])
				}
				if i < len(picks) {
					flush()
					c := r.tokens[int(picks[i])%len(r.tokens)]
					a := r.tk.addedByText[c]
					text.WriteString(c)
					plain.WriteString(c)
					if !a.special {
						noSpecial.WriteString(c)
					}
					want = append(want, int(a.id))
				}
			}
			flush()
			ids := r.tk.Encode(text.String(), false)
			var gotAdded []int
			for _, id := range ids {
				if id < 0 || id >= r.tk.VocabSize() {
					t.Fatalf("%s: %q: id %d outside [0, %d)", r.name, text.String(), id, r.tk.VocabSize())
				}
				if _, ok := r.tk.added[id]; ok {
					gotAdded = append(gotAdded, id)
				}
			}
			if !slices.Equal(gotAdded, want) {
				t.Fatalf("%s: %q: added-token ids %v, want %v (all ids %v)", r.name, text.String(), gotAdded, want, ids)
			}
			if got := r.tk.Decode(ids, false); got != plain.String() {
				t.Fatalf("%s: %q decodes to %q, want %q", r.name, text.String(), got, plain.String())
			}
			if got := r.tk.Decode(ids, true); got != noSpecial.String() {
				t.Fatalf("%s: %q decodes (skipping special tokens) to %q, want %q", r.name, text.String(), got, noSpecial.String())
			}
		}
	})
}
