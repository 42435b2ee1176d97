package server

import (
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

// A completion and a chat completion, not streamed: greedy output is the
// same for the same prompt, usage counts match, finish reasons are right.
func TestCompletionAndChat(t *testing.T) {
	ts := startServer(t, nil, Options{})
	status, body := post(t, ts.url+"/v1/completions", map[string]any{
		"model": ts.ModelName(), "prompt": "the cat sat on", "max_tokens": 12, "temperature": 0, "ignore_eos": true,
	})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	c := decode[CompletionResponse](t, body)
	if c.Object != "text_completion" || !strings.HasPrefix(c.ID, "cmpl-") || c.Model != ts.ModelName() || len(c.Choices) != 1 {
		t.Fatalf("bad response: %s", body)
	}
	ch := c.Choices[0]
	if ch.FinishReason == nil || *ch.FinishReason != "length" || ch.Text == "" || !utf8.ValidString(ch.Text) {
		t.Fatalf("choice: %s", body)
	}
	if c.Usage == nil || c.Usage.CompletionTokens != 12 || c.Usage.PromptTokens == 0 || c.Usage.TotalTokens != c.Usage.PromptTokens+12 {
		t.Fatalf("usage: %s", body)
	}
	// Same prompt, same greedy text.
	_, body2 := post(t, ts.url+"/v1/completions", map[string]any{
		"prompt": "the cat sat on", "max_tokens": 12, "temperature": 0, "ignore_eos": true,
	})
	if c2 := decode[CompletionResponse](t, body2); c2.Choices[0].Text != ch.Text {
		t.Fatalf("greedy text differs: %q vs %q", c2.Choices[0].Text, ch.Text)
	}

	status, body = post(t, ts.url+"/v1/chat/completions", map[string]any{
		"model": ts.ModelName(), "messages": []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}},
		"max_tokens": 8, "temperature": 0, "ignore_eos": true,
	})
	if status != http.StatusOK {
		t.Fatalf("chat status %d: %s", status, body)
	}
	cc := decode[ChatCompletionResponse](t, body)
	if cc.Object != "chat.completion" || len(cc.Choices) != 1 || cc.Choices[0].Message.Role != "assistant" || cc.Choices[0].Message.Content == nil {
		t.Fatalf("chat response: %s", body)
	}
	// The prompt is the rendered template, encoded without special tokens.
	want := len(ts.tok.Encode("system: be brief\nuser: hi there\nassistant:", false))
	if cc.Usage == nil || cc.Usage.PromptTokens != want || cc.Usage.CompletionTokens != 8 {
		t.Fatalf("chat usage %+v, want %d prompt tokens", cc.Usage, want)
	}
}
