package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Tokenizer encodes text to token ids and decodes ids to text as the Hugging
// Face tokenizers library does for the same tokenizer.json. It is safe for
// concurrent use.
type Tokenizer struct {
	model      *bpe
	normalizer normalizer // nil: none
	preTok     []preTokenizer
	post       postProcessor // nil: none
	decoder    decoder       // nil: tokens joined with spaces, as in HF

	added       map[int]*addedToken // by id
	addedByText map[string]*addedToken
	special     map[string]bool // contents of special added tokens
	rawAdded    *addedMatcher   // tokens matched on the raw text; nil if none
	normAdded   *addedMatcher   // tokens matched on normalized text; nil if none
	vocabSize   int
	// maxTokenBytes is MaxTokenBytes, computed at load.
	maxTokenBytes int

	config Config
	chat   *chatTemplate // nil when tokenizer_config.json has no template

	scratch sync.Pool
}

// Config is what this package reads from tokenizer_config.json.
type Config struct {
	BOSToken     string // "" when unset
	EOSToken     string
	PadToken     string
	UnkToken     string
	ChatTemplate string // the default template; "" when none
	// ChatTemplates holds named templates when the file gives a list.
	ChatTemplates map[string]string
}

// Load reads dir/tokenizer.json and, when present, dir/tokenizer_config.json
// and dir/chat_template.jinja. As in transformers, a chat_template.jinja file
// replaces the config's default chat template (models such as gpt-oss ship
// their template only as that file).
func Load(dir string) (*Tokenizer, error) {
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	cj, err := readOptional(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	tmpl, err := readOptional(filepath.Join(dir, "chat_template.jinja"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := fromJSON(tj, cj, tmpl)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", dir, err)
	}
	return t, nil
}

// readOptional returns the contents of path, or nil when it does not exist.
func readOptional(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// FromJSON builds a Tokenizer from the contents of tokenizer.json and of
// tokenizer_config.json (nil when absent). Cost: dominated by reading the
// vocabulary and merges (about a second for 150k merges).
func FromJSON(tokenizerJSON, configJSON []byte) (*Tokenizer, error) {
	return fromJSON(tokenizerJSON, configJSON, nil)
}

// fromJSON is FromJSON with the contents of a chat_template.jinja file (nil
// when absent), which replaces the config's default chat template.
func fromJSON(tokenizerJSON, configJSON, chatTemplate []byte) (*Tokenizer, error) {
	var spec fileSpec
	if err := json.Unmarshal(tokenizerJSON, &spec); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	var cfg Config
	if configJSON != nil {
		var err error
		cfg, err = parseConfig(configJSON)
		if err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
	}
	if chatTemplate != nil {
		cfg.ChatTemplate = string(chatTemplate)
	}
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(spec.Model, &head); err != nil {
		return nil, fmt.Errorf("tokenizer.json: model: %w", err)
	}
	if head.Type != "" && head.Type != "BPE" {
		return nil, fmt.Errorf("%w: model %q", ErrUnsupported, head.Type)
	}
	var model modelSpec
	if err := json.Unmarshal(spec.Model, &model); err != nil {
		return nil, fmt.Errorf("tokenizer.json: model: %w", err)
	}
	return build(&spec, &model, cfg)
}

// LoadGPT2 builds the GPT-2 tokenizer from the original OpenAI files,
// encoder.json and vocab.bpe, exactly as HF's GPT-2 tokenizer.json describes
// it: byte-level BPE with the GPT-2 split and <|endoftext|> as special token.
func LoadGPT2(encoderPath, vocabBPEPath string) (*Tokenizer, error) {
	enc, err := os.ReadFile(encoderPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	bpeText, err := os.ReadFile(vocabBPEPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var spec fileSpec
	model := modelSpec{Type: "BPE"}
	if err := json.Unmarshal(enc, &model.Vocab); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", encoderPath, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(bpeText))
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if strings.HasPrefix(text, "#version") || text == "" {
			continue
		}
		a, b, ok := strings.Cut(text, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("tokenizer: %s:%d: want two tokens, got %q", vocabBPEPath, line, text)
		}
		model.Merges = append(model.Merges, [2]string{a, b})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", vocabBPEPath, err)
	}
	const eot = "<|endoftext|>"
	id, ok := model.Vocab[eot]
	if !ok {
		return nil, fmt.Errorf("tokenizer: %s: no %s token", encoderPath, eot)
	}
	spec.AddedTokens = []addedTokenSpec{{ID: id, Content: eot, Special: true}}
	spec.PreTokenizer = json.RawMessage(`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}`)
	spec.PostProcessor = json.RawMessage(`{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true}`)
	spec.Decoder = json.RawMessage(`{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}`)
	return build(&spec, &model, Config{BOSToken: eot, EOSToken: eot, UnkToken: eot})
}

func build(spec *fileSpec, model *modelSpec, cfg Config) (*Tokenizer, error) {
	m, err := newBPE(model)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	t := &Tokenizer{
		model:       m,
		added:       make(map[int]*addedToken),
		addedByText: make(map[string]*addedToken),
		special:     make(map[string]bool),
		config:      cfg,
	}
	t.scratch.New = func() any { return new(scratch) }

	if c, ok, err := parseComponent(spec.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	} else if ok {
		if t.normalizer, err = buildNormalizer(c); err != nil {
			return nil, fmt.Errorf("normalizer: %w", err)
		}
	}
	if c, ok, err := parseComponent(spec.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	} else if ok {
		stages, byteLevel, err := buildPreTokenizer(c)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer: %w", err)
		}
		t.preTok = stages
		if byteLevel {
			m.setByteLevel()
		}
	}
	if c, ok, err := parseComponent(spec.PostProcessor); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	} else if ok {
		if t.post, err = buildPostProcessor(c); err != nil {
			return nil, fmt.Errorf("post_processor: %w", err)
		}
	}
	if c, ok, err := parseComponent(spec.Decoder); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	} else if ok {
		if t.decoder, err = buildDecoder(c); err != nil {
			return nil, fmt.Errorf("decoder: %w", err)
		}
	}

	// Added tokens, as HF's AddedVocabulary::add_tokens loads them: a token
	// whose content is in the model vocabulary takes that id (the "id" in the
	// file is ignored, as HF ignores it); others get ids after the model's
	// vocabulary, in file order. The matching order is special tokens first,
	// then the others, each in file order.
	t.vocabSize = m.tokenSize()
	modelLen := int32(len(m.vocab))
	maxAdded := int32(-1)
	var specials, classic []*addedToken
	for i := range spec.AddedTokens {
		a := &spec.AddedTokens[i]
		if a.Content == "" {
			continue
		}
		if a.Special {
			t.special[a.Content] = true
		}
		if prev, dup := t.addedByText[a.Content]; dup && prev.singleWord == a.SingleWord && prev.lstrip == a.LStrip &&
			prev.rstrip == a.RStrip && prev.special == a.Special {
			continue
		}
		tok := &addedToken{
			content: a.Content, singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip,
			normalized: !a.Special, special: a.Special,
		}
		if a.Normalized != nil {
			tok.normalized = *a.Normalized
		}
		if prev, ok := t.addedByText[a.Content]; ok {
			tok.id = prev.id
		} else if id, ok := m.vocab[a.Content]; ok {
			tok.id = id
		} else if maxAdded < 0 || (maxAdded < modelLen && modelLen != 0) {
			tok.id = modelLen
		} else {
			tok.id = maxAdded + 1
		}
		if tok.id > maxAdded {
			maxAdded = tok.id
		}
		t.added[int(tok.id)] = tok
		t.addedByText[tok.content] = tok
		if int(tok.id) >= t.vocabSize {
			t.vocabSize = int(tok.id) + 1
		}
		if tok.special {
			specials = append(specials, tok)
		} else {
			classic = append(classic, tok)
		}
	}
	var rawToks, normToks []*addedToken
	var rawPats, normPats []string
	for _, tok := range append(specials, classic...) {
		if t.addedByText[tok.content] != tok {
			continue // superseded by a later entry with the same content
		}
		if tok.normalized {
			pat := tok.content
			if t.normalizer != nil {
				pat = t.normalizer.normalize(pat)
				// HF keeps the normalized content as the token's string, so
				// that is what decoding yields; the special check still uses
				// the original content (such a token is never skipped).
				tok.content = pat
			}
			normToks, normPats = append(normToks, tok), append(normPats, pat)
		} else {
			rawToks, rawPats = append(rawToks, tok), append(rawPats, tok.content)
		}
	}
	if len(rawToks) > 0 {
		t.rawAdded = newAddedMatcher(rawToks, rawPats)
	}
	if len(normToks) > 0 {
		t.normAdded = newAddedMatcher(normToks, normPats)
	}

	t.computeMaxTokenBytes()

	if cfg.ChatTemplate != "" {
		ct, err := compileChatTemplate(cfg.ChatTemplate)
		if err != nil {
			return nil, fmt.Errorf("chat_template: %w", err)
		}
		t.chat = ct
	}
	return t, nil
}

// parseConfig reads tokenizer_config.json. Special-token fields may be
// strings or AddedToken objects; chat_template may be a string or a list of
// {name, template}.
func parseConfig(data []byte) (Config, error) {
	var raw struct {
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
		Pad          json.RawMessage `json:"pad_token"`
		Unk          json.RawMessage `json:"unk_token"`
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	var cfg Config
	if err := json.Unmarshal(data, &raw); err != nil {
		return cfg, err
	}
	tokenText := func(name string, r json.RawMessage) (string, error) {
		if len(r) == 0 || string(r) == "null" {
			return "", nil
		}
		var s string
		if err := json.Unmarshal(r, &s); err == nil {
			return s, nil
		}
		var obj struct {
			Content string `json:"content"`
		}
		if err := json.Unmarshal(r, &obj); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return obj.Content, nil
	}
	var err error
	if cfg.BOSToken, err = tokenText("bos_token", raw.BOS); err != nil {
		return cfg, err
	}
	if cfg.EOSToken, err = tokenText("eos_token", raw.EOS); err != nil {
		return cfg, err
	}
	if cfg.PadToken, err = tokenText("pad_token", raw.Pad); err != nil {
		return cfg, err
	}
	if cfg.UnkToken, err = tokenText("unk_token", raw.Unk); err != nil {
		return cfg, err
	}
	if len(raw.ChatTemplate) > 0 && string(raw.ChatTemplate) != "null" {
		var s string
		if err := json.Unmarshal(raw.ChatTemplate, &s); err == nil {
			cfg.ChatTemplate = s
		} else {
			var list []struct {
				Name     string `json:"name"`
				Template string `json:"template"`
			}
			if err := json.Unmarshal(raw.ChatTemplate, &list); err != nil {
				return cfg, fmt.Errorf("chat_template: %w", err)
			}
			cfg.ChatTemplates = make(map[string]string, len(list))
			for _, e := range list {
				cfg.ChatTemplates[e.Name] = e.Template
			}
			cfg.ChatTemplate = cfg.ChatTemplates["default"]
		}
	}
	return cfg, nil
}

// Config returns what was read from tokenizer_config.json.
func (t *Tokenizer) Config() Config { return t.config }

// VocabSize is one more than the largest token id, added tokens included:
// the number of rows an embedding table needs.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// TokenToID returns the id of a token string (an added token's content or a
// model vocabulary entry, in its tokenizer.json spelling). Cost: one or two
// map lookups.
func (t *Tokenizer) TokenToID(token string) (int, bool) {
	if a, ok := t.addedByText[token]; ok {
		return int(a.id), true
	}
	id, ok := t.model.vocab[token]
	return int(id), ok
}

// IDToToken returns the token string of an id, as tokenizer.json spells it;
// false for an id outside the vocabulary (negative ones included). Cost: one
// map lookup and one slice index.
func (t *Tokenizer) IDToToken(id int) (string, bool) {
	if a, ok := t.added[id]; ok {
		return a.content, true
	}
	if id >= 0 && id < len(t.model.tokens) && t.model.tokens[id] != "" {
		return t.model.tokens[id], true
	}
	return "", false
}

// IsSpecial reports whether id is a special added token (skipped by Decode
// with skipSpecialTokens).
func (t *Tokenizer) IsSpecial(id int) bool {
	tok, ok := t.IDToToken(id)
	return ok && t.special[tok]
}

// Encode returns the ids of text. With addSpecialTokens the post-processor's
// template (BOS/EOS) is applied, as HF's encode(text, add_special_tokens).
// The result is newly allocated and owned by the caller. Cost: linear in
// len(text) plus the BPE merges of pre-token pieces not yet in the cache.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []int {
	out, _ := t.encodeWith(text, addSpecialTokens, nil)
	return out
}

// encodeWith is Encode with the options of st (nil: none). The error is
// non-nil only when st has a budget and the result would exceed it.
func (t *Tokenizer) encodeWith(text string, addSpecialTokens bool, st *encodeState) ([]int, error) {
	extra := 0
	if addSpecialTokens && t.post != nil {
		extra = t.post.numAdded()
	}
	if st != nil && st.maxTokens > 0 {
		st.limit = st.maxTokens - extra
		if st.limit < 0 {
			return nil, st.tooMany()
		}
	}
	sc := t.scratch.Get().(*scratch)
	ids := t.encode(sc.ids[:0], text, sc, st)
	if st != nil && st.over {
		sc.ids = ids[:0]
		t.scratch.Put(sc)
		return nil, st.tooMany()
	}
	// The model works on int32 ids (half the memory in its tables and cache);
	// widen once here.
	out := make([]int, len(ids), len(ids)+extra)
	for i, id := range ids {
		out[i] = int(id)
	}
	sc.ids = ids[:0]
	t.scratch.Put(sc)
	if addSpecialTokens && t.post != nil {
		out = t.post.process(out)
	}
	return out, nil
}

// encode appends the ids of text to dst. With a budget in st it stops as soon
// as dst would exceed it, setting st.over.
func (t *Tokenizer) encode(dst []int32, text string, sc *scratch, st *encodeState) []int32 {
	plain := st != nil && st.plain
	segs := sc.segs[:0]
	if t.rawAdded != nil {
		segs = t.rawAdded.split(segs, text, plain, st.remaining(len(dst)))
	} else if text != "" {
		segs = append(segs, segment{0, len(text), -1})
	}
	sc.segs = segs
	for _, sg := range segs {
		if sg.id >= 0 {
			dst = append(dst, sg.id)
			if st != nil && st.exceeded(len(dst)) {
				return dst
			}
			continue
		}
		part := text[sg.start:sg.end]
		if t.normalizer != nil {
			part = t.normalizer.normalize(part)
		}
		if t.normAdded == nil {
			dst = t.encodeText(dst, part, sg.start == 0, sc, st)
			if st != nil && st.over {
				return dst
			}
			continue
		}
		subs := t.normAdded.split(sc.segs2[:0], part, plain, st.remaining(len(dst)))
		sc.segs2 = subs
		for _, sub := range subs {
			if sub.id >= 0 {
				dst = append(dst, sub.id)
				if st != nil && st.exceeded(len(dst)) {
					return dst
				}
				continue
			}
			dst = t.encodeText(dst, part[sub.start:sub.end], sg.start == 0 && sub.start == 0, sc, st)
			if st != nil && st.over {
				return dst
			}
		}
	}
	return dst
}

// encodeText pre-tokenizes and runs the model over text free of added tokens.
func (t *Tokenizer) encodeText(dst []int32, s string, first bool, sc *scratch, st *encodeState) []int32 {
	if s == "" {
		return dst
	}
	if st != nil && st.limit >= 0 {
		return t.encodeTextBudget(dst, s, first, sc, st)
	}
	for _, p := range preTokenizeAll(t.preTok, piece{s: s, first: first}, sc) {
		dst = t.model.tokenize(dst, p.s, sc)
	}
	return dst
}

// Decode returns the text of ids as HF's decode(ids, skip_special_tokens):
// unknown ids are skipped; with skipSpecialTokens so are special tokens.
// Invalid UTF-8 in the result is replaced by U+FFFD. Cost: linear in len(ids)
// and the length of the text.
func (t *Tokenizer) Decode(ids []int, skipSpecialTokens bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		tok, ok := t.IDToToken(id)
		if !ok || (skipSpecialTokens && t.special[tok]) {
			continue
		}
		tokens = append(tokens, tok)
	}
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder.decodeChain(tokens), "")
}
