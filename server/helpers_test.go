package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/server/servertest"
)

// modelDir is the test model, written once per test binary.
var modelDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deepinfer-server-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := servertest.WriteModel(dir, 11); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	modelDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testServer is a Server on a loopback port over its own engine.
type testServer struct {
	*Server
	eng  *llm.Engine
	url  string
	done chan error // Serve's result
}

// startServer starts an engine for the test model (its config changed by
// edit) and a Server on 127.0.0.1:0; both stop at the end of the test.
func startServer(t testing.TB, edit func(*config.Config), opts Options) *testServer {
	t.Helper()
	cfg, err := servertest.Config(modelDir, edit)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := llm.New(cfg, llm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(eng, opts)
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	ts := &testServer{Server: s, eng: eng, url: "http://" + ln.Addr().String(), done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(ln) }()
	t.Cleanup(func() { ts.stop(t, 10*time.Second) })
	return ts
}

// stop shuts the server and the engine down (once).
func (ts *testServer) stop(t testing.TB, grace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := ts.Shutdown(ctx)
	select {
	case serveErr := <-ts.done:
		if !errors.Is(serveErr, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", serveErr)
		}
	case <-time.After(5 * time.Second):
		t.Error("Serve did not return after Shutdown")
	}
	if cerr := ts.eng.Close(); cerr != nil && !errors.Is(cerr, llm.ErrClosed) {
		t.Errorf("engine close: %v", cerr)
	}
	return err
}

// post sends body as JSON and returns the status and the response body.
func post(t testing.TB, url string, body any) (int, []byte) {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	default:
		var err error
		if data, err = json.Marshal(b); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// decode unmarshals data into a new T or fails the test.
func decode[T any](t testing.TB, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %T: %v in %s", v, err, data)
	}
	return v
}

// sseEvents reads "data:" events until [DONE] or EOF; done reports [DONE].
func sseEvents(r io.Reader) (events []string, done bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			return events, true, nil
		}
		events = append(events, data)
	}
	return events, false, sc.Err()
}

// waitFor polls cond every 5 ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// engineIdle reports whether the engine holds no request and no block.
func engineIdle(eng *llm.Engine) (bool, string) {
	st := eng.SchedulerStats()
	ok := st.NumWaiting == 0 && st.NumPrompted == 0 && st.NumRunning == 0 && st.NumFreeBlocks == st.NumBlocks && eng.NumLive() == 0
	return ok, fmt.Sprintf("waiting %d, prompted %d, running %d, free blocks %d of %d, live %d",
		st.NumWaiting, st.NumPrompted, st.NumRunning, st.NumFreeBlocks, st.NumBlocks, eng.NumLive())
}

var _ = sync.Mutex{}
