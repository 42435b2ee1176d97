package cli

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/server"
)

// deepinfer bench in both modes, small: the report, the JSON file and the
// plots.
func TestBenchCommand(t *testing.T) {
	cfgPath := writeServeConfig(t)
	dir := t.TempDir()

	// offline
	resultFile := filepath.Join(dir, "offline.json")
	out, err := run(t, "bench", "--mode", "offline", "--config", cfgPath, "--num-seqs", "6", "--min-input-len", "4", "--max-input-len", "20",
		"--min-output-len", "3", "--max-output-len", "8", "--result-file", resultFile)
	if err != nil {
		t.Fatalf("offline: %v\n%s", err, out)
	}
	for _, want := range []string{"Offline Benchmark Result", "Output token throughput", "TTFT", "E2E latency"} {
		if !strings.Contains(out, want) {
			t.Errorf("offline output lacks %q:\n%s", want, out)
		}
	}
	var off struct {
		Mode        string `json:"mode"`
		NumRequests int    `json:"num_requests"`
		TTFT        struct {
			Count int `json:"count"`
		} `json:"ttft_ms"`
	}
	readJSON(t, resultFile, &off)
	if off.Mode != "offline" || off.NumRequests != 6 || off.TTFT.Count != 6 {
		t.Fatalf("offline JSON: %+v", off)
	}

	// serve, against a server on a loopback port
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := llm.New(cfg, llm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	srv, err := server.New(eng, server.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	prompts := filepath.Join(dir, "prompts.jsonl")
	if err := os.WriteFile(prompts, []byte("{\"prompt\": \"hello there\"}\n{\"prompt\": \"how are you\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	resultFile, plotDir := filepath.Join(dir, "serve.json"), filepath.Join(dir, "serve-plots")
	out, err = run(t, "bench", "--mode", "serve", "--base-url", "http://"+ln.Addr().String(), "--endpoint", "/v1/chat/completions",
		"--num-prompts", "10", "--request-rate", "200", "--dataset-path", prompts, "--output-len", "6", "--result-file", resultFile, "--plot-dir", plotDir)
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, out)
	}
	for _, want := range []string{"Serving Benchmark Result", "Successful / failed requests:     10 / 0", "ITL", "TPOT"} {
		if !strings.Contains(out, want) {
			t.Errorf("serve output lacks %q:\n%s", want, out)
		}
	}
	var sv struct {
		Completed         int `json:"completed"`
		TotalOutputTokens int `json:"total_output_tokens"`
	}
	readJSON(t, resultFile, &sv)
	if sv.Completed != 10 || sv.TotalOutputTokens != 60 {
		t.Fatalf("serve JSON: %+v", sv)
	}
	for _, f := range []string{"ttft.png", "tpot.png", "itl.png", "e2el.png"} {
		if _, err := os.Stat(filepath.Join(plotDir, f)); err != nil {
			t.Error(err)
		}
	}
	if _, err := run(t, "bench", "--mode", "online"); err == nil || !strings.Contains(err.Error(), "--mode must be offline or serve") {
		t.Fatalf("bad mode: %v", err)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
