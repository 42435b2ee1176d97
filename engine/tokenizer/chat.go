package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/ardanlabs/jinja"
)

// ErrNoChatTemplate is returned by ApplyChatTemplate when tokenizer_config.json
// has no chat_template.
var ErrNoChatTemplate = errors.New("tokenizer: no chat template")

// Message is one turn of a conversation.
type Message struct {
	Role    string
	Content string
	// Fields holds further message fields the template may read (tool_calls,
	// reasoning_content, name, ...) as a JSON object. Its key order is kept,
	// as a Python dict keeps it, because templates render nested values with
	// tojson. Nil when there are none.
	Fields json.RawMessage
}

// ChatOptions are the optional inputs of a chat template.
type ChatOptions struct {
	// AddGenerationPrompt ends the prompt with the assistant's header.
	AddGenerationPrompt bool
	// Tools is a JSON array of tool definitions, or nil (the template then sees
	// tools as none).
	Tools json.RawMessage
	// Vars are extra template variables, such as enable_thinking. A value may
	// be a json.RawMessage to keep key order.
	Vars map[string]any
}

type chatTemplate struct {
	tmpl *jinja.Template
}

func compileChatTemplate(src string) (*chatTemplate, error) {
	tmpl, err := jinja.Compile(src)
	if err != nil {
		return nil, err
	}
	return &chatTemplate{tmpl: tmpl}, nil
}

// ApplyChatTemplate renders the conversation with the tokenizer's chat
// template as transformers' apply_chat_template(messages, tokenize=False,
// add_generation_prompt=addGenerationPrompt) does. The result is meant to be
// encoded with addSpecialTokens false when the template writes the BOS itself.
func (t *Tokenizer) ApplyChatTemplate(messages []Message, addGenerationPrompt bool) (string, error) {
	return t.ApplyChatTemplateWith(messages, ChatOptions{AddGenerationPrompt: addGenerationPrompt})
}

// ApplyChatTemplateWith is ApplyChatTemplate with tools and extra variables.
// The template also sees bos_token, eos_token, pad_token and unk_token when
// tokenizer_config.json sets them, and the helpers raise_exception and
// strftime_now.
func (t *Tokenizer) ApplyChatTemplateWith(messages []Message, opts ChatOptions) (string, error) {
	if t.chat == nil {
		return "", ErrNoChatTemplate
	}
	msgs := make([]jinja.Value, len(messages))
	for i, m := range messages {
		v := jinja.NewDict()
		d := v.AsDict()
		d.Set("role", jinja.NewString(m.Role))
		d.Set("content", jinja.NewString(m.Content))
		if len(m.Fields) > 0 {
			extra, err := jsonValue(m.Fields)
			if err != nil {
				return "", fmt.Errorf("tokenizer: chat template: message %d: fields: %w", i, err)
			}
			if !extra.IsDict() {
				return "", fmt.Errorf("tokenizer: chat template: message %d: fields: not a JSON object", i)
			}
			ed := extra.AsDict()
			for _, k := range ed.OrderedKeys() {
				fv, _ := ed.Get(k)
				d.Set(k, fv)
			}
		}
		msgs[i] = v
	}
	data := map[string]jinja.Value{
		"messages":              jinja.NewList(msgs),
		"add_generation_prompt": jinja.NewBool(opts.AddGenerationPrompt),
		"tools":                 jinja.None(),
		"documents":             jinja.None(),
	}
	if len(opts.Tools) > 0 {
		tools, err := jsonValue(opts.Tools)
		if err != nil {
			return "", fmt.Errorf("tokenizer: chat template: tools: %w", err)
		}
		data["tools"] = tools
	}
	for name, tok := range map[string]string{
		"bos_token": t.config.BOSToken, "eos_token": t.config.EOSToken,
		"pad_token": t.config.PadToken, "unk_token": t.config.UnkToken,
	} {
		if tok != "" {
			data[name] = jinja.NewString(tok)
		}
	}
	for k, v := range opts.Vars {
		if raw, ok := v.(json.RawMessage); ok {
			jv, err := jsonValue(raw)
			if err != nil {
				return "", fmt.Errorf("tokenizer: chat template: var %s: %w", k, err)
			}
			data[k] = jv
			continue
		}
		data[k] = jinja.FromGoValue(v)
	}
	out, err := t.chat.tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("tokenizer: chat template: %w", err)
	}
	return out, nil
}

// jsonValue converts JSON to a template value, keeping object key order and
// the int/float distinction of numbers.
func jsonValue(raw json.RawMessage) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeJSONValue(dec)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Undefined(), fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

func decodeJSONValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '{':
			v := jinja.NewDict()
			d := v.AsDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				key, _ := kt.(string)
				val, err := decodeJSONValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.Set(key, val)
			}
			_, err := dec.Token() // '}'
			return v, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				val, err := decodeJSONValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, val)
			}
			_, err := dec.Token() // ']'
			return jinja.NewList(items), err
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", x)
	case json.Number, string, bool, nil:
		return jinja.FromGoValue(x), nil
	}
	return jinja.Undefined(), fmt.Errorf("unexpected JSON token %v", tok)
}
