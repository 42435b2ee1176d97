package tokenlog_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/examples/internal/exampletest"
	"github.com/deepinfer/deepinfer-go/examples/tokenlog"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
)

// registry returns a clone of the default registry (the built-in stages)
// with the logger added: each test gets its own, and the process-wide
// registry is never changed.
func registry() *pipeline.Registry {
	reg := pipeline.DefaultRegistry().Clone()
	tokenlog.Register(reg)
	return reg
}

// insert is the pipeline section that inserts the logger writing to path.
func insert(path string) string {
	return "{insert: [{after: postprocess, stage: token-log, options: {path: " + strconv.Quote(path) + "}}]}"
}

// readLog decodes the log's lines.
func readLog(t *testing.T, path string) []tokenlog.Line {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []tokenlog.Line
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l tokenlog.Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %d %q: %v", len(lines)+1, sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// TestLogsEveryToken runs requests with and without the logger, zero-overhead
// scheduling off and on, greedy and sampled with n = 2. The tokens must be
// the same (the equivalence: the logger passes each step's outputs on
// unchanged and sits after sampling, so it cannot change a token; with ZOS
// the feedback edge runs through it, which delays no step's content), and
// the log must have one line per generated token: per output, its token
// ids in order, in increasing steps, its text, and its finish reason on
// the last line.
func TestLogsEveryToken(t *testing.T) {
	reg := registry()
	dir := exampletest.Model(t)
	sampled := exampletest.Params(9, 1, 4)
	sampled.N = 2
	for _, zos := range []bool{false, true} {
		for _, params := range []engine.SamplingParams{exampletest.Params(12, 0, 1), sampled} {
			t.Run(fmt.Sprintf("zos=%v/temperature=%g", zos, params.Temperature), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "tokens.jsonl")
				want := exampletest.Generate(t, exampletest.Config(t, dir, "", zos), reg, exampletest.Prompts(), params)
				got := exampletest.Generate(t, exampletest.Config(t, dir, insert(path), zos), reg, exampletest.Prompts(), params)
				if !reflect.DeepEqual(exampletest.Tokens(got), exampletest.Tokens(want)) {
					t.Fatalf("tokens with the logger %v, without %v", exampletest.Tokens(got), exampletest.Tokens(want))
				}
				checkLog(t, readLog(t, path), got)
			})
		}
	}
}

// checkLog wants lines to be exactly res's generated tokens.
func checkLog(t *testing.T, lines []tokenlog.Line, res []llm.Completion) {
	t.Helper()
	type key struct {
		req   string
		index int
	}
	byOutput := map[key][]tokenlog.Line{}
	for _, l := range lines {
		if l.Token == nil {
			t.Errorf("a line without a token: %+v", l)
			continue
		}
		k := key{l.RequestID, l.Index}
		byOutput[k] = append(byOutput[k], l)
	}
	total := 0
	for _, c := range res {
		for _, o := range c.Outputs {
			total += len(o.TokenIDs)
			ls := byOutput[key{c.RequestID, o.Index}]
			var ids []int
			var text strings.Builder
			for i, l := range ls {
				ids = append(ids, *l.Token)
				text.WriteString(l.Text)
				if i > 0 && l.Step <= ls[i-1].Step {
					t.Errorf("%s/%d: line %d at step %d after step %d", c.RequestID, o.Index, i, l.Step, ls[i-1].Step)
				}
				if fin := i == len(ls)-1; fin != (l.FinishReason != "") {
					t.Errorf("%s/%d: line %d of %d has finish reason %q", c.RequestID, o.Index, i, len(ls), l.FinishReason)
				}
			}
			if !reflect.DeepEqual(ids, o.TokenIDs) {
				t.Errorf("%s/%d: logged %v, generated %v", c.RequestID, o.Index, ids, o.TokenIDs)
			}
			if text.String() != o.Text {
				t.Errorf("%s/%d: logged text %q, generated %q", c.RequestID, o.Index, text.String(), o.Text)
			}
			if n := len(ls); n > 0 && ls[n-1].FinishReason != o.FinishReason.String() {
				t.Errorf("%s/%d: logged finish %q, got %q", c.RequestID, o.Index, ls[n-1].FinishReason, o.FinishReason)
			}
		}
	}
	if len(lines) != total {
		t.Errorf("%d lines for %d generated tokens", len(lines), total)
	}
}

// TestStartError wants a log that cannot be created to stop the engine
// from starting, with the stage named.
func TestStartError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no such directory", "tokens.jsonl")
	cfg := exampletest.Config(t, exampletest.Model(t), insert(path), false)
	if err := exampletest.StartErr(t, cfg, registry()); err == nil || !strings.Contains(err.Error(), "token-log: open "+path) {
		t.Fatalf("start: %v", err)
	}
}

// TestCommandLine runs the command line of cmd/tokenlog: the graph of the
// example's config shows the logger, generate on it succeeds, and on a
// copy that writes to a file it logs one line per generated token.
func TestCommandLine(t *testing.T) {
	reg := registry()
	out := exampletest.Command(t, reg, "graph", "--config", "config.yaml")
	if !strings.Contains(out, "token-log=default") {
		t.Errorf("graph lacks the stage:\n%s", out)
	}
	exampletest.Command(t, reg, "generate", "--config", "config.yaml", "-n", "4", "-p", "func main() {")

	data, err := os.ReadFile("config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	model, err := filepath.Abs(filepath.Join("..", "..", "assets", "deepseek-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "tokens.jsonl")
	yaml := strings.NewReplacer("../../assets/deepseek-tiny", model, `path: "-"`, "path: "+strconv.Quote(log)).Replace(string(data))
	if !strings.Contains(yaml, log) || !strings.Contains(yaml, model) {
		t.Fatalf("config.yaml changed shape, the copy does not write the log:\n%s", yaml)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	exampletest.Command(t, reg, "generate", "--config", cfg, "-n", "4", "--ignore-eos", "-p", "func main() {", "-p", "package main")
	lines := readLog(t, log)
	if len(lines) != 8 {
		t.Fatalf("%d lines for 2 prompts of 4 tokens: %+v", len(lines), lines)
	}
}
