package server

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// nodeModules is where scripts/setup-openai-node.sh installs the OpenAI
// Node client (DEEPINFER_NODE_MODULES overrides it, for both).
func nodeModules(t *testing.T) string {
	if dir := os.Getenv("DEEPINFER_NODE_MODULES"); dir != "" {
		return dir
	}
	dir, err := filepath.Abs(filepath.Join("..", ".cache", "node", "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// The official OpenAI Node client drives the server on a loopback port:
// models, a completion, a chat completion, both streamed, n = 2, stop
// strings, logprobs, two errors and a wrong API key (the server requires
// one); the script checks the client's typed results and exits non-zero on
// any failure.
func TestOpenAINodeClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: the end-to-end test needs Node 20+ and the openai package (bash scripts/setup-openai-node.sh)")
	}
	modules := nodeModules(t)
	if _, err := os.Stat(filepath.Join(modules, "openai", "package.json")); err != nil {
		t.Fatalf("the openai npm package is missing from %s: run bash scripts/setup-openai-node.sh", modules)
	}
	ts := startServer(t, nil, Options{ModelName: "tiny-chat", APIKey: "sk-e2e-key"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join("testdata", "openai_e2e.cjs"), ts.url+"/v1", "tiny-chat", "sk-e2e-key")
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("openai_e2e.cjs: %v", err)
	}
	var state string
	if !waitFor(2*time.Second, func() (ok bool) { ok, state = engineIdle(ts.eng); return ok }) {
		t.Fatalf("engine after the e2e run: %s", state)
	}
}
