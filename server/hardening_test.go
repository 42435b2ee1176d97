package server

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// send makes one request with the given headers and returns the status,
// the response headers and the body.
func send(t testing.TB, method, url string, header map[string]string, body string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

// checkError fails t unless body is an OpenAI error with status and a
// message containing msg.
func checkError(t testing.TB, body []byte, status int, msg string) {
	t.Helper()
	e := decode[ErrorResponse](t, body)
	if e.Error.Code != status || e.Error.Type != errorType(status) || !strings.Contains(e.Error.Message, msg) {
		t.Fatalf("error %+v, want code %d, type %s and a message with %q", e.Error, status, errorType(status), msg)
	}
}

// dial opens a raw connection to the test server.
func dial(t testing.TB, ts *testServer) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

const completionBody = `{"prompt": "hi", "max_tokens": 2}`

// --api-key: every route but /health and /metrics needs the key as a
// bearer token; a missing or wrong one is 401 in OpenAI's error shape.
func TestAPIKey(t *testing.T) {
	ts := startServer(t, nil, Options{APIKey: "sk-right"})
	jsonOnly := map[string]string{"Content-Type": "application/json"}
	with := func(auth string) map[string]string {
		return map[string]string{"Content-Type": "application/json", "Authorization": auth}
	}
	tests := []struct {
		name, method, path string
		header             map[string]string
		body               string
		status             int
		msg                string
	}{
		{"models without key", "GET", "/v1/models", nil, "", 401, "missing API key"},
		{"models wrong key", "GET", "/v1/models", with("Bearer sk-wrong"), "", 401, "invalid API key"},
		{"models key prefix", "GET", "/v1/models", with("Bearer sk-rig"), "", 401, "invalid API key"},
		{"models key extended", "GET", "/v1/models", with("Bearer sk-right2"), "", 401, "invalid API key"},
		{"models basic scheme", "GET", "/v1/models", with("Basic sk-right"), "", 401, "invalid API key"},
		{"models right key", "GET", "/v1/models", with("Bearer sk-right"), "", 200, ""},
		{"models scheme case", "GET", "/v1/models", with("bearer sk-right"), "", 200, ""},
		{"completion without key", "POST", "/v1/completions", jsonOnly, completionBody, 401, "missing API key"},
		{"completion wrong key", "POST", "/v1/completions", with("Bearer sk-wrong"), completionBody, 401, "invalid API key"},
		{"completion right key", "POST", "/v1/completions", with("Bearer sk-right"), completionBody, 200, ""},
		{"chat without key", "POST", "/v1/chat/completions", jsonOnly, `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`, 401, "missing API key"},
		{"chat right key", "POST", "/v1/chat/completions", with("Bearer sk-right"), `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`, 200, ""},
		{"unknown route without key", "GET", "/v2/models", nil, "", 401, "missing API key"},
		{"health without key", "GET", "/health", nil, "", 200, ""},
		{"metrics without key", "GET", "/metrics", nil, "", 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, h, body := send(t, tc.method, ts.url+tc.path, tc.header, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			if status == http.StatusUnauthorized {
				checkError(t, body, status, tc.msg)
				if !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("WWW-Authenticate %q, want a Bearer challenge", h.Get("WWW-Authenticate"))
				}
			}
		})
	}
}

// POST bodies must be declared JSON: the content types a web page can send
// cross-origin without a preflight are refused with 415.
func TestContentType(t *testing.T) {
	ts := startServer(t, nil, Options{})
	tests := []struct {
		path, contentType string
		status            int
	}{
		{"/v1/completions", "text/plain", 415},
		{"/v1/completions", "text/plain;charset=UTF-8", 415},
		{"/v1/completions", "", 415},
		{"/v1/completions", "application/x-www-form-urlencoded", 415},
		{"/v1/completions", "multipart/form-data; boundary=x", 415},
		{"/v1/completions", "application/jsonx", 415},
		{"/v1/chat/completions", "text/plain", 415},
		{"/v1/completions", "application/json", 200},
		{"/v1/completions", "application/json; charset=utf-8", 200},
		{"/v1/completions", "Application/JSON", 200},
	}
	for _, tc := range tests {
		t.Run(tc.path+" "+tc.contentType, func(t *testing.T) {
			body := completionBody
			if tc.path == "/v1/chat/completions" {
				body = `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`
			}
			header := map[string]string{}
			if tc.contentType != "" {
				header["Content-Type"] = tc.contentType
			}
			status, _, out := send(t, "POST", ts.url+tc.path, header, body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, out)
			}
			if status == http.StatusUnsupportedMediaType {
				checkError(t, out, status, "application/json")
			}
		})
	}
	var state string
	if !waitFor(2*time.Second, func() (ok bool) { ok, state = engineIdle(ts.eng); return ok }) {
		t.Fatalf("engine: %s", state)
	}
}

// CORS is off by default; --allowed-origins answers preflights and adds
// the headers for the listed origins only (a preflight needs no API key,
// and a 401 carries the headers so the page can read it).
func TestCORS(t *testing.T) {
	const good, evil = "https://good.example", "https://evil.example"
	off := startServer(t, nil, Options{})
	on := startServer(t, nil, Options{AllowedOrigins: []string{good}, APIKey: "k"})
	anyOrigin := startServer(t, nil, Options{AllowedOrigins: []string{"*"}})
	preflight := func(origin string) map[string]string {
		return map[string]string{"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
	}
	tests := []struct {
		name   string
		ts     *testServer
		method string
		header map[string]string
		status int    // 0: any
		allow  string // Access-Control-Allow-Origin wanted, "" for none
	}{
		{"off: simple request", off, "GET", map[string]string{"Origin": good}, 200, ""},
		{"off: preflight", off, "OPTIONS", preflight(good), 0, ""},
		{"on: allowed origin", on, "GET", map[string]string{"Origin": good, "Authorization": "Bearer k"}, 200, good},
		{"on: allowed origin without key", on, "GET", map[string]string{"Origin": good}, 401, good},
		{"on: other origin", on, "GET", map[string]string{"Origin": evil, "Authorization": "Bearer k"}, 200, ""},
		{"on: preflight", on, "OPTIONS", preflight(good), 204, good},
		{"on: preflight other origin", on, "OPTIONS", preflight(evil), 0, ""},
		{"any: simple request", anyOrigin, "GET", map[string]string{"Origin": evil}, 200, "*"},
		{"any: preflight", anyOrigin, "OPTIONS", preflight(evil), 204, "*"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, h, body := send(t, tc.method, tc.ts.url+"/v1/models", tc.header, "")
			if tc.status != 0 && status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			if got := h.Get("Access-Control-Allow-Origin"); got != tc.allow {
				t.Fatalf("Access-Control-Allow-Origin %q, want %q", got, tc.allow)
			}
			if tc.allow == "" {
				for k := range h {
					if strings.HasPrefix(k, "Access-Control-") {
						t.Fatalf("header %s: %q on a refused origin", k, h.Get(k))
					}
				}
			}
			if tc.method == "OPTIONS" && tc.allow != "" {
				if m := h.Get("Access-Control-Allow-Methods"); !strings.Contains(m, "POST") {
					t.Errorf("Access-Control-Allow-Methods %q lacks POST", m)
				}
				if hd := h.Get("Access-Control-Allow-Headers"); !strings.Contains(hd, "authorization") || !strings.Contains(hd, "content-type") {
					t.Errorf("Access-Control-Allow-Headers %q lacks authorization or content-type", hd)
				}
			}
		})
	}
}

// readResponse reads one response from c, giving up at the deadline.
func readResponse(t testing.TB, c net.Conn, br *bufio.Reader, within time.Duration) (*http.Response, []byte, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

// Slow clients are cut off: a body that stalls gets 408 and a closed
// connection, headers that stall and an idle keep-alive connection are
// closed. The timeouts here are short; the client waits far longer.
func TestSlowClients(t *testing.T) {
	const short = 200 * time.Millisecond
	ts := startServer(t, nil, Options{BodyReadTimeout: short, ReadHeaderTimeout: short, IdleTimeout: short})
	tests := []struct {
		name   string
		send   string
		status int // the answer wanted before the close; 0: none
	}{
		{"stalled body", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ", 408},
		{"stalled chunked body", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"pro", 408},
		{"stalled headers", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: applic", 0},
		{"idle keep-alive", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, ts)
			if _, err := io.WriteString(c, tc.send); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			if tc.status != 0 {
				resp, body, err := readResponse(t, c, br, 10*time.Second)
				if err != nil {
					t.Fatalf("no answer: %v", err)
				}
				if resp.StatusCode != tc.status {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
				}
				if tc.status == http.StatusRequestTimeout {
					checkError(t, body, tc.status, "request body not received within")
				}
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, err := br.Read(make([]byte, 1))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the server kept the connection open")
			}
			if n != 0 || err == nil {
				t.Fatalf("read %d bytes (%v) after the answer, want the connection closed", n, err)
			}
		})
	}
	// The body timeout does not cut a generation that outlasts it.
	resp := openStream(t, t.Context(), ts.url+"/v1/completions", map[string]any{"prompt": "a", "max_tokens": 600, "ignore_eos": true})
	if finish, done := streamResult(t, resp); finish != "length" || !done {
		t.Fatalf("long stream ended with %q, [DONE] %v; want length", finish, done)
	}
}

// Connections past MaxConns wait: the second connection's request is
// answered only once the first connection closes.
func TestConnectionCap(t *testing.T) {
	ts := startServer(t, nil, Options{MaxConns: 1})
	const get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
	first := dial(t, ts)
	firstR := bufio.NewReader(first)
	io.WriteString(first, get)
	if resp, body, err := readResponse(t, first, firstR, 10*time.Second); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first connection: %v %v %s", resp, err, body)
	}
	// first is idle and kept alive: it holds the only slot.
	second := dial(t, ts)
	secondR := bufio.NewReader(second)
	io.WriteString(second, get)
	if resp, _, err := readResponse(t, second, secondR, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("second connection answered past the cap: %v %v", resp, err)
	}
	first.Close()
	if resp, body, err := readResponse(t, second, secondR, 10*time.Second); err != nil || resp.StatusCode != 200 {
		t.Fatalf("second connection after the first closed: %v %v %s", resp, err, body)
	}
}

// A request with more prompts than the server can ever admit at once is a
// 400 naming the limit, not a retryable 503.
func TestTooManyPrompts(t *testing.T) {
	prompts := func(n int) []string {
		p := make([]string, n)
		for i := range p {
			p[i] = "a"
		}
		return p
	}
	tests := []struct {
		name       string
		maxPending int
		prompts    int
		status     int
		msg        string
	}{
		{"2000 prompts, default limit", 0, 2000, 400, "the request has 2000 prompts and this server holds at most 544 at once"},
		{"over --max-pending", 10, 11, 400, "the request has 11 prompts and this server holds at most 10 at once"},
		{"at --max-pending", 10, 10, 200, ""},
		{"--max-pending above the engine's queue", 5000, 545, 400, "holds at most 544 at once"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, nil, Options{MaxPending: tc.maxPending})
			status, body := post(t, ts.url+"/v1/completions", map[string]any{"prompt": prompts(tc.prompts), "max_tokens": 1})
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			if status != http.StatusOK {
				checkError(t, body, status, tc.msg)
				if e := decode[ErrorResponse](t, body); e.Error.Param == nil || *e.Error.Param != "prompt" {
					t.Fatalf("param %v, want prompt", e.Error.Param)
				}
			} else if c := decode[CompletionResponse](t, body); len(c.Choices) != tc.prompts {
				t.Fatalf("%d choices, want %d", len(c.Choices), tc.prompts)
			}
		})
	}
}
