package tokenizer

import (
	"fmt"
	"math/rand/v2"
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

// checkStream asserts that the streamed text equals what a full decode adds
// after the prompt.
func checkStream(t testing.TB, tk *Tokenizer, prompt, ids []int, skip bool) {
	t.Helper()
	got := strings.Join(streamAll(t, tk, prompt, ids, skip), "")
	full := tk.Decode(append(append([]int(nil), prompt...), ids...), skip)
	head := tk.Decode(prompt, skip)
	if !strings.HasPrefix(full, head) {
		return // the prompt's own decode is not a prefix; nothing to compare
	}
	if want := full[len(head):]; got != want {
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
