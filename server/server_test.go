package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
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

// Bad requests are answered with their status and a message that names
// the problem, in OpenAI's error shape; the server keeps serving.
func TestBadRequests(t *testing.T) {
	ts := startServer(t, nil, Options{MaxBodyBytes: 1 << 16})
	long := strings.Repeat("a", 1100) // one token per character: over max_model_len 1024
	tests := []struct {
		name, path string
		body       any
		status     int
		param      string
		msg        string
	}{
		{"unknown model", "/v1/completions", map[string]any{"model": "gpt-4", "prompt": "hi"}, 404, "model", "The model `gpt-4` does not exist"},
		{"malformed JSON", "/v1/completions", `{"prompt": "hi",`, 400, "", "malformed JSON"},
		{"not an object", "/v1/completions", `[1, 2]`, 400, "", "expected a JSON object"},
		{"trailing data", "/v1/completions", `{"prompt": "hi"} {}`, 400, "", "data after the request object"},
		{"empty body", "/v1/completions", ``, 400, "", "empty request body"},
		{"negative max_tokens", "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": -1}, 400, "max_tokens", "max_tokens must be at least 1, got -1"},
		{"zero max_tokens chat", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_completion_tokens": 0}, 400, "max_completion_tokens", "at least 1"},
		{"prompt over max_model_len", "/v1/completions", map[string]any{"prompt": long, "max_tokens": 1}, 400, "prompt", "maximum context length is 1024 tokens"},
		{"prompt plus output over max_model_len", "/v1/completions", map[string]any{"prompt": []int{5, 6, 7, 8, 9}, "max_tokens": 1020}, 400, "max_tokens", "you requested 1025 tokens (5 in the prompt, 1020 in the completion)"},
		{"chat over max_model_len", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": long}}}, 400, "messages", "maximum context length"},
		{"unknown field", "/v1/completions", map[string]any{"prompt": "hi", "max_token": 3}, 400, "max_token", `unknown field "max_token"`},
		{"mistyped field", "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": "three"}, 400, "max_tokens", `field "max_tokens": expected an integer, got string`},
		{"bad stop type", "/v1/completions", map[string]any{"prompt": "hi", "stop": 3}, 400, "stop", "expected a string or an array of strings"},
		{"temperature out of range", "/v1/completions", map[string]any{"prompt": "hi", "temperature": -1}, 400, "temperature", "temperature must be >= 0"},
		{"top_p out of range", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "top_p": 1.5}, 400, "top_p", "top_p must be in (0, 1]"},
		{"too many logprobs", "/v1/completions", map[string]any{"prompt": "hi", "logprobs": 21}, 400, "logprobs", "logprobs must be in [0, 20]"},
		{"top_logprobs without logprobs", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "top_logprobs": 2}, 400, "top_logprobs", "needs logprobs"},
		{"top_logprobs too many", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "logprobs": true, "top_logprobs": 30}, 400, "top_logprobs", "top_logprobs must be in [0, 20]"},
		{"n over max_num_seqs", "/v1/completions", map[string]any{"prompt": "hi", "n": 33}, 400, "n", "exceeds the engine's max_num_seqs (32)"},
		{"logit_bias key", "/v1/completions", map[string]any{"prompt": "hi", "logit_bias": map[string]float64{"x": 1}}, 400, "logit_bias", `key "x" is not a token id`},
		{"logit_bias token", "/v1/completions", map[string]any{"prompt": "hi", "logit_bias": map[string]float64{"500": 1}}, 400, "logit_bias", "logit_bias token id must be in [0, 128)"},
		{"empty stop", "/v1/completions", map[string]any{"prompt": "hi", "stop": []string{""}}, 400, "stop", "stop[0] must not be empty"},
		{"prompt token outside vocab", "/v1/completions", map[string]any{"prompt": []int{5, 999}}, 400, "prompt", "prompt token 1 is 999, outside the vocabulary"},
		{"empty prompt", "/v1/completions", map[string]any{"prompt": ""}, 400, "prompt", "the prompt is empty"},
		{"missing prompt", "/v1/completions", map[string]any{"max_tokens": 3}, 400, "prompt", "prompt is required"},
		{"stream_options without stream", "/v1/completions", map[string]any{"prompt": "hi", "stream_options": map[string]bool{"include_usage": true}}, 400, "stream_options", "only be set when stream is true"},
		{"empty messages", "/v1/chat/completions", map[string]any{"messages": []any{}}, 400, "messages", "non-empty array"},
		{"message without role", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"content": "hi"}}}, 400, "messages[0].role", "needs a role"},
		{"image content", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url", "image_url": map[string]string{"url": "x"}}}}}}, 400, "messages[0].content", `content part type "image_url" is not supported`},
		{"tool without function", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "tools": []map[string]any{{"type": "function"}}}, 400, "tools[0].function", "tools[0].function is required"},
		{"bad response_format", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "response_format": map[string]string{"type": "xml"}}, 400, "response_format.type", `got "xml"`},
		{"oversized body", "/v1/completions", map[string]any{"prompt": strings.Repeat("x", 1<<17)}, 413, "", "request body exceeds 65536 bytes"},
		{"wrong method", "/v1/completions", nil, 405, "", "method not allowed"},
		{"unknown route", "/v1/embeddings", map[string]any{"input": "hi"}, 404, "", "no route for POST /v1/embeddings"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var status int
			var body []byte
			if tc.body == nil {
				resp, err := http.Get(ts.url + tc.path)
				if err != nil {
					t.Fatal(err)
				}
				body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
			} else {
				status, body = post(t, ts.url+tc.path, tc.body)
			}
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			e := decode[ErrorResponse](t, body)
			if e.Error.Code != tc.status || e.Error.Type != errorType(tc.status) || !strings.Contains(e.Error.Message, tc.msg) {
				t.Fatalf("error %+v, want code %d and a message with %q", e.Error, tc.status, tc.msg)
			}
			if param := ""; e.Error.Param != nil {
				param = *e.Error.Param
				if param != tc.param {
					t.Fatalf("param %q, want %q", param, tc.param)
				}
			} else if tc.param != "" {
				t.Fatalf("param null, want %q", tc.param)
			}
		})
	}
	// Still serving.
	status, body := post(t, ts.url+"/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 2})
	if status != http.StatusOK {
		t.Fatalf("after bad requests: %d %s", status, body)
	}
	if ok, state := engineIdle(ts.eng); !waitFor(time.Second, func() bool { ok, state = engineIdle(ts.eng); return ok }) {
		t.Fatalf("engine not idle: %s", state)
	}
}

// The second request of a prompt reports the prompt tokens the prefix
// cache served (usage.prompt_tokens_details.cached_tokens, as OpenAI's);
// the first reports none.
func TestUsageCachedTokens(t *testing.T) {
	ts := startServer(t, nil, Options{})
	prompt := strings.Repeat("the cat sat on the mat and looked at the dog. ", 8)
	var usages []*Usage
	for range 2 {
		status, body := post(t, ts.url+"/v1/completions", map[string]any{
			"prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": true,
		})
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, body)
		}
		usages = append(usages, decode[CompletionResponse](t, body).Usage)
	}
	if usages[0] == nil || usages[0].PromptTokensDetails != nil {
		t.Errorf("first request's usage %+v: want no cached tokens", usages[0])
	}
	u := usages[1]
	if u == nil || u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens <= 0 || u.PromptTokensDetails.CachedTokens >= u.PromptTokens {
		t.Fatalf("second request's usage %+v: want some cached tokens, fewer than the prompt's", u)
	}
	t.Logf("prompt %d tokens, %d cached on the second request", u.PromptTokens, u.PromptTokensDetails.CachedTokens)
}
