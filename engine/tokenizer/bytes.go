package tokenizer

import (
	"unicode/utf8"
)

// byteLevelAlphabet maps each byte to the printable rune GPT-2's byte-level
// BPE uses for it: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100 and up, in byte order.
type byteLevelAlphabet struct {
	runeOf [256]rune
	str    [256]string // string(runeOf[b])
	byteOf map[rune]byte
}

// byteLevelRunes is the one byte-level alphabet; it is never modified.
var byteLevelRunes = newByteLevelAlphabet()

func newByteLevelAlphabet() *byteLevelAlphabet {
	a := &byteLevelAlphabet{byteOf: make(map[rune]byte, 256)}
	n := rune(0)
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		r := rune(b)
		if !printable {
			r = 256 + n
			n++
		}
		a.runeOf[b] = r
		a.str[b] = string(r)
		a.byteOf[r] = byte(b)
	}
	return a
}

// bytesOf returns the raw bytes a byte-level token stands for; ok is false when
// the token holds a rune outside the byte-level alphabet.
func (a *byteLevelAlphabet) bytesOf(token string) (b []byte, ok bool) {
	b = make([]byte, 0, len(token))
	for _, r := range token {
		c, found := a.byteOf[r]
		if !found {
			return nil, false
		}
		b = append(b, c)
	}
	return b, true
}

// appendLossyUTF8 appends b to dst as valid UTF-8, replacing each maximal
// ill-formed subsequence with U+FFFD exactly as Rust's String::from_utf8_lossy
// (and Python's "replace" error handler) do. Go's strings.ToValidUTF8 differs:
// it collapses a whole run of bad bytes into one U+FFFD.
func appendLossyUTF8(dst []byte, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			dst = append(dst, b[i:i+size]...)
			i += size
			continue
		}
		// Invalid: consume the longest prefix of a valid sequence, at least one byte.
		i += maximalSubpart(b[i:])
		dst = append(dst, "\uFFFD"...)
	}
	return dst
}

// maximalSubpart returns the length (>= 1) of the maximal prefix of b that
// could start a well-formed UTF-8 sequence, b[0] being invalid at this point.
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		x := b[n]
		if k > 0 {
			lo, hi = 0x80, 0xBF
		}
		if x < lo || x > hi {
			break
		}
		n++
	}
	return n
}

// lossyString converts b to a string, replacing ill-formed UTF-8 as
// appendLossyUTF8 does; it copies once when b is already valid.
func lossyString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return string(appendLossyUTF8(make([]byte, 0, len(b)+8), b))
}

// ByteLevelRune returns the rune GPT-2's byte-level BPE writes for byte b
// in its token strings.
func ByteLevelRune(b byte) rune { return byteLevelRunes.runeOf[b] }

// ByteLevelBytes returns the raw bytes a byte-level BPE token string stands
// for; ok is false when it holds a rune outside the byte-level alphabet
// (such a token, an added one, stands for its own UTF-8). Cost: one pass
// over the token.
func ByteLevelBytes(token string) (b []byte, ok bool) { return byteLevelRunes.bytesOf(token) }

// ParseByteToken reads a SentencePiece byte-fallback token "<0xNN>": the
// byte NN, ok false for any other token.
func ParseByteToken(token string) (byte, bool) { return parseByteToken(token) }
