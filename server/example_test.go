package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/server"
	"github.com/deepinfer/deepinfer-go/server/servertest"
)

// Serve an engine over HTTP and ask it for a completion.
func Example() {
	dir, err := os.MkdirTemp("", "example-model-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	if err := servertest.WriteModel(dir, 1); err != nil {
		panic(err)
	}
	cfg, err := servertest.Config(dir, nil)
	if err != nil {
		panic(err)
	}
	eng, err := llm.New(cfg, llm.Options{})
	if err != nil {
		panic(err)
	}
	defer eng.Close()
	srv, err := server.New(eng, server.Options{ModelName: "tiny"})
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	defer srv.Shutdown(context.Background())

	resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model": "tiny", "prompt": "Hello", "max_tokens": 5, "ignore_eos": true}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var c server.CompletionResponse
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		panic(err)
	}
	fmt.Println(resp.StatusCode, c.Object, *c.Choices[0].FinishReason, c.Usage.CompletionTokens)
	// Output: 200 text_completion length 5
}
