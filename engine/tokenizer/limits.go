package tokenizer

import (
	"errors"
	"fmt"
	"strings"
)

// ErrTooManyTokens is returned (wrapped) by EncodeWithBudget when the encoding
// of a text would have more ids than the budget allows.
var ErrTooManyTokens = errors.New("tokenizer: too many tokens")

// encodeState carries the options of one encode call beyond Encode's.
type encodeState struct {
	plain     bool // special added tokens are matched as plain text
	maxTokens int  // the caller's budget, post-processor ids included; <= 0: none
	limit     int  // ids the encode proper may produce; < 0: no limit
	over      bool // the budget was exceeded; the ids produced are incomplete
	pieces    int  // pre-token pieces checked against the budget (work done)
}

func newEncodeState(plain bool, maxTokens int) *encodeState {
	return &encodeState{plain: plain, maxTokens: maxTokens, limit: -1}
}

// exceeded records and reports whether n ids are over the limit.
func (st *encodeState) exceeded(n int) bool {
	if st.limit >= 0 && n > st.limit {
		st.over = true
	}
	return st.over
}

// remaining is how many more ids fit after n; -1 for no limit (st nil too).
func (st *encodeState) remaining(n int) int {
	if st == nil || st.limit < 0 {
		return -1
	}
	return max(st.limit-n, 0)
}

func (st *encodeState) tooMany() error {
	return fmt.Errorf("%w: more than %d", ErrTooManyTokens, st.maxTokens)
}

// MaxTokenBytes returns the largest number of bytes of text that any single
// token id stands for, over the model vocabulary and the added tokens: a
// caller can refuse, before encoding, a text longer than
// maxTokens*MaxTokenBytes() bytes, since its encoding needs more than
// maxTokens ids. For byte-level models (GPT-2, Llama 3, Qwen) it is exact:
// the length of the longest token's raw bytes, which is what that token
// decodes to. For other models a byte-fallback token <0xXX> counts one byte
// and any other token the length of its spelling, never shorter than its text
// (SentencePiece's "▁" is three bytes standing for one space), so the value is
// an upper bound. Two things can let a text encode to fewer ids than its
// length divided by MaxTokenBytes: a normalizer that shortens text (NFC
// composing a decomposed character, as Qwen's does) and added tokens with
// lstrip or rstrip, which absorb the whitespace around them. Computed once at
// load by one pass over the vocabulary; this call costs nothing.
func (t *Tokenizer) MaxTokenBytes() int { return t.maxTokenBytes }

// computeMaxTokenBytes is MaxTokenBytes's pass over the vocabulary. It also
// sets the model's maxPieceBytes. Cost: linear in the vocabulary's size.
func (t *Tokenizer) computeMaxTokenBytes() {
	m := t.model
	maxText, maxSpelling := 0, 0
	for _, tok := range m.tokens {
		if tok == "" {
			continue
		}
		maxSpelling = max(maxSpelling, len(tok))
		n := len(tok)
		if m.byteLevel {
			n = byteLevelTextLen(tok)
		} else if _, ok := parseByteToken(tok); ok && m.byteFallback {
			n = 1
		}
		maxText = max(maxText, n)
	}
	for _, a := range t.added {
		maxText = max(maxText, len(a.content))
	}
	t.maxTokenBytes = maxText
	// A token consumes at most its spelling's length of a pre-token piece
	// (affixes and byte-level runes only lengthen the spelling; a byte-fallback
	// token consumes one byte, an unknown character at most 4), provided every
	// character yields a token: not so when unknown characters are dropped (no
	// unk token, no complete byte fallback) or fused into one unk token.
	allFallback := m.byteFallback
	for _, id := range m.fallbackIDs {
		allFallback = allFallback && id >= 0
	}
	if m.fastBytes || allFallback || (m.unkID >= 0 && !m.fuseUnk) {
		m.maxPieceBytes = max(maxSpelling, 4)
	}
}

// byteLevelTextLen is the number of bytes a byte-level token decodes to: one
// per rune of the byte-level alphabet, or the token's own bytes when it has a
// rune outside the alphabet (as the ByteLevel decoder treats it).
func byteLevelTextLen(tok string) int {
	n := 0
	for _, r := range tok {
		if _, ok := byteLevelRunes.byteOf[r]; !ok {
			return len(tok)
		}
		n++
	}
	return n
}

// EncodeWithBudget is Encode with a limit: when the result would have more
// than maxTokens ids (post-processor ids included) it stops and returns an
// error wrapping ErrTooManyTokens and no ids. maxTokens <= 0 means no limit.
// Under the budget the result is exactly Encode's.
//
// Cost: the budget is checked before and after each pre-token piece, so an
// over-budget text costs about maxTokens tokens' worth of pre-tokenization
// and BPE, however long it is. A piece too long to fit the remaining budget
// (one token covers at most a vocabulary entry's length of it) is refused
// before its BPE. The work that still scales with the whole text is the
// linear scan for added tokens and, for tokenizers with a normalizer, the
// normalization of the stretch between added tokens in which the budget runs
// out; for pre-tokenizers other than the byte-level splits of GPT-2, Llama 3
// and Qwen, the pre-tokenization of that stretch too.
func (t *Tokenizer) EncodeWithBudget(text string, addSpecialTokens bool, maxTokens int) ([]int, error) {
	return t.encodeWith(text, addSpecialTokens, newEncodeState(false, maxTokens))
}

// EncodePlain returns the ids of text with special tokens treated as plain
// text, for untrusted input: a user who types "<|im_end|>" gets the ids of
// those characters, never the control token's id. No special tokens are added
// (no BOS/EOS). This is HF's split_special_tokens=True (tokenizers'
// encode_special_tokens): only added tokens marked special are affected;
// added tokens that are not special (Qwen3's "<think>" and "<tool_call>", for
// example) still encode to their own ids, as in HF. A special token's text is
// skipped as a whole by the added-token scan, so an added token inside it is
// not matched either. Cost: as Encode.
func (t *Tokenizer) EncodePlain(text string) []int {
	out, _ := t.encodeWith(text, false, newEncodeState(true, 0))
	return out
}

// stepMatcher is a split matcher whose matches tile the text and can be found
// one at a time, so a budgeted encode need not split the whole text first.
type stepMatcher interface {
	nextEnd(s string, i int) int
}

// lazyFirstStage returns the matcher of the first pre-tokenizer stage and the
// text it splits when that stage can be run one piece at a time with the same
// pieces as its split: an isolating, non-inverted split by a stepMatcher,
// alone or inside ByteLevel, or a word-splitting Metaspace.
func lazyFirstStage(stage preTokenizer, in piece) (stepMatcher, string, bool) {
	s := in.s
	switch p := stage.(type) {
	case *metaspacePreTokenizer:
		if p.splitWords {
			return metaspaceSteps{p.replacement}, p.prepare(in), true
		}
	case *splitPreTokenizer:
		if m, ok := p.m.(stepMatcher); ok && p.behavior == behaviorIsolated && !p.invert {
			return m, s, true
		}
	case *byteLevelPreTokenizer:
		if p.re == nil {
			return nil, "", false
		}
		if m, ok := p.re.m.(stepMatcher); ok && p.re.behavior == behaviorIsolated && !p.re.invert {
			if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
				s = " " + s
			}
			return m, s, true
		}
	}
	return nil, "", false
}

// encodeTextBudget is encodeText under a budget: the pieces are produced and
// encoded in order, and it stops at the first one that goes over.
func (t *Tokenizer) encodeTextBudget(dst []int32, s string, first bool, sc *scratch, st *encodeState) []int32 {
	if len(t.preTok) > 0 {
		if m, text, ok := lazyFirstStage(t.preTok[0], piece{s: s, first: first}); ok {
			for i := 0; i < len(text); {
				j := m.nextEnd(text, i)
				sub := piece{s: text[i:j], first: first && i == 0}
				for _, p := range preTokenizeAll(t.preTok[1:], sub, sc) {
					if dst = t.tokenizeBudget(dst, p.s, sc, st); st.over {
						return dst
					}
				}
				i = j
			}
			return dst
		}
	}
	for _, p := range preTokenizeAll(t.preTok, piece{s: s, first: first}, sc) {
		if dst = t.tokenizeBudget(dst, p.s, sc, st); st.over {
			return dst
		}
	}
	return dst
}

// tokenizeBudget runs the model on one piece unless the piece alone is
// certain to overrun the budget.
func (t *Tokenizer) tokenizeBudget(dst []int32, s string, sc *scratch, st *encodeState) []int32 {
	st.pieces++
	if mb := t.model.maxPieceBytes; mb > 0 && (len(s)+mb-1)/mb > st.limit-len(dst) {
		st.over = true
		return dst
	}
	dst = t.model.tokenize(dst, s, sc)
	st.exceeded(len(dst))
	return dst
}
