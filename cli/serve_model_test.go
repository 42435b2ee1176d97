//go:build unix

package cli

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/server/servertest"
)

// deepinfer serve MODEL_DIR serves the directory given as an argument (as
// vLLM's serve MODEL), over the config's model, with the engine flags
// applied; SIGTERM ends it cleanly.
func TestServeModelDir(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny-chat")
	if err := servertest.WriteModel(model, 5); err != nil {
		t.Fatal(err)
	}
	// The config names a model that does not exist: the argument replaces it.
	cfg := filepath.Join(dir, "serve.yaml")
	if err := os.WriteFile(cfg, []byte(servertest.ConfigYAML(filepath.Join(dir, "nonesuch"))), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(dir, "chat.jinja")
	if err := os.WriteFile(tmpl, []byte("{{ messages[0]['content'] }}"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := NewRootCommand(nil)
	var out syncBuffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"serve", model, "--config", cfg, "--port", "0", "--max-num-seqs", "4", "--max-model-len", "64", "--chat-template", tmpl, "--seed", "9"})
	done := make(chan error, 1)
	go func() { done <- cmd.Execute() }()
	url := waitServing(t, &out, done, "tiny-chat")
	get := func(path, body string) string {
		t.Helper()
		var resp *http.Response
		var err error
		if body == "" {
			resp, err = http.Get(url + path)
		} else {
			resp, err = http.Post(url+path, "application/json", strings.NewReader(body))
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := get("/v1/models", ""); !strings.Contains(got, `"tiny-chat"`) {
		t.Errorf("/v1/models: %s", got)
	}
	// --max-model-len 64 reached the engine: 60 prompt tokens + 10 do not fit.
	if got := get("/v1/completions", `{"prompt": "`+strings.Repeat("a", 60)+`", "max_tokens": 10}`); !strings.Contains(got, "64") {
		t.Errorf("completion past --max-model-len: %s", got)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return after SIGTERM")
	}
}
