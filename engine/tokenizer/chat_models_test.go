package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestChatTemplateGemma3 renders conversations with Gemma 3's own template
// (from its tokenizer_config.json) and compares with the format the template
// defines: <bos>, then per turn <start_of_turn>{user|model}\n{content,
// trimmed}<end_of_turn>\n, the system content prefixed to the first user turn
// with a blank line, and <start_of_turn>model\n as the generation prompt.
func TestChatTemplateGemma3(t *testing.T) {
	tk := loadFetchedOrSkip(t, "gemma3")
	u := func(s string) Message { return Message{Role: "user", Content: s} }
	a := func(s string) Message { return Message{Role: "assistant", Content: s} }
	sys := func(s string) Message { return Message{Role: "system", Content: s} }
	cases := []struct {
		name string
		msgs []Message
		gen  bool
		want string // "" when rendering must fail
	}{
		{"system_user", []Message{sys("You are terse."), u("Hello! Who are you?")}, true,
			"<bos><start_of_turn>user\nYou are terse.\n\nHello! Who are you?<end_of_turn>\n<start_of_turn>model\n"},
		{"user_only", []Message{u("Hi")}, true,
			"<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"},
		{"user_no_gen", []Message{u("Hi")}, false,
			"<bos><start_of_turn>user\nHi<end_of_turn>\n"},
		{"multi_turn", []Message{sys("Be brief."), u("What is 2+2?"), a("4."), u("And 3+3?")}, true,
			"<bos><start_of_turn>user\nBe brief.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4.<end_of_turn>\n" +
				"<start_of_turn>user\nAnd 3+3?<end_of_turn>\n<start_of_turn>model\n"},
		{"multi_turn_no_gen", []Message{u("Hi"), a("Hello."), u("Bye"), a("Goodbye.")}, false,
			"<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n" +
				"<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\nGoodbye.<end_of_turn>\n"},
		{"contents_trimmed", []Message{u("  padded \n\n"), a("\tanswer  ")}, false,
			"<bos><start_of_turn>user\npadded<end_of_turn>\n<start_of_turn>model\nanswer<end_of_turn>\n"},
		{"unicode_and_newlines", []Message{u("héllo\n世界 👋\n\nline3")}, true,
			"<bos><start_of_turn>user\nhéllo\n世界 👋\n\nline3<end_of_turn>\n<start_of_turn>model\n"},
		{"roles_not_alternating", []Message{u("a"), u("b")}, true, ""},
		{"assistant_first", []Message{a("a")}, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := tk.ApplyChatTemplate(c.msgs, c.gen)
			if c.want == "" {
				if err == nil || !strings.Contains(err.Error(), "must alternate") {
					t.Fatalf("got %q, %v; want the template's alternation error", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("\n got %q\nwant %q", got, c.want)
			}
		})
	}
}

// TestChatTemplateGemma3Encode: the rendered prompt, encoded without added
// special tokens (the template writes <bos> itself), gives the reference ids
// of the same text minus the <bos> that encoding with special tokens adds.
func TestChatTemplateGemma3Encode(t *testing.T) {
	tk := loadFetchedOrSkip(t, "gemma3")
	text, err := tk.ApplyChatTemplate([]Message{
		{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Hello! Who are you?"},
	}, true)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(testdataDir(t), "model_texts.json"))
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	if err := json.Unmarshal(raw, &texts); err != nil {
		t.Fatal(err)
	}
	if texts[0] != text {
		t.Fatalf("model_texts.json[0] = %q, want the rendering %q", texts[0], text)
	}
	fx := readJSONLines[decodeFixture](t, filepath.Join(testdataDir(t), "fixtures", "gemma3_texts.jsonl.gz"))
	bos, ok := tk.TokenToID("<bos>")
	if !ok || len(fx[0].IDs) < 2 || fx[0].IDs[0] != bos || fx[0].IDs[1] != bos {
		t.Fatalf("reference ids %v do not start with <bos> twice", fx[0].IDs)
	}
	got := tk.Encode(text, false)
	if !slices.Equal(got, fx[0].IDs[1:]) {
		t.Errorf("encode rendered prompt\n got %v\nwant %v", got, fx[0].IDs[1:])
	}
	for _, special := range []string{"<bos>", "<start_of_turn>", "<end_of_turn>"} {
		id, ok := tk.TokenToID(special)
		if !ok || !slices.Contains(got, id) {
			t.Errorf("%s (id %d) not a single token in %v", special, id, got)
		}
	}
}

// TestChatTemplateGptOss: the gpt-oss tokenizer package carries no chat
// template (upstream ships it as chat_template.jinja beside the tokenizer,
// which Load reads when present; see TestChatTemplateFile), so without that
// file chat rendering reports ErrNoChatTemplate; the harmony tokens are
// single special tokens (their ids are in the gptoss_texts fixtures).
func TestChatTemplateGptOss(t *testing.T) {
	tk := loadFetchedOrSkip(t, "gptoss")
	dir := filepath.Join(tokenizersDir(t), "gptoss")
	if _, err := os.Stat(filepath.Join(dir, "chat_template.jinja")); err == nil {
		t.Skip("gptoss has a chat_template.jinja; this test covers the package as fetched")
	}
	if _, err := tk.ApplyChatTemplate([]Message{{Role: "user", Content: "Hi"}}, true); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("err = %v, want ErrNoChatTemplate", err)
	}
	for _, special := range []string{"<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"} {
		id, ok := tk.TokenToID(special)
		if got := tk.Encode(special, false); !ok || len(got) != 1 || got[0] != id {
			t.Errorf("%s encodes as %v, want its id %d alone", special, got, id)
		}
	}
}

// TestChatTemplateFile: Load reads chat_template.jinja and, as transformers
// does, prefers it to tokenizer_config.json's chat_template.
func TestChatTemplateFile(t *testing.T) {
	cfg := `{"chat_template": "config:{{ messages[0].content }}", "bos_token": "<s>"}`
	file := "{{ bos_token }}file:{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}" +
		"{% if add_generation_prompt %}<|start|>assistant{% endif %}"
	for _, c := range []struct {
		name         string
		config, tmpl string // "" leaves the file out
		want         string
	}{
		{"config_only", cfg, "", "config:hi"},
		{"file_over_config", cfg, file, "<s>file:<|start|>user<|message|>hi<|end|><|start|>assistant"},
		{"file_without_config", "", file, "file:<|start|>user<|message|>hi<|end|><|start|>assistant"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			write := func(name, data string) {
				if data == "" {
					return
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write("tokenizer.json", tinyByteLevelJSON)
			write("tokenizer_config.json", c.config)
			write("chat_template.jinja", c.tmpl)
			tk, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tk.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, true)
			if err != nil || got != c.want {
				t.Errorf("render = %q, %v; want %q", got, err, c.want)
			}
		})
	}
	dir := t.TempDir()
	for name, data := range map[string]string{"tokenizer.json": tinyByteLevelJSON, "chat_template.jinja": "{% if %}"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "chat_template") {
		t.Errorf("bad chat_template.jinja: err = %v", err)
	}
}

// TestChatTemplateParityGptOss renders every conversation of
// chat_conversations.json and chat_conversations_harmony.json with gpt-oss's
// harmony template, read by Load from a chat_template.jinja beside the
// fetched tokenizer as upstream ships it, and compares with transformers'
// renders of the same template (chat/gptoss.json and the template itself
// from tools/tokenizer/harmony_reference.py). The template writes the day's
// date, so "Current date: YYYY-MM-DD" is masked on both sides. Conversations
// the template rejects (raise_exception) must fail here too. The rendered
// prompts then encode with every harmony marker as its one special token.
func TestChatTemplateParityGptOss(t *testing.T) {
	fetched := filepath.Join(tokenizersDir(t), "gptoss")
	loadFetchedOrSkip(t, "gptoss")
	chatDir := filepath.Join(testdataDir(t), "chat")
	tmpl, err := os.ReadFile(filepath.Join(chatDir, "gptoss_chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if err := os.Symlink(filepath.Join(fetched, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), tmpl, 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var convs []chatConversation
	for _, name := range []string{"chat_conversations.json", "chat_conversations_harmony.json"} {
		raw, err := os.ReadFile(filepath.Join(testdataDir(t), name))
		if err != nil {
			t.Fatal(err)
		}
		var cs []chatConversation
		if err := json.Unmarshal(raw, &cs); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		convs = append(convs, cs...)
	}
	raw, err := os.ReadFile(filepath.Join(chatDir, "gptoss.json"))
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
	date := regexp.MustCompile(`Current date: \d{4}-\d{2}-\d{2}`)
	mask := func(s string) string { return date.ReplaceAllString(s, "Current date: DATE") }
	markers := []string{"<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"}
	ok, rejected := 0, 0
	for i, c := range convs {
		want := ref.Renders[i]
		if want.Name != c.Name {
			t.Fatalf("reference %d is %q, conversation %q", i, want.Name, c.Name)
		}
		got, err := renderConversation(tk, c)
		switch {
		case want.Text == nil:
			if err == nil {
				t.Errorf("%s: transformers failed (%s) but got %q", c.Name, want.Error, got)
				continue
			}
			rejected++
		case err != nil:
			t.Errorf("%s: %v", c.Name, err)
			continue
		case mask(got) != mask(*want.Text):
			t.Errorf("%s:\n got %q\nwant %q", c.Name, mask(got), mask(*want.Text))
			continue
		default:
			ids := tk.Encode(got, false)
			for _, m := range markers {
				id, _ := tk.TokenToID(m)
				if n := strings.Count(got, m); n != countID(ids, id) {
					t.Errorf("%s: %s appears %d times in the text, its id %d times in the encoding", c.Name, m, n, countID(ids, id))
				}
			}
		}
		ok++
	}
	if rejected == 0 {
		t.Error("no conversation was rejected: the template's raise_exception paths went untested")
	}
	t.Logf("gptoss: %d/%d conversations render as transformers (%d rejected by both; %s, %s)", ok, len(convs), rejected, ref.Method, ref.Source)
}

// countID is how many times id occurs in ids.
func countID(ids []int, id int) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}
