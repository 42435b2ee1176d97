package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// streamAll runs ids through a DecodeStream seeded with prompt and returns the
// deltas, checking each is valid UTF-8.
func streamAll(t testing.TB, tk *Tokenizer, prompt, ids []int, skip bool) []string {
	t.Helper()
	s := tk.NewDecodeStream(prompt, skip)
	var deltas []string
	for _, id := range ids {
		d := s.Step(id)
		if !utf8.ValidString(d) {
			t.Fatalf("delta %q is not valid UTF-8", d)
		}
		deltas = append(deltas, d)
	}
	return append(deltas, s.Flush())
}

// outputText is the text a generation adds after its prompt: the full decode
// minus its longest common prefix of whole characters with the prompt's
// decode. When the prompt ends inside a character its decode ends in U+FFFD,
// which the completed character replaces in the full decode; that character
// belongs to the output.
func outputText(full, head string) string {
	n := 0
	for n < len(full) && n < len(head) {
		r1, n1 := utf8.DecodeRuneInString(full[n:])
		r2, n2 := utf8.DecodeRuneInString(head[n:])
		if r1 != r2 || n1 != n2 {
			break
		}
		n += n1
	}
	return full[n:]
}

// checkStream asserts that the streamed text, flush included, equals what a
// full decode adds after the prompt.
func checkStream(t testing.TB, tk *Tokenizer, prompt, ids []int, skip bool) {
	t.Helper()
	got := strings.Join(streamAll(t, tk, prompt, ids, skip), "")
	full := tk.Decode(append(append([]int(nil), prompt...), ids...), skip)
	want := outputText(full, tk.Decode(prompt, skip))
	if got != want {
		t.Errorf("prompt %v ids %v: streamed %q, full decode adds %q", prompt, ids, got, want)
	}
}

// TestDecodeStreamCorpus streams the encoding of corpus cases through every
// tokenizer, with and without a prompt and skip_special_tokens.
func TestDecodeStreamCorpus(t *testing.T) {
	corpus := loadCorpus(t)
	for _, name := range parityNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tk := loadNamed(t, name)
			for i := 0; i < len(corpus); i += 23 {
				ids := tk.Encode(corpus[i], false)
				checkStream(t, tk, nil, ids, false)
				checkStream(t, tk, nil, ids, true)
				if len(ids) > 4 {
					checkStream(t, tk, ids[:3], ids[3:], false)
				}
			}
		})
	}
}

// TestDecodeStreamRandomByteLevel streams random id sequences (invalid UTF-8
// included) through the byte-level tokenizers.
func TestDecodeStreamRandomByteLevel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, name := range []string{"gpt2", "qwen3"} {
		tk := loadNamed(t, name)
		for range 300 {
			ids := make([]int, 1+r.IntN(30))
			for i := range ids {
				if r.IntN(2) == 0 {
					ids[i] = int(tk.model.singleByte[r.IntN(256)])
				} else {
					ids[i] = r.IntN(tk.VocabSize())
				}
			}
			checkStream(t, tk, nil, ids, false)
			checkStream(t, tk, nil, ids, true)
		}
	}
}

func TestDecodeStreamHoldsIncompleteCharacters(t *testing.T) {
	tk := loadNamed(t, "gpt2")
	ids := tk.Encode("😀", false) // four byte tokens in GPT-2's vocabulary
	if len(ids) < 2 {
		t.Fatalf("want a multi-token encoding, got %v", ids)
	}
	s := tk.NewDecodeStream(nil, false)
	for _, id := range ids[:len(ids)-1] {
		if d := s.Step(id); d != "" {
			t.Fatalf("incomplete character emitted: %q", d)
		}
	}
	if d := s.Step(ids[len(ids)-1]); d != "😀" {
		t.Fatalf("last step = %q, want the whole character", d)
	}
}

func TestDecodeStreamPromptContext(t *testing.T) {
	tk := loadNamed(t, "sp_llama2")
	prompt := tk.Encode("Hello", true)
	gen := tk.Encode("Hello world", true)[len(prompt):]
	got := strings.Join(streamAll(t, tk, prompt, gen, true), "")
	if got != " world" {
		t.Errorf("streamed %q after the prompt, want %q", got, " world")
	}
}

// TestDecodeStreamPromptEndsInsideCharacter: the prompt ends inside a
// multi-byte character and the output completes it in its last id.
func TestDecodeStreamPromptEndsInsideCharacter(t *testing.T) {
	tk := loadNamed(t, "gpt2")
	ids := tk.Encode("日本", false)
	if want := []int{33768, 98, 17312, 105}; !slices.Equal(ids, want) {
		t.Fatalf("encode 日本 = %v, want %v", ids, want)
	}
	deltas := streamAll(t, tk, ids[:3], ids[3:], false)
	if deltas[0] != "本" || deltas[1] != "" {
		t.Errorf("deltas %q (last from Flush), want [\"本\" \"\"]", deltas)
	}
}

// multilingualCases are stream test strings beyond the corpus: CJK, emoji
// (ZWJ sequences, flags, skin tones), scripts with combining marks, and
// special tokens between them.
var multilingualCases = []string{
	"日本語のテキストを分割します。東京は晴れ。",
	"中文测试：你好，世界！🙂 再见。",
	"한국어 문장입니다. 감사합니다!",
	"👨‍👩‍👧‍👦 family, 🇯🇵🇫🇷 flags, 👍🏽 tone, 🧑🏿‍🚀",
	"Ελληνικά και русский текст, עברית ועברית, العربية",
	"हिन्दी और বাংলা, ไทย ภาษา, ພາສາລາວ",
	"e\u0301 cafe\u0301 — “quotes” … ½ ∑ ∞ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠀀𠀁",
	"<|im_start|>user\n日本<|im_end|>\n<|endoftext|>😀😀",
	"mixed 漢字and ascii🙂🙂🙂 ends with 😀",
}

// TestDecodeStreamEverySplit streams, for each test string and each position
// that splits its ids into prompt and output, the output after the prompt and
// checks it against the full decode (outputText), with and without
// skip_special_tokens. The strings are multilingual corpus cases (every one
// with a character outside Latin-1, up to a cap) and multilingualCases.
func TestDecodeStreamEverySplit(t *testing.T) {
	var cases []string
	for _, s := range loadCorpus(t) {
		if strings.IndexFunc(s, func(r rune) bool { return r > 0x2E7F }) >= 0 {
			cases = append(cases, s)
		}
	}
	const maxCases = 600 // bound the quadratic cost under -race
	if step := len(cases) / maxCases; step > 1 {
		sampled := cases[:0]
		for i := 0; i < len(cases); i += step {
			sampled = append(sampled, cases[i])
		}
		cases = sampled
	}
	cases = append(cases, multilingualCases...)
	for _, name := range []string{"gpt2", "llama3", "qwen3"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tk := loadNamed(t, name)
			splits, inside := 0, 0
			for _, s := range cases {
				ids := tk.Encode(s, false)
				if len(ids) > 80 {
					ids = ids[:80]
				}
				for k := 0; k <= len(ids); k++ {
					prompt, out := ids[:k], ids[k:]
					splits++
					if strings.HasSuffix(tk.Decode(prompt, false), "\uFFFD") {
						inside++
					}
					checkStream(t, tk, prompt, out, false)
					checkStream(t, tk, prompt, out, true)
				}
				if t.Failed() {
					t.Fatalf("stopping at case %q", s)
				}
			}
			if inside == 0 {
				t.Fatal("no split point inside a character: the test does not cover the bug")
			}
			t.Logf("%d strings, %d split points, %d inside a character", len(cases), splits, inside)
		})
	}
}

func TestStopChecker(t *testing.T) {
	tests := []struct {
		stops   []string
		include bool
		deltas  []string
		want    string // all output joined, flush included
		stopped string
	}{
		{[]string{"STOP"}, false, []string{"hello S", "TO", "P world"}, "hello ", "STOP"},
		{[]string{"STOP"}, true, []string{"hello S", "TO", "P world"}, "hello STOP", "STOP"},
		{[]string{"\n\n"}, false, []string{"a\n", "\nb"}, "a", "\n\n"},
		{[]string{"xyz"}, false, []string{"ab", "cd"}, "abcd", ""},
		{[]string{"b", "abc"}, false, []string{"a", "bc"}, "", "abc"}, // earliest match wins
		{[]string{"世界"}, false, []string{"你好世", "界!"}, "你好", "世界"},
		{[]string{""}, false, []string{"abc"}, "abc", ""},
		{nil, false, []string{"abc", "def"}, "abcdef", ""},
	}
	for _, tc := range tests {
		c := NewStopChecker(tc.stops, tc.include)
		var out strings.Builder
		for _, d := range tc.deltas {
			o, stopped := c.Append(d)
			if !utf8.ValidString(o) {
				t.Errorf("%q: emitted invalid UTF-8 %q", tc.stops, o)
			}
			out.WriteString(o)
			if stopped {
				break
			}
		}
		out.WriteString(c.Flush())
		stopped, which := c.Stopped()
		if out.String() != tc.want || which != tc.stopped || stopped != (tc.stopped != "") {
			t.Errorf("stops %q deltas %q: out %q stop %q, want %q stop %q", tc.stops, tc.deltas, out.String(), which, tc.want, tc.stopped)
		}
		if c.Text() != tc.want {
			t.Errorf("stops %q: Text() = %q, want %q", tc.stops, c.Text(), tc.want)
		}
	}
}

// TestStopCheckerHoldBack checks that text that may begin a stop string is
// held back while streaming and released by Flush.
func TestStopCheckerHoldBack(t *testing.T) {
	c := NewStopChecker([]string{"</s>"}, false)
	if o, _ := c.Append("abc</"); o != "ab" {
		t.Errorf("first delta: %q, want %q (3 bytes held back)", o, "ab")
	}
	if o, _ := c.Append("x"); o != "c" {
		t.Errorf("second delta: %q, want %q", o, "c")
	}
	if o := c.Flush(); o != "</x" {
		t.Errorf("flush: %q", o)
	}
}

// TestStopCheckerTokenStream detects stop strings spanning token boundaries in
// a real token stream.
func TestStopCheckerTokenStream(t *testing.T) {
	tk := loadNamed(t, "qwen3")
	text := "The answer is 42.\n\nObservation: done"
	ids := tk.Encode(text, false)
	s := tk.NewDecodeStream(nil, false)
	c := NewStopChecker([]string{"\n\nObserv"}, false)
	var out strings.Builder
	stopped := false
	for _, id := range ids {
		o, st := c.Append(s.Step(id))
		out.WriteString(o)
		if st {
			stopped = true
			break
		}
	}
	if !stopped || out.String() != "The answer is 42." {
		t.Errorf("out %q stopped %v", out.String(), stopped)
	}
}

func ExampleStopChecker() {
	c := NewStopChecker([]string{"###"}, false)
	for _, delta := range []string{"Hello", " wor", "ld#", "## ignored"} {
		out, stopped := c.Append(delta)
		fmt.Printf("%q %v\n", out, stopped)
		if stopped {
			break
		}
	}
	// Output:
	// "Hel" false
	// "lo w" false
	// "orl" false
	// "d" true
}
