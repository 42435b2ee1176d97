package llm_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/assets"
	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
)

// readmeExample is the README's "From Go:" snippet, verbatim between the
// markers: TestReadmeExample checks that the README holds exactly these
// lines, so the snippet there compiles as written.
func readmeExample() {
	// README begin
	cfg := config.Default()                // the settings of configs/default.yaml
	model, err := assets.DefaultModelDir() // the shipped model, written once to the user's cache; or any HF model directory
	if err != nil {
		log.Fatal(err)
	}
	cfg.Model = model
	l, err := llm.NewLLM(&cfg, llm.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	params := engine.DefaultSamplingParams()
	params.Temperature = 0 // greedy, as deepinfer generate
	params.MaxTokens = 32
	res, err := l.Generate(context.Background(), []llm.Prompt{{Text: "func main() {"}}, params, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res[0].Outputs[0].Text)
	// README end
}

// TestReadmeExample checks that README.md's "From Go:" block is
// readmeExample's body, then runs it: it prints a greedy continuation.
func TestReadmeExample(t *testing.T) {
	src, err := os.ReadFile("readme_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(string(src), "\t// README begin\n")
	body, _, _ = strings.Cut(body, "\t// README end\n")
	var want strings.Builder
	for line := range strings.Lines(body) {
		want.WriteString(strings.TrimPrefix(line, "\t"))
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(readme), "From Go:\n\n```go\n")
	block, _, _ = strings.Cut(block, "```\n")
	if block != want.String() || block == "" {
		t.Fatalf("README.md's \"From Go:\" block differs from readmeExample's body:\n--- README\n%s--- readmeExample\n%s", block, want.String())
	}
	if testing.Short() {
		t.Skip("loads the shipped model")
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&out, r); close(copied) }()
	func() {
		defer func() { os.Stdout = stdout; w.Close() }()
		readmeExample()
	}()
	<-copied
	if strings.TrimSpace(out.String()) == "" {
		t.Errorf("the snippet printed nothing")
	}
}
