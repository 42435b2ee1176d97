package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// nodeClient returns node and the modules holding the openai package, or
// fails the test saying how to install them.
func nodeClient(t *testing.T) (node, modules string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: the end-to-end test needs Node 20+ and the openai package (bash scripts/setup-openai-node.sh)")
	}
	modules = nodeModules(t)
	if _, err := os.Stat(filepath.Join(modules, "openai", "package.json")); err != nil {
		t.Fatalf("the openai npm package is missing from %s: run bash scripts/setup-openai-node.sh", modules)
	}
	return node, modules
}

// The official OpenAI Node client drives the server on a loopback port:
// models, a completion, a chat completion, both streamed, n = 2, stop
// strings, logprobs, two errors and a wrong API key (the server requires
// one); the script checks the client's typed results and exits non-zero on
// any failure.
func TestOpenAINodeClient(t *testing.T) {
	node, modules := nodeClient(t)
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

// nodeResults are the outputs openai_structured_e2e.cjs reports: the JSON
// answers and the tool calls.
type nodeResults struct {
	JSON  []string `json:"json"`
	Calls []struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"calls"`
}

// The official OpenAI Node client's structured output and tool calling on
// the shipped default model: chat.completions.parse with a json_schema
// response_format, create with tools and tool_choice "required", parse
// with a named function (strict tools: parsed_arguments), the stream
// helper's assembled answers for each, and two refusals. The script checks
// the client's typed and parsed results; this test validates the JSON
// texts it reports against the schemas. (Needs the engine's
// structured-output integration.)
func TestOpenAINodeClientStructured(t *testing.T) {
	node, modules := nodeClient(t)
	ts := startDefaultModel(t, Options{APIKey: "sk-e2e-key"})
	tools, err := json.Marshal(e2eTools())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join("testdata", "openai_structured_e2e.cjs"), ts.url+"/v1", "deepseek-tiny", "sk-e2e-key", personSchema, string(tools))
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("openai_structured_e2e.cjs: %v", err)
	}
	var results nodeResults
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "RESULTS "); ok {
			results = decode[nodeResults](t, []byte(line))
		}
	}
	if len(results.JSON) != 2 || len(results.Calls) < 4 {
		t.Fatalf("results: %d JSON answers, %d calls; want 2 and at least 4", len(results.JSON), len(results.Calls))
	}
	for _, text := range results.JSON {
		checkInstance(t, personSchema, text)
	}
	params := map[string]string{"get_weather": weatherParams, "get_time": timeParams}
	for _, c := range results.Calls {
		checkInstance(t, params[c.Name], c.Arguments)
	}
}
