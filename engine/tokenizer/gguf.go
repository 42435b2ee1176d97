package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
)

// GGUF token types (tokenizer.ggml.token_type, llama.cpp's llama_token_type).
const (
	ggufTokenNormal      = 1
	ggufTokenUnknown     = 2
	ggufTokenControl     = 3
	ggufTokenUserDefined = 4
	ggufTokenUnused      = 5
	ggufTokenByte        = 6
)

// Pre-tokenizer regexes of the HF tokenizer.json files that llama.cpp's
// tokenizer.ggml.pre names stand for.
const (
	regexLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	regexQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// GGUFPreTokenizers lists the tokenizer.ggml.pre values FromGGUF supports
// for the "gpt2" (byte-level BPE) model.
var GGUFPreTokenizers = []string{"default", "gpt-2", "llama-bpe", "llama3", "qwen2"}

// FromGGUF builds the tokenizer a GGUF file describes in its tokenizer.ggml.*
// metadata, equal to the Hugging Face tokenizer.json it was converted from:
//
//   - model "gpt2": byte-level BPE over tokenizer.ggml.tokens and
//     tokenizer.ggml.merges, with the pre-tokenizer tokenizer.ggml.pre
//     names (GGUFPreTokenizers; "llama-bpe" also ignores merges for whole
//     words and "qwen2" normalizes to NFC, as their HF files do);
//   - model "llama": SentencePiece-style BPE with byte fallback, whose merges
//     are derived from tokenizer.ggml.scores as HF's converter derives them
//     (a pair merges when its concatenation is a token; higher score first).
//
// Tokens of type control (3) become special added tokens and user-defined
// ones (4) plain added tokens, matched before pre-tokenization. The
// special-token ids (bos, eos, unknown, padding) set the Config's token
// texts; tokenizer.ggml.add_bos_token / add_eos_token add them when encoding
// with special tokens (Encode(text, true)); tokenizer.chat_template is the
// chat template. Errors name the key. Cost: building the merge table (about
// a second for 150k merges).
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	model, err := ggufString(f, "tokenizer.ggml.model", true)
	if err != nil {
		return nil, err
	}
	tv, ok := f.Get("tokenizer.ggml.tokens")
	if !ok {
		return nil, fmt.Errorf("tokenizer: gguf: missing key %q", "tokenizer.ggml.tokens")
	}
	tokens, ok := tv.Strings()
	if !ok || len(tokens) == 0 {
		return nil, fmt.Errorf("tokenizer: gguf: key %q: want a non-empty array of strings", "tokenizer.ggml.tokens")
	}
	types := make([]int64, len(tokens))
	for i := range types {
		types[i] = ggufTokenNormal
	}
	if v, ok := f.Get("tokenizer.ggml.token_type"); ok {
		tt, isInts := v.Ints()
		if !isInts || len(tt) != len(tokens) {
			return nil, fmt.Errorf("tokenizer: gguf: key %q: want %d integers", "tokenizer.ggml.token_type", len(tokens))
		}
		types = tt
	}
	ms := modelSpec{Type: "BPE", Vocab: make(map[string]int32, len(tokens))}
	for i, tok := range tokens {
		if _, dup := ms.Vocab[tok]; !dup { // a repeated string keeps its first id
			ms.Vocab[tok] = int32(i)
		}
	}
	var spec fileSpec
	for i, tok := range tokens {
		if (types[i] == ggufTokenControl || types[i] == ggufTokenUserDefined) && ms.Vocab[tok] == int32(i) {
			special := types[i] == ggufTokenControl
			spec.AddedTokens = append(spec.AddedTokens, addedTokenSpec{ID: int32(i), Content: tok, Special: special, Normalized: &[]bool{false}[0]})
		}
	}
	switch model {
	case "gpt2":
		if err := ggufBPE(f, &spec, &ms); err != nil {
			return nil, err
		}
	case "llama":
		if err := ggufSPM(f, tokens, types, &spec, &ms); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: gguf tokenizer.ggml.model %q (supported: gpt2, llama)", ErrUnsupported, model)
	}
	cfg, post, err := ggufSpecials(f, tokens, model)
	if err != nil {
		return nil, err
	}
	if post != nil {
		spec.PostProcessor = post
	}
	if cfg.ChatTemplate, err = ggufString(f, "tokenizer.chat_template", false); err != nil {
		return nil, err
	}
	t, err := build(&spec, &ms, cfg)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: gguf: %w", err)
	}
	return t, nil
}

// ggufBPE sets up byte-level BPE: merges and the pre-tokenizer.
func ggufBPE(f *gguf.File, spec *fileSpec, ms *modelSpec) error {
	mv, ok := f.Get("tokenizer.ggml.merges")
	if !ok {
		return fmt.Errorf("tokenizer: gguf: missing key %q", "tokenizer.ggml.merges")
	}
	merges, ok := mv.Strings()
	if !ok {
		return fmt.Errorf("tokenizer: gguf: key %q: want an array of strings", "tokenizer.ggml.merges")
	}
	ms.Merges = make(mergesSpec, len(merges))
	for i, m := range merges {
		a, b, ok := strings.Cut(m, " ")
		if !ok || strings.Contains(b, " ") {
			return fmt.Errorf("tokenizer: gguf: key %q: element %d %q is not two tokens", "tokenizer.ggml.merges", i, m)
		}
		ms.Merges[i] = [2]string{a, b}
	}
	pre, err := ggufString(f, "tokenizer.ggml.pre", false)
	if err != nil {
		return err
	}
	byteLevel := func(useRegex bool) map[string]any {
		return map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": useRegex}
	}
	split := func(re string) map[string]any {
		return map[string]any{"type": "Split", "pattern": map[string]any{"Regex": re}, "behavior": "Isolated", "invert": false}
	}
	var preTok any
	switch pre {
	case "", "default", "gpt-2":
		preTok = byteLevel(true)
	case "llama-bpe", "llama3":
		preTok = map[string]any{"type": "Sequence", "pretokenizers": []any{split(regexLlama3), byteLevel(false)}}
		ms.IgnoreMerges = true
	case "qwen2":
		preTok = map[string]any{"type": "Sequence", "pretokenizers": []any{split(regexQwen2), byteLevel(false)}}
		spec.Normalizer = json.RawMessage(`{"type":"NFC"}`)
	default:
		return fmt.Errorf("%w: gguf tokenizer.ggml.pre %q (supported: %v)", ErrUnsupported, pre, GGUFPreTokenizers)
	}
	spec.PreTokenizer = mustJSON(preTok)
	spec.Decoder = json.RawMessage(`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}`)
	return nil
}

// ggufSPM sets up SentencePiece-style BPE: byte fallback, "▁" for spaces, a
// prefix space (tokenizer.ggml.add_space_prefix, default true), and merges
// from the scores.
func ggufSPM(f *gguf.File, tokens []string, types []int64, spec *fileSpec, ms *modelSpec) error {
	sv, ok := f.Get("tokenizer.ggml.scores")
	if !ok {
		return fmt.Errorf("tokenizer: gguf: missing key %q", "tokenizer.ggml.scores")
	}
	scores, ok := sv.Floats()
	if !ok || len(scores) != len(tokens) {
		return fmt.Errorf("tokenizer: gguf: key %q: want %d numbers", "tokenizer.ggml.scores", len(tokens))
	}
	// HF's SentencePieceExtractor: every split of a token into two tokens
	// is a merge ranked by the token's score (higher first), then by the
	// ids of the two halves.
	type merge struct {
		l, r   string
		score  float64
		li, ri int32
		order  int
	}
	var merges []merge
	for id, piece := range tokens {
		if ms.Vocab[piece] != int32(id) {
			continue
		}
		start := len(merges)
		for i := 1; i < len(piece); i++ {
			l, r := piece[:i], piece[i:]
			li, lok := ms.Vocab[l]
			ri, rok := ms.Vocab[r]
			if lok && rok {
				merges = append(merges, merge{l, r, scores[id], li, ri, 0})
			}
		}
		local := merges[start:]
		sort.SliceStable(local, func(a, b int) bool {
			if local[a].li != local[b].li {
				return local[a].li < local[b].li
			}
			return local[a].ri < local[b].ri
		})
	}
	sort.SliceStable(merges, func(a, b int) bool { return merges[a].score > merges[b].score })
	ms.Merges = make(mergesSpec, len(merges))
	for i, m := range merges {
		ms.Merges[i] = [2]string{m.l, m.r}
	}
	ms.ByteFallback = true
	ms.FuseUnk = true
	if id, ok := ggufID(f, "tokenizer.ggml.unknown_token_id", len(tokens)); ok {
		ms.UnkToken = &tokens[id]
	} else if i := slices.Index(types, ggufTokenUnknown); i >= 0 {
		ms.UnkToken = &tokens[i]
	}
	addPrefix := true
	if v, ok := f.Get("tokenizer.ggml.add_space_prefix"); ok {
		if addPrefix, ok = v.Bool(); !ok {
			return fmt.Errorf("tokenizer: gguf: key %q: want a bool", "tokenizer.ggml.add_space_prefix")
		}
	}
	norm := []any{map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}}
	dec := []any{
		map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
		map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
	}
	if addPrefix {
		norm = append([]any{map[string]any{"type": "Prepend", "prepend": "▁"}}, norm...)
		dec = append(dec, map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0})
	}
	spec.Normalizer = mustJSON(map[string]any{"type": "Sequence", "normalizers": norm})
	spec.Decoder = mustJSON(map[string]any{"type": "Sequence", "decoders": dec})
	return nil
}

// ggufSpecials reads the special-token ids into a Config and, when
// add_bos_token / add_eos_token ask for it, a TemplateProcessing
// post-processor adding them.
func ggufSpecials(f *gguf.File, tokens []string, model string) (Config, json.RawMessage, error) {
	var cfg Config
	ids := map[string]*string{
		"tokenizer.ggml.bos_token_id":     &cfg.BOSToken,
		"tokenizer.ggml.eos_token_id":     &cfg.EOSToken,
		"tokenizer.ggml.padding_token_id": &cfg.PadToken,
		"tokenizer.ggml.unknown_token_id": &cfg.UnkToken,
	}
	for key, dst := range ids {
		if v, ok := f.Get(key); ok {
			id, isInt := v.Int()
			if !isInt || id < 0 || id >= int64(len(tokens)) {
				return cfg, nil, fmt.Errorf("tokenizer: gguf: key %q: %v is not a token id below %d", key, v.Any(), len(tokens))
			}
			*dst = tokens[id]
		}
	}
	// llama.cpp adds BOS by default for SentencePiece vocabularies only.
	addBOS, addEOS := model == "llama", false
	for key, dst := range map[string]*bool{"tokenizer.ggml.add_bos_token": &addBOS, "tokenizer.ggml.add_eos_token": &addEOS} {
		if v, ok := f.Get(key); ok {
			b, isBool := v.Bool()
			if !isBool {
				return cfg, nil, fmt.Errorf("tokenizer: gguf: key %q: want a bool", key)
			}
			*dst = b
		}
	}
	var single []any
	special := map[string]any{}
	add := func(key, text string) error {
		if text == "" {
			return fmt.Errorf("tokenizer: gguf: %s is set but %s is missing", strings.Replace(key, "_id", "", 1), key)
		}
		id, _ := ggufID(f, key, len(tokens))
		single = append(single, map[string]any{"SpecialToken": map[string]any{"id": text, "type_id": 0}})
		special[text] = map[string]any{"id": text, "ids": []int{id}, "tokens": []string{text}}
		return nil
	}
	if addBOS {
		if err := add("tokenizer.ggml.bos_token_id", cfg.BOSToken); err != nil {
			return cfg, nil, err
		}
	}
	single = append(single, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}})
	if addEOS {
		if err := add("tokenizer.ggml.eos_token_id", cfg.EOSToken); err != nil {
			return cfg, nil, err
		}
	}
	if !addBOS && !addEOS {
		return cfg, nil, nil
	}
	post := map[string]any{"type": "TemplateProcessing", "single": single, "pair": single, "special_tokens": special}
	return cfg, mustJSON(post), nil
}

func ggufID(f *gguf.File, key string, n int) (int, bool) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false
	}
	id, ok := v.Int()
	return int(id), ok && id >= 0 && id < int64(n)
}

func ggufString(f *gguf.File, key string, required bool) (string, error) {
	v, ok := f.Get(key)
	if !ok {
		if required {
			return "", fmt.Errorf("tokenizer: gguf: missing key %q", key)
		}
		return "", nil
	}
	s, ok := v.String()
	if !ok {
		return "", fmt.Errorf("tokenizer: gguf: key %q: %s, want a string", key, v.Type())
	}
	return s, nil
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// GGUFMetadata converts a byte-level BPE tokenizer.json (and its
// tokenizer_config.json, nil when absent) into the tokenizer.ggml.* metadata
// llama.cpp's converter writes: model "gpt2", tokens by id (added tokens
// included), token types (control for special added tokens, user-defined
// for the other added ones), merges, the pre-tokenizer name recognised from
// the Split regex (GGUFPreTokenizers), special-token ids, add_bos_token and
// the chat template. FromGGUF of the result encodes as the original does.
// SentencePiece-style files (byte fallback) are not converted
// (ErrUnsupported): GGUF wants their scores, which tokenizer.json lacks.
func GGUFMetadata(tokenizerJSON, configJSON []byte) ([]gguf.KeyValue, error) {
	t, err := FromJSON(tokenizerJSON, configJSON)
	if err != nil {
		return nil, err
	}
	var spec fileSpec
	if err := json.Unmarshal(tokenizerJSON, &spec); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	var ms modelSpec
	if err := json.Unmarshal(spec.Model, &ms); err != nil {
		return nil, fmt.Errorf("tokenizer.json: model: %w", err)
	}
	if ms.ByteFallback {
		return nil, fmt.Errorf("%w: GGUF conversion of a byte-fallback (SentencePiece) BPE", ErrUnsupported)
	}
	raw := string(spec.PreTokenizer)
	var pre string
	switch {
	case strings.Contains(raw, jsonQuote(regexLlama3)):
		pre = "llama-bpe"
	case strings.Contains(raw, jsonQuote(regexQwen2)):
		pre = "qwen2"
	case strings.Contains(raw, `"ByteLevel"`) && !strings.Contains(raw, `"Split"`):
		pre = "gpt-2"
	default:
		return nil, fmt.Errorf("%w: pre_tokenizer %.200s has no GGUF name this package knows", ErrUnsupported, raw)
	}
	n := t.VocabSize()
	tokens := make([]string, n)
	types := make([]int32, n)
	for tok, id := range ms.Vocab {
		tokens[id] = tok
		types[id] = ggufTokenNormal
	}
	for id, a := range t.added {
		tokens[id] = a.content
		types[id] = ggufTokenUserDefined
		if a.special {
			types[id] = ggufTokenControl
		}
	}
	for id := range tokens {
		if types[id] == 0 { // a hole in the ids
			tokens[id], types[id] = fmt.Sprintf("[PAD%d]", id), ggufTokenUnused
		}
	}
	merges := make([]string, len(ms.Merges))
	for i, m := range ms.Merges {
		merges[i] = m[0] + " " + m[1]
	}
	kv := []gguf.KeyValue{
		{Key: "tokenizer.ggml.model", Value: gguf.String("gpt2")},
		{Key: "tokenizer.ggml.pre", Value: gguf.String(pre)},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Array(tokens)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.Array(types)},
		{Key: "tokenizer.ggml.merges", Value: gguf.Array(merges)},
	}
	cfg := t.Config()
	for _, s := range []struct{ key, text string }{
		{"tokenizer.ggml.bos_token_id", cfg.BOSToken},
		{"tokenizer.ggml.eos_token_id", cfg.EOSToken},
		{"tokenizer.ggml.padding_token_id", cfg.PadToken},
	} {
		if id, ok := t.TokenToID(s.text); ok && s.text != "" {
			kv = append(kv, gguf.KeyValue{Key: s.key, Value: gguf.Uint32(uint32(id))})
		}
	}
	// BOS is added when the post-processor adds a token before the text.
	addBOS := false
	if ids := t.Encode("", true); len(ids) > 0 && cfg.BOSToken != "" {
		if id, ok := t.TokenToID(cfg.BOSToken); ok && ids[0] == id {
			addBOS = true
		}
	}
	kv = append(kv, gguf.KeyValue{Key: "tokenizer.ggml.add_bos_token", Value: gguf.Bool(addBOS)})
	if cfg.ChatTemplate != "" {
		kv = append(kv, gguf.KeyValue{Key: "tokenizer.chat_template", Value: gguf.String(cfg.ChatTemplate)})
	}
	return kv, nil
}

func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
