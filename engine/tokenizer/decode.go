package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// decoder is one step of HF's decode chain: it maps the list of token strings
// to a new list; the final list is concatenated.
type decoder interface {
	decodeChain(tokens []string) []string
}

// byteLevelDecoder joins the tokens and maps byte-level runes back to bytes. A
// token with a rune outside the byte-level alphabet (an added token such as
// "<|im_start|>" with a space) contributes its own UTF-8 bytes. Invalid
// UTF-8 becomes U+FFFD as in Rust's from_utf8_lossy.
type byteLevelDecoder struct{}

func (byteLevelDecoder) decodeChain(tokens []string) []string {
	n := 0
	for _, t := range tokens {
		n += len(t)
	}
	buf := make([]byte, 0, n)
	for _, t := range tokens {
		buf = appendByteLevelToken(buf, t)
	}
	return []string{lossyString(buf)}
}

func appendByteLevelToken(buf []byte, t string) []byte {
	start := len(buf)
	for i := 0; i < len(t); {
		c := t[i]
		if c < utf8.RuneSelf {
			// Printable ASCII maps to itself; other ASCII is not in the alphabet.
			if c < '!' || c > '~' {
				return append(buf[:start], t...)
			}
			buf = append(buf, c)
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(t[i:])
		b, ok := byteLevelRunes.byteOf[r]
		if !ok {
			return append(buf[:start], t...)
		}
		buf = append(buf, b)
		i += n
	}
	return buf
}

// metaspaceDecoder turns the replacement rune back into spaces; in the first
// token it drops every replacement rune unless the scheme is "never".
type metaspaceDecoder struct {
	replacement string
	scheme      string
}

func (d metaspaceDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		if i == 0 && d.scheme != prependNever {
			out[i] = strings.ReplaceAll(t, d.replacement, "")
		} else {
			out[i] = strings.ReplaceAll(t, d.replacement, " ")
		}
	}
	return out
}

type replaceDecoder struct{ r *replacer }

func (d replaceDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = d.r.replace(t)
	}
	return out
}

// byteFallbackDecoder turns runs of <0xXX> tokens into the string they spell;
// a run that is not valid UTF-8 becomes one U+FFFD per byte, as in HF.
type byteFallbackDecoder struct{}

func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || t[:3] != "<0x" || t[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range []byte(t[3:5]) {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | (c - '0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | (c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | (c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

func (byteFallbackDecoder) decodeChain(tokens []string) []string {
	out := make([]string, 0, len(tokens))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if b, ok := parseByteToken(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDecoder struct{}

func (fuseDecoder) decodeChain(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

// stripDecoder removes up to start leading and stop trailing copies of a rune
// from each token.
type stripDecoder struct {
	content     rune
	start, stop int
}

func (d stripDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		for k := 0; k < d.start; k++ {
			r, n := utf8.DecodeRuneInString(t)
			if n == 0 || r != d.content {
				break
			}
			t = t[n:]
		}
		for k := 0; k < d.stop; k++ {
			r, n := utf8.DecodeLastRuneInString(t)
			if n == 0 || r != d.content {
				break
			}
			t = t[:len(t)-n]
		}
		out[i] = t
	}
	return out
}

type sequenceDecoder []decoder

func (q sequenceDecoder) decodeChain(tokens []string) []string {
	for _, d := range q {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}

func buildDecoder(c componentSpec) (decoder, error) {
	switch c.Type {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "Metaspace":
		d := metaspaceDecoder{replacement: c.Replacement, scheme: c.PrependScheme}
		if d.replacement == "" {
			d.replacement = "▁"
		}
		if d.scheme == "" {
			d.scheme = prependAlways
			if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
				d.scheme = prependNever
			}
		}
		return d, nil
	case "Replace":
		r, err := newReplacer(c.Pattern, c.Content)
		if err != nil {
			return nil, err
		}
		return replaceDecoder{r}, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Strip":
		r, n := utf8.DecodeRuneInString(c.Content)
		if n == 0 || n != len(c.Content) {
			return nil, fmt.Errorf("Strip: content %q is not one character", c.Content)
		}
		return stripDecoder{content: r, start: c.Start, stop: c.Stop}, nil
	case "Sequence":
		var q sequenceDecoder
		for i, raw := range c.Decoders {
			sub, ok, err := parseComponent(raw)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if !ok {
				continue
			}
			d, err := buildDecoder(sub)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			q = append(q, d)
		}
		return q, nil
	}
	return nil, fmt.Errorf("%w: decoder %q", ErrUnsupported, c.Type)
}
