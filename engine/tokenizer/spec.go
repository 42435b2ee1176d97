package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrUnsupported is wrapped by load errors for tokenizer.json components this
// package does not implement; the message names the component.
var ErrUnsupported = errors.New("tokenizer: unsupported component")

// fileSpec is the subset of tokenizer.json this package reads.
type fileSpec struct {
	AddedTokens   []addedTokenSpec `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
}

type addedTokenSpec struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelSpec struct {
	Type                    string           `json:"type"`
	Dropout                 *float64         `json:"dropout"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
	Vocab                   map[string]int32 `json:"vocab"`
	Merges                  mergesSpec       `json:"merges"`
}

// mergesSpec reads both merge layouts: "a b" strings and ["a", "b"] pairs.
type mergesSpec [][2]string

func (m *mergesSpec) UnmarshalJSON(data []byte) error {
	// Newer files hold pairs; older ones "a b" strings.
	var pairs [][]string
	if err := json.Unmarshal(data, &pairs); err == nil {
		out := make([][2]string, len(pairs))
		for i, p := range pairs {
			if len(p) != 2 {
				return fmt.Errorf("merges[%d]: want a pair of tokens, got %d", i, len(p))
			}
			out[i] = [2]string{p[0], p[1]}
		}
		*m = out
		return nil
	}
	var strs []string
	if err := json.Unmarshal(data, &strs); err != nil {
		return fmt.Errorf("merges: want pairs or strings: %w", err)
	}
	out := make([][2]string, len(strs))
	for i, s := range strs {
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return fmt.Errorf("merges[%d]: %q is not two tokens", i, s)
		}
		out[i] = [2]string{a, b}
	}
	*m = out
	return nil
}

// componentSpec is the union of the fields of every normalizer,
// pre-tokenizer, post-processor and decoder this package supports.
type componentSpec struct {
	Type string `json:"type"`

	// Sequence
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`

	// Prepend, Replace, Split, Strip (decoder)
	Prepend  string       `json:"prepend"`
	Pattern  *patternSpec `json:"pattern"`
	Content  string       `json:"content"`
	Behavior string       `json:"behavior"`
	Invert   bool         `json:"invert"`
	Start    int          `json:"start"`
	Stop     int          `json:"stop"`

	// Strip (normalizer)
	StripLeft  *bool `json:"strip_left"`
	StripRight *bool `json:"strip_right"`

	// ByteLevel
	AddPrefixSpace *bool `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"`

	// Metaspace
	Replacement   string `json:"replacement"`
	PrependScheme string `json:"prepend_scheme"`
	Split         *bool  `json:"split"`

	// Digits
	IndividualDigits bool `json:"individual_digits"`

	// TemplateProcessing
	Single        []templatePiece               `json:"single"`
	SpecialTokens map[string]templateSpecialTok `json:"special_tokens"`
}

type patternSpec struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type templatePiece struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type templateSpecialTok struct {
	ID  string `json:"id"`
	IDs []int  `json:"ids"`
}

// parseComponent decodes one component object; ok is false for JSON null.
func parseComponent(raw json.RawMessage) (c componentSpec, ok bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return c, false, nil
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, false, err
	}
	return c, true, nil
}
