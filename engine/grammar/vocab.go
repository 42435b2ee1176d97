package grammar

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// Vocab is a tokenizer's vocabulary as bytes: Tokens[id] is the byte string
// id stands for in generated text (nil for special and control tokens, which
// can never be generated under a grammar), and EOS holds the ids that end
// generation; the Matcher allows them only where the grammar accepts. A Vocab
// is read-only once built.
type Vocab struct {
	Tokens [][]byte
	EOS    []int

	// The byte trie every Compile against this Vocab shares, built by the
	// first (Tokens and EOS must not change after it).
	once   sync.Once
	idx    *vocabIndex
	idxErr error
}

// NewVocab builds a Vocab from the engine's tokenizer, using only its
// exported API (VocabSize, IDToToken, IsSpecial, TokenToID). The bytes of an
// id are what it contributes in the middle of a decoded text:
//
//   - byte-level BPE (GPT-2, Llama 3, Qwen: detected by all 256 byte-level
//     runes being tokens): each rune of the token string maps back to its
//     byte through GPT-2's byte-to-unicode table, so tokens holding part of a
//     UTF-8 character get their raw bytes (Decode would give U+FFFD). A token
//     with a rune outside that alphabet (an added token such as
//     "<tool_call>" with non-alphabet characters) stands for its own UTF-8,
//     as the tokenizer's ByteLevel decoder does.
//   - SentencePiece-style (Llama 2, Mistral: detected by "▁" in the
//     vocabulary): <0xNN> tokens are the single byte NN, and "▁" is a space
//     everywhere. The Strip decoder that drops the first space of a whole
//     text is not applied: generation continues a prompt, so a leading "▁"
//     is a real space (the usual convention of grammar engines).
//   - otherwise the token string's own UTF-8 bytes.
//
// Special tokens (IsSpecial) and ids without a token get nil, as do the eos
// ids (the Matcher handles those). Every eos id must be in range. Cost: one
// pass over the vocabulary, one allocation per token.
func NewVocab(tok *tokenizer.Tokenizer, eos []int) (*Vocab, error) {
	if tok == nil {
		return nil, errors.New("grammar: nil tokenizer")
	}
	n := tok.VocabSize()
	for _, e := range eos {
		if e < 0 || e >= n {
			return nil, fmt.Errorf("grammar: eos id %d outside the vocabulary of %d", e, n)
		}
	}
	byteLevel := true
	for b := range 256 {
		if _, ok := tok.TokenToID(string(tokenizer.ByteLevelRune(byte(b)))); !ok {
			byteLevel = false
			break
		}
	}
	_, metaspace := tok.TokenToID("▁")
	v := &Vocab{Tokens: make([][]byte, n), EOS: append([]int(nil), eos...)}
	isEOS := make(map[int]bool, len(eos))
	for _, e := range eos {
		isEOS[e] = true
	}
	for id := range n {
		s, ok := tok.IDToToken(id)
		if !ok || s == "" || isEOS[id] || tok.IsSpecial(id) {
			continue
		}
		switch {
		case byteLevel:
			if b, ok := tokenizer.ByteLevelBytes(s); ok {
				v.Tokens[id] = b
			} else {
				v.Tokens[id] = []byte(s) // an added token: its own UTF-8
			}
		case metaspace:
			if b, ok := tokenizer.ParseByteToken(s); ok {
				v.Tokens[id] = []byte{b}
			} else {
				v.Tokens[id] = []byte(strings.ReplaceAll(s, "▁", " "))
			}
		default:
			v.Tokens[id] = []byte(s)
		}
	}
	return v, nil
}
