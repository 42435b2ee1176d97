//go:build unix

package cli

import (
	"bytes"
	"fmt"
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

	"github.com/deepinfer/deepinfer-go/server"
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

// waitServing waits (at most 20 s) for a serve command to announce the
// address it serves model on, in out, and returns its URL; it fails the test
// if the command returns first (done).
func waitServing(t *testing.T, out fmt.Stringer, done <-chan error, model string) string {
	t.Helper()
	addr := regexp.MustCompile(`serving ` + regexp.QuoteMeta(model) + ` on (http://127\.0\.0\.1:\d+)`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address announced:\n%s", out.String())
		}
		select {
		case err := <-done:
			t.Fatalf("serve returned early: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
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
// request in flight finish and returns without error (exit status 0). The
// API key comes from $DEEPINFER_API_KEY: /health needs none, the API does.
func TestServeCommand(t *testing.T) {
	cfg := writeServeConfig(t)
	t.Setenv(apiKeyEnv, "sk-from-env")
	cmd := NewRootCommand(nil)
	var out syncBuffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"serve", "--config", cfg, "--port", "0", "--served-model-name", "tiny", "--shutdown-timeout", "20s",
		"--allowed-origins", "https://app.example", "--max-conns", "64", "--body-read-timeout", "10s", "--max-body-bytes", "1048576"})
	done := make(chan error, 1)
	go func() { done <- cmd.Execute() }()
	url := waitServing(t, &out, done, "tiny")
	resp, err := http.Get(url + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	const reqBody = `{"model": "tiny", "prompt": "hi", "max_tokens": 300, "ignore_eos": true, "stream": true}`
	resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(reqBody))
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("completion without the API key: %v %v, want 401", resp, err)
	}
	resp.Body.Close()
	// A long streamed request in flight while SIGTERM arrives.
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(reqBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-from-env")
	req.Header.Set("Origin", "https://app.example")
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("completion: %v %v", resp, err)
	}
	if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "https://app.example" {
		t.Errorf("Access-Control-Allow-Origin %q, want https://app.example", got)
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

// serveLimits.apply: the API key falls back to $DEEPINFER_API_KEY, origins
// are checked, a zero timeout or cap means none, bad values are refused.
func TestServeLimitsApply(t *testing.T) {
	defaults := func() serveLimits {
		return serveLimits{maxBody: server.DefaultMaxBodyBytes, headerTimeout: server.DefaultReadHeaderTimeout,
			bodyTimeout: server.DefaultBodyReadTimeout, idleTimeout: server.DefaultIdleTimeout, maxConns: server.DefaultMaxConns}
	}
	env := func(key string) func(string) string {
		return func(name string) string {
			if name == apiKeyEnv {
				return key
			}
			return ""
		}
	}
	tests := []struct {
		name     string
		edit     func(*serveLimits)
		keyGiven bool
		env      string
		check    func(server.Options) bool
		err      string
	}{
		{"defaults", func(*serveLimits) {}, false, "", func(o server.Options) bool {
			return o.APIKey == "" && o.AllowedOrigins == nil && o.MaxBodyBytes == server.DefaultMaxBodyBytes &&
				o.BodyReadTimeout == server.DefaultBodyReadTimeout && o.MaxConns == server.DefaultMaxConns
		}, ""},
		{"key from env", func(*serveLimits) {}, false, "sk-env", func(o server.Options) bool { return o.APIKey == "sk-env" }, ""},
		{"flag over env", func(l *serveLimits) { l.apiKey = "sk-flag" }, true, "sk-env", func(o server.Options) bool { return o.APIKey == "sk-flag" }, ""},
		{"empty flag over env", func(l *serveLimits) { l.apiKey = "" }, true, "sk-env", func(o server.Options) bool { return o.APIKey == "" }, ""},
		{"key with space", func(l *serveLimits) { l.apiKey = "sk " }, true, "", nil, "white space"},
		{"origins", func(l *serveLimits) { l.origins = []string{"https://a.example", " http://localhost:3000 ", "*"} }, false, "", func(o server.Options) bool {
			return strings.Join(o.AllowedOrigins, ",") == "https://a.example,http://localhost:3000,*"
		}, ""},
		{"origin with path", func(l *serveLimits) { l.origins = []string{"https://a.example/app"} }, false, "", nil, "is not an origin"},
		{"origin without scheme", func(l *serveLimits) { l.origins = []string{"a.example"} }, false, "", nil, "is not an origin"},
		{"zero means none", func(l *serveLimits) { l.headerTimeout, l.bodyTimeout, l.idleTimeout, l.maxConns = 0, 0, 0, 0 }, false, "", func(o server.Options) bool {
			return o.ReadHeaderTimeout < 0 && o.BodyReadTimeout < 0 && o.IdleTimeout < 0 && o.MaxConns < 0
		}, ""},
		{"set", func(l *serveLimits) { l.bodyTimeout, l.maxConns, l.maxBody = 5*time.Second, 7, 1000 }, false, "", func(o server.Options) bool {
			return o.BodyReadTimeout == 5*time.Second && o.MaxConns == 7 && o.MaxBodyBytes == 1000
		}, ""},
		{"negative timeout", func(l *serveLimits) { l.idleTimeout = -time.Second }, false, "", nil, "--idle-timeout must be 0"},
		{"negative conns", func(l *serveLimits) { l.maxConns = -1 }, false, "", nil, "--max-conns must be 0"},
		{"zero body", func(l *serveLimits) { l.maxBody = 0 }, false, "", nil, "--max-body-bytes must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := defaults()
			tc.edit(&l)
			var o server.Options
			err := l.apply(&o, tc.keyGiven, env(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(o) {
				t.Fatalf("options %+v", o)
			}
		})
	}
}
