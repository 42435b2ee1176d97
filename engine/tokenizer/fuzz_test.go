package tokenizer

import (
	"encoding/binary"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzByteLevelRoundTrip: for byte-level BPE, decode(encode(s)) == s for any
// valid UTF-8 s (NFC-normalized first for Qwen3, whose normalizer is NFC).
func FuzzByteLevelRoundTrip(f *testing.F) {
	for _, s := range splitCases {
		f.Add(s)
	}
	f.Add("<|im_start|>user\nhi<|im_end|>")
	gpt2 := loadNamed(f, "gpt2")
	llama3 := loadNamed(f, "llama3")
	qwen3 := loadNamed(f, "qwen3")
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for _, tk := range []*Tokenizer{gpt2, llama3} {
			if got := tk.Decode(tk.Encode(s, false), false); got != s {
				t.Fatalf("round trip of %q gave %q", s, got)
			}
		}
		want := qwen3.normalizer.normalize(s)
		if got := qwen3.Decode(qwen3.Encode(s, false), false); got != want {
			t.Fatalf("qwen3 round trip of %q gave %q, want NFC %q", s, got, want)
		}
	})
}

// FuzzDecodeStream: incremental decoding equals the full decode for any token
// sequence, with and without skip_special_tokens.
func FuzzDecodeStream(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, uint8(0))
	f.Add([]byte("\xe4\xbd\xa0\xe5\xa5\xbd"), uint8(1))
	f.Add([]byte{0xff, 0xfe, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60}, uint8(3))
	toks := []*Tokenizer{loadNamed(f, "gpt2"), loadNamed(f, "qwen3"), loadNamed(f, "llama3")}
	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		tk := toks[int(mode)%len(toks)]
		// Two kinds of ids: single-byte tokens (to build broken UTF-8) and
		// any id of the vocabulary.
		var ids []int
		for len(data) >= 2 {
			if data[0]&1 == 0 {
				ids = append(ids, int(tk.model.singleByte[data[1]]))
				data = data[2:]
				continue
			}
			if len(data) < 3 {
				break
			}
			v := binary.LittleEndian.Uint16(data[1:3])
			ids = append(ids, int(v)*7919%tk.VocabSize())
			data = data[3:]
		}
		for _, skip := range []bool{false, true} {
			got := strings.Join(streamAll(t, tk, nil, ids, skip), "")
			if want := tk.Decode(ids, skip); got != want {
				t.Fatalf("ids %v skip %v: streamed %q, full %q", ids, skip, got, want)
			}
		}
	})
}
