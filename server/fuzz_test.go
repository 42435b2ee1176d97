package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/server/servertest"
)

// serverForFuzz is a Server over the test model for the fuzz targets, which
// call the request decoding and validation functions directly: no request
// reaches the engine.
func serverForFuzz(f *testing.F) *Server {
	f.Helper()
	dir := f.TempDir()
	if err := servertest.WriteModel(dir, 11); err != nil {
		f.Fatal(err)
	}
	cfg, err := servertest.Config(dir, nil)
	if err != nil {
		f.Fatal(err)
	}
	eng, err := llm.New(cfg, llm.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { eng.Close() })
	s, err := New(eng, Options{})
	if err != nil {
		f.Fatal(err)
	}
	return s
}

// checkAPIError checks a refusal: a client error with a message, whose
// response encodes.
func checkAPIError(t *testing.T, body []byte, e *apiError) {
	t.Helper()
	switch e.status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge:
	default:
		t.Fatalf("body %q: status %d (%s), want a client error", body, e.status, e.msg)
	}
	if e.msg == "" {
		t.Fatalf("body %q: error without a message", body)
	}
	if _, err := json.Marshal(e.response()); err != nil {
		t.Fatalf("body %q: error response does not encode: %v", body, err)
	}
}

// checkRequests checks accepted engine requests: prompts in the vocabulary,
// valid sampling parameters, and prompt plus output within the context.
func checkRequests(t *testing.T, s *Server, body []byte, reqs []*request) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatalf("body %q: accepted with no engine request", body)
	}
	for _, r := range reqs {
		if len(r.promptTokenIDs) == 0 {
			t.Fatalf("body %q: empty prompt accepted", body)
		}
		for _, id := range r.promptTokenIDs {
			if id < 0 || id >= s.vocabSize {
				t.Fatalf("body %q: prompt token %d outside [0, %d)", body, id, s.vocabSize)
			}
		}
		if err := r.params.Validate(s.vocabSize); err != nil {
			t.Fatalf("body %q: accepted sampling params do not validate: %v", body, err)
		}
		if r.params.MaxTokens < 1 || len(r.promptTokenIDs)+r.params.MaxTokens > s.maxModelLen {
			t.Fatalf("body %q: %d prompt tokens + max_tokens %d, context %d", body, len(r.promptTokenIDs), r.params.MaxTokens, s.maxModelLen)
		}
		if r.params.N < 1 || r.params.N > s.maxN {
			t.Fatalf("body %q: n = %d outside [1, %d]", body, r.params.N, s.maxN)
		}
	}
}

var commonFuzzBodies = []string{
	``,
	`{}`,
	`null`,
	`[]`,
	`[1, 2]`,
	`"x"`,
	`{"prompt": "hi",`,
	`{"prompt": "hi"} {}`,
	`{"prompt": "hi"}  `,
	`{"model": "gpt-4", "prompt": "hi"}`,
	`{"prompt": "hi", "max_token": 3}`,
	`{"prompt": "hi", "max_tokens": "three"}`,
	`{"prompt": "hi", "max_tokens": 1e400}`,
	`{"prompt": "hi", "max_tokens": 9223372036854775807}`,
	`{"prompt": "hi", "max_tokens": -9223372036854775808}`,
	`{"prompt": "hi", "stop": 3}`,
	`{"prompt": "hi", "stop": [""]}`,
	`{"prompt": "hi", "stop": ["a", null]}`,
	`{"prompt": "hi", "temperature": -1, "top_p": 1.5, "top_k": -7, "min_p": 2}`,
	`{"prompt": "hi", "temperature": 3.5e38, "repetition_penalty": 1e-45}`,
	`{"prompt": "hi", "n": 0}`,
	`{"prompt": "hi", "n": 33}`,
	`{"prompt": "hi", "n": -1, "best_of": -1}`,
	`{"prompt": "hi", "seed": -1}`,
	`{"prompt": "hi", "logit_bias": {"x": 1}}`,
	`{"prompt": "hi", "logit_bias": {" 5 ": 100, "-1": 1, "99999999999999999999": 1}}`,
	`{"prompt": "hi", "logit_bias": {"5": "high"}}`,
	`{"prompt": "hi", "min_tokens": 5000, "max_tokens": 1}`,
	`{"prompt": "hi", "min_tokens": -1}`,
	`{"prompt": "hi", "stop_token_ids": [-1, 128, 9223372036854775807]}`,
	`{"prompt": "hi", "response_format": {"type": "text"}}`,
	`{"prompt": "hi", "response_format": {"type": "json_object"}}`,
	`{"prompt": "hi", "response_format": "text"}`,
	`{"prompt": "hi", "guided_json": null, "guided_regex": "a+"}`,
	`{"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}`,
	`{"prompt": "hi", "guided_json": "{\"type\": \"integer\"}", "structured_outputs": {"disable_any_whitespace": true}}`,
	`{"prompt": "hi", "guided_choice": ["a", ""], "guided_grammar": "root ::= \"a\""}`,
	`{"prompt": "hi", "structured_outputs": {"choice": ["x"], "json_object": true}}`,
	`{"prompt": "hi", "priority": 1}`,
	`{"prompt": "hi", "truncate_prompt_tokens": 3}`,
	`{"prompt": "hi", "include_stop_str_in_output": true}`,
	`{"prompt": "hi", "stream": true, "stream_options": {"include_usage": true}}`,
	`{"prompt": "hi", "stream_options": {"include_usage": true}}`,
}

// FuzzCompletionsBody feeds arbitrary bytes as the body of POST
// /v1/completions to the decoding and validation the handler runs before it
// submits anything. They must never panic; a refusal is a client error with a
// message; accepted requests are valid for the engine.
func FuzzCompletionsBody(f *testing.F) {
	s := serverForFuzz(f)
	for _, b := range commonFuzzBodies {
		f.Add([]byte(b))
	}
	for _, b := range []string{
		`{"prompt": "hi", "max_tokens": 2}`,
		`{"prompt": ""}`,
		`{"prompt": null}`,
		`{"prompt": 5}`,
		`{"prompt": []}`,
		`{"prompt": [[]]}`,
		`{"prompt": [5, 6, 7, 8, 9], "max_tokens": 1020}`,
		`{"prompt": [5, 999]}`,
		`{"prompt": [5, -1]}`,
		`{"prompt": [5, 1.5]}`,
		`{"prompt": [[5, 6], [7]], "n": 2, "best_of": 2}`,
		`{"prompt": [[5, 6], "x"]}`,
		`{"prompt": ["a", "b", "c"], "logprobs": 5, "echo": false}`,
		`{"prompt": ["a", 5]}`,
		`{"prompt": "\u0000\ud800\uffff<s></s><unk>", "add_special_tokens": false}`,
		`{"prompt": "hi", "logprobs": 21}`,
		`{"prompt": "hi", "logprobs": -1}`,
		`{"prompt": "hi", "prompt_logprobs": 3, "stream": true}`,
		`{"prompt": "hi", "prompt_logprobs": -3}`,
		`{"prompt": "hi", "suffix": "x"}`,
		`{"prompt": "hi", "echo": true}`,
		`{"prompt": "hi", "best_of": 3}`,
		`{"prompt": "` + strings.Repeat("a", 1100) + `", "max_tokens": 1}`,
	} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req CompletionRequest
		if e := decodeBody(bytes.NewReader(body), &req); e != nil {
			checkAPIError(t, body, e)
			return
		}
		reqs, e := s.completionRequests(&req, "cmpl-fuzz", time.Now())
		if e != nil {
			checkAPIError(t, body, e)
			return
		}
		checkRequests(t, s, body, reqs)
		prompts, e := parsePrompt(req.Prompt)
		if e != nil || len(prompts) != len(reqs) {
			t.Fatalf("body %q: %d engine requests for %d prompts (%v)", body, len(reqs), len(prompts), e)
		}
	})
}

// FuzzChatBody feeds arbitrary bytes as the body of POST
// /v1/chat/completions to the decoding, validation and chat-template
// rendering the handler runs before it submits anything. They must never
// panic; a refusal is a client error with a message; an accepted request is
// valid for the engine and its prompt holds every message's content (when
// the content is plain ASCII, which the test tokenizer encodes losslessly).
func FuzzChatBody(f *testing.F) {
	s := serverForFuzz(f)
	for _, b := range commonFuzzBodies {
		f.Add([]byte(strings.Replace(b, `"prompt": "hi"`, `"messages": [{"role": "user", "content": "hi"}]`, 1)))
	}
	for _, b := range []string{
		`{"messages": [{"role": "user", "content": "hi"}]}`,
		`{"messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "continue_final_message": true, "add_generation_prompt": false}`,
		`{"messages": [{"role": "user", "content": "hi"}], "continue_final_message": true, "add_generation_prompt": true}`,
		`{"messages": [{"role": "assistant", "content": "   "}], "continue_final_message": true}`,
		`{"messages": [{"role": "user", "content": "{{ messages }}{% for m in messages %}{{ m }}{% endfor %}"}]}`,
		`{"messages": [{"role": "{{ 7*7 }}", "content": "{% raw %}"}]}`,
		`{"messages": [{"role": "user", "content": "<s></s><unk> assistant: \n user:"}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "text"}]}]}`,
		`{"messages": [{"role": "user", "content": null}]}`,
		`{"messages": [{"role": "user", "content": 5}]}`,
		`{"messages": [{"role": "user", "content": {"a": 1}}]}`,
		`{"messages": [{"role": "", "content": "hi"}]}`,
		`{"messages": [{"role": 5, "content": "hi"}]}`,
		`{"messages": [{"content": "hi"}]}`,
		`{"messages": [{"role": "user", "role": "system", "content": "a", "content": "b"}]}`,
		`{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}], "name": "n", "x": [1, {"y": null}]}]}`,
		`{"messages": [{"role": "user", "content": "hi", "": ""}]}`,
		`{"messages": [null]}`,
		`{"messages": [[]]}`,
		`{"messages": ["hi"]}`,
		`{"messages": [{}]}`,
		`{"messages": []}`,
		`{"messages": {}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}], "tool_choice": "none"}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "function"}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "$defs": {"a": {}}}}}], "tool_choice": "required"}`,
		`{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": false}`,
		`{"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c", "content": "r"}], "tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 30}`,
		`{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}`,
		`{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": -1}`,
		`{"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 1}`,
		`{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}`,
		`{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3, "max_tokens": 0}`,
		`{"messages": [{"role": "user", "content": "hi"}], "echo": true}`,
		`{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"add_generation_prompt": false, "messages": [], "enable_thinking": false}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": 1e999}}`,
		// chat_template_kwargs must not replace the conversation.
		`{"messAges":[{"role":"user","content":"0"}],"ChAt_templAte_kwArgs":{"messages":false}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": [{"role": "system", "content": "injected"}]}}`,
		`{"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": true}`,
		`{"messages": [{"role": "user", "content": "` + strings.Repeat("a", 1100) + `"}]}`,
	} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req ChatCompletionRequest
		if e := decodeBody(bytes.NewReader(body), &req); e != nil {
			checkAPIError(t, body, e)
			return
		}
		reqs, e := s.chatRequests(&req, "chatcmpl-fuzz", time.Now())
		if e != nil {
			checkAPIError(t, body, e)
			return
		}
		checkRequests(t, s, body, reqs)
		if len(reqs) != 1 {
			t.Fatalf("body %q: %d engine requests for one conversation", body, len(reqs))
		}
		msgs, e := parseMessages(req.Messages)
		if e != nil {
			t.Fatalf("body %q: accepted, but its messages do not parse: %v", body, e.msg)
		}
		prompt := s.tok.Decode(reqs[0].promptTokenIDs, false)
		for i, m := range msgs {
			want := m.Content
			if req.ContinueFinalMessage && i == len(msgs)-1 {
				want = strings.TrimSpace(want)
			}
			if plainASCII(want) && !strings.Contains(prompt, want) {
				t.Fatalf("body %q: message %d content %q not in the prompt %q", body, i, want, prompt)
			}
		}
	})
}

// plainASCII reports whether s is printable ASCII and newlines, which the
// test model's tokenizer encodes without loss.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c != '\n' && (c < 0x20 || c > 0x7e) {
			return false
		}
	}
	return true
}
