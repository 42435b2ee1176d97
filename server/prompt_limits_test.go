package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine/config"
)

// procStatusBytes reads a "Name: N kB" line of /proc/self/status, in
// bytes; 0 where there is none (not Linux).
func procStatusBytes(name string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kib, _ := strconv.ParseInt(f[0], 10, 64)
				return kib << 10
			}
		}
	}
	return 0
}

// heapPeak samples runtime.MemStats.HeapInuse every few milliseconds until
// stop is closed and returns the largest value seen.
func heapPeak(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// Eight concurrent 30 MB prompts (3 MB under the race detector) are refused with 400 before they are
// tokenized (their bytes cannot fit max_model_len tokens), while a normal
// request is served. The elapsed time and the memory figures are logged;
// only a generous bound on the heap's growth is asserted.
func TestHugePromptsAreRefusedBeforeTokenizing(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 240 MB of prompts")
	}
	// No body read timeout: on a loaded machine 240 MB may take a while.
	ts := startServer(t, nil, Options{MaxBodyBytes: 64 << 20, BodyReadTimeout: -1})
	size, clients := 30<<20, 8
	if raceDetector {
		size = 3 << 20 // still far past the byte bound; the full size takes minutes under -race
	}
	text := strings.Repeat("the cat sat on the mat ", size/23+1)[:size]
	bodies := map[string][]byte{}
	for path, req := range map[string]any{
		"/v1/completions":      map[string]any{"prompt": text, "max_tokens": 4},
		"/v1/chat/completions": map[string]any{"messages": []map[string]string{{"role": "user", "content": text}}, "max_tokens": 4},
	} {
		data, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		bodies[path] = data
	}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rssBefore := procStatusBytes("VmRSS")
	stop := make(chan struct{})
	peakc := heapPeak(stop)

	start := time.Now()
	var wg sync.WaitGroup
	var slowest atomic.Int64
	type answer struct {
		path   string
		status int
		body   []byte
		err    error
	}
	answers := make([]answer, clients)
	for i := range clients {
		path := "/v1/completions"
		if i%2 == 1 {
			path = "/v1/chat/completions"
		}
		wg.Go(func() {
			t0 := time.Now()
			resp, err := http.Post(ts.url+path, "application/json", bytes.NewReader(bodies[path]))
			if err != nil {
				answers[i] = answer{path: path, err: err}
				return
			}
			var buf bytes.Buffer
			buf.ReadFrom(resp.Body)
			resp.Body.Close()
			answers[i] = answer{path: path, status: resp.StatusCode, body: buf.Bytes()}
			slowest.Store(max(slowest.Load(), int64(time.Since(t0))))
		})
	}
	// A normal request while the huge ones are in flight.
	time.Sleep(100 * time.Millisecond)
	status, body := post(t, ts.url+"/v1/completions", map[string]any{"prompt": "the cat", "max_tokens": 4, "ignore_eos": true})
	normal := time.Since(start)
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	peak := <-peakc
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	rssAfter, rssPeak := procStatusBytes("VmRSS"), procStatusBytes("VmHWM")

	if status != http.StatusOK {
		t.Fatalf("normal request during the huge ones: %d %s", status, body)
	}
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("client %d: %v", i, a.err)
		}
		if a.status != http.StatusBadRequest {
			t.Fatalf("client %d (%s): status %d, want 400: %.300s", i, a.path, a.status, a.body)
		}
		e := decode[ErrorResponse](t, a.body)
		want := fmt.Sprintf("your prompt is %d bytes long", len(text))
		if a.path == "/v1/chat/completions" {
			want = fmt.Sprintf("the text of your messages is %d bytes long", len(text))
		}
		if !strings.Contains(e.Error.Message, want) || !strings.Contains(e.Error.Message, "maximum context length is 1024 tokens") {
			t.Fatalf("client %d (%s): message %q, want one with %q", i, a.path, e.Error.Message, want)
		}
	}
	// The large bodies schedule a return of their memory to the OS: at
	// most memoryReturnGap after the last one is answered.
	text, bodies, answers = "", nil, nil
	var rssReturned int64
	returned := time.Now()
	waitFor(memoryReturnGap+2*time.Second, func() bool {
		rssReturned = procStatusBytes("VmRSS")
		return rssReturned < rssBefore+256<<20
	})
	returnedIn := time.Since(returned)
	mb := func(b uint64) float64 { return float64(b) / (1 << 20) }
	growth := uint64(0)
	if peak > before.HeapInuse {
		growth = peak - before.HeapInuse
	}
	t.Logf("%d x %d MB prompts: all answered 400 in %v (slowest %v); a normal request answered in %v",
		clients, size>>20, elapsed.Round(time.Millisecond), time.Duration(slowest.Load()).Round(time.Millisecond), normal.Round(time.Millisecond))
	t.Logf("heap in use: %.0f MB before, peak %.0f MB (growth %.0f MB), %.0f MB after; RSS %.0f MB before, %.0f MB after (high-water %.0f MB), %.0f MB once memory is returned",
		mb(before.HeapInuse), mb(peak), mb(growth), mb(after.HeapInuse), mb(uint64(rssBefore)), mb(uint64(rssAfter)), mb(uint64(rssPeak)), mb(uint64(rssReturned)))
	t.Logf("RSS measured %v after the last answer", returnedIn.Round(10*time.Millisecond))
	// The bodies are the floor: the client's two, and in each handler the
	// body read whole, the decoder's buffer and the decoded prompt, some
	// 120 MB per 30 MB request before the collector runs. Tokenizing one
	// such prompt took 2.2 GB.
	if growth > 3<<29 {
		t.Errorf("heap grew by %.0f MB while refusing the prompts, want under 1536 MB", mb(growth))
	}
}

// Requests whose prompt plus max_tokens cannot fit max_model_len, or whose
// prompt cannot fit the whole KV cache, are 400s naming the numbers (they
// used to be a 200 through an overflow, a 500, or a silent cut).
func TestContextLimitErrors(t *testing.T) {
	ts := startServer(t, nil, Options{})
	small := startServer(t, func(c *config.Config) { c.Cache.NumBlocks = 32 }, Options{}) // 512 tokens of KV
	ids := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = 3 + i%90
		}
		return out
	}
	tests := []struct {
		name   string
		ts     *testServer
		path   string
		body   map[string]any
		status int
		param  string
		msg    string
	}{
		{"max_tokens MaxInt", ts, "/v1/completions", map[string]any{"prompt": ids(5), "max_tokens": math.MaxInt64}, 400, "max_tokens",
			"you requested 9223372036854775812 tokens (5 in the prompt, 9223372036854775807 in the completion)"},
		{"max_tokens MaxInt, text prompt", ts, "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": math.MaxInt64}, 400, "max_tokens",
			"in the completion"},
		{"max_completion_tokens MaxInt, chat", ts, "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_completion_tokens": math.MaxInt64}, 400, "max_completion_tokens",
			"9223372036854775807 in the completion"},
		{"1000-token prompt, 100 more", ts, "/v1/completions", map[string]any{"prompt": ids(1000), "max_tokens": 100}, 400, "max_tokens",
			"you requested 1100 tokens (1000 in the prompt, 100 in the completion)"},
		{"1000-token prompt, 24 more", ts, "/v1/completions", map[string]any{"prompt": ids(1000), "max_tokens": 24, "ignore_eos": true}, 200, "", ""},
		{"prompt over the KV cache", small, "/v1/completions", map[string]any{"prompt": ids(700), "max_tokens": 1}, 400, "prompt",
			"Your prompt has 700 tokens and needs 44 KV cache blocks of 16 tokens, but the whole cache has 32 blocks (512 tokens)"},
		{"chat over the KV cache", small, "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat("a", 700)}}, "max_tokens": 1}, 400, "messages",
			"needs 45 KV cache blocks of 16 tokens, but the whole cache has 32 blocks"},
		{"prompt filling the KV cache", small, "/v1/completions", map[string]any{"prompt": ids(500), "max_tokens": 1}, 200, "", ""},
		{"text over the byte bound", ts, "/v1/completions", map[string]any{"prompt": strings.Repeat("a", 6000), "max_tokens": 1}, 400, "prompt",
			"your prompt is 6000 bytes long"},
		{"chat text over the byte bound", ts, "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat("a", 6000)}}}, 400, "messages",
			"bytes long"},
		{"text over max_model_len tokens", ts, "/v1/completions", map[string]any{"prompt": strings.Repeat("a", 1100), "max_tokens": 1}, 400, "prompt",
			"your prompt has more than 1024 tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := post(t, tc.ts.url+tc.path, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %.500s", status, tc.status, body)
			}
			if status == http.StatusOK {
				if c := decode[CompletionResponse](t, body); c.Usage == nil || c.Usage.TotalTokens > 1024 {
					t.Fatalf("usage %+v", c.Usage)
				}
				return
			}
			e := decode[ErrorResponse](t, body)
			if !strings.Contains(e.Error.Message, tc.msg) {
				t.Fatalf("message %q, want one with %q", e.Error.Message, tc.msg)
			}
			if got := ""; e.Error.Param != nil && *e.Error.Param != tc.param || e.Error.Param == nil && tc.param != "" {
				if e.Error.Param != nil {
					got = *e.Error.Param
				}
				t.Fatalf("param %q, want %q", got, tc.param)
			}
		})
	}
}

// A mistyped field is named by its JSON name, not by the Go path of the
// struct that holds it.
func TestErrorParamsAreJSONNames(t *testing.T) {
	ts := startServer(t, nil, Options{})
	chat := func(extra map[string]any) map[string]any {
		m := map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name, path string
		body       map[string]any
		param      string
	}{
		{"temperature", "/v1/completions", map[string]any{"prompt": "hi", "temperature": "hot"}, "temperature"},
		{"top_k", "/v1/chat/completions", chat(map[string]any{"top_k": "many"}), "top_k"},
		{"stop_token_ids", "/v1/completions", map[string]any{"prompt": "hi", "stop_token_ids": []string{"x"}}, "stop_token_ids"},
		{"logit_bias", "/v1/completions", map[string]any{"prompt": "hi", "logit_bias": map[string]string{"5": "x"}}, "logit_bias"},
		{"ignore_eos", "/v1/chat/completions", chat(map[string]any{"ignore_eos": 1}), "ignore_eos"},
		{"max_tokens", "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": "three"}, "max_tokens"},
		{"stream_options field", "/v1/completions", map[string]any{"prompt": "hi", "stream": true, "stream_options": map[string]any{"include_usage": "yes"}}, "stream_options.include_usage"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := post(t, ts.url+tc.path, tc.body)
			if status != http.StatusBadRequest {
				t.Fatalf("status %d: %s", status, body)
			}
			e := decode[ErrorResponse](t, body)
			if e.Error.Param == nil || *e.Error.Param != tc.param {
				t.Fatalf("param %v, want %q: %s", e.Error.Param, tc.param, body)
			}
			if strings.Contains(e.Error.Message, "SamplingFields") {
				t.Fatalf("message names a Go type: %q", e.Error.Message)
			}
		})
	}
}
