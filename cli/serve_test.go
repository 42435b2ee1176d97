//go:build unix

package cli

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/server/servertest"
)

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// writeServeConfig writes the server test model and a config for it.
func writeServeConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := servertest.WriteModel(filepath.Join(dir, "model"), 3); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "serve.yaml")
	if err := os.WriteFile(path, []byte(servertest.ConfigYAML(filepath.Join(dir, "model"))), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// deepinfer serve answers on a loopback port and, on SIGTERM, lets the
// request in flight finish and returns without error (exit status 0).
func TestServeCommand(t *testing.T) {
	cfg := writeServeConfig(t)
	cmd := NewRootCommand(nil)
	var out syncBuffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"serve", "--config", cfg, "--port", "0", "--served-model-name", "tiny", "--shutdown-timeout", "20s"})
	done := make(chan error, 1)
	go func() { done <- cmd.Execute() }()
	addr := regexp.MustCompile(`serving tiny on (http://127\.0\.0\.1:\d+)`)
	var url string
	deadline := time.Now().Add(20 * time.Second)
	for url == "" {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no address announced:\n%s", out.String())
		}
		select {
		case err := <-done:
			t.Fatalf("serve returned early: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	resp, err := http.Get(url + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	// A long streamed request in flight while SIGTERM arrives.
	resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model": "tiny", "prompt": "hi", "max_tokens": 300, "ignore_eos": true, "stream": true}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("completion: %v %v", resp, err)
	}
	if _, err := resp.Body.Read(make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(body, []byte(`"finish_reason":"length"`)) || !bytes.HasSuffix(bytes.TrimSpace(body), []byte("data: [DONE]")) {
		t.Fatalf("in-flight request did not finish: ...%s", body[max(0, len(body)-300):])
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return after SIGTERM")
	}
	for _, want := range []string{"shutting down", "stats:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
