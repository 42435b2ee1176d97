package server

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// /tokenize, /detokenize, /version and /v1/models/{id}, as vLLM's server
// has them.
func TestUtilityRoutes(t *testing.T) {
	ts := startServer(t, nil, Options{ModelName: "tiny"})

	code, body := post(t, ts.url+"/tokenize", map[string]any{"prompt": "hello world"})
	if code != http.StatusOK {
		t.Fatalf("/tokenize: %d %s", code, body)
	}
	tok := decode[TokenizeResponse](t, body)
	if tok.Count == 0 || tok.Count != len(tok.Tokens) || tok.MaxModelLen <= 0 {
		t.Fatalf("/tokenize = %+v", tok)
	}
	if want := ts.tok.Encode("hello world", true); !slices.Equal(tok.Tokens, want) {
		t.Errorf("/tokenize tokens %v, want the tokenizer's %v", tok.Tokens, want)
	}

	code, body = post(t, ts.url+"/detokenize", map[string]any{"tokens": ts.tok.Encode("hello world", false)})
	if code != http.StatusOK || decode[DetokenizeResponse](t, body).Prompt != "hello world" {
		t.Fatalf("/detokenize: %d %s", code, body)
	}

	code, body = post(t, ts.url+"/tokenize", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}})
	if code != http.StatusOK || decode[TokenizeResponse](t, body).Count == 0 {
		t.Fatalf("/tokenize of messages: %d %s", code, body)
	}

	for _, tc := range []struct {
		name, url string
		body      any
		want      int
		msg       string
	}{
		{"neither prompt nor messages", "/tokenize", map[string]any{}, 400, "give either prompt or messages"},
		{"both", "/tokenize", map[string]any{"prompt": "a", "messages": []map[string]string{{"role": "user", "content": "b"}}}, 400, "give either prompt or messages"},
		{"another model", "/tokenize", map[string]any{"model": "gpt-9", "prompt": "a"}, 404, "does not exist"},
		{"id outside the vocabulary", "/detokenize", map[string]any{"tokens": []int{-1}}, 400, "outside the vocabulary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, ts.url+tc.url, tc.body)
			if code != tc.want || !strings.Contains(string(body), tc.msg) {
				t.Fatalf("%s = %d %s, want %d with %q", tc.url, code, body, tc.want, tc.msg)
			}
		})
	}

	for _, tc := range []struct {
		path string
		want int
		body string
	}{
		{"/version", 200, `"version":`},
		{"/v1/models/tiny", 200, `"id":"tiny"`},
		{"/v1/models/other", 404, "does not exist"},
	} {
		resp, err := http.Get(ts.url + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || !strings.Contains(string(data), tc.body) {
			t.Errorf("GET %s = %d %s, want %d with %q", tc.path, resp.StatusCode, data, tc.want, tc.body)
		}
	}
}
