package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// promptContext is how many prompt ids seed a DecodeStream, so that the first
// generated token decodes as it would after the prompt (a leading "▁" or space
// kept, a multi-byte character completed).
const promptContext = 6

// DecodeStream turns generated token ids into text deltas as they arrive. A
// delta is returned only once it ends on a complete UTF-8 character, and the
// concatenation of all deltas plus Flush's result equals the output text: what
// decoding the prompt and the generated ids together adds after the longest
// common prefix (whole characters) with decoding the prompt alone. When the
// prompt ends inside a multi-byte character, its decode ends in U+FFFD and
// the completed character belongs to the output: GPT-2's "日本" split after
// the first byte of "本" streams "本" once the last byte is generated.
//
// It decodes a small window: the ids since the last emitted delta plus the
// group of ids emitted just before, as HF tokenizers' DecodeStream and
// vLLM's incremental detokenizer do. Cost per Step: a decode of that window
// (a few tokens). Not safe for concurrent use.
type DecodeStream struct {
	t           *Tokenizer
	skipSpecial bool
	ids         []int
	prefix      string // decode of ids[:len at the last emission]; the prompt's tail at first
	prefixIndex int    // ids[:prefixIndex] is context already emitted (or prompt)
}

// NewDecodeStream starts a stream for the ids generated after prompt (nil for
// none); the last few prompt ids serve as decoding context and are never
// emitted. Prompt ids that end inside a character are held like generated
// ones, so the character is emitted whole once the output completes it. The
// stream copies what it keeps of prompt, so the caller may reuse it. Cost: a
// decode of those few ids, and when they end inside a character up to as many
// more decodes of fewer ids to find where the last whole character ends.
func (t *Tokenizer) NewDecodeStream(prompt []int, skipSpecialTokens bool) *DecodeStream {
	s := &DecodeStream{t: t, skipSpecial: skipSpecialTokens}
	if n := len(prompt); n > 0 {
		tail := prompt[max(0, n-promptContext):]
		s.ids = append(s.ids, tail...)
		s.prefix = t.Decode(s.ids, skipSpecialTokens)
		// The window is cut at prefixIndex at the next emission; cut it where
		// the prompt's last whole character ends, so that it never starts
		// inside a character (a byte-fallback decoder would turn the rest of
		// such a run into U+FFFD).
		k := len(tail)
		for text := s.prefix; k > 0 && strings.HasSuffix(text, "\uFFFD"); {
			k--
			text = t.Decode(tail[:k], skipSpecialTokens)
		}
		s.prefixIndex = k
	}
	return s
}

// Step adds one generated id and returns the new text it completes, "" when
// it completes none yet (for example the first byte of a multi-byte
// character).
func (s *DecodeStream) Step(id int) string {
	s.ids = append(s.ids, id)
	text := s.t.Decode(s.ids, s.skipSpecial)
	if strings.HasSuffix(text, "\uFFFD") {
		return ""
	}
	// The emitted text (or the prompt) is normally a prefix of text. It is not
	// when the prompt ended inside a character, whose U+FFFD the completed
	// character now replaces, or when the decoder is not prefix-stable; either
	// way what is new starts where the two differ.
	n := commonPrefixLen(text, s.prefix)
	if n >= len(text) {
		return ""
	}
	return s.advance(text, n)
}

func (s *DecodeStream) advance(text string, from int) string {
	delta := text[from:]
	newIndex := len(s.ids) - s.prefixIndex
	s.ids = append(s.ids[:0], s.ids[s.prefixIndex:]...)
	s.prefix = s.t.Decode(s.ids, s.skipSpecial)
	s.prefixIndex = newIndex
	return delta
}

// Flush returns the text still held back: an incomplete character at the end
// of the generation, which decodes to U+FFFD. Call it once, when the sequence
// finishes (EOS, length, stop token), and append its result to the output:
// without it a generation that ends inside a character loses its tail. It
// returns "" when nothing is held back. Cost: one decode of the window.
func (s *DecodeStream) Flush() string {
	text := s.t.Decode(s.ids, s.skipSpecial)
	n := commonPrefixLen(text, s.prefix)
	if n >= len(text) {
		return ""
	}
	s.prefix = text
	return text[n:]
}

func commonPrefixLen(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	for n > 0 && n < len(a) && !utf8.RuneStart(a[n]) {
		n--
	}
	return n
}

// StopChecker detects stop strings in streamed output text, including ones
// that span token boundaries, and trims the output at them as vLLM does: the
// output ends just before the stop string, or just after it when it is to be
// included. When two stop strings complete within one delta the earliest in
// the text wins (vLLM takes the first in list order). While streaming it holds back the last len(longest stop)-1 bytes
// (when stop strings are excluded), since they may begin a stop string. Not
// safe for concurrent use.
type StopChecker struct {
	stops    []string
	include  bool
	holdBack int
	text     strings.Builder
	emitted  int
	stopped  bool
	matched  string
}

// NewStopChecker returns a checker for stops (empty strings are ignored). With
// includeStop the stop string is kept at the end of the output.
func NewStopChecker(stops []string, includeStop bool) *StopChecker {
	c := &StopChecker{include: includeStop}
	for _, s := range stops {
		if s == "" {
			continue
		}
		c.stops = append(c.stops, s)
		if !includeStop && len(s)-1 > c.holdBack {
			c.holdBack = len(s) - 1
		}
	}
	return c
}

// Append adds the next text delta and returns the output that is now final,
// and whether a stop string has been found. Once stopped, further deltas are
// ignored. Cost: a search of the last len(delta)+len(stop)-1 bytes per stop
// string.
func (c *StopChecker) Append(delta string) (out string, stopped bool) {
	if c.stopped || delta == "" {
		return "", c.stopped
	}
	old := c.text.Len()
	c.text.WriteString(delta)
	text := c.text.String()
	best, bestStop := -1, ""
	for _, s := range c.stops {
		from := max(0, old-len(s)+1)
		if i := strings.Index(text[from:], s); i >= 0 && (best < 0 || from+i < best) {
			best, bestStop = from+i, s
		}
	}
	if best >= 0 {
		end := best
		if c.include {
			end += len(bestStop)
		}
		c.stopped, c.matched = true, bestStop
		c.text.Reset()
		c.text.WriteString(text[:end])
		out = text[c.emitted:end]
		c.emitted = end
		return out, true
	}
	safe := len(text) - c.holdBack
	for safe > c.emitted && safe < len(text) && !utf8.RuneStart(text[safe]) {
		safe--
	}
	if safe <= c.emitted {
		return "", false
	}
	out = text[c.emitted:safe]
	c.emitted = safe
	return out, false
}

// Flush returns the held-back text; call it when the output ends for another
// reason (EOS, length).
func (c *StopChecker) Flush() string {
	text := c.text.String()
	out := text[c.emitted:]
	c.emitted = len(text)
	return out
}

// Text is the whole output so far, trimmed at the stop string once found.
func (c *StopChecker) Text() string { return c.text.String() }

// Stopped reports whether a stop string was found, and which.
func (c *StopChecker) Stopped() (bool, string) { return c.stopped, c.matched }
