package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type chatConversation struct {
	Name     string `json:"name"`
	Messages []struct {
		Role    string          `json:"role"`
		Content string          `json:"content"`
		Fields  json.RawMessage `json:"fields"`
	} `json:"messages"`
	Tools               json.RawMessage            `json:"tools"`
	AddGenerationPrompt bool                       `json:"add_generation_prompt"`
	Kwargs              map[string]json.RawMessage `json:"kwargs"`
}

type chatReference struct {
	Method  string `json:"method"`
	Source  string `json:"source"` // where the template came from, when not the tokenizer
	Renders []struct {
		Name  string  `json:"name"`
		Text  *string `json:"text"`
		Error string  `json:"error"`
	} `json:"renders"`
}

func renderConversation(tk *Tokenizer, c chatConversation) (string, error) {
	msgs := make([]Message, len(c.Messages))
	for i, m := range c.Messages {
		msgs[i] = Message{Role: m.Role, Content: m.Content, Fields: m.Fields}
	}
	opts := ChatOptions{AddGenerationPrompt: c.AddGenerationPrompt, Vars: map[string]any{}}
	if len(c.Tools) > 0 && string(c.Tools) != "null" {
		opts.Tools = c.Tools
	}
	for k, v := range c.Kwargs {
		opts.Vars[k] = v
	}
	return tk.ApplyChatTemplateWith(msgs, opts)
}

// TestChatTemplateParity renders the committed conversations with the Qwen3 and
// Llama 3 templates and compares with transformers' apply_chat_template.
func TestChatTemplateParity(t *testing.T) {
	dir := testdataDir(t)
	raw, err := os.ReadFile(filepath.Join(dir, "chat_conversations.json"))
	if err != nil {
		t.Fatal(err)
	}
	var convs []chatConversation
	if err := json.Unmarshal(raw, &convs); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"qwen3", "llama3"} {
		t.Run(name, func(t *testing.T) {
			tk := loadNamed(t, name)
			raw, err := os.ReadFile(filepath.Join(dir, "chat", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var ref chatReference
			if err := json.Unmarshal(raw, &ref); err != nil {
				t.Fatal(err)
			}
			if len(ref.Renders) != len(convs) {
				t.Fatalf("%d references for %d conversations", len(ref.Renders), len(convs))
			}
			ok := 0
			for i, c := range convs {
				want := ref.Renders[i]
				got, err := renderConversation(tk, c)
				switch {
				case want.Text == nil:
					if err == nil {
						t.Errorf("%s: transformers failed (%s) but got %q", c.Name, want.Error, got)
						continue
					}
				case err != nil:
					t.Errorf("%s: %v", c.Name, err)
					continue
				case got != *want.Text:
					t.Errorf("%s:\n got %q\nwant %q", c.Name, got, *want.Text)
					continue
				}
				ok++
			}
			t.Logf("%s: %d/%d conversations render as transformers (%s)", name, ok, len(convs), ref.Method)
		})
	}
}

func TestChatTemplateErrors(t *testing.T) {
	tk, err := FromJSON([]byte(tinyByteLevelJSON), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tk.ApplyChatTemplate(nil, true); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("no template: err = %v, want ErrNoChatTemplate", err)
	}
	cfg := `{"chat_template": "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}{{ bos_token }}", "bos_token": {"content": "<s>"}}`
	tk, err = FromJSON([]byte(tinyByteLevelJSON), []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	got, err := tk.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, true)
	if err != nil || got != "user:hi;assistant:<s>" {
		t.Errorf("render = %q, %v", got, err)
	}
	bad := `{"chat_template": "{% if %}"}`
	if _, err := FromJSON([]byte(tinyByteLevelJSON), []byte(bad)); err == nil || !strings.Contains(err.Error(), "chat_template") {
		t.Errorf("bad template: err = %v", err)
	}
}
