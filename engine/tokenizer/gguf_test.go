package tokenizer

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
)

// writeGGUF writes metadata (and one tensor, as real files have) and
// parses it back.
func writeGGUF(t testing.TB, kv []gguf.KeyValue) *gguf.File {
	t.Helper()
	w := gguf.NewWriter()
	w.Set("general.architecture", gguf.String("llama"))
	for _, e := range kv {
		w.Set(e.Key, e.Value)
	}
	if err := w.AddTensor("token_embd.weight", gguf.TypeF32, []int64{4}, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestGGUFParity converts the real Llama 3 and Qwen3 tokenizer.json files to
// GGUF metadata, builds the tokenizer back from the GGUF file, and checks
// it encodes a corpus (code, CJK, emoji, whitespace runs, special tokens)
// to the same ids as the tokenizer.json, and decodes them back the same.
func TestGGUFParity(t *testing.T) {
	corpus := loadCorpus(t)
	extra := []string{"", " ", "Hello world", "  leading spaces\n\n\ttabs", "<|im_start|>user\nhi<|im_end|>",
		"<|begin_of_text|>x<|eot_id|>", "数字 12345 和 emoji 😀👍🏽", "fn main() { println!(\"hi\"); }", "<tool_call>{}</tool_call>"}
	cases := append(extra, corpus[:min(len(corpus), 3000)]...)
	for _, name := range []string{"llama3", "qwen3"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(tokenizersDir(t), name)
			requireFiles(t, filepath.Join(dir, "tokenizer.json"))
			tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			cj, _ := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
			kv, err := GGUFMetadata(tj, cj)
			if err != nil {
				t.Fatal(err)
			}
			tk, err := FromGGUF(writeGGUF(t, kv))
			if err != nil {
				t.Fatal(err)
			}
			ref := loadNamed(t, name)
			if tk.VocabSize() != ref.VocabSize() {
				t.Fatalf("vocab size %d, want %d", tk.VocabSize(), ref.VocabSize())
			}
			bad := 0
			for _, text := range cases {
				for _, addSpecial := range []bool{false, true} {
					got, want := tk.Encode(text, addSpecial), ref.Encode(text, addSpecial)
					if !slices.Equal(got, want) {
						if bad++; bad <= 5 {
							t.Errorf("%q (special %v):\n got %v\nwant %v", text, addSpecial, got, want)
						}
						continue
					}
					if d, w := tk.Decode(want, false), ref.Decode(want, false); d != w {
						if bad++; bad <= 5 {
							t.Errorf("decode %v: %q, want %q", want, d, w)
						}
					}
				}
			}
			if bad > 0 {
				t.Fatalf("%d of %d cases differ", bad, 2*len(cases))
			}
			if ref.Config().ChatTemplate != "" && tk.Config().ChatTemplate != ref.Config().ChatTemplate {
				t.Error("chat template differs")
			}
			if tk.Config().EOSToken != ref.Config().EOSToken || tk.Config().BOSToken != ref.Config().BOSToken {
				t.Errorf("special tokens %+v, want %+v", tk.Config(), ref.Config())
			}
			msgs := []Message{{Role: "user", Content: "hi"}}
			if ref.Config().ChatTemplate != "" {
				a, errA := tk.ApplyChatTemplate(msgs, true)
				b, errB := ref.ApplyChatTemplate(msgs, true)
				if a != b || (errA == nil) != (errB == nil) {
					t.Errorf("chat template renders %q (%v), want %q (%v)", a, errA, b, errB)
				}
			}
		})
	}
}

// TestGGUFSentencePiece builds a small SentencePiece vocabulary and checks
// merges by score, the prefix space, byte fallback and BOS.
func TestGGUFSentencePiece(t *testing.T) {
	tokens := []string{"<unk>", "<s>", "</s>", "▁", "a", "b", "c", "▁a", "ab", "▁ab", "bc"}
	scores := []float32{0, 0, 0, -10, -11, -12, -13, -1, -3, -2, -0.5}
	types := []int32{2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1}
	for b := range 256 {
		tokens = append(tokens, "<0x"+strings.ToUpper(string("0123456789abcdef"[b>>4]))+strings.ToUpper(string("0123456789abcdef"[b&15]))+">")
		scores = append(scores, 0)
		types = append(types, 6)
	}
	f := writeGGUF(t, []gguf.KeyValue{
		{Key: "tokenizer.ggml.model", Value: gguf.String("llama")},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Array(tokens)},
		{Key: "tokenizer.ggml.scores", Value: gguf.Array(scores)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.Array(types)},
		{Key: "tokenizer.ggml.bos_token_id", Value: gguf.Uint32(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: gguf.Uint32(2)},
		{Key: "tokenizer.ggml.unknown_token_id", Value: gguf.Uint32(0)},
	})
	tk, err := FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		text string
		want []int
	}{
		// "▁abc": ▁a (score -1) beats ab (-3) and bc (-0.5 is not adjacent
		// first: "b c" merges at -0.5 before "▁ a" at -1).
		{"abc", []int{1, 7, 10}},
		{"ab", []int{1, 9}},                      // ▁a, then ▁a+b = ▁ab
		{"é", []int{1, 3, 11 + 0xc3, 11 + 0xa9}}, // byte fallback
	}
	for _, tc := range tests {
		if got := tk.Encode(tc.text, true); !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
		}
		if got := tk.Decode(tc.want, true); got != tc.text {
			t.Errorf("Decode(%v) = %q, want %q", tc.want, got, tc.text)
		}
	}
	if tk.Config().BOSToken != "<s>" || tk.Config().UnkToken != "<unk>" {
		t.Errorf("config %+v", tk.Config())
	}
}

func TestGGUFErrors(t *testing.T) {
	base := []gguf.KeyValue{
		{Key: "tokenizer.ggml.model", Value: gguf.String("gpt2")},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Array([]string{"a", "b", "ab"})},
		{Key: "tokenizer.ggml.merges", Value: gguf.Array([]string{"a b"})},
	}
	with := func(kv ...gguf.KeyValue) []gguf.KeyValue { return append(slices.Clone(base), kv...) }
	tests := []struct {
		name string
		kv   []gguf.KeyValue
		want string
	}{
		{"no model", nil, `"tokenizer.ggml.model"`},
		{"model", []gguf.KeyValue{{Key: "tokenizer.ggml.model", Value: gguf.String("bert")}, base[1]}, `"bert"`},
		{"pre", with(gguf.KeyValue{Key: "tokenizer.ggml.pre", Value: gguf.String("falcon")}), `"falcon"`},
		{"merge", with(gguf.KeyValue{Key: "tokenizer.ggml.merges", Value: gguf.Array([]string{"ab"})}), `element 0 "ab"`},
		{"types", with(gguf.KeyValue{Key: "tokenizer.ggml.token_type", Value: gguf.Array([]int32{1})}), `"tokenizer.ggml.token_type"`},
		{"bos", with(gguf.KeyValue{Key: "tokenizer.ggml.bos_token_id", Value: gguf.Uint32(7)}), `"tokenizer.ggml.bos_token_id"`},
		{"template", with(gguf.KeyValue{Key: "tokenizer.chat_template", Value: gguf.Uint32(7)}), `"tokenizer.chat_template"`},
	}
	for _, tc := range tests {
		_, err := FromGGUF(writeGGUF(t, tc.kv))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := FromGGUF(writeGGUF(t, []gguf.KeyValue{{Key: "tokenizer.ggml.model", Value: gguf.String("bert")}, base[1]})); !errors.Is(err, ErrUnsupported) {
		t.Errorf("unsupported model: %v", err)
	}
	ok, err := FromGGUF(writeGGUF(t, base))
	if err != nil || !slices.Equal(ok.Encode("ab", true), []int{2}) {
		t.Errorf("minimal gpt2: %v", err)
	}
}
