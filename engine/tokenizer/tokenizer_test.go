package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// tinyByteLevelJSON is a small GPT-2-style tokenizer.json: the 256 byte
// tokens, a few merges, <|eot|> as a special token.
var tinyByteLevelJSON = func() string {
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[byteLevelRunes.str[b]] = b
	}
	merges := [][2]string{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}}
	for _, m := range merges {
		vocab[m[0]+m[1]] = len(vocab)
	}
	spec := map[string]any{
		"added_tokens":  []map[string]any{{"id": len(vocab), "content": "<|eot|>", "special": true, "normalized": false}},
		"normalizer":    nil,
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

func TestTinyByteLevel(t *testing.T) {
	tk, err := FromJSON([]byte(tinyByteLevelJSON), nil)
	if err != nil {
		t.Fatal(err)
	}
	eot := 262
	tests := []struct {
		text string
		want []int
	}{
		{"", nil},
		{"hello", []int{261}},
		{"hello the", []int{261, 258}},
		{"hello<|eot|>the", []int{261, eot, 't', 257}},
		{"é", []int{0xC3, 0xA9}},
	}
	for _, tc := range tests {
		got := tk.Encode(tc.text, true)
		if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
		}
		if d := tk.Decode(got, false); d != tc.text {
			t.Errorf("Decode(Encode(%q)) = %q", tc.text, d)
		}
	}
	if d := tk.Decode([]int{261, eot, 258}, true); d != "hello the" {
		t.Errorf("skip special: %q", d)
	}
	if !tk.IsSpecial(eot) || tk.IsSpecial(261) {
		t.Error("IsSpecial")
	}
	if id, ok := tk.TokenToID("<|eot|>"); !ok || id != eot {
		t.Errorf("TokenToID = %d, %v", id, ok)
	}
	if tok, ok := tk.IDToToken(258); !ok || tok != "Ġthe" {
		t.Errorf("IDToToken = %q, %v", tok, ok)
	}
	if tk.VocabSize() != 263 {
		t.Errorf("VocabSize = %d", tk.VocabSize())
	}
}

func TestUnsupportedComponents(t *testing.T) {
	var base map[string]any
	if err := json.Unmarshal([]byte(tinyByteLevelJSON), &base); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		field string
		value any
		name  string
	}{
		{"normalizer", map[string]any{"type": "BertNormalizer"}, "BertNormalizer"},
		{"normalizer", map[string]any{"type": "Precompiled", "precompiled_charsmap": "AAAA"}, "Precompiled"},
		{"pre_tokenizer", map[string]any{"type": "BertPreTokenizer"}, "BertPreTokenizer"},
		{"post_processor", map[string]any{"type": "RobertaProcessing"}, "RobertaProcessing"},
		{"decoder", map[string]any{"type": "WordPiece"}, "WordPiece"},
		{"model", map[string]any{"type": "Unigram", "vocab": []any{}}, "Unigram"},
	}
	for _, tc := range tests {
		spec := map[string]any{}
		for k, v := range base {
			spec[k] = v
		}
		spec[tc.field] = tc.value
		b, _ := json.Marshal(spec)
		_, err := FromJSON(b, nil)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s %s: err = %v, want ErrUnsupported naming it", tc.field, tc.name, err)
		}
	}
}

func TestLossyUTF8(t *testing.T) {
	// Expected values follow Rust's String::from_utf8_lossy (maximal subparts).
	tests := []struct {
		in   string
		want string
	}{
		{"abc", "abc"},
		{"\xe4\xbd\xa0", "你"},
		{"\xe4\xbd", "\uFFFD"},
		{"\xe4\xbdA", "\uFFFDA"},
		{"\x80\x80", "\uFFFD\uFFFD"},
		{"\xf0\x9f\x98", "\uFFFD"},
		{"\xf0\x9f\x98\x80", "😀"},
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: ED then A0 is out of range
		{"\xe0\x80\x80", "\uFFFD\uFFFD\uFFFD"},
		{"\xc0\xaf", "\uFFFD\uFFFD"},
		{"\xf4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"a\xffb", "a\uFFFDb"},
	}
	for _, tc := range tests {
		if got := lossyString([]byte(tc.in)); got != tc.want {
			t.Errorf("lossy(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDecoders(t *testing.T) {
	tests := []struct {
		name string
		d    decoder
		in   []string
		want string
	}{
		{"byte fallback valid", byteFallbackDecoder{}, []string{"a", "<0xE4>", "<0xBD>", "<0xA0>", "b"}, "a你b"},
		{"byte fallback invalid", byteFallbackDecoder{}, []string{"<0xE4>", "<0xBD>", "x"}, "\uFFFD\uFFFDx"},
		{"byte fallback not a byte", byteFallbackDecoder{}, []string{"<0xZZ>", "<0x4>"}, "<0xZZ><0x4>"},
		{"strip", stripDecoder{content: ' ', start: 1, stop: 1}, []string{"  a  "}, " a "},
		{"metaspace first", metaspaceDecoder{replacement: "▁", scheme: prependFirst}, []string{"▁a▁b", "▁c"}, "ab c"},
		{"metaspace never", metaspaceDecoder{replacement: "▁", scheme: prependNever}, []string{"▁a", "▁c"}, " a c"},
		{"sequence llama2", sequenceDecoder{replaceDecoder{&replacer{literal: "▁", content: " "}}, byteFallbackDecoder{}, fuseDecoder{}, stripDecoder{content: ' ', start: 1}},
			[]string{"▁Hello", "▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"}, "Hello 😀"},
		{"byte level added token with space", byteLevelDecoder{}, []string{"Ġa", "<x y>", "Ġb"}, " a<x y> b"},
	}
	for _, tc := range tests {
		if got := strings.Join(tc.d.decodeChain(tc.in), ""); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestSplitBehaviors(t *testing.T) {
	// Splitting "a-b--c" on "-" with each behaviour, as HF documents them.
	tests := []struct {
		b      behavior
		invert bool
		want   []string
	}{
		{behaviorRemoved, false, []string{"a", "b", "c"}},
		{behaviorIsolated, false, []string{"a", "-", "b", "-", "-", "c"}},
		{behaviorMergedWithPrevious, false, []string{"a-", "b-", "-", "c"}},
		{behaviorMergedWithNext, false, []string{"a", "-b", "-", "-c"}},
		{behaviorContiguous, false, []string{"a", "-", "b", "--", "c"}},
		{behaviorRemoved, true, []string{"-", "-", "-"}},
	}
	for _, tc := range tests {
		s := "a-b--c"
		m := literalMatcher{"-"}.findAll(nil, s)
		var got []string
		for _, p := range splitByMatches(nil, piece{s: s}, m, tc.b, tc.invert) {
			got = append(got, p.s)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("behavior %d invert %v: got %q, want %q", tc.b, tc.invert, got, tc.want)
		}
	}
}

func TestAddedTokenOptions(t *testing.T) {
	// The cases of HF's added_vocabulary tests, on a matcher without normalizer.
	tok := func(id int32, content string, single, l, r bool) *addedToken {
		return &addedToken{id: id, content: content, singleWord: single, lstrip: l, rstrip: r}
	}
	tests := []struct {
		toks []*addedToken
		text string
		want []string // "[id]" for tokens
	}{
		{[]*addedToken{tok(0, "my", false, true, true), tok(1, "name", false, false, false), tok(2, "ony", true, false, false)},
			"[CLS] my name is anthony [SEP]", []string{"[CLS]", "[0]", "[1]", " is anthony [SEP]"}},
		{[]*addedToken{tok(0, "<mask>", true, false, false)},
			"<mask> my name <mask> a<mask> <mask>ony <mask>", []string{"[0]", " my name ", "[0]", " a<mask> <mask>ony ", "[0]"}},
		{[]*addedToken{tok(0, "<mask>", true, true, true)},
			"hi <mask> there\t<mask>\t<mask>\u2000", []string{"hi", "[0]", "there", "[0]", "[0]"}},
		{[]*addedToken{tok(0, "ab", false, false, false), tok(1, "abc", false, false, false)},
			"xabcab", []string{"x", "[1]", "[0]"}},
	}
	for _, tc := range tests {
		pats := make([]string, len(tc.toks))
		for i, a := range tc.toks {
			pats[i] = a.content
		}
		m := newAddedMatcher(tc.toks, pats)
		var got []string
		for _, sg := range m.split(nil, tc.text, false, -1) {
			if sg.id >= 0 {
				got = append(got, fmt.Sprintf("[%d]", sg.id))
			} else {
				got = append(got, tc.text[sg.start:sg.end])
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %q, want %q", tc.text, got, tc.want)
		}
	}
}

// TestTemplateProcessor checks the template in place (room reserved, as
// Encode reserves it) and into a new slice (no room), ids left unchanged in
// the second case.
func TestTemplateProcessor(t *testing.T) {
	p := &templateProcessor{before: []int{1}, after: []int{2, 3}}
	want := []int{1, 7, 8, 9, 2, 3}
	roomy := make([]int, 3, 6)
	copy(roomy, []int{7, 8, 9})
	if got := p.process(roomy); !slices.Equal(got, want) || &got[0] != &roomy[:1][0] {
		t.Errorf("in place: got %v, want %v in the same array", got, want)
	}
	tight := []int{7, 8, 9}
	if got := p.process(tight); !slices.Equal(got, want) || !slices.Equal(tight, []int{7, 8, 9}) {
		t.Errorf("no room: got %v (ids now %v), want %v", got, tight, want)
	}
}

func ExampleFromJSON() {
	tk, err := FromJSON([]byte(tinyByteLevelJSON), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	ids := tk.Encode("hello the<|eot|>", true)
	fmt.Println(ids)
	fmt.Printf("%q\n", tk.Decode(ids, false))
	fmt.Printf("%q\n", tk.Decode(ids, true))
	// Output:
	// [261 258 262]
	// "hello the<|eot|>"
	// "hello the"
}

func ExampleDecodeStream() {
	tk, err := FromJSON([]byte(tinyByteLevelJSON), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	s := tk.NewDecodeStream(nil, false)
	for _, id := range tk.Encode("hello é", false) {
		fmt.Printf("%q ", s.Step(id))
	}
	fmt.Printf("%q\n", s.Flush())
	// Output:
	// "hello" " " "" "é" ""
}
